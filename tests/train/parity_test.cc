// Parity with an independent framework (in the manner of llm.c's test against PyTorch): the same
// GPT, the same initial weights and the same data, 10 AdamW steps in sluice and in PyTorch 1.13
// (tests/parity/gpt_reference.py, run with /usr/bin/python3). Losses must agree within 1e-5
// relative and the first step's gradients within 1e-4 (relative to each tensor's largest entry).
#include <cstdlib>
#include <random>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "sluice/autodiff/autodiff.h"
#include "sluice/core/caching_allocator.h"
#include "sluice/exec/interpreter.h"
#include "sluice/io/safetensors.h"
#include "sluice/nn/gpt.h"
#include "sluice/nn/optimizer.h"

namespace sluice {
namespace {

double MaxError(const Tensor& a, const Tensor& b) {
  double diff = 0, scale = 1e-12;
  for (int64_t i = 0; i < a.numel(); ++i) {
    diff = std::max(diff, std::abs(a.FlatAt(i) - b.FlatAt(i)));
    scale = std::max(scale, std::abs(b.FlatAt(i)));
  }
  return diff / scale;
}

TEST(Parity, GptMatchesPyTorchOverTenAdamWSteps) {
  const char* source = std::getenv("SLUICE_SOURCE_DIR");
  ASSERT_NE(source, nullptr) << "run through CTest (SLUICE_SOURCE_DIR names the source tree)";
  const GptConfig cfg{.vocab = 37, .seq = 16, .layers = 2, .heads = 2, .dim = 32};
  const int64_t B = 3, T = 12, steps = 10;
  const OptimizerConfig opt{.kind = OptimizerKind::kAdamW, .lr = 3e-3, .beta1 = 0.9, .beta2 = 0.95,
                            .eps = 1e-8, .weight_decay = 0.1};

  Model model = BuildGpt(cfg, B, GptOutput::kLoss, T);
  std::map<std::string, Tensor> init = InitParams(model.params, 11);
  // The reference input: initial weights, every step's data (some targets ignored), the config.
  std::map<std::string, Tensor> input;
  for (const auto& [name, t] : init) input.emplace("param." + name, t);
  std::mt19937_64 rng(3);
  std::uniform_int_distribution<int64_t> token(0, cfg.vocab - 1);
  for (int64_t s = 0; s < steps; ++s) {
    Tensor ids = Tensor::Empty({B, T}, DType::kI64), targets = Tensor::Empty({B, T}, DType::kI64);
    for (int64_t i = 0; i < B * T; ++i) {
      ids.data<int64_t>()[i] = token(rng);
      targets.data<int64_t>()[i] = i % 5 == 0 ? -1 : token(rng);
    }
    input.emplace(fmt::format("ids.{}", s), ids);
    input.emplace(fmt::format("targets.{}", s), targets);
  }
  nlohmann::json config = {{"dim", cfg.dim}, {"heads", cfg.heads}, {"layers", cfg.layers}, {"steps", steps},
                           {"lr", opt.lr}, {"beta1", opt.beta1}, {"beta2", opt.beta2}, {"eps", opt.eps},
                           {"weight_decay", opt.weight_decay}};
  const std::string dir = ::testing::TempDir();
  const std::string in_path = dir + "/parity_input.safetensors", out_path = dir + "/parity_output.safetensors";
  WriteSafetensors(in_path, input, {{"config", config.dump()}});
  const std::string cmd = fmt::format("/usr/bin/python3 {}/tests/parity/gpt_reference.py {} {}", source, in_path, out_path);
  ASSERT_EQ(std::system(cmd.c_str()), 0)
      << "the PyTorch reference failed: " << cmd << "\n(needs python3-torch: run scripts/install-deps.sh)";
  SafetensorsFile ref = ReadSafetensors(out_path);

  // sluice: forward, backward, AdamW — the same programs `sluice train` runs.
  CachingAllocator alloc;
  std::vector<std::string> wrt;
  for (const ParamSpec& p : model.params) wrt.push_back(p.name);
  Backward bwd = BuildBackward(model.forward, {.loss = "loss", .wrt = wrt});
  Executable forward(model.forward, {.allocator = &alloc, .keep = bwd.saved});
  Executable backward(bwd.program, {.allocator = &alloc});
  Executable update(BuildOptimizer(model.params, opt), {.allocator = &alloc});
  Scope scope;
  for (const auto& [name, t] : init) scope.Set(name, t.Clone(alloc));
  for (auto& [name, t] : InitOptimizerState(model.params, opt, alloc)) scope.Set(name, t);

  const Tensor& losses = ref.tensors.at("losses");
  double worst_loss = 0, worst_grad = 0;
  for (int64_t s = 0; s < steps; ++s) {
    scope.Set("ids", input.at(fmt::format("ids.{}", s)));
    scope.Set("targets", input.at(fmt::format("targets.{}", s)));
    forward.Run(scope);
    const double loss = scope.Get("loss").FlatAt(0);
    worst_loss = std::max(worst_loss, std::abs(loss - losses.FlatAt(s)) / std::abs(losses.FlatAt(s)));
    EXPECT_LE(std::abs(loss - losses.FlatAt(s)) / std::abs(losses.FlatAt(s)), 1e-5)
        << "step " << s + 1 << ": sluice " << loss << " vs PyTorch " << losses.FlatAt(s);
    backward.Run(scope);
    if (s == 0) {
      for (const std::string& g : bwd.grads) {
        worst_grad = std::max(worst_grad, MaxError(scope.Get(g), ref.tensors.at(g)));
        EXPECT_LE(MaxError(scope.Get(g), ref.tensors.at(g)), 1e-4) << g;
      }
    }
    scope.Set("lr", Tensor::Full({}, opt.lr, DType::kF32, alloc));
    scope.Set("step", Tensor::Full({}, static_cast<double>(s + 1), DType::kF32, alloc));
    update.Run(scope);
    for (const std::string& n : bwd.saved) scope.Erase(n);
  }
  fmt::print("largest relative difference from PyTorch: losses {:.2e}, step-1 gradients {:.2e}\n", worst_loss,
             worst_grad);
}

}  // namespace
}  // namespace sluice
