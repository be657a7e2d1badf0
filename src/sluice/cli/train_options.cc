#include "sluice/cli/train_options.h"

#include <algorithm>
#include <chrono>
#include <string_view>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sluice/cli/commands.h"
#include "sluice/core/enum_names.h"
#include "sluice/core/error.h"
#include "sluice/core/system_memory.h"
#include "sluice/core/thread_pool.h"
#include "sluice/exec/analysis.h"
#include "sluice/pipeline/memory_forecast.h"
#include "sluice/schedule/schedule_analysis.h"
#include "sluice/step/config_checks.h"
#include "sluice/step/memory_budget.h"
#include "sluice/step/memory_replay.h"
#include "sluice/step/program_task.h"

namespace sluice::cli {

namespace {

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
// An option that only one choice of another option reads (--dim: --model gpt).
struct ScopedOption {
  const CLI::Option* option;
  std::string_view owner;  // "--model"
  std::string_view value;  // "gpt"
  bool program = false;    // also read with --program (a data option: --seq, --vocab, --classes)
  // Why a --program does not read it, where that is not "its sizes are in its file".
  std::string_view program_refusal = {};
};

// Refuses an option given for a model or optimizer that does not read it, which would otherwise
// be silently ignored. Unknown model or optimizer names are left to their own, clearer error.
void CheckScopedOptions(const std::vector<ScopedOption>& scoped, const std::string& model,
                        const std::string& optimizer) {
  for (const ScopedOption& s : scoped) {
    const std::string& chosen = s.owner == "--model" ? model : optimizer;
    if (s.option->count() == 0) continue;
    if (s.owner == "--model" && chosen == "program") {
      if (s.program) continue;
      if (!s.program_refusal.empty()) {
        throw InvalidArgument(fmt::format("{}: drop {}", s.program_refusal, s.option->get_name()));
      }
      throw InvalidArgument(fmt::format(
          "{} sets a size of --model {}; a --program's sizes are written in its file: drop {}",
          s.option->get_name(), s.value, s.option->get_name()));
    }
    const bool known = s.owner == "--model" ? (chosen == "gpt" || chosen == "mlp")
                                            : (chosen == "adamw" || chosen == "sgd");
    if (!known || chosen == s.value) continue;
    throw InvalidArgument(
        fmt::format("{} applies to {} {} only; this run uses {} {}, which does "
                    "not read it: drop {} or choose {} {}",
                    s.option->get_name(), s.owner, s.value, s.owner, chosen, s.option->get_name(),
                    s.owner, s.value));
  }
}

// An option of `sluice train` that a command training nothing accepts only to refuse it.
struct UnusedOption {
  CLI::Option* option;
  std::string_view why;  // "it writes no checkpoint"
  std::string name;      // "--save" (CLI11 names a hidden option "")
};

}  // namespace

TrainOptions AddTrainOptions(CLI::App& sub, TrainCommand command) {
  auto a = std::make_shared<TrainArgs>();
  TrainConfig& c = a->config;
  auto* model = sub.add_option("--model", c.model, "gpt or mlp")->capture_default_str();
  auto* program = sub.add_option("--program", c.program,
                                 "train this program file (a model of your own, "
                                 "docs/program-format.md) instead of --model");
  auto* data = sub.add_option("--data", c.data,
                              "gpt: sort (synthetic digits to sort, the default) or a text file "
                              "for a byte-level LM; mlp: blobs (Gaussian clusters, the default)");
  auto* layers =
      sub.add_option("--layers", c.gpt.layers, "transformer blocks")->capture_default_str();
  auto* heads = sub.add_option("--heads", c.gpt.heads, "attention heads (must divide --dim)")
                    ->capture_default_str();
  auto* dim = sub.add_option("--dim", c.gpt.dim, "model width C")->capture_default_str();
  auto* attention =
      sub.add_option("--attention", a->attention,
                     "gpt: fused (one op, no [T, T] values kept) or naive (matmul, mask, softmax)")
          ->capture_default_str();
  auto* head_chunk =
      sub.add_option("--head-chunk", c.gpt.head_chunk,
                     "gpt: tokens per chunk of the head's fused linear + cross-entropy, whose "
                     "logits are never whole (0: automatic; -1: the unfused head)")
          ->capture_default_str();
  auto* dropout = sub.add_option("--dropout", c.gpt.dropout,
                                 "gpt: dropout in training, p in [0, 1) (the embedding, each "
                                 "block's attention and MLP branches; masks never stored)")
                      ->capture_default_str();
  auto* precision =
      sub.add_option("--precision", a->precision,
                     "fp32, or bf16 (mixed precision: activations stored bf16, f32 compute and "
                     "accumulation; weights, gradients, optimizer state stay f32; a --program "
                     "gets autocast's casts, its other ops running f32)")
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
  auto* steps = sub.add_option("--steps", c.steps, "optimizer steps")->capture_default_str();
  auto* batch = sub.add_option("--batch", c.batch, "sequences per step")->capture_default_str();
  auto* microbatches = sub.add_option(
      "--microbatches", c.microbatches,
      "micro-batches per step (gradient accumulation; default 1, with a pipeline the fewest its "
      "schedule runs with, at least --stages, that divide --batch)");
  sub.add_option("--optimizer", a->optimizer, "adamw or sgd")->capture_default_str();
  sub.add_option("--lr", c.optimizer.lr, "peak learning rate")->capture_default_str();
  sub.add_option("--lr-schedule", a->lr_schedule, "constant or cosine")->capture_default_str();
  auto* warmup = sub.add_option("--warmup", c.optimizer.warmup_steps, "linear warmup steps")
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
             "inputs only), selective (also drop attention scores) or sublayer (keep what full "
             "keeps, recompute one sub-layer at a time); one for all stages or a comma list, one "
             "per stage")
          ->capture_default_str();
  auto* no_recompute =
      sub.add_flag("--no-recompute", a->no_recompute, "the same as --recompute none");
  sub.add_flag("--in-place,!--no-in-place", c.in_place,
               "write an elementwise output into the storage of an input dying at its instruction "
               "(bitwise the same; --no-in-place measures the saving)")
      ->capture_default_str();
  sub.add_flag("--accumulate-in-place,!--no-accumulate-in-place", c.accumulate_in_place,
               "micro-batches after the first add their weight gradients straight into the "
               "accumulated ones (bitwise the same; --no-accumulate-in-place measures the saving)")
      ->capture_default_str();
  sub.add_option("--memory-budget", a->memory_budget,
                 "most bytes a stage may hold, e.g. 6MiB or 1.5GB (one, or one per stage "
                 "separated by commas): picks each stage's recompute policy before training and "
                 "stops a step that would exceed it")
      ->check(NonEmpty("an empty value gives no size; leave the option out for no budget"));
  sub.add_option("--reserved-headroom", c.reserved_headroom,
                 "reserved bytes each allocator keeps past the most it ever had allocated, as a "
                 "fraction of it (0 to 1): past it, free blocks give their pages back to the "
                 "system (0 keeps them: more memory, fewer page faults)")
      ->capture_default_str();
  sub.add_option("--threads", c.threads,
                 "intra-op threads, BLAS included (0: all cores; at most 1024)")
      ->capture_default_str();
  auto* eval_every =
      sub.add_option("--eval-every", c.eval_every, "evaluate every N steps (0: at the end)")
          ->capture_default_str();
  auto* eval_batches =
      sub.add_option("--eval-batches", c.eval_batches, "validation batches per evaluation")
          ->capture_default_str();
  auto* metrics = sub.add_option("--metrics", c.metrics_path,
                                 "write JSON lines (per step, eval, summary) to this file")
                      ->check(NonEmptyPath());
  auto* save =
      sub.add_option("--save", c.save_path, "checkpoint file (safetensors)")->check(NonEmptyPath());
  auto* save_every =
      sub.add_option("--save-every", c.save_every, "checkpoint every N steps (0: at the end)")
          ->capture_default_str();
  auto* resume = sub.add_option("--resume", c.resume_path,
                                "continue from this checkpoint (bitwise the same losses)")
                     ->check(NonEmptyPath());
  auto* no_memory_check = sub.add_flag(
      "--no-memory-check", a->no_memory_check,
      "start even when the forecast peak exceeds the memory available (MemAvailable, ulimit -v)");
  auto* allow_changes = sub.add_flag(
      "--allow-changes", c.allow_changes,
      "with --resume: go on with hyperparameters (--lr, --batch, ...) that differ from the "
      "checkpoint's, each printed as a warning, instead of refusing them");
  auto* init_from =
      sub.add_option("--init-from", c.init_from, "load weights only from this safetensors file")
          ->check(NonEmptyPath());
  auto* skip_nonfinite =
      sub.add_option("--skip-nonfinite", c.skip_nonfinite,
                     "skip the update of up to N steps whose loss or gradient norm is not finite "
                     "(0: stop at the first)")
          ->capture_default_str();
  sub.add_flag("--quiet", a->quiet, "no progress output");

  sub.add_option("--stages", a->pipe.stages, "pipeline stages P, one thread each (1: no pipeline)")
      ->capture_default_str();
  auto* sched =
      sub.add_option("--schedule", a->pipeline_schedule,
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
  auto* layout =
      sub.add_option(
             "--layout", a->pipe.layout,
             "explicit layers per stage, stages separated by |, e.g. \"embed,h.0-1|h.2-3,head\"")
          ->check(
              NonEmpty("an empty layout places no layer; leave the option out for --partition"));
  auto* release = sub.add_flag("--release-outputs,!--no-release-outputs", a->release_outputs,
                               "free each stage output once its send completed (default on)");
  auto* ahead = sub.add_flag("--post-receives-ahead", a->pipe.post_receives_ahead,
                             "list each receive right after the rank's previous message, for "
                             "sends that block until their receive is posted (default off)");
  auto* post_validate = sub.add_flag(
      "--post-validate", a->pipe.post_validate,
      "optimizer post-validation: each stage updates as soon as its gradients are done and "
      "validates the update against the global norm and finite check afterwards, rolling back "
      "where clipping or a skip was due (bitwise the same results; default off)");
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
  sub.add_flag("--shard-optimizer", a->config.shard_optimizer,
               "ZeRO stage 1 with --data-parallel D: each replica keeps and updates 1/D of the "
               "optimizer state, then the parameters are gathered (losses bitwise unchanged)");
  // The files and faults a command that trains nothing (plan, simulate, export) never reads:
  // refused by name in finish rather than ignored. They stay options of the command, hidden from
  // its help, so that the error is sluice's own. What describes the run itself (--steps,
  // --eval-every, --skip-nonfinite, --seed) stays accepted, so that a train command's options can
  // be planned as they are.
  std::vector<UnusedOption> unused;
  if (command == TrainCommand::kNoTraining) {
    unused = {{save, "it writes no checkpoint"},
              {save_every, "it writes no checkpoint"},
              {metrics, "it writes no metrics"},
              {trace, "it runs no step to trace (sluice train --trace does)"},
              {profile, "it measures no costs (sluice train --profile-out does)"},
              {resume, "there is no run to continue"},
              {allow_changes, "there is no run to continue"},
              {no_memory_check, "it allocates nothing"},
              {init_from, "it loads no weights (only a --program's `loaded` parameters need them)"},
              {fault, "it runs no stage to fail"},
              {compute_sleep, "it runs no stage"}};
    for (UnusedOption& u : unused) {
      u.name = "--" + u.option->get_lnames().front();
      u.option->group("");
    }
  }
  // Integers past 64 bits are refused, not clamped to 2^63 - 1.
  for (CLI::Option* o :
       {steps, batch, microbatches, warmup, eval_every, eval_batches, save_every, skip_nonfinite,
        layers, heads, dim, head_chunk, seq, vocab, features, hidden, classes}) {
    o->check(Int64());
  }
  // Options only one model or one optimizer reads: given for the other, they would change nothing.
  const std::vector<ScopedOption> scoped = {
      {layers, "--model", "gpt"},
      {heads, "--model", "gpt"},
      {dim, "--model", "gpt"},
      {attention, "--model", "gpt"},
      {head_chunk, "--model", "gpt"},
      {dropout, "--model", "gpt", false,
       "--dropout sets the dropout of --model gpt; a --program carries its own dropout ops, "
       "each with its p (`dropout(%x, %random_key) {p = 0.1, stream = 0}`, docs/program-format.md "
       "\"Dropout\"), which is where to change it"},
      {precision, "--model", "gpt", true},
      {seq, "--model", "gpt", true},
      {vocab, "--model", "gpt", true},
      {features, "--model", "mlp"},
      {hidden, "--model", "mlp"},
      {classes, "--model", "mlp", true},
      {beta1, "--optimizer", "adamw"},
      {beta2, "--optimizer", "adamw"},
      {momentum, "--optimizer", "sgd"},
  };
  auto finish = [a, command_name = sub.get_name(), unused, init_from, resume, allow_changes, data,
                 scoped, sched, chunks, partition, layout, release, ahead, post_validate, timeout,
                 trace, profile, fault, compute_sleep, comm, dp, recompute, no_recompute, min_lr,
                 microbatches, model, program] {
    if (program->count() > 0) {
      if (model->count() > 0) {
        throw InvalidArgument(fmt::format("--program {} and --model {} name two models: drop one",
                                          a->config.program, a->config.model));
      }
      a->config.model = "program";
    }
    CheckScopedOptions(scoped, a->config.model, a->optimizer);
    for (const UnusedOption& u : unused) {
      if (u.option->count() == 0) continue;
      if (u.option == init_from && program->count() > 0) continue;  // `loaded` parameters
      throw InvalidArgument(fmt::format("{}: sluice {} trains nothing, so {}: drop {}", u.name,
                                        command_name, u.why, u.name));
    }
    if (data->count() == 0) {
      a->config.data = a->config.model == "program" ? DefaultProgramData(a->config.program)
                                                    : DefaultData(a->config.model);
    }
    OptimizerConfig& opt = a->config.optimizer;
    if (min_lr->count() == 0) opt.min_lr = std::min(opt.min_lr, opt.lr);  // no floor above peak
    a->pipeline = a->pipe.stages != 1;
    for (const CLI::Option* o : {sched, chunks, partition, layout, release, ahead, timeout, trace,
                                 profile, fault, compute_sleep, comm, dp}) {
      a->pipeline = a->pipeline || o->count() > 0;
    }
    if (post_validate->count() > 0 && a->pipe.stages < 2) {
      throw InvalidArgument(fmt::format(
          "--post-validate overlaps each pipeline stage's optimizer step with the reduction of "
          "the gradient norm across the stages, and --stages {} has no such reduction to hide: "
          "give --stages 2 or more, or drop --post-validate",
          a->pipe.stages));
    }
    if (recompute->count() > 0 && no_recompute->count() > 0) {
      throw InvalidArgument(fmt::format(
          "--recompute {} and --no-recompute (--recompute none) choose two policies: give one",
          a->recompute));
    }
    if (allow_changes->count() > 0 && resume->count() == 0) {
      throw InvalidArgument(
          "--allow-changes lets a --resume change the checkpoint's hyperparameters; without "
          "--resume there is nothing to change: drop it");
    }
    if (resume->count() > 0 && init_from->count() > 0) {
      throw InvalidArgument(fmt::format(
          "--resume {} continues a run with its own weights, which --init-from {} would replace: "
          "give --resume to continue the run, or --init-from to start a new one from its weights",
          a->config.resume_path, a->config.init_from));
    }
    a->recompute_given = recompute->count() > 0 || no_recompute->count() > 0;
    if (a->config.shard_optimizer && a->data_parallel < 2) {
      throw InvalidArgument(fmt::format(
          "--shard-optimizer shards the optimizer state over data-parallel replicas, but "
          "--data-parallel is {}: add --data-parallel D (D >= 2, with --comm mpi under mpirun -np "
          "P*D) or drop --shard-optimizer",
          a->data_parallel));
    }
    a->microbatches_given = microbatches->count() > 0;
    a->partition_given = partition->count() > 0;
    if (!(a->compute_sleep_ms >= 0 && a->compute_sleep_ms <= 60'000)) {
      throw InvalidArgument(
          fmt::format("--inject-compute-ms must be in [0, 60000] ms, got {}", a->compute_sleep_ms));
    }
    // Kept in whole milliseconds: a positive value below one would become 0 ms, which is refused.
    if (!(a->comm_timeout_s >= 1e-3)) {
      throw InvalidArgument(fmt::format(
          "--comm-timeout must be at least 0.001 s (1 ms, the resolution of the timeout), got {}",
          a->comm_timeout_s));
    }
    a->pipe.timeout =
        std::chrono::milliseconds(static_cast<int64_t>(std::min(a->comm_timeout_s, 1e9) * 1000));
  };
  return {a, finish};
}

void Configure(TrainArgs& a) {
  TrainConfig& c = a.config;
  ValidateReservedHeadroom(c.reserved_headroom);
  auto opt = ParseOptimizerKind(a.optimizer);
  if (!opt)
    throw InvalidArgument(fmt::format("--optimizer must be adamw or sgd, not '{}'", a.optimizer));
  c.optimizer.kind = *opt;
  auto lr_schedule = ParseLrSchedule(a.lr_schedule);
  if (!lr_schedule)
    throw InvalidArgument(
        fmt::format("--lr-schedule must be constant or cosine, not '{}'", a.lr_schedule));
  c.optimizer.schedule = *lr_schedule;
  auto attention = ParseGptAttention(a.attention);
  if (!attention)
    throw InvalidArgument(fmt::format("--attention must be one of {}, not '{}'",
                                      EnumNames(kGptAttentionNames, ", "), a.attention));
  c.gpt.attention = *attention;
  auto precision = ParsePrecision(a.precision);
  if (!precision)
    throw InvalidArgument(fmt::format("--precision must be one of {}, not '{}'",
                                      EnumNames(kPrecisionNames, ", "), a.precision));
  c.gpt.precision = *precision;
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
  if (a.pipeline) {
    // A thread per stage in this process (a process per stage under --comm mpi): a count past
    // the threads one process may start failed only after minutes of building the stages.
    if (a.comm != "mpi" && a.pipe.stages > ThreadPool::kMaxThreads) {
      throw InvalidArgument(fmt::format(
          "--stages must be 1 to {}, got {}: each stage is a thread of this process (more run as "
          "MPI processes: --comm mpi)",
          ThreadPool::kMaxThreads, a.pipe.stages));
    }
    if (a.pipeline_schedule != "auto") {
      const auto schedule_kind = pipeline::ParseScheduleKind(a.pipeline_schedule);
      if (!schedule_kind) {
        throw InvalidArgument(fmt::format("unknown schedule '{}': choose one of {} or auto",
                                          a.pipeline_schedule,
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
    // Other models' units are not a GPT's run of equal blocks: cut them by their costs.
    if (!a.partition_given && c.model != "gpt")
      a.pipe.partition = pipeline::PartitionKind::kBalanced;
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
    if (!a.fault.empty()) {
      a.pipe.fault = ParseFault(a.fault);
      // A fault no stage or micro-batch reaches never fires: the test that asked for it would
      // pass without testing anything.
      const pipeline::FaultInjection& f = a.pipe.fault;
      if (f.rank < 0 || f.rank >= a.pipe.stages || f.micro_batch < 0 ||
          f.micro_batch >= c.microbatches) {
        throw InvalidArgument(fmt::format(
            "--inject-fault '{}': stage {} and micro-batch {} must be below --stages {} and the "
            "step's {} micro-batches, or the fault never fires",
            a.fault, f.rank, f.micro_batch, a.pipe.stages, c.microbatches));
      }
    }
    a.pipe.fault.compute_sleep_ns = static_cast<int64_t>(a.compute_sleep_ms * 1e6);
  }
}

PlanRequest MakePlanRequest(const TrainArgs& a) {
  if (a.recompute_given && !a.memory_budget.empty()) {
    throw InvalidArgument(
        "--recompute and --memory-budget both choose the recompute policy: give one of them");
  }
  PlanRequest r{.config = a.config,
                .pipeline = a.pipeline,
                .pipe = a.pipe,
                .data_parallel = a.data_parallel,
                .stage_processes = a.comm == "mpi",
                .automatic = a.pipeline_schedule == "auto",
                .budget_text = a.memory_budget};
  if (!a.memory_budget.empty()) {
    r.budget = ParseMemoryBudget(a.memory_budget, a.pipeline ? a.pipe.stages : 1);
  }
  return r;
}

std::string MemoryShortfall(const SystemMemory& system, int64_t bytes) {
  const int64_t address_left = system.AddressLeft();
  std::string room;
  if (system.available_bytes >= 0 && bytes > system.available_bytes) {
    room = fmt::format("this machine has {} available (MemAvailable)",
                       FormatBytes(system.available_bytes));
  }
  if (address_left >= 0 && bytes > address_left) {
    room += fmt::format("{}the address-space limit (ulimit -v, {}) leaves {}",
                        room.empty() ? "" : " and ", FormatBytes(system.address_limit_bytes),
                        FormatBytes(std::max<int64_t>(address_left, 0)));
  }
  return room;
}

void CheckMemoryFits(const TrainArgs& a, std::vector<StageMemoryForecast> stages) {
  if (a.no_memory_check) return;
  const SystemMemory system = ReadSystemMemory();
  if (system.available_bytes < 0 && system.AddressLeft() < 0) return;  // nothing to compare with
  const TrainConfig& c = a.config;
  if (stages.empty()) {
    try {
      const Job job = MakeJob(c);
      stages = ForecastJob(MakePlanRequest(a), job, c, a.pipe.schedule);
    } catch (const Error&) {
      // A job that cannot be forecast cannot be built either: the trainer's error, which names
      // the option in the words of the engine (`--stages must be at least 1`), comes next.
      return;
    }
  }
  // Stages as threads share this process; under --comm mpi it runs one of them (the largest, at
  // worst).
  MemoryBreakdown peak;
  int64_t total = 0;
  for (const StageMemoryForecast& f : stages) {
    if (a.comm != "mpi") {
      for (size_t u = 0; u < peak.bytes.size(); ++u) peak.bytes[u] += f.at_peak.bytes[u];
      total += f.peak_reserved_bytes;
    } else if (f.peak_reserved_bytes > total) {
      peak = f.at_peak;
      total = f.peak_reserved_bytes;
    }
  }
  const std::string room = MemoryShortfall(system, total);
  if (room.empty()) return;
  std::vector<std::string> parts;
  for (const auto& [use, name] : kMemoryUseNames) {
    if (peak[use] > 0) {
      std::string words(name);
      std::replace(words.begin(), words.end(), '_', ' ');
      parts.push_back(fmt::format("{} {}", words, FormatBytes(peak[use])));
    }
  }
  const int64_t model_bytes =
      peak[MemoryUse::kParameters] + peak[MemoryUse::kOptimizerState] + peak[MemoryUse::kGradients];
  std::string cause;
  if (2 * model_bytes >= total) {
    if (c.model == "gpt") {
      cause = fmt::format(
          "the model's size makes most of it: --dim {} and --layers {} (parameters grow with "
          "layers × dim²); ask for a smaller model",
          c.gpt.dim, c.gpt.layers);
    } else if (c.model == "mlp") {
      cause = fmt::format(
          "the model's size makes most of it: --features {}, --hidden {}, --classes {}; ask for "
          "a smaller model",
          c.mlp.features, c.mlp.hidden, c.mlp.classes);
    } else {
      cause = fmt::format("the model's parameters make most of it: the sizes in {}", c.program);
    }
    if (a.pipeline && a.comm != "mpi") {
      cause += " or place the stages in processes of their own (--comm mpi)";
    }
  } else {
    cause = fmt::format(
        "the activations of its micro-batches make most of it: --batch {} in {} micro-batches "
        "(more --microbatches, a smaller --batch{} or --recompute full keep fewer)",
        c.batch, c.microbatches, c.model == "gpt" ? " or --seq" : "");
  }
  throw ResourceError(fmt::format(
      "this run needs {} of tensor memory at its peak (the forecast of sluice plan: {}), and {}: "
      "{}; or pass --no-memory-check to try anyway",
      FormatBytes(total), fmt::join(parts, ", "), room, cause));
}

}  // namespace sluice::cli
