// The autocast pass (ir/autocast.h) on the built-in GPT at fp32 against the GPT's own bf16 program
// (nn/gpt.cc): one set of rules makes both (for the default GPT; the cases that differ below).
// Compared instruction by instruction, names aside — each operand by where it comes from (an input
// or parameter by name, an instruction's output by its position), each output by its type.
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "sluice/ir/autocast.h"
#include "sluice/nn/gpt.h"
#include "sluice/nn/training_program.h"

namespace sluice {
namespace {

// One line per instruction: op, attributes, operands by origin, output types.
std::vector<std::string> Structure(const Program& p) {
  std::vector<std::string> origin(p.values().size());
  for (ValueId v : p.inputs()) origin[static_cast<size_t>(v)] = "%" + p.value(v).name;
  for (ValueId v : p.params()) origin[static_cast<size_t>(v)] = "%" + p.value(v).name;
  std::vector<std::string> lines;
  for (size_t i = 0; i < p.instructions().size(); ++i) {
    const Instruction& ins = p.instructions()[i];
    std::string line = ins.op->name + "(";
    for (ValueId v : ins.inputs) line += origin[static_cast<size_t>(v)] + " ";
    line += ")";
    for (const auto& [name, value] : ins.attrs.items()) line += " " + name;
    if (ins.attrs.Has("dtype")) line += "=" + ins.attrs.GetString("dtype");
    for (size_t k = 0; k < ins.outputs.size(); ++k) {
      origin[static_cast<size_t>(ins.outputs[k])] = fmt::format("#{}.{}", i, k);
      line += " -> " + p.type(ins.outputs[k]).ToString();
    }
    lines.push_back(line);
  }
  return lines;
}

// Whether the pass on the fp32 GPT of `c` gives the instructions of its bf16 GPT; the first
// difference printed.
void ExpectAutocastIsBf16Gpt(GptConfig c, const std::string& what) {
  const Model fp32 = BuildGpt(c, 4, GptOutput::kLoss);
  c.precision = Precision::kBf16;
  const Model bf16 = BuildGpt(c, 4, GptOutput::kLoss);
  const Model cast = AutocastTrainingModel(fp32);
  const std::vector<std::string> want = Structure(bf16.forward), got = Structure(cast.forward);
  ASSERT_NE(Structure(fp32.forward), want);
  for (size_t i = 0; i < std::max(want.size(), got.size()); ++i) {
    ASSERT_EQ(i < got.size() ? got[i] : "(none)", i < want.size() ? want[i] : "(none)")
        << what << ": instruction " << i;
  }
  EXPECT_EQ(cast.forward.units(), bf16.forward.units()) << what;
}

// The default GPT (fused attention, fused head) only: with the unfused head (--head-chunk -1) the
// pass multiplies the logits in bf16 and runs ln_f bf16 where the builder keeps the head f32, and
// with --attention naive it rounds q, k, v and the probabilities for the attention products,
// which the builder leaves f32.
TEST(AutocastGpt, TheFp32GptAutocastIsTheBf16Gpt) {
  ExpectAutocastIsBf16Gpt({.vocab = 11, .seq = 16, .layers = 2, .heads = 2, .dim = 16}, "L=2");
  ExpectAutocastIsBf16Gpt({.vocab = 13, .seq = 8, .layers = 3, .heads = 4, .dim = 32}, "L=3");
}

}  // namespace
}  // namespace sluice
