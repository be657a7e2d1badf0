// Elementwise ops: registration, inference and VJP rules. Kernels live in kernels/.
#include "sluice/ir/ops/elementwise.h"

#include <algorithm>
#include <optional>

#include "sluice/ir/ops.h"
#include "sluice/ir/ops/common.h"
#include "sluice/kernels/binary.h"

namespace sluice {

namespace {

std::vector<TensorType> InferBroadcastBinary(std::span<const TensorType> in, const Attrs&) {
  DType t = ops::SameFloatDType(in);
  return {{t, Broadcast(in[0].shape, in[1].shape)}};
}

struct AddOp {
  template <typename T>
  T operator()(T a, T b) const { return a + b; }
};

template <typename Op, bool kFast>
void BinaryKernel(KernelContext& ctx) {
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

std::vector<TensorType> InferFull(std::span<const TensorType>, const Attrs& attrs) {
  const std::vector<int64_t>& dims = attrs.GetInts("shape");
  std::optional<DType> t = ParseDType(attrs.GetString("dtype"));
  if (!t) throw ShapeError(fmt::format("unknown dtype '{}'", attrs.GetString("dtype")));
  attrs.GetFloat("value");
  return {{*t, Shape(std::span<const int64_t>(dims))}};
}

void FullKernel(KernelContext& ctx) {
  const Tensor& out = ctx.outputs[0];
  const double value = ctx.attrs.GetFloat("value");
  switch (out.dtype()) {
    case DType::kF32: std::fill_n(out.data<float>(), out.numel(), static_cast<float>(value)); break;
    case DType::kF64: std::fill_n(out.data<double>(), out.numel(), value); break;
    case DType::kI32: std::fill_n(out.data<int32_t>(), out.numel(), static_cast<int32_t>(value)); break;
    case DType::kI64: std::fill_n(out.data<int64_t>(), out.numel(), static_cast<int64_t>(value)); break;
    default: throw ShapeError(fmt::format("full: cannot fill dtype {}", Name(out.dtype())));
  }
}

std::vector<TensorType> InferSame(std::span<const TensorType> in, const Attrs&) { return {in[0]}; }

void CopyKernel(KernelContext& ctx) { ctx.outputs[0].CopyFrom(ctx.inputs[0]); }

std::vector<Var> CopyVjp(VjpContext& ctx) { return {ctx.dy(0)}; }

}  // namespace

Var Full(Builder& b, const Shape& shape, double value, DType dtype) {
  return b.Emit1("full", {}, {{"dtype", std::string(Name(dtype))}, {"shape", ops::ShapeToVector(shape)}, {"value", value}});
}

Var Copy(Var x) { return x.builder()->Emit1("copy", {x}); }

Var Add(Var a, Var b) { return a.builder()->Emit1("add", {a, b}); }

void RegisterElementwiseOps(OpRegistry& r) {
  r.Register({.name = "add",
              .kind = OpKind::kCompute,
              .num_inputs = 2,
              .infer = InferBroadcastBinary,
              .kernel = BinaryKernel<AddOp, true>,
              .reference = BinaryKernel<AddOp, false>,
              .vjp = AddVjp,
              .doc = "a + b with broadcasting"});
  r.Register({.name = "full",
              .num_inputs = 0,
              .infer = InferFull,
              .kernel = FullKernel,
              .doc = "a new tensor of attribute shape and dtype filled with attribute value"});
  r.Register({.name = "copy",
              .num_inputs = 1,
              .infer = InferSame,
              .kernel = CopyKernel,
              .vjp = CopyVjp,
              .doc = "a copy of the input in fresh memory"});
}

}  // namespace sluice
