#include "sluice/kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

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

// The keys query i sees: [0, i] when causal, all T otherwise.
template <typename T>
int64_t KeyCount(const AttentionMask<T>& mask, int64_t i, int64_t t) {
  return mask.causal ? i + 1 : t;
}

// Row i of the reference: s[j] = scale·q[i]·k[j] (+ bias[j]) for the n keys it sees into `s`;
// returns lse[i], −inf when every key is hidden (bias −inf).
template <typename T>
T ScoresAndLse(Rows<const T> q, Rows<const T> k, const T* bias, int64_t i, int64_t n, int64_t d,
               T scale, T* s) {
  T m = -std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j < n; ++j) {
    s[j] = scale * Dot(q[i], k[j], d);
    if (bias) s[j] += bias[j];
    m = std::max(m, s[j]);
  }
  if (m == -std::numeric_limits<T>::infinity()) return m;
  T sum = 0;
  for (int64_t j = 0; j < n; ++j) sum += std::exp(s[j] - m);
  return m + std::log(sum);
}

// The visible keys of query row i in the key tile starting at k0 with kt keys: 0 … kt.
template <typename T>
int64_t Visible(const AttentionMask<T>& mask, int64_t i, int64_t k0, int64_t kt) {
  return mask.causal ? std::clamp<int64_t>(i - k0 + 1, 0, kt) : kt;
}

// The shift of an online softmax row whose largest score so far is m: m, or 0 while every score
// is −inf (a hidden key), so that e^(s − shift) is 0 rather than e^(−inf + inf).
template <typename T>
T Shift(T m) {
  return m == -std::numeric_limits<T>::infinity() ? T(0) : m;
}

}  // namespace

template <typename T>
void AttentionReference(const T* q, const T* k, const T* v, T* y, T* lse, int64_t batch, int64_t t,
                        int64_t d, T scale, const AttentionLayouts& l,
                        const AttentionMask<T>& mask) {
  std::vector<T> s(static_cast<size_t>(t));
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t f = b / l.group;  // the key/value entry query entry b reads
    const Rows<const T> qb = EntryRows(q, l.q, b), kb = EntryRows(k, l.kv, f),
                        vb = EntryRows(v, l.kv, f);
    const Rows<T> yb = EntryRows(y, l.y, b);
    const T* bias = mask.BiasRow(b, t);
    for (int64_t i = 0; i < t; ++i) {
      const int64_t n = KeyCount(mask, i, t);
      // A query that sees no key gets e^(−inf + inf): NaN, as a softmax over −inf scores.
      const T lse_i = ScoresAndLse(qb, kb, bias, i, n, d, scale, s.data());
      lse[b * t + i] = lse_i;
      T* yi = yb[i];
      std::fill_n(yi, d, T(0));
      for (int64_t j = 0; j < n; ++j) {
        const T p = std::exp(s[j] - lse_i);
        for (int64_t c = 0; c < d; ++c) yi[c] += p * vb[j][c];
      }
    }
  }
}

template <typename T>
void AttentionGradReference(const T* dy, const T* dlse, const T* q, const T* k, const T* v,
                            const T* y, const T* lse, T* dq, T* dk, T* dv, int64_t batch, int64_t t,
                            int64_t d, T scale, const AttentionLayouts& l,
                            const AttentionMask<T>& mask) {
  std::vector<T> s(static_cast<size_t>(t));
  for (int64_t f = 0; f < batch / l.group; ++f) {  // dk, dv sum over the group: zero them first
    const Rows<T> dkf = EntryRows(dk, l.kv, f), dvf = EntryRows(dv, l.kv, f);
    for (int64_t i = 0; i < t; ++i) {
      std::fill_n(dkf[i], d, T(0));
      std::fill_n(dvf[i], d, T(0));
    }
  }
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t f = b / l.group;
    const Rows<const T> qb = EntryRows(q, l.q, b), kb = EntryRows(k, l.kv, f),
                        vb = EntryRows(v, l.kv, f);
    const Rows<const T> dyb = EntryRows(dy, l.y, b), yb = EntryRows(y, l.y, b);
    const Rows<T> dqb = EntryRows(dq, l.q, b), dkb = EntryRows(dk, l.kv, f),
                  dvb = EntryRows(dv, l.kv, f);
    const T* bias = mask.BiasRow(b, t);
    for (int64_t i = 0; i < t; ++i) std::fill_n(dqb[i], d, T(0));
    for (int64_t i = 0; i < t; ++i) {
      const T* dyi = dyb[i];
      const int64_t n = KeyCount(mask, i, t);
      ScoresAndLse(qb, kb, bias, i, n, d, scale, s.data());  // s[j]; lse is the saved one
      const T lse_i = lse[b * t + i];
      // Σ_j p·dp = dy[i]·y[i]; a gradient reaching lse adds p·dlse to ds.
      const T row = Dot(dyi, yb[i], d) - (dlse ? dlse[b * t + i] : T(0));
      for (int64_t j = 0; j < n; ++j) {
        const T p = std::exp(s[j] - lse_i);
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

// The fast kernels walk query tiles of kQ rows; each tile meets the keys up to its diagonal in
// chunks of at most kK. The products are small ([kQ, D] by [D, ≤ kK] and back) and go through
// the SIMD small-product kernel (simd_kernels.h), which reads one operand by broadcasts from
// wherever it lies and the other by rows: kᵀ and vᵀ are copied once per head into [D, T] rows
// (T·D floats of scratch), every other operand is read in place.

// The calling thread's scratch, at least n elements, kept from call to call: ParallelFor calls
// the kernels once per batch entry, and a fresh vector each time cost an allocation and a zeroing
// pass per head (page faults too, past malloc's mmap threshold). It grows to the largest
// T·D the thread has met: 2·T·D + T + 2·kQ·kK elements, 1.1 MB at T = 1024, D = 128.
template <typename T>
T* Scratch(size_t n) {
  thread_local std::vector<T> buffer;
  if (buffer.size() < n) buffer.resize(n);
  return buffer.data();
}

template <typename T>
void AttentionFast(const T* q, const T* k, const T* v, T* y, T* lse, int64_t batch, int64_t t,
                   int64_t d, T scale, const AttentionLayouts& l, const AttentionMask<T>& mask) {
  const SimdRowKernels<T>& simd = Simd<T>();
  constexpr int64_t kQ = kAttentionQueryTile, kK = kAttentionKeyChunk;
  const int64_t ldq = l.q.row_stride, ld = l.kv.row_stride, ldy = l.y.row_stride;
  // One chunk per key/value entry (a key/value head of a sequence) and its group of query
  // entries: each writes only its own y and lse, and kᵀ is copied once per key/value head.
  ParallelFor(batch / l.group, 1, [&](int64_t f_begin, int64_t f_end) {
    const int64_t width = std::min(kK, t);  // the widest key chunk
    T* s = Scratch<T>(static_cast<size_t>(kQ * width + 2 * kQ + d * t));
    T *row_max = s + kQ * width, *row_sum = row_max + kQ, *kt_rows = row_sum + kQ;
    for (int64_t f = f_begin; f < f_end; ++f) {
      const T *kb = k + l.kv.Offset(f), *vb = v + l.kv.Offset(f);
      simd.transpose(kb, ld, t, d, kt_rows, t);
      for (int64_t b = f * l.group; b < (f + 1) * l.group; ++b) {
        const T* qb = q + l.q.Offset(b);
        const T* bias = mask.BiasRow(b, t);
        T* yb = y + l.y.Offset(b);
        for (int64_t q0 = 0; q0 < t; q0 += kQ) {
          const int64_t qt = std::min(kQ, t - q0);
          const int64_t keys = mask.causal ? q0 + qt : t;  // keys [0, keys) are visible
          T* o = yb + q0 * ldy;  // [qt, d] rows ldy apart: the running, unnormalised output
          for (int64_t k0 = 0; k0 < keys; k0 += kK) {
            const int64_t kt = std::min(kK, keys - k0);
            // s = scale · q[q0 : q0+qt] · k[k0 : k0+kt]ᵀ   [qt, kt]
            simd.small_gemm(qt, kt, d, scale, qb + q0 * ldq, ldq, 1, kt_rows + k0, t, T(0), s, kt);
            for (int64_t r = 0; r < qt; ++r) {
              T* sr = s + r * kt;
              if (bias) simd.add(sr, bias + k0, sr, kt);
              const int64_t n = Visible(mask, q0 + r, k0, kt);  // ≥ 1: chunks start ≤ q0
              std::fill(sr + n, sr + kt, T(0));                 // keys after the query: p = 0
              if (k0 == 0) {
                row_max[r] = simd.row_max(sr, n);
                row_sum[r] = simd.exp_sum(sr, Shift(row_max[r]), sr, n);
                continue;
              }
              // Online softmax: a larger max rescales what the row has summed so far (nothing
              // while every key so far was hidden).
              const T m = std::max(row_max[r], simd.row_max(sr, n));
              const T rescale = row_max[r] == -std::numeric_limits<T>::infinity()
                                    ? T(0)
                                    : std::exp(row_max[r] - m);
              row_sum[r] = row_sum[r] * rescale + simd.exp_sum(sr, Shift(m), sr, n);
              row_max[r] = m;
              if (rescale != T(1)) simd.scale_in_place(o + r * ldy, rescale, d);
            }
            // o = p · v[k0 : k0+kt] on the first chunk, o += on the next   [qt, d]
            simd.small_gemm(qt, d, kt, T(1), s, kt, 1, vb + k0 * ld, ld, T(k0 == 0 ? 0 : 1), o,
                            ldy);
          }
          for (int64_t r = 0; r < qt; ++r) {
            if (row_sum[r] == T(0)) {  // every key hidden: NaN, as a softmax over −inf scores
              std::fill_n(o + r * ldy, d, std::numeric_limits<T>::quiet_NaN());
              lse[b * t + q0 + r] = -std::numeric_limits<T>::infinity();
              continue;
            }
            simd.scale_in_place(o + r * ldy, T(1) / row_sum[r], d);
            lse[b * t + q0 + r] = row_max[r] + std::log(row_sum[r]);
          }
        }
      }
    }
  });
}

template <typename T>
void AttentionGradFast(const T* dy, const T* dlse, const T* q, const T* k, const T* v, const T* y,
                       const T* lse, T* dq, T* dk, T* dv, int64_t batch, int64_t t, int64_t d,
                       T scale, const AttentionLayouts& l, const AttentionMask<T>& mask) {
  const SimdRowKernels<T>& simd = Simd<T>();
  constexpr int64_t kQ = kAttentionQueryTile, kK = kAttentionKeyChunk;
  const int64_t ldq = l.q.row_stride, ld = l.kv.row_stride, ldy = l.y.row_stride;
  // One chunk per key/value entry, its query entries one after the other: each chunk writes only
  // its own dq and its own dk, dv (which sum over the group).
  ParallelFor(batch / l.group, 1, [&](int64_t f_begin, int64_t f_end) {
    const int64_t width = std::min(kK, t);  // the widest key chunk
    T* p = Scratch<T>(static_cast<size_t>(2 * kQ * width + t + 2 * d * t));
    T *ds = p + kQ * width, *row = ds + kQ * width, *kt_rows = row + t, *vt_rows = kt_rows + d * t;
    for (int64_t f = f_begin; f < f_end; ++f) {
      const T *kb = k + l.kv.Offset(f), *vb = v + l.kv.Offset(f);
      T *dkb = dk + l.kv.Offset(f), *dvb = dv + l.kv.Offset(f);
      simd.transpose(kb, ld, t, d, kt_rows, t);
      simd.transpose(vb, ld, t, d, vt_rows, t);
      for (int64_t b = f * l.group; b < (f + 1) * l.group; ++b) {
        const T *qb = q + l.q.Offset(b), *dyb = dy + l.y.Offset(b), *yb = y + l.y.Offset(b);
        T* dqb = dq + l.q.Offset(b);
        const T* bias = mask.BiasRow(b, t);
        // row[i] = dy[i]·y[i] − dlse[i]: what softmax backward subtracts from dp on row i.
        for (int64_t i = 0; i < t; ++i) {
          row[i] = simd.row_dot(dyb + i * ldy, yb + i * ldy, d) - (dlse ? dlse[b * t + i] : T(0));
        }
        // Query tiles from the last: it sees every key, so the group's first query entry writes
        // dk and dv there (beta 0) and every later product adds to them — no pass zeroes dq, dk,
        // dv first.
        const int64_t last = (t - 1) / kQ * kQ;
        for (int64_t q0 = last; q0 >= 0; q0 -= kQ) {
          const int64_t qt = std::min(kQ, t - q0), keys = mask.causal ? q0 + qt : t;
          // beta of the dk, dv products
          const T overwrite = q0 == last && b == f * l.group ? T(0) : T(1);
          for (int64_t k0 = 0; k0 < keys; k0 += kK) {
            const int64_t kt = std::min(kK, keys - k0);
            // p = e^(s − lse), recomputed from q, k and the saved lse   [qt, kt]
            simd.small_gemm(qt, kt, d, scale, qb + q0 * ldq, ldq, 1, kt_rows + k0, t, T(0), p, kt);
            for (int64_t r = 0; r < qt; ++r) {
              T* pr = p + r * kt;
              if (bias) simd.add(pr, bias + k0, pr, kt);
              const int64_t n = Visible(mask, q0 + r, k0, kt);
              simd.exp_sum(pr, lse[b * t + q0 + r], pr, n);
              std::fill(pr + n, pr + kt, T(0));
            }
            // dv[k0 …] (+)= pᵀ · dy[q0 …]   [kt, d]
            simd.small_gemm(kt, d, qt, T(1), p, 1, kt, dyb + q0 * ldy, ldy, overwrite,
                            dvb + k0 * ld, ld);
            // dp = dy[q0 …] · v[k0 …]ᵀ   [qt, kt], then ds = p · (dp − row)
            simd.small_gemm(qt, kt, d, T(1), dyb + q0 * ldy, ldy, 1, vt_rows + k0, t, T(0), ds, kt);
            for (int64_t r = 0; r < qt; ++r) {
              simd.softmax_grad_row(p + r * kt, ds + r * kt, row[q0 + r], ds + r * kt, kt);
            }
            // dq[q0 …] (+)= scale · ds · k[k0 …];  dk[k0 …] (+)= scale · dsᵀ · q[q0 …]
            simd.small_gemm(qt, d, kt, scale, ds, kt, 1, kb + k0 * ld, ld, T(k0 == 0 ? 0 : 1),
                            dqb + q0 * ldq, ldq);
            simd.small_gemm(kt, d, qt, scale, ds, 1, kt, qb + q0 * ldq, ldq, overwrite,
                            dkb + k0 * ld, ld);
          }
        }
      }
    }
  });
}

// The contiguous [batch, T, D] causal forms.
template <typename T>
void CausalAttentionReference(const T* q, const T* k, const T* v, T* y, T* lse, int64_t batch,
                              int64_t t, int64_t d, T scale) {
  AttentionReference(q, k, v, y, lse, batch, t, d, scale, AttentionLayouts::Contiguous(t, d, 1));
}

template <typename T>
void CausalAttentionFast(const T* q, const T* k, const T* v, T* y, T* lse, int64_t batch, int64_t t,
                         int64_t d, T scale) {
  AttentionFast(q, k, v, y, lse, batch, t, d, scale, AttentionLayouts::Contiguous(t, d, 1));
}

template <typename T>
void CausalAttentionGradReference(const T* dy, const T* dlse, const T* q, const T* k, const T* v,
                                  const T* y, const T* lse, T* dq, T* dk, T* dv, int64_t batch,
                                  int64_t t, int64_t d, T scale) {
  AttentionGradReference(dy, dlse, q, k, v, y, lse, dq, dk, dv, batch, t, d, scale,
                         AttentionLayouts::Contiguous(t, d, 1));
}

template <typename T>
void CausalAttentionGradFast(const T* dy, const T* dlse, const T* q, const T* k, const T* v,
                             const T* y, const T* lse, T* dq, T* dk, T* dv, int64_t batch,
                             int64_t t, int64_t d, T scale) {
  AttentionGradFast(dy, dlse, q, k, v, y, lse, dq, dk, dv, batch, t, d, scale,
                    AttentionLayouts::Contiguous(t, d, 1));
}

template void CausalAttentionReference<float>(const float*, const float*, const float*, float*,
                                              float*, int64_t, int64_t, int64_t, float);
template void CausalAttentionFast<float>(const float*, const float*, const float*, float*, float*,
                                         int64_t, int64_t, int64_t, float);
template void CausalAttentionGradReference<float>(const float*, const float*, const float*,
                                                  const float*, const float*, const float*,
                                                  const float*, float*, float*, float*, int64_t,
                                                  int64_t, int64_t, float);
template void CausalAttentionGradFast<float>(const float*, const float*, const float*, const float*,
                                             const float*, const float*, const float*, float*,
                                             float*, float*, int64_t, int64_t, int64_t, float);
template void AttentionReference<float>(const float*, const float*, const float*, float*, float*,
                                        int64_t, int64_t, int64_t, float, const AttentionLayouts&,
                                        const AttentionMask<float>&);
template void AttentionFast<float>(const float*, const float*, const float*, float*, float*,
                                   int64_t, int64_t, int64_t, float, const AttentionLayouts&,
                                   const AttentionMask<float>&);
template void AttentionGradReference<float>(const float*, const float*, const float*, const float*,
                                            const float*, const float*, const float*, float*,
                                            float*, float*, int64_t, int64_t, int64_t, float,
                                            const AttentionLayouts&, const AttentionMask<float>&);
template void AttentionGradFast<float>(const float*, const float*, const float*, const float*,
                                       const float*, const float*, const float*, float*, float*,
                                       float*, int64_t, int64_t, int64_t, float,
                                       const AttentionLayouts&, const AttentionMask<float>&);

template void CausalAttentionReference<double>(const double*, const double*, const double*, double*,
                                               double*, int64_t, int64_t, int64_t, double);
template void CausalAttentionFast<double>(const double*, const double*, const double*, double*,
                                          double*, int64_t, int64_t, int64_t, double);
template void CausalAttentionGradReference<double>(const double*, const double*, const double*,
                                                   const double*, const double*, const double*,
                                                   const double*, double*, double*, double*,
                                                   int64_t, int64_t, int64_t, double);
template void CausalAttentionGradFast<double>(const double*, const double*, const double*,
                                              const double*, const double*, const double*,
                                              const double*, double*, double*, double*, int64_t,
                                              int64_t, int64_t, double);
template void AttentionReference<double>(const double*, const double*, const double*, double*,
                                         double*, int64_t, int64_t, int64_t, double,
                                         const AttentionLayouts&, const AttentionMask<double>&);
template void AttentionFast<double>(const double*, const double*, const double*, double*, double*,
                                    int64_t, int64_t, int64_t, double, const AttentionLayouts&,
                                    const AttentionMask<double>&);
template void AttentionGradReference<double>(const double*, const double*, const double*,
                                             const double*, const double*, const double*,
                                             const double*, double*, double*, double*, int64_t,
                                             int64_t, int64_t, double, const AttentionLayouts&,
                                             const AttentionMask<double>&);
template void AttentionGradFast<double>(const double*, const double*, const double*, const double*,
                                        const double*, const double*, const double*, double*,
                                        double*, double*, int64_t, int64_t, int64_t, double,
                                        const AttentionLayouts&, const AttentionMask<double>&);

}  // namespace sluice::kernels
