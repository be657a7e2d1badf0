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

namespace sluice {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

struct Result {
  int status;
  std::string err;
};

class TrainCli : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* binary = std::getenv("SLUICE_BINARY");
    ASSERT_NE(binary, nullptr) << "SLUICE_BINARY must name the sluice binary (CTest sets it)";
    binary_ = binary;
    dir_ = fs::temp_directory_path() / fmt::format("sluice_train_cli_{}", ::getpid());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  Result Train(const std::string& args) {
    const fs::path err = dir_ / "stderr.txt";
    const std::string cmd = fmt::format("'{}' train {} > /dev/null 2> '{}'", binary_, args, err.string());
    const int raw = std::system(cmd.c_str());
    std::ifstream in(err);
    std::stringstream s;
    s << in.rdbuf();
    return {WIFEXITED(raw) ? WEXITSTATUS(raw) : -1, s.str()};
  }

  std::vector<nlohmann::json> Lines(const fs::path& p) {
    std::vector<nlohmann::json> out;
    std::ifstream in(p);
    for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
    return out;
  }

  std::string binary_;
  fs::path dir_;
};

TEST_F(TrainCli, TrainsWritesMetricsAndResumesBitwise) {
  const fs::path full = dir_ / "full.jsonl", first = dir_ / "first.jsonl", ckpt = dir_ / "ckpt.safetensors";
  const std::string common = "--layers 1 --dim 16 --heads 2 --batch 8 --threads 1 --eval-every 0 --quiet";
  ASSERT_EQ(Train(fmt::format("{} --steps 6 --metrics {}", common, full.string())).status, 0);
  Result r = Train(fmt::format("{} --steps 3 --metrics {} --save {}", common, first.string(), ckpt.string()));
  ASSERT_EQ(r.status, 0) << r.err;
  // Resuming appends to the metrics file and continues from step 4 with the same losses.
  r = Train(fmt::format("{} --steps 6 --metrics {} --resume {}", common, first.string(), ckpt.string()));
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

TEST_F(TrainCli, BadOptionsSayWhatToChange) {
  Result r = Train("--heads 3 --dim 16 --steps 1");
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
  EXPECT_THAT(r.err, HasSubstr("--gc must be none, sync or async"));
  r = Train("--no-such-option");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("no-such-option"));
  r = Train("--steps 0");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("--steps must be at least 1"));
}

TEST_F(TrainCli, ResumeFromACorruptCheckpointIsAClearError) {
  const fs::path bad = dir_ / "bad.safetensors";
  std::ofstream(bad) << "not a checkpoint";
  Result r = Train(fmt::format("--steps 2 --resume {}", bad.string()));
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr(bad.string()));
}

TEST_F(TrainCli, MlpOnBlobs) {
  const fs::path m = dir_ / "mlp.jsonl";
  Result r = Train(fmt::format("--model mlp --steps 100 --lr 0.01 --threads 1 --quiet --metrics {}", m.string()));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_GE(Lines(m).back()["accuracy"].get<double>(), 0.9);
}

}  // namespace
}  // namespace sluice
