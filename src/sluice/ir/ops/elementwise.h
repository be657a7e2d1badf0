// Elementwise ops. Binary ops use NumPy broadcasting (trailing axes aligned, size-1 axes stretch)
// and need both operands of the same floating dtype (f32 or f64; add and mul also bf16, computed
// in f32 and rounded: mixed precision); unary ops keep shape and dtype.
// Kernels: kernels/binary.h, kernels/unary.h. Shapes below: x, y [...] any shape; a, b broadcast
// to the output shape.
//
// Gradients: binary ops sum the gradient back to each operand's shape (SumTo). Activations use
// fused gradient ops (relu_grad, gelu_grad, tanh_grad: one pass, no temporaries), which are ops of
// their own so that the backward program stays one instruction per activation.
//
// Example:
//   Var h = Gelu(MatMul(x, w1) + b1);      // [B, T, 4C]
//   Var y = (h - Mean(h, {-1}, true)) * 0.5;
#pragma once

#include "sluice/ir/builder.h"

namespace sluice {

// a + b, a - b, a · b, a / b with broadcasting. Ops "add", "sub", "mul", "div".
Var Add(Var a, Var b);
Var Sub(Var a, Var b);
Var Mul(Var a, Var b);
Var Div(Var a, Var b);
inline Var operator+(Var a, Var b) { return Add(a, b); }
inline Var operator-(Var a, Var b) { return Sub(a, b); }
inline Var operator*(Var a, Var b) { return Mul(a, b); }
inline Var operator/(Var a, Var b) { return Div(a, b); }

// factor · x. Op "scale", attribute factor.
Var Scale(Var x, double factor);
inline Var operator*(Var x, double factor) { return Scale(x, factor); }
inline Var operator*(double factor, Var x) { return Scale(x, factor); }
// -x. Op "neg".
Var Neg(Var x);
inline Var operator-(Var x) { return Neg(x); }

// Activations and functions, y = f(x), same shape. Ops "relu", "gelu" (tanh approximation,
// PyTorch's gelu(approximate='tanh')), "gelu_erf" (exact, approximate='none'), "silu" (x·σ(x)),
// "tanh", "sigmoid" (1 / (1 + e^−x)), "exp", "log", "sqrt".
Var Relu(Var x);
Var Gelu(Var x);
Var GeluErf(Var x);
Var Silu(Var x);
Var Tanh(Var x);
Var Sigmoid(Var x);
Var Exp(Var x);
Var Log(Var x);
Var Sqrt(Var x);
// x where x > 0, slope·x elsewhere: PyTorch's leaky_relu(x, negative_slope). Op "leaky_relu",
// attribute slope; VJP: leaky_relu_grad(dy, x).
Var LeakyRelu(Var x, double slope = 0.01);
// x clamped to [min_val, max_val]: PyTorch's hardtanh (nn.ReLU6 is [0, 6]). Op "hardtanh",
// attributes min_val < max_val; VJP: hardtanh_grad(dy, y), from the output, so that the input
// need not be kept for the backward.
Var Hardtanh(Var x, double min_val, double max_val);
// log(1 + e^(beta·x)) / beta, x where beta·x > threshold: PyTorch's softplus(x, beta, threshold).
// Op "softplus", attributes beta and threshold; VJP: softplus_grad(dy, x).
Var Softplus(Var x, double beta = 1.0, double threshold = 20.0);

// Fused activation gradients (used by the VJP rules; no gradients of their own). dy, the saved
// value and the result all have one shape.
// dy where s > 0, else 0; s is relu's input or output (same signs; the rule passes the output,
// which the next op usually keeps anyway). Op "relu_grad".
Var ReluGrad(Var dy, Var s);
// dy · gelu'(x). Op "gelu_grad".
Var GeluGrad(Var dy, Var x);
// dy · silu'(x). Op "silu_grad".
Var SiluGrad(Var dy, Var x);
// dy · gelu_erf'(x). Op "gelu_erf_grad".
Var GeluErfGrad(Var dy, Var x);
// dy · (1 − y²) for y = tanh(x). Op "tanh_grad".
Var TanhGrad(Var dy, Var y);
// dy · y·(1 − y) for y = sigmoid(x). Op "sigmoid_grad".
Var SigmoidGrad(Var dy, Var y);
// dy where x > 0, slope·dy elsewhere. Op "leaky_relu_grad", attribute slope.
Var LeakyReluGrad(Var dy, Var x, double slope);
// dy where min_val < y < max_val, else 0 (y hardtanh's output). Op "hardtanh_grad".
Var HardtanhGrad(Var dy, Var y, double min_val, double max_val);
// dy · σ(beta·x), dy where beta·x > threshold. Op "softplus_grad", attributes beta, threshold.
Var SoftplusGrad(Var dy, Var x, double beta, double threshold);

// SwiGLU's gate, silu(a) · b, a and b of one shape (Llama's MLP: a = x·W1ᵀ, b = x·W3ᵀ). Op
// "swiglu", recomputable; its VJP, swiglu_grad, recomputes silu(a), so the forward keeps a and b
// only (silu then mul would keep silu(a) as well).
Var Swiglu(Var a, Var b);
// {da, db} = {dy · b · silu'(a), dy · silu(a)}, all one shape. Op "swiglu_grad".
std::vector<Var> SwigluGrad(Var dy, Var a, Var b);

// A new tensor of `shape` filled with `value`. Op "full", no inputs; attributes shape, value,
// dtype.
Var Full(Builder& b, const Shape& shape, double value, DType dtype);
// Full with 0 and 1.
Var Zeros(Builder& b, const Shape& shape, DType dtype);
Var Ones(Builder& b, const Shape& shape, DType dtype);

// x converted to `dtype` (f32 <-> f64, f32 <-> bf16, i32 or i64 to f32 or f64: an integer x has
// no gradient); x itself when it already has that dtype. Op "cast", attribute dtype.
Var Cast(Var x, DType dtype);
// A copy of x in fresh memory. Op "copy".
Var Copy(Var x);

}  // namespace sluice
