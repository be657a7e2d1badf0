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
#include "sluice/schedule/schedule_analysis.h"

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
