// Weight gradients added straight into their accumulated buffers (TrainConfig::accumulate_in_place,
// autodiff.h's AccumulateGradients): bitwise the same training as giving each micro-batch's
// gradients out and adding them afterwards — GPT and MLP, one stage and pipelined (with and without
// the zero-bubble B/W split), a tied parameter — at a lower measured and forecast peak.
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "sluice/autodiff/autodiff.h"
#include "sluice/kernels/matmul.h"
#include "sluice/pipeline/pipeline_engine.h"
#include "sluice/step/memory_replay.h"
#include "sluice/step/task.h"
#include "sluice/train/trainer.h"
#include "trained_run.h"

namespace sluice::pipeline {
namespace {

using testing_support::ExpectBitwiseRun;
using testing_support::TrainAndKeep;
using testing_support::TrainedRun;

TrainConfig Config(const std::string& model) {
  TrainConfig c;
  c.model = model;
  if (model == "gpt") c.gpt = {.vocab = 0, .seq = 0, .layers = 2, .heads = 2, .dim = 32};
  if (model == "mlp") c.data = "blobs";
  c.steps = 3;
  c.batch = 16;
  c.microbatches = 4;
  c.optimizer.lr = 1e-2;
  c.optimizer.clip_norm = 0.5;
  c.threads = 1;
  c.eval_every = 0;
  return c;
}

TrainConfig Apart(TrainConfig c) {
  c.accumulate_in_place = false;
  return c;
}

TEST(AccumulateInPlace, TrainsBitwiseLikeAddingAfterwardsOnOneStage) {
  for (const std::string model : {"gpt", "mlp"}) {
    const TrainConfig c = Config(model);
    const TrainedRun apart = TrainAndKeep(Apart(c));
    const TrainedRun in_place = TrainAndKeep(c);
    ExpectBitwiseRun(apart, in_place, model);
    EXPECT_LT(in_place.peak, apart.peak) << model << ": no micro-batch's gradients beside the sum";
  }
}

TEST(AccumulateInPlace, TrainsBitwiseLikeAddingAfterwardsPipelined) {
  for (const std::string model : {"gpt", "mlp"}) {
    for (ScheduleKind kind : {ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubbleH1}) {
      const std::string what = fmt::format("{} {}", model, ScheduleKindName(kind));
      const TrainConfig c = Config(model);
      const PipelineOptions options{
          .stages = 2, .schedule = kind, .partition = PartitionKind::kBalanced};
      ExpectBitwiseRun(TrainAndKeep(Apart(c), PipelineEngineFactory(options)),
                       TrainAndKeep(c, PipelineEngineFactory(options)), what);
    }
  }
}

// The forecast replays what the run does: the accumulating backward from the second micro-batch
// on, so the plan shows the smaller peak.
TEST(AccumulateInPlace, TheForecastShowsTheSmallerPeak) {
  const TrainConfig c = Config("gpt");
  const std::unique_ptr<Task> task = MakeTask(c);
  const Model model = task->BuildTrain(c.batch / c.microbatches);
  const StageMemoryForecast apart = ForecastSingleStage(model, Apart(c));
  const StageMemoryForecast in_place = ForecastSingleStage(model, c);
  EXPECT_LT(in_place.peak_allocated_bytes, apart.peak_allocated_bytes);
  EXPECT_EQ(in_place.work, apart.work);  // the same arithmetic, counted the same
}

// The GPT's block weight gradients become GEMMs into the buffers when the micro-batch's tokens fit
// one GEMM block; the biases, layer norms, embeddings and the fused head's lm_head (made inside
// linear_cross_entropy_grad) are added in where they are made.
TEST(AccumulateInPlace, WeightGradientsBecomeGemmsIntoTheBuffers) {
  const TrainConfig c = Config("gpt");
  const Model model = MakeTask(c)->BuildTrain(1);  // one sequence: few tokens, one block
  std::vector<std::string> wrt, grads;
  for (ValueId v : model.forward.params()) {
    wrt.push_back(model.forward.value(v).name);
    grads.push_back(wrt.back() + ".grad");
  }
  const Backward bwd = BuildBackward(model.forward, {.loss = model.loss, .wrt = wrt});
  const Program acc = AccumulateGradients(bwd.program, grads, kernels::GemmOneBlockK());
  int gemms = 0, adds = 0;
  for (const Instruction& ins : acc.instructions()) {
    gemms += ins.op->name == "matmul_accumulate";
    adds += ins.op->name == "accumulate";
  }
  ASSERT_GE(kernels::GemmOneBlockK(), model.forward.type(model.forward.Get("ids")).shape.numel());
  EXPECT_EQ(gemms, 2 * 4) << "c_attn, attn.c_proj, c_fc, mlp.c_proj per block";
  EXPECT_EQ(gemms + adds, static_cast<int>(grads.size()));
  EXPECT_TRUE(acc.outputs().empty());
  for (const std::string& g : grads) EXPECT_EQ(acc.value(acc.Get(g)).kind, ValueKind::kInput) << g;
  EXPECT_THROW(AccumulateGradients(bwd.program, {"nothing.grad"}, 0), ProgramError);
}

}  // namespace
}  // namespace sluice::pipeline
