#include <cmath>

#include <gtest/gtest.h>

#include "sluice/nn/optimizer.h"

namespace sluice {
namespace {

Tensor Vec(std::vector<float> values) {
  const int64_t n = static_cast<int64_t>(values.size());
  return Tensor::FromVector<float>({n}, std::move(values));
}

TEST(GradientAccumulator, SumsMicroBatchesThenTakesTheMean) {
  GradientAccumulator acc;
  acc.Add("w", Vec({1, 2, 3}));
  acc.Add("w", Vec({3, 2, 1}));
  acc.Add("b", Vec({4}));
  const std::map<std::string, double> sum_squares = acc.MeanAndSumSquares(2);
  EXPECT_EQ(acc.grads().at("w").FlatAt(0), 2.0);  // (1 + 3) / 2
  EXPECT_EQ(acc.grads().at("w").FlatAt(2), 2.0);
  EXPECT_EQ(acc.grads().at("b").FlatAt(0), 2.0);  // one micro-batch's 4, halved like the rest
  EXPECT_EQ(sum_squares.at("w"), 12.0);
  EXPECT_EQ(sum_squares.at("b"), 4.0);
}

TEST(GradientAccumulator, TheFirstGradientIsTakenOverNotCopied) {
  GradientAccumulator acc;
  Tensor g = Vec({1, 1});
  acc.Add("w", g);
  acc.Add("w", Vec({2, 2}));
  EXPECT_EQ(g.FlatAt(0), 3.0);  // the accumulator sums into the tensor it was given
}

TEST(GradientAccumulator, ClipScalesLikeTorchClipGradNorm) {
  GradientAccumulator acc;
  acc.Add("w", Vec({3, 4}));
  const double norm = std::sqrt(acc.MeanAndSumSquares(1).at("w"));
  ASSERT_EQ(norm, 5.0);
  acc.Clip(norm, 10.0);  // below the clip norm: untouched
  EXPECT_EQ(acc.grads().at("w").FlatAt(0), 3.0f);
  acc.Clip(norm, 1.0);  // scaled by 1 / (5 + 1e-6)
  EXPECT_FLOAT_EQ(acc.grads().at("w").FlatAt(0), static_cast<float>(3.0 / (5.0 + 1e-6)));
  EXPECT_FLOAT_EQ(acc.grads().at("w").FlatAt(1), static_cast<float>(4.0 / (5.0 + 1e-6)));
}

TEST(OptimizerNames, RoundTripAndRefuseOthers) {
  EXPECT_EQ(Name(OptimizerKind::kSgd), "sgd");
  EXPECT_EQ(ParseOptimizerKind("adamw"), OptimizerKind::kAdamW);
  EXPECT_EQ(ParseOptimizerKind("adam"), std::nullopt);
  EXPECT_EQ(Name(LrSchedule::kCosine), "cosine");
  EXPECT_EQ(ParseLrSchedule("constant"), LrSchedule::kConstant);
  EXPECT_EQ(ParseLrSchedule("linear"), std::nullopt);
}

}  // namespace
}  // namespace sluice
