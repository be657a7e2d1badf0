// Run reports (io/run_report.h): the metrics and traces of a run condensed into the page's data,
// errors naming the file and line, and a page that loads nothing from the network.
#include "sluice/io/run_report.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sluice/core/error.h"

namespace sluice {
namespace {

using Json = nlohmann::json;
using ::testing::HasSubstr;
using ::testing::Not;

std::vector<Json> Metrics() {
  return {
      {{"step", 1},
       {"loss", 2.5},
       {"lr", 1e-3},
       {"tokens_per_s", 100.0},
       {"peak_allocated_bytes", 10}},
      {{"step", 2},
       {"loss", 2.0},
       {"lr", 2e-3},
       {"tokens_per_s", 120.0},
       {"peak_allocated_bytes", 12}},
      {{"step", 2}, {"val_loss", 2.2}, {"accuracy", 0.5}},
      {{"step", 3},
       {"loss", 1.5},
       {"lr", 3e-3},
       {"tokens_per_s", 110.0},
       {"peak_allocated_bytes", 12}},
      // A resumed run redid step 3: the later line counts.
      {{"step", 3},
       {"loss", 1.4},
       {"lr", 3e-3},
       {"tokens_per_s", 115.0},
       {"peak_allocated_bytes", 12}},
      {{"summary", true},
       {"steps", 3},
       {"config", {{"model", "gpt"}, {"layers", 2}}},
       {"stages",
        {{{"stage", 0},
          {"peak_allocated_bytes", 100},
          {"peak_reserved_bytes", 128},
          {"bubble", 0.25}},
         {{"stage", 1},
          {"peak_allocated_bytes", 80},
          {"peak_reserved_bytes", 96},
          {"bubble", 0.5},
          {"predicted_peak_allocated_bytes", 81}}}},
       {"pipeline", {{"schedule", "1f1b"}, {"stages", 2}}}},
  };
}

// Two stages; stage 0 computes 60 of the step's 100 µs, stage 1 computes 30.
Json Trace() {
  return Json::array({
      {{"ph", "M"}, {"name", "process_name"}, {"pid", 1}, {"args", {{"name", "stage 0"}}}},
      {{"ph", "M"}, {"name", "process_name"}, {"pid", 2}, {"args", {{"name", "stage 1"}}}},
      {{"ph", "X"}, {"name", "F0"}, {"pid", 1}, {"tid", 0}, {"ts", 0.0}, {"dur", 20.0}},
      {{"ph", "X"}, {"name", "SEND_F0"}, {"pid", 1}, {"tid", 1}, {"ts", 20.0}, {"dur", 5.0}},
      {{"ph", "X"}, {"name", "B0"}, {"pid", 1}, {"tid", 0}, {"ts", 50.0}, {"dur", 30.0}},
      {{"ph", "X"}, {"name", "OPT"}, {"pid", 1}, {"tid", 0}, {"ts", 90.0}, {"dur", 10.0}},
      {{"ph", "X"}, {"name", "RECV_F0"}, {"pid", 2}, {"tid", 1}, {"ts", 0.0}, {"dur", 25.0}},
      {{"ph", "X"}, {"name", "F0"}, {"pid", 2}, {"tid", 0}, {"ts", 25.0}, {"dur", 10.0}},
      {{"ph", "X"}, {"name", "B0"}, {"pid", 2}, {"tid", 0}, {"ts", 35.0}, {"dur", 20.0}},
      {{"ph", "C"},
       {"name", "allocated bytes"},
       {"pid", 1},
       {"ts", 0.0},
       {"args", {{"bytes", 64}}}},
      {{"ph", "C"},
       {"name", "allocated bytes"},
       {"pid", 1},
       {"ts", 30.0},
       {"args", {{"bytes", 96}}}},
  });
}

TEST(RunReport, StepsCountOnceAndTheLaterLineWins) {
  const Json d = ReportData(Metrics());
  EXPECT_EQ(d["steps"]["step"], Json({1, 2, 3}));
  EXPECT_EQ(d["steps"]["loss"], Json({2.5, 2.0, 1.4}));
  EXPECT_EQ(d["evals"]["step"], Json({2}));
  EXPECT_EQ(d["evals"]["accuracy"], Json({0.5}));
  EXPECT_TRUE(d["complete"].get<bool>());
  EXPECT_TRUE(d["trace"].is_null());
}

// A language model's metrics count tokens; a classifier's on arrays count examples
// ("examples_per_s"): the report draws whichever the run wrote, under its name.
TEST(RunReport, ThroughputKeepsTheUnitTheRunCounted) {
  const Json tokens = ReportData(Metrics());
  EXPECT_EQ(tokens["unit"], "tokens");
  EXPECT_EQ(tokens["steps"]["per_s"], Json({100.0, 120.0, 115.0}));
  std::vector<Json> metrics = {
      {{"step", 1}, {"loss", 1.2}, {"lr", 1e-3}, {"examples_per_s", 900.0}},
      {{"step", 2}, {"loss", 1.1}, {"lr", 1e-3}, {"examples_per_s", 1100.0}},
      {{"summary", true}, {"steps", 2}, {"examples_per_s", 1000.0}}};
  const Json examples = ReportData(metrics);
  EXPECT_EQ(examples["unit"], "examples");
  EXPECT_EQ(examples["steps"]["per_s"], Json({900.0, 1100.0}));
  EXPECT_EQ(examples["per_s"], 1000.0);
}

TEST(RunReport, StagesCarryTheirPeaksAndAnyPredictionFromTheSummary) {
  const Json d = ReportData(Metrics());
  ASSERT_EQ(d["stages"].size(), 2u);
  EXPECT_EQ(d["stages"][0]["peak_reserved_bytes"], 128);
  EXPECT_FALSE(d["stages"][0].contains("predicted_peak_allocated_bytes"));
  EXPECT_EQ(d["stages"][1]["predicted_peak_allocated_bytes"], 81);
  // Configuration rows: nested keys joined with '.', the stages left to their own panel.
  const Json& rows = d["config"];
  EXPECT_THAT(rows.dump(), HasSubstr(R"(["config.model","gpt"])"));
  EXPECT_THAT(rows.dump(), HasSubstr(R"(["pipeline.schedule","1f1b"])"));
  EXPECT_THAT(rows.dump(), Not(HasSubstr("[\"stages\"")));
}

TEST(RunReport, ASingleStageRunIsOneStageWithTheRunsPeak) {
  std::vector<Json> m = Metrics();
  m.back().erase("stages");
  m.back()["peak_allocated_bytes"] = 500;
  m.back()["liveness_bound_bytes"] = 450;
  const Json d = ReportData(m);
  ASSERT_EQ(d["stages"].size(), 1u);
  EXPECT_EQ(d["stages"][0]["peak_allocated_bytes"], 500);
  EXPECT_EQ(d["stages"][0]["liveness_bound_bytes"], 450);
  // Without a summary (a run still going): the largest step's peak.
  m.pop_back();
  const Json partial = ReportData(m);
  EXPECT_EQ(partial["stages"][0]["peak_allocated_bytes"], 12);
  EXPECT_FALSE(partial["complete"].get<bool>());
}

TEST(RunReport, TraceGivesARowPerStageWithKindsLanesAndBubbles) {
  const Json d = ReportData(Metrics(), {Trace()});
  const Json& t = d["trace"];
  EXPECT_EQ(t["begin_us"], 0.0);
  EXPECT_EQ(t["end_us"], 100.0);
  ASSERT_EQ(t["stages"].size(), 2u);
  EXPECT_EQ(t["stages"][0]["name"], "stage 0");
  EXPECT_EQ(t["stages"][0]["spans"].size(), 4u);
  EXPECT_EQ(t["stages"][0]["spans"][1]["kind"], "SEND");
  EXPECT_EQ(t["stages"][0]["spans"][1]["lane"], 1);
  EXPECT_EQ(t["stages"][0]["spans"][2]["kind"], "B");
  EXPECT_DOUBLE_EQ(t["stages"][0]["bubble"].get<double>(), 1 - 60.0 / 100);
  EXPECT_DOUBLE_EQ(t["stages"][1]["bubble"].get<double>(), 1 - 30.0 / 100);
  EXPECT_EQ(t["stages"][0]["memory"], Json::parse("[[0.0, 64], [30.0, 96]]"));
  EXPECT_EQ(t["stages"][1]["memory"].size(), 0u);
}

TEST(RunReport, MetricsWithoutStepsOrWithWrongTypesAreRejected) {
  EXPECT_THROW(ReportData({{{"summary", true}}}), InvalidArgument);
  try {
    ReportData({{{"step", "one"}, {"loss", 1.0}}});
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(),
                HasSubstr("the metrics hold a line that sluice train --metrics does not"));
  }
  Json bad_trace = Trace();
  bad_trace.push_back({{"ph", "X"}, {"name", "F1"}, {"pid", "stage 0"}});
  try {
    ReportData(Metrics(), {bad_trace});
    FAIL() << "expected InvalidArgument";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("the trace holds an event that is not a Chrome trace event"));
  }
}

class RunReportFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("sluice_run_report_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string Write(const std::string& name, const std::string& text) {
    const std::string p = (dir_ / name).string();
    std::ofstream(p) << text;
    return p;
  }
  std::filesystem::path dir_;
};

TEST_F(RunReportFiles, ABadMetricsLineIsNamedByFileAndLine) {
  const std::string p = Write("m.jsonl", "{\"step\": 1, \"loss\": 2}\n\n[1, 2]\n");
  try {
    ReadMetricsFile(p);
    FAIL() << "expected ParseError";
  } catch (const ParseError& e) {
    EXPECT_THAT(e.what(), HasSubstr(p + ":3:1: a metrics line must be a JSON object"));
  }
  const std::string q = Write("n.jsonl", "{\"step\": 1, \"loss\": 2}\n{\"step\": \n");
  EXPECT_THROW(ReadMetricsFile(q), ParseError);
  EXPECT_EQ(ReadMetricsFile(Write("ok.jsonl", "{\"step\": 1, \"loss\": 2}\n\n")).size(), 1u);
  try {
    ReadMetricsFile((dir_ / "absent.jsonl").string());
    FAIL() << "expected IoError";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(),
                HasSubstr("cannot read metrics file '" + (dir_ / "absent.jsonl").string() + "'"));
  }
}

TEST_F(RunReportFiles, ATraceMustBeAChromeTrace) {
  EXPECT_EQ(ReadTraceFile(Write("t.json", Json({{"traceEvents", Trace()}}).dump())).size(),
            Trace().size());
  EXPECT_EQ(ReadTraceFile(Write("a.json", Trace().dump())).size(), Trace().size());
  EXPECT_THROW(ReadTraceFile(Write("b.json", "{\"events\": []}")), ParseError);
  EXPECT_THROW(ReadTraceFile(Write("c.json", "not json")), ParseError);
}

// Regression: a number past the range of a double (1e999) is not a parse_error for nlohmann::json
// but an out_of_range (406), which escaped both readers: `sluice report` ended with "internal
// error". It is a ParseError naming the file and line, as any other bad JSON.
TEST_F(RunReportFiles, ANumberPastADoubleIsAParseErrorNotAnInternalError) {
  const std::string m =
      Write("big.jsonl", "{\"step\": 1, \"loss\": 2}\n{\"step\": 2, \"loss\": 1e999}\n");
  try {
    ReadMetricsFile(m);
    FAIL() << "expected ParseError";
  } catch (const ParseError& e) {
    EXPECT_THAT(e.what(), HasSubstr(m + ":2:"));
    EXPECT_THAT(e.what(), HasSubstr("number overflow parsing '1e999'"));
  }
  const std::string t = Write(
      "big.json",
      R"({"traceEvents": [{"ph": "X", "ts": 1e999, "dur": 1, "pid": 0, "tid": 0, "name": "F0"}]})");
  try {
    ReadTraceFile(t);
    FAIL() << "expected ParseError";
  } catch (const ParseError& e) {
    EXPECT_THAT(e.what(), HasSubstr(t + ":1:"));
    EXPECT_THAT(e.what(), HasSubstr("not a Chrome trace (JSON)"));
    EXPECT_THAT(e.what(), HasSubstr("number overflow parsing '1e999'"));
  }
}

// Regression (issue "Nothing lost"): figures out of their range were drawn as they came — a step
// of 2^63 as negative, negative steps, byte counts and stage indices, a bubble above 1. Each is a
// ParseError naming the file, the line and the range.
TEST_F(RunReportFiles, AFigureOutOfItsRangeIsNamedByFileAndLine) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"{\"step\": 9223372036854775808, \"loss\": 1}",
       "\"step\" is 9223372036854775808, outside 0 to 9223372036854775807"},
      {"{\"step\": -3, \"loss\": 1}", "\"step\" is -3, outside 0 to 9223372036854775807"},
      {"{\"step\": 2, \"loss\": 1, \"peak_allocated_bytes\": -5}",
       "\"peak_allocated_bytes\" is -5, below 0"},
      {"{\"step\": 2, \"loss\": 1, \"lr\": -0.1}", "\"lr\" is -0.1, below 0"},
      {"{\"summary\": true, \"stages\": [{\"stage\": -1}]}",
       "in \"stages\", \"stage\" is -1, outside 0 to 9223372036854775807"},
      {"{\"summary\": true, \"stages\": [{\"stage\": 0, \"bubble\": 1.5}]}",
       "in \"stages\", \"bubble\" is 1.5, outside 0 to 1"},
      {"{\"summary\": true, \"stages\": [{\"stage\": 0, \"peak_reserved_bytes\": -1}]}",
       "in \"stages\", \"peak_reserved_bytes\" is -1, below 0"},
  };
  for (const auto& [line, message] : cases) {
    const std::string m = Write("m.jsonl", "{\"step\": 1, \"loss\": 2}\n" + line + "\n");
    try {
      ReadMetricsFile(m);
      ADD_FAILURE() << "accepted " << line;
    } catch (const ParseError& e) {
      EXPECT_THAT(e.what(), HasSubstr(m + ":2:1: " + message)) << line;
    }
  }
  // The edges are figures: step 2^63 - 1, a bubble of 1, a byte count of 0.
  const std::string edges =
      Write("edges.jsonl",
            "{\"step\": 9223372036854775807, \"loss\": 1, \"peak_allocated_bytes\": 0}\n"
            "{\"summary\": true, \"stages\": [{\"stage\": 0, \"bubble\": 1}]}\n");
  EXPECT_NO_THROW(ReadMetricsFile(edges));
}

// Regression: a value of the wrong type was reported without its file or line ("the metrics hold a
// line that ... does not write") or, for a figure, drawn as 0; and a process_name event without
// "args" was read through operator[] on a const object (undefined behaviour: the message differed
// between builds).
TEST_F(RunReportFiles, AValueOfTheWrongTypeIsNamedByFileAndLineOrEvent) {
  const std::string m = Write("m.jsonl", "{\"step\": 1, \"loss\": 2}\n{\"step\": \"two\"}\n");
  try {
    ReadMetricsFile(m);
    FAIL() << "expected ParseError";
  } catch (const ParseError& e) {
    EXPECT_THAT(e.what(), HasSubstr(m + ":2:1: \"step\" is \"two\", not an integer"));
  }
  const std::string s = Write("s.jsonl", "{\"summary\": true, \"stages\": [{\"stage\": null}]}\n");
  EXPECT_THROW(ReadMetricsFile(s), ParseError);
  // A figure of another type was drawn as 0 without a word; null (a non-finite loss) is fine.
  const std::string l =
      Write("l.jsonl", "{\"step\": 1, \"loss\": null}\n{\"step\": 2, \"loss\": \"x\"}\n");
  try {
    ReadMetricsFile(l);
    FAIL() << "expected ParseError";
  } catch (const ParseError& e) {
    EXPECT_THAT(e.what(), HasSubstr(l + ":2:1: \"loss\" is \"x\", not a number"));
  }
  const std::vector<std::pair<Json, std::string>> cases = {
      {{{"ph", "X"}, {"name", "F1"}, {"pid", nullptr}},
       "event 1 is not a Chrome trace event: "
       "\"pid\" is null, not an integer"},
      {{{"ph", "X"}, {"name", 7}, {"pid", 1}}, "\"name\" is 7, not a string"},
      {{{"ph", "X"}, {"name", "F0"}, {"pid", 1}, {"ts", "soon"}},
       "\"ts\" is \"soon\", not a number"},
      {{{"ph", "M"}, {"name", "process_name"}, {"pid", 1}, {"args", "x"}},
       "\"args\" is \"x\", not an object"},
  };
  for (const auto& [event, message] : cases) {
    const std::string t = Write("t.json", Json::array({Trace()[0], event}).dump());
    try {
      ReadTraceFile(t);
      FAIL() << event.dump();
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), HasSubstr("trace file '" + t + "': event 1"));
      EXPECT_THAT(e.what(), HasSubstr(message));
    }
  }
  // A process name without "args" is a process without a name, the same in every build.
  const Json unnamed = Json::array({{{"ph", "M"}, {"name", "process_name"}, {"pid", 0}}});
  const Json data = ReportData(Metrics(), {ReadTraceFile(Write("u.json", unnamed.dump()))});
  EXPECT_TRUE(data["trace"].is_null());
}

TEST(RunReport, ThePageEmbedsTheDataSafelyAndLoadsNothingFromTheNetwork) {
  std::vector<Json> m = Metrics();
  m.back()["config"]["data"] = "</script><script>alert(1)</script>";
  const std::string html = RenderReportHtml(ReportData(m, {Trace()}), "run <a> & @DATA@");
  EXPECT_THAT(html, HasSubstr("<title>run &lt;a&gt; &amp; &#64;DATA&#64;</title>"));
  EXPECT_THAT(html, Not(HasSubstr("alert(1)</script>")));
  EXPECT_THAT(html, HasSubstr(R"(<\/script><script>alert(1)<\/script>)"));
  // Only the page's own two script elements end (inside one, "<script" is just text), and no
  // reference that a browser would fetch.
  size_t scripts = 0;
  for (size_t at = 0; (at = html.find("</script", at)) != std::string::npos; ++at) ++scripts;
  EXPECT_EQ(scripts, 2u);
  for (const char* fetch : {"src=", "href=\"http", "url(", "@import", "<link rel=\"stylesheet"}) {
    EXPECT_THAT(html, Not(HasSubstr(fetch))) << fetch;
  }
  // The data parses back.
  const size_t begin = html.find("id=\"report-data\">") + 17;
  const size_t end = html.find("</script>", begin);
  Json back = Json::parse(html.substr(begin, end - begin));
  EXPECT_EQ(back["steps"]["step"].size(), 3u);
}

}  // namespace
}  // namespace sluice
