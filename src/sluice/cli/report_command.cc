// `sluice report`: one self-contained HTML page of a training run (io/run_report.h) — loss,
// validation loss and learning rate, tokens/s, peak memory per stage, the last step's schedule as
// a Gantt chart per stage, allocated bytes during that step, and the configuration. Open it in any
// browser; it loads nothing from the network.
//
// Example:
//   sluice train --stages 4 --metrics run/metrics.jsonl --trace run/trace.json
//   sluice report run/metrics.jsonl --trace run/trace.json        # writes run/report.html
//   # MPI runs write a trace per rank: pass them all (--trace run/trace.rank0.json --trace ...)
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "sluice/cli/commands.h"
#include "sluice/core/files.h"
#include "sluice/io/run_report.h"

namespace sluice::cli {

namespace {

struct ReportArgs {
  std::string metrics;
  std::vector<std::string> traces;
  std::string out;
};

int RunReport(const ReportArgs& a) {
  std::string out = a.out;
  if (out.empty()) {
    out = (std::filesystem::path(a.metrics).parent_path() / "report.html").string();
  }
  // Before reading anything: the page may not overwrite the metrics or a trace.
  std::vector<NamedPath> inputs = {{"metrics", a.metrics}};
  for (const std::string& t : a.traces) inputs.push_back({"--trace", t});
  CheckOutputPaths(inputs, {{"--out", out}});
  std::vector<nlohmann::json> traces;
  for (const std::string& t : a.traces) traces.push_back(ReadTraceFile(t));
  const nlohmann::json data = ReportData(ReadMetricsFile(a.metrics), traces, a.metrics);
  // A new file renamed over `out`: a failed write (a full disk) leaves a good page as it was.
  WriteFileAtomic("report", out, RenderReportHtml(data, fmt::format("sluice run: {}", a.metrics)));
  PrintToStdout("report: {}\n", out);
  return 0;
}

}  // namespace

CommandRunner SetupReportCommand(CLI::App& sub) {
  auto a = std::make_shared<ReportArgs>();
  sub.add_option("metrics", a->metrics, "the JSON-lines metrics of sluice train --metrics")
      ->required();
  sub.add_option("--trace", a->traces,
                 "the Chrome trace of sluice train --trace (under MPI: one per rank, each given)");
  sub.add_option("--out", a->out, "the HTML file to write (default: report.html beside METRICS)")
      ->check(NonEmptyPath());
  return [a] { return RunReport(*a); };
}

}  // namespace sluice::cli
