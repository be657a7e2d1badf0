// Communicator: how the ranks of a parallel job — pipeline stages, data-parallel replicas —
// exchange tensors. Non-blocking point-to-point sends and receives with completion handles
// (Request), a barrier, and an in-place all-reduce. The pipeline runtime sees only this interface;
// backends implement it:
//   * LocalWorld (comm/local.h): the ranks are threads of one process (the embedded default);
//   * an MPI backend: the ranks are processes (MPI_Isend / MPI_Irecv / MPI_Test / MPI_Allreduce).
//
// Point-to-point semantics (every backend):
//   * Isend(tensor, peer, tag) and Irecv(peer, tag, dtype, shape, allocator) start an operation and
//     return a Request at once; they never wait for the peer.
//   * Matching follows MPI: a receive posted by rank r for (peer p, tag t) takes the sends of p
//     to r with tag t in the order p posted them, and receives for the same (p, t) are served in
//     the order r posted them. Different (peer, tag) pairs are independent channels. Tags lie in
//     [0, kMaxTag] (the smallest upper bound MPI guarantees). A rank may send to itself.
//   * A receive states the dtype and shape it expects. A send that carries anything else fails both
//     operations with a CommError naming both ranks, the tag and both dtype+shapes.
//   * Completion of a send means the library no longer reads the tensor's elements: from then on
//     the caller may overwrite or free them; before, it must not write them. Isend holds a
//     reference to the tensor's storage until completion, so dropping every handle early cannot
//     free memory under a running send — it only delays the free until completion, and the bytes
//     stay on the sender's statistics until then. This is the rule pipeline output release builds
//     on: release after the send has *completed*, never earlier (Megatron-LM's corrupted-receiver
//     bug was a buffer reused while its asynchronous send still read it).
//   * Completion of a receive means the tensor Wait returns holds the data. Its memory comes from
//     the allocator given to Irecv (the receiving stage's own), allocated when the receive is
//     posted (as an MPI backend must, to hand MPI a buffer), so per-stage statistics count a posted
//     receive's bytes from the post on. A non-contiguous tensor is sent in row-major logical order.
//   * Dropping a Request does not cancel its operation (like MPI_Request_free): a send still
//     completes when matched, and a receive still consumes its message.
//
// Collectives (Barrier, AllReduceSum) run over all ranks of the communicator: every rank calls the
// same collectives, with the same dtype and shape, in the same order. The group *is* the
// communicator: to reduce over a subset of ranks (the data-parallel replicas of one stage), make a
// communicator for the subset (a LocalWorld of that size in-process; MPI_Comm_split over MPI).
// AllReduceSum leaves bitwise the same result on every rank, so replicas stay identical.
//
// Failure modes (everything here throws a sluice::Error subclass; nothing hangs):
//   * CommTimeout: Wait, Barrier or AllReduceSum waited longer than its timeout. The message names
//     the ranks, the tag or the collective, how long it waited, and what is missing. A timed-out
//     Request stays pending (it may be waited for again); a timed-out collective aborts the
//     communicator, since the other ranks can no longer complete it consistently.
//   * CommAborted: some rank called Abort(reason). Every operation blocked on any rank wakes with
//     it, every pending operation fails with it, and every later operation fails at once; it names
//     the aborting rank and the reason (aborting_rank(), reason()).
//   * CommError: a send/receive dtype or shape mismatch, or a collective called differently on two
//     ranks (which also aborts the communicator: the ranks' programs have diverged).
//   * InvalidArgument: a peer outside [0, size()), a tag outside [0, kMaxTag], an undefined tensor,
//     a negative timeout, an all-reduce of a non-contiguous or non-numeric tensor, Wait on an empty
//     Request or a second Wait on a receive whose tensor was already handed over.
//   A failed send, like a completed one, no longer reads its tensor.
//
// Thread-safety: a Communicator may be used from several threads at once for point-to-point
// operations, Wait/Test and Abort; collectives are called by one thread per rank at a time. A
// Request is a move-only handle: one thread uses a given Request at a time; different Requests are
// independent and may be waited for on different threads.
//
// Example (stage 0 sends its activation y, shape (B, T, C), for micro-batch mb to stage 1):
//   // on rank 0
//   Request s = comm.Isend(y, /*peer=*/1, /*tag=*/mb);
//   ...                // compute on; y's elements must not be written meanwhile
//   s.Wait();          // completed: rank 1 holds its own copy
//   y = Tensor();      // so y's memory may be released now
//   // on rank 1
//   Request r = comm.Irecv(/*peer=*/0, /*tag=*/mb, DType::kF32, {B, T, C}, allocator);
//   Tensor x = r.Wait();  // f32[B, T, C] in memory from `allocator`
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "sluice/core/allocator.h"
#include "sluice/core/dtype.h"
#include "sluice/core/enum_names.h"
#include "sluice/core/error.h"
#include "sluice/core/shape.h"
#include "sluice/core/tensor.h"

namespace sluice {

// Largest tag every backend accepts (MPI guarantees MPI_TAG_UB >= 32767).
inline constexpr int kMaxTag = 32767;

// Timeouts longer than this are treated as this (so deadlines never overflow).
inline constexpr std::chrono::milliseconds kMaxTimeout = std::chrono::hours(24 * 365);

// A communication failure: a mismatch between ranks, or the base of the two below.
class CommError : public Error {
  using Error::Error;
};

// An operation waited longer than its timeout.
class CommTimeout : public CommError {
  using CommError::CommError;
};

// A rank called Abort(reason); the message says where the failure surfaced and names both.
class CommAborted : public CommError {
 public:
  CommAborted(const std::string& message, int aborting_rank, std::string reason)
      : CommError(message), aborting_rank_(aborting_rank), reason_(std::move(reason)) {}
  int aborting_rank() const { return aborting_rank_; }
  const std::string& reason() const { return reason_; }

 private:
  int aborting_rank_;
  std::string reason_;
};

enum class RequestState {
  kPending,    // not finished: a send may still read its tensor, a receive has no data yet
  kCompleted,  // finished; a receive's tensor is ready (Wait hands it over)
  kFailed,     // finished with an error (Test and Wait throw it); the tensor is no longer read
};

inline constexpr EnumEntry<RequestState> kRequestStateNames[] = {
    {RequestState::kPending, "pending"},
    {RequestState::kCompleted, "completed"},
    {RequestState::kFailed, "failed"},
};
static_assert(IsCompleteEnumTable(kRequestStateNames));

// The state's name in kRequestStateNames.
std::string_view Name(RequestState state);

// "f32[2, 3]": how messages and errors print a tensor's type.
std::string DescribeTensor(DType dtype, const Shape& shape);

// The backend's side of a Request. Implementations are thread-safe.
class RequestImpl {
 public:
  virtual ~RequestImpl() = default;
  // Blocks until the operation finishes or `timeout` passes (then throws CommTimeout). Returns the
  // received tensor for a receive (handing it over: a second call throws InvalidArgument) and an
  // undefined Tensor for a send; throws the operation's error if it failed.
  virtual Tensor Wait(std::chrono::milliseconds timeout) = 0;
  // True when completed, false when pending; throws the operation's error if it failed.
  virtual bool Test() = 0;
  virtual RequestState state() const = 0;
  // "rank 0: send f32[2, 3] to rank 1 (tag 5)".
  virtual std::string Describe() const = 0;
};

// A handle on one non-blocking send or receive. Move-only; a default-constructed Request is empty.
class Request {
 public:
  Request() = default;
  // Backends create Requests; `default_timeout` is what Wait() without an argument waits.
  Request(std::shared_ptr<RequestImpl> impl, std::chrono::milliseconds default_timeout)
      : impl_(std::move(impl)), default_timeout_(default_timeout) {}
  Request(Request&&) = default;
  Request& operator=(Request&&) = default;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;

  bool valid() const { return impl_ != nullptr; }

  // See RequestImpl::Wait. Wait() waits the communicator's default timeout.
  Tensor Wait();
  Tensor Wait(std::chrono::milliseconds timeout);
  // Non-blocking completion check; see RequestImpl::Test.
  bool Test();
  RequestState state() const;
  std::string Describe() const;

 private:
  RequestImpl& impl() const;

  std::shared_ptr<RequestImpl> impl_;
  std::chrono::milliseconds default_timeout_{0};
};

// One rank's view of a group of ranks. The public methods validate their arguments (the same
// errors for every backend) and call the backend's Do* hooks.
class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // What Request::Wait(), Barrier() and AllReduceSum(tensor) wait before throwing CommTimeout.
  virtual std::chrono::milliseconds default_timeout() const = 0;

  // Starts sending `tensor` (any dtype, shape and strides) to `peer`.
  Request Isend(const Tensor& tensor, int peer, int tag);
  // Starts receiving a dtype[shape] tensor from `peer`, allocated from `allocator` now.
  Request Irecv(int peer, int tag, DType dtype, const Shape& shape, Allocator& allocator);
  // Blocking forms: Isend(...).Wait() and Irecv(...).Wait() with the default timeout.
  void Send(const Tensor& tensor, int peer, int tag);
  Tensor Recv(int peer, int tag, DType dtype, const Shape& shape, Allocator& allocator);

  // Returns when every rank has entered the barrier.
  void Barrier();
  void Barrier(std::chrono::milliseconds timeout);
  // Replaces `tensor` (contiguous; f32, f64, i32 or i64; same dtype and shape on every rank) by the
  // elementwise sum over ranks, added in rank order 0, 1, ..., size() − 1 on every rank.
  void AllReduceSum(const Tensor& tensor);
  void AllReduceSum(const Tensor& tensor, std::chrono::milliseconds timeout);
  // The non-blocking AllReduceSum: posts `tensor` (the same rules) and returns at once. Wait() on
  // the Request writes the rank-order sum into `tensor` (bitwise AllReduceSum's) and returns it;
  // until then the caller must neither write nor free the tensor. Every rank posts its
  // IallReduceSums in the same order (the n-th of every rank's are reduced together), and may post
  // the next before waiting on the last. A backend without its own runs AllReduceSum inside the
  // post and returns a completed Request: correct, but blocking (MPI does so above 1 MiB).
  Request IallReduceSum(const Tensor& tensor);

  // Stops the whole group: see CommAborted above. The first abort wins; later calls do nothing.
  virtual void Abort(std::string_view reason) noexcept = 0;

 protected:
  // Arguments are valid when these are called (peer and tag in range, tensor defined, timeout
  // within [0, kMaxTimeout], all-reduce tensor contiguous and numeric).
  virtual Request DoIsend(const Tensor& tensor, int peer, int tag) = 0;
  virtual Request DoIrecv(int peer, int tag, DType dtype, const Shape& shape,
                          Allocator& allocator) = 0;
  virtual void DoBarrier(std::chrono::milliseconds timeout) = 0;
  virtual void DoAllReduceSum(const Tensor& tensor, std::chrono::milliseconds timeout) = 0;
  virtual Request DoIallReduceSum(const Tensor& tensor);

 private:
  void CheckReducible(std::string_view what, const Tensor& tensor) const;
  void CheckPeerAndTag(std::string_view what, int peer, int tag) const;
  std::chrono::milliseconds CheckTimeout(std::string_view what,
                                         std::chrono::milliseconds timeout) const;
};

}  // namespace sluice
