// Test data for the bf16 and oneDNN kernel tests (tests/kernels/bf16_test.cc,
// tests/kernels/onednn_epilogue_test.cc): seeded uniform floats, and floats rounded to bf16 with
// their exact f32 values kept beside the bf16 numbers.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "sluice/core/dtype.h"
#include "sluice/kernels/bf16_convert.h"

namespace sluice::testing_support {

// n floats drawn uniformly from [-scale, scale) with a fixed seed.
inline std::vector<float> Uniform(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = dist(rng);
  return v;
}

// x rounded to bf16: returns the bf16 numbers and leaves their exact f32 values in x.
inline std::vector<BFloat16> RoundToBF16(std::vector<float>& x) {
  std::vector<BFloat16> out(x.size());
  const auto n = static_cast<int64_t>(x.size());
  kernels::ToBF16Reference(x.data(), out.data(), n);
  kernels::FromBF16Reference(out.data(), x.data(), n);
  return out;
}

}  // namespace sluice::testing_support
