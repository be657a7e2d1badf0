// Reserved bytes (what the caching allocator takes from the system) against allocated bytes (the
// tensors), from the command line (issue 34): on the one-stage GPT jobs (batch 16, and batch 48
// with full recompute) and the 4-stage job, each stage's peak reserved is within 5% of its peak
// allocated by default; `sluice plan` predicts the reserved peak of the one-stage job exactly; and
// `--memory-budget` bounds reserved bytes.
// Peaks are byte counts, the same on every machine for these jobs (no timing is asserted).
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli/cli_fixture.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;

// The small GPT of docs/benchmarks.md (V = 256, L = 4, H = 4, C = 128, T = 64, one thread).
constexpr const char* kGpt =
    "--vocab 256 --seq 64 --layers 4 --heads 4 --dim 128 --threads 1 --microbatches 1 "
    "--steps 2 --eval-every 0";
// The 4-stage job of docs/benchmarks.md ("Pipeline memory beside PyTorch"): the same GPT at batch
// 16 in 1F1B with 8 micro-batches, default flags otherwise, two steps.
constexpr const char* kPipeline =
    "--vocab 256 --seq 64 --layers 4 --heads 4 --dim 128 --batch 16 --stages 4 --schedule 1f1b "
    "--microbatches 8 --steps 2 --eval-every 0";

class ReservedMemoryCli : public CliTest {
 protected:
  // 256 KiB of random bytes, a data file for the byte-level GPT.
  std::string Bytes() {
    const fs::path p = dir_ / "bytes.txt";
    if (!fs::exists(p)) {
      std::mt19937 rng(7);
      std::string text(256 << 10, '\0');
      for (char& c : text) c = static_cast<char>(rng() & 0xff);
      std::ofstream(p, std::ios::binary) << text;
    }
    return p.string();
  }

  nlohmann::json Plan(const std::string& args) {
    const CliResult r = Sluice(fmt::format("plan {} --format json", args));
    EXPECT_EQ(r.status, 0) << args << "\n" << r.err;
    return nlohmann::json::parse(r.out.empty() ? "{}" : r.out);
  }

  // The summary line of a training run.
  nlohmann::json Train(const std::string& args) {
    const fs::path metrics = dir_ / "m.jsonl";
    fs::remove(metrics);
    const CliResult r =
        Sluice(fmt::format("train {} --quiet --metrics {}", args, metrics.string()), "timeout 300");
    EXPECT_EQ(r.status, 0) << args << "\n" << r.err;
    std::ifstream in(metrics);
    nlohmann::json summary;
    for (std::string line; std::getline(in, line);) {
      nlohmann::json j = nlohmann::json::parse(line);
      if (j.value("summary", false)) summary = j;
    }
    return summary;
  }

  // Every stage's (or the one stage's) figures.
  static std::vector<nlohmann::json> Stages(const nlohmann::json& summary) {
    if (!summary.contains("stages")) return {summary};
    return {summary["stages"].begin(), summary["stages"].end()};
  }

  static void ExpectReservedNearAllocated(const nlohmann::json& summary, const std::string& job,
                                          int64_t percent = 105) {
    const std::vector<nlohmann::json> stages = Stages(summary);
    ASSERT_FALSE(stages.empty()) << job;
    for (size_t s = 0; s < stages.size(); ++s) {
      const int64_t allocated = stages[s]["peak_allocated_bytes"].get<int64_t>();
      const int64_t reserved = stages[s]["peak_reserved_bytes"].get<int64_t>();
      EXPECT_GT(allocated, 0) << job << " stage " << s;
      EXPECT_GE(reserved, allocated) << job << " stage " << s;
      EXPECT_LE(reserved * 100, allocated * percent)
          << job << " stage " << s << ": reserved " << reserved << " B, allocated " << allocated
          << " B (" << static_cast<double>(reserved) / static_cast<double>(allocated) << "x)";
    }
  }
};

TEST_F(ReservedMemoryCli, OneStageBatch16ReservesWithinFivePercentOfAllocated) {
  const std::string job = fmt::format("{} --batch 16 --recompute none --data {}", kGpt, Bytes());
  ExpectReservedNearAllocated(Train(job), job);
}

// Its recomputed block's 6 MiB and 4.5 MiB transients meet holes a little too small for them
// (1.081 with the holes kept): the allocator returns the holes' pages past its headroom (4% over
// the most allocated) before growing. One stage replays exactly: no jitter.
TEST_F(ReservedMemoryCli, OneStageBatch48FullRecomputeReservesWithinFivePercentOfAllocated) {
  const std::string job = fmt::format("{} --batch 48 --recompute full --data {}", kGpt, Bytes());
  ExpectReservedNearAllocated(Train(job), job);
}

// The order in which the stage threads free (sends completing) leaves different holes from run to
// run (1.04-1.11 with the holes kept); returning their pages past the headroom holds every stage
// within 5% whatever the order.
TEST_F(ReservedMemoryCli, FourStageJobReservesWithinFivePercentOfAllocatedOnEveryStage) {
  const std::string job = fmt::format("{} --data {}", kPipeline, Bytes());
  const nlohmann::json summary = Train(job);
  ASSERT_EQ(Stages(summary).size(), 4u) << summary.dump();
  ExpectReservedNearAllocated(summary, job);
}

// One stage under sync GC replays exactly: the plan's reserved peak is the run's, and it is at
// least the allocated peak the plan also predicts.
TEST_F(ReservedMemoryCli, PlanPredictsTheOneStageReservedPeak) {
  const std::string job = fmt::format("{} --batch 16 --recompute none --data {}", kGpt, Bytes());
  const nlohmann::json plan = Plan(job);
  ASSERT_EQ(plan["stages"].size(), 1u) << plan.dump();
  const int64_t predicted = plan["stages"][0]["predicted_peak_reserved_bytes"].get<int64_t>();
  EXPECT_GE(predicted, plan["stages"][0]["predicted_peak_allocated_bytes"].get<int64_t>());
  const nlohmann::json run = Train(job);
  EXPECT_EQ(run["predicted_peak_reserved_bytes"].get<int64_t>(), predicted);
  EXPECT_EQ(run["peak_reserved_bytes"].get<int64_t>(), predicted) << run.dump();
}

// --reserved-headroom reaches the run's allocators and the plan's model of them. At 0 the batch-48
// full-recompute job keeps its holes' pages (1.08x its allocated peak) and the plan predicts that;
// at 0.02 (and the default 0.04) it stays within that much of it. Either way the plan's reserved
// peak is the run's to the byte: the second step, which follows the first one's placements (fewer
// pages fault in again), stays within the first step's peak.
TEST_F(ReservedMemoryCli, TheHeadroomReachesTheRunAndThePlan) {
  for (const std::string headroom : {"0", "0.02", "0.04"}) {
    const std::string job = fmt::format(
        "{} --batch 48 --recompute full --data {} "
        "--reserved-headroom {}",
        kGpt, Bytes(), headroom);
    const nlohmann::json plan = Plan(job);
    ASSERT_EQ(plan["stages"].size(), 1u) << plan.dump();
    const nlohmann::json run = Train(job);
    const int64_t allocated = run["peak_allocated_bytes"].get<int64_t>();
    const int64_t reserved = run["peak_reserved_bytes"].get<int64_t>();
    EXPECT_EQ(plan["stages"][0]["predicted_peak_reserved_bytes"].get<int64_t>(), reserved) << job;
    EXPECT_EQ(run["predicted_peak_reserved_bytes"].get<int64_t>(), reserved) << job;
    const double ratio = static_cast<double>(reserved) / static_cast<double>(allocated);
    if (headroom == "0") {
      EXPECT_GT(ratio, 1.05) << job << ": no holes kept, the test is moot";
    } else {
      EXPECT_LE(ratio, 1 + std::stod(headroom)) << job;
    }
  }
}

// The text plan shows the reserved column beside the allocated peak.
TEST_F(ReservedMemoryCli, TextPlanShowsReservedBytes) {
  const CliResult r = Sluice(fmt::format("plan {} --data {}", kPipeline, Bytes()));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("reserved"), std::string::npos) << r.out;
}

// --memory-budget at 0.75× the largest stage's peak (the unbudgeted job's, allocated; issue 34's
// target) trains, with every stage's peak *reserved* within it whatever the order in which the
// stage threads free: the allocator returns its holes' pages before crossing the budget, and the
// plan's reserved bytes are the pages of what a stage holds. Stage 0 fits only by recomputing one
// sub-layer at a time (under full its least allocated peak is 1.01× the budget).
TEST_F(ReservedMemoryCli, ABudgetBoundsEveryStagesReservedPeak) {
  const std::string unbudgeted = fmt::format("{} --data {}", kPipeline, Bytes());
  const nlohmann::json free_run = Train(unbudgeted);
  int64_t largest = 0;
  for (const nlohmann::json& s : Stages(free_run))
    largest = std::max(largest, s["peak_allocated_bytes"].get<int64_t>());
  const int64_t budget = largest * 75 / 100;
  const std::string job = fmt::format("{} --memory-budget {}", unbudgeted, budget);
  const nlohmann::json plan = Plan(job);
  ASSERT_TRUE(plan["fits"].get<bool>()) << plan.dump();
  EXPECT_EQ(plan["stages"][0]["recompute"], "sublayer") << plan.dump();
  for (const auto& s : plan["stages"])
    EXPECT_LE(s["predicted_peak_reserved_bytes"].get<int64_t>(), budget) << s.dump();
  const nlohmann::json budgeted = Train(job);
  ASSERT_EQ(Stages(budgeted).size(), 4u) << budgeted.dump();
  for (const nlohmann::json& s : Stages(budgeted))
    EXPECT_LE(s["peak_reserved_bytes"].get<int64_t>(), budget) << s.dump();
}

}  // namespace
}  // namespace sluice
