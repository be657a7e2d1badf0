// 2-D convolution and pooling over images in PyTorch's layout, and their gradients.
//
// Buffers are contiguous, row-major:
//   x  [B, C, H, W]      images (B batch, C channels, H × W pixels)
//   w  [O, C/G, KH, KW]  convolution filters (O output channels, KH × KW taps, G groups),
//                        nn.Conv2d's weight
//   y  [B, O, OH, OW]    OH = (H + 2·PH − DH·(KH − 1) − 1) / SH + 1, OW likewise (stride S, zero
//                        padding P, dilation D)
// Convolution is PyTorch's (cross-correlation): group g = o / (O/G) reads input channels
// [g·C/G, (g+1)·C/G) only, its taps DH (DW) pixels apart:
//   y[b, o, i, j] = Σ_c,p,q w[o, c, p, q] · x[b, g·C/G + c, i·SH − PH + p·DH, j·SW − PW + q·DW]
//   (0 outside x). A depthwise convolution is G = C: one input channel per group.
// Pooling takes windows of KH × KW at stride S over x padded by P: max pooling pads with −∞ and
// its gradient goes to the first largest element of each window in row-major order (PyTorch's
// choice, which matters where a ReLU before it leaves ties of 0); average pooling divides by
// KH·KW, the padding counted (PyTorch's count_include_pad=True).
//
// *Reference: the sums as written, one output element at a time. *Fast (convolution): im2col —
// a block of output rows of one image and one group laid out as a [C/G·KH·KW, rows·OW] matrix in
// `cols`, caller-owned scratch of Conv2dScratchBytes(d, pass, sizeof(T)) — and one GEMM per block
// and group (kernels/matmul.h Gemm, on OpenBLAS's threads). Blocks are Conv2dBlockRows(d) output
// rows, as many as keep the block within kConv2dColsBudget elements (at least one row): a whole
// image when it is small, so the scratch stays bounded for large ones; and when an image needs
// blocks, within the elements of the input x, so that a small batch's scratch does not outgrow its
// activations. A depthwise convolution (G = C > 1: one input plane per group) that stays off oneDNN
// runs direct instead, a plane at a time, without scratch (Conv2dDepthwise). The fast and plain
// convolutions agree within rounding of the order of their sums. f32
// convolutions with a window larger than 1×1 over at least 16 input and output channels, and
// grouped ones (G > 1: a GEMM per group of a few channels, or of one for a depthwise convolution,
// is mostly overhead), whose oneDNN scratch stays within their input and output, run on oneDNN's
// primitives instead (kernels/onednn_conv.h's OneDnnConvolves), in the same scratch. *Fast
// (pooling): a plane at a time, each window clipped to the image once; bitwise the reference's
// results. Threads: im2col and its transpose run channels, the fast pools planes, on the intra-op
// threads (kernels/parallel.h), each chunk writing only its own rows, every sum in one fixed order:
// the results are bitwise the same at any thread count. Thread-safety: plain functions over
// caller-owned memory.
//
// Example:
//   Conv2dDims d = Conv2dShape(B, C, H, W, O, 3, 3, {1, 1}, {1, 1});
//   std::vector<float> cols(Conv2dScratchBytes(d, Conv2dPass::kForward, 4) / 4);
//   kernels::Conv2dFast<float>(x, w, y, d, cols.data());
#pragma once

#include <array>
#include <cstdint>

namespace sluice::kernels {

struct Conv2dDims {
  int64_t batch = 0, channels = 0, height = 0, width = 0;  // x [B, C, H, W]
  int64_t out_channels = 0;                                // O (pooling: C)
  int64_t kernel_h = 0, kernel_w = 0;
  int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  int64_t out_h = 0, out_w = 0;
  int64_t groups = 1;                      // G, dividing C and O (pooling: 1)
  int64_t dilation_h = 1, dilation_w = 1;  // D (pooling: 1)
};

// The dims of a convolution or pooling of x [B, C, H, W] by windows of kernel_h × kernel_w; out_h
// and out_w from the formula above (0 when the window does not fit: callers check). Callers
// check that groups divides channels and out_channels.
Conv2dDims Conv2dShape(int64_t batch, int64_t channels, int64_t height, int64_t width,
                       int64_t out_channels, int64_t kernel_h, int64_t kernel_w,
                       std::array<int64_t, 2> stride, std::array<int64_t, 2> padding,
                       std::array<int64_t, 2> dilation = {1, 1}, int64_t groups = 1);

// Input channels per group, C/G: w's second dimension.
inline int64_t Conv2dGroupChannels(const Conv2dDims& d) { return d.channels / d.groups; }

// The most elements one im2col block holds unless a single output row needs more: 256 KiB of
// f32, which a core's L2 cache holds while the GEMM reads it.
inline constexpr int64_t kConv2dColsBudget = int64_t{1} << 16;

// The three kernels of a convolution, for the scratch each takes.
enum class Conv2dPass { kForward, kGradInput, kGradWeight };

// Whether the convolution is depthwise (G = C > 1), whose fast kernels off oneDNN take no scratch.
bool Conv2dDepthwise(const Conv2dDims& d);

// Bytes of scratch the fast kernel of `pass` takes over elements of `element_bytes` (4 for f32, 8
// for f64): oneDNN's chunk buffers where the convolution runs there (f32 and
// OneDnnConvolves(d), kernels/onednn_conv.h), otherwise none for a depthwise convolution and the
// im2col block of Conv2dColsElements(d) elements for the others. The fast kernels' `cols` must hold
// at least that many bytes.
int64_t Conv2dScratchBytes(const Conv2dDims& d, Conv2dPass pass, int64_t element_bytes);

// Output rows per im2col block: all OH when C/G·KH·KW · OH·OW ≤ kConv2dColsBudget, else
// ⌊min(kConv2dColsBudget, B·C·H·W) / (C/G·KH·KW · OW)⌋, clamped to [1, OH].
int64_t Conv2dBlockRows(const Conv2dDims& d);

// Elements of the im2col scratch: C/G·KH·KW · Conv2dBlockRows(d) · OW.
int64_t Conv2dColsElements(const Conv2dDims& d);

// y [B, O, OH, OW] = conv2d(x, w).
template <typename T>
void Conv2dReference(const T* x, const T* w, T* y, const Conv2dDims& d);
template <typename T>
void Conv2dFast(const T* x, const T* w, T* y, const Conv2dDims& d, T* cols);

// dx [B, C, H, W] (overwritten) from dy [B, O, OH, OW] and w.
template <typename T>
void Conv2dGradInputReference(const T* dy, const T* w, T* dx, const Conv2dDims& d);
template <typename T>
void Conv2dGradInputFast(const T* dy, const T* w, T* dx, const Conv2dDims& d, T* cols);

// dw [O, C/G, KH, KW] (overwritten) from dy [B, O, OH, OW] and x, summed over the batch.
template <typename T>
void Conv2dGradWeightReference(const T* dy, const T* x, T* dw, const Conv2dDims& d);
template <typename T>
void Conv2dGradWeightFast(const T* dy, const T* x, T* dw, const Conv2dDims& d, T* cols);

// Pooling, d.out_channels == d.channels: y [B, C, OH, OW]; the gradients overwrite dx [B, C, H, W].
template <typename T>
void MaxPool2dReference(const T* x, T* y, const Conv2dDims& d);
template <typename T>
void MaxPool2dFast(const T* x, T* y, const Conv2dDims& d);
template <typename T>
void MaxPool2dGradReference(const T* dy, const T* x, T* dx, const Conv2dDims& d);
template <typename T>
void MaxPool2dGradFast(const T* dy, const T* x, T* dx, const Conv2dDims& d);
template <typename T>
void AvgPool2dReference(const T* x, T* y, const Conv2dDims& d);
template <typename T>
void AvgPool2dFast(const T* x, T* y, const Conv2dDims& d);
template <typename T>
void AvgPool2dGradReference(const T* dy, T* dx, const Conv2dDims& d);
template <typename T>
void AvgPool2dGradFast(const T* dy, T* dx, const Conv2dDims& d);

}  // namespace sluice::kernels
