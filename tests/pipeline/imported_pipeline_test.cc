// Imported PyTorch modules on pipeline stages: the committed exports of tests/parity/torch_import/
// (tools/torch_export.py of tests/parity/torch_models.py) train at --stages 2 and 4 bit for bit
// like one stage. The Llama-style model reads its embedding table again as the output head (a
// parameter tied across the first and the last stage) and its rotary tables from every block
// (constants held by each stage reading them); the nanoGPT-style GPT ties its head the same way.
#include <string>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "sluice/pipeline/pipeline_engine.h"
#include "sluice/train/trainer.h"
#include "source_dir.h"
#include "trained_run.h"

namespace sluice::pipeline {
namespace {

using testing_support::ExpectBitwiseRun;
using testing_support::TrainAndKeep;
using testing_support::TrainedRun;

// A few AdamW steps of the exported `model` from its PyTorch weights, in four micro-batches with
// clipping on, so that the global gradient norm spans every stage.
TrainConfig ImportedConfig(const std::string& model) {
  const std::string dir =
      (testing_support::SourceDir() / "tests/parity/torch_import" / model).string();
  TrainConfig c;
  c.model = "program";
  c.program = dir + "/model.sluice";
  c.init_from = dir + "/init.safetensors";
  c.data = "sort";
  c.steps = 4;
  c.batch = 8;
  c.microbatches = 4;
  c.optimizer.clip_norm = 0.5;
  c.seed = 3;
  c.threads = 1;
  c.eval_every = 0;
  return c;
}

struct Case {
  int stages;
  ScheduleKind kind;
  int chunks;
};

class ImportedPipeline : public testing::TestWithParam<const char*> {};

TEST_P(ImportedPipeline, TrainsBitwiseLikeOneStage) {
  const TrainConfig config = ImportedConfig(GetParam());
  const TrainedRun one = TrainAndKeep(config);
  ASSERT_LT(one.losses.back(), one.losses.front());  // it learns
  // Four units (embed, two blocks, head): two stages of two, four of one, or two ranks of two
  // chunks (zb-v: embed and head on rank 0, reading one copy of the table).
  for (const Case& c : {Case{2, ScheduleKind::kOneFOneB, 0}, Case{2, ScheduleKind::kZeroBubbleV, 0},
                        Case{4, ScheduleKind::kOneFOneB, 0}, Case{4, ScheduleKind::kGPipe, 0}}) {
    const PipelineOptions options{.stages = c.stages,
                                  .schedule = c.kind,
                                  .chunks = c.chunks,
                                  .partition = PartitionKind::kBalanced};
    ExpectBitwiseRun(
        one, TrainAndKeep(config, PipelineEngineFactory(options)),
        fmt::format("{} on {} stages, {}", GetParam(), c.stages, ScheduleKindName(c.kind)));
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ImportedPipeline, testing::Values("gpt", "llama"),
                         [](const testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

}  // namespace
}  // namespace sluice::pipeline
