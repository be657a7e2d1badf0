#include "sluice/io/chrome_trace.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <vector>

#include <fmt/format.h>

#include "sluice/core/error.h"
#include "sluice/core/files.h"

namespace sluice {

using Json = nlohmann::json;

void ChromeTrace::NameProcess(int pid, std::string_view name) {
  events_.push_back(
      {{"ph", "M"}, {"name", "process_name"}, {"pid", pid}, {"args", {{"name", name}}}});
}

void ChromeTrace::NameThread(int pid, int tid, std::string_view name) {
  events_.push_back({{"ph", "M"},
                     {"name", "thread_name"},
                     {"pid", pid},
                     {"tid", tid},
                     {"args", {{"name", name}}}});
}

void ChromeTrace::AddSpan(int pid, int tid, std::string_view name, std::string_view category,
                          double begin_us, double duration_us, Json args) {
  Json e = {{"ph", "X"},  {"name", name},   {"cat", category},   {"pid", pid},
            {"tid", tid}, {"ts", begin_us}, {"dur", duration_us}};
  if (!args.is_null()) e["args"] = std::move(args);
  events_.push_back(std::move(e));
}

void ChromeTrace::AddCounter(int pid, std::string_view name, std::string_view series, double ts_us,
                             double value) {
  events_.push_back(
      {{"ph", "C"}, {"name", name}, {"pid", pid}, {"ts", ts_us}, {"args", {{series, value}}}});
}

std::string ChromeTrace::Dump() const {
  return Json{{"traceEvents", events_}, {"displayTimeUnit", "ns"}}.dump();
}

void ChromeTrace::Write(const std::string& path) const {
  WriteFileAtomic("trace", path, Dump() + "\n");
}

void AddRunTrace(ChromeTrace& trace, const RunTrace& run, const Program& program, int pid,
                 double offset_us) {
  auto us = [&](int64_t ns) { return offset_us + static_cast<double>(ns) / 1000.0; };
  auto label = [&](int32_t i) {
    const Instruction& instr = program.instructions().at(static_cast<size_t>(i));
    return instr.outputs.empty()
               ? instr.op->name
               : fmt::format("{} %{}", instr.op->name, program.value(instr.outputs[0]).name);
  };
  trace.NameProcess(pid, fmt::format("sluice run {}", program.name()));
  std::vector<MemorySample> memory;
  for (size_t tid = 0; tid < run.threads.size(); ++tid) {
    const ThreadTrace& t = run.threads[tid];
    const int id = static_cast<int>(tid);
    const bool worker = t.gc_worker;
    trace.NameThread(pid, id, t.name);
    for (const InstructionSpan& s : t.instructions) {
      trace.AddSpan(pid, id, label(s.instruction), "instruction", us(s.begin_ns),
                    us(s.end_ns) - us(s.begin_ns), {{"instruction", s.instruction}});
    }
    for (const GcSpan& g : t.gc) {
      trace.AddSpan(pid, id, worker ? "destroy" : "free", "gc", us(g.begin_ns),
                    us(g.end_ns) - us(g.begin_ns),
                    {{"after", g.instruction >= 0 ? label(g.instruction) : std::string("?")},
                     {"storages", g.storages},
                     {"bytes", g.bytes}});
    }
    memory.insert(memory.end(), t.memory.begin(), t.memory.end());
  }
  std::stable_sort(memory.begin(), memory.end(), [](const MemorySample& a, const MemorySample& b) {
    return a.time_ns < b.time_ns;
  });
  for (const MemorySample& m : memory) {
    trace.AddCounter(pid, "allocated bytes", "allocated", us(m.time_ns),
                     static_cast<double>(m.allocated_bytes));
  }
}

}  // namespace sluice
