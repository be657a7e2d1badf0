// Fuzz target for what `sluice report` reads: the JSON-lines metrics of `sluice train --metrics`
// and a Chrome trace of `--trace` (io/run_report.h), and the page it writes of them.
//
// Input: the metrics text, then (after the first NUL byte, when there is one) the trace's text.
// For every input:
//   * ParseMetricsText returns lines or throws ParseError; ParseTraceText returns events or throws
//     ParseError or InvalidArgument; ReportData returns the page's data or throws
//     InvalidArgument. Any other exception escapes and libFuzzer reports it as a crash; so do
//     hangs, sanitizer reports (a stack overflow in a deeply nested value was one) and huge
//     allocations.
//   * The page holds the data in one <script> element: no text read from the files ends it early
//     (the page has as many "</script" as the page of empty data).
//
// Run: make fuzz (FUZZ_SECONDS=300 for longer), or build-fuzz/fuzz/report_fuzz
// -dict=fuzz/report.dict CORPUS_DIR fuzz/corpus/report. Add each input that found a bug to
// tests/io/run_report_test.cc.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "sluice/core/error.h"
#include "sluice/io/run_report.h"

namespace {

[[noreturn]] void Die(const char* what, std::string_view detail) {
  std::fprintf(stderr, "report_fuzz: %s\n%.*s\n", what, static_cast<int>(detail.size()),
               detail.data());
  std::abort();
}

size_t Count(std::string_view text, std::string_view what) {
  size_t n = 0;
  for (size_t at = 0; (at = text.find(what, at)) != std::string_view::npos; at += what.size()) ++n;
  return n;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string metrics_text(input.substr(0, nul));
  std::vector<nlohmann::json> metrics, traces;
  try {
    metrics = sluice::ParseMetricsText(metrics_text, "metrics.jsonl");
    if (nul != std::string_view::npos) {
      traces.push_back(sluice::ParseTraceText(input.substr(nul + 1), "trace.json"));
    }
  } catch (const sluice::ParseError&) {
    return 0;
  } catch (const sluice::InvalidArgument&) {
    return 0;
  }
  nlohmann::json report;
  try {
    report = sluice::ReportData(metrics, traces);
  } catch (const sluice::InvalidArgument&) {
    return 0;
  }
  static const size_t kScriptEnds =
      Count(sluice::RenderReportHtml(nlohmann::json::object(), "run"), "</script");
  const std::string page = sluice::RenderReportHtml(report, "run");
  if (Count(page, "</script") != kScriptEnds) Die("the data ends the page's script early", page);
  return 0;
}
