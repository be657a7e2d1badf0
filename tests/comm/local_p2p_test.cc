// Point-to-point tests of the in-process backend (LocalWorld): per-tag ordering, many messages in
// flight, send completion only after the receiver has its own copy, per-rank memory accounting,
// timeouts, abort, mismatches and argument errors.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "comm/rank_threads.h"
#include "sluice/comm/local.h"

namespace sluice {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;
using testing::RankAllocators;
using testing::RunRanks;

// A f64[4] tensor holding {v, v + 1, v + 2, v + 3}.
Tensor Message(double v, Allocator& allocator) {
  return Tensor::FromVector<double>({4}, {v, v + 1, v + 2, v + 3}, allocator);
}

void ExpectMessage(const Tensor& t, double v) {
  ASSERT_EQ(t.dtype(), DType::kF64);
  ASSERT_EQ(t.shape(), Shape({4}));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(t.FlatAt(i), v + i) << "element " << i;
}

// A one-shot signal between two test threads.
class Latch {
 public:
  void Set() {
    std::lock_guard lock(mu_);
    set_ = true;
    cv_.notify_all();
  }
  void WaitSet() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [&] { return set_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool set_ = false;
};

TEST(LocalP2P, PingPongKeepsOrderPerTag) {
  constexpr int kRounds = 20, kTags = 3;
  RankAllocators alloc(2);
  {
    LocalWorld world(2, {.timeout = std::chrono::seconds(30)});
    RunRanks(world, [&](int rank) {
      Communicator& c = world.comm(rank);
      for (int round = 0; round < kRounds; ++round) {
        if (rank == 0) {
          // Two messages per tag per round, sent tag by tag.
          std::vector<Request> sends;
          for (int tag = 0; tag < kTags; ++tag) {
            for (int k = 0; k < 2; ++k) {
              sends.push_back(c.Isend(Message(1000 * tag + 10 * round + k, alloc[0]), 1, tag));
            }
          }
          // Replies come back in reverse tag order; the receives are posted before any wait.
          std::vector<Request> replies;
          for (int tag = 0; tag < kTags; ++tag) {
            replies.push_back(c.Irecv(1, tag, DType::kF64, {4}, alloc[0]));
          }
          for (int tag = 0; tag < kTags; ++tag) {
            ExpectMessage(replies[tag].Wait(), 1000 * tag + 10 * round + 5);
          }
          for (Request& s : sends) s.Wait();
        } else {
          // Receives posted tag by tag in reverse: each tag is its own ordered channel.
          for (int tag = kTags - 1; tag >= 0; --tag) {
            Request first = c.Irecv(0, tag, DType::kF64, {4}, alloc[1]);
            Request second = c.Irecv(0, tag, DType::kF64, {4}, alloc[1]);
            ExpectMessage(second.Wait(), 1000 * tag + 10 * round + 1);
            ExpectMessage(first.Wait(), 1000 * tag + 10 * round + 0);
            c.Send(Message(1000 * tag + 10 * round + 5, alloc[1]), 0, tag);
          }
        }
      }
    });
  }
  alloc.ExpectAllFreed();
}

TEST(LocalP2P, SendsBeforeReceivesAndReceivesBeforeSendsBothMatchInOrder) {
  RankAllocators alloc(2);
  LocalWorld world(2);
  Communicator &c0 = world.comm(0), &c1 = world.comm(1);
  // Sends first: the receives take them in the order they were sent.
  std::vector<Request> sends;
  for (int k = 0; k < 3; ++k) sends.push_back(c0.Isend(Message(k, alloc[0]), 1, 9));
  for (int k = 0; k < 3; ++k) ExpectMessage(c1.Recv(0, 9, DType::kF64, {4}, alloc[1]), k);
  // Receives first: they are served in the order they were posted.
  std::vector<Request> recvs;
  for (int k = 0; k < 3; ++k) recvs.push_back(c1.Irecv(0, 9, DType::kF64, {4}, alloc[1]));
  for (int k = 0; k < 3; ++k) c0.Send(Message(10 + k, alloc[0]), 1, 9);
  for (int k = 0; k < 3; ++k) ExpectMessage(recvs[k].Wait(), 10 + k);
  for (Request& s : sends) EXPECT_EQ(s.state(), RequestState::kCompleted);
}

TEST(LocalP2P, ManyMessagesInFlightBetweenFourRanks) {
  // Every rank sends kPerPeer messages to every rank (itself included) on kTags tags before it
  // waits for anything, and posts its receives peer by peer in reverse tag order.
  constexpr int kRanks = 4, kPerPeer = 60, kTags = 5;
  RankAllocators alloc(kRanks);
  {
    LocalWorld world(kRanks, {.timeout = std::chrono::seconds(30)});
    const auto value = [](int src, int dst, int k) { return 1e6 * src + 1e4 * dst + 10.0 * k; };
    RunRanks(world, [&](int rank) {
      Communicator& c = world.comm(rank);
      std::vector<Request> sends;
      for (int k = 0; k < kPerPeer; ++k) {
        for (int dst = 0; dst < kRanks; ++dst) {
          sends.push_back(c.Isend(Message(value(rank, dst, k), alloc[rank]), dst, k % kTags));
        }
      }
      for (int src = kRanks - 1; src >= 0; --src) {
        std::vector<std::pair<int, Request>> recvs;  // (k, request)
        for (int tag = kTags - 1; tag >= 0; --tag) {
          for (int k = tag; k < kPerPeer; k += kTags) {
            recvs.emplace_back(k, c.Irecv(src, tag, DType::kF64, {4}, alloc[rank]));
          }
        }
        for (auto& [k, r] : recvs) ExpectMessage(r.Wait(), value(src, rank, k));
      }
      for (Request& s : sends) s.Wait();
    });
  }
  alloc.ExpectAllFreed();
}

TEST(LocalP2P, SendCompletesOnlyOnceTheReceiverHasItsOwnCopy) {
  // The rule output release rests on: after the send's Wait, the sender overwrites and frees its
  // buffer, and only then does the receiver look at what it received.
  RankAllocators alloc(2);
  {
    LocalWorld world(2, {.timeout = std::chrono::seconds(30)});
    Latch overwritten;
    RunRanks(world, [&](int rank) {
      Communicator& c = world.comm(rank);
      if (rank == 0) {
        Tensor out = Message(7, alloc[0]);
        Request send = c.Isend(out, 1, 0);
        send.Wait();
        for (int i = 0; i < 4; ++i) out.FlatSet(i, -1);  // reuse the buffer...
        out = Tensor();                                  // ...and release it
        EXPECT_EQ(alloc[0].Stats().allocated_bytes, 0);
        overwritten.Set();
      } else {
        Request recv = c.Irecv(0, 0, DType::kF64, {4}, alloc[1]);
        overwritten.WaitSet();
        ExpectMessage(recv.Wait(), 7);
      }
    });
  }
  alloc.ExpectAllFreed();
}

TEST(LocalP2P, SendStaysPendingUntilItsReceiveIsPosted) {
  RankAllocators alloc(2);
  LocalWorld world(2);
  Request send = world.comm(0).Isend(Message(3, alloc[0]), 1, 2);
  EXPECT_FALSE(send.Test());
  EXPECT_EQ(send.state(), RequestState::kPending);
  Request recv = world.comm(1).Irecv(0, 2, DType::kF64, {4}, alloc[1]);
  // Matching copied the data inside Irecv: both sides are complete before anyone waits.
  EXPECT_TRUE(send.Test());
  EXPECT_EQ(recv.state(), RequestState::kCompleted);
  EXPECT_FALSE(send.Wait().defined());
  ExpectMessage(recv.Wait(), 3);
}

TEST(LocalP2P, MemoryIsCountedOnTheRankThatHoldsIt) {
  RankAllocators alloc(2);
  LocalWorld world(2);
  constexpr int64_t kBytes = 4 * 8;
  // Isend keeps the storage alive although the caller dropped every handle.
  Request send = world.comm(0).Isend(Message(1, alloc[0]), 1, 0);
  EXPECT_EQ(alloc[0].Stats().allocated_bytes, kBytes);
  EXPECT_EQ(alloc[1].Stats().allocated_bytes, 0);
  // The receive allocates its destination from the receiver's allocator when it is posted; the
  // copy then completes the send, which lets the sender's memory go.
  Request recv = world.comm(1).Irecv(0, 0, DType::kF64, {4}, alloc[1]);
  EXPECT_EQ(alloc[0].Stats().allocated_bytes, 0);
  EXPECT_EQ(alloc[1].Stats().allocated_bytes, kBytes);
  Tensor x = recv.Wait();
  EXPECT_EQ(x.storage()->allocator(), &alloc[1]);
  x = Tensor();
  alloc.ExpectAllFreed();
  // A posted receive counts from its post, before any data arrived.
  Request early = world.comm(0).Irecv(1, 0, DType::kF64, {4}, alloc[0]);
  EXPECT_EQ(alloc[0].Stats().allocated_bytes, kBytes);
  world.comm(1).Send(Message(2, alloc[1]), 0, 0);
  ExpectMessage(early.Wait(), 2);
  alloc.ExpectAllFreed();
}

TEST(LocalP2P, NonContiguousTensorIsSentInLogicalOrder) {
  RankAllocators alloc(2);
  LocalWorld world(2);
  Tensor x = Tensor::FromVector<float>({2, 3}, {0, 1, 2, 3, 4, 5}, alloc[0]);
  Tensor xt = x.Transpose(0, 1);  // f32[3, 2], strided
  Request send = world.comm(0).Isend(xt, 1, 0);
  Tensor got = world.comm(1).Recv(0, 0, DType::kF32, {3, 2}, alloc[1]);
  EXPECT_TRUE(got.is_contiguous());
  EXPECT_TRUE(BitwiseEqual(got, xt.Contiguous(alloc[0])));
}

TEST(LocalP2P, RankMaySendToItself) {
  RankAllocators alloc(1);
  LocalWorld world(1);
  Request recv = world.comm(0).Irecv(0, 4, DType::kF64, {4}, alloc[0]);
  world.comm(0).Send(Message(5, alloc[0]), 0, 4);
  ExpectMessage(recv.Wait(), 5);
}

TEST(LocalP2P, TimeoutNamesRanksTagDurationAndWhatIsMissing) {
  RankAllocators alloc(2);
  LocalWorld world(2);
  // Rank 0 sent with tag 8 while rank 1 waits on tag 7: the message says both.
  Request stray = world.comm(0).Isend(Message(0, alloc[0]), 1, 8);
  Request recv = world.comm(1).Irecv(0, 7, DType::kF64, {4}, alloc[1]);
  try {
    recv.Wait(milliseconds(30));
    FAIL() << "expected CommTimeout";
  } catch (const CommTimeout& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank 1: receive f64[4] from rank 0 (tag 7)"));
    EXPECT_THAT(e.what(), HasSubstr("within 30 ms"));
    EXPECT_THAT(e.what(), HasSubstr("rank 0 has sent nothing for it"));
    EXPECT_THAT(e.what(), HasSubstr("rank 0 has unmatched sends to rank 1 with tags 8"));
  }
  // A timed-out request stays pending and completes once its message comes.
  EXPECT_EQ(recv.state(), RequestState::kPending);
  world.comm(0).Send(Message(6, alloc[0]), 1, 7);
  ExpectMessage(recv.Wait(milliseconds(0)), 6);

  try {
    stray.Wait(milliseconds(0));
    FAIL() << "expected CommTimeout";
  } catch (const CommTimeout& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank 0: send f64[4] to rank 1 (tag 8) did not complete "
                                    "within 0 ms: rank 1 has posted no receive for it"));
  }
  ExpectMessage(world.comm(1).Recv(0, 8, DType::kF64, {4}, alloc[1]), 0);
}

TEST(LocalP2P, AbortWakesAPeerBlockedInWaitWithTheRankAndReason) {
  RankAllocators alloc(3);
  {
    LocalWorld world(3, {.timeout = std::chrono::seconds(60)});
    Latch posted;
    // A send that will never be received: abort must release its memory too.
    Request orphan = world.comm(0).Isend(Message(1, alloc[0]), 2, 0);
    RunRanks(world, [&](int rank) {
      if (rank == 1) {
        Request recv = world.comm(1).Irecv(0, 0, DType::kF64, {4}, alloc[1]);
        posted.Set();
        try {
          recv.Wait();
          ADD_FAILURE() << "expected CommAborted";
        } catch (const CommAborted& e) {
          EXPECT_EQ(e.aborting_rank(), 2);
          EXPECT_EQ(e.reason(), "stage 2 failed at F(mb 3): boom");
          EXPECT_THAT(e.what(), HasSubstr("rank 1: receive f64[4] from rank 0 (tag 0) failed: "
                                          "rank 2 aborted: stage 2 failed at F(mb 3): boom"));
        }
      } else if (rank == 2) {
        posted.WaitSet();
        world.comm(2).Abort("stage 2 failed at F(mb 3): boom");
      }
    });
    EXPECT_EQ(orphan.state(), RequestState::kFailed);
    EXPECT_THROW(orphan.Test(), CommAborted);
    // The first abort wins; every later operation fails at once.
    world.comm(0).Abort("a later reason");
    try {
      world.comm(0).Isend(Message(1, alloc[0]), 1, 0);
      FAIL() << "expected CommAborted";
    } catch (const CommAborted& e) {
      EXPECT_EQ(e.aborting_rank(), 2);
      EXPECT_THAT(e.what(), HasSubstr("rank 0: send f64[4] to rank 1 (tag 0) refused: rank 2 "
                                      "aborted: stage 2 failed at F(mb 3): boom"));
    }
    EXPECT_THROW(world.comm(1).Irecv(0, 0, DType::kF32, {1}, alloc[1]), CommAborted);
  }
  alloc.ExpectAllFreed();
}

TEST(LocalP2P, MismatchedShapeOrDtypeFailsBothSidesNamingBoth) {
  RankAllocators alloc(2);
  LocalWorld world(2);
  Request send = world.comm(0).Isend(Tensor::Zeros({2, 3}, DType::kF32, alloc[0]), 1, 4);
  Request recv = world.comm(1).Irecv(0, 4, DType::kF32, {3, 2}, alloc[1]);
  const char* what = "rank 0 sent f32[2, 3] with tag 4 but rank 1 expects f32[3, 2]";
  try {
    recv.Wait();
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank 1: receive f32[3, 2] from rank 0 (tag 4) failed"));
    EXPECT_THAT(e.what(), HasSubstr(what));
  }
  try {
    send.Wait();
    FAIL() << "expected CommError";
  } catch (const CommError& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank 0: send f32[2, 3] to rank 1 (tag 4) failed"));
    EXPECT_THAT(e.what(), HasSubstr(what));
  }
  Request send64 = world.comm(0).Isend(Tensor::Zeros({2}, DType::kF64, alloc[0]), 1, 4);
  Request recv32 = world.comm(1).Irecv(0, 4, DType::kF32, {2}, alloc[1]);
  EXPECT_THROW(send64.Test(), CommError);
  EXPECT_THROW(recv32.Wait(), CommError);
  alloc.ExpectAllFreed();
}

TEST(LocalP2P, BadArgumentsAreRejectedWithTheirPlace) {
  RankAllocators alloc(2);
  LocalWorld world(2);
  Communicator& c = world.comm(0);
  Tensor t = Message(0, alloc[0]);
  try {
    c.Isend(t, 2, 0);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank 0: send to: peer 2 is not a rank of this communicator"));
  }
  EXPECT_THROW(c.Isend(t, -1, 0), InvalidArgument);
  try {
    c.Irecv(1, kMaxTag + 1, DType::kF64, {4}, alloc[0]);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("rank 0: receive from rank 1: tag 32768 is outside"));
  }
  EXPECT_THROW(c.Isend(t, 1, -1), InvalidArgument);
  EXPECT_THROW(c.Isend(Tensor(), 1, 0), InvalidArgument);
  EXPECT_THROW(Request().Wait(), InvalidArgument);
  EXPECT_THROW(LocalWorld(0), InvalidArgument);
  EXPECT_THROW(world.comm(2), InvalidArgument);

  Request recv = world.comm(1).Irecv(0, 0, DType::kF64, {4}, alloc[1]);
  EXPECT_THROW(recv.Wait(milliseconds(-1)), InvalidArgument);
  c.Send(t, 1, 0);
  ExpectMessage(recv.Wait(), 0);
  try {
    recv.Wait();
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("already waited for"));
  }
}

}  // namespace
}  // namespace sluice
