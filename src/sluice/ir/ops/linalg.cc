// Matrix products and the linear layer: registration, inference and VJP rules.
// Kernels: kernels/matmul.h, kernels/linear.h.
#include "sluice/ir/ops/linalg.h"

#include <optional>
#include <string>
#include <type_traits>

#include "sluice/ir/ops.h"
#include "sluice/ir/ops/common.h"
#include "sluice/kernels/bf16_activations.h"
#include "sluice/kernels/bf16_convert.h"
#include "sluice/kernels/bf16_products.h"
#include "sluice/kernels/linear.h"
#include "sluice/kernels/matmul.h"
#include "sluice/kernels/unary.h"

namespace sluice {

namespace {

// Mixed precision (kernels/bf16_products.h): bf16 operands give an f32 product. Otherwise the
// operands share one float dtype, the product's.
DType ProductDType(std::span<const TensorType> operands) {
  if (operands[0].dtype == DType::kBF16) {
    for (const TensorType& t : operands) {
      if (t.dtype != DType::kBF16) {
        throw ShapeError(
            fmt::format("dtypes differ: bf16 vs {} (a bf16 product takes bf16 "
                        "operands: cast the other one)",
                        Name(t.dtype)));
      }
    }
    return DType::kF32;
  }
  return ops::SameFloatDType(operands);
}

// Whether a product's second operand (matmul's b, linear's w: attribute round_b / round_w) is f32
// rounded to bf16 as the product loads it — autocast's weights, which products alone read: no bf16
// copy of them in memory, bitwise the product of the operand cast to bf16
// (kernels/bf16_products.h).
const char* RoundAttr(const Attrs& attrs) { return attrs.Has("round_w") ? "round_w" : "round_b"; }
bool RoundsOnLoad(const Attrs& attrs) {
  return attrs.GetBool("round_b", false) || attrs.GetBool("round_w", false);
}

// The operands' types as the product sees them: a second operand rounded on load is bf16 there,
// and must be f32 beside a bf16 first operand.
std::vector<TensorType> AsLoaded(std::span<const TensorType> in, const Attrs& attrs) {
  std::vector<TensorType> loaded(in.begin(), in.end());
  if (!RoundsOnLoad(attrs)) return loaded;
  if (in[0].dtype != DType::kBF16 || in[1].dtype != DType::kF32) {
    throw ShapeError(fmt::format("{} needs a bf16 first operand and an f32 second, got {} and {}",
                                 RoundAttr(attrs), Name(in[0].dtype), Name(in[1].dtype)));
  }
  loaded[1].dtype = DType::kBF16;
  return loaded;
}

// An output gradient as an operand of the products giving the inputs' gradients: rounded to bf16
// when the forward product was bf16 (autocast's backward), as is. A gradient widened from a bf16
// one (a unit boundary's, autodiff.h GradientSpec::bf16_gradients) rounds back to it exactly: the
// products read that one, no second bf16 copy.
// The bf16 value `dy` was widened from, if it was.
std::optional<Var> WidenedFrom(Var dy) {
  if (const int32_t producer = dy.value().producer; producer >= 0) {
    const Program& p = dy.builder()->program();
    const Instruction& ins = p.instructions()[static_cast<size_t>(producer)];
    if (ins.op->name == "cast" && p.type(ins.inputs[0]).dtype == DType::kBF16) {
      return Var(dy.builder(), ins.inputs[0]);
    }
  }
  return std::nullopt;
}

Var GradOperand(Var dy, DType operand) {
  if (operand != DType::kBF16) return dy;
  if (std::optional<Var> bf16 = WidenedFrom(dy)) return *bf16;
  return Cast(dy, DType::kBF16);
}

// The f32 scratch of a bf16 product's kernel (kernels/bf16_products.h: the operands' widened
// blocks), taken from the executor's allocator so that the memory forecast holds it
// (OpDef::scratch_bytes). The reference kernels take it too, to keep the forecast exact for both.
Tensor Bf16Scratch(KernelContext& ctx, int64_t floats) {
  return Tensor::Empty({floats}, DType::kF32, ctx.allocator);
}

int64_t MatMulBF16ScratchBytes(std::span<const TensorType> in, const Attrs& attrs) {
  if (in[0].dtype != DType::kBF16) return 0;
  return 4 * kernels::MatMulBF16ScratchFloats(
                 in[0].shape, in[1].shape, attrs.GetBool("transpose_a", false),
                 attrs.GetBool("transpose_b", false), RoundsOnLoad(attrs));
}

// x [..., k] bf16 by w [k, n]: rows = x's leading axes folded.
int64_t LinearBF16ScratchBytes(std::span<const TensorType> in, const Attrs& attrs) {
  if (in[0].dtype != DType::kBF16) return 0;
  const int64_t k = in[1].shape[0], n = in[1].shape[1], m = k == 0 ? 0 : in[0].shape.numel() / k;
  const bool w_rounds = RoundsOnLoad(attrs);
  return 4 * (attrs.Has("dtype") ? kernels::LinearBF16RoundedScratchFloats(m, k, n, w_rounds)
                                 : kernels::LinearBF16ScratchFloats(m, k, n, w_rounds));
}

// in: the operands as loaded (AsLoaded).
std::vector<TensorType> InferLoadedMatMul(std::span<const TensorType> in, const Attrs& attrs) {
  DType t = ProductDType(in.first(2));
  const bool ta = attrs.GetBool("transpose_a", false), tb = attrs.GetBool("transpose_b", false);
  kernels::MatMulDims d = kernels::MatMulShape(in[0].shape, in[1].shape, ta, tb);
  Shape out = in[0].shape;
  out[out.rank() - 2] = d.m;
  out[out.rank() - 1] = d.n;
  return {{t, out}};
}

std::vector<TensorType> InferMatMul(std::span<const TensorType> in, const Attrs& attrs) {
  return InferLoadedMatMul(AsLoaded(in, attrs), attrs);
}

template <bool kFast>
void MatMulKernel(KernelContext& ctx) {
  const bool ta = ctx.attrs.GetBool("transpose_a", false),
             tb = ctx.attrs.GetBool("transpose_b", false);
  if (ctx.inputs[0].dtype() == DType::kBF16) {
    const Tensor scratch = Bf16Scratch(
        ctx, kernels::MatMulBF16ScratchFloats(ctx.inputs[0].shape(), ctx.inputs[1].shape(), ta, tb,
                                              RoundsOnLoad(ctx.attrs)));
    if constexpr (kFast) {
      kernels::MatMulBF16(ctx.inputs[0], ctx.inputs[1], ctx.outputs[0], ta, tb,
                          scratch.data<float>());
    } else {
      kernels::MatMulBF16Reference(ctx.inputs[0], ctx.inputs[1], ctx.outputs[0], ta, tb);
    }
    return;
  }
  DispatchFloat(ctx.outputs[0].dtype(), "matmul", [&]<typename T>() {
    if constexpr (kFast) {
      kernels::MatMulBlas<T>(ctx.inputs[0], ctx.inputs[1], ctx.outputs[0], ta, tb);
    } else {
      kernels::MatMulReference<T>(ctx.inputs[0], ctx.inputs[1], ctx.outputs[0], ta, tb);
    }
  });
}

// Folds every axis but the last into one: [..., X] -> [N, X].
Var Flatten2D(Var v) { return Reshape(v, {-1, v.shape()[v.rank() - 1]}); }

// C = op(A)·op(B). For each transpose combination the gradients are again matmuls:
//   ta tb | dA (stored like A)    | dB (stored like B)
//   0  0  | dC·Bᵀ                 | Aᵀ·dC
//   0  1  | dC·B                  | dCᵀ·A
//   1  0  | B·dCᵀ                 | A·dC
//   1  1  | Bᵀ·dCᵀ                | dCᵀ·Aᵀ
// When B is a 2-D weight shared by a batched A, dB sums over the batch: with A not transposed the
// batch folds into the rows (one GEMM), otherwise the batched product is summed with SumTo.
// Under mixed precision dC is rounded to bf16 first; the gradients are the products' f32 results
// (a bf16 value's gradient is f32: GradientType).
std::vector<Var> MatMulVjp(VjpContext& ctx) {
  const bool ta = ctx.attrs().GetBool("transpose_a", false),
             tb = ctx.attrs().GetBool("transpose_b", false);
  const DType operand = ctx.x_type(0).dtype;
  Var dc = GradOperand(ctx.dy(0), operand);
  std::vector<Var> grads(2);
  if (ctx.needs(0)) {
    // B rounded on load stays so where it is b again; as a, it is cast.
    Var b = ctx.x(1);
    const bool round_b = RoundsOnLoad(ctx.attrs());
    if (!ta) {
      grads[0] = MatMul(dc, b, false, !tb, round_b);
    } else if (b.rank() == 2 && dc.rank() > 2) {
      // A shared 2-D B cannot lead a batched product: dA = (dC·op(B)ᵀ)ᵀ over the last two axes.
      grads[0] = Transpose(MatMul(dc, b, false, !tb, round_b), -2, -1);
    } else {
      grads[0] = MatMul(round_b ? Cast(b, DType::kBF16) : b, dc, tb, true);
    }
  }
  if (ctx.needs(1)) {
    Var a = ctx.x(0);
    const bool shared = ctx.x_type(1).shape.rank() == 2 && ctx.x_type(0).shape.rank() > 2;
    if (shared && !ta) {
      Var a2 = Flatten2D(a), dc2 = Flatten2D(dc);
      grads[1] = tb ? MatMul(dc2, a2, true, false) : MatMul(a2, dc2, true, false);
    } else {
      Var g = tb ? MatMul(dc, a, true, ta) : MatMul(a, dc, !ta, false);
      grads[1] = shared ? SumTo(g, ctx.x_type(1).shape) : g;
    }
  }
  return grads;
}

// Whether a linear stores its result bf16 (attribute dtype = "bf16"; bf16 x and w only).
bool RoundsToBf16(const Attrs& attrs) {
  if (!attrs.Has("dtype")) return false;
  const std::string& to = attrs.GetString("dtype");
  if (to != "bf16") {
    throw ShapeError(
        fmt::format("dtype must be \"bf16\" (the result rounded) or absent, got \"{}\"", to));
  }
  return true;
}

// x and w bf16 with an f32 bias: the mixed-precision linear (f32 result, or bf16 with dtype); w
// f32 with round_w.
std::vector<TensorType> InferLinear(std::span<const TensorType> given, const Attrs& attrs) {
  const std::vector<TensorType> loaded = AsLoaded(given, attrs);
  const std::span<const TensorType> in = loaded;
  const DType t = ProductDType(in.first(2));
  if (RoundsToBf16(attrs) && in[0].dtype != DType::kBF16) {
    throw ShapeError(fmt::format("dtype \"bf16\" needs bf16 x and w, got {}", Name(in[0].dtype)));
  }
  if (in[2].dtype != t) {
    throw ShapeError(fmt::format("b must be {} for x {} and w {}, got {}", Name(t),
                                 Name(in[0].dtype), Name(in[1].dtype), Name(in[2].dtype)));
  }
  const Shape &x = in[0].shape, &w = in[1].shape, &b = in[2].shape;
  if (x.rank() < 2) {
    throw ShapeError(fmt::format("x must be [..., k] of rank 2 or more, got {}", x.ToString()));
  }
  if (w.rank() != 2 || w[0] != x[x.rank() - 1]) {
    throw ShapeError(
        fmt::format("w must be [k, n] = [in, out] with k = {} (x's last axis, x {}), got {}",
                    x[x.rank() - 1], x.ToString(), w.ToString()));
  }
  if (b.rank() != 1 || b[0] != w[1]) {
    throw ShapeError(
        fmt::format("b must be [n] = [{}] for w {}, got {}", w[1], w.ToString(), b.ToString()));
  }
  Shape out = x;
  out[out.rank() - 1] = w[1];
  return {{RoundsToBf16(attrs) ? DType::kBF16 : t, out}};
}

// The mixed-precision linear, w of type TW: bf16, or f32 rounded on load (round_w).
template <bool kFast, typename TW>
void LinearBF16Kernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const int64_t k = ctx.inputs[1].shape()[0], n = ctx.inputs[1].shape()[1],
                m = k == 0 ? 0 : x.numel() / k;
  const bool w_rounds = std::is_same_v<TW, float>;
  const TW* w = ctx.inputs[1].data<TW>();
  const float* b = ctx.inputs[2].data<float>();
  if (ctx.outputs[0].dtype() == DType::kBF16) {
    BFloat16* y = ctx.outputs[0].data<BFloat16>();
    const Tensor scratch =
        Bf16Scratch(ctx, kernels::LinearBF16RoundedScratchFloats(m, k, n, w_rounds));
    if constexpr (kFast) {
      kernels::LinearBF16Rounded(x.data<BFloat16>(), w, b, y, m, k, n, scratch.data<float>());
    } else {
      kernels::LinearBF16RoundedReference(x.data<BFloat16>(), w, b, y, m, k, n);
    }
    return;
  }
  const Tensor scratch = Bf16Scratch(ctx, kernels::LinearBF16ScratchFloats(m, k, n, w_rounds));
  float* y = ctx.outputs[0].data<float>();
  if constexpr (kFast) {
    kernels::LinearBF16(x.data<BFloat16>(), w, b, y, m, k, n, scratch.data<float>());
  } else {
    kernels::LinearBF16Reference(x.data<BFloat16>(), w, b, y, m, k, n);
  }
}

template <bool kFast>
void LinearKernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  if (x.dtype() == DType::kBF16) {
    if (ctx.inputs[1].dtype() == DType::kF32) return LinearBF16Kernel<kFast, float>(ctx);
    return LinearBF16Kernel<kFast, BFloat16>(ctx);
  }
  DispatchFloat(x.dtype(), "linear", [&]<typename T>() {
    const int64_t k = ctx.inputs[1].shape()[0], n = ctx.inputs[1].shape()[1];
    int64_t m = 1;  // rows: x's leading axes folded
    for (int i = 0; i < x.rank() - 1; ++i) m *= x.shape()[i];
    const T* w = ctx.inputs[1].data<T>();
    const T* b = ctx.inputs[2].data<T>();
    if constexpr (kFast) {
      kernels::LinearBlas<T>(x.data<T>(), w, b, ctx.outputs[0].data<T>(), m, k, n);
    } else {
      kernels::LinearReference<T>(x.data<T>(), w, b, ctx.outputs[0].data<T>(), m, k, n);
    }
  });
}

// y = x·w + b. dx = dy·wᵀ (w shared: one GEMM over all rows); dw = xᵀ·dy with the leading axes
// folded into the rows (one GEMM); db sums dy over every axis but the last.
// Mixed precision: dx and dw (f32, GradientType) from dy rounded to bf16; db from dy in f32 — both
// from one pass over dy (cast_bf16_and_sum) when both are wanted.
std::vector<Var> LinearVjp(VjpContext& ctx) {
  Var dy = ctx.dy(0);
  const DType operand = ctx.x_type(0).dtype;
  const bool products = ctx.needs(0) || ctx.needs(1);
  std::vector<Var> grads(3);
  Var dyo;
  // A dy widened from a bf16 gradient (a unit boundary's) already has its bf16 copy: the products
  // read that one, and the fused pass would only make a second.
  if (products && ctx.needs(2) && operand == DType::kBF16 && dy.dtype() == DType::kF32 &&
      !WidenedFrom(dy)) {
    std::vector<Var> both = CastBf16AndSum(dy);
    dyo = both[0];
    grads[2] = both[1];
  } else {
    dyo = products ? GradOperand(dy, operand) : Var();
    // db first: under mixed precision the products read dy's bf16 copy, so f32 dy is free before
    // they run (and their scratch) rather than after.
    if (ctx.needs(2)) grads[2] = SumTo(dy, ctx.x_type(2).shape);
  }
  if (ctx.needs(0)) grads[0] = MatMul(dyo, ctx.x(1), false, true, RoundsOnLoad(ctx.attrs()));
  if (ctx.needs(1)) grads[1] = MatMul(Flatten2D(ctx.x(0)), Flatten2D(dyo), true, false);
  return grads;
}

// dy [..., n] f32 -> dy rounded to bf16 [..., n] and dy summed over its leading axes [n].
std::vector<TensorType> InferCastBf16AndSum(std::span<const TensorType> in, const Attrs&) {
  if (in[0].dtype != DType::kF32) {
    throw ShapeError(fmt::format("dy must be f32, got {}", Name(in[0].dtype)));
  }
  const Shape& dy = in[0].shape;
  if (dy.rank() < 1) {
    throw ShapeError(fmt::format("dy must be [..., n] of rank 1 or more, got {}", dy.ToString()));
  }
  return {{DType::kBF16, dy}, {DType::kF32, Shape{dy[dy.rank() - 1]}}};
}

template <bool kFast>
void CastBf16AndSumKernel(KernelContext& ctx) {
  const Tensor& dy = ctx.inputs[0];
  const int64_t n = dy.shape()[dy.rank() - 1], rows = n == 0 ? 0 : dy.numel() / n;
  (kFast ? kernels::ToBF16ColumnSumParallel : kernels::ToBF16ColumnSumReference)(
      dy.data<float>(), ctx.outputs[0].data<BFloat16>(), ctx.outputs[1].data<float>(), rows, n);
}

// a, b as matmul's; x the product's shape, of the product's dtype — or bf16 beside bf16 a and b
// (mixed precision: the GELU's input stored bf16, the gradient f32).
std::vector<TensorType> InferMatMulGeluGrad(std::span<const TensorType> given, const Attrs& attrs) {
  const std::vector<TensorType> loaded = AsLoaded(given, attrs);
  const std::span<const TensorType> in = loaded;
  const DType t = ProductDType(in.first(2));
  const bool mixed = in[0].dtype == DType::kBF16;
  if (in[2].dtype != t && !(mixed && in[2].dtype == DType::kBF16)) {
    throw ShapeError(fmt::format("x must be {}{} for a {} and b {}, got {}", Name(t),
                                 mixed ? " or bf16" : "", Name(in[0].dtype), Name(in[1].dtype),
                                 Name(in[2].dtype)));
  }
  const Shape product = InferLoadedMatMul(in.first(2), attrs)[0].shape;
  if (in[2].shape != product) {
    throw ShapeError(fmt::format("x must have the product's shape {} (a {}, b {}), got {}",
                                 product.ToString(), in[0].shape.ToString(), in[1].shape.ToString(),
                                 in[2].shape.ToString()));
  }
  return {{t, product}};
}

template <bool kFast>
void MatMulGeluGradKernel(KernelContext& ctx) {
  const bool ta = ctx.attrs.GetBool("transpose_a", false),
             tb = ctx.attrs.GetBool("transpose_b", false);
  const Tensor& out = ctx.outputs[0];
  if (ctx.inputs[0].dtype() == DType::kBF16) {
    // bf16 a and b: the f32 product into the result, then the GELU gradient in place from x (f32,
    // or bf16 widened in the kernel).
    const Tensor& x = ctx.inputs[2];
    const Tensor dy = kFast ? out : Tensor::Empty(out.shape(), out.dtype());
    const Tensor scratch = Bf16Scratch(
        ctx, kernels::MatMulBF16ScratchFloats(ctx.inputs[0].shape(), ctx.inputs[1].shape(), ta, tb,
                                              RoundsOnLoad(ctx.attrs)));
    if constexpr (kFast) {
      kernels::MatMulBF16(ctx.inputs[0], ctx.inputs[1], dy, ta, tb, scratch.data<float>());
    } else {
      kernels::MatMulBF16Reference(ctx.inputs[0], ctx.inputs[1], dy, ta, tb);
    }
    if (x.dtype() == DType::kBF16) {
      (kFast ? kernels::GeluGradBF16Fast : kernels::GeluGradBF16Reference)(
          dy.data<float>(), x.data<BFloat16>(), out.data<float>(), out.numel());
    } else {
      (kFast ? kernels::GeluGradFast<float>
             : kernels::GeluGradReference<float>)(dy.data<float>(), x.data<float>(),
                                                  out.data<float>(), out.numel());
    }
    return;
  }
  DispatchFloat(out.dtype(), "matmul_gelu_grad", [&]<typename T>() {
    const T* x = ctx.inputs[2].data<T>();
    if constexpr (kFast) {
      // The product goes into the result, which the GELU gradient then scales in place (it reads
      // dy[j] before it writes dx[j]).
      kernels::MatMulBlas<T>(ctx.inputs[0], ctx.inputs[1], out, ta, tb);
      kernels::GeluGradFast<T>(out.data<T>(), x, out.data<T>(), out.numel());
    } else {
      const Tensor dy = Tensor::Empty(out.shape(), out.dtype());
      kernels::MatMulReference<T>(ctx.inputs[0], ctx.inputs[1], dy, ta, tb);
      kernels::GeluGradReference<T>(dy.data<T>(), x, out.data<T>(), out.numel());
    }
  });
}

// acc [m, n] += op(a)·op(b), a and b 2-D: a weight gradient added into its accumulated buffer.
std::vector<TensorType> InferMatMulAccumulate(std::span<const TensorType> in, const Attrs& attrs) {
  ops::SameFloatDType(in);
  if (in[1].shape.rank() != 2 || in[2].shape.rank() != 2) {
    throw ShapeError(fmt::format("a and b must be 2-D, got a {} and b {}", in[1].shape.ToString(),
                                 in[2].shape.ToString()));
  }
  const Shape product = InferMatMul(in.subspan(1, 2), attrs)[0].shape;
  if (in[0].shape != product) {
    throw ShapeError(fmt::format("acc must have the product's shape {} (a {}, b {}), got {}",
                                 product.ToString(), in[1].shape.ToString(), in[2].shape.ToString(),
                                 in[0].shape.ToString()));
  }
  return {};
}

template <bool kFast>
void MatMulAccumulateKernel(KernelContext& ctx) {
  const bool ta = ctx.attrs.GetBool("transpose_a", false),
             tb = ctx.attrs.GetBool("transpose_b", false);
  const Tensor& acc = ctx.inputs[0];
  DispatchFloat(acc.dtype(), "matmul_accumulate", [&]<typename T>() {
    if constexpr (kFast) {
      kernels::MatMulAccumulateBlas<T>(acc, ctx.inputs[1], ctx.inputs[2], ta, tb);
    } else {
      kernels::MatMulAccumulateReference<T>(acc, ctx.inputs[1], ctx.inputs[2], ta, tb);
    }
  });
}

}  // namespace

Var MatMulGeluGrad(Var a, Var b, Var x, bool transpose_a, bool transpose_b) {
  Attrs attrs;
  if (transpose_a) attrs.Set("transpose_a", true);
  if (transpose_b) attrs.Set("transpose_b", true);
  return a.builder()->Emit1("matmul_gelu_grad", {a, b, x}, std::move(attrs));
}

Var Linear(Var x, Var w, Var b) { return x.builder()->Emit1("linear", {x, w, b}); }

std::vector<Var> CastBf16AndSum(Var dy) { return dy.builder()->Emit("cast_bf16_and_sum", {dy}); }

Var MatMul(Var a, Var b, bool transpose_a, bool transpose_b, bool round_b) {
  Attrs attrs;
  if (transpose_a) attrs.Set("transpose_a", true);
  if (transpose_b) attrs.Set("transpose_b", true);
  if (round_b) attrs.Set("round_b", true);
  return a.builder()->Emit1("matmul", {a, b}, std::move(attrs));
}

void RegisterLinalgOps(OpRegistry& r) {
  r.Register(
      {.name = "matmul",
       .num_inputs = 2,
       .infer = InferMatMul,
       .kernel = MatMulKernel<true>,
       .reference = MatMulKernel<false>,
       .vjp = MatMulVjp,
       .doc = "op(a)·op(b), op transposing the last two axes when asked; b shared by every "
              "batch entry when 2-D (CBLAS GEMM); bf16 operands give an f32 product (oneDNN); "
              "with round_b, bf16 a and f32 b rounded to bf16 as the product loads it (bitwise "
              "the product of b cast, no bf16 copy of b: autocast's weights)",
       .signature = {.inputs = {{"a", "float or bf16[..., m, k]"},
                                {"b", "float or bf16[k, n] or [..., k, n]"}},
                     .attrs = {{"transpose_a", "bool = false"},
                               {"transpose_b", "bool = false"},
                               {"round_b", "bool = false (true: f32 b rounded to bf16 on load)"}},
                     .outputs = {{"y", "float[..., m, n]"}}},
       .scratch_bytes = MatMulBF16ScratchBytes});
  r.Register(
      {.name = "linear",
       .num_inputs = 3,
       .infer = InferLinear,
       .kernel = LinearKernel<true>,
       .reference = LinearKernel<false>,
       .vjp = LinearVjp,
       .doc = "x·w + b with w stored [in, out] (one CBLAS GEMM); bf16 x and w with an f32 b "
              "give an f32 result, or with dtype = \"bf16\" that result rounded to bf16 "
              "(bitwise linear then cast, the rounding done as the product stores it: "
              "autocast's fusion); with round_w, bf16 x and f32 w rounded to bf16 as the "
              "product loads it (bitwise w cast, no bf16 copy of w)",
       .signature = {.inputs = {{"x", "float or bf16[..., k]"},
                                {"w", "float or bf16[k, n]"},
                                {"b", "float[n]"}},
                     .attrs = {{"dtype", "string = absent (\"bf16\": y rounded)"},
                               {"round_w", "bool = false (true: f32 w rounded to bf16 on load)"}},
                     .outputs = {{"y", "float[..., n], or bf16 with dtype"}}},
       .scratch_bytes = LinearBF16ScratchBytes});
  r.Register({.name = "cast_bf16_and_sum",
              .num_inputs = 1,
              .infer = InferCastBf16AndSum,
              .kernel = CastBf16AndSumKernel<true>,
              .reference = CastBf16AndSumKernel<false>,
              .doc = "dy rounded to bf16 and dy summed over every axis but the last, in one pass "
                     "over dy: a bf16 linear's output gradient as its products' operand and its "
                     "bias gradient (the linear's VJP), bitwise cast and sum_to",
              .signature = {.inputs = {{"dy", "f32[..., n]"}},
                            .outputs = {{"dy_bf16", "bf16[..., n]"}, {"db", "f32[n]"}}}});
  r.Register({.name = "matmul_gelu_grad",
              .num_inputs = 3,
              .infer = InferMatMulGeluGrad,
              .kernel = MatMulGeluGradKernel<true>,
              .reference = MatMulGeluGradKernel<false>,
              .doc =
                  "gelu_grad(op(a)·op(b), x): a GELU's input gradient from the matmul giving its "
                  "output gradient, the product written once, into the result (autodiff's fusion)",
              .signature = {.inputs = {{"a", "float or bf16[..., m, k]"},
                                       {"b", "a's dtype[k, n] or [..., k, n]"},
                                       {"x", "float or bf16[..., m, n]"}},
                            .attrs = {{"transpose_a", "bool = false"},
                                      {"transpose_b", "bool = false"},
                                      {"round_b", "bool = false (matmul's)"}},
                            .outputs = {{"dx", "float[..., m, n]"}}},
              .scratch_bytes = MatMulBF16ScratchBytes});
  r.Register(
      {.name = "matmul_accumulate",
       .kind = OpKind::kInPlace,
       .num_inputs = 3,
       .infer = InferMatMulAccumulate,
       .kernel = MatMulAccumulateKernel<true>,
       .reference = MatMulAccumulateKernel<false>,
       .doc = "acc += op(a)·op(b) for 2-D a and b, one GEMM with beta = 1 into acc: a weight "
              "gradient added into its accumulated buffer without a product tensor (autodiff's "
              "AccumulateGradients)",
       .signature = {.inputs = {{"acc", "float[m, n]"}, {"a", "float[m, k]"}, {"b", "float[k, n]"}},
                     .attrs = {{"transpose_a", "bool = false"}, {"transpose_b", "bool = false"}}},
       .updates = {0}});
}

}  // namespace sluice
