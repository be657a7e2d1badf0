#include "sluice/kernels/bf16_llama.h"

#include <algorithm>
#include <type_traits>
#include <vector>

#include "sluice/kernels/bf16_convert.h"
#include "sluice/kernels/bf16_rows.h"
#include "sluice/kernels/parallel.h"
#include "sluice/kernels/rms_norm.h"
#include "sluice/kernels/simd_kernels.h"
#include "sluice/kernels/swiglu.h"

namespace sluice::kernels {

namespace {

using bf16_rows::kStackFloats;
using bf16_rows::Widened;
using bf16_rows::WidenedRows;

}  // namespace

void RmsNormBF16Reference(const BFloat16* x, const float* weight, BFloat16* y, int64_t rows,
                          int64_t cols, float eps) {
  const int64_t n = rows * cols;
  std::vector<float> xf = Widened(x, n), yf(static_cast<size_t>(n));
  RmsNormReference<float>(xf.data(), weight, yf.data(), rows, cols, eps);
  ToBF16Reference(yf.data(), y, n);
}

void RmsNormBF16Fast(const BFloat16* x, const float* weight, BFloat16* y, int64_t rows,
                     int64_t cols, float eps) {
  ParallelFor(rows, ChunkRows(cols), [&](int64_t begin, int64_t end) {
    WidenedRows(x, begin, end, cols, [&](int64_t r, int64_t n, float* xf) {
      // The f32 output beside the widened rows (the row kernel's output must not alias x).
      std::vector<float> heap;
      alignas(64) float stack[kStackFloats];
      float* yf = stack;
      if (n * cols > kStackFloats) {
        heap.resize(static_cast<size_t>(n * cols));
        yf = heap.data();
      }
      Simd<float>().rms_norm(xf, weight, yf, n, cols, eps);
      ToBF16Fast(yf, y + r * cols, n * cols);
    });
  });
}

void RmsNormGradXBF16Reference(const float* dy, const BFloat16* x, const float* weight, float* dx,
                               int64_t rows, int64_t cols, float eps) {
  std::vector<float> xf = Widened(x, rows * cols);
  RmsNormGradXReference<float>(dy, xf.data(), weight, dx, rows, cols, eps);
}

void RmsNormGradXBF16Fast(const float* dy, const BFloat16* x, const float* weight, float* dx,
                          int64_t rows, int64_t cols, float eps) {
  ParallelFor(rows, ChunkRows(cols), [&](int64_t begin, int64_t end) {
    WidenedRows(x, begin, end, cols, [&](int64_t r, int64_t n, float* xf) {
      const int64_t at = r * cols;
      Simd<float>().rms_norm_grad_x(dy + at, xf, weight, dx + at, n, cols, eps);
    });
  });
}

void RmsNormGradWeightBF16Reference(const float* dy, const BFloat16* x, float* dweight,
                                    int64_t rows, int64_t cols, float eps) {
  std::vector<float> xf = Widened(x, rows * cols);
  RmsNormGradWeightReference<float>(dy, xf.data(), dweight, rows, cols, eps);
}

void RmsNormGradWeightBF16Fast(const float* dy, const BFloat16* x, float* dweight, int64_t rows,
                               int64_t cols, float eps) {
  // As RmsNormGradWeightFast: one partial per chunk of rows, added in chunk order.
  const int64_t chunk = ChunkRows(cols);
  const int64_t chunks = std::max<int64_t>(1, (rows + chunk - 1) / chunk);
  std::vector<float> partials(static_cast<size_t>(chunks * cols), 0.0f);
  ParallelFor(rows, chunk, [&](int64_t begin, int64_t end) {
    // The chunk's rows in groups, added into its partial in row order as in one call.
    float* pw = partials.data() + (begin / chunk) * cols;
    WidenedRows(x, begin, end, cols, [&](int64_t r, int64_t n, float* xf) {
      Simd<float>().rms_norm_grad_weight(dy + r * cols, xf, pw, n, cols, eps);
    });
  });
  std::fill_n(dweight, cols, 0.0f);
  for (int64_t c = 0; c < chunks; ++c) {
    const float* pw = partials.data() + c * cols;
    for (int64_t j = 0; j < cols; ++j) dweight[j] += pw[j];
  }
}

void SwigluBF16Reference(const BFloat16* a, const BFloat16* b, BFloat16* y, int64_t n) {
  std::vector<float> af = Widened(a, n), bf = Widened(b, n), yf(static_cast<size_t>(n));
  SwigluReference<float>(af.data(), bf.data(), yf.data(), n);
  ToBF16Reference(yf.data(), y, n);
}

void SwigluBF16Fast(const BFloat16* a, const BFloat16* b, BFloat16* y, int64_t n) {
  ParallelFor(n, kChunkElements, [&](int64_t begin, int64_t end) {
    alignas(64) float af[kSwigluBlock], bf[kSwigluBlock];
    for (int64_t k = begin; k < end; k += kSwigluBlock) {
      const int64_t m = std::min(kSwigluBlock, end - k);
      FromBF16Fast(a + k, af, m);
      FromBF16Fast(b + k, bf, m);
      SwigluBlock(af, bf, af, m);
      ToBF16Fast(af, y + k, m);
    }
  });
}

template <typename Out>
void SwigluGradBF16Reference(const float* dy, const BFloat16* a, const BFloat16* b, Out* da,
                             Out* db, int64_t n) {
  std::vector<float> af = Widened(a, n), bf = Widened(b, n);
  if constexpr (std::is_same_v<Out, float>) {
    SwigluGradReference<float>(dy, af.data(), bf.data(), da, db, n);
  } else {
    std::vector<float> daf(static_cast<size_t>(n)), dbf(static_cast<size_t>(n));
    SwigluGradReference<float>(dy, af.data(), bf.data(), daf.data(), dbf.data(), n);
    ToBF16Reference(daf.data(), da, n);
    ToBF16Reference(dbf.data(), db, n);
  }
}

template <typename Out>
void SwigluGradBF16Fast(const float* dy, const BFloat16* a, const BFloat16* b, Out* da, Out* db,
                        int64_t n) {
  ParallelFor(n, kChunkElements, [&](int64_t begin, int64_t end) {
    alignas(64) float af[kSwigluBlock], bf[kSwigluBlock];
    for (int64_t k = begin; k < end; k += kSwigluBlock) {
      const int64_t m = std::min(kSwigluBlock, end - k);
      FromBF16Fast(a + k, af, m);
      FromBF16Fast(b + k, bf, m);
      if constexpr (std::is_same_v<Out, float>) {
        SwigluGradBlock(dy + k, af, bf, da + k, db + k, m);
      } else {
        alignas(64) float daf[kSwigluBlock], dbf[kSwigluBlock];
        SwigluGradBlock(dy + k, af, bf, daf, dbf, m);
        ToBF16Fast(daf, da + k, m);
        ToBF16Fast(dbf, db + k, m);
      }
    }
  });
}

template void SwigluGradBF16Reference<float>(const float*, const BFloat16*, const BFloat16*, float*,
                                             float*, int64_t);
template void SwigluGradBF16Reference<BFloat16>(const float*, const BFloat16*, const BFloat16*,
                                                BFloat16*, BFloat16*, int64_t);
template void SwigluGradBF16Fast<float>(const float*, const BFloat16*, const BFloat16*, float*,
                                        float*, int64_t);
template void SwigluGradBF16Fast<BFloat16>(const float*, const BFloat16*, const BFloat16*,
                                           BFloat16*, BFloat16*, int64_t);

}  // namespace sluice::kernels
