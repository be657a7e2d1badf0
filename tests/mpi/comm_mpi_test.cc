// Tests of the MPI backend (comm/mpi.h), run by CTest under mpirun with 2 and 4 processes: every
// process runs every test, in the same order, as one rank. Point-to-point (dtypes, non-contiguous
// tensors, matching order, mismatches, timeouts, dropped requests, memory release on completion)
// and collectives (Barrier, bitwise AllReduceSum in rank order, Split). Only rank 0 prints the
// test progress; every rank prints its own failures, prefixed by its rank.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "sluice/comm/mpi.h"
#include "sluice/core/caching_allocator.h"

namespace sluice {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;

MpiWorld* g_mpi = nullptr;

Communicator& World() { return g_mpi->world(); }

// Rank r's contribution to element i of the all-reduce: magnitudes that differ by rank, so that
// adding in another order would round differently.
float Contribution(int r, int64_t i) {
  return static_cast<float>(std::sin(0.37 * static_cast<double>(i) + r) * std::pow(10.0, r % 4));
}

TEST(MpiP2P, F32AndI64TravelAroundTheRingAndToSelf) {
  Communicator& c = World();
  const int r = c.rank(), n = c.size(), next = (r + 1) % n, prev = (r + n - 1) % n;
  CachingAllocator alloc;
  {
    Request f = c.Irecv(prev, 0, DType::kF32, {2, 3}, alloc);
    Request i = c.Irecv(prev, 1, DType::kI64, {5}, alloc);
    Request self = c.Irecv(r, 2, DType::kI64, {1}, alloc);
    Request sf =
        c.Isend(Tensor::FromVector<float>({2, 3}, {0, 1, 2, 3, 4, 5 + 0.5f * r}, alloc), next, 0);
    Request si =
        c.Isend(Tensor::FromVector<int64_t>({5}, {r, 1LL << 40, -r, 7, 8}, alloc), next, 1);
    c.Send(Tensor::FromVector<int64_t>({1}, {100 + r}, alloc), r, 2);
    Tensor x = f.Wait();
    ASSERT_EQ(x.shape(), Shape({2, 3}));
    EXPECT_EQ(x.At({1, 2}), 5 + 0.5 * prev);
    EXPECT_EQ(x.At({0, 1}), 1);
    Tensor y = i.Wait();
    EXPECT_EQ(y.data<int64_t>()[0], prev);
    EXPECT_EQ(y.data<int64_t>()[1], 1LL << 40);
    EXPECT_EQ(y.data<int64_t>()[2], -prev);
    EXPECT_EQ(self.Wait().data<int64_t>()[0], 100 + r);
    // Completion of a send is seen by polling this rank's MPI: wait for it before `alloc` (and
    // the storage the sends hold) goes out of scope.
    sf.Wait();
    si.Wait();
  }
  c.Barrier();
  EXPECT_EQ(alloc.Stats().allocated_bytes, 0);
}

TEST(MpiP2P, NonContiguousTensorIsSentInRowMajorOrder) {
  Communicator& c = World();
  const int r = c.rank(), n = c.size();
  CachingAllocator alloc;
  Request recv = c.Irecv((r + n - 1) % n, 3, DType::kF64, {3, 2}, alloc);
  // m = [[0, 1, 2], [3, 4, 5]] + 10r; its transpose is [[0, 3], [1, 4], [2, 5]] + 10r.
  Tensor m = Tensor::FromVector<double>({2, 3}, {0, 1, 2, 3, 4, 5}, alloc);
  for (int i = 0; i < 6; ++i) m.FlatSet(i, m.FlatAt(i) + 10 * r);
  Tensor t = m.Transpose(0, 1);
  ASSERT_FALSE(t.is_contiguous());
  c.Send(t, (r + 1) % n, 3);
  Tensor x = recv.Wait();
  const double base = 10.0 * ((r + n - 1) % n);
  const std::vector<double> want = {0, 3, 1, 4, 2, 5};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(x.FlatAt(i), base + want[i]) << "element " << i;
}

TEST(MpiP2P, MessagesMatchInOrderPerPeerAndTag) {
  constexpr int kTags = 3, kPerTag = 4;
  Communicator& c = World();
  CachingAllocator alloc;
  if (c.rank() == 0) {
    std::vector<Request> sends;
    for (int k = 0; k < kPerTag; ++k) {
      for (int tag = 0; tag < kTags; ++tag) {
        sends.push_back(c.Isend(Tensor::Full({4}, 100 * tag + k, DType::kF64, alloc), 1, tag));
      }
    }
    for (Request& s : sends) s.Wait();
  } else if (c.rank() == 1) {
    // Receives posted tag by tag, in reverse: each (peer, tag) is its own ordered channel.
    std::vector<std::vector<Request>> recvs(kTags);
    for (int tag = kTags - 1; tag >= 0; --tag) {
      for (int k = 0; k < kPerTag; ++k)
        recvs[tag].push_back(c.Irecv(0, tag, DType::kF64, {4}, alloc));
    }
    for (int tag = 0; tag < kTags; ++tag) {
      for (int k = kPerTag - 1; k >= 0; --k) {
        EXPECT_EQ(recvs[tag][k].Wait().FlatAt(3), 100 * tag + k) << "tag " << tag << " #" << k;
      }
    }
  }
  c.Barrier();
}

TEST(MpiP2P, DtypeOrShapeMismatchFailsBothSidesAndTheChannelStaysInStep) {
  Communicator& c = World();
  CachingAllocator alloc;
  if (c.rank() == 0) {
    Request wrong_dtype = c.Isend(Tensor::Zeros({4}, DType::kF32, alloc), 1, 7);
    Request too_long = c.Isend(Tensor::Zeros({8}, DType::kF32, alloc), 1, 7);
    Request right = c.Isend(Tensor::Full({4}, 2.5, DType::kF32, alloc), 1, 7);
    try {
      wrong_dtype.Wait();
      ADD_FAILURE() << "the send of a mismatched dtype completed";
    } catch (const CommError& e) {
      EXPECT_THAT(e.what(),
                  HasSubstr("rank 0 sent f32[4] with tag 7 but rank 1 expects i64[2, 2]"));
    }
    EXPECT_THROW(too_long.Wait(), CommError);
    EXPECT_EQ(too_long.state(), RequestState::kFailed);
    right.Wait();
  } else if (c.rank() == 1) {
    try {
      c.Recv(0, 7, DType::kI64, {2, 2}, alloc);
      ADD_FAILURE() << "the receive of a mismatched dtype completed";
    } catch (const CommError& e) {
      EXPECT_THAT(e.what(),
                  HasSubstr("rank 0 sent f32[4] with tag 7 but rank 1 expects i64[2, 2]"));
    }
    try {
      c.Recv(0, 7, DType::kF32, {4}, alloc);  // the sender's f32[8] does not fit
      ADD_FAILURE() << "the receive of a longer message completed";
    } catch (const CommError& e) {
      EXPECT_THAT(e.what(), HasSubstr("rank 0 sent f32[8] with tag 7 but rank 1 expects f32[4]"));
    }
    EXPECT_EQ(c.Recv(0, 7, DType::kF32, {4}, alloc).FlatAt(3), 2.5);
  }
  c.Barrier();
}

TEST(MpiP2P, WaitTimesOutNamingWhatIsMissingThenStillCompletes) {
  Communicator& c = World();
  CachingAllocator alloc;
  if (c.rank() == 0) {
    Request send = c.Isend(Tensor::Full({3}, 4.0, DType::kF32, alloc), 1, 4);
    try {
      send.Wait(milliseconds(50));
      ADD_FAILURE() << "a send without a receive completed";
    } catch (const CommTimeout& e) {
      // The peer by rank and host (issue 38: which machine to look at).
      EXPECT_THAT(e.what(), HasSubstr("rank 0: send f32[3] to rank 1 (tag 4) did not complete "
                                      "within 50 ms: rank 1 (host "));
      EXPECT_THAT(e.what(), HasSubstr(") has posted no receive for it"));
    }
    EXPECT_EQ(send.state(), RequestState::kPending);
    c.Barrier();
    send.Wait();
    c.Send(Tensor::Full({2}, 9.0, DType::kF32, alloc), 1, 5);
  } else {
    Request recv;
    if (c.rank() == 1) {
      recv = c.Irecv(0, 5, DType::kF32, {2}, alloc);
      try {
        recv.Wait(milliseconds(50));
        ADD_FAILURE() << "a receive without a send completed";
      } catch (const CommTimeout& e) {
        EXPECT_THAT(e.what(), HasSubstr("rank 1: receive f32[2] from rank 0 (tag 5) did not "
                                        "complete within 50 ms: rank 0 (host "));
        EXPECT_THAT(e.what(), HasSubstr(") has sent nothing for it"));
      }
    }
    c.Barrier();
    if (c.rank() == 1) {
      EXPECT_EQ(c.Recv(0, 4, DType::kF32, {3}, alloc).FlatAt(2), 4.0);
      EXPECT_EQ(recv.Wait().FlatAt(1), 9.0);
    }
  }
  c.Barrier();
}

TEST(MpiP2P, SendHoldsItsStorageUntilCompletionOnly) {
  Communicator& c = World();
  CachingAllocator alloc;
  if (c.rank() == 0) {
    Tensor y = Tensor::Full({256}, 1.0, DType::kF32, alloc);
    Request send = c.Isend(y, 1, 6);
    y = Tensor();  // dropped early: the pending send keeps the bytes alive
    EXPECT_EQ(alloc.Stats().allocated_bytes, 1024);
    c.Barrier();  // only now does rank 1 post its receive
    send.Wait();
    EXPECT_EQ(alloc.Stats().allocated_bytes, 0);
  } else {
    c.Barrier();
    if (c.rank() == 1) {
      EXPECT_EQ(c.Recv(0, 6, DType::kF32, {256}, alloc).FlatAt(255), 1.0);
    }
  }
  c.Barrier();
}

TEST(MpiP2P, DroppedRequestsStillCompleteAndConsumeTheirMessage) {
  Communicator& c = World();
  // Dropped requests hold their storage until the communicator sees them complete, which may be
  // after this test returns: their allocator must outlive the world (communicator.h), so it is
  // static here.
  static CachingAllocator alloc;
  if (c.rank() == 0) {
    c.Isend(Tensor::Full({2}, 1.0, DType::kI32, alloc), 1, 8);  // Request dropped at once
    c.Send(Tensor::Full({2}, 2.0, DType::kI32, alloc), 1, 8);
    c.Send(Tensor::Full({2}, 3.0, DType::kI32, alloc), 1, 8);
  } else if (c.rank() == 1) {
    EXPECT_EQ(c.Recv(0, 8, DType::kI32, {2}, alloc).FlatAt(0), 1.0);
    c.Irecv(0, 8, DType::kI32, {2}, alloc);  // dropped: it still takes the second message
    EXPECT_EQ(c.Recv(0, 8, DType::kI32, {2}, alloc).FlatAt(0), 3.0);
  }
  c.Barrier();
}

TEST(MpiCollective, NoRankLeavesTheBarrierBeforeEveryRankEnteredIt) {
  Communicator& c = World();
  CachingAllocator alloc;
  // Rank 0 names a fresh file, tells everyone, and creates it only after a pause; every rank must
  // see it once the barrier returns.
  std::string path;
  if (c.rank() == 0) {
    path = (std::filesystem::temp_directory_path() /
            ("sluice_mpi_barrier_" + std::to_string(getpid())))
               .string();
    std::filesystem::remove(path);
  }
  Tensor name = Tensor::Zeros({256}, DType::kI32, alloc);
  for (size_t i = 0; i < path.size(); ++i) name.FlatSet(static_cast<int64_t>(i), path[i]);
  c.AllReduceSum(name);  // only rank 0 contributes characters
  path.clear();
  for (int64_t i = 0; i < 256 && name.FlatAt(i) != 0; ++i)
    path += static_cast<char>(name.FlatAt(i));
  if (c.rank() == 0) {
    std::this_thread::sleep_for(milliseconds(300));
    std::ofstream(path) << "entered\n";
  }
  c.Barrier();
  EXPECT_TRUE(std::filesystem::exists(path)) << path;
  c.Barrier();
  if (c.rank() == 0) std::filesystem::remove(path);
}

TEST(MpiCollective, AllReduceSumIsTheRankOrderSumBitwiseOnEveryRank) {
  Communicator& c = World();
  const int r = c.rank(), n = c.size();
  CachingAllocator alloc;
  constexpr int64_t kNumel = 600'000;  // several 1 MiB chunks and a remainder
  Tensor t = Tensor::Empty({kNumel}, DType::kF32, alloc);
  std::vector<float> want(kNumel);
  float* x = t.data<float>();
  for (int64_t i = 0; i < kNumel; ++i) {
    x[i] = Contribution(r, i);
    float acc = Contribution(0, i);
    for (int k = 1; k < n; ++k) acc += Contribution(k, i);
    want[i] = acc;
  }
  c.AllReduceSum(t);
  EXPECT_EQ(std::memcmp(x, want.data(), kNumel * sizeof(float)), 0);

  // Every rank holds the same bits: rank 0 compares every other rank's result with its own.
  if (r == 0) {
    for (int k = 1; k < n; ++k) {
      Tensor other = c.Recv(k, 10, DType::kF32, {kNumel}, alloc);
      EXPECT_EQ(std::memcmp(other.raw_data(), x, kNumel * sizeof(float)), 0) << "rank " << k;
    }
  } else {
    c.Send(t, 0, 10);
  }

  Tensor ints = Tensor::FromVector<int64_t>({3}, {r, 1LL << 40, -1}, alloc);
  c.AllReduceSum(ints);
  EXPECT_EQ(ints.data<int64_t>()[0], n * (n - 1) / 2);
  EXPECT_EQ(ints.data<int64_t>()[1], n * (1LL << 40));
  EXPECT_EQ(ints.data<int64_t>()[2], -n);
}

// IallReduceSum: two reductions posted before either is waited for, point-to-point traffic in
// between (the interlocked steps' pattern: post at a step's end, wait at the next one's update),
// each the rank-order sum bitwise AllReduceSum's; an operand above 1 MiB takes the blocking path
// inside the post with the same result.
TEST(MpiCollective, IallReduceSumPostsNowAndWaitsLaterForTheRankOrderSum) {
  Communicator& c = World();
  const int r = c.rank(), n = c.size(), next = (r + 1) % n, prev = (r + n - 1) % n;
  CachingAllocator alloc;
  constexpr int64_t kNumel = 1000;
  auto filled = [&](int64_t numel, int salt) {
    Tensor t = Tensor::Empty({numel}, DType::kF64, alloc);
    for (int64_t i = 0; i < numel; ++i) t.data<double>()[i] = Contribution(r, i + salt);
    return t;
  };
  Tensor first = filled(kNumel, 0), second = filled(kNumel, 7);
  Tensor first_blocking = filled(kNumel, 0), second_blocking = filled(kNumel, 7);
  Request a = c.IallReduceSum(first);
  Request b = c.IallReduceSum(second);
  Request ring = c.Irecv(prev, 3, DType::kI64, {1}, alloc);
  c.Send(Tensor::FromVector<int64_t>({1}, {r}, alloc), next, 3);
  EXPECT_EQ(ring.Wait().data<int64_t>()[0], prev);
  c.AllReduceSum(first_blocking);
  c.AllReduceSum(second_blocking);
  EXPECT_EQ(b.Wait().raw_data(), second.raw_data());  // the sum lands in the posted tensor
  a.Wait();
  EXPECT_EQ(a.state(), RequestState::kCompleted);
  EXPECT_EQ(std::memcmp(first.raw_data(), first_blocking.raw_data(), kNumel * sizeof(double)), 0);
  EXPECT_EQ(std::memcmp(second.raw_data(), second_blocking.raw_data(), kNumel * sizeof(double)), 0);

  constexpr int64_t kLarge = 200'000;  // 1.6 MB of f64: above the non-blocking limit
  Tensor large = filled(kLarge, 3), large_blocking = filled(kLarge, 3);
  Request l = c.IallReduceSum(large);
  EXPECT_TRUE(l.Test());  // completed inside the post
  c.AllReduceSum(large_blocking);
  EXPECT_EQ(std::memcmp(large.raw_data(), large_blocking.raw_data(), kLarge * sizeof(double)), 0);
}

TEST(MpiCollective, IallReduceSumOfDifferentShapesIsAMismatchOnWait) {
  std::unique_ptr<MpiCommunicator> c = g_mpi->world().Split(/*color=*/0, /*key=*/0);
  CachingAllocator alloc;
  Tensor t = Tensor::Zeros({c->rank() == 0 ? 3 : 4}, DType::kF32, alloc);
  Request posted = c->IallReduceSum(t);
  try {
    posted.Wait();
    ADD_FAILURE() << "a reduction of different shapes completed";
  } catch (const CommError& e) {
    EXPECT_THAT(e.what(), HasSubstr("collective mismatch: rank 1 called iall_reduce_sum of f32[4] "
                                    "while rank 0 called iall_reduce_sum of f32[3]"));
  }
  EXPECT_THROW(c->Barrier(), CommAborted);
}

TEST(MpiCollective, CollectiveMismatchIsAnErrorOnEveryRank) {
  std::unique_ptr<MpiCommunicator> c = g_mpi->world().Split(/*color=*/0, /*key=*/0);
  CachingAllocator alloc;
  Tensor t = Tensor::Zeros({c->rank() == 0 ? 3 : 4}, DType::kF32, alloc);
  try {
    c->AllReduceSum(t);
    ADD_FAILURE() << "an all-reduce of different shapes completed";
  } catch (const CommError& e) {
    EXPECT_THAT(e.what(), HasSubstr("collective mismatch: rank 1 called all_reduce_sum of f32[4] "
                                    "while rank 0 called all_reduce_sum of f32[3]"));
  }
  // The communicator is aborted: later operations fail at once.
  EXPECT_THROW(c->Barrier(), CommAborted);
}

TEST(MpiCollective, BarrierTimeoutThrowsAndAbortsTheCommunicator) {
  std::unique_ptr<MpiCommunicator> c = g_mpi->world().Split(/*color=*/0, /*key=*/0);
  if (c->rank() == 0) {
    try {
      c->Barrier(milliseconds(50));
      ADD_FAILURE() << "a barrier that one rank entered completed";
    } catch (const CommTimeout& e) {
      EXPECT_THAT(e.what(), HasSubstr("rank 0: barrier timed out after 50 ms"));
      EXPECT_THAT(e.what(), HasSubstr("(its other ranks: rank 1 (host "));  // and where they run
    }
    EXPECT_THROW(c->Barrier(), CommAborted);
  }
  World().Barrier();
  // The other ranks now complete rank 0's abandoned barrier, so no MPI operation is left behind.
  if (c->rank() != 0) c->Barrier();
}

TEST(MpiCollective, SplitMakesGroupsThatReduceAmongThemselves) {
  Communicator& w = World();
  const int r = w.rank(), n = w.size();
  // Two groups by parity, ordered by descending world rank.
  std::unique_ptr<MpiCommunicator> group = g_mpi->world().Split(/*color=*/r % 2, /*key=*/-r);
  const int members = (n - r % 2 + 1) / 2;
  ASSERT_EQ(group->size(), members);
  EXPECT_EQ(group->rank(), members - 1 - r / 2);
  CachingAllocator alloc;
  Tensor t = Tensor::Full({5}, r, DType::kF64, alloc);
  group->AllReduceSum(t);
  double want = 0;
  for (int k = r % 2; k < n; k += 2) want += k;
  for (int i = 0; i < 5; ++i) EXPECT_EQ(t.FlatAt(i), want);
}

// Two threads of every process use MPI at once, as interlocked steps do (a stage's thread sends and
// receives on the pipeline's communicator while the main thread all-reduces over the world), with
// messages of every size class of the shared-memory transport (a fast box, one eager fragment,
// several): every message and every sum arrives intact. Under ThreadSanitizer: the library's copies
// on either thread are ordered as MPI promises (comm/mpi.cc, LibraryAccess), never a report.
TEST(MpiCollective, TwoThreadsUseTwoCommunicatorsAtOnce) {
  Communicator& w = World();
  const int r = w.rank(), n = w.size(), next = (r + 1) % n, prev = (r + n - 1) % n;
  std::unique_ptr<MpiCommunicator> pipe = g_mpi->world().Split(/*color=*/0, /*key=*/r);
  constexpr int kRounds = 120;
  const auto numel = [](int i) -> int64_t { return 1 + (i % 4) * 1500; };  // 4 B to 18 KB
  std::thread stage([&] {
    CachingAllocator alloc;
    for (int i = 0; i < kRounds; ++i) {
      Request in = pipe->Irecv(prev, i, DType::kF32, {numel(i)}, alloc);
      Request sent =
          pipe->Isend(Tensor::Full({numel(i)}, 1000.0 * r + i, DType::kF32, alloc), next, i);
      const Tensor got = in.Wait();
      sent.Wait();
      EXPECT_EQ(got.FlatAt(numel(i) - 1), 1000.0 * prev + i) << "round " << i;
    }
  });
  CachingAllocator alloc;
  for (int i = 0; i < kRounds; ++i) {
    Tensor t = Tensor::Full({numel(i) + 1000}, r + i, DType::kF64, alloc);
    w.AllReduceSum(t);
    EXPECT_EQ(t.FlatAt(numel(i) + 999), n * (n - 1) / 2 + n * i) << "round " << i;
  }
  stage.join();
}

// Every rank knows every rank's host (one process per rank here: each its own processor name),
// which messages use to name a peer's machine.
TEST(MpiWorld, HostsHoldsEveryRanksProcessorName) {
  const std::vector<std::string>& hosts = g_mpi->hosts();
  ASSERT_EQ(static_cast<int>(hosts.size()), World().size());
  char name[MPI_MAX_PROCESSOR_NAME] = {};
  int length = 0;
  MPI_Get_processor_name(name, &length);
  EXPECT_EQ(hosts[World().rank()], std::string(name, length));
  for (const std::string& h : hosts) EXPECT_FALSE(h.empty());
}

// The transport settings are the library's own: CTest sets OMPI_MCA_btl for these tests.
TEST(MpiWorld, TransportSettingsAreReadFromTheLibrary) {
  const MpiTransportSettings t = MpiWorld::TransportSettings();
  if (const char* btl = std::getenv("OMPI_MCA_btl")) EXPECT_EQ(t.btl, btl);
}

}  // namespace
}  // namespace sluice

namespace {

// Prints failed assertions of a rank other than 0, prefixed by its rank (rank 0 prints everything).
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (!result.failed()) return;
    std::fprintf(stderr, "rank %d: %s:%d: %s\n", rank_,
                 result.file_name() ? result.file_name() : "", result.line_number(),
                 result.summary());
  }

 private:
  int rank_;
};

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  sluice::MpiWorld mpi({.timeout = std::chrono::seconds(30)});
  sluice::g_mpi = &mpi;
  const int rank = mpi.world().rank();
  if (rank != 0) {
    ::testing::TestEventListeners& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(rank));
  }
  return RUN_ALL_TESTS();
}
