#include "sluice/kernels/bf16_activations.h"

#include <algorithm>
#include <array>
#include <vector>

#include "sluice/kernels/attention.h"
#include "sluice/kernels/bf16_convert.h"
#include "sluice/kernels/bf16_rows.h"
#include "sluice/kernels/layer_norm.h"
#include "sluice/kernels/parallel.h"
#include "sluice/kernels/simd_kernels.h"
#include "sluice/kernels/unary.h"

namespace sluice::kernels {

namespace {

using bf16_rows::kStackFloats;
using bf16_rows::Widened;
using bf16_rows::WidenedRows;

// The elementwise kernels widen kStackFloats elements at a time too (bf16_rows.h).

// Calls fn(begin, end) over [0, n) in pieces of at most `piece` elements.
template <typename F>
void InPieces(int64_t n, int64_t piece, F&& fn) {
  for (int64_t begin = 0; begin < n; begin += piece) fn(begin, std::min(n, begin + piece));
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
    alignas(64) float xf[kStackFloats];
    InPieces(end - begin, kStackFloats, [&](int64_t b, int64_t e) {
      FromBF16Fast(x + begin + b, xf, e - b);
      Simd<float>().gelu(xf, xf, e - b);
      ToBF16Fast(xf, y + begin + b, e - b);
    });
  });
}

void GeluGradBF16Reference(const float* dy, const BFloat16* x, float* dx, int64_t n) {
  std::vector<float> xf = Widened(x, n);
  GeluGradReference<float>(dy, xf.data(), dx, n);
}

void GeluGradBF16Fast(const float* dy, const BFloat16* x, float* dx, int64_t n) {
  ParallelFor(n, kChunkElements, [&](int64_t begin, int64_t end) {
    alignas(64) float xf[kStackFloats];
    InPieces(end - begin, kStackFloats, [&](int64_t b, int64_t e) {
      FromBF16Fast(x + begin + b, xf, e - b);
      Simd<float>().gelu_grad(dy + begin + b, xf, dx + begin + b, e - b);
    });
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
  // In place in the widened rows: the f32 kernel reads a row's statistics before it writes the
  // row, and each element before writing it.
  ParallelFor(rows, ChunkRows(cols), [&](int64_t begin, int64_t end) {
    WidenedRows(x, begin, end, cols, [&](int64_t r, int64_t n, float* xf) {
      Simd<float>().layer_norm(xf, weight, bias, xf, n, cols, eps);
      ToBF16Fast(xf, y + r * cols, n * cols);
    });
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
    WidenedRows(x, begin, end, cols, [&](int64_t r, int64_t n, float* xf) {
      const int64_t at = r * cols;
      Simd<float>().layer_norm_grad_x(dy + at, xf, weight, dx + at, n, cols, eps);
    });
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
    // The chunk's rows in groups, added into its partial in row order as in one call.
    float* pw = partials.data() + (begin / chunk) * 2 * cols;
    WidenedRows(x, begin, end, cols, [&](int64_t r, int64_t n, float* xf) {
      Simd<float>().layer_norm_grad_params(dy + r * cols, xf, pw, pw + cols, n, cols, eps);
    });
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

// The f32 kernels' layouts for q, y [H, T, D] and k, v [H_kv, T, D] of each sequence.
AttentionLayouts HeadsLayouts(const HeadsAttentionDims& n) {
  return AttentionLayouts::Contiguous(n.t, n.d, n.heads / n.kv_heads);
}

// The mask of every sequence's heads: its bias rows shared by the n.heads query entries of a
// sequence.
AttentionMask<float> HeadsMask(const AttentionMask<float>& mask, const HeadsAttentionDims& n) {
  return {mask.causal, mask.key_bias, n.heads};
}

// The mask of sequence s alone (the fast kernels' calls, one sequence each): its bias row.
AttentionMask<float> SequenceMask(const AttentionMask<float>& mask, const HeadsAttentionDims& n,
                                  int64_t s) {
  return {mask.causal, mask.key_bias == nullptr ? nullptr : mask.key_bias + s * n.t, n.heads};
}

// A bf16 operand of the attention kernels, sequence after sequence: sequence s's part is
// data + s·size, `size` elements.
struct SequenceBlock {
  const BFloat16* data;
  int64_t size;
};

// The fast attention kernels' loop: for each sequence s, every block's part of s widened into the
// scratch one after the other (on the intra-op threads), then fn(s, widened, rest), widened[i]
// the f32 copy of blocks[i]'s part and rest the scratch past them (where forward puts its f32 y).
template <size_t N, typename F>
void ForEachWidenedSequence(int64_t sequences, const std::array<SequenceBlock, N>& blocks,
                            float* scratch, F&& fn) {
  for (int64_t s = 0; s < sequences; ++s) {
    std::array<const float*, N> widened;
    float* at = scratch;
    for (size_t i = 0; i < N; ++i) {
      FromBF16Parallel(blocks[i].data + s * blocks[i].size, at, blocks[i].size);
      widened[i] = at;
      at += blocks[i].size;
    }
    fn(s, widened, at);
  }
}

}  // namespace

void CausalAttentionQkvBF16Reference(const BFloat16* qkv, BFloat16* y, float* lse,
                                     const PackedAttentionDims& n, float scale) {
  const int64_t in = n.sequences * n.t * 3 * n.c, out = n.sequences * n.t * n.c;
  std::vector<float> qf = Widened(qkv, in), yf(static_cast<size_t>(out));
  AttentionReference<float>(qf.data(), qf.data() + n.c, qf.data() + 2 * n.c, yf.data(), lse,
                            n.sequences * n.heads, n.t, n.c / n.heads, scale, PackedLayouts(n));
  ToBF16Reference(yf.data(), y, out);
}

int64_t CausalAttentionQkvBF16ScratchFloats(const PackedAttentionDims& n) { return n.t * 4 * n.c; }

// One sequence at a time: its qkv widened into the scratch, the f32 kernel over its heads, its y
// rounded (each on the intra-op threads).
void CausalAttentionQkvBF16Fast(const BFloat16* qkv, BFloat16* y, float* lse,
                                const PackedAttentionDims& n, float scale, float* scratch) {
  const int64_t in = n.t * 3 * n.c, out = n.t * n.c;
  ForEachWidenedSequence<1>(n.sequences, {{{qkv, in}}}, scratch, [&](int64_t s, auto w, float* yf) {
    AttentionFast<float>(w[0], w[0] + n.c, w[0] + 2 * n.c, yf, lse + s * n.heads * n.t, n.heads,
                         n.t, n.c / n.heads, scale, PackedLayouts({1, n.t, n.c, n.heads}));
    ToBF16Parallel(yf, y + s * out, out);
  });
}

void CausalAttentionQkvGradBF16Reference(const float* dy, const float* dlse, const BFloat16* qkv,
                                         const BFloat16* y, const float* lse, float* dqkv,
                                         const PackedAttentionDims& n, float scale) {
  const int64_t in = n.sequences * n.t * 3 * n.c, out = n.sequences * n.t * n.c;
  std::vector<float> qf = Widened(qkv, in), yf = Widened(y, out);
  AttentionGradReference<float>(dy, dlse, qf.data(), qf.data() + n.c, qf.data() + 2 * n.c,
                                yf.data(), lse, dqkv, dqkv + n.c, dqkv + 2 * n.c,
                                n.sequences * n.heads, n.t, n.c / n.heads, scale, PackedLayouts(n));
}

void CausalAttentionQkvGradBF16Fast(const float* dy, const float* dlse, const BFloat16* qkv,
                                    const BFloat16* y, const float* lse, float* dqkv,
                                    const PackedAttentionDims& n, float scale, float* scratch) {
  const int64_t in = n.t * 3 * n.c, out = n.t * n.c, stats = n.heads * n.t;
  ForEachWidenedSequence<2>(
      n.sequences, {{{qkv, in}, {y, out}}}, scratch, [&](int64_t s, auto w, float*) {
        float* dq = dqkv + s * in;
        AttentionGradFast<float>(dy + s * out, dlse == nullptr ? nullptr : dlse + s * stats, w[0],
                                 w[0] + n.c, w[0] + 2 * n.c, w[1], lse + s * stats, dq, dq + n.c,
                                 dq + 2 * n.c, n.heads, n.t, n.c / n.heads, scale,
                                 PackedLayouts({1, n.t, n.c, n.heads}));
      });
}

void AttentionBF16Reference(const BFloat16* q, const BFloat16* k, const BFloat16* v, BFloat16* y,
                            float* lse, const HeadsAttentionDims& n, float scale,
                            const AttentionMask<float>& mask) {
  const int64_t qn = n.sequences * n.heads * n.t * n.d, kvn = n.sequences * n.kv_heads * n.t * n.d;
  std::vector<float> qf = Widened(q, qn), kf = Widened(k, kvn), vf = Widened(v, kvn),
                     yf(static_cast<size_t>(qn));
  AttentionReference<float>(qf.data(), kf.data(), vf.data(), yf.data(), lse, n.sequences * n.heads,
                            n.t, n.d, scale, HeadsLayouts(n), HeadsMask(mask, n));
  ToBF16Reference(yf.data(), y, qn);
}

int64_t AttentionBF16ScratchFloats(const HeadsAttentionDims& n) {
  return n.t * n.d * (2 * n.heads + 2 * n.kv_heads);
}

// As the packed form: one sequence's q, k, v widened, the f32 kernel over its heads, its y rounded.
void AttentionBF16Fast(const BFloat16* q, const BFloat16* k, const BFloat16* v, BFloat16* y,
                       float* lse, const HeadsAttentionDims& n, float scale, float* scratch,
                       const AttentionMask<float>& mask) {
  const int64_t qn = n.heads * n.t * n.d, kvn = n.kv_heads * n.t * n.d;
  ForEachWidenedSequence<3>(
      n.sequences, {{{q, qn}, {k, kvn}, {v, kvn}}}, scratch, [&](int64_t s, auto w, float* yf) {
        AttentionFast<float>(w[0], w[1], w[2], yf, lse + s * n.heads * n.t, n.heads, n.t, n.d,
                             scale, HeadsLayouts(n), SequenceMask(mask, n, s));
        ToBF16Parallel(yf, y + s * qn, qn);
      });
}

void AttentionGradBF16Reference(const float* dy, const float* dlse, const BFloat16* q,
                                const BFloat16* k, const BFloat16* v, const BFloat16* y,
                                const float* lse, float* dq, float* dk, float* dv,
                                const HeadsAttentionDims& n, float scale,
                                const AttentionMask<float>& mask) {
  const int64_t qn = n.sequences * n.heads * n.t * n.d, kvn = n.sequences * n.kv_heads * n.t * n.d;
  std::vector<float> qf = Widened(q, qn), kf = Widened(k, kvn), vf = Widened(v, kvn),
                     yf = Widened(y, qn);
  AttentionGradReference<float>(dy, dlse, qf.data(), kf.data(), vf.data(), yf.data(), lse, dq, dk,
                                dv, n.sequences * n.heads, n.t, n.d, scale, HeadsLayouts(n),
                                HeadsMask(mask, n));
}

void AttentionGradBF16Fast(const float* dy, const float* dlse, const BFloat16* q, const BFloat16* k,
                           const BFloat16* v, const BFloat16* y, const float* lse, float* dq,
                           float* dk, float* dv, const HeadsAttentionDims& n, float scale,
                           float* scratch, const AttentionMask<float>& mask) {
  const int64_t qn = n.heads * n.t * n.d, kvn = n.kv_heads * n.t * n.d, stats = n.heads * n.t;
  ForEachWidenedSequence<4>(n.sequences, {{{q, qn}, {k, kvn}, {v, kvn}, {y, qn}}}, scratch,
                            [&](int64_t s, auto w, float*) {
                              AttentionGradFast<float>(
                                  dy + s * qn, dlse == nullptr ? nullptr : dlse + s * stats, w[0],
                                  w[1], w[2], w[3], lse + s * stats, dq + s * qn, dk + s * kvn,
                                  dv + s * kvn, n.heads, n.t, n.d, scale, HeadsLayouts(n),
                                  SequenceMask(mask, n, s));
                            });
}

}  // namespace sluice::kernels
