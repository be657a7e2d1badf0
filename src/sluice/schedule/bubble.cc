#include "sluice/schedule/bubble.h"

#include <algorithm>

#include "sluice/core/error.h"

namespace sluice::pipeline {

Bubble BubbleOf(std::span<const double> end, std::span<const double> busy) {
  SLUICE_CHECK(!end.empty() && end.size() == busy.size(),
               "a bubble needs an end and a busy time per rank, got {} and {}", end.size(),
               busy.size());
  const int P = static_cast<int>(end.size());
  Bubble b;
  b.makespan = *std::ranges::max_element(end);
  b.idle.resize(end.size());
  b.share.resize(end.size());
  double idle = 0;
  for (size_t r = 0; r < end.size(); ++r) {
    b.idle[r] = b.makespan - busy[r];
    b.share[r] = b.makespan > 0 ? b.idle[r] / b.makespan : 0;
    idle += b.idle[r];
  }
  b.total = b.makespan > 0 ? idle / (P * b.makespan) : 0;
  return b;
}

}  // namespace sluice::pipeline
