// Neural-network ops: registration, inference, kernel dispatch and VJP rules.
// Kernels: kernels/{softmax,layer_norm,rms_norm,embedding,cross_entropy}.h.
#include "sluice/ir/ops/nn.h"

#include <algorithm>
#include <cmath>

#include "sluice/ir/ops.h"
#include "sluice/ir/ops/common.h"
#include "sluice/kernels/bf16_activations.h"
#include "sluice/kernels/bf16_llama.h"
#include "sluice/kernels/cross_entropy.h"
#include "sluice/kernels/embedding.h"
#include "sluice/kernels/layer_norm.h"
#include "sluice/kernels/linear_cross_entropy.h"
#include "sluice/kernels/rms_norm.h"
#include "sluice/kernels/softmax.h"

namespace sluice {

namespace {

// x [..., C] seen as rows of C.
int64_t LastDim(const Shape& s) { return s[s.rank() - 1]; }
int64_t Rows(const Shape& s) {
  const int64_t c = LastDim(s);
  return c == 0 ? 0 : s.numel() / c;
}

// Dispatches on an index dtype: DispatchIndex(t, what, [&]<typename I>() { ... }).
template <typename F>
decltype(auto) DispatchIndex(DType t, std::string_view what, F&& f) {
  switch (t) {
    case DType::kI32:
      return f.template operator()<int32_t>();
    case DType::kI64:
      return f.template operator()<int64_t>();
    default:
      break;
  }
  throw ShapeError(fmt::format("{}: indices must be i32 or i64, not {}", what, Name(t)));
}

void RequireIndices(const TensorType& t, std::string_view what) {
  if (!IsInteger(t.dtype)) {
    throw ShapeError(fmt::format("{} must be i32 or i64, not {}", what, Name(t.dtype)));
  }
}

void RequireSameShape(const TensorType& a, const TensorType& b, std::string_view what) {
  if (a.shape != b.shape) {
    throw ShapeError(
        fmt::format("{}: shapes differ: {} vs {}", what, a.shape.ToString(), b.shape.ToString()));
  }
}

// ---- softmax, softmax_grad, causal_mask, causal_softmax ----

std::vector<TensorType> InferSoftmax(std::span<const TensorType> in, const Attrs&) {
  DType t = ops::SameFloatDType(in);
  if (in[0].shape.rank() < 1) {
    throw ShapeError("softmax needs rank 1 or more (it runs over the last axis), got a scalar");
  }
  return {{t, in[0].shape}};
}

std::vector<TensorType> InferSoftmaxGrad(std::span<const TensorType> in, const Attrs&) {
  DType t = ops::SameFloatDType(in);
  RequireSameShape(in[0], in[1], "dy and y");
  if (in[0].shape.rank() < 1) throw ShapeError("softmax_grad needs rank 1 or more, got scalars");
  return {{t, in[0].shape}};
}

std::vector<TensorType> InferCausal(std::span<const TensorType> in, const Attrs&) {
  DType t = ops::SameFloatDType(in);
  const Shape& s = in[0].shape;
  if (s.rank() < 2 || s[s.rank() - 1] != s[s.rank() - 2]) {
    throw ShapeError(fmt::format("scores must be [..., T, T] (square in the last two axes), got {}",
                                 s.ToString()));
  }
  return {{t, s}};
}

template <bool kFast>
void SoftmaxKernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  DispatchFloat(x.dtype(), "softmax", [&]<typename T>() {
    if constexpr (kFast) {
      kernels::SoftmaxFast<T>(x.data<T>(), ctx.outputs[0].data<T>(), Rows(x.shape()),
                              LastDim(x.shape()));
    } else {
      kernels::SoftmaxReference<T>(x.data<T>(), ctx.outputs[0].data<T>(), Rows(x.shape()),
                                   LastDim(x.shape()));
    }
  });
}

template <bool kFast>
void SoftmaxGradKernel(KernelContext& ctx) {
  const Tensor& dy = ctx.inputs[0];
  const Tensor& y = ctx.inputs[1];
  DispatchFloat(y.dtype(), "softmax_grad", [&]<typename T>() {
    const int64_t rows = Rows(y.shape()), cols = LastDim(y.shape());
    if constexpr (kFast) {
      kernels::SoftmaxGradFast<T>(dy.data<T>(), y.data<T>(), ctx.outputs[0].data<T>(), rows, cols);
    } else {
      kernels::SoftmaxGradReference<T>(dy.data<T>(), y.data<T>(), ctx.outputs[0].data<T>(), rows,
                                       cols);
    }
  });
}

template <bool kFast>
void CausalMaskKernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  const double value = ctx.attrs.GetFloat("value", -std::numeric_limits<double>::infinity());
  DispatchFloat(x.dtype(), "causal_mask", [&]<typename T>() {
    const int64_t t = LastDim(x.shape()), batch = t == 0 ? 0 : x.numel() / (t * t);
    if constexpr (kFast) {
      kernels::CausalMaskFast<T>(x.data<T>(), ctx.outputs[0].data<T>(), batch, t,
                                 static_cast<T>(value));
    } else {
      kernels::CausalMaskReference<T>(x.data<T>(), ctx.outputs[0].data<T>(), batch, t,
                                      static_cast<T>(value));
    }
  });
}

template <bool kFast>
void CausalSoftmaxKernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  DispatchFloat(x.dtype(), "causal_softmax", [&]<typename T>() {
    const int64_t t = LastDim(x.shape()), batch = t == 0 ? 0 : x.numel() / (t * t);
    if constexpr (kFast) {
      kernels::CausalSoftmaxFast<T>(x.data<T>(), ctx.outputs[0].data<T>(), batch, t);
    } else {
      kernels::CausalSoftmaxReference<T>(x.data<T>(), ctx.outputs[0].data<T>(), batch, t);
    }
  });
}

// Softmax (and causal softmax, whose masked outputs are 0) backward from y alone.
std::vector<Var> SoftmaxVjp(VjpContext& ctx) { return {SoftmaxGrad(ctx.dy(0), ctx.y(0))}; }
// The mask replaced those entries by a constant: no gradient flows to them.
std::vector<Var> CausalMaskVjp(VjpContext& ctx) { return {CausalMask(ctx.dy(0), 0.0)}; }

// ---- layer_norm and its two gradient ops ----

double Eps(const Attrs& attrs) { return attrs.GetFloat("eps", 1e-5); }

void RequireChannels(const TensorType& x, const TensorType& p, std::string_view what) {
  if (p.shape.rank() != 1 || p.shape[0] != LastDim(x.shape)) {
    throw ShapeError(fmt::format("{} must be [C] = [{}] for x {}, got {}", what, LastDim(x.shape),
                                 x.shape.ToString(), p.shape.ToString()));
  }
}

void RequireRank1(const TensorType& x, std::string_view what) {
  if (x.shape.rank() < 1) throw ShapeError(fmt::format("{} must be [..., C], got a scalar", what));
}

// Under mixed precision x and y are bf16, weight and bias f32 (kernels/bf16_activations.h).
std::vector<TensorType> InferLayerNorm(std::span<const TensorType> in, const Attrs& attrs) {
  DType t = ops::MixedFloatDType(in, {0});
  RequireRank1(in[0], "x");
  RequireChannels(in[0], in[1], "weight");
  RequireChannels(in[0], in[2], "bias");
  if (!(Eps(attrs) > 0)) throw ShapeError(fmt::format("eps must be positive, got {}", Eps(attrs)));
  return {{t, in[0].shape}};
}

// layer_norm_grad_x and rms_norm_grad_x: dy, x [..., C], weight [C] -> dx [..., C].
std::vector<TensorType> InferNormGradX(std::span<const TensorType> in, const Attrs&) {
  DType t = ops::SameFloatDType(in);
  RequireSameShape(in[0], in[1], "dy and x");
  RequireRank1(in[1], "x");
  RequireChannels(in[1], in[2], "weight");
  return {{t, in[1].shape}};
}

// layer_norm_grad_x and rms_norm_grad_x: as InferNormGradX, and x bf16 with dy and weight f32
// giving an f32 dx.
std::vector<TensorType> InferLayerNormGradX(std::span<const TensorType> in, const Attrs& attrs) {
  if (in[1].dtype != DType::kBF16) return InferNormGradX(in, attrs);
  ops::MixedFloatDType(in, {1});
  RequireSameShape(in[0], in[1], "dy and x");
  RequireRank1(in[1], "x");
  RequireChannels(in[1], in[2], "weight");
  return {{DType::kF32, in[1].shape}};
}

// dy, x of one dtype, or dy f32 with x bf16: f32 dweight and dbias then.
std::vector<TensorType> InferLayerNormGradParams(std::span<const TensorType> in, const Attrs&) {
  DType t = in[1].dtype == DType::kBF16 ? ops::MixedFloatDType(in, {1}) : ops::SameFloatDType(in);
  if (t == DType::kBF16) t = DType::kF32;
  RequireSameShape(in[0], in[1], "dy and x");
  RequireRank1(in[1], "x");
  const Shape c{LastDim(in[1].shape)};
  return {{t, c}, {t, c}};
}

template <bool kFast>
void LayerNormKernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  if (x.dtype() == DType::kBF16) {
    (kFast ? kernels::LayerNormBF16Fast : kernels::LayerNormBF16Reference)(
        x.data<BFloat16>(), ctx.inputs[1].data<float>(), ctx.inputs[2].data<float>(),
        ctx.outputs[0].data<BFloat16>(), Rows(x.shape()), LastDim(x.shape()),
        static_cast<float>(Eps(ctx.attrs)));
    return;
  }
  DispatchFloat(x.dtype(), "layer_norm", [&]<typename T>() {
    const int64_t rows = Rows(x.shape()), cols = LastDim(x.shape());
    const T eps = static_cast<T>(Eps(ctx.attrs));
    const T* w = ctx.inputs[1].data<T>();
    const T* b = ctx.inputs[2].data<T>();
    if constexpr (kFast) {
      kernels::LayerNormFast<T>(x.data<T>(), w, b, ctx.outputs[0].data<T>(), rows, cols, eps);
    } else {
      kernels::LayerNormReference<T>(x.data<T>(), w, b, ctx.outputs[0].data<T>(), rows, cols, eps);
    }
  });
}

template <bool kFast>
void LayerNormGradXKernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[1];
  if (x.dtype() == DType::kBF16) {
    (kFast ? kernels::LayerNormGradXBF16Fast : kernels::LayerNormGradXBF16Reference)(
        ctx.inputs[0].data<float>(), x.data<BFloat16>(), ctx.inputs[2].data<float>(),
        ctx.outputs[0].data<float>(), Rows(x.shape()), LastDim(x.shape()),
        static_cast<float>(Eps(ctx.attrs)));
    return;
  }
  DispatchFloat(x.dtype(), "layer_norm_grad_x", [&]<typename T>() {
    const int64_t rows = Rows(x.shape()), cols = LastDim(x.shape());
    const T eps = static_cast<T>(Eps(ctx.attrs));
    const T* dy = ctx.inputs[0].data<T>();
    const T* w = ctx.inputs[2].data<T>();
    if constexpr (kFast) {
      kernels::LayerNormGradXFast<T>(dy, x.data<T>(), w, ctx.outputs[0].data<T>(), rows, cols, eps);
    } else {
      kernels::LayerNormGradXReference<T>(dy, x.data<T>(), w, ctx.outputs[0].data<T>(), rows, cols,
                                          eps);
    }
  });
}

template <bool kFast>
void LayerNormGradParamsKernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[1];
  if (x.dtype() == DType::kBF16) {
    (kFast ? kernels::LayerNormGradParamsBF16Fast : kernels::LayerNormGradParamsBF16Reference)(
        ctx.inputs[0].data<float>(), x.data<BFloat16>(), ctx.outputs[0].data<float>(),
        ctx.outputs[1].data<float>(), Rows(x.shape()), LastDim(x.shape()),
        static_cast<float>(Eps(ctx.attrs)));
    return;
  }
  DispatchFloat(x.dtype(), "layer_norm_grad_params", [&]<typename T>() {
    const int64_t rows = Rows(x.shape()), cols = LastDim(x.shape());
    const T eps = static_cast<T>(Eps(ctx.attrs));
    const T* dy = ctx.inputs[0].data<T>();
    T* dw = ctx.outputs[0].data<T>();
    T* db = ctx.outputs[1].data<T>();
    if constexpr (kFast) {
      kernels::LayerNormGradParamsFast<T>(dy, x.data<T>(), dw, db, rows, cols, eps);
    } else {
      kernels::LayerNormGradParamsReference<T>(dy, x.data<T>(), dw, db, rows, cols, eps);
    }
  });
}

// dx needs weight; dweight and dbias come from one op that the zero-bubble split can defer to W.
std::vector<Var> LayerNormVjp(VjpContext& ctx) {
  const double eps = Eps(ctx.attrs());
  Var dy = ctx.dy(0);
  std::vector<Var> grads(3);
  if (ctx.needs(0)) grads[0] = LayerNormGradX(dy, ctx.x(0), ctx.x(1), eps);
  if (ctx.needs(1) || ctx.needs(2)) {
    auto [dw, db] = LayerNormGradParams(dy, ctx.x(0), eps);
    if (ctx.needs(1)) grads[1] = dw;
    if (ctx.needs(2)) grads[2] = db;
  }
  return grads;
}

// ---- rms_norm and its two gradient ops ----

double RmsEps(const Attrs& attrs) { return attrs.GetFloat("eps", 1e-6); }

// Under mixed precision x and y are bf16, weight f32 (kernels/bf16_llama.h).
std::vector<TensorType> InferRmsNorm(std::span<const TensorType> in, const Attrs& attrs) {
  DType t = ops::MixedFloatDType(in, {0});
  RequireRank1(in[0], "x");
  RequireChannels(in[0], in[1], "weight");
  if (!(RmsEps(attrs) > 0)) {
    throw ShapeError(fmt::format("eps must be positive, got {}", RmsEps(attrs)));
  }
  return {{t, in[0].shape}};
}

// dy, x of one dtype, or dy f32 with x bf16: an f32 dweight then.
std::vector<TensorType> InferRmsNormGradWeight(std::span<const TensorType> in, const Attrs&) {
  DType t = in[1].dtype == DType::kBF16 ? ops::MixedFloatDType(in, {1}) : ops::SameFloatDType(in);
  if (t == DType::kBF16) t = DType::kF32;
  RequireSameShape(in[0], in[1], "dy and x");
  RequireRank1(in[1], "x");
  return {{t, Shape{LastDim(in[1].shape)}}};
}

template <bool kFast>
void RmsNormKernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[0];
  if (x.dtype() == DType::kBF16) {
    (kFast ? kernels::RmsNormBF16Fast : kernels::RmsNormBF16Reference)(
        x.data<BFloat16>(), ctx.inputs[1].data<float>(), ctx.outputs[0].data<BFloat16>(),
        Rows(x.shape()), LastDim(x.shape()), static_cast<float>(RmsEps(ctx.attrs)));
    return;
  }
  DispatchFloat(x.dtype(), "rms_norm", [&]<typename T>() {
    const int64_t rows = Rows(x.shape()), cols = LastDim(x.shape());
    const T eps = static_cast<T>(RmsEps(ctx.attrs));
    const T* w = ctx.inputs[1].data<T>();
    if constexpr (kFast) {
      kernels::RmsNormFast<T>(x.data<T>(), w, ctx.outputs[0].data<T>(), rows, cols, eps);
    } else {
      kernels::RmsNormReference<T>(x.data<T>(), w, ctx.outputs[0].data<T>(), rows, cols, eps);
    }
  });
}

template <bool kFast>
void RmsNormGradXKernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[1];
  if (x.dtype() == DType::kBF16) {
    (kFast ? kernels::RmsNormGradXBF16Fast : kernels::RmsNormGradXBF16Reference)(
        ctx.inputs[0].data<float>(), x.data<BFloat16>(), ctx.inputs[2].data<float>(),
        ctx.outputs[0].data<float>(), Rows(x.shape()), LastDim(x.shape()),
        static_cast<float>(RmsEps(ctx.attrs)));
    return;
  }
  DispatchFloat(x.dtype(), "rms_norm_grad_x", [&]<typename T>() {
    const int64_t rows = Rows(x.shape()), cols = LastDim(x.shape());
    const T eps = static_cast<T>(RmsEps(ctx.attrs));
    const T* dy = ctx.inputs[0].data<T>();
    const T* w = ctx.inputs[2].data<T>();
    if constexpr (kFast) {
      kernels::RmsNormGradXFast<T>(dy, x.data<T>(), w, ctx.outputs[0].data<T>(), rows, cols, eps);
    } else {
      kernels::RmsNormGradXReference<T>(dy, x.data<T>(), w, ctx.outputs[0].data<T>(), rows, cols,
                                        eps);
    }
  });
}

template <bool kFast>
void RmsNormGradWeightKernel(KernelContext& ctx) {
  const Tensor& x = ctx.inputs[1];
  if (x.dtype() == DType::kBF16) {
    (kFast ? kernels::RmsNormGradWeightBF16Fast : kernels::RmsNormGradWeightBF16Reference)(
        ctx.inputs[0].data<float>(), x.data<BFloat16>(), ctx.outputs[0].data<float>(),
        Rows(x.shape()), LastDim(x.shape()), static_cast<float>(RmsEps(ctx.attrs)));
    return;
  }
  DispatchFloat(x.dtype(), "rms_norm_grad_weight", [&]<typename T>() {
    const int64_t rows = Rows(x.shape()), cols = LastDim(x.shape());
    const T eps = static_cast<T>(RmsEps(ctx.attrs));
    const T* dy = ctx.inputs[0].data<T>();
    T* dw = ctx.outputs[0].data<T>();
    if constexpr (kFast) {
      kernels::RmsNormGradWeightFast<T>(dy, x.data<T>(), dw, rows, cols, eps);
    } else {
      kernels::RmsNormGradWeightReference<T>(dy, x.data<T>(), dw, rows, cols, eps);
    }
  });
}

// dx needs weight; dweight comes from an op of its own that the zero-bubble split can defer to W.
std::vector<Var> RmsNormVjp(VjpContext& ctx) {
  const double eps = RmsEps(ctx.attrs());
  Var dy = ctx.dy(0);
  std::vector<Var> grads(2);
  if (ctx.needs(0)) grads[0] = RmsNormGradX(dy, ctx.x(0), ctx.x(1), eps);
  if (ctx.needs(1)) grads[1] = RmsNormGradWeight(dy, ctx.x(0), eps);
  return grads;
}

// ---- embedding, embedding_grad ----

Shape WithChannels(const Shape& ids, int64_t c) {
  if (ids.rank() + 1 > kMaxRank) {
    throw ShapeError(fmt::format("ids {} have too many axes", ids.ToString()));
  }
  std::vector<int64_t> dims(ids.dims().begin(), ids.dims().end());
  dims.push_back(c);
  return Shape(std::span<const int64_t>(dims));
}

// nn.Embedding's padding_idx: the row whose gradient is zero (PyTorch never trains it); -1: none.
int64_t PaddingIdx(const Attrs& attrs, int64_t vocab) {
  const int64_t p = attrs.GetInt("padding_idx", -1);
  if (p < -1 || p >= vocab) {
    throw ShapeError(fmt::format(
        "padding_idx must be a row of the table, [0, {}), or -1 (none), got {}", vocab, p));
  }
  return p;
}

std::vector<TensorType> InferEmbedding(std::span<const TensorType> in, const Attrs& attrs) {
  RequireIndices(in[0], "ids");
  DType t = ops::SameFloatDType(in.subspan(1));
  if (in[1].shape.rank() != 2) {
    throw ShapeError(fmt::format("table must be [vocab, C], got {}", in[1].shape.ToString()));
  }
  PaddingIdx(attrs, in[1].shape[0]);
  return {{t, WithChannels(in[0].shape, in[1].shape[1])}};
}

std::vector<TensorType> InferEmbeddingGrad(std::span<const TensorType> in, const Attrs& attrs) {
  RequireIndices(in[0], "ids");
  DType t = ops::SameFloatDType(in.subspan(1));
  const int64_t v = attrs.GetInt("num_embeddings");
  if (v < 0) throw ShapeError(fmt::format("num_embeddings must be ≥ 0, got {}", v));
  PaddingIdx(attrs, v);
  const Shape& dy = in[1].shape;
  if (dy.rank() != in[0].shape.rank() + 1 || WithChannels(in[0].shape, dy[dy.rank() - 1]) != dy) {
    throw ShapeError(fmt::format("dy must be ids' shape plus channels ({} + [C]), got {}",
                                 in[0].shape.ToString(), dy.ToString()));
  }
  return {{t, Shape{v, dy[dy.rank() - 1]}}};
}

template <bool kFast>
void EmbeddingKernel(KernelContext& ctx) {
  const Tensor& ids = ctx.inputs[0];
  const Tensor& table = ctx.inputs[1];
  DispatchFloat(table.dtype(), "embedding", [&]<typename T>() {
    DispatchIndex(ids.dtype(), "embedding", [&]<typename I>() {
      const int64_t v = table.shape()[0], c = table.shape()[1];
      if constexpr (kFast) {
        kernels::EmbeddingFast<T, I>(ids.data<I>(), table.data<T>(), ctx.outputs[0].data<T>(),
                                     ids.numel(), v, c);
      } else {
        kernels::EmbeddingReference<T, I>(ids.data<I>(), table.data<T>(), ctx.outputs[0].data<T>(),
                                          ids.numel(), v, c);
      }
    });
  });
}

template <bool kFast>
void EmbeddingGradKernel(KernelContext& ctx) {
  const Tensor& ids = ctx.inputs[0];
  const Tensor& dy = ctx.inputs[1];
  const Tensor& out = ctx.outputs[0];
  DispatchFloat(dy.dtype(), "embedding_grad", [&]<typename T>() {
    DispatchIndex(ids.dtype(), "embedding_grad", [&]<typename I>() {
      const int64_t v = out.shape()[0], c = out.shape()[1];
      if constexpr (kFast) {
        kernels::EmbeddingGradFast<T, I>(ids.data<I>(), dy.data<T>(), out.data<T>(), ids.numel(), v,
                                         c);
      } else {
        kernels::EmbeddingGradReference<T, I>(ids.data<I>(), dy.data<T>(), out.data<T>(),
                                              ids.numel(), v, c);
      }
      // The padding row gets no gradient, whatever its ids' rows of dy hold.
      if (const int64_t p = PaddingIdx(ctx.attrs, v); p >= 0) {
        std::fill_n(out.data<T>() + p * c, c, T(0));
      }
    });
  });
}

std::vector<Var> EmbeddingVjp(VjpContext& ctx) {
  std::vector<Var> grads(2);
  if (!ctx.needs(1)) return grads;
  const int64_t vocab = ctx.x_type(1).shape[0];
  const int64_t padding_idx = PaddingIdx(ctx.attrs(), vocab);
  if (padding_idx < 0) {
    grads[1] = EmbeddingGrad(ctx.x(0), ctx.dy(0), vocab);
  } else {
    grads[1] = ctx.builder().Emit1("embedding_grad", {ctx.x(0), ctx.dy(0)},
                                   {{"num_embeddings", vocab}, {"padding_idx", padding_idx}});
  }
  return grads;
}

// ---- cross_entropy, cross_entropy_grad ----

void CheckLogitsAndTargets(const TensorType& logits, const TensorType& targets) {
  RequireIndices(targets, "targets");
  const Shape& s = logits.shape;
  if (s.rank() < 2) {
    throw ShapeError(fmt::format(
        "logits must be [N, vocab] or [B, T, vocab] (rank 2 or more), got {}", s.ToString()));
  }
  std::vector<int64_t> lead(s.dims().begin(), s.dims().end() - 1);
  if (targets.shape != Shape(std::span<const int64_t>(lead))) {
    throw ShapeError(fmt::format(
        "targets must be logits' shape without the vocab axis ({} for logits {}), got {}",
        Shape(std::span<const int64_t>(lead)).ToString(), s.ToString(), targets.shape.ToString()));
  }
  if (targets.shape.numel() == 0) {
    throw ShapeError("there are no tokens: the mean loss is undefined");
  }
}

// The attributes label_smoothing (in [0, 1]) and reduction ("mean" or "sum").
kernels::CrossEntropyOptions CrossEntropyOptionsOf(const Attrs& attrs) {
  const double smoothing = attrs.GetFloat("label_smoothing", 0.0);
  if (!(smoothing >= 0.0 && smoothing <= 1.0)) {
    throw ShapeError(fmt::format("label_smoothing must be in [0, 1], got {}", smoothing));
  }
  const std::string reduction = attrs.Has("reduction") ? attrs.GetString("reduction") : "mean";
  if (reduction != "mean" && reduction != "sum") {
    throw ShapeError(fmt::format("reduction must be \"mean\" or \"sum\", got \"{}\"", reduction));
  }
  return {.smoothing = smoothing, .sum = reduction == "sum"};
}

std::vector<TensorType> InferCrossEntropy(std::span<const TensorType> in, const Attrs& attrs) {
  DType t = ops::SameFloatDType(in.subspan(0, 1));
  CheckLogitsAndTargets(in[0], in[1]);
  CrossEntropyOptionsOf(attrs);
  return {{t, Shape{}}};
}

std::vector<TensorType> InferCrossEntropyGrad(std::span<const TensorType> in, const Attrs& attrs) {
  const TensorType floats[] = {in[0], in[2]};
  DType t = ops::SameFloatDType(floats);
  CheckLogitsAndTargets(in[0], in[1]);
  CrossEntropyOptionsOf(attrs);
  if (in[2].shape.rank() != 0) {
    throw ShapeError(fmt::format("dloss must be a scalar [], got {}", in[2].shape.ToString()));
  }
  return {{ops::GradientDTypeAttr(t, attrs, t == DType::kF32), in[0].shape}};
}

template <bool kFast>
void CrossEntropyKernel(KernelContext& ctx) {
  const Tensor& logits = ctx.inputs[0];
  const Tensor& targets = ctx.inputs[1];
  DispatchFloat(logits.dtype(), "cross_entropy", [&]<typename T>() {
    DispatchIndex(targets.dtype(), "cross_entropy", [&]<typename I>() {
      const int64_t n = targets.numel(), v = LastDim(logits.shape());
      const kernels::CrossEntropyOptions options = CrossEntropyOptionsOf(ctx.attrs);
      T* loss = ctx.outputs[0].data<T>();
      if constexpr (kFast) {
        *loss = kernels::CrossEntropyFast<T, I>(logits.data<T>(), targets.data<I>(), n, v, options);
      } else {
        *loss = kernels::CrossEntropyReference<T, I>(logits.data<T>(), targets.data<I>(), n, v,
                                                     options);
      }
    });
  });
}

template <bool kFast>
void CrossEntropyGradKernel(KernelContext& ctx) {
  const Tensor& logits = ctx.inputs[0];
  const Tensor& targets = ctx.inputs[1];
  if (ctx.outputs[0].dtype() == DType::kBF16) {  // f32 logits, dlogits rounded as stored
    DispatchIndex(targets.dtype(), "cross_entropy_grad", [&]<typename I>() {
      const int64_t n = targets.numel(), v = LastDim(logits.shape());
      (kFast ? kernels::CrossEntropyGradBF16Fast<I>
             : kernels::CrossEntropyGradBF16Reference<I>)(logits.data<float>(), targets.data<I>(),
                                                          ctx.inputs[2].data<float>()[0],
                                                          ctx.outputs[0].data<BFloat16>(), n, v,
                                                          CrossEntropyOptionsOf(ctx.attrs));
    });
    return;
  }
  DispatchFloat(logits.dtype(), "cross_entropy_grad", [&]<typename T>() {
    DispatchIndex(targets.dtype(), "cross_entropy_grad", [&]<typename I>() {
      const int64_t n = targets.numel(), v = LastDim(logits.shape());
      const T dloss = ctx.inputs[2].data<T>()[0];
      const kernels::CrossEntropyOptions options = CrossEntropyOptionsOf(ctx.attrs);
      T* out = ctx.outputs[0].data<T>();
      if constexpr (kFast) {
        kernels::CrossEntropyGradFast<T, I>(logits.data<T>(), targets.data<I>(), dloss, out, n, v,
                                            options);
      } else {
        kernels::CrossEntropyGradReference<T, I>(logits.data<T>(), targets.data<I>(), dloss, out, n,
                                                 v, options);
      }
    });
  });
}

std::vector<Var> CrossEntropyVjp(VjpContext& ctx) {
  Var logits = ctx.x(0);
  return {logits.builder()->Emit1("cross_entropy_grad", {logits, ctx.x(1), ctx.dy(0)}, ctx.attrs()),
          Var()};
}

// ---- linear_cross_entropy, linear_cross_entropy_grad ----

// x [..., C], w [vocab, C], targets x's shape without C; returns N, the tokens.
int64_t CheckLinearCrossEntropy(std::span<const TensorType> in, const Attrs& attrs) {
  const TensorType floats[] = {in[0], in[1]};
  ops::SameFloatDType(floats);
  RequireIndices(in[2], "targets");
  const Shape &x = in[0].shape, &w = in[1].shape;
  if (x.rank() < 2) {
    throw ShapeError(
        fmt::format("x must be [N, C] or [B, T, C] (rank 2 or more), got {}", x.ToString()));
  }
  if (w.rank() != 2 || w[1] != LastDim(x)) {
    throw ShapeError(fmt::format("w must be [vocab, C] with C = {} (x's last axis, x {}), got {}",
                                 LastDim(x), x.ToString(), w.ToString()));
  }
  std::vector<int64_t> lead(x.dims().begin(), x.dims().end() - 1);
  if (in[2].shape != Shape(std::span<const int64_t>(lead))) {
    throw ShapeError(fmt::format(
        "targets must be x's shape without its last axis ({} for x {}), got {}",
        Shape(std::span<const int64_t>(lead)).ToString(), x.ToString(), in[2].shape.ToString()));
  }
  if (in[2].shape.numel() == 0) throw ShapeError("there are no tokens: the mean loss is undefined");
  if (attrs.GetInt("chunk", 0) < 0) {
    throw ShapeError(
        fmt::format("chunk must be 0 (automatic) or a positive number of tokens, got {}",
                    attrs.GetInt("chunk", 0)));
  }
  return in[2].shape.numel();
}

std::vector<TensorType> InferLinearCrossEntropy(std::span<const TensorType> in,
                                                const Attrs& attrs) {
  CheckLinearCrossEntropy(in, attrs);
  return {{in[0].dtype, Shape{}}};
}

std::vector<TensorType> InferLinearCrossEntropyGrad(std::span<const TensorType> in,
                                                    const Attrs& attrs) {
  CheckLinearCrossEntropy(in.first(3), attrs);
  if (in[3].dtype != in[0].dtype || in[3].shape.rank() != 0) {
    throw ShapeError(
        fmt::format("dloss must be a scalar {}[], got {}", Name(in[0].dtype), in[3].ToString()));
  }
  return {in[0], in[1]};
}

// The kernel's scratch: one chunk's logits, [rows, vocab].
int64_t LinearCrossEntropyScratch(std::span<const TensorType> in, const Attrs& attrs) {
  const int64_t n = in[2].shape.numel(), c = LastDim(in[0].shape), vocab = in[1].shape[0];
  const int64_t rows = kernels::LinearCrossEntropyChunk(n, c, vocab, attrs.GetInt("chunk", 0));
  return rows * vocab * static_cast<int64_t>(SizeOf(in[0].dtype));
}

template <bool kFast>
void LinearCrossEntropyKernel(KernelContext& ctx) {
  const Tensor &x = ctx.inputs[0], &w = ctx.inputs[1], &targets = ctx.inputs[2];
  DispatchFloat(x.dtype(), "linear_cross_entropy", [&]<typename T>() {
    DispatchIndex(targets.dtype(), "linear_cross_entropy", [&]<typename I>() {
      const int64_t n = targets.numel(), c = LastDim(x.shape()), vocab = w.shape()[0];
      const int64_t rows =
          kernels::LinearCrossEntropyChunk(n, c, vocab, ctx.attrs.GetInt("chunk", 0));
      const Tensor scratch = Tensor::Empty({rows, vocab}, x.dtype(), ctx.allocator);
      T* loss = ctx.outputs[0].data<T>();
      if constexpr (kFast) {
        *loss = kernels::LinearCrossEntropyFast<T, I>(x.data<T>(), w.data<T>(), targets.data<I>(),
                                                      n, c, vocab, rows, scratch.data<T>());
      } else {
        *loss = kernels::LinearCrossEntropyReference<T, I>(
            x.data<T>(), w.data<T>(), targets.data<I>(), n, c, vocab, rows, scratch.data<T>());
      }
    });
  });
}

template <bool kFast>
void LinearCrossEntropyGradKernel(KernelContext& ctx) {
  const Tensor &x = ctx.inputs[0], &w = ctx.inputs[1], &targets = ctx.inputs[2];
  DispatchFloat(x.dtype(), "linear_cross_entropy_grad", [&]<typename T>() {
    DispatchIndex(targets.dtype(), "linear_cross_entropy_grad", [&]<typename I>() {
      const int64_t n = targets.numel(), c = LastDim(x.shape()), vocab = w.shape()[0];
      const int64_t rows =
          kernels::LinearCrossEntropyChunk(n, c, vocab, ctx.attrs.GetInt("chunk", 0));
      const Tensor scratch = Tensor::Empty({rows, vocab}, x.dtype(), ctx.allocator);
      const T dloss = ctx.inputs[3].data<T>()[0];
      T* dx = ctx.outputs[0].data<T>();
      T* dw = ctx.outputs[1].data<T>();
      if constexpr (kFast) {
        kernels::LinearCrossEntropyGradFast<T, I>(x.data<T>(), w.data<T>(), targets.data<I>(),
                                                  dloss, n, c, vocab, rows, scratch.data<T>(), dx,
                                                  dw);
      } else {
        kernels::LinearCrossEntropyGradReference<T, I>(x.data<T>(), w.data<T>(), targets.data<I>(),
                                                       dloss, n, c, vocab, rows, scratch.data<T>(),
                                                       dx, dw);
      }
    });
  });
}

std::vector<Var> LinearCrossEntropyVjp(VjpContext& ctx) {
  const std::pair<Var, Var> g = LinearCrossEntropyGrad(ctx.x(0), ctx.x(1), ctx.x(2), ctx.dy(0),
                                                       ctx.attrs().GetInt("chunk", 0));
  return {ctx.needs(0) ? g.first : Var(), ctx.needs(1) ? g.second : Var(), Var()};
}

}  // namespace

Var LinearCrossEntropy(Var x, Var w, Var targets, int64_t chunk) {
  Attrs attrs;
  if (chunk != 0) attrs.Set("chunk", chunk);
  return x.builder()->Emit1("linear_cross_entropy", {x, w, targets}, std::move(attrs));
}
std::pair<Var, Var> LinearCrossEntropyGrad(Var x, Var w, Var targets, Var dloss, int64_t chunk) {
  Attrs attrs;
  if (chunk != 0) attrs.Set("chunk", chunk);
  std::vector<Var> out =
      x.builder()->Emit("linear_cross_entropy_grad", {x, w, targets, dloss}, std::move(attrs));
  return {out[0], out[1]};
}

Var Softmax(Var x) { return x.builder()->Emit1("softmax", {x}); }
Var SoftmaxGrad(Var dy, Var y) { return dy.builder()->Emit1("softmax_grad", {dy, y}); }

Var CausalMask(Var scores, double value) {
  Attrs attrs;
  if (!(std::isinf(value) && value < 0)) attrs.Set("value", value);
  return scores.builder()->Emit1("causal_mask", {scores}, std::move(attrs));
}
Var CausalSoftmax(Var scores) { return scores.builder()->Emit1("causal_softmax", {scores}); }

Var LayerNorm(Var x, Var weight, Var bias, double eps) {
  return x.builder()->Emit1("layer_norm", {x, weight, bias}, {{"eps", eps}});
}
Var LayerNormGradX(Var dy, Var x, Var weight, double eps) {
  return dy.builder()->Emit1("layer_norm_grad_x", {dy, x, weight}, {{"eps", eps}});
}
std::pair<Var, Var> LayerNormGradParams(Var dy, Var x, double eps) {
  std::vector<Var> out = dy.builder()->Emit("layer_norm_grad_params", {dy, x}, {{"eps", eps}});
  return {out[0], out[1]};
}

Var RmsNorm(Var x, Var weight, double eps) {
  return x.builder()->Emit1("rms_norm", {x, weight}, {{"eps", eps}});
}
Var RmsNormGradX(Var dy, Var x, Var weight, double eps) {
  return dy.builder()->Emit1("rms_norm_grad_x", {dy, x, weight}, {{"eps", eps}});
}
Var RmsNormGradWeight(Var dy, Var x, double eps) {
  return dy.builder()->Emit1("rms_norm_grad_weight", {dy, x}, {{"eps", eps}});
}

Var Embedding(Var ids, Var table) { return table.builder()->Emit1("embedding", {ids, table}); }
Var EmbeddingGrad(Var ids, Var dy, int64_t num_embeddings) {
  return dy.builder()->Emit1("embedding_grad", {ids, dy}, {{"num_embeddings", num_embeddings}});
}

Var CrossEntropy(Var logits, Var targets) {
  return logits.builder()->Emit1("cross_entropy", {logits, targets});
}
Var CrossEntropyGrad(Var logits, Var targets, Var dloss) {
  return logits.builder()->Emit1("cross_entropy_grad", {logits, targets, dloss});
}

void RegisterNnOps(OpRegistry& r) {
  r.Register(
      {.name = "softmax",
       .num_inputs = 1,
       .infer = InferSoftmax,
       .kernel = SoftmaxKernel<true>,
       .reference = SoftmaxKernel<false>,
       .vjp = SoftmaxVjp,
       .doc = "softmax over the last axis (row max subtracted)",
       .signature = {.inputs = {{"x", "float[..., C]"}}, .outputs = {{"y", "float[..., C]"}}}});
  r.Register({.name = "softmax_grad",
              .num_inputs = 2,
              .infer = InferSoftmaxGrad,
              .kernel = SoftmaxGradKernel<true>,
              .reference = SoftmaxGradKernel<false>,
              .doc = "softmax backward: y·(dy − Σ dy·y) over the last axis",
              .signature = {.inputs = {{"dy", "float[..., C]"}, {"y", "float[..., C]"}},
                            .outputs = {{"dx", "float[..., C]"}}}});
  r.Register({.name = "causal_mask",
              .num_inputs = 1,
              .infer = InferCausal,
              .kernel = CausalMaskKernel<true>,
              .reference = CausalMaskKernel<false>,
              .vjp = CausalMaskVjp,
              .doc = "scores with the entries j > i (keys after the query) set to value",
              .signature = {.inputs = {{"scores", "float[..., T, T]"}},
                            .attrs = {{"value", "float = -inf"}},
                            .outputs = {{"y", "float[..., T, T]"}}}});
  r.Register({.name = "causal_softmax",
              .num_inputs = 1,
              .infer = InferCausal,
              .kernel = CausalSoftmaxKernel<true>,
              .reference = CausalSoftmaxKernel<false>,
              .vjp = SoftmaxVjp,
              .doc = "softmax(causal_mask(scores)) fused: exact zeros for j > i",
              .signature = {.inputs = {{"scores", "float[..., T, T]"}},
                            .outputs = {{"y", "float[..., T, T]"}}}});
  r.Register(
      {.name = "layer_norm",
       .num_inputs = 3,
       .infer = InferLayerNorm,
       .kernel = LayerNormKernel<true>,
       .reference = LayerNormKernel<false>,
       .vjp = LayerNormVjp,
       .recomputable = true,
       .doc = "layer normalization over the last axis (biased variance), then weight and bias; "
              "bf16 x gives bf16 y, the statistics in f32",
       .signature = {
           .inputs = {{"x", "float or bf16[..., C]"}, {"weight", "float[C]"}, {"bias", "float[C]"}},
           .attrs = {{"eps", "float = 1e-05"}},
           .outputs = {{"y", "x's dtype[..., C]"}}}});
  r.Register({.name = "layer_norm_grad_x",
              .num_inputs = 3,
              .infer = InferLayerNormGradX,
              .kernel = LayerNormGradXKernel<true>,
              .reference = LayerNormGradXKernel<false>,
              .doc = "layer_norm backward for x (recomputes mean and rstd); bf16 x: f32 dy and dx",
              .signature = {.inputs = {{"dy", "float[..., C]"},
                                       {"x", "float or bf16[..., C]"},
                                       {"weight", "float[C]"}},
                            .attrs = {{"eps", "float = 1e-05"}},
                            .outputs = {{"dx", "float[..., C]"}}}});
  r.Register({.name = "layer_norm_grad_params",
              .num_inputs = 2,
              .infer = InferLayerNormGradParams,
              .kernel = LayerNormGradParamsKernel<true>,
              .reference = LayerNormGradParamsKernel<false>,
              .doc = "layer_norm backward for weight and bias (recomputes mean and rstd); bf16 x: "
                     "f32 dy and outputs",
              .signature = {.inputs = {{"dy", "float[..., C]"}, {"x", "float or bf16[..., C]"}},
                            .attrs = {{"eps", "float = 1e-05"}},
                            .outputs = {{"dweight", "float[C]"}, {"dbias", "float[C]"}}}});
  r.Register({.name = "rms_norm",
              .num_inputs = 2,
              .infer = InferRmsNorm,
              .kernel = RmsNormKernel<true>,
              .reference = RmsNormKernel<false>,
              .vjp = RmsNormVjp,
              .recomputable = true,
              .doc =
                  "RMS normalization over the last axis (x / sqrt(mean(x²) + eps)), then weight; "
                  "bf16 x gives bf16 y, rstd in f32",
              .signature = {.inputs = {{"x", "float or bf16[..., C]"}, {"weight", "float[C]"}},
                            .attrs = {{"eps", "float = 1e-06"}},
                            .outputs = {{"y", "x's dtype[..., C]"}}}});
  r.Register({.name = "rms_norm_grad_x",
              .num_inputs = 3,
              .infer = InferLayerNormGradX,
              .kernel = RmsNormGradXKernel<true>,
              .reference = RmsNormGradXKernel<false>,
              .doc = "rms_norm backward for x (recomputes rstd); bf16 x: f32 dy and dx",
              .signature = {.inputs = {{"dy", "float[..., C]"},
                                       {"x", "float or bf16[..., C]"},
                                       {"weight", "float[C]"}},
                            .attrs = {{"eps", "float = 1e-06"}},
                            .outputs = {{"dx", "float[..., C]"}}}});
  r.Register({.name = "rms_norm_grad_weight",
              .num_inputs = 2,
              .infer = InferRmsNormGradWeight,
              .kernel = RmsNormGradWeightKernel<true>,
              .reference = RmsNormGradWeightKernel<false>,
              .doc = "rms_norm backward for weight (recomputes rstd); bf16 x: f32 dy and dweight",
              .signature = {.inputs = {{"dy", "float[..., C]"}, {"x", "float or bf16[..., C]"}},
                            .attrs = {{"eps", "float = 1e-06"}},
                            .outputs = {{"dweight", "float[C]"}}}});
  r.Register({.name = "embedding",
              .num_inputs = 2,
              .infer = InferEmbedding,
              .kernel = EmbeddingKernel<true>,
              .reference = EmbeddingKernel<false>,
              .vjp = EmbeddingVjp,
              .doc = "the rows of table picked by ids (an id outside [0, vocab) is an error); "
                     "row padding_idx gets no gradient (nn.Embedding's padding_idx)",
              .signature = {.inputs = {{"ids", "int[...]"}, {"table", "float[vocab, C]"}},
                            .attrs = {{"padding_idx", "int = -1"}},
                            .outputs = {{"y", "float[..., C]"}}}});
  r.Register(
      {.name = "embedding_grad",
       .num_inputs = 2,
       .infer = InferEmbeddingGrad,
       .kernel = EmbeddingGradKernel<true>,
       .reference = EmbeddingGradKernel<false>,
       .doc = "scatter-add of the rows of dy by ids into zeros, in token order (deterministic); "
              "row padding_idx left zero",
       .signature = {.inputs = {{"ids", "int[...]"}, {"dy", "float[..., C]"}},
                     .attrs = {{"num_embeddings", "int"}, {"padding_idx", "int = -1"}},
                     .outputs = {{"dtable", "float[num_embeddings, C]"}}}});
  r.Register({.name = "cross_entropy",
              .num_inputs = 2,
              .infer = InferCrossEntropy,
              .kernel = CrossEntropyKernel<true>,
              .reference = CrossEntropyKernel<false>,
              .vjp = CrossEntropyVjp,
              .doc =
                  "mean over tokens of −log softmax(logits)[target], fused log-sum-exp; a target "
                  "of -1 does not count; label_smoothing moves that share of the target onto "
                  "every class, reduction \"sum\" sums instead (PyTorch's cross_entropy)",
              .signature = {
                  .inputs = {{"logits", "float[..., vocab]"}, {"targets", "int[...]"}},
                  .attrs = {{"label_smoothing", "float = 0"}, {"reduction", "string = \"mean\""}},
                  .outputs = {{"loss", "float[]"}}}});
  r.Register({.name = "cross_entropy_grad",
              .num_inputs = 3,
              .infer = InferCrossEntropyGrad,
              .kernel = CrossEntropyGradKernel<true>,
              .reference = CrossEntropyGradKernel<false>,
              .doc = "(dloss/N)·(softmax(logits) − (1 − ε)·onehot(targets) − ε/vocab) over the N "
                     "counted tokens (dloss alone for reduction \"sum\"), softmax recomputed; "
                     "f32 logits with dtype = \"bf16\": dlogits rounded as they are stored",
              .signature = {.inputs = {{"logits", "float[..., vocab]"},
                                       {"targets", "int[...]"},
                                       {"dloss", "float[]"}},
                            .attrs = {{"label_smoothing", "float = 0"},
                                      {"reduction", "string = \"mean\""},
                                      {"dtype", "string = logits' dtype"}},
                            .outputs = {{"dlogits", "float or bf16[..., vocab]"}}}});
  r.Register({.name = "linear_cross_entropy",
              .num_inputs = 3,
              .infer = InferLinearCrossEntropy,
              .kernel = LinearCrossEntropyKernel<true>,
              .reference = LinearCrossEntropyKernel<false>,
              .vjp = LinearCrossEntropyVjp,
              .doc = "cross_entropy(x·wᵀ, targets) over chunks of tokens: the [N, vocab] logits "
                     "are never whole (kernels/linear_cross_entropy.h)",
              .signature = {.inputs = {{"x", "float[..., C]"},
                                       {"w", "float[vocab, C]"},
                                       {"targets", "int[...]"}},
                            .attrs = {{"chunk", "int = 0"}},
                            .outputs = {{"loss", "float[]"}}},
              .scratch_bytes = LinearCrossEntropyScratch});
  r.Register({.name = "linear_cross_entropy_grad",
              .num_inputs = 4,
              .infer = InferLinearCrossEntropyGrad,
              .kernel = LinearCrossEntropyGradKernel<true>,
              .reference = LinearCrossEntropyGradKernel<false>,
              .doc = "dx and dw of linear_cross_entropy, each chunk's logits recomputed and turned "
                     "into their gradient in place",
              .signature = {.inputs = {{"x", "float[..., C]"},
                                       {"w", "float[vocab, C]"},
                                       {"targets", "int[...]"},
                                       {"dloss", "float[]"}},
                            .attrs = {{"chunk", "int = 0"}},
                            .outputs = {{"dx", "float[..., C]"}, {"dw", "float[vocab, C]"}}},
              .scratch_bytes = LinearCrossEntropyScratch});
}

}  // namespace sluice
