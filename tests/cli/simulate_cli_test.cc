// `sluice train --profile-out` and `sluice simulate`: a profiled run's costs file drives the
// simulator; without costs the unit-cost figures come out; memory is the plan's forecast; costs
// of another job, another stage count or a schedule they do not cover, and broken costs files,
// are refused naming the mismatch.
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli/cli_fixture.h"

namespace sluice {
namespace {

#define SLUICE_MODEL "--layers 4 --batch 16 --microbatches 4 --threads 1"
constexpr const char* kModel = SLUICE_MODEL;
constexpr const char* kJob = SLUICE_MODEL " --stages 2";
#undef SLUICE_MODEL

class SimulateCli : public CliTest {
 protected:
  // Profiles `schedule` (3 steps) and returns the costs file's path.
  std::string Profile(const std::string& schedule) {
    const std::string path = (dir_ / (schedule + ".json")).string();
    const CliResult r = Sluice(fmt::format("train {} --schedule {} --steps 3 --eval-every 0 "
                                           "--quiet --profile-out {}",
                                           kJob, schedule, path),
                               "timeout 300");
    EXPECT_EQ(r.status, 0) << r.err;
    return path;
  }
  nlohmann::json Simulate(const std::string& args) {
    const CliResult r = Sluice(fmt::format("simulate {} --format json", args));
    EXPECT_EQ(r.status, 0) << args << "\n" << r.err;
    return nlohmann::json::parse(r.out.empty() ? "{}" : r.out);
  }
  std::string Error(const std::string& args) {
    const CliResult r = Sluice("simulate " + args);
    EXPECT_NE(r.status, 0) << args;
    return r.err;
  }
};

TEST_F(SimulateCli, UnitCostsGiveTheTheoryBubble) {
  const nlohmann::json j = Simulate(fmt::format("{} --stages 4 --schedule 1f1b", kModel));
  EXPECT_EQ(j["time_unit"], "units");
  ASSERT_EQ(j["stages"].size(), 4u);
  EXPECT_NEAR(j["stages"][0]["bubble"].get<double>(), 3.0 / 7.0, 1e-9);  // (P−1)/(M+P−1)
  EXPECT_DOUBLE_EQ(j["step_ms"].get<double>(), 21);                      // (F + B + W)(M + P − 1)
}

TEST_F(SimulateCli, ProfiledCostsDriveTheSimulationAndMemoryIsThePlans) {
  const std::string costs = Profile("zb-h1");
  std::ifstream in(costs);
  const nlohmann::json file = nlohmann::json::parse(in);
  EXPECT_EQ(file["stages"], 2);
  EXPECT_EQ(file["split_backward"], true);
  for (const nlohmann::json& rank : file["ranks"]) {
    EXPECT_GT(rank["chunks"][0]["forward_ms"].get<double>(), 0);
    EXPECT_GT(rank["chunks"][0]["weight_ms"].get<double>(), 0);
    EXPECT_GT(rank["update_ms"].get<double>(), 0);
  }
  EXPECT_EQ(file["messages"]["bytes"], 4 * 12 * 64 * 4);  // f32[B, T, C] of the default task
  EXPECT_EQ(file["measured"]["steps"], 2);                // the first step warms up

  const nlohmann::json j = Simulate(fmt::format("{} --schedule zb-h1 --costs {}", kJob, costs));
  EXPECT_EQ(j["time_unit"], "ms");
  EXPECT_GT(j["step_ms"].get<double>(), 0);
  const CliResult plan = Sluice(fmt::format("plan {} --schedule zb-h1 --format json", kJob));
  ASSERT_EQ(plan.status, 0) << plan.err;
  const nlohmann::json p = nlohmann::json::parse(plan.out);
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(j["stages"][s]["peak_allocated_bytes"],
              p["stages"][s]["predicted_peak_allocated_bytes"]);
    EXPECT_GT(j["stages"][s]["busy_ms"].get<double>(), 0);
  }
  // Split costs cover 1f1b (B costs B + W), whose bubble at these costs is larger.
  const nlohmann::json one = Simulate(fmt::format("{} --schedule 1f1b --costs {}", kJob, costs));
  EXPECT_GT(one["bubble"].get<double>(), j["bubble"].get<double>());
}

TEST_F(SimulateCli, RefusesCostsThatDoNotMatch) {
  const std::string costs = Profile("1f1b");
  std::string err = Error(fmt::format("{} --schedule zb-h1 --costs {}", kJob, costs));
  EXPECT_NE(err.find("splits it into B and W"), std::string::npos) << err;
  err = Error(fmt::format("{} --schedule interleaved --costs {}", kJob, costs));
  EXPECT_NE(err.find("chunk(s) per stage"), std::string::npos) << err;
  err = Error(fmt::format("{} --stages 4 --costs {}", kModel, costs));
  EXPECT_NE(err.find("measured on 2 stages"), std::string::npos) << err;
  err = Error(fmt::format("{} --dim 32 --costs {}", kJob, costs));
  EXPECT_NE(err.find("dim is 64 there, 32 here"), std::string::npos) << err;
  err = Error(fmt::format("{} --recompute full --costs {}", kJob, costs));
  EXPECT_NE(err.find("recompute"), std::string::npos) << err;

  std::ifstream in(costs);
  nlohmann::json j = nlohmann::json::parse(in);
  j["ranks"][1]["optimizer_ms"] = -1;
  const std::string broken = (dir_ / "broken.json").string();
  std::ofstream(broken) << j.dump();
  err = Error(fmt::format("{} --costs {}", kJob, broken));
  EXPECT_NE(err.find("stage 1 \"optimizer_ms\" is -1"), std::string::npos) << err;
  err = Error(fmt::format("{} --costs {}", kJob, (dir_ / "none.json").string()));
  EXPECT_NE(err.find("cannot open"), std::string::npos) << err;
  std::ofstream(dir_ / "text.json") << "not json";
  err = Error(fmt::format("{} --costs {}", kJob, (dir_ / "text.json").string()));
  EXPECT_NE(err.find("not valid JSON"), std::string::npos) << err;
}

}  // namespace
}  // namespace sluice
