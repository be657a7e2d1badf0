#include "sluice/comm/rank_order_sum.h"

#include "sluice/core/error.h"

namespace sluice {

namespace {

template <typename T>
void Sum(std::span<const void* const> sources, int64_t n, void* out) {
  T* dst = static_cast<T*>(out);
  for (int64_t i = 0; i < n; ++i) {
    T acc = static_cast<const T*>(sources[0])[i];
    for (size_t r = 1; r < sources.size(); ++r) acc += static_cast<const T*>(sources[r])[i];
    dst[i] = acc;
  }
}

}  // namespace

void SumInRankOrder(DType dtype, std::span<const void* const> sources, int64_t n, void* out) {
  SLUICE_CHECK(!sources.empty(), "all_reduce_sum over no ranks");
  switch (dtype) {
    case DType::kF32:
      return Sum<float>(sources, n, out);
    case DType::kF64:
      return Sum<double>(sources, n, out);
    case DType::kI32:
      return Sum<int32_t>(sources, n, out);
    case DType::kI64:
      return Sum<int64_t>(sources, n, out);
    default:
      SLUICE_CHECK(false, "all_reduce_sum of {}", Name(dtype));
  }
}

}  // namespace sluice
