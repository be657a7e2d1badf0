// SwiGLU, the gated unit of Llama-style MLPs, fused: y = silu(a) · b = a·σ(a) · b, elementwise on
// two buffers of n elements (any shape flattened: a, b, y, dy, da, db are all [N]; in a model
// a = x·W1ᵀ and b = x·W3ᵀ, both [B, T, hidden]). Backward recomputes σ(a) from a:
//
//   da = dy · b · σ(a)·(1 + a·(1 − σ(a)))      db = dy · silu(a)
//
// so the forward keeps a and b alone, where silu(a) followed by a mul keeps a, silu(a) and b.
// *Reference is the formula with std::exp, one element at a time; *Fast takes e^−a from the SIMD
// exp (simd_kernels.h) in blocks and runs the blocks on the intra-op threads (parallel.h). T is
// float or double; explicit instantiations live in swiglu.cc.
//
// Outputs must not overlap inputs (but see SwigluBlock). Thread-safety: pure functions of their
// inputs.
//
// Example:
//   kernels::SwigluFast<float>(a, b, y, B * T * hidden);
#pragma once

#include <cstdint>

namespace sluice::kernels {

// y = silu(a) · b.
template <typename T>
void SwigluReference(const T* a, const T* b, T* y, int64_t n);
template <typename T>
void SwigluFast(const T* a, const T* b, T* y, int64_t n);

// da = dy · b · silu'(a), db = dy · silu(a).
template <typename T>
void SwigluGradReference(const T* dy, const T* a, const T* b, T* da, T* db, int64_t n);
template <typename T>
void SwigluGradFast(const T* dy, const T* a, const T* b, T* da, T* db, int64_t n);

// The fast kernels' work on one block of m <= kSwigluBlock elements, on the calling thread: the
// bf16 kernels (bf16_llama.h) run it on blocks they widened, so that they meet the f32 kernels'
// arithmetic exactly. Here y may alias a or b.
inline constexpr int64_t kSwigluBlock = 256;
template <typename T>
void SwigluBlock(const T* a, const T* b, T* y, int64_t m);
template <typename T>
void SwigluGradBlock(const T* dy, const T* a, const T* b, T* da, T* db, int64_t m);

}  // namespace sluice::kernels
