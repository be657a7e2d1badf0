#include "sluice/plan/planner.h"

#include <algorithm>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sluice/core/error.h"
#include "sluice/pipeline/memory_forecast.h"
#include "sluice/schedule/schedule_analysis.h"
#include "sluice/schedule/steady_state.h"
#include "sluice/step/config_checks.h"
#include "sluice/step/program_task.h"
#include "sluice/step/stage_program.h"

namespace sluice {

namespace {

// How far the plan is from fitting: the most any stage's smallest achievable peak exceeds its
// budget (≤ 0 when it fits).
int64_t Overshoot(const MemoryPlan& plan, const std::vector<int64_t>& budget) {
  int64_t worst = INT64_MIN;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    const StagePlan& p = plan.stages[s];
    const int64_t peak = p.fits ? p.forecast.peak_reserved_bytes : p.smallest.peak_reserved_bytes;
    worst = std::max(worst, peak - budget[s]);
  }
  return worst;
}

// The plan of one schedule kind; throws what the forecast or the schedule throws.
PlanChoice PlanKind(const PlanRequest& r, const Job& job, pipeline::ScheduleKind kind) {
  PlanChoice choice;
  choice.pipeline = r.pipeline;
  choice.schedule = kind;
  choice.budget = r.budget;
  choice.post_validate = r.pipeline && r.pipe.post_validate;
  auto forecast = [&](const TrainConfig& c) { return ForecastJob(r, job, c, kind); };
  if (r.budget.empty()) {
    const std::vector<StageMemoryForecast> f = forecast(r.config);
    choice.plan.fits = true;
    for (size_t s = 0; s < f.size(); ++s) {
      choice.plan.stages.push_back(
          {.policy = RecomputeForStage(r.config, static_cast<int>(s), static_cast<int>(f.size())),
           .forecast = f[s],
           .fits = true});
    }
  } else {
    choice.plan = PlanForBudget(r.config, r.budget, forecast);
  }
  double makespan = 1;
  if (r.pipeline) {
    pipeline::PipelineOptions options = r.pipe;
    options.schedule = kind;
    const pipeline::Schedule schedule =
        pipeline::MakeSchedule(pipeline::ScheduleOptionsOf(options, r.config.microbatches));
    // Unit cost is per action, and an action of a rank with V chunks does 1/V of its work.
    if (r.pipe.post_validate) {  // steps interlock: each costs the steady state's period
      const pipeline::SteadyState steady =
          pipeline::AnalyseSteadyState(schedule, {}, pipeline::CommMode::kAsync, true);
      makespan = steady.period / schedule.chunks;
      choice.bubble = steady.bubble;
    } else {
      const pipeline::Simulation sim = pipeline::Simulate(schedule);
      makespan = sim.makespan / schedule.chunks;
      choice.bubble = sim.bubble;
    }
  }
  double extra = 0;
  for (const StagePlan& p : choice.plan.stages) extra = std::max(extra, p.extra_work);
  choice.step_time = makespan * (1 + extra);
  return choice;
}

// Lists the tensors live at each stage's peak of `choice` (its policies and schedule).
void Explain(PlanRequest r, const Job& job, PlanChoice& choice) {
  r.pipe.post_validate = choice.post_validate;
  TrainConfig config = r.config;
  config.recompute = choice.plan.Policies();
  const std::vector<StageMemoryForecast> f =
      ForecastJob(r, job, config, choice.schedule, /*explain=*/true);
  SLUICE_CHECK(f.size() == choice.plan.stages.size(), "{} stages explained of {}", f.size(),
               choice.plan.stages.size());
  for (size_t s = 0; s < f.size(); ++s) {
    StageMemoryForecast& chosen = choice.plan.stages[s].forecast;
    SLUICE_CHECK(f[s].peak_allocated_bytes == chosen.peak_allocated_bytes,
                 "stage {} explained at {} bytes, planned at {}", s, f[s].peak_allocated_bytes,
                 chosen.peak_allocated_bytes);
    chosen.live_at_peak = f[s].live_at_peak;
  }
}

// When no policy fits at the job's micro-batch count: the fewest micro-batches above it, dividing
// the batch, at which some policy does (each micro-batch smaller, so are its activations), from
// the same forecast; as the sentence the refusal ends with, or empty when no split fits (GPipe
// keeps every micro-batch in flight, so splitting further saves nothing there). The job's task is
// reused (the data is not read again); its model is rebuilt per count and restored.
std::string MicroBatchesThatFit(const PlanRequest& request, Job& job, pipeline::ScheduleKind kind) {
  const int64_t batch = request.config.batch;
  Model original = job.model;
  std::string found;
  for (int64_t m = request.config.microbatches + 1; m <= batch && found.empty(); ++m) {
    if (batch % m != 0) continue;
    PlanRequest r = request;
    r.config.microbatches = m;
    try {
      ValidateTrainConfig(r.config);
      job.model = job.task->BuildTrain(batch / m);
      const PlanChoice c = PlanKind(r, job, kind);
      if (!c.plan.fits) continue;
      std::vector<std::string> peaks;
      for (const StagePlan& p : c.plan.stages)
        peaks.push_back(fmt::format("{} with --recompute {}",
                                    FormatBudgetBytes(p.forecast.peak_reserved_bytes),
                                    Name(p.policy)));
      found = fmt::format(
          "\n--microbatches {} fits it (batch {} in micro-batches of {}; forecast peak{} {}): "
          "the same batch in smaller micro-batches, gradients accumulated",
          m, batch, batch / m, peaks.size() == 1 ? "" : "s", fmt::join(peaks, ", "));
    } catch (const Error&) {
      continue;  // a count the schedule or the model cannot take
    }
  }
  job.model = std::move(original);
  return found;
}

}  // namespace

Job MakeJob(const TrainConfig& config) {
  ValidateTrainConfig(config);
  Job job;
  job.task = MakeTask(config);
  job.model = job.task->BuildTrain(config.batch / config.microbatches);
  return job;
}

std::vector<StageMemoryForecast> ForecastJob(const PlanRequest& request, const Job& job,
                                             const TrainConfig& config, pipeline::ScheduleKind kind,
                                             bool explain) {
  // The oneDNN scratch the run takes is sized for its threads (planner.h).
  ShareForecastThreads(config.threads,
                       request.pipeline && !request.stage_processes ? request.pipe.stages : 1);
  if (!request.pipeline) return {ForecastSingleStage(job.model, config, explain)};
  const EngineContext ctx{.config = config, .task = *job.task, .model = job.model, .threads = 1};
  pipeline::PipelineOptions options = request.pipe;
  options.schedule = kind;
  return pipeline::ForecastPipeline(ctx, options, request.data_parallel, explain);
}

PlanChoice ChoosePlan(const PlanRequest& request) {
  if (request.automatic && (!request.pipeline || request.pipe.stages < 2)) {
    throw InvalidArgument("--schedule auto chooses a pipeline schedule: give --stages P > 1 too");
  }
  const int stages = request.pipeline ? request.pipe.stages : 1;
  SLUICE_CHECK(request.budget.empty() || std::ssize(request.budget) == stages,
               "a budget of {} stages for a job of {}", request.budget.size(), stages);
  Job job = MakeJob(request.config);

  std::vector<pipeline::ScheduleKind> kinds = {request.pipe.schedule};
  if (request.automatic) {
    kinds.clear();
    for (const auto& [kind, name] : pipeline::kScheduleKindNames) kinds.push_back(kind);
  }
  std::optional<PlanChoice> best, closest;
  std::string refused;
  for (pipeline::ScheduleKind kind : kinds) {
    std::optional<PlanChoice> choice;
    try {
      choice = PlanKind(request, job, kind);
      if (request.automatic && request.pipe.post_validate) {
        // Post-validation allowed: kept only where it fits and its steady state is faster.
        PlanRequest synchronous = request;
        synchronous.pipe.post_validate = false;
        PlanChoice plain = PlanKind(synchronous, job, kind);
        if (!choice->plan.fits || !(choice->step_time < plain.step_time)) choice = plain;
      }
    } catch (const Error& e) {
      if (!request.automatic) throw;
      refused += fmt::format("\n  {}: {}", pipeline::ScheduleKindName(kind), e.what());
      continue;
    }
    if (choice->plan.fits) {
      if (!best || choice->step_time < best->step_time) best = choice;
    } else if (!closest ||
               Overshoot(choice->plan, request.budget) < Overshoot(closest->plan, request.budget)) {
      closest = choice;
    }
  }
  if (best) {
    if (request.explain) Explain(request, job, *best);
    return *best;
  }
  if (!closest) {
    throw InvalidArgument("--schedule auto: no schedule can run this job:" + refused);
  }
  const std::string split = MicroBatchesThatFit(request, job, closest->schedule);
  throw InvalidArgument(fmt::format(
      "--memory-budget {}: no recompute policy{} fits every stage{}:{}{}", request.budget_text,
      request.automatic ? " and schedule" : "",
      request.automatic
          ? fmt::format(" (the closest, {})", pipeline::ScheduleKindName(closest->schedule))
          : std::string(),
      closest->plan.Explain(request.budget),
      !split.empty() ? split
      : request.config.microbatches < request.config.batch
          ? "\nno split of the batch into more micro-batches fits it either"
          : ""));
}

}  // namespace sluice
