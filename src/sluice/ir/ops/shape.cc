// Shape ops: registration, inference, kernels and VJP rules. The copying kernels are
// kernels::CopyStrided (fast) and Tensor::CopyFrom (reference) over views of the input or output.
#include "sluice/ir/ops/shape.h"

#include "sluice/ir/gradient_type.h"
#include "sluice/ir/ops.h"
#include "sluice/ir/ops/common.h"
#include "sluice/kernels/copy.h"

namespace sluice {

namespace {

// Copies src (a strided view) into dst with the fast or the reference kernel.
template <bool kFast>
void CopyView(const Tensor& src, const Tensor& dst) {
  if constexpr (kFast) {
    kernels::CopyStrided(src, dst);
  } else {
    dst.CopyFrom(src);
  }
}

// True when a piece cut along `axis` is one contiguous range of x: every axis before it has size 1.
// False for an axis out of range (inference then reports it).
bool IsContiguousRange(const Shape& s, int64_t axis) {
  const int64_t a = axis < 0 ? axis + s.rank() : axis;
  if (a < 0 || a >= s.rank()) return false;
  for (int d = 0; d < a; ++d) {
    if (s[d] != 1) return false;
  }
  return true;
}

void CheckContiguousRange(const Shape& s, int axis, std::string_view op) {
  if (!IsContiguousRange(s, axis)) {
    throw ShapeError(
        fmt::format("{} of {} along axis {} is not one contiguous range (axes before {} "
                    "must have size 1); use {}",
                    op, s.ToString(), axis, axis, op.substr(0, op.find('_'))));
  }
}

// ---- reshape ----

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
    } else if (__builtin_mul_overflow(known, dims[i], &known)) {
      throw ShapeError(
          fmt::format("shape [{}] has more elements than int64 can count", fmt::join(dims, ", ")));
    }
  }
  const int64_t n = in[0].shape.numel();
  if (inferred >= 0) {
    if (known == 0 || n % known != 0)
      throw ShapeError(fmt::format("cannot infer -1 for {} elements", n));
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

// ---- transpose, permute ----

std::vector<TensorType> InferTranspose(std::span<const TensorType> in, const Attrs& attrs) {
  Shape s = in[0].shape;
  int a = s.Axis(attrs.GetInt("dim0")), b = s.Axis(attrs.GetInt("dim1"));
  std::swap(s[a], s[b]);
  return {{in[0].dtype, s}};
}

template <bool kFast>
void TransposeKernel(KernelContext& ctx) {
  CopyView<kFast>(ctx.inputs[0].Transpose(ctx.attrs.GetInt("dim0"), ctx.attrs.GetInt("dim1")),
                  ctx.outputs[0]);
}

std::vector<Var> TransposeVjp(VjpContext& ctx) {
  return {Transpose(ctx.dy(0), ctx.attrs().GetInt("dim0"), ctx.attrs().GetInt("dim1"))};
}

// The order attribute with negative axes normalized; throws unless it is a permutation of the axes.
std::vector<int64_t> PermutationAttr(const Shape& s, const Attrs& attrs) {
  std::vector<int64_t> order = attrs.GetInts("order");
  if (static_cast<int>(order.size()) != s.rank()) {
    throw ShapeError(fmt::format("order [{}] has {} axes but {} has rank {}",
                                 fmt::join(order, ", "), order.size(), s.ToString(), s.rank()));
  }
  std::vector<bool> seen(order.size(), false);
  for (int64_t& a : order) {
    a = s.Axis(a);
    if (seen[a]) throw ShapeError(fmt::format("axis {} appears twice in order", a));
    seen[a] = true;
  }
  return order;
}

std::vector<TensorType> InferPermute(std::span<const TensorType> in, const Attrs& attrs) {
  const std::vector<int64_t> order = PermutationAttr(in[0].shape, attrs);
  Shape out = in[0].shape;
  for (size_t i = 0; i < order.size(); ++i)
    out[static_cast<int>(i)] = in[0].shape[static_cast<int>(order[i])];
  return {{in[0].dtype, out}};
}

template <bool kFast>
void PermuteKernel(KernelContext& ctx) {
  CopyView<kFast>(ctx.inputs[0].Permute(ctx.attrs.GetInts("order")), ctx.outputs[0]);
}

// dx = dy permuted by the inverse order: inverse[order[i]] = i.
std::vector<Var> PermuteVjp(VjpContext& ctx) {
  const std::vector<int64_t> order = PermutationAttr(ctx.x_type(0).shape, ctx.attrs());
  std::vector<int64_t> inverse(order.size());
  for (size_t i = 0; i < order.size(); ++i)
    inverse[static_cast<size_t>(order[i])] = static_cast<int64_t>(i);
  return {Permute(ctx.dy(0), inverse)};
}

// ---- slice ----

struct SliceRange {
  int axis;
  int64_t start, end;
};

SliceRange SliceAttrs(const Shape& s, const Attrs& attrs) {
  const int axis = s.Axis(attrs.GetInt("axis"));
  const int64_t start = attrs.GetInt("start"), end = attrs.GetInt("end");
  if (start < 0 || end < start || end > s[axis]) {
    throw ShapeError(
        fmt::format("range [{}, {}) does not fit axis {} of size {} (need 0 <= start <= "
                    "end <= {})",
                    start, end, axis, s[axis], s[axis]));
  }
  return {axis, start, end};
}

std::vector<TensorType> InferSlice(std::span<const TensorType> in, const Attrs& attrs) {
  const SliceRange r = SliceAttrs(in[0].shape, attrs);
  Shape out = in[0].shape;
  out[r.axis] = r.end - r.start;
  return {{in[0].dtype, out}};
}

std::vector<TensorType> InferSliceView(std::span<const TensorType> in, const Attrs& attrs) {
  std::vector<TensorType> out = InferSlice(in, attrs);
  CheckContiguousRange(in[0].shape, in[0].shape.Axis(attrs.GetInt("axis")), "slice_view");
  return out;
}

template <bool kFast>
void SliceKernel(KernelContext& ctx) {
  const SliceRange r = SliceAttrs(ctx.inputs[0].shape(), ctx.attrs);
  CopyView<kFast>(ctx.inputs[0].Slice(r.axis, r.start, r.end), ctx.outputs[0]);
}

void SliceViewKernel(KernelContext& ctx) {
  const SliceRange r = SliceAttrs(ctx.inputs[0].shape(), ctx.attrs);
  const Tensor view = ctx.inputs[0].Slice(r.axis, r.start, r.end);
  ctx.outputs[0] = view.Reshape(view.shape().dims());  // contiguous strides
}

// dx = [zeros before, dy, zeros after] along the axis.
std::vector<Var> SliceVjp(VjpContext& ctx) {
  const TensorType& x = ctx.x_type(0);
  const SliceRange r = SliceAttrs(x.shape, ctx.attrs());
  Var dy = ctx.dy(0);
  const DType t = GradientType(x).dtype;
  std::vector<Var> parts;
  Shape piece = x.shape;
  if (r.start > 0) {
    piece[r.axis] = r.start;
    parts.push_back(Zeros(ctx.builder(), piece, t));
  }
  parts.push_back(dy);
  if (r.end < x.shape[r.axis]) {
    piece[r.axis] = x.shape[r.axis] - r.end;
    parts.push_back(Zeros(ctx.builder(), piece, t));
  }
  return {parts.size() == 1 ? dy : Concat(parts, r.axis)};
}

// ---- concat ----

std::vector<TensorType> InferConcat(std::span<const TensorType> in, const Attrs& attrs) {
  const Shape& first = in[0].shape;
  const int axis = first.Axis(attrs.GetInt("axis"));
  Shape out = first;
  out[axis] = 0;
  for (size_t i = 0; i < in.size(); ++i) {
    const Shape& s = in[i].shape;
    if (in[i].dtype != in[0].dtype) {
      throw ShapeError(
          fmt::format("input {} is {} but input 0 is {}", i, Name(in[i].dtype), Name(in[0].dtype)));
    }
    bool fits = s.rank() == first.rank();
    for (int d = 0; fits && d < s.rank(); ++d) fits = d == axis || s[d] == first[d];
    if (!fits) {
      throw ShapeError(
          fmt::format("input {} of shape {} does not match {} on the axes other than {}", i,
                      s.ToString(), first.ToString(), axis));
    }
    out[axis] += s[axis];
  }
  return {{in[0].dtype, out}};
}

template <bool kFast>
void ConcatKernel(KernelContext& ctx) {
  const int axis = ctx.inputs[0].shape().Axis(ctx.attrs.GetInt("axis"));
  int64_t offset = 0;
  for (const Tensor& x : ctx.inputs) {
    const int64_t n = x.shape()[axis];
    CopyView<kFast>(x, ctx.outputs[0].Slice(axis, offset, offset + n));
    offset += n;
  }
}

// dx_i = the slice of dy that input i filled.
std::vector<Var> ConcatVjp(VjpContext& ctx) {
  const int axis = ctx.x_type(0).shape.Axis(ctx.attrs().GetInt("axis"));
  std::vector<Var> grads(static_cast<size_t>(ctx.num_inputs()));
  int64_t offset = 0;
  for (int i = 0; i < ctx.num_inputs(); ++i) {
    const int64_t n = ctx.x_type(i).shape[axis];
    if (ctx.needs(i)) grads[static_cast<size_t>(i)] = Slice(ctx.dy(0), axis, offset, offset + n);
    offset += n;
  }
  return grads;
}

// ---- split ----

std::vector<TensorType> InferSplit(std::span<const TensorType> in, const Attrs& attrs) {
  const Shape& s = in[0].shape;
  const int axis = s.Axis(attrs.GetInt("axis"));
  const std::vector<int64_t>& sizes = attrs.GetInts("sizes");
  if (sizes.empty()) throw ShapeError("sizes is empty");
  std::vector<TensorType> out;
  int64_t total = 0;
  for (int64_t n : sizes) {
    if (n < 0) throw ShapeError(fmt::format("size {} is negative", n));
    Shape piece = s;
    piece[axis] = n;
    out.push_back({in[0].dtype, piece});
    total += n;
  }
  if (total != s[axis]) {
    throw ShapeError(fmt::format("sizes [{}] add up to {}, but axis {} of {} has size {}",
                                 fmt::join(sizes, ", "), total, axis, s.ToString(), s[axis]));
  }
  return out;
}

std::vector<TensorType> InferSplitView(std::span<const TensorType> in, const Attrs& attrs) {
  std::vector<TensorType> out = InferSplit(in, attrs);
  CheckContiguousRange(in[0].shape, in[0].shape.Axis(attrs.GetInt("axis")), "split_view");
  return out;
}

template <bool kFast>
void SplitKernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const int axis = x.shape().Axis(ctx.attrs.GetInt("axis"));
  int64_t offset = 0;
  for (const Tensor& y : ctx.outputs) {
    const int64_t n = y.shape()[axis];
    CopyView<kFast>(x.Slice(axis, offset, offset + n), y);
    offset += n;
  }
}

void SplitViewKernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const int axis = x.shape().Axis(ctx.attrs.GetInt("axis"));
  const std::vector<int64_t>& sizes = ctx.attrs.GetInts("sizes");
  int64_t offset = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const Tensor view = x.Slice(axis, offset, offset + sizes[i]);
    ctx.outputs[i] = view.Reshape(view.shape().dims());  // contiguous strides
    offset += sizes[i];
  }
}

// dx = the output gradients joined along the axis, zeros for outputs nothing depends on.
std::vector<Var> SplitVjp(VjpContext& ctx) {
  const int axis = ctx.x_type(0).shape.Axis(ctx.attrs().GetInt("axis"));
  std::vector<Var> parts;
  for (int i = 0; i < ctx.num_outputs(); ++i) {
    Var dy = ctx.dy(i);
    const TensorType t = GradientType(ctx.y_type(i));
    parts.push_back(dy.valid() ? dy : Zeros(ctx.builder(), t.shape, t.dtype));
  }
  return {parts.size() == 1 ? parts[0] : Concat(parts, axis)};
}

}  // namespace

Var Reshape(Var x, const std::vector<int64_t>& dims) {
  return x.builder()->Emit1("reshape", {x}, {{"shape", dims}});
}

Var Transpose(Var x, int64_t dim0, int64_t dim1) {
  return x.builder()->Emit1("transpose", {x}, {{"dim0", dim0}, {"dim1", dim1}});
}

Var Permute(Var x, const std::vector<int64_t>& order) {
  return x.builder()->Emit1("permute", {x}, {{"order", order}});
}

Var Slice(Var x, int64_t axis, int64_t start, int64_t end) {
  const char* op = IsContiguousRange(x.shape(), axis) ? "slice_view" : "slice";
  return x.builder()->Emit1(op, {x}, {{"axis", axis}, {"start", start}, {"end", end}});
}

Var Concat(const std::vector<Var>& xs, int64_t axis) {
  if (xs.empty()) throw ProgramError("concat: needs at least one input");
  return xs[0].builder()->Emit1("concat", xs, {{"axis", axis}});
}

std::vector<Var> Split(Var x, int64_t axis, const std::vector<int64_t>& sizes) {
  const char* op = IsContiguousRange(x.shape(), axis) ? "split_view" : "split";
  return x.builder()->Emit(op, {x}, {{"axis", axis}, {"sizes", sizes}});
}

void RegisterShapeOps(OpRegistry& r) {
  const OpSignature slice_signature = {.inputs = {{"x", "any[...]"}},
                                       .attrs = {{"axis", "int"}, {"start", "int"}, {"end", "int"}},
                                       .outputs = {{"y", "any[...]"}}};
  const OpSignature split_signature = {.inputs = {{"x", "any[...]"}},
                                       .attrs = {{"axis", "int"}, {"sizes", "ints"}},
                                       .outputs = {{"ys...", "any[...]"}}};
  r.Register({.name = "reshape",
              .kind = OpKind::kView,
              .num_inputs = 1,
              .infer = InferReshape,
              .kernel = ReshapeKernel,
              .vjp = ReshapeVjp,
              .doc = "the same elements in a new shape, one dimension may be -1 (a view)",
              .signature = {.inputs = {{"x", "any[...]"}},
                            .attrs = {{"shape", "ints"}},
                            .outputs = {{"y", "any[shape]"}}}});
  r.Register({.name = "transpose",
              .num_inputs = 1,
              .infer = InferTranspose,
              .kernel = TransposeKernel<true>,
              .reference = TransposeKernel<false>,
              .vjp = TransposeVjp,
              .recomputable = true,  // a copy: one pass, remade from its input in backward
              .doc = "axes dim0 and dim1 swapped (a contiguous copy)",
              .signature = {.inputs = {{"x", "any[...]"}},
                            .attrs = {{"dim0", "int"}, {"dim1", "int"}},
                            .outputs = {{"y", "any[...]"}}}});
  r.Register({.name = "permute",
              .num_inputs = 1,
              .infer = InferPermute,
              .kernel = PermuteKernel<true>,
              .reference = PermuteKernel<false>,
              .vjp = PermuteVjp,
              .recomputable = true,  // a copy: one pass, remade from its input in backward
              .doc = "the axes reordered, y.shape[i] = x.shape[order[i]] (a contiguous copy)",
              .signature = {.inputs = {{"x", "any[...]"}},
                            .attrs = {{"order", "ints"}},
                            .outputs = {{"y", "any[...]"}}}});
  r.Register({.name = "slice",
              .num_inputs = 1,
              .infer = InferSlice,
              .kernel = SliceKernel<true>,
              .reference = SliceKernel<false>,
              .vjp = SliceVjp,
              .doc = "the elements [start, end) along axis (a copy)",
              .signature = slice_signature});
  r.Register({.name = "slice_view",
              .kind = OpKind::kView,
              .num_inputs = 1,
              .infer = InferSliceView,
              .kernel = SliceViewKernel,
              .vjp = SliceVjp,
              .doc = "the elements [start, end) along axis when they are contiguous (a view)",
              .signature = slice_signature});
  r.Register({.name = "concat",
              .num_inputs = -1,
              .infer = InferConcat,
              .kernel = ConcatKernel<true>,
              .reference = ConcatKernel<false>,
              .vjp = ConcatVjp,
              .doc = "the inputs joined along axis (one dtype and rank, equal on the other axes)",
              .signature = {.inputs = {{"xs...", "any[...]"}},
                            .attrs = {{"axis", "int"}},
                            .outputs = {{"y", "any[...]"}}}});
  r.Register({.name = "split",
              .num_inputs = 1,
              .infer = InferSplit,
              .kernel = SplitKernel<true>,
              .reference = SplitKernel<false>,
              .vjp = SplitVjp,
              .doc = "x cut along axis into pieces of the given sizes (copies)",
              .signature = split_signature});
  r.Register({.name = "split_view",
              .kind = OpKind::kView,
              .num_inputs = 1,
              .infer = InferSplitView,
              .kernel = SplitViewKernel,
              .vjp = SplitVjp,
              .doc = "x cut along axis into contiguous pieces of the given sizes (views)",
              .signature = split_signature});
}

}  // namespace sluice
