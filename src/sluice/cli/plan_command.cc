// `sluice plan`: the memory forecast of a `sluice train` command line, and the recompute policies
// (and, with --schedule auto, the schedule) that --memory-budget would train with — the
// planner's choice (plan/planner.h) printed as a table or JSON. `sluice train` prints the same
// table before training under a budget or auto (DescribePlan).
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "sluice/cli/commands.h"
#include "sluice/cli/train_options.h"
#include "sluice/core/enum_names.h"
#include "sluice/plan/planner.h"

namespace sluice::cli {

namespace {

nlohmann::json PlanJson(const PlanChoice& choice, const TrainArgs& a) {
  const MemoryPlan& plan = choice.plan;
  nlohmann::json stages = nlohmann::json::array();
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const StagePlan& p = plan.stages[s];
    nlohmann::json breakdown;
    for (const auto& [use, name] : kMemoryUseNames) breakdown[name] = p.forecast.at_peak[use];
    stages.push_back({{"stage", s},
                      {"recompute", Name(p.policy)},
                      {"predicted_peak_allocated_bytes", p.forecast.peak_allocated_bytes},
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
  }
  return {{"model", a.config.ModelName()},
          {"schedule", choice.pipeline ? nlohmann::json(pipeline::ScheduleKindName(choice.schedule))
                                       : nlohmann::json(nullptr)},
          {"bubble", choice.bubble},
          {"fits", plan.fits},
          {"stages", stages}};
}

}  // namespace

std::string DescribePlan(const PlanChoice& choice, const TrainArgs& a) {
  const MemoryPlan& plan = choice.plan;
  std::string out = fmt::format(
      "memory plan: {} on {}, batch {} in {} micro-batches, {}{}\n", a.config.ModelName(),
      a.config.data, a.config.batch, a.config.microbatches,
      choice.pipeline
          ? fmt::format("{} stages, {} (bubble {:.1f}% at unit cost)", plan.stages.size(),
                        pipeline::ScheduleKindName(choice.schedule), 100 * choice.bubble)
          : std::string("one stage"),
      choice.budget.empty() ? std::string() : fmt::format(", budget {}", a.memory_budget));
  out += fmt::format(
      "  {:<5}  {:<9}  {:>12}  {:>10}  {:>10}  {:>9}  {:>9}  {:>11}  {:>9}  {:>9}  {}\n", "stage",
      "recompute", "peak B", "peak", "parameters", "optimizer", "gradients", "activations",
      "messages", "working", "peak at");
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const StagePlan& p = plan.stages[s];
    const MemoryBreakdown& b = p.forecast.at_peak;
    out += fmt::format(
        "  {:<5}  {:<9}  {:>12}  {:>10}  {:>10}  {:>9}  {:>9}  {:>11}  {:>9}  {:>9}  {}{}\n", s,
        Name(p.policy), p.forecast.peak_allocated_bytes,
        FormatBytes(p.forecast.peak_allocated_bytes), FormatBytes(b[MemoryUse::kParameters]),
        FormatBytes(b[MemoryUse::kOptimizerState]), FormatBytes(b[MemoryUse::kGradients]),
        FormatBytes(b[MemoryUse::kActivations]), FormatBytes(b[MemoryUse::kMessages]),
        FormatBytes(b[MemoryUse::kWorking]), p.forecast.peak_phase,
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
  if (!choice.budget.empty()) {
    for (size_t s = 0; s < plan.stages.size(); ++s) {
      const StagePlan& p = plan.stages[s];
      out +=
          fmt::format("  stage {}: {} of {} ({:.0f}%), recompute {}: {:+.0f}% work\n", s,
                      FormatBytes(p.forecast.peak_allocated_bytes), FormatBytes(choice.budget[s]),
                      100.0 * static_cast<double>(p.forecast.peak_allocated_bytes) /
                          static_cast<double>(choice.budget[s]),
                      Name(p.policy), 100 * p.extra_work);
    }
  }
  return out;
}

CommandRunner SetupPlanCommand(CLI::App& sub) {
  TrainOptions options = AddTrainOptions(sub, TrainCommand::kNoTraining);
  sub.add_option("--format", options.args->format, "table or json")
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();
  return [options] {
    options.finish();
    TrainArgs& a = *options.args;
    Configure(a);
    const PlanChoice choice = ChoosePlan(MakePlanRequest(a));
    if (a.format == "json") {
      fmt::print("{}\n", PlanJson(choice, a).dump(2));
    } else {
      fmt::print("{}", DescribePlan(choice, a));
    }
    return 0;
  };
}

}  // namespace sluice::cli
