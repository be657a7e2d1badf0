// Chrome trace: the events Perfetto needs — named threads, one "X" span per instruction, GC spans
// on the executor and on the worker, and an ordered "C" memory counter track.
#include "sluice/io/chrome_trace.h"

#include <cstdio>
#include <filesystem>
#include <fstream>

#include <gtest/gtest.h>

#include "scratch_path.h"
#include "sluice/core/caching_allocator.h"
#include "sluice/exec/interpreter.h"
#include "sluice/exec/random_inputs.h"
#include "sluice/ir/builder.h"
#include "sluice/ir/ops.h"

namespace sluice {
namespace {

using Json = nlohmann::json;

Program Chain() {
  Builder b("chain");
  Var x = b.Input("x", DType::kF32, {256});
  Var y = b.Name(x + x, "y");
  Var z = b.Name(y + x, "z");
  b.Output(b.Name(z + y, "out"));
  return b.Build();
}

std::vector<Json> EventsOf(const Json& trace, const std::string& ph) {
  std::vector<Json> out;
  for (const Json& e : trace["traceEvents"]) {
    if (e["ph"] == ph) out.push_back(e);
  }
  return out;
}

TEST(ChromeTrace, RunBecomesThreadsSpansAndACounter) {
  CachingAllocator alloc;
  Program program = Chain();
  Executable exe(program,
                 {.allocator = &alloc, .gc = GcMode::kAsync, .async = {.min_batch_bytes = 0}});
  Scope scope;
  BindRandomInputs(program, 1, scope);
  RunTrace run;
  exe.Run(scope, &run);
  ChromeTrace trace;
  AddRunTrace(trace, run, program);
  const Json json = Json::parse(trace.Dump());
  EXPECT_EQ(json["displayTimeUnit"], "ns");

  std::vector<std::string> threads;
  for (const Json& m : EventsOf(json, "M")) {
    if (m["name"] == "thread_name") threads.push_back(m["args"]["name"]);
  }
  EXPECT_EQ(threads, (std::vector<std::string>{"executor 0", "gc worker"}));

  int instructions = 0, frees = 0, destroys = 0;
  for (const Json& x : EventsOf(json, "X")) {
    EXPECT_GE(x["dur"].get<double>(), 0.0);
    if (x["cat"] == "instruction") {
      ++instructions;
      EXPECT_EQ(x["tid"], 0);
    } else if (x["name"] == "free") {
      ++frees;
    } else if (x["name"] == "destroy") {
      ++destroys;
      EXPECT_EQ(x["tid"], 1);
    }
  }
  EXPECT_EQ(instructions, 3);
  EXPECT_EQ(frees, 1);  // after the last add: y and z together
  EXPECT_EQ(destroys, 1);
  EXPECT_NE(trace.Dump().find("add %out"), std::string::npos);

  const std::vector<Json> counters = EventsOf(json, "C");
  ASSERT_FALSE(counters.empty());
  double last = -1;
  for (const Json& c : counters) {
    EXPECT_EQ(c["name"], "allocated bytes");
    EXPECT_GE(c["ts"].get<double>(), last);
    last = c["ts"].get<double>();
  }
}

TEST(ChromeTrace, WritesAFileAndNamesAnUnwritablePath) {
  ChromeTrace trace;
  trace.NameThread(1, 0, "main");
  trace.AddSpan(1, 0, "work", "test", 1.5, 2.0);
  trace.AddCounter(1, "bytes", "allocated", 1.5, 42);
  const std::string path = testing_support::ScratchPath("sluice_trace_test.json");
  trace.Write(path);
  std::ifstream in(path);
  const Json json = Json::parse(in);
  EXPECT_EQ(json["traceEvents"].size(), 3u);
  EXPECT_EQ(json["traceEvents"][1]["dur"], 2.0);
  EXPECT_EQ(json["traceEvents"][2]["args"]["allocated"], 42.0);
  std::remove(path.c_str());
  try {
    trace.Write("/nonexistent-dir/trace.json");
    FAIL();
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent-dir/trace.json"), std::string::npos);
  }
}

}  // namespace
}  // namespace sluice
