// Layers: small program builders that declare their parameters and emit their ops.
// Parameter names are prefixed by the enclosing Builder::NameScope ("h.0.attn." + "c_attn.weight").
#pragma once

#include <optional>
#include <string_view>

#include "sluice/core/enum_names.h"
#include "sluice/nn/model.h"

namespace sluice {

// What a model computes in (`--precision`). kFp32: everything f32. kBf16: mixed precision, the
// model's f32 program run through the autocast pass (ir/autocast.h: "bf16 storage, f32 compute" —
// products multiply bf16 operands into f32 results, activations feeding them take and give bf16,
// what crosses a unit boundary is rounded to bf16, the rest runs f32). The built-in GPT and a
// `--program` go through the same pass.
enum class Precision : uint8_t { kFp32, kBf16 };

inline constexpr EnumEntry<Precision> kPrecisionNames[] = {
    {Precision::kFp32, "fp32"},
    {Precision::kBf16, "bf16"},
};
static_assert(IsCompleteEnumTable(kPrecisionNames));

std::string_view Name(Precision precision);
std::optional<Precision> ParsePrecision(std::string_view name);

// y = x·W + b with W [in, out] (std `std`, default 0.02) and b [out] (zeros). x [..., in] → [...,
// out].
Var LinearLayer(ModelBuilder& m, std::string_view name, Var x, int64_t in, int64_t out,
                double std = 0.02);

// Layer norm over the last axis with weight (ones) and bias (zeros) of size C, eps 1e-5.
Var LayerNormLayer(ModelBuilder& m, std::string_view name, Var x, int64_t C);

}  // namespace sluice
