// Reductions: registration, inference and VJP rules. Kernels: kernels/reduce.h (sum, mean, the
// fast sum_to) and kernels/broadcast.h (the plain sum_to, broadcast_to).
#include "sluice/ir/ops/reduction.h"

#include "sluice/ir/ops.h"
#include "sluice/ir/ops/common.h"
#include "sluice/kernels/broadcast.h"
#include "sluice/kernels/reduce.h"
#include "sluice/kernels/simd.h"

namespace sluice {

namespace {

using kernels::AxisSet;

// ---- sum, mean ----

// The axes attribute as a set of axes of `shape` (absent or empty: all). Throws ShapeError for an
// axis out of range or listed twice.
AxisSet ReducedAxes(const Shape& shape, const Attrs& attrs) {
  AxisSet set;
  const std::vector<int64_t> all;
  const std::vector<int64_t>& axes = attrs.Has("axes") ? attrs.GetInts("axes") : all;
  if (axes.empty()) {
    for (int d = 0; d < shape.rank(); ++d) set.set(d);
    return set;
  }
  for (int64_t a : axes) {
    const int d = shape.Axis(a);
    if (set[d]) {
      throw ShapeError(
          fmt::format("axis {} is listed twice in axes [{}]", a, fmt::join(axes, ", ")));
    }
    set.set(d);
  }
  return set;
}

// x's shape with the reduced axes set to 1 (keepdims) or removed.
Shape ReducedShape(const Shape& shape, AxisSet reduced, bool keepdims) {
  std::vector<int64_t> dims;
  for (int d = 0; d < shape.rank(); ++d) {
    if (!reduced[d]) {
      dims.push_back(shape[d]);
    } else if (keepdims) {
      dims.push_back(1);
    }
  }
  return Shape(std::span<const int64_t>(dims));
}

std::vector<TensorType> InferReduce(std::span<const TensorType> in, const Attrs& attrs) {
  const DType t = ops::SameFloatDType(in);
  const AxisSet reduced = ReducedAxes(in[0].shape, attrs);
  return {{t, ReducedShape(in[0].shape, reduced, attrs.GetBool("keepdims", false))}};
}

// sum and mean share a kernel: mean scales the sums by 1/count afterwards.
template <bool kMean, bool kFast>
void ReduceKernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const Tensor& y = ctx.outputs[0];
  const AxisSet reduced = ReducedAxes(x.shape(), ctx.attrs);
  DispatchFloat(x.dtype(), kMean ? "mean" : "sum", [&]<typename T>() {
    T* py = y.data<T>();
    const int64_t count = kernels::ReducedCount(x.shape(), reduced);
    if constexpr (kFast) {
      kernels::SumFast<T>(x.data<T>(), x.shape(), reduced, py);
      if constexpr (kMean) {
        const T inv = T(1) / static_cast<T>(count);
        kernels::ForEachBlocked(y.numel(), [&](int64_t i) { py[i] *= inv; });
      }
    } else {
      kernels::SumReference<T>(x.data<T>(), x.shape(), reduced, py);
      if constexpr (kMean) {
        for (int64_t i = 0; i < y.numel(); ++i) py[i] /= static_cast<T>(count);
      }
    }
  });
}

// dx = dy (scaled by 1/count for mean) reshaped to the keepdims shape and broadcast to x's shape.
template <bool kMean>
std::vector<Var> ReduceVjp(VjpContext& ctx) {
  const Shape& x_shape = ctx.x_type(0).shape;
  const AxisSet reduced = ReducedAxes(x_shape, ctx.attrs());
  Var g = ctx.dy(0);
  if constexpr (kMean) {
    g = Scale(g, 1.0 / static_cast<double>(kernels::ReducedCount(x_shape, reduced)));
  }
  const Shape kept = ReducedShape(x_shape, reduced, /*keepdims=*/true);
  if (g.shape() != kept) g = Reshape(g, ops::ShapeToVector(kept));
  return {BroadcastTo(g, x_shape)};
}

// ---- sum_to, broadcast_to ----

Shape ShapeAttr(const Attrs& attrs) {
  const std::vector<int64_t>& dims = attrs.GetInts("shape");
  return Shape(std::span<const int64_t>(dims));
}

// sum_to: x [broadcast of S] -> [S]. broadcast_to: x [S] -> [broadcast of S].
std::vector<TensorType> InferSumTo(std::span<const TensorType> in, const Attrs& attrs) {
  Shape target = ShapeAttr(attrs);
  if (Broadcast(target, in[0].shape) != in[0].shape) {
    throw ShapeError(
        fmt::format("{} does not broadcast to {}", target.ToString(), in[0].shape.ToString()));
  }
  return {{ops::SameFloatDType(in), target}};
}

std::vector<TensorType> InferBroadcastTo(std::span<const TensorType> in, const Attrs& attrs) {
  Shape target = ShapeAttr(attrs);
  if (Broadcast(in[0].shape, target) != target) {
    throw ShapeError(
        fmt::format("{} does not broadcast to {}", in[0].shape.ToString(), target.ToString()));
  }
  return {{ops::SameFloatDType(in), target}};
}

// sum_to as a reduction of x over its leading axes and the axes where the target has size 1.
void SumToFastKernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const Tensor& y = ctx.outputs[0];
  AxisSet reduced;
  const int lead = x.rank() - y.rank();
  for (int d = 0; d < x.rank(); ++d)
    reduced[d] = d < lead || (y.shape()[d - lead] == 1 && x.shape()[d] != 1);
  DispatchFloat(x.dtype(), "sum_to", [&]<typename T>() {
    kernels::SumFast<T>(x.data<T>(), x.shape(), reduced, y.data<T>());
  });
}

// The reference kernels walk the large (broadcast) shape once; the small tensor is addressed with
// stride 0 on stretched axes. sum_to accumulates into a zeroed output in that fixed order, so
// results are deterministic.
void SumToKernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const Tensor& y = ctx.outputs[0];
  DispatchFloat(x.dtype(), "sum_to", [&]<typename T>() {
    const T* px = x.data<T>();
    T* py = y.data<T>();
    for (int64_t i = 0, n = y.numel(); i < n; ++i) py[i] = T(0);
    const Strides sx = x.shape().ContiguousStrides();
    const Strides sy = kernels::BroadcastStrides(y.shape(), x.shape());
    kernels::ForEachBroadcast(x.shape(), sx, sy,
                              [&](int64_t, int64_t ix, int64_t iy) { py[iy] += px[ix]; });
  });
}

void BroadcastToKernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const Tensor& y = ctx.outputs[0];
  DispatchFloat(x.dtype(), "broadcast_to", [&]<typename T>() {
    const T* px = x.data<T>();
    T* py = y.data<T>();
    const Strides sx = kernels::BroadcastStrides(x.shape(), y.shape());
    kernels::ForEachBroadcast(y.shape(), sx, sx,
                              [&](int64_t o, int64_t ix, int64_t) { py[o] = px[ix]; });
  });
}

std::vector<Var> SumToVjp(VjpContext& ctx) { return {BroadcastTo(ctx.dy(0), ctx.x_type(0).shape)}; }
std::vector<Var> BroadcastToVjp(VjpContext& ctx) { return {SumTo(ctx.dy(0), ctx.x_type(0).shape)}; }

}  // namespace

Var Sum(Var x, const std::vector<int64_t>& axes, bool keepdims) {
  return x.builder()->Emit1("sum", {x}, {{"axes", axes}, {"keepdims", keepdims}});
}

Var Mean(Var x, const std::vector<int64_t>& axes, bool keepdims) {
  return x.builder()->Emit1("mean", {x}, {{"axes", axes}, {"keepdims", keepdims}});
}

Var SumTo(Var x, const Shape& shape) {
  if (x.shape() == shape) return x;
  return x.builder()->Emit1("sum_to", {x}, {{"shape", ops::ShapeToVector(shape)}});
}

Var BroadcastTo(Var x, const Shape& shape) {
  if (x.shape() == shape) return x;
  return x.builder()->Emit1("broadcast_to", {x}, {{"shape", ops::ShapeToVector(shape)}});
}

void RegisterReductionOps(OpRegistry& r) {
  const OpSignature reduce_signature = {
      .inputs = {{"x", "float[...]"}},
      .attrs = {{"axes", "ints = []"}, {"keepdims", "bool = false"}},
      .outputs = {{"y", "float[...]"}}};
  r.Register({.name = "sum",
              .num_inputs = 1,
              .infer = InferReduce,
              .kernel = ReduceKernel<false, true>,
              .reference = ReduceKernel<false, false>,
              .vjp = ReduceVjp<false>,
              .doc = "sum over axes (none given: all), keeping them as size 1 with keepdims",
              .signature = reduce_signature});
  r.Register({.name = "mean",
              .num_inputs = 1,
              .infer = InferReduce,
              .kernel = ReduceKernel<true, true>,
              .reference = ReduceKernel<true, false>,
              .vjp = ReduceVjp<true>,
              .doc = "mean over axes (none given: all), keeping them as size 1 with keepdims",
              .signature = reduce_signature});
  r.Register({.name = "sum_to",
              .num_inputs = 1,
              .infer = InferSumTo,
              .kernel = SumToFastKernel,
              .reference = SumToKernel,
              .vjp = SumToVjp,
              .doc = "sum over the axes broadcasting stretched, down to shape (broadcast_to's "
                     "gradient)",
              .signature = {.inputs = {{"x", "float[...]"}},
                            .attrs = {{"shape", "ints"}},
                            .outputs = {{"y", "float[shape]"}}}});
  r.Register({.name = "broadcast_to",
              .num_inputs = 1,
              .infer = InferBroadcastTo,
              .kernel = BroadcastToKernel,
              .vjp = BroadcastToVjp,
              .doc = "x repeated along the axes it stretches to shape (NumPy broadcast_to, a copy)",
              .signature = {.inputs = {{"x", "float[...]"}},
                            .attrs = {{"shape", "ints"}},
                            .outputs = {{"y", "float[shape]"}}}});
}

}  // namespace sluice
