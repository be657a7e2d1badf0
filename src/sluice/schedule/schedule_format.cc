#include "sluice/schedule/schedule_format.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "sluice/schedule/schedule_analysis.h"
#include "sluice/schedule/validator.h"

namespace sluice::pipeline {

namespace {

// Every compute action one step, the unsplit backward too; receives posted ahead, so the grid
// shows the shape of the compute order itself.
// `s` is valid (the writers validate it once).
CostModel GridCosts(const Schedule& s) {
  return {.forward = 1, .backward = 1, .weight = s.split_backward ? 1.0 : 0.0};
}

Simulation UnitCostRun(const Schedule& s, bool keep_action_times) {
  return Simulate(s, GridCosts(s), CommMode::kAsync, keep_action_times, /*validated=*/true);
}

std::string Percent(double fraction) { return fmt::format("{:.1f}%", 100 * fraction); }

}  // namespace

void WriteScheduleTable(const Schedule& s, std::ostream& out, bool validated) {
  if (!validated) ValidateSchedule(s);
  const Simulation sim = UnitCostRun(s, /*keep_action_times=*/true);
  const std::vector<InFlight> in_flight = InFlightPeaks(s, /*validated=*/true);
  const int steps = static_cast<int>(std::lround(sim.makespan));

  size_t width = fmt::format("{}", steps - 1).size();
  for (const std::vector<Action>& rank : s.ranks) {
    for (const Action& a : rank) {
      if (IsCompute(a.kind)) width = std::max(width, ActionName(a, s.chunks).size());
    }
  }
  const size_t label_width = fmt::format("rank {}", s.stages - 1).size() + 2;
  auto row = [&](const std::string& label, auto cell) {
    std::string line = fmt::format("{:<{}}", label, label_width);
    for (int t = 0; t < steps; ++t)
      line += fmt::format("{:<{}}", cell(t), t + 1 < steps ? width + 1 : 0);
    return line + "\n";
  };

  out << fmt::format("{}: {} steps at unit cost (F = B{} = 1, messages free)\n", s.Describe(),
                     steps, s.split_backward ? " = W" : "");
  out << row("step", [](int t) { return fmt::format("{}", t); });
  // One rank's row at a time: cells[t], the compute starting at step t, "." when the rank idles.
  std::vector<std::string> cells;
  for (int r = 0; r < s.stages; ++r) {
    cells.assign(steps, ".");
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      const Action& a = s.ranks[r][i];
      if (IsCompute(a.kind))
        cells[std::lround(sim.ranks[r].actions[i].start)] = ActionName(a, s.chunks);
    }
    out << row(fmt::format("rank {}", r), [&](int t) { return cells[t]; });
  }
  out << fmt::format("\n{:<6}{:<11}{}{}\n", "rank", "in flight",
                     s.split_backward ? "awaiting W  " : "", "bubble");
  for (int r = 0; r < s.stages; ++r) {
    out << fmt::format(
        "{:<6}{:<11}{}{}\n", r, in_flight[r].peak,
        s.split_backward ? fmt::format("{:<12}", in_flight[r].peak_awaiting_weight) : "",
        Percent(sim.ranks[r].bubble));
  }
  const std::string m = s.chunks > 1 ? "c.m" : "m";
  out << fmt::format(
      "\ncells: {} of {}; . idle. in flight: {} whose F has run and B has not.\n",
      s.split_backward
          ? fmt::format("F{0} forward, B{0} input gradients and W{0} weight gradients", m)
          : fmt::format("F{0} forward and B{0} backward", m),
      s.chunks > 1 ? "chunk c, micro-batch m" : "micro-batch m",
      s.chunks > 1 ? "chunk-micro-batches" : "micro-batches");
}

SteadyState GridSteadyState(const Schedule& s) {
  return AnalyseSteadyState(s, GridCosts(s), CommMode::kAsync);
}

std::string FormatSteadyState(const SteadyState& st) {
  return fmt::format(
      "\npost-validation: steps interlock (a rank starts step k + 1 after its own OPT of step k)\n"
      "  steady state: a training step every {:g} unit steps, bubble {} (synchronous: {:g}, bubble "
      "{})\n"
      "  once per run: the first fill {:g} and the last drain {:g} idle unit steps per rank "
      "(mean)\n",
      st.period, Percent(st.bubble), st.synchronous_makespan, Percent(st.synchronous_bubble),
      st.fill, st.drain);
}

nlohmann::ordered_json SteadyStateJson(const SteadyState& st) {
  return {{"steady_state_bubble", st.bubble},
          {"steady_state_step", st.period},
          {"synchronous_step", st.synchronous_makespan},
          {"synchronous_bubble", st.synchronous_bubble},
          {"fill", st.fill},
          {"drain", st.drain}};
}

std::string FormatScheduleTable(const Schedule& s) {
  std::ostringstream out;
  WriteScheduleTable(s, out);
  return out.str();
}

namespace {

// `object` dumped without its closing brace, so that more keys can follow.
std::string OpenObject(const nlohmann::ordered_json& object) {
  std::string text = object.dump();
  text.pop_back();
  return text;
}

}  // namespace

void WriteScheduleJson(const Schedule& s, std::ostream& out, bool validated,
                       const SteadyState* steady) {
  if (!validated) ValidateSchedule(s);
  const Simulation sim = UnitCostRun(s, /*keep_action_times=*/false);
  const std::vector<InFlight> in_flight = InFlightPeaks(s, /*validated=*/true);
  nlohmann::ordered_json head = {{"schedule", s.name},
                                 {"stages", s.stages},
                                 {"micro_batches", s.micro_batches},
                                 {"chunks", s.chunks},
                                 {"split_backward", s.split_backward},
                                 {"bubble", sim.bubble}};
  if (steady != nullptr) head["post_validation"] = SteadyStateJson(*steady);
  out << OpenObject(head) << ",\"ranks\":[";
  std::string text;  // one rank's, written at once
  for (int r = 0; r < s.stages; ++r) {
    text = r > 0 ? "," : "";
    text += OpenObject({{"rank", r},
                        {"in_flight_peak", in_flight[r].peak},
                        {"awaiting_weight_peak", in_flight[r].peak_awaiting_weight},
                        {"bubble", sim.ranks[r].bubble}});
    text += ",\"actions\":[";
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      const Action& a = s.ranks[r][i];
      if (i > 0) text += ',';
      fmt::format_to(std::back_inserter(text), "{{\"op\":\"{}\"", ActionKindName(a.kind));
      if (a.kind != ActionKind::kOptimizer) {
        fmt::format_to(std::back_inserter(text), ",\"chunk\":{},\"mb\":{}", +a.chunk,
                       +a.micro_batch);
      }
      if (a.peer >= 0) fmt::format_to(std::back_inserter(text), ",\"peer\":{}", +a.peer);
      text += '}';
    }
    text += "]}";
    out << text;
  }
  out << "]}";
}

nlohmann::ordered_json ScheduleToJson(const Schedule& s) {
  std::ostringstream out;
  WriteScheduleJson(s, out);
  return nlohmann::ordered_json::parse(out.str());
}

}  // namespace sluice::pipeline
