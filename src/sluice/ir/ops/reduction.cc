// Reductions: registration, inference, kernels and VJP rules.
#include "sluice/ir/ops/reduction.h"

#include "sluice/ir/ops.h"
#include "sluice/ir/ops/common.h"
#include "sluice/kernels/broadcast.h"

namespace sluice {

namespace {

Shape ShapeAttr(const Attrs& attrs) {
  const std::vector<int64_t>& dims = attrs.GetInts("shape");
  return Shape(std::span<const int64_t>(dims));
}

// sum_to: x [broadcast of S] -> [S]. broadcast_to: x [S] -> [broadcast of S].
std::vector<TensorType> InferSumTo(std::span<const TensorType> in, const Attrs& attrs) {
  Shape target = ShapeAttr(attrs);
  if (Broadcast(target, in[0].shape) != in[0].shape) {
    throw ShapeError(fmt::format("{} does not broadcast to {}", target.ToString(), in[0].shape.ToString()));
  }
  return {{ops::SameFloatDType(in), target}};
}

std::vector<TensorType> InferBroadcastTo(std::span<const TensorType> in, const Attrs& attrs) {
  Shape target = ShapeAttr(attrs);
  if (Broadcast(in[0].shape, target) != target) {
    throw ShapeError(fmt::format("{} does not broadcast to {}", in[0].shape.ToString(), target.ToString()));
  }
  return {{ops::SameFloatDType(in), target}};
}

// Both kernels walk the large (broadcast) shape once; the small tensor is addressed with stride 0
// on stretched axes. sum_to accumulates into a zeroed output in that fixed order, so results are
// deterministic.
void SumToKernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const Tensor& y = ctx.outputs[0];
  DispatchFloat(x.dtype(), "sum_to", [&]<typename T>() {
    const T* px = x.data<T>();
    T* py = y.data<T>();
    for (int64_t i = 0, n = y.numel(); i < n; ++i) py[i] = T(0);
    const Strides sx = x.shape().ContiguousStrides();
    const Strides sy = kernels::BroadcastStrides(y.shape(), x.shape());
    kernels::ForEachBroadcast(x.shape(), sx, sy, [&](int64_t, int64_t ix, int64_t iy) { py[iy] += px[ix]; });
  });
}

void BroadcastToKernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const Tensor& y = ctx.outputs[0];
  DispatchFloat(x.dtype(), "broadcast_to", [&]<typename T>() {
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const Strides sx = kernels::BroadcastStrides(x.shape(), y.shape());
    kernels::ForEachBroadcast(y.shape(), sx, sx, [&](int64_t o, int64_t ix, int64_t) { py[o] = px[ix]; });
  });
}

std::vector<Var> SumToVjp(VjpContext& ctx) { return {BroadcastTo(ctx.dy(0), ctx.x_type(0).shape)}; }
std::vector<Var> BroadcastToVjp(VjpContext& ctx) { return {SumTo(ctx.dy(0), ctx.x_type(0).shape)}; }

}  // namespace

Var SumTo(Var x, const Shape& shape) {
  if (x.shape() == shape) return x;
  return x.builder()->Emit1("sum_to", {x}, {{"shape", ops::ShapeToVector(shape)}});
}

Var BroadcastTo(Var x, const Shape& shape) {
  if (x.shape() == shape) return x;
  return x.builder()->Emit1("broadcast_to", {x}, {{"shape", ops::ShapeToVector(shape)}});
}

void RegisterReductionOps(OpRegistry& r) {
  r.Register({.name = "sum_to",
              .num_inputs = 1,
              .infer = InferSumTo,
              .kernel = SumToKernel,
              .vjp = SumToVjp,
              .doc = "sum over broadcast axes down to attribute shape"});
  r.Register({.name = "broadcast_to",
              .num_inputs = 1,
              .infer = InferBroadcastTo,
              .kernel = BroadcastToKernel,
              .vjp = BroadcastToVjp,
              .doc = "repeat along stretched axes up to attribute shape"});
}

}  // namespace sluice
