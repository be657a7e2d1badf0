#include "sluice/step/program_task.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sluice/core/error.h"
#include "sluice/core/files.h"
#include "sluice/core/fnv1a.h"
#include "sluice/kernels/cross_entropy.h"
#include "sluice/nn/data.h"
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
  // The largest value of integer array `array` (token ids, labels), from what the source holds in
  // memory; nullopt for a float array or one the source cannot tell.
  virtual std::optional<int64_t> LargestId(const std::string& array) const = 0;
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
  std::optional<int64_t> LargestId(const std::string&) const override {
    return data_->largest_id();
  }

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
  std::optional<int64_t> LargestId(const std::string& array) const override {
    if (array == "labels") return config_.classes - 1;
    return std::nullopt;
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
  std::optional<int64_t> LargestId(const std::string& array) const override {
    return data_.LargestValue(array);
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
  explicit ProgramTask(const TrainConfig& c)
      : path_(c.program), loaded_by_default_(!c.init_from.empty()), precision_(c.gpt.precision) {
    text_ = ReadWholeFile("program file", c.program);
    const int64_t micro = c.batch / std::max<int64_t>(c.microbatches, 1);
    seq_ = c.gpt.seq;  // T of data without sequences: --seq, when given
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
    TrainingProgram tp = ParseAsWritten(micro);
    bindings_ = tp.data;
    CheckIdsFitTables(tp);
    if (precision_ == Precision::kBf16) tp.model = AutocastTrainingModel(tp.model, &ops_);
    FindPredictions(tp.model.forward);
    loss_ = tp.model.loss;
    for (const ParamSpec& p : tp.model.params) {
      // A resumed run takes every parameter and constant from its checkpoint.
      if (p.init == Init::kLoaded && c.init_from.empty() && c.resume_path.empty()) {
        throw InvalidArgument(fmt::format(
            "{}: %{} is `loaded` (its value comes from --init-from) but no --init-from file is "
            "given (nor a --resume checkpoint)",
            path_, p.name));
      }
    }
  }

  Model BuildTrain(int64_t batch) const override { return Parse(batch).model; }
  ModelUnits Units(int64_t batch) const override { return UnitsOf(BuildTrain(batch).forward); }
  Model BuildPiece(int64_t batch, const UnitRange& range) const override {
    return SliceTrainingModel(BuildTrain(batch), range);
  }
  // Evaluation runs the training program itself: its loss on held-out batches, and its logits
  // when it has a cross-entropy of data targets (Accuracy).
  Model BuildLogits(int64_t batch) const override {
    Model m = BuildTrain(batch);
    if (!logits_.empty()) m.forward.AddOutput(m.forward.Get(logits_));
    return m;
  }

  void BindBatch(Scope& scope, DataSplit split, int64_t index, int64_t batch,
                 uint64_t seed) const override {
    std::map<std::string, Tensor> arrays = source_->GetBatch(split, index, batch, seed);
    for (const auto& [input, array] : bindings_) {
      scope.Set(input,
                array == kRandomKeyArray ? RandomKey(split, index, batch, seed) : arrays.at(array));
    }
  }
  // A token model's tokens; a module reading arrays counts examples.
  Throughput ThroughputPerSample() const override {
    return source_->seq_len() > 0 ? Throughput{seq_, "tokens"} : Throughput{1, "examples"};
  }
  // The share of held-out targets whose logits' largest entry is the target (positions the loss
  // ignores left out): a classifier's accuracy, a language model's next-token accuracy.
  double Accuracy(Executable& logits, Scope& scope, int64_t batches, int64_t batch,
                  uint64_t seed) const override {
    if (logits_.empty()) return -1;
    int64_t right = 0, counted = 0;
    for (int64_t i = 0; i < batches; ++i) {
      BindBatch(scope, DataSplit::kValidation, i, batch, seed);
      logits.Run(scope);
      const Tensor& lg = scope.Get(logits_);
      const Tensor& targets = scope.Get(targets_);
      const int64_t classes = lg.shape()[lg.shape().rank() - 1];
      const float* row = lg.data<float>();
      for (int64_t k = 0; k < targets.numel(); ++k, row += classes) {
        const int64_t target = static_cast<int64_t>(targets.FlatAt(k));
        if (target == kernels::kIgnoreTarget) continue;
        ++counted;
        right += std::max_element(row, row + classes) - row == target;
      }
    }
    for (const auto& [input, array] : bindings_) scope.Erase(input);
    scope.Erase(logits_);
    scope.Erase(loss_);
    return counted == 0 ? -1 : static_cast<double>(right) / static_cast<double>(counted);
  }
  nlohmann::json Describe() const override {
    // The file as an absolute path, so that ./m.sluice and m.sluice resume each other.
    std::error_code ec;
    const std::filesystem::path canonical = std::filesystem::weakly_canonical(path_, ec);
    // The text's digest too, comments and white space left out: a file whose program was edited
    // since a checkpoint resumes only with --allow-changes.
    Fnv1a digest;
    bool comment = false;
    for (unsigned char c : text_) {
      comment = c == '#' || (comment && c != '\n');
      if (!comment && !std::isspace(c)) digest.Add(c);
    }
    return {{"model", "program"},
            {"program", ec ? path_ : canonical.string()},
            {"precision", std::string(Name(precision_))},
            {"program_digest", fmt::format("{:016x}", digest.value())},
            {"data", source_->name()}};
  }
  Precision precision() const override { return precision_; }
  nlohmann::json PrecisionOps() const override {
    return precision_ == Precision::kBf16 ? DescribeOps(ops_) : nullptr;
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
      ParseProgram(text_, path_, Sizes(micro), nullptr,
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
  // Under --precision bf16 the model is the program's mixed-precision form (ir/autocast.h).
  TrainingProgram Parse(int64_t batch) const {
    TrainingProgram tp = ParseAsWritten(batch);
    if (precision_ == Precision::kBf16) tp.model = AutocastTrainingModel(tp.model);
    return tp;
  }
  TrainingProgram ParseAsWritten(int64_t batch) const {
    return ParseTrainingProgram(
        text_, path_, Sizes(batch),
        [&](const std::string& input, const TensorType& declared, const std::string& array) {
          CheckInput(input, declared, array, batch);
        },
        loaded_by_default_);
  }

  void CheckInput(const std::string& input, const TensorType& declared, const std::string& array,
                  int64_t batch) const {
    if (array == kRandomKeyArray) {  // every data's: one key per example
      if (declared == TensorType{DType::kI64, Shape{batch}}) return;
      throw InvalidArgument(fmt::format(
          "input %{} binds {}, the examples' random keys (what dropout draws its masks from), "
          "which are i64[B]; it is declared {}{}",
          input, kRandomKeyArray, declared.ToString(),
          declared.dtype == DType::kI64 && declared.shape.rank() == 1
              ? fmt::format(" (this run's micro-batches hold {} examples: write B)", batch)
              : ""));
    }
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

  // Ids past a table fail only at the first step, deep inside a stage ("embedding id 104 ... vocab
  // = 11"): checked here instead, for every embedding table and cross-entropy an integer input
  // feeds (directly or through reshapes and slices), against the largest id of the array it binds.
  void CheckIdsFitTables(const TrainingProgram& tp) const {
    const Program& p = tp.model.forward;
    std::vector<std::string> array_of(p.values().size());  // integer values: the array they carry
    for (ValueId v : p.inputs()) {
      if (!IsFloating(p.type(v).dtype)) array_of[v] = tp.data.at(p.value(v).name);
    }
    auto at = [&](const std::string& name) {
      auto it = tp.annotations.declared_at.find(name);
      return it == tp.annotations.declared_at.end()
                 ? path_
                 : fmt::format("{}:{}:{}", path_, it->second.first, it->second.second);
    };
    for (const Instruction& ins : p.instructions()) {
      const std::string& op = ins.op->name;
      ValueId ids = kNoValue, table = kNoValue;
      if (op == "embedding") {
        ids = ins.inputs[0];
        table = ins.inputs[1];
      } else if (op == "cross_entropy") {
        ids = ins.inputs[1];
        table = ins.inputs[0];
      } else if (op == "linear_cross_entropy") {
        ids = ins.inputs[2];
        table = ins.inputs[1];
      }
      if (ids != kNoValue && !array_of[ids].empty()) {
        const std::string& array = array_of[ids];
        const std::optional<int64_t> largest = source_->LargestId(array);
        const Shape& shape = p.type(table).shape;
        const int64_t rows =
            op == "embedding" || op == "linear_cross_entropy" ? shape[0] : shape[shape.rank() - 1];
        if (largest && *largest >= rows) {
          const std::string out = p.value(ins.outputs[0]).name;
          const std::string table_name = p.value(table).name;
          throw InvalidArgument(
              op == "cross_entropy"
                  ? fmt::format(
                        "{}: the data's largest id in '{}' is {}, but the cross-entropy %{} of {} "
                        "scores {} classes (the last axis of %{}: ids 0 to {}): give the program "
                        "at least {} classes, or train on data whose ids are below {}",
                        source_->name(), array, *largest, out, path_, rows, table_name, rows - 1,
                        *largest + 1, rows)
                  : fmt::format(
                        "{}: the data's largest id in '{}' is {}, but %{} ({}), the table the "
                        "{} %{} picks rows of, has {} rows (ids 0 to {}): give it at least {} "
                        "rows (a byte-level text needs 256), or train on data whose ids are "
                        "below {}",
                        source_->name(), array, *largest, table_name, at(table_name), op, out, rows,
                        rows - 1, *largest + 1, rows));
        }
      }
      const bool carries = std::all_of(ins.outputs.begin(), ins.outputs.end(),
                                       [&](ValueId v) { return !IsFloating(p.type(v).dtype); });
      if (!carries) continue;
      for (ValueId v : ins.inputs) {
        if (array_of[v].empty()) continue;
        for (ValueId o : ins.outputs) array_of[o] = array_of[v];
        break;
      }
    }
  }

  std::string path_;
  bool loaded_by_default_;  // --init-from given: parameters without an initializer are loaded
  Precision precision_;
  AutocastOps ops_;  // under bf16: the ops running bf16, and those running f32 (the fallback)
  std::string text_;
  std::unique_ptr<ArraySource> source_;
  int64_t seq_ = 0;  // T; 0 when the data has no sequences and --seq is not given
  // A cross_entropy(logits, targets) of f32 logits and a targets input, if the program has one.
  void FindPredictions(const Program& p) {
    for (const Instruction& ins : p.instructions()) {
      if (ins.op->name != "cross_entropy" || ins.inputs.size() != 2) continue;
      const ValueId lg = ins.inputs[0], targets = ins.inputs[1];
      if (p.type(lg).dtype != DType::kF32 || p.value(targets).kind != ValueKind::kInput) continue;
      logits_ = p.value(lg).name;
      targets_ = p.value(targets).name;
      return;
    }
  }

  std::map<std::string, std::string> bindings_;
  std::string logits_, targets_;  // empty: no accuracy
  std::string loss_;              // input -> data array, the same at every batch
};

}  // namespace

std::unique_ptr<Task> MakeProgramTask(const TrainConfig& config) {
  return std::make_unique<ProgramTask>(config);
}

std::string DefaultProgramData(const std::string& path) {
  const std::string text = ReadWholeFile("program file", path);
  std::set<std::string> arrays;
  try {
    // Only the declarations are read: sizes take placeholder values, and a later error in the
    // text is the training run's to report.
    ParseProgram(text, path, {{"B", 1}, {"T", 1}}, nullptr,
                 [&](const std::string&, const TensorType&, const std::string& array) {
                   arrays.insert(array);
                 });
  } catch (const Error&) {
  }
  arrays.erase(kRandomKeyArray);  // every data has it
  if (arrays.count("tokens") || arrays.count("next_tokens")) return "sort";
  if (std::all_of(arrays.begin(), arrays.end(),
                  [](const std::string& a) { return a == "x" || a == "labels"; })) {
    return "blobs";
  }
  throw InvalidArgument(fmt::format(
      "--program {} binds the data arrays {}: give --data FILE.safetensors holding them (or a "
      "text or .bin token file for tokens and next_tokens)",
      path, fmt::join(arrays, ", ")));
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
        g.dropout > 0
            ? std::map<std::string, std::string>{{"ids", "tokens"},
                                                 {"targets", "next_tokens"},
                                                 {kRandomKeyArray, kRandomKeyArray}}
            : std::map<std::string, std::string>{{"ids", "tokens"}, {"targets", "next_tokens"}});
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
