// InFlightPeaks and Simulate on hand-written schedules whose figures can be checked by hand.
#include "sluice/schedule/schedule_analysis.h"

#include <gtest/gtest.h>

#include "schedule/schedule_text.h"
#include "sluice/schedule/schedules.h"

namespace sluice::pipeline {
namespace {

using testing::FromText;

TEST(InFlight, CountsMicroBatchesBetweenForwardAndBackward) {
  const Schedule s =
      FromText({.micro_batches = 2,
                .ranks = {"F0 SEND_F0>1 F1 SEND_F1>1 RECV_B0<1 B0 RECV_B1<1 B1 OPT",
                          "RECV_F0<0 F0 RECV_F1<0 B0 SEND_B0>0 F1 B1 SEND_B1>0 OPT"}});
  const std::vector<InFlight> peaks = InFlightPeaks(s);
  EXPECT_EQ(peaks[0].peak, 2);
  EXPECT_EQ(peaks[1].peak, 1);
  EXPECT_EQ(peaks[0].peak_per_chunk, std::vector<int>{2});
  EXPECT_EQ(peaks[0].peak_awaiting_weight, 0);
}

TEST(InFlight, CountsPerChunk) {
  // One rank, two chunks: chunk 0 holds micro-batches 0 and 1 at once, chunk 1 one at a time.
  const Schedule s = FromText(
      {.micro_batches = 2, .chunks = 2, .ranks = {"F0.0 F1.0 B1.0 F0.1 B0.0 F1.1 B1.1 B0.1 OPT"}});
  const InFlight peak = InFlightPeaks(s)[0];
  EXPECT_EQ(peak.peak, 2);
  EXPECT_EQ(peak.peak_per_chunk, (std::vector<int>{2, 1}));
}

TEST(InFlight, CountsAwaitingWeightUnderSplitBackward) {
  const Schedule s = FromText(
      {.micro_batches = 3, .split_backward = true, .ranks = {"F0 F1 B0 F2 B1 W0 B2 W1 W2 OPT"}});
  const InFlight peak = InFlightPeaks(s)[0];
  EXPECT_EQ(peak.peak, 2);
  EXPECT_EQ(peak.peak_awaiting_weight, 2);
  EXPECT_EQ(peak.peak_until_weight, 3);  // after F2: micro-batch 0 awaits W, 1 and 2 await B
}

TEST(Simulate, TimesEveryActionAndCountsIdleAsBubble) {
  // 1F1B, P = 2, M = 1, F = 1 and an unsplit B = 2: rank 1 runs F [1, 2) and B [2, 4), rank 0
  // then B [4, 6). Each rank is busy 3 of 6: bubble (P−1)/(M+P−1) = 1/2.
  const Schedule s =
      FromText({.ranks = {"F0 SEND_F0>1 RECV_B0<1 B0 OPT", "RECV_F0<0 F0 B0 SEND_B0>0 OPT"}});
  const Simulation sim = Simulate(s, {.forward = 1, .backward = 1, .weight = 1});
  EXPECT_EQ(sim.makespan, 6);
  EXPECT_EQ(sim.bubble, 0.5);
  for (const RankTime& rank : sim.ranks) {
    EXPECT_EQ(rank.busy, 3);
    EXPECT_EQ(rank.idle, 3);
    EXPECT_EQ(rank.bubble, 0.5);
  }
  auto at = [&](int r, int step) {
    return std::pair(sim.ranks[r].actions[step].start, sim.ranks[r].actions[step].end);
  };
  EXPECT_EQ(at(0, 1), std::pair(1.0, 1.0));  // SEND_F0 as F0 ends
  EXPECT_EQ(at(1, 1), std::pair(1.0, 2.0));  // F0 on rank 1
  EXPECT_EQ(at(1, 2), std::pair(2.0, 4.0));  // B0
  EXPECT_EQ(at(0, 2), std::pair(1.0, 4.0));  // RECV_B0, posted at 1, waits for it
  EXPECT_EQ(at(0, 3), std::pair(4.0, 6.0));
}

TEST(Simulate, SplitBackwardCostsBAndWApart) {
  const Schedule s = FromText({.split_backward = true, .ranks = {"F0 B0 W0 OPT"}});
  const Simulation sim = Simulate(s, {.forward = 1, .backward = 2, .weight = 3});
  EXPECT_EQ(sim.makespan, 6);
  EXPECT_EQ(sim.ranks[0].actions[2].start, 3);
  EXPECT_EQ(sim.bubble, 0);
}

TEST(Simulate, RendezvousSendWaitsForTheReceiverBufferedDoesNot) {
  // Rank 1 takes micro-batch 1 only after its backward of micro-batch 0; with blocking sends
  // rank 0 cannot start F2 until then, with buffered sends it goes on at once.
  const Schedule s = FromText(
      {.micro_batches = 3,
       .ranks = {
           "F0 SEND_F0>1 F1 SEND_F1>1 F2 SEND_F2>1 RECV_B0<1 B0 RECV_B1<1 B1 RECV_B2<1 B2 OPT",
           "RECV_F0<0 F0 B0 RECV_F1<0 RECV_F2<0 SEND_B0>0 F1 B1 SEND_B1>0 F2 B2 "
           "SEND_B2>0 OPT"}});
  const CostModel unit{.forward = 1, .backward = 1, .weight = 0};
  EXPECT_EQ(Simulate(s, unit, CommMode::kBuffered).ranks[0].actions[4].start, 2);
  EXPECT_EQ(Simulate(s, unit, CommMode::kRendezvous).ranks[0].actions[4].start, 3);
}

TEST(Simulate, PostedRendezvousSendWaitsOnlyUntilTheReceiveIsPosted) {
  // Rank 1 posts RECV_F1 before its F0 and B0 and goes on computing: rank 0's SEND_F1 completes
  // as F1 ends, and the message waits for rank 1's F1. Under kRendezvous rank 1 would block at
  // RECV_F1 instead, and start F0 only once the message came.
  const Schedule s =
      FromText({.micro_batches = 2,
                .ranks = {"F0 SEND_F0>1 F1 SEND_F1>1 RECV_B0<1 B0 RECV_B1<1 B1 OPT",
                          "RECV_F0<0 RECV_F1<0 F0 B0 SEND_B0>0 F1 B1 SEND_B1>0 OPT"}});
  const CostModel unit{.forward = 1, .backward = 1, .weight = 0};
  const Simulation posted = Simulate(s, unit, CommMode::kRendezvousPosted);
  EXPECT_EQ(posted.ranks[0].actions[3].start, 2);  // SEND_F1 as F1 ends
  EXPECT_EQ(posted.ranks[1].actions[1].start, 0);  // RECV_F1 posted at once …
  EXPECT_EQ(posted.ranks[1].actions[1].end, 2);    // … its message arrives with the send
  EXPECT_EQ(posted.ranks[1].actions[5].start, 3);  // F1 once B0 is done
  EXPECT_EQ(Simulate(s, unit, CommMode::kRendezvous).ranks[1].actions[2].start, 2);
}

TEST(Simulate, AsyncReceiveWaitsOnlyWhereTheMessageIsRead) {
  // Interleaved messages are placed for an unsplit backward of 2. At unit cost messages arrive at
  // other moments: a blocking receive then holds up computes that do not read it, a posted one
  // does not, and the run keeps the schedule's intrinsic shape, 2·V·M / (1 − bubble) steps.
  const Schedule s =
      MakeSchedule({.kind = ScheduleKind::kInterleaved, .stages = 4, .micro_batches = 8});
  const CostModel unit{.forward = 1, .backward = 1, .weight = 0};
  const Simulation async = Simulate(s, unit, CommMode::kAsync);
  EXPECT_EQ(async.makespan, 38);  // 32 / (1 − 3/19)
  EXPECT_GT(Simulate(s, unit, CommMode::kBuffered).makespan, async.makespan);
}

TEST(Simulate, RejectsAnInvalidSchedule) {
  EXPECT_THROW(Simulate(FromText({.ranks = {"B0 F0 OPT"}})), ScheduleError);
  EXPECT_THROW(InFlightPeaks(FromText({.ranks = {"F0 B0"}})), ScheduleError);
}

// A caller that has validated the schedule (MakeSchedule does) says so and the analysis does not
// validate it again — `sluice schedule` validated each schedule three times, a second of CPU each
// at P = 1024, M = 8192. The schedule here lacks its OPT: only a validation would refuse it.
TEST(Simulate, SkipsTheValidationItsCallerHasDone) {
  const Schedule no_optimizer = FromText({.ranks = {"F0 B0"}});
  EXPECT_THROW(Simulate(no_optimizer), ScheduleError);
  // F 1, the unsplit B 1 + W 1.
  EXPECT_EQ(Simulate(no_optimizer, {}, CommMode::kAsync, true, /*validated=*/true).makespan, 3);
  EXPECT_EQ(InFlightPeaks(no_optimizer, /*validated=*/true)[0].peak, 1);
}

}  // namespace
}  // namespace sluice::pipeline
