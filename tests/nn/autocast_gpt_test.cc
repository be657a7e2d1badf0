// The built-in GPT under Precision::kBf16 is its f32 program through the autocast pass
// (nn/gpt.h, ir/autocast.h): which operands each op of it reads in which dtype, for the default
// GPT (fused attention, fused head) and for the settings that differ from it — --attention naive
// and the unfused head (--head-chunk -1, and the logits program) — which follow the same rules, as
// PyTorch's autocast does.
#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "sluice/nn/gpt.h"

namespace sluice {
namespace {

const GptConfig kCfg{.vocab = 11, .seq = 8, .layers = 2, .heads = 2, .dim = 16};

// Per op, the dtypes of its float operands, "bf16 f32 …" per instruction: the set of patterns
// seen (casts left out); a product's second operand rounded to bf16 as it is loaded (round_b,
// round_w) "f32>bf16".
std::map<std::string, std::set<std::string>> OperandTypes(const Program& p) {
  std::map<std::string, std::set<std::string>> out;
  for (const Instruction& ins : p.instructions()) {
    if (ins.op->name == "cast") continue;
    const bool rounds = ins.attrs.GetBool("round_b", false) || ins.attrs.GetBool("round_w", false);
    std::string types;
    for (size_t k = 0; k < ins.inputs.size(); ++k) {
      const ValueId v = ins.inputs[k];
      if (!IsFloating(p.type(v).dtype)) continue;
      types += (types.empty() ? "" : " ") + std::string(Name(p.type(v).dtype)) +
               (rounds && k == 1 ? ">bf16" : "");
    }
    out[ins.op->name].insert(types);
  }
  return out;
}

Model Bf16Gpt(GptConfig c, GptOutput output = GptOutput::kLoss) {
  c.precision = Precision::kBf16;
  return BuildGpt(c, 2, output);
}

using Types = std::set<std::string>;

// The block linears multiply bf16 operands (f32 bias), their weights rounded as the products load
// them (no bf16 copy of a weight); layer norms, GELU and the fused attention
// feeding them take bf16; the residual additions and the fused head run f32.
TEST(AutocastGpt, DefaultBlocksRunBf16AndTheFusedHeadF32) {
  const auto ops = OperandTypes(Bf16Gpt(kCfg).forward);
  EXPECT_EQ(ops.at("linear"), Types{"bf16 f32>bf16 f32"});
  EXPECT_EQ(ops.at("gelu"), Types{"bf16"});
  EXPECT_EQ(ops.at("causal_attention_qkv"), Types{"bf16"});
  // ln_1 and ln_2 take bf16 (their weights f32); ln_f feeds the f32 head, so runs f32.
  EXPECT_EQ(ops.at("layer_norm"), (Types{"bf16 f32 f32", "f32 f32 f32"}));
  EXPECT_EQ(ops.at("add"), Types{"f32 f32"});
  EXPECT_EQ(ops.at("linear_cross_entropy"), Types{"f32 f32"});
}

// --attention naive: both attention products multiply bf16 (q, k, v rounded before the head
// split's reshape and transpose, the probabilities after softmax); scale, mask and softmax f32.
TEST(AutocastGpt, NaiveAttentionMultipliesBf16AndSoftmaxRunsF32) {
  GptConfig c = kCfg;
  c.attention = GptAttention::kNaive;
  const Model m = Bf16Gpt(c);
  const auto ops = OperandTypes(m.forward);
  EXPECT_EQ(ops.at("matmul"), Types{"bf16 bf16"});
  EXPECT_EQ(ops.at("transpose"), Types{"bf16"});
  EXPECT_EQ(ops.at("softmax"), Types{"f32"});
  EXPECT_EQ(ops.at("causal_mask"), Types{"f32"});
  EXPECT_EQ(ops.at("scale"), Types{"f32"});
  EXPECT_EQ(ops.at("linear"), Types{"bf16 f32>bf16 f32"});
  // The [B, H, T, T] values selective recompute drops include the probabilities' bf16 copy.
  const Program& p = m.forward;
  ASSERT_TRUE(p.Find("h.0.attn.probs.bf16"));
  EXPECT_NE(std::find(m.attention_values.begin(), m.attention_values.end(), "h.0.attn.probs.bf16"),
            m.attention_values.end());
}

// The unfused head (--head-chunk -1) and the logits program: ln_f gives bf16 to the logits'
// product with lm_head rounded as it is loaded; the logits are f32, and so is the cross-entropy.
TEST(AutocastGpt, UnfusedHeadMultipliesTheLogitsBf16) {
  GptConfig c = kCfg;
  c.head_chunk = -1;
  for (const Model& m : {Bf16Gpt(c), Bf16Gpt(kCfg, GptOutput::kLogits)}) {
    const Program& p = m.forward;
    const auto ops = OperandTypes(p);
    EXPECT_EQ(ops.at("matmul"), Types{"bf16 f32>bf16"});     // lm_head rounded on load
    EXPECT_EQ(ops.at("layer_norm"), Types{"bf16 f32 f32"});  // ln_f too
    EXPECT_EQ(p.type(p.Get("logits")).dtype, DType::kF32);
    if (m.loss.empty()) continue;
    EXPECT_EQ(ops.at("cross_entropy"), Types{"f32"});
  }
}

}  // namespace
}  // namespace sluice
