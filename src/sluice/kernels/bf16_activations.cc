#include "sluice/kernels/bf16_activations.h"

#include <algorithm>
#include <vector>

#include "sluice/kernels/attention.h"
#include "sluice/kernels/bf16_convert.h"
#include "sluice/kernels/layer_norm.h"
#include "sluice/kernels/parallel.h"
#include "sluice/kernels/simd_kernels.h"
#include "sluice/kernels/unary.h"

namespace sluice::kernels {

namespace {

// The calling thread's f32 scratch `slot` (0 or 1), at least n elements, kept from call to call.
float* Scratch(int slot, int64_t n) {
  thread_local std::vector<float> buffers[2];
  std::vector<float>& b = buffers[slot];
  if (static_cast<int64_t>(b.size()) < n) b.resize(static_cast<size_t>(n));
  return b.data();
}

// A whole f32 copy of x (the references).
std::vector<float> Widened(const BFloat16* x, int64_t n) {
  std::vector<float> out(static_cast<size_t>(n));
  FromBF16Reference(x, out.data(), n);
  return out;
}

}  // namespace

void GeluBF16Reference(const BFloat16* x, BFloat16* y, int64_t n) {
  std::vector<float> xf = Widened(x, n), yf(static_cast<size_t>(n));
  GeluReference<float>(xf.data(), yf.data(), n);
  ToBF16Reference(yf.data(), y, n);
}

void GeluBF16Fast(const BFloat16* x, BFloat16* y, int64_t n) {
  // The f32 kernel's chunks (multiples of 64 elements), so every element meets the vector code
  // it meets in f32.
  ParallelFor(n, kChunkElements, [&](int64_t begin, int64_t end) {
    const int64_t m = end - begin;
    float* xf = Scratch(0, m);
    FromBF16Fast(x + begin, xf, m);
    Simd<float>().gelu(xf, xf, m);
    ToBF16Fast(xf, y + begin, m);
  });
}

void GeluGradBF16Reference(const float* dy, const BFloat16* x, float* dx, int64_t n) {
  std::vector<float> xf = Widened(x, n);
  GeluGradReference<float>(dy, xf.data(), dx, n);
}

void GeluGradBF16Fast(const float* dy, const BFloat16* x, float* dx, int64_t n) {
  ParallelFor(n, kChunkElements, [&](int64_t begin, int64_t end) {
    const int64_t m = end - begin;
    float* xf = Scratch(0, m);
    FromBF16Fast(x + begin, xf, m);
    Simd<float>().gelu_grad(dy + begin, xf, dx + begin, m);
  });
}

void LayerNormBF16Reference(const BFloat16* x, const float* weight, const float* bias, BFloat16* y,
                            int64_t rows, int64_t cols, float eps) {
  const int64_t n = rows * cols;
  std::vector<float> xf = Widened(x, n), yf(static_cast<size_t>(n));
  LayerNormReference<float>(xf.data(), weight, bias, yf.data(), rows, cols, eps);
  ToBF16Reference(yf.data(), y, n);
}

void LayerNormBF16Fast(const BFloat16* x, const float* weight, const float* bias, BFloat16* y,
                       int64_t rows, int64_t cols, float eps) {
  ParallelFor(rows, ChunkRows(cols), [&](int64_t begin, int64_t end) {
    const int64_t at = begin * cols, m = (end - begin) * cols;
    float *xf = Scratch(0, m), *yf = Scratch(1, m);
    FromBF16Fast(x + at, xf, m);
    Simd<float>().layer_norm(xf, weight, bias, yf, end - begin, cols, eps);
    ToBF16Fast(yf, y + at, m);
  });
}

void LayerNormGradXBF16Reference(const float* dy, const BFloat16* x, const float* weight, float* dx,
                                 int64_t rows, int64_t cols, float eps) {
  std::vector<float> xf = Widened(x, rows * cols);
  LayerNormGradXReference<float>(dy, xf.data(), weight, dx, rows, cols, eps);
}

void LayerNormGradXBF16Fast(const float* dy, const BFloat16* x, const float* weight, float* dx,
                            int64_t rows, int64_t cols, float eps) {
  ParallelFor(rows, ChunkRows(cols), [&](int64_t begin, int64_t end) {
    const int64_t at = begin * cols, m = (end - begin) * cols;
    float* xf = Scratch(0, m);
    FromBF16Fast(x + at, xf, m);
    Simd<float>().layer_norm_grad_x(dy + at, xf, weight, dx + at, end - begin, cols, eps);
  });
}

void LayerNormGradParamsBF16Reference(const float* dy, const BFloat16* x, float* dweight,
                                      float* dbias, int64_t rows, int64_t cols, float eps) {
  std::vector<float> xf = Widened(x, rows * cols);
  LayerNormGradParamsReference<float>(dy, xf.data(), dweight, dbias, rows, cols, eps);
}

void LayerNormGradParamsBF16Fast(const float* dy, const BFloat16* x, float* dweight, float* dbias,
                                 int64_t rows, int64_t cols, float eps) {
  // As LayerNormGradParamsFast: one partial per chunk of rows, added in chunk order.
  const int64_t chunk = ChunkRows(cols);
  const int64_t chunks = std::max<int64_t>(1, (rows + chunk - 1) / chunk);
  std::vector<float> partials(static_cast<size_t>(chunks * 2 * cols), 0.0f);
  ParallelFor(rows, chunk, [&](int64_t begin, int64_t end) {
    float* pw = partials.data() + (begin / chunk) * 2 * cols;
    const int64_t at = begin * cols, m = (end - begin) * cols;
    float* xf = Scratch(0, m);
    FromBF16Fast(x + at, xf, m);
    Simd<float>().layer_norm_grad_params(dy + at, xf, pw, pw + cols, end - begin, cols, eps);
  });
  std::fill_n(dweight, cols, 0.0f);
  std::fill_n(dbias, cols, 0.0f);
  for (int64_t c = 0; c < chunks; ++c) {
    const float* pw = partials.data() + c * 2 * cols;
    for (int64_t j = 0; j < cols; ++j) dweight[j] += pw[j];
    for (int64_t j = 0; j < cols; ++j) dbias[j] += pw[cols + j];
  }
}

namespace {

// The f32 kernels' layouts for `sequences` sequences of qkv [T, 3C] and y [T, C].
AttentionLayouts PackedLayouts(const PackedAttentionDims& n) {
  const AttentionLayout in = AttentionLayout::Packed(n.heads, n.t, n.c, 3 * n.c);
  return {in, in, AttentionLayout::Packed(n.heads, n.t, n.c, n.c)};
}

}  // namespace

void CausalAttentionQkvBF16Reference(const BFloat16* qkv, BFloat16* y, float* lse,
                                     const PackedAttentionDims& n, float scale) {
  const int64_t in = n.sequences * n.t * 3 * n.c, out = n.sequences * n.t * n.c;
  std::vector<float> qf = Widened(qkv, in), yf(static_cast<size_t>(out));
  CausalAttentionReference<float>(qf.data(), qf.data() + n.c, qf.data() + 2 * n.c, yf.data(), lse,
                                  n.sequences * n.heads, n.t, n.c / n.heads, scale,
                                  PackedLayouts(n));
  ToBF16Reference(yf.data(), y, out);
}

// One sequence at a time: its qkv widened, the f32 kernel over its heads (on the intra-op
// threads), its y rounded. The scratch is the calling thread's; the kernel's own threads do not
// touch it.
void CausalAttentionQkvBF16Fast(const BFloat16* qkv, BFloat16* y, float* lse,
                                const PackedAttentionDims& n, float scale) {
  const int64_t in = n.t * 3 * n.c, out = n.t * n.c;
  std::vector<float> qf(static_cast<size_t>(in)), yf(static_cast<size_t>(out));
  for (int64_t s = 0; s < n.sequences; ++s) {
    FromBF16Fast(qkv + s * in, qf.data(), in);
    CausalAttentionFast<float>(qf.data(), qf.data() + n.c, qf.data() + 2 * n.c, yf.data(),
                               lse + s * n.heads * n.t, n.heads, n.t, n.c / n.heads, scale,
                               PackedLayouts({1, n.t, n.c, n.heads}));
    ToBF16Fast(yf.data(), y + s * out, out);
  }
}

void CausalAttentionQkvGradBF16Reference(const float* dy, const float* dlse, const BFloat16* qkv,
                                         const BFloat16* y, const float* lse, float* dqkv,
                                         const PackedAttentionDims& n, float scale) {
  const int64_t in = n.sequences * n.t * 3 * n.c, out = n.sequences * n.t * n.c;
  std::vector<float> qf = Widened(qkv, in), yf = Widened(y, out);
  CausalAttentionGradReference<float>(
      dy, dlse, qf.data(), qf.data() + n.c, qf.data() + 2 * n.c, yf.data(), lse, dqkv, dqkv + n.c,
      dqkv + 2 * n.c, n.sequences * n.heads, n.t, n.c / n.heads, scale, PackedLayouts(n));
}

void CausalAttentionQkvGradBF16Fast(const float* dy, const float* dlse, const BFloat16* qkv,
                                    const BFloat16* y, const float* lse, float* dqkv,
                                    const PackedAttentionDims& n, float scale) {
  const int64_t in = n.t * 3 * n.c, out = n.t * n.c, stats = n.heads * n.t;
  std::vector<float> qf(static_cast<size_t>(in)), yf(static_cast<size_t>(out));
  for (int64_t s = 0; s < n.sequences; ++s) {
    FromBF16Fast(qkv + s * in, qf.data(), in);
    FromBF16Fast(y + s * out, yf.data(), out);
    float* dq = dqkv + s * in;
    CausalAttentionGradFast<float>(dy + s * out, dlse == nullptr ? nullptr : dlse + s * stats,
                                   qf.data(), qf.data() + n.c, qf.data() + 2 * n.c, yf.data(),
                                   lse + s * stats, dq, dq + n.c, dq + 2 * n.c, n.heads, n.t,
                                   n.c / n.heads, scale, PackedLayouts({1, n.t, n.c, n.heads}));
  }
}

}  // namespace sluice::kernels
