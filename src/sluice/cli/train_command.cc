// `sluice train`: trains a GPT or an MLP, on one stage or split into pipeline stages (--stages,
// --schedule), with progress on the terminal and JSON-lines metrics. Every bad option or
// configuration is an error that says what to change.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "sluice/cli/commands.h"
#include "sluice/cli/file_checks.h"
#include "sluice/comm/mpi.h"
#include "sluice/core/enum_names.h"
#include "sluice/core/error.h"
#include "sluice/exec/analysis.h"
#include "sluice/pipeline/memory_forecast.h"
#include "sluice/pipeline/pipeline_engine.h"
#include "sluice/pipeline/schedule_analysis.h"
#include "sluice/pipeline/step_simulator.h"
#include "sluice/step/config_checks.h"
#include "sluice/step/memory_budget.h"
#include "sluice/train/trainer.h"

namespace sluice::cli {

namespace {

struct TrainArgs {
  TrainConfig config;
  std::string optimizer = "adamw";
  std::string schedule = "cosine";
  std::string gc = "auto";
  std::string memory_plan = "dynamic";
  std::string attention = "fused";
  std::string mode = "trace";
  std::string recompute = "cheap";  // a policy, or a comma list of one per stage
  bool no_recompute = false;
  bool quiet = false;
  // Pipeline: used when --stages > 1 or any pipeline option is given.
  bool pipeline = false;
  pipeline::PipelineOptions pipe;
  std::string pipe_schedule = "1f1b";
  std::string partition = "uniform";
  bool release_outputs = true;
  double comm_timeout_s = 60;
  std::string comm = "local";  // local (stages as threads) or mpi (stages as processes)
  int data_parallel = 1;
  std::string fault;            // tests: MODE:STAGE:ACTION:MICRO_BATCH
  double compute_sleep_ms = 0;  // tests: every F, B and W sleeps this long
  // Memory: a budget per stage (step/memory_budget.h) that picks the recompute policies (and, with
  // --schedule auto, the schedule) before training.
  std::string memory_budget;
  bool recompute_given = false;     // --recompute or --no-recompute on the command line
  bool microbatches_given = false;  // --microbatches on the command line
  bool partition_given = false;     // --partition on the command line
  std::string format = "table";     // sluice plan and simulate: table or json
  std::vector<std::string> costs;   // sluice simulate: costs files of --profile-out
  std::string compare;              // sluice simulate: schedules to rank
  int cores = 0;                    // sluice simulate: cores the stage threads share (0: one each)
  int draws = -1;                   // sluice simulate: replays of recorded costs (0: medians;
                                    // -1: kDefaultDraws where the costs recorded steps)
  std::string draw_mode = "computes";  // sluice simulate: computes or steps (pipeline::DrawMode)
};

// "--inject-fault throw:1:F:2" (or skip:0:SEND_F:1): rank 1 throws at its forward of micro-batch
// 2 in the first step. For tests of failure handling; hidden from --help.
pipeline::FaultInjection ParseFault(const std::string& text) {
  std::vector<std::string> parts;
  for (size_t start = 0;;) {
    size_t end = text.find(':', start);
    parts.push_back(text.substr(start, end - start));
    if (end == std::string::npos) break;
    start = end + 1;
  }
  auto bad = [&] {
    return InvalidArgument(fmt::format(
        "--inject-fault '{}': expected MODE:STAGE:ACTION:MICRO_BATCH, e.g. throw:1:F:0", text));
  };
  if (parts.size() != 4) throw bad();
  pipeline::FaultInjection f;
  if (parts[0] == "throw") {
    f.mode = pipeline::FaultInjection::Mode::kThrow;
  } else if (parts[0] == "skip") {
    f.mode = pipeline::FaultInjection::Mode::kSkip;
  } else {
    throw bad();
  }
  const std::string kinds[] = {"F", "B", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "OPT"};
  auto it = std::find(std::begin(kinds), std::end(kinds), parts[2]);
  if (it == std::end(kinds)) throw bad();
  f.kind = static_cast<pipeline::ActionKind>(it - std::begin(kinds));
  try {
    f.rank = std::stoi(parts[1]);
    f.micro_batch = std::stoi(parts[3]);
  } catch (const std::exception&) {
    throw bad();
  }
  return f;
}

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

// The model and data of a job, built as Trainer builds them, for forecasting before training.
struct Job {
  std::unique_ptr<Task> task;
  Model model;
};

Job MakeJob(const TrainConfig& c) {
  ValidateTrainConfig(c);
  Job job;
  job.task = MakeTask(c);
  job.model = job.task->BuildTrain(c.batch / c.microbatches);
  return job;
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
        "memory plan: {} on {}, batch {} in {} micro-batches, {}{}\n", a.config.model,
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
    return {{"model", a.config.model},
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

// Reads the textual options into a.config and a.pipe (everything but the memory budget).
void Configure(TrainArgs& a) {
  TrainConfig& c = a.config;
  auto opt = ParseOptimizerKind(a.optimizer);
  if (!opt)
    throw InvalidArgument(fmt::format("--optimizer must be adamw or sgd, not '{}'", a.optimizer));
  c.optimizer.kind = *opt;
  auto schedule = ParseLrSchedule(a.schedule);
  if (!schedule)
    throw InvalidArgument(
        fmt::format("--lr-schedule must be constant or cosine, not '{}'", a.schedule));
  c.optimizer.schedule = *schedule;
  auto attention = ParseGptAttention(a.attention);
  if (!attention)
    throw InvalidArgument(fmt::format("--attention must be one of {}, not '{}'",
                                      EnumNames(kGptAttentionNames, ", "), a.attention));
  c.gpt.attention = *attention;
  auto gc = ParseGcMode(a.gc);
  if (!gc)
    throw InvalidArgument(
        fmt::format("--gc must be one of {}, not '{}'", EnumNames(kGcModeNames, ", "), a.gc));
  c.gc = *gc;
  auto memory_plan = ParseMemoryPlanMode(a.memory_plan);
  if (!memory_plan)
    throw InvalidArgument(fmt::format("--memory-plan must be one of {}, not '{}'",
                                      EnumNames(kMemoryPlanModeNames, ", "), a.memory_plan));
  c.memory_plan = *memory_plan;
  auto mode = ParseRunMode(a.mode);
  if (!mode)
    throw InvalidArgument(fmt::format("--mode must be trace or parallel, not '{}'", a.mode));
  c.mode = *mode;
  c.recompute.clear();
  for (size_t start = 0;;) {  // "full,cheap,cheap,none"
    const size_t end = a.recompute.find(',', start);
    const std::string item = a.recompute.substr(start, end - start);
    auto policy = ParseRecomputePolicy(item);
    if (!policy) {
      throw InvalidArgument(
          fmt::format("--recompute: '{}' is not a policy; use {} (one, or one per stage separated "
                      "by commas)",
                      item, RecomputePolicyNames()));
    }
    c.recompute.push_back(a.no_recompute ? RecomputePolicy::kNone : *policy);
    if (end == std::string::npos) break;
    start = end + 1;
  }
  if (c.model == "mlp" && c.data == "sort") c.data = "blobs";

  if (a.pipeline) {
    if (a.pipe_schedule != "auto") {
      const auto schedule_kind = pipeline::ParseScheduleKind(a.pipe_schedule);
      if (!schedule_kind) {
        throw InvalidArgument(fmt::format("unknown schedule '{}': choose one of {} or auto",
                                          a.pipe_schedule,
                                          EnumNames(pipeline::kScheduleKindNames, ", ")));
      }
      a.pipe.schedule = *schedule_kind;
    }
    const auto partition = pipeline::ParsePartitionKind(a.partition);
    if (!partition) {
      throw InvalidArgument(fmt::format("unknown partition '{}': expected {}", a.partition,
                                        EnumNames(pipeline::kPartitionKindNames, " or ")));
    }
    a.pipe.partition = *partition;
    const int64_t virtual_stages =
        int64_t{a.pipe.stages} *
        pipeline::ChunksOf({.kind = a.pipe.schedule, .chunks = a.pipe.chunks});
    if (!a.partition_given && c.model == "gpt" && c.gpt.layers < virtual_stages &&
        c.gpt.layers + 2 >= virtual_stages) {
      // Uniform puts a layer on every virtual stage; balanced may give embed and head their own.
      // With fewer units than that still, uniform's error names the layers either would need.
      a.pipe.partition = pipeline::PartitionKind::kBalanced;
    }
    // Out of range, the batch is refused by ValidateTrainConfig before anything is built.
    if (!a.microbatches_given && c.batch >= 1 && c.batch <= kMaxBatch) {
      // --schedule auto: 1f1b's count; a schedule that needs more is skipped naming why. Each of
      // D replicas takes its rows of every micro-batch, so M divides the batch D times over.
      const int64_t D = a.data_parallel;
      if (auto m = pipeline::DefaultMicroBatches(
              {.kind = a.pipe.schedule, .stages = a.pipe.stages, .chunks = a.pipe.chunks},
              D >= 1 && c.batch % D == 0 ? c.batch / D : c.batch)) {
        c.microbatches = *m;
      }
    }
    a.pipe.release_outputs = a.release_outputs;
    if (!a.fault.empty()) a.pipe.fault = ParseFault(a.fault);
    a.pipe.fault.compute_sleep_ns = static_cast<int64_t>(a.compute_sleep_ms * 1e6);
  }
}

int RunTrain(TrainArgs& a) {
  Configure(a);
  TrainConfig& c = a.config;
  CheckTrainFiles(c, a.pipe.trace_path);
  if (!a.memory_budget.empty() || a.pipe_schedule == "auto") {
    const MemoryPlanChoice choice = ChooseMemoryPlan(a);
    if (!a.quiet) fmt::print(stderr, "{}", choice.Describe(a));
    c.recompute = choice.plan.Policies();
    c.memory_budget = choice.budget;
    a.pipe.schedule = choice.schedule;
  }
  EngineFactory engine;
  if (a.pipeline) engine = pipeline::PipelineEngineFactory(a.pipe);
  Trainer trainer(c, engine);
  if (!a.quiet) {
    fmt::print(stderr,
               "sluice train: {} on {}, {} steps of batch {} ({} micro-batches), {} from step {}\n",
               c.model, c.data, c.steps, c.batch, c.microbatches, a.optimizer, trainer.step());
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
      [&](const EvalRecord& e) { progress.OnEval(e); });
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

// An option that only one choice of another option reads (--dim: --model gpt).
struct ScopedOption {
  const CLI::Option* option;
  std::string_view owner;  // "--model"
  std::string_view value;  // "gpt"
};

// Refuses an option given for a model or optimizer that does not read it, which would otherwise
// be silently ignored. Unknown model or optimizer names are left to their own, clearer error.
void CheckScopedOptions(const std::vector<ScopedOption>& scoped, const std::string& model,
                        const std::string& optimizer) {
  for (const ScopedOption& s : scoped) {
    const std::string& chosen = s.owner == "--model" ? model : optimizer;
    const bool known = s.owner == "--model" ? (chosen == "gpt" || chosen == "mlp")
                                            : (chosen == "adamw" || chosen == "sgd");
    if (s.option->count() == 0 || !known || chosen == s.value) continue;
    throw InvalidArgument(
        fmt::format("{} applies to {} {} only; this run uses {} {}, which does "
                    "not read it: drop {} or choose {} {}",
                    s.option->get_name(), s.owner, s.value, s.owner, chosen, s.option->get_name(),
                    s.owner, s.value));
  }
}

// The options `sluice train` and `sluice plan` share. `finish`, called once the command line is
// parsed, settles what depends on which options were given.
struct TrainOptions {
  std::shared_ptr<TrainArgs> args;
  std::function<void()> finish;
};

TrainOptions AddTrainOptions(CLI::App& sub) {
  auto a = std::make_shared<TrainArgs>();
  TrainConfig& c = a->config;
  sub.add_option("--model", c.model, "gpt or mlp")->capture_default_str();
  sub.add_option("--data", c.data,
                 "sort (synthetic, default), blobs (mlp) or a text file for byte-level LM")
      ->capture_default_str();
  auto* layers =
      sub.add_option("--layers", c.gpt.layers, "transformer blocks")->capture_default_str();
  auto* heads = sub.add_option("--heads", c.gpt.heads, "attention heads (must divide --dim)")
                    ->capture_default_str();
  auto* dim = sub.add_option("--dim", c.gpt.dim, "model width C")->capture_default_str();
  auto* attention =
      sub.add_option("--attention", a->attention,
                     "gpt: fused (one op, no [T, T] values kept) or naive (matmul, mask, softmax)")
          ->capture_default_str();
  auto* seq =
      sub.add_option("--seq", c.gpt.seq, "longest sequence (0: the data's; text data default 64)")
          ->capture_default_str();
  auto* vocab = sub.add_option("--vocab", c.gpt.vocab, "vocabulary size (0: the data's)")
                    ->capture_default_str();
  auto* features =
      sub.add_option("--features", c.mlp.features, "mlp: input features")->capture_default_str();
  auto* hidden =
      sub.add_option("--hidden", c.mlp.hidden, "mlp: hidden width")->capture_default_str();
  auto* classes = sub.add_option("--classes", c.mlp.classes, "mlp: classes")->capture_default_str();
  sub.add_option("--steps", c.steps, "optimizer steps")->capture_default_str();
  sub.add_option("--batch", c.batch, "sequences per step")->capture_default_str();
  auto* microbatches = sub.add_option(
      "--microbatches", c.microbatches,
      "micro-batches per step (gradient accumulation; default 1, with a pipeline the fewest its "
      "schedule runs with, at least --stages, that divide --batch)");
  sub.add_option("--optimizer", a->optimizer, "adamw or sgd")->capture_default_str();
  sub.add_option("--lr", c.optimizer.lr, "peak learning rate")->capture_default_str();
  sub.add_option("--lr-schedule", a->schedule, "constant or cosine")->capture_default_str();
  sub.add_option("--warmup", c.optimizer.warmup_steps, "linear warmup steps")
      ->capture_default_str();
  auto* min_lr = sub.add_option("--min-lr", c.optimizer.min_lr,
                                "cosine floor, at most --lr (default: 0.0003 or --lr if lower)");
  sub.add_option("--weight-decay", c.optimizer.weight_decay,
                 "decoupled (AdamW) or L2 (SGD) weight decay")
      ->capture_default_str();
  auto* beta1 = sub.add_option("--beta1", c.optimizer.beta1, "AdamW β1")->capture_default_str();
  auto* beta2 = sub.add_option("--beta2", c.optimizer.beta2, "AdamW β2")->capture_default_str();
  auto* momentum =
      sub.add_option("--momentum", c.optimizer.momentum, "SGD momentum")->capture_default_str();
  sub.add_option("--clip", c.optimizer.clip_norm, "clip gradients to this global norm (0: off)")
      ->capture_default_str();
  sub.add_option("--seed", c.seed, "seed of initialization and data")
      ->check(Seed())
      ->capture_default_str();
  sub.add_option(
         "--gc", a->gc,
         "when dead buffers are freed: auto (sync on the caching allocator), none, sync or async")
      ->capture_default_str();
  sub.add_option("--mode", a->mode, "trace or parallel")->capture_default_str();
  sub.add_option("--memory-plan", a->memory_plan,
                 "intermediates: dynamic (allocated and freed one by one) or static (one arena "
                 "per run at planned offsets; --mode trace)")
      ->capture_default_str();
  auto* recompute =
      sub.add_option(
             "--recompute", a->recompute,
             "what backward recomputes instead of keeping: none, cheap, full (keep block "
             "inputs only) or "
             "selective (also drop attention scores); one for all stages or a comma list, one "
             "per stage")
          ->capture_default_str();
  auto* no_recompute =
      sub.add_flag("--no-recompute", a->no_recompute, "the same as --recompute none");
  sub.add_option("--memory-budget", a->memory_budget,
                 "most bytes a stage may hold, e.g. 6MiB or 1.5GB (one, or one per stage "
                 "separated by commas): picks each stage's recompute policy before training and "
                 "stops a step that would exceed it");
  sub.add_option("--threads", c.threads,
                 "intra-op threads, BLAS included (0: all cores; at most 1024)")
      ->capture_default_str();
  sub.add_option("--eval-every", c.eval_every, "evaluate every N steps (0: at the end)")
      ->capture_default_str();
  sub.add_option("--eval-batches", c.eval_batches, "validation batches per evaluation")
      ->capture_default_str();
  sub.add_option("--metrics", c.metrics_path,
                 "write JSON lines (per step, eval, summary) to this file")
      ->check(NonEmptyPath());
  sub.add_option("--save", c.save_path, "checkpoint file (safetensors)")->check(NonEmptyPath());
  sub.add_option("--save-every", c.save_every, "checkpoint every N steps (0: at the end)")
      ->capture_default_str();
  sub.add_option("--resume", c.resume_path,
                 "continue from this checkpoint (bitwise the same losses)")
      ->check(NonEmptyPath());
  sub.add_option("--init-from", c.init_from, "load weights only from this safetensors file")
      ->check(NonEmptyPath());
  sub.add_option("--skip-nonfinite", c.skip_nonfinite,
                 "skip the update of up to N steps whose loss or gradient norm is not finite "
                 "(0: stop at the first)")
      ->capture_default_str();
  sub.add_flag("--quiet", a->quiet, "no progress output");

  sub.add_option("--stages", a->pipe.stages, "pipeline stages P, one thread each (1: no pipeline)")
      ->capture_default_str();
  auto* sched =
      sub.add_option("--schedule", a->pipe_schedule,
                     "pipeline schedule: " + EnumNames(pipeline::kScheduleKindNames, ", ") +
                         " or auto (the fastest whose forecast fits --memory-budget)")
          ->capture_default_str();
  auto* chunks = sub.add_option(
      "--chunks", a->pipe.chunks,
      "model chunks per stage V (interleaved, zb-v, v-half, v-min: 2; 0: the default)");
  auto* partition = sub.add_option(
      "--partition", a->partition,
      "split the layers uniform or balanced (by estimated cost; embed and head may take a stage "
      "of their own). Default: uniform, balanced when the model has fewer layers than stages");
  auto* layout = sub.add_option(
      "--layout", a->pipe.layout,
      "explicit layers per stage, stages separated by |, e.g. \"embed,h.0-1|h.2-3,head\"");
  auto* release = sub.add_flag("--release-outputs,!--no-release-outputs", a->release_outputs,
                               "free each stage output once its send completed (default on)");
  auto* ahead = sub.add_flag("--post-receives-ahead", a->pipe.post_receives_ahead,
                             "list each receive right after the rank's previous message, for "
                             "sends that block until their receive is posted (default off)");
  auto* timeout = sub.add_option("--comm-timeout", a->comm_timeout_s,
                                 "seconds a stage waits for a message before failing")
                      ->capture_default_str();
  auto* trace = sub.add_option("--trace", a->pipe.trace_path,
                               "Chrome trace (Perfetto) of the last step, one track per stage")
                    ->check(NonEmptyPath());
  auto* profile = sub.add_option("--profile-out", a->pipe.profile_path,
                                 "write the step's measured costs (F, B, W, OPT medians, messages) "
                                 "as JSON for sluice simulate --costs")
                      ->check(NonEmptyPath());
  auto* fault = sub.add_option("--inject-fault", a->fault)->group("");  // tests of failure handling
  // Tests of the simulator against measured runs: a slow device whose costs the load does not move.
  auto* compute_sleep = sub.add_option("--inject-compute-ms", a->compute_sleep_ms)->group("");
  auto* comm =
      sub.add_option("--comm", a->comm,
                     "local (stages as threads) or mpi (one stage per process, under mpirun)")
          ->capture_default_str();
  auto* dp =
      sub.add_option(
             "--data-parallel", a->data_parallel,
             "pipeline replicas D (--comm mpi): mpirun -np P·D; gradients averaged over replicas")
          ->capture_default_str();
  // Options only one model or one optimizer reads: given for the other, they would change nothing.
  const std::vector<ScopedOption> scoped = {
      {layers, "--model", "gpt"},      {heads, "--model", "gpt"},
      {dim, "--model", "gpt"},         {attention, "--model", "gpt"},
      {seq, "--model", "gpt"},         {vocab, "--model", "gpt"},
      {features, "--model", "mlp"},    {hidden, "--model", "mlp"},
      {classes, "--model", "mlp"},     {beta1, "--optimizer", "adamw"},
      {beta2, "--optimizer", "adamw"}, {momentum, "--optimizer", "sgd"},
  };
  auto finish = [a, scoped, sched, chunks, partition, layout, release, ahead, timeout, trace,
                 profile, fault, compute_sleep, comm, dp, recompute, no_recompute, min_lr,
                 microbatches] {
    CheckScopedOptions(scoped, a->config.model, a->optimizer);
    OptimizerConfig& opt = a->config.optimizer;
    if (min_lr->count() == 0) opt.min_lr = std::min(opt.min_lr, opt.lr);  // no floor above peak
    a->pipeline = a->pipe.stages != 1;
    for (const CLI::Option* o : {sched, chunks, partition, layout, release, ahead, timeout, trace,
                                 profile, fault, compute_sleep, comm, dp}) {
      a->pipeline = a->pipeline || o->count() > 0;
    }
    a->recompute_given = recompute->count() > 0 || no_recompute->count() > 0;
    a->microbatches_given = microbatches->count() > 0;
    a->partition_given = partition->count() > 0;
    if (!(a->compute_sleep_ms >= 0 && a->compute_sleep_ms <= 60'000)) {
      throw InvalidArgument(
          fmt::format("--inject-compute-ms must be in [0, 60000] ms, got {}", a->compute_sleep_ms));
    }
    if (!(a->comm_timeout_s > 0)) {
      throw InvalidArgument(
          fmt::format("--comm-timeout must be positive, got {}", a->comm_timeout_s));
    }
    a->pipe.timeout =
        std::chrono::milliseconds(static_cast<int64_t>(std::min(a->comm_timeout_s, 1e9) * 1000));
  };
  return {a, finish};
}

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
};

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
      pipeline::CheckCostsJob(
          c, pipeline::ProfileJob(layout.setup, pipeline::FormatLayout(layout.partition)));
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
                        .core_wait_share = pipeline::CoreWaitShare(chosen)};
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

// `sluice simulate`: the job's step replayed by the step simulator (pipeline/step_simulator.h) with
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
  if (a.pipe_schedule == "auto") {
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
  fmt::print("  {:<5}  {:>10}  {:>10}  {:>7}  {:>12}{}\n", "stage", "busy", "idle", "bubble",
             "peak memory", budget.empty() ? "" : "  budget");
  for (size_t s = 0; s < p.ranks.size(); ++s) {
    fmt::print("  {:<5}  {:>10.3f}  {:>10.3f}  {:>6.1f}%  {:>12}{}\n", s, p.ranks[s].busy_ms,
               p.ranks[s].idle_ms, 100 * p.ranks[s].bubble,
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
                 "--memory-budget, those within it first");
  sub.add_option("--format", options.args->format, "table or json")
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();
  return [options] {
    options.finish();
    return RunSimulate(*options.args);
  };
}

}  // namespace sluice::cli
