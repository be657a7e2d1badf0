#include "sluice/nn/gpt.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sluice/core/error.h"
#include "sluice/ir/ops.h"
#include "sluice/nn/data.h"
#include "sluice/nn/layers.h"
#include "sluice/nn/training_program.h"

namespace sluice {

void ValidateGptConfig(const GptConfig& c) {
  if (c.vocab < 1 || c.seq < 1 || c.layers < 1 || c.heads < 1 || c.dim < 1) {
    throw InvalidArgument(
        fmt::format("GPT sizes must be positive (vocab {}, seq {}, layers {}, heads {}, dim {})",
                    c.vocab, c.seq, c.layers, c.heads, c.dim));
  }
  if (!(c.dropout >= 0 && c.dropout < 1)) {
    throw InvalidArgument(fmt::format(
        "--dropout {} is not a probability of dropping an element: give one in [0, 1)", c.dropout));
  }
  if (c.head_chunk < -1) {
    throw InvalidArgument(fmt::format(
        "--head-chunk {} is not a number of tokens: give a positive chunk, 0 (automatic) or -1 "
        "(the unfused head)",
        c.head_chunk));
  }
  if (c.dim % c.heads != 0) {
    throw InvalidArgument(
        fmt::format("--heads {} does not divide --dim {}: choose a dim that is a multiple of heads",
                    c.heads, c.dim));
  }
}

std::string_view Name(GptAttention attention) { return EnumName(kGptAttentionNames, attention); }

std::optional<GptAttention> ParseGptAttention(std::string_view name) {
  return ParseEnum(kGptAttentionNames, name);
}

namespace {

// Causal self-attention over x [B, T, C] with H heads of size D = C / H.
Var CausalSelfAttention(ModelBuilder& m, Var x, const GptConfig& c, int64_t B, int64_t T,
                        double proj_std) {
  Builder::NameScope scope(m.b(), "attn");
  const int64_t C = c.dim, H = c.heads, D = C / H;
  Var qkv = LinearLayer(m, "c_attn", x, C, 3 * C);  // [B, T, 3C]
  Builder& b = m.b();
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  Var y;  // [B, T, C]
  if (c.attention == GptAttention::kFused) {
    // The heads read in place from qkv, y written with the heads side by side: no copies.
    y = b.Name(CausalAttentionQkv(qkv, H, scale).first, "attention");  // and lse [B, H, T]
  } else {
    std::vector<Var> parts = Split(qkv, -1, {C, C, C});  // q, k, v: [B, T, C]
    auto heads = [&](Var t) { return Transpose(Reshape(t, {B, T, H, D}), 1, 2); };  // [B, H, T, D]
    Var q = heads(parts[0]), k = heads(parts[1]), v = heads(parts[2]);
    Var qk = b.Name(MatMul(q, k, false, true), "qk");   // [B, H, T, T]
    Var scores = b.Name(Scale(qk, scale), "scores");    // [B, H, T, T]
    Var masked = b.Name(CausalMask(scores), "masked");  // [B, H, T, T]
    Var att = b.Name(Softmax(masked), "probs");         // [B, H, T, T]
    for (const Var& t : {qk, scores, masked, att}) m.MarkAttentionValue(t.name());
    y = Reshape(Transpose(MatMul(att, v), 1, 2), {B, T, C});  // [B, H, T, D] -> [B, T, C]
  }
  return LinearLayer(m, "c_proj", y, C, C, proj_std);
}

Var Mlp(ModelBuilder& m, Var x, const GptConfig& c, double proj_std) {
  Builder::NameScope scope(m.b(), "mlp");
  Var fc = LinearLayer(m, "c_fc", x, c.dim, 4 * c.dim);  // [B, T, 4C]
  return LinearLayer(m, "c_proj", Gelu(fc), 4 * c.dim, c.dim, proj_std);
}

// Parameters of the embeddings (wte, wpe) and of one block (ln_1, c_attn, attn.c_proj, ln_2, c_fc,
// mlp.c_proj: weight and bias each); BuildGpt's list is embeddings, blocks in order, ln_f, lm_head.
constexpr int64_t kEmbedParams = 2;
constexpr int64_t kBlockParams = 12;

}  // namespace

std::string SliceText(const GptSlice& s, int64_t layers) {
  const int64_t end = s.end_layer < 0 ? layers : s.end_layer;
  std::vector<std::string> items;
  if (s.embed) items.push_back("embed");
  if (end - s.first_layer == 1) items.push_back(fmt::format("h.{}", s.first_layer));
  if (end - s.first_layer > 1) items.push_back(fmt::format("h.{}-{}", s.first_layer, end - 1));
  if (s.head) items.push_back("head");
  return items.empty() ? std::string("(nothing)") : fmt::format("{}", fmt::join(items, ","));
}

GptCosts EstimateGptCosts(const GptConfig& c, int64_t batch, int64_t seq_len) {
  ValidateGptConfig(c);
  const int64_t t = seq_len == 0 ? c.seq : seq_len;
  if (t < 1 || t > c.seq) {
    throw InvalidArgument(
        fmt::format("sequence length {} is outside [1, {}] (the model's --seq)", t, c.seq));
  }
  if (batch < 1) throw InvalidArgument(fmt::format("batch size must be positive, got {}", batch));
  const double B = static_cast<double>(batch), T = static_cast<double>(t);
  const double C = static_cast<double>(c.dim), vocab = static_cast<double>(c.vocab);
  return {.embed = B * T * C,
          .block = 24 * B * T * C * C + 4 * B * T * T * C,
          .head = 2 * B * T * C * vocab};
}

ModelUnits GptUnits(const GptConfig& c, int64_t batch, int64_t seq_len) {
  const GptCosts g = EstimateGptCosts(c, batch, seq_len);
  ModelUnits units{.count_option = "--layers"};
  units.names.push_back("embed");
  units.costs.push_back(g.embed);
  for (int64_t l = 0; l < c.layers; ++l) {
    units.names.push_back(fmt::format("h.{}", l));
    units.costs.push_back(g.block);
  }
  units.names.push_back("head");
  units.costs.push_back(g.head);
  return units;
}

GptSlice GptSliceOfUnits(const UnitRange& r, int64_t layers) {
  return GptSlice{.embed = r.first == 0,
                  .first_layer = std::max<int64_t>(r.first, 1) - 1,
                  .end_layer = std::min<int64_t>(r.end, layers + 1) - 1,
                  .head = r.end == layers + 2};
}

Model BuildGpt(const GptConfig& c, int64_t B, GptOutput output, int64_t seq_len) {
  return BuildGptSlice(c, B, output, seq_len, GptSlice{});
}

namespace {

// Throws InvalidArgument for what BuildGptSlice cannot build (gpt.h).
void CheckGptSlice(const GptConfig& c, int64_t B, int64_t seq_len, const GptSlice& slice) {
  ValidateGptConfig(c);
  const int64_t T = seq_len == 0 ? c.seq : seq_len;
  if (T < 1 || T > c.seq) {
    throw InvalidArgument(fmt::format("sequence length {} exceeds the model's --seq {}", T, c.seq));
  }
  if (B < 1) throw InvalidArgument(fmt::format("batch size must be positive, got {}", B));
  const int64_t first = slice.first_layer, end = slice.end_layer < 0 ? c.layers : slice.end_layer;
  if (first < 0 || first > end || end > c.layers) {
    throw InvalidArgument(
        fmt::format("GPT slice '{}': layers [{}, {}) are not a range within the model's {} layers",
                    SliceText(slice, c.layers), first, end, c.layers));
  }
  if (!slice.embed && !slice.head && first == end) {
    throw InvalidArgument(fmt::format(
        "GPT slice with no embed, no head and no layers (layers [{}, {})) is empty", first, end));
  }
}

// The f32 program of a checked slice, whatever c.precision says.
Model BuildF32Slice(const GptConfig& c, int64_t B, GptOutput output, int64_t seq_len,
                    const GptSlice& slice) {
  const int64_t T = seq_len == 0 ? c.seq : seq_len;
  const int64_t first = slice.first_layer, end = slice.end_layer < 0 ? c.layers : slice.end_layer;
  const std::string text = SliceText(slice, c.layers);
  const bool whole = slice.embed && slice.head && first == 0 && end == c.layers;
  const std::string base = output == GptOutput::kLoss ? "gpt" : "gpt_logits";
  ModelBuilder m(whole ? base : fmt::format("{}[{}]", base, text));
  Builder& b = m.b();
  const double proj_std = 0.02 / std::sqrt(2.0 * static_cast<double>(c.layers));

  // Dropout (GptConfig::dropout): the input random_key is declared by the first one a slice has.
  Var key;
  auto drop = [&](Var v, int64_t stream) {
    if (c.dropout == 0 || output != GptOutput::kLoss) return v;
    if (!key.valid()) key = b.Input(kRandomKeyArray, DType::kI64, {B});
    return Dropout(v, key, c.dropout, stream);
  };
  Var x;  // the hidden state [B, T, C]
  if (slice.embed) {
    m.SetNextInitIndex(0);
    Var ids = b.Input("ids", DType::kI64, {B, T});
    Var wte = m.Param("wte.weight", {c.vocab, c.dim}, Init::kNormal);
    Var wpe = m.Param("wpe.weight", {c.seq, c.dim}, Init::kNormal);
    Builder::Unit unit(b, "embed");
    Var pos = T == c.seq ? wpe : Slice(wpe, 0, 0, T);        // [T, C]
    x = b.Name(drop(Embedding(ids, wte) + pos, 0), "h_in");  // [B, T, C]
  } else {
    x = b.Input("x", DType::kF32, {B, T, c.dim});
  }
  for (int64_t l = first; l < end; ++l) {
    m.MarkBlockInput(x.name());
    m.SetNextInitIndex(kEmbedParams + kBlockParams * l);
    Builder::NameScope scope(b, fmt::format("h.{}", l));
    Builder::Unit unit(b, fmt::format("h.{}", l));
    Var a = CausalSelfAttention(m, LayerNormLayer(m, "ln_1", x, c.dim), c, B, T, proj_std);
    x = b.Name(x + drop(a, 1 + 2 * l), "attn_out");
    Var f = Mlp(m, LayerNormLayer(m, "ln_2", x, c.dim), c, proj_std);
    x = b.Name(x + drop(f, 2 + 2 * l), "out");
  }
  if (!slice.head) {
    b.Output(b.Name(x, "y"));
    return m.Finish("");
  }
  // The head is a unit as a block is: full recompute keeps its input too, so that the head's
  // backward recomputes ln_f and the logits only, not the last block before it.
  m.MarkBlockInput(x.name());
  m.SetNextInitIndex(kEmbedParams + kBlockParams * c.layers);
  Var logits, loss;
  {
    Builder::Unit unit(b, "head");
    x = LayerNormLayer(m, "ln_f", x, c.dim);
    // [vocab, C] like torch.nn.Linear
    Var head = m.Param("lm_head.weight", {c.vocab, c.dim}, Init::kNormal);
    if (output == GptOutput::kLoss && c.head_chunk >= 0) {
      // The logits only ever a chunk of tokens at a time, inside the kernel.
      Var targets = b.Input("targets", DType::kI64, {B, T});
      loss = b.Name(LinearCrossEntropy(x, head, targets, c.head_chunk), "loss");
    } else {
      logits = b.Name(MatMul(x, head, false, true), "logits");  // [B, T, vocab]
      if (output == GptOutput::kLoss) {
        Var targets = b.Input("targets", DType::kI64, {B, T});
        loss = b.Name(CrossEntropy(logits, targets), "loss");
      }
    }
  }
  if (output == GptOutput::kLogits) {
    b.Output(logits);
    return m.Finish("");
  }
  b.Output(loss);
  return m.Finish("loss");
}

}  // namespace

Model BuildGptSlice(const GptConfig& c, int64_t B, GptOutput output, int64_t seq_len,
                    const GptSlice& slice) {
  CheckGptSlice(c, B, seq_len, slice);
  if (c.precision == Precision::kFp32) return BuildF32Slice(c, B, output, seq_len, slice);
  // Mixed precision is the autocast pass on the whole f32 model, cut where the slice begins and
  // ends: the pass rounds what crosses a unit boundary wherever a cut may fall, so the pieces
  // compute bitwise what the whole computes.
  Model whole = AutocastTrainingModel(BuildF32Slice(c, B, output, seq_len, GptSlice{}));
  const int64_t end = slice.end_layer < 0 ? c.layers : slice.end_layer;
  return SliceTrainingModel(whole, {.first = slice.embed ? 0 : slice.first_layer + 1,
                                    .end = slice.head ? c.layers + 2 : end + 1});
}

}  // namespace sluice
