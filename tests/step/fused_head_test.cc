// The GPT's head as one linear_cross_entropy (GptConfig::head_chunk): the loss within 1e-6 of the
// unfused matmul + cross_entropy, the gradients within rounding, and at GPT-2's vocabulary a
// working set of at most an eighth of the unfused head's in the forecast.
#include <algorithm>
#include <cmath>

#include <gtest/gtest.h>

#include "sluice/core/caching_allocator.h"
#include "sluice/step/memory_replay.h"
#include "sluice/step/stage_program.h"
#include "sluice/step/task.h"

namespace sluice {
namespace {

TrainConfig Gpt(int64_t head_chunk) {
  TrainConfig c;
  c.gpt = {.vocab = 300, .seq = 16, .layers = 1, .heads = 2, .dim = 16, .head_chunk = head_chunk};
  c.batch = 4;
  c.threads = 1;
  return c;
}

struct Step {
  double loss = 0;
  std::map<std::string, std::vector<float>> grads;
};

// One forward and backward of the first training batch.
Step RunStep(const TrainConfig& c) {
  const std::unique_ptr<Task> task = MakeTask(c);
  CachingAllocator allocator;
  StageProgram program({{.model = task->BuildTrain(c.batch)}}, c, {.allocator = &allocator});
  Scope scope;
  task->BindBatch(scope, DataSplit::kTrain, 0, c.batch, c.seed);
  program.Forward(0, scope);
  Step out{.loss = scope.Get("loss").FlatAt(0)};
  GradientAccumulator grads;
  program.Backward(0, scope, grads);
  for (const auto& [name, g] : grads.grads()) {
    std::vector<float>& v = out.grads[name];
    v.assign(g.data<float>(), g.data<float>() + g.numel());
  }
  return out;
}

TEST(FusedHead, LossAndGradientsMatchTheUnfusedHead) {
  const Step unfused = RunStep(Gpt(-1));
  for (int64_t chunk : {0, 5, 64}) {  // automatic (13 of 64 tokens), uneven chunks, one chunk
    SCOPED_TRACE(chunk);
    const Step fused = RunStep(Gpt(chunk));
    EXPECT_LE(std::abs(fused.loss - unfused.loss), 1e-6 * std::abs(unfused.loss));
    ASSERT_EQ(fused.grads.size(), unfused.grads.size());
    for (const auto& [name, want] : unfused.grads) {
      const std::vector<float>& got = fused.grads.at(name);
      ASSERT_EQ(got.size(), want.size()) << name;
      float largest = 0, off = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        largest = std::max(largest, std::abs(want[i]));
        off = std::max(off, std::abs(got[i] - want[i]));
      }
      EXPECT_LE(off, 1e-5f * largest) << name;
    }
  }
}

TEST(FusedHead, AChunkOfNoTokensIsRefused) {
  EXPECT_THROW(MakeTask(Gpt(-2))->BuildTrain(4), InvalidArgument);
}

// GPT-2's vocabulary on a narrow model: the unfused head holds the [b·T, vocab] logits and their
// gradient (2 x 147 MiB here), the fused one a chunk of them. Two micro-batches, so that at the
// second one's head the weight gradients are the accumulated buffers (gradients), and what is
// working is the head's working set.
TEST(FusedHead, TheWorkingSetAtGpt2VocabularyIsAtMostAnEighth) {
  auto forecast = [](int64_t head_chunk) {
    TrainConfig c = Gpt(head_chunk);
    c.gpt.vocab = 50257;
    c.gpt.dim = 64;
    c.batch = 128;
    c.microbatches = 2;
    return ForecastSingleStage(MakeTask(c)->BuildTrain(c.batch / c.microbatches), c);
  };
  const StageMemoryForecast unfused = forecast(-1), fused = forecast(0);
  const int64_t tokens = 64 * 12;  // a micro-batch of the sort data's sequences of 12
  const int64_t unfused_working = unfused.at_peak[MemoryUse::kWorking];
  const int64_t fused_working = fused.at_peak[MemoryUse::kWorking];
  EXPECT_GE(unfused_working, 2 * tokens * 50257 * 4) << "the logits and their gradient";
  EXPECT_LE(8 * fused_working, unfused_working)
      << "fused " << fused_working << " B, unfused " << unfused_working << " B";
  EXPECT_LT(fused.peak_allocated_bytes, unfused.peak_allocated_bytes);
}

// The planner's work estimate (EstimateWork: the recompute policy's cost, the budget's choice)
// counts the fused head's GEMM as it counts the unfused head's linear: the forward programs'
// estimates differ by the cross-entropy's elementwise passes only, not by the head's GEMM.
TEST(FusedHead, TheWorkEstimateCountsTheHeadsGemm) {
  const TrainConfig fused_config = Gpt(0), unfused_config = Gpt(-1);
  const double fused = EstimateWork(MakeTask(fused_config)->BuildTrain(4).forward);
  const double unfused = EstimateWork(MakeTask(unfused_config)->BuildTrain(4).forward);
  const double head_gemm = 2.0 * 4 * 16 * 16 * 300;  // 2·N·C·vocab, N = batch·seq tokens
  EXPECT_LT(std::abs(fused - unfused), 0.1 * head_gemm) << fused << " vs " << unfused;
}

}  // namespace
}  // namespace sluice
