// The generators over every request in P ∈ 1..8, M ∈ P..4P (gpipe, v-half and v-min also M < P,
// zb-v from 2P − 1), V ∈ {2, 3} (interleaved): each schedule validates, has the promised shape,
// and meets the closed forms for in-flight micro-batches and bubble (v-half and v-min: the
// paper's activation memory, and the bubble for M ≥ 2P); impossible requests fail naming the fix.
#include "sluice/schedule/schedules.h"

#include <algorithm>
#include <array>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sluice/schedule/building_block.h"
#include "sluice/schedule/schedule_analysis.h"
#include "sluice/schedule/validator.h"

namespace sluice::pipeline {
namespace {

using ::testing::HasSubstr;

std::vector<ScheduleOptions> AllRequests() {
  std::vector<ScheduleOptions> all;
  for (int P = 1; P <= 8; ++P) {
    for (int M = 1; M <= 4 * P; ++M) {
      all.push_back({.kind = ScheduleKind::kGPipe, .stages = P, .micro_batches = M});
      all.push_back({.kind = ScheduleKind::kVHalf, .stages = P, .micro_batches = M});
      all.push_back({.kind = ScheduleKind::kVMin, .stages = P, .micro_batches = M});
      if (M < P) continue;
      all.push_back({.kind = ScheduleKind::kOneFOneB, .stages = P, .micro_batches = M});
      all.push_back({.kind = ScheduleKind::kZeroBubbleH1, .stages = P, .micro_batches = M});
      all.push_back({.kind = ScheduleKind::kZeroBubbleH2, .stages = P, .micro_batches = M});
      if (M >= 2 * P - 1)
        all.push_back({.kind = ScheduleKind::kZeroBubbleV, .stages = P, .micro_batches = M});
      if (M % P != 0) continue;
      for (int V : {2, 3}) {
        all.push_back(
            {.kind = ScheduleKind::kInterleaved, .stages = P, .micro_batches = M, .chunks = V});
      }
    }
  }
  return all;
}

std::vector<Action> Computes(const std::vector<Action>& list) {
  std::vector<Action> computes;
  for (const Action& a : list) {
    if (IsCompute(a.kind)) computes.push_back(a);
  }
  return computes;
}

TEST(Schedules, EveryRequestValidates) {
  for (const ScheduleOptions& o : AllRequests()) {
    const Schedule s = MakeSchedule(o);
    SCOPED_TRACE(s.Describe());
    EXPECT_NO_THROW(ValidateSchedule(s));
    EXPECT_EQ(s.name, ScheduleKindName(o.kind));
    EXPECT_EQ(s.stages, o.stages);
    EXPECT_EQ(s.micro_batches, o.micro_batches);
    const bool v = o.kind == ScheduleKind::kZeroBubbleV || o.kind == ScheduleKind::kVHalf ||
                   o.kind == ScheduleKind::kVMin;
    EXPECT_EQ(IsVShaped(o.kind), v);
    EXPECT_EQ(s.chunks, o.kind == ScheduleKind::kInterleaved ? o.chunks : v ? 2 : 1);
    EXPECT_EQ(s.chunks, ChunksOf(o));
    EXPECT_EQ(s.split_backward,
              o.kind == ScheduleKind::kZeroBubbleH1 || o.kind == ScheduleKind::kZeroBubbleH2 || v);
    EXPECT_EQ(s.v_shape, v);
  }
}

TEST(Schedules, Deterministic) {
  for (const ScheduleOptions& o : AllRequests()) EXPECT_EQ(MakeSchedule(o), MakeSchedule(o));
}

TEST(Schedules, FirstStageNeverReceivesForwardLastNeverSendsIt) {
  for (const ScheduleOptions& o : AllRequests()) {
    const Schedule s = MakeSchedule(o);
    SCOPED_TRACE(s.Describe());
    for (int r = 0; r < s.stages; ++r) {
      for (const Action& a : s.ranks[r]) {
        const int vs = s.VirtualStage(r, a.chunk);
        if (vs == 0) {
          EXPECT_NE(a.kind, ActionKind::kRecvF);
        }
        if (vs == s.virtual_stages() - 1) {
          EXPECT_NE(a.kind, ActionKind::kSendF);
        }
      }
    }
  }
}

TEST(Schedules, OptimizerOncePerRankAtTheEnd) {
  for (const ScheduleOptions& o : AllRequests()) {
    const Schedule s = MakeSchedule(o);
    SCOPED_TRACE(s.Describe());
    for (const std::vector<Action>& list : s.ranks) {
      ASSERT_FALSE(list.empty());
      EXPECT_EQ(list.back().kind, ActionKind::kOptimizer);
      EXPECT_EQ(std::ranges::count(list, ActionKind::kOptimizer, &Action::kind), 1);
    }
  }
}

TEST(Schedules, OneFOneBLastStageRunsEachBackwardRightAfterItsForward) {
  for (int P = 1; P <= 8; ++P) {
    for (int M = P; M <= 4 * P; ++M) {
      const Schedule s =
          MakeSchedule({.kind = ScheduleKind::kOneFOneB, .stages = P, .micro_batches = M});
      SCOPED_TRACE(s.Describe());
      const std::vector<Action> computes = Computes(s.ranks[P - 1]);
      ASSERT_EQ(computes.size(), 2u * M);
      for (int m = 0; m < M; ++m) {
        EXPECT_EQ(computes[2 * m], (Action{.kind = ActionKind::kForward, .micro_batch = m}));
        EXPECT_EQ(computes[2 * m + 1], (Action{.kind = ActionKind::kBackward, .micro_batch = m}));
      }
    }
  }
}

TEST(Schedules, SendsFollowTheirComputeSoOutputsCanBeReleased) {
  // Every SEND_F (SEND_B) comes right after its F (B), with only other messages in between —
  // except a few interleaved sends held back to a moment both ranks pause (schedules.h).
  for (const ScheduleOptions& o : AllRequests()) {
    if (o.kind == ScheduleKind::kInterleaved) continue;
    const Schedule s = MakeSchedule(o);
    SCOPED_TRACE(s.Describe());
    for (const std::vector<Action>& list : s.ranks) {
      const Action* last_compute = nullptr;
      for (const Action& a : list) {
        if (IsCompute(a.kind)) last_compute = &a;
        if (!IsSend(a.kind)) continue;
        ASSERT_NE(last_compute, nullptr);
        const ActionKind producer =
            a.kind == ActionKind::kSendF ? ActionKind::kForward : ActionKind::kBackward;
        EXPECT_EQ(*last_compute,
                  (Action{.kind = producer, .chunk = a.chunk, .micro_batch = a.micro_batch}));
      }
    }
  }
}

TEST(Schedules, GPipeRunsAllForwardsThenAllBackwards) {
  const Schedule s = MakeSchedule({.kind = ScheduleKind::kGPipe, .stages = 3, .micro_batches = 2});
  for (int r = 0; r < 3; ++r) {
    EXPECT_EQ(Computes(s.ranks[r]), (std::vector<Action>{{ActionKind::kForward, 0, 0},
                                                         {ActionKind::kForward, 0, 1},
                                                         {ActionKind::kBackward, 0, 0},
                                                         {ActionKind::kBackward, 0, 1}}));
  }
}

TEST(Schedules, InterleavedPlacesChunkCOfRankROnVirtualStageCPPlusR) {
  // P = 2, V = 2: rank 0 holds virtual stages 0 and 2, rank 1 stages 1 and 3, so rank 1's chunk 0
  // sends its forward output back to rank 0's chunk 1.
  const Schedule s =
      MakeSchedule({.kind = ScheduleKind::kInterleaved, .stages = 2, .micro_batches = 2});
  const Action send{.kind = ActionKind::kSendF, .chunk = 0, .micro_batch = 0, .peer = 0};
  const Action recv{.kind = ActionKind::kRecvF, .chunk = 1, .micro_batch = 0, .peer = 1};
  EXPECT_EQ(std::ranges::count(s.ranks[1], send), 1);
  EXPECT_EQ(std::ranges::count(s.ranks[0], recv), 1);
  EXPECT_EQ(Computes(s.ranks[0]).front(), (Action{.kind = ActionKind::kForward}));
}

TEST(Schedules, InFlightMatchesTheory) {
  for (const ScheduleOptions& o : AllRequests()) {
    const Schedule s = MakeSchedule(o);
    SCOPED_TRACE(s.Describe());
    const std::vector<InFlight> peaks = InFlightPeaks(s);
    for (int r = 0; r < s.stages; ++r)
      EXPECT_EQ(peaks[r].peak, TheoreticalInFlight(o, r)) << "rank " << r;
  }
}

TEST(Schedules, InFlightClosedForms) {
  // The formulas themselves, at P = 4, M = 8 (docs/pipeline.md).
  auto in_flight = [](ScheduleKind kind, int rank, int chunks = 0) {
    return TheoreticalInFlight({.kind = kind, .stages = 4, .micro_batches = 8, .chunks = chunks},
                               rank);
  };
  EXPECT_EQ(in_flight(ScheduleKind::kGPipe, 3), 8);
  EXPECT_EQ(in_flight(ScheduleKind::kOneFOneB, 0), 4);
  EXPECT_EQ(in_flight(ScheduleKind::kOneFOneB, 3), 1);
  EXPECT_EQ(in_flight(ScheduleKind::kZeroBubbleH1, 1), 3);
  EXPECT_EQ(in_flight(ScheduleKind::kZeroBubbleH2, 0), 7);  // 2(P − s) − 1
  EXPECT_EQ(in_flight(ScheduleKind::kZeroBubbleH2, 1), 5);
  EXPECT_EQ(in_flight(ScheduleKind::kZeroBubbleH2, 3), 1);
  EXPECT_EQ(TheoreticalInFlight(
                {.kind = ScheduleKind::kZeroBubbleH2, .stages = 4, .micro_batches = 5}, 0),
            5);                                                                        // M
  for (int r = 0; r < 4; ++r) EXPECT_EQ(in_flight(ScheduleKind::kZeroBubbleV, r), 8);  // 2P
  EXPECT_EQ(in_flight(ScheduleKind::kInterleaved, 0, 2), 11);  // V·P + P − 1
  EXPECT_EQ(in_flight(ScheduleKind::kInterleaved, 3, 2), 5);
  EXPECT_EQ(
      TheoreticalInFlight({.kind = ScheduleKind::kInterleaved, .stages = 4, .micro_batches = 4}, 0),
      8);  // V·M
}

TEST(Schedules, ZeroBubbleH1HoldsNoMoreBetweenForwardAndBackwardThanOneFOneB) {
  for (int P = 1; P <= 8; ++P) {
    for (int M = P; M <= 4 * P; ++M) {
      const auto zb = InFlightPeaks(
          MakeSchedule({.kind = ScheduleKind::kZeroBubbleH1, .stages = P, .micro_batches = M}));
      const auto base = InFlightPeaks(
          MakeSchedule({.kind = ScheduleKind::kOneFOneB, .stages = P, .micro_batches = M}));
      for (int r = 0; r < P; ++r) {
        EXPECT_EQ(zb[r].peak, base[r].peak) << "P=" << P << " M=" << M << " rank " << r;
        EXPECT_EQ(zb[r].peak_awaiting_weight, r + 1) << "P=" << P << " M=" << M << " rank " << r;
        // Between F and W, at most what 1F1B holds on its fullest stage.
        EXPECT_EQ(zb[r].peak_until_weight, base[0].peak)
            << "P=" << P << " M=" << M << " rank " << r;
        EXPECT_EQ(base[r].peak_until_weight, base[r].peak);
      }
    }
  }
}

TEST(Schedules, ZeroBubbleH2HoldsUpToTwiceOneFOneB) {
  // Between F and W every stage holds at most 2P − 1 micro-batches (1F1B's stage 0 holds P),
  // and exactly that many once M allows it.
  for (int P = 1; P <= 8; ++P) {
    for (int M = P; M <= 4 * P; ++M) {
      const auto zb = InFlightPeaks(
          MakeSchedule({.kind = ScheduleKind::kZeroBubbleH2, .stages = P, .micro_batches = M}));
      for (int r = 0; r < P; ++r) {
        EXPECT_EQ(zb[r].peak_until_weight, std::min(2 * P - 1, M))
            << "P=" << P << " M=" << M << " rank " << r;
      }
    }
  }
}

TEST(Schedules, ZeroBubbleH2RunsEachStageWithoutAGapOnceMAllows) {
  // M ≥ 2P − 1 at unit cost: stage s computes from step s to step s + 3M without pausing (the
  // parallelogram of Qi et al.), so its only idle time is the skew: P − 1 steps, as for zb-h1.
  for (int P = 1; P <= 8; ++P) {
    for (int M = 2 * P - 1; M <= 4 * P; ++M) {
      const Schedule s =
          MakeSchedule({.kind = ScheduleKind::kZeroBubbleH2, .stages = P, .micro_batches = M});
      const Simulation sim = Simulate(s);
      for (int r = 0; r < P; ++r) {
        double first = -1, last = 0;
        for (size_t i = 0; i < s.ranks[r].size(); ++i) {
          if (!IsCompute(s.ranks[r][i].kind)) continue;
          if (first < 0) first = sim.ranks[r].actions[i].start;
          last = sim.ranks[r].actions[i].end;
        }
        EXPECT_EQ(first, r) << s.Describe() << " rank " << r;
        EXPECT_EQ(last, r + 3 * M) << s.Describe() << " rank " << r;
      }
    }
  }
}

TEST(Schedules, ZeroBubbleH2BeatsH1WhenWeightGradientsAreCheaper) {
  // With W cheaper than F + B, zb-h1 idles (P − 1)(F + B − W) (Qi et al.), zb-h2 only the
  // (P − 1)·F of its skew: makespan M(F + B + W) + (P − 1)·F. Receives are posted ahead, as
  // messages were placed for W = 1.
  const CostModel cheap_w{.forward = 1, .backward = 1, .weight = 0.5};
  for (int P = 2; P <= 8; ++P) {
    for (int M = 2 * P - 1; M <= 4 * P; ++M) {
      const Simulation h2 = Simulate(
          MakeSchedule({.kind = ScheduleKind::kZeroBubbleH2, .stages = P, .micro_batches = M}),
          cheap_w, CommMode::kAsync);
      const Simulation h1 = Simulate(
          MakeSchedule({.kind = ScheduleKind::kZeroBubbleH1, .stages = P, .micro_batches = M}),
          cheap_w, CommMode::kAsync);
      EXPECT_EQ(h2.makespan, 2.5 * M + (P - 1)) << "P=" << P << " M=" << M;
      EXPECT_EQ(h1.makespan, 2.5 * M + 1.5 * (P - 1)) << "P=" << P << " M=" << M;
    }
  }
}

TEST(Schedules, ZeroBubbleVRunsTheModelDownAndBackUp) {
  // P = 4: rank r holds virtual stages r and 7 − r. Rank 0 runs the first and the last (embed and
  // loss); rank 3 hands chunk 0's output to its own chunk 1 and the gradient back, no message.
  const Schedule s =
      MakeSchedule({.kind = ScheduleKind::kZeroBubbleV, .stages = 4, .micro_batches = 8});
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(s.VirtualStage(r, 0), r);
    EXPECT_EQ(s.VirtualStage(r, 1), 7 - r);
    EXPECT_EQ(s.RankOf(r), r);
    EXPECT_EQ(s.RankOf(7 - r), r);
  }
  auto count = [&](int r, ActionKind kind, int chunk) {
    return std::ranges::count_if(
        s.ranks[r], [&](const Action& a) { return a.kind == kind && a.chunk == chunk; });
  };
  EXPECT_EQ(count(3, ActionKind::kSendF, 0), 0);
  EXPECT_EQ(count(3, ActionKind::kRecvF, 1), 0);
  EXPECT_EQ(count(3, ActionKind::kSendB, 1), 0);
  EXPECT_EQ(count(3, ActionKind::kRecvB, 0), 0);
  EXPECT_EQ(count(0, ActionKind::kRecvF, 0), 0);  // embed
  EXPECT_EQ(count(0, ActionKind::kSendF, 1), 0);  // loss
  EXPECT_EQ(count(0, ActionKind::kRecvF, 1), 8);  // from rank 1's chunk 1
  EXPECT_EQ(count(1, ActionKind::kSendF, 1), 8);
  const Action to_rank0{.kind = ActionKind::kSendF, .chunk = 1, .micro_batch = 0, .peer = 0};
  EXPECT_EQ(std::ranges::count(s.ranks[1], to_rank0), 1);
}

TEST(Schedules, ZeroBubbleVRunsEachRankWithoutAGap) {
  // At unit cost rank r computes from step r to step r + 6M without pausing: its only idle time
  // is the skew, P − 1 steps of 6M + P − 1.
  for (int P = 1; P <= 8; ++P) {
    for (int M = 2 * P - 1; M <= 4 * P; ++M) {
      const Schedule s =
          MakeSchedule({.kind = ScheduleKind::kZeroBubbleV, .stages = P, .micro_batches = M});
      const Simulation sim = Simulate(s);
      const std::vector<InFlight> peaks = InFlightPeaks(s);
      for (int r = 0; r < P; ++r) {
        double first = -1, last = 0;
        for (size_t i = 0; i < s.ranks[r].size(); ++i) {
          if (!IsCompute(s.ranks[r][i].kind)) continue;
          if (first < 0) first = sim.ranks[r].actions[i].start;
          last = sim.ranks[r].actions[i].end;
        }
        EXPECT_EQ(first, r) << s.Describe() << " rank " << r;
        EXPECT_EQ(last, r + 6 * M) << s.Describe() << " rank " << r;
        // 2P chunk-micro-batches of half a stage each: 1F1B's stage 0, P stage-micro-batches;
        // and no more between F and W.
        EXPECT_EQ(peaks[r].peak, 2 * P) << s.Describe() << " rank " << r;
        EXPECT_EQ(peaks[r].peak_until_weight, 2 * P) << s.Describe() << " rank " << r;
        EXPECT_EQ(peaks[r].peak_awaiting_weight, 2 * r + 1) << s.Describe() << " rank " << r;
      }
    }
  }
}

bool IsBuildingBlock(ScheduleKind kind) {
  return kind == ScheduleKind::kVHalf || kind == ScheduleKind::kVMin;
}

TEST(Schedules, BubbleMatchesTheoryOnEveryRank) {
  // CostModel{}: F = B = W = 1, the unsplit backward costing B + W = 2. v-half and v-min: for
  // M ≥ 2P (VHalfAndVMinBubble covers fewer).
  for (const ScheduleOptions& o : AllRequests()) {
    if (IsBuildingBlock(o.kind) && o.micro_batches < 2 * o.stages) continue;
    const Schedule s = MakeSchedule(o);
    SCOPED_TRACE(s.Describe());
    const Simulation sim = Simulate(s);
    for (int r = 0; r < s.stages; ++r)
      EXPECT_NEAR(sim.ranks[r].bubble, TheoreticalBubble(o), 1e-12) << "rank " << r;
    EXPECT_NEAR(sim.bubble, TheoreticalBubble(o), 1e-12);
  }
}

// V-Min and V-Half hold at most the paper's activation memory between F and W — 2⌊(P + 4)/3⌋ and
// 2⌊(P + 2)/2⌋ chunk-micro-batches (Qi et al. 2024, in stage-micro-batches ⌊(P + 4)/3⌋ and
// ⌊(P + 2)/2⌋) — on every rank, and their fullest rank exactly that once M ≥ P: about a third
// and a half of 1F1B's stage 0 (2P chunk-micro-batches), where zb-v holds all of it.
TEST(Schedules, VHalfAndVMinHoldThePapersActivationMemory) {
  for (BuildingBlock block : {BuildingBlock::kVMin, BuildingBlock::kVHalf}) {
    const ScheduleKind kind =
        block == BuildingBlock::kVMin ? ScheduleKind::kVMin : ScheduleKind::kVHalf;
    for (int P = 1; P <= 8; ++P) {
      const int paper = BuildingBlockPeakActivations(block, P);
      for (int M = 1; M <= 4 * P; ++M) {
        const Schedule s = MakeSchedule({.kind = kind, .stages = P, .micro_batches = M});
        SCOPED_TRACE(s.Describe());
        int fullest = 0;
        for (const InFlight& rank : InFlightPeaks(s)) {
          EXPECT_LE(rank.peak, rank.peak_until_weight);
          EXPECT_LE(rank.peak_until_weight, paper);
          fullest = std::max(fullest, rank.peak_until_weight);
        }
        if (M >= P) {
          EXPECT_EQ(fullest, paper);
        }
      }
    }
  }
  EXPECT_EQ(BuildingBlockPeakActivations(BuildingBlock::kVMin, 8), 8);    // 4 stage-mb of 1F1B's 8
  EXPECT_EQ(BuildingBlockPeakActivations(BuildingBlock::kVHalf, 8), 10);  // 5 of 8
  EXPECT_EQ(BuildingBlockPeakActivations(BuildingBlock::kVMin, 6), 6);
  EXPECT_EQ(BuildingBlockPeakActivations(BuildingBlock::kVHalf, 6), 8);
}

// The bubble: exactly TheoreticalBubble for M ≥ 2P (BubbleMatchesTheoryOnEveryRank); with fewer
// micro-batches warm-up and cool-down overlap and it can only be larger. Always below 1F1B's and
// below the paper's estimates 2P/(3M) (V-Min) and P/(2M) (V-Half).
TEST(Schedules, VHalfAndVMinBubble) {
  for (ScheduleKind kind : {ScheduleKind::kVMin, ScheduleKind::kVHalf}) {
    for (int P = 2; P <= 8; ++P) {
      for (int M = P; M <= 4 * P; ++M) {
        const ScheduleOptions o{.kind = kind, .stages = P, .micro_batches = M};
        const double bubble = Simulate(MakeSchedule(o)).bubble;
        const double paper = kind == ScheduleKind::kVMin ? 2.0 * P / (3 * M) : P / (2.0 * M);
        SCOPED_TRACE(fmt::format("{} P={} M={}", ScheduleKindName(kind), P, M));
        EXPECT_GE(bubble, TheoreticalBubble(o) - 1e-12);
        EXPECT_LT(bubble, paper);
        EXPECT_LT(bubble, double(P - 1) / (M + P - 1));  // 1F1B
      }
    }
  }
  // Where warm-up and cool-down overlap (idle slots X against the steady 4P − 5 or 3P − 7).
  EXPECT_NEAR(
      Simulate(MakeSchedule({.kind = ScheduleKind::kVHalf, .stages = 4, .micro_batches = 4}))
          .bubble,
      10.0 / 34, 1e-12);
  EXPECT_NEAR(
      Simulate(MakeSchedule({.kind = ScheduleKind::kVMin, .stages = 3, .micro_batches = 3})).bubble,
      8.0 / 26, 1e-12);
  EXPECT_NEAR(TheoreticalBubble({.kind = ScheduleKind::kVMin, .stages = 8, .micro_batches = 32}),
              27.0 / 219, 1e-12);
  EXPECT_NEAR(TheoreticalBubble({.kind = ScheduleKind::kVHalf, .stages = 8, .micro_batches = 32}),
              17.0 / 209, 1e-12);
}

// The steady state is the building block repeated: on every rank each of the four computes of
// micro-batch m + 1 starts 6 steps after micro-batch m's, at the block's offsets from rank 0.
TEST(Schedules, VHalfAndVMinRepeatTheBuildingBlock) {
  for (BuildingBlock block : {BuildingBlock::kVMin, BuildingBlock::kVHalf}) {
    const ScheduleKind kind =
        block == BuildingBlock::kVMin ? ScheduleKind::kVMin : ScheduleKind::kVHalf;
    for (int P = 2; P <= 8; ++P) {
      const int M = 4 * P;
      const Schedule s = MakeSchedule({.kind = kind, .stages = P, .micro_batches = M});
      SCOPED_TRACE(s.Describe());
      const Simulation sim = Simulate(s);
      // start[rank][F0, F1, B1, B0][micro-batch]
      std::vector<std::array<std::vector<double>, 4>> start(P);
      for (int r = 0; r < P; ++r) {
        for (auto& lane : start[r]) lane.assign(M, -1);
        for (size_t i = 0; i < s.ranks[r].size(); ++i) {
          const Action& a = s.ranks[r][i];
          if (a.kind != ActionKind::kForward && a.kind != ActionKind::kBackward) continue;
          const int lane = a.kind == ActionKind::kForward ? a.chunk : 3 - a.chunk;
          start[r][lane][a.micro_batch] = sim.ranks[r].actions[i].start;
        }
      }
      const int m = M / 2 - 1;  // inside the steady state
      const double base = start[0][0][m];
      for (int r = 0; r < P; ++r) {
        const BlockOffsets o = BuildingBlockOffsets(block, P, r);
        const int offset[4] = {o.forward0, o.forward1, o.backward1, o.backward0};
        for (int lane = 0; lane < 4; ++lane) {
          EXPECT_EQ(start[r][lane][m + 1] - start[r][lane][m], 6) << "rank " << r;
          EXPECT_EQ(start[r][lane][m] - base, offset[lane]) << "rank " << r << " lane " << lane;
        }
      }
    }
  }
}

TEST(Schedules, GPipeAndOneFOneBBubbleHoldsForEqualForwardAndBackward) {
  for (const ScheduleOptions& o : AllRequests()) {
    if (o.kind != ScheduleKind::kGPipe && o.kind != ScheduleKind::kOneFOneB) continue;
    const Simulation sim = Simulate(MakeSchedule(o), {.forward = 1, .backward = 1, .weight = 0});
    EXPECT_NEAR(sim.bubble, double(o.stages - 1) / (o.micro_batches + o.stages - 1), 1e-12)
        << ScheduleKindName(o.kind) << " P=" << o.stages << " M=" << o.micro_batches;
  }
}

TEST(Schedules, ZeroBubbleH1BubbleBelowOneFOneB) {
  for (int P = 2; P <= 8; ++P) {
    for (int M = P; M <= 4 * P; ++M) {
      const double zb =
          Simulate(
              MakeSchedule({.kind = ScheduleKind::kZeroBubbleH1, .stages = P, .micro_batches = M}))
              .bubble;
      const double base =
          Simulate(MakeSchedule({.kind = ScheduleKind::kOneFOneB, .stages = P, .micro_batches = M}))
              .bubble;
      EXPECT_LT(zb, base) << "P=" << P << " M=" << M;
    }
  }
}

TEST(Schedules, CommModesAgreeAtThePlacementCosts) {
  // Messages are placed from a CostModel{} timing: there, a receive never waits for a message the
  // rank does not yet need, so blocking and posted receives give the same run — unless receives
  // are posted ahead, which only a runtime that posts them (kAsync, kRendezvousPosted) can use.
  for (const ScheduleOptions& o : AllRequests()) {
    const Schedule s = MakeSchedule(o);
    const Simulation buffered = Simulate(s, {}, CommMode::kBuffered);
    const Simulation async = Simulate(s, {}, CommMode::kAsync);
    const Simulation rendezvous = Simulate(s, {}, CommMode::kRendezvous);
    const Simulation posted = Simulate(s, {}, CommMode::kRendezvousPosted);
    // Posted ahead, no send waits for its receiver to reach the receive.
    if (PostsReceivesAhead(o)) {
      EXPECT_EQ(posted.makespan, async.makespan) << s.Describe();
      continue;
    }
    EXPECT_EQ(buffered.makespan, async.makespan) << s.Describe();
    EXPECT_EQ(posted.makespan, rendezvous.makespan) << s.Describe();
    // Blocking sends cost only interleaved time (a sender may wait out its receiver's compute).
    if (o.kind == ScheduleKind::kInterleaved) {
      EXPECT_GE(rendezvous.makespan, buffered.makespan) << s.Describe();
    } else {
      EXPECT_EQ(rendezvous.makespan, buffered.makespan) << s.Describe();
    }
  }
}

TEST(Schedules, ReceivesPostedAheadRemoveInterleavedRendezvousWaits) {
  // Sends that block until their receive is posted (kRendezvousPosted): with receives at their
  // message's instant interleaved loses time where no common pause exists; posted ahead it runs
  // as if sends never blocked. zb-v loses nothing either way, so it does not post ahead.
  auto bubble = [](ScheduleKind kind, int P, int M, bool ahead) {
    const Schedule s =
        MakeSchedule({.kind = kind, .stages = P, .micro_batches = M, .post_receives_ahead = ahead});
    return Simulate(s, {}, CommMode::kRendezvousPosted).bubble;
  };
  for (int P = 2; P <= 8; ++P) {
    for (int M = P; M <= 4 * P; M += P) {
      const ScheduleOptions o{.kind = ScheduleKind::kInterleaved, .stages = P, .micro_batches = M};
      const double before = bubble(o.kind, P, M, false), after = bubble(o.kind, P, M, true);
      EXPECT_DOUBLE_EQ(after, TheoreticalBubble(o)) << "P=" << P << " M=" << M;
      EXPECT_GE(before, after) << "P=" << P << " M=" << M;
    }
    for (int M = 2 * P - 1; M <= 4 * P; ++M) {
      EXPECT_EQ(bubble(ScheduleKind::kZeroBubbleV, P, M, false),
                bubble(ScheduleKind::kZeroBubbleV, P, M, true))
          << "P=" << P << " M=" << M;
    }
  }
  EXPECT_NEAR(bubble(ScheduleKind::kInterleaved, 8, 32, false), 0.241, 5e-4);
  EXPECT_NEAR(bubble(ScheduleKind::kInterleaved, 8, 32, true), 0.099, 5e-4);
  EXPECT_NEAR(bubble(ScheduleKind::kInterleaved, 2, 8, false), 0.158, 5e-4);
  EXPECT_NEAR(bubble(ScheduleKind::kInterleaved, 2, 8, true), 0.059, 5e-4);
  // Off unless asked for: sluice's runtimes post receives and never block in a send.
  EXPECT_FALSE(PostsReceivesAhead({.kind = ScheduleKind::kInterleaved}));
  EXPECT_FALSE(PostsReceivesAhead({.kind = ScheduleKind::kZeroBubbleV}));
  EXPECT_TRUE(
      PostsReceivesAhead({.kind = ScheduleKind::kInterleaved, .post_receives_ahead = true}));
}

TEST(Schedules, ReceivesPostedAheadKeepEveryRanksMessageOrder) {
  // Only computes move: each RECV goes up to just after the rank's previous send or receive.
  for (int P = 2; P <= 8; ++P) {
    for (int M = P; M <= 4 * P; M += P) {
      ScheduleOptions o{.kind = ScheduleKind::kInterleaved, .stages = P, .micro_batches = M};
      o.post_receives_ahead = false;
      const Schedule at_instant = MakeSchedule(o);
      o.post_receives_ahead = true;
      const Schedule ahead = MakeSchedule(o);
      for (int r = 0; r < P; ++r) {
        auto filtered = [](const std::vector<Action>& list, bool compute) {
          std::vector<Action> out;
          for (const Action& a : list)
            if (IsCompute(a.kind) == compute) out.push_back(a);
          return out;
        };
        EXPECT_EQ(filtered(ahead.ranks[r], false), filtered(at_instant.ranks[r], false));
        EXPECT_EQ(filtered(ahead.ranks[r], true), filtered(at_instant.ranks[r], true));
        for (size_t i = 1; i < ahead.ranks[r].size(); ++i) {
          if (IsRecv(ahead.ranks[r][i].kind)) {
            EXPECT_FALSE(IsCompute(ahead.ranks[r][i - 1].kind))
                << ahead.Describe() << " rank " << r << " step " << i;
          }
        }
      }
    }
  }
}

std::string ErrorOf(const ScheduleOptions& o) {
  try {
    MakeSchedule(o);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "(no error)";
}

// Without --microbatches a pipeline runs the fewest micro-batches that divide the batch, are at
// least P and that the schedule accepts.
TEST(Schedules, DefaultMicroBatchesAreTheFewestTheScheduleRunsThatDivideTheBatch) {
  using K = ScheduleKind;
  EXPECT_EQ(DefaultMicroBatches({.kind = K::kOneFOneB, .stages = 4}, 32), 4);
  EXPECT_EQ(DefaultMicroBatches({.kind = K::kOneFOneB, .stages = 4}, 6), 6);
  EXPECT_EQ(DefaultMicroBatches({.kind = K::kOneFOneB, .stages = 3}, 8), 4);
  EXPECT_EQ(DefaultMicroBatches({.kind = K::kGPipe, .stages = 2}, 7), 7);         // a prime batch
  EXPECT_EQ(DefaultMicroBatches({.kind = K::kZeroBubbleV, .stages = 4}, 32), 8);  // ≥ 2P − 1
  EXPECT_EQ(DefaultMicroBatches({.kind = K::kInterleaved, .stages = 3}, 12), 3);
  EXPECT_EQ(DefaultMicroBatches({.kind = K::kInterleaved, .stages = 3}, 8), std::nullopt);
  EXPECT_EQ(DefaultMicroBatches({.kind = K::kOneFOneB, .stages = 4}, 3), std::nullopt);
  EXPECT_EQ(DefaultMicroBatches({.kind = K::kZeroBubbleV, .stages = 2, .chunks = 3}, 8),
            std::nullopt);  // no count makes 3 chunks V-shaped
  EXPECT_EQ(DefaultMicroBatches({.kind = K::kOneFOneB, .stages = 1}, 36), 1);
}

TEST(Schedules, ImpossibleRequestsNameTheFix) {
  EXPECT_THAT(
      ErrorOf({.kind = ScheduleKind::kOneFOneB, .stages = 4, .micro_batches = 2}),
      HasSubstr("1f1b: needs at least as many micro-batches as stages (M=2 < P=4): use 4 or more "
                "micro-batches, or gpipe"));
  EXPECT_THAT(ErrorOf({.kind = ScheduleKind::kZeroBubbleH1, .stages = 3, .micro_batches = 1}),
              HasSubstr("zb-h1: needs at least as many micro-batches as stages (M=1 < P=3)"));
  EXPECT_THAT(ErrorOf({.kind = ScheduleKind::kZeroBubbleH2, .stages = 4, .micro_batches = 3}),
              HasSubstr("zb-h2: needs at least as many micro-batches as stages (M=3 < P=4)"));
  EXPECT_THAT(ErrorOf({.kind = ScheduleKind::kZeroBubbleV, .stages = 4, .micro_batches = 6}),
              HasSubstr("zb-v: needs at least 2P − 1 micro-batches (M=6 < 7 for P=4): use 7 or "
                        "more micro-batches, or zb-h1"));
  EXPECT_THAT(
      ErrorOf({.kind = ScheduleKind::kZeroBubbleV, .stages = 2, .micro_batches = 4, .chunks = 3}),
      HasSubstr("zb-v: runs exactly 2 chunks per rank, V-shaped (got 3 chunks)"));
  EXPECT_THAT(
      ErrorOf({.kind = ScheduleKind::kZeroBubbleV, .stages = 2, .micro_batches = 4, .chunks = 1}),
      HasSubstr("zb-v: runs exactly 2 chunks per rank"));
  EXPECT_THAT(
      ErrorOf({.kind = ScheduleKind::kInterleaved, .stages = 4, .micro_batches = 6}),
      HasSubstr(
          "interleaved: the micro-batch count must be a multiple of the stage count (M=6, P=4): "
          "use 4 or 8 micro-batches"));
  EXPECT_THAT(ErrorOf({.kind = ScheduleKind::kInterleaved, .stages = 4, .micro_batches = 3}),
              HasSubstr("use 4 micro-batches"));
  EXPECT_THAT(
      ErrorOf({.kind = ScheduleKind::kInterleaved, .stages = 2, .micro_batches = 4, .chunks = 1}),
      HasSubstr("interleaved: needs at least 2 chunks per rank (got 1); for one chunk per rank use "
                "1f1b"));
  EXPECT_THAT(
      ErrorOf({.kind = ScheduleKind::kOneFOneB, .stages = 2, .micro_batches = 4, .chunks = 2}),
      HasSubstr("1f1b: runs 1 chunk per rank (got 2 chunks); chunks apply to interleaved, zb-v, "
                "v-half and v-min only"));
  EXPECT_THAT(
      ErrorOf({.kind = ScheduleKind::kVHalf, .stages = 2, .micro_batches = 4, .chunks = 3}),
      HasSubstr("v-half: runs exactly 2 chunks per rank, V-shaped (got 3 chunks): give --chunks 2 "
                "or leave it out"));
  EXPECT_THAT(ErrorOf({.kind = ScheduleKind::kVMin, .stages = 2, .micro_batches = 4, .chunks = 1}),
              HasSubstr("v-min: runs exactly 2 chunks per rank"));
  EXPECT_THAT(ErrorOf({.kind = ScheduleKind::kVMin, .stages = 2, .micro_batches = 0}),
              HasSubstr("v-min: needs at least 1 micro-batch (got 0)"));
  EXPECT_THAT(ErrorOf({.kind = ScheduleKind::kGPipe, .stages = 0, .micro_batches = 4}),
              HasSubstr("gpipe: needs at least 1 stage (got 0)"));
  EXPECT_THAT(ErrorOf({.kind = ScheduleKind::kGPipe, .stages = 2, .micro_batches = 0}),
              HasSubstr("gpipe: needs at least 1 micro-batch (got 0)"));
  EXPECT_THAT(ErrorOf({.kind = ScheduleKind::kGPipe, .stages = 10000, .micro_batches = 100000}),
              HasSubstr("gpipe: P=10000, M=100000, V=1 makes a schedule of 5999610000 actions, "
                        "over the 1000000000 a schedule may hold"));
  EXPECT_THAT(ErrorOf({.kind = ScheduleKind::kGPipe, .stages = 40000, .micro_batches = 1}),
              HasSubstr("gpipe: at most 32767 stages (got 40000)"));
  EXPECT_THAT(
      ErrorOf({.kind = ScheduleKind::kInterleaved, .stages = 2, .micro_batches = 2, .chunks = 200}),
      HasSubstr("interleaved: at most 127 chunks per rank (got 200)"));
}

TEST(Schedules, ScheduleKindNamesRoundTripAndOthersAreRefused) {
  EXPECT_EQ(ParseScheduleKind("zb-h1"), ScheduleKind::kZeroBubbleH1);
  EXPECT_EQ(ParseScheduleKind("gpipe"), ScheduleKind::kGPipe);
  for (const auto& [k, name] : kScheduleKindNames) {
    EXPECT_EQ(ParseScheduleKind(ScheduleKindName(k)), k);
  }
  EXPECT_EQ(ParseScheduleKind("zb-h3"), std::nullopt);
  EXPECT_EQ(ParseScheduleKind("1F1B"), std::nullopt);  // names are case-sensitive
  EXPECT_EQ(EnumNames(kScheduleKindNames, ", "),
            "gpipe, 1f1b, interleaved, zb-h1, zb-h2, zb-v, v-half, v-min");
}

}  // namespace
}  // namespace sluice::pipeline
