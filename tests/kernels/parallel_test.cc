// Intra-op threads (kernels/parallel.h): ParallelFor hands out fixed chunks once each, runs
// serially inside a pool job, passes errors back; and every threaded kernel gives bitwise the same
// results at 1, 2 and 3 threads.
#include "sluice/kernels/parallel.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "sluice/core/error.h"
#include "sluice/core/tensor.h"
#include "sluice/core/thread_pool.h"
#include "sluice/kernels/attention.h"
#include "sluice/kernels/binary.h"
#include "sluice/kernels/conv.h"
#include "sluice/kernels/cross_entropy.h"
#include "sluice/kernels/embedding.h"
#include "sluice/kernels/layer_norm.h"
#include "sluice/kernels/matmul.h"
#include "sluice/kernels/onednn_conv.h"
#include "sluice/kernels/optimizer.h"
#include "sluice/kernels/reduce.h"
#include "sluice/kernels/rms_norm.h"
#include "sluice/kernels/softmax.h"
#include "sluice/kernels/unary.h"

namespace sluice::kernels {
namespace {

// Restores one intra-op thread when a test ends, whatever it set.
class ParallelKernels : public ::testing::Test {
 protected:
  void TearDown() override {
    SetIntraOpThreads(1);
    SetBlasThreads(1);
  }
};

std::vector<float> Random(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(rng);
  return v;
}

using Chunks = std::set<std::pair<int64_t, int64_t>>;

Chunks RecordChunks(int64_t n, int64_t chunk, std::set<std::thread::id>* threads = nullptr) {
  std::mutex mu;
  Chunks chunks;
  ParallelFor(n, chunk, [&](int64_t begin, int64_t end) {
    std::lock_guard lock(mu);
    EXPECT_TRUE(chunks.emplace(begin, end).second) << begin;
    if (threads != nullptr) threads->insert(std::this_thread::get_id());
  });
  return chunks;
}

TEST_F(ParallelKernels, ChunksAreFixedByTheWorkNotTheThreads) {
  const Chunks expected = {{0, 40}, {40, 80}, {80, 100}};
  for (int threads : {1, 2, 3}) {
    SetIntraOpThreads(threads);
    EXPECT_EQ(IntraOpThreads(), threads);
    EXPECT_EQ(RecordChunks(100, 40), expected) << threads << " threads";
  }
  EXPECT_TRUE(RecordChunks(0, 40).empty());
  EXPECT_EQ(RecordChunks(5, 40), (Chunks{{0, 5}}));
}

TEST_F(ParallelKernels, ManyChunksUseThePoolsThreads) {
  SetIntraOpThreads(3);
  // Enough chunks, each slow enough, that a worker wakes before the caller has taken them all.
  std::set<std::thread::id> threads;
  std::mutex mu;
  ParallelFor(64, 1, [&](int64_t, int64_t) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::lock_guard lock(mu);
    threads.insert(std::this_thread::get_id());
  });
  EXPECT_GT(threads.size(), 1u);
}

TEST_F(ParallelKernels, InsideAPoolJobChunksRunOnTheCaller) {
  SetIntraOpThreads(3);
  ThreadPool outer(2);
  std::atomic<int> foreign{0};
  outer.RunOnAll([&](int) {
    const std::thread::id me = std::this_thread::get_id();
    ParallelFor(64, 1, [&](int64_t, int64_t) {
      if (std::this_thread::get_id() != me) foreign.fetch_add(1);
    });
  });
  EXPECT_EQ(foreign.load(), 0);
}

TEST_F(ParallelKernels, AChunksErrorReachesTheCallerAndThePoolStaysUsable) {
  SetIntraOpThreads(2);
  EXPECT_THROW(ParallelFor(100, 1,
                           [](int64_t begin, int64_t) {
                             if (begin == 37) throw std::runtime_error("chunk 37");
                           }),
               std::runtime_error);
  EXPECT_EQ(RecordChunks(10, 3).size(), 4u);
}

TEST_F(ParallelKernels, ConcurrentCallersEachCoverTheirWork) {
  SetIntraOpThreads(2);
  std::vector<std::thread> callers;
  std::atomic<int64_t> sums[4] = {};
  for (int k = 0; k < 4; ++k) {
    callers.emplace_back([&, k] {
      ParallelFor(1000, 7, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) sums[k].fetch_add(i);
      });
    });
  }
  for (std::thread& t : callers) t.join();
  for (auto& s : sums) EXPECT_EQ(s.load(), 999 * 1000 / 2);
}

TEST_F(ParallelKernels, BadCountsAreInvalidArguments) {
  EXPECT_THROW(SetIntraOpThreads(0), InvalidArgument);
  EXPECT_THROW(SetIntraOpThreads(ThreadPool::kMaxThreads + 1), InvalidArgument);
}

TEST_F(ParallelKernels, ParallelSumAddsChunksInOrder) {
  // 1e8 + 1 + ... : added left to right per chunk, then chunks in order, the same every time.
  std::vector<double> x(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = i % 3 == 0 ? 1e8 : 0.1 * static_cast<double>(i);
  auto sum = [&] {
    return ParallelSum<double>(1000, 64, [&](int64_t begin, int64_t end) {
      double s = 0;
      for (int64_t i = begin; i < end; ++i) s += x[i];
      return s;
    });
  };
  SetIntraOpThreads(1);
  const double one = sum();
  for (int threads : {2, 3}) {
    SetIntraOpThreads(threads);
    EXPECT_EQ(sum(), one) << threads;
  }
}

// Runs `kernel` (which fills and returns its outputs) at 1, 2 and 3 threads; every output must be
// bitwise the same.
void ExpectBitwiseAcrossThreads(const std::function<std::vector<float>()>& kernel,
                                const char* name) {
  SetIntraOpThreads(1);
  const std::vector<float> one = kernel();
  ASSERT_FALSE(one.empty()) << name;
  for (int threads : {2, 3}) {
    SetIntraOpThreads(threads);
    const std::vector<float> many = kernel();
    ASSERT_EQ(many.size(), one.size()) << name;
    EXPECT_EQ(std::memcmp(many.data(), one.data(), one.size() * sizeof(float)), 0)
        << name << " differs at " << threads << " threads";
  }
}

// Shapes large enough for several chunks (kChunkCost elements each), ragged on purpose.
constexpr int64_t kRows = 517, kCols = 133;

TEST_F(ParallelKernels, RowKernelsAreBitwiseTheSameAtAnyThreadCount) {
  const std::vector<float> x = Random(kRows * kCols, 1), dy = Random(kRows * kCols, 2);
  const std::vector<float> w = Random(kCols, 3), b = Random(kCols, 4);
  std::vector<float> y(x.size()), z(x.size());
  ExpectBitwiseAcrossThreads(
      [&] {
        SoftmaxFast(x.data(), y.data(), kRows, kCols);
        SoftmaxGradFast(dy.data(), y.data(), z.data(), kRows, kCols);
        std::vector<float> out = y;
        out.insert(out.end(), z.begin(), z.end());
        return out;
      },
      "softmax");
  ExpectBitwiseAcrossThreads(
      [&] {
        const int64_t t = 47, batch = 31;  // 31 · 47 · 47 scores fit in x
        std::vector<float> s(static_cast<size_t>(batch * t * t));
        CausalSoftmaxFast(x.data(), s.data(), batch, t);
        return s;
      },
      "causal_softmax");
  ExpectBitwiseAcrossThreads(
      [&] {
        std::vector<float> dw(kCols), db(kCols);
        LayerNormFast(x.data(), w.data(), b.data(), y.data(), kRows, kCols, 1e-5f);
        LayerNormGradXFast(dy.data(), x.data(), w.data(), z.data(), kRows, kCols, 1e-5f);
        LayerNormGradParamsFast(dy.data(), x.data(), dw.data(), db.data(), kRows, kCols, 1e-5f);
        std::vector<float> out = y;
        out.insert(out.end(), z.begin(), z.end());
        out.insert(out.end(), dw.begin(), dw.end());
        out.insert(out.end(), db.begin(), db.end());
        return out;
      },
      "layer_norm");
  ExpectBitwiseAcrossThreads(
      [&] {
        std::vector<float> dw(kCols);
        RmsNormFast(x.data(), w.data(), y.data(), kRows, kCols, 1e-6f);
        RmsNormGradXFast(dy.data(), x.data(), w.data(), z.data(), kRows, kCols, 1e-6f);
        RmsNormGradWeightFast(dy.data(), x.data(), dw.data(), kRows, kCols, 1e-6f);
        std::vector<float> out = y;
        out.insert(out.end(), z.begin(), z.end());
        out.insert(out.end(), dw.begin(), dw.end());
        return out;
      },
      "rms_norm");
  ExpectBitwiseAcrossThreads(
      [&] {
        const int64_t n = kRows * kCols;
        std::vector<float> out(static_cast<size_t>(4 * n));
        GeluFast(x.data(), out.data(), n);
        TanhFast(x.data(), out.data() + n, n);
        ExpFast(x.data(), out.data() + 2 * n, n);
        GeluGradFast(dy.data(), x.data(), out.data() + 3 * n, n);
        return out;
      },
      "unary");
}

TEST_F(ParallelKernels, LossEmbeddingOptimizerAndAttentionAreBitwiseTheSame) {
  const std::vector<float> logits = Random(kRows * kCols, 5);
  std::vector<int32_t> ids(kRows);
  for (int64_t r = 0; r < kRows; ++r) ids[r] = static_cast<int32_t>((r * 37) % kCols);
  ids[3] = static_cast<int32_t>(kIgnoreTarget);
  ExpectBitwiseAcrossThreads(
      [&] {
        std::vector<float> out(logits.size() + 1);
        out[0] = CrossEntropyFast(logits.data(), ids.data(), kRows, kCols);
        CrossEntropyGradFast(logits.data(), ids.data(), 0.5f, out.data() + 1, kRows, kCols);
        return out;
      },
      "cross_entropy");
  ids[3] = 0;
  const std::vector<float> table = Random(kCols * 96, 6), dy = Random(kRows * 96, 7);
  ExpectBitwiseAcrossThreads(
      [&] {
        std::vector<float> out(static_cast<size_t>(kRows * 96 + kCols * 96));
        EmbeddingFast(ids.data(), table.data(), out.data(), kRows, kCols, 96);
        EmbeddingGradFast(ids.data(), dy.data(), out.data() + kRows * 96, kRows, kCols, 96);
        return out;
      },
      "embedding");
  ExpectBitwiseAcrossThreads(
      [&] {
        std::vector<float> p = Random(70001, 8), m = Random(70001, 9), v = Random(70001, 10);
        for (float& x : v) x = std::abs(x);
        const std::vector<float> g = Random(70001, 11);
        AdamWUpdateFast(p.data(), g.data(), m.data(), v.data(), 70001, AdamWHyper{}, 1e-3, 3.0);
        std::vector<float> buf(70001, 0.25f);
        SgdUpdateFast(p.data(), g.data(), buf.data(), 70001, SgdHyper{.momentum = 0.9}, 0.1);
        p.insert(p.end(), m.begin(), m.end());
        p.insert(p.end(), v.begin(), v.end());
        p.insert(p.end(), buf.begin(), buf.end());
        return p;
      },
      "adamw, sgd");
  const int64_t batch = 6, t = 70, d = 16;
  const std::vector<float> q = Random(batch * t * d, 12), k = Random(batch * t * d, 13),
                           v = Random(batch * t * d, 14), dyy = Random(batch * t * d, 15);
  ExpectBitwiseAcrossThreads(
      [&] {
        const size_t n = static_cast<size_t>(batch * t * d);
        std::vector<float> y(n), lse(static_cast<size_t>(batch * t)), grads(3 * n);
        CausalAttentionFast(q.data(), k.data(), v.data(), y.data(), lse.data(), batch, t, d, 0.25f);
        CausalAttentionGradFast(dyy.data(), static_cast<const float*>(nullptr), q.data(), k.data(),
                                v.data(), y.data(), lse.data(), grads.data(), grads.data() + n,
                                grads.data() + 2 * n, batch, t, d, 0.25f);
        y.insert(y.end(), lse.begin(), lse.end());
        y.insert(y.end(), grads.begin(), grads.end());
        return y;
      },
      "attention");
  // Grouped-query: 3 query entries per key/value entry (batch 6 queries, 2 keys and values), dk
  // and dv summed over each group.
  ExpectBitwiseAcrossThreads(
      [&] {
        const size_t n = static_cast<size_t>(batch * t * d), nkv = n / 3;
        std::vector<float> y(n), lse(static_cast<size_t>(batch * t)), grads(n + 2 * nkv);
        const AttentionLayouts grouped = AttentionLayouts::Contiguous(t, d, 3);
        AttentionFast(q.data(), k.data(), v.data(), y.data(), lse.data(), batch, t, d, 0.25f,
                      grouped);
        AttentionGradFast(dyy.data(), lse.data(), q.data(), k.data(), v.data(), y.data(),
                          lse.data(), grads.data(), grads.data() + n, grads.data() + n + nkv, batch,
                          t, d, 0.25f, grouped);
        y.insert(y.end(), lse.begin(), lse.end());
        y.insert(y.end(), grads.begin(), grads.end());
        return y;
      },
      "attention, grouped-query");
  // The packed layout (heads side by side in qkv [B, T, 3C] and y [B, T, C]): batch 6 = 2 · 3
  // heads.
  const int64_t heads = 3, c = heads * d, seqs = batch / heads;
  const std::vector<float> qkv = Random(seqs * t * 3 * c, 16), dy_packed = Random(seqs * t * c, 17);
  const AttentionLayout in = AttentionLayout::Packed(heads, t, c, 3 * c),
                        out = AttentionLayout::Packed(heads, t, c, c);
  ExpectBitwiseAcrossThreads(
      [&] {
        std::vector<float> y(static_cast<size_t>(seqs * t * c)),
            lse(static_cast<size_t>(batch * t)), dqkv(qkv.size());
        const float* q = qkv.data();
        AttentionFast(q, q + c, q + 2 * c, y.data(), lse.data(), batch, t, d, 0.25f, {in, in, out});
        AttentionGradFast(dy_packed.data(), lse.data(), q, q + c, q + 2 * c, y.data(), lse.data(),
                          dqkv.data(), dqkv.data() + c, dqkv.data() + 2 * c, batch, t, d, 0.25f,
                          {in, in, out});
        y.insert(y.end(), lse.begin(), lse.end());
        y.insert(y.end(), dqkv.begin(), dqkv.end());
        return y;
      },
      "attention, packed heads");
}

// Column sums (a bias gradient: [B, T, C] summed over B and T) are bitwise the reference's sums at
// every thread count: each column is added top to bottom from 0 whichever chunk holds it. Widths
// around the 64-column chunks and the vector widths, and a long column (several chunks of rows'
// worth of work).
TEST_F(ParallelKernels, ColumnSumsAreBitwiseTheReferenceAtAnyThreadCount) {
  for (const Shape& shape : {Shape{kRows, kCols}, Shape{4, 129, 200}, Shape{2, 16, 1000},
                             Shape{3000, 7}, Shape{5, 64}, Shape{1, 1, 17}}) {
    SCOPED_TRACE(shape.ToString());
    const std::vector<float> x = Random(shape.numel(), 19);
    AxisSet reduced;
    for (int d = 0; d + 1 < shape.rank(); ++d) reduced[d] = true;
    const int64_t cols = shape[shape.rank() - 1];
    std::vector<float> ref(static_cast<size_t>(cols));
    SumReference(x.data(), shape, reduced, ref.data());
    for (int threads : {1, 2, 3}) {
      SetIntraOpThreads(threads);
      std::vector<float> fast(static_cast<size_t>(cols), -1.0f);
      SumFast(x.data(), shape, reduced, fast.data());
      EXPECT_EQ(std::memcmp(fast.data(), ref.data(), fast.size() * sizeof(float)), 0)
          << "at " << threads << " threads";
    }
  }
}

TEST_F(ParallelKernels, BroadcastBinaryIsBitwiseTheSame) {
  const Tensor a = Tensor::FromVector<float>({kRows, 3, kCols}, Random(kRows * 3 * kCols, 16));
  const Tensor b = Tensor::FromVector<float>({3, 1}, Random(3, 17));
  const Tensor c = Tensor::FromVector<float>({kRows, 3, kCols}, Random(kRows * 3 * kCols, 18));
  ExpectBitwiseAcrossThreads(
      [&] {
        Tensor broadcast = Tensor::Empty(a.shape(), DType::kF32);
        Tensor flat = Tensor::Empty(a.shape(), DType::kF32);
        BinaryFast<float>(a, b, broadcast, std::multiplies<>{});
        BinaryFast<float>(a, c, flat, std::plus<>{});
        std::vector<float> out(broadcast.data<float>(), broadcast.data<float>() + a.numel());
        out.insert(out.end(), flat.data<float>(), flat.data<float>() + a.numel());
        return out;
      },
      "binary");
  // And the threaded fast kernel agrees with the reference exactly (elementwise: no sums).
  SetIntraOpThreads(3);
  Tensor fast = Tensor::Empty(a.shape(), DType::kF32), ref = Tensor::Empty(a.shape(), DType::kF32);
  BinaryFast<float>(a, b, fast, std::multiplies<>{});
  BinaryReference<float>(a, b, ref, std::multiplies<>{});
  EXPECT_EQ(std::memcmp(fast.data<float>(), ref.data<float>(), a.numel() * sizeof(float)), 0);
}

// The largest |a − b| over the largest |b|.
float RelativeDifference(const std::vector<float>& a, const std::vector<float>& b) {
  float diff = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    diff = std::max(diff, std::abs(a[i] - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return diff / scale;
}

// Convolutions whose im2col comes in several blocks of output rows (C·KH·KW · OW · OH is past
// kConv2dColsBudget), with padding, strides and ragged sizes; and one on oneDNN (onednn_conv.h) in
// chunks of images, a remainder among them; grouped ones: on oneDNN in chunks, and a depthwise
// one on the direct kernels (oneDNN's scratch would outgrow its activations).
TEST_F(ParallelKernels, ConvolutionAndPoolingAreBitwiseTheSame) {
  struct Case {
    Conv2dDims d;
    const char* name;
  };
  const std::vector<Case> cases = {
      {Conv2dShape(3, 16, 70, 66, 8, 3, 3, {1, 1}, {1, 1}), "conv2d 3x3"},
      {Conv2dShape(2, 12, 75, 61, 5, 5, 3, {2, 1}, {2, 0}), "conv2d 5x3 strided"},
      {Conv2dShape(5, 16, 30, 22, 16, 3, 3, {1, 1}, {1, 1}), "conv2d 3x3 on oneDNN"},
      {Conv2dShape(5, 24, 30, 22, 24, 3, 3, {1, 1}, {1, 1}, {1, 1}, 3), "conv2d in 3 groups"},
      {Conv2dShape(4, 32, 12, 12, 32, 3, 3, {1, 1}, {1, 1}, {1, 1}, 32), "conv2d depthwise direct"},
  };
  for (const Case& c : cases) {
    const Conv2dDims& d = c.d;
    if (OneDnnConvolves(d)) {
      ASSERT_LT(OneDnnConvImages(d), d.batch) << c.name << ": one chunk";
      ASSERT_NE(d.batch % OneDnnConvImages(d), 0) << c.name << ": no remainder";
    } else if (Conv2dDepthwise(d)) {
      ASSERT_EQ(Conv2dScratchBytes(d, Conv2dPass::kGradWeight, 4), 0) << c.name << ": scratch";
    } else {
      ASSERT_LT(Conv2dBlockRows(d), d.out_h) << c.name << ": one block";
    }
    const int64_t xs = d.batch * d.channels * d.height * d.width;
    const int64_t ws = d.out_channels * Conv2dGroupChannels(d) * d.kernel_h * d.kernel_w;
    const int64_t ys = d.batch * d.out_channels * d.out_h * d.out_w;
    const std::vector<float> x = Random(xs, 20), w = Random(ws, 21), dy = Random(ys, 22);
    int64_t scratch = 0;
    for (Conv2dPass pass :
         {Conv2dPass::kForward, Conv2dPass::kGradInput, Conv2dPass::kGradWeight}) {
      scratch = std::max(scratch, Conv2dScratchBytes(d, pass, sizeof(float)));
    }
    std::vector<float> cols(static_cast<size_t>(scratch / 4));
    auto run = [&](bool fast) {
      std::vector<float> y(ys), dx(xs), dw(ws);
      if (fast) {
        Conv2dFast(x.data(), w.data(), y.data(), d, cols.data());
        Conv2dGradInputFast(dy.data(), w.data(), dx.data(), d, cols.data());
        Conv2dGradWeightFast(dy.data(), x.data(), dw.data(), d, cols.data());
      } else {
        Conv2dReference(x.data(), w.data(), y.data(), d);
        Conv2dGradInputReference(dy.data(), w.data(), dx.data(), d);
        Conv2dGradWeightReference(dy.data(), x.data(), dw.data(), d);
      }
      return std::vector<std::vector<float>>{y, dx, dw};
    };
    auto flat = [&] {
      std::vector<float> out;
      for (const std::vector<float>& v : run(true)) out.insert(out.end(), v.begin(), v.end());
      return out;
    };
    ExpectBitwiseAcrossThreads(flat, c.name);
    // With the GEMMs on two OpenBLAS threads too, as `--threads 2` runs them: every run gives
    // the same bits (OpenBLAS's threaded GEMM may round differently from its one-thread GEMM, so
    // across thread counts only the intra-op part is bitwise).
    SetIntraOpThreads(2);
    SetBlasThreads(2);
    const std::vector<float> first = flat();
    for (int again = 0; again < 3; ++again) {
      const std::vector<float> next = flat();
      EXPECT_EQ(std::memcmp(next.data(), first.data(), first.size() * sizeof(float)), 0)
          << c.name << " run " << again + 2 << " at 2 threads";
    }
    SetBlasThreads(1);
    // The blocks cover the image: fast agrees with the reference to rounding.
    const auto fast = run(true), reference = run(false);
    for (int k = 0; k < 3; ++k) {
      EXPECT_LE(RelativeDifference(fast[k], reference[k]), 1e-5f) << c.name << " output " << k;
    }
  }
  const Conv2dDims max = Conv2dShape(5, 7, 33, 31, 7, 2, 2, {2, 2}, {0, 0});
  const Conv2dDims avg = Conv2dShape(5, 7, 33, 31, 7, 3, 3, {2, 1}, {1, 1});
  const std::vector<float> x = Random(5 * 7 * 33 * 31, 23), dy = Random(5 * 7 * 33 * 31, 24);
  auto pools = [&](bool fast) {
    const int64_t xs = 5 * 7 * 33 * 31;
    std::vector<float> ym(5 * 7 * max.out_h * max.out_w), ya(5 * 7 * avg.out_h * avg.out_w);
    std::vector<float> dxm(xs), dxa(xs);
    if (fast) {
      MaxPool2dFast(x.data(), ym.data(), max);
      MaxPool2dGradFast(dy.data(), x.data(), dxm.data(), max);
      AvgPool2dFast(x.data(), ya.data(), avg);
      AvgPool2dGradFast(dy.data(), dxa.data(), avg);
    } else {
      MaxPool2dReference(x.data(), ym.data(), max);
      MaxPool2dGradReference(dy.data(), x.data(), dxm.data(), max);
      AvgPool2dReference(x.data(), ya.data(), avg);
      AvgPool2dGradReference(dy.data(), dxa.data(), avg);
    }
    for (const std::vector<float>* v : {&dxm, &ya, &dxa}) ym.insert(ym.end(), v->begin(), v->end());
    return ym;
  };
  ExpectBitwiseAcrossThreads([&] { return pools(true); }, "pooling");
  // And the fast pools are bitwise the reference (the same sums in the same order).
  SetIntraOpThreads(3);
  const std::vector<float> fast = pools(true), reference = pools(false);
  EXPECT_EQ(std::memcmp(fast.data(), reference.data(), fast.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace sluice::kernels
