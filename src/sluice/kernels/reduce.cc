#include "sluice/kernels/reduce.h"

#include "sluice/kernels/parallel.h"
#include "sluice/kernels/simd.h"
#include "sluice/kernels/simd_kernels.h"

namespace sluice::kernels {

int64_t ReducedCount(const Shape& shape, AxisSet reduced) {
  int64_t count = 1;
  for (int d = 0; d < shape.rank(); ++d) {
    if (reduced[d]) count *= shape[d];
  }
  return count;
}

template <typename T>
void SumReference(const T* x, const Shape& shape, AxisSet reduced, T* out) {
  const Strides xs = shape.ContiguousStrides();
  int kept_axes[kMaxRank], reduced_axes[kMaxRank];
  int num_kept = 0, num_reduced = 0;
  int64_t num_out = 1, num_summed = 1;
  for (int d = 0; d < shape.rank(); ++d) {
    if (reduced[d]) {
      reduced_axes[num_reduced++] = d;
      num_summed *= shape[d];
    } else {
      kept_axes[num_kept++] = d;
      num_out *= shape[d];
    }
  }
  for (int64_t o = 0; o < num_out; ++o) {
    // Offset in x of this output element's first summand: o as a multi-index over the kept axes.
    int64_t base = 0;
    int64_t rest = o;
    for (int k = num_kept - 1; k >= 0; --k) {
      const int d = kept_axes[k];
      base += (rest % shape[d]) * xs[d];
      rest /= shape[d];
    }
    // Sum over every multi-index of the reduced axes.
    T acc = T(0);
    for (int64_t r = 0; r < num_summed; ++r) {
      int64_t offset = 0, rem = r;
      for (int k = num_reduced - 1; k >= 0; --k) {
        const int d = reduced_axes[k];
        offset += (rem % shape[d]) * xs[d];
        rem /= shape[d];
      }
      acc += x[base + offset];
    }
    out[o] = acc;
  }
}

namespace {

// Axes of x with size-1 axes dropped and neighbours of the same role merged. x is contiguous, so
// any two neighbours merge; strides in elements (out_stride is 0 on reduced axes).
struct ReducePlan {
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  bool reduced[kMaxRank] = {};
  int64_t x_stride[kMaxRank] = {};
  int64_t out_stride[kMaxRank] = {};
};

ReducePlan PlanReduce(const Shape& shape, AxisSet reduced) {
  ReducePlan p;
  for (int d = 0; d < shape.rank(); ++d) {
    if (shape[d] == 1) continue;
    if (p.rank > 0 && p.reduced[p.rank - 1] == reduced[d]) {
      p.dims[p.rank - 1] *= shape[d];
    } else {
      p.dims[p.rank] = shape[d];
      p.reduced[p.rank] = reduced[d];
      ++p.rank;
    }
  }
  int64_t xs = 1, os = 1;
  for (int d = p.rank - 1; d >= 0; --d) {
    p.x_stride[d] = xs;
    xs *= p.dims[d];
    p.out_stride[d] = p.reduced[d] ? 0 : os;
    if (!p.reduced[d]) os *= p.dims[d];
  }
  return p;
}

// Σ x[0, n) with several vector accumulators (independent chains, vectorized).
template <typename T>
T SumRow(const T* __restrict x, int64_t n) {
  constexpr int kL = kLanes<T>;
  Vec<T> acc0{}, acc1{}, acc2{}, acc3{};
  int64_t i = 0;
  for (; i + 4 * kL <= n; i += 4 * kL) {
    acc0 += Load(x + i);
    acc1 += Load(x + i + kL);
    acc2 += Load(x + i + 2 * kL);
    acc3 += Load(x + i + 3 * kL);
  }
  for (; i + kL <= n; i += kL) acc0 += Load(x + i);
  const Vec<T> acc = (acc0 + acc1) + (acc2 + acc3);
  T sum = T(0);
  for (int l = 0; l < kL; ++l) sum += acc[l];
  for (; i < n; ++i) sum += x[i];
  return sum;
}

// out[j] += x[j] for j in [0, n).
template <typename T>
void AccumulateRow(const T* __restrict x, T* __restrict out, int64_t n) {
  ForEachBlocked(n, [&](int64_t j) { out[j] += x[j]; });
}

template <typename T>
void Walk(const ReducePlan& p, int axis, const T* x, T* out) {
  const int64_t n = p.dims[axis];
  if (axis == p.rank - 1) {
    if (p.reduced[axis]) {
      *out += SumRow(x, n);
    } else {
      AccumulateRow(x, out, n);
    }
    return;
  }
  for (int64_t k = 0; k < n; ++k)
    Walk(p, axis + 1, x + k * p.x_stride[axis], out + k * p.out_stride[axis]);
}

}  // namespace

template <typename T>
void SumFast(const T* x, const Shape& shape, AxisSet reduced, T* out) {
  const ReducePlan p = PlanReduce(shape, reduced);
  int64_t num_out = 1;
  for (int d = 0; d < p.rank; ++d) num_out *= p.reduced[d] ? 1 : p.dims[d];
  for (int64_t o = 0; o < num_out; ++o) out[o] = T(0);
  if (shape.numel() == 0) return;  // nothing to add (num_out may still be > 0)
  if (p.rank == 0) {
    out[0] = x[0];
    return;
  }
  if (p.rank == 2 && p.reduced[0] && !p.reduced[1]) {
    // Column sums ([B, T, C] over B and T: a bias gradient). Chunks of whole columns, a multiple
    // of 64 (whole vectors on every target): each chunk sums its columns over every row.
    const int64_t rows = p.dims[0], cols = p.dims[1];
    const int64_t chunk = (ChunkRows(rows) + 63) / 64 * 64;
    ParallelFor(cols, chunk, [&](int64_t begin, int64_t end) {
      Simd<T>().column_sum(x + begin, out + begin, rows, end - begin, cols);
    });
    return;
  }
  Walk(p, 0, x, out);
}

template void SumReference<float>(const float*, const Shape&, AxisSet, float*);
template void SumReference<double>(const double*, const Shape&, AxisSet, double*);
template void SumFast<float>(const float*, const Shape&, AxisSet, float*);
template void SumFast<double>(const double*, const Shape&, AxisSet, double*);

}  // namespace sluice::kernels
