#include "sluice/nn/gpt.h"

#include <cmath>

#include <fmt/format.h>

#include "sluice/core/error.h"
#include "sluice/ir/ops.h"
#include "sluice/nn/layers.h"

namespace sluice {

void ValidateGptConfig(const GptConfig& c) {
  if (c.vocab < 1 || c.seq < 1 || c.layers < 1 || c.heads < 1 || c.dim < 1) {
    throw InvalidArgument(fmt::format("GPT sizes must be positive (vocab {}, seq {}, layers {}, heads {}, dim {})",
                                      c.vocab, c.seq, c.layers, c.heads, c.dim));
  }
  if (c.dim % c.heads != 0) {
    throw InvalidArgument(fmt::format("--heads {} does not divide --dim {}: choose a dim that is a multiple of heads",
                                      c.heads, c.dim));
  }
}

namespace {

// Causal self-attention over x [B, T, C] with H heads of size D = C / H.
Var CausalSelfAttention(ModelBuilder& m, Var x, const GptConfig& c, int64_t B, int64_t T, double proj_std) {
  Builder::NameScope scope(m.b(), "attn");
  const int64_t C = c.dim, H = c.heads, D = C / H;
  Var qkv = LinearLayer(m, "c_attn", x, C, 3 * C);            // [B, T, 3C]
  std::vector<Var> parts = Split(qkv, -1, {C, C, C});          // q, k, v: [B, T, C]
  auto heads = [&](Var t) { return Transpose(Reshape(t, {B, T, H, D}), 1, 2); };  // [B, H, T, D]
  Var q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
  Var scores = Scale(MatMul(q, k, false, true), 1.0 / std::sqrt(static_cast<double>(D)));  // [B, H, T, T]
  Var att = Softmax(CausalMask(scores));
  Var y = MatMul(att, v);                                       // [B, H, T, D]
  y = Reshape(Transpose(y, 1, 2), {B, T, C});                   // [B, T, C]
  return LinearLayer(m, "c_proj", y, C, C, proj_std);
}

Var Mlp(ModelBuilder& m, Var x, const GptConfig& c, double proj_std) {
  Builder::NameScope scope(m.b(), "mlp");
  Var h = Gelu(LinearLayer(m, "c_fc", x, c.dim, 4 * c.dim));   // [B, T, 4C]
  return LinearLayer(m, "c_proj", h, 4 * c.dim, c.dim, proj_std);
}

}  // namespace

Model BuildGpt(const GptConfig& c, int64_t B, GptOutput output, int64_t seq_len) {
  ValidateGptConfig(c);
  const int64_t T = seq_len == 0 ? c.seq : seq_len;
  if (T < 1 || T > c.seq) {
    throw InvalidArgument(fmt::format("sequence length {} exceeds the model's --seq {}", T, c.seq));
  }
  if (B < 1) throw InvalidArgument(fmt::format("batch size must be positive, got {}", B));
  ModelBuilder m(output == GptOutput::kLoss ? "gpt" : "gpt_logits");
  Builder& b = m.b();
  const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.layers));

  Var ids = b.Input("ids", DType::kI64, {B, T});
  Var wte = m.Param("wte.weight", {c.vocab, c.dim}, Init::kNormal);
  Var wpe = m.Param("wpe.weight", {c.seq, c.dim}, Init::kNormal);
  Var pos = T == c.seq ? wpe : Slice(wpe, 0, 0, T);                       // [T, C]
  Var x = b.Name(Embedding(ids, wte) + pos, "h_in");                       // [B, T, C]
  for (int64_t l = 0; l < c.layers; ++l) {
    Builder::NameScope scope(b, fmt::format("h.{}", l));
    Var a = CausalSelfAttention(m, LayerNormLayer(m, "ln_1", x, c.dim), c, B, T, proj_std);
    x = b.Name(x + a, "attn_out");
    Var f = Mlp(m, LayerNormLayer(m, "ln_2", x, c.dim), c, proj_std);
    x = b.Name(x + f, "out");
  }
  x = LayerNormLayer(m, "ln_f", x, c.dim);
  Var head = m.Param("lm_head.weight", {c.vocab, c.dim}, Init::kNormal);  // [V, C] like torch.nn.Linear
  Var logits = b.Name(MatMul(x, head, false, true), "logits");             // [B, T, V]
  if (output == GptOutput::kLogits) {
    b.Output(logits);
    return m.Finish("");
  }
  Var targets = b.Input("targets", DType::kI64, {B, T});
  Var loss = b.Name(CrossEntropy(logits, targets), "loss");
  b.Output(loss);
  return m.Finish("loss");
}

}  // namespace sluice
