// Convolution and pooling ops over images [B, C, H, W] (PyTorch's layout): conv2d (nn.Conv2d
// without its bias: the bias is an add), max_pool2d and avg_pool2d, and the gradient ops their VJP
// rules emit; conv2d_grad_input is also nn.ConvTranspose2d. Kernels: kernels/conv.h (oneDNN, or
// blocked im2col and the project's GEMM, for the convolution; plane-wise loops for pooling).
//
// Attributes, each a pair [rows, columns]: stride (≥ 1), padding (≥ 0; zeros for the convolution
// and average pooling, −∞ for max pooling), kernel (pooling's window), dilation (≥ 1, the
// convolution's taps that many pixels apart); and the convolution's groups (G ≥ 1, dividing C and
// O: w is [O, C/G, KH, KW], group g's outputs read only its C/G input channels; G = C is a
// depthwise convolution). The output is [B, O, (H + 2·padding − dilation·(KH − 1) − 1) / stride
// + 1, (W + ...) / stride + 1]; a window larger than the padded image is a ShapeError.
//
// Example (a LeNet-style layer):
//   Var h = Conv2d(x, w, {1, 1}, {1, 1});            // x [B, 1, 12, 12], w [8, 1, 3, 3] -> [B, 8,
//   12, 12] Var p = MaxPool2d(Relu(h), {2, 2}, {2, 2});      // -> [B, 8, 6, 6]
#pragma once

#include <array>
#include <cstdint>

#include "sluice/ir/builder.h"

namespace sluice {

using Pair = std::array<int64_t, 2>;

// A convolution's attributes (written to the program only where they differ from 1 for dilation
// and groups).
struct ConvOptions {
  Pair stride{1, 1}, padding{0, 0}, dilation{1, 1};
  int64_t groups = 1;
};

// x [B, C, H, W], w [O, C/G, KH, KW] -> [B, O, OH, OW]. Op "conv2d", attributes stride, padding,
// dilation, groups; its kernel's scratch is kernels::Conv2dScratchBytes: one block of an image's
// im2col matrix for one group, C/G·KH·KW · rows·OW values with rows = kernels::Conv2dBlockRows,
// or, for the f32 convolutions on oneDNN (kernels/onednn_conv.h), a chunk of images in oneDNN's
// layout with the weights (counted by the memory forecast). VJP: conv2d_grad_input (x) and
// conv2d_grad_weight (w).
Var Conv2d(Var x, Var w, const ConvOptions& options);
Var Conv2d(Var x, Var w, Pair stride = {1, 1}, Pair padding = {0, 0});
// dy [B, O, OH, OW], w [O, C/G, KH, KW] -> dx [B, C, height, width]. Op "conv2d_grad_input".
// It is also PyTorch's conv_transpose2d(dy, w) (w [C_in, C_out/G, KH, KW] there), whose output
// size (H − 1)·stride − 2·padding + dilation·(KH − 1) + output_padding + 1 is height; its VJP
// is conv2d (dy) and conv2d_grad_weight (w).
Var Conv2dGradInput(Var dy, Var w, const ConvOptions& options, int64_t height, int64_t width);
// dy [B, O, OH, OW], x [B, C, H, W] -> dw [O, C/G, kernel]. Op "conv2d_grad_weight".
Var Conv2dGradWeight(Var dy, Var x, const ConvOptions& options, Pair kernel);

// Max over each window: x [B, C, H, W] -> [B, C, OH, OW]. Op "max_pool2d", attributes kernel,
// stride, padding (at most half the window, as PyTorch requires). VJP: max_pool2d_grad, which
// finds each window's first largest element in x again.
Var MaxPool2d(Var x, Pair kernel, Pair stride, Pair padding = {0, 0});
// dy [B, C, OH, OW], x [B, C, H, W] -> dx [B, C, H, W]. Op "max_pool2d_grad".
Var MaxPool2dGrad(Var dy, Var x, Pair kernel, Pair stride, Pair padding);
// Mean over each window, the padding counted: x [B, C, H, W] -> [B, C, OH, OW]. Op "avg_pool2d",
// attributes kernel, stride, padding. VJP: avg_pool2d_grad.
Var AvgPool2d(Var x, Pair kernel, Pair stride, Pair padding = {0, 0});
// dy [B, C, OH, OW] -> dx [B, C, height, width]. Op "avg_pool2d_grad".
Var AvgPool2dGrad(Var dy, Pair kernel, Pair stride, Pair padding, int64_t height, int64_t width);

void RegisterConvOps(OpRegistry& registry);

}  // namespace sluice
