// The action grid and the JSON form of a schedule.
#include "sluice/schedule/schedule_format.h"

#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "schedule/schedule_text.h"
#include "sluice/schedule/schedules.h"
#include "sluice/schedule/validator.h"

namespace sluice::pipeline {
namespace {

using ::testing::HasSubstr;

TEST(ScheduleTable, OneFOneBGrid) {
  const Schedule s =
      MakeSchedule({.kind = ScheduleKind::kOneFOneB, .stages = 2, .micro_batches = 3});
  EXPECT_EQ(FormatScheduleTable(s),
            "1f1b (P=2, M=3): 8 steps at unit cost (F = B = 1, messages free)\n"
            "step    0  1  2  3  4  5  6  7\n"
            "rank 0  F0 F1 .  B0 F2 B1 .  B2\n"
            "rank 1  .  F0 B0 F1 B1 F2 B2 .\n"
            "\n"
            "rank  in flight  bubble\n"
            "0     2          25.0%\n"
            "1     1          25.0%\n"
            "\n"
            "cells: Fm forward and Bm backward of micro-batch m; . idle. in flight: micro-batches "
            "whose F has run "
            "and B has not.\n");
}

TEST(ScheduleTable, ZeroBubbleShowsWeightGradientsAndAwaitingW) {
  const std::string table = FormatScheduleTable(
      MakeSchedule({.kind = ScheduleKind::kZeroBubbleH1, .stages = 2, .micro_batches = 2}));
  EXPECT_THAT(table, HasSubstr("(F = B = W = 1, messages free)"));
  EXPECT_THAT(table, HasSubstr("rank 0  F0 F1 .  B0 W0 B1 W1\n"));
  EXPECT_THAT(table, HasSubstr("rank  in flight  awaiting W  bubble\n"));
  EXPECT_THAT(table, HasSubstr("Wm weight gradients"));
}

TEST(ScheduleTable, InterleavedCellsNameChunkAndMicroBatch) {
  const std::string table = FormatScheduleTable(
      MakeSchedule({.kind = ScheduleKind::kInterleaved, .stages = 2, .micro_batches = 2}));
  EXPECT_THAT(table, HasSubstr("rank 0  F0.0 F0.1 F1.0 F1.1"));
  EXPECT_THAT(table, HasSubstr("chunk-micro-batches"));
}

TEST(ScheduleJson, ListsEveryActionInOrder) {
  const Schedule s =
      MakeSchedule({.kind = ScheduleKind::kOneFOneB, .stages = 2, .micro_batches = 2});
  const nlohmann::ordered_json j = ScheduleToJson(s);
  EXPECT_EQ(j["schedule"], "1f1b");
  EXPECT_EQ(j["stages"], 2);
  EXPECT_EQ(j["micro_batches"], 2);
  EXPECT_EQ(j["chunks"], 1);
  EXPECT_EQ(j["split_backward"], false);
  EXPECT_DOUBLE_EQ(j["bubble"].get<double>(), 1.0 / 3);
  ASSERT_EQ(j["ranks"].size(), 2u);
  EXPECT_EQ(j["ranks"][0]["in_flight_peak"], 2);
  EXPECT_EQ(j["ranks"][1]["in_flight_peak"], 1);
  for (int r = 0; r < 2; ++r) {
    const nlohmann::ordered_json& actions = j["ranks"][r]["actions"];
    ASSERT_EQ(actions.size(), s.ranks[r].size());
    for (size_t i = 0; i < actions.size(); ++i) {
      const Action& a = s.ranks[r][i];
      EXPECT_EQ(actions[i]["op"], ActionKindName(a.kind));
      if (a.kind == ActionKind::kOptimizer) continue;
      EXPECT_EQ(actions[i]["mb"], a.micro_batch);
      EXPECT_EQ(actions[i]["chunk"], a.chunk);
      EXPECT_EQ(actions[i].contains("peer"), a.peer >= 0);
    }
  }
  EXPECT_EQ(j["ranks"][0]["actions"][1].dump(), R"({"op":"SEND_F","chunk":0,"mb":0,"peer":1})");
}

// The writers validate a schedule once, unless their caller says it has (sluice schedule's
// MakeSchedule did): a schedule without its OPT is refused, or written as it stands.
TEST(ScheduleJson, ValidatesUnlessTheCallerHas) {
  const Schedule no_optimizer = testing::FromText({.ranks = {"F0 B0"}});
  std::ostringstream out;
  EXPECT_THROW(WriteScheduleJson(no_optimizer, out), ScheduleError);
  EXPECT_THROW(WriteScheduleTable(no_optimizer, out), ScheduleError);
  std::ostringstream json;
  WriteScheduleJson(no_optimizer, json, /*validated=*/true);
  EXPECT_THAT(json.str(), HasSubstr(R"({"op":"B","chunk":0,"mb":0})"));
}

}  // namespace
}  // namespace sluice::pipeline
