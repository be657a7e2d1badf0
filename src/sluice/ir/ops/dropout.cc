// Dropout: registration, inference and VJP rule. Kernels: kernels/dropout.h.
#include "sluice/ir/ops/dropout.h"

#include <cmath>

#include "sluice/ir/ops/common.h"
#include "sluice/kernels/dropout.h"

namespace sluice {

namespace {

double DropProbability(const Attrs& attrs) {
  const double p = attrs.GetFloat("p");
  if (!(p >= 0 && p <= 1)) {
    throw ShapeError(
        fmt::format("dropout's p is the probability of dropping an element, from 0 "
                    "to 1; got {}",
                    p));
  }
  return p;
}

std::vector<TensorType> InferDropout(std::span<const TensorType> in, const Attrs& attrs) {
  DropProbability(attrs);
  if (attrs.GetInt("stream") < 0) {
    throw ShapeError(
        fmt::format("dropout's stream must be 0 or more, got {}", attrs.GetInt("stream")));
  }
  const DType t = in[0].dtype;
  if (t != DType::kF32 && t != DType::kF64 && t != DType::kBF16) {
    throw ShapeError(fmt::format("dropout's x must be f32, f64 or bf16, got {}", Name(t)));
  }
  const TensorType& key = in[1];
  if (key.dtype != DType::kI64 || key.shape.rank() > 1 || key.shape.numel() == 0) {
    throw ShapeError(
        fmt::format("dropout's key must be i64[B], one key per example (an input "
                    "bound to the data array random_key), or i64[]; got {}",
                    key.ToString()));
  }
  if (in[0].shape.numel() % key.shape.numel() != 0) {
    throw ShapeError(
        fmt::format("dropout's x {} does not split into the key's {} examples: its "
                    "leading axis must be the batch (or a multiple of it)",
                    in[0].ToString(), key.shape.numel()));
  }
  return {in[0]};
}

template <bool kFast>
void DropoutKernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const Tensor& y = ctx.outputs[0];
  const bool training = ctx.attrs.GetBool("training", true);
  const double p = training ? ctx.attrs.GetFloat("p") : 0.0;  // evaluation: x as it is
  const Tensor& key = ctx.inputs[1];
  const std::span<const int64_t> keys(key.data<int64_t>(), static_cast<size_t>(key.numel()));
  const auto stream = static_cast<uint64_t>(ctx.attrs.GetInt("stream"));
  auto run = [&]<typename T>() {
    (kFast ? kernels::DropoutFast<T> : kernels::DropoutReference<T>)(x.data<T>(), y.data<T>(),
                                                                     x.numel(), keys, stream, p);
  };
  if (x.dtype() == DType::kBF16) {
    run.template operator()<BFloat16>();
  } else {
    DispatchFloat(x.dtype(), "dropout", run);
  }
}

// dx = dy · keep / (1 − p): the same op on dy, the mask drawn again from the same key and stream.
std::vector<Var> DropoutVjp(VjpContext& ctx) {
  Var dy = ctx.dy(0);
  return {dy.builder()->Emit1("dropout", {dy, ctx.x(1)}, ctx.attrs()), Var()};
}

}  // namespace

Var Dropout(Var x, Var key, double p, int64_t stream) {
  return x.builder()->Emit1("dropout", {x, key}, {{"p", p}, {"stream", stream}});
}

void RegisterDropoutOps(OpRegistry& r) {
  r.Register(
      {.name = "dropout",
       .num_inputs = 2,
       .infer = InferDropout,
       .kernel = DropoutKernel<true>,
       .reference = DropoutKernel<false>,
       .vjp = DropoutVjp,
       .recomputable = true,
       .doc = "x · keep / (1 - p), keep drawn per element from (key, stream, index) by "
              "Philox-4x32-10, never stored; x when training = false",
       .signature = {.inputs = {{"x", "float or bf16[B, ...]"}, {"key", "i64[B]"}},
                     .attrs = {{"p", "float"}, {"stream", "int"}, {"training", "bool = true"}},
                     .outputs = {{"y", "x's dtype[...]"}}},
       .in_place_inputs = {0}});
}

}  // namespace sluice
