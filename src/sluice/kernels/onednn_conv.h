// f32 2-D convolution and its gradients through oneDNN's convolution primitives (Debian's libdnnl
// 2.6, the engine under PyTorch's CPU convolutions): the fast path of kernels/conv.h's Conv2dFast,
// Conv2dGradInputFast and Conv2dGradWeightFast for f32 where OneDnnConvolves(d).
//
// Shapes and formulas are conv.h's (x [B, C, H, W], w [O, C/G, KH, KW], y [B, O, OH, OW]; groups
// and dilation are oneDNN's own, a grouped w read as its [G, O/G, C/G, KH, KW]). oneDNN's
// fast kernels read and write channels in blocks of 16 (nChw16c); sluice's tensors are plain
// (nchw), so each call runs in chunks of OneDnnConvImages(d) images: a chunk's operands are
// reordered into blocked buffers in the caller's scratch, the primitive runs, and its output is
// reordered back (the weights once a call). A chunk's blocked operands stay within
// kConv2dColsBudget elements (at least one image), the bound of the im2col block they replace, so
// the scratch stays small whatever the batch. The weight gradient adds the chunks' gradients in
// chunk order.
//
// Choice: OneDnnConvolves(d) — a window larger than 1×1 over at least 16 input and 16 output
// channels — is where the primitives measured faster than im2col + OpenBLAS on the CIFAR CNN's
// and ResNet-8's shapes (docs/benchmarks.md); any grouped convolution (G > 1) goes to oneDNN too
// (depthwise ones on its depthwise kernels), since im2col would run a GEMM per group of C/G
// channels. 1×1 and few-channel ungrouped convolutions stay on im2col, and so does a convolution
// whose weight-gradient scratch (blocked weights and gradients) would take more bytes than its
// input and output together (a small batch: the peak stays below PyTorch's; a depthwise one then
// runs conv.h's direct kernels).
// SLUICE_CONV=im2col (read once) keeps every convolution on im2col, for comparisons.
//
// Threads and determinism: forward and input gradient run on oneDNN's OpenMP threads
// (SetOneDnnThreads in onednn_matmul.h), the weight gradient on one (its threads add their parts
// at a spinning barrier, which on a loaded machine waited for a thread without a core:
// onednn_conv.cc). Results depend on the shape and that thread count, not on the intra-op threads
// or the stage split: bitwise the same run after run. Primitives are made once per shape and
// thread count and kept in a process-wide cache (onednn_runtime.h's OneDnnCache).
// Thread-safety: any thread may call; the cache is guarded by a mutex, each call runs on the
// calling thread's stream with its own scratch. Failures: oneDNN's errors are rethrown as
// InternalError naming the convolution.
//
// Example:
//   std::vector<std::byte> scratch(OneDnnConvScratchBytes(d, Conv2dPass::kForward));
//   kernels::OneDnnConv2d(x, w, y, d, scratch.data());
#pragma once

#include <cstdint>
#include <string>

#include "sluice/kernels/conv.h"

namespace sluice::kernels {

// "onednn" (the default: the choice above) or "im2col" (SLUICE_CONV=im2col: every convolution on
// im2col); throws InvalidArgument naming SLUICE_CONV's value when it is neither.
const char* Fp32ConvEngineName();

// Whether f32 convolutions of d run on oneDNN (see the choice above); the scratch rule makes the
// weight gradient's primitives (JIT) the first time a shape is asked about. Depends on d alone.
bool OneDnnConvolves(const Conv2dDims& d);

// Images per primitive call: ⌊kConv2dColsBudget / (C·H·W + O·OH·OW)⌋, clamped to [1, B].
int64_t OneDnnConvImages(const Conv2dDims& d);

// Bytes of scratch a call of `pass` takes (the blocked chunk buffers, the blocked weights or
// weight gradient, a chunk's plain weight gradient, oneDNN's scratchpad); makes the primitives
// (JIT) when they are not cached yet. scratch: at least that many bytes, aligned to 64.
int64_t OneDnnConvScratchBytes(const Conv2dDims& d, Conv2dPass pass);

// y [B, O, OH, OW] = conv2d(x, w).
void OneDnnConv2d(const float* x, const float* w, float* y, const Conv2dDims& d, void* scratch);
// dx [B, C, H, W] (overwritten) from dy and w.
void OneDnnConv2dGradInput(const float* dy, const float* w, float* dx, const Conv2dDims& d,
                           void* scratch);
// dw [O, C/G, KH, KW] (overwritten) from dy and x, summed over the batch.
void OneDnnConv2dGradWeight(const float* dy, const float* x, float* dw, const Conv2dDims& d,
                            void* scratch);

// The implementation oneDNN chose for `pass` on a chunk of d, e.g. "jit:avx512_core" (benchmarks).
std::string OneDnnConvImplementation(const Conv2dDims& d, Conv2dPass pass);

}  // namespace sluice::kernels
