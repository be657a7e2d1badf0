// Accumulation kernels on contiguous vectors: the two loops of summing and averaging gradients
// over micro-batches (nn/optimizer.h's GradientAccumulator).
//
//   Axpy          y[i] += alpha · x[i]     for i in [0, n)
//   ScaleInPlace  x[i] *= alpha            for i in [0, n)
//
// *Reference: one plain loop each. *Blas: CBLAS saxpy/daxpy and sscal/dscal (OpenBLAS vectorizes
// and, for long vectors, threads them), called in pieces of at most INT_MAX elements since CBLAS
// counts in int. Both give bitwise the reference's results for alpha = 1 (Axpy) and for every
// alpha (ScaleInPlace): each element is one rounded operation either way.
//
// x and y must not overlap. n may be 0.
// Thread-safety: plain functions over caller-owned memory; concurrent calls on disjoint outputs
// are safe. Failure modes: none.
//
// Example:
//   kernels::AxpyBlas<float>(grad, sum, n, 1.0f);        // sum += grad
//   kernels::ScaleInPlaceBlas<float>(sum, n, 1.0f / M);  // the mean over M micro-batches
#pragma once

#include <cstdint>

namespace sluice::kernels {

template <typename T>
void AxpyReference(const T* x, T* y, int64_t n, T alpha);
template <typename T>
void AxpyBlas(const T* x, T* y, int64_t n, T alpha);

template <typename T>
void ScaleInPlaceReference(T* x, int64_t n, T alpha);
template <typename T>
void ScaleInPlaceBlas(T* x, int64_t n, T alpha);

}  // namespace sluice::kernels
