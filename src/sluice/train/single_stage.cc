#include "sluice/train/single_stage.h"

#include <algorithm>
#include <vector>

#include "sluice/autodiff/autodiff.h"
#include "sluice/core/caching_allocator.h"
#include "sluice/exec/interpreter.h"
#include "sluice/nn/optimizer.h"
#include "sluice/train/trainer.h"

namespace sluice {

namespace {

class SingleStageEngine final : public StepEngine {
 public:
  explicit SingleStageEngine(const EngineContext& ctx)
      : config_(ctx.config), task_(ctx.task), model_(ctx.model), micro_batch_(ctx.config.batch / ctx.config.microbatches) {
    std::vector<std::string> wrt;
    for (const ParamSpec& p : model_.params) wrt.push_back(p.name);
    backward_ = BuildBackward(model_.forward, {.loss = model_.loss, .wrt = wrt, .recompute = config_.recompute});

    ExecutableOptions base{.allocator = &allocator_, .mode = config_.mode, .gc = config_.gc, .threads = ctx.threads};
    ExecutableOptions fwd_opts = base;
    fwd_opts.keep = backward_.saved;
    forward_ = std::make_unique<Executable>(model_.forward, fwd_opts);
    ExecutableOptions bwd_opts = base;
    bwd_opts.donate = backward_.saved;  // saved activations die at their last backward use
    backward_exe_ = std::make_unique<Executable>(backward_.program, bwd_opts);
    optimizer_ = std::make_unique<Executable>(BuildOptimizer(model_.params, config_.optimizer), base);

    for (auto& [name, t] : InitParams(model_.params, config_.seed, allocator_)) scope_.Set(name, std::move(t));
    for (auto& [name, t] : InitOptimizerState(model_.params, config_.optimizer, allocator_)) scope_.Set(name, std::move(t));
  }

  StepResult Step(int64_t step, double lr) override {
    const TrainConfig& c = config_;
    StepResult r;
    // Each run restarts the allocator's peak, so the step's peak is the largest of its runs' peaks.
    auto track = [&](const RunStats& s) {
      r.peak_allocated_bytes = std::max(r.peak_allocated_bytes, s.peak_allocated_bytes);
      r.peak_reserved_bytes = std::max(r.peak_reserved_bytes, s.peak_reserved_bytes);
    };
    double loss_sum = 0;
    for (int64_t k = 0; k < c.microbatches; ++k) {
      task_.BindBatch(scope_, DataSplit::kTrain, step * c.microbatches + k, micro_batch_, c.seed);
      track(forward_->Run(scope_));
      loss_sum += scope_.Get(model_.loss).FlatAt(0);
      track(backward_exe_->Run(scope_));
      for (const std::string& g : backward_.grads) grads_.Add(g, scope_.Take(g));
    }
    r.loss = loss_sum / static_cast<double>(c.microbatches);
    r.grad_norm = grads_.Finish(c.microbatches, c.optimizer.clip_norm);
    for (const auto& [name, g] : grads_.grads()) scope_.Set(name, g);
    grads_.Clear();
    scope_.Set("lr", Tensor::Full({}, lr, DType::kF32, allocator_));
    scope_.Set("step", Tensor::Full({}, static_cast<double>(step + 1), DType::kF32, allocator_));
    track(optimizer_->Run(scope_));
    for (const std::string& g : backward_.grads) scope_.Erase(g);
    scope_.Erase(model_.loss);
    return r;
  }

  std::map<std::string, Tensor> State() const override {
    std::map<std::string, Tensor> out;
    for (const ParamSpec& p : model_.params) {
      out.emplace(p.name, scope_.Get(p.name));
      for (const std::string& s : OptimizerStateNames(p.name, config_.optimizer)) out.emplace(s, scope_.Get(s));
    }
    return out;
  }

 private:
  const TrainConfig& config_;
  const Task& task_;
  const Model& model_;
  int64_t micro_batch_;
  CachingAllocator allocator_;
  Backward backward_;
  std::unique_ptr<Executable> forward_, backward_exe_, optimizer_;
  Scope scope_;
  GradientAccumulator grads_;
};

}  // namespace

std::unique_ptr<StepEngine> MakeSingleStageEngine(const EngineContext& context) {
  return std::make_unique<SingleStageEngine>(context);
}

}  // namespace sluice
