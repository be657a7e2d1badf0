#include "sluice/step/program_task.h"

#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sluice/core/error.h"
#include "sluice/core/files.h"
#include "sluice/nn/gpt.h"
#include "sluice/nn/mlp.h"
#include "sluice/nn/training_program.h"
#include "sluice/step/array_dataset.h"
#include "sluice/step/train_config.h"

namespace sluice {

namespace {

// Data as named arrays per batch: what a training program's inputs bind.
class ArraySource {
 public:
  virtual ~ArraySource() = default;
  virtual std::string name() const = 0;
  // Each array's type per example (the batch axis left out).
  virtual std::map<std::string, TensorType> example_types() const = 0;
  virtual std::map<std::string, Tensor> GetBatch(DataSplit split, int64_t index, int64_t batch,
                                                 uint64_t seed) const = 0;
  // The sequence length T of token data; 0 for other data.
  virtual int64_t seq_len() const { return 0; }
  // The vocabulary of token data; 0 for other data.
  virtual int64_t vocab() const { return 0; }
};

class TokenSource final : public ArraySource {
 public:
  explicit TokenSource(std::unique_ptr<Dataset> data) : data_(std::move(data)) {}
  std::string name() const override { return data_->name(); }
  std::map<std::string, TensorType> example_types() const override {
    const TensorType t{DType::kI64, Shape{data_->seq_len()}};
    return {{"tokens", t}, {"next_tokens", t}};
  }
  std::map<std::string, Tensor> GetBatch(DataSplit split, int64_t index, int64_t batch,
                                         uint64_t seed) const override {
    Batch b = data_->GetBatch(split, index, batch, seed);
    return {{"tokens", std::move(b.ids)}, {"next_tokens", std::move(b.targets)}};
  }
  int64_t seq_len() const override { return data_->seq_len(); }
  int64_t vocab() const override { return data_->vocab_size(); }

 private:
  std::unique_ptr<Dataset> data_;
};

class BlobsSource final : public ArraySource {
 public:
  BlobsSource(const MlpConfig& config, uint64_t seed) : config_(config), blobs_(config, seed) {}
  std::string name() const override { return "blobs"; }
  std::map<std::string, TensorType> example_types() const override {
    return {{"x", {DType::kF32, Shape{config_.features}}}, {"labels", {DType::kI64, Shape{}}}};
  }
  std::map<std::string, Tensor> GetBatch(DataSplit split, int64_t index, int64_t batch,
                                         uint64_t) const override {
    auto [x, labels] = blobs_.GetBatch(split, index, batch);
    return {{"x", std::move(x)}, {"labels", std::move(labels)}};
  }

 private:
  MlpConfig config_;
  BlobsDataset blobs_;
};

class FileArraySource final : public ArraySource {
 public:
  explicit FileArraySource(const std::string& path) : data_(path) {}
  std::string name() const override { return data_.name(); }
  std::map<std::string, TensorType> example_types() const override { return data_.example_types(); }
  std::map<std::string, Tensor> GetBatch(DataSplit split, int64_t index, int64_t batch,
                                         uint64_t seed) const override {
    return data_.GetBatch(split, index, batch, seed);
  }

 private:
  ArrayDataset data_;
};

std::string ArrayNames(const ArraySource& source) {
  std::vector<std::string> names;
  for (const auto& [name, type] : source.example_types()) names.push_back(name);
  return fmt::format("{}", fmt::join(names, ", "));
}

class ProgramTask final : public Task {
 public:
  explicit ProgramTask(const TrainConfig& c) : path_(c.program) {
    text_ = ReadWholeFile("program", c.program);
    const int64_t micro = c.batch / std::max<int64_t>(c.microbatches, 1);
    if (c.data == "blobs") {
      source_ = std::make_unique<BlobsSource>(BlobsConfig(c, micro), c.seed);
    } else if (c.data.ends_with(".safetensors")) {
      source_ = std::make_unique<FileArraySource>(c.data);
    } else {
      source_ = std::make_unique<TokenSource>(
          OpenTokenData(c.data, c.gpt.seq > 0 ? c.gpt.seq : 64, c.gpt.vocab));
    }
    seq_ = source_->seq_len() > 0 ? source_->seq_len() : c.gpt.seq;
    // Every check, before the first step.
    TrainingProgram tp = Parse(micro);
    bindings_ = tp.data;
    for (const ParamSpec& p : tp.model.params) {
      if (p.init == Init::kLoaded && c.init_from.empty()) {
        throw InvalidArgument(fmt::format(
            "{}: %{} is `loaded` (its value comes from --init-from) but no --init-from file is "
            "given",
            path_, p.name));
      }
    }
  }

  Model BuildTrain(int64_t batch) const override { return Parse(batch).model; }
  ModelUnits Units(int64_t batch) const override { return UnitsOf(BuildTrain(batch).forward); }
  Model BuildPiece(int64_t batch, const UnitRange& range) const override {
    return SliceTrainingModel(BuildTrain(batch), range);
  }
  // Evaluation runs the training program itself: its loss on held-out batches.
  Model BuildLogits(int64_t batch) const override { return BuildTrain(batch); }

  void BindBatch(Scope& scope, DataSplit split, int64_t index, int64_t batch,
                 uint64_t seed) const override {
    std::map<std::string, Tensor> arrays = source_->GetBatch(split, index, batch, seed);
    for (const auto& [input, array] : bindings_) scope.Set(input, arrays.at(array));
  }
  int64_t TokensPerSample() const override { return source_->seq_len() > 0 ? seq_ : 1; }
  double Accuracy(Executable&, Scope&, int64_t, int64_t, uint64_t) const override { return -1; }
  nlohmann::json Describe() const override {
    return {{"model", "program"}, {"program", path_}, {"data", source_->name()}};
  }
  int64_t seq_len() const override { return seq_ > 0 ? seq_ : 1; }

 private:
  SizeBindings Sizes(int64_t batch) const {
    SizeBindings sizes{{"B", batch}};
    if (seq_ > 0) sizes.emplace("T", seq_);
    return sizes;
  }

  // The MLP data's sizes: F from the program's input bound to "x", K from --classes. Only the
  // declaration is read here: the whole program is checked against the data afterwards.
  MlpConfig BlobsConfig(const TrainConfig& c, int64_t micro) const {
    std::optional<TensorType> x;
    std::string x_name;
    try {
      ParseProgram(text_, path_, {{"B", micro}}, nullptr,
                   [&](const std::string& name, const TensorType& type, const std::string& array) {
                     if (array == "x" && !x) {
                       x = type;
                       x_name = name;
                     }
                   });
    } catch (const Error&) {
      if (!x) throw;
    }
    if (!x) {
      throw InvalidArgument(fmt::format(
          "--data blobs: {} has no input that binds x (blobs gives x f32[B, F] and labels i64[B])",
          path_));
    }
    if (x->shape.rank() != 2) {
      throw InvalidArgument(
          fmt::format("{}: input %{} binds blobs' x, which is f32[B, F]; it is declared {}", path_,
                      x_name, x->ToString()));
    }
    MlpConfig m = c.mlp;
    m.features = x->shape[1];
    return m;
  }

  // Parses the program at micro-batch `batch`, each input checked against its data array.
  TrainingProgram Parse(int64_t batch) const {
    return ParseTrainingProgram(
        text_, path_, Sizes(batch),
        [&](const std::string& input, const TensorType& declared, const std::string& array) {
          CheckInput(input, declared, array, batch);
        });
  }

  void CheckInput(const std::string& input, const TensorType& declared, const std::string& array,
                  int64_t batch) const {
    const std::map<std::string, TensorType> arrays = source_->example_types();
    auto it = arrays.find(array);
    if (it == arrays.end()) {
      throw InvalidArgument(fmt::format(
          "input %{} binds the data array '{}', which {} does not have (its arrays: {}); write "
          "`= NAME` after the input's type to bind another",
          input, array, source_->name(), ArrayNames(*source_)));
    }
    std::vector<int64_t> dims{batch};
    for (int64_t d : it->second.shape.dims()) dims.push_back(d);
    const TensorType expected{it->second.dtype, Shape(dims)};
    if (declared == expected) return;
    std::string why;
    if (declared.dtype != expected.dtype) {
      why = fmt::format("the data's '{}' is {}", array, Name(expected.dtype));
    } else if (declared.shape.rank() == 0 || declared.shape[0] != batch) {
      why = fmt::format(
          "its first axis is the batch, and this run's micro-batches hold {} examples; write B "
          "for that axis to train at any batch",
          batch);
    } else {
      why = fmt::format("the data's '{}' gives {}", array, expected.ToString());
      if (source_->seq_len() > 0) {
        why += fmt::format(" (sequences of {}: write T to follow the data)", source_->seq_len());
      }
    }
    throw InvalidArgument(
        fmt::format("input %{} is declared {}, but {}", input, declared.ToString(), why));
  }

  std::string path_;
  std::string text_;
  std::unique_ptr<ArraySource> source_;
  int64_t seq_ = 0;  // T; 0 when the data has no sequences and --seq is not given
  std::map<std::string, std::string> bindings_;  // input -> data array, the same at every batch
};

}  // namespace

std::unique_ptr<Task> MakeProgramTask(const TrainConfig& config) {
  return std::make_unique<ProgramTask>(config);
}

std::string ExportBuiltinProgram(const TrainConfig& c) {
  if (c.model == "gpt") {
    const std::unique_ptr<Task> task = MakeTask(c);  // the vocabulary and sequence of the data
    const GptConfig g = *task->gpt();
    return ExportTrainingProgram(
        [&](int64_t B, int64_t T) {
          GptConfig sized = g;
          sized.seq = T;
          return BuildGpt(sized, B, GptOutput::kLoss, T);
        },
        {{"ids", "tokens"}, {"targets", "next_tokens"}});
  }
  if (c.model == "mlp") {
    ValidateMlpConfig(c.mlp);
    return ExportTrainingProgram(
        [&](int64_t B, int64_t) { return BuildMlp(c.mlp, B, MlpOutput::kLoss); }, {});
  }
  throw InvalidArgument(fmt::format(
      "export writes the program of a built-in model (--model gpt or mlp), not '{}'", c.model));
}

}  // namespace sluice
