// Trainer: bitwise resume, weight loading errors, configuration errors, metrics lines.
#include "sluice/train/trainer.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "scratch_path.h"
#include "sluice/io/checkpoint.h"
#include "sluice/io/safetensors.h"
#include "sluice/nn/optimizer.h"
#include "sluice/step/stage_program.h"
#include "sluice/step/task.h"
#include "sluice/train/single_stage.h"
#include "sluice/train/training_checkpoint.h"

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

std::string Temp(const std::string& name) { return testing_support::ScratchPath(name); }

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

// The single-stage engine, recording the first training batch of every step it is asked to run.
class BatchRecorder final : public StepEngine {
 public:
  BatchRecorder(const EngineContext& ctx, std::vector<int64_t>& first_batches)
      : engine_(MakeSingleStageEngine(ctx)), first_batches_(first_batches) {}
  StepResult Step(int64_t step, int64_t first_batch, double lr) override {
    first_batches_.push_back(first_batch);
    return engine_->Step(step, first_batch, lr);
  }
  std::map<std::string, Tensor> State() const override { return engine_->State(); }
  GcMode gc_mode() const override { return engine_->gc_mode(); }

 private:
  std::unique_ptr<StepEngine> engine_;
  std::vector<int64_t>& first_batches_;
};

TEST(Trainer, ResumeWithOtherMicroBatchesContinuesTheDataWhereItStopped) {
  const std::string ckpt = Temp("four_micro.safetensors");
  std::vector<int64_t> first;
  auto recording = [&](const EngineContext& ctx) {
    return std::make_unique<BatchRecorder>(ctx, first);
  };
  TrainConfig four = SmallGpt();
  four.microbatches = 4;
  {
    Trainer t(four, recording);
    t.Step();
    t.Step();
    t.SaveCheckpoint(ckpt);  // 2 steps of 4 micro-batches: batches 0 … 7 consumed
  }
  EXPECT_EQ(first, (std::vector<int64_t>{0, 4}));
  EXPECT_EQ(LoadCheckpoint(ckpt).metadata.at("data_position"), "8");

  first.clear();
  TrainConfig two = SmallGpt();  // 2 micro-batches: step·M would repeat batches 4 … 7
  two.resume_path = ckpt;
  Trainer resumed(two, recording);
  EXPECT_TRUE(resumed.warnings().empty());
  resumed.Step();
  resumed.Step();
  EXPECT_EQ(first, (std::vector<int64_t>{8, 10}));
  resumed.SaveCheckpoint(ckpt);
  const Checkpoint again = LoadCheckpoint(ckpt);
  EXPECT_EQ(again.metadata.at("step"), "4");
  EXPECT_EQ(again.metadata.at("data_position"), "12");
  std::remove(ckpt.c_str());
}

TEST(Trainer, ResumingAModelThatDiffersButFitsIsRefusedNamingTheOption) {
  // Heads do not change any tensor's shape: the checkpoint would load into another model.
  const std::string ckpt = Temp("two_heads.safetensors");
  {
    Trainer t(SmallGpt());
    t.Step();
    t.SaveCheckpoint(ckpt);
  }
  TrainConfig four_heads = SmallGpt();
  four_heads.gpt.heads = 4;
  four_heads.resume_path = ckpt;
  try {
    Trainer bad(four_heads);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("was written with --heads 2 (this run: 4)"), std::string::npos) << m;
    EXPECT_NE(m.find("--init-from"), std::string::npos) << m;
  }
  // Starting a new run from its weights is what --init-from is for.
  TrainConfig init = four_heads;
  init.resume_path.clear();
  init.init_from = ckpt;
  EXPECT_NO_THROW(Trainer{init});
  std::remove(ckpt.c_str());
}

TEST(Trainer, ResumingOnOtherDataWarnsAndGoesOn) {
  const std::string a = Temp("corpus_a.txt"), b = Temp("corpus_b.txt"),
                    ckpt = Temp("corpus_a.safetensors");
  for (const std::string& path : {a, b}) {
    std::ofstream out(path);
    for (int i = 0; i < 200; ++i) out << (path == a ? "to be or not to be. " : "all the world. ");
  }
  TrainConfig on_a = SmallGpt();
  on_a.data = a;
  on_a.gpt.seq = 16;
  {
    Trainer t(on_a);
    t.Step();
    EXPECT_TRUE(t.warnings().empty());
    t.SaveCheckpoint(ckpt);
  }
  TrainConfig on_b = on_a;
  on_b.data = b;
  on_b.resume_path = ckpt;
  Trainer t(on_b);
  ASSERT_EQ(t.warnings().size(), 1u);
  EXPECT_NE(t.warnings()[0].find(fmt::format("trained with --data {} (this run: {})", a, b)),
            std::string::npos)
      << t.warnings()[0];
  EXPECT_EQ(t.step(), 1);
  EXPECT_TRUE(std::isfinite(t.Step().loss));
  for (const std::string& path : {a, b, ckpt}) std::remove(path.c_str());
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

// --shard-optimizer: a checkpoint holds the whole optimizer state, and a resume on replica d of D
// copies elements OptimizerShard(numel, d, D) of each flattened state tensor into its 1-D slice,
// whatever D wrote the checkpoint; a state tensor of another shape is refused with the whole shape.
TEST(Trainer, ResumeCopiesEachReplicasSliceOfTheWholeOptimizerState) {
  const std::string ckpt = Temp("sliced.safetensors");
  const TrainConfig config = SmallGpt();
  {
    Trainer t(config);
    t.Step();
    t.Step();
    t.SaveCheckpoint(ckpt);
  }
  const Checkpoint saved = LoadCheckpoint(ckpt);
  const std::unique_ptr<Task> task = MakeTask(config);
  const Model model = task->BuildTrain(config.batch / config.microbatches);
  constexpr int kReplicas = 3;
  for (int d = 0; d < kReplicas; ++d) {
    Scope state;
    for (const ParamSpec& p : model.params) {
      state.Set(p.name, Tensor::Zeros(p.shape, DType::kF32));
      const ShardRange r = OptimizerShard(p.shape.numel(), d, kReplicas);
      for (const std::string& s : OptimizerStateNames(p, config.optimizer))
        state.Set(s, Tensor::Zeros({r.size()}, DType::kF32));
    }
    const TrainingCheckpointInfo info =
        LoadTrainingCheckpoint(ckpt, LoadKind::kResume, *task, model.params, config, state,
                               DefaultAllocator(), {.shard = d, .shards = kReplicas});
    EXPECT_EQ(info.step, 2);
    int checked = 0;
    for (const ParamSpec& p : model.params) {
      EXPECT_TRUE(BitwiseEqual(state.Get(p.name), saved.tensors.at(p.name))) << p.name;
      const ShardRange r = OptimizerShard(p.shape.numel(), d, kReplicas);
      for (const std::string& s : OptimizerStateNames(p, config.optimizer)) {
        const Tensor whole = saved.tensors.at(s).Reshape({p.shape.numel()});
        EXPECT_TRUE(BitwiseEqual(state.Get(s), whole.Slice(0, r.begin, r.end).Contiguous()))
            << s << " on replica " << d;
        ++checked;
      }
    }
    EXPECT_GT(checked, 0);
  }
  // A checkpoint holding a slice where the whole tensor belongs (as a per-replica file would).
  std::map<std::string, Tensor> tensors = saved.tensors;
  const std::string m = "wte.weight.exp_avg";
  tensors[m] = Tensor::Zeros({5}, DType::kF32);
  WriteSafetensors(ckpt, tensors, saved.metadata);
  Scope state;
  for (const ParamSpec& p : model.params) {
    state.Set(p.name, Tensor::Zeros(p.shape, DType::kF32));
    const ShardRange r = OptimizerShard(p.shape.numel(), 1, 2);
    for (const std::string& s : OptimizerStateNames(p, config.optimizer))
      state.Set(s, Tensor::Zeros({r.size()}, DType::kF32));
  }
  const Shape wte = saved.tensors.at("wte.weight").shape();
  try {
    LoadTrainingCheckpoint(ckpt, LoadKind::kResume, *task, model.params, config, state,
                           DefaultAllocator(), {.shard = 1, .shards = 2});
    FAIL() << "a sliced state tensor was loaded";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(fmt::format(
                  "tensor '{}' is f32[5] but the model needs f32{}", m, wte.ToString())),
              std::string::npos)
        << e.what();
  }
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

TEST(Trainer, ResumingAnotherSizeOfModelNamesTheOptionsAndListsAFewTensors) {
  const std::string ckpt = Temp("four_layers.safetensors");
  TrainConfig four = SmallGpt();
  four.gpt.layers = 4;
  Trainer t(four);
  t.Step();
  t.SaveCheckpoint(ckpt);
  TrainConfig two = SmallGpt();
  two.gpt.layers = 2;
  two.gpt.dim = 32;
  two.resume_path = ckpt;
  try {
    Trainer bad(two);
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("it was written with --dim 16 (this run: 32), --layers 4 (this run: 2)"),
              std::string::npos)
        << m;
    // Every tensor of the two layers is mis-shaped and two layers are unexpected: 12 listed.
    EXPECT_NE(m.find("tensor 'wte.weight' is f32["), std::string::npos) << m;
    EXPECT_EQ(std::count(m.begin(), m.end(), '\n'), 13) << m;
    EXPECT_NE(m.find("\n  … and "), std::string::npos) << m;
  }
  std::remove(ckpt.c_str());
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
      // What the machine saw: the process's resident peak holds at least the tensors (Linux
      // reports VmHWM).
      EXPECT_GE(j["peak_resident_bytes"].get<int64_t>(), j["peak_reserved_bytes"].get<int64_t>());
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

// A run that diverges: at lr 1e30 without clipping, the steps after the first have a loss or
// gradient norm that is not finite.
TrainConfig Diverging() {
  TrainConfig c = SmallGpt();
  c.optimizer.lr = 1e30;
  c.optimizer.schedule = LrSchedule::kConstant;
  c.optimizer.warmup_steps = 0;
  c.optimizer.clip_norm = 0;
  return c;
}

// Every parameter and optimizer-state tensor of `t`, copied.
std::map<std::string, Tensor> StateCopy(const Trainer& t) {
  std::map<std::string, Tensor> state;
  for (const std::string& p : t.ParamNames()) {
    state.emplace(p, t.Value(p).Clone());
    for (const std::string& s : OptimizerStateNames(p, t.config().optimizer))
      state.emplace(s, t.Value(s).Clone());
  }
  return state;
}

// Steps `t` to its end; checks that each skipped step left the state bit for bit as it was and
// that only steps with a non-finite loss or norm were skipped. Returns how many were.
int StepCheckingSkips(Trainer& t) {
  int skipped = 0;
  while (t.step() < t.config().steps) {
    const std::map<std::string, Tensor> before = StateCopy(t);
    const StepRecord r = t.Step();
    const bool finite = std::isfinite(r.loss) && std::isfinite(r.grad_norm);
    EXPECT_EQ(r.skipped, !finite) << "step " << r.step;
    if (!r.skipped) continue;
    ++skipped;
    for (const auto& [name, value] : before) {
      EXPECT_TRUE(BitwiseEqual(value, t.Value(name)))
          << name << " changed in skipped step " << r.step;
    }
  }
  return skipped;
}

// --skip-nonfinite: the update of a non-finite step is withheld, training goes on.
TEST(Trainer, SkippedStepsLeaveParametersAndOptimizerStateUntouched) {
  TrainConfig c = Diverging();
  c.skip_nonfinite = 100;
  Trainer t(c);
  EXPECT_GE(StepCheckingSkips(t), 2);
  EXPECT_EQ(t.step(), c.steps);  // the step counter advanced over the skipped steps
  for (const auto& [name, value] : StateCopy(t)) {
    for (int64_t i = 0; i < value.numel(); ++i) {
      ASSERT_TRUE(std::isfinite(value.FlatAt(i))) << name;
    }
  }
}

TEST(Trainer, TheStepAfterTheLastSkipStopsTraining) {
  TrainConfig c = Diverging();
  c.skip_nonfinite = 1;
  c.metrics_path = Temp("skip_metrics.jsonl");
  Trainer t(c);
  try {
    t.Run();
    FAIL() << "a second non-finite step did not stop training";
  } catch (const NonFiniteError& e) {
    EXPECT_NE(std::string(e.what()).find("after skipping 1 such step (--skip-nonfinite 1)"),
              std::string::npos)
        << e.what();
  }
  std::ifstream in(c.metrics_path);
  std::string line;
  int skipped_lines = 0;
  while (std::getline(in, line)) skipped_lines += nlohmann::json::parse(line).contains("skipped");
  EXPECT_EQ(skipped_lines, 1);
  std::remove(c.metrics_path.c_str());
}

TEST(Trainer, WithoutSkippingANonFiniteStepStopsTraining) {
  Trainer t(Diverging());
  EXPECT_THROW(
      {
        while (t.step() < t.config().steps) t.Step();
      },
      NonFiniteError);
}

TEST(Trainer, TheSummaryCountsSkippedSteps) {
  TrainConfig c = Diverging();
  c.skip_nonfinite = 100;
  c.metrics_path = Temp("skip_summary.jsonl");
  int64_t skipped = 0;
  {
    Trainer t(c);
    skipped = t.Run().skipped;
  }
  EXPECT_GE(skipped, 2);
  std::ifstream in(c.metrics_path);
  std::string line, last;
  int64_t marked = 0;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("summary")) {
      EXPECT_EQ(j["skipped"], skipped);
    } else if (j.contains("skipped")) {
      ++marked;
    }
  }
  EXPECT_EQ(marked, skipped);
  std::remove(c.metrics_path.c_str());
}

// A failure after training never loses the trained state: the final save's folder removed while
// training ran, the state goes to the temporary folder and the error says where.
TEST(Trainer, AFailedFinalSaveRescuesTheStateToTheTemporaryFolder) {
  namespace fs = std::filesystem;
  const fs::path dir = Temp("rescue_run"), tmp = Temp("rescue_tmp");
  fs::create_directories(dir);
  fs::create_directories(tmp);
  TrainConfig c = SmallGpt();
  c.steps = 2;
  c.save_path = (dir / "ck.safetensors").string();
  Trainer t(c);
  const char* old_tmpdir = std::getenv("TMPDIR");
  const std::string saved_tmpdir = old_tmpdir ? old_tmpdir : "";
  ::setenv("TMPDIR", tmp.c_str(), 1);
  std::string message;
  try {
    t.Run([&](const StepRecord& r) {
      if (r.step == c.steps) fs::remove_all(dir);
    });
  } catch (const IoError& e) {
    message = e.what();
  }
  if (old_tmpdir) {
    ::setenv("TMPDIR", saved_tmpdir.c_str(), 1);
  } else {
    ::unsetenv("TMPDIR");
  }
  const fs::path rescue = tmp / "ck.safetensors.rescue-step2.safetensors";
  EXPECT_NE(message.find("cannot save checkpoint '" + c.save_path + "'"), std::string::npos)
      << message;
  EXPECT_NE(message.find("the trained state (step 2) is saved to '" + rescue.string() + "'"),
            std::string::npos)
      << message;
  ASSERT_TRUE(fs::exists(rescue)) << message;
  Checkpoint ck = LoadCheckpoint(rescue.string());
  EXPECT_EQ(ck.metadata.at("step"), "2");
  for (const std::string& p : t.ParamNames()) {
    EXPECT_TRUE(BitwiseEqual(ck.tensors.at(p), t.Value(p))) << p;
  }
  fs::remove_all(tmp);
}

// When the save fails but its folder is still writable (here the path became a folder), the
// rescue goes beside it.
TEST(Trainer, AFailedSaveRescuesTheStateBesideItsPath) {
  namespace fs = std::filesystem;
  const fs::path dir = Temp("rescue_beside");
  fs::create_directories(dir);
  TrainConfig c = SmallGpt();
  c.steps = 1;
  c.save_path = (dir / "ck.safetensors").string();
  Trainer t(c);
  try {
    t.Run([&](const StepRecord&) { fs::create_directories(dir / "ck.safetensors" / "x"); });
    FAIL() << "the save into a folder succeeded";
  } catch (const IoError& e) {
    EXPECT_NE(
        std::string(e.what()).find("is saved to '" + c.save_path + ".rescue-step1.safetensors'"),
        std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(fs::exists(c.save_path + ".rescue-step1.safetensors"));
  fs::remove_all(dir);
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
