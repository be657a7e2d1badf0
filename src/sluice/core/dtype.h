// Element types of tensors.
//
// f32 and f64 are what kernels compute (f64 is for gradient checks); i32 and i64 hold indices
// (embedding ids, targets). bf16 is the storage type of mixed precision (`--precision bf16`): the
// `cast` op converts it to and from f32, and matmul and linear take bf16 operands (f32 results);
// other kernels reject it with a clear error naming the op. f16 exists as a storage type (size and
// name) for checkpoints and memory accounting only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "sluice/core/enum_names.h"

namespace sluice {

enum class DType : uint8_t { kF32, kF64, kBF16, kF16, kI32, kI64 };

// Short lowercase names as used in the text format and the safetensors mapping.
inline constexpr EnumEntry<DType> kDTypeNames[] = {
    {DType::kF32, "f32"}, {DType::kF64, "f64"}, {DType::kBF16, "bf16"},
    {DType::kF16, "f16"}, {DType::kI32, "i32"}, {DType::kI64, "i64"},
};
static_assert(IsCompleteEnumTable(kDTypeNames));

// Bytes per element.
constexpr size_t SizeOf(DType t) {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kF64:
      return 8;
    case DType::kBF16:
      return 2;
    case DType::kF16:
      return 2;
    case DType::kI32:
      return 4;
    case DType::kI64:
      return 8;
  }
  return 0;
}

// "f32", "i64", ... (kDTypeNames).
std::string_view Name(DType t);

// Inverse of Name(); nullopt for an unknown name.
std::optional<DType> ParseDType(std::string_view name);

constexpr bool IsFloating(DType t) {
  return t == DType::kF32 || t == DType::kF64 || t == DType::kBF16 || t == DType::kF16;
}
constexpr bool IsInteger(DType t) { return t == DType::kI32 || t == DType::kI64; }

// One bfloat16 number: the upper 16 bits of an IEEE f32 (sign, 8 exponent bits, 7 mantissa bits).
// A plain value type for storage; arithmetic goes through f32 (BF16ToFloat, FloatToBF16).
struct BFloat16 {
  uint16_t bits = 0;
  bool operator==(const BFloat16&) const = default;
};

// Exact: every bf16 is an f32.
inline float BF16ToFloat(BFloat16 x) {
  const uint32_t u = static_cast<uint32_t>(x.bits) << 16;
  float f;
  __builtin_memcpy(&f, &u, sizeof f);
  return f;
}

// Rounds to the nearest bf16, ties to even (as PyTorch and oneDNN do); a NaN stays a (quiet) NaN,
// infinities stay infinite, and finite values beyond the largest bf16 round to infinity.
inline BFloat16 FloatToBF16(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((u >> 16) | 0x0040u)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return {static_cast<uint16_t>(u >> 16)};
}

// Maps a C++ element type to its DType: DTypeOf<float>() == DType::kF32.
template <typename T>
constexpr DType DTypeOf();
template <>
constexpr DType DTypeOf<float>() {
  return DType::kF32;
}
template <>
constexpr DType DTypeOf<double>() {
  return DType::kF64;
}
template <>
constexpr DType DTypeOf<BFloat16>() {
  return DType::kBF16;
}
template <>
constexpr DType DTypeOf<int32_t>() {
  return DType::kI32;
}
template <>
constexpr DType DTypeOf<int64_t>() {
  return DType::kI64;
}

}  // namespace sluice
