// Layers: small program builders that declare their parameters and emit their ops.
// Parameter names are prefixed by the enclosing Builder::NameScope ("h.0.attn." + "c_attn.weight").
#pragma once

#include <optional>
#include <string_view>

#include "sluice/core/enum_names.h"
#include "sluice/nn/model.h"

namespace sluice {

// What a model computes in (`--precision`). kFp32: everything f32. kBf16: mixed precision by
// autocast's rules, "bf16 in, f32 compute, bf16 out" per op — a linear's input and weight are bf16,
// multiplied with f32 accumulation into an f32 result (kernels/bf16_products.h); layer norm, GELU
// and the fused attention take bf16 and give bf16, computing in f32 inside their kernels
// (kernels/bf16_activations.h), so the activations saved for backward are bf16. Parameters (master
// weights), gradients, optimizer state, layer norm's and softmax's statistics, the residual
// stream's additions, the loss and every reduction stay f32; a model rounds what crosses its unit
// boundaries to bf16 (nn/gpt.h), so that pipeline messages and kept unit inputs are bf16.
enum class Precision : uint8_t { kFp32, kBf16 };

inline constexpr EnumEntry<Precision> kPrecisionNames[] = {
    {Precision::kFp32, "fp32"},
    {Precision::kBf16, "bf16"},
};
static_assert(IsCompleteEnumTable(kPrecisionNames));

std::string_view Name(Precision precision);
std::optional<Precision> ParsePrecision(std::string_view name);

// y = x·W + b with W [in, out] (std `std`, default 0.02) and b [out] (zeros). x [..., in] → [...,
// out], f32. Under Precision::kBf16, x (unless bf16 already) and W are cast to bf16 for the
// product (b stays f32).
Var LinearLayer(ModelBuilder& m, std::string_view name, Var x, int64_t in, int64_t out,
                double std = 0.02, Precision precision = Precision::kFp32);

// Layer norm over the last axis with weight (ones) and bias (zeros) of size C, eps 1e-5. Under
// Precision::kBf16, x is cast to bf16 (the copy backward keeps) and y is bf16.
Var LayerNormLayer(ModelBuilder& m, std::string_view name, Var x, int64_t C,
                   Precision precision = Precision::kFp32);

// x rounded to bf16 under Precision::kBf16 (a cast named `name`), x itself otherwise: the bf16
// copy of an f32 result that the next op keeps for backward.
Var StoredAs(ModelBuilder& m, Var x, Precision precision, std::string_view name);

}  // namespace sluice
