// Autodiff on composed programs: f64 finite-difference checks of every gradient, gradient
// summation for values used more than once, pruning, naming, and the B/W split.
#include "sluice/autodiff/autodiff.h"

#include <algorithm>
#include <cmath>
#include <random>

#include <gtest/gtest.h>

#include "sluice/core/error.h"
#include "sluice/exec/reference_runner.h"
#include "sluice/ir/builder.h"
#include "sluice/ir/ops.h"
#include "sluice/ir/text_format.h"

namespace sluice {
namespace {

Tensor Random(const Shape& shape, std::mt19937_64& rng) {
  Tensor t = Tensor::Empty(shape, DType::kF64);
  std::uniform_real_distribution<double> u(-1, 1);
  for (int64_t i = 0; i < t.numel(); ++i) t.FlatSet(i, u(rng));
  return t;
}

// A two-layer perceptron without nonlinearity plus a skip path that uses x twice:
//   h = x·W1 + b1            x [B, C], W1 [C, H]
//   y = h·W2ᵀ + x·W3         W2 [C, H] (stored transposed), W3 [C, C]
Program TwoPathProgram() {
  Builder b("two_path");
  const int64_t B = 3, C = 4, H = 5;
  Var x = b.Input("x", DType::kF64, {B, C});
  Var w1 = b.Param("w1", DType::kF64, {C, H});
  Var b1 = b.Param("b1", DType::kF64, {H});
  Var w2 = b.Param("w2", DType::kF64, {C, H});
  Var w3 = b.Param("w3", DType::kF64, {C, C});
  Var h = b.Name(MatMul(x, w1) + b1, "h");
  Var y = b.Name(MatMul(h, w2, false, true) + MatMul(x, w3), "y");
  b.Output(y);
  return b.Build();
}

struct Fixture {
  Program forward = TwoPathProgram();
  Scope values;
  Tensor dy;
  Fixture() {
    std::mt19937_64 rng(5);
    for (ValueId v : forward.inputs())
      values.Set(forward.value(v).name, Random(forward.type(v).shape, rng));
    for (ValueId v : forward.params())
      values.Set(forward.value(v).name, Random(forward.type(v).shape, rng));
    dy = Random(forward.type(forward.Get("y")).shape, rng);
  }
  Scope Clone() const {
    Scope s;
    for (const std::string& n : values.Names()) s.Set(n, values.Get(n).Clone());
    return s;
  }
  // L = Σ y ⊙ dy
  double Loss(Scope scope) const {
    RunReference(forward, scope);
    const Tensor& y = scope.Get("y");
    double l = 0;
    for (int64_t i = 0; i < y.numel(); ++i) l += y.FlatAt(i) * dy.FlatAt(i);
    return l;
  }
};

const std::vector<std::string> kWrt = {"x", "w1", "b1", "w2", "w3"};

TEST(Autodiff, GradientsMatchFiniteDifferences) {
  Fixture f;
  Backward bwd = BuildBackward(f.forward, {.seeds = {"y"}, .wrt = kWrt});
  Scope scope = f.Clone();
  RunReference(f.forward, scope, DefaultAllocator(), false, bwd.saved);
  scope.Set("y.grad", f.dy);
  RunReference(bwd.program, scope);
  const double h = 1e-6;
  for (size_t w = 0; w < kWrt.size(); ++w) {
    const Tensor& analytic = scope.Get(bwd.grads[w]);
    for (int64_t i = 0; i < analytic.numel(); ++i) {
      Scope plus = f.Clone(), minus = f.Clone();
      double x0 = f.values.Get(kWrt[w]).FlatAt(i);
      plus.Get(kWrt[w]).FlatSet(i, x0 + h);
      minus.Get(kWrt[w]).FlatSet(i, x0 - h);
      double numeric = (f.Loss(std::move(plus)) - f.Loss(std::move(minus))) / (2 * h);
      double a = analytic.FlatAt(i);
      EXPECT_LE(std::abs(a - numeric) / std::max({std::abs(a), std::abs(numeric), 1e-2}), 1e-6)
          << kWrt[w] << "[" << i << "]";
    }
  }
}

// A constant is read, never differentiated: asking for its gradient is an error naming it, and a
// backward program that reads it declares it a constant too.
TEST(Autodiff, ConstantsAreNotDifferentiated) {
  Program p("rope");
  const ValueId x = p.AddParam("x", {DType::kF32, Shape{2, 4}});
  const ValueId c = p.AddConst("table", {DType::kF32, Shape{2, 4}});
  const ValueId y = p.AddInstruction("mul", {x, c}, {}, {"y"})[0];
  p.AddOutput(p.AddInstruction("sum", {y}, {{"axes", std::vector<int64_t>{}}, {"keepdims", false}},
                               {"loss"})[0]);
  try {
    BuildBackward(p, {.loss = "loss", .wrt = {"x", "table"}});
    ADD_FAILURE() << "differentiated with respect to a constant";
  } catch (const ProgramError& e) {
    EXPECT_NE(std::string(e.what()).find("%table: it is a constant"), std::string::npos)
        << e.what();
  }
  const Backward bwd = BuildBackward(p, {.loss = "loss", .wrt = {"x"}});
  EXPECT_EQ(bwd.grads, std::vector<std::string>{"x.grad"});
  ASSERT_TRUE(bwd.program.Find("table"));
  EXPECT_TRUE(bwd.program.IsConstant(*bwd.program.Find("table")));
}

TEST(Autodiff, NamesGradientsAndStatesWhatItReads) {
  Fixture f;
  Backward bwd = BuildBackward(f.forward, {.seeds = {"y"}, .wrt = kWrt});
  EXPECT_EQ(bwd.grads,
            (std::vector<std::string>{"x.grad", "w1.grad", "b1.grad", "w2.grad", "w3.grad"}));
  for (const std::string& g : bwd.grads) EXPECT_TRUE(bwd.program.Find(g).has_value()) << g;
  // The backward reads x (for dW1, dW3) and h (for dW2) — and no other forward value.
  std::vector<std::string> saved = bwd.saved;
  std::sort(saved.begin(), saved.end());
  EXPECT_EQ(saved, (std::vector<std::string>{"h", "x"}));
  std::vector<std::string> params = bwd.params_read;
  std::sort(params.begin(), params.end());
  EXPECT_EQ(params, (std::vector<std::string>{"w1", "w2", "w3"}));
  // h's gradient is computed by its own instruction and named after it.
  EXPECT_TRUE(bwd.program.Find("h.grad").has_value());
}

TEST(Autodiff, PrunesWorkNoGradientNeeds) {
  Fixture f;
  // Only dW3 wanted: nothing about W1, W2, b1 or h may be computed or read.
  Backward bwd = BuildBackward(f.forward, {.seeds = {"y"}, .wrt = {"w3"}});
  EXPECT_EQ(bwd.saved, (std::vector<std::string>{"x"}));
  EXPECT_TRUE(bwd.params_read.empty());
  EXPECT_EQ(bwd.program.instructions().size(), 1u);
  EXPECT_FALSE(bwd.program.Find("h.grad").has_value());
}

TEST(Autodiff, SplitBackwardEqualsUnsplitBitwise) {
  Fixture f;
  Backward bwd = BuildBackward(f.forward, {.seeds = {"y"}, .wrt = kWrt});
  SplitBackward split = SplitBW(bwd, {"x"});
  // B produces only x.grad (plus what it hands to W); W reads no gradient of x and only forward
  // values, seeds and B's hand-offs.
  EXPECT_TRUE(split.b.Find("x.grad").has_value());
  EXPECT_FALSE(split.w.Find("x.grad").has_value());
  for (ValueId v : split.w.inputs()) {
    const std::string& n = split.w.value(v).name;
    bool from_b = std::find(split.b_to_w.begin(), split.b_to_w.end(), n) != split.b_to_w.end();
    bool saved = std::find(split.w_saved.begin(), split.w_saved.end(), n) != split.w_saved.end();
    EXPECT_TRUE(from_b != saved) << n;
  }
  EXPECT_EQ(split.b.instructions().size() + split.w.instructions().size(),
            bwd.program.instructions().size());

  Scope whole = f.Clone();
  RunReference(f.forward, whole, DefaultAllocator(), false, bwd.saved);
  whole.Set("y.grad", f.dy);
  Scope parts = f.Clone();
  RunReference(f.forward, parts, DefaultAllocator(), false, bwd.saved);
  parts.Set("y.grad", f.dy);
  RunReference(bwd.program, whole);
  RunReference(split.b, parts);
  RunReference(split.w, parts);
  for (const std::string& g : bwd.grads) {
    EXPECT_TRUE(BitwiseEqual(whole.Get(g), parts.Get(g))) << g;
  }
}

// y = rms_norm(x, g)·W: the weight gradient of the norm is an op of its own (rms_norm_grad_weight),
// so the zero-bubble split leaves it to W, and B computes x's gradient without it. rms_norm is
// recomputable: its output, which dW needs, is rebuilt from x rather than saved.
TEST(Autodiff, SplitBackwardDefersTheRmsNormWeightGradientToW) {
  Builder b("rms");
  Var x = b.Input("x", DType::kF64, {3, 5});
  Var g = b.Param("norm.weight", DType::kF64, {5});
  Var w = b.Param("w", DType::kF64, {5, 2});
  b.Output(b.Name(MatMul(b.Name(RmsNorm(x, g, 1e-6), "n"), w), "y"));
  Program p = b.Build();
  Backward bwd = BuildBackward(p, {.seeds = {"y"}, .wrt = {"x", "norm.weight", "w"}});
  EXPECT_EQ(bwd.saved, (std::vector<std::string>{"x"}));
  SplitBackward split = SplitBW(bwd, {"x"});
  auto ops = [](const Program& q) {
    std::vector<std::string> names;
    for (const Instruction& ins : q.instructions()) names.push_back(ins.op->name);
    return names;
  };
  auto has = [](const std::vector<std::string>& names, const std::string& op) {
    return std::find(names.begin(), names.end(), op) != names.end();
  };
  EXPECT_TRUE(has(ops(split.b), "rms_norm_grad_x"));
  EXPECT_FALSE(has(ops(split.b), "rms_norm_grad_weight"));
  EXPECT_TRUE(has(ops(split.w), "rms_norm_grad_weight"));
  EXPECT_FALSE(has(ops(split.w), "rms_norm_grad_x"));

  std::mt19937_64 rng(3);
  Scope base;
  for (ValueId v : p.inputs()) base.Set(p.value(v).name, Random(p.type(v).shape, rng));
  for (ValueId v : p.params()) base.Set(p.value(v).name, Random(p.type(v).shape, rng));
  Tensor dy = Random({3, 2}, rng);
  Scope whole, parts;
  for (Scope* s : {&whole, &parts}) {
    for (const std::string& name : base.Names()) s->Set(name, base.Get(name).Clone());
    RunReference(p, *s, DefaultAllocator(), false, bwd.saved);
    s->Set("y.grad", dy);
  }
  RunReference(bwd.program, whole);
  RunReference(split.b, parts);
  RunReference(split.w, parts);
  for (const std::string& grad : bwd.grads) {
    EXPECT_TRUE(BitwiseEqual(whole.Get(grad), parts.Get(grad))) << grad;
  }
}

TEST(Autodiff, ScalarLossIsSeededWithOne) {
  Builder b("scalar");
  Var x = b.Input("x", DType::kF64, {1, 3});
  Var w = b.Param("w", DType::kF64, {3, 1});
  Var loss = b.Name(Reshape(MatMul(x, w), {}), "loss");
  b.Output(loss);
  Program p = b.Build();
  Backward bwd = BuildBackward(p, {.loss = "loss", .wrt = {"w"}});
  Scope s;
  s.Set("x", Tensor::FromVector<double>({1, 3}, {1, 2, 3}));
  s.Set("w", Tensor::FromVector<double>({3, 1}, {0, 0, 0}));
  RunReference(p, s);
  RunReference(bwd.program, s);
  // dL/dw = xᵀ
  EXPECT_EQ(s.Get("w.grad").FlatAt(2), 3.0);
}

TEST(Autodiff, ErrorsNameTheValue) {
  Fixture f;
  EXPECT_THROW(BuildBackward(f.forward, {.seeds = {"y"}, .wrt = {"nope"}}), ProgramError);
  try {
    BuildBackward(f.forward, {.loss = "y", .wrt = {"w1"}});
    FAIL();
  } catch (const ProgramError& e) {
    EXPECT_NE(std::string(e.what()).find("%y"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("scalar"), std::string::npos) << e.what();
  }
}

// GradientSpec::bf16_gradients (mixed precision's unit boundaries): a bf16 value's gradient is the
// f32 sum of its parts rounded to bf16 once — not each part rounded — and what its producer's
// gradient reads is that, widened; as a seed it comes in bf16, as a wrt it goes out bf16.
TEST(Autodiff, Bf16GradientIsItsPartsSumRoundedOnce) {
  constexpr int64_t n = 64;
  Builder b("boundary");
  Var x = b.Input("x", DType::kF32, {n});
  Var w1 = b.Param("w1", DType::kF32, {n});
  Var w2 = b.Param("w2", DType::kF32, {n});
  Var v = b.Name(Cast(x, DType::kBF16), "v");  // read twice: two gradient parts
  Var loss = b.Name(Sum(Cast(v, DType::kF32) * w1) + Sum(Cast(v, DType::kF32) * w2), "loss");
  b.Output(loss);
  const Program p = b.Build();
  const Backward bwd = BuildBackward(p, {.loss = "loss", .wrt = {"x"}, .bf16_gradients = {"v"}});
  EXPECT_EQ(bwd.program.type(bwd.program.Get("v.grad")).dtype, DType::kBF16);
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> xs(n), a(n), c(n);
  for (int64_t i = 0; i < n; ++i) xs[i] = u(rng), a[i] = u(rng), c[i] = u(rng);
  Scope s;
  s.Set("x", Tensor::FromVector<float>({n}, xs));
  s.Set("w1", Tensor::FromVector<float>({n}, a));
  s.Set("w2", Tensor::FromVector<float>({n}, c));
  RunReference(p, s, DefaultAllocator(), false, bwd.saved);
  RunReference(bwd.program, s);
  const Tensor& g = s.Get("x.grad");
  int rounded_apart = 0;  // elements where rounding each part first would differ
  for (int64_t i = 0; i < n; ++i) {
    const float once = BF16ToFloat(FloatToBF16(a[i] + c[i]));
    EXPECT_EQ(g.data<float>()[i], once) << i;
    const float each = BF16ToFloat(FloatToBF16(a[i])) + BF16ToFloat(FloatToBF16(c[i]));
    rounded_apart += BF16ToFloat(FloatToBF16(each)) != once || each != once;
  }
  EXPECT_GT(rounded_apart, 0) << "no element tells the two roundings apart";

  // v as a pipeline stage's output (seeded) and input (differentiated): both gradients bf16.
  Builder s2("stage");
  Var in = s2.Input("in", DType::kBF16, {n});
  Var out = s2.Name(Cast(Cast(in, DType::kF32) * 2.0, DType::kBF16), "out");
  s2.Output(out);
  const Program q = s2.Build();
  const Backward qb =
      BuildBackward(q, {.seeds = {"out"}, .wrt = {"in"}, .bf16_gradients = {"in", "out"}});
  EXPECT_EQ(qb.program.type(qb.program.Get("out.grad")).dtype, DType::kBF16);
  EXPECT_EQ(qb.program.type(qb.program.Get("in.grad")).dtype, DType::kBF16);
  const Backward f32 = BuildBackward(q, {.seeds = {"out"}, .wrt = {"in"}});
  EXPECT_EQ(f32.program.type(f32.program.Get("in.grad")).dtype, DType::kF32);

  EXPECT_THROW(BuildBackward(p, {.loss = "loss", .wrt = {"x"}, .bf16_gradients = {"nope"}}),
               ProgramError);
  try {
    BuildBackward(p, {.loss = "loss", .wrt = {"x"}, .bf16_gradients = {"x"}});
    ADD_FAILURE() << "an f32 value's bf16 gradient was accepted";
  } catch (const ProgramError& e) {
    EXPECT_NE(std::string(e.what()).find("%x, which is f32[64]"), std::string::npos) << e.what();
  }
}

// A boundary's f32 gradient is made again right before each reader that needs it (between them
// only its bf16 source is alive), and a bf16 product reads the bf16 gradient itself rather than a
// second rounding of its widened copy.
TEST(Autodiff, Bf16GradientIsWidenedAtEachReaderAndProductsReadItAsIs) {
  Builder b("block");
  Var x = b.Input("x", DType::kBF16, {4, 8});
  Var w = b.Param("w", DType::kF32, {8, 8});
  Var bias = b.Param("bias", DType::kF32, {8});
  Var r = Cast(x, DType::kF32) + Linear(x, Cast(w, DType::kBF16), bias);  // residual + product
  b.Output(b.Name(Cast(r, DType::kBF16), "y"));
  const Program p = b.Build();
  const Backward bwd =
      BuildBackward(p, {.seeds = {"y"}, .wrt = {"x", "w", "bias"}, .bf16_gradients = {"x", "y"}});
  const Program& q = bwd.program;
  int widenings = 0, roundings = 0, products_reading_the_seed = 0;
  for (const Instruction& ins : q.instructions()) {
    const std::string& in = q.value(ins.inputs.at(0)).name;
    if (ins.op->name == "matmul") {
      for (ValueId v : ins.inputs) products_reading_the_seed += q.value(v).name == "y.grad";
    }
    if (ins.op->name != "cast" || q.value(ins.inputs[0]).kind == ValueKind::kParam) continue;
    const DType to = q.type(ins.outputs[0]).dtype;
    widenings += to == DType::kF32 && in == "y.grad";
    roundings += to == DType::kBF16;
  }
  // y.grad widened for the bias's sum, then again for x's gradient (the residual's part).
  EXPECT_EQ(widenings, 2) << PrintProgram(q);
  EXPECT_EQ(roundings, 1) << "only x's gradient is rounded: " << PrintProgram(q);
  EXPECT_GE(products_reading_the_seed, 1) << PrintProgram(q);  // dx (dw through a reshape)
}

TEST(Autodiff, UnusedParameterGetsZeroGradient) {
  Builder b("unused");
  Var x = b.Input("x", DType::kF64, {2, 2});
  b.Param("w", DType::kF64, {2});
  b.Output(b.Name(Copy(x), "y"));
  Program p = b.Build();
  Backward bwd = BuildBackward(p, {.seeds = {"y"}, .wrt = {"w"}});
  Scope s;
  s.Set("w", Tensor::Full({2}, 5.0, DType::kF64));
  s.Set("y.grad", Tensor::Full({2, 2}, 1.0, DType::kF64));
  RunReference(bwd.program, s);
  EXPECT_EQ(s.Get("w.grad").FlatAt(0), 0.0);
}

// The parameters a loss does not depend on: one no instruction reads, one read by a branch whose
// result nothing reads; not a constant, nor a parameter read on the loss's path.
TEST(Autodiff, ParamsOffLossPathAreThoseTheLossDoesNotDependOn) {
  Program p("heads");
  const ValueId x = p.AddParam("x", {DType::kF32, Shape{2, 4}});
  p.AddParam("head", {DType::kF32, Shape{2, 4}});
  const ValueId side = p.AddParam("side", {DType::kF32, Shape{2, 4}});
  const ValueId c = p.AddConst("table", {DType::kF32, Shape{2, 4}});
  p.AddConst("unread_table", {DType::kF32, Shape{2, 4}});
  const ValueId y = p.AddInstruction("mul", {x, c}, {}, {"y"})[0];
  const ValueId branch = p.AddInstruction("mul", {y, side}, {}, {"branch"})[0];
  p.AddOutput(p.AddInstruction("sum", {y}, {{"axes", std::vector<int64_t>{}}, {"keepdims", false}},
                               {"loss"})[0]);
  p.AddOutput(branch);
  EXPECT_EQ(ParamsOffLossPath(p, "loss"), (std::vector<std::string>{"head", "side"}));
  EXPECT_EQ(ParamsOffLossPath(p, "branch"), (std::vector<std::string>{"head"}));
  EXPECT_THROW(ParamsOffLossPath(p, "nothing"), ProgramError);
}

int64_t CountOp(const Program& p, std::string_view op) {
  return std::count_if(p.instructions().begin(), p.instructions().end(),
                       [&](const Instruction& ins) { return ins.op->name == op; });
}

// Runs each forward program and then its backward program on the same random inputs, parameters
// and gradient of the output `y` (of `dtype`), and expects bitwise the same gradients from all.
void ExpectBitwiseSameGradients(const std::vector<std::pair<Program, Backward>>& runs,
                                DType dtype) {
  const Program& first = runs[0].first;
  std::mt19937_64 rng(2);
  auto random = [&](const Shape& shape, DType type) {
    Tensor t = Tensor::Empty(shape, type);
    const Tensor r = Random(shape, rng);
    for (int64_t i = 0; i < t.numel(); ++i) t.FlatSet(i, r.FlatAt(i));
    return t;
  };
  Scope base;
  // Inputs in their own dtype (a dropout's i64 keys: the random values truncated).
  for (ValueId v : first.inputs()) {
    base.Set(first.value(v).name, random(first.type(v).shape, first.type(v).dtype));
  }
  for (ValueId v : first.params()) {
    base.Set(first.value(v).name, random(first.type(v).shape, dtype));
  }
  base.Set("y.grad", random(first.type(first.Get("y")).shape, dtype));
  std::vector<Scope> results(runs.size());
  for (size_t i = 0; i < runs.size(); ++i) {
    for (const std::string& name : base.Names()) results[i].Set(name, base.Get(name).Clone());
    RunReference(runs[i].first, results[i], DefaultAllocator(), false, runs[i].second.saved);
    RunReference(runs[i].second.program, results[i]);
  }
  for (size_t i = 1; i < runs.size(); ++i) {
    for (const std::string& grad : runs[0].second.grads) {
      EXPECT_TRUE(BitwiseEqual(results[0].Get(grad), results[i].Get(grad))) << grad;
    }
  }
}

// Builds `p`'s backward without and with recomputation (seed y, gradients of `wrt`), checks
// what each saves (sorted names) and that their gradients are bitwise the same.
void ExpectRecomputationSaves(const Program& p, const std::vector<std::string>& wrt,
                              std::vector<std::string> saving_saves,
                              std::vector<std::string> recomputing_saves) {
  Backward saving = BuildBackward(p, {.seeds = {"y"}, .wrt = wrt, .recompute = false});
  Backward recomputing = BuildBackward(p, {.seeds = {"y"}, .wrt = wrt});
  auto sorted = [](std::vector<std::string> v) {
    std::sort(v.begin(), v.end());
    return v;
  };
  EXPECT_EQ(sorted(saving.saved), sorted(std::move(saving_saves)));
  EXPECT_EQ(sorted(recomputing.saved), sorted(std::move(recomputing_saves)));
  std::vector<std::pair<Program, Backward>> runs;
  runs.emplace_back(p, std::move(saving));
  runs.emplace_back(p, std::move(recomputing));
  ExpectBitwiseSameGradients(runs, DType::kF64);
}

// A GELU whose output gradient is one matmul gets its input gradient from one matmul_gelu_grad —
// also when the GELU reads the product viewed in another shape (an imported linear's [B·T, n] as
// [B, T, n]); the gradients are bitwise those of the unfused pair, which a second use of the
// GELU's output (adding a zero gradient, so the matmul's result is no longer gelu_grad's own)
// keeps apart.
TEST(Autodiff, FusesTheMatMulIntoTheGeluGradient) {
  auto build = [](bool second_use, bool view) {
    Builder b(second_use ? "unfused" : "fused");
    Var x = b.Input("x", DType::kF64, {4, 6});
    Var w1 = b.Param("w1", DType::kF64, {6, 8});
    Var w2 = b.Param("w2", DType::kF64, {3, 8});
    Var pre = b.Name(MatMul(x, w1), "pre");
    Var h = b.Name(Gelu(view ? Reshape(pre, {2, 2, 8}) : pre), "h");
    if (view) h = Reshape(h, {4, 8});
    Var y = MatMul(h, w2, false, true);
    if (second_use) y = y + MatMul(h, Zeros(b, {8, 3}, DType::kF64));
    b.Output(b.Name(y, "y"));
    return b.Build();
  };
  const std::vector<std::string> wrt = {"x", "w1", "w2"};
  for (bool view : {false, true}) {
    SCOPED_TRACE(view ? "through a view" : "the product itself");
    std::vector<std::pair<Program, Backward>> runs;
    for (bool second_use : {false, true}) {
      Program p = build(second_use, view);
      Backward bwd = BuildBackward(p, {.seeds = {"y"}, .wrt = wrt});
      runs.emplace_back(std::move(p), std::move(bwd));
    }
    const Program &fused = runs[0].second.program, &unfused = runs[1].second.program;
    EXPECT_EQ(CountOp(fused, "matmul_gelu_grad"), 1);
    EXPECT_EQ(CountOp(fused, "gelu_grad"), 0);
    EXPECT_EQ(CountOp(unfused, "matmul_gelu_grad"), 0);
    EXPECT_EQ(CountOp(unfused, "gelu_grad"), 1);
    ExpectBitwiseSameGradients(runs, DType::kF64);
  }
}

// Llama's MLP under mixed precision, swiglu(x·W1, x·W3)·W2 with bf16 operands: SwiGLU's gradients
// da and db are read only by the products' VJPs, which round them to bf16, so swiglu_grad makes
// them bf16 itself (no f32 da, db) — bitwise the same gradients as rounding them afterwards,
// which a second reader of a's gradient (a product by zeros) forces.
TEST(Autodiff, MakesASwigluGradientThatOnlyProductsReadBf16) {
  auto build = [](bool second_use) {
    Builder b(second_use ? "f32_gradients" : "bf16_gradients");
    Var x = Cast(b.Input("x", DType::kF32, {4, 6}), DType::kBF16);
    Var w1 = Cast(b.Param("w1", DType::kF32, {6, 8}), DType::kBF16);
    Var w3 = Cast(b.Param("w3", DType::kF32, {6, 8}), DType::kBF16);
    Var w2 = Cast(b.Param("w2", DType::kF32, {8, 3}), DType::kBF16);
    Var a = Cast(MatMul(x, w1), DType::kBF16), g = Cast(MatMul(x, w3), DType::kBF16);
    Var y = MatMul(Swiglu(a, g), w2);
    if (second_use) y = y + MatMul(a, Cast(Zeros(b, {8, 3}, DType::kF32), DType::kBF16));
    b.Output(b.Name(y, "y"));
    return b.Build();
  };
  auto swiglu_grad_dtype = [](const Program& p) {
    for (const Instruction& ins : p.instructions()) {
      if (ins.op->name == "swiglu_grad") return p.type(ins.outputs[0]).dtype;
    }
    ADD_FAILURE() << "no swiglu_grad in " << p.name();
    return DType::kF32;
  };
  std::vector<std::pair<Program, Backward>> runs;
  for (bool second_use : {false, true}) {
    Program p = build(second_use);
    Backward bwd = BuildBackward(p, {.seeds = {"y"}, .wrt = {"x", "w1", "w3", "w2"}});
    runs.emplace_back(std::move(p), std::move(bwd));
  }
  EXPECT_EQ(swiglu_grad_dtype(runs[0].second.program), DType::kBF16);
  EXPECT_EQ(swiglu_grad_dtype(runs[1].second.program), DType::kF32);
  ExpectBitwiseSameGradients(runs, DType::kF32);
}

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

// h = gelu(layer_norm(x)·W): both the normalized x and gelu's output feed matmuls whose
// gradients need them; recomputation rebuilds them in backward from x and the pre-GELU value,
// which the backward program reads anyway.
TEST(Autodiff, RecomputesCheapValuesInsteadOfSavingThem) {
  Builder b("recompute");
  Var x = b.Input("x", DType::kF64, {4, 6});
  Var g = b.Param("ln.weight", DType::kF64, {6});
  Var beta = b.Param("ln.bias", DType::kF64, {6});
  Var w1 = b.Param("w1", DType::kF64, {6, 8});
  Var w2 = b.Param("w2", DType::kF64, {8, 3});
  Var n = b.Name(LayerNorm(x, g, beta), "n");
  Var pre = b.Name(MatMul(n, w1), "pre");
  Var h = b.Name(Gelu(pre), "h");
  b.Output(b.Name(MatMul(h, w2), "y"));
  Program p = b.Build();
  const std::vector<std::string> wrt = {"x", "ln.weight", "ln.bias", "w1", "w2"};

  ExpectRecomputationSaves(p, wrt, {"h", "n", "pre", "x"}, {"pre", "x"});
}

// A transformer's feed-forward with dropout, linear → GELU → dropout → linear: GELU's gradient
// reads the pre-activation, dropout's only the key, so the backward remakes the second product's
// input through the chain GELU → dropout (the mask drawn again) from the pre-activation instead of
// keeping it — the feed-forward keeps what it keeps without dropout, and the gradients are
// bitwise those of keeping it.
TEST(Autodiff, RecomputesAGeluDropoutChainFromThePreActivation) {
  Builder b("feed_forward");
  Var x = b.Input("x", DType::kF64, {4, 6});
  Var key = b.Input("key", DType::kI64, {4});
  Var w1 = b.Param("w1", DType::kF64, {6, 8});
  Var w2 = b.Param("w2", DType::kF64, {8, 3});
  Var pre = b.Name(MatMul(x, w1), "pre");
  Var d = b.Name(Dropout(Gelu(pre), key, 0.5, /*stream=*/1), "d");
  b.Output(b.Name(MatMul(d, w2), "y"));
  const Program p = b.Build();
  ExpectRecomputationSaves(p, {"x", "w1", "w2"}, {"d", "key", "pre", "x"}, {"key", "pre", "x"});
}

// A ResNet's convolution, batch norm and ReLU: batch norm's gradient reads its input h, so the
// backward recomputes the ReLU's output through the normalisation from h (a chain of two
// recomputable ops) instead of keeping it — half the saved bytes of the pair, the gradients
// bitwise the same (a training batch_norm leaves the running statistics it is given unread).
TEST(Autodiff, RecomputesAReluOverABatchNormFromTheNormsInput) {
  const Program p = ParseProgram(R"(
program conv_bn_relu {
  input %x: f64[2, 2, 4, 4]
  param %w1: f64[3, 2, 3, 3]
  param %g: f64[3]
  param %b: f64[3]
  buffer %mean: f64[3]
  buffer %var: f64[3]
  param %w2: f64[2, 3, 3, 3]
  %h: f64[2, 3, 4, 4] = conv2d(%x, %w1) {padding = [1, 1], stride = [1, 1]}
  %n: f64[2, 3, 4, 4] = batch_norm(%h, %g, %b, %mean, %var) {eps = 1e-05, training = true}
  batch_norm_update_stats(%h, %mean, %var) {momentum = 0.1}
  %r: f64[2, 3, 4, 4] = relu(%n)
  %y: f64[2, 2, 4, 4] = conv2d(%r, %w2) {padding = [1, 1], stride = [1, 1]}
  output %y
}
)",
                                 "conv_bn_relu.sluice");
  const std::vector<std::string> wrt = {"x", "w1", "g", "b", "w2"};
  ExpectRecomputationSaves(p, wrt, {"h", "r", "x"}, {"h", "x"});
}

// An imported attention's output is transposed back into a copy (y.transpose(1, 2)) that the
// output projection reads through a reshape: that copy is remade in backward from the kept value
// it was taken of (through its view), not saved beside it. Here h = tanh(x·w1) is kept (tanh's
// gradient reads its output) and t = transpose(reshape(h)) feeds a product.
TEST(Autodiff, RecomputesATransposedCopyOfAKeptValueThroughItsView) {
  Builder b("transposed_copy");
  Var x = b.Input("x", DType::kF64, {4, 6});
  Var w1 = b.Param("w1", DType::kF64, {6, 8});
  Var w2 = b.Param("w2", DType::kF64, {4, 3});
  Var h = b.Name(Tanh(MatMul(x, w1)), "h");
  Var t = b.Name(Transpose(Reshape(h, {4, 2, 4}), 0, 1), "t");  // [2, 4, 4], a copy
  b.Output(b.Name(MatMul(Reshape(t, {8, 4}), w2), "y"));
  const Program p = b.Build();
  const std::vector<std::string> wrt = {"x", "w1", "w2"};
  // Without recomputation the copy is saved as the product reads it, a reshape of t.
  ExpectRecomputationSaves(p, wrt, {"h", "reshape_1", "x"}, {"h", "x"});
}

// recompute_cuts: with only the input kept, the backward rebuilds the second part's input (the
// cut value) from a transient copy of the first part, whose own values it recomputes again for
// the first part's backward; the gradients are bitwise those of keeping everything.
TEST(Autodiff, RecomputesOnePartAtATimeAcrossACut) {
  Builder b("parts");
  Var x = b.Input("x", DType::kF64, {4, 6});
  Var w1 = b.Param("w1", DType::kF64, {6, 8});
  Var w2 = b.Param("w2", DType::kF64, {8, 6});
  Var w3 = b.Param("w3", DType::kF64, {6, 8});
  Var w4 = b.Param("w4", DType::kF64, {8, 3});
  Var h1 = b.Name(Gelu(MatMul(x, w1)), "h1");
  Var mid = b.Name(x + MatMul(h1, w2), "mid");  // the one value crossing from part 0 to part 1
  Var h2 = b.Name(Gelu(MatMul(mid, w3)), "h2");
  b.Output(b.Name(MatMul(h2, w4), "y"));
  Program p = b.Build();
  const std::vector<std::string> wrt = {"x", "w1", "w2", "w3", "w4"};

  const Backward saving = BuildBackward(p, {.seeds = {"y"}, .wrt = wrt, .recompute = false});
  const Backward whole =
      BuildBackward(p, {.seeds = {"y"}, .wrt = wrt, .checkpoints = std::vector<std::string>{}});
  const Backward parts = BuildBackward(p, {.seeds = {"y"},
                                           .wrt = wrt,
                                           .checkpoints = std::vector<std::string>{},
                                           .recompute_cuts = {"mid"}});
  EXPECT_EQ(whole.saved, std::vector<std::string>{"x"});
  EXPECT_EQ(parts.saved, std::vector<std::string>{"x"});
  auto gelus = [](const Backward& bwd) {
    const auto& ins = bwd.program.instructions();
    return std::count_if(ins.begin(), ins.end(),
                         [](const Instruction& i) { return i.op->name == "gelu"; });
  };
  EXPECT_EQ(gelus(whole), 2);  // h1 and h2, once each
  EXPECT_EQ(gelus(parts), 3);  // h1 twice: a transient copy for mid, then for its own backward
  // The transient copy is not h1: h1 is made again right before the first part's backward.
  const Program& q = parts.program;
  const ValueId h1_again = q.Get("h1");
  const ValueId mid_again = q.Get("mid");
  EXPECT_GT(q.value(h1_again).producer, q.value(mid_again).producer);

  std::mt19937_64 rng(3);
  Scope base;
  for (ValueId v : p.inputs()) base.Set(p.value(v).name, Random(p.type(v).shape, rng));
  for (ValueId v : p.params()) base.Set(p.value(v).name, Random(p.type(v).shape, rng));
  Tensor dy = Random({4, 3}, rng);
  std::vector<Scope> results(3);
  const Backward* bwds[] = {&saving, &whole, &parts};
  for (int i = 0; i < 3; ++i) {
    for (const std::string& name : base.Names()) results[i].Set(name, base.Get(name));
    RunReference(p, results[i], DefaultAllocator(), false, bwds[i]->saved);
    results[i].Set("y.grad", dy);
    RunReference(bwds[i]->program, results[i]);
  }
  for (const std::string& grad : saving.grads) {
    EXPECT_TRUE(BitwiseEqual(results[0].Get(grad), results[2].Get(grad))) << grad;
    EXPECT_TRUE(BitwiseEqual(results[1].Get(grad), results[2].Get(grad))) << grad;
  }
}

}  // namespace
}  // namespace sluice
