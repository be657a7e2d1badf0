// Hostile program text against the built binary, as a user who edits an example by hand (or a
// disk that damages one) would run it: every line prefix of each program in examples/, and
// mutations of each (bytes flipped, spans deleted or copied, tokens of the format inserted,
// numbers replaced by huge, negative and zero ones, the file cut short) drawn with a fixed seed.
// Each run must end in success or in `sluice: error: ` with exit status 1 — never "internal
// error", a signal, a sanitizer report (the suite runs under ASan and UBSan too, make test-asan)
// or a hang. fuzz/parser_fuzz.cc fuzzes the parser alone with libFuzzer; this test sends the
// text through all of `sluice run` (verifier, planner, kernels) and `sluice train --program`
// (autodiff, the optimizer, the memory check). The inputs that fail are kept in the report.
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "cli/cli_fixture.h"
#include "source_dir.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;

std::vector<fs::path> ExamplePrograms() {
  std::vector<fs::path> out;
  for (const auto& entry : fs::directory_iterator(testing_support::SourceDir() / "examples"))
    if (entry.path().extension() == ".sluice") out.push_back(entry.path());
  std::sort(out.begin(), out.end());
  return out;
}

std::string Slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// One to four edits of `text`, drawn from `rng`.
std::string Mutate(std::string text, std::mt19937_64& rng) {
  static const std::vector<std::string> kTokens = {"f32",
                                                   "i64",
                                                   "f64",
                                                   "bf16",
                                                   "[",
                                                   "]",
                                                   "(",
                                                   ")",
                                                   ",",
                                                   "{",
                                                   "}",
                                                   "=",
                                                   "%x",
                                                   "%loss",
                                                   "B",
                                                   "T",
                                                   "output",
                                                   "param",
                                                   "input",
                                                   "unit",
                                                   "const",
                                                   "program",
                                                   "loaded",
                                                   "\n",
                                                   "#",
                                                   "\xff\xfe",
                                                   "1e308",
                                                   "nan",
                                                   "matmul",
                                                   "reshape",
                                                   "{transpose_b = true}",
                                                   "= normal(0, -1)"};
  static const std::vector<std::string> kNumbers = {"0",
                                                    "-3",
                                                    "1",
                                                    "65536",
                                                    "3037000500",
                                                    "4611686018427387904",
                                                    "9223372036854775807",
                                                    "99999999999999999999",
                                                    "1099511627776"};
  auto below = [&rng](size_t n) { return static_cast<size_t>(rng() % std::max<size_t>(n, 1)); };
  const size_t edits = 1 + below(4);
  for (size_t e = 0; e < edits && !text.empty(); ++e) {
    const size_t at = below(text.size());
    switch (below(6)) {
      case 0:  // a byte flipped
        text[at] = static_cast<char>(rng() & 0xff);
        break;
      case 1:  // a span deleted
        text.erase(at, 1 + below(20));
        break;
      case 2:  // a token of the format inserted
        text.insert(at, kTokens[below(kTokens.size())]);
        break;
      case 3: {  // the next number replaced
        size_t begin = at;
        while (begin < text.size() && (text[begin] < '0' || text[begin] > '9')) ++begin;
        size_t end = begin;
        while (end < text.size() && text[end] >= '0' && text[end] <= '9') ++end;
        text.replace(begin, end - begin, kNumbers[below(kNumbers.size())]);
        break;
      }
      case 4:  // cut short
        text.resize(at);
        break;
      default:  // a span copied elsewhere
        text.insert(at, text.substr(below(text.size()), 1 + below(40)));
        break;
    }
  }
  return text;
}

class ProgramFuzzCli : public CliTest {
 protected:
  // Runs `sluice ARGS` (ARGS naming the program written from `text`): a clean result or a clean
  // error, else a failure that shows the text.
  void ExpectClean(const std::string& text, const std::string& args, const std::string& what) {
    const fs::path program = Write("p.sluice", text);
    // timeout: a hang is a failure, not a stuck suite (124 is its status).
    const CliResult r = Sluice(args + " " + program.string(), "timeout 60");
    const bool clean_error = r.status == 1 && r.err.find("sluice: error: ") != std::string::npos;
    const bool reported = r.err.find("internal error") != std::string::npos ||
                          r.err.find("Sanitizer") != std::string::npos ||
                          r.err.find("runtime error:") != std::string::npos;
    EXPECT_TRUE((r.status == 0 || clean_error) && !reported)
        << what << ": `sluice " << args << "` ended with status " << r.status << "\n--- stderr:\n"
        << r.err << "--- program:\n"
        << text;
    ++runs_;
  }
  int runs_ = 0;
};

constexpr const char* kRun = "run --size B=4 --size T=8";
constexpr const char* kTrain =
    "train --data sort --steps 1 --batch 4 --threads 1 --eval-every 0 --quiet --program";

TEST_F(ProgramFuzzCli, LinePrefixesOfTheExamplesAreACleanResult) {
  // Every fourth line prefix (every one took 35 s): a file cut at a line, as a full disk leaves it.
  for (const fs::path& example : ExamplePrograms()) {
    const std::string text = Slurp(example);
    int line = 0;
    for (size_t end = text.find('\n'); end != std::string::npos; end = text.find('\n', end + 1))
      if (++line % 4 == 1)
        ExpectClean(text.substr(0, end + 1), kRun,
                    fmt::format("{} up to line {}", example.filename().string(), line));
  }
  EXPECT_GT(runs_, 50);
}

TEST_F(ProgramFuzzCli, MutatedExamplesRunAndTrainToACleanResult) {
  constexpr int kMutations = 6;
  std::mt19937_64 rng(20261205);
  for (const fs::path& example : ExamplePrograms()) {
    const std::string text = Slurp(example);
    for (int m = 0; m < kMutations; ++m) {
      const std::string mutated = Mutate(text, rng);
      const std::string what = fmt::format("{}, mutation {}", example.filename().string(), m);
      ExpectClean(mutated, kRun, what);
      ExpectClean(mutated, kTrain, what);
    }
  }
  EXPECT_GE(runs_, 2 * kMutations * 8);
}

}  // namespace
}  // namespace sluice
