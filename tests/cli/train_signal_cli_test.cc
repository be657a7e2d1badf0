// `sluice train` stopped by a signal, as Ctrl-C or a batch scheduler's SIGTERM stops it: the first
// signal finishes the step, saves a checkpoint (to --save, or beside the metrics under a name that
// says so), prints where and exits 128 + signal; the checkpoint resumes bitwise; a second signal
// ends the process at once. Waits are bounded (a process that does not end is killed and the test
// fails); nothing depends on how fast a step runs.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
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

// Small, one thread, a constant rate (so a run's first N losses do not depend on --steps).
constexpr const char* kCommon =
    "--layers 1 --dim 16 --heads 2 --batch 8 --threads 1 --eval-every 0 --quiet "
    "--lr-schedule constant --warmup 0";
// More steps than any machine runs before the signal comes.
constexpr int64_t kManySteps = 100000000;

class TrainSignalCli : public CliTest {
 protected:
  void TearDown() override {
    if (pid_ > 0) {  // a failed test's process: never left running
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    CliTest::TearDown();
  }

  // Starts `sluice train ARGS` in the background, stderr to `err` (dir_/stderr.txt by default).
  void Start(const std::string& args, std::optional<fs::path> err = std::nullopt) {
    const std::string cmd =
        fmt::format("exec '{}' train {} > '{}' 2> '{}'", binary_, args,
                    (dir_ / "stdout.txt").string(), err.value_or(err_path()).string());
    pid_ = ::fork();
    ASSERT_GE(pid_, 0);
    if (pid_ == 0) {
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }

  fs::path err_path() const { return dir_ / "stderr.txt"; }

  // Waits (at most two minutes) until `metrics` holds a complete line: a step has run.
  void AwaitFirstStep(const fs::path& metrics) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
    while (std::chrono::steady_clock::now() < deadline) {
      if (ReadFile(metrics).find('\n') != std::string::npos) return;
      int status = 0;
      ASSERT_EQ(::waitpid(pid_, &status, WNOHANG), 0)
          << "sluice train ended before its first step: " << ReadFile(err_path());
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    FAIL() << "no metrics line within two minutes";
  }

  // The raw wait status of the background process; kills it (and fails) after two minutes.
  int Wait() {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
    int status = 0;
    while (::waitpid(pid_, &status, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > deadline) {
        ADD_FAILURE() << "sluice train did not end within two minutes of the signal";
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, &status, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    pid_ = -1;
    return status;
  }

  static std::vector<double> Losses(const fs::path& p) {
    std::vector<double> l;
    std::ifstream in(p);
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json j = nlohmann::json::parse(line);
      if (j.contains("loss") && !j.contains("summary")) l.push_back(j["loss"].get<double>());
    }
    return l;
  }

  static nlohmann::json LastLine(const fs::path& p) {
    std::ifstream in(p);
    std::string line, last;
    while (std::getline(in, line)) last = line;
    return nlohmann::json::parse(last);
  }

  // Signals a run with `extra` options after its first step; checks the exit status, the message
  // and the metrics summary, then that resuming from the checkpoint (`saved`, or the name the
  // message gives when empty) continues an uninterrupted run bit for bit.
  void StopResumeAndCompare(int signal, const std::string& extra, const std::string& save) {
    const fs::path stopped = dir_ / "stopped.jsonl", full = dir_ / "full.jsonl";
    Start(fmt::format("{} {} --steps {} --metrics '{}'{}", kCommon, extra, kManySteps,
                      stopped.string(), save.empty() ? "" : " --save '" + save + "'"));
    AwaitFirstStep(stopped);
    ASSERT_EQ(::kill(pid_, signal), 0);
    const int status = Wait();
    const std::string err = ReadFile(err_path());
    ASSERT_TRUE(WIFEXITED(status)) << err;
    EXPECT_EQ(WEXITSTATUS(status), 128 + signal) << err;

    const nlohmann::json summary = LastLine(stopped);
    ASSERT_TRUE(summary.contains("summary")) << summary.dump();
    EXPECT_EQ(summary["stopped"], signal == SIGINT ? "SIGINT" : "SIGTERM");
    const int64_t steps = summary["steps"].get<int64_t>();
    ASSERT_GE(steps, 1);
    EXPECT_EQ(Losses(stopped).size(), static_cast<size_t>(steps));
    const std::string checkpoint =
        save.empty() ? (dir_ / fmt::format("sluice-stopped-step{}.safetensors", steps)).string()
                     : save;
    EXPECT_THAT(err, HasSubstr(fmt::format("stopped by {} after step {} of {}; checkpoint saved "
                                           "to '{}'",
                                           signal == SIGINT ? "SIGINT" : "SIGTERM", steps,
                                           kManySteps, checkpoint)));
    EXPECT_THAT(err, HasSubstr("continue with --resume " + checkpoint));
    if (save.empty()) {
      EXPECT_THAT(err, HasSubstr("no --save was given: saved beside the --metrics"));
    }
    ASSERT_TRUE(fs::exists(checkpoint)) << err;

    // Two more steps from the checkpoint are those of a run that was never stopped.
    CliResult r = Sluice(fmt::format("train {} {} --steps {} --metrics '{}' --resume '{}'", kCommon,
                                     extra, steps + 2, stopped.string(), checkpoint));
    ASSERT_EQ(r.status, 0) << r.err;
    r = Sluice(fmt::format("train {} {} --steps {} --metrics '{}'", kCommon, extra, steps + 2,
                           full.string()));
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(Losses(stopped), Losses(full));
    EXPECT_EQ(Losses(full).size(), static_cast<size_t>(steps + 2));
  }

  pid_t pid_ = -1;
};

TEST_F(TrainSignalCli, SigintSavesToSaveAndResumesBitwise) {
  StopResumeAndCompare(SIGINT, "", (dir_ / "ck.safetensors").string());
}

// Without --save the state goes beside the metrics, under a name that says it was stopped.
TEST_F(TrainSignalCli, SigtermWithoutSaveSavesBesideTheMetrics) {
  StopResumeAndCompare(SIGTERM, "", "");
}

// A pipeline's stage threads stop after the same step: its checkpoint resumes bitwise.
TEST_F(TrainSignalCli, PipelineStagesStopAtTheSameStepAndResumeBitwise) {
  StopResumeAndCompare(SIGINT, "--stages 2 --microbatches 2", (dir_ / "pipe.safetensors").string());
}

// The second signal ends the process at once, killed by it, with no checkpoint. The process is
// stopped while both signals are sent, so both are pending when it continues: whichever handler
// runs first takes the graceful stop, the other is the second signal.
TEST_F(TrainSignalCli, SecondSignalStopsAtOnce) {
  const fs::path metrics = dir_ / "m.jsonl", save = dir_ / "ck.safetensors";
  Start(fmt::format("{} --steps {} --metrics '{}' --save '{}'", kCommon, kManySteps,
                    metrics.string(), save.string()));
  AwaitFirstStep(metrics);
  ASSERT_EQ(::kill(pid_, SIGSTOP), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid_, &status, WUNTRACED), pid_);
  ASSERT_TRUE(WIFSTOPPED(status));
  ASSERT_EQ(::kill(pid_, SIGINT), 0);
  ASSERT_EQ(::kill(pid_, SIGTERM), 0);
  ASSERT_EQ(::kill(pid_, SIGCONT), 0);
  status = Wait();
  const std::string err = ReadFile(err_path());
  ASSERT_TRUE(WIFSIGNALED(status)) << "exit status " << WEXITSTATUS(status) << ": " << err;
  EXPECT_TRUE(WTERMSIG(status) == SIGINT || WTERMSIG(status) == SIGTERM) << WTERMSIG(status);
  EXPECT_THAT(err, HasSubstr("second signal: stopping at once, no checkpoint"));
  EXPECT_FALSE(fs::exists(save));
}

// Nothing written to stderr arrives (it is /dev/full: every write fails with ENOSPC): the run still
// stops after the step, saves and exits 130. It was aborted by std::terminate: fmt::print threw
// on the stop message, and main's error message threw again (cli/commands.h, PrintToStderr).
// The handler's own note fails too, and the handler leaves errno as the interrupted code had it
// — POSIX asks it of every handler; ThreadSanitizer reports one that changes it ("signal handler
// spoils errno").
TEST_F(TrainSignalCli, AStderrThatTakesNothingStillStopsSavesAndExits130) {
  const fs::path metrics = dir_ / "m.jsonl", save = dir_ / "ck.safetensors";
  Start(fmt::format("{} --steps {} --metrics '{}' --save '{}'", kCommon, kManySteps,
                    metrics.string(), save.string()),
        "/dev/full");
  AwaitFirstStep(metrics);
  ASSERT_EQ(::kill(pid_, SIGINT), 0);
  const int status = Wait();
  ASSERT_TRUE(WIFEXITED(status)) << "signal " << WTERMSIG(status);
  EXPECT_EQ(WEXITSTATUS(status), 128 + SIGINT);
  EXPECT_EQ(LastLine(metrics)["stopped"], "SIGINT");
  EXPECT_TRUE(fs::exists(save));
}

}  // namespace
}  // namespace sluice
