// ValidateSchedule on hand-written schedules: each fault it must catch, and the rank, step and
// action its message must name.
#include "sluice/schedule/validator.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "schedule/schedule_text.h"

namespace sluice::pipeline {
namespace {

using ::testing::AllOf;
using testing::FromText;
using ::testing::HasSubstr;
using testing::ScheduleText;

std::string ErrorOfSchedule(const Schedule& schedule) {
  try {
    ValidateSchedule(schedule);
  } catch (const ScheduleError& e) {
    return e.what();
  }
  return "(no error)";
}
std::string ErrorOf(const ScheduleText& text) { return ErrorOfSchedule(FromText(text)); }

// 1F1B on two ranks, two micro-batches, with receives placed so that rendezvous cannot deadlock.
const ScheduleText kGood1F1B = {
    .name = "1f1b",
    .micro_batches = 2,
    .ranks = {"F0 SEND_F0>1 F1 SEND_F1>1 RECV_B0<1 B0 RECV_B1<1 B1 OPT",
              "RECV_F0<0 F0 RECV_F1<0 B0 SEND_B0>0 F1 B1 SEND_B1>0 OPT"}};

TEST(Validator, AcceptsAHandWrittenOneFOneB) {
  EXPECT_NO_THROW(ValidateSchedule(FromText(kGood1F1B)));
}

TEST(Validator, AcceptsLocalHandOffBetweenChunksOfOneRank) {
  EXPECT_NO_THROW(ValidateSchedule(
      FromText({.micro_batches = 1, .chunks = 2, .ranks = {"F0.0 F1.0 B1.0 B0.0 OPT"}})));
}

TEST(Validator, DeadlockUnderRendezvousNamesEveryBlockedRank) {
  // The textbook mistake: each rank sends before it receives, so both block in their send.
  ScheduleText naive = kGood1F1B;
  naive.ranks[1] = "RECV_F0<0 F0 B0 SEND_B0>0 RECV_F1<0 F1 B1 SEND_B1>0 OPT";
  EXPECT_THAT(ErrorOf(naive),
              AllOf(HasSubstr("1f1b (P=2, M=2): deadlock under blocking send/receive"),
                    HasSubstr("rank 0 waits at step 3 (SEND_F1>1) for rank 1, which waits at "
                              "step 3 (SEND_B0>0)"),
                    HasSubstr("rank 1 waits at step 3 (SEND_B0>0) for rank 0, which waits at "
                              "step 3 (SEND_F1>1)")));
}

TEST(Validator, BackwardBeforeItsForward) {
  EXPECT_THAT(ErrorOf({.ranks = {"B0 F0 OPT"}}), HasSubstr("rank 0, step 0 (B0): runs before F0"));
}

TEST(Validator, ForwardBeforeItsInputArrives) {
  ScheduleText early = kGood1F1B;
  early.ranks[1] = "F0 RECV_F0<0 RECV_F1<0 B0 SEND_B0>0 F1 B1 SEND_B1>0 OPT";
  EXPECT_THAT(ErrorOf(early),
              HasSubstr("rank 1, step 0 (F0): runs before RECV_F0 (its input arrives there)"));
}

TEST(Validator, BackwardBeforeItsGradientArrives) {
  ScheduleText early = kGood1F1B;
  early.ranks[0] = "F0 SEND_F0>1 F1 SEND_F1>1 B0 RECV_B0<1 RECV_B1<1 B1 OPT";
  EXPECT_THAT(ErrorOf(early), HasSubstr("rank 0, step 4 (B0): runs before RECV_B0"));
}

TEST(Validator, SendBeforeItsCompute) {
  EXPECT_THAT(
      ErrorOf({.ranks = {"SEND_F0>1 F0 RECV_B0<1 B0 OPT", "RECV_F0<0 F0 B0 SEND_B0>0 OPT"}}),
      HasSubstr("rank 0, step 0 (SEND_F0>1): runs before F0"));
}

TEST(Validator, WeightBeforeItsBackward) {
  EXPECT_THAT(ErrorOf({.split_backward = true, .ranks = {"F0 W0 B0 OPT"}}),
              HasSubstr("rank 0, step 1 (W0): runs before B0 (W follows its B)"));
}

TEST(Validator, WeightInAScheduleWithoutSplitBackward) {
  EXPECT_THAT(ErrorOf({.ranks = {"F0 B0 W0 OPT"}}),
              HasSubstr("rank 0, step 2 (W0): W in a schedule whose backward is not split"));
}

TEST(Validator, MissingWeightUnderSplitBackward) {
  EXPECT_THAT(
      ErrorOf({.micro_batches = 2, .split_backward = true, .ranks = {"F0 F1 B0 B1 W1 OPT"}}),
      HasSubstr("rank 0 never runs W0"));
}

TEST(Validator, MissingForward) {
  EXPECT_THAT(ErrorOf({.micro_batches = 2, .ranks = {"F0 B0 OPT"}}),
              HasSubstr("rank 0 never runs F1"));
}

TEST(Validator, MissingSend) {
  // Rank 0 never sends F0's output: rank 1 lacks nothing locally, but rank 0 is incomplete.
  EXPECT_THAT(ErrorOf({.ranks = {"F0 RECV_B0<1 B0 OPT", "RECV_F0<0 F0 B0 SEND_B0>0 OPT"}}),
              HasSubstr("rank 0 never runs SEND_F0"));
}

TEST(Validator, ActionTwice) {
  EXPECT_THAT(ErrorOf({.ranks = {"F0 F0 B0 OPT"}}),
              HasSubstr("rank 0, step 1 (F0): F0 already ran at step 0"));
}

TEST(Validator, OptimizerNotLast) {
  EXPECT_THAT(ErrorOf({.ranks = {"F0 OPT B0"}}),
              HasSubstr("rank 0, step 1 (OPT): OPT must be the rank's last action, once"));
}

TEST(Validator, OptimizerMissing) {
  EXPECT_THAT(ErrorOf({.ranks = {"F0 B0"}}), HasSubstr("rank 0 does not end with OPT"));
}

TEST(Validator, FirstStageHasNoRecvF) {
  EXPECT_THAT(
      ErrorOf({.ranks = {"RECV_F0<1 F0 OPT", "F0 OPT"}}),
      HasSubstr(
          "rank 0, step 0 (RECV_F0<1): virtual stage 0 is the first stage: it has no RECV_F"));
}

TEST(Validator, LastStageHasNoSendF) {
  EXPECT_THAT(
      ErrorOf({.ranks = {"F0 SEND_F0>0 B0 OPT"}}),
      HasSubstr("rank 0, step 1 (SEND_F0>0): virtual stage 0 is the last stage: it has no SEND_F"));
}

TEST(Validator, PeerMustBeTheNeighbouringStage) {
  EXPECT_THAT(
      ErrorOf({.ranks = {"F0 SEND_F0>2 OPT", "OPT", "OPT"}}),
      HasSubstr(
          "rank 0, step 1 (SEND_F0>2): names peer 2, but the neighbouring virtual stage lives on "
          "rank 1"));
}

TEST(Validator, HandOffWithinARankIsNotAMessage) {
  EXPECT_THAT(
      ErrorOf({.chunks = 2, .ranks = {"F0.0 SEND_F0.0>0 OPT"}}),
      HasSubstr("virtual stages 0 and 1 are both on rank 0: the hand-off is local, no SEND_F"));
}

TEST(Validator, ChunkAndMicroBatchInRange) {
  EXPECT_THAT(ErrorOf({.ranks = {"F1.0 OPT"}}),
              HasSubstr("rank 0, step 0 (F1.0): chunk 1 is outside [0, 1)"));
  EXPECT_THAT(ErrorOf({.micro_batches = 2, .ranks = {"F2 OPT"}}),
              HasSubstr("rank 0, step 0 (F2): micro-batch 2 is outside [0, 2)"));
}

TEST(Validator, SendsAndReceivesPairUpInOrder) {
  EXPECT_THAT(
      ErrorOf({.name = "gpipe",
               .micro_batches = 2,
               .ranks = {"F0 SEND_F0>1 F1 SEND_F1>1 RECV_B0<1 B0 RECV_B1<1 B1 OPT",
                         "RECV_F1<0 RECV_F0<0 F0 F1 B0 SEND_B0>0 B1 SEND_B1>0 OPT"}}),
      AllOf(HasSubstr("gpipe (P=2, M=2): message 0 from rank 0 to rank 1 does not pair up"),
            HasSubstr(
                "rank 0, step 1 (SEND_F0>1) sends it, but rank 1, step 0 (RECV_F1<0) expects it")));
}

TEST(Validator, OneActionListPerRank) {
  Schedule s = FromText({.ranks = {"F0 B0 OPT"}});
  s.stages = 2;
  EXPECT_THAT(ErrorOfSchedule(s), HasSubstr("hand (P=2, M=1): has 1 action lists for 2 ranks"));
}

}  // namespace
}  // namespace sluice::pipeline
