#include "sluice/nn/optimizer.h"

#include <cmath>
#include <numbers>

#include <fmt/format.h>

#include "sluice/core/error.h"
#include "sluice/ir/builder.h"
#include "sluice/ir/ops/optimizer.h"
#include "sluice/kernels/accumulate.h"
#include "sluice/kernels/simd_kernels.h"

namespace sluice {

std::string_view Name(OptimizerKind kind) { return EnumName(kOptimizerKindNames, kind); }

std::optional<OptimizerKind> ParseOptimizerKind(std::string_view name) {
  return ParseEnum(kOptimizerKindNames, name);
}

std::string_view Name(LrSchedule schedule) { return EnumName(kLrScheduleNames, schedule); }

std::optional<LrSchedule> ParseLrSchedule(std::string_view name) {
  return ParseEnum(kLrScheduleNames, name);
}

std::vector<std::string> OptimizerStateNames(const std::string& param,
                                             const OptimizerConfig& config) {
  if (config.kind == OptimizerKind::kAdamW) return {param + ".exp_avg", param + ".exp_avg_sq"};
  return {param + ".momentum_buffer"};
}

std::vector<std::string> OptimizerStateNames(const ParamSpec& param,
                                             const OptimizerConfig& config) {
  if (param.constant) return {};
  return OptimizerStateNames(param.name, config);
}

namespace {

// The optimizer program: each parameter's update in place, or (`into`) written to its
// UpdatedName params.
Program BuildUpdate(const std::vector<ParamSpec>& params, const OptimizerConfig& config,
                    bool into) {
  Builder b(std::string(Name(config.kind)) + (into ? "_into" : ""));
  Var lr = b.Input("lr", DType::kF32, {});
  Var step = config.kind == OptimizerKind::kAdamW ? b.Input("step", DType::kF32, {}) : Var();
  for (const ParamSpec& s : params) {
    if (s.constant) continue;
    Var p = b.Param(s.name, DType::kF32, s.shape);
    Var g = b.Input(s.name + ".grad", DType::kF32, s.shape);
    const auto out = [&](const std::string& name) {
      return b.Param(UpdatedName(name), DType::kF32, s.shape);
    };
    std::vector<std::string> state = OptimizerStateNames(s.name, config);
    if (config.kind == OptimizerKind::kAdamW) {
      const AdamWOptions options{.beta1 = config.beta1,
                                 .beta2 = config.beta2,
                                 .eps = config.eps,
                                 .weight_decay = config.weight_decay};
      Var m = b.Param(state[0], DType::kF32, s.shape);
      Var v = b.Param(state[1], DType::kF32, s.shape);
      if (into) {
        AdamWUpdateInto(p, g, m, v, lr, step, out(s.name), out(state[0]), out(state[1]), options);
      } else {
        AdamWUpdate(p, g, m, v, lr, step, options);
      }
    } else {
      const SgdOptions options{.momentum = config.momentum, .weight_decay = config.weight_decay};
      Var buf = b.Param(state[0], DType::kF32, s.shape);
      if (into) {
        SgdUpdateInto(p, g, buf, lr, out(s.name), out(state[0]), options);
      } else {
        SgdUpdate(p, g, buf, lr, options);
      }
    }
  }
  return b.Build();
}

}  // namespace

Program BuildOptimizer(const std::vector<ParamSpec>& params, const OptimizerConfig& config) {
  return BuildUpdate(params, config, /*into=*/false);
}

Program BuildOptimizerInto(const std::vector<ParamSpec>& params, const OptimizerConfig& config) {
  return BuildUpdate(params, config, /*into=*/true);
}

std::string UpdatedName(const std::string& name) { return name + "@updated"; }

std::map<std::string, Tensor> InitOptimizerState(const std::vector<ParamSpec>& params,
                                                 const OptimizerConfig& config,
                                                 Allocator& allocator) {
  std::map<std::string, Tensor> state;
  for (const ParamSpec& s : params) {
    for (const std::string& n : OptimizerStateNames(s, config)) {
      state.emplace(n, Tensor::Zeros(s.shape, DType::kF32, allocator));
    }
  }
  return state;
}

double LearningRate(const OptimizerConfig& c, int64_t step, int64_t total_steps) {
  if (step < c.warmup_steps)
    return c.lr * static_cast<double>(step + 1) / static_cast<double>(c.warmup_steps);
  if (c.schedule == LrSchedule::kConstant) return c.lr;
  const int64_t decay = std::max<int64_t>(1, total_steps - c.warmup_steps);
  const double progress =
      std::min(1.0, static_cast<double>(step - c.warmup_steps) / static_cast<double>(decay));
  return c.min_lr + 0.5 * (1.0 + std::cos(std::numbers::pi * progress)) * (c.lr - c.min_lr);
}

void GradientAccumulator::Add(const std::string& name, Tensor grad) {
  SLUICE_CHECK(grad.dtype() == DType::kF32 && grad.is_contiguous(),
               "gradient {} must be contiguous f32", name);
  auto it = grads_.find(name);
  if (it == grads_.end()) {
    grads_.emplace(name, std::move(grad));
    return;
  }
  SLUICE_CHECK(it->second.shape() == grad.shape(), "gradient {} changed shape", name);
  kernels::AxpyBlas<float>(grad.data<float>(), it->second.data<float>(), grad.numel(), 1.0f);
}

Tensor GradientAccumulator::Take(const std::string& name) {
  auto it = grads_.find(name);
  if (it == grads_.end()) return Tensor();
  Tensor g = std::move(it->second);
  grads_.erase(it);
  return g;
}

std::map<std::string, double> GradientAccumulator::MeanAndSumSquares(int64_t micro_batches) {
  const float inv = 1.0f / static_cast<float>(micro_batches);
  std::map<std::string, double> sum_squares;
  for (auto& [name, g] : grads_) {
    if (micro_batches > 1) kernels::ScaleInPlaceBlas<float>(g.data<float>(), g.numel(), inv);
    sum_squares.emplace(name, kernels::Simd<float>().sum_squares(g.data<float>(), g.numel()));
  }
  return sum_squares;
}

double ClipCoefficient(double norm, double clip_norm) {
  if (clip_norm <= 0) return 1.0;
  const double coef = clip_norm / (norm + 1e-6);
  return coef >= 1.0 ? 1.0 : coef;
}

void GradientAccumulator::Clip(double norm, double clip_norm) {
  const double coef = ClipCoefficient(norm, clip_norm);
  if (coef == 1.0) return;
  for (auto& [name, g] : grads_) {
    kernels::ScaleInPlaceBlas<float>(g.data<float>(), g.numel(), static_cast<float>(coef));
  }
}

}  // namespace sluice
