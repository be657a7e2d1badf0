// Optimizer update ops (in place, or into buffers of their own): registration, inference and kernel
// dispatch. Kernels: kernels/optimizer.h.
#include "sluice/ir/ops/optimizer.h"

#include "sluice/ir/ops.h"
#include "sluice/ir/ops/common.h"
#include "sluice/kernels/optimizer.h"

namespace sluice {

namespace {

// Every tensor in `state` must have the shape and dtype of the parameter (state[0]).
void RequireLikeParam(std::span<const TensorType> state, std::initializer_list<const char*> names) {
  ops::SameFloatDType(state);
  auto name = names.begin();
  for (const TensorType& t : state) {
    if (t.shape != state[0].shape) {
      throw ShapeError(fmt::format("{} must have the parameter's shape {}, got {}", *name,
                                   state[0].shape.ToString(), t.shape.ToString()));
    }
    ++name;
  }
}

void RequireScalar(const TensorType& t, std::string_view what, bool integer_ok) {
  const bool dtype_ok =
      t.dtype == DType::kF32 || t.dtype == DType::kF64 || (integer_ok && t.dtype == DType::kI64);
  if (t.shape.rank() != 0 || !dtype_ok) {
    throw ShapeError(fmt::format("{} must be a scalar [] of {}, got {}", what,
                                 integer_ok ? "f32, f64 or i64" : "f32 or f64", t.ToString()));
  }
}

// A scalar input as double, whatever its dtype.
double ScalarValue(const Tensor& t) { return t.FlatAt(0); }

kernels::SgdHyper SgdHyperOf(const Attrs& attrs) {
  return {.momentum = attrs.GetFloat("momentum", 0),
          .weight_decay = attrs.GetFloat("weight_decay", 0)};
}

std::vector<TensorType> InferSgd(std::span<const TensorType> in, const Attrs& attrs) {
  RequireLikeParam(in.subspan(0, 3), {"param", "grad", "momentum_buf"});
  RequireScalar(in[3], "lr", false);
  SgdHyperOf(attrs);  // attributes of the wrong type fail here, not at run time
  return {};
}

std::vector<TensorType> InferSgdInto(std::span<const TensorType> in, const Attrs& attrs) {
  InferSgd(in.subspan(0, 4), attrs);
  const std::vector<TensorType> out = {in[0], in[4], in[5]};
  RequireLikeParam(out, {"param", "param_out", "momentum_out"});
  return {};
}

// sgd_update (kInto false) reads and writes param (input 0) and momentum_buf (2); sgd_update_into
// writes them to inputs 4 and 5.
template <bool kFast, bool kInto>
void SgdKernel(KernelContext& ctx) {
  const Tensor& p = ctx.inputs[0];
  const Tensor& p_out = ctx.inputs[kInto ? 4 : 0];
  const Tensor& buf_out = ctx.inputs[kInto ? 5 : 2];
  DispatchFloat(p.dtype(), kInto ? "sgd_update_into" : "sgd_update", [&]<typename T>() {
    const double lr = ScalarValue(ctx.inputs[3]);
    const T* buf = ctx.inputs[2].data<T>();
    if constexpr (kFast) {
      kernels::SgdUpdateFast<T>(p.data<T>(), ctx.inputs[1].data<T>(), buf, p_out.data<T>(),
                                buf_out.data<T>(), p.numel(), SgdHyperOf(ctx.attrs), lr);
    } else {
      kernels::SgdUpdateReference<T>(p.data<T>(), ctx.inputs[1].data<T>(), buf, p_out.data<T>(),
                                     buf_out.data<T>(), p.numel(), SgdHyperOf(ctx.attrs), lr);
    }
  });
}

kernels::AdamWHyper AdamWHyperOf(const Attrs& attrs) {
  return {.beta1 = attrs.GetFloat("beta1", 0.9),
          .beta2 = attrs.GetFloat("beta2", 0.999),
          .eps = attrs.GetFloat("eps", 1e-8),
          .weight_decay = attrs.GetFloat("weight_decay", 0.01)};
}

std::vector<TensorType> InferAdamW(std::span<const TensorType> in, const Attrs& attrs) {
  RequireLikeParam(in.subspan(0, 4), {"param", "grad", "m", "v"});
  RequireScalar(in[4], "lr", false);
  RequireScalar(in[5], "step", true);
  const kernels::AdamWHyper h = AdamWHyperOf(attrs);
  if (!(h.beta1 >= 0 && h.beta1 < 1)) {
    throw ShapeError(fmt::format("beta1 must be in [0, 1), got {}", h.beta1));
  }
  if (!(h.beta2 >= 0 && h.beta2 < 1)) {
    throw ShapeError(fmt::format("beta2 must be in [0, 1), got {}", h.beta2));
  }
  return {};
}

std::vector<TensorType> InferAdamWInto(std::span<const TensorType> in, const Attrs& attrs) {
  InferAdamW(in.subspan(0, 6), attrs);
  const std::vector<TensorType> out = {in[0], in[6], in[7], in[8]};
  RequireLikeParam(out, {"param", "param_out", "m_out", "v_out"});
  return {};
}

// adamw_update (kInto false) reads and writes param, m and v (inputs 0, 2, 3); adamw_update_into
// writes them to inputs 6, 7 and 8.
template <bool kFast, bool kInto>
void AdamWKernel(KernelContext& ctx) {
  const Tensor& p = ctx.inputs[0];
  const Tensor& p_out = ctx.inputs[kInto ? 6 : 0];
  const Tensor& m_out = ctx.inputs[kInto ? 7 : 2];
  const Tensor& v_out = ctx.inputs[kInto ? 8 : 3];
  DispatchFloat(p.dtype(), kInto ? "adamw_update_into" : "adamw_update", [&]<typename T>() {
    const double lr = ScalarValue(ctx.inputs[4]), step = ScalarValue(ctx.inputs[5]);
    const T* g = ctx.inputs[1].data<T>();
    const T* m = ctx.inputs[2].data<T>();
    const T* v = ctx.inputs[3].data<T>();
    if constexpr (kFast) {
      kernels::AdamWUpdateFast<T>(p.data<T>(), g, m, v, p_out.data<T>(), m_out.data<T>(),
                                  v_out.data<T>(), p.numel(), AdamWHyperOf(ctx.attrs), lr, step);
    } else {
      kernels::AdamWUpdateReference<T>(p.data<T>(), g, m, v, p_out.data<T>(), m_out.data<T>(),
                                       v_out.data<T>(), p.numel(), AdamWHyperOf(ctx.attrs), lr,
                                       step);
    }
  });
}

}  // namespace

void SgdUpdate(Var param, Var grad, Var momentum_buf, Var lr, const SgdOptions& options) {
  param.builder()->Emit("sgd_update", {param, grad, momentum_buf, lr},
                        {{"momentum", options.momentum}, {"weight_decay", options.weight_decay}});
}

void AdamWUpdate(Var param, Var grad, Var m, Var v, Var lr, Var step, const AdamWOptions& options) {
  param.builder()->Emit("adamw_update", {param, grad, m, v, lr, step},
                        {{"beta1", options.beta1},
                         {"beta2", options.beta2},
                         {"eps", options.eps},
                         {"weight_decay", options.weight_decay}});
}

void SgdUpdateInto(Var param, Var grad, Var momentum_buf, Var lr, Var param_out, Var momentum_out,
                   const SgdOptions& options) {
  param.builder()->Emit("sgd_update_into", {param, grad, momentum_buf, lr, param_out, momentum_out},
                        {{"momentum", options.momentum}, {"weight_decay", options.weight_decay}});
}

void AdamWUpdateInto(Var param, Var grad, Var m, Var v, Var lr, Var step, Var param_out, Var m_out,
                     Var v_out, const AdamWOptions& options) {
  param.builder()->Emit("adamw_update_into", {param, grad, m, v, lr, step, param_out, m_out, v_out},
                        {{"beta1", options.beta1},
                         {"beta2", options.beta2},
                         {"eps", options.eps},
                         {"weight_decay", options.weight_decay}});
}

void RegisterOptimizerOps(OpRegistry& r) {
  r.Register(
      {.name = "sgd_update",
       .kind = OpKind::kInPlace,
       .num_inputs = 4,
       .infer = InferSgd,
       .kernel = SgdKernel<true, false>,
       .reference = SgdKernel<false, false>,
       .doc = "one SGD step of param (and of momentum_buf when momentum > 0), PyTorch's semantics",
       .signature = {.inputs = {{"param", "float[...]"},
                                {"grad", "float[...]"},
                                {"momentum_buf", "float[...]"},
                                {"lr", "f32|f64[]"}},
                     .attrs = {{"momentum", "float = 0"}, {"weight_decay", "float = 0"}}},
       .updates = {0, 2}});
  r.Register(
      {.name = "adamw_update",
       .kind = OpKind::kInPlace,
       .num_inputs = 6,
       .infer = InferAdamW,
       .kernel = AdamWKernel<true, false>,
       .reference = AdamWKernel<false, false>,
       .doc = "one AdamW step of param and its moments m and v, PyTorch's semantics; step is t, "
              "counted from 1",
       .signature = {.inputs = {{"param", "float[...]"},
                                {"grad", "float[...]"},
                                {"m", "float[...]"},
                                {"v", "float[...]"},
                                {"lr", "f32|f64[]"},
                                {"step", "f32|f64|i64[]"}},
                     .attrs = {{"beta1", "float = 0.9"},
                               {"beta2", "float = 0.999"},
                               {"eps", "float = 1e-08"},
                               {"weight_decay", "float = 0.01"}}},
       .updates = {0, 2, 3}});
  r.Register(
      {.name = "sgd_update_into",
       .kind = OpKind::kInPlace,
       .num_inputs = 6,
       .infer = InferSgdInto,
       .kernel = SgdKernel<true, true>,
       .reference = SgdKernel<false, true>,
       .doc = "sgd_update read from param and momentum_buf, written to param_out and momentum_out",
       .signature = {.inputs = {{"param", "float[...]"},
                                {"grad", "float[...]"},
                                {"momentum_buf", "float[...]"},
                                {"lr", "f32|f64[]"},
                                {"param_out", "float[...]"},
                                {"momentum_out", "float[...]"}},
                     .attrs = {{"momentum", "float = 0"}, {"weight_decay", "float = 0"}}},
       .updates = {4, 5}});
  r.Register({.name = "adamw_update_into",
              .kind = OpKind::kInPlace,
              .num_inputs = 9,
              .infer = InferAdamWInto,
              .kernel = AdamWKernel<true, true>,
              .reference = AdamWKernel<false, true>,
              .doc = "adamw_update read from param, m and v, written to param_out, m_out and v_out",
              .signature = {.inputs = {{"param", "float[...]"},
                                       {"grad", "float[...]"},
                                       {"m", "float[...]"},
                                       {"v", "float[...]"},
                                       {"lr", "f32|f64[]"},
                                       {"step", "f32|f64|i64[]"},
                                       {"param_out", "float[...]"},
                                       {"m_out", "float[...]"},
                                       {"v_out", "float[...]"}},
                            .attrs = {{"beta1", "float = 0.9"},
                                      {"beta2", "float = 0.999"},
                                      {"eps", "float = 1e-08"},
                                      {"weight_decay", "float = 0.01"}}},
              .updates = {6, 7, 8}});
}

}  // namespace sluice
