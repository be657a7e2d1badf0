// `sluice train --program` as a user runs it: the built binary (SLUICE_BINARY, set by CTest)
// training the example programs end to end, `sluice plan --program` forecasting the peak that one
// stage measures, --save/--resume giving the losses of an uninterrupted run, `sluice export`
// writing examples/gpt.sluice, examples/classifier_data.py making a data set that trains, and bad
// programs and options refused with exit 1, a message naming the file, line or option, and nothing
// written.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli/cli_fixture.h"
#include "sluice/io/safetensors.h"
#include "source_dir.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

std::string Example(const std::string& name) {
  return (testing_support::SourceDir() / "examples" / name).string();
}

// A program for --data blobs (x f32[B, 16], labels i64[B]) in two units; line numbers matter to the
// messages checked below.
constexpr const char* kSmall = R"(program small {
  input %x: f32[B, 16]
  input %labels: i64[B]
  param %fc.weight: f32[16, 4] = normal(0, 0.1)
  param %fc.bias: f32[4] = zeros
  unit fc {
    %logits: f32[B, 4] = linear(%x, %fc.weight, %fc.bias)
  }
  unit loss {
    %loss: f32[] = cross_entropy(%logits, %labels)
  }
  output %loss
}
)";

// kSmall without its units: it trains on one stage, and cannot be cut into more.
constexpr const char* kSmallWithoutUnits = R"(program small {
  input %x: f32[B, 16]
  input %labels: i64[B]
  param %fc.weight: f32[16, 4] = normal(0, 0.1)
  param %fc.bias: f32[4] = zeros
  %logits: f32[B, 4] = linear(%x, %fc.weight, %fc.bias)
  %loss: f32[] = cross_entropy(%logits, %labels)
  output %loss
}
)";

// kSmall with `from` replaced by `to`.
std::string SmallWith(const std::string& from, const std::string& to) {
  std::string s = kSmall;
  const size_t at = s.find(from);
  if (at == std::string::npos) ADD_FAILURE() << "kSmall has no '" << from << "'";
  if (at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

class ProgramCli : public CliTest {
 protected:
  // Each step's loss and the summary of the metrics file at `p`.
  struct Metrics {
    std::vector<double> losses;
    nlohmann::json summary;
    size_t lines = 0;
  };
  static Metrics ReadMetrics(const fs::path& p) {
    Metrics m;
    std::ifstream in(p);
    for (std::string line; std::getline(in, line);) {
      ++m.lines;
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.value("summary", false)) {
        m.summary = j;
      } else if (j.contains("loss") && !j.contains("val_loss")) {
        m.losses.push_back(j["loss"].get<double>());
      }
    }
    return m;
  }

  // `sluice train ARGS --quiet --metrics M`, expected to succeed; what M holds.
  Metrics Train(const std::string& args, const std::string& metrics_name = "m.jsonl") {
    const fs::path metrics = dir_ / metrics_name;
    const CliResult r =
        Sluice(fmt::format("train {} --quiet --metrics {}", args, metrics.string()), "timeout 300");
    EXPECT_EQ(r.status, 0) << args << "\n" << r.err;
    return ReadMetrics(metrics);
  }

  // Runs `sluice train ARGS --save S --metrics M` expecting it to be refused: exit 1, one error
  // line holding `message`, and neither S nor M written.
  void ExpectRefused(const std::string& args, const std::string& message) {
    const fs::path save = dir_ / "refused.safetensors", metrics = dir_ / "refused.jsonl";
    const CliResult r = Sluice(fmt::format("train {} --steps 2 --threads 1 --save {} --metrics {}",
                                           args, save.string(), metrics.string()));
    EXPECT_EQ(r.status, 1) << args << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr("sluice: error: " + message)) << args;
    EXPECT_FALSE(fs::exists(save)) << args << ": wrote " << save;
    EXPECT_FALSE(fs::exists(metrics)) << args << ": wrote " << metrics;
  }
};

// The mean of the last three losses is below `fraction` of the first.
void ExpectLossFalls(const std::vector<double>& losses, double fraction, const std::string& what) {
  ASSERT_GE(losses.size(), 4u) << what;
  const size_t n = losses.size();
  const double last = (losses[n - 1] + losses[n - 2] + losses[n - 3]) / 3;
  EXPECT_LT(last, fraction * losses.front())
      << what << ": first loss " << losses.front() << ", last three " << last;
}

constexpr const char* kShort =
    "--steps 30 --batch 16 --lr 0.01 --lr-schedule constant --warmup 1 --threads 1 "
    "--eval-every 0 --eval-batches 1";

TEST_F(ProgramCli, TrainsAProgramEndToEnd) {
  const Metrics m =
      Train(fmt::format("--program {} --data sort {}", Example("prenorm.sluice"), kShort));
  EXPECT_EQ(m.losses.size(), 30u);
  EXPECT_GT(m.lines, m.losses.size());  // an evaluation and the summary follow the steps
  EXPECT_EQ(m.summary["config"]["model"], "program");
  EXPECT_EQ(m.summary["config"]["program"], Example("prenorm.sluice"));
  ExpectLossFalls(m.losses, 0.8, "prenorm.sluice");
}

// What `sluice export --model gpt` writes with every option at its default is the example file
// (tests/train/program_train_test.cc checks the same from the library's side).
TEST_F(ProgramCli, ExportWithDefaultsWritesExamplesGpt) {
  const fs::path out = dir_ / "gpt.sluice";
  const CliResult r = Sluice(fmt::format("export --model gpt --out {}", out.string()));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(ReadFile(out), ReadFile(Example("gpt.sluice")))
      << "examples/gpt.sluice is stale: run sluice export --model gpt --out examples/gpt.sluice";
}

// On one stage the forecast is exact: `sluice plan --program` predicts the peak the same job
// measures when it trains, and the run's summary carries the same forecast.
TEST_F(ProgramCli, PlanOfAProgramOnOneStageIsTheMeasuredPeak) {
  const std::vector<std::string> jobs = {
      fmt::format("--program {} --data sort", Example("prenorm.sluice")),
      fmt::format("--program {} --data blobs", Example("classifier.sluice")),
  };
  for (const std::string& program : jobs) {
    const std::string job = program +
                            " --batch 8 --microbatches 2 --threads 1 --steps 2 "
                            "--eval-every 0";
    const CliResult table = Sluice("plan " + job);
    ASSERT_EQ(table.status, 0) << job << "\n" << table.err;
    EXPECT_THAT(table.out, HasSubstr("peak at")) << table.out;
    const CliResult r = Sluice(fmt::format("plan {} --format json", job));
    ASSERT_EQ(r.status, 0) << job << "\n" << r.err;
    const nlohmann::json plan = nlohmann::json::parse(r.out);
    ASSERT_EQ(plan["stages"].size(), 1u) << plan.dump();
    const int64_t predicted = plan["stages"][0]["predicted_peak_allocated_bytes"].get<int64_t>();
    EXPECT_GT(predicted, 0) << job;
    const Metrics m = Train(job);
    EXPECT_EQ(predicted, m.summary["peak_allocated_bytes"].get<int64_t>()) << job;
    EXPECT_EQ(m.summary["predicted_peak_allocated_bytes"].get<int64_t>(), predicted) << job;
  }
}

TEST_F(ProgramCli, ResumesAProgramBitwise) {
  const fs::path ckpt = dir_ / "ckpt.safetensors";
  for (const std::string& job :
       {fmt::format("--program {} --data sort --batch 8", Example("prenorm.sluice")),
        fmt::format("--program {} --data sort --batch 8 --stages 2 --layout "
                    "'embed,block.0|block.1,head'",
                    Example("prenorm.sluice"))}) {
    const std::string common = job + " --threads 1 --eval-every 0";
    fs::remove(dir_ / "full.jsonl");
    fs::remove(dir_ / "part.jsonl");
    const Metrics full = Train(common + " --steps 6", "full.jsonl");
    Train(fmt::format("{} --steps 3 --save {}", common, ckpt.string()), "part.jsonl");
    // Resuming appends to the metrics file and continues from step 4 with the same losses.
    const Metrics resumed =
        Train(fmt::format("{} --steps 6 --resume {}", common, ckpt.string()), "part.jsonl");
    EXPECT_EQ(full.losses.size(), 6u) << job;
    EXPECT_EQ(resumed.losses, full.losses) << job;
    fs::remove(ckpt);
  }
}

// examples/classifier_data.py writes a safetensors file of named arrays that
// examples/array_classifier.sluice binds and learns from, on one stage and on two.
TEST_F(ProgramCli, TheClassifierDataScriptMakesADataSetThatTrains) {
  const char* python = "/usr/bin/python3";
  if (!fs::exists(python)) GTEST_SKIP() << python << " is not installed";
  const fs::path data = dir_ / "blobs.safetensors";
  const std::string cmd =
      fmt::format("{} '{}' '{}' > /dev/null", python, Example("classifier_data.py"), data.string());
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  ASSERT_TRUE(fs::exists(data));
  // Two micro-batches in both runs, as a pipeline of two stages needs them.
  const std::string job = fmt::format("--program {} --data {} {} --microbatches 2",
                                      Example("array_classifier.sluice"), data.string(), kShort);
  const Metrics one = Train(job, "one.jsonl");
  ExpectLossFalls(one.losses, 0.5, "array_classifier.sluice on one stage");
  const Metrics two = Train(job + " --stages 2 --layout 'in,block.0,block.1|head'", "two.jsonl");
  EXPECT_EQ(two.losses, one.losses);
}

TEST_F(ProgramCli, BadProgramsAndOptionsAreRefusedNamingThePlaceAndWriteNothing) {
  const std::string small = Write("small.sluice", kSmall).string();
  ExpectRefused(fmt::format("--program {} --data blobs --layers 2", small),
                "--layers sets a size of --model gpt; a --program's sizes are written in its "
                "file: drop --layers");
  ExpectRefused(fmt::format("--program {} --data blobs --dropout 0.1", small),
                "--dropout sets the dropout of --model gpt; a --program carries its own dropout "
                "ops, each with its p");
  ExpectRefused(fmt::format("--program {} --model gpt", small),
                fmt::format("--program {} and --model gpt name two models: drop one", small));
  const std::string missing = (dir_ / "missing.sluice").string();
  ExpectRefused(fmt::format("--program {}", missing),
                fmt::format("cannot read program file '{}'", missing));

  const std::string no_loss =
      Write("noloss.sluice", SmallWith("output %loss", "output %logits")).string();
  ExpectRefused(fmt::format("--program {} --data blobs --batch 8", no_loss),
                fmt::format("{}:12:10: the loss %logits is f32[8, 4]; a training loss is a float "
                            "scalar",
                            no_loss));
  const std::string unbound =
      Write("unbound.sluice", SmallWith("%labels: i64[B]", "%labels: i64[B] = classes")).string();
  ExpectRefused(fmt::format("--program {} --data blobs", unbound),
                fmt::format("{}:3:9: input %labels binds the data array 'classes', which blobs "
                            "does not have (its arrays: labels, x)",
                            unbound));
  const std::string no_init =
      Write("noinit.sluice", SmallWith("%fc.bias: f32[4] = zeros", "%fc.bias: f32[4]")).string();
  ExpectRefused(
      fmt::format("--program {} --data blobs", no_init),
      fmt::format("{}: a parameter without an initializer: %fc.bias ({}:5:9)", no_init, no_init));
  ExpectRefused(fmt::format("--program {} --data blobs --stages 2 --layout 'fc|head'", small),
                "--layout stage 1: 'head' is not an item: expected fc, loss");
  const std::string no_units = Write("nounits.sluice", kSmallWithoutUnits).string();
  ExpectRefused(fmt::format("--program {} --data blobs --stages 2", no_units),
                "the model has no units to split into pipeline stages (a program names them with "
                "`unit NAME { ... }`");
}

// BUG (found by this test; src/sluice/pipeline/partition.cc IsGpt): a program whose first unit is
// `embed` and last `head` — examples/prenorm.sluice, and every program `sluice export --model gpt`
// writes — is taken for the built-in GPT by the layout and partition messages, which then tell
// the user to change --layers: an option --program refuses ("--layers sets a size of --model
// gpt"). Expected: the program's units are named and no --layers fix is offered, as for a
// program whose units are named otherwise (examples/classifier.sluice: "the model has
// block.0-1").
TEST_F(ProgramCli, LayoutAndPartitionErrorsOfAProgramDoNotOfferLayers) {
  const std::string prenorm = Example("prenorm.sluice");
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"--stages 2 --layout 'embed,block.0|block.2,head'",
            "--layout stage 1: 'block.2' is out of range: the model has "},
           {"--stages 4 --partition uniform", "--partition uniform puts at least one "},
           {"--stages 8", "--partition balanced needs at least one unit per stage"}}) {
    const CliResult r = Sluice(fmt::format("train --program {} {} --steps 1", prenorm, args));
    EXPECT_EQ(r.status, 1) << args << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(message)) << args;
    EXPECT_THAT(r.err, Not(HasSubstr("--layers"))) << args;
  }
}

// Regression: a parameter the loss does not depend on (a head forward never uses, a branch whose
// result nothing reads) got a zero gradient, so AdamW's weight decay moved it, and it took
// optimizer state; PyTorch leaves its .grad None and skips it. Now it is left as it was and said
// once; on a pipeline the unread head is held by the first stage and still checkpointed.
TEST_F(ProgramCli, AParameterTheLossDoesNotReadIsLeftAsItWas) {
  const fs::path program = Write("unused.sluice", R"(program unused {
  input %x: f32[B, 16]
  input %labels: i64[B]
  param %fc.weight: f32[16, 4] = normal(0, 0.1)
  param %fc.bias: f32[4] = zeros
  param %aux.weight: f32[16, 4] = ones
  param %side.weight: f32[4, 4] = ones
  unit fc {
    %logits: f32[B, 4] = linear(%x, %fc.weight, %fc.bias)
  }
  unit loss {
    %side: f32[B, 4] = matmul(%logits, %side.weight)
    %loss: f32[] = cross_entropy(%logits, %labels)
  }
  output %loss
}
)");
  for (const char* stages : {"1", "2"}) {
    SCOPED_TRACE(stages);
    const fs::path ck = dir_ / fmt::format("unused{}.safetensors", stages);
    const CliResult r = Sluice(fmt::format(
        "train --program {} --data blobs --steps 3 --lr 0.1 --weight-decay 0.5 --clip 1 "
        "--stages {} --quiet --save {}",
        program.string(), stages, ck.string()));
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_THAT(r.err, HasSubstr("sluice: warning: the loss does not depend on parameters "
                                 "%aux.weight, %side.weight: left as they are"));
    EXPECT_EQ(r.err.find("the loss does not depend"), r.err.rfind("the loss does not depend"))
        << "said more than once:\n"
        << r.err;
    const SafetensorsFile f = ReadSafetensors(ck.string());
    for (const char* name : {"aux.weight", "side.weight"}) {
      ASSERT_TRUE(f.tensors.count(name)) << name << " is not in the checkpoint";
      const Tensor& t = f.tensors.at(name);
      for (int64_t i = 0; i < t.numel(); ++i) ASSERT_EQ(t.FlatAt(i), 1.0) << name << " at " << i;
      EXPECT_FALSE(f.tensors.count(std::string(name) + ".exp_avg")) << name;
    }
    EXPECT_TRUE(f.tensors.count("fc.weight.exp_avg"));
  }
  // The summary counts both (fc: 16·4 + 4 trained; aux and side: 64 + 16 unused; it counted the
  // trained ones alone), and a classifier's throughput is in examples, not tokens.
  const CliResult loud =
      Sluice(fmt::format("train --program {} --data blobs --steps 2 --lr 0.1", program.string()));
  ASSERT_EQ(loud.status, 0) << loud.err;
  EXPECT_THAT(loud.err, HasSubstr("68 parameters trained, 80 unused"));
  EXPECT_THAT(loud.err, HasSubstr("examples/s"));
  EXPECT_THAT(loud.err, Not(HasSubstr("tok/s")));
  // A checkpoint of an earlier sluice, which kept (zero) optimizer state for them, resumes: the
  // state is ignored, saying so.
  const fs::path ck = dir_ / "unused1.safetensors";
  SafetensorsFile old = ReadSafetensors(ck.string());
  for (const char* name : {"aux.weight", "side.weight"}) {
    for (const char* state : {".exp_avg", ".exp_avg_sq"}) {
      const Tensor& p = old.tensors.at(name);
      old.tensors.emplace(std::string(name) + state, Tensor::Zeros(p.shape(), p.dtype()));
    }
  }
  const fs::path earlier = dir_ / "earlier.safetensors";
  WriteSafetensors(earlier.string(), old.tensors, old.metadata);
  const CliResult r = Sluice(fmt::format(
      "train --program {} --data blobs --steps 4 --lr 0.1 --weight-decay 0.5 --clip 1 --quiet "
      "--resume {}",
      program.string(), earlier.string()));
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("holds optimizer state of parameters the loss does not depend on, "
                               "which training leaves alone: aux.weight.exp_avg, "
                               "aux.weight.exp_avg_sq, side.weight.exp_avg, side.weight.exp_avg_sq "
                               "ignored"));
}

// Regression: token ids past a --program's embedding rows were caught only at the first step,
// inside a stage ("stage 0 failed at step 1, action 1 of 9 ... embedding id 104 ... vocab = 11").
// Now train and plan refuse before anything runs, naming the data, its largest id, the table and
// its rows; so for targets past the cross-entropy's classes. A piped file is read once for it.
TEST_F(ProgramCli, DataIdsPastAnEmbeddingTableAreRefusedBeforeTraining) {
  std::string text;
  for (int i = 0; text.size() < 4000; ++i) text += fmt::format("line {} of a small corpus\n", i);
  const fs::path corpus = Write("corpus.txt", text);
  char largest = 0;
  for (char c : text) largest = std::max(largest, c);
  const std::string prenorm = Example("prenorm.sluice");
  for (const std::string command : {"train --steps 1 --stages 2", "plan --stages 2", "train"}) {
    SCOPED_TRACE(command);
    const CliResult r =
        Sluice(fmt::format("{} --program {} --data {}", command, prenorm, corpus.string()));
    EXPECT_EQ(r.status, 1) << r.err;
    EXPECT_THAT(r.err, HasSubstr(fmt::format(
                           "sluice: error: {}: the data's largest id in 'tokens' is {}, but "
                           "%tok.weight ({}:16:9), the table the embedding %tok picks rows of, has "
                           "11 rows (ids 0 to 10): give it at least {} rows",
                           corpus.string(), static_cast<int>(largest), prenorm, largest + 1)));
    EXPECT_THAT(r.err, Not(HasSubstr("failed at step")));
  }
  const CliResult piped =
      Sluice(fmt::format("train --steps 1 --program {} --data /dev/stdin", prenorm),
             "cat " + corpus.string() + " |");
  EXPECT_THAT(piped.err, HasSubstr("sluice: error: /dev/stdin: the data's largest id in 'tokens'"));
  // The table wide enough, the head still of 11 classes: the targets are past them.
  std::string wide = ReadFile(prenorm);
  const size_t at = wide.find("param %tok.weight: f32[11, 32]");
  ASSERT_NE(at, std::string::npos);
  wide.replace(at, 30, "param %tok.weight: f32[256, 32]");
  const fs::path program = Write("wide.sluice", wide);
  const CliResult r = Sluice(
      fmt::format("train --steps 1 --program {} --data {}", program.string(), corpus.string()));
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr(fmt::format(
                         "the data's largest id in 'next_tokens' is {}, but the cross-entropy "
                         "%loss of {} scores 11 classes (the last axis of %logits: ids 0 to 10)",
                         static_cast<int>(largest), program.string())));
  // Data within the table trains.
  EXPECT_EQ(Sluice(fmt::format("train --steps 1 --program {} --quiet", prenorm)).status, 0);
}

// Regression: --resume with the program file edited since the checkpoint (another computation)
// went on silently, though --resume promises the run continued bitwise. Now it is refused like a
// changed hyperparameter, unless --allow-changes (then a warning); an edit of comments or white
// space alone is no change.
TEST_F(ProgramCli, ResumingWithAnEditedProgramIsRefusedUnlessAllowed) {
  const fs::path program = Write("small.sluice", kSmall);
  const fs::path ck = dir_ / "ck.safetensors";
  const std::string base = fmt::format("train --program {} --data blobs --quiet", program.string());
  ASSERT_EQ(Sluice(fmt::format("{} --steps 2 --save {}", base, ck.string())).status, 0);
  Write("small.sluice",
        "# the same program, commented\n" + SmallWith("  unit fc {", "\n  unit fc {"));
  CliResult r = Sluice(fmt::format("{} --steps 3 --resume {}", base, ck.string()));
  EXPECT_EQ(r.status, 0) << r.err;
  Write("small.sluice", SmallWith("normal(0, 0.1)", "normal(0, 0.2)"));
  r = Sluice(fmt::format("{} --steps 3 --resume {}", base, ck.string()));
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr(fmt::format(
                         "sluice: error: checkpoint '{}' was trained with another text of {} (the "
                         "file changed since it was saved): --resume continues the run bitwise",
                         ck.string(), program.string())));
  r = Sluice(fmt::format("{} --steps 3 --resume {} --allow-changes", base, ck.string()));
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("the file changed since it was saved); training goes on with the "
                               "file as it is now (--allow-changes)"));
}

}  // namespace
}  // namespace sluice
