// Parity of an imported PyTorch module (tools/torch_export.py, docs/torch-export.md) with PyTorch
// training that very module: for each model of tests/parity/torch_models.py (gpt, llama, mlp_lm),
// the exporter writes model.sluice and init.safetensors; a Trainer runs the program (`--program
// ... --init-from ... --data sort --threads 1`, AdamW, constant lr, no clipping) for ten steps and
// saves a checkpoint; tests/parity/torch_import_reference.py trains the module in PyTorch from the
// same weights on the same batches, and loads sluice's checkpoint back into a fresh module.
// TorchImportParity also runs seq_mlp and encoder, modules a user brings built of PyTorch's own
// layers (nn.Sequential, nn.TransformerEncoderLayer) with frozen parameters, and the classifiers
// of tests/parity/torch_classifiers.py, whose forward reads float features and integer labels from
// a safetensors data file (examples/classifier_data.py writes it; `--data FILE` to the exporter),
// among them convolutional networks (a ResNet, MobileNetV2's depthwise inverted residuals,
// ConvNeXt blocks with a dilated grouped convolution, a UNet with a transposed convolution and
// nearest upsampling) and a ViT on the images of examples/bars_data.py, and text
// classifiers reading a padding mask (BERT-style layers, nn.TransformerEncoder with
// src_key_padding_mask) on the padded sequences of examples/padded_text_data.py, and recurrent
// layers unrolled over a fixed T (lstm_lm: a 2-layer nn.LSTM language model; gru_classifier: a
// bidirectional 2-layer nn.GRU over the rows of the bars images, from a learned initial state).
//
//   losses          the ten per-step losses, 1e-5 relative
//   final weights   1e-4 of each tensor's largest entry plus 2e-2 of the AdamW steps taken
//                   (lr · steps: the key bias, whose gradient is rounding noise)
//   weights back    PyTorch's loss of the module holding sluice's checkpoint, on the batch of the
//                   step after it, against the loss sluice computes in that step: 1e-5 relative
//
//   TorchImportGolden   always runs: the exported program, its initial weights and PyTorch's
//                       losses, committed in tests/parity/torch_import/MODEL/ (model.sluice,
//                       init.safetensors, golden.json with the batches they came from), so this
//                       check runs where PyTorch is absent.
//   TorchImportParity   exports and runs PyTorch now (skipped, saying so, without python3-torch
//                       /usr/bin/python3 -c 'import torch').
//   TorchImportAutocastParity   gpt, llama, mlp_lm under --precision bf16 against PyTorch training
//                       the module under torch.autocast("cpu", dtype=torch.bfloat16): the ten
//                       losses within 1e-2 relative (skipped without python3-torch).
//   TorchImportUnused   a parameter forward never reads stays as exported, as PyTorch leaves it.
// Regenerate the golden files after a deliberate change to the models, the exporter or the data:
//   SLUICE_UPDATE_GOLDEN=1 ctest --test-dir build -R TorchImportParity
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "sluice/exec/reference_runner.h"
#include "sluice/io/safetensors.h"
#include "sluice/ir/inference_form.h"
#include "sluice/step/task.h"
#include "sluice/train/trainer.h"
#include "source_dir.h"

namespace sluice {
namespace {

constexpr int64_t kSteps = 10;

std::string SourceDir() { return testing_support::SourceDir().string(); }

bool HaveTorch() { return std::system("/usr/bin/python3 -c 'import torch' > /dev/null 2>&1") == 0; }

// The run: `steps` steps and one more whose loss is the checkpoint's, on one batch per step.
TrainConfig ImportConfig(const std::string& dir, const std::string& data = "sort",
                         double weight_decay = 0.0, int64_t steps = kSteps) {
  TrainConfig c;
  c.model = "program";
  c.program = dir + "/model.sluice";
  c.init_from = dir + "/init.safetensors";
  c.data = data;
  c.steps = steps + 1;
  c.batch = 4;
  c.microbatches = 1;
  c.optimizer = {.kind = OptimizerKind::kAdamW,
                 .lr = 1e-2,
                 .beta1 = 0.9,
                 .beta2 = 0.99,
                 .eps = 1e-8,
                 .weight_decay = weight_decay,
                 .clip_norm = 0.0,
                 .schedule = LrSchedule::kConstant,
                 .warmup_steps = 0};
  c.seed = 7;
  c.threads = 1;
  c.eval_every = 0;
  return c;
}

double Relative(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

// A folder of this process's own: several checkouts may run these tests at once on one /tmp.
std::string ScratchDir(const std::string& name) {
  return fmt::format("{}/{}_{}", ::testing::TempDir(), name, static_cast<int64_t>(getpid()));
}

std::string GoldenDir(const std::string& model) {
  return SourceDir() + "/tests/parity/torch_import/" + model;
}

// What sluice does with an exported model: the batches it trains on, its losses, the weights it
// saved after config.steps - 1 steps (in `checkpoint`) and its loss on the next batch with them.
struct SluiceRun {
  // INPUT.<step> of every data input (tokens and targets of a token model), steps 0 to kSteps
  std::map<std::string, Tensor> batches;
  std::vector<double> losses;
  std::map<std::string, Tensor> trained;
  double next_loss = 0;
  // The inference form (ir/inference_form.h: batch norm by its running statistics) with the
  // checkpoint's values on the next batch: what module.eval() gives.
  double eval_loss = 0;
};

SluiceRun TrainExported(const TrainConfig& config, const std::string& checkpoint) {
  const int64_t steps = config.steps - 1;
  SluiceRun run;
  {
    std::unique_ptr<Task> task = MakeTask(config);
    for (int64_t s = 0; s < config.steps; ++s) {
      Scope scope;
      task->BindBatch(scope, DataSplit::kTrain, s, config.batch, config.seed);
      for (const std::string& name : scope.Names())
        run.batches.emplace(fmt::format("{}.{}", name, s), scope.Take(name));
    }
  }
  Trainer trainer(config);
  for (int64_t s = 0; s < steps; ++s) run.losses.push_back(trainer.Step().loss);
  trainer.SaveCheckpoint(checkpoint);
  for (const std::string& name : trainer.ParamNames())
    run.trained.emplace(name, trainer.Value(name).Clone());
  {
    std::unique_ptr<Task> task = MakeTask(config);
    const Program eval = InferenceForm(task->BuildTrain(config.batch).forward);
    Scope scope;
    for (const auto& [name, t] : run.trained) scope.Set(name, t.Clone());
    task->BindBatch(scope, DataSplit::kTrain, steps, config.batch, config.seed);
    RunReference(eval, scope, DefaultAllocator(), /*use_reference_kernels=*/false);
    // The program's output: %loss for a cross-entropy, another name for a sum of losses (unet).
    run.eval_loss = scope.Get(eval.value(eval.outputs().at(0)).name).FlatAt(0);
  }
  run.next_loss = trainer.Step().loss;  // the checkpoint's weights on the next batch
  return run;
}

std::vector<int64_t> Ids(const Tensor& t) {
  return std::vector<int64_t>(t.data<int64_t>(), t.data<int64_t>() + t.numel());
}

class TorchImportGolden : public testing::TestWithParam<const char*> {};

TEST_P(TorchImportGolden, TrainsLikePyTorchDid) {
  const std::string model = GetParam();
  const std::string dir = GoldenDir(model);
  std::ifstream in(dir + "/golden.json");
  ASSERT_TRUE(in) << "cannot read " << dir << "/golden.json";
  const nlohmann::json golden = nlohmann::json::parse(in);
  const std::string checkpoint = ScratchDir("torch_import_golden_" + model) + ".safetensors";
  const SluiceRun run = TrainExported(ImportConfig(dir), checkpoint);
  std::filesystem::remove(checkpoint);
  // The data first: a mismatch here is a change to the data, not to training.
  for (const auto& [name, t] : run.batches)
    ASSERT_EQ(Ids(t), golden.at("batches").at(name).get<std::vector<int64_t>>()) << name;
  const std::vector<double> losses = golden.at("losses").get<std::vector<double>>();
  ASSERT_EQ(losses.size(), run.losses.size());
  double worst = 0;
  for (size_t s = 0; s < losses.size(); ++s) {
    worst = std::max(worst, Relative(run.losses[s], losses[s]));
    EXPECT_LE(Relative(run.losses[s], losses[s]), 1e-5)
        << "loss of step " << s + 1 << ": sluice " << run.losses[s] << " vs PyTorch " << losses[s];
  }
  const double back = golden.at("checkpoint_loss").get<double>();
  EXPECT_LE(Relative(back, run.next_loss), 1e-5)
      << "PyTorch's loss with sluice's checkpoint loaded, " << back << ", vs sluice's "
      << run.next_loss;
  fmt::print("{}: largest relative difference from PyTorch's committed losses: {:.2e}\n", model,
             worst);
}

// A module of the parity test: a token model of tests/parity/torch_models.py trained on `sort`, or
// a classifier of tests/parity/torch_classifiers.py trained on a safetensors file of arrays that
// `data_cmd` writes (its {} the file's path).
struct ImportedModel {
  const char* name;
  const char* file;      // under tests/parity/
  const char* data_cmd;  // nullptr: a token model on `sort`
  // The largest relative loss difference allowed. The ResNet's batch norms over 4 examples and
  // AdamW amplify the frameworks' different conv rounding: 8e-7 to 2.5e-5 across init seeds.
  double loss_tolerance = 1e-5;
};

void PrintTo(const ImportedModel& m, std::ostream* os) { *os << m.name; }

class TorchImportParity : public testing::TestWithParam<ImportedModel> {};

// The data file of an array model, written next to its scratch folder `dir`.
std::string DataFileOf(const ImportedModel& imported, const std::string& dir) {
  return imported.data_cmd != nullptr ? dir + ".data.safetensors" : "sort";
}

// PyTorch's side (tests/parity/torch_import_reference.py): `spec` trained config.steps - 1 steps
// on the batches of `run` from config.init_from with config's AdamW, its generator seeded with
// `torch_seed` (dropout's masks), and `checkpoint` loaded back; nullopt after a failure (reported).
std::optional<SafetensorsFile> PyTorchReference(const std::string& spec, const std::string& dir,
                                                const SluiceRun& run, const TrainConfig& config,
                                                const std::string& checkpoint,
                                                uint64_t torch_seed = 0) {
  const OptimizerConfig& o = config.optimizer;
  const nlohmann::json reference_config = {
      {"steps", config.steps - 1}, {"lr", o.lr},   {"beta1", o.beta1},
      {"beta2", o.beta2},          {"eps", o.eps}, {"weight_decay", o.weight_decay},
      {"seed", torch_seed}};
  const std::string in_path = dir + "/reference_input.safetensors",
                    out_path = dir + "/reference_output.safetensors";
  WriteSafetensors(in_path, run.batches, {{"config", reference_config.dump()}});
  const std::string cmd =
      fmt::format("/usr/bin/python3 {}/tests/parity/torch_import_reference.py {} {} {} {} {}",
                  SourceDir(), spec, in_path, config.init_from, checkpoint, out_path);
  if (std::system(cmd.c_str()) != 0) {
    ADD_FAILURE() << "the PyTorch reference failed: " << cmd;
    return std::nullopt;
  }
  return ReadSafetensors(out_path);
}

// Exports `imported` into `dir`, trains it `steps` steps with sluice and with PyTorch (weight
// decay `weight_decay`) and compares losses, final weights and the checkpoint loaded back. Returns
// sluice's run and PyTorch's output (empty after a failure), their files left in `dir`.
std::pair<SluiceRun, SafetensorsFile> CompareWithPyTorch(const ImportedModel& imported,
                                                         const std::string& dir,
                                                         double weight_decay, int64_t steps) {
  const std::string model = imported.name;
  const std::string spec = fmt::format("{}/tests/parity/{}:{}", SourceDir(), imported.file, model);
  std::filesystem::remove_all(dir);
  const std::string data = DataFileOf(imported, dir);
  std::string export_args = "--batch 4 --seq 12";
  if (imported.data_cmd != nullptr) {
    const std::string data_cmd =
        fmt::format("cd {} && {}", SourceDir(), fmt::format(fmt::runtime(imported.data_cmd), data));
    if (std::system(data_cmd.c_str()) != 0) {
      ADD_FAILURE() << "writing the data failed: " << data_cmd;
      return {};
    }
    export_args = fmt::format("--batch 4 --data {}", data);
  }
  const std::string export_cmd =
      fmt::format("/usr/bin/python3 {}/tools/torch_export.py {} {} --out {}", SourceDir(), spec,
                  export_args, dir);
  if (std::system(export_cmd.c_str()) != 0) {
    ADD_FAILURE() << "the exporter failed: " << export_cmd;
    return {};
  }

  const TrainConfig config = ImportConfig(dir, data, weight_decay, steps);
  const std::string checkpoint = dir + "/trained.safetensors";
  SluiceRun run = TrainExported(config, checkpoint);

  const OptimizerConfig& o = config.optimizer;
  std::optional<SafetensorsFile> reference = PyTorchReference(spec, dir, run, config, checkpoint);
  if (!reference) return {};
  SafetensorsFile ref = std::move(*reference);

  const Tensor& ref_losses = ref.tensors.at("losses");
  EXPECT_EQ(ref_losses.numel(), steps);
  double worst_loss = 0;
  for (int64_t s = 0; s < std::min(steps, ref_losses.numel()); ++s) {
    const double mine = run.losses[static_cast<size_t>(s)];
    const double r = Relative(mine, ref_losses.FlatAt(s));
    worst_loss = std::max(worst_loss, r);
    EXPECT_LE(r, imported.loss_tolerance) << "loss of step " << s + 1 << ": sluice " << mine
                                          << " vs PyTorch " << ref_losses.FlatAt(s);
  }
  double worst_weight = 0;
  for (const auto& [name, mine] : run.trained) {
    if (!ref.tensors.count("final." + name)) {
      ADD_FAILURE() << name << " is no parameter or buffer";
      continue;
    }
    const Tensor& theirs = ref.tensors.at("final." + name);
    EXPECT_EQ(mine.numel(), theirs.numel()) << name;
    if (mine.numel() != theirs.numel()) continue;
    double diff = 0, scale = 1e-12;
    for (int64_t i = 0; i < mine.numel(); ++i) {
      diff = std::max(diff, std::abs(mine.FlatAt(i) - theirs.FlatAt(i)));
      scale = std::max(scale, std::abs(theirs.FlatAt(i)));
    }
    worst_weight = std::max(worst_weight, diff / scale);
    // The attention key bias has a true gradient of zero (softmax ignores a shift shared by every
    // key): AdamW turns its rounding noise into steps of up to lr that differ between frameworks.
    EXPECT_LE(diff, 1e-4 * scale + 2e-2 * o.lr * static_cast<double>(steps))
        << name << " after step " << steps;
  }
  const double back = ref.tensors.at("checkpoint_loss").FlatAt(0);
  EXPECT_LE(Relative(back, run.next_loss), 1e-5)
      << "PyTorch's loss with sluice's checkpoint loaded, " << back << ", vs sluice's "
      << run.next_loss;
  const double eval_back = ref.tensors.at("eval_loss").FlatAt(0);
  EXPECT_LE(Relative(eval_back, run.eval_loss), 1e-5)
      << "PyTorch's loss under module.eval() with sluice's checkpoint loaded, " << eval_back
      << ", vs sluice's inference form " << run.eval_loss;
  fmt::print(
      "{}: largest relative difference from PyTorch: losses {:.2e}, final weights {:.2e}, "
      "loss with the checkpoint loaded back {:.2e} (in eval mode {:.2e})\n",
      model, worst_loss, worst_weight, Relative(back, run.next_loss),
      Relative(eval_back, run.eval_loss));
  return {std::move(run), std::move(ref)};
}

TEST_P(TorchImportParity, TrainsLikePyTorchAndLoadsBack) {
  if (!HaveTorch()) {
    GTEST_SKIP() << "python3-torch is not installed (scripts/install-deps.sh installs it): "
                    "tools/torch_export.py needs it; only the committed golden files were checked";
  }
  const ImportedModel& imported = GetParam();
  const std::string model = imported.name;
  const std::string dir = ScratchDir("torch_import_" + model);
  const auto [run, ref] = CompareWithPyTorch(imported, dir, 0.0, kSteps);
  if (::testing::Test::HasFailure() || run.losses.empty()) return;
  const Tensor& ref_losses = ref.tensors.at("losses");
  const double back = ref.tensors.at("checkpoint_loss").FlatAt(0);

  if (std::getenv("SLUICE_UPDATE_GOLDEN") != nullptr && imported.data_cmd == nullptr) {
    const std::string golden_dir = GoldenDir(model);
    std::filesystem::create_directories(golden_dir);
    std::filesystem::copy_file(dir + "/init.safetensors", golden_dir + "/init.safetensors",
                               std::filesystem::copy_options::overwrite_existing);
    // The program as exported, its header naming the module relative to the source tree.
    std::ifstream exported(dir + "/model.sluice");
    std::string text((std::istreambuf_iterator<char>(exported)), std::istreambuf_iterator<char>());
    for (size_t at; (at = text.find(SourceDir() + "/")) != std::string::npos;)
      text.erase(at, SourceDir().size() + 1);
    std::ofstream(golden_dir + "/model.sluice") << text;
    nlohmann::json batches = nlohmann::json::object();
    for (const auto& [name, t] : run.batches) batches[name] = Ids(t);
    std::vector<double> losses;
    for (int64_t s = 0; s < kSteps; ++s) losses.push_back(ref_losses.FlatAt(s));
    const nlohmann::json golden = {
        {"produced_by",
         "tests/parity/torch_import_reference.py (SLUICE_UPDATE_GOLDEN=1 ctest -R "
         "TorchImportParity)"},
        {"model", "tests/parity/torch_models.py:" + model},
        {"losses", losses},
        {"checkpoint_loss", back},
        {"batches", batches}};
    std::ofstream(golden_dir + "/golden.json") << golden.dump() << "\n";
  }
  std::filesystem::remove_all(dir);
  if (imported.data_cmd != nullptr) std::filesystem::remove(DataFileOf(imported, dir));
}

// Regression: a parameter forward never uses (unused_head's aux_head, another task's head) got a
// zero gradient, so AdamW's weight decay moved it, where PyTorch, its .grad None, skips it. With
// weight decay 0.1, five steps: every weight as PyTorch has it, aux_head bitwise as exported.
TEST(TorchImportUnused, AHeadForwardNeverUsesIsLeftAsPyTorchLeavesIt) {
  if (!HaveTorch()) {
    GTEST_SKIP() << "python3-torch is not installed (scripts/install-deps.sh installs it)";
  }
  const std::string dir = ScratchDir("torch_import_unused_head");
  const auto [run, ref] =
      CompareWithPyTorch({"unused_head", "torch_models.py", nullptr}, dir, 0.1, 5);
  ASSERT_FALSE(run.trained.empty());
  const SafetensorsFile init = ReadSafetensors(dir + "/init.safetensors");
  for (const char* name : {"aux_head.weight", "aux_head.bias"}) {
    ASSERT_TRUE(run.trained.count(name)) << name << " is not among sluice's parameters";
    const Tensor& mine = run.trained.at(name);
    const Tensor& before = init.tensors.at(name);
    ASSERT_EQ(mine.numel(), before.numel()) << name;
    for (int64_t i = 0; i < mine.numel(); ++i)
      ASSERT_EQ(mine.FlatAt(i), before.FlatAt(i)) << name << " moved at " << i;
  }
  // A weight that trains is decayed as PyTorch decays it (the comparison above) and moved.
  EXPECT_NE(run.trained.at("net.0.weight").FlatAt(0), init.tensors.at("net.0.weight").FlatAt(0));
  std::filesystem::remove_all(dir);
}

// `--precision bf16` (ir/autocast.h) on the imported module against PyTorch training that module
// under torch.autocast("cpu", dtype=torch.bfloat16): the ten losses within 1e-2 relative. Both
// multiply bf16 operands with f32 weights and optimizer state; they round at different points
// (autocast's linears give bf16, sluice's f32; sluice rounds what crosses a unit boundary). The
// bf16 losses must differ from sluice's fp32 ones (something was rounded).
class TorchImportAutocastParity : public testing::TestWithParam<const char*> {};

TEST_P(TorchImportAutocastParity, Bf16TrainsLikeAutocast) {
  if (!HaveTorch()) {
    GTEST_SKIP() << "python3-torch is not installed (scripts/install-deps.sh installs it)";
  }
  const std::string model = GetParam();
  const std::string spec = SourceDir() + "/tests/parity/torch_models.py:" + model;
  const std::string dir = ScratchDir("torch_autocast_" + model);
  std::filesystem::remove_all(dir);
  const std::string export_cmd =
      fmt::format("/usr/bin/python3 {}/tools/torch_export.py {} --batch 4 --seq 12 --out {}",
                  SourceDir(), spec, dir);
  ASSERT_EQ(std::system(export_cmd.c_str()), 0) << "the exporter failed: " << export_cmd;
  // At lr 1e-3: at the fp32 tests' 1e-2 these ten steps are chaotic from step 8 on (two sluice
  // bf16 runs that differ only in where they round part by 5% at step 10, PyTorch's autocast and
  // fp32 runs by 0.7%), so the comparison would measure the chaos, not the rounding.
  TrainConfig config = ImportConfig(dir);
  config.optimizer.lr = 1e-3;
  config.gpt.precision = Precision::kBf16;
  const std::string checkpoint = dir + "/trained.safetensors";
  const SluiceRun run = TrainExported(config, checkpoint);
  TrainConfig fp32_config = config;
  fp32_config.gpt.precision = Precision::kFp32;
  const SluiceRun fp32 = TrainExported(fp32_config, dir + "/fp32.safetensors");

  const OptimizerConfig& o = config.optimizer;
  const nlohmann::json reference_config = {{"steps", kSteps},
                                           {"lr", o.lr},
                                           {"beta1", o.beta1},
                                           {"beta2", o.beta2},
                                           {"eps", o.eps},
                                           {"autocast", true},
                                           {"weight_decay", o.weight_decay}};
  const std::string in_path = dir + "/reference_input.safetensors",
                    out_path = dir + "/reference_output.safetensors";
  WriteSafetensors(in_path, run.batches, {{"config", reference_config.dump()}});
  const std::string cmd =
      fmt::format("/usr/bin/python3 {}/tests/parity/torch_import_reference.py {} {} {} {} {}",
                  SourceDir(), spec, in_path, config.init_from, checkpoint, out_path);
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "the PyTorch reference failed: " << cmd;
  const Tensor ref = ReadSafetensors(out_path).tensors.at("losses");  // a copy: the file dies here
  ASSERT_EQ(ref.numel(), kSteps);
  double worst = 0;
  bool differs_from_fp32 = false;
  for (int64_t s = 0; s < kSteps; ++s) {
    const double mine = run.losses[static_cast<size_t>(s)];
    worst = std::max(worst, Relative(mine, ref.FlatAt(s)));
    EXPECT_LE(Relative(mine, ref.FlatAt(s)), 1e-2)
        << "loss of step " << s + 1 << ": sluice bf16 " << mine << " vs PyTorch autocast "
        << ref.FlatAt(s);
    differs_from_fp32 = differs_from_fp32 || mine != fp32.losses[static_cast<size_t>(s)];
  }
  EXPECT_TRUE(differs_from_fp32) << "the bf16 run gave fp32's losses: nothing was rounded";
  fmt::print("{}: largest relative difference from PyTorch autocast's losses: {:.2e}\n", model,
             worst);
  std::filesystem::remove_all(dir);
}

std::string ModelName(const testing::TestParamInfo<const char*>& info) { return info.param; }
std::string ImportedName(const testing::TestParamInfo<ImportedModel>& info) {
  return info.param.name;
}

INSTANTIATE_TEST_SUITE_P(Models, TorchImportAutocastParity,
                         testing::Values("gpt", "llama", "mlp_lm"), ModelName);
INSTANTIATE_TEST_SUITE_P(Models, TorchImportGolden,
                         testing::Values("gpt", "llama", "mlp_lm", "lstm_lm"), ModelName);
// seq_mlp, encoder and bert_mlm are modules a user brings as they are (an nn.Sequential MLP with a
// frozen position table; PyTorch's own nn.TransformerEncoderLayer; a BERT-style encoder): checked
// here only, with no golden files.
// The classifiers read arrays of a data file written at run time, also checked here only.
constexpr const char* kBlobs = "python3 examples/classifier_data.py {} --examples 256 > /dev/null";
constexpr const char* kBars = "python3 examples/bars_data.py {} --examples 128 > /dev/null";
constexpr const char* kPadded =
    "python3 examples/padded_text_data.py {} --examples 128 > /dev/null";
INSTANTIATE_TEST_SUITE_P(
    Models, TorchImportParity,
    testing::Values(ImportedModel{"gpt", "torch_models.py", nullptr},
                    ImportedModel{"llama", "torch_models.py", nullptr},
                    ImportedModel{"mlp_lm", "torch_models.py", nullptr},
                    ImportedModel{"seq_mlp", "torch_models.py", nullptr},
                    ImportedModel{"encoder", "torch_models.py", nullptr},
                    ImportedModel{"mlp_classifier", "torch_classifiers.py", kBlobs},
                    ImportedModel{"smoothed_mean", "torch_classifiers.py", kBlobs},
                    ImportedModel{"smoothed_sum", "torch_classifiers.py", kBlobs},
                    ImportedModel{"cnn", "torch_classifiers.py", kBars},
                    ImportedModel{"conv1d", "torch_classifiers.py", kBars},
                    ImportedModel{"resnet", "torch_classifiers.py", kBars, 1e-4},
                    ImportedModel{"bert_mlm", "torch_models.py", nullptr},
                    ImportedModel{"vit", "torch_classifiers.py", kBars},
                    ImportedModel{"bert_classifier", "torch_classifiers.py", kPadded},
                    ImportedModel{"bert_additive", "torch_classifiers.py", kPadded},
                    ImportedModel{"encoder_classifier", "torch_classifiers.py", kPadded},
                    ImportedModel{"gated_classifier", "torch_classifiers.py", kBlobs},
                    ImportedModel{"activations", "torch_classifiers.py", kBlobs},
                    ImportedModel{"text_cnn", "torch_classifiers.py", kPadded},
                    ImportedModel{"lstm_lm", "torch_models.py", nullptr},
                    ImportedModel{"gru_classifier", "torch_classifiers.py", kBars},
                    ImportedModel{"mobilenet_v2", "torch_classifiers.py", kBars},
                    ImportedModel{"convnext", "torch_classifiers.py", kBars},
                    ImportedModel{"unet", "torch_classifiers.py", kBars}),
    ImportedName);

// Dropout (torch_classifiers.py's mlp_dropout, p = 0.1 after a ReLU): sluice's masks are not
// PyTorch's, so single losses differ, and two things are compared instead, over four seeds (each
// seeds sluice's batches and masks; PyTorch trains on the same batches, its masks from the same
// seed): in eval mode, the loss of PyTorch's module.eval() with sluice's trained weights and
// sluice's inference form, exactly (1e-5 relative, or 1e-7 where the loss is near 0: no dropout
// there, as in the other parity cases); and learning, the mean loss over all 200 steps (batches
// of 64) averaged over the seeds, within 10% of PyTorch's. Both sides are deterministic (sluice's
// masks from the seed, PyTorch seeded with torch.manual_seed, the module's weights too), so the
// verdict is the same on every run; the bound is what the seeds' spread allows: one seed's mean
// lies about 3-6% (sluice: 0.112 to 0.120 here, 0.115 to 0.133 with the keys of an earlier
// layout) and 2% (PyTorch) from the four's (one standard deviation), so the two four-seed means
// stand 2-3.3% apart by chance (measured: sluice 0.1151, PyTorch 0.1156, -0.4%; +5.9% with the
// earlier keys) and 10% is at least 3 of that. The comparison checks that training with
// dropout learns as PyTorch's does; it is too coarse to see the 1/(1 - p) scale (the network
// makes up for it), which the op tests pin bit for bit.
TEST(TorchImportDropout, LearnsLikePyTorchOnAverageOverSeedsAndEvaluatesExactly) {
  if (!HaveTorch()) {
    GTEST_SKIP() << "python3-torch is not installed (scripts/install-deps.sh installs it)";
  }
  const std::string dir = ScratchDir("torch_import_dropout");
  std::filesystem::remove_all(dir);
  const std::string data = dir + ".data.safetensors";
  const std::string spec = SourceDir() + "/tests/parity/torch_classifiers.py:mlp_dropout";
  const std::string setup = fmt::format(
      "cd {} && {} && /usr/bin/python3 tools/torch_export.py {} --batch 4 --data {} --out {} "
      "> /dev/null",
      SourceDir(), fmt::format(fmt::runtime(kBlobs), data), spec, data, dir);
  ASSERT_EQ(std::system(setup.c_str()), 0) << setup;
  constexpr int64_t kDropoutSteps = 200;
  auto mean_loss = [&](auto loss_at) {
    double sum = 0;
    for (int64_t s = 0; s < kDropoutSteps; ++s) sum += loss_at(s);
    return sum / kDropoutSteps;
  };
  double mine = 0, theirs = 0;
  const std::vector<uint64_t> seeds = {1, 2, 3, 4};
  for (const uint64_t seed : seeds) {
    TrainConfig config = ImportConfig(dir, data, 0.0, kDropoutSteps);
    config.batch = 64;
    config.seed = seed;
    const std::string checkpoint = dir + "/trained.safetensors";
    const SluiceRun run = TrainExported(config, checkpoint);
    const std::optional<SafetensorsFile> ref =
        PyTorchReference(spec, dir, run, config, checkpoint, seed);
    ASSERT_TRUE(ref);
    const Tensor& losses = ref->tensors.at("losses");
    ASSERT_EQ(losses.numel(), kDropoutSteps);
    const double a = mean_loss([&](int64_t s) { return run.losses[static_cast<size_t>(s)]; });
    const double b = mean_loss([&](int64_t s) { return losses.FlatAt(s); });
    mine += a / static_cast<double>(seeds.size());
    theirs += b / static_cast<double>(seeds.size());
    const double eval_back = ref->tensors.at("eval_loss").FlatAt(0);
    EXPECT_LE(std::abs(eval_back - run.eval_loss), std::max(1e-5 * std::abs(eval_back), 1e-7))
        << "seed " << seed << ": PyTorch's module.eval() loss with sluice's weights " << eval_back
        << " vs sluice's inference form " << run.eval_loss;
    fmt::print(
        "seed {}: mean loss of {} steps: sluice {:.4f}, PyTorch {:.4f}; eval {:.6f} vs {:.6f}\n",
        seed, kDropoutSteps, a, b, run.eval_loss, eval_back);
  }
  fmt::print("over {} seeds: sluice {:.4f}, PyTorch {:.4f} ({:+.1f}%)\n", seeds.size(), mine,
             theirs, 100 * (mine / theirs - 1));
  EXPECT_LE(Relative(mine, theirs), 0.10) << "sluice " << mine << " vs PyTorch " << theirs;
  std::filesystem::remove_all(dir);
  std::filesystem::remove(data);
}

}  // namespace
}  // namespace sluice
