// LocalWorld: the in-process Communicator backend. Every rank is a thread of this process (one per
// pipeline stage), and the ranks of one world share its mailboxes. It implements the contract of
// comm/communicator.h; what follows is how.
//
// How a message travels (the receiver owns its copy):
//   * Irecv allocates the destination tensor from the receiver's allocator at once, then posts it.
//     Isend posts a reference to the sender's tensor (the storage stays alive while posted);
//     nothing is copied and nothing is allocated on the sender's side.
//   * Posting matches against the oldest unmatched operation of the other kind on the same
//     (sender, receiver, tag) channel. Whichever of the pair is posted second copies the elements
//     into the receiver's tensor — inside its Isend or Irecv call, outside the world's lock — then
//     drops its reference to the sender's storage, and only then completes both requests.
//   * So a send completes exactly when the receiver holds its own copy; only then may the sender's
//     buffer be reused or released (pipeline output release waits for this). Received bytes are
//     counted on the receiving stage's allocator, sent bytes only on the sender's. And a matched
//     pair never waits for either side to call Wait, as MPI's progress rule promises: two ranks
//     that post their receives before waiting on their sends cannot deadlock.
//   * A send posted before its receive stays pending (holding its tensor) until the receive is
//     posted — a rank that waits on a send whose receive its peer posts only later waits for it.
//
// Collectives: Barrier is a generation-counting rendezvous. AllReduceSum runs three rendezvous
// with no scratch memory: after the first, rank r adds slice r of every rank's tensor (in rank
// order) into slice r of its own; after the second, it copies every other rank's slice into its
// own tensor; the third makes sure no rank returns (and reuses its tensor) while another reads it.
// Abort and timeouts interrupt only the first rendezvous; after it, the rest is bounded local work
// on every rank and runs to the end, so no rank ever returns while another writes its tensor.
// IallReduceSum (non-blocking) copies the rank's tensor into the world at its post, the n-th post
// of every rank meeting in one pending sum; the last rank to post adds the copies in rank order
// (SumInRankOrder, bitwise AllReduceSum's result) and Wait copies the sum back: scratch memory of
// P + 1 copies while pending, so it is meant for small tensors (a step's norm partials).
//
// Ownership and lifetime: LocalWorld owns its Communicators; the state they share lives until the
// world and every Request made by it are gone. Tensors posted and not yet matched are released by
// Abort or by that last owner. Every allocator given to Irecv, and the allocator of every tensor
// given to Isend, must outlive the world and its Requests. Join the rank threads before destroying
// the world.
//
// Thread-safety: as in communicator.h. One mutex of the world guards all shared state (the fields
// in local.cc say GUARDED_BY, and clang checks it); copies and additions run outside it, the copy
// of a matched pair under the protocol that local.cc's Op describes.
//
// Example:
//   LocalWorld world(2, {.timeout = std::chrono::seconds(10)});
//   CachingAllocator alloc0, alloc1;          // one per stage, so each reports its own memory
//   std::thread stage1([&] {
//     Tensor x = world.comm(1).Recv(/*peer=*/0, /*tag=*/0, DType::kF32, {2, 3}, alloc1);
//   });
//   Tensor y = Tensor::Full({2, 3}, 1.0, DType::kF32, alloc0);
//   Request send = world.comm(0).Isend(y, /*peer=*/1, /*tag=*/0);
//   send.Wait();                              // rank 1 holds its own copy
//   y = Tensor();                             // alloc0.Stats().allocated_bytes == 0
//   stage1.join();
#pragma once

#include <chrono>
#include <memory>
#include <vector>

#include "sluice/comm/communicator.h"

namespace sluice {

struct LocalWorldOptions {
  // Default timeout of Request::Wait(), Barrier() and AllReduceSum() on every rank.
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
};

class LocalWorld {
 public:
  // size ≥ 1 ranks; throws InvalidArgument otherwise or for a negative timeout.
  explicit LocalWorld(int size, LocalWorldOptions options = {});
  ~LocalWorld();
  LocalWorld(const LocalWorld&) = delete;
  LocalWorld& operator=(const LocalWorld&) = delete;

  int size() const { return static_cast<int>(comms_.size()); }
  // The communicator of `rank` (InvalidArgument outside [0, size())).
  Communicator& comm(int rank);

 private:
  std::vector<std::unique_ptr<Communicator>> comms_;
};

}  // namespace sluice
