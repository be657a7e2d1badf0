// A tiny MPI program for tests/mpi/fault_test.sh: how a job ends when one rank fails.
//   mpi_fault_helper abort DIR  rank 1 calls Abort("test abort") while the others wait in a
//                               receive that nobody sends; mpirun must end them all.
//   mpi_fault_helper wait DIR   every rank writes its pid to DIR/rank<R>.pid and waits in such a
//                               receive; the test kills one with SIGKILL, mpirun must end the rest.
// The receives wait 120 s, far longer than the test allows, so only mpirun can end them in time.
//   mpi_fault_helper overwrite DIR  rank 0 writes into the elements of a send that rank 1 has
//                               not received yet, which MPI forbids: under ThreadSanitizer a data
//                               race with the library (comm/mpi.cc, LibraryAccess) naming the send.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include "sluice/comm/mpi.h"
#include "sluice/core/caching_allocator.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s abort|wait|overwrite DIR\n", argv[0]);
    return 2;
  }
  const std::string mode = argv[1], dir = argv[2];
  sluice::MpiWorld mpi({.timeout = std::chrono::seconds(120)});
  sluice::Communicator& comm = mpi.world();
  const int rank = comm.rank(), size = comm.size();
  std::ofstream(dir + "/rank" + std::to_string(rank) + ".pid") << getpid() << "\n";
  comm.Barrier();
  if (mode == "abort" && rank == 1) comm.Abort("test abort");
  sluice::CachingAllocator alloc;
  if (mode == "overwrite") {
    // Rank 1 posts its receive only after the barrier, so the send is pending at the write.
    if (rank == 0) {
      sluice::Tensor t = sluice::Tensor::Full({1024}, 1.0, sluice::DType::kF32, alloc);
      sluice::Request sent = comm.Isend(t, /*peer=*/1, /*tag=*/7);
      t.data<float>()[1000] = 2.0f;
      comm.Barrier();
      sent.Wait();
    } else if (rank == 1) {
      comm.Barrier();
      comm.Recv(/*peer=*/0, /*tag=*/7, sluice::DType::kF32, {1024}, alloc);
    } else {
      comm.Barrier();
    }
    return 0;
  }
  comm.Recv((rank + 1) % size, /*tag=*/0, sluice::DType::kF32, {1}, alloc);
  std::fprintf(stderr, "rank %d: received a message nobody sent\n", rank);
  return 1;
}
