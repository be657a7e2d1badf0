// Elementwise binary kernels with NumPy broadcasting: out = f(a, b), out contiguous of the
// broadcast shape, a and b contiguous. f is a functor such as std::plus<>, std::divides<>.
//
// BinaryReference is the plain version: one multi-index computation per element.
// BinaryFast first merges output axes along which neither operand changes how it is read
// (PlanBroadcast: [B, T, C] + [C] becomes rows [B·T] × [C]; two equal shapes become one flat
// axis), then runs the innermost axis as a tight vectorizable loop in one of four forms — both
// operands advancing, or one of them (or both) held fixed — and advances the outer axes with a
// running multi-index. No index arithmetic per element, whatever the broadcasting pattern. Two
// equal shapes under +, −, ·, / skip the plan and run as one flat row of Highway's widest vectors
// (simd_kernels.h: bitwise the scalar loop's results, one IEEE operation per element). Chunks
// of rows (or of the one flat row) run on the intra-op threads (kernels/parallel.h); every element
// is computed alone, so results do not depend on the thread count.
//
// BinaryBF16Reference / BinaryBF16Fast: mixed precision's form, a, b and out bf16 (PyTorch's
// bf16 · bf16 = bf16): each element widened exactly, computed in f32 by f and rounded to nearest
// even — bit for bit what casting a and b to f32, running the f32 kernel (one IEEE operation per
// element) and rounding out would give, without the f32 copies. The same two walks as above, over
// bf16 elements.
//
// Thread-safety: pure functions of their inputs.
#pragma once

#include <cstdint>
#include <functional>
#include <type_traits>

#include "sluice/core/tensor.h"
#include "sluice/kernels/broadcast.h"
#include "sluice/kernels/parallel.h"
#include "sluice/kernels/simd.h"
#include "sluice/kernels/simd_kernels.h"

namespace sluice::kernels {

template <typename T, typename F>
void BinaryReference(const Tensor& a, const Tensor& b, const Tensor& out, F f) {
  const Shape& s = out.shape();
  const Strides sa = BroadcastStrides(a.shape(), s), sb = BroadcastStrides(b.shape(), s);
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* po = out.data<T>();
  for (int64_t i = 0, n = s.numel(); i < n; ++i) {
    // Decompose the flat output index into a multi-index, axis by axis from the last.
    int64_t rem = i, ia = 0, ib = 0;
    for (int d = s.rank() - 1; d >= 0; --d) {
      int64_t k = rem % s[d];
      rem /= s[d];
      ia += k * sa[d];
      ib += k * sb[d];
    }
    po[i] = f(pa[ia], pb[ib]);
  }
}

// The output shape with size-1 axes dropped and neighbouring axes merged where both operands'
// strides allow it (stride[d] == stride[d + 1] · dims[d + 1]: contiguous, or stretched on both).
// Strides are in elements, 0 where an operand is stretched. The innermost axis then has stride 0
// or 1 for each operand.
struct BroadcastPlan {
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t sa[kMaxRank] = {}, sb[kMaxRank] = {};
};

inline BroadcastPlan PlanBroadcast(const Shape& a, const Shape& b, const Shape& out) {
  const Strides sa = BroadcastStrides(a, out), sb = BroadcastStrides(b, out);
  BroadcastPlan p;
  for (int d = 0; d < out.rank(); ++d) {
    if (out[d] == 1) continue;
    const int last = p.rank - 1;
    if (last >= 0 && p.sa[last] == sa[d] * out[d] && p.sb[last] == sb[d] * out[d]) {
      p.dims[last] *= out[d];
      p.sa[last] = sa[d];
      p.sb[last] = sb[d];
    } else {
      p.dims[p.rank] = out[d];
      p.sa[p.rank] = sa[d];
      p.sb[p.rank] = sb[d];
      ++p.rank;
    }
  }
  return p;
}

// One innermost row of n outputs; a_step/b_step are 1 (advancing) or 0 (held fixed).
template <typename T, typename F>
inline void BinaryRow(const T* __restrict a, int64_t a_step, const T* __restrict b, int64_t b_step,
                      T* __restrict out, int64_t n, F f) {
  if (a_step == 1 && b_step == 1) {
    ForEachBlocked(n, [&](int64_t i) { out[i] = f(a[i], b[i]); });
  } else if (a_step == 1) {
    const T y = b[0];
    ForEachBlocked(n, [&](int64_t i) { out[i] = f(a[i], y); });
  } else if (b_step == 1) {
    const T x = a[0];
    ForEachBlocked(n, [&](int64_t i) { out[i] = f(x, b[i]); });
  } else {
    const T v = f(a[0], b[0]);
    ForEachBlocked(n, [&](int64_t i) { out[i] = v; });
  }
}

// Whether f has a runtime-dispatched row over two advancing operands (simd_kernels.h).
template <typename F>
inline constexpr bool kHasSimdBinaryRow =
    std::is_same_v<F, std::plus<>> || std::is_same_v<F, std::minus<>> ||
    std::is_same_v<F, std::multiplies<>> || std::is_same_v<F, std::divides<>>;

// That row, or nullptr when f has none.
template <typename T, typename F>
auto SimdBinaryRow() -> void (*)(const T*, const T*, T*, int64_t) {
  if constexpr (std::is_same_v<F, std::plus<>>) {
    return Simd<T>().add;
  } else if constexpr (std::is_same_v<F, std::minus<>>) {
    return Simd<T>().sub;
  } else if constexpr (std::is_same_v<F, std::multiplies<>>) {
    return Simd<T>().mul;
  } else if constexpr (std::is_same_v<F, std::divides<>>) {
    return Simd<T>().div;
  } else {
    return nullptr;
  }
}

// BinaryFast past its first case: broadcast planning, or equal shapes under an f without a SIMD
// row. Out of line, so that the first case (the interpreter's most frequent instruction) pays no
// stack frame for the plan.
template <typename T, typename F>
[[gnu::noinline]] void BinaryPlanned(const Tensor& a, const Tensor& b, const Tensor& out, F f) {
  const T* pa = a.data<T>();
  const T* pb = b.data<T>();
  T* po = out.data<T>();
  const int64_t total = out.numel();
  if (total == 0) return;
  if (a.shape() == out.shape() && b.shape() == out.shape()) {  // equal shapes: no plan to make
    ParallelFor(total, kChunkElements, [&](int64_t begin, int64_t end) {
      BinaryRow<T>(pa + begin, 1, pb + begin, 1, po + begin, end - begin, f);
    });
    return;
  }
  const BroadcastPlan p = PlanBroadcast(a.shape(), b.shape(), out.shape());
  if (p.rank == 0) {  // a single element
    po[0] = f(pa[0], pb[0]);
    return;
  }
  const int inner = p.rank - 1;
  const int64_t n = p.dims[inner];
  if (p.rank == 1) {  // one flat row: equal shapes, or an operand held fixed
    ParallelFor(n, kChunkElements, [&](int64_t begin, int64_t end) {
      BinaryRow<T>(pa + begin * p.sa[0], p.sa[0], pb + begin * p.sb[0], p.sb[0], po + begin,
                   end - begin, f);
    });
    return;
  }
  // Chunks of innermost rows; each starts its outer multi-index at its first row.
  ParallelFor(total / n, ChunkRows(n), [&](int64_t row_begin, int64_t row_end) {
    int64_t index[kMaxRank] = {};
    int64_t ia = 0, ib = 0;
    for (int64_t d = inner - 1, rest = row_begin; d >= 0; --d) {
      index[d] = rest % p.dims[d];
      rest /= p.dims[d];
      ia += index[d] * p.sa[d];
      ib += index[d] * p.sb[d];
    }
    for (int64_t o = row_begin * n, stop = row_end * n; o < stop; o += n) {
      BinaryRow<T>(pa + ia, p.sa[inner], pb + ib, p.sb[inner], po + o, n, f);
      for (int d = inner - 1; d >= 0; --d) {  // advance the outer multi-index
        ia += p.sa[d];
        ib += p.sb[d];
        if (++index[d] < p.dims[d]) break;
        ia -= p.sa[d] * p.dims[d];
        ib -= p.sb[d] * p.dims[d];
        index[d] = 0;
      }
    }
  });
}

// Equal shapes of more than one chunk: the SIMD row over chunks on the intra-op threads. Out of
// line, so that BinaryFast's one-chunk case pays no stack frame for the chunks' closure.
template <typename T, typename F>
[[gnu::noinline]] void BinarySimdChunks(const T* pa, const T* pb, T* po, int64_t total) {
  const auto row = SimdBinaryRow<T, F>();
  ParallelFor(total, kChunkElements, [&](int64_t begin, int64_t end) {
    row(pa + begin, pb + begin, po + begin, end - begin);
  });
}

template <typename T, typename F>
void BinaryFast(const Tensor& a, const Tensor& b, const Tensor& out, F f) {
  if constexpr (kHasSimdBinaryRow<F>) {
    const Shape& s = out.shape();
    if (a.shape() == s && b.shape() == s) {  // equal shapes: one flat row of SIMD vectors
      const T* pa = a.data<T>();
      const T* pb = b.data<T>();
      T* po = out.data<T>();
      const int64_t total = s.numel();
      if (total > kChunkElements) return BinarySimdChunks<T, F>(pa, pb, po, total);
      return SimdBinaryRow<T, F>()(pa, pb, po, total);  // one chunk: no ParallelFor
    }
  }
  BinaryPlanned<T>(a, b, out, f);
}

// f on bf16 elements: widened, computed in f32, rounded (core/dtype.h's conversions).
template <typename F>
struct InF32 {
  F f;
  BFloat16 operator()(BFloat16 a, BFloat16 b) const {
    return FloatToBF16(static_cast<float>(f(BF16ToFloat(a), BF16ToFloat(b))));
  }
};

template <typename F>
void BinaryBF16Reference(const Tensor& a, const Tensor& b, const Tensor& out, F f) {
  BinaryReference<BFloat16>(a, b, out, InF32<F>{f});
}

template <typename F>
void BinaryBF16Fast(const Tensor& a, const Tensor& b, const Tensor& out, F f) {
  BinaryPlanned<BFloat16>(a, b, out, InF32<F>{f});
}

}  // namespace sluice::kernels
