// Op table: elementwise family (binary with broadcasting, unary, fused activation gradients, fill,
// cast, copy), plus GELU (both forms) and SiLU against PyTorch's numbers.
#include <cmath>
#include <limits>

#include "op_harness.h"
#include "sluice/exec/reference_runner.h"
#include "sluice/ir/ops.h"

namespace sluice::testing {
// Tables keep one case per line.
// clang-format off
std::vector<OpCase> ElementwiseCases() {
  const Fill positive = Positive();
  const Fill wide = Uniform(-4, 4);  // reaches GELU's tails and exp's larger values
  const std::vector<Fill> nonzero_b = {Fill{}, positive};
  const Attrs f32{{"dtype", std::string("f32")}}, f64{{"dtype", std::string("f64")}},
      bf16{{"dtype", std::string("bf16")}};
  return {
      // Binary ops: equal shapes, rows, columns, scalars, both operands stretched, odd sizes.
      {.label = "add_same", .op = "add", .inputs = {F({4, 3}), F({4, 3})}},
      {.label = "add_row", .op = "add", .inputs = {F({4, 3}), F({3})}},
      {.label = "add_col", .op = "add", .inputs = {F({4, 1}), F({4, 3})}},
      {.label = "add_scalar", .op = "add", .inputs = {F({}), F({2, 5})}},
      {.label = "add_both_stretch", .op = "add", .inputs = {F({3, 1, 5}), F({1, 4, 1})}},
      {.label = "add_odd", .op = "add", .inputs = {F({7, 1, 13}), F({13})}, .grad = false},
      {.label = "add_long", .op = "add", .inputs = {F({3, 333}), F({3, 333})}, .grad = false},
      {.label = "add_empty", .op = "add", .inputs = {F({0, 3}), F({3})}},
      {.label = "sub_same", .op = "sub", .inputs = {F({7, 13}), F({7, 13})}},
      {.label = "sub_row", .op = "sub", .inputs = {F({2, 7, 13}), F({13})}},
      {.label = "sub_col", .op = "sub", .inputs = {F({7, 13}), F({7, 1})}},
      {.label = "sub_scalar_left", .op = "sub", .inputs = {F({}), F({33})}},
      {.label = "sub_both_stretch", .op = "sub", .inputs = {F({1, 7}), F({13, 1})}},
      {.label = "mul_same", .op = "mul", .inputs = {F({33}), F({33})}},
      {.label = "mul_row", .op = "mul", .inputs = {F({7, 13}), F({1, 13})}},
      {.label = "mul_col", .op = "mul", .inputs = {F({7, 1}), F({7, 13})}},
      {.label = "mul_scalar", .op = "mul", .inputs = {F({2, 7}), F({1})}},
      {.label = "mul_middle", .op = "mul", .inputs = {F({2, 7, 3}), F({2, 1, 3})}},
      {.label = "mul_both_stretch", .op = "mul", .inputs = {F({3, 1, 5}), F({1, 4, 1})}},
      {.label = "div_same", .op = "div", .inputs = {F({7, 13}), F({7, 13})}, .fills = nonzero_b},
      {.label = "div_row", .op = "div", .inputs = {F({7, 13}), F({13})}, .fills = nonzero_b},
      {.label = "div_col", .op = "div", .inputs = {F({7, 13}), F({7, 1})}, .fills = nonzero_b},
      {.label = "div_scalar", .op = "div", .inputs = {F({33}), F({})}, .fills = nonzero_b},
      {.label = "div_both_stretch", .op = "div", .inputs = {F({1, 7}), F({13, 1})}, .fills = nonzero_b},
      // Unary ops.
      {.label = "scale", .op = "scale", .single_kernel = true, .inputs = {F({7, 13})}, .attrs = {{"factor", 2.5}}},
      {.label = "scale_int_factor", .op = "scale", .single_kernel = true, .inputs = {F({7})}, .attrs = {{"factor", int64_t{-3}}}},
      {.label = "neg", .op = "neg", .single_kernel = true, .inputs = {F({33})}},
      {.label = "relu", .op = "relu", .single_kernel = true, .inputs = {F({7, 13})}},
      {.label = "relu_scalar", .op = "relu", .single_kernel = true, .inputs = {F({})}},
      {.label = "leaky_relu", .op = "leaky_relu", .single_kernel = true, .inputs = {F({7, 13})}},
      // ReLU6 over inputs on both sides of both bounds; another clamp.
      {.label = "hardtanh_relu6", .op = "hardtanh", .single_kernel = true, .inputs = {F({7, 13})}, .attrs = {{"min_val", 0.0}, {"max_val", 6.0}}, .fills = {Uniform(-3, 9)}},
      {.label = "hardtanh", .op = "hardtanh", .single_kernel = true, .inputs = {F({33})}, .attrs = {{"min_val", -2.0}, {"max_val", 2.0}}, .fills = {Uniform(-3, 3)}},
      {.label = "leaky_relu_slope", .op = "leaky_relu", .single_kernel = true, .inputs = {F({33})}, .attrs = {{"slope", 0.2}}, .fills = {Uniform(-3, 3)}},
      {.label = "softplus", .op = "softplus", .single_kernel = true, .inputs = {F({7, 13})}, .fills = {Uniform(-5, 5)}},
      {.label = "softplus_beta", .op = "softplus", .single_kernel = true, .inputs = {F({33})}, .attrs = {{"beta", 2.0}, {"threshold", 20.0}}, .fills = {Uniform(-4, 4)}},
      // Past the threshold softplus is x itself (a jump of log1p(e^-threshold) / beta: no finite difference there).
      {.label = "softplus_threshold", .op = "softplus", .single_kernel = true, .inputs = {F({33})}, .attrs = {{"beta", 1.0}, {"threshold", 1.0}}, .fills = {Uniform(-4, 4)}, .grad = false},
      {.label = "gelu", .op = "gelu", .inputs = {F({7, 13})}, .fills = {wide}},
      {.label = "gelu_one", .op = "gelu", .inputs = {F({1})}},
      {.label = "gelu_long", .op = "gelu", .inputs = {F({1031})}, .fills = {Uniform(-12, 12)}, .grad = false},
      {.label = "gelu_erf", .op = "gelu_erf", .single_kernel = true, .inputs = {F({7, 13})}, .fills = {wide}},
      {.label = "silu", .op = "silu", .inputs = {F({7, 13})}, .fills = {wide}},
      {.label = "silu_one", .op = "silu", .inputs = {F({1})}},
      {.label = "silu_long", .op = "silu", .inputs = {F({1031})}, .fills = {Uniform(-90, 90)}, .grad = false},
      {.label = "swiglu", .op = "swiglu", .inputs = {F({7, 13}), F({7, 13})}, .fills = {wide, Fill{}}},
      {.label = "swiglu_one", .op = "swiglu", .inputs = {F({1}), F({1})}},
      {.label = "swiglu_long", .op = "swiglu", .inputs = {F({1031}), F({1031})}, .fills = {Uniform(-90, 90), Fill{}}, .grad = false},
      {.label = "tanh", .op = "tanh", .inputs = {F({33})}, .fills = {wide}},
      {.label = "tanh_long", .op = "tanh", .inputs = {F({1031})}, .fills = {Uniform(-12, 12)}, .grad = false},
      {.label = "sigmoid", .op = "sigmoid", .inputs = {F({7, 13})}, .fills = {wide}},
      {.label = "sigmoid_one", .op = "sigmoid", .inputs = {F({1})}},
      // Past ±88 e^-x overflows f32 (and underflows): σ is 0 or 1 there, never NaN.
      {.label = "sigmoid_long", .op = "sigmoid", .inputs = {F({1031})}, .fills = {Uniform(-100, 100)}, .grad = false},
      {.label = "exp", .op = "exp", .inputs = {F({7, 13})}, .fills = {wide}},
      {.label = "exp_long", .op = "exp", .inputs = {F({1031})}, .fills = {Uniform(-80, 80)}, .grad = false},
      {.label = "log", .op = "log", .single_kernel = true, .inputs = {F({7, 13})}, .fills = {positive}},
      {.label = "sqrt", .op = "sqrt", .single_kernel = true, .inputs = {F({33})}, .fills = {positive}},
      // Fused activation gradients (no gradients of their own).
      {.label = "relu_grad", .op = "relu_grad", .single_kernel = true, .inputs = {F({7, 13}), F({7, 13})}, .grad = false},
      {.label = "gelu_grad", .op = "gelu_grad", .inputs = {F({33}), F({33})}, .fills = {Fill{}, wide}, .grad = false},
      {.label = "gelu_grad_long", .op = "gelu_grad", .inputs = {F({1031}), F({1031})}, .fills = {Fill{}, Uniform(-12, 12)}, .grad = false},
      {.label = "silu_grad", .op = "silu_grad", .inputs = {F({33}), F({33})}, .fills = {Fill{}, wide}, .grad = false},
      {.label = "silu_grad_long", .op = "silu_grad", .inputs = {F({1031}), F({1031})}, .fills = {Fill{}, Uniform(-90, 90)}, .grad = false},
      {.label = "swiglu_grad", .op = "swiglu_grad", .inputs = {F({33}), F({33}), F({33})}, .fills = {Fill{}, wide, Fill{}}, .grad = false},
      {.label = "swiglu_grad_long", .op = "swiglu_grad", .inputs = {F({1031}), F({1031}), F({1031})}, .fills = {Fill{}, Uniform(-90, 90), Fill{}}, .grad = false},
      {.label = "gelu_erf_grad", .op = "gelu_erf_grad", .single_kernel = true, .inputs = {F({33}), F({33})}, .fills = {Fill{}, wide}, .grad = false},
      {.label = "tanh_grad", .op = "tanh_grad", .single_kernel = true, .inputs = {F({7, 13}), F({7, 13})}, .grad = false},
      {.label = "sigmoid_grad", .op = "sigmoid_grad", .single_kernel = true, .inputs = {F({7, 13}), F({7, 13})}, .grad = false},
      {.label = "hardtanh_grad", .op = "hardtanh_grad", .single_kernel = true, .inputs = {F({7, 13}), F({7, 13})}, .attrs = {{"min_val", -0.5}, {"max_val", 0.5}}, .grad = false},
      {.label = "leaky_relu_grad", .op = "leaky_relu_grad", .single_kernel = true, .inputs = {F({7, 13}), F({7, 13})}, .attrs = {{"slope", 0.2}}, .grad = false},
      {.label = "softplus_grad", .op = "softplus_grad", .single_kernel = true, .inputs = {F({33}), F({33})}, .attrs = {{"beta", 2.0}, {"threshold", 3.0}}, .fills = {Fill{}, Uniform(-4, 4)}, .grad = false},
      // Fill, cast, copy. (A cast to f32 rounds away what a finite difference measures: no grad.)
      {.label = "full", .op = "full", .single_kernel = true, .inputs = {}, .attrs = {{"dtype", std::string("f32")}, {"shape", std::vector<int64_t>{2, 3}}, {"value", 1.5}}},
      {.label = "cast_to_f64", .op = "cast", .inputs = {F({7, 13})}, .attrs = f64},
      {.label = "cast_to_f32", .op = "cast", .inputs = {F({7, 13})}, .attrs = f32, .grad = false},
      // An integer mask or count read as numbers (exact below 2^24); no gradient.
      {.label = "cast_from_i64", .op = "cast", .inputs = {I64({5, 7})}, .attrs = f32, .fills = {Indices(9)}, .grad = false},
      // Mixed precision (op_harness.h): rounding to bf16 costs at most half a bf16 ulp, 2^-8 of
      // the value just above a power of two (4e-3); widening is exact; gradients pass through in
      // f32 both ways (exact).
      {.label = "cast_to_bf16", .op = "cast", .inputs = {F({7, 13})}, .attrs = bf16, .bf16 = true, .bf16_tolerance = 4e-3, .bf16_grad_tolerance = 0},
      {.label = "cast_to_bf16_long", .op = "cast", .inputs = {F({1031})}, .attrs = bf16, .fills = {Uniform(-1e3, 1e3)}, .grad = false, .bf16 = true, .bf16_tolerance = 4e-3},
      {.label = "cast_from_bf16", .op = "cast", .inputs = {F({1031})}, .attrs = f32, .bf16 = true, .bf16_inputs = {0}, .bf16_tolerance = 0, .bf16_grad_tolerance = 0},
      // GELU on bf16 (kernels/bf16_activations.h): widened exactly, f32 inside, y rounded — half a
      // bf16 ulp of y, at most 2^-8 relative (4e-3), against the twin; fast and reference kernels
      // round f32 values that differ in the last bits, so they may fall on two sides of a tie:
      // one ulp (8e-3). gelu_grad with bf16 x computes the f32 kernel's values (f32 rounding).
      {.label = "gelu_bf16", .op = "gelu", .inputs = {F({7, 13})}, .fills = {wide}, .f32_tolerance = 8e-3, .bf16 = true, .bf16_inputs = {0}, .bf16_tolerance = 4e-3, .bf16_grad_tolerance = 1e-5},
      {.label = "gelu_bf16_long", .op = "gelu", .inputs = {F({40000})}, .fills = {Uniform(-12, 12)}, .grad = false, .f32_tolerance = 8e-3, .bf16 = true, .bf16_inputs = {0}, .bf16_tolerance = 4e-3},
      // SwiGLU on bf16 a and b (kernels/bf16_llama.h), as GELU's: y rounded (2^-8 against the
      // twin, one ulp between fast and reference); swiglu_grad with bf16 a, b computes the f32
      // kernel's values. 40000 elements span several chunks and 256-element blocks.
      {.label = "swiglu_bf16", .op = "swiglu", .inputs = {F({7, 13}), F({7, 13})}, .fills = {wide, Fill{}}, .f32_tolerance = 8e-3, .bf16 = true, .bf16_inputs = {0, 1}, .bf16_tolerance = 4e-3, .bf16_grad_tolerance = 1e-5},
      {.label = "swiglu_bf16_long", .op = "swiglu", .inputs = {F({40000}), F({40000})}, .fills = {Uniform(-12, 12), Fill{}}, .grad = false, .f32_tolerance = 8e-3, .bf16 = true, .bf16_inputs = {0, 1}, .bf16_tolerance = 4e-3},
      {.label = "swiglu_grad_bf16", .op = "swiglu_grad", .inputs = {F({40000}), F({40000}), F({40000})}, .fills = {Fill{}, Uniform(-12, 12), Fill{}}, .grad = false, .bf16 = true, .bf16_inputs = {1, 2}, .bf16_tolerance = 1e-5},
      // da and db rounded to bf16 as they are stored (dtype = "bf16": a gradient only bf16
      // products read): half a bf16 ulp against the twin, one ulp between fast and reference
      // (their f32 values differ in the last bits).
      {.label = "swiglu_grad_bf16_rounded", .op = "swiglu_grad", .inputs = {F({40000}), F({40000}), F({40000})}, .attrs = bf16, .fills = {Fill{}, Uniform(-12, 12), Fill{}}, .grad = false, .f32_tolerance = 8e-3, .bf16 = true, .bf16_inputs = {1, 2}, .bf16_tolerance = 4e-3},
      {.label = "gelu_grad_bf16", .op = "gelu_grad", .inputs = {F({40000}), F({40000})}, .fills = {Fill{}, Uniform(-12, 12)}, .grad = false, .bf16 = true, .bf16_inputs = {1}, .bf16_tolerance = 1e-5},
      // add and mul on bf16 a and b (kernels/binary.h): each element computed in f32 and rounded,
      // half a bf16 ulp of y (2^-8 relative, 4e-3) against the twin; fast and reference kernels
      // compute the same bits (0), equal shapes and broadcast, one chunk and several. Gradients are
      // f32 (mul's reads the other operand widened, exactly): the twin's bits.
      {.label = "add_bf16", .op = "add", .inputs = {F({7, 13}), F({7, 13})}, .f32_tolerance = 0, .bf16 = true, .bf16_inputs = {0, 1}, .bf16_tolerance = 4e-3, .bf16_grad_tolerance = 0},
      {.label = "add_bf16_long", .op = "add", .inputs = {F({40000}), F({40000})}, .grad = false, .f32_tolerance = 0, .bf16 = true, .bf16_inputs = {0, 1}, .bf16_tolerance = 4e-3},
      {.label = "mul_bf16_rotary", .op = "mul", .inputs = {F({2, 3, 5, 4}), F({5, 4})}, .fills = {wide, wide}, .f32_tolerance = 0, .bf16 = true, .bf16_inputs = {0, 1}, .bf16_tolerance = 4e-3, .bf16_grad_tolerance = 0},
      {.label = "mul_bf16_rows_long", .op = "mul", .inputs = {F({300, 131}), F({300, 1})}, .grad = false, .f32_tolerance = 0, .bf16 = true, .bf16_inputs = {0, 1}, .bf16_tolerance = 4e-3},
      {.label = "copy", .op = "copy", .single_kernel = true, .inputs = {F({3, 7})}},
      // Gradient accumulation in place (autodiff's AccumulateGradients).
      {.label = "accumulate", .op = "accumulate", .inputs = {F({3, 7}), F({3, 7})}, .grad = false},
      {.label = "accumulate_long", .op = "accumulate", .inputs = {F({1031}), F({1031})}, .grad = false},
  };
}
// clang-format on

namespace {

// clang-format off
std::vector<OpErrorCase> ElementwiseErrors() {
  const TensorType f64_3{DType::kF64, Shape{3}};
  return {
      {.label = "add_mismatch", .op = "add", .inputs = {F({4, 3}), F({4})}},
      {.label = "accumulate_shape", .op = "accumulate", .inputs = {F({4, 3}), F({3, 4})}},
      {.label = "add_dtype", .op = "add", .inputs = {F({3}), f64_3}},
      {.label = "add_int", .op = "add", .inputs = {I64({3}), I64({3})}},
      {.label = "sub_mismatch", .op = "sub", .inputs = {F({7, 13}), F({13, 7})}},
      {.label = "mul_dtype", .op = "mul", .inputs = {f64_3, F({3})}},
      {.label = "div_int", .op = "div", .inputs = {I32({3}), I32({3})}},
      {.label = "div_mismatch", .op = "div", .inputs = {F({2, 3}), F({3, 3})}},
      {.label = "scale_no_factor", .op = "scale", .inputs = {F({3})}},
      {.label = "scale_int", .op = "scale", .inputs = {I64({3})}, .attrs = {{"factor", 2.0}}},
      {.label = "relu_int", .op = "relu", .inputs = {I64({3})}},
      {.label = "tanh_bf16", .op = "tanh", .inputs = {{DType::kBF16, Shape{3}}}},
      {.label = "gelu_grad_bf16_dy", .op = "gelu_grad", .inputs = {{DType::kBF16, Shape{3}}, {DType::kBF16, Shape{3}}}},
      {.label = "gelu_grad_bf16_shape", .op = "gelu_grad", .inputs = {F({4}), {DType::kBF16, Shape{3}}}},
      {.label = "add_bf16_f32", .op = "add", .inputs = {{DType::kBF16, Shape{3}}, F({3})}},
      {.label = "mul_f32_bf16", .op = "mul", .inputs = {F({3}), {DType::kBF16, Shape{3}}}},
      {.label = "div_bf16", .op = "div", .inputs = {{DType::kBF16, Shape{3}}, {DType::kBF16, Shape{3}}}},
      {.label = "cast_bf16_to_f64", .op = "cast", .inputs = {{DType::kBF16, Shape{3}}}, .attrs = {{"dtype", std::string("f64")}}},
      {.label = "cast_to_f16", .op = "cast", .inputs = {F({3})}, .attrs = {{"dtype", std::string("f16")}}},
      {.label = "exp_int", .op = "exp", .inputs = {I32({3})}},
      {.label = "silu_int", .op = "silu", .inputs = {I64({3})}},
      {.label = "silu_grad_shape", .op = "silu_grad", .inputs = {F({3}), F({4})}},
      {.label = "swiglu_shape", .op = "swiglu", .inputs = {F({3}), F({1, 3})}},
      {.label = "swiglu_int", .op = "swiglu", .inputs = {I64({3}), I64({3})}},
      {.label = "swiglu_bf16_mixed", .op = "swiglu", .inputs = {{DType::kBF16, Shape{3}}, F({3})}},
      {.label = "swiglu_grad_bf16_dy", .op = "swiglu_grad", .inputs = {{DType::kBF16, Shape{3}}, {DType::kBF16, Shape{3}}, {DType::kBF16, Shape{3}}}},
      {.label = "swiglu_grad_bf16_shape", .op = "swiglu_grad", .inputs = {F({4}), {DType::kBF16, Shape{3}}, {DType::kBF16, Shape{3}}}},
      {.label = "swiglu_grad_shape", .op = "swiglu_grad", .inputs = {F({3}), F({3}), F({4})}},
      {.label = "swiglu_grad_bf16_of_f32", .op = "swiglu_grad", .inputs = {F({3}), F({3}), F({3})}, .attrs = {{"dtype", std::string("bf16")}}},
      {.label = "swiglu_grad_dtype_unknown", .op = "swiglu_grad", .inputs = {F({3}), {DType::kBF16, Shape{3}}, {DType::kBF16, Shape{3}}}, .attrs = {{"dtype", std::string("f16")}}},
      {.label = "relu_grad_shape", .op = "relu_grad", .inputs = {F({3}), F({4})}},
      {.label = "gelu_grad_broadcast", .op = "gelu_grad", .inputs = {F({2, 3}), F({3})}},
      {.label = "tanh_grad_dtype", .op = "tanh_grad", .inputs = {F({3}), f64_3}},
      {.label = "sigmoid_int", .op = "sigmoid", .inputs = {I64({3})}},
      {.label = "sigmoid_grad_shape", .op = "sigmoid_grad", .inputs = {F({3}), F({4})}},
      {.label = "softplus_beta_zero", .op = "softplus", .inputs = {F({3})}, .attrs = {{"beta", 0.0}}},
      {.label = "hardtanh_bounds", .op = "hardtanh", .inputs = {F({3})}, .attrs = {{"min_val", 1.0}, {"max_val", 1.0}}},
      {.label = "leaky_relu_grad_shape", .op = "leaky_relu_grad", .inputs = {F({3}), F({4})}},
      {.label = "full_dtype", .op = "full", .inputs = {}, .attrs = {{"dtype", std::string("q8")}, {"shape", std::vector<int64_t>{2}}, {"value", 0.0}}},
      {.label = "cast_to_int", .op = "cast", .inputs = {F({3})}, .attrs = {{"dtype", std::string("i64")}}},
      {.label = "cast_int_to_bf16", .op = "cast", .inputs = {I64({3})}, .attrs = {{"dtype", std::string("bf16")}}},
  };
}
// clang-format on

INSTANTIATE_TEST_SUITE_P(Elementwise, OpHarness, ::testing::ValuesIn(ElementwiseCases()),
                         CaseName());
INSTANTIATE_TEST_SUITE_P(Elementwise, OpErrors, ::testing::ValuesIn(ElementwiseErrors()),
                         CaseName());

// torch.nn.functional.gelu(x, approximate='tanh') and its gradient in float64 (PyTorch 1.13).
TEST(Gelu, MatchesPyTorchTanhApproximation) {
  const std::vector<double> x = {-6.0, -3.0, -1.5, -0.5, -1e-3, 0.0, 1e-3, 0.5, 1.0, 2.5, 6.0};
  const std::vector<double> torch_y = {
      -8.43964897967453e-11, -0.0036373920817729943, -0.10042842301976707,
      -0.15428599017485606,  -0.000499601057786418,  0.0,
      0.000500398942213582,  0.34571400982514394,    0.8411919906082768,
      2.484915733910001,     5.9999999999156035};
  const std::vector<double> torch_dx = {
      -7.709976012836329e-10, -0.011584166630969648, -0.12771079315143308,
      0.13263009646535764,    0.499202115706475,     0.5,
      0.500797884293525,      0.8673699035346424,    1.0829640838457826,
      1.037951576212666,      1.0000000007709977};
  const Shape n{static_cast<int64_t>(x.size())};
  const Tensor xt = Tensor::FromVector<double>(n, x);
  const Tensor ones = Tensor::Full(n, 1.0, DType::kF64);
  for (bool reference : {false, true}) {
    const std::vector<double> y = RunF64("gelu", {xt}, reference);
    const std::vector<double> dx = RunF64("gelu_grad", {ones, xt}, reference);
    for (size_t i = 0; i < x.size(); ++i) {
      // Absolute below 1: PyTorch's 0.5·x·(1 + tanh u) cancels for very negative x.
      EXPECT_NEAR(y[i], torch_y[i], 1e-12 * std::max(1.0, std::abs(torch_y[i])))
          << "gelu(" << x[i] << ") reference=" << reference;
      EXPECT_NEAR(dx[i], torch_dx[i], 1e-12 * std::max(1.0, std::abs(torch_dx[i])))
          << "gelu'(" << x[i] << ") reference=" << reference;
    }
  }
}

// torch.nn.functional.silu and gelu(approximate='none') and their gradients in float64 (PyTorch
// 1.13), fast and reference kernels.
TEST(SiluAndExactGelu, MatchPyTorch) {
  const std::vector<double> x = {-20.0, -6.0, -1.5, -0.5, 0.0, 1e-3, 0.5, 2.5, 6.0, 20.0};
  struct Expected {
    const char* op;
    const char* grad_op;
    std::vector<double> y, dx;
  };
  const std::vector<Expected> expected = {
      {"silu",
       "silu_grad",
       {-4.122307236380407e-08, -0.014835738939808647, -0.2736382857095345, -0.1887703343990727,
        0.0, 0.0005002499999791667, 0.3112296656009273, 2.3103545499468914, 5.985164261060192,
        19.999999958776925},
       {-3.9161918660646786e-08, -0.012326432591525513, -0.041294154299142946, 0.2600388126973482,
        0.5, 0.5004999999166666, 0.7399611873026519, 1.0994011113415267, 1.0123264325915249,
        1.0000000391619202}},
      {"gelu_erf",
       "gelu_erf_grad",
       {-0.0, -5.919525869479969e-09, -0.10021080190328704, -0.15426876936299344, 0.0,
        0.000500398942213911, 0.34573123063700656, 2.4844758366855597, 5.999999994080474, 20.0},
       {-1.1041896724319527e-86, -3.546870945402639e-08, -0.1274691922299796, 0.13250487534383712,
        0.5, 0.5007978842948414, 0.8674951246561629, 1.037611085908145, 1.0000000354687093, 1.0}},
  };
  const Shape n{static_cast<int64_t>(x.size())};
  const Tensor xt = Tensor::FromVector<double>(n, x);
  const Tensor ones = Tensor::Full(n, 1.0, DType::kF64);
  for (const Expected& e : expected) {
    for (bool reference : {false, true}) {
      const std::vector<double> y = RunF64(e.op, {xt}, reference);
      const std::vector<double> dx = RunF64(e.grad_op, {ones, xt}, reference);
      for (size_t i = 0; i < x.size(); ++i) {
        EXPECT_NEAR(y[i], e.y[i], 1e-12 * std::max(1.0, std::abs(e.y[i])))
            << e.op << "(" << x[i] << ") reference=" << reference;
        EXPECT_NEAR(dx[i], e.dx[i], 1e-12 * std::max(1.0, std::abs(e.dx[i])))
            << e.op << "'(" << x[i] << ") reference=" << reference;
      }
    }
  }
}

// torch.sigmoid and its gradient in float64 (PyTorch 1.13), fast and reference kernels; the
// gradient op reads sigmoid's output. At ±100 the tails are 3.7e-44 and 1 (no NaN where e^-x is
// large).
TEST(Sigmoid, MatchesPyTorch) {
  const std::vector<double> x = {-100.0, -20.0, -6.0, -1.5, -0.5, 0.0,
                                 1e-3,   0.5,   2.5,  6.0,  20.0, 100.0};
  const std::vector<double> torch_y = {
      3.7200759760208356e-44, 2.0611536181902037e-09, 0.0024726231566347743,
      0.18242552380635635,    0.3775406687981454,     0.5,
      0.5002499999791666,     0.6224593312018546,     0.9241418199787566,
      0.9975273768433653,     0.9999999979388463,     1.0};
  const std::vector<double> torch_dx = {
      3.7200759760208356e-44, 2.0611536139418496e-09, 0.002466509291360048,
      0.14914645207033286,    0.2350037122015945,     0.25,
      0.24999993750001043,    0.2350037122015945,     0.07010371654510807,
      0.002466509291359931,   2.0611536879193953e-09, 0.0};
  const Shape n{static_cast<int64_t>(x.size())};
  const Tensor ones = Tensor::Full(n, 1.0, DType::kF64);
  for (bool reference : {false, true}) {
    const std::vector<double> y = RunF64("sigmoid", {Tensor::FromVector<double>(n, x)}, reference);
    const std::vector<double> dx =
        RunF64("sigmoid_grad", {ones, Tensor::FromVector<double>(n, y)}, reference);
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_NEAR(y[i], torch_y[i], 1e-12 * std::max(1e-30, std::abs(torch_y[i])))
          << "sigmoid(" << x[i] << ") reference=" << reference;
      EXPECT_NEAR(dx[i], torch_dx[i], 1e-12 * std::max(1e-30, std::abs(torch_dx[i])))
          << "sigmoid'(" << x[i] << ") reference=" << reference;
    }
  }
}

// torch.nn.functional.leaky_relu(x, 0.2) and softplus(x, beta=2, threshold=10) and their
// gradients in float64 (PyTorch 1.13): the slope at 0 is leaky_relu's, and 12 is past the
// threshold, where softplus is x.
TEST(LeakyReluAndSoftplus, MatchPyTorch) {
  const std::vector<double> x = {-3.0, -0.5, 0.0, 0.75, 4.0, 12.0};
  struct Expected {
    const char* op;
    const char* grad_op;
    Attrs attrs;
    std::vector<double> y, dx;
  };
  const std::vector<Expected> expected = {
      {"leaky_relu",
       "leaky_relu_grad",
       {{"slope", 0.2}},
       {-0.6, -0.1, 0.0, 0.75, 4.0, 12.0},
       {0.2, 0.2, 0.2, 1.0, 1.0, 1.0}},
      {"softplus",
       "softplus_grad",
       {{"beta", 2.0}, {"threshold", 10.0}},
       {0.0012378425688652247, 0.15663084375911143, 0.34657359027997264, 0.8507066389913762,
        4.000167703186448, 12.0},
       {0.0024726231566347748, 0.2689414213699951, 0.5, 0.8175744761936437, 0.9996646498695335,
        1.0}},
  };
  const Shape n{static_cast<int64_t>(x.size())};
  const Tensor xt = Tensor::FromVector<double>(n, x);
  const Tensor ones = Tensor::Full(n, 1.0, DType::kF64);
  for (const Expected& e : expected) {
    const std::vector<double> y = RunF64(e.op, {xt}, false, e.attrs);
    const std::vector<double> dx = RunF64(e.grad_op, {ones, xt}, false, e.attrs);
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_NEAR(y[i], e.y[i], 1e-12 * std::max(1.0, std::abs(e.y[i])))
          << e.op << "(" << x[i] << ")";
      EXPECT_NEAR(dx[i], e.dx[i], 1e-12 * std::max(1.0, std::abs(e.dx[i])))
          << e.op << "'(" << x[i] << ")";
    }
  }
}

// exp keeps IEEE special values and the ends of the range in the fast kernel.
TEST(Exp, FastKernelHandlesSpecialValuesAndRangeEnds) {
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<double> x = {-inf, -800.0, -745.0, -708.0, 0.0, 1.0, 709.7, 710.0, inf};
  const Tensor xt = Tensor::FromVector<double>(Shape{static_cast<int64_t>(x.size())}, x);
  const std::vector<double> fast = RunF64("exp", {xt}, /*reference=*/false);
  for (size_t i = 0; i < x.size(); ++i) {
    const double want = std::exp(x[i]);
    if (std::isinf(want)) {
      EXPECT_EQ(fast[i], want) << "exp(" << x[i] << ")";
    } else {
      EXPECT_NEAR(fast[i], want, 4e-16 * want + 1e-323)
          << "exp(" << x[i] << ")";  // 2 subnormal ulp
    }
  }
  const std::vector<double> nan =
      RunF64("exp", {Tensor::Full(Shape{3}, std::nan(""), DType::kF64)}, false);
  for (double v : nan) EXPECT_TRUE(std::isnan(v));
}

TEST(ElementwiseBuilder, OperatorsEmitTheirOps) {
  Builder b("ops");
  Var x = b.Input("x", DType::kF32, {2, 3});
  Var y = b.Input("y", DType::kF32, {3});
  const std::vector<std::pair<Var, std::string>> cases = {
      {x + y, "add"}, {x - y, "sub"},     {x * y, "mul"},    {x / y, "div"},
      {-x, "neg"},    {x * 2.0, "scale"}, {0.5 * x, "scale"}};
  for (const auto& [v, op] : cases) {
    EXPECT_EQ(b.program().instructions()[v.value().producer].op->name, op);
    EXPECT_EQ(v.shape(), (Shape{2, 3}));
  }
  EXPECT_EQ(Cast(x, DType::kF32).id(), x.id()) << "a cast to the same dtype is no op";
  EXPECT_EQ(Cast(x, DType::kF64).dtype(), DType::kF64);
  EXPECT_EQ(Zeros(b, {4}, DType::kF64).type(), (TensorType{DType::kF64, Shape{4}}));
}

}  // namespace
}  // namespace sluice::testing
