#include "sluice/nn/gpt_decoder.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "sluice/core/dtype.h"
#include "sluice/core/error.h"
#include "sluice/kernels/layer_norm.h"
#include "sluice/kernels/matmul.h"
#include "sluice/kernels/unary.h"

namespace sluice {

namespace {

constexpr float kLayerNormEps = 1e-5f;  // as nn/layers.h LayerNormLayer

// Each of `n` values rounded to the nearest bf16 (ties to even), kept as f32.
void RoundToBf16(const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = BF16ToFloat(FloatToBF16(x[i]));
}

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

GptDecoder::GptDecoder(const GptConfig& config, const std::map<std::string, Tensor>& params)
    : config_(config) {
  ValidateGptConfig(config);
  // The parameters BuildGpt declares, with their shapes: the one list of names and shapes.
  const Model model = BuildGpt(config, /*batch=*/1, GptOutput::kLogits, /*seq_len=*/1);
  std::vector<std::string> problems;
  std::map<std::string, const float*> found;
  for (const ParamSpec& spec : model.params) {
    auto it = params.find(spec.name);
    if (it == params.end()) {
      problems.push_back(fmt::format("'{}' is missing", spec.name));
      continue;
    }
    const Tensor& t = it->second;
    if (t.dtype() != DType::kF32 || t.shape() != spec.shape || !t.is_contiguous()) {
      problems.push_back(fmt::format("'{}' is {} {}, expected f32 {}", spec.name, Name(t.dtype()),
                                     t.shape().ToString(), spec.shape.ToString()));
      continue;
    }
    found[spec.name] = t.data<float>();
  }
  if (!problems.empty()) {
    std::string list;
    for (const std::string& p : problems) list += "\n  " + p;
    throw InvalidArgument(fmt::format(
        "the weights do not fit a GPT with vocab {}, seq {}, layers {}, heads {}, dim {}:{}",
        config.vocab, config.seq, config.layers, config.heads, config.dim, list));
  }
  wte_ = found.at("wte.weight");
  wpe_ = found.at("wpe.weight");
  lnf_w_ = found.at("ln_f.weight");
  lnf_b_ = found.at("ln_f.bias");
  head_ = found.at("lm_head.weight");
  for (int64_t l = 0; l < config.layers; ++l) {
    auto p = [&](const char* name) { return found.at(fmt::format("h.{}.{}", l, name)); };
    layers_.push_back({p("ln_1.weight"), p("ln_1.bias"), p("attn.c_attn.weight"),
                       p("attn.c_attn.bias"), p("attn.c_proj.weight"), p("attn.c_proj.bias"),
                       p("ln_2.weight"), p("ln_2.bias"), p("mlp.c_fc.weight"), p("mlp.c_fc.bias"),
                       p("mlp.c_proj.weight"), p("mlp.c_proj.bias")});
  }
  if (config.precision == Precision::kBf16) {
    // The block linears and the logits multiply bf16 operands (nn/gpt.h, the autocast pass):
    // their weights are rounded once here, and their inputs at each product (Linear, Norm).
    // Products of bf16 values are exact in f32 and summed in f32, as the program's bf16 products
    // sum them.
    const int64_t C = config.dim;
    const int64_t per_layer = C * 3 * C + C * C + C * 4 * C + 4 * C * C;
    bf16_weights_.resize(static_cast<size_t>(config.layers * per_layer + config.vocab * C));
    float* next = bf16_weights_.data();
    auto round = [&](const float*& w, int64_t count) {
      RoundToBf16(w, next, count);
      w = next;
      next += count;
    };
    for (Layer& layer : layers_) {
      round(layer.attn_w, C * 3 * C);
      round(layer.proj_w, C * C);
      round(layer.fc_w, C * 4 * C);
      round(layer.fc_proj_w, 4 * C * C);
    }
    round(head_, config.vocab * C);
  }
  const size_t cache = static_cast<size_t>(config.layers * config.seq * config.dim);
  keys_.resize(cache);
  values_.resize(cache);
  scores_.resize(static_cast<size_t>(config.seq));
}

void GptDecoder::Linear(const float* x, const float* w, const float* b, float* out, int64_t n,
                        int64_t in, int64_t out_dim) {
  for (int64_t r = 0; r < n; ++r) std::copy(b, b + out_dim, out + r * out_dim);
  if (config_.precision == Precision::kBf16) {
    rounded_.resize(static_cast<size_t>(n * in));
    RoundToBf16(x, rounded_.data(), n * in);
    x = rounded_.data();
  }
  kernels::Gemm(false, false, n, out_dim, in, 1.0f, x, w, 1.0f, out);
}

void GptDecoder::StoreAsBf16(float* x, int64_t n) const {
  if (config_.precision == Precision::kBf16) RoundToBf16(x, x, n);
}

void GptDecoder::Norm(const float* x, const float* w, const float* b, int64_t n) {
  const int64_t C = config_.dim;
  if (config_.precision == Precision::kBf16) {
    norm_in_.resize(static_cast<size_t>(n * C));
    RoundToBf16(x, norm_in_.data(), n * C);
    x = norm_in_.data();
  }
  kernels::LayerNormFast<float>(x, w, b, normed_.data(), n, C, kLayerNormEps);
  StoreAsBf16(normed_.data(), n * C);
}

std::span<const float> GptDecoder::Append(std::span<const int64_t> tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t C = config_.dim, H = config_.heads, D = C / H, S = config_.seq, V = config_.vocab;
  if (length_ + n > S) {
    throw InvalidArgument(fmt::format(
        "{} positions do not fit the model's {} (--seq {}): {} are cached, {} more were given",
        length_ + n, S, S, length_, n));
  }
  for (int64_t i = 0; i < n; ++i) {
    if (tokens[i] < 0 || tokens[i] >= V) {
      throw InvalidArgument(fmt::format("token {} at position {} is outside the vocabulary [0, {})",
                                        tokens[i], length_ + i, V));
    }
  }
  auto size = [](int64_t k) { return static_cast<size_t>(k); };
  x_.resize(size(n * C));
  normed_.resize(size(n * C));
  qkv_.resize(size(n * 3 * C));
  att_.resize(size(n * C));
  fc_.resize(size(n * 4 * C));
  fc_act_.resize(size(n * 4 * C));
  logits_.resize(size(n * V));

  // x = wte[token] + wpe[position]
  for (int64_t i = 0; i < n; ++i) {
    const float* te = wte_ + tokens[i] * C;
    const float* pe = wpe_ + (length_ + i) * C;
    for (int64_t c = 0; c < C; ++c) x_[size(i * C + c)] = te[c] + pe[c];
  }
  StoreAsBf16(x_.data(), n * C);  // what crosses a unit boundary is bf16 (ir/autocast.h)
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(D)));
  for (size_t l = 0; l < layers_.size(); ++l) {
    const Layer& w = layers_[l];
    // Attention: qkv = ln_1(x)·W + b; the new keys and values join the cache.
    Norm(x_.data(), w.ln1_w, w.ln1_b, n);
    Linear(normed_.data(), w.attn_w, w.attn_b, qkv_.data(), n, C, 3 * C);
    StoreAsBf16(qkv_.data(), n * 3 * C);
    float* keys = keys_.data() + l * size(S * C);  // [H, S, D]
    float* values = values_.data() + l * size(S * C);
    for (int64_t i = 0; i < n; ++i) {
      const float* row = qkv_.data() + i * 3 * C;
      for (int64_t h = 0; h < H; ++h) {
        std::copy_n(row + C + h * D, D, keys + (h * S + length_ + i) * D);
        std::copy_n(row + 2 * C + h * D, D, values + (h * S + length_ + i) * D);
      }
    }
    // Each new position i attends to positions [0, length_ + i].
    for (int64_t i = 0; i < n; ++i) {
      const int64_t p = length_ + i;
      for (int64_t h = 0; h < H; ++h) {
        const float* q = qkv_.data() + i * 3 * C + h * D;
        float max = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j <= p; ++j) {
          const float* k = keys + (h * S + j) * D;
          float dot = 0;
          for (int64_t d = 0; d < D; ++d) dot += q[d] * k[d];
          scores_[size(j)] = dot * scale;
          max = std::max(max, scores_[size(j)]);
        }
        float sum = 0;
        for (int64_t j = 0; j <= p; ++j) {
          scores_[size(j)] = std::exp(scores_[size(j)] - max);
          sum += scores_[size(j)];
        }
        float* y = att_.data() + i * C + h * D;
        std::fill_n(y, D, 0.0f);
        for (int64_t j = 0; j <= p; ++j) {
          const float prob = scores_[size(j)] / sum;
          const float* v = values + (h * S + j) * D;
          for (int64_t d = 0; d < D; ++d) y[d] += prob * v[d];
        }
      }
    }
    StoreAsBf16(att_.data(), n * C);
    Linear(att_.data(), w.proj_w, w.proj_b, normed_.data(), n, C, C);
    for (size_t k = 0; k < size(n * C); ++k) x_[k] += normed_[k];
    // MLP: x += c_proj(gelu(c_fc(ln_2(x))))
    Norm(x_.data(), w.ln2_w, w.ln2_b, n);
    Linear(normed_.data(), w.fc_w, w.fc_b, fc_.data(), n, C, 4 * C);
    StoreAsBf16(fc_.data(), n * 4 * C);
    kernels::GeluFast<float>(fc_.data(), fc_act_.data(), n * 4 * C);
    StoreAsBf16(fc_act_.data(), n * 4 * C);
    Linear(fc_act_.data(), w.fc_proj_w, w.fc_proj_b, normed_.data(), n, 4 * C, C);
    for (size_t k = 0; k < size(n * C); ++k) x_[k] += normed_[k];
    StoreAsBf16(x_.data(), n * C);
  }
  length_ += n;
  // logits [n, V] = ln_f(x) · lm_headᵀ
  Norm(x_.data(), lnf_w_, lnf_b_, n);
  kernels::Gemm(false, true, n, V, C, 1.0f, normed_.data(), head_, 0.0f, logits_.data());
  return {logits_.data(), logits_.size()};
}

TokenSampler::TokenSampler(const SamplingOptions& options) : options_(options), rng_(options.seed) {
  if (!options.greedy && !(options.temperature > 0 && std::isfinite(options.temperature))) {
    throw InvalidArgument(fmt::format(
        "--temperature must be a positive number when sampling, got {}; use --greedy for the most "
        "likely token at every step",
        options.temperature));
  }
  if (options.top_k < 0) {
    throw InvalidArgument(
        fmt::format("--top-k must be 0 (all tokens) or positive, got {}", options.top_k));
  }
}

int64_t TokenSampler::Next(std::span<const float> logits) {
  const int64_t V = static_cast<int64_t>(logits.size());
  // Greedy: the first maximum.
  const int64_t best = std::max_element(logits.begin(), logits.end()) - logits.begin();
  if (options_.greedy) return best;
  // Top-k: keep the logits at least as large as the k-th largest (ties at the boundary kept).
  float threshold = -std::numeric_limits<float>::infinity();
  if (options_.top_k > 0 && options_.top_k < V) {
    std::vector<float> sorted(logits.begin(), logits.end());
    std::nth_element(sorted.begin(), sorted.begin() + (options_.top_k - 1), sorted.end(),
                     std::greater<float>());
    threshold = sorted[static_cast<size_t>(options_.top_k - 1)];
  }
  // Softmax of logits / temperature over the kept tokens, in double.
  probs_.assign(logits.size(), 0.0);
  const double max = logits[static_cast<size_t>(best)];
  double sum = 0;
  for (size_t v = 0; v < logits.size(); ++v) {
    if (logits[v] < threshold) continue;
    probs_[v] = std::exp((static_cast<double>(logits[v]) - max) / options_.temperature);
    sum += probs_[v];
  }
  // A uniform double in [0, 1) from 53 random bits (the same on every platform, unlike
  // std::uniform_real_distribution).
  const double u = static_cast<double>(rng_() >> 11) * 0x1.0p-53 * sum;
  double acc = 0;
  int64_t last_kept = best;
  for (size_t v = 0; v < probs_.size(); ++v) {
    if (probs_[v] == 0) continue;
    acc += probs_[v];
    last_kept = static_cast<int64_t>(v);
    if (u < acc) return last_kept;
  }
  return last_kept;  // u within rounding of sum
}

GenerateResult Generate(GptDecoder& decoder, std::span<const int64_t> prompt, int64_t tokens,
                        TokenSampler& sampler, const std::function<void(int64_t)>& on_token) {
  const int64_t S = decoder.config().seq;
  if (prompt.empty()) throw InvalidArgument("the prompt is empty: give at least one token");
  if (static_cast<int64_t>(prompt.size()) > S) {
    throw InvalidArgument(fmt::format(
        "the prompt is {} tokens long but the model takes at most {} positions (--seq {})",
        prompt.size(), S, S));
  }
  if (tokens < 0) throw InvalidArgument(fmt::format("--tokens must be ≥ 0, got {}", tokens));
  GenerateResult r;
  std::vector<int64_t> context(prompt.begin(), prompt.end());  // what the cache holds
  auto t0 = std::chrono::steady_clock::now();
  decoder.Reset();
  std::span<const float> logits = decoder.Append(prompt);
  const int64_t V = decoder.config().vocab;
  std::span<const float> last = logits.subspan(logits.size() - static_cast<size_t>(V));
  r.prefill_s = SecondsSince(t0);
  t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < tokens; ++i) {
    const int64_t next = sampler.Next(last);
    r.tokens.push_back(next);
    if (on_token) on_token(next);
    if (i + 1 == tokens) break;  // the last token's logits are not needed
    if (decoder.length() == S) {
      // The window is full: keep the last half of it and encode it again at positions [0, keep).
      const int64_t keep = std::max<int64_t>(1, S / 2);
      context.erase(context.begin(), context.end() - (keep - 1));
      context.push_back(next);
      decoder.Reset();
      logits = decoder.Append(context);
      ++r.reencodes;
    } else {
      context.push_back(next);
      logits = decoder.Append(std::span<const int64_t>(&next, 1));
    }
    last = logits.subspan(logits.size() - static_cast<size_t>(V));
  }
  r.decode_s = SecondsSince(t0);
  return r;
}

}  // namespace sluice
