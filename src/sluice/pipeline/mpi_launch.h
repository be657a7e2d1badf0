// What every rank of `mpirun … sluice train --comm mpi` checks and says at start (docs/mpi.md
// "Many machines"): that all ranks run the same sluice with the same options (CheckSameLaunch),
// and where each runs and how it reaches its peers (the line of DescribeRankPlacement).
//
// World rank w runs stage w mod P of replica w div P (MpiJob). Its peers are the neighbouring
// stages of its replica (activations and gradients) and the same stage of the other replicas (the
// gradient all-reduce); each is on this host or another, and the transport to it follows from the
// MPI library's settings (MpiTransportSettings).
//
// Example (P = 2 × D = 2 on four hosts, Open MPI with btl self,tcp):
//   sluice: rank 2 of 4 on host node2: stage 0, replica 1, tcp (10.213.0.0/24) to rank 3 on
//   node3 (next stage) and rank 0 on node0 (replica 0)
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "sluice/comm/communicator.h"
#include "sluice/comm/mpi.h"

namespace sluice::pipeline {

// One rank's launch: ("version", "sluice 0.1.0") and then each option with its value as given on
// the command line ("" where not given), in a fixed order.
using LaunchSettings = std::vector<std::pair<std::string, std::string>>;

// Collective over `world`: compares every rank's settings with rank 0's. Where some rank's differ,
// throws InvalidArgument on every rank naming the first such rank and its first differing setting,
// e.g. "rank 3 was started with --steps 7 but rank 0 with --steps 5: every rank must run the same
// sluice with the same options". Three AllReduceSums when all agree (CommTimeout rather than a
// hang if a rank never comes).
void CheckSameLaunch(Communicator& world, const LaunchSettings& mine);

// The transport between two ranks, from the library's settings: "shared memory (vader)", "tcp
// (10.213.0.0/24)", the pml's name where it is not ob1 ("ucx"), or "Open MPI's choice (btl
// unset)".
std::string TransportBetween(bool same_host, const MpiTransportSettings& settings);

// The start line of world rank `rank` (see the example above), without a trailing newline.
// `hosts` has one entry per rank (MpiWorld::hosts()), stages × replicas of them.
std::string DescribeRankPlacement(const std::vector<std::string>& hosts, int rank, int stages,
                                  int replicas, const MpiTransportSettings& settings);

}  // namespace sluice::pipeline
