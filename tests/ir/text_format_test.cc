// The program text format: round trips (print -> parse -> print gives the same text) on programs
// built with the Builder and on examples/, exact float and attribute-type round trips, quoting of
// odd names, and file loading. Malformed inputs are in text_format_errors_test.cc.
#include "sluice/ir/text_format.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>

#include <gtest/gtest.h>

#include "scratch_path.h"
#include "sluice/core/error.h"
#include "sluice/ir/ops.h"
#include "source_dir.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;

using testing_support::SourceDir;

void ExpectRoundTrip(const Program& p) {
  const std::string text = PrintProgram(p);
  const Program q = ParseProgram(text, p.name());
  EXPECT_EQ(PrintProgram(q), text);
  ASSERT_EQ(q.instructions().size(), p.instructions().size());
  for (size_t i = 0; i < p.instructions().size(); ++i) {
    EXPECT_EQ(q.instructions()[i].op, p.instructions()[i].op) << "instruction " << i;
    EXPECT_TRUE(q.instructions()[i].attrs == p.instructions()[i].attrs) << "instruction " << i;
  }
  EXPECT_EQ(q.inputs().size(), p.inputs().size());
  EXPECT_EQ(q.params().size(), p.params().size());
  EXPECT_EQ(q.outputs().size(), p.outputs().size());
}

// A GPT-like block: embedding, layer norm, attention with heads, residuals, a final RMS norm, loss.
Program TransformerBlock() {
  const int64_t B = 2, T = 4, C = 8, H = 2, vocab = 11;
  Builder b("gpt.block");
  Var ids = b.Input("ids", DType::kI64, {B, T});
  Var targets = b.Input("targets", DType::kI32, {B, T});
  Var wte = b.Param("wte", DType::kF32, {vocab, C});
  Var x = b.Name(Embedding(ids, wte), "x");
  Builder::NameScope h0(b, "h.0");
  Var ln_w = b.Param(b.Prefixed("ln_1.weight"), DType::kF32, {C});
  Var ln_b = b.Param(b.Prefixed("ln_1.bias"), DType::kF32, {C});
  Var xn = b.Name(LayerNorm(x, ln_w, ln_b, 1e-5), "ln_1");
  Var w_qkv = b.Param(b.Prefixed("attn.c_attn.weight"), DType::kF32, {C, 3 * C});
  Var b_qkv = b.Param(b.Prefixed("attn.c_attn.bias"), DType::kF32, {3 * C});
  Var qkv = b.Name(Linear(xn, w_qkv, b_qkv), "attn.c_attn");
  Var heads = Transpose(Reshape(qkv, {B, T, 3 * H, C / H}), 1, 2);  // [B, 3H, T, C/H]
  Var scores = MatMul(heads, heads, false, true);
  Var probs = Softmax(CausalMask(scores));
  Var probs2 = CausalSoftmax(scores);
  Var ctx = MatMul(Add(probs, probs2), heads);
  Var merged = Reshape(Transpose(ctx, 1, 2), {B, T, -1});  // [B, T, 3C]
  Var w_proj = b.Param(b.Prefixed("attn.c_proj.weight"), DType::kF32, {3 * C, C});
  Var b_proj = b.Param(b.Prefixed("attn.c_proj.bias"), DType::kF32, {C});
  Var y = Add(x, Linear(merged, w_proj, b_proj));
  Var rms_w = b.Param(b.Prefixed("rms_f.weight"), DType::kF32, {C});
  Var yn = b.Name(RmsNorm(y, rms_w, 1e-6), "rms_f");
  Var logits = MatMul(yn, wte, false, true);  // tied embedding: [B, T, vocab]
  Var loss = b.Name(CrossEntropy(logits, targets), "loss");
  b.Output(loss);
  b.Output(y);
  return b.Build();
}

// Hand-written gradient ops and the optimizers, with names like autodiff's (%w.grad).
Program GradientsAndOptimizers() {
  Builder b("grads.and.optimizers");
  Var x = b.Input("x", DType::kF64, {3, 5});
  Var dy = b.Input("y.grad", DType::kF64, {3, 5});
  Var targets = b.Input("targets", DType::kI64, {3});
  Var ids = b.Input("ids", DType::kI32, {3});
  Var lr = b.Input("lr", DType::kF64, {});
  Var step = b.Input("step", DType::kI64, {});
  Var w = b.Param("w", DType::kF64, {5});
  Var bias = b.Param("b", DType::kF64, {5});
  Var m = b.Param("w.m", DType::kF64, {5});
  Var v = b.Param("w.v", DType::kF64, {5});
  Var y = Softmax(x);
  Var dx = b.Name(SoftmaxGrad(dy, y), "x.grad");
  Var dxn = LayerNormGradX(dy, x, w, 1e-6);
  auto [dw, db] = LayerNormGradParams(dy, x);
  Var drms = RmsNormGradX(dy, x, w, 1e-5);
  Var drms_w = RmsNormGradWeight(dy, x);
  b.Name(dw, "w.grad");
  Var one = Full(b, Shape{}, 1.0, DType::kF64);
  Var dlogits = CrossEntropyGrad(x, targets, one);
  Var dtable = EmbeddingGrad(ids, dy, 7);
  // Fused attention over x seen as [T = 3, D = 5] (one head), and its gradient.
  auto [att, lse] = CausalAttention(x, x, x, 0.5);
  std::vector<Var> dqkv = CausalAttentionGrad(dy, lse, x, x, x, att, lse, 0.5);
  // Over every key; and with a key bias [T = 3] over x seen as [H = 1, T = 3, D = 5].
  auto [att_all, lse_all] = Attention(x, x, x, 0.5);
  std::vector<Var> dall = AttentionGrad(dy, lse_all, x, x, x, att_all, lse_all, 0.5);
  Var heads = Reshape(x, {1, 3, 5}), key_bias = b.Input("key_bias", DType::kF64, {3});
  auto [att_bias, lse_bias] = Attention(heads, heads, heads, 0.5, key_bias);
  std::vector<Var> dbias = AttentionGrad(Reshape(dy, {1, 3, 5}), lse_bias, heads, heads, heads,
                                         att_bias, lse_bias, 0.5, key_bias);
  // The packed form over qkv [T = 3, 3C = 6], one head of C = 2, and its gradient.
  Var packed = b.Input("qkv", DType::kF64, {3, 6});
  auto [att_packed, lse_packed] = CausalAttentionQkv(packed, 1, 0.5);
  Var dpacked =
      CausalAttentionQkvGrad(att_packed, lse_packed, packed, att_packed, lse_packed, 1, 0.5);
  // A GELU's input gradient from the matmul producing its output gradient: [3, 5]·[5, 5]ᵀ.
  Var dgelu = MatMulGeluGrad(dy, b.Input("w5", DType::kF64, {5, 5}), x, false, true);
  // A bf16 linear's output gradient [2, 3, 4], rounded for its products and summed for its bias.
  std::vector<Var> dy_bf16_db = CastBf16AndSum(b.Input("dy32", DType::kF32, {2, 3, 4}));
  // The chunked head (x [3, 5], a [7, 5] weight) and its gradient; gradients added into buffers.
  Var head = b.Input("head", DType::kF64, {7, 5});
  Var head_loss = LinearCrossEntropy(x, head, targets, 2);
  auto [dhead_x, dhead_w] = LinearCrossEntropyGrad(x, head, targets, one, 2);
  Var acc = b.Input("acc", DType::kF64, {5, 5});
  b.Emit("matmul_accumulate", {acc, x, dy}, {{"transpose_a", true}});
  b.Emit("accumulate", {acc, b.Input("part", DType::kF64, {5, 5})});
  Var summed = SumTo(BroadcastTo(db, Shape{3, 5}), Shape{5});
  // The out-of-place forms write buffers of their own (post-validation's spares), then in place.
  const auto spare = [&](const char* name) { return b.Param(name, DType::kF64, {5}); };
  SgdUpdateInto(bias, summed, Copy(bias), lr, spare("b.next"), spare("b.buf.next"),
                {.momentum = 0.5});
  AdamWUpdateInto(w, dw, m, v, lr, step, spare("w.next"), spare("w.m.next"), spare("w.v.next"),
                  {.beta2 = 0.99});
  SgdUpdate(bias, summed, Copy(bias), lr, {.momentum = 0.9, .weight_decay = 1e-4});
  AdamWUpdate(w, dw, m, v, lr, step, {.beta1 = 0.8, .eps = 1e-12});
  b.Output(dx);
  b.Output(dy_bf16_db[0]);
  b.Output(dy_bf16_db[1]);
  b.Output(dxn);
  b.Output(drms);
  b.Output(drms_w);
  b.Output(dlogits);
  b.Output(dtable);
  b.Output(dqkv[0]);
  b.Output(dall[0]);
  b.Output(dbias[0]);
  b.Output(dpacked);
  b.Output(dgelu);
  b.Output(head_loss);
  b.Output(dhead_x);
  b.Output(dhead_w);
  return b.Build();
}

// Elementwise, reduction and shape ops, several outputs per instruction, every dtype in a type.
Program ElementwiseShapesAndReductions() {
  Builder b("shapes");
  Var x = b.Input("x", DType::kF32, {2, 3, 4});
  Var y = b.Input("y", DType::kF32, {4});
  Var z = Add(Sub(Mul(x, y), Div(x, y)), Neg(Scale(x, 0.125)));
  Var act =
      Add(Add(Add(Relu(z), Gelu(z)), Add(Tanh(z), Sqrt(Exp(Log(z))))), Add(Silu(z), GeluErf(z)));
  act = Add(Add(act, Swiglu(z, act)), Sigmoid(z));
  Var grads = Add(Add(Add(ReluGrad(act, z), GeluGrad(act, z)), TanhGrad(act, z)),
                  Add(SiluGrad(act, z), GeluErfGrad(act, z)));
  grads = Add(grads, SigmoidGrad(act, z));
  grads = Add(grads, SwigluGrad(act, z, grads)[1]);
  std::vector<Var> parts = Split(grads, 2, {1, 3});
  Var joined = Concat({parts[1], parts[0], Slice(grads, 2, 1, 2)}, 2);
  Var perm = Permute(joined, {2, 0, 1});
  std::vector<Var> rows = Split(perm, 0, {2, 3});        // leading axis: views
  perm = Concat({rows[1], Slice(rows[0], 0, 0, 2)}, 0);  // [5, 2, 3]
  perm = Where(Compare(perm, Slice(perm, 2, 0, 1), "gt"), perm, Scale(perm, 0.5));
  Var reduced = Add(Sum(perm, {0}, true), Mean(perm, {-1, 0}, true));
  Var full = Add(Zeros(b, Shape{1, 1, 1}, DType::kF32), Ones(b, Shape{1}, DType::kF32));
  b.Output(Cast(Add(reduced, full), DType::kF64));
  b.Output(b.Input("half", DType::kF16, {2}));  // storage-only dtypes still read and print
  b.Output(b.Input("brain", DType::kBF16, {2, 1}));
  b.Output(b.Input("ids", DType::kI32, {0}));
  return b.Build();
}

// Convolution and pooling over images, attributed activations and a smoothed, summed loss, with
// the gradient ops of each.
Program ImagesAndActivations() {
  Builder b("images");
  Var x = b.Input("x", DType::kF32, {2, 3, 8, 8});
  Var w = b.Param("w", DType::kF32, {4, 3, 3, 3});
  Var h = Softplus(LeakyRelu(Conv2d(x, w, {2, 1}, {1, 0}), 0.2), 2.0, 15.0);     // [2, 4, 4, 6]
  Var pooled = Add(MaxPool2d(h, {2, 2}, {2, 2}), AvgPool2d(h, {2, 2}, {2, 2}));  // [2, 4, 2, 3]
  Var dh = Add(LeakyReluGrad(h, h, 0.2), SoftplusGrad(h, h, 2.0, 15.0));
  // ReLU6 and its gradient: the bounds, floats, travel through the text.
  Var clamped = Hardtanh(h, 0.0, 6.0);
  b.Output(HardtanhGrad(clamped, clamped, 0.0, 6.0));
  const ConvOptions strided{.stride = {2, 1}, .padding = {1, 0}};
  b.Output(Conv2dGradInput(dh, w, strided, 8, 8));
  b.Output(Conv2dGradWeight(dh, x, strided, {3, 3}));
  // A depthwise (3 groups), dilated convolution: its attributes travel through the text too.
  Var depthwise = b.Param("depthwise", DType::kF32, {6, 1, 3, 3});
  b.Output(Conv2d(x, depthwise, {.padding = {2, 2}, .dilation = {2, 2}, .groups = 3}));
  b.Output(MaxPool2dGrad(pooled, h, {2, 2}, {2, 2}, {0, 0}));
  b.Output(AvgPool2dGrad(pooled, {2, 2}, {2, 2}, {0, 0}, 4, 6));
  // Batch norm in both modes, its gradient ops and the running statistics' update (buffers in a
  // model; here parameters, which the update may write too).
  Var gamma = b.Param("gamma", DType::kF32, {4});
  Var beta = b.Param("beta", DType::kF32, {4});
  Var mean = b.Param("running_mean", DType::kF32, {4});
  Var var = b.Param("running_var", DType::kF32, {4});
  Var normed = BatchNorm(pooled, gamma, beta, mean, var, {.eps = 1e-3});
  b.Output(BatchNorm(normed, gamma, beta, mean, var, {.training = false}));
  b.Output(BatchNormGradX(normed, pooled, gamma, 1e-3));
  b.Output(BatchNormGradParams(normed, pooled, 1e-3).first);
  BatchNormUpdateStats(pooled, mean, var, 0.25);
  // Dropout, with one key per example and in evaluation.
  Var keys = b.Input("keys", DType::kI64, {2});
  b.Output(Dropout(pooled, keys, 0.25, 3));
  b.Output(b.Emit1("dropout", {pooled, keys},
                   {{"p", 0.5}, {"stream", int64_t{4}}, {"training", false}}));
  Var logits = Reshape(pooled, {2, 4 * 2 * 3});
  Var labels = b.Input("labels", DType::kI64, {2});
  b.Output(b.Emit1("cross_entropy", {logits, labels},
                   {{"label_smoothing", 0.1}, {"reduction", std::string("sum")}}));
  return b.Build();
}

TEST(TextFormat, RoundTripsTransformerBlock) { ExpectRoundTrip(TransformerBlock()); }

TEST(TextFormat, RoundTripsImagesAndActivations) { ExpectRoundTrip(ImagesAndActivations()); }

TEST(TextFormat, RoundTripsGradientAndOptimizerOps) { ExpectRoundTrip(GradientsAndOptimizers()); }

TEST(TextFormat, RoundTripsElementwiseShapeAndReductionOps) {
  ExpectRoundTrip(ElementwiseShapesAndReductions());
}

// The programs above are meant to use every registered op; an op added later needs a line in one
// of them so that its attributes are known to round-trip.
TEST(TextFormat, RoundTripProgramsCoverEveryRegisteredOp) {
  std::set<std::string> used;
  for (const Program& p : {TransformerBlock(), GradientsAndOptimizers(),
                           ElementwiseShapesAndReductions(), ImagesAndActivations()}) {
    for (const Instruction& ins : p.instructions()) used.insert(ins.op->name);
  }
  for (const OpDef* op : OpRegistry::Global().All()) {
    EXPECT_TRUE(used.count(op->name)) << "op '" << op->name << "' is in no round-trip program of "
                                      << "tests/ir/text_format_test.cc; add it to one";
  }
}

// A constant prints as `const`, where it was declared among the parameters, and parses back as one.
TEST(TextFormat, ConstantsRoundTripAsConstants) {
  Program p("rope");
  const ValueId x = p.AddInput("x", {DType::kF32, Shape{2, 4}});
  const ValueId w = p.AddParam("w", {DType::kF32, Shape{4}});
  const ValueId table = p.AddConst("table", {DType::kF32, Shape{8, 4}});
  const ValueId rows = p.AddInstruction(
      "slice", {table}, {{"axis", int64_t{0}}, {"start", int64_t{0}}, {"end", int64_t{2}}},
      {"rows"})[0];
  p.AddOutput(p.AddInstruction("mul", {p.AddInstruction("mul", {x, rows}, {}, {"xr"})[0], w}, {},
                               {"y"})[0]);
  const std::string text = PrintProgram(p);
  EXPECT_NE(text.find("  param %w: f32[4]\n  const %table: f32[8, 4]\n"), std::string::npos)
      << text;
  const Program q = ParseProgram(text);
  EXPECT_FALSE(q.IsConstant(q.Get("w")));
  EXPECT_TRUE(q.IsConstant(q.Get("table")));
  EXPECT_FALSE(q.IsConstant(q.Get("x")));
  EXPECT_EQ(PrintProgram(q), text);
  ProgramAnnotations a;
  const Program r = ParseProgram("program c { const %t: f32[3] = loaded  output %t }", "c", {}, &a);
  EXPECT_TRUE(r.IsConstant(r.Get("t")));
  EXPECT_EQ(a.initializers.at("t").kind, "loaded");
  EXPECT_EQ(PrintProgram(r, &a), "program c {\n  const %t: f32[3] = loaded\n  output %t\n}\n");
}

TEST(TextFormat, PrintsTheDocumentedLayout) {
  Builder b("affine");
  Var x = b.Input("x", DType::kF32, {8, 16});
  Var w = b.Param("fc.weight", DType::kF32, {16, 4});
  Var y = b.Name(MatMul(x, w, false, false), "y");
  Var z = Reshape(y, {32});
  b.Output(z);
  EXPECT_EQ(PrintProgram(b.Build()),
            "program affine {\n"
            "  input %x: f32[8, 16]\n"
            "  param %fc.weight: f32[16, 4]\n"
            "  %y: f32[8, 4] = matmul(%x, %fc.weight)\n"
            "  %reshape_0: f32[32] = reshape(%y) {shape = [32]}\n"
            "  output %reshape_0\n"
            "}\n");
}

TEST(TextFormat, FormatFloatIsShortestAndAlwaysAFloat) {
  EXPECT_EQ(FormatFloat(2.0), "2.0");
  EXPECT_EQ(FormatFloat(0.5), "0.5");
  EXPECT_EQ(FormatFloat(1e-5), "1e-05");
  EXPECT_EQ(FormatFloat(1e20), "1e+20");
  EXPECT_EQ(FormatFloat(-0.0), "-0.0");
  EXPECT_EQ(FormatFloat(0.1), "0.1");
  EXPECT_EQ(FormatFloat(std::numeric_limits<double>::infinity()), "inf");
  EXPECT_EQ(FormatFloat(-std::numeric_limits<double>::infinity()), "-inf");
  EXPECT_EQ(FormatFloat(std::numeric_limits<double>::quiet_NaN()), "nan");
}

// Attributes of every type, at the edges of their ranges, survive print -> parse bit for bit and
// keep their type. An instruction carries only the attributes its op declares, so each type rides
// on an op that takes it: floats on scale's factor, integers on full's value (an op reads an
// integer where it asks for a float, and the text keeps it an integer), booleans on matmul's
// transposes, lists on sum's axes and permute's order, strings on full's dtype. Escapes in strings
// are the names' (QuotesNamesOutsideTheBareCharset): one quoting routine writes both.
TEST(TextFormat, AttributesRoundTripExactlyAndKeepTheirType) {
  const double kFloats[] = {0.0,
                            -0.0,
                            2.0,
                            1.0 / 3.0,
                            0.1,
                            1e-5,
                            -2.5e300,
                            std::numeric_limits<double>::denorm_min(),
                            std::numeric_limits<double>::min(),
                            std::numeric_limits<double>::max(),
                            std::numeric_limits<double>::lowest(),
                            std::numeric_limits<double>::infinity(),
                            -std::numeric_limits<double>::infinity(),
                            std::numeric_limits<double>::quiet_NaN()};
  const int64_t kInts[] = {2, -1, std::numeric_limits<int64_t>::min(),
                           std::numeric_limits<int64_t>::max()};
  Program p("attrs");
  ValueId x = p.AddInput("x", {DType::kF32, Shape{2, 3}});
  for (double f : kFloats) p.AddInstruction("scale", {x}, {{"factor", f}});
  for (int64_t i : kInts) {
    p.AddInstruction(
        "full", {},
        {{"dtype", std::string("f64")}, {"shape", std::vector<int64_t>{}}, {"value", i}});
  }
  p.AddInstruction("matmul", {x, x}, {{"transpose_a", false}, {"transpose_b", true}});
  p.AddInstruction("sum", {x}, {{"axes", std::vector<int64_t>{}}, {"keepdims", true}});
  p.AddInstruction("permute", {x}, {{"order", std::vector<int64_t>{-1, 0}}});
  const std::string text = PrintProgram(p);
  const Program q = ParseProgram(text);
  EXPECT_EQ(PrintProgram(q), text);
  size_t n = 0;
  for (double want : kFloats) {
    const double* f = std::get_if<double>(&q.instructions()[n++].attrs.items()[0].second);
    ASSERT_NE(f, nullptr) << text;
    EXPECT_EQ(std::signbit(*f), std::signbit(want));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(*f));
    } else {
      EXPECT_EQ(*f, want);
    }
  }
  for (int64_t want : kInts) {
    const Attrs& a = q.instructions()[n++].attrs;
    const int64_t* i = std::get_if<int64_t>(&a.items()[2].second);  // dtype, shape, value
    ASSERT_NE(i, nullptr) << "an integer must stay an integer:\n" << text;
    EXPECT_EQ(*i, want);
    EXPECT_EQ(a.GetString("dtype"), "f64");
    EXPECT_TRUE(a.GetInts("shape").empty());
  }
  EXPECT_TRUE(q.instructions()[n].attrs == p.instructions()[n].attrs);
  EXPECT_TRUE(q.instructions()[n].attrs.GetBool("transpose_b", false));
  EXPECT_FALSE(q.instructions()[n].attrs.GetBool("transpose_a", true));
  ++n;
  EXPECT_TRUE(q.instructions()[n].attrs.GetInts("axes").empty());
  EXPECT_TRUE(q.instructions()[n].attrs.GetBool("keepdims", false));
  ++n;
  EXPECT_EQ(q.instructions()[n].attrs.GetInts("order"), (std::vector<int64_t>{-1, 0}));
}

TEST(TextFormat, QuotesNamesOutsideTheBareCharset) {
  Program p("my model/v2");
  ValueId x = p.AddInput("token ids", {DType::kF32, Shape{3}});
  ValueId y = p.AddInstruction("copy", {x}, {}, {"say \"hi\"\n"})[0];
  ValueId z = p.AddInstruction("copy", {y}, {}, {"0.9"})[0];
  const std::string odd("tab\tbackslash\\bell\x07 del\x7f utf8 \xc3\xa9 nul\0end", 40);
  p.AddOutput(z);
  p.AddOutput(p.AddInstruction("copy", {z}, {}, {odd})[0]);
  const std::string text = PrintProgram(p);
  EXPECT_NE(text.find("program \"my model/v2\" {"), std::string::npos) << text;
  EXPECT_NE(text.find("%\"token ids\""), std::string::npos) << text;
  EXPECT_NE(text.find("%\"say \\\"hi\\\"\\n\""), std::string::npos) << text;
  EXPECT_NE(text.find("%0.9: f32[3] = copy(%\"say"), std::string::npos) << text;
  const Program q = ParseProgram(text);
  EXPECT_EQ(q.name(), "my model/v2");
  EXPECT_TRUE(q.Find("say \"hi\"\n").has_value());
  EXPECT_TRUE(q.Find(odd).has_value()) << text;
  EXPECT_EQ(PrintProgram(q), text);
}

// An attribute name may be written quoted; it is the same attribute.
TEST(TextFormat, AcceptsQuotedAttributeNames) {
  const Program p = ParseProgram(
      "program p {\n  input %x: f32[2]\n  %y: f32[2] = scale(%x) {\"factor\" = 2.0}\n}\n");
  EXPECT_EQ(p.instructions()[0].attrs.GetFloat("factor"), 2.0);
}

TEST(TextFormat, AcceptsFreeLayoutAndComments) {
  const Program p = ParseProgram(
      "# leading comment\n"
      "program\tp{input %x:f32[2,3]# no space needed\r\n"
      "%y:f32[3,2]=transpose(%x){dim1=1,dim0=0}output %y}\n"
      "# trailing comment");
  EXPECT_EQ(PrintProgram(p),
            "program p {\n"
            "  input %x: f32[2, 3]\n"
            "  %y: f32[3, 2] = transpose(%x) {dim0 = 0, dim1 = 1}\n"
            "  output %y\n"
            "}\n");
}

TEST(TextFormat, ReadsScalarsZeroSizesAndQuotedReferences) {
  const Program p = ParseProgram(
      "program p {\n"
      "  input %s: f64[]\n"
      "  input %e: f32[0, 1099511627776]\n"
      "  %t: f64[] = copy(%\"s\")\n"
      "  output %e\n"
      "}\n");
  EXPECT_EQ(p.type(p.Get("t")), (TensorType{DType::kF64, Shape{}}));
  EXPECT_EQ(p.type(p.Get("e")).shape.numel(), 0);
}

TEST(TextFormat, ReadsInfAndNanLiterals) {
  const Program p = ParseProgram(
      "program p { input %x: f32[2]\n"
      "  %a: f32[2] = scale(%x) {factor = inf}\n"
      "  %b: f32[2] = scale(%x) {factor = -inf}\n"
      "  %c: f32[2] = scale(%x) {factor = nan}\n"
      "  %d: f32[2] = scale(%x) {factor = -nan}\n"
      "}");
  EXPECT_EQ(p.instructions()[0].attrs.GetFloat("factor"), std::numeric_limits<double>::infinity());
  EXPECT_EQ(p.instructions()[1].attrs.GetFloat("factor"), -std::numeric_limits<double>::infinity());
  EXPECT_TRUE(std::isnan(p.instructions()[2].attrs.GetFloat("factor")));
  EXPECT_TRUE(std::signbit(p.instructions()[3].attrs.GetFloat("factor")));
}

TEST(TextFormat, ExamplesParseAndPrintStably) {
  int count = 0;
  for (const auto& entry : fs::directory_iterator(SourceDir() / "examples")) {
    if (entry.path().extension() != ".sluice") continue;
    ++count;
    std::ifstream in(entry.path());
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // Training programs name their sizes (B, T) and say how to initialize and feed them: printed
    // with what they say, they read back the same.
    const SizeBindings sizes{{"B", 4}, {"T", 8}};
    ProgramAnnotations a, b;
    const Program p = ParseProgram(text, entry.path().string(), sizes, &a);
    const std::string printed = PrintProgram(p, &a);
    EXPECT_EQ(PrintProgram(ParseProgram(printed, "reprinted", {}, &b), &b), printed);
    ExpectRoundTrip(p);
  }
  EXPECT_GE(count, 3);
}

// The fuzzer's seed corpus doubles as a regression suite: valid_* files round-trip, the others
// fail with a ParseError.
TEST(TextFormat, FuzzSeedCorpusParsesOrFailsCleanly) {
  int count = 0;
  for (const auto& entry : fs::directory_iterator(SourceDir() / "fuzz" / "corpus" / "parser")) {
    ++count;
    std::ifstream in(entry.path(), std::ios::binary);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    // As the fuzzer reads them: sizes B and T bound, annotations printed back.
    const SizeBindings sizes{{"B", 3}, {"T", 5}};
    if (entry.path().filename().string().starts_with("valid_")) {
      ProgramAnnotations a, b;
      const std::string printed =
          PrintProgram(ParseProgram(text, entry.path().string(), sizes, &a), &a);
      EXPECT_EQ(PrintProgram(ParseProgram(printed, "reprinted", {}, &b), &b), printed)
          << entry.path();
    } else {
      EXPECT_THROW(ParseProgram(text, entry.path().string(), sizes), ParseError) << entry.path();
    }
  }
  EXPECT_GT(count, 0);
}

TEST(TextFormat, LoadProgramFileNamesTheUnreadablePath) {
  const std::string missing = (fs::temp_directory_path() / "sluice-no-such-file.sluice").string();
  try {
    LoadProgramFile(missing);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find(missing), std::string::npos) << e.what();
  }
  const std::string dir = fs::temp_directory_path().string();
  try {
    LoadProgramFile(dir);
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("is a directory"), std::string::npos) << e.what();
  }
}

TEST(TextFormat, LoadProgramFileLabelsParseErrorsWithThePath) {
  const fs::path path = testing_support::ScratchPath("sluice-text-format-test-bad.sluice");
  {
    std::ofstream out(path);
    out << "program p {\n  input %x: f33[2]\n}\n";
  }
  try {
    LoadProgramFile(path.string());
    FAIL() << "expected ParseError";
  } catch (const ParseError& e) {
    EXPECT_EQ(e.file(), path.string());
    EXPECT_EQ(e.line(), 2);
    EXPECT_EQ(e.col(), 13);
  }
  fs::remove(path);
}

}  // namespace
}  // namespace sluice
