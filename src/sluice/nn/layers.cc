#include "sluice/nn/layers.h"

#include <string>

#include "sluice/ir/ops.h"

namespace sluice {

std::string_view Name(Precision precision) { return EnumName(kPrecisionNames, precision); }

std::optional<Precision> ParsePrecision(std::string_view name) {
  return ParseEnum(kPrecisionNames, name);
}

Var LinearLayer(ModelBuilder& m, std::string_view name, Var x, int64_t in, int64_t out,
                double std) {
  Builder::NameScope scope(m.b(), name);
  Var w = m.Param("weight", {in, out}, Init::kNormal, std);
  Var b = m.Param("bias", {out}, Init::kZeros);
  return Linear(x, w, b);
}

Var LayerNormLayer(ModelBuilder& m, std::string_view name, Var x, int64_t C) {
  Builder::NameScope scope(m.b(), name);
  Var w = m.Param("weight", {C}, Init::kOnes);
  Var b = m.Param("bias", {C}, Init::kZeros);
  return LayerNorm(x, w, b, 1e-5);
}

}  // namespace sluice
