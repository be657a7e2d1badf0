// Op table: dropout, plus what its mask must be — the generator's published known answers, the
// share of kept elements, the scaling, p = 0 and p = 1, evaluation, independence of the thread
// count and of the stream and key, and a gradient that draws the mask again instead of keeping it.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "op_harness.h"
#include "sluice/autodiff/autodiff.h"
#include "sluice/exec/reference_runner.h"
#include "sluice/ir/autocast.h"
#include "sluice/ir/inference_form.h"
#include "sluice/ir/ops.h"
#include "sluice/ir/text_format.h"
#include "sluice/kernels/dropout.h"
#include "sluice/kernels/parallel.h"

namespace sluice::testing {

namespace {

Attrs DropAttrs(double p, int64_t stream = 0) { return {{"p", p}, {"stream", stream}}; }

}  // namespace

// clang-format off
std::vector<OpCase> DropoutCases() {
  // Keys anywhere in i64 (negative ones too: the key's bits are what the generator takes).
  const Fill keys = {Fill::kIndex, -1e9, 1e9};
  return {
      // One key per example (x's leading axis), or one for all (an i64[] key). The harness's
      // finite differences hold exactly: for fixed keys the op is linear in x.
      {.label = "dropout", .op = "dropout", .inputs = {F({4, 33}), I64({4})}, .attrs = DropAttrs(0.1), .fills = {{}, keys}},
      {.label = "dropout_half_stream", .op = "dropout", .inputs = {F({2, 3, 17}), I64({2})}, .attrs = DropAttrs(0.5, 7), .fills = {{}, keys}},
      {.label = "dropout_p0", .op = "dropout", .inputs = {F({5, 7}), I64({5})}, .attrs = DropAttrs(0.0), .fills = {{}, keys}},
      {.label = "dropout_p1", .op = "dropout", .inputs = {F({5, 7}), I64({5})}, .attrs = DropAttrs(1.0), .fills = {{}, keys}},
      {.label = "dropout_scalar", .op = "dropout", .inputs = {F({}), I64({})}, .attrs = DropAttrs(0.3), .fills = {{}, keys}},
      {.label = "dropout_eval", .op = "dropout", .inputs = {F({3, 9}), I64({3})}, .attrs = {{"p", 0.4}, {"stream", int64_t{2}}, {"training", false}}, .fills = {{}, keys}},
      // bf16 x: x · 1/(1 - p) in f32, rounded once (half an ulp of bf16 against the f32 twin);
      // the gradient is dy's (f32) dropout, the twin's bits.
      {.label = "dropout_bf16", .op = "dropout", .inputs = {F({4, 37}), I64({4})}, .attrs = DropAttrs(0.2, 3), .fills = {{}, keys},
       .f32_tolerance = 0, .bf16 = true, .bf16_inputs = {0}, .bf16_tolerance = 4e-3, .bf16_grad_tolerance = 0},
  };
}

std::vector<OpErrorCase> DropoutErrors() {
  return {
      {.label = "dropout_p_above_one", .op = "dropout", .inputs = {F({3}), I64({})}, .attrs = DropAttrs(1.5)},
      {.label = "dropout_p_negative", .op = "dropout", .inputs = {F({3}), I64({})}, .attrs = DropAttrs(-0.1)},
      {.label = "dropout_stream_negative", .op = "dropout", .inputs = {F({3}), I64({})}, .attrs = DropAttrs(0.1, -1)},
      {.label = "dropout_key_indivisible", .op = "dropout", .inputs = {F({3}), I64({2})}, .attrs = DropAttrs(0.1)},
      {.label = "dropout_key_matrix", .op = "dropout", .inputs = {F({3}), I64({1, 3})}, .attrs = DropAttrs(0.1)},
      {.label = "dropout_key_empty", .op = "dropout", .inputs = {F({0}), I64({0})}, .attrs = DropAttrs(0.1)},
      {.label = "dropout_key_float", .op = "dropout", .inputs = {F({3}), F({})}, .attrs = DropAttrs(0.1)},
      {.label = "dropout_integer_x", .op = "dropout", .inputs = {I64({3}), I64({})}, .attrs = DropAttrs(0.1)},
      {.label = "dropout_no_p", .op = "dropout", .inputs = {F({3}), I64({})}, .attrs = {{"stream", int64_t{0}}}},
  };
}
// clang-format on

INSTANTIATE_TEST_SUITE_P(Dropout, OpHarness, ::testing::ValuesIn(DropoutCases()), CaseName());
INSTANTIATE_TEST_SUITE_P(Dropout, OpErrors, ::testing::ValuesIn(DropoutErrors()), CaseName());

namespace {

std::vector<double> Drop(const std::vector<double>& x, int64_t key, double p, int64_t stream,
                         bool reference = false) {
  const Tensor xt = Tensor::FromVector<double>(Shape{static_cast<int64_t>(x.size())}, x);
  const Tensor k = Tensor::FromVector<int64_t>(Shape{}, {key});
  return RunF64("dropout", {xt, k}, reference, DropAttrs(p, stream));
}

// x as `keys.size()` rows (examples) of x.size() / keys.size() elements, one key each.
std::vector<double> DropRows(const std::vector<double>& x, const std::vector<int64_t>& keys,
                             double p, int64_t stream, bool reference = false) {
  const auto rows = static_cast<int64_t>(keys.size());
  const Tensor xt =
      Tensor::FromVector<double>(Shape{rows, static_cast<int64_t>(x.size()) / rows}, x);
  const Tensor k = Tensor::FromVector<int64_t>(Shape{rows}, keys);
  return RunF64("dropout", {xt, k}, reference, DropAttrs(p, stream));
}

}  // namespace

// The generator is Random123's Philox-4x32-10 with the counter and key laid out as
// kernels/dropout.h says (low words first): its published known answers (Random123's
// kat_vectors: the zero counter and key, and the digits of π).
TEST(Dropout, DrawsArePhiloxKnownAnswers) {
  EXPECT_EQ(kernels::DropoutDraws(0, 0, 0),
            (std::array<uint32_t, 4>{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}));
  EXPECT_EQ(kernels::DropoutDraws(/*key=*/0x299f31d0a4093822, /*stream=*/0x0370734413198a2e,
                                  /*block=*/0x85a308d3243f6a88),
            (std::array<uint32_t, 4>{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}));
}

// Of 10^5 elements, the kept count is binomial(n, 1 − p) for a good generator: within 6 standard
// deviations (√(n·p·(1 − p)) ≤ 159) of n·(1 − p) — the draws are fixed by the key, so the test is
// deterministic; a generator or threshold that is off (a bias of 1% is 10 σ at p = 0.5) fails.
// Kept elements are x · 1/(1 − p) exactly, dropped ones 0.
TEST(Dropout, KeepsOneMinusPOfTheElementsScaled) {
  const int64_t n = 100000;
  const std::vector<double> ones(n, 1.0);
  for (double p : {0.1, 0.5, 0.9}) {
    for (int64_t key : {int64_t{1}, int64_t{-77}}) {
      const std::vector<double> y = Drop(ones, key, p, /*stream=*/3);
      int64_t kept = 0;
      for (double v : y) {
        if (v != 0) {
          ++kept;
          ASSERT_EQ(v, 1.0 / (1.0 - p));
        }
      }
      const double mean = n * (1 - p), sigma = std::sqrt(n * p * (1 - p));
      EXPECT_LE(std::abs(kept - mean), 6 * sigma) << "p " << p << " key " << key << ": " << kept;
    }
  }
}

TEST(Dropout, ZeroKeepsXBitwiseAndOneGivesZeros) {
  std::vector<double> x(1000);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(static_cast<double>(i)) * 1e3;
  x[5] = -0.0;
  const std::vector<double> same = Drop(x, 42, 0.0, 0);
  ASSERT_EQ(same.size(), x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(std::signbit(same[i]), std::signbit(x[i]));
    EXPECT_EQ(same[i], x[i]);
  }
  for (double v : Drop(x, 42, 1.0, 0)) EXPECT_EQ(v, 0.0);
}

// The mask is a function of (key, stream, index) alone: the same for the fast and the reference
// kernel and at any thread count (several chunks of the intra-op pool), different for another key
// or another stream.
TEST(Dropout, MaskDependsOnKeyStreamAndIndexOnly) {
  const int64_t n = 3 * kernels::kChunkElements + 5;
  const std::vector<double> ones(n, 1.0);
  const std::vector<double> a = Drop(ones, 9, 0.5, 1, /*reference=*/true);
  kernels::SetIntraOpThreads(4);
  const std::vector<double> fast = Drop(ones, 9, 0.5, 1);
  kernels::SetIntraOpThreads(1);
  EXPECT_EQ(fast, a);
  EXPECT_EQ(Drop(ones, 9, 0.5, 1), a);
  auto agreeing = [&](const std::vector<double>& b) {
    int64_t same = 0;
    for (int64_t i = 0; i < n; ++i) same += a[i] == b[i];
    return static_cast<double>(same) / static_cast<double>(n);
  };
  // Independent masks at p = 0.5 agree on half the elements (±1% is 6 σ here).
  EXPECT_NEAR(agreeing(Drop(ones, 10, 0.5, 1)), 0.5, 0.01);
  EXPECT_NEAR(agreeing(Drop(ones, 9, 0.5, 2)), 0.5, 0.01);
  // A prefix of a longer tensor has the shorter one's mask: element i is element i.
  const std::vector<double> shorter = Drop(std::vector<double>(1001, 1.0), 9, 0.5, 1);
  EXPECT_TRUE(std::equal(shorter.begin(), shorter.end(), a.begin()));
}

// Each example's elements are drawn under its own key: row b of a batch has the mask that its key
// gives a tensor of that row alone, so a data-parallel replica holding rows 2 and 3 of a batch of 4
// draws exactly what the whole batch draws there — with either kernel, at any thread count (runs
// longer than a chunk of the intra-op pool here).
TEST(Dropout, EachExampleDrawsUnderItsOwnKey) {
  const int64_t run = kernels::kChunkElements + 37;
  std::vector<double> x(static_cast<size_t>(4 * run));
  for (size_t i = 0; i < x.size(); ++i) x[i] = 1.0 + static_cast<double>(i % 7);
  const std::vector<int64_t> keys = {11, -5, 8, 1 << 30};
  const std::vector<double> whole = DropRows(x, keys, 0.3, 2, /*reference=*/true);
  kernels::SetIntraOpThreads(3);
  EXPECT_EQ(DropRows(x, keys, 0.3, 2), whole);
  kernels::SetIntraOpThreads(1);
  EXPECT_EQ(DropRows(x, keys, 0.3, 2), whole);
  for (size_t b = 0; b < keys.size(); ++b) {
    const std::vector<double> row(x.begin() + b * run, x.begin() + (b + 1) * run);
    const std::vector<double> alone = Drop(row, keys[b], 0.3, 2);
    EXPECT_TRUE(std::equal(alone.begin(), alone.end(), whole.begin() + b * run)) << "row " << b;
  }
  const std::vector<double> replica(x.begin() + 2 * run, x.end());
  const std::vector<double> half = DropRows(replica, {keys[2], keys[3]}, 0.3, 2);
  EXPECT_TRUE(std::equal(half.begin(), half.end(), whole.begin() + 2 * run));
}

// Backward draws the mask again: it reads the key and nothing of the forward pass (neither x nor
// y: the saved bytes of the op are the key's 8), and dx = keep · dy / (1 − p) with the forward's
// keep, bitwise.
TEST(Dropout, GradientDrawsTheForwardMaskAgain) {
  Builder b("drop");
  Var x = b.Input("x", DType::kF32, {6, 50});
  Var key = b.Input("key", DType::kI64, {});
  Var y = b.Name(Dropout(x * x, key, 0.25, 4), "y");
  b.Output(y);
  const Program forward = b.Build();
  const Backward bwd = BuildBackward(forward, {.seeds = {"y"}, .wrt = {"x"}});
  // x for x·x's own gradient, and the key: no mask, no y.
  std::vector<std::string> saved = bwd.saved;
  std::sort(saved.begin(), saved.end());
  EXPECT_EQ(saved, (std::vector<std::string>{"key", "x"}));

  Scope scope;
  Tensor xt = Tensor::Empty(Shape{6, 50}, DType::kF32);
  Tensor dy = Tensor::Empty(Shape{6, 50}, DType::kF32);
  for (int64_t i = 0; i < xt.numel(); ++i) {
    xt.FlatSet(i, 0.5 + 0.01 * static_cast<double>(i));
    dy.FlatSet(i, std::cos(static_cast<double>(i)));
  }
  scope.Set("x", xt);
  scope.Set("key", Tensor::FromVector<int64_t>(Shape{}, {123456789}));
  RunReference(forward, scope, DefaultAllocator(), false, bwd.saved);
  const Tensor out = scope.Get("y").Clone();
  scope.Set("y.grad", dy);
  RunReference(bwd.program, scope);
  const Tensor& dx = scope.Get("x.grad");
  const float scale = static_cast<float>(1.0 / 0.75);
  int64_t kept = 0;
  for (int64_t i = 0; i < dx.numel(); ++i) {
    const bool keep = out.data<float>()[i] != 0;  // x·x > 0: y is 0 only where dropped
    kept += keep;
    const float x_i = xt.data<float>()[i];
    const float want = keep ? dy.data<float>()[i] * scale * (x_i + x_i) : 0.0f;
    EXPECT_EQ(dx.data<float>()[i], want) << i;
  }
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, dx.numel());
}

// Evaluation: the inference form (module.eval()) sets training = false on every dropout, which
// then gives x as it is; the training program drops elements of the same x.
TEST(Dropout, TheInferenceFormKeepsEveryElement) {
  const Program train = ParseProgram(R"(program drop {
  input %x: f32[2, 8]
  input %key: i64[2]
  %y: f32[2, 8] = dropout(%x, %key) {p = 0.5, stream = 0}
  output %y
}
)",
                                     "drop.sluice");
  ASSERT_TRUE(HasTrainingMode(train));
  const Program eval = InferenceForm(train);
  EXPECT_FALSE(eval.instructions()[0].attrs.GetBool("training", true));
  Tensor x = Tensor::Empty(Shape{2, 8}, DType::kF32);
  for (int64_t i = 0; i < x.numel(); ++i) x.FlatSet(i, 1.0 + static_cast<double>(i));
  auto run = [&](const Program& p) {
    Scope s;
    s.Set("x", x.Clone());
    s.Set("key", Tensor::FromVector<int64_t>(Shape{2}, {3, 4}));
    RunReference(p, s);
    return s.Get("y").Clone();
  };
  const Tensor evaluated = run(eval), trained = run(train);
  int64_t dropped = 0;
  for (int64_t i = 0; i < x.numel(); ++i) {
    EXPECT_EQ(evaluated.FlatAt(i), x.FlatAt(i));
    dropped += trained.FlatAt(i) == 0;
  }
  EXPECT_GT(dropped, 0);
}

// Under mixed precision a dropout is arithmetic (ir/autocast.h): bf16 where its x is made bf16 and
// its reader takes bf16 (a layer norm's output into a product here); its keys stay i64.
TEST(Dropout, AutocastRunsItBf16BetweenALayerNormAndAProduct) {
  const Program p = ParseProgram(R"(program lndrop {
  input %x: f32[4, 16]
  input %key: i64[4]
  param %n.weight: f32[16]
  param %n.bias: f32[16]
  param %w: f32[16, 4]
  %n: f32[4, 16] = layer_norm(%x, %n.weight, %n.bias)
  %d: f32[4, 16] = dropout(%n, %key) {p = 0.1, stream = 0}
  %y: f32[4, 4] = matmul(%d, %w)
  output %y
}
)",
                                 "lndrop.sluice");
  const AutocastResult r = AutocastBf16(p);
  EXPECT_THAT(r.bf16_ops, ::testing::Contains("dropout"));
  EXPECT_EQ(r.program.type(r.program.Get("d")).dtype, DType::kBF16);
  EXPECT_EQ(r.program.type(r.program.Get("key")).dtype, DType::kI64);
}

}  // namespace sluice::testing
