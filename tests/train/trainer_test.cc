// Trainer: bitwise resume, weight loading errors, configuration errors, metrics lines.
#include "sluice/train/trainer.h"

#include <cstdio>
#include <fstream>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "sluice/io/checkpoint.h"
#include "sluice/io/safetensors.h"

namespace sluice {
namespace {

TrainConfig SmallGpt() {
  TrainConfig c;
  c.gpt = {.vocab = 0, .seq = 0, .layers = 1, .heads = 2, .dim = 16};
  c.steps = 6;
  c.batch = 4;
  c.microbatches = 2;
  c.optimizer.lr = 1e-2;
  c.optimizer.clip_norm = 1.0;
  c.optimizer.warmup_steps = 2;
  c.optimizer.schedule = LrSchedule::kCosine;
  c.threads = 1;
  c.eval_batches = 1;
  return c;
}

std::string Temp(const std::string& name) { return ::testing::TempDir() + "/" + name; }

TEST(Trainer, ResumeGivesBitwiseTheSameLosses) {
  const std::string ckpt = Temp("resume.safetensors");
  std::vector<double> uninterrupted;
  {
    Trainer t(SmallGpt());
    for (int i = 0; i < 3; ++i) t.Step();
    t.SaveCheckpoint(ckpt);
    for (int i = 0; i < 3; ++i) uninterrupted.push_back(t.Step().loss);
  }
  TrainConfig c = SmallGpt();
  c.resume_path = ckpt;
  Trainer resumed(c);
  EXPECT_EQ(resumed.step(), 3);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(resumed.Step().loss, uninterrupted[i]) << "step " << 4 + i;
  std::remove(ckpt.c_str());
}

TEST(Trainer, CheckpointHoldsWeightsStateAndMetadata) {
  const std::string ckpt = Temp("meta.safetensors");
  Trainer t(SmallGpt());
  t.Step();
  t.SaveCheckpoint(ckpt);
  Checkpoint c = LoadCheckpoint(ckpt);
  EXPECT_EQ(c.metadata.at("step"), "1");
  EXPECT_EQ(c.metadata.at("data_position"), "2");
  EXPECT_TRUE(c.tensors.count("wte.weight"));
  EXPECT_TRUE(c.tensors.count("h.0.attn.c_attn.weight.exp_avg_sq"));
  EXPECT_TRUE(BitwiseEqual(c.tensors.at("lm_head.weight"), t.Value("lm_head.weight")));
  std::remove(ckpt.c_str());
}

TEST(Trainer, InitFromReportsMissingExtraAndMisShapedTensorsByName) {
  const std::string path = Temp("weights.safetensors");
  Trainer t(SmallGpt());
  std::map<std::string, Tensor> weights;
  for (const std::string& n : t.ParamNames()) weights.emplace(n, t.Value(n));
  weights.erase("wpe.weight");
  weights["wte.weight"] = Tensor::Zeros({3, 3}, DType::kF32);
  weights["surprise"] = Tensor::Zeros({1}, DType::kF32);
  WriteSafetensors(path, weights);
  TrainConfig c = SmallGpt();
  c.init_from = path;
  try {
    Trainer bad(c);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("missing tensor 'wpe.weight'"), std::string::npos) << m;
    EXPECT_NE(m.find("'wte.weight' is f32[3, 3]"), std::string::npos) << m;
    EXPECT_NE(m.find("unexpected tensor 'surprise'"), std::string::npos) << m;
  }
  std::remove(path.c_str());
}

TEST(Trainer, InitFromLoadsWeights) {
  const std::string path = Temp("good_weights.safetensors");
  Trainer source(SmallGpt());
  source.Step();
  std::map<std::string, Tensor> weights;
  for (const std::string& n : source.ParamNames()) weights.emplace(n, source.Value(n));
  WriteSafetensors(path, weights);
  TrainConfig c = SmallGpt();
  c.init_from = path;
  c.seed = 99;  // different initialization, overwritten by the file
  Trainer t(c);
  EXPECT_EQ(t.step(), 0);
  EXPECT_TRUE(BitwiseEqual(t.Value("h.0.mlp.c_fc.weight"), source.Value("h.0.mlp.c_fc.weight")));
  std::remove(path.c_str());
}

TEST(Trainer, InvalidConfigurationsSayWhatToChange) {
  auto message = [](TrainConfig c) {
    try {
      Trainer t(c);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  TrainConfig c = SmallGpt();
  c.gpt.heads = 3;
  EXPECT_NE(message(c).find("--heads 3 does not divide --dim 16"), std::string::npos) << message(c);
  c = SmallGpt();
  c.gpt.seq = 4;  // the sort data has 12 tokens
  EXPECT_NE(message(c).find("raise --seq"), std::string::npos) << message(c);
  c = SmallGpt();
  c.microbatches = 3;
  EXPECT_NE(message(c).find("--microbatches 3 must divide --batch 4"), std::string::npos)
      << message(c);
  c = SmallGpt();
  c.data = "/no/such/file.txt";
  EXPECT_NE(message(c).find("/no/such/file.txt"), std::string::npos) << message(c);
  c = SmallGpt();
  c.resume_path = "/no/such/ckpt.safetensors";
  EXPECT_NE(message(c).find("/no/such/ckpt.safetensors"), std::string::npos) << message(c);
}

TEST(Trainer, MetricsHaveStepEvalAndSummaryLines) {
  TrainConfig c = SmallGpt();
  c.metrics_path = Temp("metrics.jsonl");
  c.eval_every = 3;
  {
    Trainer t(c);
    t.Run();
  }
  std::ifstream in(c.metrics_path);
  std::string line;
  int steps = 0, evals = 0, summaries = 0;
  while (std::getline(in, line)) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("summary")) {
      ++summaries;
      EXPECT_EQ(j["steps"], 6);
      EXPECT_GT(j["peak_allocated_bytes"].get<int64_t>(), 0);
    } else if (j.contains("val_loss")) {
      ++evals;
      EXPECT_TRUE(j.contains("accuracy"));
    } else {
      ++steps;
      for (const char* key :
           {"step", "loss", "lr", "tokens_per_s", "step_ms", "peak_allocated_bytes"}) {
        EXPECT_TRUE(j.contains(key)) << key;
      }
    }
  }
  EXPECT_EQ(steps, 6);
  EXPECT_EQ(evals, 2);
  EXPECT_EQ(summaries, 1);
  std::remove(c.metrics_path.c_str());
}

TEST(Trainer, MlpLearnsBlobs) {
  TrainConfig c;
  c.model = "mlp";
  c.data = "blobs";
  c.steps = 150;
  c.batch = 32;
  c.optimizer.lr = 1e-2;
  c.threads = 1;
  Trainer t(c);
  TrainSummary s = t.Run();
  EXPECT_GE(s.last_eval.accuracy, 0.9);
}

}  // namespace
}  // namespace sluice
