// GPT with fused attention (the default) against the naive chain: same parameters, the same loss
// and gradients to rounding, and no [T, T] value in the fused program.
#include <algorithm>
#include <cmath>
#include <random>

#include <gtest/gtest.h>

#include "sluice/autodiff/autodiff.h"
#include "sluice/exec/reference_runner.h"
#include "sluice/nn/gpt.h"

namespace sluice {
namespace {

// T = 70 spans two tiles of the fast attention kernel.
constexpr int64_t kB = 2, kT = 70;

struct Result {
  double loss = 0;
  std::map<std::string, std::vector<float>> grads;
};

Result TrainingGradients(GptAttention attention) {
  const GptConfig cfg{
      .vocab = 11, .seq = kT, .layers = 2, .heads = 2, .dim = 16, .attention = attention};
  const Model m = BuildGpt(cfg, kB, GptOutput::kLoss);
  std::vector<std::string> wrt;
  for (const ParamSpec& p : m.params) wrt.push_back(p.name);
  const Backward bwd = BuildBackward(m.forward, {.loss = "loss", .wrt = wrt});
  Scope scope;
  for (auto& [name, t] : InitParams(m.params, 3)) scope.Set(name, t);
  Tensor ids = Tensor::Empty({kB, kT}, DType::kI64), targets = Tensor::Empty({kB, kT}, DType::kI64);
  std::mt19937_64 rng(4);
  for (int64_t i = 0; i < kB * kT; ++i) {
    ids.data<int64_t>()[i] = static_cast<int64_t>(rng() % 11);
    targets.data<int64_t>()[i] = static_cast<int64_t>(rng() % 11);
  }
  scope.Set("ids", ids);
  scope.Set("targets", targets);
  RunReference(m.forward, scope, DefaultAllocator(), false, bwd.saved);
  RunReference(bwd.program, scope);
  Result r{.loss = scope.Get("loss").FlatAt(0)};
  for (const std::string& g : bwd.grads) {
    const Tensor& t = scope.Get(g);
    std::vector<float>& v = r.grads[g];
    for (int64_t i = 0; i < t.numel(); ++i) v.push_back(static_cast<float>(t.FlatAt(i)));
  }
  return r;
}

TEST(GptFusedAttention, FusedIsTheDefaultAndKeepsNoScores) {
  EXPECT_EQ(GptConfig{}.attention, GptAttention::kFused);
  // T = 8, D = 24 / 2 = 12: a [.., 8, 8] value can only be attention scores.
  const Model fused =
      BuildGpt({.vocab = 11, .seq = 8, .layers = 2, .heads = 2, .dim = 24}, 2, GptOutput::kLoss);
  EXPECT_TRUE(fused.attention_values.empty());
  for (const Value& v : fused.forward.values()) {
    const Shape& s = fused.forward.types()[v.type_id].shape;
    EXPECT_FALSE(s.rank() == 4 && s[2] == 8 && s[3] == 8) << v.name << " is [.., T, T]";
  }
  const Model naive = BuildGpt({.vocab = 11,
                                .seq = 8,
                                .layers = 2,
                                .heads = 2,
                                .dim = 24,
                                .attention = GptAttention::kNaive},
                               2, GptOutput::kLoss);
  EXPECT_EQ(naive.attention_values.size(), 2u * 4u);
  ASSERT_EQ(naive.params.size(), fused.params.size());
  for (size_t i = 0; i < naive.params.size(); ++i) {
    EXPECT_EQ(naive.params[i].name, fused.params[i].name);
    EXPECT_EQ(naive.params[i].shape, fused.params[i].shape);
  }
}

// The tolerance gpt.h documents: relative 1e-5 in f32 (the sums run in another order).
TEST(GptFusedAttention, FusedMatchesNaiveLossAndGradients) {
  const Result naive = TrainingGradients(GptAttention::kNaive),
               fused = TrainingGradients(GptAttention::kFused);
  EXPECT_NEAR(fused.loss, naive.loss, 1e-5 * std::abs(naive.loss));
  ASSERT_EQ(fused.grads.size(), naive.grads.size());
  for (const auto& [name, want] : naive.grads) {
    const std::vector<float>& got = fused.grads.at(name);
    float scale = 0;
    for (float g : want) scale = std::max(scale, std::abs(g));
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-5f * scale + 1e-9f) << name << " at " << i;
    }
  }
}

TEST(GptFusedAttention, NamesParseBack) {
  EXPECT_EQ(ParseGptAttention("fused"), GptAttention::kFused);
  EXPECT_EQ(ParseGptAttention("naive"), GptAttention::kNaive);
  EXPECT_EQ(ParseGptAttention("flash"), std::nullopt);
  EXPECT_EQ(Name(GptAttention::kNaive), "naive");
}

}  // namespace
}  // namespace sluice
