// `sluice run` as a user runs it: the built binary (SLUICE_BINARY, set by CTest) on program files,
// checking the JSON statistics, identical outputs in every mode, --inputs, --trace, the readable
// summary, --verbose, and clear non-zero exits for malformed programs and bad options.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli/cli_fixture.h"
#include "exec/test_programs.h"
#include "sluice/io/safetensors.h"
#include "sluice/ir/text_format.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::json;
namespace fs = std::filesystem;

using Result = CliResult;

class RunCli : public CliTest {
 protected:
  Json StatsJson(const std::string& args) {
    Result r = Sluice("run " + args + " --stats-json");
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(std::count(r.out.begin(), r.out.end(), '\n'), 1) << "one JSON object on one line:\n"
                                                               << r.out;
    return Json::parse(r.out);
  }
};

constexpr const char* kTriple = R"(program triple {
  input %x: f32[3]
  %y: f32[3] = add(%x, %x)
  %z: f32[3] = add(%y, %x)
  output %z
}
)";

TEST_F(RunCli, StatsJsonHasEveryFieldAndSyncReachesTheBound) {
  const fs::path program = Write("branchy.sluice", PrintProgram(testing::BranchyProgram()));
  Json j = StatsJson(program.string() + " --runs 3");
  for (const char* key :
       {"instructions", "runs", "wall_ns_median", "peak_allocated_bytes", "peak_reserved_bytes",
        "liveness_lower_bound_bytes", "gc_mode", "run_mode", "gc_thread_ns_per_run",
        "frees_per_run", "async_pending_peak_bytes", "outputs"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["instructions"], testing::BranchyProgram().instructions().size());
  EXPECT_EQ(j["runs"], 3);
  EXPECT_EQ(j["gc_mode"], "auto (sync)");  // the default, on the default (caching) allocator
  EXPECT_EQ(j["run_mode"], "trace");
  EXPECT_GT(j["liveness_lower_bound_bytes"].get<int64_t>(), 0);
  EXPECT_EQ(j["peak_allocated_bytes"], j["liveness_lower_bound_bytes"]);
  // A SystemAllocator's free of a large block is a munmap: the default hands frees to the worker.
  EXPECT_EQ(StatsJson(program.string() + " --allocator system")["gc_mode"], "auto (async)");
}

TEST_F(RunCli, EveryModeGivesTheSameOutputs) {
  const fs::path program = Write("branchy.sluice", PrintProgram(testing::BranchyProgram()));
  Json reference;
  for (const char* mode : {"trace", "parallel"}) {
    for (const char* gc : {"none", "sync", "async"}) {
      Json j = StatsJson(
          fmt::format("{} --mode {} --gc {} --threads 3 --seed 7", program.string(), mode, gc));
      EXPECT_EQ(j["gc_mode"], gc);
      EXPECT_EQ(j["run_mode"], mode);
      if (reference.is_null()) reference = j["outputs"];
      EXPECT_EQ(j["outputs"], reference) << mode << " " << gc;
      if (std::string(gc) == "none") {
        EXPECT_GE(j["peak_allocated_bytes"].get<int64_t>(),
                  j["liveness_lower_bound_bytes"].get<int64_t>());
      }
    }
  }
  for (const char* gc : {"none", "sync", "async"}) {
    Json j = StatsJson(
        fmt::format("{} --memory-plan static --gc {} --seed 7 --runs 2", program.string(), gc));
    EXPECT_EQ(j["memory_plan"], "static");
    EXPECT_GT(j["arena_bytes"].get<int64_t>(), 0);
    EXPECT_EQ(j["outputs"], reference) << "static " << gc;
  }
  Json other_seed = StatsJson(program.string() + " --seed 8");
  EXPECT_NE(other_seed["outputs"], reference);
  EXPECT_EQ(other_seed["memory_plan"], "dynamic");
  EXPECT_EQ(other_seed["arena_bytes"], 0);
}

TEST_F(RunCli, InputsComeFromASafetensorsFile) {
  const fs::path program = Write("triple.sluice", kTriple);
  const fs::path inputs = dir_ / "x.safetensors";
  WriteSafetensors(inputs.string(), {{"x", Tensor::FromVector<float>({3}, {1, 2, 3})}});
  Json j = StatsJson(fmt::format("{} --inputs {}", program.string(), inputs.string()));
  EXPECT_EQ(j["outputs"]["z"]["first"], Json::parse("[3.0, 6.0, 9.0]"));
  EXPECT_EQ(j["outputs"]["z"]["type"], "f32[3]");

  WriteSafetensors(inputs.string(), {{"nope", Tensor::Zeros({3}, DType::kF32)}});
  Result r = Sluice(fmt::format("run {} --inputs {}", program.string(), inputs.string()));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("tensor 'nope' is not an input or parameter of program 'triple'"));

  WriteSafetensors(inputs.string(), {{"x", Tensor::Zeros({4}, DType::kF32)}});
  r = Sluice(fmt::format("run {} --inputs {}", program.string(), inputs.string()));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("%x must be f32[3]"));
}

TEST_F(RunCli, TraceIsAChromeTraceOfTheLastRun) {
  const fs::path program = Write("triple.sluice", kTriple);
  const fs::path trace = dir_ / "trace.json";
  Result r = Sluice(
      fmt::format("run {} --gc async --runs 2 --trace {}", program.string(), trace.string()));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("trace:"));
  Json j = Json::parse(ReadFile(trace));
  int spans = 0, counters = 0;
  for (const Json& e : j["traceEvents"]) {
    spans += e["ph"] == "X" && e["cat"] == "instruction";
    counters += e["ph"] == "C";
  }
  EXPECT_EQ(spans, 2);
  EXPECT_GT(counters, 0);
}

TEST_F(RunCli, ReadableSummaryAndVerbosePlan) {
  const fs::path program = Write("triple.sluice", kTriple);
  Result r = Sluice("run " + program.string());
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("program 'triple'"));
  // z = add(y, x) is y's last reader: z is written over y, one 12-byte buffer.
  EXPECT_THAT(r.out, HasSubstr("liveness lower bound 12 B"));
  EXPECT_THAT(r.out, HasSubstr("output %z = Tensor(f32[3]"));
  EXPECT_EQ(r.err, "");

  r = Sluice("run " + program.string() + " --verbose");
  EXPECT_THAT(r.err, HasSubstr("%z = add(%y, %x) [in place of %y]  →  %y (handed to %z)"));
  r = Sluice("run " + program.string() + " --verbose --no-in-place");
  EXPECT_THAT(r.err, HasSubstr("%z = add(%y, %x)  →  %y (12 B)"));
  r = Sluice("run " + program.string() + " --no-in-place", "SLUICE_VERBOSE=1");
  EXPECT_THAT(r.err, HasSubstr("liveness lower bound: 24 B"));
}

TEST_F(RunCli, MalformedProgramsAndBadOptionsFailClearly) {
  const fs::path bad =
      Write("bad.sluice", "program p {\n  input %x: f32[3]\n  %y: f32[4] = add(%x, %x)\n}\n");
  Result r = Sluice("run " + bad.string());
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr(bad.string() + ":3:"));

  r = Sluice("run " + (dir_ / "missing.sluice").string());
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("missing.sluice"));

  const fs::path program = Write("triple.sluice", kTriple);
  for (const char* option : {"--gc eager", "--mode fast", "--runs 0", "--threads -2",
                             "--order random", "--memory-plan arena"}) {
    r = Sluice(fmt::format("run {} {}", program.string(), option));
    EXPECT_NE(r.status, 0) << option;
    EXPECT_THAT(r.err, HasSubstr(std::string(option).substr(0, std::string(option).find(' '))))
        << option;
  }
  r = Sluice(fmt::format("run {} --memory-plan static --mode parallel", program.string()));
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("memory plan static needs run mode trace"));
}

// Regression: a --size past int64 (std::from_chars out of range, the value left at 0) ran the
// program at size 0: `--size B=99999999999999999999999` reported "there are no tokens".
TEST_F(RunCli, ASizePastInt64IsRefusedNotTakenForZero) {
  const fs::path program = Write("scaled.sluice", R"(program scaled {
  input %x: f32[B, 3]
  %y: f32[B, 3] = add(%x, %x)
  output %y
}
)");
  for (const char* value : {"99999999999999999999999", "18446744073709551615"}) {
    const Result r = Sluice(fmt::format("run {} --size B={}", program.string(), value));
    EXPECT_EQ(r.status, 1) << value << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr(fmt::format("sluice: error: --size 'B={}': expected NAME=VALUE "
                                             "with a non-negative integer",
                                             value)));
    EXPECT_THAT(r.err, HasSubstr("at most 9223372036854775807")) << r.err;
  }
  EXPECT_EQ(Sluice(fmt::format("run {} --size B=2", program.string())).status, 0);
}

// Regression: `run --size Q=3` for a size the program never names was silently ignored.
TEST_F(RunCli, ASizeTheProgramNeverNamesIsRefused) {
  const fs::path program = Write("scaled.sluice", R"(program scaled {
  input %x: f32[B, 3]
  %y: f32[B, 3] = add(%x, %x)
  output %y
}
)");
  Result r = Sluice(fmt::format("run {} --size B=2 --size Q=3", program.string()));
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr(fmt::format("sluice: error: --size Q=3: {} names no size Q (its "
                                           "sizes: B)",
                                           program.string())));
  const fs::path fixed = Write("fixed.sluice", R"(program fixed {
  input %x: f32[2, 3]
  %y: f32[2, 3] = add(%x, %x)
  output %y
}
)");
  r = Sluice(fmt::format("run {} --size B=2", fixed.string()));
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr("names no size B (it names no sizes)"));
  EXPECT_EQ(Sluice(fmt::format("run {} --size B=2", program.string())).status, 0);
}

}  // namespace
}  // namespace sluice
