#include "sluice/train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "sluice/core/caching_allocator.h"
#include "sluice/core/error.h"
#include "sluice/core/system_memory.h"
#include "sluice/io/checkpoint.h"
#include "sluice/io/metrics.h"
#include "sluice/ir/inference_form.h"
#include "sluice/kernels/bf16_probe.h"
#include "sluice/kernels/bf16_products.h"
#include "sluice/kernels/blas.h"
#include "sluice/kernels/matmul.h"
#include "sluice/kernels/onednn_conv.h"
#include "sluice/kernels/onednn_matmul.h"
#include "sluice/kernels/simd_kernels.h"
#include "sluice/nn/data.h"
#include "sluice/train/single_stage.h"
#include "sluice/train/stop_signals.h"
#include "sluice/train/training_checkpoint.h"

namespace sluice {

namespace {

// The kernels the run's products and row kernels use: simd, Highway's target for the row kernels;
// blas, OpenBLAS's core (and what OpenBLAS chose by itself, when sluice replaced it:
// kernels/blas.h); gemm, the engine of f32 GEMMs, gemm_chosen_by what chose it (kernels/matmul.h),
// gemm_epilogue what the f32 linear fuses into the product ("bias" on oneDNN, "none" on OpenBLAS);
// conv, the engine of f32 convolutions (kernels/onednn_conv.h: "onednn" for windows past 1×1 over
// 16 channels or more, im2col for the rest; "im2col" for all under SLUICE_CONV=im2col);
// on oneDNN (f32 or bf16 products), omp_wait_policy how oneDNN's OpenMP threads wait
// (OMP_WAIT_POLICY, read when the process starts: with cores shared, libgomp's default spinning
// made 2-thread steps ~4× slower, docs/benchmarks.md "GEMM epilogues", so while it is unset
// oneDNN runs on one thread: kernels/onednn_matmul.h). Under --precision bf16, bf16_gemm names the
// engine of bf16 products (kernels/bf16_products.h): oneDNN's implementation, or OpenBLAS on
// operands widened to f32 (bf16 storage, f32 compute); bf16_native says whether the CPU has bf16
// instructions (AVX512_BF16 or AMX) as oneDNN sees it; bf16 says what the run does with them
// (storage bf16, compute f32 or bf16) beside the CPU's flags and the measured bf16 dot-product rate
// (kernels/bf16_probe.h), and its one-line text.
nlohmann::json KernelsDescription(Precision precision) {
  const kernels::BlasKernels& blas = kernels::EnsureBlasKernels();
  nlohmann::json k = {{"simd", kernels::SimdTarget()},
                      {"blas", blas.core},
                      {"gemm", kernels::Fp32GemmEngineName()},
                      {"gemm_chosen_by", kernels::Fp32GemmChosenBy()},
                      {"gemm_epilogue", kernels::Fp32GemmOnOneDnn() ? "bias" : "none"},
                      {"conv", kernels::Fp32ConvEngineName()}};
  const bool bf16_on_onednn =
      precision == Precision::kBf16 && std::string(kernels::Bf16GemmEngine()) == "onednn";
  if (kernels::Fp32GemmOnOneDnn() || bf16_on_onednn) {
    const char* wait = std::getenv("OMP_WAIT_POLICY");
    k["omp_wait_policy"] =
        wait == nullptr ? "unset (libgomp's default: oneDNN on the calling thread only)" : wait;
  }
  if (blas.switched) k["blas_openblas_choice"] = blas.openblas_choice;
  if (precision == Precision::kBf16) {
    const std::string engine = kernels::Bf16GemmEngine();
    if (engine == "onednn") {
      k["bf16_gemm"] = "onednn " + kernels::OneDnnImplementation(DType::kBF16, 256, 256, 256);
    } else if (engine == "packed") {
      k["bf16_gemm"] = "packed (bf16 operands widened to f32 in the GEMM's packing)";
    } else {
      k["bf16_gemm"] = "openblas (bf16 operands widened to f32)";
    }
    k["bf16_native"] = kernels::OneDnnBf16Native();
    const kernels::Bf16Products& probe = kernels::ProbeBf16Products();
    k["bf16"] = {{"storage", "bf16"},
                 {"compute", bf16_on_onednn ? "bf16" : "f32"},
                 {"dot_vs_fma", std::round(probe.dot_vs_fma * 100) / 100},
                 {"products_pay", probe.Pay()},
                 {"cpu_flags", probe.Flags()},
                 {"text", kernels::DescribeBf16Compute(probe, bf16_on_onednn)}};
  }
  return k;
}

using Clock = std::chrono::steady_clock;
double MsSince(Clock::time_point t) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t).count();
}

}  // namespace

struct Trainer::Impl {
  TrainConfig config;
  std::unique_ptr<Task> task;
  Model model;                         // one micro-batch's model: parameter names, evaluation
  std::unique_ptr<StepEngine> engine;  // owns the parameters and optimizer state
  CachingAllocator eval_allocator;     // evaluation's activations (not counted in step peaks)
  std::unique_ptr<Executable> eval, logits;
  Scope scope;  // the engine's state (shared) plus evaluation's values
  MetricsWriter metrics;
  int64_t step = 0;
  int64_t data_position = 0;          // the next step's first training batch
  std::vector<std::string> warnings;  // unused parameters; from --resume (LoadTrainingCheckpoint)
  int64_t micro_batch = 0;
  int64_t eval_batch = 0;
  double wall_s = 0;
  int64_t tokens = 0;         // what the throughput counts (tokens or examples), every step
  int64_t unused_params = 0;  // elements of the parameters the loss does not depend on
  int64_t peak_allocated = 0, peak_reserved = 0;
  int64_t skipped = 0;  // steps of this run whose update was withheld
  // Side outputs that failed (TrainSummary::output_failures); the metrics are abandoned after their
  // first failed write.
  std::vector<std::string> output_failures;

  Impl(TrainConfig c, const EngineFactory& factory);
  // Writes a metrics line; a failed write abandons the metrics (kept in output_failures) instead
  // of failing the run.
  void WriteMetrics(const nlohmann::json& line);
  // After `error` (a step that was not finite; the engine withheld its update, so the state is the
  // previous step's): with config.save_path, saves that state as LastFiniteCheckpointPath unless
  // this run trained nothing, then throws `error` naming where it went (or why not).
  // One step; with `lookahead`, the engine is told the next one (StepEngine::Step's `next`).
  StepRecord Step(bool lookahead);
  [[noreturn]] void SaveLastFinite(const NonFiniteError& error, int64_t first_step);
  // Saves a checkpoint at `path`; when that fails, saves the state elsewhere (RescuePaths) and
  // throws IoError naming both.
  void SaveOrRescue(const std::string& path);
};

Trainer::Impl::Impl(TrainConfig c, const EngineFactory& factory)
    : config(std::move(c)),
      eval_allocator(CachingAllocatorOptions{.reserved_headroom = config.reserved_headroom}) {
  ValidateTrainConfig(config);
  task = MakeTask(config);
  // Intra-op threads of the process (0: every core): the engine shares them among its ranks and
  // sets BLAS's count (step/stage_program.h ShareIntraOpThreads); evaluation's runs take them as
  // ExecutableOptions::threads, where 0 means the same.
  const int threads = config.threads;

  micro_batch = config.batch / config.microbatches;
  eval_batch = micro_batch;
  model = task->BuildTrain(micro_batch);
  engine = (factory ? factory : EngineFactory(MakeSingleStageEngine))(
      EngineContext{.config = config, .task = *task, .model = model, .threads = threads});

  ExecutableOptions base{.allocator = &eval_allocator,
                         .mode = config.mode,
                         .gc = config.gc,
                         .threads = threads,
                         .memory_plan = config.memory_plan,
                         .in_place = config.in_place};
  // Evaluation runs the inference form (ir/inference_form.h): batch norm by its running
  // statistics, which evaluating leaves alone, as PyTorch's module.eval().
  eval = std::make_unique<Executable>(InferenceForm(model.forward), base);
  logits = std::make_unique<Executable>(InferenceForm(task->BuildLogits(eval_batch).forward), base);
  for (auto& [name, t] : engine->State()) scope.Set(name, std::move(t));

  // Parameters the loss never reads (nn/training_program.h): a ParamSpec marked constant whose
  // program value is a param. Said once, so a head left out of forward by mistake shows.
  std::vector<std::string> unused;
  for (const ParamSpec& p : model.params) {
    const std::optional<ValueId> v = model.forward.Find(p.name);
    if (p.constant && v && !model.forward.IsConstant(*v)) {
      unused.push_back("%" + p.name);
      unused_params += p.shape.numel();
    }
  }
  if (!unused.empty()) {
    warnings.push_back(fmt::format(
        "the loss does not depend on {} {}: left as {} (no gradient, weight decay, optimizer "
        "state or share of the gradient norm), as PyTorch's optimizers skip a parameter whose "
        ".grad is None",
        unused.size() == 1 ? "parameter" : "parameters", fmt::join(unused, ", "),
        unused.size() == 1 ? "it is" : "they are"));
  }
  if (!config.init_from.empty()) {
    LoadTrainingCheckpoint(config.init_from, LoadKind::kInitFrom, *task, model.params, config,
                           scope, eval_allocator);
  }
  if (!config.resume_path.empty()) {
    const TrainingCheckpointInfo resumed =
        LoadTrainingCheckpoint(config.resume_path, LoadKind::kResume, *task, model.params, config,
                               scope, eval_allocator, engine->optimizer_state_slice());
    step = resumed.step;
    data_position = resumed.data_position;
    warnings.insert(warnings.end(), resumed.warnings.begin(), resumed.warnings.end());
  }
  if (!config.init_from.empty() || !config.resume_path.empty()) engine->StateLoaded();
  if (!config.metrics_path.empty() && engine->leader()) {
    metrics = MetricsWriter(config.metrics_path, /*append=*/!config.resume_path.empty());
  }
}

Trainer::Trainer(TrainConfig config, const EngineFactory& engine)
    : impl_(std::make_unique<Impl>(std::move(config), engine)) {}
Trainer::~Trainer() = default;

int64_t Trainer::step() const { return impl_->step; }
Throughput Trainer::throughput() const { return impl_->task->ThroughputPerSample(); }
const std::vector<std::string>& Trainer::warnings() const { return impl_->warnings; }
const TrainConfig& Trainer::config() const { return impl_->config; }
const StepEngine& Trainer::engine() const { return *impl_->engine; }
const Task& Trainer::task() const { return *impl_->task; }
const Tensor& Trainer::Value(const std::string& name) const { return impl_->scope.Get(name); }
bool Trainer::Has(const std::string& name) const { return impl_->scope.Has(name); }
std::vector<std::string> Trainer::ParamNames() const {
  std::vector<std::string> names;
  for (const ParamSpec& p : impl_->model.params) names.push_back(p.name);
  return names;
}

StepRecord Trainer::Step() { return impl_->Step(/*lookahead=*/false); }

StepRecord Trainer::Impl::Step(bool lookahead) {
  Impl& impl = *this;
  const TrainConfig& c = impl.config;
  const auto t0 = Clock::now();
  StepRecord r;
  r.lr = LearningRate(c.optimizer, impl.step, c.steps);
  std::optional<StepEngine::NextStep> next;
  if (lookahead && impl.step + 1 < c.steps) {
    next = StepEngine::NextStep{.step = impl.step + 1,
                                .first_batch = impl.data_position + c.microbatches,
                                .lr = LearningRate(c.optimizer, impl.step + 1, c.steps)};
  }
  StepResult s = impl.engine->Step(impl.step, impl.data_position, r.lr, next);
  for (std::string& failure : impl.engine->TakeOutputFailures())
    impl.output_failures.push_back(std::move(failure));
  ++impl.step;
  impl.data_position += c.microbatches;
  r.step = impl.step;
  r.loss = s.loss;
  r.grad_norm = s.grad_norm;
  r.step_ms = MsSince(t0);
  const Throughput unit = impl.task->ThroughputPerSample();
  const int64_t tokens = c.batch * unit.per_sample;
  r.per_s = static_cast<double>(tokens) / (r.step_ms / 1000.0);
  r.peak_allocated_bytes = s.peak_allocated_bytes;
  r.peak_reserved_bytes = s.peak_reserved_bytes;
  impl.wall_s += r.step_ms / 1000.0;
  impl.tokens += tokens;
  impl.peak_allocated = std::max(impl.peak_allocated, r.peak_allocated_bytes);
  impl.peak_reserved = std::max(impl.peak_reserved, r.peak_reserved_bytes);
  // The engine withheld the update of a step whose loss or norm is not finite (on a pipeline,
  // judged on the all-reduced figures); the trainer decides whether training goes on.
  const bool finite = s.updated && std::isfinite(r.loss) && std::isfinite(r.grad_norm);
  r.skipped = !finite && impl.skipped < c.skip_nonfinite;
  nlohmann::json line = {{"step", r.step},
                         {"loss", r.loss},
                         {"lr", r.lr},
                         {"grad_norm", r.grad_norm},
                         {fmt::format("{}_per_s", unit.unit), r.per_s},
                         {"step_ms", r.step_ms},
                         {"peak_allocated_bytes", r.peak_allocated_bytes},
                         {"peak_reserved_bytes", r.peak_reserved_bytes}};
  if (r.skipped) line["skipped"] = true;
  impl.WriteMetrics(line);
  if (r.skipped) {
    ++impl.skipped;
  } else if (!finite) {
    impl.engine->Drain();  // a step running ahead is not taken: the state is this step's
    const std::string skipped =
        c.skip_nonfinite > 0
            ? fmt::format(" after skipping {} such step{} (--skip-nonfinite {})", impl.skipped,
                          impl.skipped == 1 ? "" : "s", c.skip_nonfinite)
            : std::string();
    throw NonFiniteError(fmt::format(
        "step {}: the loss is {} and the gradient norm {}; training stopped there{}, no "
        "checkpoint of it is saved (lower --lr, clip gradients with --clip, or skip such steps "
        "with --skip-nonfinite N)",
        r.step, r.loss, r.grad_norm, skipped));
  }
  return r;
}

EvalRecord Trainer::Evaluate() {
  Impl& impl = *impl_;
  const TrainConfig& c = impl.config;
  EvalRecord e;
  e.step = impl.step;
  // A distributed engine gathers the whole model on the leader, which evaluates alone.
  std::map<std::string, Tensor> params = impl.engine->GatherParams(impl.eval_allocator);
  if (!impl.engine->leader()) return e;
  for (auto& [name, t] : params) impl.scope.Set(name, std::move(t));
  double sum = 0;
  for (int64_t i = 0; i < c.eval_batches; ++i) {
    impl.task->BindBatch(impl.scope, DataSplit::kValidation, i, impl.eval_batch, c.seed);
    impl.eval->Run(impl.scope);
    sum += impl.scope.Get(impl.model.loss).FlatAt(0);
  }
  impl.scope.Erase(impl.model.loss);
  e.val_loss = sum / static_cast<double>(c.eval_batches);
  e.accuracy =
      impl.task->Accuracy(*impl.logits, impl.scope, c.eval_batches, impl.eval_batch, c.seed);
  nlohmann::json line = {{"step", e.step}, {"val_loss", e.val_loss}};
  if (e.accuracy >= 0) line["accuracy"] = e.accuracy;
  impl.WriteMetrics(line);
  return e;
}

void Trainer::SaveCheckpoint(const std::string& path) const {
  const Impl& impl = *impl_;
  impl.engine->SaveCheckpoint(
      path, TrainingCheckpointMetadata(*impl.task, impl.config, impl.step, impl.data_position));
}

namespace {

// Where a checkpoint that could not be written at `path` goes instead, in order of preference:
// beside it, then in the temporary folder (the same list on every rank of a distributed run).
std::vector<std::string> RescuePaths(const std::string& path, int64_t step) {
  const std::string suffix = fmt::format(".rescue-step{}.safetensors", step);
  std::error_code ec;
  std::filesystem::path tmp = std::filesystem::temp_directory_path(ec);
  if (ec) tmp = "/tmp";
  return {path + suffix,
          (tmp / (std::filesystem::path(path).filename().string() + suffix)).string()};
}

}  // namespace

void Trainer::Impl::WriteMetrics(const nlohmann::json& line) {
  try {
    metrics.Write(line);
  } catch (const IoError& e) {
    output_failures.push_back(fmt::format("{}; no more metrics are written", e.what()));
    metrics = MetricsWriter();
  }
}

void Trainer::Impl::SaveLastFinite(const NonFiniteError& error, int64_t first_step) {
  const int64_t good = step - 1;
  if (config.save_path.empty() || good <= first_step) throw error;
  // The state in memory is step `good`'s: roll the counters back to it for the metadata.
  step = good;
  data_position -= config.microbatches;
  const std::string path = LastFiniteCheckpointPath(config.save_path, good);
  try {
    SaveOrRescue(path);
  } catch (const IoError& e) {
    throw NonFiniteError(
        fmt::format("{}; saving the last finite state failed: {}", error.what(), e.what()));
  }
  throw NonFiniteError(
      fmt::format("{}; the last finite state (step {}) is saved to '{}': resume from it with "
                  "--resume {} (and --allow-changes to go on with a lower --lr)",
                  error.what(), good, path, path));
}

std::string LastFiniteCheckpointPath(const std::string& save_path, int64_t step) {
  return fmt::format("{}.last-finite-step{}.safetensors", save_path, step);
}

std::string StopCheckpointPath(const TrainConfig& config, int64_t step) {
  if (!config.save_path.empty()) return config.save_path;
  const std::string name = fmt::format("sluice-stopped-step{}.safetensors", step);
  if (config.metrics_path.empty()) return name;
  return (std::filesystem::path(config.metrics_path).parent_path() / name).string();
}

void Trainer::Impl::SaveOrRescue(const std::string& path) {
  const std::map<std::string, std::string> metadata =
      TrainingCheckpointMetadata(*task, config, step, data_position);
  // Every rank of a distributed run gets the same verdicts (TrySaveCheckpoint is collective), so
  // all try the same paths and end with the same outcome.
  const std::optional<std::string> failure = engine->TrySaveCheckpoint(path, metadata);
  if (!failure) return;
  std::string failures;
  for (const std::string& rescue : RescuePaths(path, step)) {
    if (std::optional<std::string> again = engine->TrySaveCheckpoint(rescue, metadata)) {
      failures += fmt::format("; saving it to '{}' failed too: {}", rescue, *again);
      continue;
    }
    throw IoError(fmt::format(
        "{}; the trained state (step {}) is saved to '{}' instead: resume from it with --resume {}",
        *failure, step, rescue, rescue));
  }
  throw IoError(fmt::format("{}{}; the trained state (step {}) is lost", *failure, failures, step));
}

TrainSummary Trainer::Run(const std::function<void(const StepRecord&)>& on_step,
                          const std::function<void(const EvalRecord&)>& on_eval,
                          const std::function<int()>& stop) {
  Impl& impl = *impl_;
  const TrainConfig& c = impl.config;
  TrainSummary s;
  StepRecord last;
  const int64_t first_step = impl.step;
  int64_t saved_step = -1;  // the step of the last checkpoint this run wrote
  // What follows step count n: an evaluation, a checkpoint. Either needs the state settled, so
  // the engine is told no next step before one (nor before the end, which does both).
  const auto evaluates = [&](int64_t n) {
    return n == c.steps || (c.eval_every > 0 && n % c.eval_every == 0);
  };
  const auto saves = [&](int64_t n) {
    return !c.save_path.empty() && (n == c.steps || (c.save_every > 0 && n % c.save_every == 0));
  };
  while (impl.step < c.steps) {
    bool stopping = false;
    if (stop) {
      s.stop_signal = impl.engine->AgreeOnStop(stop(), impl.step);
      if (s.stop_signal != 0) {
        if (!impl.engine->RunningAhead()) break;
        stopping = s.stopped_ahead = true;  // finish the step begun ahead, then stop
      }
    }
    try {
      const int64_t n = impl.step + 1;
      last = impl.Step(/*lookahead=*/!stopping && n < c.steps && !evaluates(n) && !saves(n));
    } catch (const NonFiniteError& e) {
      impl.SaveLastFinite(e, first_step);  // throws
    }
    s.final_loss = last.loss;
    if (on_step) on_step(last);
    if (evaluates(impl.step)) {
      s.last_eval = Evaluate();
      if (on_eval) on_eval(s.last_eval);
    }
    if (saves(impl.step)) {
      impl.SaveOrRescue(c.save_path);
      saved_step = impl.step;
    }
    if (stopping) break;
  }
  if (s.stop_signal != 0 && impl.step > first_step) {
    s.stop_checkpoint = StopCheckpointPath(c, impl.step);
    if (saved_step != impl.step || s.stop_checkpoint != c.save_path)
      impl.SaveOrRescue(s.stop_checkpoint);
  }
  s.steps = impl.step;
  s.wall_s = impl.wall_s;
  s.per_s = impl.wall_s > 0 ? static_cast<double>(impl.tokens) / impl.wall_s : 0;
  s.peak_allocated_bytes = impl.peak_allocated;
  s.peak_reserved_bytes = impl.peak_reserved;
  s.peak_resident_bytes = ReadSystemMemory().peak_resident_bytes;
  s.params = CountParams(impl.model.params);
  s.unused_params = impl.unused_params;
  s.skipped = impl.skipped;
  nlohmann::json summary = {
      {"summary", true},
      {"steps", s.steps},
      {"final_loss", s.final_loss},
      {"val_loss", s.last_eval.val_loss},
      {"wall_s", s.wall_s},
      {fmt::format("{}_per_s", impl.task->ThroughputPerSample().unit), s.per_s},
      {"peak_allocated_bytes", s.peak_allocated_bytes},
      {"peak_reserved_bytes", s.peak_reserved_bytes},
      {"peak_resident_bytes", s.peak_resident_bytes},
      {"params", s.params},
      {"unused_params", s.unused_params},
      {"skipped", s.skipped},
      {"gc", DescribeGcMode(c.gc, impl.engine->gc_mode())},
      {"memory_plan", Name(c.memory_plan)},
      {"in_place", c.in_place},
      {"config", impl.task->Describe()},
      {"kernels", KernelsDescription(impl.task->precision())}};
  // Under bf16: which of the model's ops run bf16 and which f32 (the fallback, ir/autocast.h).
  if (nlohmann::json ops = impl.task->PrecisionOps(); !ops.is_null()) summary["precision"] = ops;
  if (s.last_eval.accuracy >= 0) summary["accuracy"] = s.last_eval.accuracy;
  if (s.stop_signal != 0) summary["stopped"] = SignalName(s.stop_signal);
  if (nlohmann::json extra = impl.engine->Summary(); extra.is_object()) summary.update(extra);
  if (!c.metrics_path.empty() && impl.engine->leader()) {
    // What `sluice plan` predicts beside what was measured, per stage.
    const std::vector<StageMemoryForecast> forecast = impl.engine->Forecast();
    nlohmann::json* stages = summary.contains("stages") ? &summary["stages"] : nullptr;
    for (size_t s = 0; s < forecast.size(); ++s) {
      nlohmann::json& entry = stages != nullptr && s < stages->size() ? (*stages)[s] : summary;
      entry["predicted_peak_allocated_bytes"] = forecast[s].peak_allocated_bytes;
      entry["least_peak_allocated_bytes"] = forecast[s].least_peak_allocated_bytes;
      entry["predicted_peak_reserved_bytes"] = forecast[s].peak_reserved_bytes;
    }
  }
  impl.WriteMetrics(summary);
  s.output_failures = impl.output_failures;
  return s;
}

}  // namespace sluice
