#include "sluice/kernels/conv.h"

#include <algorithm>
#include <limits>

#include "sluice/kernels/matmul.h"

namespace sluice::kernels {

Conv2dDims Conv2dShape(int64_t batch, int64_t channels, int64_t height, int64_t width,
                       int64_t out_channels, int64_t kernel_h, int64_t kernel_w,
                       std::array<int64_t, 2> stride, std::array<int64_t, 2> padding) {
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
               .pad_w = padding[1]};
  const int64_t span_h = height + 2 * d.pad_h - kernel_h, span_w = width + 2 * d.pad_w - kernel_w;
  d.out_h = span_h < 0 ? 0 : span_h / d.stride_h + 1;
  d.out_w = span_w < 0 ? 0 : span_w / d.stride_w + 1;
  return d;
}

int64_t Conv2dColsElements(const Conv2dDims& d) {
  return d.channels * d.kernel_h * d.kernel_w * d.out_h * d.out_w;
}

namespace {

// The input row (column) that output row i (column j) reads at tap p (q); outside [0, H) it is
// padding.
inline int64_t InRow(const Conv2dDims& d, int64_t i, int64_t p) {
  return i * d.stride_h - d.pad_h + p;
}
inline int64_t InCol(const Conv2dDims& d, int64_t j, int64_t q) {
  return j * d.stride_w - d.pad_w + q;
}

// cols [C·KH·KW, OH·OW] of one image x [C, H, W]: row (c, p, q) holds, for every output pixel,
// the input it reads at that tap (0 in the padding).
template <typename T>
void Im2Col(const T* x, T* cols, const Conv2dDims& d) {
  const int64_t pixels = d.out_h * d.out_w;
  for (int64_t c = 0; c < d.channels; ++c) {
    const T* plane = x + c * d.height * d.width;
    for (int64_t p = 0; p < d.kernel_h; ++p) {
      for (int64_t q = 0; q < d.kernel_w; ++q) {
        T* row = cols + ((c * d.kernel_h + p) * d.kernel_w + q) * pixels;
        for (int64_t i = 0; i < d.out_h; ++i) {
          const int64_t r = InRow(d, i, p);
          T* out = row + i * d.out_w;
          if (r < 0 || r >= d.height) {
            std::fill_n(out, d.out_w, T(0));
            continue;
          }
          for (int64_t j = 0; j < d.out_w; ++j) {
            const int64_t s = InCol(d, j, q);
            out[j] = s >= 0 && s < d.width ? plane[r * d.width + s] : T(0);
          }
        }
      }
    }
  }
}

// The transpose of Im2Col: dx [C, H, W] += each entry of cols at the input it was read from.
template <typename T>
void Col2ImAdd(const T* cols, T* dx, const Conv2dDims& d) {
  const int64_t pixels = d.out_h * d.out_w;
  for (int64_t c = 0; c < d.channels; ++c) {
    T* plane = dx + c * d.height * d.width;
    for (int64_t p = 0; p < d.kernel_h; ++p) {
      for (int64_t q = 0; q < d.kernel_w; ++q) {
        const T* row = cols + ((c * d.kernel_h + p) * d.kernel_w + q) * pixels;
        for (int64_t i = 0; i < d.out_h; ++i) {
          const int64_t r = InRow(d, i, p);
          if (r < 0 || r >= d.height) continue;
          for (int64_t j = 0; j < d.out_w; ++j) {
            const int64_t s = InCol(d, j, q);
            if (s >= 0 && s < d.width) plane[r * d.width + s] += row[i * d.out_w + j];
          }
        }
      }
    }
  }
}

int64_t XIndex(const Conv2dDims& d, int64_t b, int64_t c, int64_t r, int64_t s) {
  return ((b * d.channels + c) * d.height + r) * d.width + s;
}
int64_t YIndex(const Conv2dDims& d, int64_t b, int64_t o, int64_t i, int64_t j) {
  return ((b * d.out_channels + o) * d.out_h + i) * d.out_w + j;
}
int64_t WIndex(const Conv2dDims& d, int64_t o, int64_t c, int64_t p, int64_t q) {
  return ((o * d.channels + c) * d.kernel_h + p) * d.kernel_w + q;
}

}  // namespace

template <typename T>
void Conv2dReference(const T* x, const T* w, T* y, const Conv2dDims& d) {
  for (int64_t b = 0; b < d.batch; ++b) {
    for (int64_t o = 0; o < d.out_channels; ++o) {
      for (int64_t i = 0; i < d.out_h; ++i) {
        for (int64_t j = 0; j < d.out_w; ++j) {
          T sum = 0;
          for (int64_t c = 0; c < d.channels; ++c) {
            for (int64_t p = 0; p < d.kernel_h; ++p) {
              for (int64_t q = 0; q < d.kernel_w; ++q) {
                const int64_t r = InRow(d, i, p), s = InCol(d, j, q);
                if (r < 0 || r >= d.height || s < 0 || s >= d.width) continue;
                sum += w[WIndex(d, o, c, p, q)] * x[XIndex(d, b, c, r, s)];
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
  const int64_t pixels = d.out_h * d.out_w, taps = d.channels * d.kernel_h * d.kernel_w;
  for (int64_t b = 0; b < d.batch; ++b) {
    Im2Col(x + b * d.channels * d.height * d.width, cols, d);
    // y_b [O, OH·OW] = w [O, C·KH·KW] · cols
    Gemm(false, false, d.out_channels, pixels, taps, T(1), w, cols, T(0),
         y + b * d.out_channels * pixels);
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
          for (int64_t c = 0; c < d.channels; ++c) {
            for (int64_t p = 0; p < d.kernel_h; ++p) {
              for (int64_t q = 0; q < d.kernel_w; ++q) {
                const int64_t r = InRow(d, i, p), s = InCol(d, j, q);
                if (r < 0 || r >= d.height || s < 0 || s >= d.width) continue;
                dx[XIndex(d, b, c, r, s)] += g * w[WIndex(d, o, c, p, q)];
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
  const int64_t pixels = d.out_h * d.out_w, taps = d.channels * d.kernel_h * d.kernel_w;
  const int64_t image = d.channels * d.height * d.width;
  std::fill_n(dx, d.batch * image, T(0));
  for (int64_t b = 0; b < d.batch; ++b) {
    // cols [C·KH·KW, OH·OW] = wᵀ · dy_b [O, OH·OW], then each tap back to its input pixel
    Gemm(true, false, taps, pixels, d.out_channels, T(1), w, dy + b * d.out_channels * pixels, T(0),
         cols);
    Col2ImAdd(cols, dx + b * image, d);
  }
}

template <typename T>
void Conv2dGradWeightReference(const T* dy, const T* x, T* dw, const Conv2dDims& d) {
  for (int64_t o = 0; o < d.out_channels; ++o) {
    for (int64_t c = 0; c < d.channels; ++c) {
      for (int64_t p = 0; p < d.kernel_h; ++p) {
        for (int64_t q = 0; q < d.kernel_w; ++q) {
          T sum = 0;
          for (int64_t b = 0; b < d.batch; ++b) {
            for (int64_t i = 0; i < d.out_h; ++i) {
              for (int64_t j = 0; j < d.out_w; ++j) {
                const int64_t r = InRow(d, i, p), s = InCol(d, j, q);
                if (r < 0 || r >= d.height || s < 0 || s >= d.width) continue;
                sum += dy[YIndex(d, b, o, i, j)] * x[XIndex(d, b, c, r, s)];
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
  const int64_t pixels = d.out_h * d.out_w, taps = d.channels * d.kernel_h * d.kernel_w;
  if (d.batch == 0) std::fill_n(dw, d.out_channels * taps, T(0));
  for (int64_t b = 0; b < d.batch; ++b) {
    Im2Col(x + b * d.channels * d.height * d.width, cols, d);
    // dw [O, C·KH·KW] (+)= dy_b [O, OH·OW] · colsᵀ
    Gemm(false, true, d.out_channels, taps, pixels, T(1), dy + b * d.out_channels * pixels, cols,
         b == 0 ? T(0) : T(1), dw);
  }
}

template <typename T>
void MaxPool2d(const T* x, T* y, const Conv2dDims& d) {
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
void MaxPool2dGrad(const T* dy, const T* x, T* dx, const Conv2dDims& d) {
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
void AvgPool2d(const T* x, T* y, const Conv2dDims& d) {
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
void AvgPool2dGrad(const T* dy, T* dx, const Conv2dDims& d) {
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
template void MaxPool2d<float>(const float*, float*, const Conv2dDims&);
template void MaxPool2dGrad<float>(const float*, const float*, float*, const Conv2dDims&);
template void AvgPool2d<float>(const float*, float*, const Conv2dDims&);
template void AvgPool2dGrad<float>(const float*, float*, const Conv2dDims&);
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
template void MaxPool2d<double>(const double*, double*, const Conv2dDims&);
template void MaxPool2dGrad<double>(const double*, const double*, double*, const Conv2dDims&);
template void AvgPool2d<double>(const double*, double*, const Conv2dDims&);
template void AvgPool2dGrad<double>(const double*, double*, const Conv2dDims&);

}  // namespace sluice::kernels
