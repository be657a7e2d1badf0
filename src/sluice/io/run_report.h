// Run reports: one self-contained HTML page showing a training run — what `sluice report` writes.
//
// Inputs are the files a run leaves: the JSON-lines metrics of `sluice train --metrics` (one object
// per step, per evaluation, and a summary; io/metrics.h) and, optionally, the Chrome trace of the
// last step (`--trace`, pipeline/pipeline_engine.h: a process per stage, its compute and
// communication threads, an "allocated bytes" counter; under MPI one file per rank, merged here).
//
// ReportData condenses them into what the page draws (a JSON object, embedded in the page):
//   steps    per logged step (a step logged twice — a resumed run redoing it — counts once, the
//            later line winning): loss, learning rate, throughput (per_s), peak allocated bytes
//   evals    validation loss (and accuracy) per evaluation
//   stages   per stage: peak allocated and reserved bytes, the bubble over the run, and — when the
//            summary has them — the liveness bound ("liveness_bound_bytes") and `sluice plan`'s
//            prediction ("predicted_peak_allocated_bytes"); a single-stage run is one stage
//   config   the run's configuration as rows of [key, value] text
//   unit     what the throughput counts: "tokens" (metrics' tokens_per_s) or "examples" (a
//            classifier on arrays: examples_per_s)
//   per_s    the run's throughput over every step (the summary's; absent without a summary)
//   trace    (when given) per stage ("process" of the trace): its spans on the last step, each with
//            its kind (F, B, W, OPT, SEND, RECV, ALLREDUCE or other) and lane (thread), the bubble
//            of the step (1 − compute time / the step's span), and its allocated-bytes samples
// RenderReportHtml puts the data into the page (report_page.cc): inline CSS, inline SVG drawn by
// an inline script, nothing loaded from the network.
//
// Thread-safety: plain functions. Failure: IoError naming the path for an unreadable file;
// ParseError naming path:line for a metrics line that is not a JSON object or holds a value of the
// wrong type ("step" not an integer, "loss" not a number or null), or a trace that is not a
// Chrome trace; InvalidArgument naming the trace file and the event's index for an event of the
// wrong types ("pid" null), and for metrics without a single step.
//
// Example:
//   nlohmann::json data = ReportData(ReadMetricsFile("runs/default/metrics.jsonl"),
//                                    {ReadTraceFile("runs/default/trace.json")});
//   WriteFileAtomic("report", "runs/default/report.html",                   // core/files.h
//                   RenderReportHtml(data, "runs/default"));
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace sluice {

// The lines of a metrics file, parsed, in order (blank lines skipped).
std::vector<nlohmann::json> ReadMetricsFile(const std::string& path);
// The same for the file's text, `path` naming it in errors (fuzz/report_fuzz.cc feeds it).
std::vector<nlohmann::json> ParseMetricsText(const std::string& text, const std::string& path);

// A Chrome trace file's event list ("traceEvents", or the array itself).
nlohmann::json ReadTraceFile(const std::string& path);
nlohmann::json ParseTraceText(std::string_view text, const std::string& path);

// What the page draws, from the metrics lines and any number of traces (merged: processes keep
// their names, so the ranks of an MPI run become the stages of one chart). `metrics_path` names
// the metrics file in errors (empty: the metrics are named as such).
nlohmann::json ReportData(const std::vector<nlohmann::json>& metrics,
                          const std::vector<nlohmann::json>& traces = {},
                          const std::string& metrics_path = "");

// The whole HTML page for `data`, titled `title`.
std::string RenderReportHtml(const nlohmann::json& data, const std::string& title);

}  // namespace sluice
