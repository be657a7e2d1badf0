// Op table: neural-network family (softmax, causal masking, layer and RMS norm, embedding,
// cross-entropy), plus the properties the table cannot state: exact zeros under the mask, stability
// for large logits, closed-form norms and losses and the out-of-range errors; and the PyTorch
// parity check of rms_norm and its gradients (tests/parity/rms_norm_reference.py, checked in as
// tests/ops/data/rms_norm_reference.json).
#include <cmath>
#include <limits>
#include <span>
#include <tuple>

#include <gmock/gmock.h>

#include "op_harness.h"
#include "sluice/autodiff/autodiff.h"
#include "sluice/exec/reference_runner.h"
#include "sluice/ir/ops.h"
#include "torch_reference.h"

namespace sluice::testing {
std::vector<OpCase> NnCases() {
  const Attrs mask_finite{{"value", -3.0}};  // finite, so the loss of the gradient check is too
  const Attrs mask_zero{{"value", 0.0}};
  const Attrs eps{{"eps", 1e-5}};
  const Attrs rms_eps{{"eps", 1e-6}};
  return {
      {.label = "softmax_row", .op = "softmax", .inputs = {F({4, 7})}},
      {.label = "softmax_3d", .op = "softmax", .inputs = {F({2, 3, 13})}},
      {.label = "softmax_single", .op = "softmax", .inputs = {F({5, 1})}},
      {.label = "softmax_vector", .op = "softmax", .inputs = {F({33})}},
      {.label = "softmax_wide_range",
       .op = "softmax",
       .inputs = {F({3, 33})},
       .fills = {Uniform(-8, 8)}},
      {.label = "softmax_big",
       .op = "softmax",
       .inputs = {F({17, 257})},
       .fills = {Uniform(-30, 30)},
       .grad = false},
      {.label = "softmax_grad",
       .op = "softmax_grad",
       .inputs = {F({3, 7}), F({3, 7})},
       .grad = false},
      {.label = "softmax_grad_odd",
       .op = "softmax_grad",
       .inputs = {F({2, 1, 33}), F({2, 1, 33})},
       .grad = false},
      {.label = "causal_mask", .op = "causal_mask", .inputs = {F({2, 5, 5})}, .attrs = mask_finite},
      {.label = "causal_mask_zero",
       .op = "causal_mask",
       .inputs = {F({2, 2, 4, 4})},
       .attrs = mask_zero},
      {.label = "causal_mask_one",
       .op = "causal_mask",
       .inputs = {F({1, 1})},
       .attrs = mask_finite},
      {.label = "causal_softmax", .op = "causal_softmax", .inputs = {F({2, 6, 6})}},
      {.label = "causal_softmax_4d", .op = "causal_softmax", .inputs = {F({2, 2, 7, 7})}},
      {.label = "causal_softmax_one", .op = "causal_softmax", .inputs = {F({1, 1})}},
      {.label = "causal_softmax_big",
       .op = "causal_softmax",
       .inputs = {F({3, 65, 65})},
       .fills = {Uniform(-20, 20)},
       .grad = false},
      {.label = "layer_norm",
       .op = "layer_norm",
       .inputs = {F({4, 7}), F({7}), F({7})},
       .attrs = eps},
      {.label = "layer_norm_3d",
       .op = "layer_norm",
       .inputs = {F({2, 3, 13}), F({13}), F({13})},
       .attrs = eps},
      {.label = "layer_norm_one_channel",
       .op = "layer_norm",
       .inputs = {F({3, 1}), F({1}), F({1})},
       .attrs = eps},
      {.label = "layer_norm_offset",
       .op = "layer_norm",
       .inputs = {F({5, 33}), F({33}), F({33})},
       .attrs = {{"eps", 1e-3}},
       .fills = {Uniform(2, 6)}},
      {.label = "layer_norm_big",
       .op = "layer_norm",
       .inputs = {F({9, 257}), F({257}), F({257})},
       .grad = false},
      {.label = "layer_norm_grad_x",
       .op = "layer_norm_grad_x",
       .inputs = {F({4, 7}), F({4, 7}), F({7})},
       .attrs = eps,
       .grad = false},
      {.label = "layer_norm_grad_x_big",
       .op = "layer_norm_grad_x",
       .inputs = {F({9, 257}), F({9, 257}), F({257})},
       .attrs = eps,
       .grad = false},
      {.label = "layer_norm_grad_params",
       .op = "layer_norm_grad_params",
       .inputs = {F({2, 3, 7}), F({2, 3, 7})},
       .attrs = eps,
       .grad = false},
      // Layer norm on bf16 x (kernels/bf16_activations.h): statistics in f32, y rounded to bf16
      // (2^-8 of y against the twin, one ulp between fast and reference); the gradients take bf16
      // x and compute the f32 kernels' values (f32 rounding against the twin).
      {.label = "layer_norm_bf16",
       .op = "layer_norm",
       .inputs = {F({4, 7}), F({7}), F({7})},
       .attrs = eps,
       .f32_tolerance = 8e-3,
       .bf16 = true,
       .bf16_inputs = {0},
       .bf16_tolerance = 4e-3,
       .bf16_grad_tolerance = 1e-5},
      {.label = "layer_norm_bf16_big",
       .op = "layer_norm",
       .inputs = {F({300, 257}), F({257}), F({257})},
       .fills = {Uniform(2, 6)},
       .grad = false,
       .f32_tolerance = 8e-3,
       .bf16 = true,
       .bf16_inputs = {0},
       .bf16_tolerance = 4e-3},
      {.label = "layer_norm_grad_x_bf16",
       .op = "layer_norm_grad_x",
       .inputs = {F({300, 257}), F({300, 257}), F({257})},
       .attrs = eps,
       .grad = false,
       .bf16 = true,
       .bf16_inputs = {1},
       .bf16_tolerance = 1e-5},
      {.label = "layer_norm_grad_params_bf16",
       .op = "layer_norm_grad_params",
       .inputs = {F({300, 257}), F({300, 257})},
       .attrs = eps,
       .grad = false,
       .bf16 = true,
       .bf16_inputs = {1},
       .bf16_tolerance = 1e-5},
      {.label = "rms_norm", .op = "rms_norm", .inputs = {F({4, 7}), F({7})}},
      {.label = "rms_norm_3d",
       .op = "rms_norm",
       .inputs = {F({2, 3, 13}), F({13})},
       .attrs = rms_eps},
      {.label = "rms_norm_one_channel",
       .op = "rms_norm",
       .inputs = {F({3, 1}), F({1})},
       .attrs = rms_eps},
      {.label = "rms_norm_offset",
       .op = "rms_norm",
       .inputs = {F({5, 33}), F({33})},
       .attrs = {{"eps", 1e-3}},
       .fills = {Uniform(2, 6)}},
      {.label = "rms_norm_small",  // mean(x²) ≈ 1e-4, near eps: eps's share of rstd is tested
       .op = "rms_norm",
       .inputs = {F({3, 9}), F({9})},
       .attrs = {{"eps", 1e-4}},
       .fills = {Uniform(-0.02, 0.02)}},
      {.label = "rms_norm_big", .op = "rms_norm", .inputs = {F({9, 257}), F({257})}, .grad = false},
      {.label = "rms_norm_grad_x",
       .op = "rms_norm_grad_x",
       .inputs = {F({4, 7}), F({4, 7}), F({7})},
       .attrs = rms_eps,
       .grad = false},
      {.label = "rms_norm_grad_x_big",
       .op = "rms_norm_grad_x",
       .inputs = {F({9, 257}), F({9, 257}), F({257})},
       .attrs = rms_eps,
       .grad = false},
      {.label = "rms_norm_grad_weight",
       .op = "rms_norm_grad_weight",
       .inputs = {F({2, 3, 7}), F({2, 3, 7})},
       .attrs = rms_eps,
       .grad = false},
      {.label = "rms_norm_grad_weight_big",
       .op = "rms_norm_grad_weight",
       .inputs = {F({9, 257}), F({9, 257})},
       .grad = false},
      // RMS norm on bf16 x (kernels/bf16_llama.h), as layer norm's: rstd in f32, y rounded to bf16
      // (2^-8 of y against the twin, one ulp between fast and reference); the gradients take bf16
      // x and compute the f32 kernels' values (f32 rounding against the twin). 300 rows of 257
      // channels span several row groups and chunks; 5000 channels take the one-row heap buffer.
      {.label = "rms_norm_bf16",
       .op = "rms_norm",
       .inputs = {F({4, 7}), F({7})},
       .attrs = rms_eps,
       .f32_tolerance = 8e-3,
       .bf16 = true,
       .bf16_inputs = {0},
       .bf16_tolerance = 4e-3,
       .bf16_grad_tolerance = 1e-5},
      {.label = "rms_norm_bf16_big",
       .op = "rms_norm",
       .inputs = {F({300, 257}), F({257})},
       .fills = {Uniform(2, 6)},
       .grad = false,
       .f32_tolerance = 8e-3,
       .bf16 = true,
       .bf16_inputs = {0},
       .bf16_tolerance = 4e-3},
      {.label = "rms_norm_bf16_wide",
       .op = "rms_norm",
       .inputs = {F({3, 5000}), F({5000})},
       .grad = false,
       .f32_tolerance = 8e-3,
       .bf16 = true,
       .bf16_inputs = {0},
       .bf16_tolerance = 4e-3},
      {.label = "rms_norm_grad_x_bf16",
       .op = "rms_norm_grad_x",
       .inputs = {F({300, 257}), F({300, 257}), F({257})},
       .attrs = rms_eps,
       .grad = false,
       .bf16 = true,
       .bf16_inputs = {1},
       .bf16_tolerance = 1e-5},
      {.label = "rms_norm_grad_weight_bf16",
       .op = "rms_norm_grad_weight",
       .inputs = {F({300, 257}), F({300, 257})},
       .attrs = rms_eps,
       .grad = false,
       .bf16 = true,
       .bf16_inputs = {1},
       .bf16_tolerance = 1e-5},
      {.label = "embedding",
       .op = "embedding",
       .inputs = {I64({2, 3}), F({5, 4})},
       .fills = {Indices(5)}},
      {.label = "embedding_i32",
       .op = "embedding",
       .inputs = {I32({7}), F({3, 2})},
       .fills = {Indices(3)}},
      {.label = "embedding_repeats",
       .op = "embedding",
       .inputs = {I64({4, 5}), F({2, 13})},
       .fills = {Indices(2)}},
      {.label = "embedding_grad",
       .op = "embedding_grad",
       .inputs = {I64({2, 3}), F({2, 3, 5})},
       .attrs = {{"num_embeddings", int64_t{4}}},
       .fills = {Indices(4)},
       .grad = false},
      {.label = "embedding_grad_padding",
       .op = "embedding_grad",
       .inputs = {I64({3, 4}), F({3, 4, 5})},
       .attrs = {{"num_embeddings", int64_t{4}}, {"padding_idx", int64_t{2}}},
       .fills = {Indices(4)},
       .grad = false},
      {.label = "embedding_grad_i32",
       .op = "embedding_grad",
       .inputs = {I32({13}), F({13, 3})},
       .attrs = {{"num_embeddings", int64_t{7}}},
       .fills = {Indices(7)},
       .grad = false},
      {.label = "cross_entropy",
       .op = "cross_entropy",
       .inputs = {F({4, 7}), I64({4})},
       .fills = {Uniform(-3, 3), Indices(7)}},
      {.label = "cross_entropy_3d_i32",
       .op = "cross_entropy",
       .inputs = {F({2, 3, 5}), I32({2, 3})},
       .fills = {Uniform(-3, 3), Indices(5)}},
      {.label = "cross_entropy_wide",
       .op = "cross_entropy",
       .inputs = {F({3, 33}), I64({3})},
       .fills = {Uniform(-10, 10), Indices(33)}},
      {.label = "cross_entropy_ignored_targets",
       .op = "cross_entropy",
       .inputs = {F({3, 4, 6}), I64({3, 4})},
       .fills = {Uniform(-3, 3), IndicesOrIgnored(6)}},
      // PyTorch's label_smoothing and reduction="sum" (values against PyTorch: CrossEntropyParity).
      {.label = "cross_entropy_smoothed",
       .op = "cross_entropy",
       .inputs = {F({4, 7}), I64({4})},
       .attrs = {{"label_smoothing", 0.1}},
       .fills = {Uniform(-3, 3), Indices(7)}},
      {.label = "cross_entropy_sum_smoothed_ignored",
       .op = "cross_entropy",
       .inputs = {F({3, 4, 6}), I64({3, 4})},
       .attrs = {{"label_smoothing", 0.25}, {"reduction", std::string("sum")}},
       .fills = {Uniform(-3, 3), IndicesOrIgnored(6)}},
      {.label = "cross_entropy_big",
       .op = "cross_entropy",
       .inputs = {F({16, 257}), I64({16})},
       .fills = {Uniform(-10, 10), Indices(257)},
       .grad = false},
      {.label = "cross_entropy_grad",
       .op = "cross_entropy_grad",
       .inputs = {F({4, 7}), I64({4}), F({})},
       .fills = {Uniform(-3, 3), Indices(7)},
       .grad = false},
      {.label = "cross_entropy_grad_sum_smoothed",
       .op = "cross_entropy_grad",
       .inputs = {F({5, 33}), I64({5}), F({})},
       .attrs = {{"label_smoothing", 0.2}, {"reduction", std::string("sum")}},
       .fills = {Uniform(-3, 3), IndicesOrIgnored(33)},
       .grad = false},
      // dlogits rounded to bf16 as stored (dtype = "bf16", f32 logits): half a bf16 ulp against
      // the f32 twin; fast and reference kernels' f32 values differ in the last bits, so they may
      // round to neighbours (one ulp). 300 rows of 257 span several chunks, some ignored.
      {.label = "cross_entropy_grad_bf16_rounded",
       .op = "cross_entropy_grad",
       .inputs = {F({300, 257}), I64({300}), F({})},
       .attrs = {{"label_smoothing", 0.1}, {"dtype", std::string("bf16")}},
       .fills = {Uniform(-3, 3), IndicesOrIgnored(257)},
       .grad = false,
       .f32_tolerance = 8e-3,
       .bf16 = true,
       .bf16_tolerance = 4e-3},
      {.label = "cross_entropy_grad_3d",
       .op = "cross_entropy_grad",
       .inputs = {F({2, 3, 33}), I32({2, 3}), F({})},
       .fills = {Uniform(-3, 3), Indices(33)},
       .grad = false},
      // The fused head: chunks of 2 tokens of 5, one chunk, automatic, ignored targets.
      {.label = "linear_cross_entropy",
       .op = "linear_cross_entropy",
       .inputs = {F({5, 4}), F({7, 4}), I64({5})},
       .attrs = {{"chunk", int64_t{2}}},
       .fills = {Uniform(-2, 2), Uniform(-1, 1), Indices(7)}},
      {.label = "linear_cross_entropy_3d_one_chunk",
       .op = "linear_cross_entropy",
       .inputs = {F({2, 3, 4}), F({9, 4}), I32({2, 3})},
       .attrs = {{"chunk", int64_t{64}}},
       .fills = {Uniform(-2, 2), Uniform(-1, 1), Indices(9)}},
      {.label = "linear_cross_entropy_auto_ignored",
       .op = "linear_cross_entropy",
       .inputs = {F({3, 4, 3}), F({11, 3}), I64({3, 4})},
       .fills = {Uniform(-2, 2), Uniform(-1, 1), IndicesOrIgnored(11)}},
      {.label = "linear_cross_entropy_big",
       .op = "linear_cross_entropy",
       .inputs = {F({37, 16}), F({257, 16}), I64({37})},
       .attrs = {{"chunk", int64_t{8}}},
       .fills = {Uniform(-2, 2), Uniform(-1, 1), Indices(257)},
       .grad = false},
      {.label = "linear_cross_entropy_grad",
       .op = "linear_cross_entropy_grad",
       .inputs = {F({5, 4}), F({7, 4}), I64({5}), F({})},
       .attrs = {{"chunk", int64_t{2}}},
       .fills = {Uniform(-2, 2), Uniform(-1, 1), Indices(7)},
       .grad = false},
      {.label = "linear_cross_entropy_grad_big",
       .op = "linear_cross_entropy_grad",
       .inputs = {F({37, 16}), F({257, 16}), I32({37}), F({})},
       .attrs = {{"chunk", int64_t{8}}},
       .fills = {Uniform(-2, 2), Uniform(-1, 1), Indices(257)},
       .grad = false},
  };
}

namespace {

std::vector<OpErrorCase> NnErrors() {
  return {
      {.label = "softmax_scalar", .op = "softmax", .inputs = {F({})}},
      {.label = "cross_entropy_smoothing_past_1",
       .op = "cross_entropy",
       .inputs = {F({4, 7}), I64({4})},
       .attrs = {{"label_smoothing", 1.5}}},
      {.label = "cross_entropy_reduction_none",
       .op = "cross_entropy",
       .inputs = {F({4, 7}), I64({4})},
       .attrs = {{"reduction", std::string("none")}}},
      {.label = "softmax_int", .op = "softmax", .inputs = {I64({3})}},
      {.label = "softmax_grad_shapes", .op = "softmax_grad", .inputs = {F({3, 4}), F({3, 5})}},
      {.label = "causal_mask_not_square", .op = "causal_mask", .inputs = {F({2, 3, 4})}},
      {.label = "causal_mask_rank1", .op = "causal_mask", .inputs = {F({4})}},
      {.label = "causal_softmax_not_square", .op = "causal_softmax", .inputs = {F({4, 5})}},
      {.label = "layer_norm_weight", .op = "layer_norm", .inputs = {F({4, 7}), F({6}), F({7})}},
      {.label = "layer_norm_bias_rank",
       .op = "layer_norm",
       .inputs = {F({4, 7}), F({7}), F({7, 1})}},
      {.label = "layer_norm_bf16_weight",
       .op = "layer_norm",
       .inputs = {{DType::kBF16, Shape{4, 7}}, {DType::kBF16, Shape{7}}, F({7})}},
      {.label = "layer_norm_grad_x_bf16_dy",
       .op = "layer_norm_grad_x",
       .inputs = {{DType::kBF16, Shape{4, 7}}, {DType::kBF16, Shape{4, 7}}, F({7})}},
      {.label = "layer_norm_dtype",
       .op = "layer_norm",
       .inputs = {F({4, 7}), {DType::kF64, Shape{7}}, F({7})}},
      {.label = "layer_norm_eps",
       .op = "layer_norm",
       .inputs = {F({4, 7}), F({7}), F({7})},
       .attrs = {{"eps", 0.0}}},
      {.label = "layer_norm_grad_x_shapes",
       .op = "layer_norm_grad_x",
       .inputs = {F({4, 7}), F({4, 6}), F({6})}},
      {.label = "layer_norm_grad_params_shapes",
       .op = "layer_norm_grad_params",
       .inputs = {F({4, 7}), F({3, 7})}},
      {.label = "rms_norm_weight", .op = "rms_norm", .inputs = {F({4, 7}), F({6})}},
      {.label = "rms_norm_weight_rank", .op = "rms_norm", .inputs = {F({4, 7}), F({7, 1})}},
      {.label = "rms_norm_scalar", .op = "rms_norm", .inputs = {F({}), F({1})}},
      {.label = "rms_norm_dtype", .op = "rms_norm", .inputs = {F({4, 7}), {DType::kF64, Shape{7}}}},
      {.label = "rms_norm_int", .op = "rms_norm", .inputs = {I64({4, 7}), I64({7})}},
      {.label = "rms_norm_eps",
       .op = "rms_norm",
       .inputs = {F({4, 7}), F({7})},
       .attrs = {{"eps", -1e-6}}},
      {.label = "rms_norm_arity", .op = "rms_norm", .inputs = {F({4, 7}), F({7}), F({7})}},
      {.label = "rms_norm_grad_x_shapes",
       .op = "rms_norm_grad_x",
       .inputs = {F({4, 7}), F({4, 6}), F({6})}},
      {.label = "rms_norm_grad_x_weight",
       .op = "rms_norm_grad_x",
       .inputs = {F({4, 7}), F({4, 7}), F({6})}},
      {.label = "rms_norm_bf16_weight",  // a bf16 x takes an f32 weight
       .op = "rms_norm",
       .inputs = {{DType::kBF16, Shape{4, 7}}, {DType::kBF16, Shape{7}}}},
      {.label = "rms_norm_grad_x_bf16_dy",  // a bf16 x's gradient is f32
       .op = "rms_norm_grad_x",
       .inputs = {{DType::kBF16, Shape{4, 7}}, {DType::kBF16, Shape{4, 7}}, F({7})}},
      {.label = "rms_norm_grad_weight_bf16_dy",
       .op = "rms_norm_grad_weight",
       .inputs = {{DType::kBF16, Shape{4, 7}}, {DType::kBF16, Shape{4, 7}}}},
      {.label = "rms_norm_grad_weight_shapes",
       .op = "rms_norm_grad_weight",
       .inputs = {F({4, 7}), F({3, 7})}},
      {.label = "embedding_float_ids", .op = "embedding", .inputs = {F({2, 3}), F({5, 4})}},
      {.label = "embedding_table_rank", .op = "embedding", .inputs = {I64({2}), F({5})}},
      {.label = "embedding_padding_idx_past_the_table",
       .op = "embedding",
       .inputs = {I64({2}), F({5, 4})},
       .attrs = {{"padding_idx", int64_t{5}}}},
      {.label = "embedding_grad_dy",
       .op = "embedding_grad",
       .inputs = {I64({2, 3}), F({2, 4, 5})},
       .attrs = {{"num_embeddings", int64_t{4}}}},
      {.label = "cross_entropy_targets_shape",
       .op = "cross_entropy",
       .inputs = {F({4, 7}), I64({3})}},
      {.label = "cross_entropy_float_targets",
       .op = "cross_entropy",
       .inputs = {F({4, 7}), F({4})}},
      {.label = "cross_entropy_rank1", .op = "cross_entropy", .inputs = {F({7}), I64({})}},
      {.label = "cross_entropy_no_tokens", .op = "cross_entropy", .inputs = {F({0, 7}), I64({0})}},
      {.label = "linear_cross_entropy_w",
       .op = "linear_cross_entropy",
       .inputs = {F({5, 4}), F({4, 7}), I64({5})}},
      {.label = "linear_cross_entropy_targets",
       .op = "linear_cross_entropy",
       .inputs = {F({5, 4}), F({7, 4}), I64({4})}},
      {.label = "linear_cross_entropy_chunk",
       .op = "linear_cross_entropy",
       .inputs = {F({5, 4}), F({7, 4}), I64({5})},
       .attrs = {{"chunk", int64_t{-2}}}},
      {.label = "linear_cross_entropy_grad_dloss",
       .op = "linear_cross_entropy_grad",
       .inputs = {F({5, 4}), F({7, 4}), I64({5}), F({2})}},
      {.label = "cross_entropy_grad_dloss",
       .op = "cross_entropy_grad",
       .inputs = {F({4, 7}), I64({4}), F({1})}},
      {.label = "cross_entropy_grad_bf16_of_f64",
       .op = "cross_entropy_grad",
       .inputs = {{DType::kF64, Shape{4, 7}}, I64({4}), {DType::kF64, Shape{}}},
       .attrs = {{"dtype", std::string("bf16")}}},
  };
}

INSTANTIATE_TEST_SUITE_P(Nn, OpHarness, ::testing::ValuesIn(NnCases()), CaseName());
INSTANTIATE_TEST_SUITE_P(Nn, OpErrors, ::testing::ValuesIn(NnErrors()), CaseName());

// Runs a one-output program built by `build` on `inputs` with the fast or the reference kernels.
template <typename Build>
Tensor RunOne(Build build, Scope inputs, bool reference) {
  Builder b("t");
  b.Output(b.Name(build(b), "y"));
  Program p = b.Build();
  RunReference(p, inputs, DefaultAllocator(), reference);
  return inputs.Get("y");
}

Scope With(std::initializer_list<std::pair<std::string, Tensor>> values) {
  Scope s;
  for (const auto& [name, t] : values) s.Set(name, t);
  return s;
}

TEST(CausalMask, DefaultMaskThenSoftmaxGivesExactZerosAndMatchesCausalSoftmax) {
  const int64_t t = 9;
  std::vector<float> v(2 * t * t);
  for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(0.37f * static_cast<float>(i)) * 5;
  Tensor scores = Tensor::FromVector<float>({2, t, t}, v);
  for (bool reference : {false, true}) {
    Tensor masked = RunOne(
        [&](Builder& b) {
          return CausalMask(b.Input("s", DType::kF32, {2, t, t}));
        },
        With({{"s", scores}}), reference);
    Tensor split = RunOne(
        [&](Builder& b) {
          return Softmax(CausalMask(b.Input("s", DType::kF32, {2, t, t})));
        },
        With({{"s", scores}}), reference);
    Tensor fused = RunOne(
        [&](Builder& b) {
          return CausalSoftmax(b.Input("s", DType::kF32, {2, t, t}));
        },
        With({{"s", scores}}), reference);
    for (int64_t m = 0; m < 2; ++m) {
      for (int64_t i = 0; i < t; ++i) {
        float row_sum = 0;
        for (int64_t j = 0; j < t; ++j) {
          if (j > i) {
            EXPECT_EQ(masked.At({m, i, j}), -std::numeric_limits<double>::infinity());
            EXPECT_EQ(split.At({m, i, j}), 0.0)
                << "reference=" << reference << " at " << i << "," << j;
            EXPECT_EQ(fused.At({m, i, j}), 0.0)
                << "reference=" << reference << " at " << i << "," << j;
          } else {
            EXPECT_EQ(masked.At({m, i, j}), scores.At({m, i, j}));
            EXPECT_GT(fused.At({m, i, j}), 0.0);
          }
          row_sum += static_cast<float>(fused.At({m, i, j}));
        }
        EXPECT_NEAR(row_sum, 1.0f, 1e-6f);
      }
    }
    EXPECT_LE(MaxRelativeDifference(split, fused, 1e-6), 1e-6);
  }
}

TEST(Softmax, LargeLogitsDoNotOverflow) {
  Tensor x = Tensor::FromVector<float>({1, 3}, {1000.0f, 1000.0f, 0.0f});
  for (bool reference : {false, true}) {
    Tensor y = RunOne(
        [](Builder& b) {
          return Softmax(b.Input("x", DType::kF32, {1, 3}));
        },
        With({{"x", x}}), reference);
    EXPECT_FLOAT_EQ(static_cast<float>(y.At({0, 0})), 0.5f);
    EXPECT_FLOAT_EQ(static_cast<float>(y.At({0, 1})), 0.5f);
    EXPECT_EQ(y.At({0, 2}), 0.0);
  }
}

TEST(LayerNorm, NormalizesEachRowWithBiasedVariance) {
  // Rows of 4 with weight 1 and bias 0: mean 0 and variance var / (var + eps) after the op.
  Tensor x = Tensor::FromVector<double>({2, 4}, {1, 2, 3, 4, -5, 0, 5, 10});
  Tensor w = Tensor::Full({4}, 1.0, DType::kF64), bias = Tensor::Zeros({4}, DType::kF64);
  for (bool reference : {false, true}) {
    Tensor y = RunOne(
        [](Builder& b) {
          return LayerNorm(b.Input("x", DType::kF64, {2, 4}), b.Input("w", DType::kF64, {4}),
                           b.Input("b", DType::kF64, {4}), 1e-5);
        },
        With({{"x", x}, {"w", w}, {"b", bias}}), reference);
    // Row 0: mean 2.5, biased variance 1.25, so y[0, 0] = −1.5 / sqrt(1.25 + 1e-5).
    EXPECT_NEAR(y.At({0, 0}), -1.5 / std::sqrt(1.25 + 1e-5), 1e-12);
    for (int64_t r = 0; r < 2; ++r) {
      double mean = 0, sq = 0;
      for (int64_t j = 0; j < 4; ++j) mean += y.At({r, j}) / 4;
      for (int64_t j = 0; j < 4; ++j) sq += (y.At({r, j}) - mean) * (y.At({r, j}) - mean) / 4;
      const double var = r == 0 ? 1.25 : 31.25;
      EXPECT_NEAR(mean, 0.0, 1e-12);
      EXPECT_NEAR(sq, var / (var + 1e-5), 1e-12);
    }
  }
}

TEST(RmsNorm, ScalesEachRowToUnitRootMeanSquareWithoutCentring) {
  // Row 0 has mean square (9 + 16) / 2 = 12.5; row 1 is constant, which layer norm would map to
  // 0 and RMS norm maps to ±1 (no mean is removed). Weight [2, −0.5] scales the channels.
  Tensor x = Tensor::FromVector<double>({2, 2}, {3, 4, -7, -7});
  Tensor w = Tensor::FromVector<double>({2}, {2, -0.5});
  const double eps = 1e-6;
  for (bool reference : {false, true}) {
    Tensor y = RunOne(
        [&](Builder& b) {
          return RmsNorm(b.Input("x", DType::kF64, {2, 2}), b.Input("w", DType::kF64, {2}), eps);
        },
        With({{"x", x}, {"w", w}}), reference);
    const double r0 = 1 / std::sqrt(12.5 + eps), r1 = 1 / std::sqrt(49 + eps);
    EXPECT_NEAR(y.At({0, 0}), 3 * r0 * 2, 1e-14);
    EXPECT_NEAR(y.At({0, 1}), 4 * r0 * -0.5, 1e-14);
    EXPECT_NEAR(y.At({1, 0}), -7 * r1 * 2, 1e-14);
    EXPECT_NEAR(y.At({1, 1}), -7 * r1 * -0.5, 1e-14);
  }
}

TEST(RmsNorm, AllZeroRowStaysZeroAndFinite) {
  // eps > 0 keeps rstd finite (1 / sqrt(eps)): a zero row gives y = 0 and dx = rstd · dy · weight.
  const double eps = 1e-6;
  Tensor x = Tensor::Zeros({1, 3}, DType::kF32);
  Tensor w = Tensor::FromVector<float>({3}, {1, 2, 3});
  Tensor dy = Tensor::FromVector<float>({1, 3}, {1, 1, -1});
  for (bool reference : {false, true}) {
    Tensor y = RunOne(
        [&](Builder& b) {
          return RmsNorm(b.Input("x", DType::kF32, {1, 3}), b.Input("w", DType::kF32, {3}), eps);
        },
        With({{"x", x}, {"w", w}}), reference);
    Tensor dx = RunOne(
        [&](Builder& b) {
          return RmsNormGradX(b.Input("dy", DType::kF32, {1, 3}), b.Input("x", DType::kF32, {1, 3}),
                              b.Input("w", DType::kF32, {3}), eps);
        },
        With({{"dy", dy}, {"x", x}, {"w", w}}), reference);
    for (int64_t j = 0; j < 3; ++j) {
      EXPECT_EQ(y.At({0, j}), 0.0);
      EXPECT_NEAR(dx.At({0, j}), dy.At({0, j}) * w.At({j}) / std::sqrt(eps), 1e-2);
    }
  }
}

// PyTorch parity: y, dx and dweight of x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) *
// weight, recorded by tests/parity/rms_norm_reference.py (tests/ops/data/rms_norm_reference.json),
// against rms_norm and the gradients autodiff builds from its VJP, with both kernel sets.
TEST(RmsNormParity, OutputAndGradientsMatchPyTorch) {
  const nlohmann::json ref =
      LoadTorchReference("rms_norm_reference.json", "tests/parity/rms_norm_reference.py");
  ASSERT_FALSE(ref.at("cases").empty());
  for (const nlohmann::json& c : ref.at("cases")) {
    const std::vector<int64_t> dims = c.at("shape").get<std::vector<int64_t>>();
    const Shape shape{std::span<const int64_t>(dims)};
    const Shape channels{dims.back()};
    for (const auto& [label, dtype, tolerance] :
         {std::tuple{"f64", DType::kF64, 1e-12}, std::tuple{"f32", DType::kF32, 2e-6}}) {
      Builder b(c.at("name").get<std::string>());
      b.Output(b.Name(RmsNorm(b.Input("x", dtype, shape), b.Input("w", dtype, channels),
                              c.at("eps").get<double>()),
                      "y"));
      const Program forward = b.Build();
      const Backward backward = BuildBackward(forward, {.seeds = {"y"}, .wrt = {"x", "w"}});
      const nlohmann::json& want = c.at(label);
      for (bool reference_kernels : {false, true}) {
        SCOPED_TRACE(fmt::format("{} {} {} kernels", c.at("name").get<std::string>(), label,
                                 reference_kernels ? "reference" : "fast"));
        Scope scope;
        scope.Set("x", TensorFromJson(want.at("x"), shape, dtype));
        scope.Set("w", TensorFromJson(want.at("weight"), channels, dtype));
        RunReference(forward, scope, DefaultAllocator(), reference_kernels, backward.saved);
        scope.Set("y.grad", TensorFromJson(want.at("dy"), shape, dtype));
        RunReference(backward.program, scope, DefaultAllocator(), reference_kernels);
        EXPECT_LE(RelativeErrorToTorch(scope.Get("y"), want.at("y")), tolerance) << "y";
        EXPECT_LE(RelativeErrorToTorch(scope.Get("x.grad"), want.at("dx")), tolerance) << "dx";
        EXPECT_LE(RelativeErrorToTorch(scope.Get("w.grad"), want.at("dweight")), tolerance)
            << "dweight";
      }
    }
  }
}

// F.cross_entropy(logits, targets, ignore_index=-1, label_smoothing=0.1), mean and sum, and the
// sum's gradient, in float64 (PyTorch 1.13); the third row's target is ignored.
TEST(CrossEntropy, LabelSmoothingAndSumMatchPyTorch) {
  const Tensor logits =
      Tensor::FromVector<double>({3, 3}, {0.5, -1.25, 2.0, 1.5, 0.25, -0.75, 0.0, 3.0, -2.0});
  const Tensor targets = Tensor::FromVector<int64_t>({3}, {2, 0, -1});
  const std::vector<double> dsum = {0.14348684877411097,
                                    -0.0026065930068969005,
                                    -0.14088025576721408,
                                    -0.21489299218226843,
                                    0.17250327066431823,
                                    0.04238972151795018,
                                    0.0,
                                    0.0,
                                    0.0};
  for (bool reference : {false, true}) {
    for (const std::string reduction : {"mean", "sum"}) {
      const Attrs attrs = {{"label_smoothing", 0.1}, {"reduction", reduction}};
      Tensor loss = RunOne(
          [&](Builder& b) {
            return b.Emit1("cross_entropy",
                           {b.Input("l", DType::kF64, {3, 3}), b.Input("t", DType::kI64, {3})},
                           attrs);
          },
          With({{"l", logits}, {"t", targets}}), reference);
      EXPECT_NEAR(loss.FlatAt(0), reduction == "sum" ? 0.8382945925092566 : 0.4191472962546283,
                  1e-12)
          << reduction;
    }
    Tensor grad = RunOne(
        [&](Builder& b) {
          return b.Emit1("cross_entropy_grad",
                         {b.Input("l", DType::kF64, {3, 3}), b.Input("t", DType::kI64, {3}),
                          b.Input("d", DType::kF64, {})},
                         {{"label_smoothing", 0.1}, {"reduction", std::string("sum")}});
        },
        With({{"l", logits}, {"t", targets}, {"d", Tensor::Full({}, 1.0, DType::kF64)}}),
        reference);
    for (int64_t i = 0; i < 9; ++i) EXPECT_NEAR(grad.FlatAt(i), dsum[i], 1e-12) << i;
  }
}

TEST(CrossEntropy, UniformLogitsGiveLogVocab) {
  const int64_t vocab = 11;
  Tensor logits = Tensor::Full({3, vocab}, 0.25, DType::kF32);
  Tensor targets = Tensor::FromVector<int64_t>({3}, {0, 5, 10});
  for (bool reference : {false, true}) {
    Tensor loss = RunOne(
        [&](Builder& b) {
          return CrossEntropy(b.Input("l", DType::kF32, {3, vocab}),
                              b.Input("t", DType::kI64, {3}));
        },
        With({{"l", logits}, {"t", targets}}), reference);
    EXPECT_EQ(loss.shape(), Shape{});
    EXPECT_NEAR(loss.FlatAt(0), std::log(static_cast<double>(vocab)), 1e-6);
  }
}

TEST(CrossEntropy, ConfidentCorrectTokensCostAlmostNothing) {
  // Row 0 puts 50 more on its target, row 1 puts 50 less: losses ≈ 0 and ≈ 50 + log 2.
  Tensor logits = Tensor::FromVector<double>({2, 3}, {50, 0, 0, -50, 0, 0});
  Tensor targets = Tensor::FromVector<int32_t>({2}, {0, 0});
  Tensor loss = RunOne(
      [](Builder& b) {
        return CrossEntropy(b.Input("l", DType::kF64, {2, 3}), b.Input("t", DType::kI32, {2}));
      },
      With({{"l", logits}, {"t", targets}}), false);
  EXPECT_NEAR(loss.FlatAt(0), (2 * std::exp(-50.0) + 50 + std::log(2.0) + std::exp(-50.0)) / 2,
              1e-12);
}

template <typename Build>
void ExpectOutOfRange(Build build, Scope inputs, const std::vector<std::string>& fragments) {
  for (bool reference : {false, true}) {
    try {
      RunOne(build, inputs, reference);
      ADD_FAILURE() << "expected InvalidArgument";
    } catch (const InvalidArgument& e) {
      for (const std::string& f : fragments) EXPECT_THAT(e.what(), ::testing::HasSubstr(f));
    }
  }
}

TEST(Embedding, OutOfRangeIdNamesTheIdAndVocab) {
  Tensor table = Tensor::Zeros({5, 2}, DType::kF32);
  ExpectOutOfRange(
      [](Builder& b) {
        return Embedding(b.Input("ids", DType::kI64, {3}), b.Input("w", DType::kF32, {5, 2}));
      },
      With({{"ids", Tensor::FromVector<int64_t>({3}, {1, 7, 0})}, {"w", table}}),
      {"embedding id 7 at position 1", "vocab = 5"});
  ExpectOutOfRange(
      [](Builder& b) {
        return Embedding(b.Input("ids", DType::kI32, {2}), b.Input("w", DType::kF32, {5, 2}));
      },
      With({{"ids", Tensor::FromVector<int32_t>({2}, {-1, 0})}, {"w", table}}),
      {"id -1 at position 0", "vocab = 5"});
  ExpectOutOfRange(
      [](Builder& b) {
        return EmbeddingGrad(b.Input("ids", DType::kI64, {2}), b.Input("dy", DType::kF32, {2, 2}),
                             5);
      },
      With({{"ids", Tensor::FromVector<int64_t>({2}, {0, 5})},
            {"dy", Tensor::Zeros({2, 2}, DType::kF32)}}),
      {"embedding_grad id 5 at position 1", "vocab = 5"});
}

// nn.Embedding's padding_idx: the row keeps no gradient (PyTorch never trains it), every other row
// gets what it gets without padding_idx; forward reads the row as any other.
TEST(Embedding, PaddingRowGetsNoGradient) {
  Builder b("padded");
  Var y =
      b.Emit1("embedding", {b.Input("ids", DType::kI64, {4}), b.Input("w", DType::kF32, {3, 2})},
              {{"padding_idx", int64_t{0}}});
  b.Output(b.Name(Sum(y), "loss"));
  const Program p = b.Build();
  const Backward bwd = BuildBackward(p, {.seeds = {"loss"}, .wrt = {"w"}});
  Scope s = With({{"ids", Tensor::FromVector<int64_t>({4}, {0, 1, 0, 2})},
                  {"w", Tensor::FromVector<float>({3, 2}, {1, 2, 3, 4, 5, 6})}});
  RunReference(p, s, DefaultAllocator(), false, bwd.saved);
  EXPECT_EQ(s.Get("loss").FlatAt(0), 1 + 2 + 3 + 4 + 1 + 2 + 5 + 6);  // row 0 read twice
  s.Set("loss.grad", Tensor::FromVector<float>({}, {1}));
  RunReference(bwd.program, s);
  const Tensor& dw = s.Get("w.grad");
  EXPECT_EQ(dw.FlatAt(0), 0);  // row 0, read twice: no gradient
  EXPECT_EQ(dw.FlatAt(1), 0);
  EXPECT_EQ(dw.FlatAt(2), 1);
  EXPECT_EQ(dw.FlatAt(5), 1);
}

TEST(CrossEntropy, OutOfRangeTargetNamesTheTargetAndVocab) {
  Tensor logits = Tensor::Zeros({2, 4}, DType::kF32);
  ExpectOutOfRange(
      [](Builder& b) {
        return CrossEntropy(b.Input("l", DType::kF32, {2, 4}), b.Input("t", DType::kI64, {2}));
      },
      With({{"l", logits}, {"t", Tensor::FromVector<int64_t>({2}, {3, 4})}}),
      {"cross_entropy target 4 at position 1", "vocab = 4"});
  ExpectOutOfRange(
      [](Builder& b) {
        return CrossEntropyGrad(b.Input("l", DType::kF32, {2, 4}), b.Input("t", DType::kI64, {2}),
                                b.Input("d", DType::kF32, {}));
      },
      With({{"l", logits},
            {"t", Tensor::FromVector<int64_t>({2}, {-2, 0})},
            {"d", Tensor::Full({}, 1, DType::kF32)}}),
      {"cross_entropy_grad target -2 at position 0", "vocab = 4"});
}

}  // namespace
}  // namespace sluice::testing

namespace sluice::testing {
namespace {

// Targets of -1 are ignored (PyTorch's ignore_index=-1): the mean runs over counted tokens.
TEST(CrossEntropy, IgnoredTargetsDoNotCount) {
  Tensor logits = Tensor::FromVector<double>({3, 2}, {0.0, 1.0, 5.0, -5.0, 2.0, 2.0});
  Tensor all = Tensor::FromVector<int64_t>({3}, {1, -1, 0});
  Tensor none = Tensor::FromVector<int64_t>({3}, {-1, -1, -1});
  Tensor dloss = Tensor::Full({}, 1.0, DType::kF64);
  for (KernelFn k : {OpRegistry::Global().Get("cross_entropy").kernel,
                     OpRegistry::Global().Get("cross_entropy").reference}) {
    Tensor out = Tensor::Empty({}, DType::kF64);
    std::vector<Tensor> in = {logits, all}, outs = {out};
    KernelContext ctx{in, outs, Attrs(), DefaultAllocator()};
    k(ctx);
    // rows 0 and 2 count: (log(1 + e^-1)) and log 2
    EXPECT_NEAR(out.FlatAt(0), (std::log1p(std::exp(-1.0)) + std::log(2.0)) / 2, 1e-12);
    in = {logits, none};
    KernelContext ctx_none{in, outs, Attrs(), DefaultAllocator()};
    k(ctx_none);
    EXPECT_EQ(out.FlatAt(0), 0.0);
  }
  Tensor grad = Tensor::Empty({3, 2}, DType::kF64);
  std::vector<Tensor> in = {logits, all, dloss}, outs = {grad};
  KernelContext ctx{in, outs, Attrs(), DefaultAllocator()};
  OpRegistry::Global().Get("cross_entropy_grad").kernel(ctx);
  EXPECT_EQ(grad.At({1, 0}), 0.0);
  EXPECT_EQ(grad.At({1, 1}), 0.0);
  EXPECT_NEAR(grad.At({0, 1}), (1.0 / (1.0 + std::exp(-1.0)) - 1.0) / 2, 1e-12);
}

}  // namespace
}  // namespace sluice::testing
