#include "sluice/train/trainer.h"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "sluice/autodiff/autodiff.h"
#include "sluice/core/caching_allocator.h"
#include "sluice/core/error.h"
#include "sluice/io/checkpoint.h"
#include "sluice/io/metrics.h"
#include "sluice/nn/data.h"

namespace sluice {

namespace {

using Clock = std::chrono::steady_clock;
double MsSince(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

// What differs between models: how a batch is bound and how accuracy is measured.
class Task {
 public:
  virtual ~Task() = default;
  virtual Model BuildTrain(int64_t batch) const = 0;
  virtual Model BuildLogits(int64_t batch) const = 0;
  virtual void BindBatch(Scope& scope, DataSplit split, int64_t index, int64_t batch, uint64_t seed) const = 0;
  virtual int64_t TokensPerSample() const = 0;
  // Exact-match accuracy over `batches` validation batches; -1 when the task has none.
  virtual double Accuracy(Executable& logits, Scope& scope, int64_t batches, int64_t batch, uint64_t seed) const = 0;
  virtual nlohmann::json Describe() const = 0;
};

class GptTask final : public Task {
 public:
  GptTask(const TrainConfig& c) {
    if (c.data == "sort") {
      data_ = std::make_unique<SortDataset>();
    } else {
      data_ = std::make_unique<TextDataset>(c.data, c.gpt.seq > 0 ? c.gpt.seq : 64);
    }
    cfg_ = c.gpt;
    if (cfg_.vocab == 0) cfg_.vocab = data_->vocab_size();
    if (cfg_.seq == 0) cfg_.seq = data_->seq_len();
    if (cfg_.vocab < data_->vocab_size()) {
      throw InvalidArgument(fmt::format("--vocab {} is smaller than the data's vocabulary {} ({}): raise --vocab",
                                        cfg_.vocab, data_->vocab_size(), data_->name()));
    }
    if (data_->seq_len() > cfg_.seq) {
      throw InvalidArgument(fmt::format("the data's sequences have {} tokens but the model takes at most --seq {}: "
                                        "raise --seq", data_->seq_len(), cfg_.seq));
    }
    ValidateGptConfig(cfg_);
  }
  Model BuildTrain(int64_t batch) const override { return BuildGpt(cfg_, batch, GptOutput::kLoss, data_->seq_len()); }
  Model BuildLogits(int64_t batch) const override { return BuildGpt(cfg_, batch, GptOutput::kLogits, data_->seq_len()); }
  void BindBatch(Scope& scope, DataSplit split, int64_t index, int64_t batch, uint64_t seed) const override {
    Batch b = data_->GetBatch(split, index, batch, seed);
    scope.Set("ids", std::move(b.ids));
    scope.Set("targets", std::move(b.targets));
  }
  int64_t TokensPerSample() const override { return data_->seq_len(); }

  // Sort: generate the answer greedily, one digit per forward pass, and count sequences whose
  // every digit is right.
  double Accuracy(Executable& logits, Scope& scope, int64_t batches, int64_t batch, uint64_t seed) const override {
    const auto* sort = dynamic_cast<const SortDataset*>(data_.get());
    if (sort == nullptr) return -1;
    const int64_t n = sort->num_digits(), T = data_->seq_len(), V = cfg_.vocab;
    int64_t correct = 0, total = 0;
    for (int64_t i = 0; i < batches; ++i) {
      Batch b = data_->GetBatch(DataSplit::kValidation, i, batch, seed);
      Tensor gen = b.ids.Clone();
      std::vector<bool> ok(batch, true);
      for (int64_t t = n; t < T; ++t) {
        scope.Set("ids", gen);
        logits.Run(scope);
        const float* lg = scope.Get("logits").data<float>();
        for (int64_t r = 0; r < batch; ++r) {
          const float* row = lg + (r * T + t) * V;
          int64_t pred = std::max_element(row, row + V) - row;
          ok[r] = ok[r] && pred == b.targets.data<int64_t>()[r * T + t];
          if (t + 1 < T) gen.data<int64_t>()[r * T + t + 1] = pred;
        }
      }
      correct += std::count(ok.begin(), ok.end(), true);
      total += batch;
    }
    scope.Erase("ids");
    scope.Erase("logits");
    return static_cast<double>(correct) / static_cast<double>(total);
  }
  nlohmann::json Describe() const override {
    return {{"model", "gpt"}, {"vocab", cfg_.vocab}, {"seq", cfg_.seq}, {"layers", cfg_.layers},
            {"heads", cfg_.heads}, {"dim", cfg_.dim}, {"data", data_->name()}};
  }

 private:
  std::unique_ptr<Dataset> data_;
  GptConfig cfg_;
};

class MlpTask final : public Task {
 public:
  MlpTask(const TrainConfig& c) : cfg_(c.mlp), data_(c.mlp, c.seed) {
    if (c.data != "blobs" && c.data != "sort") {
      throw InvalidArgument(fmt::format("--model mlp trains on --data blobs, not '{}'", c.data));
    }
  }
  Model BuildTrain(int64_t batch) const override { return BuildMlp(cfg_, batch, MlpOutput::kLoss); }
  Model BuildLogits(int64_t batch) const override { return BuildMlp(cfg_, batch, MlpOutput::kLogits); }
  void BindBatch(Scope& scope, DataSplit split, int64_t index, int64_t batch, uint64_t) const override {
    auto [x, labels] = data_.GetBatch(split, index, batch);
    scope.Set("x", std::move(x));
    scope.Set("labels", std::move(labels));
  }
  int64_t TokensPerSample() const override { return 1; }
  double Accuracy(Executable& logits, Scope& scope, int64_t batches, int64_t batch, uint64_t) const override {
    int64_t correct = 0;
    for (int64_t i = 0; i < batches; ++i) {
      auto [x, labels] = data_.GetBatch(DataSplit::kValidation, i, batch);
      scope.Set("x", x);
      logits.Run(scope);
      const float* lg = scope.Get("logits").data<float>();
      for (int64_t r = 0; r < batch; ++r) {
        const float* row = lg + r * cfg_.classes;
        correct += (std::max_element(row, row + cfg_.classes) - row) == labels.data<int64_t>()[r];
      }
    }
    scope.Erase("x");
    scope.Erase("logits");
    return static_cast<double>(correct) / static_cast<double>(batches * batch);
  }
  nlohmann::json Describe() const override {
    return {{"model", "mlp"}, {"features", cfg_.features}, {"hidden", cfg_.hidden}, {"classes", cfg_.classes},
            {"layers", cfg_.layers}, {"data", "blobs"}};
  }

 private:
  MlpConfig cfg_;
  BlobsDataset data_;
};

void ValidateTrainConfig(const TrainConfig& c) {
  auto bad = [](const std::string& what) { throw InvalidArgument(what); };
  if (c.steps < 1) bad(fmt::format("--steps must be at least 1, got {}", c.steps));
  if (c.batch < 1) bad(fmt::format("--batch must be at least 1, got {}", c.batch));
  if (c.microbatches < 1 || c.batch % c.microbatches != 0) {
    bad(fmt::format("--microbatches {} must divide --batch {}", c.microbatches, c.batch));
  }
  if (c.optimizer.lr <= 0) bad(fmt::format("--lr must be positive, got {}", c.optimizer.lr));
  if (c.eval_batches < 1) bad("--eval-batches must be at least 1");
  if (c.model != "gpt" && c.model != "mlp") bad(fmt::format("--model must be gpt or mlp, not '{}'", c.model));
}

}  // namespace

struct Trainer::Impl {
  TrainConfig config;
  CachingAllocator allocator;
  std::unique_ptr<Task> task;
  Model model;
  Backward backward;
  std::unique_ptr<Executable> forward, backward_exe, optimizer, eval, logits;
  Scope scope;
  GradientAccumulator grads;
  MetricsWriter metrics;
  int64_t step = 0;
  int64_t micro_batch = 0;
  int64_t eval_batch = 0;
  double wall_s = 0;
  int64_t tokens = 0;
  int64_t peak_allocated = 0, peak_reserved = 0;

  explicit Impl(TrainConfig c);
  std::map<std::string, Tensor> StateTensors() const;
  void LoadWeights(const Checkpoint& ckpt, bool with_optimizer_state);
};

Trainer::Impl::Impl(TrainConfig c) : config(std::move(c)) {
  ValidateTrainConfig(config);
  if (config.model == "gpt") {
    task = std::make_unique<GptTask>(config);
  } else {
    task = std::make_unique<MlpTask>(config);
  }
  const int threads = config.threads > 0 ? config.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  openblas_set_num_threads(threads);

  micro_batch = config.batch / config.microbatches;
  eval_batch = micro_batch;
  model = task->BuildTrain(micro_batch);
  std::vector<std::string> wrt;
  for (const ParamSpec& p : model.params) wrt.push_back(p.name);
  backward = BuildBackward(model.forward, {.loss = model.loss, .wrt = wrt, .recompute = config.recompute});

  ExecutableOptions base{.allocator = &allocator, .mode = config.mode, .gc = config.gc, .threads = threads};
  ExecutableOptions fwd_opts = base;
  fwd_opts.keep = backward.saved;
  forward = std::make_unique<Executable>(model.forward, fwd_opts);
  ExecutableOptions bwd_opts = base;
  bwd_opts.donate = backward.saved;  // saved activations die at their last backward use
  backward_exe = std::make_unique<Executable>(backward.program, bwd_opts);
  optimizer = std::make_unique<Executable>(BuildOptimizer(model.params, config.optimizer), base);
  eval = std::make_unique<Executable>(model.forward, base);
  logits = std::make_unique<Executable>(task->BuildLogits(eval_batch).forward, base);

  for (auto& [name, t] : InitParams(model.params, config.seed, allocator)) scope.Set(name, std::move(t));
  for (auto& [name, t] : InitOptimizerState(model.params, config.optimizer, allocator)) scope.Set(name, std::move(t));

  if (!config.init_from.empty()) LoadWeights(LoadCheckpoint(config.init_from, allocator), false);
  if (!config.resume_path.empty()) {
    Checkpoint ckpt = LoadCheckpoint(config.resume_path, allocator);
    LoadWeights(ckpt, true);
    step = std::stoll(ckpt.metadata.at("step"));
    if (ckpt.metadata.count("data_seed") && std::stoull(ckpt.metadata.at("data_seed")) != config.seed) {
      throw InvalidArgument(fmt::format("checkpoint '{}' was trained with --seed {}; resume with the same seed",
                                        config.resume_path, ckpt.metadata.at("data_seed")));
    }
  }
  if (!config.metrics_path.empty()) metrics = MetricsWriter(config.metrics_path, /*append=*/!config.resume_path.empty());
}

void Trainer::Impl::LoadWeights(const Checkpoint& ckpt, bool with_optimizer_state) {
  std::vector<std::string> problems;
  std::vector<std::string> expected;
  for (const ParamSpec& p : model.params) {
    expected.push_back(p.name);
    if (with_optimizer_state) {
      for (const std::string& s : OptimizerStateNames(p.name, config.optimizer)) expected.push_back(s);
    }
  }
  for (const std::string& name : expected) {
    auto it = ckpt.tensors.find(name);
    const Tensor& current = scope.Get(name);
    if (it == ckpt.tensors.end()) {
      problems.push_back(fmt::format("missing tensor '{}' ({}{})", name, Name(current.dtype()), current.shape().ToString()));
    } else if (it->second.shape() != current.shape() || it->second.dtype() != current.dtype()) {
      problems.push_back(fmt::format("tensor '{}' is {}{} but the model needs {}{}", name, Name(it->second.dtype()),
                                     it->second.shape().ToString(), Name(current.dtype()), current.shape().ToString()));
    }
  }
  for (const auto& [name, t] : ckpt.tensors) {
    if (std::find(expected.begin(), expected.end(), name) == expected.end() &&
        (with_optimizer_state || !ckpt.metadata.count("step"))) {
      problems.push_back(fmt::format("unexpected tensor '{}' (not a {} of this model)", name,
                                     with_optimizer_state ? "parameter or optimizer state" : "parameter"));
    }
  }
  if (!problems.empty()) {
    throw InvalidArgument(fmt::format("cannot load '{}' into this model:\n  {}", ckpt.path, fmt::join(problems, "\n  ")));
  }
  for (const std::string& name : expected) scope.Set(name, ckpt.tensors.at(name));
}

std::map<std::string, Tensor> Trainer::Impl::StateTensors() const {
  std::map<std::string, Tensor> out;
  for (const ParamSpec& p : model.params) {
    out.emplace(p.name, scope.Get(p.name));
    for (const std::string& s : OptimizerStateNames(p.name, config.optimizer)) out.emplace(s, scope.Get(s));
  }
  return out;
}

Trainer::Trainer(TrainConfig config) : impl_(std::make_unique<Impl>(std::move(config))) {}
Trainer::~Trainer() = default;

int64_t Trainer::step() const { return impl_->step; }
const TrainConfig& Trainer::config() const { return impl_->config; }
const Tensor& Trainer::Value(const std::string& name) const { return impl_->scope.Get(name); }
std::vector<std::string> Trainer::ParamNames() const {
  std::vector<std::string> names;
  for (const ParamSpec& p : impl_->model.params) names.push_back(p.name);
  return names;
}

StepRecord Trainer::Step() {
  Impl& m = *impl_;
  const TrainConfig& c = m.config;
  const auto t0 = Clock::now();
  // Each run restarts the allocator's peak, so the step's peak is the largest of its runs' peaks.
  int64_t peak_allocated = 0, peak_reserved = 0;
  auto track = [&](const RunStats& s) {
    peak_allocated = std::max(peak_allocated, s.peak_allocated_bytes);
    peak_reserved = std::max(peak_reserved, s.peak_reserved_bytes);
  };
  double loss_sum = 0;
  for (int64_t k = 0; k < c.microbatches; ++k) {
    m.task->BindBatch(m.scope, DataSplit::kTrain, m.step * c.microbatches + k, m.micro_batch, c.seed);
    track(m.forward->Run(m.scope));
    loss_sum += m.scope.Get(m.model.loss).FlatAt(0);
    track(m.backward_exe->Run(m.scope));
    for (const std::string& g : m.backward.grads) m.grads.Add(g, m.scope.Take(g));
  }
  StepRecord r;
  r.grad_norm = m.grads.Finish(c.microbatches, c.optimizer.clip_norm);
  r.lr = LearningRate(c.optimizer, m.step, c.steps);
  for (const auto& [name, g] : m.grads.grads()) m.scope.Set(name, g);
  m.grads.Clear();
  m.scope.Set("lr", Tensor::Full({}, r.lr, DType::kF32, m.allocator));
  m.scope.Set("step", Tensor::Full({}, static_cast<double>(m.step + 1), DType::kF32, m.allocator));
  track(m.optimizer->Run(m.scope));
  for (const std::string& g : m.backward.grads) m.scope.Erase(g);
  m.scope.Erase(m.model.loss);

  ++m.step;
  r.step = m.step;
  r.loss = loss_sum / static_cast<double>(c.microbatches);
  r.step_ms = MsSince(t0);
  const int64_t tokens = c.batch * m.task->TokensPerSample();
  r.tokens_per_s = static_cast<double>(tokens) / (r.step_ms / 1000.0);
  r.peak_allocated_bytes = peak_allocated;
  r.peak_reserved_bytes = peak_reserved;
  m.wall_s += r.step_ms / 1000.0;
  m.tokens += tokens;
  m.peak_allocated = std::max(m.peak_allocated, r.peak_allocated_bytes);
  m.peak_reserved = std::max(m.peak_reserved, r.peak_reserved_bytes);
  m.metrics.Write({{"step", r.step}, {"loss", r.loss}, {"lr", r.lr}, {"grad_norm", r.grad_norm},
                   {"tokens_per_s", r.tokens_per_s}, {"step_ms", r.step_ms},
                   {"peak_allocated_bytes", r.peak_allocated_bytes}, {"peak_reserved_bytes", r.peak_reserved_bytes}});
  return r;
}

EvalRecord Trainer::Evaluate() {
  Impl& m = *impl_;
  const TrainConfig& c = m.config;
  EvalRecord e;
  e.step = m.step;
  double sum = 0;
  for (int64_t i = 0; i < c.eval_batches; ++i) {
    m.task->BindBatch(m.scope, DataSplit::kValidation, i, m.eval_batch, c.seed);
    m.eval->Run(m.scope);
    sum += m.scope.Get(m.model.loss).FlatAt(0);
  }
  m.scope.Erase(m.model.loss);
  e.val_loss = sum / static_cast<double>(c.eval_batches);
  e.accuracy = m.task->Accuracy(*m.logits, m.scope, c.eval_batches, m.eval_batch, c.seed);
  nlohmann::json line = {{"step", e.step}, {"val_loss", e.val_loss}};
  if (e.accuracy >= 0) line["accuracy"] = e.accuracy;
  m.metrics.Write(line);
  return e;
}

void Trainer::SaveCheckpoint(const std::string& path) const {
  const Impl& m = *impl_;
  nlohmann::json config = m.task->Describe();
  config["optimizer"] = m.config.optimizer.kind == OptimizerKind::kAdamW ? "adamw" : "sgd";
  std::map<std::string, std::string> metadata = {
      {"format", "sluice-checkpoint-1"},
      {"step", std::to_string(m.step)},
      {"data_seed", std::to_string(m.config.seed)},
      {"data_position", std::to_string(m.step * m.config.microbatches)},
      {"config", config.dump()},
  };
  SaveCheckpointAtomic(path, m.StateTensors(), metadata);
}

TrainSummary Trainer::Run(const std::function<void(const StepRecord&)>& on_step,
                          const std::function<void(const EvalRecord&)>& on_eval) {
  Impl& m = *impl_;
  const TrainConfig& c = m.config;
  TrainSummary s;
  StepRecord last;
  while (m.step < c.steps) {
    last = Step();
    s.final_loss = last.loss;
    if (on_step) on_step(last);
    const bool final = m.step == c.steps;
    if (final || (c.eval_every > 0 && m.step % c.eval_every == 0)) {
      s.last_eval = Evaluate();
      if (on_eval) on_eval(s.last_eval);
    }
    if (!c.save_path.empty() && (final || (c.save_every > 0 && m.step % c.save_every == 0))) SaveCheckpoint(c.save_path);
  }
  s.steps = m.step;
  s.wall_s = m.wall_s;
  s.tokens_per_s = m.wall_s > 0 ? static_cast<double>(m.tokens) / m.wall_s : 0;
  s.peak_allocated_bytes = m.peak_allocated;
  s.peak_reserved_bytes = m.peak_reserved;
  s.params = CountParams(m.model.params);
  nlohmann::json summary = {{"summary", true}, {"steps", s.steps}, {"final_loss", s.final_loss},
                            {"val_loss", s.last_eval.val_loss}, {"wall_s", s.wall_s},
                            {"tokens_per_s", s.tokens_per_s}, {"peak_allocated_bytes", s.peak_allocated_bytes},
                            {"peak_reserved_bytes", s.peak_reserved_bytes}, {"params", s.params},
                            {"gc", std::string(Name(c.gc))}, {"config", m.task->Describe()}};
  if (s.last_eval.accuracy >= 0) summary["accuracy"] = s.last_eval.accuracy;
  m.metrics.Write(summary);
  return s;
}

}  // namespace sluice
