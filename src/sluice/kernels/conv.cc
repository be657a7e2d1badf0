#include "sluice/kernels/conv.h"

#include <algorithm>
#include <limits>
#include <type_traits>

#include "sluice/kernels/matmul.h"
#include "sluice/kernels/onednn_conv.h"
#include "sluice/kernels/parallel.h"

namespace sluice::kernels {

Conv2dDims Conv2dShape(int64_t batch, int64_t channels, int64_t height, int64_t width,
                       int64_t out_channels, int64_t kernel_h, int64_t kernel_w,
                       std::array<int64_t, 2> stride, std::array<int64_t, 2> padding,
                       std::array<int64_t, 2> dilation, int64_t groups) {
  Conv2dDims d{.batch = batch,
               .channels = channels,
               .height = height,
               .width = width,
               .out_channels = out_channels,
               .kernel_h = kernel_h,
               .kernel_w = kernel_w,
               .stride_h = stride[0],
               .stride_w = stride[1],
               .pad_h = padding[0],
               .pad_w = padding[1],
               .groups = groups,
               .dilation_h = dilation[0],
               .dilation_w = dilation[1]};
  // The window's extent: KH taps DH apart.
  const int64_t span_h = height + 2 * d.pad_h - (dilation[0] * (kernel_h - 1) + 1);
  const int64_t span_w = width + 2 * d.pad_w - (dilation[1] * (kernel_w - 1) + 1);
  d.out_h = span_h < 0 ? 0 : span_h / d.stride_h + 1;
  d.out_w = span_w < 0 ? 0 : span_w / d.stride_w + 1;
  return d;
}

int64_t Conv2dBlockRows(const Conv2dDims& d) {
  const int64_t per_row = Conv2dGroupChannels(d) * d.kernel_h * d.kernel_w * d.out_w;
  const int64_t whole = per_row * d.out_h, input = d.batch * d.channels * d.height * d.width;
  // A whole image that fits the budget is one block; once blocks are needed, none holds more
  // values than the input does (a small batch's scratch would otherwise outgrow its activations).
  const int64_t budget =
      whole <= kConv2dColsBudget ? kConv2dColsBudget : std::min(kConv2dColsBudget, input);
  return std::clamp<int64_t>(budget / std::max<int64_t>(1, per_row), 1,
                             std::max<int64_t>(1, d.out_h));
}

int64_t Conv2dColsElements(const Conv2dDims& d) {
  return Conv2dGroupChannels(d) * d.kernel_h * d.kernel_w * std::min(d.out_h, Conv2dBlockRows(d)) *
         d.out_w;
}

bool Conv2dDepthwise(const Conv2dDims& d) { return d.groups > 1 && d.groups == d.channels; }

int64_t Conv2dScratchBytes(const Conv2dDims& d, Conv2dPass pass, int64_t element_bytes) {
  if (element_bytes == 4 && OneDnnConvolves(d)) return OneDnnConvScratchBytes(d, pass);
  if (Conv2dDepthwise(d)) return 0;
  return Conv2dColsElements(d) * element_bytes;
}

namespace {

// f32 convolutions that run on oneDNN (onednn_conv.h).
template <typename T>
bool OnOneDnn(const Conv2dDims& d) {
  return std::is_same_v<T, float> && OneDnnConvolves(d);
}

// The input row (column) that output row i (column j) reads at tap p (q); outside [0, H) it is
// padding.
inline int64_t InRow(const Conv2dDims& d, int64_t i, int64_t p) {
  return i * d.stride_h - d.pad_h + p * d.dilation_h;
}
inline int64_t InCol(const Conv2dDims& d, int64_t j, int64_t q) {
  return j * d.stride_w - d.pad_w + q * d.dilation_w;
}

// The output columns j whose input column InCol(d, j, q) lies inside the image, [lo, hi) (empty
// when lo ≥ hi); likewise the output rows for tap row p.
struct Span {
  int64_t lo = 0, hi = 0;
};
Span Inside(int64_t outputs, int64_t stride, int64_t pad, int64_t tap, int64_t extent) {
  // in = j·stride − pad + tap ∈ [0, extent)  ⇔  j ∈ [⌈(pad − tap) / stride⌉, ⌊(extent − 1 + pad
  // − tap) / stride⌋], tap the offset of the tap in the window (q·DW)
  const int64_t first = pad - tap, last = extent - 1 + pad - tap;
  if (last < 0) return {0, 0};
  const int64_t lo = first <= 0 ? 0 : (first + stride - 1) / stride;
  return {std::min(lo, outputs), std::min(outputs, last / stride + 1)};
}
Span InsideCols(const Conv2dDims& d, int64_t q) {
  return Inside(d.out_w, d.stride_w, d.pad_w, q * d.dilation_w, d.width);
}

// cols [C/G·KH·KW, rows·OW] of output rows [i0, i0 + rows) of one image's group of channels x
// [C/G, H, W]: row (c, p, q) holds, for each of those output pixels, the input it reads at that
// tap (0 in the padding). Channels run on the intra-op threads; each writes only its own KH·KW
// rows of cols.
template <typename T>
void Im2Col(const T* x, T* cols, const Conv2dDims& d, int64_t i0, int64_t rows) {
  const int64_t block = rows * d.out_w;
  ParallelFor(Conv2dGroupChannels(d), ChunkRows(d.kernel_h * d.kernel_w * block),
              [&](int64_t c0, int64_t c1) {
                for (int64_t c = c0; c < c1; ++c) {
                  const T* plane = x + c * d.height * d.width;
                  for (int64_t p = 0; p < d.kernel_h; ++p) {
                    for (int64_t q = 0; q < d.kernel_w; ++q) {
                      T* row = cols + ((c * d.kernel_h + p) * d.kernel_w + q) * block;
                      const Span in = InsideCols(d, q);
                      for (int64_t i = i0; i < i0 + rows; ++i) {
                        const int64_t r = InRow(d, i, p);
                        T* out = row + (i - i0) * d.out_w;
                        if (r < 0 || r >= d.height || in.lo >= in.hi) {
                          std::fill_n(out, d.out_w, T(0));
                          continue;
                        }
                        std::fill(out, out + in.lo, T(0));
                        const T* src = plane + r * d.width + InCol(d, in.lo, q);
                        if (d.stride_w == 1) {
                          std::copy(src, src + (in.hi - in.lo), out + in.lo);
                        } else {
                          for (int64_t j = in.lo; j < in.hi; ++j)
                            out[j] = src[(j - in.lo) * d.stride_w];
                        }
                        std::fill(out + in.hi, out + d.out_w, T(0));
                      }
                    }
                  }
                }
              });
}

// The transpose of Im2Col: dx [C/G, H, W] (one image's group) += each entry of cols (output rows
// [i0, i0 + rows)) at the input it was read from. Channels run on the intra-op threads, each
// adding only into its own plane, every element's terms in the order of (p, q, i, j): the same
// sums at any thread count.
template <typename T>
void Col2ImAdd(const T* cols, T* dx, const Conv2dDims& d, int64_t i0, int64_t rows) {
  const int64_t block = rows * d.out_w;
  ParallelFor(Conv2dGroupChannels(d), ChunkRows(d.kernel_h * d.kernel_w * block),
              [&](int64_t c0, int64_t c1) {
                for (int64_t c = c0; c < c1; ++c) {
                  T* plane = dx + c * d.height * d.width;
                  for (int64_t p = 0; p < d.kernel_h; ++p) {
                    for (int64_t q = 0; q < d.kernel_w; ++q) {
                      const T* row = cols + ((c * d.kernel_h + p) * d.kernel_w + q) * block;
                      const Span in = InsideCols(d, q);
                      if (in.lo >= in.hi) continue;
                      for (int64_t i = i0; i < i0 + rows; ++i) {
                        const int64_t r = InRow(d, i, p);
                        if (r < 0 || r >= d.height) continue;
                        const T* from = row + (i - i0) * d.out_w;
                        T* dst = plane + r * d.width + InCol(d, in.lo, q);
                        if (d.stride_w == 1) {
                          for (int64_t j = in.lo; j < in.hi; ++j) dst[j - in.lo] += from[j];
                        } else {
                          for (int64_t j = in.lo; j < in.hi; ++j)
                            dst[(j - in.lo) * d.stride_w] += from[j];
                        }
                      }
                    }
                  }
                }
              });
}

int64_t XIndex(const Conv2dDims& d, int64_t b, int64_t c, int64_t r, int64_t s) {
  return ((b * d.channels + c) * d.height + r) * d.width + s;
}
int64_t YIndex(const Conv2dDims& d, int64_t b, int64_t o, int64_t i, int64_t j) {
  return ((b * d.out_channels + o) * d.out_h + i) * d.out_w + j;
}
// c counts the channels of o's group: w [O, C/G, KH, KW].
int64_t WIndex(const Conv2dDims& d, int64_t o, int64_t c, int64_t p, int64_t q) {
  return ((o * Conv2dGroupChannels(d) + c) * d.kernel_h + p) * d.kernel_w + q;
}
// The first input channel of output channel o's group.
int64_t GroupStart(const Conv2dDims& d, int64_t o) {
  return o / (d.out_channels / d.groups) * Conv2dGroupChannels(d);
}

// The sizes of one group's part of each operand, in elements: x's and y's of one image (images
// hold G of them in a row), w's; and the group's GEMM dimensions.
struct GroupStrides {
  explicit GroupStrides(const Conv2dDims& d)
      : pixels(d.out_h * d.out_w),
        taps(Conv2dGroupChannels(d) * d.kernel_h * d.kernel_w),
        outputs(d.out_channels / d.groups),
        x(Conv2dGroupChannels(d) * d.height * d.width),
        y(outputs * pixels),
        w(outputs * taps) {}
  int64_t pixels, taps, outputs;  // OH·OW, C/G·KH·KW, O/G
  int64_t x, y, w;
};

// ---- depthwise: one input plane per group, no im2col ----
// Output channel o reads input plane o / M (M = O/C filters per input channel). Each tap (p, q)
// adds w[o, 0, p, q] times a shifted window of the plane to the output plane, over the output rows
// and columns whose input lies inside the image (Inside): the inner loop runs along a row, the
// taps in the reference's order (bitwise its sums). Planes run on the intra-op threads, each
// written by one chunk.

// out [OH, OW] (+)= Σ_p,q w[p, q] · the plane in at the tap (the forward's window walk).
template <typename T>
void DepthwisePlane(const T* in, const T* w, T* out, const Conv2dDims& d) {
  std::fill_n(out, d.out_h * d.out_w, T(0));
  for (int64_t p = 0; p < d.kernel_h; ++p) {
    const Span rows = Inside(d.out_h, d.stride_h, d.pad_h, p * d.dilation_h, d.height);
    for (int64_t q = 0; q < d.kernel_w; ++q) {
      const Span cols = InsideCols(d, q);
      const T tap = w[p * d.kernel_w + q];
      for (int64_t i = rows.lo; i < rows.hi; ++i) {
        const T* src = in + InRow(d, i, p) * d.width + InCol(d, 0, q);
        T* dst = out + i * d.out_w;
        for (int64_t j = cols.lo; j < cols.hi; ++j) dst[j] += tap * src[j * d.stride_w];
      }
    }
  }
}

template <typename T>
void DepthwiseForward(const T* x, const T* w, T* y, const Conv2dDims& d) {
  const int64_t image = d.height * d.width, pixels = d.out_h * d.out_w,
                taps = d.kernel_h * d.kernel_w;
  const int64_t multiplier = d.out_channels / d.channels;
  ParallelFor(d.batch * d.out_channels, ChunkRows(pixels * taps), [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t b = k / d.out_channels, o = k % d.out_channels;
      DepthwisePlane(x + (b * d.channels + o / multiplier) * image, w + o * taps, y + k * pixels,
                     d);
    }
  });
}

// dx plane c = Σ over its M output channels o and taps of w[o, p, q] · dy[o] back at the input
// pixels they read.
template <typename T>
void DepthwiseGradInput(const T* dy, const T* w, T* dx, const Conv2dDims& d) {
  const int64_t image = d.height * d.width, pixels = d.out_h * d.out_w,
                taps = d.kernel_h * d.kernel_w;
  const int64_t multiplier = d.out_channels / d.channels;
  ParallelFor(d.batch * d.channels, ChunkRows(image + multiplier * pixels * taps),
              [&](int64_t k0, int64_t k1) {
                for (int64_t k = k0; k < k1; ++k) {
                  const int64_t b = k / d.channels, c = k % d.channels;
                  T* plane = dx + k * image;
                  std::fill_n(plane, image, T(0));
                  for (int64_t m = 0; m < multiplier; ++m) {
                    const int64_t o = c * multiplier + m;
                    const T* g = dy + (b * d.out_channels + o) * pixels;
                    for (int64_t p = 0; p < d.kernel_h; ++p) {
                      const Span rows =
                          Inside(d.out_h, d.stride_h, d.pad_h, p * d.dilation_h, d.height);
                      for (int64_t q = 0; q < d.kernel_w; ++q) {
                        const Span cols = InsideCols(d, q);
                        const T tap = w[o * taps + p * d.kernel_w + q];
                        for (int64_t i = rows.lo; i < rows.hi; ++i) {
                          T* dst = plane + InRow(d, i, p) * d.width + InCol(d, 0, q);
                          const T* src = g + i * d.out_w;
                          for (int64_t j = cols.lo; j < cols.hi; ++j) {
                            dst[j * d.stride_w] += tap * src[j];
                          }
                        }
                      }
                    }
                  }
                }
              });
}

// dw[o, 0, p, q] = Σ_b Σ_i,j dy[b, o, i, j] · x[b, o / M, the tap's input pixel]: output channels
// on the threads, each summing its taps over the batch in order.
template <typename T>
void DepthwiseGradWeight(const T* dy, const T* x, T* dw, const Conv2dDims& d) {
  const int64_t image = d.height * d.width, pixels = d.out_h * d.out_w,
                taps = d.kernel_h * d.kernel_w;
  const int64_t multiplier = d.out_channels / d.channels;
  ParallelFor(d.out_channels, ChunkRows(d.batch * pixels * taps), [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      for (int64_t p = 0; p < d.kernel_h; ++p) {
        const Span rows = Inside(d.out_h, d.stride_h, d.pad_h, p * d.dilation_h, d.height);
        for (int64_t q = 0; q < d.kernel_w; ++q) {
          const Span cols = InsideCols(d, q);
          T sum = 0;
          for (int64_t b = 0; b < d.batch; ++b) {
            const T* plane = x + (b * d.channels + o / multiplier) * image;
            const T* g = dy + (b * d.out_channels + o) * pixels;
            for (int64_t i = rows.lo; i < rows.hi; ++i) {
              const T* src = plane + InRow(d, i, p) * d.width + InCol(d, 0, q);
              const T* row = g + i * d.out_w;
              for (int64_t j = cols.lo; j < cols.hi; ++j) sum += row[j] * src[j * d.stride_w];
            }
          }
          dw[o * taps + p * d.kernel_w + q] = sum;
        }
      }
    }
  });
}

}  // namespace

template <typename T>
void Conv2dReference(const T* x, const T* w, T* y, const Conv2dDims& d) {
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t o = 0; o < d.out_channels; ++o) {
      for (int64_t i = 0; i < d.out_h; ++i) {
        for (int64_t j = 0; j < d.out_w; ++j) {
          T sum = 0;
          for (int64_t c = 0; c < Conv2dGroupChannels(d); ++c) {
            for (int64_t p = 0; p < d.kernel_h; ++p) {
              for (int64_t q = 0; q < d.kernel_w; ++q) {
                const int64_t r = InRow(d, i, p), s = InCol(d, j, q);
                if (r < 0 || r >= d.height || s < 0 || s >= d.width) continue;
                sum += w[WIndex(d, o, c, p, q)] * x[XIndex(d, b, GroupStart(d, o) + c, r, s)];
              }
            }
          }
          y[YIndex(d, b, o, i, j)] = sum;
        }
      }
    }
  }
}

template <typename T>
void Conv2dFast(const T* x, const T* w, T* y, const Conv2dDims& d, T* cols) {
  if constexpr (std::is_same_v<T, float>) {
    if (OnOneDnn<T>(d)) return OneDnnConv2d(x, w, y, d, cols);
  }
  if (Conv2dDepthwise(d)) return DepthwiseForward(x, w, y, d);
  const GroupStrides g(d);
  const int64_t block = Conv2dBlockRows(d);
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t k = 0; k < d.groups; ++k) {
      T* yg = y + (b * d.groups + k) * g.y;
      for (int64_t i0 = 0; i0 < d.out_h; i0 += block) {
        const int64_t rows = std::min(block, d.out_h - i0), n = rows * d.out_w;
        Im2Col(x + (b * d.groups + k) * g.x, cols, d, i0, rows);
        // y_bk[:, rows i0…] [O/G, rows·OW] = w_k [O/G, C/G·KH·KW] · cols
        Gemm(false, false, g.outputs, n, g.taps, T(1), w + k * g.w, g.taps, cols, n, T(0),
             yg + i0 * d.out_w, g.pixels);
      }
    }
  }
}

template <typename T>
void Conv2dGradInputReference(const T* dy, const T* w, T* dx, const Conv2dDims& d) {
  std::fill_n(dx, d.batch * d.channels * d.height * d.width, T(0));
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t o = 0; o < d.out_channels; ++o) {
      for (int64_t i = 0; i < d.out_h; ++i) {
        for (int64_t j = 0; j < d.out_w; ++j) {
          const T g = dy[YIndex(d, b, o, i, j)];
          for (int64_t c = 0; c < Conv2dGroupChannels(d); ++c) {
            for (int64_t p = 0; p < d.kernel_h; ++p) {
              for (int64_t q = 0; q < d.kernel_w; ++q) {
                const int64_t r = InRow(d, i, p), s = InCol(d, j, q);
                if (r < 0 || r >= d.height || s < 0 || s >= d.width) continue;
                dx[XIndex(d, b, GroupStart(d, o) + c, r, s)] += g * w[WIndex(d, o, c, p, q)];
              }
            }
          }
        }
      }
    }
  }
}

template <typename T>
void Conv2dGradInputFast(const T* dy, const T* w, T* dx, const Conv2dDims& d, T* cols) {
  if constexpr (std::is_same_v<T, float>) {
    if (OnOneDnn<T>(d)) return OneDnnConv2dGradInput(dy, w, dx, d, cols);
  }
  if (Conv2dDepthwise(d)) return DepthwiseGradInput(dy, w, dx, d);
  const GroupStrides g(d);
  const int64_t image = d.channels * d.height * d.width, block = Conv2dBlockRows(d);
  for (int64_t b = 0; b < d.batch; ++b) {
    T* dxb = dx + b * image;
    ParallelFor(image, kChunkElements,
                [&](int64_t begin, int64_t end) { std::fill(dxb + begin, dxb + end, T(0)); });
    for (int64_t k = 0; k < d.groups; ++k) {
      const T* dyg = dy + (b * d.groups + k) * g.y;
      for (int64_t i0 = 0; i0 < d.out_h; i0 += block) {
        const int64_t rows = std::min(block, d.out_h - i0), n = rows * d.out_w;
        // cols [C/G·KH·KW, rows·OW] = w_kᵀ · dy_bk[:, rows i0…], then each tap back to its input
        // pixel
        Gemm(true, false, g.taps, n, g.outputs, T(1), w + k * g.w, g.taps, dyg + i0 * d.out_w,
             g.pixels, T(0), cols, n);
        Col2ImAdd(cols, dxb + k * g.x, d, i0, rows);
      }
    }
  }
}

template <typename T>
void Conv2dGradWeightReference(const T* dy, const T* x, T* dw, const Conv2dDims& d) {
  for (int64_t o = 0; o < d.out_channels; ++o) {
    for (int64_t c = 0; c < Conv2dGroupChannels(d); ++c) {
      for (int64_t p = 0; p < d.kernel_h; ++p) {
        for (int64_t q = 0; q < d.kernel_w; ++q) {
          T sum = 0;
          for (int64_t b = 0; b < d.batch; ++b) {
            for (int64_t i = 0; i < d.out_h; ++i) {
              for (int64_t j = 0; j < d.out_w; ++j) {
                const int64_t r = InRow(d, i, p), s = InCol(d, j, q);
                if (r < 0 || r >= d.height || s < 0 || s >= d.width) continue;
                sum += dy[YIndex(d, b, o, i, j)] * x[XIndex(d, b, GroupStart(d, o) + c, r, s)];
              }
            }
          }
          dw[WIndex(d, o, c, p, q)] = sum;
        }
      }
    }
  }
}

template <typename T>
void Conv2dGradWeightFast(const T* dy, const T* x, T* dw, const Conv2dDims& d, T* cols) {
  if constexpr (std::is_same_v<T, float>) {
    if (OnOneDnn<T>(d)) return OneDnnConv2dGradWeight(dy, x, dw, d, cols);
  }
  if (Conv2dDepthwise(d)) return DepthwiseGradWeight(dy, x, dw, d);
  const GroupStrides g(d);
  const int64_t block = Conv2dBlockRows(d);
  if (d.batch == 0 || g.pixels == 0) std::fill_n(dw, d.groups * g.w, T(0));
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t k = 0; k < d.groups; ++k) {
      const T* dyg = dy + (b * d.groups + k) * g.y;
      for (int64_t i0 = 0; i0 < d.out_h; i0 += block) {
        const int64_t rows = std::min(block, d.out_h - i0), n = rows * d.out_w;
        Im2Col(x + (b * d.groups + k) * g.x, cols, d, i0, rows);
        // dw_k [O/G, C/G·KH·KW] (+)= dy_bk[:, rows i0…] [O/G, rows·OW] · colsᵀ; the first block
        // of the first image overwrites
        const bool first = b == 0 && i0 == 0;
        Gemm(false, true, g.outputs, g.taps, n, T(1), dyg + i0 * d.out_w, g.pixels, cols, n,
             first ? T(0) : T(1), dw + k * g.w, g.taps);
      }
    }
  }
}

template <typename T>
void MaxPool2dReference(const T* x, T* y, const Conv2dDims& d) {
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t c = 0; c < d.channels; ++c) {
      for (int64_t i = 0; i < d.out_h; ++i) {
        for (int64_t j = 0; j < d.out_w; ++j) {
          T best = -std::numeric_limits<T>::infinity();
          for (int64_t p = 0; p < d.kernel_h; ++p) {
            for (int64_t q = 0; q < d.kernel_w; ++q) {
              const int64_t r = InRow(d, i, p), s = InCol(d, j, q);
              if (r < 0 || r >= d.height || s < 0 || s >= d.width) continue;
              best = std::max(best, x[XIndex(d, b, c, r, s)]);
            }
          }
          y[YIndex(d, b, c, i, j)] = best;
        }
      }
    }
  }
}

template <typename T>
void MaxPool2dGradReference(const T* dy, const T* x, T* dx, const Conv2dDims& d) {
  std::fill_n(dx, d.batch * d.channels * d.height * d.width, T(0));
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t c = 0; c < d.channels; ++c) {
      for (int64_t i = 0; i < d.out_h; ++i) {
        for (int64_t j = 0; j < d.out_w; ++j) {
          // The first largest element in row-major order (a later one must be strictly larger).
          int64_t at = -1;
          T best = -std::numeric_limits<T>::infinity();
          for (int64_t p = 0; p < d.kernel_h; ++p) {
            for (int64_t q = 0; q < d.kernel_w; ++q) {
              const int64_t r = InRow(d, i, p), s = InCol(d, j, q);
              if (r < 0 || r >= d.height || s < 0 || s >= d.width) continue;
              const int64_t k = XIndex(d, b, c, r, s);
              if (at < 0 || x[k] > best) {
                at = k;
                best = x[k];
              }
            }
          }
          if (at >= 0) dx[at] += dy[YIndex(d, b, c, i, j)];
        }
      }
    }
  }
}

template <typename T>
void AvgPool2dReference(const T* x, T* y, const Conv2dDims& d) {
  const T scale = T(1) / static_cast<T>(d.kernel_h * d.kernel_w);
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t c = 0; c < d.channels; ++c) {
      for (int64_t i = 0; i < d.out_h; ++i) {
        for (int64_t j = 0; j < d.out_w; ++j) {
          T sum = 0;
          for (int64_t p = 0; p < d.kernel_h; ++p) {
            for (int64_t q = 0; q < d.kernel_w; ++q) {
              const int64_t r = InRow(d, i, p), s = InCol(d, j, q);
              if (r < 0 || r >= d.height || s < 0 || s >= d.width) continue;
              sum += x[XIndex(d, b, c, r, s)];
            }
          }
          y[YIndex(d, b, c, i, j)] = sum * scale;
        }
      }
    }
  }
}

template <typename T>
void AvgPool2dGradReference(const T* dy, T* dx, const Conv2dDims& d) {
  const T scale = T(1) / static_cast<T>(d.kernel_h * d.kernel_w);
  std::fill_n(dx, d.batch * d.channels * d.height * d.width, T(0));
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t c = 0; c < d.channels; ++c) {
      for (int64_t i = 0; i < d.out_h; ++i) {
        for (int64_t j = 0; j < d.out_w; ++j) {
          const T g = dy[YIndex(d, b, c, i, j)] * scale;
          for (int64_t p = 0; p < d.kernel_h; ++p) {
            for (int64_t q = 0; q < d.kernel_w; ++q) {
              const int64_t r = InRow(d, i, p), s = InCol(d, j, q);
              if (r < 0 || r >= d.height || s < 0 || s >= d.width) continue;
              dx[XIndex(d, b, c, r, s)] += g;
            }
          }
        }
      }
    }
  }
}

// Explicit instantiations for the two dtypes kernels compute.
// The fast pools walk one plane [H, W] of one image and channel at a time, planes on the intra-op
// threads, each window's rows and columns clipped to the image once (Inside) instead of tested
// per tap. Each plane is written by one chunk, its sums and its first-largest choice taken in the
// reference's order: bitwise the reference's results at any thread count.
template <typename F>
void ForEachPlane(const Conv2dDims& d, int64_t cost_per_plane, F&& plane) {
  ParallelFor(d.batch * d.channels, ChunkRows(cost_per_plane), [&](int64_t begin, int64_t end) {
    for (int64_t k = begin; k < end; ++k) plane(k);
  });
}

// Calls window(i, j, rows, cols, offset) for every output pixel: its window's taps inside the
// image are rows [rows.lo, rows.hi) × cols [cols.lo, cols.hi) of the window, and tap (p, q) reads
// the plane at offset + p·W + q.
template <typename F>
void ForEachWindow(const Conv2dDims& d, F&& window) {
  for (int64_t i = 0; i < d.out_h; ++i) {
    const int64_t r0 = InRow(d, i, 0);
    const Span rows{std::max<int64_t>(0, -r0), std::min(d.kernel_h, d.height - r0)};
    for (int64_t j = 0; j < d.out_w; ++j) {
      const int64_t s0 = InCol(d, j, 0);
      const Span cols{std::max<int64_t>(0, -s0), std::min(d.kernel_w, d.width - s0)};
      window(i * d.out_w + j, rows, cols, r0 * d.width + s0);
    }
  }
}

template <typename T>
void MaxPool2dFast(const T* x, T* y, const Conv2dDims& d) {
  const int64_t image = d.height * d.width, pixels = d.out_h * d.out_w;
  ForEachPlane(d, pixels * d.kernel_h * d.kernel_w, [&](int64_t k) {
    const T* plane = x + k * image;
    T* out = y + k * pixels;
    ForEachWindow(d, [&](int64_t o, Span rows, Span cols, int64_t at) {
      T best = -std::numeric_limits<T>::infinity();
      for (int64_t p = rows.lo; p < rows.hi; ++p) {
        const T* row = plane + (at + p * d.width);
        for (int64_t q = cols.lo; q < cols.hi; ++q) best = std::max(best, row[q]);
      }
      out[o] = best;
    });
  });
}

template <typename T>
void MaxPool2dGradFast(const T* dy, const T* x, T* dx, const Conv2dDims& d) {
  const int64_t image = d.height * d.width, pixels = d.out_h * d.out_w;
  ForEachPlane(d, image + pixels * d.kernel_h * d.kernel_w, [&](int64_t k) {
    const T* plane = x + k * image;
    const T* g = dy + k * pixels;
    T* grad = dx + k * image;
    std::fill_n(grad, image, T(0));
    ForEachWindow(d, [&](int64_t o, Span rows, Span cols, int64_t at) {
      // The first largest element in row-major order (a later one must be strictly larger); a
      // window always holds one element of the image (padding is at most half the window).
      int64_t arg = at + rows.lo * d.width + cols.lo;
      T best = plane[arg];
      for (int64_t p = rows.lo; p < rows.hi; ++p) {
        const int64_t row = at + p * d.width;
        for (int64_t q = cols.lo; q < cols.hi; ++q) {
          if (plane[row + q] > best) {
            best = plane[row + q];
            arg = row + q;
          }
        }
      }
      grad[arg] += g[o];
    });
  });
}

template <typename T>
void AvgPool2dFast(const T* x, T* y, const Conv2dDims& d) {
  const T scale = T(1) / static_cast<T>(d.kernel_h * d.kernel_w);
  const int64_t image = d.height * d.width, pixels = d.out_h * d.out_w;
  ForEachPlane(d, pixels * d.kernel_h * d.kernel_w, [&](int64_t k) {
    const T* plane = x + k * image;
    T* out = y + k * pixels;
    ForEachWindow(d, [&](int64_t o, Span rows, Span cols, int64_t at) {
      T sum = 0;
      for (int64_t p = rows.lo; p < rows.hi; ++p) {
        const T* row = plane + (at + p * d.width);
        for (int64_t q = cols.lo; q < cols.hi; ++q) sum += row[q];
      }
      out[o] = sum * scale;
    });
  });
}

template <typename T>
void AvgPool2dGradFast(const T* dy, T* dx, const Conv2dDims& d) {
  const T scale = T(1) / static_cast<T>(d.kernel_h * d.kernel_w);
  const int64_t image = d.height * d.width, pixels = d.out_h * d.out_w;
  ForEachPlane(d, image + pixels * d.kernel_h * d.kernel_w, [&](int64_t k) {
    const T* g = dy + k * pixels;
    T* grad = dx + k * image;
    std::fill_n(grad, image, T(0));
    ForEachWindow(d, [&](int64_t o, Span rows, Span cols, int64_t at) {
      const T v = g[o] * scale;
      for (int64_t p = rows.lo; p < rows.hi; ++p) {
        T* row = grad + (at + p * d.width);
        for (int64_t q = cols.lo; q < cols.hi; ++q) row[q] += v;
      }
    });
  });
}

template void Conv2dReference<float>(const float*, const float*, float*, const Conv2dDims&);
template void Conv2dFast<float>(const float*, const float*, float*, const Conv2dDims&, float*);
template void Conv2dGradInputReference<float>(const float*, const float*, float*,
                                              const Conv2dDims&);
template void Conv2dGradInputFast<float>(const float*, const float*, float*, const Conv2dDims&,
                                         float*);
template void Conv2dGradWeightReference<float>(const float*, const float*, float*,
                                               const Conv2dDims&);
template void Conv2dGradWeightFast<float>(const float*, const float*, float*, const Conv2dDims&,
                                          float*);
template void MaxPool2dReference<float>(const float*, float*, const Conv2dDims&);
template void MaxPool2dGradReference<float>(const float*, const float*, float*, const Conv2dDims&);
template void AvgPool2dReference<float>(const float*, float*, const Conv2dDims&);
template void AvgPool2dGradReference<float>(const float*, float*, const Conv2dDims&);
template void MaxPool2dFast<float>(const float*, float*, const Conv2dDims&);
template void MaxPool2dGradFast<float>(const float*, const float*, float*, const Conv2dDims&);
template void AvgPool2dFast<float>(const float*, float*, const Conv2dDims&);
template void AvgPool2dGradFast<float>(const float*, float*, const Conv2dDims&);
template void Conv2dReference<double>(const double*, const double*, double*, const Conv2dDims&);
template void Conv2dFast<double>(const double*, const double*, double*, const Conv2dDims&, double*);
template void Conv2dGradInputReference<double>(const double*, const double*, double*,
                                               const Conv2dDims&);
template void Conv2dGradInputFast<double>(const double*, const double*, double*, const Conv2dDims&,
                                          double*);
template void Conv2dGradWeightReference<double>(const double*, const double*, double*,
                                                const Conv2dDims&);
template void Conv2dGradWeightFast<double>(const double*, const double*, double*, const Conv2dDims&,
                                           double*);
template void MaxPool2dReference<double>(const double*, double*, const Conv2dDims&);
template void MaxPool2dGradReference<double>(const double*, const double*, double*,
                                             const Conv2dDims&);
template void AvgPool2dReference<double>(const double*, double*, const Conv2dDims&);
template void AvgPool2dGradReference<double>(const double*, double*, const Conv2dDims&);
template void MaxPool2dFast<double>(const double*, double*, const Conv2dDims&);
template void MaxPool2dGradFast<double>(const double*, const double*, double*, const Conv2dDims&);
template void AvgPool2dFast<double>(const double*, double*, const Conv2dDims&);
template void AvgPool2dGradFast<double>(const double*, double*, const Conv2dDims&);

}  // namespace sluice::kernels
