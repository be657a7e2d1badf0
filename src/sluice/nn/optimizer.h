// Optimizers as programs, and the host-side pieces around them (learning-rate schedule, gradient
// accumulation over micro-batches, clipping by global norm).
//
// BuildOptimizer writes one program that updates every parameter in place (BuildOptimizerInto the
// same into buffers of their own):
//   params  the model parameters and their state: "<p>.exp_avg", "<p>.exp_avg_sq" (AdamW) or
//           "<p>.momentum_buffer" (SGD) — names as in PyTorch's optimizer state;
//   inputs  "<p>.grad" for every parameter, scalar "lr" and (AdamW) scalar "step" (1-based);
//   ops     adamw_update / sgd_update (OpKind::kInPlace), PyTorch semantics (the *_into forms).
//
// Example:
//   OptimizerConfig opt{.kind = OptimizerKind::kAdamW, .lr = 3e-4};
//   Program update = BuildOptimizer(model.params, opt);
//   std::map<std::string, Tensor> state = InitOptimizerState(model.params, opt);
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sluice/core/enum_names.h"
#include "sluice/core/tensor.h"
#include "sluice/ir/program.h"
#include "sluice/nn/model.h"

namespace sluice {

enum class OptimizerKind { kAdamW, kSgd };

inline constexpr EnumEntry<OptimizerKind> kOptimizerKindNames[] = {
    {OptimizerKind::kAdamW, "adamw"},
    {OptimizerKind::kSgd, "sgd"},
};
static_assert(IsCompleteEnumTable(kOptimizerKindNames));

// The kind's name in kOptimizerKindNames ("adamw", "sgd"), and back (nullopt for any other text).
std::string_view Name(OptimizerKind kind);
std::optional<OptimizerKind> ParseOptimizerKind(std::string_view name);

enum class LrSchedule { kConstant, kCosine };

inline constexpr EnumEntry<LrSchedule> kLrScheduleNames[] = {
    {LrSchedule::kConstant, "constant"},
    {LrSchedule::kCosine, "cosine"},
};
static_assert(IsCompleteEnumTable(kLrScheduleNames));

// The schedule's name in kLrScheduleNames ("constant", "cosine"), and back (nullopt for any other
// text).
std::string_view Name(LrSchedule schedule);
std::optional<LrSchedule> ParseLrSchedule(std::string_view name);

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kAdamW;
  double lr = 1e-3;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // AdamW
  double momentum = 0.0;                          // SGD
  double weight_decay = 0.0;
  double clip_norm = 0.0;  // clip gradients to this global norm; 0 = off
  LrSchedule schedule = LrSchedule::kConstant;
  int64_t warmup_steps = 0;
  double min_lr = 0.0;  // cosine decays from lr to min_lr over the run
};

// Constants (ParamSpec::constant) are skipped by all three: they have no state and no update.
Program BuildOptimizer(const std::vector<ParamSpec>& params, const OptimizerConfig& config);
// The same update out of place (adamw_update_into / sgd_update_into): it reads the parameters and
// their state as BuildOptimizer's program does and writes the new values to params of their own,
// UpdatedName(name) of each ("<name>@updated"), leaving the old ones as they were. Post-validation
// double-buffers the state with it (step/stage_program.h): the old state stays for a rollback.
Program BuildOptimizerInto(const std::vector<ParamSpec>& params, const OptimizerConfig& config);
std::string UpdatedName(const std::string& name);

// Zero-initialized optimizer state tensors, by name.
std::map<std::string, Tensor> InitOptimizerState(const std::vector<ParamSpec>& params,
                                                 const OptimizerConfig& config,
                                                 Allocator& allocator = DefaultAllocator());
// Names of the state tensors of one parameter.
std::vector<std::string> OptimizerStateNames(const std::string& param,
                                             const OptimizerConfig& config);
// The same for a parameter's spec: none for a constant.
std::vector<std::string> OptimizerStateNames(const ParamSpec& param, const OptimizerConfig& config);

// Learning rate for 0-based `step` of `total_steps`: linear warmup over warmup_steps to lr, then
// constant or cosine decay to min_lr (nanoGPT's schedule).
double LearningRate(const OptimizerConfig& config, int64_t step, int64_t total_steps);

// The factor clipping scales the gradients by (torch.nn.utils.clip_grad_norm_): clip_norm /
// (norm + 1e-6) when that is below 1 (or not a number), else 1 — and 1 when clip_norm is 0
// (clipping off). The one definition of when clipping fires: GradientAccumulator::Clip and the
// post-validation of an eager update (step/stage_program.h) both ask it.
double ClipCoefficient(double norm, double clip_norm);

// Accumulates gradients over micro-batches: Add(g) sums (g is taken over for the first micro-batch,
// added after). Then MeanAndSumSquares divides by the micro-batches and returns each gradient's sum
// of squares (step/stage_program.h sums them in the model's parameter order into the global
// norm, whatever stage holds which gradient), and Clip scales to the clip norm.
class GradientAccumulator {
 public:
  void Add(const std::string& name, Tensor grad);
  // Gradient `name`, or null when there is none yet (a backward adds into it in place).
  const Tensor* Find(const std::string& name) const {
    auto it = grads_.find(name);
    return it == grads_.end() ? nullptr : &it->second;
  }
  // Removes and returns gradient `name`; an undefined tensor when there is none.
  Tensor Take(const std::string& name);
  // Divides every gradient by `micro_batches`; returns each one's sum of squares (in f64) by name.
  std::map<std::string, double> MeanAndSumSquares(int64_t micro_batches);
  // torch.nn.utils.clip_grad_norm_: scales by ClipCoefficient(norm, clip_norm) when it is not 1.
  void Clip(double norm, double clip_norm);
  const std::map<std::string, Tensor>& grads() const { return grads_; }
  void Clear() { grads_.clear(); }

 private:
  std::map<std::string, Tensor> grads_;
};

}  // namespace sluice
