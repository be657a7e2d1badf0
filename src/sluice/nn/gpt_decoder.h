// GptDecoder: text generation from a trained GPT (nn/gpt.h) with a key/value cache.
//
// Training runs the model as a program over whole sequences [B, T]. Generating one token at a
// time that way would recompute the whole prefix for every new token (T² work per sequence). The
// decoder keeps, per layer, the keys and values of every position seen so far (the KV cache,
// [L, H, T, D] each) and computes only the new positions: appending n tokens costs n rows of every
// linear layer plus attention against the cached prefix.
//
// It computes what BuildGpt(config, 1, GptOutput::kLogits) computes — the same weights by the same
// names (docs/models.md), the same formulas (pre-LayerNorm blocks, causal attention, GELU tanh,
// untied head) — from the same kernels (kernels/layer_norm.h, kernels/unary.h GeluFast, Gemm), so
// its logits agree with the program's within float rounding (tests/nn/gpt_decoder_test.cc
// compares them position by position, for a prefill and for one token at a time). Under
// config.precision bf16 it rounds to bf16 where the program stores bf16 (nn/gpt.h, the autocast
// pass): the block linears' and the logits' inputs and weights (products summed in f32), the layer
// norms' inputs and outputs (ln_f's too), qkv and the attention's output, GELU's input and output,
// the hidden state between blocks (the embedding's and each block's output); the residual
// additions stay f32.
//
// Positions: the model has config.seq rows of position embeddings, so the cache holds at most
// seq positions. Generate() slides the window when it is full: it keeps the last seq/2 tokens and
// encodes them again once (an absolute-position model cannot shift its cache), then continues
// with the cache — one re-encode per seq/2 generated tokens instead of one per token.
//
// Thread-safety: a decoder is used by one thread at a time. Failure modes: the constructor throws
// InvalidArgument listing every missing or mis-shaped parameter; Append throws InvalidArgument for
// a token outside [0, vocab) or more positions than the model has.
//
// Example:
//   GptDecoder decoder(config, checkpoint.tensors);
//   TokenSampler sampler({.temperature = 0.8, .top_k = 40, .seed = 1});
//   GenerateResult r = Generate(decoder, prompt_ids, /*tokens=*/200, sampler);
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "sluice/core/tensor.h"
#include "sluice/nn/gpt.h"

namespace sluice {

class GptDecoder {
 public:
  // Reads (does not copy) the weights: `params` must outlive the decoder. Only f32 contiguous
  // tensors named as BuildGpt names them are accepted; extra tensors (optimizer state) are ignored.
  GptDecoder(const GptConfig& config, const std::map<std::string, Tensor>& params);

  const GptConfig& config() const { return config_; }
  // Positions held in the cache (the next token's position).
  int64_t length() const { return length_; }
  // Forgets every cached position.
  void Reset() { length_ = 0; }

  // Encodes `tokens` at positions [length(), length() + n) and returns their logits, row-major
  // [n, vocab] (valid until the next call). Throws InvalidArgument when a token is outside
  // [0, vocab) or length() + n > config.seq.
  std::span<const float> Append(std::span<const int64_t> tokens);

 private:
  struct Layer {
    const float *ln1_w, *ln1_b, *attn_w, *attn_b, *proj_w, *proj_b;
    const float *ln2_w, *ln2_b, *fc_w, *fc_b, *fc_proj_w, *fc_proj_b;
  };
  GptConfig config_;
  const float *wte_, *wpe_, *lnf_w_, *lnf_b_, *head_;
  std::vector<Layer> layers_;
  std::vector<float> keys_, values_;  // [L, H, seq, D] each
  int64_t length_ = 0;
  // Scratch for one Append of n rows: x, normed [n, C]; qkv [n, 3C]; att [n, C]; fc [n, 4C] twice;
  // scores [seq]; logits [n, vocab].
  std::vector<float> x_, normed_, qkv_, att_, fc_, fc_act_, scores_, logits_;
  // Under bf16: the block linears' and lm_head's weights rounded to bf16 (Layer and head_ point
  // into it), one linear's input rounded, and a layer norm's input rounded.
  std::vector<float> bf16_weights_, rounded_, norm_in_;

  // x [n] rounded to bf16 in place under bf16 (a value the program stores bf16), as is otherwise.
  void StoreAsBf16(float* x, int64_t n) const;
  // normed_ [n, C] = layer_norm(x [n, C]) with the program's rounding under bf16.
  void Norm(const float* x, const float* w, const float* b, int64_t n);

  // out [n, out] = x [n, in] · w [in, out] + b [out]; under bf16, x rounded to bf16 first.
  void Linear(const float* x, const float* w, const float* b, float* out, int64_t n, int64_t in,
              int64_t out_dim);
};

// How the next token is chosen from the logits.
struct SamplingOptions {
  bool greedy = false;       // the most likely token (ties: the smallest id); no randomness
  double temperature = 1.0;  // logits are divided by it before the softmax; must be > 0
  int64_t top_k = 0;         // sample among the k most likely tokens only (0: all)
  uint64_t seed = 0;         // the same seed and logits give the same tokens
};

// Draws tokens from logits. Deterministic: the draws are a pure function of the seed and the
// logits (a 64-bit Mersenne Twister, the same on every platform).
class TokenSampler {
 public:
  // Throws InvalidArgument when sampling (not greedy) with temperature ≤ 0 or not finite, or with
  // top_k < 0.
  explicit TokenSampler(const SamplingOptions& options);
  int64_t Next(std::span<const float> logits);

 private:
  SamplingOptions options_;
  std::mt19937_64 rng_;
  std::vector<double> probs_;
};

struct GenerateResult {
  std::vector<int64_t> tokens;  // the generated tokens (the prompt not included)
  double prefill_s = 0;         // encoding the prompt
  double decode_s = 0;          // generating `tokens` (window re-encodes included)
  int64_t reencodes = 0;        // times the window was full and slid
};

// Encodes `prompt` (1 ≤ size ≤ config.seq) from an empty cache, then generates `tokens` tokens,
// calling on_token (when given) with each as soon as it is chosen. Throws as Append.
GenerateResult Generate(GptDecoder& decoder, std::span<const int64_t> prompt, int64_t tokens,
                        TokenSampler& sampler,
                        const std::function<void(int64_t)>& on_token = nullptr);

}  // namespace sluice
