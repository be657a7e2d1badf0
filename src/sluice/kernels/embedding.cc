#include "sluice/kernels/embedding.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "sluice/core/error.h"

namespace sluice::kernels {

void CheckIndex(const char* what, int64_t id, int64_t position, int64_t vocab) {
  if (id < 0 || id >= vocab) [[unlikely]] {
    throw InvalidArgument(
        fmt::format("{} {} at position {} is out of range: vocab = {} (valid: 0 to {})", what, id,
                    position, vocab, vocab - 1));
  }
}

template <typename T, typename I>
void EmbeddingReference(const I* ids, const T* table, T* out, int64_t n, int64_t vocab, int64_t c) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = static_cast<int64_t>(ids[i]);
    CheckIndex("embedding id", id, i, vocab);
    for (int64_t j = 0; j < c; ++j) out[i * c + j] = table[id * c + j];
  }
}

template <typename T, typename I>
void EmbeddingFast(const I* ids, const T* table, T* out, int64_t n, int64_t vocab, int64_t c) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = static_cast<int64_t>(ids[i]);
    CheckIndex("embedding id", id, i, vocab);
    std::memcpy(out + i * c, table + id * c, static_cast<size_t>(c) * sizeof(T));
  }
}

template <typename T, typename I>
void EmbeddingGradReference(const I* ids, const T* dy, T* dtable, int64_t n, int64_t vocab,
                            int64_t c) {
  for (int64_t k = 0; k < vocab * c; ++k) dtable[k] = T(0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = static_cast<int64_t>(ids[i]);
    CheckIndex("embedding_grad id", id, i, vocab);
    for (int64_t j = 0; j < c; ++j) dtable[id * c + j] += dy[i * c + j];
  }
}

template <typename T, typename I>
void EmbeddingGradFast(const I* ids, const T* dy, T* dtable, int64_t n, int64_t vocab, int64_t c) {
  std::fill_n(dtable, vocab * c, T(0));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t id = static_cast<int64_t>(ids[i]);
    CheckIndex("embedding_grad id", id, i, vocab);
    T* __restrict row = dtable + id * c;
    const T* __restrict d = dy + i * c;
    for (int64_t j = 0; j < c; ++j) row[j] += d[j];
  }
}

template void EmbeddingReference<float, int32_t>(const int32_t*, const float*, float*, int64_t,
                                                 int64_t, int64_t);
template void EmbeddingReference<float, int64_t>(const int64_t*, const float*, float*, int64_t,
                                                 int64_t, int64_t);
template void EmbeddingReference<double, int32_t>(const int32_t*, const double*, double*, int64_t,
                                                  int64_t, int64_t);
template void EmbeddingReference<double, int64_t>(const int64_t*, const double*, double*, int64_t,
                                                  int64_t, int64_t);
template void EmbeddingFast<float, int32_t>(const int32_t*, const float*, float*, int64_t, int64_t,
                                            int64_t);
template void EmbeddingFast<float, int64_t>(const int64_t*, const float*, float*, int64_t, int64_t,
                                            int64_t);
template void EmbeddingFast<double, int32_t>(const int32_t*, const double*, double*, int64_t,
                                             int64_t, int64_t);
template void EmbeddingFast<double, int64_t>(const int64_t*, const double*, double*, int64_t,
                                             int64_t, int64_t);
template void EmbeddingGradReference<float, int32_t>(const int32_t*, const float*, float*, int64_t,
                                                     int64_t, int64_t);
template void EmbeddingGradReference<float, int64_t>(const int64_t*, const float*, float*, int64_t,
                                                     int64_t, int64_t);
template void EmbeddingGradReference<double, int32_t>(const int32_t*, const double*, double*,
                                                      int64_t, int64_t, int64_t);
template void EmbeddingGradReference<double, int64_t>(const int64_t*, const double*, double*,
                                                      int64_t, int64_t, int64_t);
template void EmbeddingGradFast<float, int32_t>(const int32_t*, const float*, float*, int64_t,
                                                int64_t, int64_t);
template void EmbeddingGradFast<float, int64_t>(const int64_t*, const float*, float*, int64_t,
                                                int64_t, int64_t);
template void EmbeddingGradFast<double, int32_t>(const int32_t*, const double*, double*, int64_t,
                                                 int64_t, int64_t);
template void EmbeddingGradFast<double, int64_t>(const int64_t*, const double*, double*, int64_t,
                                                 int64_t, int64_t);

}  // namespace sluice::kernels
