// Layers: small program builders that declare their parameters and emit their ops.
// Parameter names are prefixed by the enclosing Builder::NameScope ("h.0.attn." + "c_attn.weight").
#pragma once

#include <optional>
#include <string_view>

#include "sluice/core/enum_names.h"
#include "sluice/nn/model.h"

namespace sluice {

// What a model's products compute in (`--precision`). kFp32: everything f32. kBf16: mixed
// precision by autocast's rules — a linear's input and weight are cast to bf16 and multiplied
// with f32 accumulation into an f32 result (kernels/bf16_products.h), so the products' saved
// inputs are bf16; parameters (master weights), their gradients, optimizer state, layer norms,
// softmax, the loss and every reduction stay f32.
enum class Precision : uint8_t { kFp32, kBf16 };

inline constexpr EnumEntry<Precision> kPrecisionNames[] = {
    {Precision::kFp32, "fp32"},
    {Precision::kBf16, "bf16"},
};
static_assert(IsCompleteEnumTable(kPrecisionNames));

std::string_view Name(Precision precision);
std::optional<Precision> ParsePrecision(std::string_view name);

// y = x·W + b with W [in, out] (std `std`, default 0.02) and b [out] (zeros). x [..., in] → [...,
// out], f32. Under Precision::kBf16, x and W are cast to bf16 for the product (b stays f32).
Var LinearLayer(ModelBuilder& m, std::string_view name, Var x, int64_t in, int64_t out,
                double std = 0.02, Precision precision = Precision::kFp32);

// Layer norm over the last axis with weight (ones) and bias (zeros) of size C, eps 1e-5.
Var LayerNormLayer(ModelBuilder& m, std::string_view name, Var x, int64_t C);

}  // namespace sluice
