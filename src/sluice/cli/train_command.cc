// `sluice train`: trains a GPT or an MLP, on one stage or split into pipeline stages (--stages,
// --schedule), with progress on the terminal and JSON-lines metrics. Every bad option or
// configuration is an error that says what to change. With --memory-budget or --schedule auto
// the planner (plan/planner.h) chooses before training, as `sluice plan` (cli/plan_command.cc)
// shows. The shared options are cli/train_options.h's; `sluice simulate` is
// cli/simulate_command.cc.
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
#include <nlohmann/json.hpp>

#include "sluice/cli/commands.h"
#include "sluice/cli/file_checks.h"
#include "sluice/cli/train_options.h"
#include "sluice/comm/mpi.h"
#include "sluice/core/enum_names.h"
#include "sluice/core/error.h"
#include "sluice/kernels/bf16_probe.h"
#include "sluice/pipeline/mpi_launch.h"
#include "sluice/pipeline/pipeline_engine.h"
#include "sluice/plan/planner.h"
#include "sluice/step/config_checks.h"
#include "sluice/train/stop_signals.h"
#include "sluice/train/trainer.h"

namespace sluice::cli {

namespace {

std::string FormatDuration(double seconds) {
  int s = static_cast<int>(seconds + 0.5);
  return s >= 60 ? fmt::format("{}m{:02}s", s / 60, s % 60) : fmt::format("{}s", s);
}

// "48.2k tok/s" for a language model, "5.8k examples/s" for a classifier on arrays.
std::string FormatRate(double per_s, const Throughput& unit) {
  const std::string_view name = std::string_view(unit.unit) == "tokens" ? "tok" : unit.unit;
  return per_s >= 1e3 ? fmt::format("{:.1f}k {}/s", per_s / 1e3, name)
                      : fmt::format("{:.0f} {}/s", per_s, name);
}

// A progress bar redrawn in place on a terminal; plain periodic lines otherwise (logs, CI).
class Progress {
 public:
  Progress(int64_t first_step, int64_t steps, bool quiet, Throughput unit)
      : unit_(unit),
        steps_(steps),
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
      PrintToStderr("\r  step {:>{}}/{} [{}{}] loss {:.4f} | {} | eta {}   ", r.step,
                    std::to_string(steps_).size(), steps_, std::string(filled, '#'),
                    std::string(width - filled, '.'), r.loss, FormatRate(r.per_s, unit_),
                    FormatDuration(eta));
      if (r.step == steps_) PrintToStderr("\n");
    } else if (r.step % every_ == 0 || r.step == steps_) {
      PrintToStderr("  step {}/{}  loss {:.4f}  lr {:.2e}  {}  {:.1f} ms/step\n", r.step, steps_,
                    r.loss, r.lr, FormatRate(r.per_s, unit_), r.step_ms);
    }
  }

  // Ends a progress bar left mid-line (a run stopped early).
  void EndLine() {
    if (!quiet_ && tty_) PrintToStderr("\n");
  }

  void OnEval(const EvalRecord& e) {
    if (quiet_) return;
    if (tty_ && e.step != steps_) PrintToStderr("\n");
    if (e.accuracy >= 0) {
      PrintToStderr("  eval at step {}: val_loss {:.4f}, accuracy {:.1f}%\n", e.step, e.val_loss,
                    100 * e.accuracy);
    } else {
      PrintToStderr("  eval at step {}: val_loss {:.4f}\n", e.step, e.val_loss);
    }
  }

 private:
  Throughput unit_;
  int64_t steps_, first_;
  bool quiet_, tty_;
  int64_t every_;
  double elapsed_ = 0;
};

int RunTrain(TrainArgs& a);

// `--comm mpi`: one rank per process under mpirun. World rank w runs stage w mod P of replica
// w div P. Any error on any rank ends the whole job (MPI_Abort) with the rank and the message.
int RunTrainMpi(TrainArgs& a, const pipeline::LaunchSettings& launch) {
  MpiWorld mpi(MpiWorldOptions{.timeout = a.pipe.timeout});
  MpiCommunicator& world = mpi.world();
  try {
    pipeline::CheckSameLaunch(world, launch);  // before anything else can differ
    pipeline::MpiJob job(world, a.pipe.stages, a.data_parallel);
    // Every rank says where it runs and how it reaches its peers (one write: lines never mix).
    const std::string placement = pipeline::DescribeRankPlacement(
        mpi.hosts(), world.rank(), a.pipe.stages, a.data_parallel, MpiWorld::TransportSettings());
    PrintToStderr("{}\n", placement);
    a.pipe.distributed = job.distributed();
    a.quiet = a.quiet || world.rank() != 0;  // the leader reports for everyone
    return RunTrain(a);
  } catch (const std::exception& e) {
    world.Abort(e.what());  // ends every process of the job
    throw;
  }
}

int RunTrain(TrainArgs& a) {
  Configure(a);
  TrainConfig& c = a.config;
  CheckTrainFiles(c, a.pipe.trace_path, a.pipe.profile_path);
  // "sort" names the GPT's built-in task, even where a file of that name lies (a warning, printed
  // under --quiet too).
  if (c.model != "mlp" && c.data == "sort" && std::filesystem::exists(c.data)) {
    PrintToStderr(
        "sluice: warning: --data sort is the built-in sort task, not the file 'sort' here: "
        "give --data ./sort to train on the file\n");
  }
  std::vector<StageMemoryForecast> forecast;  // the plan's, when one is made
  if (!a.memory_budget.empty() || a.pipeline_schedule == "auto") {
    const PlanChoice choice = ChoosePlan(MakePlanRequest(a));
    if (!a.quiet) PrintToStderr("{}", DescribePlan(choice, a));
    c.recompute = choice.plan.Policies();
    c.memory_budget = choice.budget;
    a.pipe.schedule = choice.schedule;
    a.pipe.post_validate = choice.post_validate;  // auto may leave it off (planner.h)
    for (const StagePlan& p : choice.plan.stages) forecast.push_back(p.forecast);
  }
  CheckMemoryFits(a, std::move(forecast));  // before anything is allocated
  EngineFactory engine;
  if (a.pipeline) engine = pipeline::PipelineEngineFactory(a.pipe);
  // From here a first SIGINT or SIGTERM stops training after the current step, with a checkpoint.
  const StopSignals signals;
  Trainer trainer(c, engine);
  if (trainer.engine().leader()) {  // warnings, printed under --quiet too
    for (const std::string& w : trainer.warnings()) PrintToStderr("sluice: warning: {}\n", w);
  }
  if (!a.quiet) {
    PrintToStderr(
        "sluice train: {} on {}, {} steps of batch {} ({} micro-batches), {} from step {}\n",
        c.ModelName(), c.data, c.steps, c.batch, c.microbatches, a.optimizer, trainer.step());
    if (std::string d = trainer.engine().Describe(); !d.empty()) PrintToStderr("{}\n", d);
  }
  Progress progress(trainer.step(), c.steps, a.quiet, trainer.throughput());
  const bool leader = trainer.engine().leader();
  int64_t skipped = 0;
  TrainSummary s = trainer.Run(
      [&](const StepRecord& r) {
        if (r.skipped && leader) {  // a warning, printed under --quiet too
          PrintToStderr(
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
      if (s.stopped_ahead) {
        PrintToStderr(
            "sluice: {} came while step {} ran ahead of step {} (--post-validate "
            "interlocks consecutive steps): step {} was finished and validated first\n",
            SignalName(s.stop_signal), s.steps, s.steps - 1, s.steps);
      }
      const std::string where =
          c.save_path.empty() ? fmt::format(" (no --save was given: saved {})",
                                            c.metrics_path.empty() ? "in the working directory"
                                                                   : "beside the --metrics file")
                              : std::string();
      if (s.stop_checkpoint.empty()) {
        PrintToStderr("sluice: stopped by {} before the first step; nothing new to save\n",
                      SignalName(s.stop_signal));
      } else {
        PrintToStderr(
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
    const std::string resident =
        s.peak_resident_bytes >= 0
            ? fmt::format(", process resident {:.2f} MiB", s.peak_resident_bytes / 1048576.0)
            : std::string();
    PrintToStderr(
        "done: {} steps in {}, {}, peak tensor memory {:.2f} MiB (reserved {:.2f} MiB{}), "
        "{}\n",
        s.steps, FormatDuration(s.wall_s), FormatRate(s.per_s, trainer.throughput()),
        s.peak_allocated_bytes / 1048576.0, s.peak_reserved_bytes / 1048576.0, resident,
        s.unused_params > 0
            ? fmt::format("{} parameters trained, {} unused", s.params, s.unused_params)
            : fmt::format("{} parameters", s.params));
    for (const std::string& line : trainer.engine().ReportLines()) PrintToStderr("  {}\n", line);
    // What bf16 does on this CPU, and which ops of the model run bf16.
    if (a.config.gpt.precision == Precision::kBf16) {
      PrintToStderr("  {}\n", kernels::DescribeBf16Compute());
      if (std::string ops = DescribePrecisionOps(trainer.task()); !ops.empty())
        PrintToStderr("  {}\n", ops);
    }
    // Post-validation pays a whole step again for each rollback: say so when most steps paid it.
    if (const nlohmann::json extra = trainer.engine().Summary();
        extra.is_object() && extra.contains("post_validation")) {
      const int64_t redone = extra["post_validation"]["rollbacks"].get<int64_t>();
      if (redone > 0 && 2 * redone > s.steps) {
        PrintToStderr(
            "note: post-validation redid {} of {} steps (clipping or the non-finite check "
            "fired), each at the cost of a step; where that is usual (--clip below the "
            "run's gradient norms), training without --post-validate is faster\n",
            redone, s.steps);
      }
    }
    if (s.last_eval.accuracy >= 0)
      PrintToStderr("held-out accuracy: {:.1f}%\n", 100 * s.last_eval.accuracy);
    if (!c.metrics_path.empty()) PrintToStderr("metrics: {}\n", c.metrics_path);
    if (!c.save_path.empty()) PrintToStderr("checkpoint: {}\n", c.save_path);
  }
  return 0;
}

}  // namespace

CommandRunner SetupTrainCommand(CLI::App& sub) {
  TrainOptions options = AddTrainOptions(sub, TrainCommand::kTrain);
  return [options, &sub] {
    options.finish();
    TrainArgs* a = options.args.get();
    if (a->comm == "mpi") {
      // What each rank was started with, compared across the ranks: the version, then every
      // option as given ("" where not given).
      pipeline::LaunchSettings launch = {{"version", kSluiceVersion}};
      for (const CLI::Option* o : sub.get_options()) {
        if (o->get_name().empty() || o->get_name() == "--help") continue;
        launch.emplace_back(o->get_name(), fmt::format("{}", fmt::join(o->results(), " ")));
      }
      return RunTrainMpi(*a, launch);
    }
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

}  // namespace sluice::cli
