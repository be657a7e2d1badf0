// Op table: batch normalization (batch_norm by the batch's or the running statistics, its gradient
// ops, batch_norm_update_stats), plus what the table cannot state: the normalised channels' mean
// and variance, the running statistics' update in closed form (PyTorch's unbiased variance), the
// inference form, and buffers — the only constants an in-place op may write, and only an op that
// keeps running statistics.
#include <cmath>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "op_harness.h"
#include "sluice/core/error.h"
#include "sluice/exec/reference_runner.h"
#include "sluice/ir/inference_form.h"
#include "sluice/ir/ops.h"
#include "sluice/ir/text_format.h"
#include "sluice/ir/verifier.h"

namespace sluice::testing {

std::vector<OpCase> BatchNormCases() {
  const Attrs eps{{"eps", 1e-5}};
  const Attrs inference{{"eps", 1e-3}, {"training", false}};
  const Attrs momentum{{"momentum", 0.1}};
  // x, weight, bias, running_mean, running_var: the running statistics have no gradient (training
  // ignores them; evaluation's gradient is not taken with respect to its buffers).
  const std::vector<Fill> stats{Fill{}, Fill{}, Fill{}, Fill{}, Positive()};
  return {
      {.label = "batch_norm_images",
       .op = "batch_norm",
       .inputs = {F({3, 4, 5, 2}), F({4}), F({4}), F({4}), F({4})},
       .attrs = eps,
       .fills = stats,
       .no_grad_inputs = {3, 4}},
      {.label = "batch_norm_features",
       .op = "batch_norm",
       .inputs = {F({5, 7}), F({7}), F({7}), F({7}), F({7})},
       .fills = stats,
       .no_grad_inputs = {3, 4}},
      {.label = "batch_norm_sequence",
       .op = "batch_norm",
       .inputs = {F({2, 3, 9}), F({3}), F({3}), F({3}), F({3})},
       .attrs = eps,
       .fills = stats,
       .no_grad_inputs = {3, 4}},
      {.label = "batch_norm_offset",
       .op = "batch_norm",
       .inputs = {F({4, 3, 3, 3}), F({3}), F({3}), F({3}), F({3})},
       .fills = {Uniform(5, 7), Fill{}, Fill{}, Fill{}, Positive()},
       .no_grad_inputs = {3, 4}},
      {.label = "batch_norm_big",
       .op = "batch_norm",
       .inputs = {F({16, 24, 9, 9}), F({24}), F({24}), F({24}), F({24})},
       .fills = stats,
       .grad = false},
      // ResNet-sized runs (S = 1024: two blocks of the fast kernels' sums) far from 0: the fast
      // kernels' f32 lanes against the reference's double loops: 2.5e-7 of the largest value
      // measured.
      {.label = "batch_norm_long_runs",
       .op = "batch_norm",
       .inputs = {F({6, 3, 32, 32}), F({3}), F({3}), F({3}), F({3})},
       .fills = {Uniform(5, 7), Fill{}, Fill{}, Fill{}, Positive()},
       .grad = false,
       .f32_tolerance = 1e-6},
      {.label = "batch_norm_grad_x_long_runs",
       .op = "batch_norm_grad_x",
       .inputs = {F({6, 3, 32, 32}), F({6, 3, 32, 32}), F({3})},
       .fills = {Fill{}, Uniform(5, 7), Fill{}},
       .grad = false,
       .f32_tolerance = 1e-6},
      {.label = "batch_norm_grad_params_long_runs",
       .op = "batch_norm_grad_params",
       .inputs = {F({6, 3, 32, 32}), F({6, 3, 32, 32})},
       .fills = {Fill{}, Uniform(5, 7)},
       .grad = false,
       .f32_tolerance = 1e-6},
      {.label = "batch_norm_update_stats_long_runs",
       .op = "batch_norm_update_stats",
       .inputs = {F({6, 3, 32, 32}), F({3}), F({3})},
       .fills = {Uniform(5, 7), Fill{}, Positive()},
       .grad = false,
       .f32_tolerance = 1e-6},
      {.label = "batch_norm_inference",
       .op = "batch_norm",
       .inputs = {F({3, 4, 2, 3}), F({4}), F({4}), F({4}), F({4})},
       .attrs = inference,
       .fills = stats,
       .no_grad_inputs = {3, 4}},
      {.label = "batch_norm_grad_x",
       .op = "batch_norm_grad_x",
       .inputs = {F({3, 4, 5, 2}), F({3, 4, 5, 2}), F({4})},
       .attrs = eps,
       .grad = false},
      {.label = "batch_norm_grad_x_big",
       .op = "batch_norm_grad_x",
       .inputs = {F({16, 24, 9, 9}), F({16, 24, 9, 9}), F({24})},
       .grad = false},
      {.label = "batch_norm_grad_params",
       .op = "batch_norm_grad_params",
       .inputs = {F({3, 4, 5, 2}), F({3, 4, 5, 2})},
       .attrs = eps,
       .grad = false},
      {.label = "batch_norm_update_stats",
       .op = "batch_norm_update_stats",
       .inputs = {F({3, 4, 5, 2}), F({4}), F({4})},
       .attrs = momentum,
       .fills = {Fill{}, Fill{}, Positive()},
       .grad = false},
      {.label = "batch_norm_update_stats_features",
       .op = "batch_norm_update_stats",
       .inputs = {F({6, 33}), F({33}), F({33})},
       .attrs = {{"momentum", 0.5}},
       .fills = {Uniform(-3, 5), Fill{}, Positive()},
       .grad = false},
  };
}

namespace {

std::vector<OpErrorCase> BatchNormErrors() {
  return {
      {.label = "batch_norm_rank1",
       .op = "batch_norm",
       .inputs = {F({4}), F({4}), F({4}), F({4}), F({4})}},
      {.label = "batch_norm_weight_channels",
       .op = "batch_norm",
       .inputs = {F({2, 4, 3}), F({3}), F({4}), F({4}), F({4})}},
      {.label = "batch_norm_running_var_channels",
       .op = "batch_norm",
       .inputs = {F({2, 4, 3}), F({4}), F({4}), F({4}), F({2})}},
      {.label = "batch_norm_eps_zero",
       .op = "batch_norm",
       .inputs = {F({2, 4}), F({4}), F({4}), F({4}), F({4})},
       .attrs = {{"eps", 0.0}}},
      {.label = "batch_norm_int",
       .op = "batch_norm",
       .inputs = {I64({2, 4}), I64({4}), I64({4}), I64({4}), I64({4})}},
      {.label = "batch_norm_grad_x_shapes",
       .op = "batch_norm_grad_x",
       .inputs = {F({2, 4, 3}), F({2, 4, 2}), F({4})}},
      {.label = "batch_norm_grad_params_shapes",
       .op = "batch_norm_grad_params",
       .inputs = {F({2, 4}), F({3, 4})}},
      {.label = "batch_norm_update_stats_momentum",
       .op = "batch_norm_update_stats",
       .inputs = {F({2, 4}), F({4}), F({4})},
       .attrs = {{"momentum", 1.5}}},
      {.label = "batch_norm_one_value_per_channel",
       .op = "batch_norm",
       .inputs = {F({1, 4}), F({4}), F({4}), F({4}), F({4})}},
      {.label = "batch_norm_update_stats_one_value_per_channel",
       .op = "batch_norm_update_stats",
       .inputs = {F({1, 4, 1}), F({4}), F({4})}},
      {.label = "batch_norm_update_stats_channels",
       .op = "batch_norm_update_stats",
       .inputs = {F({2, 4}), F({4}), F({3})}},
  };
}

INSTANTIATE_TEST_SUITE_P(BatchNorm, OpHarness, ::testing::ValuesIn(BatchNormCases()), CaseName());
INSTANTIATE_TEST_SUITE_P(BatchNorm, OpErrors, ::testing::ValuesIn(BatchNormErrors()), CaseName());

// x [2, 2, 3]: channel 0 holds 1..6, channel 1 holds 10, 10, 10, 20, 20, 20.
Tensor TwoChannels() {
  Tensor x = Tensor::Empty(Shape{2, 2, 3}, DType::kF32);
  const float values[] = {1, 2, 3, 10, 10, 10, 4, 5, 6, 20, 20, 20};
  for (int64_t i = 0; i < 12; ++i) x.FlatSet(i, values[i]);
  return x;
}

Tensor Filled(Shape shape, double value) {
  Tensor t = Tensor::Empty(shape, DType::kF32);
  for (int64_t i = 0; i < t.numel(); ++i) t.FlatSet(i, value);
  return t;
}

constexpr const char* kTrainText = R"(
program bn {
  input %x: f32[2, 2, 3]
  param %w: f32[2]
  param %b: f32[2]
  buffer %mean: f32[2]
  buffer %var: f32[2]
  unit norm {
    %y: f32[2, 2, 3] = batch_norm(%x, %w, %b, %mean, %var) {eps = 0.0001}
    batch_norm_update_stats(%x, %mean, %var) {momentum = 0.25}
  }
  output %y
}
)";

// The message of the ParseError that parsing `text` throws; "" when it parses.
std::string ParseFailure(const std::string& text) {
  try {
    ParseProgram(text, "t.sluice");
  } catch (const ParseError& e) {
    return e.what();
  }
  return "";
}

Scope TrainScope() {
  Scope s;
  s.Set("x", TwoChannels());
  s.Set("w", Filled(Shape{2}, 1));
  s.Set("b", Filled(Shape{2}, 0));
  s.Set("mean", Filled(Shape{2}, 0));
  s.Set("var", Filled(Shape{2}, 1));
  return s;
}

TEST(BatchNorm, NormalisesEachChannelByTheBatchAndMovesTheRunningStatistics) {
  const Program p = ParseProgram(kTrainText, "bn.sluice");
  for (bool reference : {true, false}) {
    Scope s = TrainScope();
    RunReference(p, s, DefaultAllocator(), reference);
    const Tensor& y = s.Get("y");
    // Channel 0: mean 3.5, biased variance 35/12; channel 1: mean 15, variance 25.
    const double var0 = 35.0 / 12;
    EXPECT_NEAR(y.FlatAt(0), (1 - 3.5) / std::sqrt(var0 + 1e-4), 1e-5);
    EXPECT_NEAR(y.FlatAt(3), (10 - 15) / std::sqrt(25 + 1e-4), 1e-5);
    EXPECT_NEAR(y.FlatAt(11), (20 - 15) / std::sqrt(25 + 1e-4), 1e-5);
    // running = 0.75·running + 0.25·batch, the variance unbiased (6 values: × 6/5), as PyTorch.
    EXPECT_NEAR(s.Get("mean").FlatAt(0), 0.25 * 3.5, 1e-6);
    EXPECT_NEAR(s.Get("mean").FlatAt(1), 0.25 * 15, 1e-6);
    EXPECT_NEAR(s.Get("var").FlatAt(0), 0.75 + 0.25 * var0 * 6 / 5, 1e-6);
    EXPECT_NEAR(s.Get("var").FlatAt(1), 0.75 + 0.25 * 25 * 6 / 5, 1e-5);
  }
}

TEST(BatchNorm, InferenceFormNormalisesByTheRunningStatisticsAndLeavesThemAlone) {
  const Program train = ParseProgram(kTrainText, "bn.sluice");
  ASSERT_TRUE(HasTrainingMode(train));
  const Program eval = InferenceForm(train);
  Verify(eval);
  ASSERT_EQ(eval.instructions().size(), 1u);  // the update is dropped
  EXPECT_FALSE(eval.instructions()[0].attrs.GetBool("training", true));
  ASSERT_EQ(eval.units().size(), 1u);
  EXPECT_EQ(eval.units()[0].name, "norm");
  EXPECT_EQ(eval.units()[0].end, 1);
  EXPECT_TRUE(eval.IsBuffer(eval.Get("mean")));
  Scope s = TrainScope();
  s.Set("mean", Filled(Shape{2}, 2));
  s.Set("var", Filled(Shape{2}, 4));
  RunReference(eval, s, DefaultAllocator(), false);
  EXPECT_NEAR(s.Get("y").FlatAt(0), (1 - 2) / std::sqrt(4 + 1e-4), 1e-6);
  EXPECT_NEAR(s.Get("y").FlatAt(11), (20 - 2) / std::sqrt(4 + 1e-4), 1e-5);
  EXPECT_EQ(s.Get("mean").FlatAt(0), 2);
  EXPECT_EQ(s.Get("var").FlatAt(1), 4);
  // A program without training-only ops comes back the same.
  const std::string text = PrintProgram(eval);
  EXPECT_EQ(PrintProgram(InferenceForm(ParseProgram(text, "eval.sluice"))), text);
}

TEST(BatchNorm, BuffersRoundTripAndOnlyRunningStatisticsWriteThem) {
  const Program p = ParseProgram(kTrainText, "bn.sluice");
  EXPECT_THAT(PrintProgram(p), ::testing::HasSubstr("  buffer %mean: f32[2]\n"));
  EXPECT_EQ(PrintProgram(ParseProgram(PrintProgram(p), "again.sluice")), PrintProgram(p));
  EXPECT_TRUE(p.IsConstant(p.Get("var")));  // no gradient, no optimizer, checkpointed
  // An optimizer update of a buffer, and running statistics kept in a plain constant: refused.
  std::string adamw = kTrainText;
  adamw.replace(adamw.find("  output"), 0,
                "  input %lr: f32[]\n  input %step: f32[]\n"
                "  adamw_update(%mean, %b, %w, %var, %lr, %step)\n");
  EXPECT_THAT(ParseFailure(adamw),
              ::testing::HasSubstr("%mean is a buffer, and adamw_update updates its inputs in "
                                   "place"));
  std::string constant = kTrainText;
  constant.replace(constant.find("buffer %var"), 6, "const");
  EXPECT_THAT(
      ParseFailure(constant),
      ::testing::HasSubstr("%var is a constant, and batch_norm_update_stats updates it in place"));
}

}  // namespace
}  // namespace sluice::testing
