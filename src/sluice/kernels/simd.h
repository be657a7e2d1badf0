// Vectorization helpers for elementwise kernels on contiguous buffers.
//
// The project builds at -O2, where GCC vectorizes only loops whose vector code replaces the scalar
// loop entirely (the "very-cheap" cost model): a loop over an unknown count n is left scalar, and
// most floating-point compare-and-selects and every libm call keep a loop scalar. Two tools cover
// the kernels here:
//
//   ForEachBlocked(n, f)  runs f(i) for every i in [0, n) as blocks with a constant trip count, so
//                         plain arithmetic bodies (add, mul, relu, ...) vectorize at -O2. Use it
//                         with __restrict pointer parameters.
//   Vec<T>, MapVec        explicit GCC/Clang vector extensions (16 bytes: 4 floats or 2 doubles,
//                         the SSE2/NEON width every 64-bit target has) for bodies with selects and
//                         polynomials (exp, gelu); no intrinsics. (32-byte vectors would change
//                         the calling convention of every lambda taking one depending on -mavx,
//                         which GCC warns about.)
//
// Kernels that need more than the baseline vectors (AVX2, AVX-512) or vectorised transcendentals
// live in simd_kernels.h, dispatched at run time through Highway.
//
// MapVec handles the tail (n not a multiple of the lane count) by padding one vector, so every
// element goes through the same vector code and results do not depend on an element's position.
//
// Thread-safety: pure functions.
//
// Example:
//   void AddOne(const float* __restrict x, float* __restrict y, int64_t n) {
//     ForEachBlocked(n, [&](int64_t i) { y[i] = x[i] + 1.0f; });
//   }
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

// For helpers (and lambdas) that must be inlined into the kernel using them.
#define SLUICE_ALWAYS_INLINE __attribute__((always_inline))

namespace sluice::kernels {

// Iterations per block of ForEachBlocked: a multiple of every vector width up to 512 bits of f32.
inline constexpr int kBlock = 16;

template <typename F>
inline void ForEachBlocked(int64_t n, F&& f) {
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    for (int j = 0; j < kBlock; ++j) f(i + j);  // constant trip count: vectorized at -O2
  }
  for (; i < n; ++i) f(i);
}

// Vec<T>: a vector of 16 bytes of T (T = float or double); IVec<T>: the same-sized vector of signed
// integers of T's width, for bit manipulation. (GCC ignores vector_size on a dependent type, hence
// the explicit specializations.)
template <typename T>
struct VectorTypes;
template <>
struct VectorTypes<float> {
  typedef float Vec __attribute__((vector_size(16)));
  typedef int32_t IVec __attribute__((vector_size(16)));
};
template <>
struct VectorTypes<double> {
  typedef double Vec __attribute__((vector_size(16)));
  typedef int64_t IVec __attribute__((vector_size(16)));
};
template <typename T>
using Vec = typename VectorTypes<T>::Vec;
template <typename T>
using IVec = typename VectorTypes<T>::IVec;
template <typename T>
using IntOf = std::conditional_t<sizeof(T) == 4, int32_t, int64_t>;

template <typename T>
inline constexpr int kLanes = static_cast<int>(16 / sizeof(T));

template <typename T>
SLUICE_ALWAYS_INLINE inline Vec<T> Splat(T value) {
  return Vec<T>{} + value;
}

template <typename T>
SLUICE_ALWAYS_INLINE inline Vec<T> Load(const T* p) {
  Vec<T> v;
  std::memcpy(&v, p, sizeof(v));  // unaligned load
  return v;
}

template <typename T>
SLUICE_ALWAYS_INLINE inline void Store(T* p, Vec<T> v) {
  std::memcpy(p, &v, sizeof(v));
}

// y[i] = f(x[i]) for i in [0, n), f mapping Vec<T> -> Vec<T>.
template <typename T, typename F>
SLUICE_ALWAYS_INLINE inline void MapVec(const T* __restrict x, T* __restrict y, int64_t n, F&& f) {
  constexpr int kL = kLanes<T>;
  int64_t i = 0;
  for (; i + kL <= n; i += kL) Store(y + i, f(Load(x + i)));
  if (i < n) {
    T in[kL] = {}, out[kL];
    std::memcpy(in, x + i, static_cast<size_t>(n - i) * sizeof(T));
    Store(out, f(Load(in)));
    std::memcpy(y + i, out, static_cast<size_t>(n - i) * sizeof(T));
  }
}

// z[i] = f(x[i], y[i]) for i in [0, n).
template <typename T, typename F>
SLUICE_ALWAYS_INLINE inline void MapVec2(const T* __restrict x, const T* __restrict y,
                                         T* __restrict z, int64_t n, F&& f) {
  constexpr int kL = kLanes<T>;
  int64_t i = 0;
  for (; i + kL <= n; i += kL) Store(z + i, f(Load(x + i), Load(y + i)));
  if (i < n) {
    T in_x[kL] = {}, in_y[kL] = {}, out[kL];
    std::memcpy(in_x, x + i, static_cast<size_t>(n - i) * sizeof(T));
    std::memcpy(in_y, y + i, static_cast<size_t>(n - i) * sizeof(T));
    Store(out, f(Load(in_x), Load(in_y)));
    std::memcpy(z + i, out, static_cast<size_t>(n - i) * sizeof(T));
  }
}

}  // namespace sluice::kernels
