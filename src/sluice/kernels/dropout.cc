#include "sluice/kernels/dropout.h"

#include <algorithm>
#include <cmath>

#include <Random123/philox.h>

#include "sluice/kernels/parallel.h"

namespace sluice::kernels {

namespace {

uint32_t Low(uint64_t v) { return static_cast<uint32_t>(v); }
uint32_t High(uint64_t v) { return static_cast<uint32_t>(v >> 32); }

// Elements [begin, end) of one key's run (x and y start at the run); begin is a multiple of 4 (the
// first element of a block).
template <typename T>
void DropoutRange(const T* x, T* y, int64_t begin, int64_t end, uint64_t key, uint64_t stream,
                  double p) {
  const uint64_t threshold = DropThreshold(p);
  // The factor in the type the product is computed in: f32 for bf16.
  using Compute = std::conditional_t<std::is_same_v<T, BFloat16>, float, T>;
  const Compute scale = p < 1 ? static_cast<Compute>(1.0 / (1.0 - p)) : Compute(0);
  for (int64_t i = begin; i < end; i += 4) {
    const std::array<uint32_t, 4> u = DropoutDraws(key, stream, static_cast<uint64_t>(i / 4));
    const int64_t block_end = std::min<int64_t>(i + 4, end);
    for (int64_t k = i; k < block_end; ++k) {
      const bool keep = u[static_cast<size_t>(k - i)] >= threshold;
      if constexpr (std::is_same_v<T, BFloat16>) {
        y[k] = keep ? FloatToBF16(BF16ToFloat(x[k]) * scale) : BFloat16{};
      } else {
        y[k] = keep ? x[k] * scale : T(0);
      }
    }
  }
}

}  // namespace

uint64_t DropThreshold(double p) {
  // p · 2^32 is exact in a double; the floor of it is at most 2^32 (p = 1: every draw is below).
  return static_cast<uint64_t>(std::floor(p * 4294967296.0));
}

std::array<uint32_t, 4> DropoutDraws(uint64_t key, uint64_t stream, uint64_t block) {
  const r123::Philox4x32::ctr_type counter = {{Low(block), High(block), Low(stream), High(stream)}};
  const r123::Philox4x32::key_type k = {{Low(key), High(key)}};
  const r123::Philox4x32::ctr_type r = r123::Philox4x32()(counter, k);
  return {r[0], r[1], r[2], r[3]};
}

template <typename T>
void DropoutReference(const T* x, T* y, int64_t n, std::span<const int64_t> keys, uint64_t stream,
                      double p) {
  const int64_t run = n / static_cast<int64_t>(keys.size());
  for (size_t b = 0; b < keys.size(); ++b) {
    const int64_t at = static_cast<int64_t>(b) * run;
    DropoutRange(x + at, y + at, 0, run, static_cast<uint64_t>(keys[b]), stream, p);
  }
}

template <typename T>
void DropoutFast(const T* x, T* y, int64_t n, std::span<const int64_t> keys, uint64_t stream,
                 double p) {
  static_assert(kChunkElements % 4 == 0, "a chunk starts on a block of four draws");
  const int64_t run = n / static_cast<int64_t>(keys.size());
  const int64_t chunks_per_run = (run + kChunkElements - 1) / kChunkElements;
  // Chunk c: run c / chunks_per_run, its elements from (c mod chunks_per_run) · kChunkElements.
  ParallelFor(static_cast<int64_t>(keys.size()) * chunks_per_run,
              ChunkRows(std::min(run, kChunkElements)), [&](int64_t first, int64_t last) {
                for (int64_t c = first; c < last; ++c) {
                  const int64_t b = c / chunks_per_run;
                  const int64_t begin = (c % chunks_per_run) * kChunkElements;
                  const int64_t end = std::min(begin + kChunkElements, run);
                  DropoutRange(x + b * run, y + b * run, begin, end,
                               static_cast<uint64_t>(keys[static_cast<size_t>(b)]), stream, p);
                }
              });
}

template void DropoutReference<float>(const float*, float*, int64_t, std::span<const int64_t>,
                                      uint64_t, double);
template void DropoutReference<double>(const double*, double*, int64_t, std::span<const int64_t>,
                                       uint64_t, double);
template void DropoutReference<BFloat16>(const BFloat16*, BFloat16*, int64_t,
                                         std::span<const int64_t>, uint64_t, double);
template void DropoutFast<float>(const float*, float*, int64_t, std::span<const int64_t>, uint64_t,
                                 double);
template void DropoutFast<double>(const double*, double*, int64_t, std::span<const int64_t>,
                                  uint64_t, double);
template void DropoutFast<BFloat16>(const BFloat16*, BFloat16*, int64_t, std::span<const int64_t>,
                                    uint64_t, double);

}  // namespace sluice::kernels
