// Standard input, output and error that fail or are missing, against the built binary: a stdout
// that takes nothing (/dev/full) is an error naming standard output; a reader that went away ends
// a command quietly, as it ends other Unix tools, but not a training run; descriptors 0 to 2
// closed at start never make a file sluice opens receive its messages (docs/errors.md).
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <filesystem>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cli/cli_fixture.h"
#include "sluice/io/safetensors.h"

extern char** environ;

namespace sluice {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

constexpr const char* kTinyTrain =
    "train --layers 1 --dim 16 --heads 2 --batch 4 --threads 1 --eval-every 0 --eval-batches 1";

class StandardStreamsCli : public CliTest {
 protected:
  // Runs `bash -c script` with `{sluice}` in it replaced by the binary; returns the exit status
  // (-1 when a signal ended it).
  int Bash(const std::string& script) {
    std::string text = script;
    for (size_t at; (at = text.find("{sluice}")) != std::string::npos;) {
      text.replace(at, 8, "'" + binary_ + "'");
    }
    const std::string cmd = fmt::format("bash -c \"{}\"", text);
    const int raw = std::system(cmd.c_str());
    return WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
  }

  struct Ended {
    int exit_status = -1;  // -1: ended by a signal
    int signal = 0;
    std::string err;
  };
  // Runs `sluice args` with its stdout (and, with `stderr_too`, its stderr) on a pipe whose read
  // end is already closed: every write there fails at once (SIGPIPE, or EPIPE while SIGPIPE is
  // ignored), with no race against a reader. SIGPIPE is at its default or, with `ignore_sigpipe`,
  // ignored (inherited through exec, as a parent that ignores it passes it on).
  Ended WithReaderGone(const std::vector<std::string>& args, bool stderr_too, bool ignore_sigpipe) {
    int fds[2];
    EXPECT_EQ(::pipe(fds), 0);
    ::close(fds[0]);
    const fs::path err = dir_ / "stderr.txt";
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
    if (stderr_too) {
      posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
    } else {
      posix_spawn_file_actions_addopen(&actions, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                       0644);
    }
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t defaults;
    sigemptyset(&defaults);
    if (!ignore_sigpipe) sigaddset(&defaults, SIGPIPE);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGDEF);
    std::vector<std::string> argv_text = {binary_};
    argv_text.insert(argv_text.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& a : argv_text) argv.push_back(a.data());
    argv.push_back(nullptr);
    struct sigaction ignore {
    }, previous{};
    ignore.sa_handler = SIG_IGN;
    if (ignore_sigpipe) ::sigaction(SIGPIPE, &ignore, &previous);
    pid_t pid = 0;
    const int spawned = posix_spawn(&pid, binary_.c_str(), &actions, &attr, argv.data(), environ);
    if (ignore_sigpipe) ::sigaction(SIGPIPE, &previous, nullptr);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    ::close(fds[1]);
    EXPECT_EQ(spawned, 0);
    int raw = 0;
    EXPECT_EQ(::waitpid(pid, &raw, 0), pid);
    Ended e;
    if (WIFEXITED(raw)) e.exit_status = WEXITSTATUS(raw);
    if (WIFSIGNALED(raw)) e.signal = WTERMSIG(raw);
    if (!stderr_too) e.err = ReadFile(err);
    return e;
  }

  // A trained checkpoint and its metrics, for the commands that read them.
  void TrainSomething() {
    const CliResult r =
        Sluice(fmt::format("{} --steps 2 --quiet --save {} --metrics {}", kTinyTrain,
                           (dir_ / "ck.safetensors").string(), (dir_ / "m.jsonl").string()));
    ASSERT_EQ(r.status, 0) << r.err;
  }
};

// Every command that prints on stdout, with a stdout that takes nothing: before, `ops` ended as
// "internal error: cannot write to file" (exit 2) and `plan`, whose output stayed in the buffer
// until exit, lost it and exited 0.
TEST_F(StandardStreamsCli, AStdoutThatTakesNothingIsAnErrorNamingIt) {
  TrainSomething();
  const std::string source = std::getenv("SLUICE_SOURCE_DIR");
  const std::vector<std::string> commands = {
      "ops",
      "plan --layers 1",
      "plan --layers 1 --format json",
      "simulate --stages 2 --microbatches 2 --layers 2",
      "schedule -p 2 -m 4",
      fmt::format("run {}/examples/mlp.sluice", source),
      fmt::format("export --model mlp --out {}", (dir_ / "e.sluice").string()),
      fmt::format("report {} --out {}", (dir_ / "m.jsonl").string(), (dir_ / "r.html").string()),
      fmt::format("sample --checkpoint {} --prompt 315402", (dir_ / "ck.safetensors").string()),
      "--help",
      "--version",
  };
  for (const std::string& command : commands) {
    const fs::path err = dir_ / "err.txt";
    const int status =
        Bash(fmt::format("{{sluice}} {} > /dev/full 2> '{}'", command, err.string()));
    const std::string text = ReadFile(err);
    EXPECT_EQ(status, 1) << command << "\n" << text;
    EXPECT_THAT(text, HasSubstr("sluice: error: cannot write to standard output (No space left "
                                "on device): what was printed there is incomplete"))
        << command;
    EXPECT_THAT(text, Not(HasSubstr("internal error"))) << command;
  }
}

// A reader that went away (`sluice ops | head -1`): by default SIGPIPE ends the command, as it
// ends cat; with SIGPIPE ignored, the EPIPE ends it quietly with status 141 (128 + SIGPIPE), not
// "internal error" (exit 2) or a message about a reader nobody is left to tell.
TEST_F(StandardStreamsCli, AReaderThatWentAwayEndsACommandQuietly) {
  const std::vector<std::vector<std::string>> commands = {
      {"ops"}, {"plan", "--layers", "1"}, {"schedule", "-p", "8", "-m", "64", "--format", "json"}};
  for (const auto& command : commands) {
    const std::string name = fmt::format("{}", fmt::join(command, " "));
    const Ended by_default = WithReaderGone(command, /*stderr_too=*/false, false);
    EXPECT_EQ(by_default.signal, SIGPIPE) << name << "\n" << by_default.err;
    EXPECT_EQ(by_default.err, "") << name;
    const Ended ignored = WithReaderGone(command, /*stderr_too=*/false, true);
    EXPECT_EQ(ignored.exit_status, 128 + SIGPIPE) << name << "\n" << ignored.err;
    EXPECT_EQ(ignored.err, "") << name;
  }
}

// `sluice train 2>&1 | head -3`, the reader gone: the progress lines are lost, the run is not —
// SIGPIPE's default action ended it at its first line, its checkpoint never written.
TEST_F(StandardStreamsCli, TrainingOutlivesAReaderThatWentAway) {
  const fs::path ck = dir_ / "ck.safetensors";
  const Ended e =
      WithReaderGone({"train", "--layers", "1", "--dim", "16", "--heads", "2", "--batch", "4",
                      "--threads", "1", "--steps", "3", "--save", ck.string()},
                     /*stderr_too=*/true, /*ignore_sigpipe=*/false);
  EXPECT_EQ(e.signal, 0);
  EXPECT_EQ(e.exit_status, 0);
  ASSERT_TRUE(fs::exists(ck));
  EXPECT_EQ(ReadSafetensors(ck.string()).metadata.at("step"), "3");
}

// Started with stderr closed (`2>&-`), the metrics file took descriptor 2 and the progress lines
// were written into it between its JSON lines; they go to /dev/null instead.
TEST_F(StandardStreamsCli, ClosedStandardDescriptorsNeverReceiveMessages) {
  const fs::path ck = dir_ / "ck.safetensors", metrics = dir_ / "m.jsonl";
  ASSERT_EQ(Bash(fmt::format("{{sluice}} {} --steps 3 --save '{}' --metrics '{}' 2>&-", kTinyTrain,
                             ck.string(), metrics.string())),
            0);
  const std::vector<nlohmann::json> lines = Lines(metrics);  // throws on a line that is not JSON
  EXPECT_GE(lines.size(), 3u);
  EXPECT_EQ(ReadSafetensors(ck.string()).metadata.at("step"), "3");
}

// SLUICE_VERBOSE's debug line on a stderr that takes nothing: fmt::print threw, and the run ended
// as "internal error" (exit 2) before its first step.
TEST_F(StandardStreamsCli, AVerboseLineOnAFullStderrIsLostNotTheRun) {
  const fs::path ck = dir_ / "ck.safetensors";
  ASSERT_EQ(Bash(fmt::format("SLUICE_VERBOSE=1 {{sluice}} {} --steps 2 --save '{}' 2>/dev/full",
                             kTinyTrain, ck.string())),
            0);
  EXPECT_TRUE(fs::exists(ck));
}

}  // namespace
}  // namespace sluice
