// Memory budgets: `--memory-budget SIZE` parsed, and the plan that meets it — per stage, the
// recompute policy with the least extra work whose forecast peak (step/memory_replay.h,
// pipeline/memory_forecast.h) fits the stage's budget.
//
// Sizes: a positive number of bytes with an optional unit — B, KB/MB/GB/TB (powers of 1000),
// KiB/MiB/GiB/TiB (powers of 1024), case-insensitive: "6MiB", "1.5GB", "1048576". One size for
// every stage, or a comma list with one per stage ("8MiB,6MiB,6MiB,5MiB").
//
// The plan: every policy (none, cheap, selective, full, sublayer) is forecast for the whole job;
// each stage takes, among the policies whose forecast fits its budget, the one with the least
// estimated work (EstimateWork: recomputing costs forward work again in the backward). Stages are
// independent — each has its own allocator and runs its own policy — so choosing per stage is
// choosing for the job. Nothing fits on a stage when even the smallest exceeds its budget; the plan
// then says, per stage, its smallest achievable peak and what dominates it.
//
// Thread-safety: pure functions. Failure: the parsers throw InvalidArgument naming the option,
// the text and what is allowed.
//
// Example:
//   std::vector<int64_t> budget = ParseMemoryBudget("6MiB", /*stages=*/4);   // 4 × 6291456
//   MemoryPlan plan = PlanForBudget(config, budget, forecaster);
//   if (!plan.fits) throw InvalidArgument(plan.Explain(budget));
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/step/memory_replay.h"

namespace sluice {

// "6MiB" → 6291456. `option` names the flag in errors.
int64_t ParseByteSize(std::string_view text, std::string_view option = "--memory-budget");
// One size, or one per stage (`stages` entries), comma-separated; always `stages` entries back.
std::vector<int64_t> ParseMemoryBudget(std::string_view text, int stages);

// The forecast of every stage of the job for `config` (its recompute list included).
using Forecaster = std::function<std::vector<StageMemoryForecast>(const TrainConfig& config)>;

struct StagePlan {
  RecomputePolicy policy = RecomputePolicy::kCheap;
  StageMemoryForecast forecast;  // under that policy
  double extra_work = 0;         // estimated work beyond no recompute: 0.12 = 12% more
  bool fits = false;
  StageMemoryForecast smallest;  // the policy with the lowest forecast (when nothing fits)
  RecomputePolicy smallest_policy = RecomputePolicy::kFull;
};

struct MemoryPlan {
  std::vector<StagePlan> stages;
  bool fits = false;  // every stage
  // The recompute list to train with (TrainConfig::recompute): one policy per stage.
  std::vector<RecomputePolicy> Policies() const;
  // For people: why no plan fits — each stage over budget with its smallest achievable peak,
  // under which policy, and what dominates it.
  std::string Explain(const std::vector<int64_t>& budget) const;
};

MemoryPlan PlanForBudget(const TrainConfig& config, const std::vector<int64_t>& budget,
                         const Forecaster& forecast);

// "6.00 MiB (6291456 B)": exact bytes beside the readable figure.
std::string FormatBudgetBytes(int64_t bytes);

}  // namespace sluice
