// Interlocked steps (post-validation): InterlockSteps makes a valid schedule of N steps, and the
// steady state at unit cost matches the zero-bubble paper — ZB-H2 and ZB-V lose nothing between
// steps at P = 8, M = 32 (Qi et al. 2024, table 3: bubble 0), their synchronous bubble being
// exactly the first fill and the last drain, now paid once per run.
#include "sluice/schedule/steady_state.h"

#include <algorithm>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "sluice/schedule/schedule_format.h"
#include "sluice/schedule/schedules.h"
#include "sluice/schedule/validator.h"

namespace sluice::pipeline {
namespace {

TEST(InterlockSteps, RenumbersEachStepsMicroBatchesAndKeepsOneOpt) {
  const Schedule one =
      MakeSchedule({.kind = ScheduleKind::kOneFOneB, .stages = 2, .micro_batches = 3});
  const Schedule three = InterlockSteps(one, 3);
  EXPECT_NO_THROW(ValidateSchedule(three));
  EXPECT_EQ(three.micro_batches, 9);
  for (int r = 0; r < 2; ++r) {
    const std::vector<Action>& list = three.ranks[r];
    ASSERT_EQ(list.size(), 3 * one.ranks[r].size() - 2) << "rank " << r;
    EXPECT_EQ(std::count_if(list.begin(), list.end(),
                            [](const Action& a) { return a.kind == ActionKind::kOptimizer; }),
              1);
    // Step 1's actions follow step 0's, micro-batch m as 3 + m.
    const size_t n = one.ranks[r].size() - 1;  // step 0 without its OPT
    for (size_t i = 0; i < n; ++i) {
      Action expected = one.ranks[r][i];
      expected.micro_batch = expected.micro_batch + 3;
      EXPECT_EQ(list[n + i], expected) << "rank " << r << " action " << n + i;
    }
  }
  EXPECT_EQ(InterlockSteps(one, 1), one);
  EXPECT_THROW(InterlockSteps(one, 0), InvalidArgument);
}

// The paper's figure: with T_F = T_B = T_W, ZB-H2 and ZB-V have no bubble once steps interlock.
TEST(SteadyState, ZeroBubbleH2AndVHaveNoBubbleBetweenStepsAtP8M32) {
  for (ScheduleKind kind : {ScheduleKind::kZeroBubbleH2, ScheduleKind::kZeroBubbleV}) {
    const Schedule s = MakeSchedule({.kind = kind, .stages = 8, .micro_batches = 32});
    const SteadyState st = GridSteadyState(s);
    const std::string what(ScheduleKindName(kind));
    // Every rank computes F, B and W of each of its chunk-micro-batches: 3·V·M unit steps.
    const double busy = 3.0 * s.chunks * 32;
    EXPECT_EQ(st.period, busy) << what;
    EXPECT_EQ(st.bubble, 0.0) << what;
    EXPECT_GT(st.synchronous_bubble, 0.03) << what << ": every synchronous step fills and drains";
    // What a synchronous step loses is the fill and the drain, now paid once per run.
    EXPECT_DOUBLE_EQ(st.fill + st.drain, st.synchronous_makespan - st.period) << what;
    EXPECT_GT(st.fill, 0) << what;
    EXPECT_GT(st.drain, 0) << what;
  }
}

// The synchronous figures are Simulate's; ZB-H2's one step is the parallelogram with P − 1 idle
// steps per rank, its steady state none, and the fill and drain are (P − 1)/2 each on average.
TEST(SteadyState, ZeroBubbleH2sFillAndDrainAreHalfThePipelineDepthEach) {
  const Schedule s =
      MakeSchedule({.kind = ScheduleKind::kZeroBubbleH2, .stages = 8, .micro_batches = 32});
  const SteadyState st = GridSteadyState(s);
  EXPECT_EQ(st.synchronous_makespan, 3 * 32 + 7);
  EXPECT_DOUBLE_EQ(st.synchronous_bubble, 7.0 / 103);
  EXPECT_DOUBLE_EQ(st.fill, 3.5);
  EXPECT_DOUBLE_EQ(st.drain, 3.5);
}

// Interlocking never lengthens a step: every schedule's steady state is at most its synchronous
// step and bubble, and a schedule with a bubble inside its steady state (1F1B's, whose ranks
// alternate F and B and wait for each other's) keeps part of it.
TEST(SteadyState, NoScheduleLosesByInterlocking) {
  for (const auto& [kind, name] : kScheduleKindNames) {
    const Schedule s = MakeSchedule({.kind = kind, .stages = 4, .micro_batches = 8});
    const SteadyState st = GridSteadyState(s);
    EXPECT_LE(st.period, st.synchronous_makespan) << name;
    EXPECT_LE(st.bubble, st.synchronous_bubble + 1e-12) << name;
    EXPECT_GE(st.bubble, 0.0) << name;
  }
}

TEST(SteadyState, FormatsTheSteadyStateBesideTheSynchronousStep) {
  const SteadyState st = GridSteadyState(
      MakeSchedule({.kind = ScheduleKind::kZeroBubbleH2, .stages = 8, .micro_batches = 32}));
  const std::string text = FormatSteadyState(st);
  EXPECT_NE(
      text.find("a training step every 96 unit steps, bubble 0.0% (synchronous: 103, bubble 6.8%)"),
      std::string::npos)
      << text;
  EXPECT_NE(text.find("the first fill 3.5 and the last drain 3.5"), std::string::npos) << text;
  const auto json = SteadyStateJson(st);
  EXPECT_EQ(json["steady_state_bubble"], 0.0);
  EXPECT_EQ(json["steady_state_step"], 96.0);
}

}  // namespace
}  // namespace sluice::pipeline
