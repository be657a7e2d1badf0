// Pins the whole output of `sluice schedule`, `simulate` and `plan` for small jobs of every
// schedule kind — grids, action lists, predicted times and bubbles, every stage's forecast peak,
// its breakdown and where it falls — so that work on their speed and memory at scale cannot change
// a character of what they print at small sizes. tests/cli/data/pinned_commands.txt lists the
// commands; tests/cli/data/pinned_outputs.txt holds their outputs ("$ " before each command).
// A change meant to alter these outputs regenerates the file with SLUICE_UPDATE_PINS=1 set while
// this test runs, and its commit says why they changed.
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cli/cli_fixture.h"
#include "source_dir.h"

namespace sluice {
namespace {

class PinnedOutputs : public CliTest {};

// What a command prints, as the pinned file holds it.
std::string Transcript(const std::string& command, const CliResult& r) {
  std::string out = fmt::format("$ {}\n{}", command, r.out);
  if (r.status != 0 || !r.err.empty()) out += fmt::format("[exit {}] {}", r.status, r.err);
  return out;
}

TEST_F(PinnedOutputs, SmallJobsPrintWhatTheyPrinted) {
  const std::filesystem::path data = testing_support::SourceDir() / "tests" / "cli" / "data";
  std::ifstream commands(data / "pinned_commands.txt");
  ASSERT_TRUE(commands) << "cannot read " << (data / "pinned_commands.txt");
  std::string actual;
  std::vector<std::string> transcripts;
  for (std::string line; std::getline(commands, line);) {
    if (line.empty()) continue;
    transcripts.push_back(Transcript(line, Sluice(line)));
    actual += transcripts.back();
  }
  const std::filesystem::path pinned = data / "pinned_outputs.txt";
  if (std::getenv("SLUICE_UPDATE_PINS") != nullptr) {
    std::ofstream(pinned) << actual;
    GTEST_SKIP() << "rewrote " << pinned;
  }
  const std::string expected = ReadFile(pinned);
  ASSERT_FALSE(expected.empty()) << "cannot read " << pinned;
  // Command by command, so a failure names the command whose output changed.
  size_t at = 0;
  for (const std::string& t : transcripts) {
    const std::string want = expected.substr(at, t.size());
    EXPECT_EQ(t, want);
    if (t != want) break;
    at += t.size();
  }
  EXPECT_EQ(actual.size(), expected.size());
}

}  // namespace
}  // namespace sluice
