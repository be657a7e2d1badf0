#include "sluice/kernels/embedding.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "sluice/core/error.h"
#include "sluice/kernels/parallel.h"

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
  ParallelFor(n, ChunkRows(c), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const int64_t id = static_cast<int64_t>(ids[i]);
      CheckIndex("embedding id", id, i, vocab);
      std::memcpy(out + i * c, table + id * c, static_cast<size_t>(c) * sizeof(T));
    }
  });
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
  for (int64_t i = 0; i < n; ++i) {
    CheckIndex("embedding_grad id", static_cast<int64_t>(ids[i]), i, vocab);
  }
  // Chunks of columns: each owns dtable[:, c0:c1) and adds the rows in order, so every element
  // sums the same values in the same order at any thread count. 64 columns per chunk at most
  // (whole vectors), fewer when few rows make a column cheap.
  const int64_t columns = std::clamp<int64_t>(ChunkRows(n) / 16 * 16, 16, 64);
  ParallelFor(c, columns, [&](int64_t c0, int64_t c1) {
    for (int64_t k = 0; k < vocab; ++k) std::fill(dtable + k * c + c0, dtable + k * c + c1, T(0));
    for (int64_t i = 0; i < n; ++i) {
      T* __restrict row = dtable + static_cast<int64_t>(ids[i]) * c;
      const T* __restrict d = dy + i * c;
      for (int64_t j = c0; j < c1; ++j) row[j] += d[j];
    }
  });
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
