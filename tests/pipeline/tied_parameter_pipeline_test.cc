// Tied parameters across pipeline stages: a language model whose output head is its token
// embedding trains at --stages 2 and 4 under every kind of schedule bit for bit like one stage
// (losses, gradient norms, final state), every rank's copy of the tied table stays equal to the
// others, a checkpoint holds the table once and resumes bitwise into every copy, and the memory
// forecast counts the copy on every stage holding it.
#include <algorithm>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "scratch_path.h"
#include "sluice/io/checkpoint.h"
#include "sluice/nn/training_program.h"
#include "sluice/pipeline/memory_forecast.h"
#include "sluice/pipeline/pipeline_engine.h"
#include "sluice/train/trainer.h"
#include "source_dir.h"
#include "trained_run.h"

namespace sluice::pipeline {
namespace {

using testing_support::ExpectBitwiseRun;
using testing_support::TrainAndKeep;
using testing_support::TrainedRun;

// A language model on the sort task (vocabulary 11) with `blocks` residual MLP blocks between an
// embedding and a head that reads the embedding table again, transposed: units embed, block.i,
// head — blocks + 2 of them, so that 4 ranks of 2 chunks each get a unit with 6 blocks. With
// `shared_up`, every block also reads block 0's up-projection (ALBERT's sharing).
std::string TiedLm(int blocks, bool shared_up = false) {
  std::string params, units;
  std::string x = "%x";
  for (int i = 0; i < blocks; ++i) {
    const int up = shared_up ? 0 : i;
    params += fmt::format("  param %b{0}.norm: f32[16] = ones\n", i);
    if (up == i) params += fmt::format("  param %b{0}.up: f32[16, 32] = normal(0, 0.1)\n", i);
    params += fmt::format("  param %b{0}.down: f32[32, 16] = normal(0, 0.1)\n", i);
    units += fmt::format(
        "  unit block.{0} {{\n"
        "    %b{0}.n: f32[B, T, 16] = rms_norm({1}, %b{0}.norm) {{eps = 1e-06}}\n"
        "    %b{0}.u: f32[B, T, 32] = matmul(%b{0}.n, %b{2}.up)\n"
        "    %b{0}.a: f32[B, T, 32] = relu(%b{0}.u)\n"
        "    %b{0}.d: f32[B, T, 16] = matmul(%b{0}.a, %b{0}.down)\n"
        "    %b{0}.out: f32[B, T, 16] = add({1}, %b{0}.d)\n"
        "  }}\n",
        i, x, up);
    x = fmt::format("%b{}.out", i);
  }
  return fmt::format(R"(program tied_lm {{
  input %ids: i64[B, T] = tokens
  input %targets: i64[B, T] = next_tokens
  param %tok.weight: f32[11, 16] = normal(0, 0.1)
  param %pos.weight: f32[T, 16] = normal(0, 0.1)
{}  param %norm.weight: f32[16] = ones
  unit embed {{
    %tok: f32[B, T, 16] = embedding(%ids, %tok.weight)
    %x: f32[B, T, 16] = add(%tok, %pos.weight)
  }}
{}  unit head {{
    %final: f32[B, T, 16] = rms_norm({}, %norm.weight) {{eps = 1e-06}}
    %logits: f32[B, T, 11] = matmul(%final, %tok.weight) {{transpose_b = true}}
    %loss: f32[] = cross_entropy(%logits, %targets)
  }}
  output %loss
}}
)",
                     params, units, x);
}

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = testing_support::ScratchPath(name);
  std::ofstream(path) << text;
  return path;
}

// Six steps of the tied LM with 8 micro-batches (zb-v at P = 4 needs 2P − 1), one intra-op thread
// so that sums run in one order and runs compare bit for bit, clipping on (it reads the norm).
TrainConfig Config(const std::string& name = "tied_lm.sluice") {
  TrainConfig c;
  c.model = "program";
  c.program = WriteTemp(name, TiedLm(6));
  c.data = "sort";
  c.steps = 6;
  c.batch = 16;
  c.microbatches = 8;
  c.optimizer.lr = 1e-2;
  c.optimizer.schedule = LrSchedule::kConstant;
  c.optimizer.warmup_steps = 1;
  c.optimizer.clip_norm = 0.5;
  c.threads = 1;
  c.eval_every = 0;
  return c;
}

// The tied table and its optimizer state of every rank holding it, against the first holder's.
void ExpectEqualCopies(const PipelineEngine& engine, int stages, const OptimizerConfig& optimizer,
                       const std::string& what) {
  std::vector<std::string> names = OptimizerStateNames("tok.weight", optimizer);
  names.insert(names.begin(), "tok.weight");
  int holders = 0;
  std::map<std::string, Tensor> first;
  for (int r = 0; r < stages; ++r) {
    const std::map<std::string, Tensor> state = engine.RankState(r);
    if (!state.contains("tok.weight")) continue;
    ++holders;
    if (first.empty()) {
      first = state;
      continue;
    }
    for (const std::string& n : names) {
      const Tensor& a = first.at(n);
      const Tensor& b = state.at(n);
      ASSERT_EQ(a.numel(), b.numel()) << what << ": " << n;
      for (int64_t i = 0; i < a.numel(); ++i) {
        ASSERT_EQ(a.FlatAt(i), b.FlatAt(i)) << what << ": " << n << " of rank " << r << " at " << i;
      }
    }
  }
  EXPECT_GE(holders, 1) << what;
}

struct Case {
  ScheduleKind kind;
  int chunks;
};

TEST(TiedParameterPipeline, FindsTheTableReadByEmbedAndHead) {
  const TrainingProgram p = ParseTrainingProgram(TiedLm(2), "tied_lm", {{"B", 2}, {"T", 5}});
  const std::vector<TiedParam> tied = TiedParams(p.model.forward);
  ASSERT_EQ(tied.size(), 1u);
  EXPECT_EQ(tied[0].name, "tok.weight");
  EXPECT_EQ(tied[0].units, (std::vector<std::string>{"embed", "head"}));
  const Program separated = SeparateTiedReads(p.model.forward, tied);
  EXPECT_FALSE(separated.Find("tok.weight"));
  EXPECT_TRUE(separated.Find("tok.weight@embed"));
  EXPECT_TRUE(separated.Find("tok.weight@head"));
  EXPECT_EQ(separated.units(), p.model.forward.units());
  EXPECT_EQ(separated.instructions().size(), p.model.forward.instructions().size());
}

// Every schedule kind at P = 2 and 4 trains bitwise like one stage, and the copies stay equal:
// embed and head on different ranks (1f1b, gpipe, zb-h1, interleaved), or on one rank reading the
// one copy from two chunks (zb-v puts the first and the last virtual stage on rank 0).
TEST(TiedParameterPipeline, TrainsBitwiseLikeOneStageAndKeepsTheCopiesEqual) {
  const TrainConfig config = Config();
  const TrainedRun one = TrainAndKeep(config);
  ASSERT_LT(one.losses.back(), one.losses.front());  // it learns
  const Case cases[] = {{ScheduleKind::kOneFOneB, 0},
                        {ScheduleKind::kGPipe, 0},
                        {ScheduleKind::kInterleaved, 2},
                        {ScheduleKind::kZeroBubbleH1, 0},
                        {ScheduleKind::kZeroBubbleV, 0}};
  for (const Case& c : cases) {
    for (int P : {2, 4}) {
      const std::string what = fmt::format("{} P={}", ScheduleKindName(c.kind), P);
      const PipelineOptions options{.stages = P,
                                    .schedule = c.kind,
                                    .chunks = c.chunks,
                                    .partition = PartitionKind::kBalanced};
      const PipelineEngine* engine = nullptr;
      auto factory = [&](const EngineContext& ctx) -> std::unique_ptr<StepEngine> {
        auto e = std::make_unique<PipelineEngine>(ctx, options);
        engine = e.get();
        return e;
      };
      Trainer trainer(config, factory);
      TrainedRun piped;
      for (int64_t s = 0; s < config.steps; ++s) {
        const StepRecord r = trainer.Step();
        piped.losses.push_back(r.loss);
        piped.norms.push_back(r.grad_norm);
      }
      piped.state = testing_support::KeepState(trainer, config.optimizer);
      ExpectBitwiseRun(one, piped, what);
      ExpectEqualCopies(*engine, P, config.optimizer, what);
    }
  }
}

// A weight read by every block as well as the tied table: at P = 4 each of the four ranks holds the
// block weight, their shares summed in unit order, bitwise one stage's.
TEST(TiedParameterPipeline, AWeightSharedByEveryBlockTrainsBitwiseOnFourStages) {
  TrainConfig config = Config("shared_lm.sluice");
  config.program = WriteTemp("shared_lm.sluice", TiedLm(6, /*shared_up=*/true));
  const TrainedRun one = TrainAndKeep(config);
  for (const Case& c : {Case{ScheduleKind::kOneFOneB, 0}, Case{ScheduleKind::kInterleaved, 2}}) {
    const PipelineOptions options{
        .stages = 4, .schedule = c.kind, .chunks = c.chunks, .partition = PartitionKind::kBalanced};
    ExpectBitwiseRun(one, TrainAndKeep(config, PipelineEngineFactory(options)),
                     fmt::format("{} P=4, b0.up shared", ScheduleKindName(c.kind)));
  }
}

// A checkpoint of a pipelined run holds the table once, under its own name; resuming it on
// P = 2 and on one stage continues bitwise, every copy loaded.
TEST(TiedParameterPipeline, ACheckpointHoldsTheTableOnceAndResumesBitwiseIntoEveryCopy) {
  TrainConfig config = Config("tied_lm_resume.sluice");
  config.steps = 4;
  const PipelineOptions options{.stages = 2};
  const TrainedRun whole = TrainAndKeep(config, PipelineEngineFactory(options));

  const std::string path = testing_support::ScratchPath("tied_lm.safetensors");
  TrainConfig first = config;
  first.steps = 2;
  first.save_path = path;
  {
    Trainer trainer(first, PipelineEngineFactory(options));
    trainer.Run();
  }
  const Checkpoint ckpt = LoadCheckpoint(path);
  EXPECT_TRUE(ckpt.tensors.contains("tok.weight"));
  for (const auto& [name, t] : ckpt.tensors) EXPECT_EQ(name.find('@'), std::string::npos) << name;

  TrainConfig resumed = config;
  resumed.resume_path = path;
  const PipelineEngine* engine = nullptr;
  auto factory = [&](const EngineContext& ctx) -> std::unique_ptr<StepEngine> {
    auto e = std::make_unique<PipelineEngine>(ctx, options);
    engine = e.get();
    return e;
  };
  Trainer trainer(resumed, factory);
  // Both copies hold the checkpoint's table before any step.
  for (int r = 0; r < 2; ++r) {
    const Tensor& saved = ckpt.tensors.at("tok.weight");
    const Tensor copy = engine->RankState(r).at("tok.weight");
    for (int64_t i = 0; i < saved.numel(); ++i)
      ASSERT_EQ(saved.FlatAt(i), copy.FlatAt(i)) << "rank " << r << " at " << i;
  }
  std::vector<double> losses;
  while (trainer.step() < config.steps) losses.push_back(trainer.Step().loss);
  EXPECT_EQ(losses, std::vector<double>(whole.losses.begin() + 2, whole.losses.end()));
  ExpectEqualCopies(*engine, 2, config.optimizer, "resumed");

  TrainConfig on_one = resumed;  // the pipeline's checkpoint on one stage
  Trainer single(on_one);
  std::vector<double> single_losses;
  while (single.step() < config.steps) single_losses.push_back(single.Step().loss);
  EXPECT_EQ(single_losses, losses);
}

// Each rank holding the table counts it — parameter and optimizer state — in its forecast, and the
// forecast brackets the measured peak as for untied models.
TEST(TiedParameterPipeline, TheForecastCountsTheCopyOnEveryHoldingStage) {
  TrainConfig config = Config("tied_lm_forecast.sluice");
  config.steps = 2;
  {  // one stage: exact, the per-unit gradient shares included
    Trainer trainer(config);
    int64_t peak = 0;
    for (int64_t s = 0; s < config.steps; ++s)
      peak = std::max(peak, trainer.Step().peak_allocated_bytes);
    const std::vector<StageMemoryForecast> one = trainer.engine().Forecast();
    ASSERT_EQ(one.size(), 1u);
    EXPECT_EQ(one[0].peak_allocated_bytes, peak);
  }
  for (int P : {2, 4}) {
    const PipelineOptions options{.stages = P};
    std::vector<StageMemoryForecast> forecast, untied;
    const PipelineEngine* engine = nullptr;
    auto factory = [&](const EngineContext& ctx) -> std::unique_ptr<StepEngine> {
      forecast = ForecastPipeline(ctx, options);
      auto e = std::make_unique<PipelineEngine>(ctx, options);
      engine = e.get();
      return e;
    };
    Trainer trainer(config, factory);
    for (int64_t s = 0; s < config.steps; ++s) trainer.Step();
    ASSERT_EQ(forecast.size(), static_cast<size_t>(P));
    const int64_t table = 11 * 16 * static_cast<int64_t>(sizeof(float));
    const int64_t copies =
        1 + static_cast<int64_t>(OptimizerStateNames("tok.weight", config.optimizer).size());
    for (int r = 0; r < P; ++r) {
      int64_t held = 0;  // what the rank really holds between steps
      for (const auto& [name, t] : engine->RankState(r))
        held += t.numel() * static_cast<int64_t>(sizeof(float));
      EXPECT_EQ(forecast[r].persistent_bytes, held) << "P=" << P << " stage " << r;
      const bool holder = r == 0 || r == P - 1;
      EXPECT_EQ(engine->RankState(r).contains("tok.weight"), holder) << "stage " << r;
      if (holder) {
        EXPECT_GE(held, copies * table) << "stage " << r;
      }
      const int64_t measured = engine->reports()[static_cast<size_t>(r)].peak_allocated_bytes;
      EXPECT_LE(measured, forecast[r].peak_allocated_bytes) << "P=" << P << " stage " << r;
      EXPECT_GE(measured, forecast[r].least_peak_allocated_bytes) << "P=" << P << " stage " << r;
    }
  }
}

}  // namespace
}  // namespace sluice::pipeline
