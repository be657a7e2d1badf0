// The MPI Communicator backend: the ranks are processes launched by mpirun (or a cluster
// scheduler), one pipeline stage per process, on one machine or many. It implements the contract of
// comm/communicator.h — every point of it holds here — with non-blocking MPI; what follows is how,
// and what differs from LocalWorld (comm/local.h).
//
// How a message travels. Each MpiCommunicator owns three private communicators (MPI_Comm_dup of
// the one it was made from, so sluice's traffic never mixes with anyone else's): `data`, and two
// announcement channels. For one transfer from rank s to rank r with tag t:
//   * Isend posts MPI_Isend of the elements on `data` (a non-contiguous tensor is first packed into
//     a contiguous copy from the tensor's own allocator), MPI_Isend of a header — its dtype and
//     shape — on the send-announcement channel, and MPI_Irecv of the receiver's header on the
//     receive-announcement channel.
//   * Irecv allocates the destination from its allocator and posts MPI_Irecv into it (exactly the
//     expected bytes) on `data`, MPI_Isend of its own header (the dtype and shape it expects), and
//     MPI_Irecv of the sender's header.
//   MPI's non-overtaking rule per (source, tag, communicator) pairs the k-th send with the k-th
//   receive on all three channels at once, so the contract's matching order holds. Each side then
//   compares the two headers: a dtype or shape mismatch fails *both* operations with a CommError
//   that names both ranks, the tag and both dtype+shapes (the data message is still consumed, so
//   the channel stays in step; a longer message than expected is truncated by MPI, never written
//   past the buffer). The headers cost two small messages per transfer; in exchange the sender
//   learns of a mismatch, and a timeout can say what is missing ("rank 1 has posted no receive").
//   * An operation completes when MPI_Test reports all three of its MPI requests done; only then
//     does it drop its reference to the tensor's storage. So, as in LocalWorld, a send completes
//     once the receive is posted and the elements have left the buffer.
//   * Request::Wait polls MPI_Test — a brief spin, then naps of up to 100 µs — until completion or
//     the timeout (CommTimeout; the Request stays pending and may be waited for again). Polling
//     also drives MPI's progress (OpenMPI has no progress thread), so a rank that is computing
//     moves its messages on at its next Wait or Test.
//   * A Request dropped while pending keeps its buffers alive in the communicator, which tests it
//     on every later operation until it completes. When the communicator goes away it waits for
//     such operations up to its timeout; any still unmatched then are cancelled and their buffers
//     are deliberately leaked (MPI may still touch them), with a line on stderr.
//
// Collectives. Every collective first gathers, from every rank, a fixed-size signature (which
// collective, dtype, shape) with MPI_Iallgather and compares them, so a collective called
// differently on two ranks is a CommError on *every* rank (naming both) instead of a hang or a
// corrupted sum. Barrier is that gather alone (no rank can finish it before every rank entered).
// AllReduceSum then gathers the tensor in chunks of at most 1 MiB per rank with MPI_Iallgather
// into a scratch buffer and adds the contributions in rank order 0..size−1 locally: every rank
// adds the same numbers in the same order, so the result is bitwise identical everywhere
// (MPI_Allreduce promises no order). Scratch memory: size × 1 MiB at most, on the heap.
// IallReduceSum posts both gathers at once — the signatures and the whole operand (up to 1 MiB,
// into a scratch buffer of size × its bytes) — and returns; Wait (or a Test that finds both done)
// compares the signatures and adds the operands in rank order, bitwise AllReduceSum's sum. A
// wait past the timeout aborts the communicator locally, as a timed-out collective does. A
// larger operand runs the blocking AllReduceSum inside the post.
// Split(color, key) is MPI_Comm_split after the same signature check.
//
// What differs from LocalWorld:
//   * Abort(reason) prints "sluice: rank R aborts: <reason>" (R: the rank in MPI_COMM_WORLD) to
//     stderr and calls MPI_Abort: the process ends, and mpirun ends every other rank of the job.
//     No CommAborted reaches another rank; the job's exit status is non-zero.
//   * A dead peer (killed, crashed) is detected by mpirun, which ends the whole job; the ranks
//     never see an error object for it.
//   * A timed-out collective throws CommTimeout, and the communicator is then aborted locally:
//     every later operation on it throws CommAborted naming this rank and the timeout (the other
//     ranks cannot tell; end the job with Abort). MPI cannot say which ranks are missing, only
//     that not all have entered. Operations already posted keep their MPI semantics.
//   * Split, and the communicator's own setup, block until every rank of the parent calls them.
//   * One message carries at most 2 GiB (MPI counts are ints): Isend/Irecv of a larger tensor
//     throw InvalidArgument; send it in slices.
//
// Ownership and lifetime: MpiWorld owns MPI itself (MPI_Init_thread / MPI_Finalize) and the world
// communicator. Every communicator made by Split, and every Request, must be destroyed before the
// MpiWorld (MPI_Finalize must come last). Allocators follow the rule of LocalWorld: each must
// outlive the tensors and Requests made from it.
//
// Thread-safety: as in communicator.h. MpiWorld asks for MPI_THREAD_MULTIPLE; if the library
// provides less, every MPI call of sluice is serialized by one process-wide mutex (never held
// while sleeping). A communicator's state shared with its Requests (dropped operations, the local
// abort) is guarded by one mutex per communicator (GUARDED_BY in mpi.cc, checked by clang).
// Construct one MpiWorld per process, on the main thread.
//
// Launch (see docs/mpi.md):
//   mpirun -np 2 ./my_program           # as root: add --allow-run-as-root
//
// Example:
//   int main() {
//     MpiWorld mpi({.timeout = std::chrono::seconds(30)});
//     Communicator& comm = mpi.world();
//     CachingAllocator alloc;
//     if (comm.rank() == 0) {
//       Tensor y = Tensor::Full({2, 3}, 1.0, DType::kF32, alloc);
//       comm.Send(y, /*peer=*/1, /*tag=*/0);
//     } else if (comm.rank() == 1) {
//       Tensor x = comm.Recv(/*peer=*/0, /*tag=*/0, DType::kF32, {2, 3}, alloc);
//     }
//     // Data-parallel groups: ranks with the same stage reduce their gradients together.
//     std::unique_ptr<MpiCommunicator> replicas = mpi.world().Split(/*color=*/stage, /*key=*/rank);
//     replicas->AllReduceSum(grad);
//   }                                   // ~MpiWorld: MPI_Finalize
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/comm/communicator.h"

namespace sluice {

struct MpiCommShared;  // mpi.cc: the state a communicator shares with its Requests

// How the MPI library was told to move messages: Open MPI's MCA variables pml (the messaging
// layer), btl (its byte transports, e.g. "self,tcp") and btl_tcp_if_include (the networks TCP may
// use), read through the MPI tool interface (MPI_T). A value is empty where unset (the library then
// chooses) or where the library has no such variable (another MPI).
struct MpiTransportSettings {
  std::string pml, btl, tcp_interfaces;
};

struct MpiWorldOptions {
  // Default timeout of Request::Wait(), Barrier() and AllReduceSum() on every communicator.
  std::chrono::milliseconds timeout = std::chrono::seconds(60);
};

class MpiCommunicator final : public Communicator {
 public:
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override;
  int size() const override;
  std::chrono::milliseconds default_timeout() const override;
  // Prints "sluice: rank R aborts: <reason>" to stderr and calls MPI_Abort; does not return.
  void Abort(std::string_view reason) noexcept override;

  // A communicator over the ranks that pass the same `color` (≥ 0), ordered by `key` (ties by rank
  // here). Collective: every rank of this communicator calls it. Throws InvalidArgument for a
  // negative color, CommTimeout if not every rank calls it within the default timeout, CommError
  // if some rank called another collective instead.
  std::unique_ptr<MpiCommunicator> Split(int color, int key);

 protected:
  Request DoIsend(const Tensor& tensor, int peer, int tag) override;
  Request DoIrecv(int peer, int tag, DType dtype, const Shape& shape,
                  Allocator& allocator) override;
  void DoBarrier(std::chrono::milliseconds timeout) override;
  void DoAllReduceSum(const Tensor& tensor, std::chrono::milliseconds timeout) override;
  Request DoIallReduceSum(const Tensor& tensor) override;

 private:
  friend class MpiWorld;
  explicit MpiCommunicator(std::shared_ptr<MpiCommShared> shared);

  std::shared_ptr<MpiCommShared> shared_;
};

class MpiWorld {
 public:
  // Initializes MPI (MPI_Init_thread, asking for MPI_THREAD_MULTIPLE) unless it already is, and
  // makes the world communicator. Throws CommError if MPI was already finalized or fails to start,
  // InvalidArgument for a negative timeout.
  explicit MpiWorld(MpiWorldOptions options = {});
  // Destroys the world communicator, then calls MPI_Finalize if this object initialized MPI.
  ~MpiWorld();
  MpiWorld(const MpiWorld&) = delete;
  MpiWorld& operator=(const MpiWorld&) = delete;

  // True when this process was started by mpirun/mpiexec (OpenMPI's OMPI_COMM_WORLD_SIZE or the
  // PMI_SIZE of MPICH and Slurm is set). Needs no MPI call; usable before constructing MpiWorld.
  static bool LaunchedByMpirun();

  // Every world rank's host (MPI_Get_processor_name), by rank: gathered once at construction.
  // Messages of every communicator name a peer's world rank and host with it.
  const std::vector<std::string>& hosts() const;

  // This process's transport settings (MPI_T). Call after construction; never throws.
  static MpiTransportSettings TransportSettings();

  // The communicator over every process of the job (MPI_COMM_WORLD).
  MpiCommunicator& world() { return *world_; }

 private:
  bool initialized_here_ = false;
  std::unique_ptr<MpiCommunicator> world_;
};

}  // namespace sluice
