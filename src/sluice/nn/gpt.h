// GPT: a nanoGPT-style decoder-only transformer written as a program.
//
//   ids [B, T] → wte + wpe → L × pre-LayerNorm block → ln_f → lm_head → logits [B, T, vocab]
//   block(x) = x + attn(ln_1(x)); x + mlp(ln_2(x))
//   attn: causal self-attention, H heads of C/H channels: by default one fused op
//         (causal_attention_qkv, ir/ops/attention.h: no [T, T] value is kept between forward and
//         backward, and the heads are read from c_attn's output and written for c_proj in place,
//         no split, transpose or concat copies); GptAttention::kNaive writes it as matmul → scale →
//         causal_mask → softmax → matmul, the textbook chain (kept for comparison; its scores and
//         probabilities are the values Model::attention_values names). The two agree to rounding:
//         relative 1e-5 in f32 on a training run's losses, 1e-11 in f64
//         (tests/ops/attention_test.cc, tests/nn).
//   mlp:  Linear(C, 4C) → GELU (tanh) → Linear(4C, C)
// Linear layers have biases, layer norms weight and bias (eps 1e-5), no dropout, lm_head has no
// bias and is not tied to wte. Parameter names and layouts: docs/models.md (GPT-2 names; block
// weights stored [in, out], lm_head.weight [vocab, C] like torch.nn.Linear).
//
// A pipeline stage runs a contiguous slice of the model (BuildGptSlice): the hidden state
// x [B, T, C] (f32, bf16 under Precision::kBf16) passes from one slice to the next, and chaining
// the slices' programs computes bitwise what the whole model computes. Under kBf16 a slice is the
// piece of the whole model's mixed-precision program (nn/training_program.h SliceTrainingModel).
//
// Example:
//   GptConfig cfg{.vocab = 11, .seq = 12, .layers = 2, .heads = 4, .dim = 64};
//   Model m = BuildGpt(cfg, /*batch=*/32, GptOutput::kLoss);
//   Model first = BuildGptSlice(cfg, 32, GptOutput::kLoss, 0, {.end_layer = 1, .head = false});
//   Model last = BuildGptSlice(cfg, 32, GptOutput::kLoss, 0, {.embed = false, .first_layer = 1});
//   // first: ids → "y"; last: "x" (= first's "y"), targets → "loss", as m's loss bitwise.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "sluice/core/enum_names.h"
#include "sluice/nn/layers.h"
#include "sluice/nn/model.h"

namespace sluice {

enum class GptAttention : uint8_t { kNaive, kFused };

inline constexpr EnumEntry<GptAttention> kGptAttentionNames[] = {
    {GptAttention::kNaive, "naive"},
    {GptAttention::kFused, "fused"},
};
static_assert(IsCompleteEnumTable(kGptAttentionNames));

// The name in kGptAttentionNames, and back (nullopt for any other text).
std::string_view Name(GptAttention attention);
std::optional<GptAttention> ParseGptAttention(std::string_view name);

struct GptConfig {
  int64_t vocab = 256;
  int64_t seq = 64;  // the longest sequence the model takes (rows of wpe)
  int64_t layers = 4;
  int64_t heads = 4;
  int64_t dim = 128;
  GptAttention attention = GptAttention::kFused;  // how blocks compute attention (same parameters)
  // The head's loss: linear_cross_entropy over chunks of this many tokens, so that the [B, T,
  // vocab] logits and their gradient are never whole (0: chunks whose logits are the size of the
  // head's input); -1: the unfused matmul and cross_entropy (the logits whole). Same parameters,
  // the loss within rounding (ir/ops/nn.h).
  int64_t head_chunk = 0;
  // kBf16: the f32 program run through the autocast pass (ir/autocast.h), as a `--program` under
  // --precision bf16 — one set of rules. The block linears multiply bf16 operands; layer norms,
  // GELU and the fused attention feeding them take and give bf16 (f32 inside); the residual
  // additions stay f32; what crosses a unit boundary (the embedding's output, each block's output)
  // is rounded to bf16 by the unit that makes it and widened by the one that reads it, as
  // Megatron-LM's bf16 residual: a slice's "x" and "y" are bf16, and so are their gradients
  // (StageProgram), on one stage as on many. The fused head (linear_cross_entropy) runs f32. The
  // other settings follow the same rules, as PyTorch's autocast does: --attention naive multiplies
  // bf16 q, k, v and probabilities (scale, mask and softmax f32); the unfused head (head_chunk -1,
  // and GptOutput::kLogits) multiplies the logits from bf16 ln_f output and lm_head (the logits
  // f32, cross_entropy f32). Value names are the f32 program's, the casts `NAME.bf16`/`NAME.f32`.
  Precision precision = Precision::kFp32;
  // Dropout in training (nanoGPT's places: the embedding's sum, each block's attention and MLP
  // branches before their residual add), p in [0, 1); 0, the default, builds none. The training
  // loss only (GptOutput::kLogits and the decoder have none, as module.eval()); its masks are
  // drawn from the input "random_key" i64[B] (ir/ops/dropout.h), streams 0, then 1 + 2l and
  // 2 + 2l for block l.
  double dropout = 0;
};

// Throws InvalidArgument saying what to change (heads not dividing dim, non-positive sizes).
void ValidateGptConfig(const GptConfig& config);

enum class GptOutput {
  kLoss,    // inputs ids, targets [B, T] (i64); output scalar "loss" (mean over counted targets)
  kLogits,  // input ids [B, T]; output "logits" [B, T, vocab]
};

// The model for batches of `batch` sequences of length `seq_len` (≤ config.seq; 0 = config.seq).
Model BuildGpt(const GptConfig& config, int64_t batch, GptOutput output, int64_t seq_len = 0);

// A contiguous piece of the model: one pipeline (virtual) stage. The default is the whole model.
struct GptSlice {
  bool embed = true;        // wte + wpe; the program's input is "ids" i64[B, T]
  int64_t first_layer = 0;  // transformer blocks [first_layer, end_layer)
  int64_t end_layer = -1;   // -1: config.layers
  bool head = true;         // ln_f + lm_head (+ cross-entropy with "targets" when kLoss)

  bool operator==(const GptSlice&) const = default;
};

// The slice of the model as BuildGpt would build it, with the same value and parameter names
// (h_in, h.3.out, h.3.attn.c_attn.weight, …). Program interface:
//   embed: input "ids" i64[B, T];  otherwise input "x" f32[B, T, C], the previous slice's "y".
//   head:  as BuildGpt ("loss" with input "targets", or "logits"); Model::loss as BuildGpt's.
//   otherwise the single output "y" f32[B, T, C], the hidden state for the next slice (the value
//          the whole model calls h_in or h.i.out), and Model::loss is "".
//   Under Precision::kBf16 "x" and "y" are bf16 (h_in.bf16, h.i.out.bf16 of the whole model).
// Every ParamSpec has init_index = its position in BuildGpt's parameter list, so InitParams gives
// a slice bitwise the whole model's tensors. The whole-model slice gives exactly BuildGpt's model.
// Throws InvalidArgument naming the slice when it is empty (no embed, no head, no layers) or its
// layers are out of [0, config.layers); otherwise as BuildGpt.
Model BuildGptSlice(const GptConfig& config, int64_t batch, GptOutput output, int64_t seq_len,
                    const GptSlice& slice);

// The GPT's units in model order — embed (unit 0), h.0 … h.L−1 (units 1 … L), head (unit L + 1) —
// and their forward FLOPs (a multiply-add counts 2) at batch B, sequence T (seq_len; 0 =
// config.seq), channels C:
//   embed = B·T·C                      the position add (the lookup does no arithmetic)
//   block = 24·B·T·C² + 4·B·T²·C       c_attn 6, attn.c_proj 2, c_fc 8, mlp.c_proj 8 (× B·T·C²);
//                                      q·kᵀ and att·v 2 each (× B·T²·C)
//   head  = 2·B·T·C·vocab              lm_head
// Layer norms, softmax, GELU, biases and the loss are linear in B·T·C (or B·T·vocab) and left out.
struct GptCosts {
  double embed = 0;
  double block = 0;
  double head = 0;
};
GptCosts EstimateGptCosts(const GptConfig& config, int64_t batch, int64_t seq_len);
ModelUnits GptUnits(const GptConfig& config, int64_t batch, int64_t seq_len);

// Units [range.first, range.end) of GptUnits as a slice.
GptSlice GptSliceOfUnits(const UnitRange& range, int64_t layers);

// The slice in --layout syntax (pipeline/partition.h): "embed,h.0-1", "h.2", "h.3-5,head", "head".
// An end_layer of -1 stands for `layers`.
std::string SliceText(const GptSlice& slice, int64_t layers);

}  // namespace sluice
