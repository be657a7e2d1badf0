// GPT: a nanoGPT-style decoder-only transformer written as a program.
//
//   ids [B, T] → wte + wpe → N × pre-LayerNorm block → ln_f → lm_head → logits [B, T, V]
//   block(x) = x + attn(ln_1(x)); x + mlp(ln_2(x))
//   attn: causal self-attention, H heads of D = C/H, written with matmul and masked softmax
//   mlp:  Linear(C, 4C) → GELU (tanh) → Linear(4C, C)
// Linear layers have biases, layer norms weight and bias (eps 1e-5), no dropout, lm_head has no
// bias and is not tied to wte. Parameter names and layouts: docs/models.md (GPT-2 names; block
// weights stored [in, out], lm_head.weight [V, C] like torch.nn.Linear).
//
// Example:
//   GptConfig cfg{.vocab = 11, .seq = 12, .layers = 2, .heads = 4, .dim = 64};
//   Model m = BuildGpt(cfg, /*batch=*/32, GptOutput::kLoss);
#pragma once

#include <cstdint>

#include "sluice/nn/model.h"

namespace sluice {

struct GptConfig {
  int64_t vocab = 256;
  int64_t seq = 64;  // the longest sequence the model takes (rows of wpe)
  int64_t layers = 4;
  int64_t heads = 4;
  int64_t dim = 128;
};

// Throws InvalidArgument saying what to change (heads not dividing dim, non-positive sizes).
void ValidateGptConfig(const GptConfig& config);

enum class GptOutput {
  kLoss,    // inputs ids, targets [B, T] (i64); output scalar "loss" (mean over counted targets)
  kLogits,  // input ids [B, T]; output "logits" [B, T, V]
};

// The model for batches of `batch` sequences of length `seq_len` (≤ config.seq; 0 = config.seq).
Model BuildGpt(const GptConfig& config, int64_t batch, GptOutput output, int64_t seq_len = 0);

}  // namespace sluice
