// ChromeTrace: writes timelines in the Chrome trace-event JSON format, which Perfetto
// (ui.perfetto.dev) and chrome://tracing open directly.
//
// The file is {"traceEvents": [...], "displayTimeUnit": "ns"}. Events used:
//   "X"  complete events: a span with a start and a duration on one thread (pid, tid);
//   "C"  counter events: one track per counter name per process, drawn as a graph;
//   "M"  metadata: process and thread names.
// Times are microseconds (doubles, so nanoseconds survive as fractions).
//
// AddRunTrace turns one interpreter run (exec/run_trace.h) into a process: a thread per executing
// thread with a span per instruction (named "op %first_output") and its GC spans ("free"), the GC
// worker's thread with its "destroy" spans, and an "allocated bytes" counter track.
//
// Thread-safety: none; build a trace on one thread.
// Failure modes: Write throws IoError naming the path when the file cannot be written.
//
// Example:
//   RunTrace run;
//   exe.Run(scope, &run);
//   ChromeTrace trace;
//   AddRunTrace(trace, run, exe.program());
//   trace.Write("run.json");   // open in ui.perfetto.dev
#pragma once

#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "sluice/exec/run_trace.h"
#include "sluice/ir/program.h"

namespace sluice {

class ChromeTrace {
 public:
  void NameProcess(int pid, std::string_view name);
  void NameThread(int pid, int tid, std::string_view name);
  // A span on thread (pid, tid); `args` (a JSON object or null) shows in the span's details.
  void AddSpan(int pid, int tid, std::string_view name, std::string_view category, double begin_us,
               double duration_us, nlohmann::json args = nullptr);
  // One sample of counter `name` (track) with one `series` value at ts_us.
  void AddCounter(int pid, std::string_view name, std::string_view series, double ts_us,
                  double value);

  const nlohmann::json& events() const { return events_; }
  // The whole file's text.
  std::string Dump() const;
  // Writes Dump() to `path` atomically (core/files.h WriteFileAtomic): a failed write leaves a good
  // trace there as it was. IoError "cannot save trace 'PATH': ...".
  void Write(const std::string& path) const;

 private:
  nlohmann::json events_ = nlohmann::json::array();
};

// Adds one interpreter run as process `pid`, its times shifted by offset_us.
void AddRunTrace(ChromeTrace& trace, const RunTrace& run, const Program& program, int pid = 1,
                 double offset_us = 0);

}  // namespace sluice
