// The example programs train, on one stage and cut into two pipeline stages at their units, bit for
// bit alike: examples/gpt.sluice (the exported GPT) and examples/prenorm.sluice (a hand-written
// pre-norm LM with RMSNorm and fused attention) and examples/tied_lm.sluice (the same with its head
// tied to its embedding) on the sort task, and
// examples/array_classifier.sluice (two blocks sharing a tied weight, on one stage or both) on a
// safetensors file of named arrays that its inputs bind under other names, and
// examples/batch_norm_classifier.sluice (running statistics as buffers) on the same arrays.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "scratch_path.h"
#include "sluice/core/error.h"
#include "sluice/io/safetensors.h"
#include "sluice/pipeline/pipeline_engine.h"
#include "sluice/train/trainer.h"
#include "source_dir.h"
#include "trained_run.h"

namespace sluice::pipeline {
namespace {

using testing_support::TrainAndKeep;
using testing_support::TrainedRun;

std::string Example(const std::string& name) {
  return (testing_support::SourceDir() / "examples" / name).string();
}

// A short run of `program` that learns visibly: a constant learning rate after one warm-up step,
// one intra-op thread so that sums run in one order and two runs compare bit for bit.
TrainConfig Short(const std::string& program, const std::string& data) {
  TrainConfig c;
  c.model = "program";
  c.program = program;
  c.data = data;
  c.steps = 30;
  c.batch = 16;
  c.microbatches = 2;
  c.optimizer.lr = 1e-2;
  c.optimizer.schedule = LrSchedule::kConstant;
  c.optimizer.warmup_steps = 1;
  c.threads = 1;
  c.eval_every = 0;
  c.eval_batches = 1;
  return c;
}

// The mean of the last three losses is below `fraction` of the first: the model learns (the run
// is deterministic, so this is a fixed fact of the program, not a chance).
void ExpectLossFalls(const TrainedRun& run, double fraction, const std::string& what) {
  ASSERT_GE(run.losses.size(), 4u) << what;
  const size_t n = run.losses.size();
  const double last = (run.losses[n - 1] + run.losses[n - 2] + run.losses[n - 3]) / 3;
  EXPECT_LT(last, fraction * run.losses.front())
      << what << ": first loss " << run.losses.front() << ", last three " << last;
}

// Trains `config` on one stage and on two (cut by `layout`): the loss falls on both, and the two
// runs are bitwise alike.
void ExpectTrainsOnOneAndTwoStages(const TrainConfig& config, const std::string& layout,
                                   double fraction) {
  const TrainedRun one = TrainAndKeep(config);
  ExpectLossFalls(one, fraction, config.program + " on one stage");
  const PipelineOptions two{.stages = 2, .schedule = ScheduleKind::kOneFOneB, .layout = layout};
  const TrainedRun piped = TrainAndKeep(config, PipelineEngineFactory(two));
  ExpectLossFalls(piped, fraction, config.program + " on two stages");
  testing_support::ExpectBitwiseRun(one, piped, config.program + " two stages (" + layout + ")");
}

TEST(ProgramExamples, TheExportedGptLearnsToSortOnOneAndTwoStagesAlike) {
  ExpectTrainsOnOneAndTwoStages(Short(Example("gpt.sluice"), "sort"), "embed,h.0|h.1,head", 0.8);
}

TEST(ProgramExamples, APreNormLmLearnsToSortOnOneAndTwoStagesAlike) {
  ExpectTrainsOnOneAndTwoStages(Short(Example("prenorm.sluice"), "sort"),
                                "embed,block.0|block.1,head", 0.8);
}

// Its head reads the token embedding: both stages hold a copy.
TEST(ProgramExamples, ALmWithATiedHeadLearnsToSortOnOneAndTwoStagesAlike) {
  ExpectTrainsOnOneAndTwoStages(Short(Example("tied_lm.sluice"), "sort"),
                                "embed,block.0|block.1,head", 0.8);
}

// N examples of 8 features uniform in [-1, 1) and a label in [0, 4) that is a function of them,
// (x0 + x1 > 0) + 2·(x2 − x3 > 0), as examples/classifier_data.py writes: "features" f32[N, 8],
// "label" i64[N].
std::string WriteClassifierData(const std::string& name, int64_t n) {
  std::mt19937 rng(7);
  std::vector<float> features(static_cast<size_t>(n * 8));
  std::vector<int64_t> labels(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    float* x = &features[static_cast<size_t>(i * 8)];
    for (int j = 0; j < 8; ++j) x[j] = static_cast<float>(rng() >> 8) * 0x1p-23f - 1.0f;
    labels[static_cast<size_t>(i)] = int64_t{x[0] + x[1] > 0} + 2 * int64_t{x[2] - x[3] > 0};
  }
  const std::string path = testing_support::ScratchPath(name);
  WriteSafetensors(path, {{"features", Tensor::FromVector<float>({n, 8}, features)},
                          {"label", Tensor::FromVector<int64_t>({n}, labels)}});
  return path;
}

TEST(ProgramExamples, AClassifierOnNamedArraysWithATiedWeightLearnsOnOneAndTwoStagesAlike) {
  const TrainConfig config =
      Short(Example("array_classifier.sluice"), WriteClassifierData("classifier.safetensors", 256));
  // The tied %shared.weight is read by block.0 and block.1: on one stage, or on both.
  ExpectTrainsOnOneAndTwoStages(config, "in,block.0,block.1|head", 0.5);
  ExpectTrainsOnOneAndTwoStages(config, "in,block.0|block.1,head", 0.5);
}

// Batch norm in micro-batches: each micro-batch's forward normalises by its own statistics and
// moves the running statistics (buffers), in micro-batch order on every stage, so two stages train
// bitwise like one, running statistics included (TrainedRun::state holds every buffer).
TEST(ProgramExamples, ABatchNormClassifierLearnsOnOneAndTwoStagesAlike) {
  TrainConfig config = Short(Example("batch_norm_classifier.sluice"),
                             WriteClassifierData("bn_classifier.safetensors", 256));
  ExpectTrainsOnOneAndTwoStages(config, "in,norm|head", 0.5);
  ExpectTrainsOnOneAndTwoStages(config, "in|norm,head", 0.5);
  const TrainedRun one = TrainAndKeep(config);
  EXPECT_NE(one.state.at("bn.running_mean"), std::vector<float>(32, 0.0f)) << "never updated";
  config.recompute = {RecomputePolicy::kFull};
  testing_support::ExpectBitwiseRun(one, TrainAndKeep(config), "--recompute full");
}

// Post-validation with interlocked steps (Trainer::Run announces each next step): a step runs
// ahead on the eagerly updated weights, and when the clip of the step before fires, that run is
// discarded and the step runs again (docs/pipeline.md, "Post-validation"). The discarded run's
// forwards moved the running statistics too: they are restored with the parameters, so the run
// stays bitwise one stage's, buffers included — under 1F1B and zero-bubble (split backward).
TEST(ProgramExamples, PostValidationRestoresTheBatchNormStatisticsOfADiscardedRun) {
  TrainConfig config = Short(Example("batch_norm_classifier.sluice"),
                             WriteClassifierData("bn_post_validate.safetensors", 256));
  config.steps = 6;
  config.optimizer.clip_norm = 1e-3;  // below every step's norm: each step after the first redone
  auto run = [&](const EngineFactory& engine, nlohmann::json* post_validation) {
    Trainer trainer(config, engine);
    TrainedRun out;
    trainer.Run([&](const StepRecord& r) {
      out.losses.push_back(r.loss);
      out.norms.push_back(r.grad_norm);
    });
    out.state = testing_support::KeepState(trainer, config.optimizer);
    if (post_validation != nullptr)
      *post_validation = trainer.engine().Summary()["post_validation"];
    return out;
  };
  const TrainedRun one = run(nullptr, nullptr);
  ASSERT_EQ(one.norms.size(), 6u);
  for (double norm : one.norms) ASSERT_GT(norm, config.optimizer.clip_norm);
  for (ScheduleKind kind : {ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubbleH1}) {
    PipelineOptions options{.stages = 2, .schedule = kind, .layout = "in,norm|head"};
    options.post_validate = true;
    nlohmann::json post_validation;
    const TrainedRun piped = run(PipelineEngineFactory(options), &post_validation);
    const std::string what = fmt::format("post-validated {}", ScheduleKindName(kind));
    ASSERT_TRUE(post_validation.is_object()) << what;
    EXPECT_EQ(post_validation["rollbacks"].get<int64_t>(), 6) << what;
    testing_support::ExpectBitwiseRun(one, piped, what);
  }
}

// Images through the fast convolution and batch-norm kernels: a 16-channel 3x3 convolution on
// oneDNN (kernels/onednn_conv.h, chunks of images), BatchNorm2d's SIMD passes over runs of 64
// values, and a 4-channel convolution on im2col. Two stages train bitwise like one, and full
// recomputation like none.
TEST(ProgramExamples, AConvolutionalNetworkWithBatchNormLearnsOnOneAndTwoStagesAlike) {
  const std::string program = testing_support::ScratchPath("conv_bn_classifier.sluice");
  std::ofstream(program) << R"(program convbn {
  input %features: f32[B, 8] = features
  input %label: i64[B] = label
  param %lift.weight: f32[8, 256] = normal(0, 0.3)
  param %c1.weight: f32[16, 4, 3, 3] = normal(0, 0.2)
  param %bn.weight: f32[16] = ones
  param %bn.bias: f32[16] = zeros
  buffer %bn.running_mean: f32[16] = zeros
  buffer %bn.running_var: f32[16] = ones
  param %c2.weight: f32[16, 16, 3, 3] = normal(0, 0.1)
  param %out.weight: f32[16, 4] = normal(0, 0.1)
  unit lift {
    %flat: f32[B, 256] = matmul(%features, %lift.weight)
    %image: f32[B, 4, 8, 8] = reshape(%flat) {shape = [B, 4, 8, 8]}
  }
  unit conv1 {
    %h1: f32[B, 16, 8, 8] = conv2d(%image, %c1.weight) {padding = [1, 1], stride = [1, 1]}
    %n1: f32[B, 16, 8, 8] = batch_norm(%h1, %bn.weight, %bn.bias, %bn.running_mean, %bn.running_var)
    batch_norm_update_stats(%h1, %bn.running_mean, %bn.running_var) {momentum = 0.1}
    %a1: f32[B, 16, 8, 8] = relu(%n1)
  }
  unit conv2 {
    %h2: f32[B, 16, 8, 8] = conv2d(%a1, %c2.weight) {padding = [1, 1], stride = [1, 1]}
    %a2: f32[B, 16, 8, 8] = relu(%h2)
  }
  unit head {
    %p: f32[B, 16, 1, 1] = avg_pool2d(%a2) {kernel = [8, 8], stride = [8, 8]}
    %f: f32[B, 16] = reshape(%p) {shape = [B, 16]}
    %logits: f32[B, 4] = matmul(%f, %out.weight)
    %loss: f32[] = cross_entropy(%logits, %label)
  }
  output %loss
}
)";
  TrainConfig config = Short(program, WriteClassifierData("conv_bn_classifier.safetensors", 256));
  ExpectTrainsOnOneAndTwoStages(config, "lift,conv1|conv2,head", 0.8);
  const TrainedRun one = TrainAndKeep(config);
  config.recompute = {RecomputePolicy::kFull};
  testing_support::ExpectBitwiseRun(one, TrainAndKeep(config), "--recompute full");
}

// Under --precision bf16 every example trains as its mixed-precision form (ir/autocast.h), and two
// stages stay bitwise one: what crosses a unit boundary is rounded by the unit making it, on one
// stage as on two.
TrainConfig Bf16(TrainConfig c) {
  c.gpt.precision = Precision::kBf16;
  return c;
}

TEST(ProgramExamples, EveryLmExampleLearnsUnderBf16OnOneAndTwoStagesAlike) {
  ExpectTrainsOnOneAndTwoStages(Bf16(Short(Example("gpt.sluice"), "sort")), "embed,h.0|h.1,head",
                                0.8);
  ExpectTrainsOnOneAndTwoStages(Bf16(Short(Example("prenorm.sluice"), "sort")),
                                "embed,block.0|block.1,head", 0.8);
  ExpectTrainsOnOneAndTwoStages(Bf16(Short(Example("tied_lm.sluice"), "sort")),
                                "embed,block.0|block.1,head", 0.8);
}

// The GPT of tests/parity/torch_models.py as tools/torch_export.py writes it: the split of its
// attention projection, the attention on split heads and the merge back run bf16 under autocast,
// and two stages stay bitwise one.
TEST(ProgramExamples, AnExportedSplitHeadsGptLearnsUnderBf16OnOneAndTwoStagesAlike) {
  if (std::system("/usr/bin/python3 -c 'import torch' > /dev/null 2>&1") != 0) {
    GTEST_SKIP() << "python3-torch is not installed (scripts/install-deps.sh installs it)";
  }
  const std::string dir = testing_support::ScratchPath("split_heads_gpt");
  std::filesystem::remove_all(dir);
  const std::string cmd = "/usr/bin/python3 " + Example("../tools/torch_export.py") + " " +
                          Example("../tests/parity/torch_models.py") +
                          ":gpt --batch 16 --seq 12 --out " + dir + " > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << "the exporter failed: " << cmd;
  TrainConfig c = Bf16(Short(dir + "/model.sluice", "sort"));
  c.init_from = dir + "/init.safetensors";
  ExpectTrainsOnOneAndTwoStages(c, "embed,h.0|h.1,head", 0.9);
  std::filesystem::remove_all(dir);
}

// Under bf16 a dropout of a bf16 value runs bf16 (its GELU then too), and two stages stay bitwise
// one.
TEST(ProgramExamples, TheDropoutClassifierLearnsUnderBf16OnOneAndTwoStagesAlike) {
  ExpectTrainsOnOneAndTwoStages(Bf16(Short(Example("dropout_classifier.sluice"), "blobs")),
                                "in,block.0|block.1,head", 0.5);
}

TEST(ProgramExamples, TheClassifiersLearnUnderBf16OnOneAndTwoStagesAlike) {
  ExpectTrainsOnOneAndTwoStages(
      Bf16(Short(Example("array_classifier.sluice"),
                 WriteClassifierData("classifier_bf16.safetensors", 256))),
      "in,block.0|block.1,head", 0.5);
  ExpectTrainsOnOneAndTwoStages(Bf16(Short(Example("classifier.sluice"), "blobs")),
                                "in,block.0|block.1,head", 0.5);
}

// examples/dropout_classifier.sluice at dropout p (its p = 0.1 replaced), written to a file of its
// own.
std::string DropoutClassifier(const std::string& p) {
  std::ifstream in(Example("dropout_classifier.sluice"));
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const std::string with = "p = " + p;
  for (size_t at = text.find("p = 0.1"); at != std::string::npos;
       at = text.find("p = 0.1", at + with.size())) {
    text.replace(at, 7, with);
  }
  const std::string path = testing_support::ScratchPath("dropout_classifier_" + p + ".sluice");
  std::ofstream(path) << text;
  return path;
}

// Dropout's masks are drawn from the batch's random key and each dropout's stream, never stored:
// one stage, two stages under every kind of schedule (1F1B, GPipe, a backward split into B and W,
// the V-shaped two chunks per rank), a full recompute of the forward in backward and a resumed run
// all draw the same masks, so they all train bit for bit alike.
TEST(ProgramExamples, ADropoutClassifierTrainsBitwiseAlikeOnEveryScheduleRecomputeAndResume) {
  TrainConfig config = Short(Example("dropout_classifier.sluice"), "blobs");
  config.microbatches = 4;
  ExpectTrainsOnOneAndTwoStages(config, "in,block.0|block.1,head", 0.5);
  const TrainedRun one = TrainAndKeep(config);
  for (const ScheduleKind kind :
       {ScheduleKind::kGPipe, ScheduleKind::kZeroBubbleH1, ScheduleKind::kZeroBubbleV}) {
    const PipelineOptions options{
        .stages = 2, .schedule = kind, .partition = PartitionKind::kBalanced};
    testing_support::ExpectBitwiseRun(one, TrainAndKeep(config, PipelineEngineFactory(options)),
                                      std::string(ScheduleKindName(kind)));
  }
  for (const RecomputePolicy policy : {RecomputePolicy::kFull, RecomputePolicy::kSelective}) {
    TrainConfig recomputed = config;
    recomputed.recompute = {policy};
    testing_support::ExpectBitwiseRun(one, TrainAndKeep(recomputed),
                                      "--recompute " + std::string(Name(policy)));
  }
  // Stopped after 12 steps and resumed from its checkpoint: the same 18 steps after.
  const std::string checkpoint = testing_support::ScratchPath("dropout_classifier.safetensors");
  {
    Trainer first(config);
    for (int s = 0; s < 12; ++s) first.Step();
    first.SaveCheckpoint(checkpoint);
  }
  TrainConfig resume = config;
  resume.resume_path = checkpoint;
  Trainer resumed(resume);
  ASSERT_EQ(resumed.step(), 12);
  for (int64_t s = 12; s < config.steps; ++s) {
    EXPECT_EQ(resumed.Step().loss, one.losses[static_cast<size_t>(s)]) << "step " << s + 1;
  }
  std::remove(checkpoint.c_str());
}

// p = 0 keeps every element bitwise and passes every gradient bitwise: the program trains exactly
// as examples/classifier.sluice, which has no dropout (its parameters are the same, drawn by
// position). p = 0.1 does not: its masks drop elements.
TEST(ProgramExamples, DropoutOfZeroTrainsBitwiseAsNoDropoutAndOfATenthDoesNot) {
  const TrainedRun none = TrainAndKeep(Short(Example("classifier.sluice"), "blobs"));
  testing_support::ExpectBitwiseRun(none, TrainAndKeep(Short(DropoutClassifier("0"), "blobs")),
                                    "dropout p = 0");
  const TrainedRun dropped = TrainAndKeep(Short(DropoutClassifier("0.1"), "blobs"));
  EXPECT_NE(dropped.losses[0], none.losses[0]) << "the first forward already drops";
}

}  // namespace
}  // namespace sluice::pipeline
