// `sluice plan`: the memory forecast of a `sluice train` command line, and the recompute policies
// (and, with --schedule auto, the schedule) that --memory-budget would train with — the
// planner's choice (plan/planner.h) printed as a table or JSON. `sluice train` prints the same
// table before training under a budget or auto (DescribePlan). With --explain, every tensor live
// at each stage's peak as well, largest first (DescribeLiveAtPeak; "live_at_peak" in JSON).
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "sluice/cli/commands.h"
#include "sluice/cli/train_options.h"
#include "sluice/core/enum_names.h"
#include "sluice/kernels/bf16_probe.h"
#include "sluice/plan/planner.h"
#include "sluice/step/task.h"

namespace sluice::cli {

namespace {

nlohmann::json LiveJson(const std::vector<LiveTensor>& live) {
  nlohmann::json out = nlohmann::json::array();
  auto or_null = [](int v) { return v >= 0 ? nlohmann::json(v) : nlohmann::json(nullptr); };
  for (const LiveTensor& t : live) {
    out.push_back({{"name", t.name},
                   {"type", t.type},
                   {"bytes", t.bytes},
                   {"use", Name(t.use)},
                   {"reason", Name(t.reason)},
                   {"why", t.Why()},
                   {"micro_batch", or_null(t.micro_batch)},
                   {"chunk", or_null(t.chunk)},
                   {"made_by", t.made_by},
                   {"made_in", t.made_in},
                   {"next_reader", t.next_reader},
                   {"next_read_in", t.next_read_in}});
  }
  return out;
}

nlohmann::json PlanJson(const PlanChoice& choice, const TrainArgs& a, bool explain) {
  const MemoryPlan& plan = choice.plan;
  nlohmann::json stages = nlohmann::json::array();
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const StagePlan& p = plan.stages[s];
    nlohmann::json breakdown;
    for (const auto& [use, name] : kMemoryUseNames) breakdown[name] = p.forecast.at_peak[use];
    stages.push_back({{"stage", s},
                      {"recompute", Name(p.policy)},
                      {"predicted_peak_allocated_bytes", p.forecast.peak_allocated_bytes},
                      {"predicted_peak_reserved_bytes", p.forecast.peak_reserved_bytes},
                      {"least_peak_allocated_bytes", p.forecast.least_peak_allocated_bytes},
                      {"persistent_bytes", p.forecast.persistent_bytes},
                      {"breakdown", breakdown},
                      {"peak_at", p.forecast.peak_phase},
                      {"peak_instruction", p.forecast.peak_instruction},
                      {"extra_work", p.extra_work},
                      {"estimated_work", p.forecast.work},
                      {"budget_bytes", choice.budget.empty() ? nlohmann::json(nullptr)
                                                             : nlohmann::json(choice.budget[s])},
                      {"fits", p.fits}});
    if (explain) stages.back()["live_at_peak"] = LiveJson(p.forecast.live_at_peak);
    if (choice.post_validate) {
      stages.back()["rollback_bytes"] = p.forecast.rollback_bytes;
      stages.back()["interlock_bytes"] = p.forecast.interlock_bytes;
    }
  }
  nlohmann::json out = {
      {"model", a.config.ModelName()},
      {"schedule", choice.pipeline ? nlohmann::json(pipeline::ScheduleKindName(choice.schedule))
                                   : nlohmann::json(nullptr)},
      {"bubble", choice.bubble},
      {"fits", plan.fits},
      {"stages", stages}};
  if (choice.post_validate) out["post_validate"] = true;  // bubble: the steady state's
  return out;
}

}  // namespace

std::string DescribePlan(const PlanChoice& choice, const TrainArgs& a) {
  const MemoryPlan& plan = choice.plan;
  std::string out = fmt::format(
      "memory plan: {} on {}, batch {} in {} micro-batches, {}{}\n", a.config.ModelName(),
      a.config.data, a.config.batch, a.config.microbatches,
      choice.pipeline
          ? fmt::format("{} stages, {} ({}bubble {:.1f}% at unit cost{})", plan.stages.size(),
                        pipeline::ScheduleKindName(choice.schedule),
                        choice.post_validate ? "steady-state " : "", 100 * choice.bubble,
                        choice.post_validate ? " with post-validation" : "")
          : std::string("one stage"),
      choice.budget.empty() ? std::string() : fmt::format(", budget {}", a.memory_budget));
  out += fmt::format(
      "  {:<5}  {:<9}  {:>12}  {:>10}  {:>10}  {:>10}  {:>9}  {:>9}  {:>11}  {:>9}  {:>9}  {}\n",
      "stage", "recompute", "peak B", "peak", "reserved", "parameters", "optimizer", "gradients",
      "activations", "messages", "working", "peak at");
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const StagePlan& p = plan.stages[s];
    const MemoryBreakdown& b = p.forecast.at_peak;
    out += fmt::format(
        "  {:<5}  {:<9}  {:>12}  {:>10}  {:>10}  {:>10}  {:>9}  {:>9}  {:>11}  {:>9}  {:>9}  "
        "{}{}\n",
        s, Name(p.policy), p.forecast.peak_allocated_bytes,
        FormatBytes(p.forecast.peak_allocated_bytes), FormatBytes(p.forecast.peak_reserved_bytes),
        FormatBytes(b[MemoryUse::kParameters]), FormatBytes(b[MemoryUse::kOptimizerState]),
        FormatBytes(b[MemoryUse::kGradients]), FormatBytes(b[MemoryUse::kActivations]),
        FormatBytes(b[MemoryUse::kMessages]), FormatBytes(b[MemoryUse::kWorking]),
        p.forecast.peak_phase,
        p.forecast.peak_instruction.empty() ? "" : ": " + p.forecast.peak_instruction);
  }
  if (choice.pipeline) {
    out +=
        "  a pipeline stage's measured peak lies between its peak above and, if every send "
        "completes at once, ";
    for (size_t s = 0; s < plan.stages.size(); ++s) {
      out +=
          fmt::format("{}{}", s ? " / " : "", plan.stages[s].forecast.least_peak_allocated_bytes);
    }
    out += " B\n";
  }
  if (a.pipe.post_validate && !choice.post_validate) {
    out += fmt::format(
        "  post-validation off for {}: --schedule auto keeps it only where it fits and its "
        "steady-state step is shorter than the synchronous one at unit cost\n",
        pipeline::ScheduleKindName(choice.schedule));
  }
  if (choice.post_validate) {
    out +=
        "  post-validation keeps a copy of each stage's parameters and optimizer state for a "
        "rollback (in the optimizer column): ";
    for (size_t s = 0; s < plan.stages.size(); ++s) {
      out +=
          fmt::format("{}{}", s ? " / " : "", FormatBytes(plan.stages[s].forecast.rollback_bytes));
    }
    out +=
        "\n  and, as consecutive steps interlock, the previous step's gradients for its redo (in "
        "the gradients column): ";
    for (size_t s = 0; s < plan.stages.size(); ++s) {
      out +=
          fmt::format("{}{}", s ? " / " : "", FormatBytes(plan.stages[s].forecast.interlock_bytes));
    }
    out += "\n";
  }
  if (!choice.budget.empty()) {
    for (size_t s = 0; s < plan.stages.size(); ++s) {
      const StagePlan& p = plan.stages[s];
      out +=
          fmt::format("  stage {}: {} reserved of {} ({:.0f}%), recompute {}: {:+.0f}% work\n", s,
                      FormatBytes(p.forecast.peak_reserved_bytes), FormatBytes(choice.budget[s]),
                      100.0 * static_cast<double>(p.forecast.peak_reserved_bytes) /
                          static_cast<double>(choice.budget[s]),
                      Name(p.policy), 100 * p.extra_work);
    }
  }
  // What bf16 does on this CPU, and which ops of the model run bf16.
  if (a.config.gpt.precision == Precision::kBf16) {
    out += fmt::format("  {}\n", kernels::DescribeBf16Compute());
    if (std::string ops = DescribePrecisionOps(*MakeTask(a.config)); !ops.empty())
      out += fmt::format("  {}\n", ops);
  }
  return out;
}

std::string DescribePrecisionOps(const Task& task) {
  const nlohmann::json ops = task.PrecisionOps();
  if (ops.is_null()) return "";
  auto names = [](const nlohmann::json& list) {
    return list.empty() ? std::string("none") : fmt::format("{}", fmt::join(list, ", "));
  };
  return fmt::format("ops running bf16: {}; running f32 (the fp32 fallback): {}",
                     names(ops["bf16_ops"]), names(ops["f32_ops"]));
}

std::string DescribeLiveAtPeak(const PlanChoice& choice) {
  std::string out;
  for (size_t s = 0; s < choice.plan.stages.size(); ++s) {
    const StageMemoryForecast& f = choice.plan.stages[s].forecast;
    out += fmt::format("\nstage {}: {} tensors live at its peak of {} B ({}), {}{}\n", s,
                       f.live_at_peak.size(), f.peak_allocated_bytes,
                       FormatBytes(f.peak_allocated_bytes), f.peak_phase,
                       f.peak_instruction.empty() ? "" : ": " + f.peak_instruction);
    out += fmt::format("  {:>10}  {:<18}  {:<32}  {:<44}  {}\n", "bytes", "type", "name", "why",
                       "made by  →  next reader");
    for (const LiveTensor& t : f.live_at_peak) {
      const std::string next =
          t.next_reader.empty()
              ? (t.next_read_in.empty() ? "none in this step" : "none; " + t.next_read_in)
              : fmt::format("{} ({})", t.next_reader, t.next_read_in);
      out += fmt::format("  {:>10}  {:<18}  {:<32}  {:<44}  {}  →  {}\n", t.bytes,
                         t.type.empty() ? "-" : t.type, t.name, t.Why(), t.made_by, next);
    }
  }
  return out;
}

CommandRunner SetupPlanCommand(CLI::App& sub) {
  TrainOptions options = AddTrainOptions(sub, TrainCommand::kNoTraining);
  sub.add_option("--format", options.args->format, "table or json")
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();
  auto explain = std::make_shared<bool>(false);
  sub.add_flag("--explain", *explain,
               "list every tensor live at each stage's peak, largest first: its type, bytes, why "
               "it is alive, the instruction that made it and its next reader");
  return [options, explain] {
    options.finish();
    TrainArgs& a = *options.args;
    Configure(a);
    PlanRequest request = MakePlanRequest(a);
    request.explain = *explain;
    const PlanChoice choice = ChoosePlan(request);
    if (a.format == "json") {
      PrintToStdout("{}\n", PlanJson(choice, a, *explain).dump(2));
    } else {
      PrintToStdout("{}{}", DescribePlan(choice, a), *explain ? DescribeLiveAtPeak(choice) : "");
    }
    return 0;
  };
}

}  // namespace sluice::cli
