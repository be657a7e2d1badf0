// GptDecoder (nn/gpt_decoder.h): the KV-cache decoder computes the logits the GPT program
// computes, for a prefill and one token at a time; TokenSampler is greedy, seeded and honours
// temperature and top-k; Generate slides its window when the positions run out.
#include "sluice/nn/gpt_decoder.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sluice/core/error.h"
#include "sluice/exec/reference_runner.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

const GptConfig kCfg{.vocab = 13, .seq = 10, .layers = 2, .heads = 2, .dim = 16};

// Weights with std 0.3 instead of 0.02, so that the logits differ clearly between tokens and
// positions (with GPT's small initial weights every row is nearly uniform and any bug hides).
std::map<std::string, Tensor> Weights(uint64_t seed = 3) {
  std::vector<ParamSpec> specs = BuildGpt(kCfg, 1, GptOutput::kLogits).params;
  for (ParamSpec& s : specs) s.std = 0.3;
  std::map<std::string, Tensor> params = InitParams(specs, seed);
  // Layer norms with weights and biases other than ones and zeros.
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(0.5f, 1.5f);
  for (auto& [name, t] : params) {
    if (name.find("ln_") == std::string::npos) continue;
    for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(rng) - 0.5f;
  }
  return params;
}

std::vector<int64_t> Tokens(int64_t n, uint64_t seed = 7) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> ids(static_cast<size_t>(n));
  for (int64_t& id : ids) id = static_cast<int64_t>(rng() % kCfg.vocab);
  return ids;
}

// The program's logits [T, vocab] for one sequence (BuildGpt, kLogits, run by RunReference).
std::vector<float> ProgramLogits(const std::map<std::string, Tensor>& params,
                                 const std::vector<int64_t>& ids, const GptConfig& config = kCfg) {
  const int64_t T = static_cast<int64_t>(ids.size());
  const Model m = BuildGpt(config, 1, GptOutput::kLogits, T);
  Scope scope;
  for (const ParamSpec& p : m.params) scope.Set(p.name, params.at(p.name));
  Tensor t = Tensor::Empty({1, T}, DType::kI64);
  std::copy(ids.begin(), ids.end(), t.data<int64_t>());
  scope.Set("ids", t);
  RunReference(m.forward, scope);
  const Tensor& logits = scope.Get("logits");
  return {logits.data<float>(), logits.data<float>() + logits.numel()};
}

void ExpectClose(std::span<const float> got, std::span<const float> want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  float spread = 0;
  for (float w : want) spread = std::max(spread, std::abs(w));
  ASSERT_GT(spread, 0.5f) << "logits too flat to tell positions apart: " << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 2e-4f * spread) << what << ", element " << i;
  }
}

TEST(GptDecoder, PrefillGivesTheProgramsLogitsAtEveryPosition) {
  const auto params = Weights();
  for (int64_t T : {int64_t{1}, int64_t{4}, kCfg.seq}) {
    const std::vector<int64_t> ids = Tokens(T);
    GptDecoder decoder(kCfg, params);
    const std::vector<float> want = ProgramLogits(params, ids);
    ExpectClose(decoder.Append(ids), want, fmt::format("prefill of {}", T));
    EXPECT_EQ(decoder.length(), T);
  }
}

// Under bf16 the decoder gives the bf16 program's logits (its blocks store bf16 values: the
// linears' operands, layer norms', qkv, attention's and GELU's inputs and outputs), which differ
// from the fp32 program's by more than the tolerance: the rounding is there, and it is the
// program's.
TEST(GptDecoder, UnderBf16ItGivesTheBf16ProgramsLogits) {
  const auto params = Weights();
  GptConfig bf16 = kCfg;
  bf16.precision = Precision::kBf16;
  const std::vector<int64_t> ids = Tokens(kCfg.seq);
  const std::vector<float> want = ProgramLogits(params, ids, bf16);
  GptDecoder decoder(bf16, params);
  ExpectClose(decoder.Append(std::span(ids).first(4)),
              std::span(want).first(static_cast<size_t>(4 * kCfg.vocab)), "bf16 prefill of 4");
  for (int64_t p = 4; p < kCfg.seq; ++p) {
    ExpectClose(decoder.Append(std::span(ids).subspan(static_cast<size_t>(p), 1)),
                std::span(want).subspan(static_cast<size_t>(p * kCfg.vocab),
                                        static_cast<size_t>(kCfg.vocab)),
                fmt::format("bf16, position {}", p));
  }
  const std::vector<float> fp32 = ProgramLogits(params, ids);
  float spread = 0, off = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    spread = std::max(spread, std::abs(fp32[i]));
    off = std::max(off, std::abs(want[i] - fp32[i]));
  }
  EXPECT_GT(off, 2e-3f * spread) << "bf16 and fp32 programs agree: the test would not see rounding";
}

TEST(GptDecoder, OneTokenAtATimeGivesTheProgramsLogits) {
  const auto params = Weights();
  const std::vector<int64_t> ids = Tokens(kCfg.seq);
  const std::vector<float> want = ProgramLogits(params, ids);
  GptDecoder decoder(kCfg, params);
  // A prefill of 3, then one token per call: each call's row is the program's row at its position.
  ExpectClose(decoder.Append(std::span(ids).first(3)),
              std::span(want).first(static_cast<size_t>(3 * kCfg.vocab)), "prefill of 3");
  for (int64_t p = 3; p < kCfg.seq; ++p) {
    ExpectClose(decoder.Append(std::span(ids).subspan(static_cast<size_t>(p), 1)),
                std::span(want).subspan(static_cast<size_t>(p * kCfg.vocab),
                                        static_cast<size_t>(kCfg.vocab)),
                fmt::format("position {}", p));
  }
  // Reset forgets the cache: the same prefix again gives the same logits.
  decoder.Reset();
  ExpectClose(decoder.Append(std::span(ids).first(2)),
              std::span(want).first(static_cast<size_t>(2 * kCfg.vocab)), "after Reset");
}

TEST(GptDecoder, RejectsTokensOutsideTheVocabularyAndTooManyPositions) {
  const auto params = Weights();
  GptDecoder decoder(kCfg, params);
  const std::vector<int64_t> bad = {1, 13};
  try {
    decoder.Append(bad);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("token 13 at position 1 is outside the vocabulary [0, 13)"));
  }
  EXPECT_EQ(decoder.length(), 0);
  decoder.Append(Tokens(8));
  try {
    decoder.Append(Tokens(3));
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("11 positions do not fit the model's 10 (--seq 10)"));
  }
}

TEST(GptDecoder, ListsEveryMissingOrMisshapedWeight) {
  auto params = Weights();
  params.erase("h.1.mlp.c_fc.bias");
  params["wpe.weight"] = Tensor::Empty({4, kCfg.dim}, DType::kF32);
  try {
    GptDecoder decoder(kCfg, params);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("'h.1.mlp.c_fc.bias' is missing"));
    EXPECT_THAT(e.what(), HasSubstr("'wpe.weight' is f32 [4, 16], expected f32 [10, 16]"));
  }
}

TEST(TokenSampler, GreedyTakesTheFirstLargestLogit) {
  TokenSampler greedy({.greedy = true, .temperature = 0});  // temperature unused when greedy
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(greedy.Next(logits), 1);
  // Top-1 keeps the ties at the boundary: 1 and 3, equally likely.
  TokenSampler top1({.top_k = 1, .seed = 4});
  std::set<int64_t> drawn;
  for (int i = 0; i < 40; ++i) drawn.insert(top1.Next(logits));
  EXPECT_EQ(drawn, std::set<int64_t>({1, 3}));
}

TEST(TokenSampler, SameSeedSameTokensAndFrequenciesFollowTheSoftmax) {
  const std::vector<float> logits = {std::log(0.6f), std::log(0.3f), std::log(0.1f)};
  auto draw = [&](uint64_t seed, double temperature, int64_t top_k, int n) {
    TokenSampler s({.temperature = temperature, .top_k = top_k, .seed = seed});
    std::vector<int64_t> out;
    for (int i = 0; i < n; ++i) out.push_back(s.Next(logits));
    return out;
  };
  EXPECT_EQ(draw(11, 1.0, 0, 50), draw(11, 1.0, 0, 50));
  EXPECT_NE(draw(11, 1.0, 0, 50), draw(12, 1.0, 0, 50));
  auto frequencies = [&](double temperature, int64_t top_k) {
    std::vector<double> f(3, 0.0);
    const int n = 20000;
    for (int64_t t : draw(5, temperature, top_k, n)) f[static_cast<size_t>(t)] += 1.0 / n;
    return f;
  };
  std::vector<double> f = frequencies(1.0, 0);
  EXPECT_NEAR(f[0], 0.6, 0.015);
  EXPECT_NEAR(f[1], 0.3, 0.015);
  EXPECT_NEAR(f[2], 0.1, 0.015);
  f = frequencies(1.0, 2);  // top-2: 0.6 and 0.3 renormalised
  EXPECT_NEAR(f[0], 2.0 / 3, 0.015);
  EXPECT_EQ(f[2], 0.0);
  f = frequencies(0.5, 0);  // temperature 0.5 squares the probabilities: 0.36 : 0.09 : 0.01
  EXPECT_NEAR(f[0], 0.36 / 0.46, 0.015);
  EXPECT_NEAR(f[2], 0.01 / 0.46, 0.01);
}

TEST(TokenSampler, RejectsANonPositiveTemperatureOrANegativeTopK) {
  for (double t : {0.0, -1.0, std::nan("")}) {
    try {
      TokenSampler s({.temperature = t});
      FAIL() << "expected InvalidArgument for temperature " << t;
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), HasSubstr("--temperature must be a positive number when sampling"));
      EXPECT_THAT(e.what(), HasSubstr("--greedy"));
    }
  }
  EXPECT_THROW(TokenSampler({.top_k = -1}), InvalidArgument);
}

TEST(Generate, GreedyMatchesRecomputingTheWholePrefixWithTheProgram) {
  const auto params = Weights(21);
  const std::vector<int64_t> prompt = Tokens(3, 8);
  GptDecoder decoder(kCfg, params);
  TokenSampler greedy({.greedy = true});
  std::vector<int64_t> streamed;
  const GenerateResult r =
      Generate(decoder, prompt, kCfg.seq - 3, greedy, [&](int64_t t) { streamed.push_back(t); });
  EXPECT_EQ(r.tokens, streamed);
  EXPECT_EQ(r.reencodes, 0);
  // Without a cache: the program over the whole prefix for every new token (what the cache saves).
  std::vector<int64_t> context = prompt;
  for (int64_t i = 0; i < kCfg.seq - 3; ++i) {
    const std::vector<float> logits = ProgramLogits(params, context);
    const auto last = logits.end() - kCfg.vocab;
    const int64_t next = std::max_element(last, logits.end()) - last;
    ASSERT_EQ(r.tokens[static_cast<size_t>(i)], next) << "token " << i;
    context.push_back(next);
  }
}

TEST(Generate, SlidesTheWindowWhenThePositionsRunOut) {
  const auto params = Weights();
  GptDecoder decoder(kCfg, params);
  TokenSampler sampler({.temperature = 1.0, .seed = 2});
  // seq 10, prompt 4: token 6 finds the cache full; the window keeps 5 positions, so every 6th
  // token after that finds it full again (tokens 6, 12, 18, 24 of 30).
  const GenerateResult r = Generate(decoder, Tokens(4), 30, sampler);
  EXPECT_EQ(r.tokens.size(), 30u);
  EXPECT_EQ(r.reencodes, 4);
  for (int64_t t : r.tokens) EXPECT_TRUE(t >= 0 && t < kCfg.vocab);
  TokenSampler again({.temperature = 1.0, .seed = 2});
  EXPECT_EQ(Generate(decoder, Tokens(4), 30, again).tokens, r.tokens);
}

TEST(Generate, RejectsAnEmptyOrTooLongPrompt) {
  const auto params = Weights();
  GptDecoder decoder(kCfg, params);
  TokenSampler greedy({.greedy = true});
  EXPECT_THROW(Generate(decoder, {}, 1, greedy), InvalidArgument);
  try {
    Generate(decoder, Tokens(11), 1, greedy);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("the prompt is 11 tokens long but the model takes at most 10 "
                                    "positions (--seq 10)"));
  }
}

}  // namespace
}  // namespace sluice
