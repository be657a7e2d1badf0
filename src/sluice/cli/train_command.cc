// `sluice train`: trains a GPT or an MLP, on one stage or split into pipeline stages (--stages,
// --schedule), with progress on the terminal and JSON-lines metrics. Every bad option or
// configuration is an error that says what to change.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "sluice/cli/commands.h"
#include "sluice/cli/file_checks.h"
#include "sluice/comm/mpi.h"
#include "sluice/core/enum_names.h"
#include "sluice/core/error.h"
#include "sluice/pipeline/pipeline_engine.h"
#include "sluice/train/trainer.h"

namespace sluice::cli {

namespace {

struct TrainArgs {
  TrainConfig config;
  std::string optimizer = "adamw";
  std::string schedule = "cosine";
  std::string gc = "auto";
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
  std::string fault;  // tests: MODE:STAGE:ACTION:MICRO_BATCH
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

int RunTrain(TrainArgs& a) {
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
  CheckTrainFiles(c, a.pipe.trace_path);

  EngineFactory engine;
  if (a.pipeline) {
    const auto schedule_kind = pipeline::ParseScheduleKind(a.pipe_schedule);
    if (!schedule_kind) {
      throw InvalidArgument(fmt::format("unknown schedule '{}': choose one of {}", a.pipe_schedule,
                                        EnumNames(pipeline::kScheduleKindNames, ", ")));
    }
    a.pipe.schedule = *schedule_kind;
    const auto partition = pipeline::ParsePartitionKind(a.partition);
    if (!partition) {
      throw InvalidArgument(fmt::format("unknown partition '{}': expected {}", a.partition,
                                        EnumNames(pipeline::kPartitionKindNames, " or ")));
    }
    a.pipe.partition = *partition;
    a.pipe.release_outputs = a.release_outputs;
    if (!a.fault.empty()) a.pipe.fault = ParseFault(a.fault);
    engine = pipeline::PipelineEngineFactory(a.pipe);
  }
  Trainer trainer(c, engine);
  if (!a.quiet) {
    fmt::print(stderr,
               "sluice train: {} on {}, {} steps of batch {} ({} micro-batches), {} from step {}\n",
               c.model, c.data, c.steps, c.batch, c.microbatches, a.optimizer, trainer.step());
    if (std::string d = trainer.engine().Describe(); !d.empty()) fmt::print(stderr, "{}\n", d);
  }
  Progress progress(trainer.step(), c.steps, a.quiet);
  TrainSummary s = trainer.Run([&](const StepRecord& r) { progress.OnStep(r); },
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

}  // namespace

CommandRunner SetupTrainCommand(CLI::App& sub) {
  auto a = std::make_shared<TrainArgs>();
  TrainConfig& c = a->config;
  sub.add_option("--model", c.model, "gpt or mlp")->capture_default_str();
  sub.add_option("--data", c.data,
                 "sort (synthetic, default), blobs (mlp) or a text file for byte-level LM")
      ->capture_default_str();
  sub.add_option("--layers", c.gpt.layers, "transformer blocks")->capture_default_str();
  sub.add_option("--heads", c.gpt.heads, "attention heads (must divide --dim)")
      ->capture_default_str();
  sub.add_option("--dim", c.gpt.dim, "model width C")->capture_default_str();
  sub.add_option("--attention", a->attention,
                 "gpt: fused (one op, no [T, T] values kept) or naive (matmul, mask, softmax)")
      ->capture_default_str();
  sub.add_option("--seq", c.gpt.seq, "longest sequence (0: the data's; text data default 64)")
      ->capture_default_str();
  sub.add_option("--vocab", c.gpt.vocab, "vocabulary size (0: the data's)")->capture_default_str();
  sub.add_option("--features", c.mlp.features, "mlp: input features")->capture_default_str();
  sub.add_option("--hidden", c.mlp.hidden, "mlp: hidden width")->capture_default_str();
  sub.add_option("--classes", c.mlp.classes, "mlp: classes")->capture_default_str();
  sub.add_option("--steps", c.steps, "optimizer steps")->capture_default_str();
  sub.add_option("--batch", c.batch, "sequences per step")->capture_default_str();
  sub.add_option("--microbatches", c.microbatches, "micro-batches per step (gradient accumulation)")
      ->capture_default_str();
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
  sub.add_option("--beta1", c.optimizer.beta1, "AdamW β1")->capture_default_str();
  sub.add_option("--beta2", c.optimizer.beta2, "AdamW β2")->capture_default_str();
  sub.add_option("--momentum", c.optimizer.momentum, "SGD momentum")->capture_default_str();
  sub.add_option("--clip", c.optimizer.clip_norm, "clip gradients to this global norm (0: off)")
      ->capture_default_str();
  sub.add_option("--seed", c.seed, "seed of initialization and data")
      ->check(CLI::NonNegativeNumber)  // a uint64: "-1" would wrap around silently
      ->capture_default_str();
  sub.add_option(
         "--gc", a->gc,
         "when dead buffers are freed: auto (sync on the caching allocator), none, sync or async")
      ->capture_default_str();
  sub.add_option("--mode", a->mode, "trace or parallel")->capture_default_str();
  sub.add_option("--recompute", a->recompute,
                 "what backward recomputes instead of keeping: none, cheap, full (keep block "
                 "inputs only) or "
                 "selective (also drop attention scores); one for all stages or a comma list, one "
                 "per stage")
      ->capture_default_str();
  sub.add_flag("--no-recompute", a->no_recompute, "the same as --recompute none");
  sub.add_option("--threads", c.threads,
                 "intra-op threads, BLAS included (0: all cores; at most 1024)")
      ->capture_default_str();
  sub.add_option("--eval-every", c.eval_every, "evaluate every N steps (0: at the end)")
      ->capture_default_str();
  sub.add_option("--eval-batches", c.eval_batches, "validation batches per evaluation")
      ->capture_default_str();
  sub.add_option("--metrics", c.metrics_path,
                 "write JSON lines (per step, eval, summary) to this file");
  sub.add_option("--save", c.save_path, "checkpoint file (safetensors)");
  sub.add_option("--save-every", c.save_every, "checkpoint every N steps (0: at the end)")
      ->capture_default_str();
  sub.add_option("--resume", c.resume_path,
                 "continue from this checkpoint (bitwise the same losses)");
  sub.add_option("--init-from", c.init_from, "load weights only from this safetensors file");
  sub.add_flag("--quiet", a->quiet, "no progress output");

  sub.add_option("--stages", a->pipe.stages, "pipeline stages P, one thread each (1: no pipeline)")
      ->capture_default_str();
  auto* sched = sub.add_option("--schedule", a->pipe_schedule,
                               "pipeline schedule: gpipe, 1f1b, interleaved or zb-h1")
                    ->capture_default_str();
  auto* chunks = sub.add_option("--chunks", a->pipe.chunks,
                                "model chunks per stage V (interleaved; 0: default 2)");
  auto* partition = sub.add_option("--partition", a->partition,
                                   "split the layers uniform or balanced (by estimated cost)")
                        ->capture_default_str();
  auto* layout = sub.add_option(
      "--layout", a->pipe.layout,
      "explicit layers per stage, stages separated by |, e.g. \"embed,h.0-1|h.2-3,head\"");
  auto* release = sub.add_flag("--release-outputs,!--no-release-outputs", a->release_outputs,
                               "free each stage output once its send completed (default on)");
  auto* timeout = sub.add_option("--comm-timeout", a->comm_timeout_s,
                                 "seconds a stage waits for a message before failing")
                      ->capture_default_str();
  auto* trace = sub.add_option("--trace", a->pipe.trace_path,
                               "Chrome trace (Perfetto) of the last step, one track per stage");
  auto* fault = sub.add_option("--inject-fault", a->fault)->group("");  // tests of failure handling
  auto* comm =
      sub.add_option("--comm", a->comm,
                     "local (stages as threads) or mpi (one stage per process, under mpirun)")
          ->capture_default_str();
  auto* dp =
      sub.add_option(
             "--data-parallel", a->data_parallel,
             "pipeline replicas D (--comm mpi): mpirun -np P·D; gradients averaged over replicas")
          ->capture_default_str();
  return [a, sched, chunks, partition, layout, release, timeout, trace, fault, comm, dp, min_lr] {
    OptimizerConfig& opt = a->config.optimizer;
    if (min_lr->count() == 0) opt.min_lr = std::min(opt.min_lr, opt.lr);  // no floor above peak
    a->pipeline = a->pipe.stages != 1;
    for (const CLI::Option* o :
         {sched, chunks, partition, layout, release, timeout, trace, fault, comm, dp}) {
      a->pipeline = a->pipeline || o->count() > 0;
    }
    if (!(a->comm_timeout_s > 0)) {
      throw InvalidArgument(
          fmt::format("--comm-timeout must be positive, got {}", a->comm_timeout_s));
    }
    a->pipe.timeout =
        std::chrono::milliseconds(static_cast<int64_t>(std::min(a->comm_timeout_s, 1e9) * 1000));
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

}  // namespace sluice::cli
