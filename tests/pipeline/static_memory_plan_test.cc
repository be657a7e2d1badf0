// The static memory plan (exec/memory_plan.h) on the GPT programs training runs: the arena stays
// within 1.05× of the planned values' liveness bound over several shapes, forward and backward;
// training with it is bitwise the same as without, on one stage and on a pipeline; the memory
// forecast stays exact on one stage. The figures (arena / bound, step peaks) are printed for
// docs/executor.md, "Static memory plan".
#include <gtest/gtest.h>

#include "sluice/core/caching_allocator.h"
#include "sluice/pipeline/memory_forecast.h"
#include "sluice/pipeline/pipeline_engine.h"
#include "sluice/step/task.h"
#include "sluice/train/single_stage.h"
#include "sluice/train/trainer.h"
#include "trained_run.h"

namespace sluice::pipeline {
namespace {

struct Shape4 {
  int layers, heads, dim;
  int64_t batch;
};

TrainConfig Config(const Shape4& s, MemoryPlanMode plan) {
  TrainConfig c;
  c.gpt = {.vocab = 0, .seq = 0, .layers = s.layers, .heads = s.heads, .dim = s.dim};
  c.steps = 3;
  c.batch = s.batch;
  c.microbatches = 2;
  c.optimizer.lr = 1e-2;
  c.optimizer.clip_norm = 0.5;
  c.threads = 1;
  c.eval_every = 0;
  c.memory_plan = plan;
  return c;
}

double Ratio(const ArenaPlan& a) {
  return static_cast<double>(a.arena_bytes) / static_cast<double>(a.planned_bound);
}

TEST(StaticMemoryPlan, GptArenasAreWithinFivePercentOfTheBound) {
  const Shape4 shapes[] = {{1, 2, 16, 4},  {2, 2, 32, 8}, {2, 4, 64, 8},
                           {4, 4, 64, 16}, {3, 2, 48, 4}, {6, 6, 96, 8}};
  fmt::print("attention recompute   L  H   C   B  program    planned  arena / bound\n");
  for (const Shape4& s : shapes) {
    for (GptAttention attention : {GptAttention::kFused, GptAttention::kNaive}) {
      for (RecomputePolicy policy : {RecomputePolicy::kCheap, RecomputePolicy::kNone}) {
        TrainConfig c = Config(s, MemoryPlanMode::kStatic);
        c.gpt.attention = attention;
        c.recompute = {policy};
        std::unique_ptr<Task> task = MakeTask(c);
        CachingAllocator allocator;
        StageProgram program({{.model = task->BuildTrain(c.batch / c.microbatches)}}, c,
                             {.allocator = &allocator, .recompute = policy, .plan_only = true});
        const Chunk& ch = program.chunk(0);
        for (const Executable* exe : {ch.forward.get(), ch.backward_exe.get()}) {
          const ArenaPlan& a = exe->arena();
          const std::string label = fmt::format(
              "{:9} {:9} {:2} {:2} {:3} {:3}  {:9} {:8}  {:.4f}", Name(attention), Name(policy),
              s.layers, s.heads, s.dim, s.batch / c.microbatches,
              exe == ch.forward.get() ? "forward" : "backward", a.num_planned, Ratio(a));
          fmt::print("{}\n", label);
          ASSERT_GT(a.planned_bound, 0) << label;
          EXPECT_GE(a.arena_bytes, a.planned_bound) << label;
          EXPECT_LE(Ratio(a), 1.05) << label;
        }
      }
    }
  }
}

using testing_support::TrainAndKeep;
using Trained = testing_support::TrainedRun;

Trained Train(const TrainConfig& c, const PipelineOptions* pipe = nullptr) {
  EngineFactory factory;
  if (pipe != nullptr) {
    factory = [pipe](const EngineContext& ctx) -> std::unique_ptr<StepEngine> {
      return std::make_unique<PipelineEngine>(ctx, *pipe);
    };
  }
  return TrainAndKeep(c, factory);
}

void ExpectSameTraining(const Trained& a, const Trained& b, const std::string& label) {
  EXPECT_EQ(a.losses, b.losses) << label;
  EXPECT_EQ(a.norms, b.norms) << label;
  ASSERT_EQ(a.state.size(), b.state.size()) << label;
  for (const auto& [name, values] : a.state) {
    EXPECT_TRUE(b.state.at(name) == values) << label << ": " << name;
  }
}

TEST(StaticMemoryPlan, TrainsBitwiseLikeDynamic) {
  for (const Shape4& s : {Shape4{2, 2, 32, 8}, Shape4{3, 4, 64, 8}}) {
    for (GptAttention attention : {GptAttention::kFused, GptAttention::kNaive}) {
      TrainConfig c = Config(s, MemoryPlanMode::kDynamic);
      c.gpt.attention = attention;
      const Trained dynamic = Train(c);
      c.memory_plan = MemoryPlanMode::kStatic;
      const Trained planned = Train(c);
      const std::string label = fmt::format("L={} C={} {}", s.layers, s.dim, Name(attention));
      ExpectSameTraining(dynamic, planned, label);
      fmt::print(
          "one stage {}: step peak dynamic {} B, static {} B ({:+.1f}%)\n", label, dynamic.peak,
          planned.peak,
          100.0 * (static_cast<double>(planned.peak) / static_cast<double>(dynamic.peak) - 1));
    }
  }
}

TEST(StaticMemoryPlan, PipelinesTrainBitwiseLikeDynamic) {
  TrainConfig c = Config({4, 2, 32, 8}, MemoryPlanMode::kDynamic);
  c.microbatches = 4;
  for (ScheduleKind kind : {ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubbleH1}) {
    const PipelineOptions options{.stages = 2, .schedule = kind};
    c.memory_plan = MemoryPlanMode::kDynamic;
    const Trained dynamic = Train(c, &options);
    c.memory_plan = MemoryPlanMode::kStatic;
    const Trained planned = Train(c, &options);
    ExpectSameTraining(dynamic, planned, std::string(ScheduleKindName(kind)));
  }
}

// The forecast replays the arena as the run holds it: still exact to the byte on one stage.
TEST(StaticMemoryPlan, TheOneStageForecastStaysExact) {
  for (RecomputePolicy policy : {RecomputePolicy::kNone, RecomputePolicy::kCheap}) {
    TrainConfig c = Config({2, 2, 32, 8}, MemoryPlanMode::kStatic);
    c.recompute = {policy};
    int64_t forecast = 0;
    Trainer trainer(c, [&](const EngineContext& ctx) -> std::unique_ptr<StepEngine> {
      forecast = ForecastSingleStage(ctx.model, ctx.config).peak_allocated_bytes;
      return MakeSingleStageEngine(ctx);
    });
    int64_t measured = 0;
    for (int64_t s = 0; s < c.steps; ++s) {
      measured = std::max(measured, trainer.Step().peak_allocated_bytes);
    }
    EXPECT_EQ(forecast, measured) << Name(policy);
  }
}

TEST(StaticMemoryPlan, ParallelModeIsAConfigurationError) {
  TrainConfig c = Config({1, 2, 16, 4}, MemoryPlanMode::kStatic);
  c.mode = RunMode::kParallel;
  try {
    Trainer trainer(c);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--memory-plan static needs --mode trace"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace sluice::pipeline
