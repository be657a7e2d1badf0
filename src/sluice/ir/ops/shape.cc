// Shape ops: registration, inference, kernels and VJP rules.
#include "sluice/ir/ops/shape.h"

#include "sluice/ir/ops.h"
#include "sluice/ir/ops/common.h"

namespace sluice {

namespace {

std::vector<TensorType> InferReshape(std::span<const TensorType> in, const Attrs& attrs) {
  std::vector<int64_t> dims = attrs.GetInts("shape");
  int64_t known = 1;
  int inferred = -1;
  for (size_t i = 0; i < dims.size(); ++i) {
    if (dims[i] == -1) {
      if (inferred >= 0) throw ShapeError("only one dimension may be -1");
      inferred = static_cast<int>(i);
    } else if (dims[i] < 0) {
      throw ShapeError(fmt::format("dimension {} is negative", dims[i]));
    } else {
      known *= dims[i];
    }
  }
  const int64_t n = in[0].shape.numel();
  if (inferred >= 0) {
    if (known == 0 || n % known != 0) throw ShapeError(fmt::format("cannot infer -1 for {} elements", n));
    dims[inferred] = n / known;
  }
  Shape out(std::span<const int64_t>(dims.data(), dims.size()));
  if (out.numel() != n) {
    throw ShapeError(fmt::format("{} has {} elements, {} has {}", in[0].shape.ToString(), n,
                                 out.ToString(), out.numel()));
  }
  return {{in[0].dtype, out}};
}

void ReshapeKernel(KernelContext& ctx) {
  const std::vector<int64_t>& dims = ctx.attrs.GetInts("shape");
  ctx.outputs[0] = ctx.inputs[0].Reshape(std::span<const int64_t>(dims));
}

std::vector<Var> ReshapeVjp(VjpContext& ctx) {
  return {Reshape(ctx.dy(0), ops::ShapeToVector(ctx.x_type(0).shape))};
}

std::vector<TensorType> InferTranspose(std::span<const TensorType> in, const Attrs& attrs) {
  Shape s = in[0].shape;
  int a = s.Axis(attrs.GetInt("dim0")), b = s.Axis(attrs.GetInt("dim1"));
  std::swap(s[a], s[b]);
  return {{in[0].dtype, s}};
}

void TransposeKernel(KernelContext& ctx) {
  ctx.outputs[0].CopyFrom(ctx.inputs[0].Transpose(ctx.attrs.GetInt("dim0"), ctx.attrs.GetInt("dim1")));
}

std::vector<Var> TransposeVjp(VjpContext& ctx) {
  return {Transpose(ctx.dy(0), ctx.attrs().GetInt("dim0"), ctx.attrs().GetInt("dim1"))};
}

}  // namespace

Var Transpose(Var x, int64_t dim0, int64_t dim1) {
  return x.builder()->Emit1("transpose", {x}, {{"dim0", dim0}, {"dim1", dim1}});
}

Var Reshape(Var x, const std::vector<int64_t>& dims) {
  return x.builder()->Emit1("reshape", {x}, {{"shape", dims}});
}

void RegisterShapeOps(OpRegistry& r) {
  r.Register({.name = "reshape",
              .kind = OpKind::kView,
              .num_inputs = 1,
              .infer = InferReshape,
              .kernel = ReshapeKernel,
              .vjp = ReshapeVjp,
              .doc = "same elements, new shape (a view)"});
  r.Register({.name = "transpose",
              .num_inputs = 1,
              .infer = InferTranspose,
              .kernel = TransposeKernel,
              .vjp = TransposeVjp,
              .doc = "swap axes dim0 and dim1 (a contiguous copy)"});
}

}  // namespace sluice
