// The autocast pass (ir/autocast.h): which casts go where on small programs, the unit-boundary
// rounding, per-unit copies of a parameter, the fp32 fallback it names, and that a program already
// holding bf16 is left as it is (so the pass is idempotent).
#include "sluice/ir/autocast.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sluice/ir/text_format.h"
#include "sluice/ir/verifier.h"

namespace sluice {
namespace {

using testing::ElementsAre;

// The instructions of `text` after the pass, as the printer writes them (one per line).
std::string Autocast(const std::string& text, AutocastResult* result = nullptr) {
  AutocastResult r = AutocastBf16(ParseProgram(text));
  Verify(r.program);
  const std::string printed = PrintProgram(r.program);
  if (result != nullptr) *result = std::move(r);
  return printed;
}

constexpr const char* kMlp = R"(program mlp {
  input %x: f32[8, 16]
  input %targets: i64[8]
  param %fc1.weight: f32[16, 32]
  param %fc1.bias: f32[32]
  param %fc2.weight: f32[32, 10]
  param %fc2.bias: f32[10]
  %h: f32[8, 32] = linear(%x, %fc1.weight, %fc1.bias)
  %a: f32[8, 32] = gelu(%h)
  %logits: f32[8, 10] = linear(%a, %fc2.weight, %fc2.bias)
  %loss: f32[] = cross_entropy(%logits, %targets)
  output %loss
}
)";

// Products take bf16 operands (bias f32) and give f32; GELU, read only by a product, takes and
// gives bf16; the loss runs f32. The first linear, read only by the bf16 GELU, stores its result
// rounded itself (dtype "bf16"): no f32 result, no cast. The weights are read f32 and rounded as
// the products load them (round_w): no bf16 copy of them.
TEST(Autocast, AnMlpMultipliesBf16OperandsAndKeepsItsLossF32) {
  AutocastResult r;
  EXPECT_EQ(Autocast(kMlp, &r), R"(program mlp {
  input %x: f32[8, 16]
  input %targets: i64[8]
  param %fc1.weight: f32[16, 32]
  param %fc1.bias: f32[32]
  param %fc2.weight: f32[32, 10]
  param %fc2.bias: f32[10]
  %x.bf16: bf16[8, 16] = cast(%x) {dtype = "bf16"}
  %h.bf16: bf16[8, 32] = linear(%x.bf16, %fc1.weight, %fc1.bias) {dtype = "bf16", round_w = true}
  %a: bf16[8, 32] = gelu(%h.bf16)
  %logits: f32[8, 10] = linear(%a, %fc2.weight, %fc2.bias) {round_w = true}
  %loss: f32[] = cross_entropy(%logits, %targets)
  output %loss
}
)");
  EXPECT_THAT(r.bf16_ops, ElementsAre("gelu", "linear"));
  EXPECT_THAT(r.f32_ops, ElementsAre("cross_entropy"));
  EXPECT_TRUE(r.already_bf16.empty());
}

// A linear whose result an f32 op of its unit reads, or that is a program output, keeps its f32
// result and a separate rounded copy for its bf16 readers.
TEST(Autocast, ALinearReadAsF32KeepsItsF32ResultAndTheCast) {
  const std::string out = Autocast(R"(program p {
  input %x: f32[4, 8]
  param %w: f32[8, 8]
  param %b: f32[8]
  %h: f32[4, 8] = linear(%x, %w, %b)
  %a: f32[4, 8] = gelu(%h)
  %g: f32[4, 8] = linear(%a, %w, %b)
  %s: f32[4, 8] = add(%h, %g)
  %loss: f32[] = sum(%s)
  %o: f32[4, 8] = linear(%a, %w, %b)
  output %loss
  output %o
}
)");
  EXPECT_THAT(out, testing::HasSubstr(R"(  %h: f32[4, 8] = linear(%x.bf16, %w, %b) {round_w = true}
  %h.bf16: bf16[4, 8] = cast(%h) {dtype = "bf16"}
  %a: bf16[4, 8] = gelu(%h.bf16)
)"));
  EXPECT_THAT(out, testing::HasSubstr("  %o: f32[4, 8] = linear(%a, %w, %b) {round_w = true}\n"));
  EXPECT_THAT(out, testing::Not(testing::HasSubstr("%b) {dtype")));
}

// A layer norm (or GELU) whose output an f32 op reads runs f32: its output would only be widened
// again. One bf16 copy of %h serves both products.
TEST(Autocast, AnActivationReadByAnF32OpStaysF32AndOneCopyServesEveryProduct) {
  AutocastResult r;
  const std::string out = Autocast(R"(program p {
  input %x: f32[4, 8]
  param %w: f32[8, 8]
  param %v: f32[8, 8]
  param %g: f32[8]
  param %b: f32[8]
  %h: f32[4, 8] = layer_norm(%x, %g, %b)
  %y: f32[4, 8] = add(%h, %x)
  %p: f32[4, 8] = matmul(%y, %w)
  %q: f32[4, 8] = matmul(%y, %v)
  %s: f32[4, 8] = add(%p, %q)
  %loss: f32[] = sum(%s)
  output %loss
}
)",
                                   &r);
  EXPECT_THAT(out, testing::HasSubstr("%h: f32[4, 8] = layer_norm(%x, %g, %b)"));
  EXPECT_THAT(out, testing::HasSubstr(R"(  %y: f32[4, 8] = add(%h, %x)
  %y.bf16: bf16[4, 8] = cast(%y) {dtype = "bf16"}
  %p: f32[4, 8] = matmul(%y.bf16, %w) {round_b = true}
  %q: f32[4, 8] = matmul(%y.bf16, %v) {round_b = true}
)"));
  EXPECT_THAT(r.bf16_ops, ElementsAre("matmul"));
  EXPECT_THAT(r.f32_ops, ElementsAre("add", "layer_norm", "sum"));
}

// What one unit makes and another reads is rounded by the unit making it; the reading unit
// multiplies the bf16 copy and widens it once for its f32 ops. A parameter two units' products
// read is rounded by each product as it loads it. Readers inside the making unit keep the f32
// value.
TEST(Autocast, AValueCrossingAUnitBoundaryIsRoundedByItsMaker) {
  AutocastResult r;
  const std::string out = Autocast(R"(program p {
  input %x: f32[4, 8]
  param %w: f32[8, 8]
  unit a {
    %h: f32[4, 8] = matmul(%x, %w)
    %r: f32[4, 8] = relu(%h)
    %y: f32[4, 8] = add(%h, %r)
  }
  unit b {
    %z: f32[4, 8] = matmul(%y, %w)
    %s: f32[4, 8] = add(%y, %z)
    %t: f32[4, 8] = mul(%y, %s)
    %loss: f32[] = sum(%t)
  }
  output %loss
}
)",
                                   &r);
  EXPECT_EQ(out, R"(program p {
  input %x: f32[4, 8]
  param %w: f32[8, 8]
  unit a {
    %x.bf16: bf16[4, 8] = cast(%x) {dtype = "bf16"}
    %h: f32[4, 8] = matmul(%x.bf16, %w) {round_b = true}
    %r: f32[4, 8] = relu(%h)
    %y: f32[4, 8] = add(%h, %r)
    %y.bf16: bf16[4, 8] = cast(%y) {dtype = "bf16"}
  }
  unit b {
    %z: f32[4, 8] = matmul(%y.bf16, %w) {round_b = true}
    %y.f32: f32[4, 8] = cast(%y.bf16) {dtype = "f32"}
    %s: f32[4, 8] = add(%y.f32, %z)
    %t: f32[4, 8] = mul(%y.f32, %s)
    %loss: f32[] = sum(%t)
  }
  output %loss
}
)");
  EXPECT_THAT(r.f32_ops, ElementsAre("add", "mul", "relu", "sum"));
}

// The fused attention takes bf16 qkv and gives bf16 y (read by a product) and f32 lse.
TEST(Autocast, FusedAttentionTakesAndGivesBf16) {
  const std::string out = Autocast(R"(program p {
  input %x: f32[2, 4, 8]
  param %wqkv: f32[8, 24]
  param %wo: f32[8, 8]
  %qkv: f32[2, 4, 24] = matmul(%x, %wqkv)
  %y: f32[2, 4, 8], %lse: f32[2, 2, 4] = causal_attention_qkv(%qkv) {heads = 2, scale = 0.5}
  %o: f32[2, 4, 8] = matmul(%y, %wo)
  %loss: f32[] = sum(%o)
  output %loss
}
)");
  EXPECT_THAT(out, testing::HasSubstr(R"(  %qkv.bf16: bf16[2, 4, 24] = cast(%qkv) {dtype = "bf16"}
  %y: bf16[2, 4, 8], %lse: f32[2, 2, 4] = causal_attention_qkv(%qkv.bf16) {heads = 2, scale = 0.5}
  %o: f32[2, 4, 8] = matmul(%y, %wo) {round_b = true}
)"));
}

// Llama's MLP: rms_norm read by products takes and gives bf16 (its weight f32); swiglu takes the
// two products' results rounded once each and gives the down projection bf16.
TEST(Autocast, RmsNormAndSwigluTakeAndGiveBf16) {
  AutocastResult result;
  const std::string out = Autocast(R"(program p {
  input %x: f32[4, 8]
  param %norm.weight: f32[8]
  param %gate: f32[8, 16]
  param %up: f32[8, 16]
  param %down: f32[16, 8]
  %h: f32[4, 8] = rms_norm(%x, %norm.weight) {eps = 1e-06}
  %a: f32[4, 16] = matmul(%h, %gate)
  %b: f32[4, 16] = matmul(%h, %up)
  %g: f32[4, 16] = swiglu(%a, %b)
  %o: f32[4, 8] = matmul(%g, %down)
  %loss: f32[] = sum(%o)
  output %loss
}
)",
                                   &result);
  EXPECT_THAT(out, testing::HasSubstr(R"(  %x.bf16: bf16[4, 8] = cast(%x) {dtype = "bf16"}
  %h: bf16[4, 8] = rms_norm(%x.bf16, %norm.weight) {eps = 1e-06}
)"));
  EXPECT_THAT(out, testing::HasSubstr(R"(  %a: f32[4, 16] = matmul(%h, %gate) {round_b = true}
  %a.bf16: bf16[4, 16] = cast(%a) {dtype = "bf16"}
)"));
  EXPECT_THAT(out, testing::HasSubstr(R"(  %g: bf16[4, 16] = swiglu(%a.bf16, %b.bf16)
  %o: f32[4, 8] = matmul(%g, %down) {round_b = true}
)"));
  EXPECT_THAT(result.bf16_ops, ElementsAre("matmul", "rms_norm", "swiglu"));
  EXPECT_THAT(result.f32_ops, ElementsAre("sum"));
}

// Shape ops carry bf16 between a layer norm and a product (as tools/torch_export.py writes a
// linear: reshape, then matmul); one that an f32 op reads stays f32.
TEST(Autocast, ShapeOpsCarryBf16ToAProduct) {
  AutocastResult r;
  const std::string out = Autocast(R"(program p {
  input %x: f32[2, 4, 8]
  param %w: f32[8, 8]
  param %g: f32[8]
  param %b: f32[8]
  %n: f32[2, 4, 8] = layer_norm(%x, %g, %b)
  %v: f32[8, 8] = reshape(%n) {shape = [8, 8]}
  %h: f32[8, 8] = matmul(%v, %w)
  %t: f32[8, 8] = transpose(%h) {dim0 = 0, dim1 = 1}
  %loss: f32[] = sum(%t)
  output %loss
}
)",
                                   &r);
  EXPECT_THAT(out, testing::HasSubstr(R"(  %x.bf16: bf16[2, 4, 8] = cast(%x) {dtype = "bf16"}
  %n: bf16[2, 4, 8] = layer_norm(%x.bf16, %g, %b)
  %v: bf16[8, 8] = reshape(%n) {shape = [8, 8]}
  %h: f32[8, 8] = matmul(%v, %w) {round_b = true}
  %t: f32[8, 8] = transpose(%h) {dim0 = 0, dim1 = 1}
)"));
  EXPECT_THAT(r.bf16_ops, ElementsAre("layer_norm", "matmul", "reshape"));
  EXPECT_THAT(r.f32_ops, ElementsAre("sum", "transpose"));
}

// An exported GPT's attention: the projection's result (after its bias, f32) is rounded once, and
// the split, the per-head reshapes and transposes, causal_attention on split heads (lse f32) and
// the merge back carry bf16 to the output projection.
TEST(Autocast, SplitHeadsAttentionAndTheShapeOpsAroundItCarryBf16) {
  AutocastResult r;
  const std::string out = Autocast(R"(program p {
  input %x: f32[2, 4, 8]
  param %wqkv: f32[8, 24]
  param %bqkv: f32[24]
  param %wo: f32[8, 8]
  %m: f32[2, 4, 24] = matmul(%x, %wqkv)
  %qkv: f32[2, 4, 24] = add(%m, %bqkv)
  %q: f32[2, 4, 8], %k: f32[2, 4, 8], %v: f32[2, 4, 8] = split(%qkv) {axis = 2, sizes = [8, 8, 8]}
  %q4: f32[2, 4, 2, 4] = reshape(%q) {shape = [2, 4, 2, 4]}
  %k4: f32[2, 4, 2, 4] = reshape(%k) {shape = [2, 4, 2, 4]}
  %v4: f32[2, 4, 2, 4] = reshape(%v) {shape = [2, 4, 2, 4]}
  %qh: f32[2, 2, 4, 4] = transpose(%q4) {dim0 = 1, dim1 = 2}
  %kh: f32[2, 2, 4, 4] = transpose(%k4) {dim0 = 1, dim1 = 2}
  %vh: f32[2, 2, 4, 4] = transpose(%v4) {dim0 = 1, dim1 = 2}
  %y: f32[2, 2, 4, 4], %lse: f32[2, 2, 4] = causal_attention(%qh, %kh, %vh) {scale = 0.5}
  %yt: f32[2, 4, 2, 4] = transpose(%y) {dim0 = 1, dim1 = 2}
  %ym: f32[2, 4, 8] = reshape(%yt) {shape = [2, 4, 8]}
  %o: f32[2, 4, 8] = matmul(%ym, %wo)
  %loss: f32[] = sum(%o)
  output %loss
}
)",
                                   &r);
  EXPECT_THAT(out, testing::HasSubstr(R"(  %qkv: f32[2, 4, 24] = add(%m, %bqkv)
  %qkv.bf16: bf16[2, 4, 24] = cast(%qkv) {dtype = "bf16"}
  %q: bf16[2, 4, 8], %k: bf16[2, 4, 8], %v: bf16[2, 4, 8] = split(%qkv.bf16) {axis = 2, sizes = [8, 8, 8]}
)"));
  EXPECT_THAT(
      out,
      testing::HasSubstr(
          R"(  %y: bf16[2, 2, 4, 4], %lse: f32[2, 2, 4] = causal_attention(%qh, %kh, %vh) {scale = 0.5}
  %yt: bf16[2, 4, 2, 4] = transpose(%y) {dim0 = 1, dim1 = 2}
  %ym: bf16[2, 4, 8] = reshape(%yt) {shape = [2, 4, 8]}
)"));
  EXPECT_THAT(r.bf16_ops,
              ElementsAre("causal_attention", "matmul", "reshape", "split", "transpose"));
  EXPECT_THAT(r.f32_ops, ElementsAre("add", "sum"));
}

// add and mul follow PyTorch's type promotion: bf16 where both operands are bf16 already (here two
// GELUs running bf16), computing in f32. An f32 operand keeps the op f32 and nothing is rounded
// for it: a product's result (a residual stream a linear starts), or a slice of a constant table
// (a Llama's rotary cos; the slice does not turn bf16 to feed it).
TEST(Autocast, ArithmeticRunsBf16OnlyOnBf16Operands) {
  AutocastResult r;
  const std::string out = Autocast(R"(program p {
  input %x: f32[4, 8]
  param %w1: f32[8, 8]
  param %w3: f32[8, 8]
  param %w2: f32[8, 8]
  const %cos: f32[6, 8] = loaded
  %a: f32[4, 8] = matmul(%x, %w1)
  %b: f32[4, 8] = matmul(%x, %w3)
  %g: f32[4, 8] = gelu(%a)
  %e: f32[4, 8] = gelu(%b)
  %h: f32[4, 8] = mul(%g, %e)
  %o: f32[4, 8] = matmul(%h, %w2)
  %c: f32[4, 8] = slice(%cos) {axis = 0, start = 0, end = 4}
  %rot: f32[4, 8] = mul(%o, %c)
  %u: f32[4, 8] = gelu(%rot)
  %res: f32[4, 8] = add(%o, %u)
  %q: f32[4, 8] = matmul(%res, %w2)
  %loss: f32[] = sum(%q)
  output %loss
}
)",
                                   &r);
  EXPECT_THAT(out, testing::HasSubstr(R"(  %h: bf16[4, 8] = mul(%g, %e)
  %o: f32[4, 8] = matmul(%h, %w2) {round_b = true}
  %c: f32[4, 8] = slice(%cos) {axis = 0, end = 4, start = 0}
  %rot: f32[4, 8] = mul(%o, %c)
  %u: f32[4, 8] = gelu(%rot)
  %res: f32[4, 8] = add(%o, %u)
  %res.bf16: bf16[4, 8] = cast(%res) {dtype = "bf16"}
)"));
  EXPECT_THAT(r.bf16_ops, ElementsAre("gelu", "matmul", "mul"));
  EXPECT_THAT(r.f32_ops, ElementsAre("add", "gelu", "mul", "slice", "sum"));
}

// An activation that is a program output stays f32: outputs keep their types.
TEST(Autocast, OutputsKeepTheirTypes) {
  AutocastResult r;
  const std::string out = Autocast(R"(program p {
  input %x: f32[4, 8]
  param %w: f32[8, 8]
  %h: f32[4, 8] = matmul(%x, %w)
  %a: f32[4, 8] = gelu(%h)
  output %a
}
)",
                                   &r);
  EXPECT_THAT(out, testing::HasSubstr("%a: f32[4, 8] = gelu(%h)"));
  EXPECT_THAT(r.f32_ops, ElementsAre("gelu"));
}

// f64 values and the ops reading them are left as written.
TEST(Autocast, F64IsLeftAlone) {
  const std::string text = R"(program p {
  input %x: f64[4, 8]
  param %w: f64[8, 8]
  %h: f64[4, 8] = matmul(%x, %w)
  %loss: f64[] = sum(%h)
  output %loss
}
)";
  AutocastResult r;
  EXPECT_EQ(Autocast(text, &r), text);
  EXPECT_TRUE(r.bf16_ops.empty());
  EXPECT_TRUE(r.f32_ops.empty());
}

// A program holding bf16 already sets its own precision: the pass names the value and changes
// nothing, so applying it twice is applying it once.
TEST(Autocast, IsIdempotentAndLeavesABf16ProgramAlone) {
  const std::string once = Autocast(kMlp);
  AutocastResult r;
  EXPECT_EQ(Autocast(once, &r), once);
  EXPECT_EQ(r.already_bf16, "x.bf16");
  EXPECT_TRUE(r.f32_ops.empty());
}

// A name the pass would make that the program uses later is not taken.
TEST(Autocast, NewNamesNeverCollideWithTheProgramsOwn) {
  const std::string out = Autocast(R"(program p {
  input %x: f32[4, 8]
  param %w: f32[8, 8]
  %h: f32[4, 8] = matmul(%x, %w)
  %x.bf16: f32[4, 8] = relu(%h)
  %loss: f32[] = sum(%x.bf16)
  output %loss
}
)");
  EXPECT_THAT(out, testing::HasSubstr("%x.bf16_0: bf16[4, 8] = cast(%x)"));
  EXPECT_THAT(out, testing::HasSubstr("%x.bf16: f32[4, 8] = relu(%h)"));
}

}  // namespace
}  // namespace sluice
