// Convolution and pooling ops: registration, inference and VJP rules. Kernels: kernels/conv.h.
#include "sluice/ir/ops/conv.h"

#include <string>
#include <vector>

#include <fmt/ranges.h>

#include "sluice/ir/ops/common.h"
#include "sluice/kernels/conv.h"

namespace sluice {

namespace {

std::vector<int64_t> Ints(Pair p) { return {p[0], p[1]}; }

// The pair attribute `name` ([rows, columns]); `fallback` when absent. Throws ShapeError when it
// is not two integers of at least `least`.
Pair PairAttr(const Attrs& attrs, std::string_view name, Pair fallback, int64_t least) {
  if (!attrs.Has(name)) return fallback;
  const std::vector<int64_t>& v = attrs.GetInts(name);
  if (v.size() != 2 || v[0] < least || v[1] < least) {
    throw ShapeError(fmt::format("{} must be two integers [rows, columns] of at least {}, got [{}]",
                                 name, least, fmt::join(v, ", ")));
  }
  return {v[0], v[1]};
}

Pair Stride(const Attrs& attrs) { return PairAttr(attrs, "stride", {1, 1}, 1); }
Pair Padding(const Attrs& attrs) { return PairAttr(attrs, "padding", {0, 0}, 0); }
Pair Dilation(const Attrs& attrs) { return PairAttr(attrs, "dilation", {1, 1}, 1); }
int64_t Groups(const Attrs& attrs) {
  const int64_t groups = attrs.GetInt("groups", 1);
  if (groups < 1) throw ShapeError(fmt::format("groups must be at least 1, got {}", groups));
  return groups;
}
Pair Kernel(const Attrs& attrs) {
  if (!attrs.Has("kernel")) throw ShapeError("kernel (the window, [rows, columns]) is required");
  return PairAttr(attrs, "kernel", {0, 0}, 1);
}

void RequireImages(const TensorType& t, const char* what) {
  if (t.shape.rank() != 4) {
    throw ShapeError(
        fmt::format("{} must be images [B, C, H, W] (rank 4), got {}", what, t.shape.ToString()));
  }
}

// The dims of a window of `kernel` (its taps `dilation` apart) over x [B, C, H, W] giving
// `out_channels` in `groups` groups; throws ShapeError when the window is larger than the padded
// image.
kernels::Conv2dDims WindowDims(const Shape& x, int64_t out_channels, Pair kernel, Pair stride,
                               Pair padding, Pair dilation = {1, 1}, int64_t groups = 1) {
  const kernels::Conv2dDims d =
      kernels::Conv2dShape(x[0], x[1], x[2], x[3], out_channels, kernel[0], kernel[1], stride,
                           padding, dilation, groups);
  const Pair extent{dilation[0] * (kernel[0] - 1) + 1, dilation[1] * (kernel[1] - 1) + 1};
  if (x[2] + 2 * padding[0] < extent[0] || x[3] + 2 * padding[1] < extent[1]) {
    const std::string dilated = extent == kernel
                                    ? ""
                                    : fmt::format(" (dilated [{}, {}]: {}x{})", dilation[0],
                                                  dilation[1], extent[0], extent[1]);
    throw ShapeError(
        fmt::format("a window of {}x{}{} does not fit images of {}x{} padded by "
                    "[{}, {}]",
                    kernel[0], kernel[1], dilated, x[2], x[3], padding[0], padding[1]));
  }
  return d;
}

Shape OutShape(const kernels::Conv2dDims& d) {
  return Shape{d.batch, d.out_channels, d.out_h, d.out_w};
}

// ---- conv2d and its gradients ----

// x [B, C, H, W], w [O, C/G, KH, KW].
kernels::Conv2dDims ConvDims(const Shape& x, const Shape& w, const Attrs& attrs) {
  return WindowDims(x, w[0], {w[2], w[3]}, Stride(attrs), Padding(attrs), Dilation(attrs),
                    Groups(attrs));
}

void CheckFilters(const TensorType& x, const TensorType& w, const Attrs& attrs) {
  RequireImages(x, "x");
  const int64_t groups = Groups(attrs), c = x.shape[1];
  if (c % groups != 0) {
    throw ShapeError(fmt::format("groups = {} must divide x's channels C = {}", groups, c));
  }
  if (w.shape.rank() != 4 || w.shape[1] != c / groups || w.shape[2] < 1 || w.shape[3] < 1) {
    const std::string per_group =
        groups == 1 ? "" : fmt::format(" ({} groups: C/G = {})", groups, c / groups);
    throw ShapeError(fmt::format("w must be filters [O, C/G, KH, KW] with x's C = {}{}, got {}", c,
                                 per_group, w.shape.ToString()));
  }
  if (w.shape[0] % groups != 0) {
    throw ShapeError(
        fmt::format("groups = {} must divide w's output channels O = {}", groups, w.shape[0]));
  }
}

std::vector<TensorType> InferConv2d(std::span<const TensorType> in, const Attrs& attrs) {
  const DType t = ops::SameFloatDType(in);
  CheckFilters(in[0], in[1], attrs);
  return {{t, OutShape(ConvDims(in[0].shape, in[1].shape, attrs))}};
}

int64_t Conv2dScratch(std::span<const TensorType> in, const Attrs& attrs) {
  return kernels::Conv2dScratchBytes(ConvDims(in[0].shape, in[1].shape, attrs),
                                     kernels::Conv2dPass::kForward,
                                     static_cast<int64_t>(SizeOf(in[0].dtype)));
}

// dy must be the convolution's output for x of `x_shape`.
void RequireOutput(const TensorType& dy, const kernels::Conv2dDims& d) {
  if (dy.shape != OutShape(d)) {
    throw ShapeError(fmt::format("dy must be {} (the output's shape), got {}",
                                 OutShape(d).ToString(), dy.shape.ToString()));
  }
}

// conv2d_grad_input: dy [B, O, OH, OW], w [O, C/G, KH, KW]; attributes height and width give x's.
Shape GradInputShape(std::span<const TensorType> in, const Attrs& attrs) {
  RequireImages(in[0], "dy");
  const Shape& w = in[1].shape;
  if (w.rank() != 4)
    throw ShapeError(fmt::format("w must be [O, C/G, KH, KW], got {}", w.ToString()));
  const int64_t height = attrs.GetInt("height"), width = attrs.GetInt("width");
  if (height < 1 || width < 1) {
    throw ShapeError(
        fmt::format("height and width must be at least 1, got {} and {}", height, width));
  }
  return Shape{in[0].shape[0], w[1] * Groups(attrs), height, width};
}

std::vector<TensorType> InferConv2dGradInput(std::span<const TensorType> in, const Attrs& attrs) {
  const DType t = ops::SameFloatDType(in);
  const Shape x = GradInputShape(in, attrs);
  CheckFilters({t, x}, in[1], attrs);
  RequireOutput(in[0], ConvDims(x, in[1].shape, attrs));
  return {{t, x}};
}

int64_t Conv2dGradInputScratch(std::span<const TensorType> in, const Attrs& attrs) {
  return kernels::Conv2dScratchBytes(ConvDims(GradInputShape(in, attrs), in[1].shape, attrs),
                                     kernels::Conv2dPass::kGradInput,
                                     static_cast<int64_t>(SizeOf(in[0].dtype)));
}

// conv2d_grad_weight: dy [B, O, OH, OW], x [B, C, H, W]; attribute kernel gives [KH, KW].
Shape GradWeightShape(std::span<const TensorType> in, const Attrs& attrs) {
  RequireImages(in[0], "dy");
  RequireImages(in[1], "x");
  const Pair k = Kernel(attrs);
  return Shape{in[0].shape[1], in[1].shape[1] / Groups(attrs), k[0], k[1]};
}

std::vector<TensorType> InferConv2dGradWeight(std::span<const TensorType> in, const Attrs& attrs) {
  const DType t = ops::SameFloatDType(in);
  const Shape w = GradWeightShape(in, attrs);
  CheckFilters(in[1], {t, w}, attrs);
  RequireOutput(in[0], ConvDims(in[1].shape, w, attrs));
  return {{t, w}};
}

int64_t Conv2dGradWeightScratch(std::span<const TensorType> in, const Attrs& attrs) {
  return kernels::Conv2dScratchBytes(ConvDims(in[1].shape, GradWeightShape(in, attrs), attrs),
                                     kernels::Conv2dPass::kGradWeight,
                                     static_cast<int64_t>(SizeOf(in[0].dtype)));
}

// The fast kernel's scratch (kernels/conv.h Conv2dScratchBytes), from the executor's allocator: the
// forecast's figure for the instruction, the ops' scratch functions above.
template <typename T>
Tensor Scratch(const kernels::Conv2dDims& d, kernels::Conv2dPass pass, KernelContext& ctx) {
  const int64_t bytes = kernels::Conv2dScratchBytes(d, pass, sizeof(T));
  return Tensor::Empty({(bytes + sizeof(T) - 1) / static_cast<int64_t>(sizeof(T))}, DTypeOf<T>(),
                       ctx.allocator);
}

template <bool kFast>
void Conv2dKernel(KernelContext& ctx) {
  const Tensor &x = ctx.inputs[0], &w = ctx.inputs[1];
  const kernels::Conv2dDims d = ConvDims(x.shape(), w.shape(), ctx.attrs);
  DispatchFloat(x.dtype(), "conv2d", [&]<typename T>() {
    T* y = ctx.outputs[0].data<T>();
    if constexpr (kFast) {
      const Tensor cols = Scratch<T>(d, kernels::Conv2dPass::kForward, ctx);
      kernels::Conv2dFast<T>(x.data<T>(), w.data<T>(), y, d, cols.data<T>());
    } else {
      kernels::Conv2dReference<T>(x.data<T>(), w.data<T>(), y, d);
    }
  });
}

template <bool kFast>
void Conv2dGradInputKernel(KernelContext& ctx) {
  const Tensor &dy = ctx.inputs[0], &w = ctx.inputs[1];
  const Tensor& dx = ctx.outputs[0];
  const kernels::Conv2dDims d = ConvDims(dx.shape(), w.shape(), ctx.attrs);
  DispatchFloat(dy.dtype(), "conv2d_grad_input", [&]<typename T>() {
    if constexpr (kFast) {
      const Tensor cols = Scratch<T>(d, kernels::Conv2dPass::kGradInput, ctx);
      kernels::Conv2dGradInputFast<T>(dy.data<T>(), w.data<T>(), dx.data<T>(), d, cols.data<T>());
    } else {
      kernels::Conv2dGradInputReference<T>(dy.data<T>(), w.data<T>(), dx.data<T>(), d);
    }
  });
}

template <bool kFast>
void Conv2dGradWeightKernel(KernelContext& ctx) {
  const Tensor &dy = ctx.inputs[0], &x = ctx.inputs[1];
  const Tensor& dw = ctx.outputs[0];
  const kernels::Conv2dDims d = ConvDims(x.shape(), dw.shape(), ctx.attrs);
  DispatchFloat(dy.dtype(), "conv2d_grad_weight", [&]<typename T>() {
    if constexpr (kFast) {
      const Tensor cols = Scratch<T>(d, kernels::Conv2dPass::kGradWeight, ctx);
      kernels::Conv2dGradWeightFast<T>(dy.data<T>(), x.data<T>(), dw.data<T>(), d, cols.data<T>());
    } else {
      kernels::Conv2dGradWeightReference<T>(dy.data<T>(), x.data<T>(), dw.data<T>(), d);
    }
  });
}

ConvOptions Options(const Attrs& attrs) {
  return {.stride = Stride(attrs),
          .padding = Padding(attrs),
          .dilation = Dilation(attrs),
          .groups = Groups(attrs)};
}

std::vector<Var> Conv2dVjp(VjpContext& ctx) {
  std::vector<Var> grads(2);
  const ConvOptions o = Options(ctx.attrs());
  const Shape& x = ctx.x_type(0).shape;
  const Shape& w = ctx.x_type(1).shape;
  if (ctx.needs(0)) grads[0] = Conv2dGradInput(ctx.dy(0), ctx.x(1), o, x[2], x[3]);
  if (ctx.needs(1)) grads[1] = Conv2dGradWeight(ctx.dy(0), ctx.x(0), o, {w[2], w[3]});
  return grads;
}

// conv2d_grad_input(dy, w) is linear in each input: of dy, the convolution of its gradient g by
// w; of w, the weight gradient of that convolution, its input g and its output's gradient dy.
// This is nn.ConvTranspose2d's backward (the exporter maps the transposed convolution here).
std::vector<Var> Conv2dGradInputVjp(VjpContext& ctx) {
  std::vector<Var> grads(2);
  const ConvOptions o = Options(ctx.attrs());
  const Shape& w = ctx.x_type(1).shape;
  if (ctx.needs(0)) grads[0] = Conv2d(ctx.dy(0), ctx.x(1), o);
  if (ctx.needs(1)) grads[1] = Conv2dGradWeight(ctx.x(0), ctx.dy(0), o, {w[2], w[3]});
  return grads;
}

// ---- pooling ----

kernels::Conv2dDims PoolDims(const Shape& x, const Attrs& attrs) {
  const Pair kernel = Kernel(attrs), padding = Padding(attrs);
  if (2 * padding[0] > kernel[0] || 2 * padding[1] > kernel[1]) {
    throw ShapeError(fmt::format("padding [{}, {}] must be at most half the window {}x{}",
                                 padding[0], padding[1], kernel[0], kernel[1]));
  }
  return WindowDims(x, x[1], kernel, Stride(attrs), padding);
}

std::vector<TensorType> InferPool(std::span<const TensorType> in, const Attrs& attrs) {
  const DType t = ops::SameFloatDType(in.first(1));
  RequireImages(in[0], "x");
  return {{t, OutShape(PoolDims(in[0].shape, attrs))}};
}

std::vector<TensorType> InferMaxPoolGrad(std::span<const TensorType> in, const Attrs& attrs) {
  const DType t = ops::SameFloatDType(in);
  RequireImages(in[1], "x");
  RequireOutput(in[0], PoolDims(in[1].shape, attrs));
  return {{t, in[1].shape}};
}

Shape AvgPoolGradShape(const TensorType& dy, const Attrs& attrs) {
  RequireImages(dy, "dy");
  return Shape{dy.shape[0], dy.shape[1], attrs.GetInt("height"), attrs.GetInt("width")};
}

std::vector<TensorType> InferAvgPoolGrad(std::span<const TensorType> in, const Attrs& attrs) {
  const DType t = ops::SameFloatDType(in);
  const Shape x = AvgPoolGradShape(in[0], attrs);
  RequireOutput(in[0], PoolDims(x, attrs));
  return {{t, x}};
}

template <bool kFast>
void MaxPoolKernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const kernels::Conv2dDims d = PoolDims(x.shape(), ctx.attrs);
  DispatchFloat(x.dtype(), "max_pool2d", [&]<typename T>() {
    const auto pool = kFast ? kernels::MaxPool2dFast<T> : kernels::MaxPool2dReference<T>;
    pool(x.data<T>(), ctx.outputs[0].data<T>(), d);
  });
}

template <bool kFast>
void MaxPoolGradKernel(KernelContext& ctx) {
  const Tensor &dy = ctx.inputs[0], &x = ctx.inputs[1];
  const kernels::Conv2dDims d = PoolDims(x.shape(), ctx.attrs);
  DispatchFloat(x.dtype(), "max_pool2d_grad", [&]<typename T>() {
    const auto grad = kFast ? kernels::MaxPool2dGradFast<T> : kernels::MaxPool2dGradReference<T>;
    grad(dy.data<T>(), x.data<T>(), ctx.outputs[0].data<T>(), d);
  });
}

template <bool kFast>
void AvgPoolKernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const kernels::Conv2dDims d = PoolDims(x.shape(), ctx.attrs);
  DispatchFloat(x.dtype(), "avg_pool2d", [&]<typename T>() {
    const auto pool = kFast ? kernels::AvgPool2dFast<T> : kernels::AvgPool2dReference<T>;
    pool(x.data<T>(), ctx.outputs[0].data<T>(), d);
  });
}

template <bool kFast>
void AvgPoolGradKernel(KernelContext& ctx) {
  const Tensor& dy = ctx.inputs[0];
  const Tensor& dx = ctx.outputs[0];
  const kernels::Conv2dDims d = PoolDims(dx.shape(), ctx.attrs);
  DispatchFloat(dy.dtype(), "avg_pool2d_grad", [&]<typename T>() {
    const auto grad = kFast ? kernels::AvgPool2dGradFast<T> : kernels::AvgPool2dGradReference<T>;
    grad(dy.data<T>(), dx.data<T>(), d);
  });
}

std::vector<Var> MaxPoolVjp(VjpContext& ctx) {
  const Attrs& a = ctx.attrs();
  return {MaxPool2dGrad(ctx.dy(0), ctx.x(0), Kernel(a), Stride(a), Padding(a))};
}

std::vector<Var> AvgPoolVjp(VjpContext& ctx) {
  const Attrs& a = ctx.attrs();
  const Shape& x = ctx.x_type(0).shape;
  return {AvgPool2dGrad(ctx.dy(0), Kernel(a), Stride(a), Padding(a), x[2], x[3])};
}

const std::vector<OpParam> kConvAttrs = {{"stride", "ints = [1, 1]"},
                                         {"padding", "ints = [0, 0]"},
                                         {"dilation", "ints = [1, 1]"},
                                         {"groups", "int = 1"}};
const std::vector<OpParam> kPoolAttrs = {
    {"kernel", "ints"}, {"stride", "ints = [1, 1]"}, {"padding", "ints = [0, 0]"}};

std::vector<OpParam> With(std::vector<OpParam> attrs, std::vector<OpParam> more) {
  attrs.insert(attrs.end(), more.begin(), more.end());
  return attrs;
}

}  // namespace

namespace {

// A convolution's attributes; dilation and groups only where they are not 1, so that programs
// without them read as they always did.
Attrs ConvAttrs(const ConvOptions& o) {
  Attrs attrs{{"stride", Ints(o.stride)}, {"padding", Ints(o.padding)}};
  if (o.dilation != Pair{1, 1}) attrs.Set("dilation", Ints(o.dilation));
  if (o.groups != 1) attrs.Set("groups", o.groups);
  return attrs;
}

}  // namespace

Var Conv2d(Var x, Var w, const ConvOptions& options) {
  return x.builder()->Emit1("conv2d", {x, w}, ConvAttrs(options));
}
Var Conv2d(Var x, Var w, Pair stride, Pair padding) {
  return Conv2d(x, w, {.stride = stride, .padding = padding});
}
Var Conv2dGradInput(Var dy, Var w, const ConvOptions& options, int64_t height, int64_t width) {
  Attrs attrs = ConvAttrs(options);
  attrs.Set("height", height);
  attrs.Set("width", width);
  return dy.builder()->Emit1("conv2d_grad_input", {dy, w}, std::move(attrs));
}
Var Conv2dGradWeight(Var dy, Var x, const ConvOptions& options, Pair kernel) {
  Attrs attrs = ConvAttrs(options);
  attrs.Set("kernel", Ints(kernel));
  return dy.builder()->Emit1("conv2d_grad_weight", {dy, x}, std::move(attrs));
}
Var MaxPool2d(Var x, Pair kernel, Pair stride, Pair padding) {
  return x.builder()->Emit1(
      "max_pool2d", {x},
      {{"kernel", Ints(kernel)}, {"stride", Ints(stride)}, {"padding", Ints(padding)}});
}
Var MaxPool2dGrad(Var dy, Var x, Pair kernel, Pair stride, Pair padding) {
  return dy.builder()->Emit1(
      "max_pool2d_grad", {dy, x},
      {{"kernel", Ints(kernel)}, {"stride", Ints(stride)}, {"padding", Ints(padding)}});
}
Var AvgPool2d(Var x, Pair kernel, Pair stride, Pair padding) {
  return x.builder()->Emit1(
      "avg_pool2d", {x},
      {{"kernel", Ints(kernel)}, {"stride", Ints(stride)}, {"padding", Ints(padding)}});
}
Var AvgPool2dGrad(Var dy, Pair kernel, Pair stride, Pair padding, int64_t height, int64_t width) {
  return dy.builder()->Emit1("avg_pool2d_grad", {dy},
                             {{"kernel", Ints(kernel)},
                              {"stride", Ints(stride)},
                              {"padding", Ints(padding)},
                              {"height", height},
                              {"width", width}});
}

void RegisterConvOps(OpRegistry& r) {
  r.Register(
      {.name = "conv2d",
       .num_inputs = 2,
       .infer = InferConv2d,
       .kernel = Conv2dKernel<true>,
       .reference = Conv2dKernel<false>,
       .vjp = Conv2dVjp,
       .doc = "2-D convolution (PyTorch conv2d without bias, with its dilation and groups), "
              "oneDNN's primitives (f32, a window past 1x1 over 16 channels or more, or grouped) "
              "or im2col and a GEMM per block of output rows and group",
       .signature = {.inputs = {{"x", "float[B, C, H, W]"}, {"w", "float[O, C/G, KH, KW]"}},
                     .attrs = kConvAttrs,
                     .outputs = {{"y", "float[B, O, OH, OW]"}}},
       .scratch_bytes = Conv2dScratch});
  r.Register(
      {.name = "conv2d_grad_input",
       .num_inputs = 2,
       .infer = InferConv2dGradInput,
       .kernel = Conv2dGradInputKernel<true>,
       .reference = Conv2dGradInputKernel<false>,
       .vjp = Conv2dGradInputVjp,
       .doc = "conv2d gradient of x: each output's gradient times the filters, back to the "
              "input pixels it read; also PyTorch's conv_transpose2d (dy its input, "
              "height and width its output's size)",
       .signature = {.inputs = {{"dy", "float[B, O, OH, OW]"}, {"w", "float[O, C/G, KH, KW]"}},
                     .attrs = With(kConvAttrs, {{"height", "int"}, {"width", "int"}}),
                     .outputs = {{"dx", "float[B, C, height, width]"}}},
       .scratch_bytes = Conv2dGradInputScratch});
  r.Register({.name = "conv2d_grad_weight",
              .num_inputs = 2,
              .infer = InferConv2dGradWeight,
              .kernel = Conv2dGradWeightKernel<true>,
              .reference = Conv2dGradWeightKernel<false>,
              .doc = "conv2d gradient of w: dy times the input windows, summed over the batch",
              .signature = {.inputs = {{"dy", "float[B, O, OH, OW]"}, {"x", "float[B, C, H, W]"}},
                            .attrs = With(kConvAttrs, {{"kernel", "ints"}}),
                            .outputs = {{"dw", "float[O, C/G, kernel]"}}},
              .scratch_bytes = Conv2dGradWeightScratch});
  r.Register({.name = "max_pool2d",
              .num_inputs = 1,
              .infer = InferPool,
              .kernel = MaxPoolKernel<true>,
              .reference = MaxPoolKernel<false>,
              .vjp = MaxPoolVjp,
              .doc = "the largest value of each window (PyTorch max_pool2d, padding −∞)",
              .signature = {.inputs = {{"x", "float[B, C, H, W]"}},
                            .attrs = kPoolAttrs,
                            .outputs = {{"y", "float[B, C, OH, OW]"}}}});
  r.Register({.name = "max_pool2d_grad",
              .num_inputs = 2,
              .infer = InferMaxPoolGrad,
              .kernel = MaxPoolGradKernel<true>,
              .reference = MaxPoolGradKernel<false>,
              .doc = "max_pool2d gradient: dy to each window's first largest element of x",
              .signature = {.inputs = {{"dy", "float[B, C, OH, OW]"}, {"x", "float[B, C, H, W]"}},
                            .attrs = kPoolAttrs,
                            .outputs = {{"dx", "float[B, C, H, W]"}}}});
  r.Register({.name = "avg_pool2d",
              .num_inputs = 1,
              .infer = InferPool,
              .kernel = AvgPoolKernel<true>,
              .reference = AvgPoolKernel<false>,
              .vjp = AvgPoolVjp,
              .recomputable = true,
              .doc = "the mean of each window, the padding counted (PyTorch avg_pool2d)",
              .signature = {.inputs = {{"x", "float[B, C, H, W]"}},
                            .attrs = kPoolAttrs,
                            .outputs = {{"y", "float[B, C, OH, OW]"}}}});
  r.Register({.name = "avg_pool2d_grad",
              .num_inputs = 1,
              .infer = InferAvgPoolGrad,
              .kernel = AvgPoolGradKernel<true>,
              .reference = AvgPoolGradKernel<false>,
              .doc = "avg_pool2d gradient: dy / window size to every element of its window",
              .signature = {.inputs = {{"dy", "float[B, C, OH, OW]"}},
                            .attrs = With(kPoolAttrs, {{"height", "int"}, {"width", "int"}}),
                            .outputs = {{"dx", "float[B, C, height, width]"}}}});
}

}  // namespace sluice
