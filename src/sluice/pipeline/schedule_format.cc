#include "sluice/pipeline/schedule_format.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include <fmt/format.h>

#include "sluice/pipeline/schedule_analysis.h"

namespace sluice::pipeline {

namespace {

// Every compute action one step, the unsplit backward too; receives posted ahead, so the grid
// shows the shape of the compute order itself.
Simulation UnitCostRun(const Schedule& s) {
  return Simulate(s, CostModel{.forward = 1, .backward = 1, .weight = s.split_backward ? 1.0 : 0.0},
                  CommMode::kAsync);
}

std::string Percent(double fraction) { return fmt::format("{:.1f}%", 100 * fraction); }

}  // namespace

std::string FormatScheduleTable(const Schedule& s) {
  const Simulation sim = UnitCostRun(s);
  const std::vector<InFlight> in_flight = InFlightPeaks(s);
  const int steps = static_cast<int>(std::lround(sim.makespan));

  // grid[r][t]: the compute starting at step t on rank r, "." when the rank idles.
  std::vector<std::vector<std::string>> grid(s.stages, std::vector<std::string>(steps, "."));
  size_t width = fmt::format("{}", steps - 1).size();
  for (int r = 0; r < s.stages; ++r) {
    for (size_t i = 0; i < s.ranks[r].size(); ++i) {
      const Action& a = s.ranks[r][i];
      if (!IsCompute(a.kind)) continue;
      std::string& cell = grid[r][std::lround(sim.ranks[r].actions[i].start)];
      cell = ActionName(a, s.chunks);
      width = std::max(width, cell.size());
    }
  }
  const size_t label_width = fmt::format("rank {}", s.stages - 1).size() + 2;
  auto row = [&](const std::string& label, auto cell) {
    std::string line = fmt::format("{:<{}}", label, label_width);
    for (int t = 0; t < steps; ++t)
      line += fmt::format("{:<{}}", cell(t), t + 1 < steps ? width + 1 : 0);
    return line + "\n";
  };

  std::string out = fmt::format("{}: {} steps at unit cost (F = B{} = 1, messages free)\n",
                                s.Describe(), steps, s.split_backward ? " = W" : "");
  out += row("step", [](int t) { return fmt::format("{}", t); });
  for (int r = 0; r < s.stages; ++r) {
    out += row(fmt::format("rank {}", r), [&](int t) { return grid[r][t]; });
  }
  out += fmt::format("\n{:<6}{:<11}{}{}\n", "rank", "in flight",
                     s.split_backward ? "awaiting W  " : "", "bubble");
  for (int r = 0; r < s.stages; ++r) {
    out += fmt::format(
        "{:<6}{:<11}{}{}\n", r, in_flight[r].peak,
        s.split_backward ? fmt::format("{:<12}", in_flight[r].peak_awaiting_weight) : "",
        Percent(sim.ranks[r].bubble));
  }
  const std::string m = s.chunks > 1 ? "c.m" : "m";
  out += fmt::format(
      "\ncells: {} of {}; . idle. in flight: {} whose F has run and B has not.\n",
      s.split_backward
          ? fmt::format("F{0} forward, B{0} input gradients and W{0} weight gradients", m)
          : fmt::format("F{0} forward and B{0} backward", m),
      s.chunks > 1 ? "chunk c, micro-batch m" : "micro-batch m",
      s.chunks > 1 ? "chunk-micro-batches" : "micro-batches");
  return out;
}

nlohmann::ordered_json ScheduleToJson(const Schedule& s) {
  const Simulation sim = UnitCostRun(s);
  const std::vector<InFlight> in_flight = InFlightPeaks(s);
  nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
  for (int r = 0; r < s.stages; ++r) {
    nlohmann::ordered_json actions = nlohmann::ordered_json::array();
    for (const Action& a : s.ranks[r]) {
      nlohmann::ordered_json action = {{"op", ActionKindName(a.kind)}};
      if (a.kind != ActionKind::kOptimizer) {
        action["chunk"] = a.chunk;
        action["mb"] = a.micro_batch;
      }
      if (a.peer >= 0) action["peer"] = a.peer;
      actions.push_back(std::move(action));
    }
    ranks.push_back({{"rank", r},
                     {"in_flight_peak", in_flight[r].peak},
                     {"awaiting_weight_peak", in_flight[r].peak_awaiting_weight},
                     {"bubble", sim.ranks[r].bubble},
                     {"actions", std::move(actions)}});
  }
  return {{"schedule", s.name},
          {"stages", s.stages},
          {"micro_batches", s.micro_batches},
          {"chunks", s.chunks},
          {"split_backward", s.split_backward},
          {"bubble", sim.bubble},
          {"ranks", std::move(ranks)}};
}

}  // namespace sluice::pipeline
