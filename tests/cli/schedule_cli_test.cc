// `sluice schedule` as a user runs it: the built binary (SLUICE_BINARY, set by CTest) prints the
// grid or JSON, and every impossible request exits 1 with a message naming the fix.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include "cli/cli_fixture.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

using Result = CliResult;

class ScheduleCli : public CliTest {
 protected:
  Result Sluice(const std::string& args) { return CliTest::Sluice("schedule " + args); }
};

TEST_F(ScheduleCli, PrintsTheGrid) {
  const Result r = Sluice("--stages 4 --microbatches 8 --schedule 1f1b");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("1f1b (P=4, M=8): 22 steps"));
  EXPECT_THAT(r.out, HasSubstr("rank 3  .  .  .  F0 B0 F1 B1"));
  EXPECT_THAT(r.out, HasSubstr("0     4          27.3%"));
}

// --post-validate: the steps interlock, and ZB-H2 and ZB-V lose nothing between them at unit
// cost (the zero-bubble paper's 0), their fill and drain reported apart.
TEST_F(ScheduleCli, PostValidateReportsTheSteadyStateBubble) {
  const Result r = Sluice("-p 8 -m 32 -s zb-h2 --post-validate");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("zb-h2 (P=8, M=32): 103 steps"));
  EXPECT_THAT(
      r.out,
      HasSubstr(
          "a training step every 96 unit steps, bubble 0.0% (synchronous: 103, bubble 6.8%)"));
  EXPECT_THAT(r.out, HasSubstr("the first fill 3.5 and the last drain 3.5"));
  const Result v = Sluice("-p 8 -m 32 -s zb-v --post-validate --format json");
  ASSERT_EQ(v.status, 0) << v.err;
  const nlohmann::json j = nlohmann::json::parse(v.out);
  EXPECT_EQ(j["post_validation"]["steady_state_bubble"], 0.0);
  EXPECT_GT(j["bubble"].get<double>(), 0.03);
  // Without the flag the JSON and the grid are as they were.
  EXPECT_FALSE(nlohmann::json::parse(Sluice("-p 8 -m 32 -s zb-v --format json").out)
                   .contains("post_validation"));
  const Result one = Sluice("-p 1 -m 4 --post-validate");
  EXPECT_EQ(one.status, 1);
  EXPECT_THAT(one.err, HasSubstr("--stages 2 or more"));
}

TEST_F(ScheduleCli, PrintsJson) {
  const Result r = Sluice("-p 4 -m 8 -s interleaved --chunks 3 --format json");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["schedule"], "interleaved");
  EXPECT_EQ(j["chunks"], 3);
  EXPECT_EQ(j["ranks"].size(), 4u);
  EXPECT_EQ(j["ranks"][0]["in_flight_peak"], 3 * 4 + 4 - 1);
}

// The memory-controllable V schedules: V-shaped chunks, the paper's memory on the fullest rank.
TEST_F(ScheduleCli, PrintsVHalfAndVMin) {
  Result r = Sluice("--stages 2 --microbatches 4 --schedule v-min");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("v-min (P=2, M=4, V=2): 27 steps"));
  EXPECT_THAT(r.out, HasSubstr("rank 1  .    F0.0 F1.0 .    .    B1.0 B0.0 F0.1 F1.1 W1.0"));
  r = Sluice("-p 8 -m 32 -s v-half --format json");
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["schedule"], "v-half");
  EXPECT_EQ(j["chunks"], 2);
  for (const nlohmann::json& rank : j["ranks"]) EXPECT_EQ(rank["in_flight_peak"], 10);
  EXPECT_NEAR(j["bubble"].get<double>(), 17.0 / 209, 1e-9);
}

// --post-receives-ahead lists each receive right after the rank's previous message: the lists
// change, and no RECV follows a compute.
TEST_F(ScheduleCli, PostReceivesAheadMovesReceivesUpPastComputes) {
  auto ranks = [&](const std::string& args) {
    const Result r = Sluice("-p 2 -m 8 -s interleaved --format json " + args);
    EXPECT_EQ(r.status, 0) << r.err;
    return nlohmann::json::parse(r.out)["ranks"];
  };
  const nlohmann::json ahead = ranks("--post-receives-ahead");
  EXPECT_NE(ahead, ranks(""));
  for (const nlohmann::json& rank : ahead) {
    const nlohmann::json& actions = rank["actions"];
    for (size_t i = 1; i < actions.size(); ++i) {
      const std::string op = actions[i]["op"], before = actions[i - 1]["op"];
      if (!op.starts_with("RECV")) continue;
      EXPECT_TRUE(before != "F" && before != "B" && before != "W") << rank["rank"] << " " << i;
    }
  }
}

TEST_F(ScheduleCli, ImpossibleRequestsAreErrorsNamingTheFix) {
  struct Case {
    std::string args, message;
  };
  for (const Case& c : std::vector<Case>{
           {"-p 4 -m 2 -s 1f1b",
            "1f1b: needs at least as many micro-batches as stages (M=2 < P=4): use 4 or more"},
           {"-p 4 -m 6 -s interleaved",
            "must be a multiple of the stage count (M=6, P=4): use 4 or 8 micro-batches"},
           {"-p 4 -m 8 -s interleaved --chunks 1", "needs at least 2 chunks per rank"},
           {"-p 0 -m 8 -s gpipe", "needs at least 1 stage (got 0)"},
           {"-p 4 -m 8 -s zb-h3",
            "unknown schedule 'zb-h3': choose one of gpipe, 1f1b, interleaved, zb-h1, zb-h2, "
            "zb-v, v-half, v-min"},
           {"-p 4 -m 8 -s v-half --chunks 3",
            "v-half: runs exactly 2 chunks per rank, V-shaped (got 3 chunks): give --chunks 2 or "
            "leave it out"},
           {"-p 4 -m 0 -s v-min", "v-min: needs at least 1 micro-batch (got 0)"},
           {"-p 4 -m 6 -s zb-v", "zb-v: needs at least 2P − 1 micro-batches (M=6 < 7 for P=4)"},
           {"-p 4 -m 8 -s zb-v --chunks 4", "zb-v: runs exactly 2 chunks per rank"},
           {"-p 4 -m 3 -s zb-h2",
            "zb-h2: needs at least as many micro-batches as stages (M=3 < P=4)"},
           {"-p 4 -m 8 -s 1f1b --chunks 2",
            "chunks apply to interleaved, zb-v, v-half and v-min only"},
       }) {
    const Result r = Sluice(c.args);
    EXPECT_EQ(r.status, 1) << c.args;
    EXPECT_THAT(r.err, HasSubstr("sluice: error: ")) << c.args;
    EXPECT_THAT(r.err, HasSubstr(c.message)) << c.args;
    EXPECT_EQ(r.out, "") << c.args;
  }
}

TEST_F(ScheduleCli, MissingOptionsAreUsageErrors) {
  const Result r = Sluice("--stages 4");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("--microbatches is required"));
}

}  // namespace
}  // namespace sluice
