// Batch normalization ops: registration, inference, kernel dispatch and VJP rules. Kernels:
// kernels/batch_norm.h.
#include "sluice/ir/ops/batch_norm.h"

#include <string>
#include <vector>

#include "sluice/ir/ops.h"
#include "sluice/ir/ops/common.h"
#include "sluice/kernels/batch_norm.h"

namespace sluice {

namespace {

double Eps(const Attrs& attrs) { return attrs.GetFloat("eps", 1e-5); }
bool Training(const Attrs& attrs) { return attrs.GetBool("training", true); }
double Momentum(const Attrs& attrs) { return attrs.GetFloat("momentum", 0.1); }

kernels::BatchNormDims DimsOf(const Shape& x) {
  kernels::BatchNormDims d{.batch = x[0], .channels = x[1], .inner = 1};
  for (int i = 2; i < x.rank(); ++i) d.inner *= x[i];
  return d;
}

void RequireBatchChannels(const TensorType& x, std::string_view what) {
  if (x.shape.rank() < 2) {
    throw ShapeError(
        fmt::format("{} must be [B, C, ...] (rank 2 or more), got {}", what, x.shape.ToString()));
  }
}

// Each of `per_channel` (named by `names`) must be [C] for x [B, C, ...].
void RequirePerChannel(const TensorType& x, std::span<const TensorType> per_channel,
                       std::initializer_list<const char*> names) {
  auto name = names.begin();
  for (const TensorType& p : per_channel) {
    if (p.shape.rank() != 1 || p.shape[0] != x.shape[1]) {
      throw ShapeError(fmt::format("{} must be [C] = [{}] for x {}, got {}", *name, x.shape[1],
                                   x.shape.ToString(), p.shape.ToString()));
    }
    ++name;
  }
}

// The batch's statistics need two values per channel at least (one has no variance, and the
// unbiased one divides by zero); PyTorch refuses one in training too.
void RequireBatchStatistics(const TensorType& x) {
  const int64_t per_channel = x.shape[1] == 0 ? 0 : x.shape.numel() / x.shape[1];
  if (per_channel < 2) {
    throw ShapeError(fmt::format(
        "the batch's statistics need more than one value per channel, and x {} has {}: train "
        "with a larger (micro-)batch",
        x.shape.ToString(), per_channel));
  }
}

void RequirePositive(double v, std::string_view what) {
  if (!(v > 0)) throw ShapeError(fmt::format("{} must be positive, got {}", what, v));
}

// x, weight, bias, running_mean, running_var -> y.
std::vector<TensorType> InferBatchNorm(std::span<const TensorType> in, const Attrs& attrs) {
  const DType t = ops::SameFloatDType(in);
  RequireBatchChannels(in[0], "x");
  RequirePerChannel(in[0], in.subspan(1), {"weight", "bias", "running_mean", "running_var"});
  RequirePositive(Eps(attrs), "eps");
  if (Training(attrs)) RequireBatchStatistics(in[0]);
  return {{t, in[0].shape}};
}

// dy, x, weight -> dx.
std::vector<TensorType> InferBatchNormGradX(std::span<const TensorType> in, const Attrs& attrs) {
  const DType t = ops::SameFloatDType(in);
  RequireBatchChannels(in[1], "x");
  if (in[0].shape != in[1].shape) {
    throw ShapeError(
        fmt::format("dy {} and x {} differ", in[0].shape.ToString(), in[1].shape.ToString()));
  }
  RequirePerChannel(in[1], in.subspan(2), {"weight"});
  RequirePositive(Eps(attrs), "eps");
  return {{t, in[1].shape}};
}

// dy, x -> dweight, dbias.
std::vector<TensorType> InferBatchNormGradParams(std::span<const TensorType> in,
                                                 const Attrs& attrs) {
  const DType t = ops::SameFloatDType(in);
  RequireBatchChannels(in[1], "x");
  if (in[0].shape != in[1].shape) {
    throw ShapeError(
        fmt::format("dy {} and x {} differ", in[0].shape.ToString(), in[1].shape.ToString()));
  }
  RequirePositive(Eps(attrs), "eps");
  const Shape c{in[1].shape[1]};
  return {{t, c}, {t, c}};
}

// x, running_mean, running_var: no outputs.
std::vector<TensorType> InferUpdateStats(std::span<const TensorType> in, const Attrs& attrs) {
  ops::SameFloatDType(in);
  RequireBatchChannels(in[0], "x");
  RequirePerChannel(in[0], in.subspan(1), {"running_mean", "running_var"});
  RequireBatchStatistics(in[0]);
  const double m = Momentum(attrs);
  if (!(m >= 0 && m <= 1)) throw ShapeError(fmt::format("momentum must be in [0, 1], got {}", m));
  return {};
}

template <bool kFast>
void BatchNormKernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  DispatchFloat(x.dtype(), "batch_norm", [&]<typename T>() {
    const bool training = Training(ctx.attrs);
    const T* mean = training ? nullptr : ctx.inputs[3].data<T>();
    const T* var = training ? nullptr : ctx.inputs[4].data<T>();
    (kFast ? kernels::BatchNormFast<T>
           : kernels::BatchNormReference<T>)(x.data<T>(), ctx.inputs[1].data<T>(),
                                             ctx.inputs[2].data<T>(), mean, var,
                                             ctx.outputs[0].data<T>(), DimsOf(x.shape()),
                                             Eps(ctx.attrs));
  });
}

template <bool kFast>
void BatchNormGradXKernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[1];
  DispatchFloat(x.dtype(), "batch_norm_grad_x", [&]<typename T>() {
    (kFast ? kernels::BatchNormGradXFast<T>
           : kernels::BatchNormGradXReference<T>)(ctx.inputs[0].data<T>(), x.data<T>(),
                                                  ctx.inputs[2].data<T>(), ctx.outputs[0].data<T>(),
                                                  DimsOf(x.shape()), Eps(ctx.attrs));
  });
}

template <bool kFast>
void BatchNormGradParamsKernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[1];
  DispatchFloat(x.dtype(), "batch_norm_grad_params", [&]<typename T>() {
    (kFast ? kernels::BatchNormGradParamsFast<T>
           : kernels::BatchNormGradParamsReference<T>)(ctx.inputs[0].data<T>(), x.data<T>(),
                                                       ctx.outputs[0].data<T>(),
                                                       ctx.outputs[1].data<T>(), DimsOf(x.shape()),
                                                       Eps(ctx.attrs));
  });
}

template <bool kFast>
void UpdateStatsKernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  DispatchFloat(x.dtype(), "batch_norm_update_stats", [&]<typename T>() {
    (kFast ? kernels::BatchNormUpdateStatsFast<T>
           : kernels::BatchNormUpdateStatsReference<T>)(x.data<T>(), ctx.inputs[1].data<T>(),
                                                        ctx.inputs[2].data<T>(), DimsOf(x.shape()),
                                                        Momentum(ctx.attrs));
  });
}

// Every axis of a [B, C, ...] value but the channels'.
std::vector<int64_t> AxesButChannels(const TensorType& x) {
  std::vector<int64_t> axes{0};
  for (int i = 2; i < x.shape.rank(); ++i) axes.push_back(i);
  return axes;
}

// Training: the batch's statistics depend on x, so dx has the two extra terms (batch_norm_grad_x);
// dweight and dbias come from one op that the zero-bubble split can defer to W. Inference form:
// y = x·scale + shift per channel, scale = weight / sqrt(running_var + eps), so dx is dy·scale (a
// batch_norm of dy with zero mean and bias), dweight Σ dy·x̂ and dbias Σ dy over the channel.
std::vector<Var> BatchNormVjp(VjpContext& ctx) {
  const double eps = Eps(ctx.attrs());
  Var dy = ctx.dy(0);
  std::vector<Var> grads(5);
  if (Training(ctx.attrs())) {
    if (ctx.needs(0)) grads[0] = BatchNormGradX(dy, ctx.x(0), ctx.x(1), eps);
    if (ctx.needs(1) || ctx.needs(2)) {
      auto [dw, db] = BatchNormGradParams(dy, ctx.x(0), eps);
      if (ctx.needs(1)) grads[1] = dw;
      if (ctx.needs(2)) grads[2] = db;
    }
    return grads;
  }
  Builder& b = ctx.builder();
  const TensorType& c = ctx.x_type(1);
  const BatchNormOptions inference{.eps = eps, .training = false};
  if (ctx.needs(0)) {
    Var zeros = Zeros(b, c.shape, c.dtype);
    grads[0] = BatchNorm(dy, ctx.x(1), zeros, zeros, ctx.x(4), inference);
  }
  const std::vector<int64_t> axes = AxesButChannels(ctx.x_type(0));
  if (ctx.needs(1)) {
    Var xhat = BatchNorm(ctx.x(0), Ones(b, c.shape, c.dtype), Zeros(b, c.shape, c.dtype), ctx.x(3),
                         ctx.x(4), inference);
    grads[1] = Sum(Mul(dy, xhat), axes);
  }
  if (ctx.needs(2)) grads[2] = Sum(dy, axes);
  return grads;
}

}  // namespace

Var BatchNorm(Var x, Var weight, Var bias, Var running_mean, Var running_var,
              const BatchNormOptions& options) {
  return x.builder()->Emit1("batch_norm", {x, weight, bias, running_mean, running_var},
                            {{"eps", options.eps}, {"training", options.training}});
}

Var BatchNormGradX(Var dy, Var x, Var weight, double eps) {
  return dy.builder()->Emit1("batch_norm_grad_x", {dy, x, weight}, {{"eps", eps}});
}

std::pair<Var, Var> BatchNormGradParams(Var dy, Var x, double eps) {
  std::vector<Var> out = dy.builder()->Emit("batch_norm_grad_params", {dy, x}, {{"eps", eps}});
  return {out[0], out[1]};
}

void BatchNormUpdateStats(Var x, Var running_mean, Var running_var, double momentum) {
  x.builder()->Emit("batch_norm_update_stats", {x, running_mean, running_var},
                    {{"momentum", momentum}});
}

void RegisterBatchNormOps(OpRegistry& r) {
  r.Register({.name = "batch_norm",
              .num_inputs = 5,
              .infer = InferBatchNorm,
              .kernel = BatchNormKernel<true>,
              .reference = BatchNormKernel<false>,
              .vjp = BatchNormVjp,
              // Its input is what its own gradient ops read: a backward recomputes y (a ReLU's
              // output after it) from x instead of keeping both (autodiff.h, recompute).
              .recomputable = true,
              .doc =
                  "batch normalization per channel (axis 1) over every other axis, then weight and "
                  "bias: by the batch's statistics (biased variance) when training, else by "
                  "running_mean and running_var",
              .signature = {.inputs = {{"x", "float[B, C, ...]"},
                                       {"weight", "float[C]"},
                                       {"bias", "float[C]"},
                                       {"running_mean", "float[C]"},
                                       {"running_var", "float[C]"}},
                            .attrs = {{"eps", "float = 1e-05"}, {"training", "bool = true"}},
                            .outputs = {{"y", "float[B, C, ...]"}}}});
  r.Register({.name = "batch_norm_grad_x",
              .num_inputs = 3,
              .infer = InferBatchNormGradX,
              .kernel = BatchNormGradXKernel<true>,
              .reference = BatchNormGradXKernel<false>,
              .doc = "batch_norm backward for x under the batch's statistics (recomputes them)",
              .signature = {.inputs = {{"dy", "float[B, C, ...]"},
                                       {"x", "float[B, C, ...]"},
                                       {"weight", "float[C]"}},
                            .attrs = {{"eps", "float = 1e-05"}},
                            .outputs = {{"dx", "float[B, C, ...]"}}}});
  r.Register({.name = "batch_norm_grad_params",
              .num_inputs = 2,
              .infer = InferBatchNormGradParams,
              .kernel = BatchNormGradParamsKernel<true>,
              .reference = BatchNormGradParamsKernel<false>,
              .doc = "batch_norm backward for weight and bias under the batch's statistics "
                     "(recomputes them)",
              .signature = {.inputs = {{"dy", "float[B, C, ...]"}, {"x", "float[B, C, ...]"}},
                            .attrs = {{"eps", "float = 1e-05"}},
                            .outputs = {{"dweight", "float[C]"}, {"dbias", "float[C]"}}}});
  r.Register({.name = "batch_norm_update_stats",
              .kind = OpKind::kInPlace,
              .num_inputs = 3,
              .infer = InferUpdateStats,
              .kernel = UpdateStatsKernel<true>,
              .reference = UpdateStatsKernel<false>,
              .doc = "running_mean and running_var (buffers) moved towards x's batch statistics "
                     "per channel, the variance unbiased: (1 - momentum)·running + "
                     "momentum·batch, in place; training only",
              .signature = {.inputs = {{"x", "float[B, C, ...]"},
                                       {"running_mean", "float[C]"},
                                       {"running_var", "float[C]"}},
                            .attrs = {{"momentum", "float = 0.1"}}},
              .updates = {1, 2},
              .updates_buffers = true});
}

}  // namespace sluice
