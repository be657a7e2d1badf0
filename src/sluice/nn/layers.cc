#include "sluice/nn/layers.h"

#include <string>

#include "sluice/ir/ops.h"

namespace sluice {

std::string_view Name(Precision precision) { return EnumName(kPrecisionNames, precision); }

std::optional<Precision> ParsePrecision(std::string_view name) {
  return ParseEnum(kPrecisionNames, name);
}

Var LinearLayer(ModelBuilder& m, std::string_view name, Var x, int64_t in, int64_t out, double std,
                Precision precision) {
  Builder::NameScope scope(m.b(), name);
  Var w = m.Param("weight", {in, out}, Init::kNormal, std);
  Var b = m.Param("bias", {out}, Init::kZeros);
  if (precision == Precision::kBf16) {
    return Linear(StoredAs(m, x, precision, "x_bf16"),
                  m.b().Name(Cast(w, DType::kBF16), "weight_bf16"), b);
  }
  return Linear(x, w, b);
}

Var LayerNormLayer(ModelBuilder& m, std::string_view name, Var x, int64_t C, Precision precision) {
  Builder::NameScope scope(m.b(), name);
  Var w = m.Param("weight", {C}, Init::kOnes);
  Var b = m.Param("bias", {C}, Init::kZeros);
  return LayerNorm(StoredAs(m, x, precision, "x_bf16"), w, b, 1e-5);
}

Var StoredAs(ModelBuilder& m, Var x, Precision precision, std::string_view name) {
  if (precision != Precision::kBf16 || x.dtype() == DType::kBF16) return x;
  return m.b().Name(Cast(x, DType::kBF16), name);
}

}  // namespace sluice
