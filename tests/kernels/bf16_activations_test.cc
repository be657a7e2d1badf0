// The bf16 activation kernels (kernels/bf16_activations.h) compute, bit for bit, what widening
// their bf16 inputs, running the f32 fast kernels and rounding their bf16 outputs computes — at
// sizes spanning several chunks of rows and, for the attention, several sequences and query
// tiles, packed and with the heads apart (grouped) — at 1 and 2 intra-op threads. (Their tolerances
// against the f32 ops and the reference kernels are the op tables' mixed cases, tests/ops/.)
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "sluice/core/dtype.h"
#include "sluice/kernels/attention.h"
#include "sluice/kernels/bf16_activations.h"
#include "sluice/kernels/bf16_convert.h"
#include "sluice/kernels/layer_norm.h"
#include "sluice/kernels/parallel.h"
#include "sluice/kernels/unary.h"

namespace sluice::kernels {
namespace {

std::vector<BFloat16> RandomBf16(int64_t n, float lo, float hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<BFloat16> out(static_cast<size_t>(n));
  for (BFloat16& v : out) v = FloatToBF16(d(rng));
  return out;
}

std::vector<float> RandomF32(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(-1, 1);
  std::vector<float> out(static_cast<size_t>(n));
  for (float& v : out) v = d(rng);
  return out;
}

std::vector<float> Widened(const std::vector<BFloat16>& x) {
  std::vector<float> out(x.size());
  FromBF16Reference(x.data(), out.data(), static_cast<int64_t>(x.size()));
  return out;
}

std::vector<BFloat16> Rounded(const std::vector<float>& x) {
  std::vector<BFloat16> out(x.size());
  ToBF16Reference(x.data(), out.data(), static_cast<int64_t>(x.size()));
  return out;
}

template <typename T>
bool SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0;
}

class Bf16Activations : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { SetIntraOpThreads(GetParam()); }
  void TearDown() override { SetIntraOpThreads(1); }
};

TEST_P(Bf16Activations, GeluIsTheF32KernelBetweenConversions) {
  const int64_t n = 3 * kChunkElements + 77;
  const std::vector<BFloat16> x = RandomBf16(n, -6, 6, 1);
  const std::vector<float> dy = RandomF32(n, 2);
  std::vector<BFloat16> y(static_cast<size_t>(n));
  GeluBF16Fast(x.data(), y.data(), n);
  const std::vector<float> xf = Widened(x);
  std::vector<float> yf(static_cast<size_t>(n)), dx(static_cast<size_t>(n)),
      want_dx(static_cast<size_t>(n));
  GeluFast<float>(xf.data(), yf.data(), n);
  EXPECT_TRUE(SameBits(y, Rounded(yf)));
  GeluGradBF16Fast(dy.data(), x.data(), dx.data(), n);
  GeluGradFast<float>(dy.data(), xf.data(), want_dx.data(), n);
  EXPECT_TRUE(SameBits(dx, want_dx));
}

TEST_P(Bf16Activations, LayerNormIsTheF32KernelBetweenConversions) {
  const int64_t rows = 301, cols = 131;  // several chunks of ChunkRows(131) = 125 rows
  const std::vector<BFloat16> x = RandomBf16(rows * cols, 1, 5, 3);
  const std::vector<float> w = RandomF32(cols, 4), b = RandomF32(cols, 5),
                           dy = RandomF32(rows * cols, 6);
  const std::vector<float> xf = Widened(x);
  std::vector<BFloat16> y(static_cast<size_t>(rows * cols));
  std::vector<float> yf(y.size());
  LayerNormBF16Fast(x.data(), w.data(), b.data(), y.data(), rows, cols, 1e-5f);
  LayerNormFast<float>(xf.data(), w.data(), b.data(), yf.data(), rows, cols, 1e-5f);
  EXPECT_TRUE(SameBits(y, Rounded(yf)));
  std::vector<float> dx(yf.size()), want_dx(yf.size());
  LayerNormGradXBF16Fast(dy.data(), x.data(), w.data(), dx.data(), rows, cols, 1e-5f);
  LayerNormGradXFast<float>(dy.data(), xf.data(), w.data(), want_dx.data(), rows, cols, 1e-5f);
  EXPECT_TRUE(SameBits(dx, want_dx));
  std::vector<float> dw(static_cast<size_t>(cols)), db(dw.size()), want_dw(dw.size()),
      want_db(dw.size());
  LayerNormGradParamsBF16Fast(dy.data(), x.data(), dw.data(), db.data(), rows, cols, 1e-5f);
  LayerNormGradParamsFast<float>(dy.data(), xf.data(), want_dw.data(), want_db.data(), rows, cols,
                                 1e-5f);
  EXPECT_TRUE(SameBits(dw, want_dw));
  EXPECT_TRUE(SameBits(db, want_db));
}

TEST_P(Bf16Activations, PackedAttentionIsTheF32KernelBetweenConversions) {
  const PackedAttentionDims n{
      .sequences = 3, .t = kAttentionQueryTile * 2 + 5, .c = 24, .heads = 3};
  const int64_t in = n.sequences * n.t * 3 * n.c, out = n.sequences * n.t * n.c,
                stats = n.sequences * n.heads * n.t;
  const float scale = 1.0f / std::sqrt(8.0f);
  const std::vector<BFloat16> qkv = RandomBf16(in, -2, 2, 7);
  const std::vector<float> qf = Widened(qkv);
  std::vector<BFloat16> y(static_cast<size_t>(out));
  std::vector<float> lse(static_cast<size_t>(stats)), yf(y.size()), want_lse(lse.size());
  std::vector<float> scratch(static_cast<size_t>(CausalAttentionQkvBF16ScratchFloats(n)));
  CausalAttentionQkvBF16Fast(qkv.data(), y.data(), lse.data(), n, scale, scratch.data());
  const AttentionLayout l_in = AttentionLayout::Packed(n.heads, n.t, n.c, 3 * n.c);
  const AttentionLayouts layouts{l_in, l_in, AttentionLayout::Packed(n.heads, n.t, n.c, n.c)};
  AttentionFast<float>(qf.data(), qf.data() + n.c, qf.data() + 2 * n.c, yf.data(), want_lse.data(),
                       n.sequences * n.heads, n.t, n.c / n.heads, scale, layouts);
  EXPECT_TRUE(SameBits(y, Rounded(yf)));
  EXPECT_TRUE(SameBits(lse, want_lse));
  const std::vector<float> dy = RandomF32(out, 8), dlse = RandomF32(stats, 9);
  const std::vector<float> y_wide = Widened(y);
  std::vector<float> dqkv(static_cast<size_t>(in)), want(dqkv.size());
  CausalAttentionQkvGradBF16Fast(dy.data(), dlse.data(), qkv.data(), y.data(), lse.data(),
                                 dqkv.data(), n, scale, scratch.data());
  AttentionGradFast<float>(dy.data(), dlse.data(), qf.data(), qf.data() + n.c, qf.data() + 2 * n.c,
                           y_wide.data(), lse.data(), want.data(), want.data() + n.c,
                           want.data() + 2 * n.c, n.sequences * n.heads, n.t, n.c / n.heads, scale,
                           layouts);
  EXPECT_TRUE(SameBits(dqkv, want));
}

// The split form (causal_attention's), grouped: 4 query heads over 2 key/value heads.
TEST_P(Bf16Activations, SplitHeadsAttentionIsTheF32KernelBetweenConversions) {
  const HeadsAttentionDims n{
      .sequences = 3, .heads = 4, .kv_heads = 2, .t = kAttentionQueryTile * 2 + 5, .d = 8};
  const int64_t qn = n.sequences * n.heads * n.t * n.d, kvn = n.sequences * n.kv_heads * n.t * n.d,
                stats = n.sequences * n.heads * n.t;
  const float scale = 1.0f / std::sqrt(8.0f);
  const std::vector<BFloat16> q = RandomBf16(qn, -2, 2, 10), k = RandomBf16(kvn, -2, 2, 11),
                              v = RandomBf16(kvn, -2, 2, 12);
  const std::vector<float> qf = Widened(q), kf = Widened(k), vf = Widened(v);
  std::vector<BFloat16> y(static_cast<size_t>(qn));
  std::vector<float> lse(static_cast<size_t>(stats)), yf(y.size()), want_lse(lse.size());
  std::vector<float> scratch(static_cast<size_t>(AttentionBF16ScratchFloats(n)));
  AttentionBF16Fast(q.data(), k.data(), v.data(), y.data(), lse.data(), n, scale, scratch.data());
  const AttentionLayouts layouts = AttentionLayouts::Contiguous(n.t, n.d, n.heads / n.kv_heads);
  AttentionFast<float>(qf.data(), kf.data(), vf.data(), yf.data(), want_lse.data(),
                       n.sequences * n.heads, n.t, n.d, scale, layouts);
  EXPECT_TRUE(SameBits(y, Rounded(yf)));
  EXPECT_TRUE(SameBits(lse, want_lse));
  const std::vector<float> dy = RandomF32(qn, 13), dlse = RandomF32(stats, 14);
  const std::vector<float> y_wide = Widened(y);
  std::vector<float> dq(static_cast<size_t>(qn)), dk(static_cast<size_t>(kvn)), dv(dk.size()),
      want_dq(dq.size()), want_dk(dk.size()), want_dv(dk.size());
  AttentionGradBF16Fast(dy.data(), dlse.data(), q.data(), k.data(), v.data(), y.data(), lse.data(),
                        dq.data(), dk.data(), dv.data(), n, scale, scratch.data());
  AttentionGradFast<float>(dy.data(), dlse.data(), qf.data(), kf.data(), vf.data(), y_wide.data(),
                           lse.data(), want_dq.data(), want_dk.data(), want_dv.data(),
                           n.sequences * n.heads, n.t, n.d, scale, layouts);
  EXPECT_TRUE(SameBits(dq, want_dq));
  EXPECT_TRUE(SameBits(dk, want_dk));
  EXPECT_TRUE(SameBits(dv, want_dv));
}

INSTANTIATE_TEST_SUITE_P(Threads, Bf16Activations, ::testing::Values(1, 2));

}  // namespace
}  // namespace sluice::kernels
