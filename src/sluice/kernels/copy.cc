#include "sluice/kernels/copy.h"

#include <cstring>

namespace sluice::kernels {

namespace {

// Axes with size 1 dropped and neighbours merged where both tensors are contiguous across them.
struct CopyPlan {
  int rank = 0;
  int64_t dims[kMaxRank] = {};
  int64_t src_stride[kMaxRank] = {}, dst_stride[kMaxRank] = {};
};

CopyPlan PlanCopy(const Tensor& src, const Tensor& dst) {
  CopyPlan p;
  const Shape& s = src.shape();
  for (int d = 0; d < s.rank(); ++d) {
    if (s[d] == 1) continue;
    const int last = p.rank - 1;
    const int64_t ss = src.strides()[d], ds = dst.strides()[d];
    if (last >= 0 && p.src_stride[last] == ss * s[d] && p.dst_stride[last] == ds * s[d]) {
      p.dims[last] *= s[d];
      p.src_stride[last] = ss;
      p.dst_stride[last] = ds;
    } else {
      p.dims[p.rank] = s[d];
      p.src_stride[p.rank] = ss;
      p.dst_stride[p.rank] = ds;
      ++p.rank;
    }
  }
  return p;
}

// One row of n elements of kBytes each, with strides in elements. The fixed-size memcpy is a
// single move (and reads the bytes without breaking type-based aliasing rules).
template <size_t kBytes>
void StridedRow(const char* src, int64_t src_stride, char* dst, int64_t dst_stride, int64_t n) {
  const int64_t ss = src_stride * static_cast<int64_t>(kBytes),
                ds = dst_stride * static_cast<int64_t>(kBytes);
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * ds, src + i * ss, kBytes);
}

}  // namespace

void CopyStrided(const Tensor& src, const Tensor& dst) {
  SLUICE_CHECK(src.shape() == dst.shape() && src.dtype() == dst.dtype(), "copy of {}{} into {}{}",
               Name(src.dtype()), src.shape().ToString(), Name(dst.dtype()),
               dst.shape().ToString());
  if (src.numel() == 0) return;
  const size_t elem = SizeOf(src.dtype());
  const char* ps = static_cast<const char*>(src.raw_data());
  char* pd = static_cast<char*>(dst.raw_data());
  const CopyPlan p = PlanCopy(src, dst);
  if (p.rank == 0) {  // a single element
    std::memcpy(pd, ps, elem);
    return;
  }
  const int inner = p.rank - 1;
  const int64_t n = p.dims[inner];
  const bool rows = p.src_stride[inner] == 1 && p.dst_stride[inner] == 1;
  auto copy_row = [&](const char* s, char* d) {
    if (rows) {
      std::memcpy(d, s, static_cast<size_t>(n) * elem);
      return;
    }
    switch (elem) {
      case 2:
        StridedRow<2>(s, p.src_stride[inner], d, p.dst_stride[inner], n);
        break;
      case 4:
        StridedRow<4>(s, p.src_stride[inner], d, p.dst_stride[inner], n);
        break;
      case 8:
        StridedRow<8>(s, p.src_stride[inner], d, p.dst_stride[inner], n);
        break;
      default:
        SLUICE_CHECK(false, "no strided copy for elements of {} bytes", elem);
    }
  };
  int64_t index[kMaxRank] = {};
  int64_t offset_s = 0, offset_d = 0;  // in elements
  for (int64_t done = 0, total = src.numel(); done < total; done += n) {
    copy_row(ps + offset_s * static_cast<int64_t>(elem),
             pd + offset_d * static_cast<int64_t>(elem));
    for (int d = inner - 1; d >= 0; --d) {  // advance the outer multi-index
      offset_s += p.src_stride[d];
      offset_d += p.dst_stride[d];
      if (++index[d] < p.dims[d]) break;
      offset_s -= p.src_stride[d] * p.dims[d];
      offset_d -= p.dst_stride[d] * p.dims[d];
      index[d] = 0;
    }
  }
}

}  // namespace sluice::kernels
