// Attention ops: registration, inference, kernel dispatch and the VJP rule.
// Kernels: kernels/attention.h.
#include "sluice/ir/ops/attention.h"

#include <vector>

#include "sluice/ir/gradient_type.h"
#include "sluice/ir/ops.h"
#include "sluice/ir/ops/common.h"
#include "sluice/kernels/attention.h"
#include "sluice/kernels/bf16_activations.h"

namespace sluice {

namespace {

// [..., T, D] without its last axis: [..., T].
Shape RowsShape(const Shape& s) {
  std::vector<int64_t> dims(s.dims().begin(), s.dims().end() - 1);
  return Shape(std::span<const int64_t>(dims));
}

// q [..., H, T, D], k and v one shape: q's, or with H_kv heads dividing H (grouped-query
// attention: H / H_kv query heads per key/value head). Returns that group; throws ShapeError
// naming what does not fit.
int64_t RequireQkv(std::span<const TensorType> qkv) {
  const Shape& s = qkv[0].shape;
  if (s.rank() < 2) {
    throw ShapeError(fmt::format("q must be [..., T, D] (rank 2 or more), got {}", s.ToString()));
  }
  const Shape& k = qkv[1].shape;
  if (qkv[2].shape != k) {
    throw ShapeError(fmt::format("k and v must have one shape: k {}, v {}", k.ToString(),
                                 qkv[2].shape.ToString()));
  }
  if (k == s) return 1;
  const int64_t r = s.rank();
  bool fits = r >= 3 && k.rank() == r;
  for (int64_t i = 0; fits && i < r; ++i) {
    if (i != r - 3 && k[i] != s[i]) fits = false;
  }
  if (!fits || k[r - 3] < 1 || s[r - 3] % k[r - 3] != 0) {
    throw ShapeError(fmt::format(
        "k and v must have q's shape {} or, for grouped-query attention, q's shape with fewer "
        "heads (axis -3) dividing q's; got k {}",
        s.ToString(), k.ToString()));
  }
  return s[r - 3] / k[r - 3];
}

double Scale(const Attrs& attrs) { return attrs.GetFloat("scale"); }

// The keys the split-form ops let a query see: causal_attention's (keys up to the query),
// attention's (every key) and attention_key_bias's (every key, its scores plus the key bias
// [..., T], the op's last input).
enum class Keys { kCausal, kAll, kBiased };

constexpr const char* kOpNames[] = {"causal_attention", "attention", "attention_key_bias"};
constexpr const char* kGradNames[] = {"causal_attention_grad", "attention_grad",
                                      "attention_key_bias_grad"};

const char* OpName(Keys keys) { return kOpNames[static_cast<int>(keys)]; }
const char* GradName(Keys keys) { return kGradNames[static_cast<int>(keys)]; }

// The query heads H of q [..., H, T, D] (1 for q [T, D]).
int64_t Heads(const Shape& q) { return q.rank() >= 3 ? q[q.rank() - 3] : 1; }

// key_bias [..., T]: q [..., H, T, D] without H and D, one row per sequence that its heads share.
void RequireKeyBias(const Shape& q, const Shape& bias) {
  if (q.rank() < 3) {
    throw ShapeError(fmt::format(
        "q must be [..., H, T, D] (rank 3 or more) beside a key bias, got {}", q.ToString()));
  }
  std::vector<int64_t> want(q.dims().begin(), q.dims().end() - 3);
  want.push_back(q[q.rank() - 2]);
  const Shape rows{std::span<const int64_t>(want)};
  if (bias != rows) {
    throw ShapeError(fmt::format(
        "key_bias must be {} (q {} without its heads and channels: one bias per key of each "
        "sequence), got {}",
        rows.ToString(), q.ToString(), bias.ToString()));
  }
}

// Under mixed precision q, k, v and y are bf16 and lse (and a key bias) f32
// (kernels/bf16_activations.h).
template <Keys kKeys>
std::vector<TensorType> InferAttention(std::span<const TensorType> in, const Attrs& attrs) {
  const DType t = ops::MixedFloatDType(in, {0, 1, 2});
  RequireQkv(in);
  if constexpr (kKeys == Keys::kBiased) RequireKeyBias(in[0].shape, in[3].shape);
  if (!std::isfinite(Scale(attrs))) {
    throw ShapeError(fmt::format("scale must be finite, got {}", Scale(attrs)));
  }
  return {{t, in[0].shape}, {t == DType::kBF16 ? DType::kF32 : t, RowsShape(in[0].shape)}};
}

// dy, dlse, q, k, v, y, lse (and the key bias); under mixed precision q, k, v and y bf16, the rest
// f32, dq, dk, dv f32.
template <Keys kKeys>
std::vector<TensorType> InferAttentionGrad(std::span<const TensorType> in, const Attrs& attrs) {
  DType t = ops::MixedFloatDType(in, {2, 3, 4, 5});
  if (t == DType::kBF16) t = DType::kF32;
  RequireQkv(in.subspan(2, 3));
  if constexpr (kKeys == Keys::kBiased) RequireKeyBias(in[2].shape, in[7].shape);
  const Shape& s = in[2].shape;
  const Shape rows = RowsShape(s);
  const char* names[] = {"dy", "dlse", "q", "k", "v", "y", "lse"};
  for (int i : {0, 5}) {
    if (in[i].shape != s) {
      throw ShapeError(fmt::format("{} must be q's shape {}, got {}", names[i], s.ToString(),
                                   in[i].shape.ToString()));
    }
  }
  for (int i : {1, 6}) {
    if (in[i].shape != rows) {
      throw ShapeError(fmt::format("{} must be {} (q {} without D), got {}", names[i],
                                   rows.ToString(), s.ToString(), in[i].shape.ToString()));
    }
  }
  return {{t, s}, {t, in[3].shape}, {t, in[3].shape}};
}

struct Dims {
  int64_t batch, t, d;
};

Dims AttentionDims(const Shape& s) {
  const int64_t t = s[s.rank() - 2], d = s[s.rank() - 1];
  return {t * d == 0 ? 0 : s.numel() / (t * d), t, d};
}

// Query heads per key/value head: q [..., H, T, D], k [..., H_kv, T, D] (shapes checked by
// inference).
int64_t Group(const Shape& q, const Shape& k) {
  return q == k ? 1 : q[q.rank() - 3] / k[k.rank() - 3];
}

// The kernels' mask for q [..., H, T, D]: the key bias (input `bias_at` when kBiased) is one row
// per sequence, shared by its H heads.
template <Keys kKeys, typename T>
kernels::AttentionMask<T> MaskOf(const KernelContext& ctx, const Shape& q, int bias_at) {
  if constexpr (kKeys == Keys::kCausal) {
    return kernels::AttentionMask<T>::Causal();
  } else {
    const T* bias = kKeys == Keys::kBiased ? ctx.inputs[bias_at].data<T>() : nullptr;
    return kernels::AttentionMask<T>::Bidirectional(bias, Heads(q));
  }
}

// The bf16 kernels' dims for q [..., H, T, D] and k [..., H_kv, T, D]: the axes before H are the
// sequences (for q of rank 2, one sequence of one head).
kernels::HeadsAttentionDims HeadsDims(const Shape& q, const Shape& k) {
  const Dims n = AttentionDims(q);
  const int64_t heads = Heads(q);
  const int64_t group = Group(q, k);
  return {.sequences = heads == 0 ? 0 : n.batch / heads,
          .heads = heads,
          .kv_heads = heads / group,
          .t = n.t,
          .d = n.d};
}

// The bf16 kernels' f32 scratch (one sequence's q, k, v and y), taken from the executor's
// allocator as the packed form's (below). q is input `q_input`.
template <int q_input>
int64_t AttentionHeadsBF16ScratchBytes(std::span<const TensorType> in, const Attrs&) {
  if (in[q_input].dtype != DType::kBF16) return 0;
  const kernels::HeadsAttentionDims n = HeadsDims(in[q_input].shape, in[q_input + 1].shape);
  return n.sequences == 0 ? 0 : 4 * kernels::AttentionBF16ScratchFloats(n);
}

Tensor AttentionHeadsBF16Scratch(KernelContext& ctx, const kernels::HeadsAttentionDims& n) {
  const int64_t floats = n.sequences == 0 ? 0 : kernels::AttentionBF16ScratchFloats(n);
  return Tensor::Empty({floats}, DType::kF32, ctx.allocator);
}

template <bool kFast, Keys kKeys>
void AttentionKernel(KernelContext& ctx) {
  const Tensor& q = ctx.inputs[0];
  if (q.dtype() == DType::kBF16) {
    const kernels::HeadsAttentionDims n = HeadsDims(q.shape(), ctx.inputs[1].shape());
    const Tensor scratch = AttentionHeadsBF16Scratch(ctx, n);
    const float scale = static_cast<float>(Scale(ctx.attrs));
    const BFloat16 *qp = q.data<BFloat16>(), *kp = ctx.inputs[1].data<BFloat16>(),
                   *vp = ctx.inputs[2].data<BFloat16>();
    BFloat16* y = ctx.outputs[0].data<BFloat16>();
    float* lse = ctx.outputs[1].data<float>();
    const auto mask = MaskOf<kKeys, float>(ctx, q.shape(), 3);
    if constexpr (kFast) {
      kernels::AttentionBF16Fast(qp, kp, vp, y, lse, n, scale, scratch.data<float>(), mask);
    } else {
      kernels::AttentionBF16Reference(qp, kp, vp, y, lse, n, scale, mask);
    }
    return;
  }
  DispatchFloat(q.dtype(), OpName(kKeys), [&]<typename T>() {
    const Dims n = AttentionDims(q.shape());
    const kernels::AttentionLayouts l =
        kernels::AttentionLayouts::Contiguous(n.t, n.d, Group(q.shape(), ctx.inputs[1].shape()));
    const auto mask = MaskOf<kKeys, T>(ctx, q.shape(), 3);
    const T scale = static_cast<T>(Scale(ctx.attrs));
    const T *qp = q.data<T>(), *kp = ctx.inputs[1].data<T>(), *vp = ctx.inputs[2].data<T>();
    T *y = ctx.outputs[0].data<T>(), *lse = ctx.outputs[1].data<T>();
    if constexpr (kFast) {
      kernels::AttentionFast<T>(qp, kp, vp, y, lse, n.batch, n.t, n.d, scale, l, mask);
    } else {
      kernels::AttentionReference<T>(qp, kp, vp, y, lse, n.batch, n.t, n.d, scale, l, mask);
    }
  });
}

template <bool kFast, Keys kKeys>
void AttentionGradKernel(KernelContext& ctx) {
  const Tensor& q = ctx.inputs[2];
  if (q.dtype() == DType::kBF16) {
    const kernels::HeadsAttentionDims n = HeadsDims(q.shape(), ctx.inputs[3].shape());
    const Tensor scratch = AttentionHeadsBF16Scratch(ctx, n);
    const float scale = static_cast<float>(Scale(ctx.attrs));
    const float *dy = ctx.inputs[0].data<float>(), *dlse = ctx.inputs[1].data<float>(),
                *lse = ctx.inputs[6].data<float>();
    const BFloat16 *qp = q.data<BFloat16>(), *kp = ctx.inputs[3].data<BFloat16>(),
                   *vp = ctx.inputs[4].data<BFloat16>(), *y = ctx.inputs[5].data<BFloat16>();
    float *dq = ctx.outputs[0].data<float>(), *dk = ctx.outputs[1].data<float>(),
          *dv = ctx.outputs[2].data<float>();
    const auto mask = MaskOf<kKeys, float>(ctx, q.shape(), 7);
    if constexpr (kFast) {
      kernels::AttentionGradBF16Fast(dy, dlse, qp, kp, vp, y, lse, dq, dk, dv, n, scale,
                                     scratch.data<float>(), mask);
    } else {
      kernels::AttentionGradBF16Reference(dy, dlse, qp, kp, vp, y, lse, dq, dk, dv, n, scale, mask);
    }
    return;
  }
  DispatchFloat(q.dtype(), GradName(kKeys), [&]<typename T>() {
    const Dims n = AttentionDims(q.shape());
    const kernels::AttentionLayouts l =
        kernels::AttentionLayouts::Contiguous(n.t, n.d, Group(q.shape(), ctx.inputs[3].shape()));
    const auto mask = MaskOf<kKeys, T>(ctx, q.shape(), 7);
    const T scale = static_cast<T>(Scale(ctx.attrs));
    const T* in[7];
    for (int i = 0; i < 7; ++i) in[i] = ctx.inputs[i].data<T>();
    T *dq = ctx.outputs[0].data<T>(), *dk = ctx.outputs[1].data<T>(),
      *dv = ctx.outputs[2].data<T>();
    if constexpr (kFast) {
      kernels::AttentionGradFast<T>(in[0], in[1], in[2], in[3], in[4], in[5], in[6], dq, dk, dv,
                                    n.batch, n.t, n.d, scale, l, mask);
    } else {
      kernels::AttentionGradReference<T>(in[0], in[1], in[2], in[3], in[4], in[5], in[6], dq, dk,
                                         dv, n.batch, n.t, n.d, scale, l, mask);
    }
  });
}

// ---- causal_attention_qkv: heads read from qkv [..., T, 3C] in place ----

struct PackedDims {
  int64_t sequences, t, c, heads;  // sequences: the leading axes folded
};

// qkv [..., T, 3C] with heads dividing C; throws ShapeError naming what does not fit.
PackedDims RequirePackedQkv(const Shape& s, const Attrs& attrs) {
  const int64_t heads = attrs.GetInt("heads");
  if (s.rank() < 2) {
    throw ShapeError(
        fmt::format("qkv must be [..., T, 3C] (rank 2 or more), got {}", s.ToString()));
  }
  const int64_t width = s[s.rank() - 1], t = s[s.rank() - 2];
  if (heads < 1 || width % (3 * heads) != 0) {
    throw ShapeError(fmt::format(
        "qkv's last axis {} (qkv {}) must be 3·C with C a multiple of heads = {}: q, k and v side "
        "by side, each of heads × D channels",
        width, s.ToString(), heads));
  }
  return {t * width == 0 ? 0 : s.numel() / (t * width), t, width / 3, heads};
}

// [..., T, 3C] -> y [..., T, C] and lse [..., H, T].
std::pair<Shape, Shape> PackedOutputShapes(const Shape& qkv, const PackedDims& n) {
  std::vector<int64_t> y(qkv.dims().begin(), qkv.dims().end());
  y.back() = n.c;
  std::vector<int64_t> lse(qkv.dims().begin(), qkv.dims().end() - 2);
  lse.push_back(n.heads);
  lse.push_back(n.t);
  return {Shape(std::span<const int64_t>(y)), Shape(std::span<const int64_t>(lse))};
}

// Under mixed precision qkv and y are bf16 and lse f32 (kernels/bf16_activations.h).
std::vector<TensorType> InferAttentionQkv(std::span<const TensorType> in, const Attrs& attrs) {
  const DType t = ops::MixedFloatDType(in, {0});
  const PackedDims n = RequirePackedQkv(in[0].shape, attrs);
  if (!std::isfinite(Scale(attrs))) {
    throw ShapeError(fmt::format("scale must be finite, got {}", Scale(attrs)));
  }
  const auto [y, lse] = PackedOutputShapes(in[0].shape, n);
  return {{t, y}, {t == DType::kBF16 ? DType::kF32 : t, lse}};
}

// dy, dlse, qkv, y, lse; under mixed precision qkv and y bf16, the rest f32, dqkv f32.
std::vector<TensorType> InferAttentionQkvGrad(std::span<const TensorType> in, const Attrs& attrs) {
  DType t = ops::MixedFloatDType(in, {2, 3});
  if (t == DType::kBF16) t = DType::kF32;
  const PackedDims n = RequirePackedQkv(in[2].shape, attrs);
  const auto [y, lse] = PackedOutputShapes(in[2].shape, n);
  const char* names[] = {"dy", "dlse", "qkv", "y", "lse"};
  for (int i : {0, 1, 3, 4}) {
    const Shape& want = (i == 1 || i == 4) ? lse : y;
    if (in[i].shape != want) {
      throw ShapeError(fmt::format("{} must be {} for qkv {} and {} heads, got {}", names[i],
                                   want.ToString(), in[2].shape.ToString(), n.heads,
                                   in[i].shape.ToString()));
    }
  }
  return {{t, in[2].shape}};
}

// The kernels' layouts for qkv [..., T, 3C] (q, k, v at columns 0, C, 2C) and y [..., T, C].
struct PackedLayouts {
  kernels::AttentionLayout in, out;
  int64_t entries, d;
};

PackedLayouts Layouts(const PackedDims& n) {
  return {kernels::AttentionLayout::Packed(n.heads, n.t, n.c, 3 * n.c),
          kernels::AttentionLayout::Packed(n.heads, n.t, n.c, n.c), n.sequences * n.heads,
          n.c / n.heads};
}

kernels::PackedAttentionDims BF16Dims(const PackedDims& n) {
  return {.sequences = n.sequences, .t = n.t, .c = n.c, .heads = n.heads};
}

// The bf16 kernels' f32 scratch (one sequence's qkv and y), from the executor's allocator so that
// the memory forecast holds it (OpDef::scratch_bytes); the reference kernels take it too, to keep
// the forecast exact for both. qkv is input `qkv_input`.
template <int qkv_input>
int64_t AttentionBF16ScratchBytes(std::span<const TensorType> in, const Attrs& attrs) {
  if (in[qkv_input].dtype != DType::kBF16) return 0;
  const PackedDims n = RequirePackedQkv(in[qkv_input].shape, attrs);
  if (n.sequences == 0) return 0;
  return 4 * kernels::CausalAttentionQkvBF16ScratchFloats(BF16Dims(n));
}

Tensor AttentionBF16Scratch(KernelContext& ctx, const PackedDims& n) {
  const int64_t floats =
      n.sequences == 0 ? 0 : kernels::CausalAttentionQkvBF16ScratchFloats(BF16Dims(n));
  return Tensor::Empty({floats}, DType::kF32, ctx.allocator);
}

template <bool kFast>
void AttentionQkvKernel(KernelContext& ctx) {
  const Tensor& qkv = ctx.inputs[0];
  if (qkv.dtype() == DType::kBF16) {
    const PackedDims n = RequirePackedQkv(qkv.shape(), ctx.attrs);
    const Tensor scratch = AttentionBF16Scratch(ctx, n);
    const float scale = static_cast<float>(Scale(ctx.attrs));
    BFloat16* y = ctx.outputs[0].data<BFloat16>();
    float* lse = ctx.outputs[1].data<float>();
    if constexpr (kFast) {
      kernels::CausalAttentionQkvBF16Fast(qkv.data<BFloat16>(), y, lse, BF16Dims(n), scale,
                                          scratch.data<float>());
    } else {
      kernels::CausalAttentionQkvBF16Reference(qkv.data<BFloat16>(), y, lse, BF16Dims(n), scale);
    }
    return;
  }
  DispatchFloat(qkv.dtype(), "causal_attention_qkv", [&]<typename T>() {
    const PackedDims n = RequirePackedQkv(qkv.shape(), ctx.attrs);
    const PackedLayouts l = Layouts(n);
    const T scale = static_cast<T>(Scale(ctx.attrs));
    const T* q = qkv.data<T>();
    T *y = ctx.outputs[0].data<T>(), *lse = ctx.outputs[1].data<T>();
    if constexpr (kFast) {
      kernels::AttentionFast<T>(q, q + n.c, q + 2 * n.c, y, lse, l.entries, n.t, l.d, scale,
                                {l.in, l.in, l.out});
    } else {
      kernels::AttentionReference<T>(q, q + n.c, q + 2 * n.c, y, lse, l.entries, n.t, l.d, scale,
                                     {l.in, l.in, l.out});
    }
  });
}

template <bool kFast>
void AttentionQkvGradKernel(KernelContext& ctx) {
  const Tensor& qkv = ctx.inputs[2];
  if (qkv.dtype() == DType::kBF16) {
    const PackedDims n = RequirePackedQkv(qkv.shape(), ctx.attrs);
    const Tensor scratch = AttentionBF16Scratch(ctx, n);
    const float scale = static_cast<float>(Scale(ctx.attrs));
    const float *dy = ctx.inputs[0].data<float>(), *dlse = ctx.inputs[1].data<float>(),
                *lse = ctx.inputs[4].data<float>();
    const BFloat16* y = ctx.inputs[3].data<BFloat16>();
    float* dqkv = ctx.outputs[0].data<float>();
    if constexpr (kFast) {
      kernels::CausalAttentionQkvGradBF16Fast(dy, dlse, qkv.data<BFloat16>(), y, lse, dqkv,
                                              BF16Dims(n), scale, scratch.data<float>());
    } else {
      kernels::CausalAttentionQkvGradBF16Reference(dy, dlse, qkv.data<BFloat16>(), y, lse, dqkv,
                                                   BF16Dims(n), scale);
    }
    return;
  }
  DispatchFloat(qkv.dtype(), "causal_attention_qkv_grad", [&]<typename T>() {
    const PackedDims n = RequirePackedQkv(qkv.shape(), ctx.attrs);
    const PackedLayouts l = Layouts(n);
    const T scale = static_cast<T>(Scale(ctx.attrs));
    const T *dy = ctx.inputs[0].data<T>(), *dlse = ctx.inputs[1].data<T>(), *q = qkv.data<T>(),
            *y = ctx.inputs[3].data<T>(), *lse = ctx.inputs[4].data<T>();
    T* dq = ctx.outputs[0].data<T>();
    const T *k = q + n.c, *v = q + 2 * n.c;
    T *dk = dq + n.c, *dv = dq + 2 * n.c;
    if constexpr (kFast) {
      kernels::AttentionGradFast<T>(dy, dlse, q, k, v, y, lse, dq, dk, dv, l.entries, n.t, l.d,
                                    scale, {l.in, l.in, l.out});
    } else {
      kernels::AttentionGradReference<T>(dy, dlse, q, k, v, y, lse, dq, dk, dv, l.entries, n.t, l.d,
                                         scale, {l.in, l.in, l.out});
    }
  });
}

// The gradient reaching output i, or zeros of its gradient type when none does (the kernels need
// both).
Var GradientOrZeros(VjpContext& ctx, int i) {
  Var g = ctx.dy(i);
  const TensorType t = GradientType(ctx.y_type(i));
  return g.valid() ? g : Zeros(ctx.builder(), t.shape, t.dtype);
}

template <Keys kKeys>
std::vector<Var> AttentionVjp(VjpContext& ctx) {
  if constexpr (kKeys == Keys::kCausal) {
    return CausalAttentionGrad(GradientOrZeros(ctx, 0), GradientOrZeros(ctx, 1), ctx.x(0), ctx.x(1),
                               ctx.x(2), ctx.y(0), ctx.y(1), Scale(ctx.attrs()));
  } else if constexpr (kKeys == Keys::kAll) {
    return AttentionGrad(GradientOrZeros(ctx, 0), GradientOrZeros(ctx, 1), ctx.x(0), ctx.x(1),
                         ctx.x(2), ctx.y(0), ctx.y(1), Scale(ctx.attrs()));
  } else {
    if (ctx.needs(3)) {
      throw ProgramError(
          "autodiff: attention_key_bias has no gradient for its key_bias (a mask: 0 keeps a "
          "key, -inf hides it); compute the bias from the inputs, not from parameters");
    }
    std::vector<Var> grads =
        AttentionGrad(GradientOrZeros(ctx, 0), GradientOrZeros(ctx, 1), ctx.x(0), ctx.x(1),
                      ctx.x(2), ctx.y(0), ctx.y(1), Scale(ctx.attrs()), ctx.x(3));
    grads.emplace_back();  // the key bias: none
    return grads;
  }
}

std::vector<Var> AttentionQkvVjp(VjpContext& ctx) {
  return {CausalAttentionQkvGrad(GradientOrZeros(ctx, 0), GradientOrZeros(ctx, 1), ctx.x(0),
                                 ctx.y(0), ctx.y(1), ctx.attrs().GetInt("heads"),
                                 Scale(ctx.attrs()))};
}

}  // namespace

std::pair<Var, Var> CausalAttentionQkv(Var qkv, int64_t heads, double scale) {
  std::vector<Var> out =
      qkv.builder()->Emit("causal_attention_qkv", {qkv}, {{"heads", heads}, {"scale", scale}});
  return {out[0], out[1]};
}

Var CausalAttentionQkvGrad(Var dy, Var dlse, Var qkv, Var y, Var lse, int64_t heads, double scale) {
  return dy.builder()->Emit1("causal_attention_qkv_grad", {dy, dlse, qkv, y, lse},
                             {{"heads", heads}, {"scale", scale}});
}

std::pair<Var, Var> CausalAttention(Var q, Var k, Var v, double scale) {
  std::vector<Var> out = q.builder()->Emit("causal_attention", {q, k, v}, {{"scale", scale}});
  return {out[0], out[1]};
}

std::pair<Var, Var> Attention(Var q, Var k, Var v, double scale, Var key_bias) {
  std::vector<Var> out =
      key_bias.valid()
          ? q.builder()->Emit("attention_key_bias", {q, k, v, key_bias}, {{"scale", scale}})
          : q.builder()->Emit("attention", {q, k, v}, {{"scale", scale}});
  return {out[0], out[1]};
}

std::vector<Var> AttentionGrad(Var dy, Var dlse, Var q, Var k, Var v, Var y, Var lse, double scale,
                               Var key_bias) {
  if (key_bias.valid()) {
    return dy.builder()->Emit("attention_key_bias_grad", {dy, dlse, q, k, v, y, lse, key_bias},
                              {{"scale", scale}});
  }
  return dy.builder()->Emit("attention_grad", {dy, dlse, q, k, v, y, lse}, {{"scale", scale}});
}

std::vector<Var> CausalAttentionGrad(Var dy, Var dlse, Var q, Var k, Var v, Var y, Var lse,
                                     double scale) {
  return dy.builder()->Emit("causal_attention_grad", {dy, dlse, q, k, v, y, lse},
                            {{"scale", scale}});
}

namespace {

// The split-form op of `keys` and its gradient: causal_attention, attention, attention_key_bias.
template <Keys kKeys>
void RegisterSplitAttention(OpRegistry& r, std::string doc, std::string grad_doc) {
  constexpr bool kBiased = kKeys == Keys::kBiased;
  std::vector<OpParam> inputs = {{"q", "float or bf16[..., H, T, D]"},
                                 {"k", "q's dtype[..., H_kv, T, D]"},
                                 {"v", "q's dtype[..., H_kv, T, D]"}};
  std::vector<OpParam> grad_inputs = {
      {"dy", "float[..., H, T, D]"},        {"dlse", "float[..., H, T]"},
      {"q", "float or bf16[..., H, T, D]"}, {"k", "q's dtype[..., H_kv, T, D]"},
      {"v", "q's dtype[..., H_kv, T, D]"},  {"y", "q's dtype[..., H, T, D]"},
      {"lse", "float[..., H, T]"}};
  if (kBiased) {
    inputs.push_back({"key_bias", "float[..., T]"});
    grad_inputs.push_back({"key_bias", "float[..., T]"});
  }
  r.Register(
      {.name = OpName(kKeys),
       .num_inputs = kBiased ? 4 : 3,
       .infer = InferAttention<kKeys>,
       .kernel = AttentionKernel<true, kKeys>,
       .reference = AttentionKernel<false, kKeys>,
       .vjp = AttentionVjp<kKeys>,
       .doc = std::move(doc),
       .signature = {.inputs = std::move(inputs),
                     .attrs = {{"scale", "float"}},
                     .outputs = {{"y", "q's dtype[..., H, T, D]"}, {"lse", "float[..., H, T]"}}},
       .scratch_bytes = AttentionHeadsBF16ScratchBytes<0>});
  r.Register({.name = GradName(kKeys),
              .num_inputs = kBiased ? 8 : 7,
              .infer = InferAttentionGrad<kKeys>,
              .kernel = AttentionGradKernel<true, kKeys>,
              .reference = AttentionGradKernel<false, kKeys>,
              .doc = std::move(grad_doc),
              .signature = {.inputs = std::move(grad_inputs),
                            .attrs = {{"scale", "float"}},
                            .outputs = {{"dq", "float[..., H, T, D]"},
                                        {"dk", "float[..., H_kv, T, D]"},
                                        {"dv", "float[..., H_kv, T, D]"}}},
              .scratch_bytes = AttentionHeadsBF16ScratchBytes<2>});
}

}  // namespace

void RegisterAttentionOps(OpRegistry& r) {
  RegisterSplitAttention<Keys::kCausal>(
      r,
      "fused causal self-attention softmax(scale·q·kᵀ, masked)·v; also the log-sum-exp of each "
      "row (no [T, T] value is kept); k and v may have fewer heads than q (grouped-query "
      "attention: H / H_kv query heads per key/value head, read in place); bf16 q, k, v give "
      "bf16 y, computed in f32",
      "causal_attention backward: dq, dk, dv, the probabilities recomputed from q, k and lse "
      "tile by tile; dk and dv summed over each key/value head's group; bf16 q, k, v and y beside "
      "f32 dy, dlse and lse give f32 dq, dk, dv");
  RegisterSplitAttention<Keys::kAll>(
      r,
      "fused attention softmax(scale·q·kᵀ)·v over every key (an encoder's: BERT, "
      "nn.TransformerEncoder, ViT); also the log-sum-exp of each row (no [T, T] value is kept); "
      "grouped-query k and v and bf16 as causal_attention",
      "attention backward: dq, dk, dv, the probabilities recomputed from q, k and lse tile by "
      "tile; grouped-query and bf16 as causal_attention_grad");
  RegisterSplitAttention<Keys::kBiased>(
      r,
      "fused attention softmax(scale·q·kᵀ + key_bias)·v over every key, key_bias [..., T] one "
      "row per sequence shared by its heads (0 keeps a key, -inf hides it: a key-padding mask); "
      "a query whose keys are all hidden gets NaN, as PyTorch's softmax; key_bias takes no "
      "gradient; grouped-query and bf16 as causal_attention (key_bias f32)",
      "attention_key_bias backward: dq, dk, dv (none for key_bias), the probabilities "
      "recomputed from q, k, key_bias and lse tile by tile");
  r.Register(
      {.name = "causal_attention_qkv",
       .num_inputs = 1,
       .infer = InferAttentionQkv,
       .kernel = AttentionQkvKernel<true>,
       .reference = AttentionQkvKernel<false>,
       .vjp = AttentionQkvVjp,
       .doc = "causal_attention over the heads of q, k, v packed side by side in qkv (a "
              "GPT's c_attn output), read in place; y comes out with the heads side by "
              "side, no split, transpose or concat copies; bf16 qkv gives bf16 y, computed in f32",
       .signature = {.inputs = {{"qkv", "float or bf16[..., T, 3C]"}},
                     .attrs = {{"heads", "int (H, dividing C)"}, {"scale", "float"}},
                     .outputs = {{"y", "qkv's dtype[..., T, C]"}, {"lse", "float[..., H, T]"}}},
       .scratch_bytes = AttentionBF16ScratchBytes<0>});
  r.Register({.name = "causal_attention_qkv_grad",
              .num_inputs = 5,
              .infer = InferAttentionQkvGrad,
              .kernel = AttentionQkvGradKernel<true>,
              .reference = AttentionQkvGradKernel<false>,
              .doc = "causal_attention_qkv backward: dq, dk, dv written side by side into dqkv; "
                     "bf16 qkv and y beside f32 dy, dlse and lse give an f32 dqkv",
              .signature = {.inputs = {{"dy", "float[..., T, C]"},
                                       {"dlse", "float[..., H, T]"},
                                       {"qkv", "float or bf16[..., T, 3C]"},
                                       {"y", "qkv's dtype[..., T, C]"},
                                       {"lse", "float[..., H, T]"}},
                            .attrs = {{"heads", "int"}, {"scale", "float"}},
                            .outputs = {{"dqkv", "float[..., T, 3C]"}}},
              .scratch_bytes = AttentionBF16ScratchBytes<2>});
}

}  // namespace sluice
