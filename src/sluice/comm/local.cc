#include "sluice/comm/local.h"

#include <algorithm>
#include <compare>
#include <cstddef>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "sluice/comm/rank_order_sum.h"
#include "sluice/core/mutex.h"
#include "sluice/core/thread_annotations.h"

namespace sluice {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

enum class Phase {
  kPosted,   // waiting in its channel for the other half of the pair
  kCopying,  // matched; the thread that matched it copies the elements
  kCompleted,
  kFailed,
};

// One posted send or receive. The identity fields are immutable. `tensor`, `phase`, `handed_over`
// and `error` are guarded by the world's mutex (LocalWorldShared::mu, which `world_mu` names so
// that the analysis can check it), with one protocol exception: while a pair is kCopying, the
// thread that matched it reads the send's tensor and writes the elements of the receive's tensor
// without the lock (CopyMatchedPair); nobody else touches those two tensors in that phase (Abort
// only fails kPosted operations, Wait and Test only look at `phase` until kCompleted).
struct Op {
  Op(Mutex& world_mu, bool is_send, int rank, int peer, int tag, Tensor tensor)
      : is_send(is_send),
        rank(rank),
        peer(peer),
        tag(tag),
        dtype(tensor.dtype()),
        shape(tensor.shape()),
        world_mu(world_mu),
        tensor(std::move(tensor)) {}

  // "rank 0: send f32[2, 3] to rank 1 (tag 5)" or "rank 1: receive f32[2, 3] from rank 0 (tag 5)".
  std::string Describe() const {
    return fmt::format("rank {}: {} {} {} rank {} (tag {})", rank, is_send ? "send" : "receive",
                       DescribeTensor(dtype, shape), is_send ? "to" : "from", peer, tag);
  }
  bool finished() const REQUIRES(world_mu) {
    return phase == Phase::kCompleted || phase == Phase::kFailed;
  }

  const bool is_send;
  const int rank;  // the rank that posted it
  const int peer;
  const int tag;
  const DType dtype;  // sent, or expected by the receive
  const Shape shape;
  Mutex& world_mu;  // the world's LocalWorldShared::mu
  // send: the source, held until no longer read; receive: the destination
  Tensor tensor GUARDED_BY(world_mu);
  Phase phase GUARDED_BY(world_mu) = Phase::kPosted;
  bool handed_over GUARDED_BY(world_mu) = false;  // receive: Wait has returned the tensor
  std::exception_ptr error GUARDED_BY(world_mu);  // when kFailed
};

// The protocol exception of Op: the thread that matched a pair copies the send's elements into the
// receive's tensor, then drops its reference to the send's storage (which may free it, on this
// thread), without the lock — both are kCopying, so no other thread touches their tensors.
void CopyMatchedPair(Op& send, Op& recv) NO_THREAD_SAFETY_ANALYSIS {
  recv.tensor.CopyFrom(send.tensor);
  send.tensor = Tensor();
}

// Unmatched operations between one sender and one receiver with one tag. At most one of the two
// queues is non-empty: a new operation first matches the oldest one of the other kind.
struct ChannelKey {
  int src;
  int dst;
  int tag;
  auto operator<=>(const ChannelKey&) const = default;
};
struct Channel {
  std::deque<std::shared_ptr<Op>> sends;
  std::deque<std::shared_ptr<Op>> recvs;
};

// One non-blocking all-reduce (IallReduceSum): the n-th post of every rank. Every field is guarded
// by the world's mutex (LocalWorldShared::mu); `result` is written once, when the last rank posts,
// and only read afterwards.
struct PendingSum {
  DType dtype = DType::kF32;
  Shape shape;
  int first_rank = 0;                         // the first to post, for mismatch messages
  std::vector<std::vector<std::byte>> parts;  // [rank]: its contribution, copied at its post
  std::vector<bool> posted;
  int count = 0;  // ranks posted
  bool done = false;
  std::vector<std::byte> result;  // the rank-order sum, once every rank posted
};

// The state the ranks of one world share. Every method but the constructor takes mu itself or, as
// declared, requires it.
struct LocalWorldShared {
  LocalWorldShared(int size, milliseconds timeout)
      : size(size), timeout(timeout), present(size, false), operands(size) {}

  void Post(const std::shared_ptr<Op>& op) EXCLUDES(mu);
  Tensor Wait(Op& op, milliseconds timeout) EXCLUDES(mu);
  bool Test(Op& op) EXCLUDES(mu);
  RequestState State(const Op& op) EXCLUDES(mu);
  void Abort(int rank, std::string_view reason) noexcept EXCLUDES(mu);
  void Barrier(int rank, milliseconds timeout) EXCLUDES(mu);
  void AllReduceSum(int rank, const Tensor& tensor, milliseconds timeout) EXCLUDES(mu);
  // IallReduceSum: copies `tensor` into this rank's next pending sum; the last rank to post adds
  // the contributions in rank order. WaitSum writes the result into `tensor` once every rank has
  // posted (abort and the deadline interrupt it; a timeout aborts the world).
  std::shared_ptr<PendingSum> PostSum(int rank, const Tensor& tensor) EXCLUDES(mu);
  void WaitSum(int rank, PendingSum& sum, const Tensor& tensor, milliseconds timeout) EXCLUDES(mu);
  bool SumDone(const PendingSum& sum) EXCLUDES(mu);

  const int size;
  const milliseconds timeout;  // the default of every rank

  Mutex mu;
  // Notified (all waiters) when an operation finishes, a rendezvous completes, or the world aborts.
  CondVar cv;

  std::map<ChannelKey, Channel> channels GUARDED_BY(mu);  // a channel left empty is erased

  bool aborted GUARDED_BY(mu) = false;  // set once, never cleared
  int abort_rank GUARDED_BY(mu) = -1;
  std::string abort_reason GUARDED_BY(mu);

  // Collective rendezvous.
  uint64_t round GUARDED_BY(mu) = 0;            // rendezvous completed so far
  int arrived GUARDED_BY(mu) = 0;               // ranks waiting in the current one
  std::string signature GUARDED_BY(mu);         // what its first arriver called
  int signature_rank GUARDED_BY(mu) = -1;       // who that was
  std::vector<bool> present GUARDED_BY(mu);     // per rank, waiting in the current one
  std::vector<Tensor> operands GUARDED_BY(mu);  // per rank, its all-reduce tensor meanwhile

  // Non-blocking all-reduces: those some rank has not posted yet, by sequence number, and each
  // rank's count of posts so far (its next post's number).
  std::map<uint64_t, std::shared_ptr<PendingSum>> sums GUARDED_BY(mu);
  std::vector<uint64_t> sums_posted GUARDED_BY(mu) = std::vector<uint64_t>(size, 0);

 private:
  // Tells the analysis what it cannot see: `op` was posted to this world, so its guard
  // (op.world_mu) is mu, which the caller holds. Call it at the top of a function that holds mu
  // throughout, never in one that drops mu and then touches `op`.
  void AssertOwns(const Op& op) const REQUIRES(mu) ASSERT_CAPABILITY(op.world_mu);
  // Queues `op` on its channel, or takes the oldest operation of the other kind there. Returns
  // that partner when the pair's elements are now to be copied (both kCopying), nullptr when `op`
  // was queued or the pair failed (both kFailed: dtype or shape mismatch).
  std::shared_ptr<Op> Match(const std::shared_ptr<Op>& op) REQUIRES(mu);
  void Complete(Op& send, Op& recv) REQUIRES(mu);
  CommAborted AbortedError(const std::string& context) const REQUIRES(mu);
  void Fail(Op& op, std::exception_ptr error) REQUIRES(mu);
  void AbortLocked(int rank, std::string_view reason) REQUIRES(mu);
  std::string TimeoutMessage(const Op& op, milliseconds timeout) const REQUIRES(mu);
  // Returns once every rank has arrived at the current rendezvous. `interruptible`: check that
  // every rank called the same collective (`what`), honour abort and the deadline; a timeout aborts
  // the world. Otherwise wait unconditionally (the rest of a collective that every rank entered).
  void Rendezvous(int rank, const std::string& what, bool interruptible, Clock::time_point deadline,
                  milliseconds timeout) REQUIRES(mu);
};

// Tags of the unmatched operations of one kind between `src` and `dst`, for timeout hints.
std::string PendingTags(const std::map<ChannelKey, Channel>& channels, int src, int dst,
                        bool sends) {
  std::vector<int> tags;
  for (auto it = channels.lower_bound({src, dst, 0});
       it != channels.end() && it->first.src == src && it->first.dst == dst; ++it) {
    if (!(sends ? it->second.sends : it->second.recvs).empty()) tags.push_back(it->first.tag);
  }
  return fmt::format("{}", fmt::join(tags, ", "));
}

void LocalWorldShared::AssertOwns(const Op& op) const {
  SLUICE_CHECK(&op.world_mu == &mu, "{} is not an operation of this world", op.Describe());
}

CommAborted LocalWorldShared::AbortedError(const std::string& context) const {
  return CommAborted(fmt::format("{}: rank {} aborted: {}", context, abort_rank, abort_reason),
                     abort_rank, abort_reason);
}

void LocalWorldShared::Fail(Op& op, std::exception_ptr error) {
  AssertOwns(op);
  op.phase = Phase::kFailed;
  op.error = std::move(error);
  op.tensor =
      Tensor();  // a failed operation holds no memory (freed here: Abort and mismatch are rare)
}

std::shared_ptr<Op> LocalWorldShared::Match(const std::shared_ptr<Op>& op) {
  if (aborted) throw AbortedError(op->Describe() + " refused");
  const ChannelKey key = op->is_send ? ChannelKey{op->rank, op->peer, op->tag}
                                     : ChannelKey{op->peer, op->rank, op->tag};
  auto it = channels.try_emplace(key).first;
  Channel& channel = it->second;
  auto& others = op->is_send ? channel.recvs : channel.sends;
  if (others.empty()) {
    (op->is_send ? channel.sends : channel.recvs).push_back(op);
    return nullptr;
  }
  std::shared_ptr<Op> partner = std::move(others.front());
  others.pop_front();
  if (channel.sends.empty() && channel.recvs.empty()) channels.erase(it);

  Op& send = op->is_send ? *op : *partner;
  Op& recv = op->is_send ? *partner : *op;
  AssertOwns(send);
  AssertOwns(recv);
  if (send.dtype != recv.dtype || send.shape != recv.shape) {
    const std::string what =
        fmt::format("rank {} sent {} with tag {} but rank {} expects {}", send.rank,
                    DescribeTensor(send.dtype, send.shape), send.tag, recv.rank,
                    DescribeTensor(recv.dtype, recv.shape));
    Fail(send, std::make_exception_ptr(CommError(send.Describe() + " failed: " + what)));
    Fail(recv, std::make_exception_ptr(CommError(recv.Describe() + " failed: " + what)));
    cv.NotifyAll();
    return nullptr;
  }
  send.phase = recv.phase = Phase::kCopying;
  return partner;
}

void LocalWorldShared::Complete(Op& send, Op& recv) {
  AssertOwns(send);
  AssertOwns(recv);
  send.phase = recv.phase = Phase::kCompleted;
}

void LocalWorldShared::Post(const std::shared_ptr<Op>& op) {
  std::shared_ptr<Op> partner;
  {
    MutexLock lock(&mu);
    partner = Match(op);
  }
  if (partner == nullptr) return;
  // Outside the lock: only this thread touches the pair's tensors while they are kCopying.
  Op& send = op->is_send ? *op : *partner;
  Op& recv = op->is_send ? *partner : *op;
  CopyMatchedPair(send, recv);
  {
    MutexLock lock(&mu);
    Complete(send, recv);
  }
  cv.NotifyAll();
}

std::string LocalWorldShared::TimeoutMessage(const Op& op, milliseconds timeout) const {
  AssertOwns(op);
  std::string message =
      fmt::format("{} did not complete within {} ms: ", op.Describe(), timeout.count());
  if (op.phase == Phase::kCopying) return message + "its data was still being copied";
  const int src = op.is_send ? op.rank : op.peer, dst = op.is_send ? op.peer : op.rank;
  const auto it = channels.find({src, dst, op.tag});
  SLUICE_CHECK(it != channels.end(), "{} is posted but not in its channel", op.Describe());
  const auto& queue = op.is_send ? it->second.sends : it->second.recvs;
  const auto ahead =
      std::find_if(queue.begin(), queue.end(), [&](const auto& p) { return p.get() == &op; }) -
      queue.begin();
  if (op.is_send) {
    message += fmt::format("rank {} has posted no receive for it", op.peer);
  } else {
    message += fmt::format("rank {} has sent nothing for it", op.peer);
  }
  if (ahead > 0) {
    message += fmt::format(" ({} earlier {} on this channel wait too)", ahead,
                           op.is_send ? "sends" : "receives");
  }
  // The other side may be using another tag: say which tags it has pending.
  const std::string tags = PendingTags(channels, src, dst, !op.is_send);
  if (!tags.empty()) {
    message += fmt::format("; rank {} has unmatched {} with tags {}", op.peer,
                           op.is_send ? "receives from rank " + std::to_string(op.rank)
                                      : "sends to rank " + std::to_string(op.rank),
                           tags);
  }
  return message;
}

Tensor LocalWorldShared::Wait(Op& op, milliseconds timeout) {
  MutexLock lock(&mu);
  AssertOwns(op);
  const auto deadline = Clock::now() + timeout;
  while (!op.finished() && cv.WaitUntil(&mu, deadline)) {
  }
  if (!op.finished()) throw CommTimeout(TimeoutMessage(op, timeout));
  if (op.phase == Phase::kFailed) std::rethrow_exception(op.error);
  if (op.is_send) return Tensor();
  if (op.handed_over) {
    throw InvalidArgument(op.Describe() + ": already waited for; its tensor was handed over");
  }
  op.handed_over = true;
  return std::move(op.tensor);
}

bool LocalWorldShared::Test(Op& op) {
  MutexLock lock(&mu);
  AssertOwns(op);
  if (op.phase == Phase::kFailed) std::rethrow_exception(op.error);
  return op.phase == Phase::kCompleted;
}

RequestState LocalWorldShared::State(const Op& op) {
  MutexLock lock(&mu);
  AssertOwns(op);
  switch (op.phase) {
    case Phase::kPosted:
    case Phase::kCopying:
      return RequestState::kPending;
    case Phase::kCompleted:
      return RequestState::kCompleted;
    case Phase::kFailed:
      return RequestState::kFailed;
  }
  return RequestState::kFailed;
}

void LocalWorldShared::AbortLocked(int rank, std::string_view reason) {
  if (aborted) return;
  aborted = true;
  abort_rank = rank;
  abort_reason = reason;
  for (auto& [key, channel] : channels) {
    for (auto* queue : {&channel.sends, &channel.recvs}) {
      for (const std::shared_ptr<Op>& op : *queue) {
        Fail(*op, std::make_exception_ptr(AbortedError(op->Describe() + " failed")));
      }
    }
  }
  channels.clear();
  cv.NotifyAll();
}

void LocalWorldShared::Abort(int rank, std::string_view reason) noexcept {
  MutexLock lock(&mu);
  AbortLocked(rank, reason);
}

void LocalWorldShared::Rendezvous(int rank, const std::string& what, bool interruptible,
                                  Clock::time_point deadline, milliseconds timeout) {
  if (interruptible) {
    if (aborted) throw AbortedError(fmt::format("rank {}: {} refused", rank, what));
    if (arrived == 0) {
      signature = what;
      signature_rank = rank;
    } else if (what != signature) {
      const std::string reason =
          fmt::format("collective mismatch: rank {} called {} while rank {} called {}", rank, what,
                      signature_rank, signature);
      AbortLocked(rank, reason);
      throw CommError(fmt::format("rank {}: {}", rank, reason));
    }
  }
  const uint64_t my_round = round;
  present[rank] = true;
  if (++arrived == size) {
    arrived = 0;
    ++round;
    std::fill(present.begin(), present.end(), false);
    cv.NotifyAll();
    return;
  }
  if (!interruptible) {
    while (round == my_round) cv.Wait(&mu);
    return;
  }
  while (round == my_round && !aborted && cv.WaitUntil(&mu, deadline)) {
  }
  if (round != my_round) return;
  if (aborted) throw AbortedError(fmt::format("rank {}: {} failed", rank, what));
  std::vector<int> missing;
  for (int r = 0; r < size; ++r) {
    if (!present[r]) missing.push_back(r);
  }
  const std::string message =
      fmt::format("rank {}: {} timed out after {} ms waiting for rank(s) {}", rank, what,
                  timeout.count(), fmt::join(missing, ", "));
  AbortLocked(rank, message);
  throw CommTimeout(message);
}

void LocalWorldShared::Barrier(int rank, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  MutexLock lock(&mu);
  Rendezvous(rank, "barrier", /*interruptible=*/true, deadline, timeout);
}

void LocalWorldShared::AllReduceSum(int rank, const Tensor& tensor, milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  const std::string what = "all_reduce_sum of " + DescribeTensor(tensor.dtype(), tensor.shape());
  std::vector<Tensor> all;  // every rank's tensor, in rank order
  {
    MutexLock lock(&mu);
    operands[rank] = tensor;
    try {
      Rendezvous(rank, what, /*interruptible=*/true, deadline, timeout);
    } catch (...) {
      operands[rank] = Tensor();
      throw;
    }
    all = operands;
  }
  // Reduce-scatter: slice r of every tensor, summed in rank order, into slice r of rank r's.
  const int64_t n = tensor.numel();
  const auto begin = [&](int r) { return n * r / size; };
  const int64_t offset = begin(rank) * static_cast<int64_t>(SizeOf(tensor.dtype()));
  std::vector<const void*> slices;
  for (const Tensor& t : all) {
    slices.push_back(static_cast<const std::byte*>(t.raw_data()) + offset);
  }
  SumInRankOrder(tensor.dtype(), slices, begin(rank + 1) - begin(rank),
                 static_cast<std::byte*>(tensor.raw_data()) + offset);
  {
    MutexLock lock(&mu);
    Rendezvous(rank, what, /*interruptible=*/false, deadline, timeout);
  }
  // All-gather: every other rank's reduced slice into this rank's tensor.
  const size_t elem = SizeOf(tensor.dtype());
  for (int r = 0; r < size; ++r) {
    if (r == rank || begin(r) == begin(r + 1)) continue;
    std::memcpy(static_cast<char*>(tensor.raw_data()) + begin(r) * elem,
                static_cast<const char*>(all[r].raw_data()) + begin(r) * elem,
                (begin(r + 1) - begin(r)) * elem);
  }
  {
    MutexLock lock(&mu);
    Rendezvous(rank, what, /*interruptible=*/false, deadline, timeout);
    operands[rank] = Tensor();
  }
}

std::shared_ptr<PendingSum> LocalWorldShared::PostSum(int rank, const Tensor& tensor) {
  const size_t bytes = static_cast<size_t>(tensor.numel()) * SizeOf(tensor.dtype());
  MutexLock lock(&mu);
  const std::string what = "iall_reduce_sum of " + DescribeTensor(tensor.dtype(), tensor.shape());
  if (aborted) throw AbortedError(fmt::format("rank {}: {} refused", rank, what));
  const uint64_t seq = sums_posted[rank]++;
  std::shared_ptr<PendingSum>& slot = sums[seq];
  if (slot == nullptr) {
    slot = std::make_shared<PendingSum>();
    slot->dtype = tensor.dtype();
    slot->shape = tensor.shape();
    slot->first_rank = rank;
    slot->parts.resize(size);
    slot->posted.assign(size, false);
  } else if (slot->dtype != tensor.dtype() || slot->shape != tensor.shape()) {
    const std::string reason = fmt::format(
        "collective mismatch: rank {} posted {} while rank {} posted iall_reduce_sum of {}", rank,
        what, slot->first_rank, DescribeTensor(slot->dtype, slot->shape));
    AbortLocked(rank, reason);
    throw CommError(fmt::format("rank {}: {}", rank, reason));
  }
  std::shared_ptr<PendingSum> sum = slot;
  sum->parts[rank].resize(bytes);
  std::memcpy(sum->parts[rank].data(), tensor.raw_data(), bytes);
  sum->posted[rank] = true;
  if (++sum->count == size) {  // the last: add in rank order, once, for every rank
    std::vector<const void*> sources;
    for (const auto& part : sum->parts) sources.push_back(part.data());
    sum->result.resize(bytes);
    SumInRankOrder(sum->dtype, sources, tensor.numel(), sum->result.data());
    sum->parts.clear();
    sum->done = true;
    sums.erase(seq);
    cv.NotifyAll();
  }
  return sum;
}

void LocalWorldShared::WaitSum(int rank, PendingSum& sum, const Tensor& tensor,
                               milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  MutexLock lock(&mu);
  while (!sum.done && !aborted && cv.WaitUntil(&mu, deadline)) {
  }
  const std::string what = "iall_reduce_sum of " + DescribeTensor(sum.dtype, sum.shape);
  if (sum.done) {
    std::memcpy(tensor.raw_data(), sum.result.data(), sum.result.size());
    return;
  }
  if (aborted) throw AbortedError(fmt::format("rank {}: {} failed", rank, what));
  std::vector<int> missing;
  for (int r = 0; r < size; ++r) {
    if (!sum.posted[r]) missing.push_back(r);
  }
  const std::string message =
      fmt::format("rank {}: {} timed out after {} ms waiting for rank(s) {}", rank, what,
                  timeout.count(), fmt::join(missing, ", "));
  AbortLocked(rank, message);
  throw CommTimeout(message);
}

bool LocalWorldShared::SumDone(const PendingSum& sum) {
  MutexLock lock(&mu);
  if (!sum.done && aborted) throw AbortedError("iall_reduce_sum failed");
  return sum.done;
}

class LocalRequest final : public RequestImpl {
 public:
  LocalRequest(std::shared_ptr<LocalWorldShared> shared, std::shared_ptr<Op> op)
      : shared_(std::move(shared)), op_(std::move(op)) {}

  Tensor Wait(milliseconds timeout) override { return shared_->Wait(*op_, timeout); }
  bool Test() override { return shared_->Test(*op_); }
  RequestState state() const override { return shared_->State(*op_); }
  std::string Describe() const override { return op_->Describe(); }

 private:
  std::shared_ptr<LocalWorldShared> shared_;
  std::shared_ptr<Op> op_;
};

// A rank's handle on a PendingSum: Wait writes the sum into its tensor.
class LocalSumRequest final : public RequestImpl {
 public:
  LocalSumRequest(std::shared_ptr<LocalWorldShared> shared, std::shared_ptr<PendingSum> sum,
                  int rank, Tensor tensor)
      : shared_(std::move(shared)), sum_(std::move(sum)), rank_(rank), tensor_(std::move(tensor)) {}

  Tensor Wait(milliseconds timeout) override {
    shared_->WaitSum(rank_, *sum_, tensor_, timeout);
    return tensor_;
  }
  bool Test() override { return shared_->SumDone(*sum_); }
  RequestState state() const override {
    try {
      return shared_->SumDone(*sum_) ? RequestState::kCompleted : RequestState::kPending;
    } catch (const CommAborted&) {
      return RequestState::kFailed;
    }
  }
  std::string Describe() const override {
    return fmt::format("rank {}: iall_reduce_sum of {}", rank_,
                       DescribeTensor(tensor_.dtype(), tensor_.shape()));
  }

 private:
  std::shared_ptr<LocalWorldShared> shared_;
  std::shared_ptr<PendingSum> sum_;
  int rank_;
  Tensor tensor_;
};

class LocalCommunicator final : public Communicator {
 public:
  LocalCommunicator(std::shared_ptr<LocalWorldShared> shared, int rank)
      : shared_(std::move(shared)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return shared_->size; }
  milliseconds default_timeout() const override { return shared_->timeout; }
  void Abort(std::string_view reason) noexcept override { shared_->Abort(rank_, reason); }

 protected:
  Request DoIsend(const Tensor& tensor, int peer, int tag) override {
    return Start(std::make_shared<Op>(shared_->mu, /*is_send=*/true, rank_, peer, tag, tensor));
  }
  Request DoIrecv(int peer, int tag, DType dtype, const Shape& shape,
                  Allocator& allocator) override {
    Tensor destination = Tensor::Empty(shape, dtype, allocator);
    return Start(std::make_shared<Op>(shared_->mu, /*is_send=*/false, rank_, peer, tag,
                                      std::move(destination)));
  }
  void DoBarrier(milliseconds timeout) override { shared_->Barrier(rank_, timeout); }
  void DoAllReduceSum(const Tensor& tensor, milliseconds timeout) override {
    shared_->AllReduceSum(rank_, tensor, timeout);
  }
  Request DoIallReduceSum(const Tensor& tensor) override {
    return Request(
        std::make_shared<LocalSumRequest>(shared_, shared_->PostSum(rank_, tensor), rank_, tensor),
        shared_->timeout);
  }

 private:
  Request Start(std::shared_ptr<Op> op) {
    shared_->Post(op);
    return Request(std::make_shared<LocalRequest>(shared_, std::move(op)), shared_->timeout);
  }

  std::shared_ptr<LocalWorldShared> shared_;
  const int rank_;
};

}  // namespace

LocalWorld::LocalWorld(int size, LocalWorldOptions options) {
  if (size < 1) {
    throw InvalidArgument(fmt::format("LocalWorld: size must be at least 1, got {}", size));
  }
  if (options.timeout.count() < 0) {
    throw InvalidArgument(fmt::format("LocalWorld: timeout must not be negative, got {} ms",
                                      options.timeout.count()));
  }
  auto shared = std::make_shared<LocalWorldShared>(size, std::min(options.timeout, kMaxTimeout));
  for (int r = 0; r < size; ++r) comms_.push_back(std::make_unique<LocalCommunicator>(shared, r));
}

LocalWorld::~LocalWorld() = default;

Communicator& LocalWorld::comm(int rank) {
  if (rank < 0 || rank >= size()) {
    throw InvalidArgument(fmt::format("LocalWorld: rank {} is outside [0, {})", rank, size()));
  }
  return *comms_[rank];
}

}  // namespace sluice
