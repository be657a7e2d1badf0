#include "op_harness.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include <fmt/format.h>

#include "sluice/autodiff/autodiff.h"
#include "sluice/exec/reference_runner.h"
#include "sluice/ir/gradient_type.h"
#include "sluice/ir/program.h"

namespace sluice::testing {

namespace {

// The case's program with floating inputs in `float_type`. Inputs are named x0, x1, ...
Program MakeProgram(const OpCase& c, DType float_type) {
  Program p(c.label);
  std::vector<ValueId> ins;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    TensorType t = c.inputs[i];
    if (IsFloating(t.dtype)) t.dtype = float_type;
    ins.push_back(p.AddInput(fmt::format("x{}", i), t));
  }
  ValueList outs = p.AddInstruction(c.op, ins, c.attrs);
  for (size_t i = 0; i < outs.size(); ++i) {
    p.Rename(outs[i], fmt::format("y{}", i));
    p.AddOutput(outs[i]);
  }
  return p;
}

// Whether a product rounds its f32 second operand to bf16 as it loads it (round_b, round_w).
bool RoundsOnLoad(const Attrs& attrs) {
  return attrs.GetBool("round_b", false) || attrs.GetBool("round_w", false);
}

// attrs without round_b and round_w.
Attrs WithoutRounding(const Attrs& attrs) {
  Attrs out;
  for (const auto& [name, value] : attrs.items()) {
    if (name != "round_b" && name != "round_w") out.Set(name, value);
  }
  return out;
}

// The mixed-precision case's program: inputs c.bf16_inputs in bf16, other floating ones in f32.
// With `twin`, its f32 twin: every floating input f32, an attribute dtype = "bf16" read "f32" and
// rounding on load left out (the twin's input 1 holds the rounded values instead: RunMixedCase).
// With `cast`, the operand a product rounds on load is cast to bf16 by a cast instead.
Program MakeMixedProgram(const OpCase& c, bool twin, bool cast = false) {
  Program p(c.label);
  std::vector<ValueId> ins;
  for (size_t i = 0; i < c.inputs.size(); ++i) {
    TensorType t = c.inputs[i];
    const bool bf16 = std::find(c.bf16_inputs.begin(), c.bf16_inputs.end(), static_cast<int>(i)) !=
                      c.bf16_inputs.end();
    if (IsFloating(t.dtype)) t.dtype = bf16 && !twin ? DType::kBF16 : DType::kF32;
    ins.push_back(p.AddInput(fmt::format("x{}", i), t));
  }
  Attrs attrs = c.attrs;
  if (twin && attrs.Has("dtype") && attrs.GetString("dtype") == "bf16") attrs.Set("dtype", "f32");
  if (twin || cast) attrs = WithoutRounding(attrs);
  if (cast && RoundsOnLoad(c.attrs)) {
    ins[1] = p.AddInstruction("cast", {ins[1]}, {{"dtype", std::string("bf16")}})[0];
  }
  ValueList outs = p.AddInstruction(c.op, ins, attrs);
  for (size_t i = 0; i < outs.size(); ++i) {
    p.Rename(outs[i], fmt::format("y{}", i));
    p.AddOutput(outs[i]);
  }
  return p;
}

// max |a - b| / max(|b|, 1e-6) over two tensors of one shape, read as doubles.
double RelativeDiff(const Tensor& a, const Tensor& b) {
  double scale = 1e-6, diff = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    scale = std::max(scale, std::abs(b.FlatAt(i)));
    diff = std::max(diff, std::abs(a.FlatAt(i) - b.FlatAt(i)));
  }
  return diff / scale;
}

Tensor MakeInput(const TensorType& t, const Fill& fill, std::mt19937_64& rng) {
  Tensor x = Tensor::Empty(t.shape, t.dtype);
  for (int64_t i = 0; i < x.numel(); ++i) {
    double v;
    if (fill.kind == Fill::kIndex) {
      v = static_cast<double>(std::uniform_int_distribution<int64_t>(
          static_cast<int64_t>(fill.low), static_cast<int64_t>(fill.high) - 1)(rng));
    } else {
      v = std::uniform_real_distribution<double>(fill.low, fill.high)(rng);
    }
    x.FlatSet(i, v);
  }
  return x;
}

Scope MakeInputs(const Program& p, const OpCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Scope scope;
  for (size_t i = 0; i < p.inputs().size(); ++i) {
    const Value& v = p.value(p.inputs()[i]);
    Fill fill = i < c.fills.size() ? c.fills[i] : Fill{};
    if (fill.kind == Fill::kPositive && fill.low == -1.0) fill = Positive();
    scope.Set(v.name, MakeInput(p.type(p.inputs()[i]), fill, rng));
  }
  return scope;
}

// Inputs are cloned so in-place ops see the same starting state in each run.
Scope CloneScope(const Scope& s) {
  Scope out;
  for (const std::string& n : s.Names()) out.Set(n, s.Get(n).Clone());
  return out;
}

void CompareKernels(const OpCase& c, DType t, double tolerance) {
  Program p = MakeProgram(c, t);
  Scope inputs = MakeInputs(p, c, 1234);
  Scope fast = CloneScope(inputs), ref = CloneScope(inputs);
  RunReference(p, fast, DefaultAllocator(), /*use_reference_kernels=*/false);
  RunReference(p, ref, DefaultAllocator(), /*use_reference_kernels=*/true);
  // Compare outputs and (for in-place ops) the possibly updated inputs.
  for (const std::string& name : fast.Names()) {
    const Tensor& a = fast.Get(name);
    const Tensor& b = ref.Get(name);
    ASSERT_EQ(a.shape(), b.shape()) << name;
    if (IsInteger(a.dtype())) {
      EXPECT_TRUE(BitwiseEqual(a, b)) << c.label << " " << name;
    } else {
      // Error relative to the tensor's largest magnitude: accumulation order differs between
      // kernels, so an element that cancels to near zero may differ by a few ulps of its terms.
      double scale = 1e-6, diff = 0;
      for (int64_t i = 0; i < a.numel(); ++i) {
        scale = std::max(scale, std::abs(b.FlatAt(i)));
        diff = std::max(diff, std::abs(a.FlatAt(i) - b.FlatAt(i)));
      }
      double err = diff / scale;
      EXPECT_LE(err, tolerance) << c.label << " (" << Name(t)
                                << "): fast and reference kernels differ on %" << name << "\nfast "
                                << a.ToString(16) << "\nref  " << b.ToString(16);
    }
  }
}

// The values of `from` in the types of `p`'s inputs (f32 copies of bf16 inputs for the twin).
Scope Retyped(const Program& p, const Scope& from) {
  Scope out;
  for (ValueId v : p.inputs()) {
    const std::string& name = p.value(v).name;
    const Tensor& x = from.Get(name);
    Tensor y = Tensor::Empty(x.shape(), p.type(v).dtype);
    for (int64_t i = 0; i < x.numel(); ++i) y.FlatSet(i, x.FlatAt(i));
    out.Set(name, y);
  }
  return out;
}

// Input 1 of `scope` rounded to bf16 values (kept f32): the twin's operand a product rounds on
// load.
void RoundInput1(const Program& p, Scope& scope) {
  const Tensor& x = scope.Get(p.value(p.inputs()[1]).name);
  for (int64_t i = 0; i < x.numel(); ++i) {
    x.FlatSet(i, BF16ToFloat(FloatToBF16(static_cast<float>(x.FlatAt(i)))));
  }
}

// A product rounding its operand on load gives, with each kind of kernel, bitwise what the
// product of the operand's cast gives.
void CompareWithTheCast(const OpCase& c, const Program& p, const Scope& inputs) {
  const Program cast = MakeMixedProgram(c, false, true);
  for (const bool reference : {false, true}) {
    Scope fused = CloneScope(inputs), unfused = CloneScope(inputs);
    RunReference(p, fused, DefaultAllocator(), reference);
    RunReference(cast, unfused, DefaultAllocator(), reference);
    for (ValueId y : p.outputs()) {
      const std::string& name = p.value(y).name;
      EXPECT_TRUE(BitwiseEqual(fused.Get(name), unfused.Get(name)))
          << c.label << (reference ? " (reference" : " (fast") << " kernels): %" << name
          << " differs from the product of the cast operand";
    }
  }
}

void RunMixedCase(const OpCase& c) {
  const Program p = MakeMixedProgram(c, false), twin = MakeMixedProgram(c, true);
  const Scope inputs = MakeInputs(p, c, 1234);
  const bool rounds = RoundsOnLoad(c.attrs);
  if (rounds) CompareWithTheCast(c, p, inputs);
  Scope fast = CloneScope(inputs), ref = CloneScope(inputs), exact = Retyped(twin, inputs);
  if (rounds) RoundInput1(twin, exact);
  RunReference(p, fast, DefaultAllocator(), /*use_reference_kernels=*/false);
  RunReference(p, ref, DefaultAllocator(), /*use_reference_kernels=*/true);
  RunReference(twin, exact, DefaultAllocator(), /*use_reference_kernels=*/true);
  for (ValueId y : p.outputs()) {
    const std::string& name = p.value(y).name;
    ASSERT_EQ(fast.Get(name).dtype(), p.type(y).dtype) << c.label << " %" << name;
    EXPECT_LE(RelativeDiff(fast.Get(name), ref.Get(name)), c.f32_tolerance)
        << c.label << " (mixed): fast and reference kernels differ on %" << name;
    EXPECT_LE(RelativeDiff(fast.Get(name), exact.Get(name)), c.bf16_tolerance)
        << c.label << " (mixed): %" << name << " beside its f32 twin\nmixed "
        << fast.Get(name).ToString(16) << "\nf32   " << exact.Get(name).ToString(16);
  }
  if (!c.grad) return;
  // Backward of both programs seeded with the same output gradients.
  GradientSpec spec;
  for (ValueId y : p.outputs()) spec.seeds.push_back(p.value(y).name);
  for (size_t i = 0; i < p.inputs().size(); ++i) {
    const ValueId x = p.inputs()[i];
    const bool skip = std::find(c.no_grad_inputs.begin(), c.no_grad_inputs.end(),
                                static_cast<int>(i)) != c.no_grad_inputs.end();
    if (IsFloating(p.type(x).dtype) && !skip) spec.wrt.push_back(p.value(x).name);
  }
  const Backward bwd = BuildBackward(p, spec), twin_bwd = BuildBackward(twin, spec);
  std::mt19937_64 rng(7);
  Scope mixed_scope = CloneScope(inputs), twin_scope = Retyped(twin, inputs);
  if (rounds) RoundInput1(twin, twin_scope);
  RunReference(p, mixed_scope, DefaultAllocator(), false);
  RunReference(twin, twin_scope, DefaultAllocator(), true);
  for (size_t k = 0; k < p.outputs().size(); ++k) {
    const Tensor seed = MakeInput(GradientType(p.type(p.outputs()[k])), Fill{}, rng);
    Tensor twin_seed = Tensor::Empty(seed.shape(), twin.type(twin.outputs()[k]).dtype);
    for (int64_t i = 0; i < seed.numel(); ++i) twin_seed.FlatSet(i, seed.FlatAt(i));
    mixed_scope.Set(p.value(p.outputs()[k]).name + ".grad", seed);
    twin_scope.Set(twin.value(twin.outputs()[k]).name + ".grad", twin_seed);
  }
  RunReference(bwd.program, mixed_scope, DefaultAllocator(), false);
  RunReference(twin_bwd.program, twin_scope, DefaultAllocator(), true);
  for (size_t w = 0; w < spec.wrt.size(); ++w) {
    const Tensor& g = mixed_scope.Get(bwd.grads[w]);
    EXPECT_EQ(g.dtype(), GradientType({inputs.Get(spec.wrt[w]).dtype(), {}}).dtype)
        << c.label << " d/d" << spec.wrt[w];
    EXPECT_LE(RelativeDiff(g, twin_scope.Get(twin_bwd.grads[w])), c.bf16_grad_tolerance)
        << c.label << " (mixed): gradient of " << spec.wrt[w] << " beside its f32 twin";
  }
}

// L = Σ_k Σ y_k ⊙ r_k for fixed random r_k; dL/dy_k = r_k seeds the backward program.
void CheckGradients(const OpCase& c) {
  Program p = MakeProgram(c, DType::kF64);
  Scope inputs = MakeInputs(p, c, 99);
  std::mt19937_64 rng(7);
  std::vector<Tensor> weights;
  for (ValueId y : p.outputs()) weights.push_back(MakeInput(p.type(y), Fill{}, rng));

  GradientSpec spec;
  for (ValueId y : p.outputs()) spec.seeds.push_back(p.value(y).name);
  std::vector<size_t> wrt_inputs;
  for (size_t i = 0; i < p.inputs().size(); ++i) {
    bool skip = std::find(c.no_grad_inputs.begin(), c.no_grad_inputs.end(), static_cast<int>(i)) !=
                c.no_grad_inputs.end();
    if (!skip && IsFloating(p.type(p.inputs()[i]).dtype)) {
      spec.wrt.push_back(p.value(p.inputs()[i]).name);
      wrt_inputs.push_back(i);
    }
  }
  if (spec.wrt.empty()) return;
  Backward bwd = BuildBackward(p, spec);

  auto loss = [&](Scope& scope) {
    RunReference(p, scope);
    double l = 0;
    for (size_t k = 0; k < p.outputs().size(); ++k) {
      const Tensor& y = scope.Get(p.value(p.outputs()[k]).name);
      for (int64_t i = 0; i < y.numel(); ++i) l += y.FlatAt(i) * weights[k].FlatAt(i);
    }
    return l;
  };

  Scope scope = CloneScope(inputs);
  RunReference(p, scope);
  for (size_t k = 0; k < p.outputs().size(); ++k)
    scope.Set(p.value(p.outputs()[k]).name + ".grad", weights[k]);
  RunReference(bwd.program, scope);

  const double h = 1e-6;
  for (size_t w = 0; w < spec.wrt.size(); ++w) {
    const std::string& name = spec.wrt[w];
    const Tensor& analytic = scope.Get(bwd.grads[w]);
    const Tensor& x = inputs.Get(name);
    for (int64_t i = 0; i < x.numel(); ++i) {
      Scope plus = CloneScope(inputs), minus = CloneScope(inputs);
      plus.Get(name).FlatSet(i, x.FlatAt(i) + h);
      minus.Get(name).FlatSet(i, x.FlatAt(i) - h);
      double numeric = (loss(plus) - loss(minus)) / (2 * h);
      double a = analytic.FlatAt(i);
      double err = std::abs(a - numeric) / std::max({std::abs(a), std::abs(numeric), 1e-2});
      ASSERT_LE(err, c.grad_tolerance) << c.label << ": d loss / d " << name << "[" << i
                                       << "] analytic " << a << " numeric " << numeric;
    }
  }
}

// A single-kernel op's one run per dtype: it runs on the case's shapes and its outputs have the
// types inference promised; there is no second kernel to compare them with.
void RunSingleKernel(const OpCase& c, DType t) {
  Program p = MakeProgram(c, t);
  Scope scope = MakeInputs(p, c, 1234);
  RunReference(p, scope, DefaultAllocator(), /*use_reference_kernels=*/false);
  for (ValueId y : p.outputs()) {
    EXPECT_NO_THROW(CheckBinding(p, y, scope.Get(p.value(y).name)))
        << c.label << " (" << Name(t) << ")";
  }
}

// Writing in place (exec/analysis.h): for every input the op lists in OpDef::in_place_inputs with
// output 0's shape and element width, each of its kernels run with output 0 on that input's storage
// gives bitwise what it gives into fresh memory — the alias-safety the listing promises.
void CheckInPlace(const Program& p, const Scope& inputs, const OpDef& op,
                  const std::string& label) {
  const Instruction& instr = p.instructions()[0];
  const TensorType& yt = p.type(instr.outputs[0]);
  for (int j : op.in_place_inputs) {
    const TensorType& xt = p.type(instr.inputs[static_cast<size_t>(j)]);
    if (xt.shape != yt.shape || SizeOf(xt.dtype) != SizeOf(yt.dtype)) continue;
    for (KernelFn kernel : {op.kernel, op.reference}) {
      auto run = [&](bool in_place) {
        std::vector<Tensor> ins;
        for (ValueId v : instr.inputs) ins.push_back(inputs.Get(p.value(v).name).Clone());
        std::vector<Tensor> outs;
        for (ValueId v : instr.outputs)
          outs.push_back(Tensor::Empty(p.type(v).shape, p.type(v).dtype));
        if (in_place)
          outs[0] = Tensor::OnStorage(ins[static_cast<size_t>(j)].storage(), yt.shape, yt.dtype);
        KernelContext ctx{
            KernelInputs(ins), {outs.data(), outs.size()}, instr.attrs, DefaultAllocator()};
        kernel(ctx);
        return outs[0];
      };
      const Tensor apart = run(false), over = run(true);
      EXPECT_TRUE(BitwiseEqual(apart, over))
          << label << " (" << Name(yt.dtype) << "): output 0 written over input " << j << " of "
          << op.name << " differs\napart " << apart.ToString(16) << "\nover  " << over.ToString(16);
    }
  }
}

bool SignatureNames(const std::vector<OpParam>& params, const std::string& name) {
  return std::any_of(params.begin(), params.end(),
                     [&](const OpParam& p) { return p.name == name; });
}

// The case's attributes are the signature's, and the op gives the outputs the signature lists
// (at least as many as its fixed entries when the last is "ys...").
void CheckSignature(const OpCase& c, const OpDef& op) {
  const OpSignature& s = op.signature;
  for (const auto& [name, value] : c.attrs.items()) {
    EXPECT_TRUE(SignatureNames(s.attrs, name))
        << c.label << ": attribute '" << name << "' is not in " << c.op << "'s signature";
  }
  const Program p = MakeProgram(c, DType::kF64);
  const size_t outputs = p.outputs().size();
  if (!s.outputs.empty() && s.outputs.back().name.ends_with("...")) {
    EXPECT_GE(outputs + 1, s.outputs.size()) << c.label << ": outputs of " << c.op;
  } else {
    EXPECT_EQ(outputs, s.outputs.size())
        << c.label << ": outputs of " << c.op << " vs its signature";
  }
}

}  // namespace

void RunOpCase(const OpCase& c) {
  const OpDef* op = OpRegistry::Global().Find(c.op);
  ASSERT_NE(op, nullptr) << "unknown op " << c.op;
  const bool one_kernel = op->kernel == op->reference;
  ASSERT_EQ(c.single_kernel, one_kernel)
      << c.label << ": " << c.op
      << (one_kernel
              ? " has a single kernel (the registry's reference is its fast kernel): mark the "
                "case .single_kernel = true"
              : " has a reference and a fast kernel: drop .single_kernel so they are compared");
  if (c.bf16) {
    RunMixedCase(c);
    const Program p = MakeMixedProgram(c, false);
    CheckInPlace(p, MakeInputs(p, c, 1234), *op, c.label);
    return;
  }
  for (DType t : {DType::kF32, DType::kF64}) {
    const Program p = MakeProgram(c, t);
    CheckInPlace(p, MakeInputs(p, c, 1234), *op, c.label);
  }
  CheckSignature(c, *op);
  if (c.single_kernel) {
    ::testing::Test::RecordProperty("fast_vs_reference", "skipped: single kernel");
    std::printf(
        "[   NOTE   ] %s: %s has a single kernel; fast vs reference skipped, the kernel run "
        "in f32 and f64\n",
        c.label.c_str(), c.op.c_str());
    RunSingleKernel(c, DType::kF32);
    RunSingleKernel(c, DType::kF64);
  } else {
    CompareKernels(c, DType::kF32, c.f32_tolerance);
    CompareKernels(c, DType::kF64, 1e-12);
  }
  if (c.grad) CheckGradients(c);
}

void RunOpErrorCase(const OpErrorCase& c) {
  Program p(c.label);
  std::vector<ValueId> ins;
  for (size_t i = 0; i < c.inputs.size(); ++i)
    ins.push_back(p.AddInput(fmt::format("x{}", i), c.inputs[i]));
  try {
    p.AddInstruction(c.op, ins, c.attrs);
    ADD_FAILURE() << c.label << ": expected a ShapeError or ProgramError";
  } catch (const ShapeError& e) {
    EXPECT_NE(std::string(e.what()).find(c.op), std::string::npos)
        << "message should name the op: " << e.what();
  } catch (const ProgramError& e) {
    EXPECT_NE(std::string(e.what()).find(c.op), std::string::npos)
        << "message should name the op: " << e.what();
  }
}

TEST_P(OpHarness, KernelsAgreeAndGradientsCheck) { RunOpCase(GetParam()); }
TEST_P(OpErrors, BadShapesAreErrors) { RunOpErrorCase(GetParam()); }

std::vector<double> RunF64(const std::string& op, const std::vector<Tensor>& inputs, bool reference,
                           const Attrs& attrs) {
  Program p(op);
  Scope scope;
  std::vector<ValueId> ids;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const std::string name = "x" + std::to_string(i);
    const DType dtype = IsInteger(inputs[i].dtype()) ? inputs[i].dtype() : DType::kF64;
    ids.push_back(p.AddInput(name, {dtype, inputs[i].shape()}));
    scope.Set(name, inputs[i]);
  }
  p.AddOutput(p.AddInstruction(op, ids, attrs, {"y"})[0]);
  RunReference(p, scope, DefaultAllocator(), reference);
  const Tensor& y = scope.Get("y");
  std::vector<double> out;
  for (int64_t i = 0; i < y.numel(); ++i) out.push_back(y.FlatAt(i));
  return out;
}

}  // namespace sluice::testing
