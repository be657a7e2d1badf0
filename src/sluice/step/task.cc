#include "sluice/step/task.h"

#include <algorithm>
#include <limits>
#include <string>

#include <fmt/format.h>

#include "sluice/core/error.h"
#include "sluice/nn/mlp.h"
#include "sluice/nn/training_program.h"
#include "sluice/step/config_checks.h"
#include "sluice/step/program_task.h"
#include "sluice/step/train_config.h"

namespace sluice {

namespace {

class GptTask final : public Task {
 public:
  GptTask(const TrainConfig& c) {
    data_ = OpenTokenData(c.data, c.gpt.seq > 0 ? c.gpt.seq : 64, c.gpt.vocab);
    cfg_ = c.gpt;
    if (cfg_.vocab == 0) cfg_.vocab = data_->vocab_size();
    if (cfg_.seq == 0) cfg_.seq = data_->seq_len();
    if (cfg_.vocab < data_->vocab_size()) {
      throw InvalidArgument(
          fmt::format("--vocab {} is smaller than the data's vocabulary {} ({}): raise --vocab",
                      cfg_.vocab, data_->vocab_size(), data_->name()));
    }
    if (data_->seq_len() > cfg_.seq) {
      throw InvalidArgument(
          fmt::format("the data's sequences have {} tokens but the model takes at most --seq {}: "
                      "raise --seq",
                      data_->seq_len(), cfg_.seq));
    }
    ValidateGptConfig(cfg_);
  }
  Model BuildTrain(int64_t batch) const override {
    return BuildGpt(cfg_, batch, GptOutput::kLoss, data_->seq_len());
  }
  Model BuildLogits(int64_t batch) const override {
    return BuildGpt(cfg_, batch, GptOutput::kLogits, data_->seq_len());
  }
  ModelUnits Units(int64_t batch) const override { return GptUnits(cfg_, batch, data_->seq_len()); }
  Model BuildPiece(int64_t batch, const UnitRange& range) const override {
    return BuildGptSlice(cfg_, batch, GptOutput::kLoss, data_->seq_len(),
                         GptSliceOfUnits(range, cfg_.layers));
  }
  void BindBatch(Scope& scope, DataSplit split, int64_t index, int64_t batch,
                 uint64_t seed) const override {
    Batch b = data_->GetBatch(split, index, batch, seed);
    scope.Set("ids", std::move(b.ids));
    scope.Set("targets", std::move(b.targets));
    if (cfg_.dropout > 0) scope.Set(kRandomKeyArray, RandomKey(split, index, batch, seed));
  }
  Throughput ThroughputPerSample() const override { return {data_->seq_len(), "tokens"}; }
  const GptConfig* gpt() const override { return &cfg_; }
  Precision precision() const override { return cfg_.precision; }
  // Which ops the autocast pass runs bf16 (nn/gpt.h): asked once or twice a run (the summary,
  // the startup line), so the fp32 GPT is built and cast here rather than kept.
  nlohmann::json PrecisionOps() const override {
    if (cfg_.precision != Precision::kBf16) return nullptr;
    GptConfig f32 = cfg_;
    f32.precision = Precision::kFp32;
    AutocastOps ops;
    AutocastTrainingModel(BuildGpt(f32, 1, GptOutput::kLoss, data_->seq_len()), &ops);
    return DescribeOps(ops);
  }
  int64_t seq_len() const override { return data_->seq_len(); }

  // Sort: generate the answer greedily, one digit per forward pass, and count sequences whose
  // every digit is right.
  double Accuracy(Executable& logits, Scope& scope, int64_t batches, int64_t batch,
                  uint64_t seed) const override {
    const auto* sort = dynamic_cast<const SortDataset*>(data_.get());
    if (sort == nullptr) return -1;
    const int64_t n = sort->num_digits(), T = data_->seq_len(), vocab = cfg_.vocab;
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
          const float* row = lg + (r * T + t) * vocab;
          int64_t pred = std::max_element(row, row + vocab) - row;
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
    nlohmann::json d = {{"model", "gpt"},
                        {"vocab", cfg_.vocab},
                        {"seq", cfg_.seq},
                        {"layers", cfg_.layers},
                        {"heads", cfg_.heads},
                        {"dim", cfg_.dim},
                        {"precision", std::string(Name(cfg_.precision))},
                        {"data", data_->name()}};
    if (cfg_.dropout > 0) d["dropout"] = cfg_.dropout;  // a run without keeps its line as it was
    return d;
  }

 private:
  std::unique_ptr<Dataset> data_;
  GptConfig cfg_;
};

class MlpTask final : public Task {
 public:
  MlpTask(const TrainConfig& c) : cfg_(c.mlp), data_(c.mlp, c.seed) {}
  Model BuildTrain(int64_t batch) const override { return BuildMlp(cfg_, batch, MlpOutput::kLoss); }
  ModelUnits Units(int64_t batch) const override { return UnitsOf(BuildTrain(batch).forward); }
  Model BuildPiece(int64_t batch, const UnitRange& range) const override {
    return SliceTrainingModel(BuildTrain(batch), range);
  }
  Model BuildLogits(int64_t batch) const override {
    return BuildMlp(cfg_, batch, MlpOutput::kLogits);
  }
  void BindBatch(Scope& scope, DataSplit split, int64_t index, int64_t batch,
                 uint64_t) const override {
    auto [x, labels] = data_.GetBatch(split, index, batch);
    scope.Set("x", std::move(x));
    scope.Set("labels", std::move(labels));
  }
  Throughput ThroughputPerSample() const override { return {1, "examples"}; }
  double Accuracy(Executable& logits, Scope& scope, int64_t batches, int64_t batch,
                  uint64_t) const override {
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
    return {{"model", "mlp"},          {"features", cfg_.features}, {"hidden", cfg_.hidden},
            {"classes", cfg_.classes}, {"layers", cfg_.layers},     {"data", "blobs"}};
  }

 private:
  MlpConfig cfg_;
  BlobsDataset data_;
};

}  // namespace

nlohmann::json DescribeOps(const AutocastOps& ops) {
  return {{"bf16_ops", ops.bf16}, {"f32_ops", ops.f32}};
}

std::string DefaultData(const std::string& model) { return model == "mlp" ? "blobs" : "sort"; }

void CheckModelData(const TrainConfig& c) {
  if (c.model == "program") return;  // the program's inputs say what it takes (program_task.h)
  if (c.model == "mlp" && c.data != "blobs") {
    throw InvalidArgument(fmt::format(
        "--data {}: --model mlp trains on blobs only (Gaussian clusters, its default); drop "
        "--data or choose --model gpt, which trains on sort or a text file",
        c.data));
  }
  if (c.model == "gpt" && c.data == "blobs") {
    throw InvalidArgument(
        "--data blobs: --model gpt trains on sort (its default) or a text file; blobs is --model "
        "mlp's data (a file named blobs: --data ./blobs)");
  }
}

std::unique_ptr<Task> MakeTask(const TrainConfig& config) {
  CheckModelData(config);
  if (config.model == "program") return MakeProgramTask(config);
  if (config.model == "gpt") return std::make_unique<GptTask>(config);
  return std::make_unique<MlpTask>(config);
}

void ValidateTrainConfig(const TrainConfig& c) {
  auto bad = [](const std::string& what) { throw InvalidArgument(what); };
  if (c.steps < 1) bad(fmt::format("--steps must be at least 1, got {}", c.steps));
  if (c.batch < 1) bad(fmt::format("--batch must be at least 1, got {}", c.batch));
  if (c.microbatches < 1) {
    bad(fmt::format("--microbatches must be 1 or more, got {}", c.microbatches));
  }
  if (c.batch % c.microbatches != 0) {
    std::string fix;
    if (c.batch <= std::numeric_limits<int64_t>::max() - c.microbatches) {
      const int64_t up = c.batch - c.batch % c.microbatches + c.microbatches;  // next multiple
      fix = fmt::format(
          ": use --batch {} (micro-batches of {}) or a number of micro-batches "
          "that divides {}",
          up, up / c.microbatches, c.batch);
    }
    bad(fmt::format("--microbatches {} must divide --batch {}{}", c.microbatches, c.batch, fix));
  }
  if (c.threads < 0)
    bad(fmt::format("--threads must be 0 (every core) or more, got {}", c.threads));
  if (c.memory_plan == MemoryPlanMode::kStatic && c.mode != RunMode::kTrace) {
    bad(
        fmt::format("--memory-plan static needs --mode trace (the plan follows the trace order), "
                    "not {}",
                    Name(c.mode)));
  }
  if (c.model != "gpt" && c.model != "mlp" && c.model != "program")
    bad(fmt::format("--model must be gpt or mlp, not '{}'", c.model));
  if (c.model == "program" && c.program.empty()) bad("--model program needs --program FILE");
  CheckModelData(c);
  ValidateTrainRanges(c);
}

}  // namespace sluice
