// Elementwise ops: registration, inference and VJP rules. Kernels live in kernels/.
#include "sluice/ir/ops/elementwise.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <type_traits>

#include "sluice/ir/gradient_type.h"
#include "sluice/ir/ops.h"
#include "sluice/ir/ops/common.h"
#include "sluice/kernels/accumulate.h"
#include "sluice/kernels/bf16_activations.h"
#include "sluice/kernels/bf16_convert.h"
#include "sluice/kernels/bf16_llama.h"
#include "sluice/kernels/binary.h"
#include "sluice/kernels/swiglu.h"
#include "sluice/kernels/unary.h"

namespace sluice {

namespace {

// ---- Binary ops with broadcasting ----

std::vector<TensorType> InferBroadcastBinary(std::span<const TensorType> in, const Attrs&) {
  DType t = ops::SameFloatDType(in);
  return {{t, Broadcast(in[0].shape, in[1].shape)}};
}

// add and mul under mixed precision: a and b bf16 give bf16, computed in f32 (kernels/binary.h).
std::vector<TensorType> InferBroadcastBinaryBF16(std::span<const TensorType> in, const Attrs&) {
  DType t = ops::MixedFloatDType(in, {0, 1});
  return {{t, Broadcast(in[0].shape, in[1].shape)}};
}

template <typename Op, bool kFast>
void BinaryKernel(KernelContext& ctx) {
  if (ctx.outputs[0].dtype() == DType::kBF16) {
    if constexpr (kFast) {
      kernels::BinaryBF16Fast(ctx.inputs[0], ctx.inputs[1], ctx.outputs[0], Op{});
    } else {
      kernels::BinaryBF16Reference(ctx.inputs[0], ctx.inputs[1], ctx.outputs[0], Op{});
    }
    return;
  }
  DispatchFloat(ctx.outputs[0].dtype(), "binary op", [&]<typename T>() {
    if constexpr (kFast) {
      kernels::BinaryFast<T>(ctx.inputs[0], ctx.inputs[1], ctx.outputs[0], Op{});
    } else {
      kernels::BinaryReference<T>(ctx.inputs[0], ctx.inputs[1], ctx.outputs[0], Op{});
    }
  });
}

// d(a + b) = dy summed back to each operand's shape.
std::vector<Var> AddVjp(VjpContext& ctx) {
  Var dy = ctx.dy(0);
  std::vector<Var> grads(2);
  for (int i = 0; i < 2; ++i) {
    if (ctx.needs(i)) grads[i] = SumTo(dy, ctx.x_type(i).shape);
  }
  return grads;
}

// d(a - b): da = dy, db = -dy (negated after summing: on the smaller tensor).
std::vector<Var> SubVjp(VjpContext& ctx) {
  Var dy = ctx.dy(0);
  std::vector<Var> grads(2);
  if (ctx.needs(0)) grads[0] = SumTo(dy, ctx.x_type(0).shape);
  if (ctx.needs(1)) grads[1] = Neg(SumTo(dy, ctx.x_type(1).shape));
  return grads;
}

// d(a · b): da = dy · b, db = dy · a; a bf16 operand is widened to dy's f32 (a bf16 value's
// gradient type) first.
std::vector<Var> MulVjp(VjpContext& ctx) {
  Var dy = ctx.dy(0);
  auto widened = [&](int i) { return Cast(ctx.x(i), dy.dtype()); };
  std::vector<Var> grads(2);
  if (ctx.needs(0)) grads[0] = SumTo(Mul(dy, widened(1)), ctx.x_type(0).shape);
  if (ctx.needs(1)) grads[1] = SumTo(Mul(dy, widened(0)), ctx.x_type(1).shape);
  return grads;
}

// d(a / b) with y = a / b: da = dy / b, db = -dy · a / b² = -(dy / b) · y.
std::vector<Var> DivVjp(VjpContext& ctx) {
  Var g = Div(ctx.dy(0), ctx.x(1));
  std::vector<Var> grads(2);
  if (ctx.needs(0)) grads[0] = SumTo(g, ctx.x_type(0).shape);
  if (ctx.needs(1)) grads[1] = Neg(SumTo(Mul(g, ctx.y(0)), ctx.x_type(1).shape));
  return grads;
}

// ---- Unary ops: y = f(x), and fused gradients dx = g(dy, s) ----

std::vector<TensorType> InferUnary(std::span<const TensorType> in, const Attrs&) {
  return {{ops::SameFloatDType(in), in[0].shape}};
}

// dy and the saved value: same dtype and the same shape (no broadcasting).
std::vector<TensorType> InferUnaryGrad(std::span<const TensorType> in, const Attrs&) {
  DType t = ops::SameFloatDType(in);
  if (in[0].shape != in[1].shape) {
    throw ShapeError(fmt::format("the gradient {} and the saved value {} must have one shape",
                                 in[0].shape.ToString(), in[1].shape.ToString()));
  }
  return {{t, in[0].shape}};
}

template <typename T>
using UnaryFn = void (*)(const T*, T*, int64_t);
template <typename T>
using UnaryGradFn = void (*)(const T*, const T*, T*, int64_t);

template <UnaryFn<float> kF32, UnaryFn<double> kF64>
void UnaryKernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const Tensor& y = ctx.outputs[0];
  DispatchFloat(x.dtype(), "unary op", [&]<typename T>() {
    if constexpr (std::is_same_v<T, float>) {
      kF32(x.data<T>(), y.data<T>(), x.numel());
    } else {
      kF64(x.data<T>(), y.data<T>(), x.numel());
    }
  });
}

template <UnaryGradFn<float> kF32, UnaryGradFn<double> kF64>
void UnaryGradKernel(KernelContext& ctx) {
  const Tensor& dy = ctx.inputs[0];
  const Tensor& s = ctx.inputs[1];
  const Tensor& dx = ctx.outputs[0];
  DispatchFloat(dy.dtype(), "activation gradient", [&]<typename T>() {
    if constexpr (std::is_same_v<T, float>) {
      kF32(dy.data<T>(), s.data<T>(), dx.data<T>(), dy.numel());
    } else {
      kF64(dy.data<T>(), s.data<T>(), dx.data<T>(), dy.numel());
    }
  });
}

// ---- GELU under mixed precision: bf16 in, f32 compute, bf16 out (kernels/bf16_activations.h) ----

// gelu: x f32, f64 or bf16 -> y of x's dtype.
std::vector<TensorType> InferGelu(std::span<const TensorType> in, const Attrs& attrs) {
  if (in[0].dtype == DType::kBF16) return {in[0]};
  return InferUnary(in, attrs);
}

// gelu_grad: dy and x of one dtype, or dy f32 (a bf16 value's gradient type) with x bf16.
std::vector<TensorType> InferGeluGrad(std::span<const TensorType> in, const Attrs& attrs) {
  if (in[1].dtype != DType::kBF16) return InferUnaryGrad(in, attrs);
  if (in[0].dtype != DType::kF32) {
    throw ShapeError(
        fmt::format("dy must be f32 (the gradient of bf16 x), got {}", Name(in[0].dtype)));
  }
  if (in[0].shape != in[1].shape) {
    throw ShapeError(fmt::format("the gradient {} and the saved value {} must have one shape",
                                 in[0].shape.ToString(), in[1].shape.ToString()));
  }
  return {{DType::kF32, in[0].shape}};
}

template <bool kFast>
void GeluKernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  if (x.dtype() == DType::kBF16) {
    (kFast ? kernels::GeluBF16Fast : kernels::GeluBF16Reference)(
        x.data<BFloat16>(), ctx.outputs[0].data<BFloat16>(), x.numel());
  } else if constexpr (kFast) {
    UnaryKernel<kernels::GeluFast<float>, kernels::GeluFast<double>>(ctx);
  } else {
    UnaryKernel<kernels::GeluReference<float>, kernels::GeluReference<double>>(ctx);
  }
}

template <bool kFast>
void GeluGradKernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[1];
  if (x.dtype() == DType::kBF16) {
    (kFast ? kernels::GeluGradBF16Fast : kernels::GeluGradBF16Reference)(
        ctx.inputs[0].data<float>(), x.data<BFloat16>(), ctx.outputs[0].data<float>(), x.numel());
  } else if constexpr (kFast) {
    UnaryGradKernel<kernels::GeluGradFast<float>, kernels::GeluGradFast<double>>(ctx);
  } else {
    UnaryGradKernel<kernels::GeluGradReference<float>, kernels::GeluGradReference<double>>(ctx);
  }
}

void ScaleKernel(KernelContext& ctx) {
  const double factor = ctx.attrs.GetFloat("factor");
  const Tensor& x = ctx.inputs[0];
  const Tensor& y = ctx.outputs[0];
  DispatchFloat(x.dtype(), "scale", [&]<typename T>() {
    kernels::Scale<T>(x.data<T>(), y.data<T>(), x.numel(), static_cast<T>(factor));
  });
}

std::vector<TensorType> InferScale(std::span<const TensorType> in, const Attrs& attrs) {
  attrs.GetFloat("factor");
  return InferUnary(in, attrs);
}

std::vector<Var> ScaleVjp(VjpContext& ctx) {
  return {Scale(ctx.dy(0), ctx.attrs().GetFloat("factor"))};
}
std::vector<Var> NegVjp(VjpContext& ctx) { return {Neg(ctx.dy(0))}; }
std::vector<Var> ReluVjp(VjpContext& ctx) { return {ReluGrad(ctx.dy(0), ctx.y(0))}; }
std::vector<Var> GeluVjp(VjpContext& ctx) { return {GeluGrad(ctx.dy(0), ctx.x(0))}; }
std::vector<Var> SiluVjp(VjpContext& ctx) { return {SiluGrad(ctx.dy(0), ctx.x(0))}; }
std::vector<Var> GeluErfVjp(VjpContext& ctx) { return {GeluErfGrad(ctx.dy(0), ctx.x(0))}; }
std::vector<Var> TanhVjp(VjpContext& ctx) { return {TanhGrad(ctx.dy(0), ctx.y(0))}; }
std::vector<Var> SigmoidVjp(VjpContext& ctx) { return {SigmoidGrad(ctx.dy(0), ctx.y(0))}; }
std::vector<Var> LeakyReluVjp(VjpContext& ctx) {
  return {LeakyReluGrad(ctx.dy(0), ctx.x(0), ctx.attrs().GetFloat("slope", 0.01))};
}
// hardtanh's bounds: attributes min_val and max_val (PyTorch's names), min_val < max_val.
std::pair<double, double> HardtanhBounds(const Attrs& attrs) {
  const double lo = attrs.GetFloat("min_val", -1.0), hi = attrs.GetFloat("max_val", 1.0);
  if (!(lo < hi)) {
    throw ShapeError(fmt::format("hardtanh needs min_val < max_val, got {} and {}", lo, hi));
  }
  return {lo, hi};
}
std::vector<TensorType> InferHardtanh(std::span<const TensorType> in, const Attrs& attrs) {
  HardtanhBounds(attrs);
  return InferUnary(in, attrs);
}
std::vector<TensorType> InferHardtanhGrad(std::span<const TensorType> in, const Attrs& attrs) {
  HardtanhBounds(attrs);
  return InferUnaryGrad(in, attrs);
}
std::vector<Var> HardtanhVjp(VjpContext& ctx) {
  const auto [lo, hi] = HardtanhBounds(ctx.attrs());
  return {HardtanhGrad(ctx.dy(0), ctx.y(0), lo, hi)};
}
std::vector<Var> SoftplusVjp(VjpContext& ctx) {
  return {SoftplusGrad(ctx.dy(0), ctx.x(0), ctx.attrs().GetFloat("beta", 1.0),
                       ctx.attrs().GetFloat("threshold", 20.0))};
}

// leaky_relu and softplus: unary functions with attributes, one plain kernel each (a loop of
// compares, and libm's log1p and exp).
void LeakyReluKernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const double slope = ctx.attrs.GetFloat("slope", 0.01);
  DispatchFloat(x.dtype(), "leaky_relu", [&]<typename T>() {
    kernels::LeakyRelu<T>(x.data<T>(), ctx.outputs[0].data<T>(), x.numel(), static_cast<T>(slope));
  });
}

void LeakyReluGradKernel(KernelContext& ctx) {
  const Tensor& dy = ctx.inputs[0];
  const double slope = ctx.attrs.GetFloat("slope", 0.01);
  DispatchFloat(dy.dtype(), "leaky_relu_grad", [&]<typename T>() {
    kernels::LeakyReluGrad<T>(dy.data<T>(), ctx.inputs[1].data<T>(), ctx.outputs[0].data<T>(),
                              dy.numel(), static_cast<T>(slope));
  });
}

void HardtanhKernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const auto [lo, hi] = HardtanhBounds(ctx.attrs);
  DispatchFloat(x.dtype(), "hardtanh", [&]<typename T>() {
    kernels::Hardtanh<T>(x.data<T>(), ctx.outputs[0].data<T>(), x.numel(), static_cast<T>(lo),
                         static_cast<T>(hi));
  });
}

void HardtanhGradKernel(KernelContext& ctx) {
  const Tensor& dy = ctx.inputs[0];
  const auto [lo, hi] = HardtanhBounds(ctx.attrs);
  DispatchFloat(dy.dtype(), "hardtanh_grad", [&]<typename T>() {
    kernels::HardtanhGrad<T>(dy.data<T>(), ctx.inputs[1].data<T>(), ctx.outputs[0].data<T>(),
                             dy.numel(), static_cast<T>(lo), static_cast<T>(hi));
  });
}

void SoftplusKernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const double beta = ctx.attrs.GetFloat("beta", 1.0);
  const double threshold = ctx.attrs.GetFloat("threshold", 20.0);
  DispatchFloat(x.dtype(), "softplus", [&]<typename T>() {
    kernels::Softplus<T>(x.data<T>(), ctx.outputs[0].data<T>(), x.numel(), static_cast<T>(beta),
                         static_cast<T>(threshold));
  });
}

void SoftplusGradKernel(KernelContext& ctx) {
  const Tensor& dy = ctx.inputs[0];
  const double beta = ctx.attrs.GetFloat("beta", 1.0);
  const double threshold = ctx.attrs.GetFloat("threshold", 20.0);
  DispatchFloat(dy.dtype(), "softplus_grad", [&]<typename T>() {
    kernels::SoftplusGrad<T>(dy.data<T>(), ctx.inputs[1].data<T>(), ctx.outputs[0].data<T>(),
                             dy.numel(), static_cast<T>(beta), static_cast<T>(threshold));
  });
}

// softplus: beta must not be 0 (it divides).
std::vector<TensorType> InferSoftplus(std::span<const TensorType> in, const Attrs& attrs) {
  if (attrs.GetFloat("beta", 1.0) == 0.0) throw ShapeError("softplus: beta must not be 0");
  return {{ops::SameFloatDType(in.first(1)), in[0].shape}};
}

std::vector<TensorType> InferSoftplusGrad(std::span<const TensorType> in, const Attrs& attrs) {
  if (attrs.GetFloat("beta", 1.0) == 0.0) throw ShapeError("softplus_grad: beta must not be 0");
  return InferUnaryGrad(in, attrs);
}

// d e^x = dy · y.
std::vector<Var> ExpVjp(VjpContext& ctx) { return {Mul(ctx.dy(0), ctx.y(0))}; }
// d ln x = dy / x.
std::vector<Var> LogVjp(VjpContext& ctx) { return {Div(ctx.dy(0), ctx.x(0))}; }
// d √x = dy / (2·y).
std::vector<Var> SqrtVjp(VjpContext& ctx) { return {Scale(Div(ctx.dy(0), ctx.y(0)), 0.5)}; }

// ---- SwiGLU: silu(a) · b fused, backward from a and b ----

// a, b (and dy for the gradient): one float dtype, one shape (no broadcasting); under mixed
// precision a, b and y bf16 (kernels/bf16_llama.h).
std::vector<TensorType> InferSwiglu(std::span<const TensorType> in, const Attrs&) {
  DType t = ops::MixedFloatDType(in, {0, 1});
  for (size_t i = 1; i < in.size(); ++i) {
    if (in[i].shape != in[0].shape) {
      throw ShapeError(
          fmt::format("swiglu's operands must have one shape (no broadcasting): {} "
                      "and {}",
                      in[0].shape.ToString(), in[i].shape.ToString()));
    }
  }
  return {{t, in[0].shape}};
}

// dy, a, b -> da, db; dy f32 with a, b bf16 gives f32 da, db (a bf16 value's gradient type), or
// bf16 ones with the attribute dtype = "bf16" (rounded where they are made: a gradient that only
// bf16 products read, autodiff/autodiff.h). dtype, when given, names da's and db's dtype.
std::vector<TensorType> InferSwigluGrad(std::span<const TensorType> in, const Attrs& attrs) {
  TensorType t;
  if (in[1].dtype == DType::kBF16) {
    ops::MixedFloatDType(in, {1, 2});
    t = InferSwiglu(in.subspan(1), attrs)[0];
    if (in[0].shape != t.shape) {
      throw ShapeError(fmt::format("swiglu_grad's dy {} must have a's shape {}",
                                   in[0].shape.ToString(), t.shape.ToString()));
    }
    t.dtype = DType::kF32;
  } else {
    t = InferSwiglu(in, attrs)[0];
  }
  t.dtype = ops::GradientDTypeAttr(t.dtype, attrs, in[1].dtype == DType::kBF16);
  return {t, t};
}

template <bool kFast>
void SwigluKernel(KernelContext& ctx) {
  const Tensor& a = ctx.inputs[0];
  if (a.dtype() == DType::kBF16) {
    (kFast ? kernels::SwigluBF16Fast : kernels::SwigluBF16Reference)(
        a.data<BFloat16>(), ctx.inputs[1].data<BFloat16>(), ctx.outputs[0].data<BFloat16>(),
        a.numel());
    return;
  }
  DispatchFloat(a.dtype(), "swiglu", [&]<typename T>() {
    const T *ap = a.data<T>(), *bp = ctx.inputs[1].data<T>();
    T* y = ctx.outputs[0].data<T>();
    if constexpr (kFast) {
      kernels::SwigluFast<T>(ap, bp, y, a.numel());
    } else {
      kernels::SwigluReference<T>(ap, bp, y, a.numel());
    }
  });
}

template <bool kFast>
void SwigluGradKernel(KernelContext& ctx) {
  const Tensor& dy = ctx.inputs[0];
  if (ctx.inputs[1].dtype() == DType::kBF16) {
    const BFloat16 *a = ctx.inputs[1].data<BFloat16>(), *b = ctx.inputs[2].data<BFloat16>();
    if (ctx.outputs[0].dtype() == DType::kBF16) {
      (kFast ? kernels::SwigluGradBF16Fast<BFloat16>
             : kernels::SwigluGradBF16Reference<BFloat16>)(dy.data<float>(), a, b,
                                                           ctx.outputs[0].data<BFloat16>(),
                                                           ctx.outputs[1].data<BFloat16>(),
                                                           dy.numel());
    } else {
      (kFast ? kernels::SwigluGradBF16Fast<float>
             : kernels::SwigluGradBF16Reference<float>)(dy.data<float>(), a, b,
                                                        ctx.outputs[0].data<float>(),
                                                        ctx.outputs[1].data<float>(), dy.numel());
    }
    return;
  }
  DispatchFloat(dy.dtype(), "swiglu_grad", [&]<typename T>() {
    const T *g = dy.data<T>(), *a = ctx.inputs[1].data<T>(), *b = ctx.inputs[2].data<T>();
    T *da = ctx.outputs[0].data<T>(), *db = ctx.outputs[1].data<T>();
    if constexpr (kFast) {
      kernels::SwigluGradFast<T>(g, a, b, da, db, dy.numel());
    } else {
      kernels::SwigluGradReference<T>(g, a, b, da, db, dy.numel());
    }
  });
}

std::vector<Var> SwigluVjp(VjpContext& ctx) { return SwigluGrad(ctx.dy(0), ctx.x(0), ctx.x(1)); }

// ---- Fill, cast, copy ----

std::optional<DType> DTypeAttr(const Attrs& attrs) { return ParseDType(attrs.GetString("dtype")); }

std::vector<TensorType> InferFull(std::span<const TensorType>, const Attrs& attrs) {
  const std::vector<int64_t>& dims = attrs.GetInts("shape");
  std::optional<DType> t = DTypeAttr(attrs);
  if (!t) throw ShapeError(fmt::format("unknown dtype '{}'", attrs.GetString("dtype")));
  attrs.GetFloat("value");
  return {{*t, Shape(std::span<const int64_t>(dims))}};
}

void FullKernel(KernelContext& ctx) {
  const Tensor& out = ctx.outputs[0];
  const double value = ctx.attrs.GetFloat("value");
  switch (out.dtype()) {
    case DType::kF32:
      std::fill_n(out.data<float>(), out.numel(), static_cast<float>(value));
      break;
    case DType::kF64:
      std::fill_n(out.data<double>(), out.numel(), value);
      break;
    case DType::kI32:
      std::fill_n(out.data<int32_t>(), out.numel(), static_cast<int32_t>(value));
      break;
    case DType::kI64:
      std::fill_n(out.data<int64_t>(), out.numel(), static_cast<int64_t>(value));
      break;
    default:
      throw ShapeError(fmt::format("full: cannot fill dtype {}", Name(out.dtype())));
  }
}

// f32 <-> f64 both ways, f32 <-> bf16 both ways (mixed precision), i32 or i64 to f32 or f64 (a
// mask or a count read as numbers), and a cast to the same dtype.
std::vector<TensorType> InferCast(std::span<const TensorType> in, const Attrs& attrs) {
  std::optional<DType> to = DTypeAttr(attrs);
  const DType from = in[0].dtype;
  if (!to || (*to != DType::kF32 && *to != DType::kF64 && *to != DType::kBF16)) {
    throw ShapeError(
        fmt::format("can cast to f32, f64 or bf16, not '{}'", attrs.GetString("dtype")));
  }
  if (from != DType::kF32 && from != DType::kF64 && from != DType::kBF16 && !IsInteger(from)) {
    throw ShapeError(fmt::format("can cast f32, f64, bf16, i32 or i64, not {}", Name(from)));
  }
  if ((from == DType::kBF16 && *to == DType::kF64) ||
      ((from == DType::kF64 || IsInteger(from)) && *to == DType::kBF16)) {
    throw ShapeError(
        fmt::format("cannot cast {} to {} directly: cast through f32", Name(from), Name(*to)));
  }
  return {{*to, in[0].shape}};
}

template <bool kFast>
void CastKernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const Tensor& y = ctx.outputs[0];
  const int64_t n = x.numel();
  if (x.dtype() == y.dtype()) {
    y.CopyFrom(x);
  } else if (y.dtype() == DType::kBF16) {
    (kFast ? kernels::ToBF16Parallel : kernels::ToBF16Reference)(x.data<float>(),
                                                                 y.data<BFloat16>(), n);
  } else if (x.dtype() == DType::kBF16) {
    (kFast ? kernels::FromBF16Parallel : kernels::FromBF16Reference)(x.data<BFloat16>(),
                                                                     y.data<float>(), n);
  } else if (IsInteger(x.dtype())) {
    DispatchFloat(y.dtype(), "cast", [&]<typename To>() {
      if (x.dtype() == DType::kI64) {
        kernels::Cast<int64_t, To>(x.data<int64_t>(), y.data<To>(), n);
      } else {
        kernels::Cast<int32_t, To>(x.data<int32_t>(), y.data<To>(), n);
      }
    });
  } else {
    DispatchFloat(x.dtype(), "cast", [&]<typename From>() {
      DispatchFloat(y.dtype(), "cast", [&]<typename To>() {
        kernels::Cast<From, To>(x.data<From>(), y.data<To>(), n);
      });
    });
  }
}

// The gradient in x's gradient type: f32 <-> f64 cast back; across bf16 both sides' gradients are
// f32 (GradientType), so it passes through unrounded.
// An integer x has no gradient.
std::vector<Var> CastVjp(VjpContext& ctx) {
  if (IsInteger(ctx.x_type(0).dtype)) return {Var()};
  Var dy = ctx.dy(0);
  const DType want = GradientType(ctx.x_type(0)).dtype;
  return {dy.dtype() == want ? dy : Cast(dy, want)};
}

std::vector<TensorType> InferSame(std::span<const TensorType> in, const Attrs&) { return {in[0]}; }

void CopyKernel(KernelContext& ctx) { ctx.outputs[0].CopyFrom(ctx.inputs[0]); }

std::vector<Var> CopyVjp(VjpContext& ctx) { return {ctx.dy(0)}; }

// acc += x, same shape and dtype: a gradient added into its accumulated buffer, each element one
// rounded addition (what GradientAccumulator::Add computes).
std::vector<TensorType> InferAccumulate(std::span<const TensorType> in, const Attrs&) {
  ops::SameFloatDType(in);
  if (in[0].shape != in[1].shape) {
    throw ShapeError(fmt::format("x must have acc's shape {}, got {}", in[0].shape.ToString(),
                                 in[1].shape.ToString()));
  }
  return {};
}

template <bool kFast>
void AccumulateKernel(KernelContext& ctx) {
  const Tensor& acc = ctx.inputs[0];
  DispatchFloat(acc.dtype(), "accumulate", [&]<typename T>() {
    if constexpr (kFast) {
      kernels::AxpyBlas<T>(ctx.inputs[1].data<T>(), acc.data<T>(), acc.numel(), T(1));
    } else {
      kernels::AxpyReference<T>(ctx.inputs[1].data<T>(), acc.data<T>(), acc.numel(), T(1));
    }
  });
}

// bf16: the op takes bf16 a and b too (mixed precision), computing in f32.
void RegisterBinary(OpRegistry& r, std::string name, KernelFn fast, KernelFn reference, VjpFn vjp,
                    std::string doc, bool bf16 = false) {
  const char* operand = bf16 ? "float or bf16[...]" : "float[...]";
  r.Register({.name = std::move(name),
              .num_inputs = 2,
              .infer = bf16 ? InferBroadcastBinaryBF16 : InferBroadcastBinary,
              .kernel = fast,
              .reference = reference,
              .vjp = vjp,
              .doc = std::move(doc),
              .signature = {.inputs = {{"a", operand}, {"b", bf16 ? "a's dtype[...]" : operand}},
                            .outputs = {{"y", bf16 ? "a's dtype[broadcast of a and b]"
                                                   : "float[broadcast of a and b]"}}},
              // An operand of the output's shape is read at the output's position (any broadcast
              // of the other one); kernels/binary.h's loops read a position, then write it.
              .in_place_inputs = {0, 1}});
}

// reference == nullptr: the kernel is the only version (the registry uses it for both).
void RegisterUnary(OpRegistry& r, std::string name, KernelFn fast, KernelFn reference, VjpFn vjp,
                   std::string doc, bool recomputable = false) {
  r.Register({.name = std::move(name),
              .num_inputs = 1,
              .infer = InferUnary,
              .kernel = fast,
              .reference = reference,
              .vjp = vjp,
              .recomputable = recomputable,
              .doc = std::move(doc),
              .signature = {.inputs = {{"x", "float[...]"}}, .outputs = {{"y", "float[...]"}}},
              .in_place_inputs = {0}});
}

// `saved` names the forward value the gradient reads besides dy ("x", "y" or "s").
void RegisterUnaryGrad(OpRegistry& r, std::string name, const char* saved, KernelFn fast,
                       KernelFn reference, std::string doc) {
  r.Register({.name = std::move(name),
              .num_inputs = 2,
              .infer = InferUnaryGrad,
              .kernel = fast,
              .reference = reference,
              .doc = std::move(doc),
              .signature = {.inputs = {{"dy", "float[...]"}, {saved, "float[...]"}},
                            .outputs = {{"dx", "float[...]"}}},
              .in_place_inputs = {0, 1}});
}

}  // namespace

Var Add(Var a, Var b) { return a.builder()->Emit1("add", {a, b}); }
Var Sub(Var a, Var b) { return a.builder()->Emit1("sub", {a, b}); }
Var Mul(Var a, Var b) { return a.builder()->Emit1("mul", {a, b}); }
Var Div(Var a, Var b) { return a.builder()->Emit1("div", {a, b}); }
Var Scale(Var x, double factor) { return x.builder()->Emit1("scale", {x}, {{"factor", factor}}); }
Var Neg(Var x) { return x.builder()->Emit1("neg", {x}); }
Var Relu(Var x) { return x.builder()->Emit1("relu", {x}); }
Var Gelu(Var x) { return x.builder()->Emit1("gelu", {x}); }
Var Silu(Var x) { return x.builder()->Emit1("silu", {x}); }
Var GeluErf(Var x) { return x.builder()->Emit1("gelu_erf", {x}); }
Var Tanh(Var x) { return x.builder()->Emit1("tanh", {x}); }
Var Sigmoid(Var x) { return x.builder()->Emit1("sigmoid", {x}); }
Var Exp(Var x) { return x.builder()->Emit1("exp", {x}); }
Var Log(Var x) { return x.builder()->Emit1("log", {x}); }
Var Sqrt(Var x) { return x.builder()->Emit1("sqrt", {x}); }
Var LeakyRelu(Var x, double slope) {
  return x.builder()->Emit1("leaky_relu", {x}, {{"slope", slope}});
}
Var Softplus(Var x, double beta, double threshold) {
  return x.builder()->Emit1("softplus", {x}, {{"beta", beta}, {"threshold", threshold}});
}
Var Hardtanh(Var x, double min_val, double max_val) {
  return x.builder()->Emit1("hardtanh", {x}, {{"min_val", min_val}, {"max_val", max_val}});
}
Var HardtanhGrad(Var dy, Var y, double min_val, double max_val) {
  return dy.builder()->Emit1("hardtanh_grad", {dy, y},
                             {{"min_val", min_val}, {"max_val", max_val}});
}
Var LeakyReluGrad(Var dy, Var x, double slope) {
  return dy.builder()->Emit1("leaky_relu_grad", {dy, x}, {{"slope", slope}});
}
Var SoftplusGrad(Var dy, Var x, double beta, double threshold) {
  return dy.builder()->Emit1("softplus_grad", {dy, x}, {{"beta", beta}, {"threshold", threshold}});
}
Var ReluGrad(Var dy, Var s) { return dy.builder()->Emit1("relu_grad", {dy, s}); }
Var GeluGrad(Var dy, Var x) { return dy.builder()->Emit1("gelu_grad", {dy, x}); }
Var TanhGrad(Var dy, Var y) { return dy.builder()->Emit1("tanh_grad", {dy, y}); }
Var SigmoidGrad(Var dy, Var y) { return dy.builder()->Emit1("sigmoid_grad", {dy, y}); }
Var SiluGrad(Var dy, Var x) { return dy.builder()->Emit1("silu_grad", {dy, x}); }
Var GeluErfGrad(Var dy, Var x) { return dy.builder()->Emit1("gelu_erf_grad", {dy, x}); }
Var Swiglu(Var a, Var b) { return a.builder()->Emit1("swiglu", {a, b}); }
std::vector<Var> SwigluGrad(Var dy, Var a, Var b) {
  return dy.builder()->Emit("swiglu_grad", {dy, a, b});
}

Var Full(Builder& b, const Shape& shape, double value, DType dtype) {
  return b.Emit1("full", {},
                 {{"dtype", std::string(Name(dtype))},
                  {"shape", ops::ShapeToVector(shape)},
                  {"value", value}});
}
Var Zeros(Builder& b, const Shape& shape, DType dtype) { return Full(b, shape, 0.0, dtype); }
Var Ones(Builder& b, const Shape& shape, DType dtype) { return Full(b, shape, 1.0, dtype); }

Var Cast(Var x, DType dtype) {
  if (x.dtype() == dtype) return x;
  return x.builder()->Emit1("cast", {x}, {{"dtype", std::string(Name(dtype))}});
}

Var Copy(Var x) { return x.builder()->Emit1("copy", {x}); }

void RegisterElementwiseOps(OpRegistry& r) {
  r.Register({.name = "accumulate",
              .kind = OpKind::kInPlace,
              .num_inputs = 2,
              .infer = InferAccumulate,
              .kernel = AccumulateKernel<true>,
              .reference = AccumulateKernel<false>,
              .doc = "acc += x elementwise, in place: a gradient added into its accumulated buffer "
                     "(autodiff's AccumulateGradients)",
              .signature = {.inputs = {{"acc", "float[...]"}, {"x", "float[...]"}}},
              .updates = {0}});
  RegisterBinary(r, "add", BinaryKernel<std::plus<>, true>, BinaryKernel<std::plus<>, false>,
                 AddVjp, "a + b with broadcasting; bf16 a and b give bf16, computed in f32",
                 /*bf16=*/true);
  RegisterBinary(r, "sub", BinaryKernel<std::minus<>, true>, BinaryKernel<std::minus<>, false>,
                 SubVjp, "a - b with broadcasting");
  RegisterBinary(r, "mul", BinaryKernel<std::multiplies<>, true>,
                 BinaryKernel<std::multiplies<>, false>, MulVjp,
                 "a * b with broadcasting; bf16 a and b give bf16, computed in f32", /*bf16=*/true);
  RegisterBinary(r, "div", BinaryKernel<std::divides<>, true>, BinaryKernel<std::divides<>, false>,
                 DivVjp, "a / b with broadcasting");

  r.Register({.name = "scale",
              .num_inputs = 1,
              .infer = InferScale,
              .kernel = ScaleKernel,
              .vjp = ScaleVjp,
              .recomputable = true,
              .doc = "factor · x",
              .signature = {.inputs = {{"x", "float[...]"}},
                            .attrs = {{"factor", "float"}},
                            .outputs = {{"y", "float[...]"}}},
              .in_place_inputs = {0}});
  RegisterUnary(r, "neg", UnaryKernel<kernels::Neg<float>, kernels::Neg<double>>, nullptr, NegVjp,
                "-x", /*recomputable=*/true);
  RegisterUnary(r, "relu", UnaryKernel<kernels::Relu<float>, kernels::Relu<double>>, nullptr,
                ReluVjp, "max(x, 0)", /*recomputable=*/true);
  r.Register(
      {.name = "gelu",
       .num_inputs = 1,
       .infer = InferGelu,
       .kernel = GeluKernel<true>,
       .reference = GeluKernel<false>,
       .vjp = GeluVjp,
       .recomputable = true,
       .doc = "GELU, tanh approximation (PyTorch gelu(approximate='tanh')); bf16 x gives "
              "bf16 y, computed in f32",
       .signature = {.inputs = {{"x", "float or bf16[...]"}}, .outputs = {{"y", "x's dtype[...]"}}},
       .in_place_inputs = {0}});
  RegisterUnary(r, "gelu_erf", UnaryKernel<kernels::GeluErf<float>, kernels::GeluErf<double>>,
                nullptr, GeluErfVjp,
                "GELU, exact: 0.5·x·(1 + erf(x/√2)) (PyTorch gelu(approximate='none'))",
                /*recomputable=*/true);
  RegisterUnary(r, "silu", UnaryKernel<kernels::SiluFast<float>, kernels::SiluFast<double>>,
                UnaryKernel<kernels::SiluReference<float>, kernels::SiluReference<double>>, SiluVjp,
                "SiLU (swish): x·sigmoid(x) = x / (1 + e^-x)", /*recomputable=*/true);
  RegisterUnary(r, "tanh", UnaryKernel<kernels::TanhFast<float>, kernels::TanhFast<double>>,
                UnaryKernel<kernels::TanhReference<float>, kernels::TanhReference<double>>, TanhVjp,
                "tanh(x)", /*recomputable=*/true);
  RegisterUnary(
      r, "sigmoid", UnaryKernel<kernels::SigmoidFast<float>, kernels::SigmoidFast<double>>,
      UnaryKernel<kernels::SigmoidReference<float>, kernels::SigmoidReference<double>>, SigmoidVjp,
      "sigmoid: 1 / (1 + e^-x) (PyTorch sigmoid; 0 where e^-x overflows); its gradient reads y "
      "alone",
      /*recomputable=*/true);
  RegisterUnary(r, "exp", UnaryKernel<kernels::ExpFast<float>, kernels::ExpFast<double>>,
                UnaryKernel<kernels::ExpReference<float>, kernels::ExpReference<double>>, ExpVjp,
                "e^x");
  RegisterUnary(r, "log", UnaryKernel<kernels::Log<float>, kernels::Log<double>>, nullptr, LogVjp,
                "natural logarithm");
  RegisterUnary(r, "sqrt", UnaryKernel<kernels::Sqrt<float>, kernels::Sqrt<double>>, nullptr,
                SqrtVjp, "square root");

  r.Register({.name = "swiglu",
              .num_inputs = 2,
              .infer = InferSwiglu,
              .kernel = SwigluKernel<true>,
              .reference = SwigluKernel<false>,
              .vjp = SwigluVjp,
              .recomputable = true,
              .doc = "SwiGLU gate silu(a)·b (Llama's MLP); backward recomputes silu from a, so "
                     "a and b are all it keeps; bf16 a and b give bf16 y, computed in f32",
              .signature = {.inputs = {{"a", "float or bf16[...]"}, {"b", "a's dtype[...]"}},
                            .outputs = {{"y", "a's dtype[...]"}}},
              .in_place_inputs = {0, 1}});
  r.Register(
      {.name = "swiglu_grad",
       .num_inputs = 3,
       .infer = InferSwigluGrad,
       .kernel = SwigluGradKernel<true>,
       .reference = SwigluGradKernel<false>,
       .doc = "swiglu gradient: da = dy·b·silu'(a), db = dy·silu(a); bf16 a, b: f32 dy, da, db, "
              "or bf16 da, db with dtype = \"bf16\" (rounded as they are stored)",
       .signature = {
           .inputs = {{"dy", "float[...]"}, {"a", "float or bf16[...]"}, {"b", "a's dtype[...]"}},
           .attrs = {{"dtype", "string = dy's dtype"}},
           .outputs = {{"da", "float or bf16[...]"}, {"db", "da's dtype[...]"}}}});

  r.Register({.name = "leaky_relu",
              .num_inputs = 1,
              .infer = InferUnary,
              .kernel = LeakyReluKernel,
              .vjp = LeakyReluVjp,
              .recomputable = true,
              .doc = "x where x > 0, slope·x elsewhere (PyTorch leaky_relu, negative_slope)",
              .signature = {.inputs = {{"x", "float[...]"}},
                            .attrs = {{"slope", "float = 0.01"}},
                            .outputs = {{"y", "float[...]"}}},
              .in_place_inputs = {0}});
  r.Register({.name = "hardtanh",
              .num_inputs = 1,
              .infer = InferHardtanh,
              .kernel = HardtanhKernel,
              .vjp = HardtanhVjp,
              .recomputable = true,
              .doc = "x clamped to [min_val, max_val] (PyTorch hardtanh; ReLU6 is [0, 6])",
              .signature = {.inputs = {{"x", "float[...]"}},
                            .attrs = {{"min_val", "float = -1"}, {"max_val", "float = 1"}},
                            .outputs = {{"y", "float[...]"}}},
              .in_place_inputs = {0}});
  r.Register({.name = "hardtanh_grad",
              .num_inputs = 2,
              .infer = InferHardtanhGrad,
              .kernel = HardtanhGradKernel,
              .doc = "hardtanh gradient: dy where min_val < y < max_val (y hardtanh's output), "
                     "else 0",
              .signature = {.inputs = {{"dy", "float[...]"}, {"y", "float[...]"}},
                            .attrs = {{"min_val", "float = -1"}, {"max_val", "float = 1"}},
                            .outputs = {{"dx", "float[...]"}}},
              .in_place_inputs = {0, 1}});
  r.Register({.name = "softplus",
              .num_inputs = 1,
              .infer = InferSoftplus,
              .kernel = SoftplusKernel,
              .vjp = SoftplusVjp,
              .recomputable = true,
              .doc = "log(1 + e^(beta·x)) / beta, x where beta·x > threshold (PyTorch softplus)",
              .signature = {.inputs = {{"x", "float[...]"}},
                            .attrs = {{"beta", "float = 1"}, {"threshold", "float = 20"}},
                            .outputs = {{"y", "float[...]"}}},
              .in_place_inputs = {0}});
  r.Register({.name = "leaky_relu_grad",
              .num_inputs = 2,
              .infer = InferUnaryGrad,
              .kernel = LeakyReluGradKernel,
              .doc = "leaky_relu gradient: dy where x > 0, slope·dy elsewhere",
              .signature = {.inputs = {{"dy", "float[...]"}, {"x", "float[...]"}},
                            .attrs = {{"slope", "float = 0.01"}},
                            .outputs = {{"dx", "float[...]"}}},
              .in_place_inputs = {0, 1}});
  r.Register({.name = "softplus_grad",
              .num_inputs = 2,
              .infer = InferSoftplusGrad,
              .kernel = SoftplusGradKernel,
              .doc = "softplus gradient: dy·sigmoid(beta·x), dy where beta·x > threshold",
              .signature = {.inputs = {{"dy", "float[...]"}, {"x", "float[...]"}},
                            .attrs = {{"beta", "float = 1"}, {"threshold", "float = 20"}},
                            .outputs = {{"dx", "float[...]"}}},
              .in_place_inputs = {0, 1}});
  RegisterUnaryGrad(r, "relu_grad", "s",
                    UnaryGradKernel<kernels::ReluGrad<float>, kernels::ReluGrad<double>>, nullptr,
                    "relu gradient: dy where s (relu's input or output) is > 0, else 0");
  r.Register({.name = "gelu_grad",
              .num_inputs = 2,
              .infer = InferGeluGrad,
              .kernel = GeluGradKernel<true>,
              .reference = GeluGradKernel<false>,
              .doc = "gelu gradient: dy · gelu'(x); bf16 x takes an f32 dy and gives an f32 dx",
              .signature = {.inputs = {{"dy", "float[...]"}, {"x", "float or bf16[...]"}},
                            .outputs = {{"dx", "float[...]"}}},
              .in_place_inputs = {0, 1}});
  RegisterUnaryGrad(
      r, "silu_grad", "x",
      UnaryGradKernel<kernels::SiluGradFast<float>, kernels::SiluGradFast<double>>,
      UnaryGradKernel<kernels::SiluGradReference<float>, kernels::SiluGradReference<double>>,
      "silu gradient: dy · sigmoid(x)·(1 + x·(1 − sigmoid(x)))");
  RegisterUnaryGrad(r, "gelu_erf_grad", "x",
                    UnaryGradKernel<kernels::GeluErfGrad<float>, kernels::GeluErfGrad<double>>,
                    nullptr, "exact gelu gradient: dy · (Φ(x) + x·φ(x))");
  RegisterUnaryGrad(r, "tanh_grad", "y",
                    UnaryGradKernel<kernels::TanhGrad<float>, kernels::TanhGrad<double>>, nullptr,
                    "tanh gradient from the output y: dy · (1 − y²)");
  RegisterUnaryGrad(r, "sigmoid_grad", "y",
                    UnaryGradKernel<kernels::SigmoidGrad<float>, kernels::SigmoidGrad<double>>,
                    nullptr, "sigmoid gradient from the output y: dy · y·(1 − y)");

  r.Register({.name = "full",
              .num_inputs = 0,
              .infer = InferFull,
              .kernel = FullKernel,
              .doc =
                  "a new tensor of the given shape and dtype (f32, f64, i32 or i64), every element "
                  "value",
              .signature = {.attrs = {{"dtype", "string"}, {"shape", "ints"}, {"value", "float"}},
                            .outputs = {{"y", "dtype[shape]"}}}});
  r.Register({.name = "cast",
              .num_inputs = 1,
              .infer = InferCast,
              .kernel = CastKernel<true>,
              .reference = CastKernel<false>,
              .vjp = CastVjp,
              // A bf16 copy a backward product reads is remade from its input, as the layer norm
              // or GELU giving that input is, so `--recompute cheap` saves what fp32 saves.
              .recomputable = true,
              .doc = "x converted to dtype: f32 <-> f64, f32 <-> bf16 (rounded to nearest even), "
                     "i32 or i64 -> f32 or f64; the gradient is cast back (f32 across bf16)",
              .signature = {.inputs = {{"x", "f32, f64, bf16, i32 or i64[...]"}},
                            .attrs = {{"dtype", "string"}},
                            .outputs = {{"y", "dtype[...]"}}}});
  r.Register({.name = "copy",
              .num_inputs = 1,
              .infer = InferSame,
              .kernel = CopyKernel,
              .vjp = CopyVjp,
              .doc = "a copy of x in fresh memory",
              .signature = {.inputs = {{"x", "any[...]"}}, .outputs = {{"y", "any[...]"}}}});
}

}  // namespace sluice
