// What every rank of an MPI job checks and says at start (pipeline/mpi_launch.h), over the
// in-process backend: the same launch passes, a differing option or version is refused on every
// rank naming the first differing rank and option; the placement line names host, stage, replica
// and the transport to each peer.
#include "sluice/pipeline/mpi_launch.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "comm/rank_threads.h"
#include "sluice/comm/local.h"
#include "sluice/core/error.h"

namespace sluice::pipeline {
namespace {

using ::testing::HasSubstr;
using testing::RunRanks;

LaunchSettings Launch(const std::string& version, const std::string& steps) {
  return {{"version", version}, {"--stages", "2"}, {"--steps", steps}, {"--save", ""}};
}

// The message each rank's CheckSameLaunch threw ("" where it passed).
std::vector<std::string> Check(const std::vector<LaunchSettings>& launches) {
  LocalWorld world(static_cast<int>(launches.size()), {.timeout = std::chrono::seconds(30)});
  std::vector<std::string> errors(launches.size());
  RunRanks(world, [&](int rank) {
    try {
      CheckSameLaunch(world.comm(rank), launches[rank]);
    } catch (const InvalidArgument& e) {
      errors[rank] = e.what();
    }
  });
  return errors;
}

TEST(CheckSameLaunch, TheSameLaunchOnEveryRankPasses) {
  const LaunchSettings same = Launch("sluice 0.1.0", "5");
  for (const std::string& e : Check({same, same, same, same})) EXPECT_EQ(e, "");
}

TEST(CheckSameLaunch, ADifferingOptionIsRefusedOnEveryRankNamingIt) {
  const LaunchSettings a = Launch("sluice 0.1.0", "5"), b = Launch("sluice 0.1.0", "7");
  for (const std::string& e : Check({a, a, b, b})) {
    EXPECT_THAT(e, HasSubstr("rank 2 was started with --steps 7 but rank 0 with --steps 5"));
    EXPECT_THAT(e, HasSubstr("every rank must run the same sluice with the same options"));
  }
}

TEST(CheckSameLaunch, AnotherVersionIsRefusedNamingBoth) {
  const LaunchSettings a = Launch("sluice 0.1.0", "5"), b = Launch("sluice 0.2.0", "5");
  for (const std::string& e : Check({a, b}))
    EXPECT_THAT(e, HasSubstr("rank 1 was started with sluice 0.2.0 but rank 0 with sluice 0.1.0"));
}

TEST(CheckSameLaunch, AnOptionGivenOnOneRankOnlyIsNamed) {
  LaunchSettings a = Launch("sluice 0.1.0", "5"), b = a;
  b[3].second = "ck.safetensors";
  for (const std::string& e : Check({a, a, b}))
    EXPECT_THAT(
        e, HasSubstr("rank 2 was started with --save ck.safetensors but rank 0 with --save unset"));
}

TEST(DescribeRankPlacement, NamesHostStageReplicaAndTheTransportToEachPeer) {
  const std::vector<std::string> hosts = {"node0", "node1", "node0", "node3"};
  const MpiTransportSettings tcp{
      .pml = "", .btl = "self,vader,tcp", .tcp_interfaces = "10.213.0.0/24"};
  EXPECT_EQ(DescribeRankPlacement(hosts, 2, 2, 2, tcp),
            "sluice: rank 2 of 4 on host node0: stage 0, replica 1, tcp (10.213.0.0/24) to rank 3 "
            "on node3 (next stage), shared memory (vader) to rank 0 on node0 (replica 0)");
  EXPECT_EQ(DescribeRankPlacement({"solo"}, 0, 1, 1, tcp),
            "sluice: rank 0 of 1 on host solo: stage 0, replica 0, no peers");
}

TEST(TransportBetween, FollowsTheLibrarySettings) {
  EXPECT_EQ(TransportBetween(false, {.pml = "ucx", .btl = "", .tcp_interfaces = ""}), "ucx");
  EXPECT_EQ(TransportBetween(false, {.pml = "", .btl = "", .tcp_interfaces = ""}),
            "Open MPI's choice (btl unset)");
  EXPECT_EQ(TransportBetween(true, {.pml = "ob1", .btl = "self,tcp", .tcp_interfaces = ""}), "tcp");
  EXPECT_EQ(TransportBetween(false, {.pml = "", .btl = "self,vader", .tcp_interfaces = ""}),
            "none (btl self,vader reaches no other host)");
}

}  // namespace
}  // namespace sluice::pipeline
