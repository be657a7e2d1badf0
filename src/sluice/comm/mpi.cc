#include "sluice/comm/mpi.h"

#include <mpi.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <climits>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sluice/comm/rank_order_sum.h"
#include "sluice/core/mutex.h"
#include "sluice/core/thread_annotations.h"

#if defined(__SANITIZE_THREAD__)
#define SLUICE_MPI_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define SLUICE_MPI_TSAN 1
#endif
#endif
#if SLUICE_MPI_TSAN
#include <sanitizer/tsan_interface.h>
extern "C" {  // ThreadSanitizer's own entry points, which its public header does not declare
void __tsan_read_range(void* addr, unsigned long size);   // NOLINT(google-runtime-int)
void __tsan_write_range(void* addr, unsigned long size);  // NOLINT(google-runtime-int)
void __tsan_ignore_thread_begin();
void __tsan_ignore_thread_end();
}
#endif

namespace sluice {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

namespace {

// Set once by MpiWorld's constructor, before any other sluice MPI call: true when the library gave
// less than MPI_THREAD_MULTIPLE, so that every MPI call must hold g_mpi_mu.
std::atomic<bool> g_serialize{false};
// A plain std::mutex, not an annotated sluice::Mutex: it guards calls into the MPI library rather
// than fields, and is taken only when g_serialize is set — a conditional lock around code, which
// the analysis has nothing to check on. MpiCall is its only user.
std::mutex g_mpi_mu;
// Every world rank's host (MPI_Get_processor_name), gathered once by MpiWorld's constructor before
// any communicator exists and read-only after: messages name a peer's host with it.
std::vector<std::string> g_world_hosts;

// Holds the process-wide MPI mutex for one MPI call when calls must be serialized. Under
// ThreadSanitizer, what the library reads and writes during the call is not recorded: OpenMPI is
// not instrumented and orders its own copies (into its shared-memory segment, out of another
// thread's send buffer that its progress moves on) with atomics that ThreadSanitizer cannot see,
// so they looked like races between threads. What MPI does with sluice's buffers is told to
// ThreadSanitizer by LibraryAccess instead. Synchronization the library makes is still seen.
class MpiCall {
 public:
  MpiCall() {
    if (g_serialize.load(std::memory_order_relaxed)) lock_ = std::unique_lock(g_mpi_mu);
#if SLUICE_MPI_TSAN
    __tsan_ignore_thread_begin();
#endif
  }
  ~MpiCall() {
#if SLUICE_MPI_TSAN
    __tsan_ignore_thread_end();
#endif
  }
  MpiCall(const MpiCall&) = delete;
  MpiCall& operator=(const MpiCall&) = delete;

 private:
  std::unique_lock<std::mutex> lock_;
};

std::string MpiErrorString(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    return fmt::format("MPI error {}", code);
  return std::string(text, length);
}

// Throws CommError "<what>: <MPI's message>" unless `code` is MPI_SUCCESS.
void Check(int code, std::string_view what) {
  if (code != MPI_SUCCESS) throw CommError(fmt::format("{}: {}", what, MpiErrorString(code)));
}

bool MpiFinalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

// ---- Headers and signatures ---------------------------------------------------------------------

// A dtype and shape as fixed-size integers: {dtype, rank, dims..., 0 padding}.
constexpr int kHeaderLength = 2 + kMaxRank;
using Header = std::array<int64_t, kHeaderLength>;

Header Encode(DType dtype, const Shape& shape) {
  Header h{};
  h[0] = static_cast<int64_t>(dtype);
  h[1] = shape.rank();
  for (int i = 0; i < shape.rank(); ++i) h[2 + i] = shape[i];
  return h;
}

// "f32[2, 3]", or a note that the peer sent something that is not a header.
std::string DescribeHeader(const Header& h) {
  if (h[0] < 0 || h[0] > static_cast<int64_t>(DType::kI64) || h[1] < 0 || h[1] > kMaxRank) {
    return fmt::format("an unreadable header (dtype {}, rank {})", h[0], h[1]);
  }
  return DescribeTensor(static_cast<DType>(h[0]),
                        Shape(std::span<const int64_t>(h.data() + 2, static_cast<size_t>(h[1]))));
}

// What a rank calls as a collective: {kind, header of the tensor}; every rank's must be equal.
enum class CollectiveKind : int64_t { kBarrier, kAllReduceSum, kSplit, kIallReduceSum };
constexpr int kSignatureLength = 1 + kHeaderLength;
using Signature = std::array<int64_t, kSignatureLength>;

Signature MakeSignature(CollectiveKind kind, DType dtype = DType::kF32, const Shape& shape = {}) {
  Signature s{};
  s[0] = static_cast<int64_t>(kind);
  if (kind == CollectiveKind::kAllReduceSum || kind == CollectiveKind::kIallReduceSum) {
    const Header h = Encode(dtype, shape);
    std::copy(h.begin(), h.end(), s.begin() + 1);
  }
  return s;
}

std::string DescribeSignature(const Signature& s) {
  switch (static_cast<CollectiveKind>(s[0])) {
    case CollectiveKind::kBarrier:
      return "barrier";
    case CollectiveKind::kSplit:
      return "split";
    case CollectiveKind::kAllReduceSum:
    case CollectiveKind::kIallReduceSum: {
      Header h;
      std::copy(s.begin() + 1, s.end(), h.begin());
      return (static_cast<CollectiveKind>(s[0]) == CollectiveKind::kAllReduceSum
                  ? "all_reduce_sum of "
                  : "iall_reduce_sum of ") +
             DescribeHeader(h);
    }
  }
  return fmt::format("an unknown collective ({})", s[0]);
}

// Polls `done` until it returns true (then true) or `deadline` passes (then false): a brief spin,
// then sleeps growing to 100 µs, so a long wait costs little CPU and a message that arrives
// during one costs at most ~100 µs of latency (pipeline stages wait for many small messages).
template <typename Done>
bool PollUntil(Clock::time_point deadline, Done done) {
  const auto spin_until = Clock::now() + std::chrono::microseconds(50);
  auto nap = std::chrono::microseconds(10);
  while (true) {
    if (done()) return true;
    const auto now = Clock::now();
    if (now >= deadline) return false;
    if (now < spin_until) continue;
    std::this_thread::sleep_for(std::min<Clock::duration>(nap, deadline - now));
    nap = std::min(nap * 2, std::chrono::microseconds(100));
  }
}

// ---- What ThreadSanitizer is told of MPI's use of the buffers -----------------------------------

// MPI reads a send's buffers and writes a receive's at any time from the post to the completion,
// on whichever thread drives its progress: a Test on any communicator moves every pending message
// of the process on, so the main thread's all-reduce may copy a message of a stage's thread.
// OpenMPI is not instrumented, and it orders its copies against each other and against the
// owner's next access with its own atomics, which ThreadSanitizer does not see: its copies are
// not recorded at all (tests/mpi/tsan.supp). Instead sluice tells ThreadSanitizer what the MPI
// standard promises. Each posted operation gets a fiber — a ThreadSanitizer thread of its own,
// standing for the library — that reads every buffer the operation sends from and writes every
// buffer it receives into, ordered after everything its poster did before the post; the thread
// that sees the operation complete is then ordered after the fiber. So any access to a pending
// receive's buffer, or a write into a pending send's, by any thread (the posting one too) is
// reported as a data race with the fiber, whose name says which operation it stands for and whose
// creation stack shows the post. Without ThreadSanitizer the class does nothing.
// Used by one thread at a time, as its operation is (InFlight).
class LibraryAccess {
 public:
  LibraryAccess() = default;
  LibraryAccess(const LibraryAccess&) = delete;
  LibraryAccess& operator=(const LibraryAccess&) = delete;
  // An operation is destroyed only after it completed (or is leaked while pending).
  ~LibraryAccess() { Complete(); }

  struct Range {
    const void* data;
    size_t bytes;
  };
  // Before the post: from now until Complete the library reads `reads` and writes `writes`;
  // name() says what the operation is (called only under ThreadSanitizer). Completes the previous
  // post first (an operation reused, one chunk after another).
  template <typename Name>
  void Post([[maybe_unused]] Name&& name, [[maybe_unused]] std::initializer_list<Range> reads,
            [[maybe_unused]] std::initializer_list<Range> writes) {
#if SLUICE_MPI_TSAN
    Complete();
    fiber_ = __tsan_create_fiber(0);
    __tsan_set_fiber_name(fiber_, ("MPI: " + std::string(name())).c_str());
    AccessAsFiber(fiber_, reads.begin(), reads.size(), writes.begin(), writes.size());
#endif
  }

  // The operation completed, as this thread saw: what the library did with the buffers is
  // ordered before this thread's next access. Does nothing when nothing is pending.
  void Complete() {
#if SLUICE_MPI_TSAN
    if (fiber_ == nullptr) return;
    JoinFiber(fiber_);
    __tsan_destroy_fiber(fiber_);
    fiber_ = nullptr;
#endif
  }

 private:
#if SLUICE_MPI_TSAN
  // While the thread runs as the fiber, every access it makes is the fiber's: these two are not
  // instrumented, so the fiber makes only the accesses they declare (not the reads of `reads`).
  __attribute__((no_sanitize("thread"))) static void AccessAsFiber(void* fiber, const Range* reads,
                                                                   size_t n_reads,
                                                                   const Range* writes,
                                                                   size_t n_writes) {
    void* poster = __tsan_get_current_fiber();
    __tsan_switch_to_fiber(fiber, 0);  // the fiber after everything before the post
    for (size_t i = 0; i < n_reads; ++i) {
      if (reads[i].bytes > 0) __tsan_read_range(const_cast<void*>(reads[i].data), reads[i].bytes);
    }
    for (size_t i = 0; i < n_writes; ++i) {
      if (writes[i].bytes > 0)
        __tsan_write_range(const_cast<void*>(writes[i].data), writes[i].bytes);
    }
    __tsan_switch_to_fiber(poster, __tsan_switch_to_fiber_no_sync);  // the poster not after it
  }
  __attribute__((no_sanitize("thread"))) static void JoinFiber(void* fiber) {
    void* me = __tsan_get_current_fiber();
    __tsan_switch_to_fiber(fiber, __tsan_switch_to_fiber_no_sync);
    __tsan_switch_to_fiber(me, 0);  // this thread after the fiber
  }

  void* fiber_ = nullptr;  // the library's hands while an operation is pending
#endif
};

// ---- In-flight MPI operations -------------------------------------------------------------------

// MPI requests together with every buffer they read or write, kept alive until all complete.
// Used by one thread at a time: the owner of its Request, or (once orphaned) MpiCommShared under
// mu.
class InFlight {
 public:
  virtual ~InFlight() = default;
  // Tests every outstanding MPI request once; true when none is left.
  virtual bool Progress() = 0;
  // Cancels and frees the outstanding MPI requests; the buffers must then never be freed.
  virtual void Cancel() = 0;
};

// Tests `request` once (unless already done). Returns MPI's error code for a finished request.
int TestOnce(MPI_Request& request, bool& done) {
  done = request == MPI_REQUEST_NULL;
  if (done) return MPI_SUCCESS;
  int flag = 0;
  int code;
  {
    MpiCall call;
    code = MPI_Test(&request, &flag, MPI_STATUS_IGNORE);
  }
  if (code != MPI_SUCCESS) {
    request = MPI_REQUEST_NULL;  // an error finishes the request (MPI has freed it)
    done = true;
    return code;
  }
  done = flag != 0;
  return MPI_SUCCESS;
}

void CancelAll(std::span<MPI_Request> requests) {
  MpiCall call;
  for (MPI_Request& r : requests) {
    if (r == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&r);
    MPI_Request_free(&r);
  }
}

enum class Phase { kPending, kCompleted, kFailed };

// What Request::state reports for an operation in this phase.
RequestState StateOf(Phase phase) {
  switch (phase) {
    case Phase::kPending:
      return RequestState::kPending;
    case Phase::kCompleted:
      return RequestState::kCompleted;
    case Phase::kFailed:
      return RequestState::kFailed;
  }
  return RequestState::kFailed;
}

// One send or receive (see mpi.h for the three MPI operations it is made of).
class P2POp final : public InFlight {
 public:
  P2POp(bool is_send, int rank, std::string me, int peer, std::string peer_name, int tag,
        DType dtype, const Shape& shape, Tensor tensor)
      : is_send(is_send),
        rank(rank),
        me(std::move(me)),
        peer(peer),
        peer_name(std::move(peer_name)),
        tag(tag),
        dtype(dtype),
        shape(shape),
        tensor(std::move(tensor)),
        mine(Encode(dtype, shape)) {}

  // "rank 0: send f32[2, 3] to rank 1 (tag 5)"; "rank 2 (rank 0 of its communicator): ..." on a
  // communicator of Split (MpiCommShared::Me).
  std::string Describe() const {
    return fmt::format("{}: {} {} {} rank {} (tag {})", me, is_send ? "send" : "receive",
                       DescribeTensor(dtype, shape), is_send ? "to" : "from", peer, tag);
  }

  bool Progress() override {
    if (phase != Phase::kPending) return true;
    bool all_done = true;
    for (size_t i = 0; i < requests.size(); ++i) {
      bool done = false;
      const int code = TestOnce(requests[i], done);
      if (code != MPI_SUCCESS && mpi_error == MPI_SUCCESS) mpi_error = code;
      all_done = all_done && done;
    }
    if (all_done) {
      library.Complete();
      Settle();
    }
    return all_done;
  }

  void Cancel() override { CancelAll(requests); }

  // Timeout hint: what the operation still waits for.
  std::string Missing() const {
    if (requests[kTheirHeader] != MPI_REQUEST_NULL) {
      return is_send ? fmt::format("{} has posted no receive for it", peer_name)
                     : fmt::format("{} has sent nothing for it", peer_name);
    }
    return "the peer has posted its half, but the data is still in transit";
  }

  static constexpr size_t kData = 0, kMyHeader = 1, kTheirHeader = 2;

  const bool is_send;
  const int rank;
  const std::string me;  // MpiCommShared::Me()
  const int peer;
  const std::string peer_name;  // MpiCommShared::Who(peer)
  const int tag;
  const DType dtype;
  const Shape shape;
  Tensor tensor;  // send: the (packed) source; receive: the destination; dropped when finished
  const Header mine;
  Header theirs{};
  std::array<MPI_Request, 3> requests{MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  int mpi_error = MPI_SUCCESS;
  Phase phase = Phase::kPending;
  std::exception_ptr error;  // when kFailed
  bool handed_over = false;  // receive: Wait has returned the tensor
  LibraryAccess library;     // last: completed before the buffers above are freed

 private:
  // Every MPI request is done: compare the headers and finish. A mismatch is named even when it
  // also made MPI fail the data message (a longer message than expected is truncated).
  void Settle() {
    if (theirs != mine) {
      const Header& sent = is_send ? mine : theirs;
      const Header& expected = is_send ? theirs : mine;
      Fail(CommError(fmt::format("{} failed: rank {} sent {} with tag {} but rank {} expects {}",
                                 Describe(), is_send ? rank : peer, DescribeHeader(sent), tag,
                                 is_send ? peer : rank, DescribeHeader(expected))));
    } else if (mpi_error != MPI_SUCCESS) {
      Fail(CommError(Describe() + " failed: " + MpiErrorString(mpi_error)));
    } else {
      phase = Phase::kCompleted;
      if (is_send) tensor = Tensor();  // the elements are no longer read: release them
    }
  }

  void Fail(const CommError& e) {
    phase = Phase::kFailed;
    error = std::make_exception_ptr(e);
    tensor = Tensor();
  }
};

// One non-blocking collective MPI operation and its buffers.
class CollectiveOp final : public InFlight {
 public:
  bool Progress() override {
    bool done = false;
    code = TestOnce(request, done);
    if (done) library.Complete();
    return done;
  }
  void Cancel() override { CancelAll(std::span(&request, 1)); }

  MPI_Request request = MPI_REQUEST_NULL;
  int code = MPI_SUCCESS;
  Tensor tensor;                   // the all-reduce operand, read by MPI
  std::vector<int64_t> words;      // signatures: this rank's, then the gathered ones
  std::vector<std::byte> scratch;  // gathered all-reduce chunks
  LibraryAccess library;           // last: completed before the buffers above are freed
};

// One IallReduceSum: the gather of every rank's signature and the gather of every rank's whole
// operand, both posted at once (MPI_Iallgather); the sum in rank order follows their completion.
class ReductionOp final : public InFlight {
 public:
  bool Progress() override {
    bool all_done = true;
    for (MPI_Request& r : requests) {
      bool done = false;
      const int c = TestOnce(r, done);
      if (c != MPI_SUCCESS && code == MPI_SUCCESS) code = c;
      all_done = all_done && done;
    }
    if (all_done) library.Complete();
    return all_done;
  }
  void Cancel() override { CancelAll(requests); }

  std::array<MPI_Request, 2> requests{MPI_REQUEST_NULL, MPI_REQUEST_NULL};  // signatures, data
  int code = MPI_SUCCESS;
  Tensor tensor;                   // the operand, read by MPI; the sum is written into it
  std::vector<int64_t> words;      // this rank's signature, then the gathered ones
  std::vector<std::byte> scratch;  // every rank's operand, by rank
  LibraryAccess library;           // last: completed before the buffers above are freed
};

// Operands up to this size are reduced without blocking (IallReduceSum); the scratch buffer holds
// every rank's, size × the operand's bytes. Larger ones run the blocking AllReduceSum in the post.
constexpr size_t kMaxNonBlockingReduction = size_t{1} << 20;

}  // namespace

// ---- Shared communicator state ------------------------------------------------------------------

// What a communicator shares with its Requests, which may live on other threads. The MPI
// communicators, rank, size and timeout are fixed at construction; `mu` guards the rest (the
// fields say GUARDED_BY).
struct MpiCommShared {
  // Duplicates `parent` into the three private communicators. Collective over `parent`.
  MpiCommShared(MPI_Comm parent, milliseconds timeout) : timeout(timeout) {
    MpiCall call;
    for (MPI_Comm* c : {&data, &send_headers, &recv_headers}) {
      Check(MPI_Comm_dup(parent, c), "MPI_Comm_dup");
      Check(MPI_Comm_set_errhandler(*c, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler");
    }
    MPI_Comm_rank(data, &rank);
    MPI_Comm_size(data, &size);
    // Each member's world rank, for messages (Who).
    MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
    MPI_Comm_group(data, &group);
    MPI_Comm_group(MPI_COMM_WORLD, &world);
    std::vector<int> members(static_cast<size_t>(size));
    for (int r = 0; r < size; ++r) members[r] = r;
    world_ranks.resize(members.size());
    MPI_Group_translate_ranks(group, size, members.data(), world, world_ranks.data());
    MPI_Group_free(&group);
    MPI_Group_free(&world);
  }

  // Rank r of this communicator as a message names it: "rank 1 (world rank 3 on host node3)",
  // or "rank 3 (host node3)" on the world.
  std::string Who(int r) const {
    if (r < 0 || r >= size) return fmt::format("rank {}", r);
    const int w = world_ranks[r];
    const std::string host =
        w >= 0 && static_cast<size_t>(w) < g_world_hosts.size() ? g_world_hosts[w] : "";
    if (w == r)
      return host.empty() ? fmt::format("rank {}", r) : fmt::format("rank {} (host {})", r, host);
    return host.empty() ? fmt::format("rank {} (world rank {})", r, w)
                        : fmt::format("rank {} (world rank {} on host {})", r, w, host);
  }

  // This process as a message names it: its world rank, and its rank here when that differs —
  // "rank 3", or "rank 3 (rank 1 of its communicator)". The world rank is the one the abort line
  // ("sluice: rank 3 aborts: ...") and mpirun name.
  std::string Me() const {
    const int w = rank < static_cast<int>(world_ranks.size()) ? world_ranks[rank] : rank;
    return w == rank ? fmt::format("rank {}", rank)
                     : fmt::format("rank {} (rank {} of its communicator)", w, rank);
  }

  ~MpiCommShared() {
    if (MpiFinalized()) return;  // a precondition was broken; nothing can be done safely
    const auto deadline = Clock::now() + timeout;
    PollUntil(deadline, [&] {
      MutexLock lock(&mu);
      SweepLocked();
      return orphans.empty();
    });
    MutexLock lock(&mu);
    if (!orphans.empty()) {
      std::fprintf(stderr,
                   "sluice: rank %d: %zu MPI operation(s) whose Request was dropped did not "
                   "complete within %lld ms; cancelled, their buffers are leaked\n",
                   rank, orphans.size(), static_cast<long long>(timeout.count()));
      for (const std::shared_ptr<InFlight>& op : orphans) {
        op->Cancel();
        new std::shared_ptr<InFlight>(op);  // leaked on purpose: MPI may still touch the buffers
      }
    }
    MpiCall call;
    for (MPI_Comm* c : {&data, &send_headers, &recv_headers}) MPI_Comm_free(c);
  }

  // Tests every orphaned operation once and forgets those that finished.
  void Sweep() EXCLUDES(mu) {
    MutexLock lock(&mu);
    SweepLocked();
  }
  void SweepLocked() REQUIRES(mu) {
    std::erase_if(orphans, [](const std::shared_ptr<InFlight>& op) { return op->Progress(); });
  }
  // Keeps `op` (pending, its Request dropped) until a later Sweep sees it finish.
  void Adopt(std::shared_ptr<InFlight> op) EXCLUDES(mu) {
    MutexLock lock(&mu);
    orphans.push_back(std::move(op));
  }

  // Throws CommAborted if a collective timed out on this communicator.
  void CheckAborted(std::string_view context) EXCLUDES(mu) {
    MutexLock lock(&mu);
    if (!aborted) return;
    throw CommAborted(fmt::format("{}: rank {} aborted: {}", context, rank, abort_reason), rank,
                      abort_reason);
  }
  void AbortLocally(const std::string& reason) EXCLUDES(mu) {
    MutexLock lock(&mu);
    if (aborted) return;
    aborted = true;
    abort_reason = reason;
  }

  // Every rank but this one, as Who names them.
  std::string Others() const {
    std::vector<std::string> others;
    for (int r = 0; r < size; ++r) {
      if (r != rank) others.push_back(Who(r));
    }
    return others.empty() ? "none" : fmt::format("{}", fmt::join(others, ", "));
  }

  // Runs `op` (already started) to completion, or throws CommTimeout after aborting locally.
  void WaitCollective(const std::shared_ptr<CollectiveOp>& op, const std::string& what,
                      Clock::time_point deadline, milliseconds timeout) {
    if (!PollUntil(deadline, [&] { return op->Progress(); })) {
      const std::string message = fmt::format(
          "{}: {} timed out after {} ms: not every one of the {} ranks of the communicator "
          "has entered it (its other ranks: {})",
          Me(), what, timeout.count(), size, Others());
      Adopt(op);
      AbortLocally(message);
      throw CommTimeout(message);
    }
    Check(op->code, fmt::format("rank {}: {}", rank, what));
  }

  // Gathers every rank's signature and checks that all called the same collective as this one.
  void AgreeOn(const Signature& signature, Clock::time_point deadline, milliseconds timeout) {
    const std::string what = DescribeSignature(signature);
    CheckAborted(fmt::format("{}: {} refused", Me(), what));
    Sweep();
    auto op = std::make_shared<CollectiveOp>();
    op->words.resize(kSignatureLength * (1 + size));
    std::copy(signature.begin(), signature.end(), op->words.begin());
    op->library.Post([&] { return fmt::format("{}: {}", Me(), what); },
                     {{op->words.data(), sizeof(Signature)}},
                     {{op->words.data() + kSignatureLength, sizeof(Signature) * size}});
    {
      MpiCall call;
      Check(MPI_Iallgather(op->words.data(), kSignatureLength, MPI_INT64_T,
                           op->words.data() + kSignatureLength, kSignatureLength, MPI_INT64_T, data,
                           &op->request),
            fmt::format("rank {}: {}: MPI_Iallgather", rank, what));
    }
    WaitCollective(op, what, deadline, timeout);
    const auto row = [&](int r) {
      Signature s;
      std::copy_n(op->words.begin() + kSignatureLength * (1 + r), kSignatureLength, s.begin());
      return s;
    };
    const Signature first = row(0);
    for (int r = 1; r < size; ++r) {
      if (row(r) == first) continue;
      const std::string reason =
          fmt::format("collective mismatch: rank {} called {} while rank 0 called {}", r,
                      DescribeSignature(row(r)), DescribeSignature(first));
      AbortLocally(reason);
      throw CommError(fmt::format("rank {}: {}", rank, reason));
    }
  }

  MPI_Comm data = MPI_COMM_NULL;          // elements and collectives
  MPI_Comm send_headers = MPI_COMM_NULL;  // a send's header, to the receiver
  MPI_Comm recv_headers = MPI_COMM_NULL;  // a receive's header, to the sender
  int rank = 0;
  int size = 0;
  std::vector<int> world_ranks;  // by rank of this communicator; set at construction
  const milliseconds timeout;

  Mutex mu;
  std::vector<std::shared_ptr<InFlight>> orphans GUARDED_BY(mu);  // Requests dropped while pending
  bool aborted GUARDED_BY(mu) = false;                            // set once, never cleared
  std::string abort_reason GUARDED_BY(mu);
};

namespace {

class MpiRequest final : public RequestImpl {
 public:
  MpiRequest(std::shared_ptr<MpiCommShared> shared, std::shared_ptr<P2POp> op)
      : shared_(std::move(shared)), op_(std::move(op)) {}

  // A pending operation outlives its Request: the communicator keeps testing it.
  ~MpiRequest() override {
    if (op_->phase == Phase::kPending) shared_->Adopt(std::move(op_));
  }

  Tensor Wait(milliseconds timeout) override {
    P2POp& op = *op_;
    if (!PollUntil(Clock::now() + timeout, [&] {
          shared_->CheckAborted(op.Describe() + " failed");
          return op.Progress();
        })) {
      throw CommTimeout(fmt::format("{} did not complete within {} ms: {}", op.Describe(),
                                    timeout.count(), op.Missing()));
    }
    if (op.phase == Phase::kFailed) std::rethrow_exception(op.error);
    if (op.is_send) return Tensor();
    if (op.handed_over) {
      throw InvalidArgument(op.Describe() + ": already waited for; its tensor was handed over");
    }
    op.handed_over = true;
    return std::move(op.tensor);
  }

  bool Test() override {
    shared_->CheckAborted(op_->Describe() + " failed");
    op_->Progress();
    if (op_->phase == Phase::kFailed) std::rethrow_exception(op_->error);
    return op_->phase == Phase::kCompleted;
  }

  RequestState state() const override { return StateOf(op_->phase); }

  std::string Describe() const override { return op_->Describe(); }

 private:
  std::shared_ptr<MpiCommShared> shared_;
  std::shared_ptr<P2POp> op_;
};

// The Request of one IallReduceSum (ReductionOp). Wait and Test finish it once: compare the
// gathered signatures, then add the gathered operands in rank order into the tensor.
class MpiReduction final : public RequestImpl {
 public:
  MpiReduction(std::shared_ptr<MpiCommShared> shared, std::shared_ptr<ReductionOp> op,
               std::string what)
      : shared_(std::move(shared)), op_(std::move(op)), what_(std::move(what)) {}

  // A pending reduction outlives its Request: the communicator keeps testing it.
  ~MpiReduction() override {
    if (phase_ == Phase::kPending) shared_->Adopt(std::move(op_));
  }

  Tensor Wait(milliseconds timeout) override {
    if (phase_ == Phase::kPending) {
      if (!PollUntil(Clock::now() + timeout, [&] {
            shared_->CheckAborted(Describe() + " failed");
            return op_->Progress();
          })) {
        // A collective that timed out: the ranks can no longer complete it consistently.
        const std::string message = fmt::format(
            "{} timed out after {} ms: not every one of the {} ranks of the communicator has "
            "posted it (its other ranks: {})",
            Describe(), timeout.count(), shared_->size, shared_->Others());
        shared_->AbortLocally(message);
        throw CommTimeout(message);
      }
      Finish();
    }
    if (phase_ == Phase::kFailed) std::rethrow_exception(error_);
    return op_->tensor;
  }

  bool Test() override {
    if (phase_ == Phase::kPending) {
      shared_->CheckAborted(Describe() + " failed");
      if (op_->Progress()) Finish();
    }
    if (phase_ == Phase::kFailed) std::rethrow_exception(error_);
    return phase_ == Phase::kCompleted;
  }

  RequestState state() const override { return StateOf(phase_); }

  std::string Describe() const override { return fmt::format("{}: {}", shared_->Me(), what_); }

 private:
  // Both gathers are done: check that every rank posted the same reduction (a mismatch is named
  // before any error MPI found in the gather it broke), then sum.
  void Finish() {
    MpiCommShared& s = *shared_;
    const auto row = [&](int r) {
      Signature sig;
      std::copy_n(op_->words.begin() + kSignatureLength * (1 + r), kSignatureLength, sig.begin());
      return sig;
    };
    const Signature first = row(0);
    for (int r = 1; r < s.size; ++r) {
      if (row(r) == first) continue;
      const std::string reason =
          fmt::format("collective mismatch: rank {} called {} while rank 0 called {}", r,
                      DescribeSignature(row(r)), DescribeSignature(first));
      s.AbortLocally(reason);
      return Fail(CommError(fmt::format("rank {}: {}", s.rank, reason)));
    }
    if (op_->code != MPI_SUCCESS) {
      return Fail(CommError(Describe() + " failed: " + MpiErrorString(op_->code)));
    }
    const size_t bytes = op_->tensor.nbytes();
    std::vector<const void*> contributions;  // rank r's at r · bytes into the scratch buffer
    for (int r = 0; r < s.size; ++r) contributions.push_back(op_->scratch.data() + r * bytes);
    SumInRankOrder(op_->tensor.dtype(), contributions, op_->tensor.numel(), op_->tensor.raw_data());
    op_->scratch = {};
    phase_ = Phase::kCompleted;
  }
  void Fail(const CommError& e) {
    phase_ = Phase::kFailed;
    error_ = std::make_exception_ptr(e);
  }

  std::shared_ptr<MpiCommShared> shared_;
  std::shared_ptr<ReductionOp> op_;
  std::string what_;
  Phase phase_ = Phase::kPending;
  std::exception_ptr error_;  // when kFailed
};

// Bytes of `t` as an MPI count, or InvalidArgument naming the operation.
int ByteCount(const P2POp& op) {
  const size_t bytes = op.tensor.nbytes();
  if (bytes > static_cast<size_t>(INT_MAX)) {
    throw InvalidArgument(
        fmt::format("{}: {} bytes exceed MPI's limit of {} per message; "
                    "send the tensor in slices",
                    op.Describe(), bytes, INT_MAX));
  }
  return static_cast<int>(bytes);
}

}  // namespace

// ---- MpiCommunicator ----------------------------------------------------------------------------

MpiCommunicator::MpiCommunicator(std::shared_ptr<MpiCommShared> shared)
    : shared_(std::move(shared)) {}

MpiCommunicator::~MpiCommunicator() = default;

int MpiCommunicator::rank() const { return shared_->rank; }
int MpiCommunicator::size() const { return shared_->size; }
milliseconds MpiCommunicator::default_timeout() const { return shared_->timeout; }

void MpiCommunicator::Abort(std::string_view reason) noexcept {
  int world_rank = -1;
  MpiCall call;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  std::fprintf(stderr, "sluice: rank %d aborts: %.*s\n", world_rank,
               static_cast<int>(reason.size()), reason.data());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();  // MPI_Abort does not return; should it, the process must still end
}

namespace {

// Posts the three MPI operations of `op` (see mpi.h) and wraps it in a Request.
Request Start(const std::shared_ptr<MpiCommShared>& shared, std::shared_ptr<P2POp> op) {
  MpiCommShared& s = *shared;
  s.CheckAborted(op->Describe() + " refused");
  const int bytes = ByteCount(*op);
  // A send announces on send_headers and learns the receive's header on recv_headers; a receive
  // the other way round.
  MPI_Comm announce = op->is_send ? s.send_headers : s.recv_headers;
  MPI_Comm learn = op->is_send ? s.recv_headers : s.send_headers;
  const LibraryAccess::Range elements{op->tensor.raw_data(), static_cast<size_t>(bytes)};
  const LibraryAccess::Range mine{op->mine.data(), sizeof(Header)};
  const LibraryAccess::Range theirs{op->theirs.data(), sizeof(Header)};
  if (op->is_send) {
    op->library.Post([&] { return op->Describe(); }, {mine, elements}, {theirs});
  } else {
    op->library.Post([&] { return op->Describe(); }, {mine}, {theirs, elements});
  }
  try {
    MpiCall call;
    Check(MPI_Irecv(op->theirs.data(), kHeaderLength, MPI_INT64_T, op->peer, op->tag, learn,
                    &op->requests[P2POp::kTheirHeader]),
          op->Describe());
    Check(MPI_Isend(op->mine.data(), kHeaderLength, MPI_INT64_T, op->peer, op->tag, announce,
                    &op->requests[P2POp::kMyHeader]),
          op->Describe());
    void* elements = op->tensor.raw_data();
    Check(op->is_send ? MPI_Isend(elements, bytes, MPI_BYTE, op->peer, op->tag, s.data,
                                  &op->requests[P2POp::kData])
                      : MPI_Irecv(elements, bytes, MPI_BYTE, op->peer, op->tag, s.data,
                                  &op->requests[P2POp::kData]),
          op->Describe());
  } catch (...) {
    s.Adopt(std::move(op));  // what was posted may still use its buffers
    throw;
  }
  return Request(std::make_shared<MpiRequest>(shared, std::move(op)), s.timeout);
}

}  // namespace

Request MpiCommunicator::DoIsend(const Tensor& tensor, int peer, int tag) {
  shared_->Sweep();
  Tensor source = tensor;
  if (!tensor.is_contiguous()) {  // packed, in row-major logical order, on the sender's allocator
    Allocator* own = tensor.storage()->allocator();
    source = tensor.Contiguous(own != nullptr ? *own : DefaultAllocator());
  }
  return Start(shared_, std::make_shared<P2POp>(/*is_send=*/true, shared_->rank, shared_->Me(),
                                                peer, shared_->Who(peer), tag, tensor.dtype(),
                                                tensor.shape(), std::move(source)));
}

Request MpiCommunicator::DoIrecv(int peer, int tag, DType dtype, const Shape& shape,
                                 Allocator& allocator) {
  shared_->Sweep();
  return Start(shared_, std::make_shared<P2POp>(/*is_send=*/false, shared_->rank, shared_->Me(),
                                                peer, shared_->Who(peer), tag, dtype, shape,
                                                Tensor::Empty(shape, dtype, allocator)));
}

void MpiCommunicator::DoBarrier(milliseconds timeout) {
  shared_->AgreeOn(MakeSignature(CollectiveKind::kBarrier), Clock::now() + timeout, timeout);
}

void MpiCommunicator::DoAllReduceSum(const Tensor& tensor, milliseconds timeout) {
  MpiCommShared& s = *shared_;
  const auto deadline = Clock::now() + timeout;
  const Signature signature =
      MakeSignature(CollectiveKind::kAllReduceSum, tensor.dtype(), tensor.shape());
  s.AgreeOn(signature, deadline, timeout);
  const std::string what = DescribeSignature(signature);

  const size_t elem = SizeOf(tensor.dtype());
  const int64_t numel = tensor.numel();
  const int64_t chunk = std::min<int64_t>(numel, std::max<int64_t>(1, (int64_t{1} << 20) / elem));
  auto op = std::make_shared<CollectiveOp>();
  op->tensor = tensor;
  op->scratch.resize(static_cast<size_t>(chunk) * elem * s.size);
  auto* base = static_cast<std::byte*>(tensor.raw_data());
  for (int64_t begin = 0; begin < numel; begin += chunk) {
    const int64_t n = std::min(chunk, numel - begin);
    const int bytes = static_cast<int>(n * elem);
    op->library.Post([&] { return fmt::format("{}: {}", s.Me(), what); },
                     {{base + begin * elem, static_cast<size_t>(bytes)}},
                     {{op->scratch.data(), static_cast<size_t>(bytes) * s.size}});
    {
      MpiCall call;
      Check(MPI_Iallgather(base + begin * elem, bytes, MPI_BYTE, op->scratch.data(), bytes,
                           MPI_BYTE, s.data, &op->request),
            fmt::format("rank {}: {}: MPI_Iallgather", s.rank, what));
    }
    s.WaitCollective(op, what, deadline, timeout);
    std::vector<const void*> contributions;  // rank r's at r·n elements into the scratch buffer
    for (int r = 0; r < s.size; ++r) contributions.push_back(op->scratch.data() + r * n * elem);
    SumInRankOrder(tensor.dtype(), contributions, n, base + begin * elem);
  }
}

Request MpiCommunicator::DoIallReduceSum(const Tensor& tensor) {
  MpiCommShared& s = *shared_;
  const size_t bytes = tensor.nbytes();
  if (bytes > kMaxNonBlockingReduction) return Communicator::DoIallReduceSum(tensor);
  const Signature signature =
      MakeSignature(CollectiveKind::kIallReduceSum, tensor.dtype(), tensor.shape());
  const std::string what = DescribeSignature(signature);
  s.CheckAborted(fmt::format("{}: {} refused", s.Me(), what));
  s.Sweep();
  auto op = std::make_shared<ReductionOp>();
  op->tensor = tensor;
  op->words.resize(kSignatureLength * (1 + s.size));
  std::copy(signature.begin(), signature.end(), op->words.begin());
  op->scratch.resize(bytes * static_cast<size_t>(s.size));
  op->library.Post([&] { return fmt::format("{}: {}", s.Me(), what); },
                   {{op->words.data(), sizeof(Signature)}, {tensor.raw_data(), bytes}},
                   {{op->words.data() + kSignatureLength, sizeof(Signature) * s.size},
                    {op->scratch.data(), op->scratch.size()}});
  try {
    MpiCall call;
    Check(MPI_Iallgather(op->words.data(), kSignatureLength, MPI_INT64_T,
                         op->words.data() + kSignatureLength, kSignatureLength, MPI_INT64_T, s.data,
                         &op->requests[0]),
          fmt::format("rank {}: {}: MPI_Iallgather", s.rank, what));
    // MPI reads the operand until the gather completes: the caller must not write it (the
    // contract), and the sum is written only after.
    Check(MPI_Iallgather(tensor.raw_data(), static_cast<int>(bytes), MPI_BYTE, op->scratch.data(),
                         static_cast<int>(bytes), MPI_BYTE, s.data, &op->requests[1]),
          fmt::format("rank {}: {}: MPI_Iallgather", s.rank, what));
  } catch (...) {
    s.Adopt(std::move(op));  // what was posted may still use its buffers
    throw;
  }
  return Request(std::make_shared<MpiReduction>(shared_, std::move(op), what), s.timeout);
}

std::unique_ptr<MpiCommunicator> MpiCommunicator::Split(int color, int key) {
  MpiCommShared& s = *shared_;
  if (color < 0) {
    throw InvalidArgument(
        fmt::format("rank {}: split: color must not be negative, got {}", s.rank, color));
  }
  s.AgreeOn(MakeSignature(CollectiveKind::kSplit), Clock::now() + s.timeout, s.timeout);
  MPI_Comm part = MPI_COMM_NULL;
  {
    MpiCall call;
    Check(MPI_Comm_split(s.data, color, key, &part),
          fmt::format("rank {}: split (color {}, key {})", s.rank, color, key));
  }
  auto shared = std::make_shared<MpiCommShared>(part, s.timeout);
  {
    MpiCall call;
    MPI_Comm_free(&part);
  }
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(std::move(shared)));
}

// ---- MpiWorld -----------------------------------------------------------------------------------

MpiWorld::MpiWorld(MpiWorldOptions options) {
  if (options.timeout.count() < 0) {
    throw InvalidArgument(
        fmt::format("MpiWorld: timeout must not be negative, got {} ms", options.timeout.count()));
  }
  if (MpiFinalized()) throw CommError("MpiWorld: MPI was already finalized in this process");
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  if (initialized) {
    MPI_Query_thread(&provided);
  } else {
    Check(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided),
          "MpiWorld: MPI_Init_thread");
    initialized_here_ = true;
  }
  g_serialize.store(provided < MPI_THREAD_MULTIPLE);
  // Errors are codes, never fatal: Open MPI reports an error of a non-blocking collective's
  // request (a gather whose ranks' sizes differ) on MPI_COMM_WORLD, whatever its communicator.
  Check(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN), "MpiWorld: error handler");
  {
    // Every rank's host, once (a blocking gather at start, as MPI_Init_thread itself is).
    int size = 0, length = 0;
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    std::vector<char> name(MPI_MAX_PROCESSOR_NAME, '\0');
    if (MPI_Get_processor_name(name.data(), &length) != MPI_SUCCESS) name.assign(name.size(), '\0');
    name.back() = '\0';
    std::vector<char> all(name.size() * static_cast<size_t>(size), '\0');
    Check(MPI_Allgather(name.data(), MPI_MAX_PROCESSOR_NAME, MPI_CHAR, all.data(),
                        MPI_MAX_PROCESSOR_NAME, MPI_CHAR, MPI_COMM_WORLD),
          "MpiWorld: gathering the host names");
    g_world_hosts.clear();
    for (int r = 0; r < size; ++r)
      g_world_hosts.emplace_back(all.data() + r * MPI_MAX_PROCESSOR_NAME);
  }
  world_.reset(new MpiCommunicator(
      std::make_shared<MpiCommShared>(MPI_COMM_WORLD, std::min(options.timeout, kMaxTimeout))));
}

MpiWorld::~MpiWorld() {
  world_.reset();
  if (initialized_here_ && !MpiFinalized()) MPI_Finalize();
}

MpiTransportSettings MpiWorld::TransportSettings() {
  MpiCall call;
  int provided = 0;
  if (MPI_T_init_thread(MPI_THREAD_SINGLE, &provided) != MPI_SUCCESS) return {};
  auto read = [](const char* name) -> std::string {
    int index = 0;
    if (MPI_T_cvar_get_index(name, &index) != MPI_SUCCESS) return "";
    char cvar_name[256], description[1024];
    int name_len = sizeof cvar_name, desc_len = sizeof description, verbosity = 0, bind = 0,
        scope = 0;
    MPI_Datatype type = MPI_DATATYPE_NULL;
    MPI_T_enum enumtype = MPI_T_ENUM_NULL;
    if (MPI_T_cvar_get_info(index, cvar_name, &name_len, &verbosity, &type, &enumtype, description,
                            &desc_len, &bind, &scope) != MPI_SUCCESS ||
        type != MPI_CHAR) {
      return "";
    }
    MPI_T_cvar_handle handle = MPI_T_CVAR_HANDLE_NULL;
    int count = 0;
    if (MPI_T_cvar_handle_alloc(index, nullptr, &handle, &count) != MPI_SUCCESS) return "";
    std::string value(static_cast<size_t>(std::max(count, 0)) + 1, '\0');
    const bool ok = MPI_T_cvar_read(handle, value.data()) == MPI_SUCCESS;
    MPI_T_cvar_handle_free(&handle);
    if (!ok) return "";
    value.resize(std::strlen(value.c_str()));
    return value;
  };
  MpiTransportSettings settings{
      .pml = read("pml"), .btl = read("btl"), .tcp_interfaces = read("btl_tcp_if_include")};
  MPI_T_finalize();
  return settings;
}

const std::vector<std::string>& MpiWorld::hosts() const { return g_world_hosts; }

bool MpiWorld::LaunchedByMpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr;
}

}  // namespace sluice
