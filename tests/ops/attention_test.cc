// Op table: fused attention (causal_attention, attention, attention_key_bias,
// causal_attention_qkv and their gradients), plus what the table cannot state: the fused ops
// compute what the naive chain matmul → scale → (causal_mask | add key bias) → softmax → matmul
// computes, across several query tiles and key chunks of the fast kernels (T >
// kernels::kAttentionKeyChunk), hidden keys (−inf) included, and the packed op what split →
// transpose → causal_attention → transpose computes; a query with every key hidden gets NaN.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "op_harness.h"
#include "sluice/autodiff/autodiff.h"
#include "sluice/exec/reference_runner.h"
#include "sluice/ir/ops.h"
#include "sluice/kernels/attention.h"

namespace sluice::testing {
std::vector<OpCase> AttentionCases() {
  const Attrs scale{{"scale", 0.5}};
  const Fill wide = Uniform(-2, 2);
  // T beyond one key chunk, so the fast kernels rescale partial rows (online softmax).
  const int64_t long_t = kernels::kAttentionKeyChunk + 3;
  return {
      {.label = "attention",
       .op = "causal_attention",
       .inputs = {F({2, 3, 5, 4}), F({2, 3, 5, 4}), F({2, 3, 5, 4})},
       .attrs = scale,
       .fills = {wide, wide}},
      {.label = "attention_one_position",
       .op = "causal_attention",
       .inputs = {F({1, 1, 3}), F({1, 1, 3}), F({1, 1, 3})},
       .attrs = scale},
      {.label = "attention_two_tiles",
       .op = "causal_attention",
       .inputs = {F({1, 67, 2}), F({1, 67, 2}), F({1, 67, 2})},
       .attrs = scale,
       .fills = {wide, wide},
       .grad_tolerance = 1e-5},
      {.label = "attention_long",
       .op = "causal_attention",
       .inputs = {F({2, long_t, 8}), F({2, long_t, 8}), F({2, long_t, 8})},
       .attrs = scale,
       .fills = {wide, wide},
       .grad = false},
      // Grouped-query attention: k and v with fewer heads (2 query heads per key/value head).
      {.label = "attention_grouped",
       .op = "causal_attention",
       .inputs = {F({2, 4, 5, 4}), F({2, 2, 5, 4}), F({2, 2, 5, 4})},
       .attrs = scale,
       .fills = {wide, wide}},
      {.label = "attention_grouped_one_kv_head_two_tiles",
       .op = "causal_attention",
       .inputs = {F({1, 3, 67, 2}), F({1, 1, 67, 2}), F({1, 1, 67, 2})},
       .attrs = scale,
       .fills = {wide, wide},
       .grad_tolerance = 1e-5},
      {.label = "attention_qkv",
       .op = "causal_attention_qkv",
       .inputs = {F({2, 5, 3 * 6})},
       .attrs = {{"heads", 2}, {"scale", 0.5}},
       .fills = {wide}},
      {.label = "attention_qkv_one_head_two_tiles",
       .op = "causal_attention_qkv",
       .inputs = {F({67, 3 * 2})},
       .attrs = {{"heads", 1}, {"scale", 0.5}},
       .fills = {wide},
       .grad_tolerance = 1e-5},
      {.label = "attention_qkv_long",
       .op = "causal_attention_qkv",
       .inputs = {F({2, long_t, 3 * 16})},
       .attrs = {{"heads", 2}, {"scale", 0.5}},
       .fills = {wide},
       .grad = false},
      {.label = "attention_qkv_grad",
       .op = "causal_attention_qkv_grad",
       .inputs = {F({2, long_t, 16}), F({2, 2, long_t}), F({2, long_t, 3 * 16}), F({2, long_t, 16}),
                  F({2, 2, long_t})},
       .attrs = {{"heads", 2}, {"scale", 0.5}},
       .grad = false},
      // On bf16 qkv (kernels/bf16_activations.h): widened exactly, f32 inside, y rounded to bf16
      // (2^-8 of y against the twin, one ulp between fast and reference; lse f32); backward reads
      // the rounded y (dy·y, 2e-3 through the op's VJP); the gradient op takes bf16 qkv and y and
      // computes the f32 kernel's values (f32 rounding against the twin).
      {.label = "attention_qkv_bf16",
       .op = "causal_attention_qkv",
       .inputs = {F({2, 5, 3 * 6})},
       .attrs = {{"heads", 2}, {"scale", 0.5}},
       .fills = {wide},
       .f32_tolerance = 8e-3,
       .bf16 = true,
       .bf16_inputs = {0},
       .bf16_tolerance = 4e-3,
       .bf16_grad_tolerance = 2e-3},
      {.label = "attention_qkv_bf16_long",
       .op = "causal_attention_qkv",
       .inputs = {F({2, long_t, 3 * 16})},
       .attrs = {{"heads", 2}, {"scale", 0.5}},
       .fills = {wide},
       .grad = false,
       .f32_tolerance = 8e-3,
       .bf16 = true,
       .bf16_inputs = {0},
       .bf16_tolerance = 4e-3},
      {.label = "attention_qkv_grad_bf16",
       .op = "causal_attention_qkv_grad",
       .inputs = {F({2, long_t, 16}), F({2, 2, long_t}), F({2, long_t, 3 * 16}), F({2, long_t, 16}),
                  F({2, 2, long_t})},
       .attrs = {{"heads", 2}, {"scale", 0.5}},
       .grad = false,
       .bf16 = true,
       .bf16_inputs = {2, 3},
       .bf16_tolerance = 1e-5},
      // On bf16 q, k, v (kernels/bf16_activations.h), as on bf16 qkv: widened exactly, f32
      // inside, y rounded (2^-8 of y against the twin, one ulp between fast and reference; lse
      // f32); backward reads the rounded y through dy·y (4e-3 here, 2.6e-3 measured on the first
      // case: y's half ulp summed over a row, against the gradient's largest entry); the gradient
      // op on bf16 q, k, v and y computes the f32 kernel's values (f32 rounding against the twin).
      // Grouped heads, several query tiles and key chunks, and several sequences.
      {.label = "attention_bf16",
       .op = "causal_attention",
       .inputs = {F({2, 3, 5, 4}), F({2, 3, 5, 4}), F({2, 3, 5, 4})},
       .attrs = scale,
       .fills = {wide, wide},
       .f32_tolerance = 8e-3,
       .bf16 = true,
       .bf16_inputs = {0, 1, 2},
       .bf16_tolerance = 4e-3,
       .bf16_grad_tolerance = 4e-3},
      {.label = "attention_bf16_grouped",
       .op = "causal_attention",
       .inputs = {F({2, 4, 5, 4}), F({2, 2, 5, 4}), F({2, 2, 5, 4})},
       .attrs = scale,
       .fills = {wide, wide},
       .f32_tolerance = 8e-3,
       .bf16 = true,
       .bf16_inputs = {0, 1, 2},
       .bf16_tolerance = 4e-3,
       .bf16_grad_tolerance = 4e-3},
      {.label = "attention_bf16_grouped_long",
       .op = "causal_attention",
       .inputs = {F({2, 4, long_t, 8}), F({2, 2, long_t, 8}), F({2, 2, long_t, 8})},
       .attrs = scale,
       .fills = {wide, wide},
       .grad = false,
       .f32_tolerance = 8e-3,
       .bf16 = true,
       .bf16_inputs = {0, 1, 2},
       .bf16_tolerance = 4e-3},
      {.label = "attention_grad_bf16_grouped_long",
       .op = "causal_attention_grad",
       .inputs = {F({2, 4, long_t, 8}), F({2, 4, long_t}), F({2, 4, long_t, 8}),
                  F({2, 2, long_t, 8}), F({2, 2, long_t, 8}), F({2, 4, long_t, 8}),
                  F({2, 4, long_t})},
       .attrs = scale,
       .grad = false,
       .bf16 = true,
       .bf16_inputs = {2, 3, 4, 5},
       .bf16_tolerance = 1e-5},
      {.label = "attention_grad",
       .op = "causal_attention_grad",
       .inputs = {F({2, 3, 5, 4}), F({2, 3, 5}), F({2, 3, 5, 4}), F({2, 3, 5, 4}), F({2, 3, 5, 4}),
                  F({2, 3, 5, 4}), F({2, 3, 5})},
       .attrs = scale,
       .grad = false},
      {.label = "attention_grad_grouped_long",
       .op = "causal_attention_grad",
       .inputs = {F({3, long_t, 8}), F({3, long_t}), F({3, long_t, 8}), F({1, long_t, 8}),
                  F({1, long_t, 8}), F({3, long_t, 8}), F({3, long_t})},
       .attrs = scale,
       .grad = false},
      {.label = "attention_grad_long",
       .op = "causal_attention_grad",
       .inputs = {F({2, long_t, 8}), F({2, long_t}), F({2, long_t, 8}), F({2, long_t, 8}),
                  F({2, long_t, 8}), F({2, long_t, 8}), F({2, long_t})},
       .attrs = scale,
       .grad = false},
      // Every key seen (an encoder's attention), and with a key bias [B, T] shared by the heads.
      {.label = "attention_all_keys",
       .op = "attention",
       .inputs = {F({2, 3, 5, 4}), F({2, 3, 5, 4}), F({2, 3, 5, 4})},
       .attrs = scale,
       .fills = {wide, wide}},
      {.label = "attention_all_keys_two_tiles",
       .op = "attention",
       .inputs = {F({1, 67, 2}), F({1, 67, 2}), F({1, 67, 2})},
       .attrs = scale,
       .fills = {wide, wide},
       .grad_tolerance = 1e-5},
      {.label = "attention_all_keys_grouped_long",
       .op = "attention",
       .inputs = {F({2, 4, long_t, 8}), F({2, 2, long_t, 8}), F({2, 2, long_t, 8})},
       .attrs = scale,
       .fills = {wide, wide},
       .grad = false},
      {.label = "attention_key_bias",
       .op = "attention_key_bias",
       .inputs = {F({2, 3, 5, 4}), F({2, 3, 5, 4}), F({2, 3, 5, 4}), F({2, 5})},
       .attrs = scale,
       .fills = {wide, wide, wide, wide},
       .no_grad_inputs = {3}},
      {.label = "attention_key_bias_grouped_two_tiles",
       .op = "attention_key_bias",
       .inputs = {F({1, 2, 67, 2}), F({1, 1, 67, 2}), F({1, 1, 67, 2}), F({1, 67})},
       .attrs = scale,
       .fills = {wide, wide, wide, wide},
       .grad_tolerance = 1e-5,
       .no_grad_inputs = {3}},
      {.label = "attention_key_bias_long",
       .op = "attention_key_bias",
       .inputs = {F({2, 2, long_t, 8}), F({2, 2, long_t, 8}), F({2, 2, long_t, 8}), F({2, long_t})},
       .attrs = scale,
       .fills = {wide, wide, wide, wide},
       .grad = false},
      // bf16 as causal_attention's (tolerances there); the key bias stays f32.
      {.label = "attention_all_keys_bf16_grouped",
       .op = "attention",
       .inputs = {F({2, 4, 5, 4}), F({2, 2, 5, 4}), F({2, 2, 5, 4})},
       .attrs = scale,
       .fills = {wide, wide},
       .f32_tolerance = 8e-3,
       .bf16 = true,
       .bf16_inputs = {0, 1, 2},
       .bf16_tolerance = 4e-3,
       .bf16_grad_tolerance = 4e-3},
      {.label = "attention_key_bias_bf16",
       .op = "attention_key_bias",
       .inputs = {F({2, 3, 5, 4}), F({2, 3, 5, 4}), F({2, 3, 5, 4}), F({2, 5})},
       .attrs = scale,
       .fills = {wide, wide, wide, wide},
       .f32_tolerance = 8e-3,
       .no_grad_inputs = {3},
       .bf16 = true,
       .bf16_inputs = {0, 1, 2},
       .bf16_tolerance = 4e-3,
       .bf16_grad_tolerance = 4e-3},
      {.label = "attention_key_bias_bf16_long",
       .op = "attention_key_bias",
       .inputs = {F({2, 2, long_t, 8}), F({2, 2, long_t, 8}), F({2, 2, long_t, 8}), F({2, long_t})},
       .attrs = scale,
       .fills = {wide, wide, wide, wide},
       .grad = false,
       .f32_tolerance = 8e-3,
       .bf16 = true,
       .bf16_inputs = {0, 1, 2},
       .bf16_tolerance = 4e-3},
      {.label = "attention_all_keys_grad",
       .op = "attention_grad",
       .inputs = {F({2, 3, 5, 4}), F({2, 3, 5}), F({2, 3, 5, 4}), F({2, 3, 5, 4}), F({2, 3, 5, 4}),
                  F({2, 3, 5, 4}), F({2, 3, 5})},
       .attrs = scale,
       .grad = false},
      {.label = "attention_key_bias_grad_long",
       .op = "attention_key_bias_grad",
       .inputs = {F({2, 2, long_t, 8}), F({2, 2, long_t}), F({2, 2, long_t, 8}),
                  F({2, 1, long_t, 8}), F({2, 1, long_t, 8}), F({2, 2, long_t, 8}),
                  F({2, 2, long_t}), F({2, long_t})},
       .attrs = scale,
       .grad = false},
      {.label = "attention_key_bias_grad_bf16",
       .op = "attention_key_bias_grad",
       .inputs = {F({2, 3, 5, 4}), F({2, 3, 5}), F({2, 3, 5, 4}), F({2, 3, 5, 4}), F({2, 3, 5, 4}),
                  F({2, 3, 5, 4}), F({2, 3, 5}), F({2, 5})},
       .attrs = scale,
       .grad = false,
       .bf16 = true,
       .bf16_inputs = {2, 3, 4, 5},
       .bf16_tolerance = 1e-5},
  };
}

namespace {

std::vector<OpErrorCase> AttentionErrors() {
  const Attrs scale{{"scale", 0.5}};
  return {
      {.label = "attention_rank1",
       .op = "causal_attention",
       .inputs = {F({4}), F({4}), F({4})},
       .attrs = scale},
      {.label = "attention_k_shape",
       .op = "causal_attention",
       .inputs = {F({2, 5, 4}), F({2, 6, 4}), F({2, 5, 4})},
       .attrs = scale},
      {.label = "attention_grouped_heads_not_dividing",
       .op = "causal_attention",
       .inputs = {F({2, 3, 5, 4}), F({2, 2, 5, 4}), F({2, 2, 5, 4})},
       .attrs = scale},
      {.label = "attention_grouped_k_v_differ",
       .op = "causal_attention",
       .inputs = {F({2, 4, 5, 4}), F({2, 2, 5, 4}), F({2, 4, 5, 4})},
       .attrs = scale},
      {.label = "attention_grouped_other_axis",
       .op = "causal_attention",
       .inputs = {F({2, 4, 5, 4}), F({1, 4, 5, 4}), F({1, 4, 5, 4})},
       .attrs = scale},
      {.label = "attention_dtype",
       .op = "causal_attention",
       .inputs = {F({5, 4}), F({5, 4}), {DType::kF64, Shape{5, 4}}},
       .attrs = scale},
      {.label = "attention_int",
       .op = "causal_attention",
       .inputs = {I64({5, 4}), I64({5, 4}), I64({5, 4})},
       .attrs = scale},
      {.label = "attention_no_scale",
       .op = "causal_attention",
       .inputs = {F({5, 4}), F({5, 4}), F({5, 4})}},
      {.label = "attention_qkv_not_three_heads",
       .op = "causal_attention_qkv",
       .inputs = {F({2, 5, 12})},
       .attrs = {{"heads", 3}, {"scale", 0.5}}},
      {.label = "attention_qkv_rank1",
       .op = "causal_attention_qkv",
       .inputs = {F({12})},
       .attrs = {{"heads", 2}, {"scale", 0.5}}},
      {.label = "attention_qkv_no_heads",
       .op = "causal_attention_qkv",
       .inputs = {F({5, 12})},
       .attrs = {{"scale", 0.5}}},
      {.label = "attention_qkv_grad_lse",
       .op = "causal_attention_qkv_grad",
       .inputs = {F({5, 4}), F({2, 4}), F({5, 12}), F({5, 4}), F({2, 4})},
       .attrs = {{"heads", 2}, {"scale", 0.5}}},
      {.label = "attention_qkv_grad_bf16_y",
       .op = "causal_attention_qkv_grad",
       .inputs = {F({5, 4}), F({2, 5}), {DType::kBF16, Shape{5, 12}}, F({5, 4}), F({2, 5})},
       .attrs = {{"heads", 2}, {"scale", 0.5}}},
      {.label = "attention_bf16_f32_k",
       .op = "causal_attention",
       .inputs = {{DType::kBF16, Shape{5, 4}}, F({5, 4}), {DType::kBF16, Shape{5, 4}}},
       .attrs = scale},
      {.label = "attention_grad_bf16_dy",
       .op = "causal_attention_grad",
       .inputs = {{DType::kBF16, Shape{5, 4}},
                  F({5}),
                  {DType::kBF16, Shape{5, 4}},
                  {DType::kBF16, Shape{5, 4}},
                  {DType::kBF16, Shape{5, 4}},
                  {DType::kBF16, Shape{5, 4}},
                  F({5})},
       .attrs = scale},
      {.label = "attention_grad_lse",
       .op = "causal_attention_grad",
       .inputs = {F({5, 4}), F({5}), F({5, 4}), F({5, 4}), F({5, 4}), F({5, 4}), F({4})},
       .attrs = scale},
      {.label = "attention_grad_dy",
       .op = "causal_attention_grad",
       .inputs = {F({5, 3}), F({5}), F({5, 4}), F({5, 4}), F({5, 4}), F({5, 4}), F({5})},
       .attrs = scale},
      {.label = "attention_key_bias_shape",
       .op = "attention_key_bias",
       .inputs = {F({2, 3, 5, 4}), F({2, 3, 5, 4}), F({2, 3, 5, 4}), F({2, 3, 5})},
       .attrs = scale},
      {.label = "attention_key_bias_q_rank2",
       .op = "attention_key_bias",
       .inputs = {F({5, 4}), F({5, 4}), F({5, 4}), F({5})},
       .attrs = scale},
      {.label = "attention_key_bias_bf16_bias",
       .op = "attention_key_bias",
       .inputs = {{DType::kBF16, Shape{1, 5, 4}},
                  {DType::kBF16, Shape{1, 5, 4}},
                  {DType::kBF16, Shape{1, 5, 4}},
                  {DType::kBF16, Shape{5}}},
       .attrs = scale},
      {.label = "attention_key_bias_grad_bias_shape",
       .op = "attention_key_bias_grad",
       .inputs = {F({1, 5, 4}), F({1, 5}), F({1, 5, 4}), F({1, 5, 4}), F({1, 5, 4}), F({1, 5, 4}),
                  F({1, 5}), F({4})},
       .attrs = scale},
  };
}

INSTANTIATE_TEST_SUITE_P(Attention, OpHarness, ::testing::ValuesIn(AttentionCases()), CaseName());
INSTANTIATE_TEST_SUITE_P(Attention, OpErrors, ::testing::ValuesIn(AttentionErrors()), CaseName());

Tensor Sine(const Shape& s, double freq) {
  std::vector<double> v(static_cast<size_t>(s.numel()));
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(freq * static_cast<double>(i) + 0.3) * 1.5;
  return Tensor::FromVector<double>(s, v);
}

// Runs `p` forward (fast kernels) and its backward for `wrt` from `scope`: its loss, then the
// gradients in wrt's order.
std::vector<Tensor> LossAndGradients(const Program& p, Scope& scope,
                                     const std::vector<std::string>& wrt) {
  const Backward bwd = BuildBackward(p, {.loss = "loss", .wrt = wrt});
  RunReference(p, scope, DefaultAllocator(), false, bwd.saved);
  RunReference(bwd.program, scope);
  std::vector<Tensor> out = {scope.Get("loss")};
  for (const std::string& g : bwd.grads) out.push_back(scope.Get(g));
  return out;
}

// Every element of `got` within `tolerance` of want's, relative (absolute below magnitude 1); both
// finite.
void ExpectNearAll(const std::vector<Tensor>& want, const std::vector<Tensor>& got,
                   double tolerance) {
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(want[i].numel(), got[i].numel());
    for (int64_t j = 0; j < want[i].numel(); ++j) {
      ASSERT_TRUE(std::isfinite(want[i].FlatAt(j))) << "output " << i << " at " << j;
      EXPECT_NEAR(got[i].FlatAt(j), want[i].FlatAt(j),
                  tolerance * std::max(1.0, std::abs(want[i].FlatAt(j))))
          << "output " << i << " at " << j;
    }
  }
}

// The fused op and the naive chain give the same output and the same gradients of q, k and v, in
// f64 with the fast kernels, over five query tiles and two chunks of keys.
TEST(CausalAttention, MatchesTheNaiveChainWithGradients) {
  const int64_t t = kernels::kAttentionKeyChunk + 9, d = 5;
  const Shape s{2, t, d};
  const double scale = 1 / std::sqrt(static_cast<double>(d));
  auto run = [&](bool fused) {
    Builder b(fused ? "fused" : "naive");
    Var q = b.Input("q", DType::kF64, s), k = b.Input("k", DType::kF64, s),
        v = b.Input("v", DType::kF64, s);
    Var y = fused ? CausalAttention(q, k, v, scale).first
                  : MatMul(Softmax(CausalMask(Scale(MatMul(q, k, false, true), scale))), v);
    Var w = b.Input("w", DType::kF64, s);
    b.Output(b.Name(Sum(y * w), "loss"));
    Program p = b.Build();
    Scope scope;
    scope.Set("q", Sine(s, 0.37));
    scope.Set("k", Sine(s, 0.91));
    scope.Set("v", Sine(s, 0.13));
    scope.Set("w", Sine(s, 0.71));
    return LossAndGradients(p, scope, {"q", "k", "v"});
  };
  const std::vector<Tensor> naive = run(false), fused = run(true);
  ExpectNearAll(naive, fused, 1e-11);
}

// The packed op computes what the copies around causal_attention compute — split qkv, heads
// [B, H, T, D], attention, heads back side by side — output and gradient of qkv, in f64 with the
// fast kernels, over two query tiles.
TEST(CausalAttentionQkv, MatchesSplitTransposeAndCausalAttention) {
  const int64_t batch = 2, t = kernels::kAttentionQueryTile + 9, heads = 3, d = 4, c = heads * d;
  const Shape s{batch, t, 3 * c};
  const double scale = 1 / std::sqrt(static_cast<double>(d));
  auto run = [&](bool packed) {
    Builder b(packed ? "packed" : "copies");
    Var qkv = b.Input("qkv", DType::kF64, s);
    Var y;
    if (packed) {
      y = CausalAttentionQkv(qkv, heads, scale).first;
    } else {
      std::vector<Var> parts = Split(qkv, -1, {c, c, c});
      auto split_heads = [&](Var x) { return Transpose(Reshape(x, {batch, t, heads, d}), 1, 2); };
      Var att = CausalAttention(split_heads(parts[0]), split_heads(parts[1]), split_heads(parts[2]),
                                scale)
                    .first;
      y = Reshape(Transpose(att, 1, 2), {batch, t, c});
    }
    Var w = b.Input("w", DType::kF64, {batch, t, c});
    b.Output(b.Name(Sum(y * w), "loss"));
    Program p = b.Build();
    Scope scope;
    scope.Set("qkv", Sine(s, 0.37));
    scope.Set("w", Sine({batch, t, c}, 0.71));
    return LossAndGradients(p, scope, {"qkv"});
  };
  const std::vector<Tensor> copies = run(false), packed = run(true);
  ExpectNearAll(copies, packed, 1e-12);
}

// Grouped-query attention computes what repeating each key/value head over its group of query
// heads (repeat_interleave: reshape, broadcast_to, reshape) and then causal_attention computes —
// output and gradients of q, k and v (dk, dv summed over the group), in f64 with the fast kernels,
// over two query tiles.
TEST(CausalAttention, GroupedMatchesRepeatedKeysAndValues) {
  const int64_t batch = 2, heads = 6, kv_heads = 2, t = kernels::kAttentionQueryTile + 9, d = 4;
  const int64_t group = heads / kv_heads;
  const Shape sq{batch, heads, t, d}, skv{batch, kv_heads, t, d};
  const double scale = 1 / std::sqrt(static_cast<double>(d));
  auto run = [&](bool grouped) {
    Builder b(grouped ? "grouped" : "repeated");
    Var q = b.Input("q", DType::kF64, sq), k = b.Input("k", DType::kF64, skv),
        v = b.Input("v", DType::kF64, skv);
    auto repeat = [&](Var x) {
      Var wide =
          BroadcastTo(Reshape(x, {batch, kv_heads, 1, t, d}), Shape{batch, kv_heads, group, t, d});
      return Reshape(wide, {batch, heads, t, d});
    };
    Var y = grouped ? CausalAttention(q, k, v, scale).first
                    : CausalAttention(q, repeat(k), repeat(v), scale).first;
    Var w = b.Input("w", DType::kF64, sq);
    b.Output(b.Name(Sum(y * w), "loss"));
    Program p = b.Build();
    Scope scope;
    scope.Set("q", Sine(sq, 0.37));
    scope.Set("k", Sine(skv, 0.91));
    scope.Set("v", Sine(skv, 0.13));
    scope.Set("w", Sine(sq, 0.71));
    return LossAndGradients(p, scope, {"q", "k", "v"});
  };
  const std::vector<Tensor> repeated = run(false), grouped = run(true);
  ASSERT_EQ(repeated.size(), 4u);
  ASSERT_EQ(grouped.size(), 4u);
  ExpectNearAll(repeated, grouped, 1e-12);
}

// attention_key_bias computes what the naive chain with the bias added to the scores (a padding
// mask: −inf at hidden keys, as the exporter lowers BERT's and nn.MultiheadAttention's) computes —
// output and gradients of q, k and v, in f64 with the fast kernels, over two key chunks: the first
// sequence hides every key of the first chunk but for its last, the second hides only a few at the
// end, and a finite bias shifts the others.
TEST(Attention, KeyBiasMatchesTheNaiveChainWithGradients) {
  const int64_t batch = 2, heads = 2, t = kernels::kAttentionKeyChunk + 9, d = 5;
  const Shape s{batch, heads, t, d};
  const double scale = 1 / std::sqrt(static_cast<double>(d));
  std::vector<double> bias(static_cast<size_t>(batch * t));
  for (int64_t j = 0; j < t; ++j) {
    const double inf = std::numeric_limits<double>::infinity();
    bias[j] = j < kernels::kAttentionKeyChunk - 1 ? -inf : 0.1 * static_cast<double>(j % 3);
    bias[t + j] = j >= t - 4 ? -inf : -0.2 * static_cast<double>(j % 5);
  }
  auto run = [&](bool fused) {
    Builder b(fused ? "fused" : "naive");
    Var q = b.Input("q", DType::kF64, s), k = b.Input("k", DType::kF64, s),
        v = b.Input("v", DType::kF64, s), kb = b.Input("bias", DType::kF64, {batch, t});
    Var y = fused ? Attention(q, k, v, scale, kb).first
                  : MatMul(Softmax(Scale(MatMul(q, k, false, true), scale) +
                                   Reshape(kb, {batch, 1, 1, t})),
                           v);
    Var w = b.Input("w", DType::kF64, s);
    b.Output(b.Name(Sum(y * w), "loss"));
    Program p = b.Build();
    Scope scope;
    scope.Set("q", Sine(s, 0.37));
    scope.Set("k", Sine(s, 0.91));
    scope.Set("v", Sine(s, 0.13));
    scope.Set("w", Sine(s, 0.71));
    scope.Set("bias", Tensor::FromVector<double>({batch, t}, bias));
    return LossAndGradients(p, scope, {"q", "k", "v"});
  };
  const std::vector<Tensor> naive = run(false), fused = run(true);
  ASSERT_EQ(naive.size(), 4u);
  ASSERT_EQ(fused.size(), 4u);
  ExpectNearAll(naive, fused, 1e-11);
}

// A sequence whose keys are all hidden: its queries get y = NaN and lse = −inf from both kernels
// (a softmax over a row of −inf gives NaN, as PyTorch's); the other sequence is unaffected —
// over two key chunks, so the fast kernel's online softmax meets a hidden first chunk too.
TEST(Attention, EveryKeyHiddenGivesNaN) {
  const int64_t t = kernels::kAttentionKeyChunk + 3, d = 4;
  const Shape s{2, 1, t, d};
  std::vector<double> bias(static_cast<size_t>(2 * t), 0.0);
  for (int64_t j = 0; j < t; ++j) bias[j] = -std::numeric_limits<double>::infinity();
  Builder b("hidden");
  Var q = b.Input("q", DType::kF64, s), k = b.Input("k", DType::kF64, s),
      v = b.Input("v", DType::kF64, s), kb = b.Input("bias", DType::kF64, {2, t});
  auto [y, lse] = Attention(q, k, v, 0.5, kb);
  b.Output(b.Name(y, "y"));
  b.Output(b.Name(lse, "lse"));
  const Program p = b.Build();
  for (bool reference : {false, true}) {
    const char* kernel = reference ? "reference" : "fast";
    Scope scope;
    scope.Set("q", Sine(s, 0.37));
    scope.Set("k", Sine(s, 0.91));
    scope.Set("v", Sine(s, 0.13));
    scope.Set("bias", Tensor::FromVector<double>({2, t}, bias));
    RunReference(p, scope, DefaultAllocator(), reference);
    const Tensor &ys = scope.Get("y"), &lses = scope.Get("lse");
    for (int64_t i = 0; i < ys.numel(); ++i) {
      const bool hidden = i < t * d;
      EXPECT_EQ(std::isnan(ys.FlatAt(i)), hidden) << kernel << " y at " << i;
      if (!hidden) EXPECT_TRUE(std::isfinite(ys.FlatAt(i))) << kernel << " y at " << i;
    }
    for (int64_t i = 0; i < lses.numel(); ++i) {
      if (i < t) {
        EXPECT_EQ(lses.FlatAt(i), -std::numeric_limits<double>::infinity())
            << kernel << " at " << i;
      } else {
        EXPECT_TRUE(std::isfinite(lses.FlatAt(i))) << kernel << " lse at " << i;
      }
    }
  }
}

// The key bias takes no gradient: autodiff refuses one that depends on what it differentiates.
TEST(Attention, KeyBiasFromAParameterIsRefused) {
  Builder b("bias_param");
  const Shape s{1, 2, 3, 4};
  Var q = b.Input("q", DType::kF32, s);
  Var bias = b.Param("bias", DType::kF32, {1, 3});
  b.Output(b.Name(Sum(Attention(q, q, q, 0.5, bias).first), "loss"));
  Program p = b.Build();
  try {
    BuildBackward(p, {.loss = "loss", .wrt = {"bias"}});
    FAIL() << "expected a ProgramError";
  } catch (const ProgramError& e) {
    EXPECT_NE(std::string(e.what()).find("attention_key_bias has no gradient for its key_bias"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace sluice::testing
