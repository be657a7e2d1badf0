#include "sluice/step/memory_budget.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>

#include <fmt/format.h>

#include "sluice/core/error.h"
#include "sluice/exec/analysis.h"

namespace sluice {

namespace {

struct Unit {
  const char* name;
  double bytes;
};
constexpr Unit kUnits[] = {{"b", 1},
                           {"kb", 1e3},
                           {"mb", 1e6},
                           {"gb", 1e9},
                           {"tb", 1e12},
                           {"kib", 1024.0},
                           {"mib", 1024.0 * 1024},
                           {"gib", 1024.0 * 1024 * 1024},
                           {"tib", 1024.0 * 1024 * 1024 * 1024}};

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace

int64_t ParseByteSize(std::string_view given, std::string_view option) {
  auto bad = [&](std::string_view why) {
    return InvalidArgument(fmt::format(
        "{} '{}': {}; expected a positive size such as 6MiB, 1.5GB or 1048576 (units B, KB, MB, "
        "GB, TB, KiB, MiB, GiB, TiB)",
        option, given, why));
  };
  // Spaces around the size are not part of it ("6MiB, 8MiB" lists two).
  auto space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  std::string_view text = given;
  while (!text.empty() && space(text.front())) text.remove_prefix(1);
  while (!text.empty() && space(text.back())) text.remove_suffix(1);
  size_t end = 0;
  while (end < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[end])) != 0 || text[end] == '.')) {
    ++end;
  }
  if (text.empty()) throw bad("empty");
  if (text.front() == '-') throw bad("not positive");
  if (end == 0) throw bad("not a number");
  double value = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + end, value);
  if (ec != std::errc() || ptr != text.data() + end) throw bad("not a number");
  std::string_view unit = text.substr(end);
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  double scale = 1;
  if (!unit.empty()) {
    const std::string u = Lower(unit);
    auto it = std::find_if(std::begin(kUnits), std::end(kUnits),
                           [&](const Unit& k) { return u == k.name; });
    if (it == std::end(kUnits)) throw bad(fmt::format("unknown unit '{}'", unit));
    scale = it->bytes;
  }
  const double bytes = std::floor(value * scale);
  if (!(bytes >= 1)) throw bad("not positive");
  if (bytes > 9.0e18) throw bad("too large");
  return static_cast<int64_t>(bytes);
}

std::vector<int64_t> ParseMemoryBudget(std::string_view text, int stages) {
  std::vector<int64_t> sizes;
  for (size_t start = 0;;) {
    const size_t comma = text.find(',', start);
    sizes.push_back(ParseByteSize(text.substr(start, comma - start)));
    if (comma == std::string_view::npos) break;
    start = comma + 1;
  }
  if (sizes.size() == 1) return std::vector<int64_t>(static_cast<size_t>(stages), sizes[0]);
  if (sizes.size() != static_cast<size_t>(stages)) {
    throw InvalidArgument(fmt::format(
        "--memory-budget lists {} sizes but training runs in {} stage{}: give one size for all "
        "stages or one per stage",
        sizes.size(), stages, stages == 1 ? "" : "s"));
  }
  return sizes;
}

std::string FormatBudgetBytes(int64_t bytes) {
  return bytes < 1024 ? FormatBytes(bytes) : fmt::format("{} ({} B)", FormatBytes(bytes), bytes);
}

std::vector<RecomputePolicy> MemoryPlan::Policies() const {
  std::vector<RecomputePolicy> out;
  for (const StagePlan& s : stages) out.push_back(s.policy);
  return out;
}

std::string MemoryPlan::Explain(const std::vector<int64_t>& budget) const {
  std::string out;
  for (size_t s = 0; s < stages.size(); ++s) {
    const StagePlan& p = stages[s];
    if (p.fits) continue;
    // What dominates the smallest peak.
    MemoryUse top = MemoryUse::kParameters;
    for (const auto& [use, name] : kMemoryUseNames) {
      if (p.smallest.at_peak[use] > p.smallest.at_peak[top]) top = use;
    }
    out += fmt::format(
        "\n  stage {}: budget {}, smallest achievable peak {} with --recompute {}, of which {} {} "
        "(at {})",
        s, FormatBudgetBytes(budget[s]), FormatBudgetBytes(p.smallest.peak_reserved_bytes),
        Name(p.smallest_policy), Name(top), FormatBytes(p.smallest.at_peak[top]),
        p.smallest.peak_phase);
  }
  return out;
}

MemoryPlan PlanForBudget(const TrainConfig& config, const std::vector<int64_t>& budget,
                         const Forecaster& forecast) {
  constexpr RecomputePolicy kPolicies[] = {RecomputePolicy::kNone, RecomputePolicy::kCheap,
                                           RecomputePolicy::kSelective, RecomputePolicy::kFull,
                                           RecomputePolicy::kSublayer};
  std::vector<std::vector<StageMemoryForecast>> by_policy;
  for (RecomputePolicy policy : kPolicies) {
    TrainConfig c = config;
    c.recompute = {policy};
    by_policy.push_back(forecast(c));
    SLUICE_CHECK(by_policy.back().size() == budget.size(),
                 "the forecast has {} stages, the budget {}", by_policy.back().size(),
                 budget.size());
  }
  MemoryPlan plan;
  plan.fits = true;
  for (size_t s = 0; s < budget.size(); ++s) {
    StagePlan stage;
    const double base_work = by_policy[0][s].work;
    size_t best = SIZE_MAX, smallest = 0;
    for (size_t p = 0; p < by_policy.size(); ++p) {
      const StageMemoryForecast& f = by_policy[p][s];
      if (f.peak_reserved_bytes < by_policy[smallest][s].peak_reserved_bytes) smallest = p;
      if (f.peak_reserved_bytes > budget[s]) continue;
      if (best == SIZE_MAX || f.work < by_policy[best][s].work) best = p;
    }
    stage.smallest = by_policy[smallest][s];
    stage.smallest_policy = kPolicies[smallest];
    stage.fits = best != SIZE_MAX;
    const size_t chosen = stage.fits ? best : smallest;
    stage.policy = kPolicies[chosen];
    stage.forecast = by_policy[chosen][s];
    stage.extra_work = base_work > 0 ? stage.forecast.work / base_work - 1 : 0;
    plan.fits = plan.fits && stage.fits;
    plan.stages.push_back(std::move(stage));
  }
  return plan;
}

}  // namespace sluice
