// A run's side outputs never cost it the model (issue 37): a --metrics, --trace or --profile-out
// that cannot be written (/dev/full: a full disk) is reported with a non-zero exit, while training
// goes on and its --save checkpoint is written; `report --out` on a full disk (a file size limit)
// leaves a good page as it was; a run stopped by a non-finite step keeps its last finite state.
#include <filesystem>
#include <string>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cli/cli_fixture.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

constexpr const char* kSmall =
    "--layers 1 --dim 16 --heads 2 --batch 8 --threads 1 --eval-every 0 --quiet --steps 3";

class SideOutputsCli : public CliTest {};

TEST_F(SideOutputsCli, AnUnwritableTraceOrProfileOrMetricsStillSavesTheCheckpoint) {
  const struct {
    std::string option, message;
  } cases[] = {
      {"--stages 2 --microbatches 2 --trace /dev/full",
       "cannot save trace '/dev/full': write failed (No space left on device)"},
      {"--stages 2 --microbatches 2 --profile-out /dev/full",
       "cannot save --profile-out costs file '/dev/full': write failed (No space left on device)"},
      {"--metrics /dev/full",
       "cannot write metrics file '/dev/full': No space left on device; no more metrics are "
       "written"},
  };
  for (const auto& c : cases) {
    const fs::path ck = dir_ / "ck.safetensors";
    fs::remove(ck);
    const CliResult r = Sluice(fmt::format("train {} {} --save {}", kSmall, c.option, ck.string()));
    EXPECT_EQ(r.status, 1) << c.option << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr(c.message)) << c.option;
    EXPECT_THAT(r.err, HasSubstr(fmt::format(
                           "training itself went on to step 3 and its state is saved to '{}'",
                           ck.string())))
        << c.option;
    EXPECT_TRUE(fs::exists(ck)) << c.option << ": the checkpoint was lost";
    EXPECT_THAT(r.err, ::testing::Not(HasSubstr("internal error")));
  }
}

// A full disk under `report --out` (here a file size limit of 512 bytes; the page is larger):
// the good report already there is kept whole, and no temporary is left.
TEST_F(SideOutputsCli, AReportThatCannotBeWrittenKeepsTheGoodOne) {
  const fs::path metrics = dir_ / "m.jsonl", page = dir_ / "r.html";
  ASSERT_EQ(Sluice(fmt::format("train {} --metrics {}", kSmall, metrics.string())).status, 0);
  const std::string good = "<html>a good report</html>\n";
  Write("r.html", good);
  const CliResult r = Sluice(fmt::format("report {} --out {}", metrics.string(), page.string()),
                             "trap '' XFSZ; ulimit -f 1;");
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_THAT(r.err,
              HasSubstr(fmt::format("cannot save report '{}': write failed", page.string())));
  EXPECT_EQ(ReadFile(page), good);
  for (const auto& entry : fs::directory_iterator(dir_)) {
    EXPECT_THAT(entry.path().filename().string(), ::testing::Not(HasSubstr(".tmp-")));
  }
}

// Regression: a run stopped at a non-finite loss saved nothing of its finite steps.
TEST_F(SideOutputsCli, ANonFiniteStopKeepsTheLastFiniteState) {
  const fs::path ck = dir_ / "ck.safetensors";
  const fs::path kept = dir_ / "ck.safetensors.last-finite-step1.safetensors";
  const CliResult r = Sluice(
      fmt::format("train {} --lr 1e30 --lr-schedule constant --save {}", kSmall, ck.string()));
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("step 2: the loss is"));
  EXPECT_THAT(r.err, HasSubstr(fmt::format(
                         "the last finite state (step 1) is saved to '{}': resume from it with "
                         "--resume {}",
                         kept.string(), kept.string())));
  EXPECT_FALSE(fs::exists(ck)) << "a diverged run wrote its --save checkpoint";
  ASSERT_TRUE(fs::exists(kept));
  // It is a checkpoint of step 1.
  const CliResult resumed = Sluice(fmt::format("train {} --steps 1 --resume {}",
                                               "--layers 1 --dim 16 --heads 2 "
                                               "--batch 8 --threads 1 --quiet",
                                               kept.string()));
  EXPECT_THAT(resumed.err, HasSubstr("is at step 1, at or past --steps 1"));
}

}  // namespace
}  // namespace sluice
