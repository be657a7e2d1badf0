// ReadyQueue: the queue hands out each index once, to the members of a ThreadPool.
#include "sluice/exec/ready_queue.h"

#include <atomic>
#include <vector>

#include <gtest/gtest.h>

#include "sluice/core/error.h"
#include "sluice/core/thread_pool.h"

namespace sluice {
namespace {

TEST(ReadyQueue, HandsOutEachIndexOnceThenStops) {
  constexpr int kItems = 1000;
  ReadyQueue q(kItems);
  ThreadPool pool(4);
  std::vector<std::atomic<int>> taken(kItems);
  std::atomic<int> done{0};
  pool.RunOnAll([&](int member) {
    if (member == 0) {
      for (int i = 0; i < kItems; ++i) q.Push(i);
    }
    for (int32_t i = q.Pop(); i >= 0; i = q.Pop()) {
      taken[i].fetch_add(1);
      if (done.fetch_add(1) + 1 == kItems) q.Stop();
    }
  });
  for (int i = 0; i < kItems; ++i) EXPECT_EQ(taken[i].load(), 1) << i;
  EXPECT_TRUE(q.stopped());
  EXPECT_EQ(q.Pop(), -1);
  q.Reset();
  q.Push(7);
  EXPECT_EQ(q.Pop(), 7);
  EXPECT_THROW(for (int i = 0; i <= kItems; ++i) q.Push(i), InternalError);
}

}  // namespace
}  // namespace sluice
