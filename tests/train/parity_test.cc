// Parity with an independent framework (in the manner of llm.c's test against PyTorch), through the
// engine `sluice train` runs: a Trainer with its default single-stage engine — micro-batch
// accumulation, clipping to the global norm, donated activations, the default GC — trains a small
// GPT on the sort task for three AdamW steps; PyTorch 1.13 (tests/parity/gpt_reference.py, with
// /usr/bin/python3) trains the same model from the same initial weights on the same micro-batches.
//
//   GoldenLossesAndNorms   always runs: the losses and gradient norms the reference produced,
//                          committed in tests/parity/gpt_golden.json with the micro-batches they
//                          came from (so this check runs where PyTorch is absent).
//   LivePyTorch            runs the reference now (skipped, saying so, without python3-torch):
//                          losses, norms and the weights after the last step.
//
//   ParityBf16.*           the same under mixed precision: sluice `--precision bf16` against
//                          PyTorch's torch.autocast("cpu", bfloat16) for ten steps (golden file
//                          tests/parity/gpt_bf16_golden.json). The two round at different places
//                          (autocast also runs attention's products and the head in bf16), so
//                          losses agree within 1e-2 relative and gradient norms within 5e-2.
//
// Tolerances: losses and norms 1e-5 relative; final weights 1e-4 of each tensor's largest entry
// plus 1e-3 of the AdamW steps taken (lr · steps: where a gradient is rounding noise).
// Regenerate the golden file after a deliberate change to initialization or data:
//   SLUICE_UPDATE_GOLDEN=1 ctest --test-dir build -R 'Parity.*LivePyTorch'
#include <cstdlib>
#include <fstream>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "scratch_path.h"
#include "sluice/io/safetensors.h"
#include "sluice/step/task.h"
#include "sluice/train/trainer.h"
#include "source_dir.h"

namespace sluice {
namespace {

TrainConfig ParityConfig() {
  TrainConfig c;
  c.model = "gpt";
  c.data = "sort";
  c.gpt = {.vocab = 0, .seq = 0, .layers = 2, .heads = 2, .dim = 32};
  c.steps = 3;
  c.batch = 6;
  c.microbatches = 2;  // accumulation
  c.optimizer = {.kind = OptimizerKind::kAdamW,
                 .lr = 3e-3,
                 .beta1 = 0.9,
                 .beta2 = 0.95,
                 .eps = 1e-8,
                 .weight_decay = 0.1,
                 .clip_norm = 0.5,
                 .schedule = LrSchedule::kConstant};
  c.seed = 11;
  c.threads = 1;
  c.eval_every = 0;
  return c;  // the GC mode and recompute are the defaults `sluice train` runs with
}

TrainConfig Bf16ParityConfig() {
  TrainConfig c = ParityConfig();
  c.gpt.precision = Precision::kBf16;
  c.steps = 10;
  return c;
}

nlohmann::json ReferenceConfig(const TrainConfig& c, const Trainer& trainer) {
  const OptimizerConfig& o = c.optimizer;
  nlohmann::json config = {{"dim", c.gpt.dim},
                           {"heads", c.gpt.heads},
                           {"layers", c.gpt.layers},
                           {"steps", c.steps},
                           {"microbatches", c.microbatches},
                           {"batch", c.batch},
                           {"seed", c.seed},
                           {"data", c.data},
                           {"vocab", trainer.Value("wte.weight").shape()[0]},
                           {"lr", o.lr},
                           {"beta1", o.beta1},
                           {"beta2", o.beta2},
                           {"eps", o.eps},
                           {"weight_decay", o.weight_decay},
                           {"clip", o.clip_norm}};
  if (c.gpt.precision != Precision::kFp32) config["precision"] = Name(c.gpt.precision);
  return config;
}

// The micro-batches of every step, as the engine binds them: "ids.<step>.<k>",
// "targets.<step>.<k>".
std::map<std::string, Tensor> MicroBatches(const TrainConfig& c) {
  std::unique_ptr<Task> task = MakeTask(c);
  std::map<std::string, Tensor> out;
  for (int64_t s = 0; s < c.steps; ++s) {
    for (int64_t k = 0; k < c.microbatches; ++k) {
      Scope scope;
      task->BindBatch(scope, DataSplit::kTrain, s * c.microbatches + k, c.batch / c.microbatches,
                      c.seed);
      out.emplace(fmt::format("ids.{}.{}", s, k), scope.Take("ids"));
      out.emplace(fmt::format("targets.{}.{}", s, k), scope.Take("targets"));
    }
  }
  return out;
}

struct SluiceRun {
  std::vector<double> losses, grad_norms;
};

SluiceRun Train(Trainer& trainer) {
  SluiceRun run;
  while (trainer.step() < trainer.config().steps) {
    StepRecord r = trainer.Step();
    run.losses.push_back(r.loss);
    run.grad_norms.push_back(r.grad_norm);
  }
  return run;
}

double Relative(double a, double b) { return std::abs(a - b) / std::max(std::abs(b), 1e-30); }

void ExpectClose(const std::vector<double>& sluice, const std::vector<double>& reference,
                 const char* what, double tolerance = 1e-5) {
  ASSERT_EQ(sluice.size(), reference.size()) << what;
  for (size_t s = 0; s < sluice.size(); ++s) {
    EXPECT_LE(Relative(sluice[s], reference[s]), tolerance)
        << what << " of step " << s + 1 << ": sluice " << sluice[s] << " vs PyTorch "
        << reference[s];
  }
}

std::string SourceDir() { return testing_support::SourceDir().string(); }

TEST(Parity, GoldenLossesAndNorms) {
  const std::string path = SourceDir() + "/tests/parity/gpt_golden.json";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot read " << path;
  const nlohmann::json golden = nlohmann::json::parse(in);

  const TrainConfig config = ParityConfig();
  Trainer trainer(config);
  EXPECT_EQ(golden.at("config"), ReferenceConfig(config, trainer))
      << "the golden file was made for another configuration: regenerate it (see the top of this "
         "file)";
  // The data first: a mismatch here is a change to the data, not to training.
  for (const auto& [name, t] : MicroBatches(config)) {
    const std::vector<int64_t> expected = golden.at("batches").at(name).get<std::vector<int64_t>>();
    ASSERT_EQ(t.numel(), static_cast<int64_t>(expected.size())) << name;
    for (int64_t i = 0; i < t.numel(); ++i)
      ASSERT_EQ(t.data<int64_t>()[i], expected[i]) << name << " at " << i;
  }
  const std::vector<double> norms = golden.at("grad_norms").get<std::vector<double>>();
  EXPECT_GT(*std::max_element(norms.begin(), norms.end()), config.optimizer.clip_norm)
      << "the configuration should exercise clipping";

  const SluiceRun run = Train(trainer);
  ExpectClose(run.losses, golden.at("losses").get<std::vector<double>>(), "loss");
  ExpectClose(run.grad_norms, norms, "gradient norm");
}

TEST(Parity, LivePyTorch) {
  if (std::system("/usr/bin/python3 -c 'import torch' > /dev/null 2>&1") != 0) {
    GTEST_SKIP()
        << "python3-torch is not installed (scripts/install-deps.sh installs it): only the golden "
           "file was checked";
  }
  const TrainConfig config = ParityConfig();
  Trainer trainer(config);
  std::map<std::string, Tensor> input = MicroBatches(config);
  for (const std::string& name : trainer.ParamNames())
    input.emplace("param." + name, trainer.Value(name).Clone());
  const std::string in_path = testing_support::ScratchPath("parity_input.safetensors"),
                    out_path = testing_support::ScratchPath("parity_output.safetensors");
  WriteSafetensors(in_path, input, {{"config", ReferenceConfig(config, trainer).dump()}});
  std::string cmd = fmt::format("/usr/bin/python3 {}/tests/parity/gpt_reference.py {} {}",
                                SourceDir(), in_path, out_path);
  if (std::getenv("SLUICE_UPDATE_GOLDEN") != nullptr)
    cmd += " --golden " + SourceDir() + "/tests/parity/gpt_golden.json";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "the PyTorch reference failed: " << cmd;
  const SafetensorsFile ref = ReadSafetensors(out_path);
  auto values = [&](const char* name) {
    const Tensor& t = ref.tensors.at(name);
    std::vector<double> v;
    for (int64_t i = 0; i < t.numel(); ++i) v.push_back(t.FlatAt(i));
    return v;
  };

  const SluiceRun run = Train(trainer);
  ExpectClose(run.losses, values("losses"), "loss");
  ExpectClose(run.grad_norms, values("grad_norms"), "gradient norm");
  double worst = 0;
  for (const std::string& name : trainer.ParamNames()) {
    const Tensor& mine = trainer.Value(name);
    const Tensor& theirs = ref.tensors.at("final." + name);
    double diff = 0, scale = 1e-12;
    for (int64_t i = 0; i < mine.numel(); ++i) {
      diff = std::max(diff, std::abs(mine.FlatAt(i) - theirs.FlatAt(i)));
      scale = std::max(scale, std::abs(theirs.FlatAt(i)));
    }
    // AdamW turns a gradient that is rounding noise in both frameworks (the attention key bias,
    // whose true gradient is zero) into steps of up to lr that differ: allow 1e-3 of those steps.
    const double allowed =
        1e-4 * scale + 1e-3 * config.optimizer.lr * static_cast<double>(config.steps);
    worst = std::max(worst, diff / scale);
    EXPECT_LE(diff, allowed) << name << " after step " << config.steps << " (largest entry "
                             << scale << ")";
  }
  double worst_loss = 0;
  for (size_t s = 0; s < run.losses.size(); ++s)
    worst_loss = std::max(worst_loss, Relative(run.losses[s], values("losses")[s]));
  fmt::print("largest relative difference from PyTorch: losses {:.2e}, final weights {:.2e}\n",
             worst_loss, worst);
}

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

// Runs tests/parity/gpt_reference.py on `config`'s initial weights and micro-batches; its output.
SafetensorsFile RunReference(const TrainConfig& config, Trainer& trainer,
                             const std::string& golden) {
  std::map<std::string, Tensor> input = MicroBatches(config);
  for (const std::string& name : trainer.ParamNames())
    input.emplace("param." + name, trainer.Value(name).Clone());
  const std::string in_path = testing_support::ScratchPath("parity_bf16_input.safetensors"),
                    out_path = testing_support::ScratchPath("parity_bf16_output.safetensors");
  WriteSafetensors(in_path, input, {{"config", ReferenceConfig(config, trainer).dump()}});
  std::string cmd = fmt::format("/usr/bin/python3 {}/tests/parity/gpt_reference.py {} {}",
                                SourceDir(), in_path, out_path);
  if (std::getenv("SLUICE_UPDATE_GOLDEN") != nullptr) cmd += " --golden " + golden;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << "the PyTorch reference failed: " << cmd;
  return ReadSafetensors(out_path);
}

std::vector<double> Values(const Tensor& t) {
  std::vector<double> v;
  for (int64_t i = 0; i < t.numel(); ++i) v.push_back(t.FlatAt(i));
  return v;
}

TEST(ParityBf16, GoldenLosses) {
  const std::string path = SourceDir() + "/tests/parity/gpt_bf16_golden.json";
  std::ifstream in(path);
  ASSERT_TRUE(in) << "cannot read " << path;
  const nlohmann::json golden = nlohmann::json::parse(in);
  const TrainConfig config = Bf16ParityConfig();
  Trainer trainer(config);
  EXPECT_EQ(golden.at("config"), ReferenceConfig(config, trainer))
      << "the golden file was made for another configuration: regenerate it (see the top of this "
         "file)";
  const SluiceRun run = Train(trainer);
  ExpectClose(run.losses, golden.at("losses").get<std::vector<double>>(), "bf16 loss", 1e-2);
  ExpectClose(run.grad_norms, golden.at("grad_norms").get<std::vector<double>>(),
              "bf16 gradient norm", 5e-2);
}

TEST(ParityBf16, DiffersFromFp32ByMoreThanFp32ParityAllows) {
  // Guards against a --precision bf16 that silently ran in f32 (and so matched autocast loosely).
  TrainConfig fp32 = Bf16ParityConfig();
  fp32.gpt.precision = Precision::kFp32;
  fp32.steps = 2;
  TrainConfig bf16 = Bf16ParityConfig();
  bf16.steps = 2;
  Trainer a(fp32), b(bf16);
  const SluiceRun ra = Train(a), rb = Train(b);
  EXPECT_GT(Relative(rb.losses[1], ra.losses[1]), 1e-5);
  EXPECT_LT(Relative(rb.losses[1], ra.losses[1]), 1e-2);
}

TEST(ParityBf16, LivePyTorch) {
  if (std::system("/usr/bin/python3 -c 'import torch' > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3-torch is not installed: only the golden file was checked";
  }
  const TrainConfig config = Bf16ParityConfig();
  Trainer trainer(config);
  const SafetensorsFile ref =
      RunReference(config, trainer, SourceDir() + "/tests/parity/gpt_bf16_golden.json");
  const SluiceRun run = Train(trainer);
  ExpectClose(run.losses, Values(ref.tensors.at("losses")), "bf16 loss", 1e-2);
  ExpectClose(run.grad_norms, Values(ref.tensors.at("grad_norms")), "bf16 gradient norm", 5e-2);
  double worst = 0;
  for (size_t s = 0; s < run.losses.size(); ++s)
    worst = std::max(worst, Relative(run.losses[s], Values(ref.tensors.at("losses"))[s]));
  fmt::print("bf16: largest relative difference of the losses from PyTorch autocast: {:.2e}\n",
             worst);
}

}  // namespace
}  // namespace sluice
