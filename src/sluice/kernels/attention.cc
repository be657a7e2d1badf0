#include "sluice/kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "sluice/kernels/matmul.h"
#include "sluice/kernels/parallel.h"
#include "sluice/kernels/simd_kernels.h"

namespace sluice::kernels {

namespace {

template <typename T>
T Dot(const T* a, const T* b, int64_t n) {
  T s = 0;
  for (int64_t c = 0; c < n; ++c) s += a[c] * b[c];
  return s;
}

// One batch entry's [T, D] matrix in a layout: row i at base + i·stride.
template <typename T>
struct Rows {
  T* base;
  int64_t stride;
  T* operator[](int64_t i) const { return base + i * stride; }
};

template <typename T>
Rows<T> EntryRows(T* p, const AttentionLayout& l, int64_t e) {
  return {p + l.Offset(e), l.row_stride};
}

// Row i of the reference: s[j] = scale·q[i]·k[j] for j ≤ i into `s`; returns lse[i].
template <typename T>
T ScoresAndLse(Rows<const T> q, Rows<const T> k, int64_t i, int64_t d, T scale, T* s) {
  T m = -std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j <= i; ++j) {
    s[j] = scale * Dot(q[i], k[j], d);
    m = std::max(m, s[j]);
  }
  T sum = 0;
  for (int64_t j = 0; j <= i; ++j) sum += std::exp(s[j] - m);
  return m + std::log(sum);
}

// The visible keys of query row i in the key tile starting at k0 with kt keys: 0 … kt.
int64_t Visible(int64_t i, int64_t k0, int64_t kt) {
  return std::clamp<int64_t>(i - k0 + 1, 0, kt);
}

}  // namespace

template <typename T>
void CausalAttentionReference(const T* q, const T* k, const T* v, T* y, T* lse, int64_t batch,
                              int64_t t, int64_t d, T scale, const AttentionLayout& in,
                              const AttentionLayout& out) {
  std::vector<T> s(static_cast<size_t>(t));
  for (int64_t b = 0; b < batch; ++b) {
    const Rows<const T> qb = EntryRows(q, in, b), kb = EntryRows(k, in, b),
                        vb = EntryRows(v, in, b);
    const Rows<T> yb = EntryRows(y, out, b);
    for (int64_t i = 0; i < t; ++i) {
      const T l = ScoresAndLse(qb, kb, i, d, scale, s.data());
      lse[b * t + i] = l;
      T* yi = yb[i];
      std::fill_n(yi, d, T(0));
      for (int64_t j = 0; j <= i; ++j) {
        const T p = std::exp(s[j] - l);
        for (int64_t c = 0; c < d; ++c) yi[c] += p * vb[j][c];
      }
    }
  }
}

template <typename T>
void CausalAttentionGradReference(const T* dy, const T* dlse, const T* q, const T* k, const T* v,
                                  const T* y, const T* lse, T* dq, T* dk, T* dv, int64_t batch,
                                  int64_t t, int64_t d, T scale, const AttentionLayout& in,
                                  const AttentionLayout& out) {
  std::vector<T> s(static_cast<size_t>(t));
  for (int64_t b = 0; b < batch; ++b) {
    const Rows<const T> qb = EntryRows(q, in, b), kb = EntryRows(k, in, b),
                        vb = EntryRows(v, in, b);
    const Rows<const T> dyb = EntryRows(dy, out, b), yb = EntryRows(y, out, b);
    const Rows<T> dqb = EntryRows(dq, in, b), dkb = EntryRows(dk, in, b),
                  dvb = EntryRows(dv, in, b);
    for (int64_t i = 0; i < t; ++i) {
      std::fill_n(dqb[i], d, T(0));
      std::fill_n(dkb[i], d, T(0));
      std::fill_n(dvb[i], d, T(0));
    }
    for (int64_t i = 0; i < t; ++i) {
      const T* dyi = dyb[i];
      ScoresAndLse(qb, kb, i, d, scale, s.data());  // s[j]; lse is the saved one
      const T l = lse[b * t + i];
      // Σ_j p·dp = dy[i]·y[i]; a gradient reaching lse adds p·dlse to ds.
      const T row = Dot(dyi, yb[i], d) - (dlse ? dlse[b * t + i] : T(0));
      for (int64_t j = 0; j <= i; ++j) {
        const T p = std::exp(s[j] - l);
        const T dp = Dot(dyi, vb[j], d);
        const T ds = p * (dp - row);
        for (int64_t c = 0; c < d; ++c) {
          dqb[i][c] += scale * ds * kb[j][c];
          dkb[j][c] += scale * ds * qb[i][c];
          dvb[j][c] += p * dyi[c];
        }
      }
    }
  }
}

template <typename T>
void CausalAttentionFast(const T* q, const T* k, const T* v, T* y, T* lse, int64_t batch, int64_t t,
                         int64_t d, T scale, const AttentionLayout& in,
                         const AttentionLayout& out) {
  const SimdRowKernels<T>& simd = Simd<T>();
  constexpr int64_t kT = kAttentionTile;
  const int64_t ld = in.row_stride, ldy = out.row_stride;
  // One chunk per batch entry (a head of a sequence): each writes only its own y and lse.
  ParallelFor(batch, 1, [&](int64_t b_begin, int64_t b_end) {
    std::vector<T> s(kT * kT), row_max(kT), row_sum(kT);
    for (int64_t b = b_begin; b < b_end; ++b) {
      const T *qb = q + in.Offset(b), *kb = k + in.Offset(b), *vb = v + in.Offset(b);
      T* yb = y + out.Offset(b);
      for (int64_t q0 = 0; q0 < t; q0 += kT) {
        const int64_t qt = std::min(kT, t - q0);
        T* o = yb + q0 * ldy;  // [qt, d] rows ldy apart: the running, unnormalised output
        for (int64_t r = 0; r < qt; ++r) std::fill_n(o + r * ldy, d, T(0));
        std::fill_n(row_max.begin(), qt, -std::numeric_limits<T>::infinity());
        std::fill_n(row_sum.begin(), qt, T(0));
        for (int64_t k0 = 0; k0 < q0 + qt; k0 += kT) {  // key tiles up to the diagonal
          const int64_t kt = std::min(kT, t - k0);
          // s = scale · q[q0 : q0+qt] · k[k0 : k0+kt]ᵀ   [qt, kt]
          Gemm(false, true, qt, kt, d, scale, qb + q0 * ld, ld, kb + k0 * ld, ld, T(0), s.data(),
               kt);
          for (int64_t r = 0; r < qt; ++r) {
            T* sr = s.data() + r * kt;
            const int64_t n = Visible(q0 + r, k0, kt);
            std::fill(sr + n, sr + kt, T(0));  // keys after the query: p = 0
            if (n == 0) continue;
            // Online softmax: a larger max rescales what the row has summed so far.
            const T m = std::max(row_max[r], simd.row_max(sr, n));
            const T rescale = std::exp(row_max[r] - m);  // 0 on the first tile (max was −inf)
            row_sum[r] = row_sum[r] * rescale + simd.exp_sum(sr, m, sr, n);
            row_max[r] = m;
            if (rescale != T(1)) simd.scale_in_place(o + r * ldy, rescale, d);
          }
          // o += p · v[k0 : k0+kt]   [qt, d]
          Gemm(false, false, qt, d, kt, T(1), s.data(), kt, vb + k0 * ld, ld, T(1), o, ldy);
        }
        for (int64_t r = 0; r < qt; ++r) {
          simd.scale_in_place(o + r * ldy, T(1) / row_sum[r], d);
          lse[b * t + q0 + r] = row_max[r] + std::log(row_sum[r]);
        }
      }
    }
  });
}

template <typename T>
void CausalAttentionGradFast(const T* dy, const T* dlse, const T* q, const T* k, const T* v,
                             const T* y, const T* lse, T* dq, T* dk, T* dv, int64_t batch,
                             int64_t t, int64_t d, T scale, const AttentionLayout& in,
                             const AttentionLayout& out) {
  const SimdRowKernels<T>& simd = Simd<T>();
  constexpr int64_t kT = kAttentionTile;
  const int64_t ld = in.row_stride, ldy = out.row_stride;
  // One chunk per batch entry: each writes only its own dq, dk, dv.
  ParallelFor(batch, 1, [&](int64_t b_begin, int64_t b_end) {
    std::vector<T> p(kT * kT), ds(kT * kT), row(static_cast<size_t>(t));
    for (int64_t b = b_begin; b < b_end; ++b) {
      const int64_t at = in.Offset(b), at_y = out.Offset(b);
      const T *qb = q + at, *kb = k + at, *vb = v + at, *dyb = dy + at_y, *yb = y + at_y;
      T *dqb = dq + at, *dkb = dk + at, *dvb = dv + at;
      for (int64_t i = 0; i < t; ++i) {
        std::fill_n(dqb + i * ld, d, T(0));
        std::fill_n(dkb + i * ld, d, T(0));
        std::fill_n(dvb + i * ld, d, T(0));
      }
      // row[i] = dy[i]·y[i] − dlse[i]: what softmax backward subtracts from dp on row i.
      for (int64_t i = 0; i < t; ++i) {
        row[i] = simd.row_dot(dyb + i * ldy, yb + i * ldy, d) - (dlse ? dlse[b * t + i] : T(0));
      }
      for (int64_t q0 = 0; q0 < t; q0 += kT) {
        const int64_t qt = std::min(kT, t - q0);
        for (int64_t k0 = 0; k0 < q0 + qt; k0 += kT) {
          const int64_t kt = std::min(kT, t - k0);
          // p = e^(s − lse), recomputed from q, k and the saved lse   [qt, kt]
          Gemm(false, true, qt, kt, d, scale, qb + q0 * ld, ld, kb + k0 * ld, ld, T(0), p.data(),
               kt);
          for (int64_t r = 0; r < qt; ++r) {
            T* pr = p.data() + r * kt;
            const int64_t n = Visible(q0 + r, k0, kt);
            simd.exp_sum(pr, lse[b * t + q0 + r], pr, n);
            std::fill(pr + n, pr + kt, T(0));
          }
          // dv[k0 …] += pᵀ · dy[q0 …]   [kt, d]
          Gemm(true, false, kt, d, qt, T(1), p.data(), kt, dyb + q0 * ldy, ldy, T(1), dvb + k0 * ld,
               ld);
          // dp = dy[q0 …] · v[k0 …]ᵀ   [qt, kt], then ds = p · (dp − row)
          Gemm(false, true, qt, kt, d, T(1), dyb + q0 * ldy, ldy, vb + k0 * ld, ld, T(0), ds.data(),
               kt);
          for (int64_t r = 0; r < qt; ++r) {
            simd.softmax_grad_row(p.data() + r * kt, ds.data() + r * kt, row[q0 + r],
                                  ds.data() + r * kt, kt);
          }
          // dq[q0 …] += scale · ds · k[k0 …];  dk[k0 …] += scale · dsᵀ · q[q0 …]
          Gemm(false, false, qt, d, kt, scale, ds.data(), kt, kb + k0 * ld, ld, T(1), dqb + q0 * ld,
               ld);
          Gemm(true, false, kt, d, qt, scale, ds.data(), kt, qb + q0 * ld, ld, T(1), dkb + k0 * ld,
               ld);
        }
      }
    }
  });
}

// The contiguous [batch, T, D] forms.
template <typename T>
void CausalAttentionReference(const T* q, const T* k, const T* v, T* y, T* lse, int64_t batch,
                              int64_t t, int64_t d, T scale) {
  const AttentionLayout l = AttentionLayout::Contiguous(t, d);
  CausalAttentionReference(q, k, v, y, lse, batch, t, d, scale, l, l);
}

template <typename T>
void CausalAttentionFast(const T* q, const T* k, const T* v, T* y, T* lse, int64_t batch, int64_t t,
                         int64_t d, T scale) {
  const AttentionLayout l = AttentionLayout::Contiguous(t, d);
  CausalAttentionFast(q, k, v, y, lse, batch, t, d, scale, l, l);
}

template <typename T>
void CausalAttentionGradReference(const T* dy, const T* dlse, const T* q, const T* k, const T* v,
                                  const T* y, const T* lse, T* dq, T* dk, T* dv, int64_t batch,
                                  int64_t t, int64_t d, T scale) {
  const AttentionLayout l = AttentionLayout::Contiguous(t, d);
  CausalAttentionGradReference(dy, dlse, q, k, v, y, lse, dq, dk, dv, batch, t, d, scale, l, l);
}

template <typename T>
void CausalAttentionGradFast(const T* dy, const T* dlse, const T* q, const T* k, const T* v,
                             const T* y, const T* lse, T* dq, T* dk, T* dv, int64_t batch,
                             int64_t t, int64_t d, T scale) {
  const AttentionLayout l = AttentionLayout::Contiguous(t, d);
  CausalAttentionGradFast(dy, dlse, q, k, v, y, lse, dq, dk, dv, batch, t, d, scale, l, l);
}

template void CausalAttentionReference<float>(const float*, const float*, const float*, float*,
                                              float*, int64_t, int64_t, int64_t, float);
template void CausalAttentionFast<float>(const float*, const float*, const float*, float*, float*,
                                         int64_t, int64_t, int64_t, float);
template void CausalAttentionReference<float>(const float*, const float*, const float*, float*,
                                              float*, int64_t, int64_t, int64_t, float,
                                              const AttentionLayout&, const AttentionLayout&);
template void CausalAttentionFast<float>(const float*, const float*, const float*, float*, float*,
                                         int64_t, int64_t, int64_t, float, const AttentionLayout&,
                                         const AttentionLayout&);
template void CausalAttentionGradReference<float>(const float*, const float*, const float*,
                                                  const float*, const float*, const float*,
                                                  const float*, float*, float*, float*, int64_t,
                                                  int64_t, int64_t, float);
template void CausalAttentionGradFast<float>(const float*, const float*, const float*, const float*,
                                             const float*, const float*, const float*, float*,
                                             float*, float*, int64_t, int64_t, int64_t, float);
template void CausalAttentionGradReference<float>(const float*, const float*, const float*,
                                                  const float*, const float*, const float*,
                                                  const float*, float*, float*, float*, int64_t,
                                                  int64_t, int64_t, float, const AttentionLayout&,
                                                  const AttentionLayout&);
template void CausalAttentionGradFast<float>(const float*, const float*, const float*, const float*,
                                             const float*, const float*, const float*, float*,
                                             float*, float*, int64_t, int64_t, int64_t, float,
                                             const AttentionLayout&, const AttentionLayout&);

template void CausalAttentionReference<double>(const double*, const double*, const double*, double*,
                                               double*, int64_t, int64_t, int64_t, double);
template void CausalAttentionFast<double>(const double*, const double*, const double*, double*,
                                          double*, int64_t, int64_t, int64_t, double);
template void CausalAttentionReference<double>(const double*, const double*, const double*, double*,
                                               double*, int64_t, int64_t, int64_t, double,
                                               const AttentionLayout&, const AttentionLayout&);
template void CausalAttentionFast<double>(const double*, const double*, const double*, double*,
                                          double*, int64_t, int64_t, int64_t, double,
                                          const AttentionLayout&, const AttentionLayout&);
template void CausalAttentionGradReference<double>(const double*, const double*, const double*,
                                                   const double*, const double*, const double*,
                                                   const double*, double*, double*, double*,
                                                   int64_t, int64_t, int64_t, double);
template void CausalAttentionGradFast<double>(const double*, const double*, const double*,
                                              const double*, const double*, const double*,
                                              const double*, double*, double*, double*, int64_t,
                                              int64_t, int64_t, double);
template void CausalAttentionGradReference<double>(const double*, const double*, const double*,
                                                   const double*, const double*, const double*,
                                                   const double*, double*, double*, double*,
                                                   int64_t, int64_t, int64_t, double,
                                                   const AttentionLayout&, const AttentionLayout&);
template void CausalAttentionGradFast<double>(const double*, const double*, const double*,
                                              const double*, const double*, const double*,
                                              const double*, double*, double*, double*, int64_t,
                                              int64_t, int64_t, double, const AttentionLayout&,
                                              const AttentionLayout&);

}  // namespace sluice::kernels
