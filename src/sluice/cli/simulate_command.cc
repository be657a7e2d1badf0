// `sluice simulate`: the job's pipeline step replayed by the step simulator
// (schedule/step_simulator.h) with measured or unit costs, beside every stage's memory forecast;
// --compare ranks schedules by predicted step time. The simulation and the ranking are
// plan/simulation.h's; this file parses the options and prints.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "sluice/cli/commands.h"
#include "sluice/cli/train_options.h"
#include "sluice/core/enum_names.h"
#include "sluice/core/error.h"
#include "sluice/plan/simulation.h"
#include "sluice/schedule/schedule_format.h"
#include "sluice/step/memory_budget.h"

namespace sluice::cli {

namespace {

// What to say beside a prediction from costs whose run's stage threads waited for cores; "" when
// they did not (much).
std::string CoreWaitNote(const SimulatedSchedule& r) {
  if (r.core_wait_share < pipeline::kCoreWaitShareNoted) return "";
  return fmt::format(
      "{}: a stage thread of the profiled run waited for a core {:.0f}% of its step (other work "
      "on the machine): the prediction is for a core per stage, which that run did not have — "
      "profile where every stage has one",
      r.costs, 100 * r.core_wait_share);
}

// Stage s's forecast peak of allocated or reserved bytes, or null when memory was not forecast.
nlohmann::ordered_json PeakJson(const std::vector<StageMemoryForecast>& memory, size_t s,
                                bool reserved = false) {
  if (memory.empty()) return nlohmann::ordered_json();
  return memory[s].*(reserved ? &StageMemoryForecast::peak_reserved_bytes
                              : &StageMemoryForecast::peak_allocated_bytes);
}

// The kinds of --compare: a comma list of schedule names, or "all".
std::vector<pipeline::ScheduleKind> ParseCompareList(const std::string& text) {
  std::vector<pipeline::ScheduleKind> kinds;
  if (text == "all") {
    for (const auto& [kind, name] : pipeline::kScheduleKindNames) kinds.push_back(kind);
    return kinds;
  }
  for (size_t start = 0;;) {
    const size_t end = text.find(',', start);
    const std::string name = text.substr(start, end - start);
    const std::optional<pipeline::ScheduleKind> kind = pipeline::ParseScheduleKind(name);
    if (!kind) {
      throw InvalidArgument(fmt::format("--compare '{}': '{}' is not a schedule ({}, or all)", text,
                                        name, EnumNames(pipeline::kScheduleKindNames, ", ")));
    }
    if (std::find(kinds.begin(), kinds.end(), *kind) != kinds.end()) {
      throw InvalidArgument(fmt::format("--compare '{}': '{}' is named twice", text, name));
    }
    kinds.push_back(*kind);
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return kinds;
}

// `sluice simulate --compare`: every named schedule simulated and ranked by predicted step time;
// with --memory-budget those whose forecast exceeds it rank after those within it.
int RunCompare(const TrainArgs& a, const SimulationRequest& request, const Job& job) {
  const ScheduleRanking ranking = RankSchedules(request, job, ParseCompareList(a.compare));
  const std::vector<SimulatedSchedule>& ranked = ranking.ranked;
  const auto& refused = ranking.refused;
  const std::vector<pipeline::StepCosts>& costs = request.costs;
  const std::vector<int64_t>& budget = request.budget;
  const char* unit = costs.empty() ? "units" : "ms";
  if (a.format == "json") {
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    for (size_t i = 0; i < ranked.size(); ++i) {
      const SimulatedSchedule& r = ranked[i];
      nlohmann::ordered_json stages = nlohmann::ordered_json::array();
      for (size_t s = 0; s < r.prediction.ranks.size(); ++s) {
        stages.push_back({{"stage", s},
                          {"bubble", r.prediction.ranks[s].bubble},
                          {"peak_allocated_bytes", PeakJson(r.memory, s)},
                          {"peak_reserved_bytes", PeakJson(r.memory, s, true)}});
      }
      rows.push_back(
          {{"rank", i + 1},
           {"schedule", pipeline::ScheduleKindName(r.kind)},
           {"describe", r.describe},
           {"costs", r.costs},
           {"step_ms", r.prediction.step_ms},
           {"bubble", r.prediction.bubble},
           {"peak_allocated_bytes",
            r.memory.empty() ? nlohmann::ordered_json() : nlohmann::ordered_json(r.LargestPeak())},
           {"peak_reserved_bytes", r.memory.empty()
                                       ? nlohmann::ordered_json()
                                       : nlohmann::ordered_json(r.LargestReservedPeak())},
           {"fits_budget", r.fits},
           {"stages", stages}});
      if (!r.memory_note.empty()) rows.back()["memory_note"] = r.memory_note;
      if (r.core_wait_share >= 0) rows.back()["core_wait_share"] = r.core_wait_share;
      if (const std::string note = CoreWaitNote(r); !note.empty()) rows.back()["note"] = note;
    }
    nlohmann::ordered_json not_simulated = nlohmann::ordered_json::array();
    for (const auto& [kind, reason] : refused) {
      not_simulated.push_back({{"schedule", pipeline::ScheduleKindName(kind)}, {"reason", reason}});
    }
    nlohmann::ordered_json out;
    out["time_unit"] = unit;
    out["cores"] = a.cores;
    out["ranking"] = rows;
    out["not_simulated"] = not_simulated;
    PrintToStdout("{}\n", out.dump(2));
    return 0;
  }
  PrintToStdout("schedules ranked by predicted step time ({}){}\n",
                costs.empty() ? "unit costs" : "measured costs",
                budget.empty() ? "" : ", those within --memory-budget first");
  // With a budget the column shows what it bounds: reserved bytes (docs/memory.md).
  PrintToStdout("  {:<4}  {:<28}  {:>10}  {:>7}  {:>16}{}\n", "rank", "schedule", "step", "bubble",
                budget.empty() ? "largest peak" : "largest reserved",
                budget.empty() ? "" : "  budget");
  for (size_t i = 0; i < ranked.size(); ++i) {
    const SimulatedSchedule& r = ranked[i];
    PrintToStdout("  {:<4}  {:<28}  {:>7.3f} {:<2}  {:>6.1f}%  {:>16}{}\n", i + 1, r.describe,
                  r.prediction.step_ms, unit, 100 * r.prediction.bubble,
                  r.memory.empty()
                      ? "-"
                      : FormatBytes(budget.empty() ? r.LargestPeak() : r.LargestReservedPeak()),
                  budget.empty() ? "" : (r.fits ? "  fits" : "  over"));
  }
  std::vector<std::string> notes;  // one per costs file
  for (const SimulatedSchedule& r : ranked) {
    if (!r.memory_note.empty()) PrintToStdout("  {}: {}\n", r.describe, r.memory_note);
    const std::string note = CoreWaitNote(r);
    if (!note.empty() && std::find(notes.begin(), notes.end(), note) == notes.end()) {
      notes.push_back(note);
    }
  }
  for (const std::string& note : notes) PrintToStdout("  note: {}\n", note);
  for (const auto& [kind, reason] : refused) {
    PrintToStdout("  not simulated: {}: {}\n", pipeline::ScheduleKindName(kind), reason);
  }
  return 0;
}

// `sluice simulate`: the job's step replayed by the step simulator (schedule/step_simulator.h) with
// measured or unit costs, beside the memory forecast of every stage.
int RunSimulate(TrainArgs& a) {
  a.pipeline = true;
  Configure(a);
  const Job job = MakeJob(a.config);
  SimulationRequest request{.config = a.config,
                            .pipe = a.pipe,
                            .cores = a.cores,
                            .draws = a.draws,
                            .draw_mode = a.draw_mode == "steps" ? pipeline::DrawMode::kSteps
                                                                : pipeline::DrawMode::kComputes};
  for (const std::string& path : a.costs) request.costs.push_back(pipeline::ReadCostsFile(path));
  if (!a.memory_budget.empty()) {
    request.budget = ParseMemoryBudget(a.memory_budget, a.pipe.stages);
  }
  if (!a.compare.empty()) return RunCompare(a, request, job);
  if (a.pipeline_schedule == "auto") {
    throw InvalidArgument(fmt::format(
        "sluice simulate --schedule: name a schedule ({}), not auto; --compare ranks several",
        EnumNames(pipeline::kScheduleKindNames, ", ")));
  }
  const SimulatedSchedule r = SimulateSchedule(request, job, a.pipe.schedule);
  const std::vector<pipeline::StepCosts>& costs = request.costs;
  const std::vector<int64_t>& budget = request.budget;
  const pipeline::StepPrediction& p = r.prediction;
  const std::vector<StageMemoryForecast>& memory = r.memory;
  const char* unit = costs.empty() ? "units" : "ms";
  const double overhead = costs.empty() ? 0 : p.step_ms - p.makespan_ms;
  if (a.format == "json") {
    nlohmann::ordered_json stages = nlohmann::ordered_json::array();
    for (size_t s = 0; s < p.ranks.size(); ++s) {
      stages.push_back({{"stage", s},
                        {"busy_ms", p.ranks[s].busy_ms},
                        {"idle_ms", p.ranks[s].idle_ms},
                        {"bubble", p.ranks[s].bubble},
                        {"peak_allocated_bytes", PeakJson(memory, s)},
                        {"peak_reserved_bytes", PeakJson(memory, s, true)}});
    }
    nlohmann::ordered_json out;
    out["schedule"] = r.describe;
    out["costs"] = r.costs;
    out["time_unit"] = unit;
    out["cores"] = a.cores;
    out["draws"] = r.draws;
    out["step_ms"] = p.step_ms;
    out["makespan_ms"] = p.makespan_ms;
    out["bubble"] = p.bubble;
    if (!budget.empty()) out["fits_budget"] = r.fits;
    if (!r.memory_note.empty()) out["memory_note"] = r.memory_note;
    if (r.core_wait_share >= 0) out["core_wait_share"] = r.core_wait_share;
    if (const std::string note = CoreWaitNote(r); !note.empty()) out["note"] = note;
    if (!r.measured.is_null()) out["measured"] = r.measured;
    if (r.steady) {
      out["post_validation"] = pipeline::SteadyStateJson(*r.steady);
      if (r.steady_per_action) {
        out["post_validation"]["per_action"] = true;
        out["post_validation"]["rollback_copy_ms"] = r.rollback_copy_ms;
      }
    }
    out["stages"] = stages;
    if (!p.draws.empty()) {
      nlohmann::ordered_json draws = nlohmann::ordered_json::array();
      for (const pipeline::DrawPrediction& d : p.draws) {
        draws.push_back({{"step_ms", d.step_ms},
                         {"makespan_ms", d.makespan_ms},
                         {"stage_bubble", d.stage_bubble}});
      }
      out["drawn"] = draws;
    }
    PrintToStdout("{}\n", out.dump(2));
    return 0;
  }
  PrintToStdout(
      "simulated step: {}, {}{}{}\n", r.describe, r.costs,
      a.cores > 0 ? fmt::format(", {} shared core(s)", a.cores) : "",
      r.draws > 0 ? fmt::format(", mean of {} draws of the recorded computes", r.draws) : "");
  PrintToStdout("  step {:.3f} {} (makespan {:.3f}{}), bubble {:.1f}%\n", p.step_ms, unit,
                p.makespan_ms,
                overhead > 0 ? fmt::format(" + {:.3f} step overhead", overhead) : std::string(),
                100 * p.bubble);
  const bool measured = !r.measured.is_null();
  if (measured) {
    const double step_ms = r.measured["step_ms"].get<double>();
    const double off = step_ms > 0 ? 100 * (p.step_ms / step_ms - 1) : 0.0;
    PrintToStdout(
        "  measured {:.3f} ms: the profiled run of this schedule{}; the prediction is "
        "{:.1f}% {} it\n",
        step_ms,
        r.measured.contains("steps")
            ? fmt::format(", median of {} steps", r.measured["steps"].dump())
            : "",
        std::abs(off), off >= 0 ? "above" : "below");
  }
  PrintToStdout("  {:<5}  {:>10}  {:>10}  {:>7}{}  {:>12}{}\n", "stage", "busy", "idle", "bubble",
                measured ? "  measured" : "", "peak memory",
                budget.empty() ? "" : "      reserved  budget");
  for (size_t s = 0; s < p.ranks.size(); ++s) {
    PrintToStdout(
        "  {:<5}  {:>10.3f}  {:>10.3f}  {:>6.1f}%{}  {:>12}{}\n", s, p.ranks[s].busy_ms,
        p.ranks[s].idle_ms, 100 * p.ranks[s].bubble,
        measured ? fmt::format("  {:>7.1f}%", 100 * r.measured["stage_bubble"][s].get<double>())
                 : "",
        memory.empty() ? "-" : FormatBytes(memory[s].peak_allocated_bytes),
        budget.empty() || memory.empty()  // the budget bounds reserved bytes
            ? ""
            : fmt::format("  {:>12}  {}", FormatBytes(memory[s].peak_reserved_bytes),
                          memory[s].peak_reserved_bytes <= budget[s]
                              ? "fits"
                              : "over " + FormatBytes(budget[s])));
  }
  if (!r.memory_note.empty()) PrintToStdout("  {}\n", r.memory_note);
  if (const std::string note = CoreWaitNote(r); !note.empty()) PrintToStdout("  note: {}\n", note);
  if (r.steady) {
    const pipeline::SteadyState& st = *r.steady;
    PrintToStdout(
        "  post-validation: the steps interlock; {} a steady-state step takes {:.3f} {}, bubble "
        "{:.1f}% (synchronous {:.3f}, {:.1f}%); once per run the first fill {:.3f} and the last "
        "drain {:.3f} (mean per stage)\n",
        r.steady_per_action
            ? fmt::format("at the profile's per-action costs, every step's OPT and rollback copy "
                          "({:.3f} ms) included,",
                          r.rollback_copy_ms)
            : "at the mean F, B and W costs (messages and OPT free)",
        st.period, unit, 100 * st.bubble, st.synchronous_makespan, 100 * st.synchronous_bubble,
        st.fill, st.drain);
  }
  return 0;
}

}  // namespace

CommandRunner SetupSimulateCommand(CLI::App& sub) {
  TrainOptions options = AddTrainOptions(sub, TrainCommand::kNoTraining);
  sub.add_option("--costs", options.args->costs,
                 "costs file of sluice train --profile-out (default: unit costs); repeat it to "
                 "give several (interleaved needs its own): each schedule uses the first that "
                 "covers it")
      ->delimiter(',');
  sub.add_option("--cores", options.args->cores,
                 "cores the stage threads share (0: one per stage); with fewer, computes wait "
                 "for a free core and cost their measured CPU time")
      ->check(CLI::Range(0, 1 << 20));
  sub.add_option("--draws", options.args->draws,
                 "replay this many draws of the costs file's recorded computes and give their "
                 "mean (0: one replay of the medians; default: 64 where the file recorded 8 "
                 "steps or more, without --cores)")
      ->check(CLI::Range(0, 100000));
  sub.add_option("--draw-mode", options.args->draw_mode,
                 "computes (every compute drawn at random from its rank, chunk and kind) or steps "
                 "(draw d replays recorded step d)")
      ->check(CLI::IsMember({"computes", "steps"}))
      ->capture_default_str();
  sub.add_option("--compare", options.args->compare,
                 "rank these schedules (comma list, or all) by predicted step time; with "
                 "--memory-budget, those within it first")
      ->check(NonEmpty("an empty list names no schedule; give schedules separated by commas, "
                       "or all"));
  sub.add_option("--format", options.args->format, "table or json")
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();
  return [options] {
    options.finish();
    return RunSimulate(*options.args);
  };
}

}  // namespace sluice::cli
