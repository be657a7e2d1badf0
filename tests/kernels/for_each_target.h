// ForEachTarget(body): runs body once per SIMD target this machine runs (kernels/simd_kernels.h's
// SimdTargets, best first), that target forced for every runtime-dispatched kernel, then restores
// the default — for tests that hold a fast kernel to its reference on every target.
#pragma once

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "sluice/kernels/simd_kernels.h"

namespace sluice::kernels {

template <typename F>
void ForEachTarget(F&& body) {
  const std::vector<std::string> targets = SimdTargets();
  ASSERT_FALSE(targets.empty());
  for (const std::string& t : targets) {
    ForceSimdTarget(t);
    ASSERT_EQ(SimdTarget(), t) << "forcing a target changes the dispatch";
    SCOPED_TRACE("target " + t);
    body();
  }
  ForceSimdTarget("");
  EXPECT_EQ(SimdTarget(), targets.front()) << "the default is the best target";
}

}  // namespace sluice::kernels
