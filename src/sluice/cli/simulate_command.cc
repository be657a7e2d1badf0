// `sluice simulate`: the job's pipeline step replayed by the step simulator
// (schedule/step_simulator.h) with measured or unit costs, beside every stage's memory forecast;
// --compare ranks schedules by predicted step time.
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
#include "sluice/pipeline/cost_profiler.h"
#include "sluice/pipeline/memory_forecast.h"
#include "sluice/schedule/schedule_analysis.h"
#include "sluice/schedule/step_simulator.h"
#include "sluice/step/memory_budget.h"

namespace sluice::cli {

namespace {

// One schedule's simulated step: the prediction and the memory forecast of every stage.
struct SimulatedSchedule {
  pipeline::ScheduleKind kind;
  std::string describe;  // the schedule (kind, P, M, V)
  std::string costs;     // where its costs come from
  pipeline::StepPrediction prediction;
  int draws = 0;                            // replays of drawn costs (0: of the medians)
  std::vector<StageMemoryForecast> memory;  // empty when not forecast (memory_note says why)
  std::string memory_note;
  bool fits = true;  // every stage's forecast within --memory-budget (true without a budget)
  double core_wait_share = -1;  // of the costs' run (pipeline::CoreWaitShare); -1 unknown
  // The profiled run's own step, when it ran this very schedule (its costs' "measured"): what the
  // prediction can be checked against. Null otherwise.
  nlohmann::ordered_json measured;
};

// The costs' run's step time and stage bubbles when it ran `schedule`; null when it ran another
// (or the costs do not say: unit costs, files written before they named the schedule).
nlohmann::ordered_json MeasuredStep(const pipeline::StepCosts& costs,
                                    const pipeline::Schedule& schedule) {
  const nlohmann::json& m = costs.measured;
  if (!m.is_object() || !m.contains("schedule") || m["schedule"] != schedule.Describe() ||
      !m.contains("step_ms") || !m.contains("stage_bubble")) {
    return nullptr;
  }
  nlohmann::ordered_json out;
  if (m.contains("steps") && m["steps"].is_number_unsigned()) out["steps"] = m["steps"];  // a count
  out["step_ms"] = m["step_ms"];
  out["stage_bubble"] = m["stage_bubble"];
  return out;
}

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

// The first of `costs` that covers the job under `kind` (P, V, split backward, the same model,
// micro-batch, layout, recompute and threads); unit costs when none is given. Throws
// InvalidArgument naming why each file does not cover it.
pipeline::StepCosts CostsFor(const std::vector<pipeline::StepCosts>& costs,
                             const pipeline::PipelineLayout& layout) {
  const pipeline::Schedule& schedule = layout.setup.schedule;
  if (costs.empty()) return pipeline::UnitCosts(schedule);
  std::string why;
  for (const pipeline::StepCosts& c : costs) {
    try {
      pipeline::CheckCostsCover(c, schedule);
      pipeline::CheckCostsJob(c, pipeline::ProfileJob(layout.setup, layout.layout));
      return c;
    } catch (const InvalidArgument& e) {
      why += costs.size() > 1 ? fmt::format("\n  {}", e.what()) : e.what();
    }
  }
  throw InvalidArgument(why);
}

SimulatedSchedule SimulateSchedule(const TrainArgs& a, const Job& job, pipeline::ScheduleKind kind,
                                   const std::vector<pipeline::StepCosts>& costs,
                                   const std::vector<int64_t>& budget) {
  const EngineContext ctx{.config = a.config, .task = *job.task, .model = job.model, .threads = 1};
  pipeline::PipelineOptions options = a.pipe;
  options.schedule = kind;
  const pipeline::PipelineLayout layout = pipeline::LayOutPipeline(ctx, options, 1);
  const pipeline::StepCosts chosen = CostsFor(costs, layout);
  // By default, draws where the costs recorded enough steps and every stage has a core (the
  // model draws are for); the medians elsewhere.
  const bool enough = chosen.recorded.size() >= size_t{pipeline::kDefaultDrawsLeastSteps};
  const int draws = a.draws >= 0 ? a.draws : enough && a.cores == 0 ? pipeline::kDefaultDraws : 0;
  SimulatedSchedule out{.kind = kind,
                        .describe = layout.setup.schedule.Describe(),
                        .costs = chosen.source,
                        .prediction = pipeline::SimulateStep(
                            layout.setup.schedule, chosen,
                            {.cores = a.cores,
                             .validated = true,
                             .draws = draws,
                             .draw_mode = a.draw_mode == "steps" ? pipeline::DrawMode::kSteps
                                                                 : pipeline::DrawMode::kComputes}),
                        .draws = draws,
                        .core_wait_share = pipeline::CoreWaitShare(chosen),
                        .measured = MeasuredStep(chosen, layout.setup.schedule)};
  if (std::optional<std::string> why = pipeline::ForecastRefusal(layout.setup.schedule)) {
    out.memory_note = *why;
    if (!budget.empty()) throw InvalidArgument("--memory-budget: " + out.memory_note);
  } else {
    out.memory = pipeline::ForecastStages(layout.setup);
  }
  for (size_t s = 0; s < budget.size() && s < out.memory.size(); ++s) {
    if (out.memory[s].peak_allocated_bytes > budget[s]) out.fits = false;
  }
  return out;
}

// Stage s's forecast peak, or null when memory was not forecast.
nlohmann::ordered_json PeakJson(const std::vector<StageMemoryForecast>& memory, size_t s) {
  return memory.empty() ? nlohmann::ordered_json()
                        : nlohmann::ordered_json(memory[s].peak_allocated_bytes);
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

// The largest stage's forecast peak; -1 when memory was not forecast.
int64_t LargestPeak(const std::vector<StageMemoryForecast>& memory) {
  int64_t peak = memory.empty() ? -1 : 0;
  for (const StageMemoryForecast& m : memory) peak = std::max(peak, m.peak_allocated_bytes);
  return peak;
}

// `sluice simulate --compare`: every named schedule simulated and ranked by predicted step time;
// with --memory-budget those whose forecast exceeds it rank after those within it.
int RunCompare(const TrainArgs& a, const Job& job, const std::vector<pipeline::StepCosts>& costs,
               const std::vector<int64_t>& budget) {
  std::vector<SimulatedSchedule> ranked;
  std::vector<std::pair<pipeline::ScheduleKind, std::string>> refused;
  for (pipeline::ScheduleKind kind : ParseCompareList(a.compare)) {
    try {
      ranked.push_back(SimulateSchedule(a, job, kind, costs, budget));
    } catch (const Error& e) {
      refused.emplace_back(kind, e.what());
    }
  }
  if (ranked.empty()) {
    std::string why;
    for (const auto& [kind, reason] : refused) {
      why += fmt::format("\n  {}: {}", pipeline::ScheduleKindName(kind), reason);
    }
    throw InvalidArgument("--compare: no schedule named can be simulated for this job:" + why);
  }
  // Within the budget first, then the fastest; of equal times, the one needing less memory.
  std::stable_sort(ranked.begin(), ranked.end(), [](const auto& x, const auto& y) {
    if (x.fits != y.fits) return x.fits;
    if (x.prediction.step_ms != y.prediction.step_ms) {
      return x.prediction.step_ms < y.prediction.step_ms;
    }
    return LargestPeak(x.memory) < LargestPeak(y.memory);
  });
  const char* unit = costs.empty() ? "units" : "ms";
  if (a.format == "json") {
    nlohmann::ordered_json rows = nlohmann::ordered_json::array();
    for (size_t i = 0; i < ranked.size(); ++i) {
      const SimulatedSchedule& r = ranked[i];
      nlohmann::ordered_json stages = nlohmann::ordered_json::array();
      for (size_t s = 0; s < r.prediction.ranks.size(); ++s) {
        stages.push_back({{"stage", s},
                          {"bubble", r.prediction.ranks[s].bubble},
                          {"peak_allocated_bytes", PeakJson(r.memory, s)}});
      }
      rows.push_back({{"rank", i + 1},
                      {"schedule", pipeline::ScheduleKindName(r.kind)},
                      {"describe", r.describe},
                      {"costs", r.costs},
                      {"step_ms", r.prediction.step_ms},
                      {"bubble", r.prediction.bubble},
                      {"peak_allocated_bytes", r.memory.empty()
                                                   ? nlohmann::ordered_json()
                                                   : nlohmann::ordered_json(LargestPeak(r.memory))},
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
    fmt::print("{}\n", out.dump(2));
    return 0;
  }
  fmt::print("schedules ranked by predicted step time ({}){}\n",
             costs.empty() ? "unit costs" : "measured costs",
             budget.empty() ? "" : ", those within --memory-budget first");
  fmt::print("  {:<4}  {:<28}  {:>10}  {:>7}  {:>16}{}\n", "rank", "schedule", "step", "bubble",
             "largest peak", budget.empty() ? "" : "  budget");
  for (size_t i = 0; i < ranked.size(); ++i) {
    const SimulatedSchedule& r = ranked[i];
    fmt::print("  {:<4}  {:<28}  {:>7.3f} {:<2}  {:>6.1f}%  {:>16}{}\n", i + 1, r.describe,
               r.prediction.step_ms, unit, 100 * r.prediction.bubble,
               r.memory.empty() ? "-" : FormatBytes(LargestPeak(r.memory)),
               budget.empty() ? "" : (r.fits ? "  fits" : "  over"));
  }
  std::vector<std::string> notes;  // one per costs file
  for (const SimulatedSchedule& r : ranked) {
    if (!r.memory_note.empty()) fmt::print("  {}: {}\n", r.describe, r.memory_note);
    const std::string note = CoreWaitNote(r);
    if (!note.empty() && std::find(notes.begin(), notes.end(), note) == notes.end()) {
      notes.push_back(note);
    }
  }
  for (const std::string& note : notes) fmt::print("  note: {}\n", note);
  for (const auto& [kind, reason] : refused) {
    fmt::print("  not simulated: {}: {}\n", pipeline::ScheduleKindName(kind), reason);
  }
  return 0;
}

// `sluice simulate`: the job's step replayed by the step simulator (schedule/step_simulator.h) with
// measured or unit costs, beside the memory forecast of every stage.
int RunSimulate(TrainArgs& a) {
  a.pipeline = true;
  Configure(a);
  const Job job = MakeJob(a.config);
  std::vector<pipeline::StepCosts> costs;
  for (const std::string& path : a.costs) costs.push_back(pipeline::ReadCostsFile(path));
  std::vector<int64_t> budget;
  if (!a.memory_budget.empty()) budget = ParseMemoryBudget(a.memory_budget, a.pipe.stages);
  if (!a.compare.empty()) return RunCompare(a, job, costs, budget);
  if (a.pipeline_schedule == "auto") {
    throw InvalidArgument(fmt::format(
        "sluice simulate --schedule: name a schedule ({}), not auto; --compare ranks several",
        EnumNames(pipeline::kScheduleKindNames, ", ")));
  }
  const SimulatedSchedule r = SimulateSchedule(a, job, a.pipe.schedule, costs, budget);
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
                        {"peak_allocated_bytes", PeakJson(memory, s)}});
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
    fmt::print("{}\n", out.dump(2));
    return 0;
  }
  fmt::print(
      "simulated step: {}, {}{}{}\n", r.describe, r.costs,
      a.cores > 0 ? fmt::format(", {} shared core(s)", a.cores) : "",
      r.draws > 0 ? fmt::format(", mean of {} draws of the recorded computes", r.draws) : "");
  fmt::print("  step {:.3f} {} (makespan {:.3f}{}), bubble {:.1f}%\n", p.step_ms, unit,
             p.makespan_ms,
             overhead > 0 ? fmt::format(" + {:.3f} step overhead", overhead) : std::string(),
             100 * p.bubble);
  const bool measured = !r.measured.is_null();
  if (measured) {
    const double step_ms = r.measured["step_ms"].get<double>();
    const double off = step_ms > 0 ? 100 * (p.step_ms / step_ms - 1) : 0.0;
    fmt::print(
        "  measured {:.3f} ms: the profiled run of this schedule{}; the prediction is "
        "{:.1f}% {} it\n",
        step_ms,
        r.measured.contains("steps")
            ? fmt::format(", median of {} steps", r.measured["steps"].dump())
            : "",
        std::abs(off), off >= 0 ? "above" : "below");
  }
  fmt::print("  {:<5}  {:>10}  {:>10}  {:>7}{}  {:>12}{}\n", "stage", "busy", "idle", "bubble",
             measured ? "  measured" : "", "peak memory", budget.empty() ? "" : "  budget");
  for (size_t s = 0; s < p.ranks.size(); ++s) {
    fmt::print("  {:<5}  {:>10.3f}  {:>10.3f}  {:>6.1f}%{}  {:>12}{}\n", s, p.ranks[s].busy_ms,
               p.ranks[s].idle_ms, 100 * p.ranks[s].bubble,
               measured
                   ? fmt::format("  {:>7.1f}%", 100 * r.measured["stage_bubble"][s].get<double>())
                   : "",
               memory.empty() ? "-" : FormatBytes(memory[s].peak_allocated_bytes),
               budget.empty() ? ""
                              : fmt::format("  {}", memory[s].peak_allocated_bytes <= budget[s]
                                                        ? "fits"
                                                        : "over " + FormatBytes(budget[s])));
  }
  if (!r.memory_note.empty()) fmt::print("  {}\n", r.memory_note);
  if (const std::string note = CoreWaitNote(r); !note.empty()) fmt::print("  note: {}\n", note);
  return 0;
}

}  // namespace

CommandRunner SetupSimulateCommand(CLI::App& sub) {
  TrainOptions options = AddTrainOptions(sub);
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
