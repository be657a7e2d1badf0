// GPT slices (BuildGptSlice): chained, the slices of a split model compute the whole model's loss
// and gradients, with the whole model's parameters (names and initial values).
#include <algorithm>
#include <random>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sluice/autodiff/autodiff.h"
#include "sluice/core/error.h"
#include "sluice/exec/reference_runner.h"
#include "sluice/nn/gpt.h"

namespace sluice {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

const GptConfig kCfg{.vocab = 13, .seq = 8, .layers = 4, .heads = 2, .dim = 16};
constexpr int64_t kB = 2, kT = 6;  // T < seq: the slices slice wpe as the whole model does
constexpr uint64_t kSeed = 5;

// Splits of the 4-block model, each a list of slices in model order.
std::vector<std::vector<GptSlice>> Splits() {
  return {
      {{.embed = true, .first_layer = 0, .end_layer = 0, .head = false},
       {.embed = false, .first_layer = 0}},
      {{.embed = true, .end_layer = 4, .head = false}, {.embed = false, .first_layer = 4}},
      {{.embed = true, .end_layer = 1, .head = false},
       {.embed = false, .first_layer = 1, .end_layer = 3, .head = false},
       {.embed = false, .first_layer = 3}},
      {{.embed = true, .end_layer = 0, .head = false},
       {.embed = false, .first_layer = 0, .end_layer = 2, .head = false},
       {.embed = false, .first_layer = 2, .end_layer = 4, .head = false},
       {.embed = false, .first_layer = 4, .end_layer = 4, .head = true}},
  };
}

std::string SplitText(const std::vector<GptSlice>& split) {
  std::string out;
  for (const GptSlice& s : split) out += (out.empty() ? "" : "|") + SliceText(s, kCfg.layers);
  return out;
}

struct Batch {
  Tensor ids = Tensor::Empty({kB, kT}, DType::kI64);
  Tensor targets = Tensor::Empty({kB, kT}, DType::kI64);
};

Batch MakeBatch() {
  Batch b;
  std::mt19937_64 rng(9);
  std::uniform_int_distribution<int64_t> token(0, kCfg.vocab - 1);
  for (int64_t i = 0; i < kB * kT; ++i) {
    b.ids.data<int64_t>()[i] = token(rng);
    b.targets.data<int64_t>()[i] = i % 4 == 0 ? -1 : token(rng);
  }
  return b;
}

std::vector<std::string> ParamNames(const Model& m) {
  std::vector<std::string> names;
  for (const ParamSpec& p : m.params) names.push_back(p.name);
  return names;
}

// A scope with the model's parameters (from the whole model's tensors) and its data inputs.
Scope StageScope(const Model& m, const std::map<std::string, Tensor>& params, const Batch& batch) {
  Scope scope;
  for (const ParamSpec& p : m.params) scope.Set(p.name, params.at(p.name));
  if (m.forward.Find("ids")) scope.Set("ids", batch.ids);
  if (m.forward.Find("targets")) scope.Set("targets", batch.targets);
  return scope;
}

TEST(GptSlice, ChainedSlicesGiveTheWholeModelsLossBitwise) {
  for (const Precision precision : {Precision::kFp32, Precision::kBf16}) {
    SCOPED_TRACE(Name(precision));
    GptConfig cfg = kCfg;
    cfg.precision = precision;
    const Model whole = BuildGpt(cfg, kB, GptOutput::kLoss, kT);
    const std::map<std::string, Tensor> params = InitParams(whole.params, kSeed);
    const Batch batch = MakeBatch();
    Scope ws = StageScope(whole, params, batch);
    RunReference(whole.forward, ws);
    const float expected = ws.Get("loss").data<float>()[0];

    for (const std::vector<GptSlice>& split : Splits()) {
      SCOPED_TRACE(SplitText(split));
      Tensor x;
      float loss = 0;
      for (const GptSlice& slice : split) {
        const Model m = BuildGptSlice(cfg, kB, GptOutput::kLoss, kT, slice);
        Scope scope = StageScope(m, params, batch);
        if (!slice.embed) scope.Set("x", x);
        RunReference(m.forward, scope);
        if (slice.head) {
          loss = scope.Get("loss").data<float>()[0];
        } else {
          x = scope.Get("y");
        }
      }
      EXPECT_EQ(loss, expected);
    }
  }
}

// Under bf16 what crosses a unit boundary — the embedding's output, each block's output — is
// rounded to bf16 by the unit that makes it, on one stage as on many: a slice's "x" and "y" (the
// pipeline's messages) are bf16, half fp32's bytes, and so is every unit input a full recompute
// keeps; inside a block the residual additions stay f32.
TEST(GptSlice, UnderBf16WhatCrossesAUnitBoundaryIsBf16) {
  GptConfig cfg = kCfg;
  cfg.precision = Precision::kBf16;
  const GptSlice mid{.embed = false, .first_layer = 1, .end_layer = 3, .head = false};
  const Model m = BuildGptSlice(cfg, kB, GptOutput::kLoss, kT, mid);
  const Program& p = m.forward;
  EXPECT_EQ(p.type(p.Get("x")).dtype, DType::kBF16);
  EXPECT_EQ(p.type(p.Get("y")).dtype, DType::kBF16);
  const Model f32 = BuildGptSlice(kCfg, kB, GptOutput::kLoss, kT, mid);
  EXPECT_EQ(2 * p.Bytes(p.Get("y")), f32.forward.Bytes(f32.forward.Get("y")));
  EXPECT_EQ(p.type(p.Get("h.1.attn_out")).dtype, DType::kF32);
  EXPECT_EQ(p.type(p.Get("h.1.out")).dtype, DType::kF32);  // the sum before its rounding

  const Model whole = BuildGpt(cfg, kB, GptOutput::kLoss, kT);
  ASSERT_EQ(whole.block_inputs.size(), static_cast<size_t>(cfg.layers + 1));  // blocks and head
  for (const std::string& name : whole.block_inputs) {
    EXPECT_EQ(whole.forward.type(whole.forward.Get(name)).dtype, DType::kBF16) << name;
  }
  const Model fp32 = BuildGpt(kCfg, kB, GptOutput::kLoss, kT);
  for (const std::string& name : fp32.block_inputs) {
    EXPECT_EQ(fp32.forward.type(fp32.forward.Get(name)).dtype, DType::kF32) << name;
  }
}

TEST(GptSlice, ProgramInterfaceNamesTheHiddenStateXAndY) {
  const Model mid =
      BuildGptSlice(kCfg, kB, GptOutput::kLoss, kT,
                    {.embed = false, .first_layer = 1, .end_layer = 3, .head = false});
  ASSERT_EQ(mid.forward.inputs().size(), 1u);
  const Value& x = mid.forward.value(mid.forward.inputs()[0]);
  EXPECT_EQ(x.name, "x");
  EXPECT_EQ(mid.forward.type(mid.forward.inputs()[0]).dtype, DType::kF32);
  EXPECT_EQ(mid.forward.type(mid.forward.inputs()[0]).shape, Shape({kB, kT, kCfg.dim}));
  ASSERT_EQ(mid.forward.outputs().size(), 1u);
  const Value& y = mid.forward.value(mid.forward.outputs()[0]);
  EXPECT_EQ(y.name, "y");
  EXPECT_EQ(mid.forward.type(mid.forward.outputs()[0]).shape, Shape({kB, kT, kCfg.dim}));
  EXPECT_EQ(mid.loss, "");
  EXPECT_TRUE(mid.forward.Find("h.1.attn_out").has_value());  // the whole model's names inside

  const Model embed =
      BuildGptSlice(kCfg, kB, GptOutput::kLoss, kT, {.end_layer = 0, .head = false});
  EXPECT_EQ(embed.forward.value(embed.forward.inputs()[0]).name, "ids");
  EXPECT_EQ(embed.forward.value(embed.forward.outputs()[0]).name, "y");
  EXPECT_THAT(ParamNames(embed), ElementsAre("wte.weight", "wpe.weight"));

  const Model logits =
      BuildGptSlice(kCfg, kB, GptOutput::kLogits, kT, {.embed = false, .first_layer = 4});
  EXPECT_EQ(logits.forward.value(logits.forward.outputs()[0]).name, "logits");
  EXPECT_EQ(logits.loss, "");
  EXPECT_THAT(ParamNames(logits), ElementsAre("ln_f.weight", "ln_f.bias", "lm_head.weight"));

  const Model head =
      BuildGptSlice(kCfg, kB, GptOutput::kLoss, kT, {.embed = false, .first_layer = 4});
  EXPECT_EQ(head.loss, "loss");
  EXPECT_TRUE(head.forward.Find("targets").has_value());
}

TEST(GptSlice, SliceParamsPartitionTheModelsAndInitBitwiseAlike) {
  const Model whole = BuildGpt(kCfg, kB, GptOutput::kLoss, kT);
  const std::map<std::string, Tensor> expected = InitParams(whole.params, kSeed);
  for (size_t i = 0; i < whole.params.size(); ++i)
    EXPECT_EQ(whole.params[i].init_index, static_cast<int64_t>(i));
  for (const std::vector<GptSlice>& split : Splits()) {
    SCOPED_TRACE(SplitText(split));
    std::vector<std::string> names;
    for (const GptSlice& slice : split) {
      const Model m = BuildGptSlice(kCfg, kB, GptOutput::kLoss, kT, slice);
      for (const auto& [name, t] : InitParams(m.params, kSeed)) {
        EXPECT_TRUE(BitwiseEqual(t, expected.at(name))) << name;
      }
      for (const ParamSpec& p : m.params) names.push_back(p.name);
    }
    // In model order, each once: exactly the whole model's list.
    EXPECT_EQ(names, ParamNames(whole));
  }
}

// Gradients: the head slice from the loss, the others from the seed "y.grad" = the next slice's
// "x.grad", chained back to the front; compared with the whole model's.
TEST(GptSlice, ChainedBackwardGivesTheWholeModelsGradients) {
  const Model whole = BuildGpt(kCfg, kB, GptOutput::kLoss, kT);
  const std::map<std::string, Tensor> params = InitParams(whole.params, kSeed);
  const Batch batch = MakeBatch();
  const Backward wb = BuildBackward(whole.forward, {.loss = "loss", .wrt = ParamNames(whole)});
  Scope ws = StageScope(whole, params, batch);
  RunReference(whole.forward, ws, DefaultAllocator(), false, wb.saved);
  RunReference(wb.program, ws);

  for (const std::vector<GptSlice>& split : Splits()) {
    SCOPED_TRACE(SplitText(split));
    std::vector<Model> models;
    std::vector<Backward> backwards;
    for (const GptSlice& slice : split) {
      models.push_back(BuildGptSlice(kCfg, kB, GptOutput::kLoss, kT, slice));
      GradientSpec spec{.wrt = ParamNames(models.back())};
      if (slice.head) {
        spec.loss = "loss";
      } else {
        spec.seeds = {"y"};
      }
      if (!slice.embed) spec.wrt.push_back("x");
      backwards.push_back(BuildBackward(models.back().forward, spec));
    }
    std::vector<Scope> scopes;
    Tensor x;
    for (size_t k = 0; k < split.size(); ++k) {  // forward, keeping what each backward reads
      scopes.push_back(StageScope(models[k], params, batch));
      if (!split[k].embed) scopes[k].Set("x", x);
      RunReference(models[k].forward, scopes[k], DefaultAllocator(), false, backwards[k].saved);
      if (!split[k].head) x = scopes[k].Get("y");
    }
    Tensor dy;
    for (size_t k = split.size(); k-- > 0;) {  // backward, passing x.grad back as y.grad
      if (!split[k].head) scopes[k].Set("y.grad", dy);
      RunReference(backwards[k].program, scopes[k]);
      for (const ParamSpec& p : models[k].params) {
        EXPECT_TRUE(BitwiseEqual(scopes[k].Get(p.name + ".grad"), ws.Get(p.name + ".grad")))
            << p.name;
      }
      if (!split[k].embed) dy = scopes[k].Get("x.grad");
    }
  }
}

TEST(GptSlice, WholeSliceIsBuildGpt) {
  const Model a = BuildGpt(kCfg, kB, GptOutput::kLoss, kT);
  const Model b = BuildGptSlice(kCfg, kB, GptOutput::kLoss, kT, {.end_layer = kCfg.layers});
  EXPECT_EQ(a.forward.name(), "gpt");
  EXPECT_EQ(b.forward.name(), "gpt");
  ASSERT_EQ(a.forward.values().size(), b.forward.values().size());
  for (size_t i = 0; i < a.forward.values().size(); ++i)
    EXPECT_EQ(a.forward.values()[i].name, b.forward.values()[i].name);
  EXPECT_TRUE(a.forward.Find("h_in").has_value());
  EXPECT_TRUE(a.forward.Find("h.3.out").has_value());
  EXPECT_FALSE(a.forward.Find("y").has_value());
}

TEST(GptSlice, InvalidSlicesNameTheSlice) {
  auto message = [](const GptSlice& s) {
    try {
      BuildGptSlice(kCfg, kB, GptOutput::kLoss, kT, s);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_THAT(message({.embed = false, .first_layer = 2, .end_layer = 2, .head = false}),
              HasSubstr("GPT slice with no embed, no head and no layers (layers [2, 2)) is empty"));
  EXPECT_THAT(
      message({.embed = false, .first_layer = 2, .end_layer = 5, .head = false}),
      HasSubstr("GPT slice 'h.2-4': layers [2, 5) are not a range within the model's 4 layers"));
  EXPECT_THAT(message({.first_layer = 3, .end_layer = 1}),
              HasSubstr("layers [3, 1) are not a range within the model's 4 layers"));
  EXPECT_THAT(message({.embed = false, .first_layer = -1}), HasSubstr("layers [-1, 4)"));
}

}  // namespace
}  // namespace sluice
