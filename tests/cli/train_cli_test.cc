// `sluice train` as a user runs it: the built binary (SLUICE_BINARY, set by CTest) training the
// sort task and an MLP, writing metrics and checkpoints, resuming, and refusing bad options with a
// message that says what to change and a non-zero exit.
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include "cli/cli_fixture.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

class TrainCli : public CliTest {
 protected:
  CliResult Train(const std::string& args) { return Sluice("train " + args); }
};

TEST_F(TrainCli, TrainsWritesMetricsAndResumesBitwise) {
  const fs::path full = dir_ / "full.jsonl", first = dir_ / "first.jsonl",
                 ckpt = dir_ / "ckpt.safetensors";
  const std::string common =
      "--layers 1 --dim 16 --heads 2 --batch 8 --threads 1 --eval-every 0 --quiet";
  ASSERT_EQ(Train(fmt::format("{} --steps 6 --metrics {}", common, full.string())).status, 0);
  CliResult r = Train(
      fmt::format("{} --steps 3 --metrics {} --save {}", common, first.string(), ckpt.string()));
  ASSERT_EQ(r.status, 0) << r.err;
  // Resuming appends to the metrics file and continues from step 4 with the same losses.
  r = Train(
      fmt::format("{} --steps 6 --metrics {} --resume {}", common, first.string(), ckpt.string()));
  ASSERT_EQ(r.status, 0) << r.err;
  auto losses = [&](const fs::path& p) {
    std::vector<double> l;
    for (const auto& j : Lines(p)) {
      if (j.contains("loss") && !j.contains("summary")) l.push_back(j["loss"].get<double>());
    }
    return l;
  };
  EXPECT_EQ(losses(full), losses(first));
  EXPECT_EQ(losses(full).size(), 6u);
  const nlohmann::json summary = Lines(full).back();
  EXPECT_TRUE(summary["summary"].get<bool>());
  EXPECT_TRUE(summary.contains("accuracy"));
}

TEST_F(TrainCli, ResumeOnOtherDataWarnsAndOfAnotherModelIsRefused) {
  const fs::path a = dir_ / "a.txt", b = dir_ / "b.txt", ckpt = dir_ / "a.safetensors";
  for (const fs::path& p : {a, b}) {
    std::ofstream out(p);
    for (int i = 0; i < 200; ++i) out << (p == a ? "to be or not to be. " : "all the world. ");
  }
  const std::string common = "--layers 1 --dim 16 --batch 4 --seq 16 --threads 1 --eval-every 0";
  CliResult r = Train(fmt::format("{} --heads 2 --data {} --steps 1 --quiet --save {}", common,
                                  a.string(), ckpt.string()));
  ASSERT_EQ(r.status, 0) << r.err;
  // Other data: a warning, under --quiet too, and training goes on.
  r = Train(fmt::format("{} --heads 2 --data {} --steps 2 --quiet --resume {}", common, b.string(),
                        ckpt.string()));
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr(fmt::format("sluice: warning: checkpoint '{}' was trained with "
                                           "--data {} (this run: {})",
                                           ckpt.string(), a.string(), b.string())));
  // Another model whose tensors fit: refused, pointing at --init-from.
  r = Train(fmt::format("{} --heads 4 --data {} --steps 2 --resume {}", common, a.string(),
                        ckpt.string()));
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("was written with --heads 2 (this run: 4)"));
  EXPECT_THAT(r.err, HasSubstr("--init-from"));
}

TEST_F(TrainCli, DataNamedLikeABuiltInTaskSaysWhichItTrainsOn) {
  {
    std::ofstream out(dir_ / "sort");
    for (int i = 0; i < 200; ++i) out << "to be or not to be. ";
  }
  const std::string here = fmt::format("cd '{}' &&", dir_.string());
  const std::string common = "--layers 1 --dim 16 --heads 2 --batch 4 --threads 1 --eval-every 0";
  CliResult r = Sluice(fmt::format("train {} --steps 1 --quiet --data sort", common), here);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("sluice: warning: --data sort is the built-in sort task, not the "
                               "file 'sort' here: give --data ./sort to train on the file"));
  r = Sluice(fmt::format("train {} --steps 1 --quiet --seq 16 --data ./sort", common), here);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.err, "");
}

TEST_F(TrainCli, BadOptionsSayWhatToChange) {
  CliResult r = Train("--heads 3 --dim 16 --steps 1");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("--heads 3 does not divide --dim 16"));
  r = Train("--data /no/such/corpus.txt --steps 1");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("/no/such/corpus.txt"));
  r = Train("--optimizer adam --steps 1");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("--optimizer must be adamw or sgd"));
  r = Train("--gc sometimes --steps 1");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("--gc must be one of auto, none, sync, async, not 'sometimes'"));
  r = Train("--memory-plan arena --steps 1");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("--memory-plan must be one of dynamic, static, not 'arena'"));
  r = Train("--memory-plan static --mode parallel --steps 1");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("--memory-plan static needs --mode trace"));
  r = Train("--threads -2 --steps 1");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("--threads must be 0 (every core) or more, got -2"));
  r = Train("--no-such-option");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("no-such-option"));
  r = Train("--steps 0");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("--steps must be at least 1"));
}

// An option only the other model or optimizer reads would change nothing: it is refused, naming
// what it applies to, instead of being silently ignored.
TEST_F(TrainCli, OptionsOfTheOtherModelOrOptimizerAreRefused) {
  CliResult r = Train("--model mlp --dim 32 --steps 1");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("--dim applies to --model gpt only; this run uses --model mlp"));
  r = Train("--hidden 8 --steps 1");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("--hidden applies to --model mlp only; this run uses --model gpt"));
  r = Train("--momentum 0.9 --steps 1");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err,
              HasSubstr("--momentum applies to --optimizer sgd only; this run uses --optimizer "
                        "adamw"));
  r = Train("--optimizer sgd --beta2 0.95 --steps 1");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("--beta2 applies to --optimizer adamw only"));
  // Given where they apply, they run; an unknown model keeps its own error.
  r = Train("--optimizer sgd --momentum 0.9 --model mlp --hidden 16 --steps 2 --quiet");
  EXPECT_EQ(r.status, 0) << r.err;
  r = Train("--model cnn --dim 32 --steps 1");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("--model must be gpt or mlp, not 'cnn'"));
}

// `--model mlp --data sort` trained on blobs without a word: each model's default data applies
// only when --data is not given, and data the model cannot train on is an error naming both.
TEST_F(TrainCli, DataTheModelCannotTrainOnIsRefusedNotReplaced) {
  for (const char* data : {"sort", "corpus.txt"}) {
    const CliResult r = Train(fmt::format("--model mlp --data {} --steps 1", data));
    EXPECT_EQ(r.status, 1) << r.err;
    EXPECT_THAT(r.err, HasSubstr(fmt::format(
                           "--data {}: --model mlp trains on blobs only (Gaussian clusters, its "
                           "default); drop --data or choose --model gpt",
                           data)));
  }
  CliResult r = Train("--data blobs --steps 1");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--data blobs: --model gpt trains on sort (its default) or a text "
                               "file; blobs is --model mlp's data"));
  // plan and simulate read the same options.
  r = Sluice("plan --model mlp --data sort --steps 1");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("--data sort: --model mlp trains on blobs only"));
  // Without --data each model takes its own; with the right one given, it trains.
  const fs::path m = dir_ / "mlp.jsonl";
  r = Train(fmt::format("--model mlp --steps 1 --threads 1 --quiet --metrics {}", m.string()));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(Lines(m).back()["config"]["data"], "blobs");
  r = Train("--model mlp --data blobs --steps 1 --threads 1 --quiet");
  EXPECT_EQ(r.status, 0) << r.err;
}

TEST_F(TrainCli, ResumeFromACorruptCheckpointIsAClearError) {
  const fs::path bad = dir_ / "bad.safetensors";
  std::ofstream(bad) << "not a checkpoint";
  CliResult r = Train(fmt::format("--steps 2 --resume {}", bad.string()));
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr(bad.string()));
}

TEST_F(TrainCli, MlpOnBlobs) {
  const fs::path m = dir_ / "mlp.jsonl";
  CliResult r = Train(fmt::format(
      "--model mlp --steps 100 --lr 0.01 --threads 1 --quiet --metrics {}", m.string()));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_GE(Lines(m).back()["accuracy"].get<double>(), 0.9);
}

}  // namespace
}  // namespace sluice
