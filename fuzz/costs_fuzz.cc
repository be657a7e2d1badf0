// Fuzz target for the costs file of `sluice train --profile-out` that `sluice simulate --costs`
// reads (schedule/step_costs.h: CostsFromJson, CostsToJson; schedule/step_simulator.h).
//
// Input: the file's text. For every input that is JSON:
//   * CostsFromJson returns costs or throws InvalidArgument. Any other exception escapes and
//     libFuzzer reports it as a crash (a JSON type error reaching the user was one); so do hangs
//     and sanitizer reports.
//   * Costs it returns are well formed: P and V in range, an entry per rank and chunk, every cost
//     a number from 0 to kMaxCostMs, recorded steps of one M.
//   * CostsToJson of them reads back to the same text.
//   * Up to 8 stages, the step simulator replays them on the schedule they cover (1f1b, zb-h1 or
//     interleaved; M = 2P), with the medians and, where steps were recorded, with two draws: a
//     finite step no shorter than its makespan, or an InvalidArgument.
//
// Run: make fuzz (FUZZ_SECONDS=300 for longer), or build-fuzz/fuzz/costs_fuzz
// -dict=fuzz/costs.dict CORPUS_DIR fuzz/corpus/costs. Add each input that found a bug to
// tests/schedule/step_simulator_test.cc.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "sluice/core/error.h"
#include "sluice/core/json_text.h"
#include "sluice/schedule/schedules.h"
#include "sluice/schedule/step_costs.h"
#include "sluice/schedule/step_simulator.h"

namespace {

using sluice::pipeline::StepCosts;

[[noreturn]] void Die(const char* what, const std::string& text) {
  std::fprintf(stderr, "costs_fuzz: %s\ncosts: %s\n", what, text.c_str());
  std::abort();
}

bool IsCost(double ms) { return ms >= 0 && ms <= sluice::pipeline::kMaxCostMs; }

// The invariants CostsFromJson promises of what it returns.
bool WellFormed(const StepCosts& c) {
  if (c.stages < 1 || c.chunks < 1 || static_cast<int>(c.ranks.size()) != c.stages) return false;
  for (const sluice::pipeline::RankCosts& r : c.ranks) {
    if (static_cast<int>(r.chunks.size()) != c.chunks) return false;
    if (!IsCost(r.optimizer_ms) || !IsCost(r.update_ms) || !IsCost(r.overhead_ms)) return false;
    for (const sluice::pipeline::ChunkCosts& ch : r.chunks) {
      for (double ms : {ch.forward_ms, ch.backward_ms, ch.weight_ms, ch.forward_cpu_ms,
                        ch.backward_cpu_ms, ch.weight_cpu_ms}) {
        if (!IsCost(ms)) return false;
      }
    }
  }
  for (double ms : {c.post_ms, c.copy_ms, c.wake_ms, c.allreduce_ms, c.step_overhead_ms}) {
    if (!IsCost(ms)) return false;
  }
  return c.message_bytes >= 0 && c.measured.is_object();
}

// Replays `c` on the schedule it covers; returns an error message, or "" when the prediction is
// sound or the simulator refused the costs with an InvalidArgument.
std::string Replay(const StepCosts& c, int draws) {
  using sluice::pipeline::ScheduleKind;
  const ScheduleKind kind = c.split_backward ? ScheduleKind::kZeroBubbleH1
                            : c.chunks == 2  ? ScheduleKind::kInterleaved
                                             : ScheduleKind::kOneFOneB;
  try {
    const sluice::pipeline::Schedule schedule = sluice::pipeline::MakeSchedule(
        {.kind = kind, .stages = c.stages, .micro_batches = 2 * c.stages, .chunks = c.chunks});
    const sluice::pipeline::StepPrediction p =
        sluice::pipeline::SimulateStep(schedule, c, {.validated = true, .draws = draws});
    if (!std::isfinite(p.step_ms) || !std::isfinite(p.makespan_ms) || p.makespan_ms < 0 ||
        p.step_ms < p.makespan_ms) {
      return "the prediction is not a finite step at least its makespan";
    }
    if (!(p.bubble >= 0 && p.bubble <= 1)) return "the predicted bubble is not a share";
  } catch (const sluice::InvalidArgument&) {
  }
  return "";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // As ReadCostsFile parses the file (nesting bounded: a deep "measured" overflowed the stack).
  nlohmann::json json;
  try {
    json = sluice::ParseJsonText(std::string_view(reinterpret_cast<const char*>(data), size));
  } catch (const nlohmann::json::exception&) {
    return 0;
  }
  StepCosts costs;
  try {
    costs = sluice::pipeline::CostsFromJson(json, "costs.json");
  } catch (const sluice::InvalidArgument&) {
    return 0;
  }
  const std::string text = json.dump();
  if (!WellFormed(costs)) Die("CostsFromJson returned costs out of its bounds", text);
  const std::string written = sluice::pipeline::CostsToJson(costs).dump();
  StepCosts again;
  try {
    again = sluice::pipeline::CostsFromJson(nlohmann::json::parse(written), "again.json");
  } catch (const sluice::InvalidArgument& e) {
    Die(e.what(), written);
  }
  if (sluice::pipeline::CostsToJson(again).dump() != written) {
    Die("what CostsToJson wrote reads back different", written);
  }
  if (const double share = sluice::pipeline::CoreWaitShare(costs);
      !(share == -1 || (share >= 0 && share <= 1))) {
    Die("CoreWaitShare is neither -1 nor a share", text);
  }
  if (costs.stages <= 8 && costs.chunks <= 2) {
    for (int draws : {0, costs.recorded.empty() ? 0 : 2}) {
      if (const std::string why = Replay(costs, draws); !why.empty()) Die(why.c_str(), text);
    }
  }
  return 0;
}
