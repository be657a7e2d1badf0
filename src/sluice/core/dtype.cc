#include "sluice/core/dtype.h"

#include <array>
#include <utility>

namespace sluice {

namespace {
constexpr std::array<std::pair<DType, std::string_view>, 6> kNames = {{
    {DType::kF32, "f32"},
    {DType::kF64, "f64"},
    {DType::kBF16, "bf16"},
    {DType::kF16, "f16"},
    {DType::kI32, "i32"},
    {DType::kI64, "i64"},
}};
}  // namespace

std::string_view Name(DType t) {
  for (const auto& [type, name] : kNames) {
    if (type == t) return name;
  }
  return "?";
}

std::optional<DType> ParseDType(std::string_view name) {
  for (const auto& [type, n] : kNames) {
    if (n == name) return type;
  }
  return std::nullopt;
}

}  // namespace sluice
