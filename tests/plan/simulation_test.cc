// The simulation behind `sluice simulate` (plan/simulation.h), without a command line: a schedule's
// step at unit cost beside its memory forecast, and the ranking of --compare — the schedules within
// the budget first, then by predicted step time — with each kind the job cannot run set apart with
// its reason.
#include "sluice/plan/simulation.h"

#include <algorithm>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "sluice/core/error.h"
#include "sluice/pipeline/cost_profiler.h"
#include "sluice/schedule/schedule_analysis.h"
#include "sluice/schedule/steady_state.h"

namespace sluice {
namespace {

using pipeline::ScheduleKind;

SimulationRequest Request(int stages, int64_t microbatches) {
  SimulationRequest r;
  r.config.gpt = {.vocab = 0, .seq = 0, .layers = 4, .heads = 2, .dim = 32};
  r.config.batch = 4 * microbatches;
  r.config.microbatches = microbatches;
  r.config.threads = 1;
  r.pipe = {.stages = stages, .partition = pipeline::PartitionKind::kBalanced};
  return r;
}

std::vector<ScheduleKind> EveryKind() {
  std::vector<ScheduleKind> kinds;
  for (const auto& [kind, name] : pipeline::kScheduleKindNames) kinds.push_back(kind);
  return kinds;
}

TEST(Simulation, UnitCostsGiveTheScheduleAnalysisBubbleAndTheForecast) {
  const SimulationRequest r = Request(4, 8);
  const Job job = MakeJob(r.config);
  const SimulatedSchedule s = SimulateSchedule(r, job, ScheduleKind::kOneFOneB);
  EXPECT_EQ(s.costs, "unit costs");
  ASSERT_EQ(s.memory.size(), 4u);
  EXPECT_TRUE(s.fits);
  // 1F1B at unit cost: (P − 1)/(M + P − 1), as the schedule's own analysis says.
  EXPECT_NEAR(s.prediction.bubble, 3.0 / 11, 1e-12);
  EXPECT_EQ(s.LargestPeak(), std::ranges::max(s.memory, {}, [](const StageMemoryForecast& f) {
                               return f.peak_allocated_bytes;
                             }).peak_allocated_bytes);
}

TEST(Simulation, RankingPutsTheBudgetFirstThenTheStepTime) {
  SimulationRequest r = Request(4, 4);  // M = 4 < 2P − 1: zb-v cannot run
  const Job job = MakeJob(r.config);
  const ScheduleRanking free = RankSchedules(r, job, EveryKind());
  ASSERT_GE(free.ranked.size(), 3u);
  // A budget between the smallest and the largest of the kinds' largest peaks: some fit, some not.
  std::vector<int64_t> peaks;
  // What a budget bounds: each kind's largest reserved peak.
  const auto largest_reserved = [](const SimulatedSchedule& s) {
    int64_t peak = 0;
    for (const StageMemoryForecast& m : s.memory) peak = std::max(peak, m.peak_reserved_bytes);
    return peak;
  };
  for (const SimulatedSchedule& s : free.ranked) peaks.push_back(largest_reserved(s));
  std::ranges::sort(peaks);
  ASSERT_LT(peaks.front(), peaks.back());
  r.budget.assign(4, peaks.front());
  const ScheduleRanking ranking = RankSchedules(r, job, EveryKind());
  EXPECT_EQ(ranking.ranked.size() + ranking.refused.size(), EveryKind().size());
  bool over_seen = false;
  for (size_t i = 0; i < ranking.ranked.size(); ++i) {
    const SimulatedSchedule& s = ranking.ranked[i];
    EXPECT_EQ(s.fits, largest_reserved(s) <= peaks.front()) << s.describe;
    EXPECT_FALSE(over_seen && s.fits) << s.describe << " fits but ranks after one over budget";
    over_seen = over_seen || !s.fits;
    if (i > 0 && ranking.ranked[i - 1].fits == s.fits) {
      EXPECT_LE(ranking.ranked[i - 1].prediction.step_ms, s.prediction.step_ms) << s.describe;
    }
  }
  EXPECT_TRUE(ranking.ranked.front().fits);
  EXPECT_TRUE(over_seen);
  const auto zbv = std::ranges::find_if(
      ranking.refused, [](const auto& r) { return r.first == ScheduleKind::kZeroBubbleV; });
  ASSERT_NE(zbv, ranking.refused.end());
  EXPECT_FALSE(zbv->second.empty());
}

// The costs of a profile of this job: unit computes (F, B, W 1 each, messages free), as a
// costs file of `sluice train --profile-out` would hold them.
pipeline::StepCosts ProfileOf(const SimulationRequest& r, const Job& job, ScheduleKind kind) {
  const EngineContext ctx{.config = r.config, .task = *job.task, .model = job.model, .threads = 1};
  pipeline::PipelineOptions options = r.pipe;
  options.schedule = kind;
  const pipeline::PipelineLayout layout = pipeline::LayOutPipeline(ctx, options, 1);
  pipeline::StepCosts costs = pipeline::UnitCosts(layout.setup.schedule);
  costs.source = "test costs";
  costs.job = pipeline::ProfileJob(layout.setup, layout.layout);
  return costs;
}

// `simulate --post-validate` with a costs file replays interlocked steps at the per-action costs:
// at unit computes the unit-cost analysis' steady state; every step pays each rank's OPT and the
// copy of its rollback state at the profile's copy bandwidth — not again when the profiled run
// had post-validation (its update held the copy).
TEST(Simulation, PostValidationWithAProfileChargesEveryStepsOptAndRollbackCopy) {
  SimulationRequest r = Request(4, 8);
  r.pipe.post_validate = true;
  const Job job = MakeJob(r.config);
  const ScheduleKind kind = ScheduleKind::kZeroBubbleH2;
  const SimulatedSchedule unit = SimulateSchedule(r, job, kind);
  ASSERT_TRUE(unit.steady.has_value());
  EXPECT_FALSE(unit.steady_per_action);

  r.costs = {ProfileOf(r, job, kind)};
  const SimulatedSchedule free = SimulateSchedule(r, job, kind);
  ASSERT_TRUE(free.steady.has_value());
  EXPECT_TRUE(free.steady_per_action);
  EXPECT_NEAR(free.steady->period, unit.steady->period, 1e-9);
  EXPECT_NEAR(free.steady->bubble, unit.steady->bubble, 1e-9);
  EXPECT_EQ(free.rollback_copy_ms, 0);
  EXPECT_EQ(free.RankedTime(), free.steady->period);

  // Each rank's OPT 0.25 ms: every step pays it.
  pipeline::StepCosts& c = r.costs[0];
  for (pipeline::RankCosts& rank : c.ranks) rank.optimizer_ms = 0.25;
  EXPECT_NEAR(SimulateSchedule(r, job, kind).steady->period, free.steady->period + 0.25, 1e-9);

  // A copy of message_bytes costs copy_ms (the messages' copies too): the rollback copy is charged
  // at that bandwidth, on the rank where it costs most — unless the profile's run copied already.
  c.message_bytes = 1 << 20;
  c.copy_ms = 0.5;
  const SimulatedSchedule charged = SimulateSchedule(r, job, kind);
  double copy = 0;
  for (const StageMemoryForecast& m : charged.memory) {
    ASSERT_GT(m.rollback_bytes, 0);
    copy = std::max(copy, static_cast<double>(m.rollback_bytes) * 0.5 / (1 << 20));
  }
  EXPECT_DOUBLE_EQ(charged.rollback_copy_ms, copy);
  c.measured["post_validate"] = true;
  const SimulatedSchedule measured = SimulateSchedule(r, job, kind);
  EXPECT_EQ(measured.rollback_copy_ms, 0);
  EXPECT_NEAR(charged.steady->period - measured.steady->period, copy, 1e-9);
}

TEST(Simulation, NoKindThatCanRunIsAnErrorNamingEach) {
  const SimulationRequest r = Request(4, 4);
  const Job job = MakeJob(r.config);
  try {
    RankSchedules(r, job, {ScheduleKind::kZeroBubbleV});
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(
        std::string(e.what()).find("no schedule named can be simulated for this job:\n  zb-v: "),
        std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace sluice
