// The planner's choices (plan/planner.h), without a command line: which schedule auto picks, that
// a budget gets the least-work recompute policies that fit it, the error that names each stage's
// smallest achievable peak (of the closest schedule under auto, even a few bytes short), that a
// kind the job cannot run is skipped under auto, and that the forecast follows --gc and --mode:
// what a budget is planned with is what the run then holds.
#include "sluice/plan/planner.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "sluice/core/error.h"
#include "sluice/pipeline/memory_forecast.h"
#include "sluice/pipeline/pipeline_engine.h"
#include "sluice/step/memory_budget.h"
#include "sluice/train/trainer.h"

namespace sluice {
namespace {

using pipeline::ScheduleKind;

constexpr RecomputePolicy kPolicies[] = {RecomputePolicy::kNone, RecomputePolicy::kCheap,
                                         RecomputePolicy::kSelective, RecomputePolicy::kFull,
                                         RecomputePolicy::kSublayer};

// A small GPT of the sort task: M micro-batches of one sequence.
TrainConfig Config(int64_t microbatches) {
  TrainConfig c;
  c.gpt = {.vocab = 0, .seq = 0, .layers = 4, .heads = 2, .dim = 32};
  c.steps = 2;
  c.batch = microbatches;
  c.microbatches = microbatches;
  c.threads = 1;
  c.eval_every = 0;
  return c;
}

PlanRequest Pipeline(int stages, int64_t microbatches,
                     ScheduleKind kind = ScheduleKind::kOneFOneB) {
  return {.config = Config(microbatches),
          .pipeline = true,
          .pipe = {
              .stages = stages, .schedule = kind, .partition = pipeline::PartitionKind::kBalanced}};
}

// The plan of one kind, or nullopt when the job cannot run it.
std::optional<PlanChoice> TryPlan(PlanRequest r, ScheduleKind kind) {
  r.automatic = false;
  r.pipe.schedule = kind;
  try {
    return ChoosePlan(r);
  } catch (const InvalidArgument&) {
    return std::nullopt;
  }
}

// Per stage, the least any policy's forecast peaks at under `kind`.
std::vector<int64_t> SmallestPeaks(const PlanRequest& r, ScheduleKind kind) {
  const Job job = MakeJob(r.config);
  std::vector<int64_t> smallest;
  for (RecomputePolicy policy : kPolicies) {
    TrainConfig c = r.config;
    c.recompute = {policy};
    const std::vector<StageMemoryForecast> f = ForecastJob(r, job, c, kind);
    smallest.resize(f.size(), INT64_MAX);
    for (size_t s = 0; s < f.size(); ++s) {
      smallest[s] = std::min(smallest[s], f[s].peak_reserved_bytes);
    }
  }
  return smallest;
}

std::string Caught(const PlanRequest& r) {
  try {
    ChoosePlan(r);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  ADD_FAILURE() << "the plan was accepted";
  return "";
}

TEST(Planner, AutoPicksTheFastestKindTheJobCanRun) {
  PlanRequest r = Pipeline(4, 8);
  r.automatic = true;
  const PlanChoice chosen = ChoosePlan(r);
  EXPECT_TRUE(chosen.plan.fits);
  // Every kind the job runs, planned alone: none is faster; the first of the fastest wins.
  std::optional<ScheduleKind> fastest;
  double best = 0;
  for (const auto& [kind, name] : pipeline::kScheduleKindNames) {
    const std::optional<PlanChoice> c = TryPlan(r, kind);
    if (!c) continue;
    EXPECT_GE(c->step_time, chosen.step_time) << name;
    if (!fastest || c->step_time < best) {
      fastest = kind;
      best = c->step_time;
    }
  }
  ASSERT_TRUE(fastest.has_value());
  EXPECT_EQ(pipeline::ScheduleKindName(chosen.schedule), pipeline::ScheduleKindName(*fastest));
  // Without a budget nothing recomputes more, so the unit-cost makespan decides: not 1F1B, whose
  // bubble a zero-bubble schedule fills.
  EXPECT_LT(chosen.step_time, TryPlan(r, ScheduleKind::kOneFOneB)->step_time);
  EXPECT_LT(chosen.bubble, TryPlan(r, ScheduleKind::kOneFOneB)->bubble);
}

// --post-validate: steps interlock, so auto weighs each kind's steady-state step instead of its
// synchronous one — a zero-bubble kind (zb-h2 or zb-v, steady bubble 0) wins — and every stage's
// forecast holds the rollback copy (its parameters and optimizer state once more) and what
// interlocked steps keep for a redo (the previous step's gradients and norm partials).
TEST(Planner, UnderPostValidationAutoWeighsTheSteadyStateAndTheRollbackCopy) {
  PlanRequest r = Pipeline(4, 8);
  r.automatic = true;
  const PlanChoice sync = ChoosePlan(r);
  r.pipe.post_validate = true;
  const PlanChoice chosen = ChoosePlan(r);
  EXPECT_TRUE(chosen.schedule == ScheduleKind::kZeroBubbleH2 ||
              chosen.schedule == ScheduleKind::kZeroBubbleV)
      << pipeline::ScheduleKindName(chosen.schedule);
  EXPECT_EQ(chosen.bubble, 0.0);
  EXPECT_LT(chosen.step_time, sync.step_time);
  r.automatic = false;
  r.pipe.schedule = chosen.schedule;
  const PlanChoice pv = ChoosePlan(r);
  r.pipe.post_validate = false;
  const PlanChoice without = ChoosePlan(r);
  for (size_t s = 0; s < pv.plan.stages.size(); ++s) {
    const StageMemoryForecast& f = pv.plan.stages[s].forecast;
    EXPECT_GT(f.rollback_bytes, 0) << "stage " << s;
    EXPECT_GT(f.interlock_bytes, 0) << "stage " << s;
    EXPECT_EQ(f.peak_allocated_bytes, without.plan.stages[s].forecast.peak_allocated_bytes +
                                          f.rollback_bytes + f.interlock_bytes)
        << "stage " << s;
  }
}

// Under auto, --post-validate is allowed, not required: each kind keeps it only where its plan
// fits and its steady-state step is strictly shorter than its synchronous step. Unbudgeted, a
// zero-bubble kind wins with it; under a budget that the chosen kind's synchronous plan just fits,
// the rule still holds of whatever auto picks.
TEST(Planner, AutoKeepsPostValidationOnlyWhereItFitsAndIsFaster) {
  PlanRequest r = Pipeline(4, 8);
  r.automatic = true;
  r.pipe.post_validate = true;
  const PlanChoice free = ChoosePlan(r);
  EXPECT_TRUE(free.post_validate);
  EXPECT_EQ(free.plan.stages.front().forecast.rollback_bytes > 0, true);
  // 1F1B's steady state is its synchronous step: with post-validation it is no faster.
  PlanRequest one = r;
  one.pipe.schedule = ScheduleKind::kOneFOneB;
  const std::optional<PlanChoice> with = TryPlan(one, ScheduleKind::kOneFOneB);
  one.pipe.post_validate = false;
  const std::optional<PlanChoice> without = TryPlan(one, ScheduleKind::kOneFOneB);
  ASSERT_TRUE(with && without);
  EXPECT_GE(with->step_time, without->step_time);

  // The rule, checked on a choice: post-validated only where it fits and is faster.
  const auto check = [&](const PlanRequest& req, const PlanChoice& c) {
    PlanRequest plain = req;
    plain.pipe.post_validate = false;
    const std::optional<PlanChoice> pv = TryPlan(req, c.schedule);
    const std::optional<PlanChoice> sync = TryPlan(plain, c.schedule);
    ASSERT_TRUE(pv && sync);
    EXPECT_TRUE(c.plan.fits);
    if (c.post_validate) {
      EXPECT_TRUE(pv->plan.fits);
      EXPECT_LT(pv->step_time, sync->step_time);
      EXPECT_EQ(c.step_time, pv->step_time);
    } else {
      EXPECT_TRUE(!pv->plan.fits || pv->step_time >= sync->step_time);
      EXPECT_EQ(c.step_time, sync->step_time);
    }
  };
  check(r, free);
  PlanRequest synchronous = r;
  synchronous.pipe.post_validate = false;
  const std::optional<PlanChoice> sync = TryPlan(synchronous, free.schedule);
  ASSERT_TRUE(sync);
  r.budget.clear();
  for (const StagePlan& p : sync->plan.stages) r.budget.push_back(p.forecast.peak_reserved_bytes);
  r.budget_text = "test";
  const PlanChoice budgeted = ChoosePlan(r);
  check(r, budgeted);
}

TEST(Planner, ABudgetGetsTheLeastWorkPoliciesThatFit) {
  PlanRequest r = Pipeline(2, 4);
  r.config.batch = 32;  // micro-batches of 8 sequences: activations that recompute can drop
  r.config.recompute = {RecomputePolicy::kNone};
  const PlanChoice free = ChoosePlan(r);
  int64_t largest = 0;
  for (const StagePlan& p : free.plan.stages) {
    largest = std::max(largest, p.forecast.peak_reserved_bytes);
  }
  r.budget = {largest * 4 / 5, largest * 4 / 5};
  r.budget_text = std::to_string(largest * 4 / 5);
  const PlanChoice budgeted = ChoosePlan(r);
  ASSERT_TRUE(budgeted.plan.fits);
  ASSERT_EQ(budgeted.plan.stages.size(), 2u);
  const Job job = MakeJob(r.config);
  bool recomputes = false;
  for (size_t s = 0; s < 2; ++s) {
    const StagePlan& p = budgeted.plan.stages[s];
    EXPECT_LE(p.forecast.peak_reserved_bytes, r.budget[s]) << "stage " << s;
    recomputes = recomputes || p.policy != RecomputePolicy::kNone;
    // Every policy of less work than the chosen one is over the budget.
    for (RecomputePolicy policy : kPolicies) {
      TrainConfig c = r.config;
      c.recompute = {policy};
      const StageMemoryForecast f = ForecastJob(r, job, c, ScheduleKind::kOneFOneB)[s];
      if (f.work < p.forecast.work) {
        EXPECT_GT(f.peak_reserved_bytes, r.budget[s]) << "stage " << s << ": " << Name(policy);
      }
    }
  }
  EXPECT_TRUE(recomputes) << "4/5 of the unbudgeted peak needs some recompute";
  // The policies train: the per-stage list the run is given.
  EXPECT_EQ(budgeted.plan.Policies().size(), 2u);
}

TEST(Planner, NothingFitsNamesEveryStagesSmallestPeak) {
  PlanRequest r = Pipeline(2, 4);
  r.budget = {1024, 1024};
  r.budget_text = "1KiB";
  const std::string message = Caught(r);
  EXPECT_NE(message.find("--memory-budget 1KiB: no recompute policy fits every stage"),
            std::string::npos)
      << message;
  const std::vector<int64_t> smallest = SmallestPeaks(r, ScheduleKind::kOneFOneB);
  for (size_t s = 0; s < smallest.size(); ++s) {
    EXPECT_NE(message.find(fmt::format("stage {}: budget {}, smallest achievable peak {}", s,
                                       FormatBudgetBytes(1024), FormatBudgetBytes(smallest[s]))),
              std::string::npos)
        << message;
  }
}

// Regression: under auto the error named the first kind's (gpipe's) smallest peaks, not those of
// the kind that comes closest — a budget a few bytes short of what fits named a peak far above it.
TEST(Planner, AFewBytesShortUnderAutoNamesTheClosestSchedule) {
  PlanRequest r = Pipeline(4, 8);
  r.automatic = true;
  std::optional<ScheduleKind> closest;
  int64_t least = INT64_MAX;
  for (const auto& [kind, name] : pipeline::kScheduleKindNames) {
    if (!TryPlan(r, kind)) continue;
    const std::vector<int64_t> smallest = SmallestPeaks(r, kind);
    const int64_t worst = *std::ranges::max_element(smallest);
    if (worst < least) {
      least = worst;
      closest = kind;
    }
  }
  ASSERT_TRUE(closest.has_value());
  ASSERT_NE(pipeline::ScheduleKindName(*closest), "gpipe") << "gpipe, first, must not be closest";
  const int64_t budget = least - 4;  // 4 bytes short of the least achievable worst stage
  r.budget.assign(4, budget);
  r.budget_text = std::to_string(budget);
  const std::string message = Caught(r);
  EXPECT_NE(message.find(fmt::format("no recompute policy and schedule fits every stage (the "
                                     "closest, {})",
                                     pipeline::ScheduleKindName(*closest))),
            std::string::npos)
      << message;
  EXPECT_NE(message.find(fmt::format("smallest achievable peak {}", FormatBudgetBytes(least))),
            std::string::npos)
      << message;
  // And at that peak itself the closest kind fits.
  r.budget.assign(4, least);
  EXPECT_TRUE(ChoosePlan(r).plan.fits);
}

TEST(Planner, AKindTheJobCannotRunIsSkippedUnderAutoAndRefusedByName) {
  // M = 4 < 2P − 1 = 7: zb-v cannot run 4 stages.
  PlanRequest r = Pipeline(4, 4, ScheduleKind::kZeroBubbleV);
  EXPECT_THROW(ChoosePlan(r), InvalidArgument);
  r.automatic = true;
  const PlanChoice chosen = ChoosePlan(r);
  EXPECT_NE(chosen.schedule, ScheduleKind::kZeroBubbleV);
  EXPECT_TRUE(chosen.plan.fits);
  // Auto on one stage is a mistake named as such.
  PlanRequest single{.config = Config(4), .automatic = true};
  EXPECT_NE(Caught(single).find("--schedule auto chooses a pipeline schedule"), std::string::npos);
}

// The peak the single-stage engine measures over a config's steps.
int64_t MeasuredSingleStage(const TrainConfig& config) {
  Trainer trainer(config);
  int64_t peak = 0;
  for (int64_t s = 0; s < config.steps; ++s) {
    peak = std::max(peak, trainer.Step().peak_allocated_bytes);
  }
  return peak;
}

// Regression: the forecast replayed sync GC in trace mode whatever --gc and --mode said, so a
// budget planned for `--gc none` was exceeded by the run it planned.
TEST(Planner, TheForecastFollowsGcAndMode) {
  PlanRequest r{.config = Config(2)};
  const int64_t sync = ChoosePlan(r).plan.stages[0].forecast.peak_allocated_bytes;
  EXPECT_EQ(sync, MeasuredSingleStage(r.config));

  r.config.gc = GcMode::kNone;
  const int64_t none = ChoosePlan(r).plan.stages[0].forecast.peak_allocated_bytes;
  EXPECT_GT(none, sync) << "gc none holds every value of a run to its end";
  EXPECT_EQ(none, MeasuredSingleStage(r.config));

  // Parallel mode and async GC: frees thread timing decides, bounded by holding them to the end.
  for (auto [gc, mode] :
       {std::pair{GcMode::kAsync, RunMode::kTrace}, std::pair{GcMode::kSync, RunMode::kParallel}}) {
    r.config.gc = gc;
    r.config.mode = mode;
    const int64_t bound = ChoosePlan(r).plan.stages[0].forecast.peak_allocated_bytes;
    EXPECT_EQ(bound, none) << Name(gc) << " " << Name(mode);
    EXPECT_LE(MeasuredSingleStage(r.config), bound) << Name(gc) << " " << Name(mode);
  }
}

TEST(Planner, APipelineForecastFollowsGcNone) {
  PlanRequest r = Pipeline(2, 4);
  const PlanChoice sync = ChoosePlan(r);
  r.config.gc = GcMode::kNone;
  const PlanChoice none = ChoosePlan(r);
  ASSERT_EQ(none.plan.stages.size(), 2u);
  // The measured peaks of the run under gc none lie within its own forecast.
  const pipeline::PipelineEngine* engine = nullptr;
  Trainer trainer(r.config, [&](const EngineContext& ctx) -> std::unique_ptr<StepEngine> {
    auto e = std::make_unique<pipeline::PipelineEngine>(ctx, r.pipe);
    engine = e.get();
    return e;
  });
  for (int64_t s = 0; s < r.config.steps; ++s) trainer.Step();
  ASSERT_NE(engine, nullptr);
  for (size_t s = 0; s < 2; ++s) {
    const int64_t forecast = none.plan.stages[s].forecast.peak_allocated_bytes;
    EXPECT_GT(forecast, sync.plan.stages[s].forecast.peak_allocated_bytes) << "stage " << s;
    EXPECT_LE(engine->reports()[s].peak_allocated_bytes, forecast) << "stage " << s;
  }
}

}  // namespace
}  // namespace sluice
