// The sum every backend's AllReduceSum computes (communicator.h): element by element, the ranks'
// contributions added in rank order 0, 1, …, size − 1, so that every rank of every backend gets
// bitwise the same result.
//
// Thread-safety: a pure function of its arguments. Failure: InternalError for a dtype that is not
// f32, f64, i32 or i64 (the Communicator checks this before a backend runs).
//
// Example (two ranks' f32 contributions of 3 elements):
//   const void* sources[] = {a.raw_data(), b.raw_data()};
//   SumInRankOrder(DType::kF32, sources, /*n=*/3, out.raw_data());   // out[i] = a[i] + b[i]
#pragma once

#include <cstdint>
#include <span>

#include "sluice/core/dtype.h"

namespace sluice {

// out[i] = sources[0][i] + sources[1][i] + … for i in [0, n), added in that order. `out` may be
// one of the sources: each element is read from every source before it is written.
void SumInRankOrder(DType dtype, std::span<const void* const> sources, int64_t n, void* out);

}  // namespace sluice
