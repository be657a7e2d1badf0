// The step simulator: unit costs reproduce the unit-cost analysis for every schedule kind; measured
// costs of a hand-written schedule give the makespan computed by hand; the replay rank by rank
// gives the reference replay's times bit for bit; costs that do not cover a
// schedule, and costs files with missing or negative entries, are refused naming the mismatch.
#include "sluice/schedule/step_simulator.h"

#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "schedule/schedule_text.h"
#include "sluice/schedule/schedule_analysis.h"
#include "sluice/schedule/schedules.h"
#include "source_dir.h"

namespace sluice::pipeline {
namespace {

// What CostsFromJson says of `j` read as "costs.json": its error message, or "no error".
std::string CostsError(const nlohmann::json& j) {
  try {
    CostsFromJson(j, "costs.json");
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "no error";
}

using testing::FromText;

TEST(StepSimulator, UnitCostsReproduceTheUnitCostAnalysisForEveryKind) {
  for (const auto& [kind, name] : kScheduleKindNames) {
    for (int P : {2, 4}) {
      for (int M : {4, 8}) {
        Schedule s;
        try {
          s = MakeSchedule({.kind = kind, .stages = P, .micro_batches = M});
        } catch (const InvalidArgument&) {
          continue;  // a kind that cannot run this (P, M)
        }
        SCOPED_TRACE(s.Describe());
        const Simulation theory = Simulate(s);
        const StepPrediction p = SimulateStep(s, UnitCosts(s));
        const double V = s.chunks;  // the analysis counts 1 per action, unit costs 1/V per chunk
        EXPECT_NEAR(p.makespan_ms * V, theory.makespan, 1e-9);
        EXPECT_NEAR(p.step_ms * V, theory.makespan, 1e-9);
        EXPECT_NEAR(p.bubble, theory.bubble, 1e-12);
        for (int r = 0; r < P; ++r) {
          EXPECT_NEAR(p.ranks[r].busy_ms * V, theory.ranks[r].busy, 1e-9);
          EXPECT_NEAR(p.ranks[r].bubble, theory.ranks[r].bubble, 1e-12);
        }
      }
    }
  }
}

TEST(StepSimulator, UnitCostBubbleOfOneFOneBIsTheClosedForm) {
  const Schedule s =
      MakeSchedule({.kind = ScheduleKind::kOneFOneB, .stages = 4, .micro_batches = 8});
  EXPECT_NEAR(SimulateStep(s, UnitCosts(s)).ranks[0].bubble, 3.0 / 11.0, 1e-12);
}

// Two ranks, one micro-batch; every cost different so that each rule shows in the sum.
StepCosts HandCosts() {
  StepCosts c;
  c.source = "hand";
  c.stages = 2;
  c.split_backward = false;
  c.ranks = {RankCosts{.chunks = {{.forward_ms = 1, .backward_ms = 2, .weight_ms = 0.5}},
                       .optimizer_ms = 0.3,
                       .update_ms = 0.2},
             RankCosts{.chunks = {{.forward_ms = 3, .backward_ms = 4, .weight_ms = 0.5}},
                       .optimizer_ms = 0.3,
                       .update_ms = 0.2}};
  c.post_ms = 0.1;
  c.copy_ms = 0.2;
  c.step_overhead_ms = 1;
  return c;
}

TEST(StepSimulator, MeasuredCostsGiveTheHandComputedMakespan) {
  const Schedule s =
      FromText({.micro_batches = 1,
                .ranks = {"F0 SEND_F0>1 RECV_B0<1 B0 OPT", "RECV_F0<0 F0 B0 SEND_B0>0 OPT"}});
  const StepPrediction p = SimulateStep(s, HandCosts());
  // Rank 1 posts RECV_F at 0 (→ 0.1). Rank 0: F 0→1, SEND_F posts (→1.1) second, so it copies:
  // the message arrives at 1.3. Rank 0 posts RECV_B (→1.4). Rank 1: F 1.3→4.3, B + W 4.5 → 8.8,
  // SEND_B posts (→8.9) and copies (→9.1), OPT's first half → 9.4. Rank 0: B waits for 9.1,
  // 2.5 → 11.6, OPT → 11.9. The all-reduce at 11.9, the update → 12.1 on both; + 1 overhead.
  EXPECT_NEAR(p.makespan_ms, 12.1, 1e-12);
  EXPECT_NEAR(p.step_ms, 13.1, 1e-12);
  EXPECT_NEAR(p.ranks[0].busy_ms, 1 + 2.5 + 0.3 + 0.2, 1e-12);
  EXPECT_NEAR(p.ranks[1].busy_ms, 3 + 4.5 + 0.3 + 0.2, 1e-12);
  EXPECT_NEAR(p.ranks[0].bubble, (12.1 - 4.0) / 12.1, 1e-12);
}

// The fixed costs between computes: a compute that waited starts wake_ms after its message, every
// F, B and W is followed by its rank's overhead_ms (idle), the all-reduce ends allreduce_ms after
// the last rank reaches it. A costs file round-trips them; one written before them reads 0.
TEST(StepSimulator, WakeUpsBookkeepingAndTheAllReduceGiveTheHandComputedMakespan) {
  const Schedule s =
      FromText({.micro_batches = 1,
                .ranks = {"F0 SEND_F0>1 RECV_B0<1 B0 OPT", "RECV_F0<0 F0 B0 SEND_B0>0 OPT"}});
  StepCosts c = HandCosts();
  c.wake_ms = 0.5;
  c.allreduce_ms = 0.4;
  c.ranks[0].overhead_ms = 0.1;
  c.ranks[1].overhead_ms = 0.2;
  // Rank 1 posts RECV_F (→ 0.1). Rank 0: F 0 → 1, its overhead → 1.1, SEND_F posts (→ 1.2) and
  // copies: the message arrives at 1.4; RECV_B → 1.5. Rank 1 waited: F starts at 1.4 + 0.5,
  // → 4.9 + 0.2; B + W → 9.6 + 0.2; SEND_B posts (→ 9.9) and copies: arrives at 10.1; OPT's first
  // half → 10.4. Rank 0 waited: B from 10.6 → 13.1 + 0.1, OPT → 13.5. The all-reduce ends at
  // 13.9, the update → 14.1 on both.
  for (const StepCosts& costs :
       {c, CostsFromJson(nlohmann::json::parse(CostsToJson(c).dump()), "file")}) {
    const StepPrediction p = SimulateStep(s, costs);
    EXPECT_NEAR(p.makespan_ms, 14.1, 1e-12);
    EXPECT_NEAR(p.step_ms, 15.1, 1e-12);
    EXPECT_NEAR(p.ranks[0].busy_ms, 4.0, 1e-12);  // the overheads are idle
    EXPECT_NEAR(p.ranks[0].bubble, (14.1 - 4.0) / 14.1, 1e-12);
  }
  nlohmann::json old = nlohmann::json::parse(CostsToJson(c).dump());
  old.erase("allreduce_ms");
  old["messages"].erase("wake_ms");
  for (nlohmann::json& rank : old["ranks"]) rank.erase("overhead_ms");
  const StepCosts back = CostsFromJson(old, "old.json");
  EXPECT_EQ(back.wake_ms, 0);
  EXPECT_EQ(back.allreduce_ms, 0);
  EXPECT_EQ(back.ranks[1].overhead_ms, 0);
  EXPECT_NEAR(SimulateStep(s, back).makespan_ms, 12.1, 1e-12);  // HandCosts' own
}

TEST(StepSimulator, RefusesAnInvalidSchedule) {
  const Schedule s =
      FromText({.micro_batches = 1, .ranks = {"F0 SEND_F0>1 OPT", "RECV_F0<0 F0 OPT"}});
  EXPECT_THROW(SimulateStep(s, HandCosts()), ScheduleError);  // no backward
}

TEST(StepSimulator, RefusesCostsThatDoNotCoverTheSchedule) {
  const Schedule four =
      MakeSchedule({.kind = ScheduleKind::kOneFOneB, .stages = 4, .micro_batches = 4});
  StepCosts c = HandCosts();
  try {
    SimulateStep(four, c);
    ADD_FAILURE() << "costs of 2 stages simulated 4";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("measured on 2 stages"), std::string::npos) << e.what();
  }
  const Schedule zb =
      MakeSchedule({.kind = ScheduleKind::kZeroBubbleH1, .stages = 2, .micro_batches = 4});
  try {
    SimulateStep(zb, c);
    ADD_FAILURE() << "unsplit costs simulated a split backward";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("splits it into B and W"), std::string::npos) << e.what();
  }
  const Schedule inter =
      MakeSchedule({.kind = ScheduleKind::kInterleaved, .stages = 2, .micro_batches = 4});
  EXPECT_THROW(SimulateStep(inter, c), InvalidArgument);
  // Split costs cover an unsplit schedule: B costs B + W.
  c.split_backward = true;
  const Schedule onefb =
      MakeSchedule({.kind = ScheduleKind::kOneFOneB, .stages = 2, .micro_batches = 2});
  EXPECT_GT(SimulateStep(onefb, c).step_ms, 0);
}

TEST(StepSimulator, RefusesCostsOfAnotherJob) {
  StepCosts c = HandCosts();
  c.job = {{"dim", 64}, {"layers", 4}};
  EXPECT_NO_THROW(CheckCostsJob(c, {{"dim", 64}, {"layers", 4}}));
  try {
    CheckCostsJob(c, {{"dim", 128}, {"layers", 4}});
    ADD_FAILURE();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("dim is 64 there, 128 here"), std::string::npos)
        << e.what();
  }
  // A file that does not say what it measured fits no job (it was taken for any before).
  c.job = nlohmann::json::object();
  EXPECT_THAT(
      [&] {
        CheckCostsJob(c, {{"dim", 64}});
      },
      ::testing::ThrowsMessage<InvalidArgument>(::testing::HasSubstr(
          "it has no \"job\": it says nothing of \"dim\", so it could have been "
          "measured on any job")));
  c.job = {{"layers", 4}};
  EXPECT_THAT(
      [&] {
        CheckCostsJob(c, {{"dim", 64}, {"layers", 4}});
      },
      ::testing::ThrowsMessage<InvalidArgument>(
          ::testing::HasSubstr("its \"job\" says nothing of \"dim\"")));
}

// Under MPI: every message arrives (its send completes) the transit after its later post, and OPT
// starts with the replicas' gradient all-reduce (idle). A costs file round-trips both; one
// without them (in-process, or written before) reads 0.
TEST(StepSimulator, TransitAndTheReplicasAllReduceGiveTheHandComputedMakespan) {
  const Schedule s =
      FromText({.micro_batches = 1,
                .ranks = {"F0 SEND_F0>1 RECV_B0<1 B0 OPT", "RECV_F0<0 F0 B0 SEND_B0>0 OPT"}});
  StepCosts c = HandCosts();
  c.message_bytes = 1000;
  c.transit_latency_ms = 0.25;
  c.transit_ms_per_byte = 0.00025;  // 0.25 + 1000 × 0.00025: 0.5 per message
  c.ranks[0].data_allreduce_ms = 0.7;
  c.ranks[1].data_allreduce_ms = 0.3;
  EXPECT_DOUBLE_EQ(TransitMs(c), 0.5);
  // As MeasuredCostsGiveTheHandComputedMakespan, but the F message, copied at 1.3, arrives at
  // 1.8: rank 1's F 1.8 → 4.8, B + W → 9.3, SEND_B posts (→ 9.4) and copies (→ 9.6): arrives at
  // 10.1; its OPT: the replicas' all-reduce → 9.9, the first half → 10.2. Rank 0: B 10.1 → 12.6,
  // the replicas' all-reduce → 13.3, OPT's first half → 13.6; the update → 13.8 on both.
  for (const StepCosts& costs :
       {c, CostsFromJson(nlohmann::json::parse(CostsToJson(c).dump()), "file")}) {
    const StepPrediction p = SimulateStep(s, costs);
    EXPECT_NEAR(p.makespan_ms, 13.8, 1e-12);
    EXPECT_NEAR(p.ranks[0].busy_ms, 4.0, 1e-12);  // the all-reduce is idle
    const StepPrediction reference = SimulateStep(s, costs, {.in_event_order = true});
    EXPECT_EQ(p.makespan_ms, reference.makespan_ms);
  }
  const nlohmann::json file = nlohmann::json::parse(CostsToJson(c).dump());
  EXPECT_DOUBLE_EQ(file["messages"]["transit_ms"].get<double>(), 0.5);
  EXPECT_DOUBLE_EQ(file["ranks"][0]["data_allreduce_ms"].get<double>(), 0.7);
  // In-process costs write neither (their files stay as they were) and read them back as 0.
  const nlohmann::json local = nlohmann::json::parse(CostsToJson(HandCosts()).dump());
  EXPECT_FALSE(local["messages"].contains("transit_latency_ms"));
  EXPECT_FALSE(local["ranks"][0].contains("data_allreduce_ms"));
  const StepCosts back = CostsFromJson(local, "local.json");
  EXPECT_EQ(TransitMs(back), 0);
  EXPECT_EQ(back.ranks[0].data_allreduce_ms, 0);
  // A negative one is an error naming it.
  nlohmann::json bad = file;
  bad["messages"]["transit_latency_ms"] = -1;
  EXPECT_NE(CostsError(bad).find("\"transit_latency_ms\" is -1"), std::string::npos)
      << CostsError(bad);
}

TEST(StepSimulator, CostsRoundTripThroughJson) {
  const StepCosts c = HandCosts();
  const StepCosts back = CostsFromJson(nlohmann::json::parse(CostsToJson(c).dump()), "file");
  EXPECT_EQ(back.stages, 2);
  EXPECT_DOUBLE_EQ(back.ranks[1].chunks[0].backward_ms, 4);
  EXPECT_DOUBLE_EQ(back.copy_ms, 0.2);
  const Schedule s =
      FromText({.micro_batches = 1,
                .ranks = {"F0 SEND_F0>1 RECV_B0<1 B0 OPT", "RECV_F0<0 F0 B0 SEND_B0>0 OPT"}});
  EXPECT_DOUBLE_EQ(SimulateStep(s, back).step_ms, SimulateStep(s, c).step_ms);
}

TEST(StepSimulator, CostsFileErrorsNameTheEntry) {
  const nlohmann::json good = nlohmann::json::parse(CostsToJson(HandCosts()).dump());
  nlohmann::json negative = good;
  negative["ranks"][1]["chunks"][0]["forward_ms"] = -2;
  EXPECT_NE(CostsError(negative).find("costs.json: stage 1 chunk 0 \"forward_ms\" is -2"),
            std::string::npos)
      << CostsError(negative);
  nlohmann::json missing = good;
  missing["ranks"][0].erase("update_ms");
  EXPECT_NE(CostsError(missing).find("stage 0 has no \"update_ms\""), std::string::npos)
      << CostsError(missing);
  nlohmann::json short_ranks = good;
  short_ranks["ranks"].erase(1);
  EXPECT_NE(CostsError(short_ranks).find("one entry per stage (2)"), std::string::npos);
  nlohmann::json other = good;
  other["format"] = "something else";
  EXPECT_NE(CostsError(other).find("\"format\""), std::string::npos);
  EXPECT_NE(CostsError(nlohmann::json::array()).find("not a JSON object"), std::string::npos);
  // A format of another type, counts that are not integers or out of range, costs so large that
  // the replay's sums would overflow: each an error naming the entry, never a type error or a
  // replay that stalls on infinite clocks.
  nlohmann::json format_number = good;
  format_number["format"] = 1;
  EXPECT_NE(CostsError(format_number).find("\"format\" must be"), std::string::npos)
      << CostsError(format_number);
  nlohmann::json fractional = good;
  fractional["stages"] = 1.5;
  EXPECT_NE(CostsError(fractional).find("\"stages\" is 1.5: it must be an integer from 1 to 32767"),
            std::string::npos)
      << CostsError(fractional);
  nlohmann::json huge_stages = good;
  huge_stages["stages"] = 1e308;
  EXPECT_NE(CostsError(huge_stages).find("it must be an integer"), std::string::npos);
  nlohmann::json huge_bytes = good;
  huge_bytes["messages"]["bytes"] = uint64_t{1} << 63;
  EXPECT_NE(CostsError(huge_bytes).find("\"messages\" \"bytes\" is 9223372036854775808"),
            std::string::npos)
      << CostsError(huge_bytes);
  nlohmann::json huge_cost = good;
  huge_cost["ranks"][0]["chunks"][0]["backward_ms"] = 1e308;
  EXPECT_NE(
      CostsError(huge_cost).find("\"backward_ms\" is 1e+308: it must be a number from 0 to 1e+09"),
      std::string::npos)
      << CostsError(huge_cost);
  // Entries moved by hand out of stage order, and a "measured" that cannot be set beside a
  // prediction.
  nlohmann::json swapped = good;
  std::swap(swapped["ranks"][0], swapped["ranks"][1]);
  EXPECT_NE(CostsError(swapped).find("\"ranks\"[0] says \"stage\": 1: the entries must be in "
                                     "stage order, 0 to 1"),
            std::string::npos)
      << CostsError(swapped);
  nlohmann::json measured_text = good;
  measured_text["measured"] = "fast";
  EXPECT_NE(CostsError(measured_text).find("\"measured\" is not an object"), std::string::npos)
      << CostsError(measured_text);
  nlohmann::json bubbles = good;
  bubbles["measured"] = {{"step_ms", 3.0}, {"stage_bubble", {0.5}}};
  EXPECT_NE(CostsError(bubbles).find("\"measured\" must have \"stage_bubble\": one number per "
                                     "stage (2)"),
            std::string::npos)
      << CostsError(bubbles);
  bubbles["measured"]["stage_bubble"] = {0.5, 7};
  EXPECT_NE(CostsError(bubbles).find("\"stage_bubble\" holds 7: a share from 0 to 1"),
            std::string::npos)
      << CostsError(bubbles);
  bubbles["measured"]["stage_bubble"] = {0.5, 0.25};
  bubbles["measured"]["step_ms"] = -1;
  EXPECT_NE(CostsError(bubbles).find("\"measured\" \"step_ms\" is -1"), std::string::npos)
      << CostsError(bubbles);
  nlohmann::json waits = good;
  waits["measured"] = {{"step_ms", 3.0}, {"stage_core_wait_ms", {0.5}}};
  EXPECT_NE(CostsError(waits).find("\"measured\" must have \"stage_core_wait_ms\": one number per "
                                   "stage (2)"),
            std::string::npos)
      << CostsError(waits);
  waits["measured"]["stage_core_wait_ms"] = {0.5, -1};
  EXPECT_NE(CostsError(waits).find("\"stage_core_wait_ms\"[1] is -1"), std::string::npos)
      << CostsError(waits);
  // A wait longer than the step (a hand-edited file) is a share of at most 1.
  waits["measured"]["stage_core_wait_ms"] = {0.5, 1e6};
  EXPECT_DOUBLE_EQ(CoreWaitShare(CostsFromJson(waits, "costs.json")), 1);
}

// The costs fuzzer's seeds (fuzz/costs_fuzz.cc): valid_* are profiles sluice wrote (and one
// written by hand) that read and replay on the schedule they cover; the others fail cleanly.
TEST(StepSimulator, FuzzSeedCorpusReadsOrFailsCleanly) {
  int count = 0;
  for (const std::filesystem::path& file : testing_support::FuzzCorpus("costs")) {
    ++count;
    if (file.filename().string().starts_with("valid_")) {
      const StepCosts c = ReadCostsFile(file.string());
      const ScheduleKind kind = c.split_backward ? ScheduleKind::kZeroBubbleH1
                                : c.chunks == 2  ? ScheduleKind::kInterleaved
                                                 : ScheduleKind::kOneFOneB;
      const Schedule s = MakeSchedule(
          {.kind = kind, .stages = c.stages, .micro_batches = 2 * c.stages, .chunks = c.chunks});
      const StepPrediction p = SimulateStep(s, c, {});
      EXPECT_GT(p.step_ms, 0) << file;
      EXPECT_GE(p.step_ms, p.makespan_ms) << file;
    } else {
      EXPECT_THROW(ReadCostsFile(file.string()), InvalidArgument) << file;
    }
  }
  EXPECT_GE(count, 7);
}

// Costs that differ per rank and chunk, with the given message costs; `zero_forward` makes every
// forward free, so that posts meet at equal clocks.
StepCosts UnevenCosts(const Schedule& s, double post_ms, double copy_ms, bool zero_forward) {
  StepCosts c = UnitCosts(s);
  for (int r = 0; r < s.stages; ++r) {
    for (int v = 0; v < s.chunks; ++v) {
      ChunkCosts& ch = c.ranks[r].chunks[v];
      ch.forward_ms = zero_forward ? 0 : 1.0 + 0.375 * ((r * 3 + v) % 4);
      ch.backward_ms = 2.0 + 0.0625 * ((r * 7 + v) % 5);
      ch.weight_ms = 0.5 + 0.1 * (r % 3);
    }
    c.ranks[r].optimizer_ms = 0.3 + 0.01 * r;
    c.ranks[r].update_ms = 0.2;
  }
  c.post_ms = post_ms;
  c.copy_ms = copy_ms;
  return c;
}

// The replay rank by rank (the default) against the replay in event order (the reference): the
// same times bit for bit for every kind, with and without message costs — copying that costs
// something decides which of two posts copies, and equal clocks (unit costs, free forwards) put
// the tie-break to the test.
TEST(StepSimulator, RankByRankReplayGivesTheEventOrderedTimesExactly) {
  struct Case {
    int stages, micro_batches;
    bool ahead;
  };
  for (const auto& [kind, name] : kScheduleKindNames) {
    for (const Case& k : {Case{2, 2, false}, Case{4, 8, false}, Case{4, 8, true},
                          Case{5, 11, false}, Case{8, 16, false}, Case{8, 32, true}}) {
      Schedule s;
      try {
        s = MakeSchedule({.kind = kind,
                          .stages = k.stages,
                          .micro_batches = k.micro_batches,
                          .post_receives_ahead = k.ahead});
      } catch (const InvalidArgument&) {
        continue;  // a kind that cannot run this (P, M)
      }
      StepCosts unit_copies = UnitCosts(s);
      unit_copies.post_ms = 0.125;
      unit_copies.copy_ms = 0.25;
      StepCosts overheads = UnevenCosts(s, 0.01, 0.05, false);  // between the computes too
      overheads.wake_ms = 0.03;
      overheads.allreduce_ms = 0.2;
      for (int r = 0; r < s.stages; ++r) overheads.ranks[r].overhead_ms = 0.02 * (r + 1);
      StepCosts transit = overheads;  // under MPI
      transit.message_bytes = 1000;
      transit.transit_latency_ms = 0.07;
      transit.transit_ms_per_byte = 1e-5;
      for (int r = 0; r < s.stages; ++r) transit.ranks[r].data_allreduce_ms = 0.05 * (r % 3);
      StepCosts transit_copies = unit_copies;
      transit_copies.transit_latency_ms = 0.3;
      for (const StepCosts& c : {UnitCosts(s), unit_copies, overheads, transit, transit_copies,
                                 UnevenCosts(s, 0.01, 0.05, false), UnevenCosts(s, 0.01, 0, false),
                                 UnevenCosts(s, 0, 0.05, false), UnevenCosts(s, 0.01, 0.05, true),
                                 UnevenCosts(s, 0, 0, true)}) {
        SCOPED_TRACE(fmt::format("{}{}, post {} copy {}, forward {}", s.Describe(),
                                 k.ahead ? " receives ahead" : "", c.post_ms, c.copy_ms,
                                 c.ranks[0].chunks[0].forward_ms));
        const StepPrediction fast = SimulateStep(s, c);
        const StepPrediction reference = SimulateStep(s, c, {.in_event_order = true});
        EXPECT_EQ(fast.makespan_ms, reference.makespan_ms);
        EXPECT_EQ(fast.step_ms, reference.step_ms);
        EXPECT_EQ(fast.bubble, reference.bubble);
        for (int r = 0; r < s.stages; ++r) {
          EXPECT_EQ(fast.ranks[r].end_ms, reference.ranks[r].end_ms) << "rank " << r;
          EXPECT_EQ(fast.ranks[r].busy_ms, reference.ranks[r].busy_ms) << "rank " << r;
        }
      }
    }
  }
}

// `costs` with `steps` recorded steps: every compute of step k costs its median times
// scale(k, micro-batch) — the medians' costs when scale is 1.
template <typename Scale>
StepCosts WithRecordedSteps(StepCosts costs, int steps, int micro_batches, Scale scale) {
  costs.micro_batches = micro_batches;
  for (int k = 0; k < steps; ++k) {
    RecordedStep& rec = costs.recorded.emplace_back();
    rec.stage_bubble.assign(costs.stages, 0);
    for (const RankCosts& r : costs.ranks) {
      RecordedStep::Rank& rank = rec.ranks.emplace_back();
      rank.optimizer_ms = r.optimizer_ms;
      rank.update_ms = r.update_ms;
      for (const ChunkCosts& c : r.chunks) {
        RecordedStep::Chunk& ch = rank.chunks.emplace_back();
        for (int m = 0; m < micro_batches; ++m) {
          ch.forward_ms.push_back(c.forward_ms * scale(k, m));
          ch.backward_ms.push_back(c.backward_ms * scale(k, m));
          ch.weight_ms.push_back(c.weight_ms * scale(k, m));
        }
      }
    }
  }
  return costs;
}

// Draws of computes (the default) leave out the recorded steps that other work on the machine
// stalled — a stage thread waited for a core 5% of the step's span or more — while they are fewer
// than half: their computes are another machine's (one such step of 19 put the draws' mean 10%
// above the measured median). kSteps still replays every recorded step, the stalled ones too.
TEST(StepSimulator, DrawsLeaveOutStepsWhoseThreadsWaitedForACore) {
  const Schedule s =
      FromText({.micro_batches = 1,
                .ranks = {"F0 SEND_F0>1 RECV_B0<1 B0 OPT", "RECV_F0<0 F0 B0 SEND_B0>0 OPT"}});
  // Step 3 was stalled: its computes took 10 times as long, and stage 1 waited 5 of its 50 ms.
  StepCosts c =
      WithRecordedSteps(HandCosts(), 4, 1, [](int k, int) { return k == 3 ? 10.0 : 1.0; });
  for (RecordedStep& step : c.recorded) {
    step.span_ms = 50;
    for (RecordedStep::Rank& r : step.ranks) r.core_wait_ms = 0;
  }
  c.recorded[3].ranks[1].core_wait_ms = 5;
  EXPECT_EQ(DrawnSteps(c), (std::vector<size_t>{0, 1, 2}));
  const StepPrediction p = SimulateStep(s, c, {.draws = 16});
  ASSERT_EQ(p.draws.size(), 16u);
  for (const DrawPrediction& d : p.draws) EXPECT_DOUBLE_EQ(d.makespan_ms, 12.1);  // HandCosts'
  const StepPrediction steps = SimulateStep(s, c, {.draws = 4, .draw_mode = DrawMode::kSteps});
  EXPECT_GT(steps.draws[3].makespan_ms, 12.1);
  // A wait under 5% of the span, or one the step does not know, is a core per stage.
  c.recorded[3].ranks[1].core_wait_ms = 2.4;
  EXPECT_EQ(DrawnSteps(c).size(), 4u);
  EXPECT_GT(SimulateStep(s, c, {.draws = 16}).makespan_ms, 12.1);
  c.recorded[3].ranks[1].core_wait_ms = -1;
  EXPECT_EQ(DrawnSteps(c).size(), 4u);
  // Half of the steps stalled: the other half is drawn; more than half: the run is of that
  // machine throughout, and every step is drawn.
  c.recorded[2].ranks[0].core_wait_ms = c.recorded[3].ranks[0].core_wait_ms = 2.5;
  EXPECT_EQ(DrawnSteps(c), (std::vector<size_t>{0, 1}));
  c.recorded[1].ranks[1].core_wait_ms = 20;
  EXPECT_EQ(DrawnSteps(c).size(), 4u);
}

// A draw of mode kSteps replays one recorded step, every compute its own micro-batch's time:
// draw k's makespan is the replay of medians equal to step k's costs; the prediction is the mean.
TEST(StepSimulator, DrawsOfRecordedStepsReplayEachStepWithItsOwnComputes) {
  const Schedule s =
      FromText({.micro_batches = 1,
                .ranks = {"F0 SEND_F0>1 RECV_B0<1 B0 OPT", "RECV_F0<0 F0 B0 SEND_B0>0 OPT"}});
  const StepCosts c = WithRecordedSteps(HandCosts(), 2, 1, [](int k, int) { return k + 1.0; });
  StepCosts doubled = HandCosts();
  for (RankCosts& r : doubled.ranks) {
    for (ChunkCosts& ch : r.chunks) {
      ch.forward_ms *= 2;
      ch.backward_ms *= 2;
      ch.weight_ms *= 2;
    }
  }
  const StepPrediction p = SimulateStep(s, c, {.draws = 2, .draw_mode = DrawMode::kSteps});
  ASSERT_EQ(p.draws.size(), 2u);
  EXPECT_DOUBLE_EQ(p.draws[0].makespan_ms, 12.1);  // HandCosts' own, by hand above
  EXPECT_DOUBLE_EQ(p.draws[1].makespan_ms, SimulateStep(s, doubled).makespan_ms);
  EXPECT_GT(p.draws[1].makespan_ms, 12.1);
  EXPECT_NEAR(p.makespan_ms, (p.draws[0].makespan_ms + p.draws[1].makespan_ms) / 2, 1e-12);
  EXPECT_NEAR(p.step_ms, p.makespan_ms + 1, 1e-12);
  EXPECT_NEAR(p.ranks[0].idle_ms, p.makespan_ms - p.ranks[0].busy_ms, 1e-12);
  EXPECT_EQ(p.draws[0].stage_bubble.size(), 2u);
  // A third draw takes the first step again.
  EXPECT_DOUBLE_EQ(
      SimulateStep(s, c, {.draws = 3, .draw_mode = DrawMode::kSteps}).draws[2].makespan_ms, 12.1);
}

// Computes that vary make waits at every hand-off: over draws of costs whose every compute
// averages its median, the mean makespan is at least the medians' (a replay is a maximum of
// sums — E[max] ≥ max E), and above it here. Recorded costs that do not vary give the medians'
// replay in either mode. Draws are deterministic: the same seed, the same draws.
TEST(StepSimulator, DrawsOfVaryingComputesPredictLongerStepsThanTheirMedians) {
  const Schedule s =
      MakeSchedule({.kind = ScheduleKind::kOneFOneB, .stages = 4, .micro_batches = 8});
  StepCosts base = UnevenCosts(s, 0, 0, false);
  const StepPrediction medians = SimulateStep(s, base);
  for (DrawMode mode : {DrawMode::kSteps, DrawMode::kComputes}) {
    const StepCosts steady = WithRecordedSteps(base, 3, 8, [](int, int) { return 1.0; });
    const StepPrediction same = SimulateStep(s, steady, {.draws = 5, .draw_mode = mode});
    EXPECT_NEAR(same.makespan_ms, medians.makespan_ms, 1e-9);
    EXPECT_NEAR(same.ranks[2].bubble, medians.ranks[2].bubble, 1e-12);
    // Step k, micro-batch m: 0.5 or 1.5 times the median, half of each in every step.
    const StepCosts varying =
        WithRecordedSteps(base, 4, 8, [](int k, int m) { return (k + m) % 2 ? 1.5 : 0.5; });
    const StepPrediction drawn = SimulateStep(s, varying, {.draws = 4, .draw_mode = mode});
    EXPECT_GT(drawn.makespan_ms, medians.makespan_ms * 1.01);
    const StepPrediction again = SimulateStep(s, varying, {.draws = 4, .draw_mode = mode});
    EXPECT_EQ(again.makespan_ms, drawn.makespan_ms);
    // The replay in event order agrees with the replay rank by rank on drawn costs too.
    const StepPrediction reference =
        SimulateStep(s, varying, {.in_event_order = true, .draws = 4, .draw_mode = mode});
    for (int d = 0; d < 4; ++d)
      EXPECT_EQ(reference.draws[d].makespan_ms, drawn.draws[d].makespan_ms);
  }
  const StepCosts varying =
      WithRecordedSteps(base, 4, 8, [](int k, int m) { return (k * 8 + m) % 3 ? 1.5 : 0.25; });
  EXPECT_NE(SimulateStep(s, varying, {.draws = 4, .draw_mode = DrawMode::kComputes, .seed = 1})
                .makespan_ms,
            SimulateStep(s, varying, {.draws = 4, .draw_mode = DrawMode::kComputes, .seed = 2})
                .makespan_ms);
}

// Draws need recorded steps (a costs file of an older profile, or of an MPI run, has medians
// only) and a core per rank; each refusal says why. A schedule of more micro-batches than were
// recorded draws micro-batch m's costs from m mod M.
TEST(StepSimulator, DrawsNeedRecordedStepsAndACorePerRank) {
  const Schedule s =
      MakeSchedule({.kind = ScheduleKind::kOneFOneB, .stages = 2, .micro_batches = 4});
  StepCosts c = UnitCosts(s);
  c.source = "old.json";
  try {
    SimulateStep(s, c, {.draws = 2});
    ADD_FAILURE() << "draws without recorded steps";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("old.json: no recorded steps"), std::string::npos)
        << e.what();
  }
  c = WithRecordedSteps(c, 2, 2, [](int, int) { return 1.0; });
  EXPECT_THROW(SimulateStep(s, c, {.cores = 1, .draws = 2}), InvalidArgument);
  EXPECT_NEAR(SimulateStep(s, c, {.draws = 2}).makespan_ms, SimulateStep(s, c).makespan_ms, 1e-9);
}

// The recorded steps round-trip through a costs file; a file without them still reads (it
// predates them); a broken entry is an error naming the step, stage, chunk and micro-batch.
TEST(StepSimulator, RecordedStepsRoundTripAndTheirErrorsNameTheEntry) {
  const StepCosts c =
      WithRecordedSteps(HandCosts(), 2, 3, [](int k, int m) { return k + m + 1.0; });
  const nlohmann::json file = nlohmann::json::parse(CostsToJson(c).dump());
  const StepCosts back = CostsFromJson(file, "file");
  ASSERT_EQ(back.recorded.size(), 2u);
  EXPECT_EQ(back.micro_batches, 3);
  EXPECT_DOUBLE_EQ(back.recorded[1].ranks[1].chunks[0].backward_ms[2], 4.0 * 4);
  EXPECT_DOUBLE_EQ(back.recorded[0].ranks[0].update_ms, 0.2);
  nlohmann::json old = file;
  old.erase("steps");
  EXPECT_TRUE(CostsFromJson(old, "old.json").recorded.empty());
  nlohmann::json negative = file;
  negative["steps"][1]["ranks"][0]["chunks"][0]["forward_ms"][2] = -1;
  EXPECT_NE(
      CostsError(negative).find("costs.json: steps[1] stage 0 chunk 0 \"forward_ms\"[2] is -1"),
      std::string::npos)
      << CostsError(negative);
  nlohmann::json ragged = file;
  ragged["steps"][1]["ranks"][1]["chunks"][0]["weight_ms"].erase(0);
  EXPECT_NE(
      CostsError(ragged).find("steps[1] stage 1 chunk 0 \"weight_ms\" has 2 entries, the first "
                              "step's 3"),
      std::string::npos)
      << CostsError(ragged);
  // A stage thread's wait for a core, where the run recorded it: kept; absent, unknown.
  EXPECT_DOUBLE_EQ(back.recorded[0].ranks[0].core_wait_ms, -1);
  nlohmann::json waits = file;
  waits["steps"][1]["ranks"][0]["core_wait_ms"] = 2.5;
  EXPECT_DOUBLE_EQ(CostsFromJson(waits, "file").recorded[1].ranks[0].core_wait_ms, 2.5);
  EXPECT_EQ(CostsToJson(CostsFromJson(waits, "file"))["steps"][1]["ranks"][0]["core_wait_ms"], 2.5);
  EXPECT_FALSE(CostsToJson(back)["steps"][1]["ranks"][0].contains("core_wait_ms"));
  waits["steps"][1]["ranks"][0]["core_wait_ms"] = -2;
  EXPECT_NE(CostsError(waits).find("steps[1] stage 0 \"core_wait_ms\" is -2"), std::string::npos)
      << CostsError(waits);
  nlohmann::json no_ranks = file;
  no_ranks["steps"][0].erase("ranks");
  EXPECT_NE(CostsError(no_ranks).find("steps[0] must have \"ranks\""), std::string::npos)
      << CostsError(no_ranks);
}

// Shared cores: with one core for two ranks nothing overlaps, so the makespan is every compute's
// CPU time in a row plus the posts and copies that sit between them on the critical path; with a
// core per rank the model is the one above.
TEST(StepSimulator, SharedCoresSerialiseComputes) {
  const Schedule s =
      MakeSchedule({.kind = ScheduleKind::kOneFOneB, .stages = 2, .micro_batches = 4});
  const StepCosts unit = UnitCosts(s);
  const StepPrediction free = SimulateStep(s, unit);
  EXPECT_DOUBLE_EQ(SimulateStep(s, unit, {.cores = 2}).makespan_ms, free.makespan_ms);
  EXPECT_DOUBLE_EQ(SimulateStep(s, unit, {.cores = 8}).makespan_ms, free.makespan_ms);
  // One core: 2 ranks × 4 micro-batches × (F + B + W) = 24 units, back to back.
  const StepPrediction one = SimulateStep(s, unit, {.cores = 1});
  EXPECT_DOUBLE_EQ(one.makespan_ms, 24);
  EXPECT_DOUBLE_EQ(one.ranks[0].busy_ms, 12);
  EXPECT_NEAR(one.bubble, 0.5, 1e-12);  // each rank idles while the other holds the core

  // Shared cores charge CPU time, not wall: a profile taken with the threads competing has wall
  // above CPU, and its wall times already hold the waits.
  StepCosts measured = unit;
  for (RankCosts& r : measured.ranks) {
    for (ChunkCosts& c : r.chunks) c.forward_ms = c.backward_ms = c.weight_ms = 5;
  }
  EXPECT_DOUBLE_EQ(SimulateStep(s, measured, {.cores = 1}).makespan_ms, 24);
  EXPECT_GT(SimulateStep(s, measured).makespan_ms, 24);
}

}  // namespace
}  // namespace sluice::pipeline
