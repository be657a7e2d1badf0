// `--program`: a model written as a training program trains like a built-in one. The programs
// `sluice export` writes for the GPT and the MLP train with bitwise the losses, gradient norms
// and weights of --model; a hand-written classifier learns; the program is checked against its data
// before the first step.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "scratch_path.h"
#include "sluice/core/error.h"
#include "sluice/io/safetensors.h"
#include "sluice/step/program_task.h"
#include "sluice/train/trainer.h"
#include "source_dir.h"
#include "trained_run.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using testing_support::TrainAndKeep;
using testing_support::TrainedRun;

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = testing_support::ScratchPath(name);
  std::ofstream(path) << text;
  return path;
}

TrainConfig SmallGpt() {
  TrainConfig c;
  c.gpt = {.vocab = 0, .seq = 0, .layers = 2, .heads = 2, .dim = 16};
  c.steps = 4;
  c.batch = 4;
  c.microbatches = 2;
  c.optimizer.lr = 1e-2;
  c.optimizer.clip_norm = 0.5;  // fires at these sizes: clipping is part of what is compared
  c.optimizer.warmup_steps = 1;
  c.threads = 1;
  c.eval_batches = 1;
  return c;
}

TrainConfig AsProgram(TrainConfig c, const std::string& path) {
  c.model = "program";
  c.program = path;
  return c;
}

void ExpectBitwise(const TrainedRun& a, const TrainedRun& b) {
  testing_support::ExpectBitwiseRun(a, b, "--program against --model");
}

TEST(ProgramTraining, ExportedGptTrainsBitwiseLikeModelGpt) {
  const TrainConfig c = SmallGpt();
  const std::string path = WriteTemp("gpt.sluice", ExportBuiltinProgram(c));
  ExpectBitwise(TrainAndKeep(c), TrainAndKeep(AsProgram(c, path)));
}

TEST(ProgramTraining, ExportedGptTrainsBitwiseAtOtherBatchesAndPolicies) {
  TrainConfig c = SmallGpt();
  const std::string path = WriteTemp("gpt_any.sluice", ExportBuiltinProgram(c));
  c.batch = 6;
  c.microbatches = 3;
  c.recompute = {RecomputePolicy::kFull};
  c.optimizer.kind = OptimizerKind::kSgd;
  c.optimizer.momentum = 0.9;
  ExpectBitwise(TrainAndKeep(c), TrainAndKeep(AsProgram(c, path)));
}

TEST(ProgramTraining, ExportedMlpTrainsBitwiseLikeModelMlp) {
  TrainConfig c = SmallGpt();
  c.model = "mlp";
  c.data = "blobs";
  const std::string path = WriteTemp("mlp.sluice", ExportBuiltinProgram(c));
  ExpectBitwise(TrainAndKeep(c), TrainAndKeep(AsProgram(c, path)));
}

TEST(ProgramTraining, ExportedGptNamesItsSizesAndUnits) {
  const std::string text = ExportBuiltinProgram(SmallGpt());
  EXPECT_THAT(text, HasSubstr("input %ids: i64[B, T] = tokens"));
  EXPECT_THAT(text, HasSubstr("input %targets: i64[B, T] = next_tokens"));
  EXPECT_THAT(text, HasSubstr("param %wte.weight: f32[11, 16] = normal(0, 0.02)"));
  EXPECT_THAT(text, HasSubstr("param %h.0.ln_1.weight: f32[16] = ones"));
  EXPECT_THAT(text, HasSubstr("unit embed {"));
  EXPECT_THAT(text, HasSubstr("unit h.1 {"));
  EXPECT_THAT(text, HasSubstr("unit head {"));
}

// examples/gpt.sluice is what `sluice export --model gpt --out examples/gpt.sluice` writes with
// every option at its default (TrainConfig's defaults are the CLI's: 2 layers, 4 heads, dim 64,
// sort data). When the GPT or the printer changes, this fails: regenerate the file with that
// command.
TEST(ProgramTraining, ExampleGptIsWhatExportWritesByDefault) {
  std::ifstream in(testing_support::SourceDir() / "examples/gpt.sluice");
  ASSERT_TRUE(in) << "examples/gpt.sluice is missing";
  const std::string file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(file, ExportBuiltinProgram(TrainConfig{}))
      << "examples/gpt.sluice is stale: run sluice export --model gpt --out examples/gpt.sluice";
}

// A classifier that is not a built-in model: two layers, a tied projection (the first layer's
// weight used again, transposed, by a reconstruction term), on blobs.
constexpr const char* kTiedClassifier = R"(program tied {
  input %x: f32[B, 16]
  input %labels: i64[B]
  param %enc.weight: f32[16, 32] = normal(0, 0.1)
  param %enc.bias: f32[32] = zeros
  param %out.weight: f32[32, 4] = normal(0, 0.1)
  param %out.bias: f32[4] = zeros
  unit enc {
    %h: f32[B, 32] = linear(%x, %enc.weight, %enc.bias)
    %a: f32[B, 32] = gelu(%h)
  }
  unit head {
    %logits: f32[B, 4] = linear(%a, %out.weight, %out.bias)
    %ce: f32[] = cross_entropy(%logits, %labels)
    %back: f32[B, 16] = matmul(%a, %enc.weight) {transpose_b = true}
    %sq: f32[B, 16] = mul(%back, %back)
    %r: f32[] = mean(%sq)
    %rs: f32[] = scale(%r) {factor = 0.001}
    %loss: f32[] = add(%ce, %rs)
  }
  output %loss
}
)";

TEST(ProgramTraining, AHandWrittenClassifierWithATiedWeightLearns) {
  TrainConfig c = SmallGpt();
  c.data = "blobs";
  c.steps = 30;
  c.batch = 16;
  c.microbatches = 1;
  c.optimizer.clip_norm = 0;
  c.optimizer.lr = 3e-2;
  const TrainedRun run = TrainAndKeep(AsProgram(c, WriteTemp("tied.sluice", kTiedClassifier)));
  EXPECT_LT(run.losses.back(), 0.5 * run.losses.front());
}

// A tied parameter trains with the sum of its readings' gradients: one SGD step of a program whose
// embedding table is also its output head moves the table by the sum of the steps that an untied
// twin (a table for each reading, loaded with the same values) gives its two tables. Two
// micro-batches, so accumulation is part of what is checked. (The gradient itself is checked
// against finite differences in tests/autodiff/tied_parameter_test.cc.)
std::string TinyLm(const std::string& table_in, const std::string& table_out) {
  std::string params = fmt::format("  param %{}: f32[11, 8] = loaded\n", table_in);
  if (table_out != table_in) params += fmt::format("  param %{}: f32[11, 8] = loaded\n", table_out);
  return fmt::format(R"(program tiny {{
  input %ids: i64[B, T] = tokens
  input %targets: i64[B, T] = next_tokens
{}  %e: f32[B, T, 8] = embedding(%ids, %{})
  %h: f32[B, T, 8] = tanh(%e)
  %logits: f32[B, T, 11] = matmul(%h, %{}) {{transpose_b = true}}
  %loss: f32[] = cross_entropy(%logits, %targets)
  output %loss
}}
)",
                     params, table_in, table_out);
}

TEST(ProgramTraining, ATiedParameterStepsByTheSumOfItsReadingsGradients) {
  std::vector<float> table(11 * 8);
  for (size_t i = 0; i < table.size(); ++i) table[i] = std::sin(0.7f * static_cast<float>(i));
  const Tensor initial = Tensor::FromVector<float>({11, 8}, table);
  const std::string tied_init = testing_support::ScratchPath("tied_init.safetensors");
  const std::string untied_init = testing_support::ScratchPath("untied_init.safetensors");
  WriteSafetensors(tied_init, {{"table", initial}});
  WriteSafetensors(untied_init, {{"table_in", initial}, {"table_out", initial}});

  TrainConfig c = SmallGpt();
  c.steps = 1;
  c.optimizer.kind = OptimizerKind::kSgd;
  c.optimizer.schedule = LrSchedule::kConstant;
  c.optimizer.warmup_steps = 0;
  c.optimizer.lr = 0.5;
  c.optimizer.momentum = 0;
  c.optimizer.weight_decay = 0;
  c.optimizer.clip_norm = 0;
  TrainConfig tied = AsProgram(c, WriteTemp("tied_lm.sluice", TinyLm("table", "table")));
  tied.init_from = tied_init;
  TrainConfig untied = AsProgram(c, WriteTemp("untied_lm.sluice", TinyLm("table_in", "table_out")));
  untied.init_from = untied_init;
  const TrainedRun a = TrainAndKeep(tied);
  const TrainedRun b = TrainAndKeep(untied);
  EXPECT_EQ(a.losses, b.losses);  // the same function of the same values

  const std::vector<float>& after = a.state.at("table");
  const std::vector<float>& in = b.state.at("table_in");
  const std::vector<float>& out = b.state.at("table_out");
  double in_norm = 0, out_norm = 0;
  for (size_t i = 0; i < table.size(); ++i) {
    const double step_in = in[i] - table[i], step_out = out[i] - table[i];
    EXPECT_NEAR(after[i] - table[i], step_in + step_out, 1e-6) << "table[" << i << "]";
    in_norm += step_in * step_in;
    out_norm += step_out * step_out;
  }
  // Both readings move the table, far beyond the tolerance: either alone would fail above.
  EXPECT_GT(std::sqrt(in_norm), 1e-3);
  EXPECT_GT(std::sqrt(out_norm), 1e-3);
}

TEST(ProgramTraining, ExamplesTrain) {
  TrainConfig c = SmallGpt();
  c.data = "blobs";
  c.steps = 20;
  c.batch = 16;
  c.microbatches = 2;
  c.optimizer.clip_norm = 0;
  c.optimizer.lr = 3e-2;
  const TrainedRun run = TrainAndKeep(
      AsProgram(c, (testing_support::SourceDir() / "examples/classifier.sluice").string()));
  EXPECT_LT(run.losses.back(), 0.7 * run.losses.front());
}

std::string ErrorOf(const TrainConfig& c) {
  try {
    Trainer t(c);
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(ProgramTraining, AProgramTheDataCannotFeedIsRefusedBeforeTheFirstStep) {
  TrainConfig c = SmallGpt();
  c.data = "blobs";
  auto with = [&](const std::string& name, const std::string& text) {
    return ErrorOf(AsProgram(c, WriteTemp(name, text)));
  };
  const std::string base = kTiedClassifier;
  auto replace = [&](const std::string& from, const std::string& to) {
    std::string s = base;
    s.replace(s.find(from), from.size(), to);
    return s;
  };
  EXPECT_THAT(with("unbound.sluice", replace("input %labels: i64[B]", "input %classes: i64[B]")),
              HasSubstr("unbound.sluice:3:9: input %classes binds the data array 'classes', "
                        "which blobs does not have (its arrays: labels, x)"));
  EXPECT_THAT(with("fixed.sluice", replace("input %labels: i64[B]", "input %labels: i64[3]")),
              HasSubstr("fixed.sluice:3:9: input %labels is declared i64[3], but its first axis "
                        "is the batch, and this run's micro-batches hold 2 examples"));
  EXPECT_THAT(with("dtype.sluice", replace("input %labels: i64[B]", "input %labels: f32[B]")),
              HasSubstr("the data's 'labels' is i64"));
  // The examples' random keys (dropout's) are one i64 per example, whatever the data.
  EXPECT_THAT(
      with("key.sluice", replace("input %labels: i64[B]",
                                 "input %labels: i64[B]\n  input %key: i64[] = random_key")),
      HasSubstr("input %key binds random_key, the examples' random keys (what dropout "
                "draws its masks from), which are i64[B]; it is declared i64[]"));
  EXPECT_THAT(
      with("key3.sluice", replace("input %labels: i64[B]",
                                  "input %labels: i64[B]\n  input %key: i64[3] = random_key")),
      HasSubstr("it is declared i64[3] (this run's micro-batches hold 2 examples: write B)"));
  EXPECT_THAT(
      with("noinit.sluice", replace("param %out.bias: f32[4] = zeros", "param %out.bias: f32[4]")),
      HasSubstr("a parameter without an initializer: %out.bias"));
  EXPECT_THAT(with("loaded.sluice",
                   replace("param %out.bias: f32[4] = zeros", "param %out.bias: f32[4] = loaded")),
              HasSubstr("%out.bias is `loaded` (its value comes from --init-from) but no "
                        "--init-from file is given"));
  EXPECT_THAT(with("noloss.sluice", replace("output %loss", "output %ce\n  output %logits")),
              HasSubstr("a training program outputs its loss: an output named %loss, or a single "
                        "output (this program has 2 outputs)"));
  EXPECT_THAT(with("vector.sluice", replace("output %loss", "output %logits")),
              HasSubstr("vector.sluice:21:10: the loss %logits is f32[2, 4]; a training loss is "
                        "a float scalar"));
  EXPECT_THAT(with("bad.sluice", replace("normal(0, 0.1)", "normal(0, 0)")),
              HasSubstr("bad.sluice:4:36: normal's std must be positive"));
}

// With --init-from, a parameter written without an initializer comes from the file (as if written
// `= loaded`); without it, the program is refused naming the parameter.
TEST(ProgramTraining, ParametersWithoutInitializersComeFromInitFrom) {
  std::vector<float> table(11 * 8);
  for (size_t i = 0; i < table.size(); ++i) table[i] = std::cos(0.3f * static_cast<float>(i));
  const std::string init = testing_support::ScratchPath("bare_init.safetensors");
  WriteSafetensors(init, {{"table", Tensor::FromVector<float>({11, 8}, table)}});
  std::string bare = TinyLm("table", "table");
  bare.replace(bare.find(" = loaded"), 9, "");
  TrainConfig c = SmallGpt();
  c.steps = 2;
  TrainConfig written = AsProgram(c, WriteTemp("loaded_lm.sluice", TinyLm("table", "table")));
  written.init_from = init;
  TrainConfig unwritten = AsProgram(c, WriteTemp("bare_lm.sluice", bare));
  unwritten.init_from = init;
  const TrainedRun a = TrainAndKeep(written), b = TrainAndKeep(unwritten);
  EXPECT_EQ(a.losses, b.losses);
  EXPECT_EQ(a.state, b.state);
  unwritten.init_from.clear();
  EXPECT_THAT(ErrorOf(unwritten), HasSubstr("a parameter without an initializer: %table"));
}

// A constant (`const`) is read like a parameter but never trained: it keeps its loaded values,
// has no optimizer state, is counted in no gradient, and the checkpoint keeps it, so that the
// checkpoint alone is enough to --init-from. The same program with the table as a `param` moves it.
TEST(ProgramTraining, AConstantIsReadButNeverTrainedAndTheCheckpointKeepsIt) {
  std::vector<float> table(11 * 8), scale(8);
  for (size_t i = 0; i < table.size(); ++i) table[i] = std::sin(0.7f * static_cast<float>(i));
  for (size_t i = 0; i < scale.size(); ++i) scale[i] = 0.5f + 0.25f * static_cast<float>(i);
  const std::string init = testing_support::ScratchPath("const_init.safetensors");
  WriteSafetensors(init, {{"table", Tensor::FromVector<float>({11, 8}, table)},
                          {"scale", Tensor::FromVector<float>({1, 8}, scale)}});
  const std::string program = R"(program consts {
  input %ids: i64[B, T] = tokens
  input %targets: i64[B, T] = next_tokens
  param %table: f32[11, 8] = loaded
  const %scale: f32[1, 8] = loaded
  %e: f32[B, T, 8] = embedding(%ids, %table)
  %s: f32[1, 8] = slice(%scale) {axis = 0, end = 1, start = 0}
  %h: f32[B, T, 8] = mul(%e, %s)
  %logits: f32[B, T, 11] = matmul(%h, %table) {transpose_b = true}
  %loss: f32[] = cross_entropy(%logits, %targets)
  output %loss
}
)";
  TrainConfig c = AsProgram(SmallGpt(), WriteTemp("consts.sluice", program));
  c.steps = 3;
  c.init_from = init;
  const std::string checkpoint = testing_support::ScratchPath("consts_ckpt.safetensors");
  std::vector<double> losses;
  {
    Trainer trainer(c);
    for (int64_t s = 0; s < c.steps; ++s) losses.push_back(trainer.Step().loss);
    EXPECT_EQ(trainer.ParamNames(), (std::vector<std::string>{"table", "scale"}));
    const Tensor& kept = trainer.Value("scale");
    for (int64_t i = 0; i < kept.numel(); ++i)
      EXPECT_EQ(kept.FlatAt(i), scale[static_cast<size_t>(i)]) << "scale[" << i << "]";
    EXPECT_FALSE(trainer.Has("scale.exp_avg"));
    EXPECT_TRUE(trainer.Has("table.exp_avg"));
    EXPECT_NE(trainer.Value("table").FlatAt(0), table[0]) << "the parameter beside it trains";
    trainer.SaveCheckpoint(checkpoint);
  }
  const SafetensorsFile saved = ReadSafetensors(checkpoint);
  ASSERT_TRUE(saved.tensors.count("scale"));
  EXPECT_FALSE(saved.tensors.count("scale.exp_avg"));
  EXPECT_EQ(saved.tensors.at("scale").FlatAt(3), scale[3]);
  // The checkpoint alone starts a run (parameter and constant), and resumes one.
  TrainConfig from = c;
  from.init_from = checkpoint;
  EXPECT_NO_THROW(Trainer{from}.Step());
  TrainConfig resumed = c;
  resumed.init_from.clear();
  resumed.resume_path = checkpoint;
  resumed.steps = 4;
  Trainer again(resumed);
  EXPECT_EQ(again.step(), 3);
  EXPECT_TRUE(std::isfinite(again.Step().loss));
}

}  // namespace
}  // namespace sluice
