// Collective tests of the in-process backend (LocalWorld): the barrier orders phases, the
// all-reduce sums in rank order and leaves bitwise-equal results on every rank, and abort,
// timeouts and collectives called differently on two ranks end in clear errors on every rank.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "comm/rank_threads.h"
#include "sluice/comm/local.h"

namespace sluice {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;
using testing::RankAllocators;
using testing::RunRanks;

TEST(LocalCollective, BarrierSeparatesPhases) {
  constexpr int kRanks = 4, kRounds = 50;
  LocalWorld world(kRanks, {.timeout = std::chrono::seconds(30)});
  std::atomic<int> arrivals{0};
  RunRanks(world, [&](int rank) {
    for (int round = 0; round < kRounds; ++round) {
      arrivals.fetch_add(1);
      world.comm(rank).Barrier();
      // Everyone has arrived at this round's first barrier, and nobody has passed its second.
      EXPECT_EQ(arrivals.load(), kRanks * (round + 1));
      world.comm(rank).Barrier();
    }
  });
  EXPECT_EQ(arrivals.load(), kRanks * kRounds);
}

// Rank r's contribution: element i is a value whose f32 sums depend on the order of addition.
double Contribution(int rank, int64_t i) { return (rank + 1) * 0.1 + i * 1e-3 + 1.0 / (3 + rank); }

template <typename T>
Tensor Filled(const Shape& shape, int rank, Allocator& allocator) {
  std::vector<T> values(shape.numel());
  for (int64_t i = 0; i < shape.numel(); ++i) {
    values[i] = static_cast<T>(IsInteger(DTypeOf<T>()) ? 1000 * rank + i : Contribution(rank, i));
  }
  return Tensor::FromVector<T>(shape, values, allocator);
}

// The sum a plain loop gets by adding the contributions in rank order in T.
template <typename T>
Tensor ExpectedSum(const Shape& shape, int ranks) {
  std::vector<Tensor> inputs;
  for (int r = 0; r < ranks; ++r) inputs.push_back(Filled<T>(shape, r, DefaultAllocator()));
  std::vector<T> values(shape.numel());
  for (int64_t i = 0; i < shape.numel(); ++i) {
    T acc = inputs[0].data<T>()[i];
    for (int r = 1; r < ranks; ++r) acc += inputs[r].data<T>()[i];
    values[i] = acc;
  }
  return Tensor::FromVector<T>(shape, values);
}

template <typename T>
void CheckAllReduce(const Shape& shape) {
  constexpr int kRanks = 4, kRounds = 3;
  SCOPED_TRACE(DescribeTensor(DTypeOf<T>(), shape));
  const Tensor expected = ExpectedSum<T>(shape, kRanks);
  RankAllocators alloc(kRanks);
  {
    LocalWorld world(kRanks, {.timeout = std::chrono::seconds(30)});
    RunRanks(world, [&](int rank) {
      for (int round = 0; round < kRounds; ++round) {
        Tensor t = Filled<T>(shape, rank, alloc[rank]);
        world.comm(rank).AllReduceSum(t);
        EXPECT_TRUE(BitwiseEqual(t, expected)) << "rank " << rank << " round " << round << ": "
                                               << t.ToString() << " vs " << expected.ToString();
      }
    });
  }
  alloc.ExpectAllFreed();
}

TEST(LocalCollective, AllReduceSumAcrossFourThreadsAddsInRankOrder) {
  // Sizes that split evenly, unevenly, into fewer elements than ranks, and not at all.
  for (const Shape& shape : {Shape{4, 33}, Shape{10}, Shape{3}, Shape{0}, Shape{}}) {
    CheckAllReduce<float>(shape);
    CheckAllReduce<double>(shape);
    CheckAllReduce<int32_t>(shape);
    CheckAllReduce<int64_t>(shape);
  }
}

TEST(LocalCollective, AllReduceSumOnOneRankLeavesTheTensor) {
  LocalWorld world(1);
  Tensor t = Tensor::FromVector<float>({3}, {1, 2, 3});
  world.comm(0).AllReduceSum(t);
  EXPECT_TRUE(BitwiseEqual(t, Tensor::FromVector<float>({3}, {1, 2, 3})));
}

// Ranks 0 and 1 enter `collective`; rank 2 aborts instead. Both must end with its reason.
void ExpectAbortWakes(const std::function<void(Communicator&)>& collective) {
  LocalWorld world(3, {.timeout = std::chrono::seconds(60)});
  std::atomic<int> woken{0};
  RunRanks(world, [&](int rank) {
    if (rank == 2) {
      world.comm(2).Abort("rank 2 ran out of memory");
      return;
    }
    try {
      collective(world.comm(rank));
      ADD_FAILURE() << "rank " << rank << ": expected CommAborted";
    } catch (const CommAborted& e) {
      EXPECT_EQ(e.aborting_rank(), 2);
      EXPECT_THAT(e.what(), HasSubstr("rank 2 aborted: rank 2 ran out of memory"));
      woken.fetch_add(1);
    }
  });
  EXPECT_EQ(woken.load(), 2);
}

TEST(LocalCollective, AbortWakesRanksBlockedInBarrier) {
  ExpectAbortWakes([](Communicator& c) { c.Barrier(); });
}

TEST(LocalCollective, AbortWakesRanksBlockedInAllReduce) {
  ExpectAbortWakes([](Communicator& c) { c.AllReduceSum(Tensor::Zeros({8}, DType::kF32)); });
}

TEST(LocalCollective, TimeoutNamesTheMissingRanksAndAbortsTheRest) {
  LocalWorld world(3);
  try {
    world.comm(0).Barrier(milliseconds(20));
    FAIL() << "expected CommTimeout";
  } catch (const CommTimeout& e) {
    EXPECT_THAT(e.what(),
                HasSubstr("rank 0: barrier timed out after 20 ms waiting for rank(s) 1, 2"));
  }
  try {
    world.comm(1).Barrier();
    FAIL() << "expected CommAborted";
  } catch (const CommAborted& e) {
    EXPECT_EQ(e.aborting_rank(), 0);
    EXPECT_THAT(e.what(), HasSubstr("rank 1: barrier refused: rank 0 aborted: rank 0: barrier "
                                    "timed out"));
  }
}

TEST(LocalCollective, CollectivesCalledDifferentlyFailOnEveryRank) {
  LocalWorld world(2, {.timeout = std::chrono::seconds(60)});
  std::atomic<int> failures{0};
  RunRanks(world, [&](int rank) {
    try {
      world.comm(rank).AllReduceSum(Tensor::Zeros({rank == 0 ? 4 : 8}, DType::kF32));
    } catch (const CommError& e) {
      // Whichever rank arrives second detects it; the other learns it from the abort.
      EXPECT_THAT(e.what(), HasSubstr("collective mismatch: rank"));
      EXPECT_THAT(e.what(), HasSubstr("all_reduce_sum of f32[4]"));
      EXPECT_THAT(e.what(), HasSubstr("all_reduce_sum of f32[8]"));
      failures.fetch_add(1);
    }
  });
  EXPECT_EQ(failures.load(), 2);
}

TEST(LocalCollective, AllReduceRejectsWhatItCannotSum) {
  LocalWorld world(1);
  Tensor x = Tensor::Zeros({2, 3}, DType::kF32);
  try {
    world.comm(0).AllReduceSum(x.Transpose(0, 1));
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank 0: all_reduce_sum of f32[3, 2]: the tensor must be "
                                    "contiguous"));
  }
  EXPECT_THROW(world.comm(0).AllReduceSum(Tensor::Zeros({2}, DType::kBF16)), InvalidArgument);
  EXPECT_THROW(world.comm(0).AllReduceSum(Tensor()), InvalidArgument);
  EXPECT_THROW(world.comm(0).Barrier(milliseconds(-5)), InvalidArgument);
}

// The non-blocking all-reduce: every rank posts two reductions before waiting on either (the
// interlocked steps' pattern, comm/communicator.h IallReduceSum); each gets the rank-order sum,
// bitwise AllReduceSum's, the n-th post of every rank reduced together.
TEST(LocalCollective, IallReduceSumMatchesTheNthPostsAndSumsInRankOrder) {
  constexpr int kRanks = 4;
  const Shape shape{5, 3};
  const Tensor expected = ExpectedSum<double>(shape, kRanks);
  RankAllocators alloc(kRanks);
  LocalWorld world(kRanks, {.timeout = std::chrono::seconds(30)});
  RunRanks(world, [&](int rank) {
    Communicator& comm = world.comm(rank);
    Tensor first = Filled<double>(shape, rank, alloc[rank]);
    Tensor second = Filled<double>(shape, rank, alloc[rank]);
    for (int64_t i = 0; i < second.numel(); ++i) second.data<double>()[i] *= 2;
    Request a = comm.IallReduceSum(first);
    Request b = comm.IallReduceSum(second);
    Tensor blocking = Filled<double>(shape, rank, alloc[rank]);
    comm.AllReduceSum(blocking);  // independent of the pending ones
    EXPECT_TRUE(BitwiseEqual(b.Wait(), second)) << "rank " << rank;
    EXPECT_TRUE(BitwiseEqual(a.Wait(), expected)) << "rank " << rank << ": " << first.ToString();
    EXPECT_TRUE(BitwiseEqual(blocking, expected)) << "rank " << rank;
    EXPECT_TRUE(a.Test());
    for (int64_t i = 0; i < second.numel(); ++i)
      EXPECT_EQ(second.data<double>()[i], 2 * expected.data<double>()[i]) << "rank " << rank;
  });
}

// A rank that never posts: the waiting ranks time out naming it, and the world is aborted.
TEST(LocalCollective, IallReduceSumTimesOutNamingTheRankThatDidNotPost) {
  LocalWorld world(3, {.timeout = milliseconds(200)});
  RankAllocators alloc(3);
  std::vector<std::string> errors(3);
  RunRanks(world, [&](int rank) {
    if (rank == 2) return;
    Tensor t = Tensor::Zeros({2}, DType::kF64, alloc[rank]);
    try {
      world.comm(rank).IallReduceSum(t).Wait();
    } catch (const CommError& e) {
      errors[rank] = e.what();
    }
  });
  const std::string both = errors[0] + errors[1];
  EXPECT_THAT(both, HasSubstr("iall_reduce_sum of f64[2] timed out"));
  EXPECT_THAT(both, HasSubstr("waiting for rank(s) 2"));
}

// Two ranks posting different shapes as their n-th reduction: a mismatch naming both.
TEST(LocalCollective, IallReduceSumOfDifferentShapesIsAMismatch) {
  LocalWorld world(2, {.timeout = std::chrono::seconds(10)});
  RankAllocators alloc(2);
  std::vector<std::string> errors(2);
  RunRanks(world, [&](int rank) {
    Tensor t = Tensor::Zeros({rank + 1}, DType::kF64, alloc[rank]);
    try {
      world.comm(rank).IallReduceSum(t).Wait();
    } catch (const CommError& e) {
      errors[rank] = e.what();
    }
  });
  EXPECT_THAT(errors[0] + errors[1], HasSubstr("collective mismatch"));
}

}  // namespace
}  // namespace sluice
