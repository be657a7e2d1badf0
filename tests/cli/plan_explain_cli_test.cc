// `sluice plan --explain` as a user runs it: per stage, the tensors live at its peak, largest
// first, as a table and under "live_at_peak" in --format json — their bytes adding up to the
// stage's predicted peak, the JSON's rows the table's. Options plan refuses are refused with
// --explain too, with the same message and no list.
#include <sstream>
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli/cli_fixture.h"

namespace sluice {
namespace {

constexpr const char* kJob =
    "--layers 4 --batch 16 --microbatches 4 --threads 1 --stages 4 --schedule 1f1b";

class PlanExplainCli : public CliTest {};

TEST_F(PlanExplainCli, JsonListsExactlyEachStagesPeak) {
  const CliResult r = Sluice(fmt::format("plan {} --explain --format json", kJob));
  ASSERT_EQ(r.status, 0) << r.err;
  const nlohmann::json plan = nlohmann::json::parse(r.out);
  ASSERT_EQ(plan["stages"].size(), 4u);
  for (const auto& stage : plan["stages"]) {
    const nlohmann::json& live = stage["live_at_peak"];
    ASSERT_FALSE(live.empty()) << stage.dump();
    int64_t sum = 0, previous = INT64_MAX;
    nlohmann::json by_use = nlohmann::json::object();
    for (const auto& t : live) {
      const int64_t bytes = t["bytes"].get<int64_t>();
      sum += bytes;
      EXPECT_LE(bytes, previous) << "largest first: " << t.dump();
      previous = bytes;
      by_use[t["use"].get<std::string>()] = by_use.value(t["use"].get<std::string>(), 0) + bytes;
      for (const char* key : {"name", "type", "reason", "why", "made_by", "next_reader"}) {
        EXPECT_TRUE(t.contains(key)) << key << " in " << t.dump();
      }
    }
    EXPECT_EQ(sum, stage["predicted_peak_allocated_bytes"].get<int64_t>()) << stage["stage"];
    for (const auto& [use, bytes] : stage["breakdown"].items()) {
      EXPECT_EQ(by_use.value(use, 0), bytes.get<int64_t>())
          << use << " of stage " << stage["stage"];
    }
  }
  // Without --explain the JSON has no list.
  const CliResult plain = Sluice(fmt::format("plan {} --format json", kJob));
  ASSERT_EQ(plain.status, 0) << plain.err;
  EXPECT_FALSE(nlohmann::json::parse(plain.out)["stages"][0].contains("live_at_peak"));
}

TEST_F(PlanExplainCli, TableShowsEveryStagesListAfterThePlan) {
  const CliResult r = Sluice(fmt::format("plan {} --explain", kJob));
  ASSERT_EQ(r.status, 0) << r.err;
  const CliResult json = Sluice(fmt::format("plan {} --explain --format json", kJob));
  ASSERT_EQ(json.status, 0) << json.err;
  const nlohmann::json plan = nlohmann::json::parse(json.out);
  EXPECT_NE(r.out.find("memory plan:"), std::string::npos) << r.out;
  for (const auto& stage : plan["stages"]) {
    const size_t count = stage["live_at_peak"].size();
    const int64_t peak = stage["predicted_peak_allocated_bytes"].get<int64_t>();
    const std::string heading = fmt::format("stage {}: {} tensors live at its peak of {} B",
                                            stage["stage"].get<int>(), count, peak);
    const size_t at = r.out.find(heading);
    ASSERT_NE(at, std::string::npos) << heading << "\n" << r.out;
    // The rows under the heading's column titles: one per tensor, their bytes adding up to the
    // peak, each with its tensor's name and why, in the JSON's order.
    std::istringstream rows(r.out.substr(at));
    std::string line;
    std::getline(rows, line);  // the heading
    std::getline(rows, line);  // the column titles
    EXPECT_NE(line.find("made by  →  next reader"), std::string::npos) << line;
    int64_t sum = 0;
    for (const auto& t : stage["live_at_peak"]) {
      ASSERT_TRUE(std::getline(rows, line)) << heading;
      int64_t bytes = 0;
      std::istringstream(line) >> bytes;
      sum += bytes;
      EXPECT_EQ(bytes, t["bytes"].get<int64_t>()) << line;
      for (const char* key : {"type", "name", "why", "made_by"}) {
        EXPECT_NE(line.find(t[key].get<std::string>()), std::string::npos) << key << ": " << line;
      }
    }
    EXPECT_EQ(sum, peak) << heading;
  }
  EXPECT_NE(r.out.find("saved for backward of micro-batch"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("parameter"), std::string::npos) << r.out;
}

TEST_F(PlanExplainCli, OptionsPlanRefusesAreRefusedWithExplainToo) {
  const std::pair<std::string, const char*> cases[] = {
      {fmt::format("{} --memory-budget 1KiB", kJob), "smallest achievable peak"},
      {fmt::format("{} --memory-budget 6MiB --recompute full", kJob),
       "--recompute and --memory-budget"},
      {"--layers 4 --stages 1 --schedule auto", "--schedule auto chooses a pipeline schedule"},
      {"--layers 8 --stages 8 --batch 16384 --microbatches 16384 --schedule 1f1b",
       "memory not forecast"},
  };
  for (const auto& [args, message] : cases) {
    for (const char* format : {"table", "json"}) {
      const CliResult r = Sluice(fmt::format("plan {} --explain --format {}", args, format));
      EXPECT_NE(r.status, 0) << args;
      EXPECT_NE(r.err.find(message), std::string::npos) << args << "\n" << r.err;
      EXPECT_EQ(r.err.find("internal error"), std::string::npos) << args << "\n" << r.err;
      EXPECT_TRUE(r.out.empty()) << args << "\n" << r.out;
    }
  }
  // --explain is plan's: train refuses it as an option it does not know.
  const CliResult t = Sluice("train --layers 2 --steps 1 --explain");
  EXPECT_NE(t.status, 0);
  EXPECT_NE(t.err.find("--explain"), std::string::npos) << t.err;
}

}  // namespace
}  // namespace sluice
