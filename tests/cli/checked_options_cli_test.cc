// Every value checked or explained (the issue "Nothing lost"): a --resume that changes the run's
// hyperparameters is refused naming each (or, with --allow-changes, warned about); options that
// contradict each other are errors; integers past 64 bits are errors, not clamps; `plan` and
// `simulate` refuse the options only training reads. Each case was accepted without a word before.
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>

#include "cli/cli_fixture.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

// Without --batch, which one case changes: Checkpoint gives 4.
constexpr const char* kTiny =
    "--layers 1 --dim 16 --heads 2 --threads 1 --eval-every 0 --eval-batches 1 --quiet";

class CheckedOptionsCli : public CliTest {
 protected:
  // A checkpoint after 1 step of the tiny model, trained with `args`.
  std::string Checkpoint(const std::string& args = "") {
    const std::string ck = (dir_ / "ck.safetensors").string();
    const CliResult r =
        Sluice(fmt::format("train {} --batch 4 --steps 1 --save {} {}", kTiny, ck, args));
    EXPECT_EQ(r.status, 0) << r.err;
    return ck;
  }
};

TEST_F(CheckedOptionsCli, ResumeRefusesChangedHyperparametersNamingEach) {
  const std::string ck = Checkpoint("--lr 0.002 --clip 1");
  struct Change {
    std::string args, message;
  };
  const std::vector<Change> changes = {
      {"--batch 4 --lr 0.01 --clip 1", "--lr 0.002 (this run: 0.01)"},
      {"--lr 0.002 --clip 1 --batch 8", "--batch 4 (this run: 8)"},
      {"--batch 4 --lr 0.002 --clip 1 --beta1 0.8", "--beta1 0.9 (this run: 0.8)"},
      {"--batch 4 --lr 0.002 --clip 1 --lr-schedule constant",
       "--lr-schedule cosine (this run: constant)"},
      {"--batch 4 --lr 0.002 --clip 1 --warmup 7", "--warmup 50 (this run: 7)"},
      {"--batch 4 --lr 0.002", "--clip 1.0 (this run: 0.0)"},
      {"--batch 4 --lr 0.002 --clip 1 --weight-decay 0.5", "--weight-decay 0.0 (this run: 0.5)"},
  };
  for (const Change& c : changes) {
    const std::string err =
        Refused(fmt::format("train {} --steps 2 --resume {} {}", kTiny, ck, c.args));
    EXPECT_THAT(err, HasSubstr(c.message)) << c.args;
    EXPECT_THAT(err, HasSubstr("add --allow-changes to go on with this run's")) << c.args;
  }
  // Two changes are named together (in the order of their names).
  EXPECT_THAT(Refused(fmt::format("train {} --batch 4 --steps 2 --resume {} --lr 0.01", kTiny, ck)),
              HasSubstr("--clip 1.0 (this run: 0.0), --lr 0.002 (this run: 0.01)"));
  // --allow-changes goes on, with a warning per change (printed under --quiet too).
  CliResult r = Sluice(fmt::format(
      "train {} --batch 4 --steps 2 --resume {} --lr 0.01 --clip 1 --allow-changes", kTiny, ck));
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("sluice: warning: checkpoint '" + ck +
                               "' was trained with --lr 0.002 (this run: 0.01); training goes on "
                               "with this run's (--allow-changes)"));
  // The same values resume without a word; --steps may change.
  r = Sluice(
      fmt::format("train {} --batch 4 --steps 3 --resume {} --lr 0.002 --clip 1", kTiny, ck));
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, Not(HasSubstr("warning")));
  EXPECT_THAT(Refused(fmt::format("train {} --steps 2 --allow-changes", kTiny)),
              HasSubstr("--allow-changes lets a --resume change"));
}

TEST_F(CheckedOptionsCli, ConflictingOptionsAreErrors) {
  const std::string ck = Checkpoint();
  EXPECT_THAT(Refused(fmt::format("train {} --steps 2 --resume {} --init-from {}", kTiny, ck, ck)),
              HasSubstr("--resume " + ck +
                        " continues a run with its own weights, which "
                        "--init-from " +
                        ck + " would replace"));
  EXPECT_THAT(Refused(fmt::format("train {} --steps 1 --recompute full --no-recompute", kTiny)),
              HasSubstr("--recompute full and --no-recompute (--recompute none) choose two "
                        "policies: give one"));
}

TEST_F(CheckedOptionsCli, IntegersPastSixtyFourBitsAreRefusedNotClamped) {
  for (const char* option : {"--steps", "--warmup", "--eval-every", "--save-every",
                             "--skip-nonfinite", "--microbatches", "--batch", "--vocab"}) {
    for (const char* value : {"99999999999999999999", "-99999999999999999999"}) {
      const CliResult r = Sluice(fmt::format("train {} {} {}", kTiny, option, value));
      EXPECT_EQ(r.status, static_cast<int>(CLI::ExitCodes::ValidationError)) << option << r.err;
      EXPECT_THAT(r.err, HasSubstr(fmt::format("'{}' is out of range: an integer from "
                                               "-9223372036854775808 to 9223372036854775807",
                                               value)))
          << option;
    }
  }
  // 2^63 - 1 itself is a value: refused by the check of that option, not as out of range.
  EXPECT_THAT(Refused(fmt::format("train {} --seq 9223372036854775807", kTiny)),
              HasSubstr("--seq must be 0 (the data's) to 16384"));
}

TEST_F(CheckedOptionsCli, CommTimeoutBelowAMillisecondIsRefusedAsZeroIs) {
  for (const char* t : {"0", "1e-9", "0.0009", "-1", "nan"}) {
    EXPECT_THAT(Refused(fmt::format("train {} --steps 1 --stages 2 --comm-timeout {}", kTiny, t)),
                HasSubstr("--comm-timeout must be at least 0.001 s (1 ms"))
        << t;
  }
}

TEST_F(CheckedOptionsCli, ForecastsRefuseTheOptionsOnlyTrainingReads) {
  const std::string ck = Checkpoint();
  const std::string out = (dir_ / "out").string();
  const std::vector<std::string> unused = {
      "--save " + out,         "--save-every 2",  "--metrics " + out,  "--trace " + out,
      "--profile-out " + out,  "--resume " + ck,  "--init-from " + ck, "--inject-fault throw:0:F:0",
      "--inject-compute-ms 1", "--allow-changes", "--no-memory-check"};
  for (const char* command : {"plan", "simulate"}) {
    for (const std::string& option : unused) {
      const std::string name = option.substr(0, option.find(' '));
      const std::string err =
          Refused(fmt::format("{} --layers 2 --stages 2 --dim 16 --heads 2 {}", command, option));
      EXPECT_THAT(err, HasSubstr(fmt::format("{}: sluice {} trains nothing, so", name, command)))
          << option;
      EXPECT_THAT(err, HasSubstr("drop " + name)) << option;
    }
    // What a forecast reads still works, and so do the options that describe the run.
    const CliResult r = Sluice(fmt::format(
        "{} --layers 2 --stages 2 --dim 16 --heads 2 --steps 9 --eval-every 3 --skip-nonfinite 1",
        command));
    EXPECT_EQ(r.status, 0) << command << r.err;
  }
}

}  // namespace
}  // namespace sluice
