// The bf16 row kernels' widening (kernels/bf16_activations.cc, kernels/bf16_llama.cc): "bf16 in,
// f32 compute, bf16 out" runs the f32 kernel on rows widened into a buffer on the calling thread's
// stack. Internal to those kernels.
//
// Thread-safety: pure functions; each call's buffer is its own.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "sluice/core/dtype.h"
#include "sluice/kernels/bf16_convert.h"

namespace sluice::kernels::bf16_rows {

// Elements widened at a time into the stack (16 KiB: it stays in L1 between the widening, the f32
// kernel and the rounding). A multiple of 64, so every element meets the vector code it meets in
// f32.
inline constexpr int64_t kStackFloats = 4096;

// Rows [begin, end) of a [rows, cols] bf16 matrix through fn(row0, rows, xf): each group of rows
// that fits kStackFloats widened into a stack buffer xf (f32, the group's rows packed), which fn
// may overwrite. A row longer than kStackFloats takes a heap buffer of one row (the only scratch
// of these kernels outside the stack: channels past 4096).
template <typename F>
void WidenedRows(const BFloat16* x, int64_t begin, int64_t end, int64_t cols, F&& fn) {
  if (cols > kStackFloats) {
    std::vector<float> row(static_cast<size_t>(cols));
    for (int64_t r = begin; r < end; ++r) {
      FromBF16Fast(x + r * cols, row.data(), cols);
      fn(r, int64_t{1}, row.data());
    }
    return;
  }
  alignas(64) float xf[kStackFloats];
  const int64_t group = kStackFloats / std::max<int64_t>(1, cols);
  for (int64_t r = begin; r < end; r += group) {
    const int64_t rows = std::min(group, end - r);
    FromBF16Fast(x + r * cols, xf, rows * cols);
    fn(r, rows, xf);
  }
}

// A whole f32 copy of x (the references).
inline std::vector<float> Widened(const BFloat16* x, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  FromBF16Reference(x, out.data(), n);
  return out;
}

}  // namespace sluice::kernels::bf16_rows
