#include "sluice/train/single_stage.h"

#include "sluice/core/caching_allocator.h"
#include "sluice/step/stage_program.h"

namespace sluice {

namespace {

CachingAllocatorOptions AllocatorOptions(const TrainConfig& config) {
  CachingAllocatorOptions options{.reserved_headroom = config.reserved_headroom};
  if (!config.memory_budget.empty()) {
    options.max_reserved_bytes = static_cast<size_t>(config.memory_budget[0]);
  }
  return options;
}

class SingleStageEngine final : public StepEngine {
 public:
  explicit SingleStageEngine(const EngineContext& ctx)
      : config_(ctx.config),
        task_(ctx.task),
        micro_batch_size_(ctx.config.batch / ctx.config.microbatches),
        allocator_(AllocatorOptions(ctx.config)),
        program_({{.model = ctx.model}}, ctx.config,
                 {.allocator = &allocator_,
                  .threads = ShareIntraOpThreads(ctx.threads, /*ranks=*/1),
                  .recompute = RecomputeForStage(ctx.config, /*stage=*/0, /*stages=*/1)}) {}

  StepResult Step(int64_t step, int64_t first_batch, double lr) override {
    const int64_t M = config_.microbatches;
    const std::string& loss = program_.chunk(0).model.loss;
    allocator_.ResetPeak();
    StepResult r;
    double loss_sum = 0;
    for (int64_t k = 0; k < M; ++k) {
      Scope scope;
      task_.BindBatch(scope, DataSplit::kTrain, first_batch + k, micro_batch_size_, config_.seed);
      program_.Forward(0, scope);
      loss_sum += scope.Take(loss).FlatAt(0);
      program_.Backward(0, scope, grads_);
    }
    r.loss = loss_sum / static_cast<double>(M);
    r.grad_norm = GlobalNorm(program_.FinishGradients(grads_, M));
    r.updated = program_.UpdateIfFinite(grads_, r.grad_norm, r.loss, lr, step);
    const MemoryStats stats = allocator_.Stats();
    r.peak_allocated_bytes = stats.peak_allocated_bytes;
    r.peak_reserved_bytes = stats.peak_reserved_bytes;
    return r;
  }

  std::map<std::string, Tensor> State() const override { return program_.State(); }
  std::vector<StageMemoryForecast> Forecast() const override {
    return {ForecastSingleStage(program_.chunk(0).model, config_)};
  }
  GcMode gc_mode() const override { return ResolveGcMode(config_.gc, allocator_); }

 private:
  const TrainConfig& config_;
  const Task& task_;
  int64_t micro_batch_size_;
  CachingAllocator allocator_;  // declared before program_, which allocates from it
  StageProgram program_;
  GradientAccumulator grads_;
};

}  // namespace

std::unique_ptr<StepEngine> MakeSingleStageEngine(const EngineContext& context) {
  return std::make_unique<SingleStageEngine>(context);
}

}  // namespace sluice
