// The cost profiler: it records each step's computes by micro-batch, measures a stage's bubble
// over the step's span, keeps stalled steps out of the waits' means, and says nothing of a wait
// for a core it could not measure; threads sharing one core are seen waiting for it; the transit
// of a message is fitted by every neighbour pair of a pipeline, and by no other rank.
#include "sluice/pipeline/cost_profiler.h"

#include <atomic>
#include <cmath>
#include <optional>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#if defined(__linux__)
#include <pthread.h>
#include <sched.h>
#endif

#include "comm/rank_threads.h"
#include "sluice/core/clock.h"
#include "sluice/schedule/schedules.h"

namespace sluice::pipeline {
namespace {

// The measured bubble has the simulator's definition: every stage's idle time is the step's span
// — the first rank's start to the last rank's end, the makespan of the replay — minus its busy
// time, not its own wall minus busy (which leaves out a late start and an early end); the step
// overhead is the engine's wall beyond that span.
TEST(CostProfiler, ProfiledBubbleIsIdleOverTheStepsSpan) {
  const Schedule s =
      MakeSchedule({.kind = ScheduleKind::kOneFOneB, .stages = 2, .micro_batches = 2});
  CostProfiler profiler(s, nlohmann::json::object());
  std::vector<StageStep> steps(2);
  steps[0].begin_ns = 1'000'000;  // starts first, ends at 101 ms
  steps[0].wall_ns = 100'000'000;
  steps[0].busy_ns = 60'000'000;
  steps[1].begin_ns = 11'000'000;  // starts 10 ms later, ends last at 111 ms
  steps[1].wall_ns = 100'000'000;
  steps[1].busy_ns = 80'000'000;
  profiler.Add(steps, /*step_wall_ns=*/120'000'000);
  const StepCosts c = profiler.Costs();
  // Span 110 ms: idle 50 and 30 ms (own walls would give 40 and 20).
  EXPECT_NEAR(c.measured["stage_bubble"][0].get<double>(), 50.0 / 110, 1e-12);
  EXPECT_NEAR(c.measured["stage_bubble"][1].get<double>(), 30.0 / 110, 1e-12);
  EXPECT_NEAR(c.step_overhead_ms, 10, 1e-12);
  EXPECT_EQ(StepSpanNs(steps), 110'000'000);
}

// The profiler records each step's computes by micro-batch (the order they ran in does not
// matter), the step's span and its bubbles — the first kMaxRecordedSteps steps.
TEST(CostProfiler, ProfilerRecordsEveryComputeByMicroBatch) {
  const Schedule s =
      MakeSchedule({.kind = ScheduleKind::kZeroBubbleH1, .stages = 2, .micro_batches = 2});
  CostProfiler profiler(s, nlohmann::json::object());
  for (int k = 0; k < kMaxRecordedSteps + 3; ++k) {
    std::vector<StageStep> steps(2);
    for (int r = 0; r < 2; ++r) {
      steps[r].begin_ns = r * 1'000'000;
      steps[r].wall_ns = 10'000'000;
      steps[r].busy_ns = 5'000'000;
      for (int m : {1, 0}) {  // micro-batch 1 first
        for (int kind = 0; kind < 3; ++kind) {
          steps[r].computes[kind].push_back(
              {.chunk = 0, .micro_batch = m, .wall_ns = (kind + 1) * 1'000'000 + m * 100'000 + r});
        }
      }
      steps[r].computes[3].push_back({.wall_ns = 300'000});
      steps[r].computes[4].push_back({.wall_ns = 400'000});
      steps[r].core_wait_ns = r * (k % 2 + 1) * 1'000'000;  // stage 1: 1 and 2 ms in turn
    }
    profiler.Add(steps, 12'000'000);
  }
  const StepCosts c = profiler.Costs();
  ASSERT_EQ(c.recorded.size(), static_cast<size_t>(kMaxRecordedSteps));
  EXPECT_EQ(c.micro_batches, 2);
  const RecordedStep& step = c.recorded[0];
  EXPECT_DOUBLE_EQ(step.span_ms, 11);
  EXPECT_DOUBLE_EQ(step.step_ms, 12);
  EXPECT_DOUBLE_EQ(step.stage_bubble[1], 6.0 / 11);
  EXPECT_DOUBLE_EQ(step.ranks[1].chunks[0].forward_ms[1], 1.100001);
  EXPECT_DOUBLE_EQ(step.ranks[0].chunks[0].weight_ms[0], 3);
  EXPECT_DOUBLE_EQ(step.ranks[0].update_ms, 0.4);
  // The threads' waits for a core: each step's, and each stage's mean over the steps.
  EXPECT_DOUBLE_EQ(step.ranks[0].core_wait_ms, 0);
  EXPECT_DOUBLE_EQ(step.ranks[1].core_wait_ms, 1);
  EXPECT_DOUBLE_EQ(c.recorded[1].ranks[1].core_wait_ms, 2);
  const nlohmann::json& waits = c.measured["stage_core_wait_ms"];
  ASSERT_EQ(waits.size(), 2u);
  EXPECT_DOUBLE_EQ(waits[0].get<double>(), 0);
  // 67 steps, 34 of 1 ms and 33 of 2 ms.
  EXPECT_DOUBLE_EQ(waits[1].get<double>(), (34 * 1.0 + 33 * 2.0) / 67);
  EXPECT_DOUBLE_EQ(CoreWaitShare(c), waits[1].get<double>() / 12);
}

// One stalled step does not skew the waits' means: a step in which a stage thread waited for a
// core (other work took it) holds a wake-up, bookkeeping and all-reduce of another machine, and
// while such steps are fewer than half, the means are of the steps that ran with a core per stage
// (two stalled steps of 19 made wake_ms 25 times its value, docs/simulator.md). When most steps
// waited, the run is of that other machine throughout, and the means are of every step.
TEST(CostProfiler, StepsThatWaitedForACoreDoNotSkewTheWaitsMeans) {
  const Schedule s =
      MakeSchedule({.kind = ScheduleKind::kOneFOneB, .stages = 2, .micro_batches = 2});
  // A step of 10 ms whose receive on stage 1 waited `wake` after its message was copied, whose
  // stage 0 spent `bookkeeping` outside computes and the communicator, whose all-reduce took
  // `allreduce` on the last rank to reach it, and whose stage 1 waited `core_wait` for a core.
  auto step = [](int64_t wake, int64_t bookkeeping, int64_t allreduce, int64_t core_wait) {
    std::vector<StageStep> steps(2);
    for (int r = 0; r < 2; ++r) {
      StageStep& st = steps[r];
      st.wall_ns = 10'000'000;
      st.computes[0].push_back({.wall_ns = 1'000'000});
      st.computes[1].push_back({.wall_ns = 2'000'000});
      st.busy_ns = 3'000'000;
      st.comm_ns = 7'000'000 - (r == 0 ? 2 * bookkeeping : 0);  // 2 computes
      st.allreduce_begin_ns = 8'000'000 + r;
      st.allreduce_end_ns = st.allreduce_begin_ns + (r == 1 ? allreduce : 1'000'000);
      st.core_wait_ns = r == 1 ? core_wait : 0;
    }
    steps[0].copied_sends.push_back({.message = 3, .begin_ns = 1'000'000, .end_ns = 1'100'000});
    steps[1].blocked_receives.push_back(
        {.message = 3, .begin_ns = 500'000, .end_ns = 1'100'000 + wake});
    return steps;
  };
  auto costs = [&](int stalled) {  // 4 steps, the last `stalled` of them stalled
    CostProfiler profiler(s, nlohmann::json::object());
    for (int k = 0; k < 4; ++k) {
      if (k < 4 - stalled) {
        profiler.Add(step(10'000 * (k + 1), 1'000 * (k + 1), 100'000 * (k + 1), 0), 10'000'000);
      } else {  // 3 ms of its 10 waiting for a core
        profiler.Add(step(5'000'000, 2'000'000, 4'000'000, 3'000'000), 10'000'000);
      }
    }
    return profiler.Costs();
  };
  const StepCosts one = costs(1);  // the means of steps 1-3: 20 µs, 2 µs, 200 µs
  EXPECT_DOUBLE_EQ(one.wake_ms, 0.02);
  EXPECT_DOUBLE_EQ(one.ranks[0].overhead_ms, 0.002);
  EXPECT_DOUBLE_EQ(one.allreduce_ms, 0.2);
  EXPECT_EQ(one.measured["steps_without_core_wait"], 3);
  const StepCosts two = costs(2);  // half: still the steps with a core per stage, 15 µs ...
  EXPECT_DOUBLE_EQ(two.wake_ms, 0.015);
  EXPECT_DOUBLE_EQ(two.ranks[0].overhead_ms, 0.0015);
  EXPECT_DOUBLE_EQ(two.allreduce_ms, 0.15);
  const StepCosts three = costs(3);  // most steps waited: every step's mean
  EXPECT_DOUBLE_EQ(three.wake_ms, (0.01 + 3 * 5.0) / 4);
  EXPECT_DOUBLE_EQ(three.ranks[0].overhead_ms, (0.001 + 3 * 2.0) / 4);
  EXPECT_DOUBLE_EQ(three.allreduce_ms, (0.1 + 3 * 4.0) / 4);
  EXPECT_EQ(three.measured["steps_without_core_wait"], 1);
  // The medians and the run's own figures are every step's.
  EXPECT_EQ(one.measured["steps"], 4);
  EXPECT_DOUBLE_EQ(one.ranks[1].chunks[0].forward_ms, 1);
}

// Where a stage's thread could not say how long it waited for a core (StageStep::core_wait_ns
// -1: not Linux, or a distributed process that knows only its own rank), the costs say nothing
// of it rather than 0 — and a prediction from them carries no note.
TEST(CostProfiler, UnknownWaitsForACoreAreNotZero) {
  const Schedule s =
      MakeSchedule({.kind = ScheduleKind::kOneFOneB, .stages = 2, .micro_batches = 2});
  CostProfiler profiler(s, nlohmann::json::object());
  std::vector<StageStep> steps(2);
  for (StageStep& st : steps) {
    st.wall_ns = 10'000'000;
    for (int m : {0, 1}) {
      st.computes[0].push_back({.micro_batch = m, .wall_ns = 1'000'000});
      st.computes[1].push_back({.micro_batch = m, .wall_ns = 2'000'000});
    }
  }
  steps[0].core_wait_ns = 3'000'000;  // stage 1 does not say
  profiler.Add(steps, 10'000'000);
  const StepCosts c = profiler.Costs();
  EXPECT_FALSE(c.measured.contains("stage_core_wait_ms")) << c.measured.dump();
  EXPECT_DOUBLE_EQ(c.recorded[0].ranks[0].core_wait_ms, 3);
  EXPECT_DOUBLE_EQ(c.recorded[0].ranks[1].core_wait_ms, -1);
  EXPECT_DOUBLE_EQ(CoreWaitShare(c), -1);
  EXPECT_DOUBLE_EQ(CoreWaitShare(UnitCosts(s)), -1);
}

#if defined(__linux__)
// The measure of whether a run had a core per stage: two threads kept on one core, both ready to
// run for 30 ms of CPU time each, cannot run at once, so one of them waits for the core while the
// other holds it — on an idle machine or a loaded one (there they wait longer).
TEST(CostProfiler, ThreadsSharingOneCoreWaitForIt) {
  if (ThreadCoreWaitNs() < 0) GTEST_SKIP() << "this system does not say how long threads wait";
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  int cpu = 0;
  while (cpu < CPU_SETSIZE && !CPU_ISSET(cpu, &allowed)) ++cpu;
  ASSERT_LT(cpu, CPU_SETSIZE);
  std::atomic<int> ready{0};
  std::vector<int64_t> waits(2, -1);
  auto spin = [&](int i) {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    const bool kept = pthread_setaffinity_np(pthread_self(), sizeof one, &one) == 0;
    ++ready;
    if (!kept) return;  // waits[i] stays -1: the test fails instead of hanging
    while (ready.load() < 2) {
    }
    const int64_t wait = ThreadCoreWaitNs(), cpu_begin = ThreadCpuNs();
    while (ThreadCpuNs() - cpu_begin < 30'000'000) {
    }
    waits[i] = ThreadCoreWaitNs() - wait;
  };
  std::thread a(spin, 0), b(spin, 1);
  a.join();
  b.join();
  ASSERT_GE(waits[0], 0);
  ASSERT_GE(waits[1], 0);
  EXPECT_GT(waits[0] + waits[1], 0);
  const int64_t before = ThreadCoreWaitNs();
  EXPECT_GE(ThreadCoreWaitNs(), before);
}
#endif

// MeasureTransit is collective: every rank of the pipeline takes part, each pair of neighbours
// ping-pongs (even stages first, then odd), and each rank that pinged its next stage gets a fit —
// the last stage, and a pipeline of one, none. Ranks are threads here (no network: only the
// protocol and the fit's signs are checked, never a time).
TEST(CostProfiler, TransitIsFittedByEveryNeighbourPairAndNoOtherRank) {
  for (int P : {1, 2, 3, 4}) {
    LocalWorld world(P, {.timeout = std::chrono::seconds(30)});
    std::vector<std::optional<TransitFit>> fits(static_cast<size_t>(P));
    testing::RunRanks(world, [&](int r) { fits[r] = MeasureTransit(world.comm(r), 4096); });
    for (int r = 0; r < P; ++r) {
      SCOPED_TRACE(::testing::Message() << "P = " << P << ", rank " << r);
      ASSERT_EQ(fits[r].has_value(), r + 1 < P);
      if (!fits[r]) continue;
      EXPECT_TRUE(std::isfinite(fits[r]->latency_ms) && fits[r]->latency_ms >= 0);
      EXPECT_TRUE(std::isfinite(fits[r]->ms_per_byte) && fits[r]->ms_per_byte >= 0);
    }
  }
}

// Under MPI the ranks share no clock: each measures its half of a message round trip — the
// sender of F(m) from posting it until the blocked receive of B(m) returns, the receiver from its
// blocked receive of F(m) returning until it posts B(m) — and the difference is two transits. A
// receive that did not block says nothing (the message came before the wait), nor does a rank's
// half alone.
TEST(CostProfiler, TransitInTheStepIsHalfTheRoundTripBeyondThePeersTurn) {
  const Schedule s =
      MakeSchedule({.kind = ScheduleKind::kOneFOneB, .stages = 2, .micro_batches = 2});
  CostProfiler profiler(s, nlohmann::json::object());
  // Messages: (receiving virtual stage · M + m) · 2 + direction. F(m) to stage 1: 4 + 2m;
  // B(m) to stage 0: 1 + 2m.
  StageStep lower, upper;
  lower.sends = {{4, 100, 110}, {6, 2000, 2010}};
  lower.blocked_receives = {{1, 150, 1100}};  // B(1)'s receive did not block
  upper.blocked_receives = {{4, 0, 300}, {6, 0, 2400}};
  upper.sends = {{1, 700, 710}, {3, 2900, 2910}};
  profiler.AddRank(0, lower, 3000);
  profiler.AddRank(1, upper, 3000);
  const std::vector<std::vector<double>>& halves = profiler.RoundTrips();
  ASSERT_EQ(halves.size(), 2u);  // one per AddRank
  ASSERT_EQ(halves[0].size(), 4u);
  EXPECT_EQ(halves[0][0], 1000);          // rank 0: F(0) posted at 100, B(0) back at 1100
  EXPECT_TRUE(std::isnan(halves[0][1]));  // the upper half is rank 1's
  EXPECT_TRUE(std::isnan(halves[0][2]));  // B(1)'s receive did not block
  EXPECT_EQ(halves[1][1], 400);           // rank 1: F(0) at 300, B(0) posted at 700
  EXPECT_EQ(halves[1][3], 500);           // F(1) at 2400, B(1) posted at 2900
  std::vector<double> joined(4);
  for (size_t i = 0; i < joined.size(); ++i)
    joined[i] = std::isnan(halves[0][i]) ? halves[1][i] : halves[0][i];
  // Only m = 0 has both halves: (1000 − 400) / 2 ns.
  ASSERT_TRUE(TransitInStepMs(joined).has_value());
  EXPECT_DOUBLE_EQ(*TransitInStepMs(joined), 300e-6);
  EXPECT_FALSE(TransitInStepMs(halves[0]).has_value());  // one rank's halves alone: none
}

}  // namespace
}  // namespace sluice::pipeline
