// `sluice train`: trains a GPT or an MLP, on one stage or split into pipeline stages (--stages,
// --schedule), with progress on the terminal and JSON-lines metrics. Every bad option or
// configuration is an error that says what to change. `sluice plan`: the memory forecast of the
// same options, and the recompute policies (and schedule) that --memory-budget would train with.
// Their shared options are cli/train_options.h's; `sluice simulate` is cli/simulate_command.cc.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sluice/cli/commands.h"
#include "sluice/cli/file_checks.h"
#include "sluice/cli/train_options.h"
#include "sluice/comm/mpi.h"
#include "sluice/core/enum_names.h"
#include "sluice/core/error.h"
#include "sluice/exec/analysis.h"
#include "sluice/pipeline/memory_forecast.h"
#include "sluice/pipeline/pipeline_engine.h"
#include "sluice/schedule/schedule_analysis.h"
#include "sluice/schedule/step_simulator.h"
#include "sluice/step/config_checks.h"
#include "sluice/step/memory_budget.h"
#include "sluice/train/stop_signals.h"
#include "sluice/train/trainer.h"

namespace sluice::cli {

namespace {

std::string FormatDuration(double seconds) {
  int s = static_cast<int>(seconds + 0.5);
  return s >= 60 ? fmt::format("{}m{:02}s", s / 60, s % 60) : fmt::format("{}s", s);
}

std::string FormatRate(double tokens_per_s) {
  return tokens_per_s >= 1e3 ? fmt::format("{:.1f}k tok/s", tokens_per_s / 1e3)
                             : fmt::format("{:.0f} tok/s", tokens_per_s);
}

// A progress bar redrawn in place on a terminal; plain periodic lines otherwise (logs, CI).
class Progress {
 public:
  Progress(int64_t first_step, int64_t steps, bool quiet)
      : steps_(steps),
        first_(first_step),
        quiet_(quiet),
        tty_(::isatty(STDERR_FILENO) == 1),
        every_(std::max<int64_t>(1, steps / 20)) {}

  void OnStep(const StepRecord& r) {
    if (quiet_) return;
    elapsed_ += r.step_ms / 1000.0;
    const double per_step = elapsed_ / static_cast<double>(r.step - first_);
    const double eta = per_step * static_cast<double>(steps_ - r.step);
    if (tty_) {
      const int width = 24;
      const int filled = static_cast<int>(width * r.step / steps_);
      fmt::print(stderr, "\r  step {:>{}}/{} [{}{}] loss {:.4f} | {} | eta {}   ", r.step,
                 std::to_string(steps_).size(), steps_, std::string(filled, '#'),
                 std::string(width - filled, '.'), r.loss, FormatRate(r.tokens_per_s),
                 FormatDuration(eta));
      if (r.step == steps_) fmt::print(stderr, "\n");
    } else if (r.step % every_ == 0 || r.step == steps_) {
      fmt::print(stderr, "  step {}/{}  loss {:.4f}  lr {:.2e}  {}  {:.1f} ms/step\n", r.step,
                 steps_, r.loss, r.lr, FormatRate(r.tokens_per_s), r.step_ms);
    }
  }

  // Ends a progress bar left mid-line (a run stopped early).
  void EndLine() {
    if (!quiet_ && tty_) fmt::print(stderr, "\n");
  }

  void OnEval(const EvalRecord& e) {
    if (quiet_) return;
    if (tty_ && e.step != steps_) fmt::print(stderr, "\n");
    if (e.accuracy >= 0) {
      fmt::print(stderr, "  eval at step {}: val_loss {:.4f}, accuracy {:.1f}%\n", e.step,
                 e.val_loss, 100 * e.accuracy);
    } else {
      fmt::print(stderr, "  eval at step {}: val_loss {:.4f}\n", e.step, e.val_loss);
    }
  }

 private:
  int64_t steps_, first_;
  bool quiet_, tty_;
  int64_t every_;
  double elapsed_ = 0;
};

int RunTrain(TrainArgs& a);

// `--comm mpi`: one rank per process under mpirun. World rank w runs stage w mod P of replica
// w div P. Any error on any rank ends the whole job (MPI_Abort) with the rank and the message.
int RunTrainMpi(TrainArgs& a) {
  MpiWorld mpi(MpiWorldOptions{.timeout = a.pipe.timeout});
  MpiCommunicator& world = mpi.world();
  try {
    pipeline::MpiJob job(world, a.pipe.stages, a.data_parallel);
    a.pipe.distributed = job.distributed();
    a.quiet = a.quiet || world.rank() != 0;  // the leader reports for everyone
    return RunTrain(a);
  } catch (const std::exception& e) {
    world.Abort(e.what());  // ends every process of the job
    throw;
  }
}

// Every stage's forecast for `config` under schedule `kind` (single stage without a pipeline).
std::vector<StageMemoryForecast> ForecastJob(const TrainArgs& a, const Job& job,
                                             const TrainConfig& config,
                                             pipeline::ScheduleKind kind) {
  if (!a.pipeline) return {ForecastSingleStage(job.model, config)};
  const EngineContext ctx{.config = config, .task = *job.task, .model = job.model, .threads = 1};
  pipeline::PipelineOptions options = a.pipe;
  options.schedule = kind;
  return pipeline::ForecastPipeline(ctx, options, a.data_parallel);
}

// What `sluice plan` prints and `--memory-budget` / `--schedule auto` train with.
struct MemoryPlanChoice {
  bool pipeline = false;
  pipeline::ScheduleKind schedule = pipeline::ScheduleKind::kOneFOneB;
  double bubble = 0;            // the schedule's, at unit cost (schedule_analysis.h)
  std::vector<int64_t> budget;  // per stage; empty: none given
  MemoryPlan plan;

  std::string Describe(const TrainArgs& a) const {
    std::string out = fmt::format(
        "memory plan: {} on {}, batch {} in {} micro-batches, {}{}\n", a.config.ModelName(),
        a.config.data, a.config.batch, a.config.microbatches,
        pipeline ? fmt::format("{} stages, {} (bubble {:.1f}% at unit cost)", plan.stages.size(),
                               pipeline::ScheduleKindName(schedule), 100 * bubble)
                 : std::string("one stage"),
        budget.empty() ? std::string() : fmt::format(", budget {}", a.memory_budget));
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
    if (pipeline) {
      out +=
          "  a pipeline stage's measured peak lies between its peak above and, if every send "
          "completes at once, ";
      for (size_t s = 0; s < plan.stages.size(); ++s) {
        out +=
            fmt::format("{}{}", s ? " / " : "", plan.stages[s].forecast.least_peak_allocated_bytes);
      }
      out += " B\n";
    }
    if (!budget.empty()) {
      for (size_t s = 0; s < plan.stages.size(); ++s) {
        const StagePlan& p = plan.stages[s];
        out += fmt::format("  stage {}: {} of {} ({:.0f}%), recompute {}: {:+.0f}% work\n", s,
                           FormatBytes(p.forecast.peak_allocated_bytes), FormatBytes(budget[s]),
                           100.0 * static_cast<double>(p.forecast.peak_allocated_bytes) /
                               static_cast<double>(budget[s]),
                           Name(p.policy), 100 * p.extra_work);
      }
    }
    return out;
  }

  nlohmann::json Json(const TrainArgs& a) const {
    nlohmann::json stages = nlohmann::json::array();
    for (size_t s = 0; s < plan.stages.size(); ++s) {
      const StagePlan& p = plan.stages[s];
      nlohmann::json breakdown;
      for (const auto& [use, name] : kMemoryUseNames) breakdown[name] = p.forecast.at_peak[use];
      stages.push_back(
          {{"stage", s},
           {"recompute", Name(p.policy)},
           {"predicted_peak_allocated_bytes", p.forecast.peak_allocated_bytes},
           {"least_peak_allocated_bytes", p.forecast.least_peak_allocated_bytes},
           {"persistent_bytes", p.forecast.persistent_bytes},
           {"breakdown", breakdown},
           {"peak_at", p.forecast.peak_phase},
           {"peak_instruction", p.forecast.peak_instruction},
           {"extra_work", p.extra_work},
           {"estimated_work", p.forecast.work},
           {"budget_bytes", budget.empty() ? nlohmann::json(nullptr) : nlohmann::json(budget[s])},
           {"fits", p.fits}});
    }
    return {{"model", a.config.ModelName()},
            {"schedule", pipeline ? nlohmann::json(pipeline::ScheduleKindName(schedule))
                                  : nlohmann::json(nullptr)},
            {"bubble", bubble},
            {"fits", plan.fits},
            {"stages", stages}};
  }
};

// The plan for a's job: its forecast; with --memory-budget the recompute policies that fit; with
// --schedule auto the schedule (every kind the job can run) with the least estimated step time
// — the unit-cost makespan times the largest stage's extra work — among those that fit.
// Throws InvalidArgument when nothing fits, naming each stage's smallest achievable peak.
MemoryPlanChoice ChooseMemoryPlan(const TrainArgs& a) {
  const bool automatic = a.pipe_schedule == "auto";
  if (a.recompute_given && !a.memory_budget.empty()) {
    throw InvalidArgument(
        "--recompute and --memory-budget both choose the recompute policy: give one of them");
  }
  if (automatic && a.pipe.stages < 2) {
    throw InvalidArgument("--schedule auto chooses a pipeline schedule: give --stages P > 1 too");
  }
  const int stages = a.pipeline ? a.pipe.stages : 1;
  const Job job = MakeJob(a.config);
  std::vector<int64_t> budget;
  if (!a.memory_budget.empty()) budget = ParseMemoryBudget(a.memory_budget, stages);

  std::vector<pipeline::ScheduleKind> kinds = {a.pipe.schedule};
  if (automatic) {
    kinds.clear();
    for (const auto& [kind, name] : pipeline::kScheduleKindNames) kinds.push_back(kind);
  }
  std::optional<MemoryPlanChoice> best, closest;
  double best_time = 0;
  std::string refused;
  for (pipeline::ScheduleKind kind : kinds) {
    MemoryPlanChoice choice;
    choice.pipeline = a.pipeline;
    choice.schedule = kind;
    choice.budget = budget;
    double makespan = 1;
    try {
      auto forecast = [&](const TrainConfig& c) { return ForecastJob(a, job, c, kind); };
      if (budget.empty()) {
        const std::vector<StageMemoryForecast> f = forecast(a.config);
        choice.plan.fits = true;
        for (size_t s = 0; s < f.size(); ++s) {
          choice.plan.stages.push_back({.policy = RecomputeForStage(a.config, static_cast<int>(s),
                                                                    static_cast<int>(f.size())),
                                        .forecast = f[s],
                                        .fits = true});
        }
      } else {
        choice.plan = PlanForBudget(a.config, budget, forecast);
      }
      if (a.pipeline) {
        const pipeline::Schedule schedule =
            pipeline::MakeSchedule({.kind = kind,
                                    .stages = a.pipe.stages,
                                    .micro_batches = static_cast<int>(a.config.microbatches),
                                    .chunks = a.pipe.chunks,
                                    .post_receives_ahead = a.pipe.post_receives_ahead});
        const pipeline::Simulation sim = pipeline::Simulate(schedule);
        // Unit cost is per action, and an action of a rank with V chunks does 1/V of its work.
        makespan = sim.makespan / schedule.chunks;
        choice.bubble = sim.bubble;
      }
    } catch (const Error& e) {
      if (!automatic) throw;
      refused += fmt::format("\n  {}: {}", pipeline::ScheduleKindName(kind), e.what());
      continue;
    }
    double extra = 0;
    for (const StagePlan& p : choice.plan.stages) extra = std::max(extra, p.extra_work);
    const double time = makespan * (1 + extra);
    if (choice.plan.fits && (!best || time < best_time)) {
      best = choice;
      best_time = time;
    }
    if (!closest) closest = choice;
  }
  if (best) return *best;
  if (!closest) throw InvalidArgument("--schedule auto: no schedule can run this job:" + refused);
  throw InvalidArgument(fmt::format("--memory-budget {}: no recompute policy{} fits every stage:{}",
                                    a.memory_budget, automatic ? " and schedule" : "",
                                    closest->plan.Explain(budget)));
}

int RunTrain(TrainArgs& a) {
  Configure(a);
  TrainConfig& c = a.config;
  CheckTrainFiles(c, a.pipe.trace_path, a.pipe.profile_path);
  // "sort" names the GPT's built-in task, even where a file of that name lies (a warning, printed
  // under --quiet too).
  if (c.model != "mlp" && c.data == "sort" && std::filesystem::exists(c.data)) {
    fmt::print(stderr,
               "sluice: warning: --data sort is the built-in sort task, not the file 'sort' here: "
               "give --data ./sort to train on the file\n");
  }
  if (!a.memory_budget.empty() || a.pipe_schedule == "auto") {
    const MemoryPlanChoice choice = ChooseMemoryPlan(a);
    if (!a.quiet) fmt::print(stderr, "{}", choice.Describe(a));
    c.recompute = choice.plan.Policies();
    c.memory_budget = choice.budget;
    a.pipe.schedule = choice.schedule;
  }
  EngineFactory engine;
  if (a.pipeline) engine = pipeline::PipelineEngineFactory(a.pipe);
  // From here a first SIGINT or SIGTERM stops training after the current step, with a checkpoint.
  const StopSignals signals;
  Trainer trainer(c, engine);
  if (trainer.engine().leader()) {  // warnings, printed under --quiet too
    for (const std::string& w : trainer.warnings()) fmt::print(stderr, "sluice: warning: {}\n", w);
  }
  if (!a.quiet) {
    fmt::print(stderr,
               "sluice train: {} on {}, {} steps of batch {} ({} micro-batches), {} from step {}\n",
               c.ModelName(), c.data, c.steps, c.batch, c.microbatches, a.optimizer,
               trainer.step());
    if (std::string d = trainer.engine().Describe(); !d.empty()) fmt::print(stderr, "{}\n", d);
  }
  Progress progress(trainer.step(), c.steps, a.quiet);
  const bool leader = trainer.engine().leader();
  int64_t skipped = 0;
  TrainSummary s = trainer.Run(
      [&](const StepRecord& r) {
        if (r.skipped && leader) {  // a warning, printed under --quiet too
          fmt::print(stderr,
                     "sluice: warning: step {}: the loss is {} and the gradient norm {}; its "
                     "update is skipped ({} of --skip-nonfinite {})\n",
                     r.step, r.loss, r.grad_norm, ++skipped, c.skip_nonfinite);
        }
        progress.OnStep(r);
      },
      [&](const EvalRecord& e) { progress.OnEval(e); }, [&] { return signals.received(); });
  // A side output that failed did not stop training; the run ends with its error once the model
  // is saved (Trainer::Run has written the checkpoints).
  auto fail_on_lost_outputs = [&] {
    if (s.output_failures.empty()) return;
    const std::string saved = !s.stop_checkpoint.empty() ? s.stop_checkpoint
                              : !c.save_path.empty()     ? c.save_path
                                                         : std::string();
    throw IoError(fmt::format("{}; training itself went on to step {}{}",
                              fmt::join(s.output_failures, "; also, "), s.steps,
                              saved.empty()
                                  ? std::string(" (no --save was given, so its state is not kept)")
                                  : fmt::format(" and its state is saved to '{}'", saved)));
  };
  if (s.stop_signal != 0) {
    // Printed under --quiet too: the run did not do what was asked, and the user must know where
    // its state went.
    if (leader) {
      progress.EndLine();
      const std::string where =
          c.save_path.empty() ? fmt::format(" (no --save was given: saved {})",
                                            c.metrics_path.empty() ? "in the working directory"
                                                                   : "beside the --metrics file")
                              : std::string();
      if (s.stop_checkpoint.empty()) {
        fmt::print(stderr, "sluice: stopped by {} before the first step; nothing new to save\n",
                   SignalName(s.stop_signal));
      } else {
        fmt::print(stderr,
                   "sluice: stopped by {} after step {} of {}; checkpoint saved to '{}'{}: "
                   "continue with --resume {}\n",
                   SignalName(s.stop_signal), s.steps, c.steps, s.stop_checkpoint, where,
                   s.stop_checkpoint);
      }
    }
    fail_on_lost_outputs();
    return 128 + s.stop_signal;  // as a shell reports a process the signal ended
  }
  fail_on_lost_outputs();
  if (!a.quiet) {
    fmt::print(stderr, "done: {} steps in {}, {}, peak tensor memory {:.2f} MiB, {} parameters\n",
               s.steps, FormatDuration(s.wall_s), FormatRate(s.tokens_per_s),
               s.peak_allocated_bytes / 1048576.0, s.params);
    for (const std::string& line : trainer.engine().ReportLines())
      fmt::print(stderr, "  {}\n", line);
    if (s.last_eval.accuracy >= 0)
      fmt::print(stderr, "held-out accuracy: {:.1f}%\n", 100 * s.last_eval.accuracy);
    if (!c.metrics_path.empty()) fmt::print(stderr, "metrics: {}\n", c.metrics_path);
    if (!c.save_path.empty()) fmt::print(stderr, "checkpoint: {}\n", c.save_path);
  }
  return 0;
}

}  // namespace

CommandRunner SetupTrainCommand(CLI::App& sub) {
  TrainOptions options = AddTrainOptions(sub);
  return [options] {
    options.finish();
    TrainArgs* a = options.args.get();
    if (a->comm == "mpi") return RunTrainMpi(*a);
    if (a->comm != "local")
      throw InvalidArgument(fmt::format("--comm must be local or mpi, not '{}'", a->comm));
    if (a->data_parallel != 1) {
      throw InvalidArgument(
          "--data-parallel runs pipeline replicas as MPI processes: add --comm mpi and launch with "
          "mpirun");
    }
    return RunTrain(*a);
  };
}

CommandRunner SetupPlanCommand(CLI::App& sub) {
  TrainOptions options = AddTrainOptions(sub);
  sub.add_option("--format", options.args->format, "table or json")
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();
  return [options] {
    options.finish();
    TrainArgs& a = *options.args;
    Configure(a);
    const MemoryPlanChoice choice = ChooseMemoryPlan(a);
    if (a.format == "json") {
      fmt::print("{}\n", choice.Json(a).dump(2));
    } else {
      fmt::print("{}", choice.Describe(a));
    }
    return 0;
  };
}

}  // namespace sluice::cli
