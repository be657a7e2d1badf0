#include "sluice/pipeline/partition.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <limits>
#include <optional>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sluice/core/error.h"

namespace sluice::pipeline {

std::string_view Name(PartitionKind kind) { return EnumName(kPartitionKindNames, kind); }

std::optional<PartitionKind> ParsePartitionKind(std::string_view name) {
  return ParseEnum(kPartitionKindNames, name);
}

namespace {

// Whether the units are the built-in GPT's (embed, h.i, head): messages then speak of its layers.
bool IsGpt(const ModelUnits& units) { return units.count_option == "--layers"; }

// The units between the first and the last (the GPT's layers) split evenly; the first unit goes
// with stage 0, the last with stage S − 1.
Partition Uniform(const ModelUnits& units, int S) {
  const int64_t L = static_cast<int64_t>(units.names.size()) - 2;
  if (L < S) {
    const bool gpt = IsGpt(units);
    const std::string ends =
        gpt ? "embed and head" : fmt::format("{} and {}", units.names.front(), units.names.back());
    const std::string grow =
        gpt ? fmt::format("give the model --layers {} or more", S) : "give the model more units";
    const std::string fix =
        L + 2 >= S ? fmt::format(
                         "use --partition balanced ({} may take a stage of their own), name the "
                         "layers of each stage with --layout, or {}",
                         ends, grow)
                   : fmt::format(
                         "{} ({} with --partition balanced: {} may take a stage of their own), "
                         "or use fewer stages",
                         grow, gpt ? fmt::format("{}", S - 2) : fmt::format("{} units", S), ends);
    throw InvalidArgument(
        fmt::format("--partition uniform puts at least one layer on every stage, but the model has "
                    "{} layers for {} virtual stages (--stages × --chunks): {}",
                    L, S, fix));
  }
  // L mod S stages get one block more: the middle stages first, then stage 0 (partition.h).
  std::vector<int64_t> count(static_cast<size_t>(S), L / S);
  int64_t extra = L % S;
  for (int s = 1; s + 1 < S && extra > 0; ++s, --extra) ++count[static_cast<size_t>(s)];
  if (extra > 0) ++count[0];
  Partition p;
  int64_t first = 0;
  for (int s = 0; s < S; ++s) {
    const int64_t end = first + count[static_cast<size_t>(s)];
    // Units: the first is 0, layer l is l + 1, the last is L + 1.
    p.stages.push_back({.first = s == 0 ? 0 : first + 1, .end = s == S - 1 ? L + 2 : end + 1});
    first = end;
  }
  return p;
}

// --partition balanced puts at least one of the N units (embed, the layers, head) on each of the
// S virtual stages; `stages` says how S was counted, `fewer` what to reduce.
void RequireUnitPerStage(int S, const ModelUnits& units, std::string_view stages,
                         std::string_view fewer) {
  const std::vector<std::string>& names = units.names;
  const auto N = static_cast<int64_t>(names.size());
  if (S <= N) return;
  if (IsGpt(units)) {
    throw InvalidArgument(fmt::format(
        "--partition balanced needs at least one unit per stage, but {} virtual stages ({}) "
        "exceed the model's {} units (embed, {} layers, head): use fewer {}, or give the model "
        "--layers {} or more",
        S, stages, N, N - 2, fewer, S - 2));
  }
  throw InvalidArgument(fmt::format(
      "--partition balanced needs at least one unit per stage, but {} virtual stages ({}) exceed "
      "the model's {} unit{} ({}): use fewer {}, or split the model into more units",
      S, stages, N, N == 1 ? "" : "s", fmt::join(names, ", "), fewer));
}

// No cut of the model into S stages passes one value at every cut.
InvalidArgument NoCut(const ModelUnits& model, int S) {
  std::vector<std::string> at;
  for (size_t u = 1; u < model.names.size(); ++u) {
    if (model.CanCut(static_cast<int64_t>(u))) at.push_back(model.names[u]);
  }
  return InvalidArgument(fmt::format(
      "the model cannot be cut into {} virtual stages: a pipeline cut passes one value, and only "
      "{} unit{} start{} where one does ({}); use fewer stages or change the units",
      S, at.size(), at.size() == 1 ? "" : "s", at.size() == 1 ? "s" : "",
      at.empty() ? std::string("none") : fmt::format("{}", fmt::join(at, ", "))));
}

Partition Balanced(const ModelUnits& model, int S) {
  const std::vector<double>& units = model.costs;
  const int64_t N = static_cast<int64_t>(units.size());
  RequireUnitPerStage(S, model, "--stages × --chunks", "stages or chunks");
  // cost[i][j]: units [i, j), summed left to right (as EstimateStageCosts sums them, so the two
  // agree).
  std::vector<std::vector<double>> cost(N + 1, std::vector<double>(N + 1, 0.0));
  for (int64_t i = 0; i < N; ++i) {
    for (int64_t j = i + 1; j <= N; ++j) cost[i][j] = cost[i][j - 1] + units[j - 1];
  }
  // best[k][i]: the least possible maximum group cost splitting units [i, N) into k non-empty
  // groups.
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> best(S + 1, std::vector<double>(N + 1, inf));
  for (int64_t i = 0; i < N; ++i) best[1][i] = cost[i][N];
  for (int k = 2; k <= S; ++k) {
    for (int64_t i = 0; i + k <= N; ++i) {
      for (int64_t j = i + 1; j + k - 1 <= N; ++j) {
        if (!model.CanCut(j)) continue;
        best[k][i] = std::min(best[k][i], std::max(cost[i][j], best[k - 1][j]));
      }
    }
  }
  if (best[S][0] == inf) throw NoCut(model, S);
  // Walk from the front, each stage taking the fewest units that keep the optimum reachable.
  const double target = best[S][0];
  Partition p;
  int64_t i = 0;
  for (int k = S; k >= 1; --k) {
    int64_t j = i + 1;
    if (k == 1) {
      j = N;
    } else {
      while (j < N - (k - 1) &&
             !(model.CanCut(j) && cost[i][j] <= target && best[k - 1][j] <= target)) {
        ++j;
      }
      SLUICE_CHECK(cost[i][j] <= target && best[k - 1][j] <= target);
    }
    p.stages.push_back({i, j});
    i = j;
  }
  return p;
}

// Which cuts of a V-shaped placement keep every rank's cost at most a bound T. Rank k runs groups k
// and 2P − 1 − k: when the ranks outside it have taken units [0, i) and [j, N), rank k takes a
// front group [i, a) and a back group [e, j), a ≤ e, and leaves [a, e) to the ranks inside it
// (a = e for the innermost). Its cost is span(i, j) − span(a, e): the whole interval minus what it
// leaves, one formula wherever a rank's cost is compared, so the test and the walk agree bit for
// bit.
class VShapeCuts {
 public:
  VShapeCuts(const ModelUnits& model, int P)
      : model_(model),
        N_(static_cast<int64_t>(model.costs.size())),
        P_(P),
        prefix_(model.costs.size() + 1, 0.0) {
    for (int64_t u = 0; u < N_; ++u) prefix_[u + 1] = prefix_[u] + model.costs[u];
  }

  double span(int64_t i, int64_t j) const { return prefix_[j] - prefix_[i]; }
  double total() const { return prefix_[N_]; }

  // ok(k)[i][j]: ranks k … P − 1 can cut [i, j) into non-empty groups, each rank at most T.
  // Computed from the innermost rank out, each rank in O(N²): for rank k at [i, j) the best
  // choice leaves the largest span(a, e) the inner ranks can cut, and that largest span over
  // i < a ≤ e < j is a running maximum, best(i, j) = max(best(i + 1, j), best(i, j − 1),
  // inner(i + 1, j − 1)). With keep_all, every rank's table is kept for Walk.
  bool Feasible(double T, bool keep_all) {
    const int64_t W = N_ + 1;
    std::vector<uint8_t> inner(static_cast<size_t>(W * W), 0);
    for (int64_t i = 0; i <= N_; ++i) inner[i * W + i] = 1;  // no rank left: an empty interval
    const double none = -std::numeric_limits<double>::infinity();
    std::vector<double> best(static_cast<size_t>(W * W), none);
    tables_.clear();
    if (keep_all) tables_.assign(static_cast<size_t>(P_) + 1, {});
    if (keep_all) tables_[P_] = inner;
    for (int k = P_ - 1; k >= 0; --k) {
      std::vector<uint8_t> ok(static_cast<size_t>(W * W), 0);
      for (int64_t i = N_; i >= 0; --i) {
        for (int64_t j = i; j <= N_; ++j) {
          double b = none;
          if (j >= i + 2) {
            b = std::max(best[(i + 1) * W + j], best[i * W + j - 1]);
            if (inner[(i + 1) * W + j - 1] && model_.CanCut(i + 1) && model_.CanCut(j - 1)) {
              b = std::max(b, span(i + 1, j - 1));
            }
          }
          best[i * W + j] = b;
          ok[i * W + j] = b != none && span(i, j) - b <= T;
        }
      }
      inner = std::move(ok);
      if (keep_all) tables_[k] = inner;
    }
    return inner[N_] != 0;  // [0, N) by ranks 0 … P − 1
  }

  // After Feasible(T, true): the groups, from the outside in, each rank's front group taking as
  // few units as it can, then its back group as few.
  std::vector<std::pair<int64_t, int64_t>> Walk(double T) const {
    const int64_t W = N_ + 1;
    std::vector<std::pair<int64_t, int64_t>> groups(static_cast<size_t>(2 * P_));
    int64_t i = 0, j = N_;
    for (int k = 0; k < P_; ++k) {
      const std::vector<uint8_t>& inner = tables_[k + 1];
      bool found = false;
      for (int64_t a = i + 1; a < j && !found; ++a) {
        for (int64_t e = j - 1; e >= a && !found; --e) {
          if (!inner[a * W + e] || !model_.CanCut(a) || !model_.CanCut(e) ||
              span(i, j) - span(a, e) > T) {
            continue;
          }
          groups[static_cast<size_t>(k)] = {i, a};
          groups[static_cast<size_t>(2 * P_ - 1 - k)] = {e, j};
          i = a;
          j = e;
          found = true;
        }
      }
      SLUICE_CHECK(found, "the V-shaped cut lost its optimum at rank {}", k);
    }
    return groups;
  }

 private:
  const ModelUnits& model_;
  int64_t N_;
  int P_;
  std::vector<double> prefix_;
  std::vector<std::vector<uint8_t>> tables_;  // ok(k) for k = 0 … P, kept by Feasible
};

// The least double x ≥ lo for which feasible(x) holds, given feasible(hi): bisection over the
// doubles' order (for non-negative doubles, the order of their bits), exact in at most 64 tests.
template <typename Test>
double LeastFeasible(double lo, double hi, Test feasible) {
  uint64_t a = std::bit_cast<uint64_t>(lo), b = std::bit_cast<uint64_t>(hi);
  while (a < b) {
    const uint64_t mid = a + (b - a) / 2;
    if (feasible(std::bit_cast<double>(mid))) {
      b = mid;
    } else {
      a = mid + 1;
    }
  }
  return std::bit_cast<double>(b);
}

// Placement::kVShape: 2P groups, rank r running groups r and 2P − 1 − r, cut so that the most
// expensive rank is as cheap as possible — exact: the least bound T some cut meets, found by
// bisection (whether a cut meets T is monotone in T), each test O(P·N²) (VShapeCuts).
Partition BalancedV(const ModelUnits& model, int S) {
  const int P = S / 2;
  RequireUnitPerStage(S, model, "--stages × 2 chunks", "stages");
  VShapeCuts cuts(model, P);
  if (!cuts.Feasible(cuts.total(), false)) throw NoCut(model, S);
  const double target =
      LeastFeasible(0.0, cuts.total(), [&](double T) { return cuts.Feasible(T, false); });
  cuts.Feasible(target, true);
  Partition p;
  for (const auto& [first, end] : cuts.Walk(target)) p.stages.push_back({first, end});
  return p;
}

// One parsed layout item: a unit range [first, end) of UnitCosts order.
struct Item {
  std::string text;
  int stage = 0;
  int64_t first = 0;
  int64_t end = 0;
};

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

std::vector<std::string_view> SplitOn(std::string_view s, char sep) {
  std::vector<std::string_view> parts;
  size_t start = 0;
  for (size_t k = 0; k <= s.size(); ++k) {
    if (k == s.size() || s[k] == sep) {
      parts.push_back(s.substr(start, k - start));
      start = k + 1;
    }
  }
  return parts;
}

std::optional<int64_t> ParseIndex(std::string_view s) {
  int64_t v = 0;
  auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ec != std::errc() || ptr != s.data() + s.size() || v < 0) return std::nullopt;
  return v;
}

// The forms an item may take, for messages: each unit that is not numbered, then "P.i or P.i-j"
// for each prefix P of numbered units ("embed, head, h.i or h.i-j" for the GPT).
std::string ItemForms(const std::vector<std::string>& names) {
  std::vector<std::string> single, families;
  for (const std::string& n : names) {
    const size_t dot = n.rfind('.');
    if (dot != std::string::npos && ParseIndex(std::string_view(n).substr(dot + 1))) {
      const std::string family = n.substr(0, dot);
      if (std::find(families.begin(), families.end(), family) == families.end())
        families.push_back(family);
    } else {
      single.push_back(n);
    }
  }
  std::vector<std::string> forms = single;
  for (const std::string& f : families) forms.push_back(fmt::format("{0}.i or {0}.i-j", f));
  if (forms.size() > 12) forms.resize(12), forms.push_back("…");
  if (single.empty() && families.size() == 1) return forms[0];
  std::string last = forms.back();
  forms.pop_back();
  return fmt::format("{}{}{}", fmt::join(forms, ", "), forms.empty() ? "" : ", ", last);
}

// A unit name → its index, or a range "P.i-j" of numbered units → [index of P.i, index of P.j + 1).
Item ParseItem(std::string_view text, int stage, const std::vector<std::string>& names, bool gpt) {
  Item item{std::string(text), stage, 0, 0};
  const auto fail = [&](std::string_view why) {
    return InvalidArgument(fmt::format("--layout stage {}: '{}' {}", stage, text, why));
  };
  const auto index = [&](std::string_view name) -> std::optional<int64_t> {
    auto it = std::find(names.begin(), names.end(), name);
    if (it == names.end()) return std::nullopt;
    return static_cast<int64_t>(it - names.begin());
  };
  if (std::optional<int64_t> u = index(text)) {
    item.first = *u;
    item.end = *u + 1;
    return item;
  }
  const std::string forms = fmt::format("is not an item: expected {}", ItemForms(names));
  const size_t dot = text.rfind('.');
  if (dot == std::string_view::npos) throw fail(forms);
  const std::string_view family = text.substr(0, dot), range = text.substr(dot + 1);
  const size_t dash = range.find('-');
  const std::optional<int64_t> lo = ParseIndex(range.substr(0, dash));
  const std::optional<int64_t> hi =
      dash == std::string_view::npos ? lo : ParseIndex(range.substr(dash + 1));
  if (!lo || !hi) throw fail(forms);
  // The numbered units of this family: the model's P.0 … P.n.
  int64_t count = 0;
  while (index(fmt::format("{}.{}", family, count))) ++count;
  if (count == 0) throw fail(forms);
  if (*lo >= count || *hi >= count) {
    throw fail(fmt::format("is out of range: the model has {}{}.0-{}{}", gpt ? "layers " : "",
                           family, count - 1, gpt ? fmt::format(" (--layers {})", count) : ""));
  }
  if (*hi < *lo) {
    throw fail(fmt::format("runs backwards: {} are out of order (write {}.{}-{})",
                           gpt ? "layers" : "units", family, *hi, *lo));
  }
  item.first = *index(fmt::format("{}.{}", family, *lo));
  item.end = *index(fmt::format("{}.{}", family, *hi)) + 1;
  if (item.end <= item.first) throw fail("is not a run of units in model order");
  return item;
}

}  // namespace

Partition PartitionUnits(const ModelUnits& units, int S, PartitionKind kind, Placement placement) {
  SLUICE_CHECK(units.names.size() == units.costs.size(), "{} unit names for {} costs",
               units.names.size(), units.costs.size());
  if (units.names.empty()) {
    throw InvalidArgument(
        "the model has no units to split into pipeline stages (a program names "
        "them with `unit NAME { ... }`, docs/program-format.md)");
  }
  if (S < 1)
    throw InvalidArgument(fmt::format("the number of virtual stages must be positive, got {}", S));
  if (placement == Placement::kVShape && S % 2 != 0) {
    throw InvalidArgument(fmt::format(
        "a V-shaped placement runs 2 virtual stages per rank, so an even number (got {})", S));
  }
  if (kind == PartitionKind::kUniform) return Uniform(units, S);
  return placement == Placement::kVShape ? BalancedV(units, S) : Balanced(units, S);
}

Partition ParseLayout(std::string_view layout, const ModelUnits& units, int S,
                      Placement placement) {
  const std::vector<std::string>& names = units.names;
  const auto N = static_cast<int64_t>(names.size());
  if (N == 0) {
    throw InvalidArgument(
        "--layout: the model has no units to lay out (a program names them with "
        "`unit NAME { ... }`, docs/program-format.md)");
  }
  const bool gpt = IsGpt(units);
  std::vector<Item> items;
  const std::vector<std::string_view> stages = SplitOn(layout, '|');
  for (size_t s = 0; s < stages.size(); ++s) {
    const int stage = static_cast<int>(s);
    if (Trim(stages[s]).empty()) {
      throw InvalidArgument(fmt::format("--layout stage {} is empty: every stage needs {}", stage,
                                        gpt ? "embed, head or a layer" : "a unit"));
    }
    for (std::string_view text : SplitOn(stages[s], ',')) {
      if (Trim(text).empty())
        throw InvalidArgument(fmt::format("--layout stage {}: an empty item (two commas?)", stage));
      items.push_back(ParseItem(Trim(text), stage, names, gpt));
    }
  }
  const int given = static_cast<int>(stages.size());
  if (given != S && placement == Placement::kVShape) {
    throw InvalidArgument(fmt::format(
        "--layout has {} stages, but a V-shaped schedule (zb-v, v-half, v-min) runs {} virtual "
        "stages: 2 per rank, listed in model order — stage k runs on rank k for k < {}, on "
        "rank {} − k after, so rank 0 runs the first stage ({}) and the last ({})",
        given, S, S / 2, S - 1, names.front(), names.back()));
  }
  if (given != S) {
    throw InvalidArgument(fmt::format(
        "--layout has {} stage{}, but --stages × --chunks asks for {} virtual stages ('|' "
        "separates stages, ',' the items of one)",
        given, given == 1 ? "" : "s", S));
  }
  // Every unit in exactly one item.
  std::vector<const Item*> owner(static_cast<size_t>(N), nullptr);
  for (const Item& item : items) {
    for (int64_t u = item.first; u < item.end; ++u) {
      if (const Item* other = owner[static_cast<size_t>(u)]) {
        throw InvalidArgument(fmt::format(
            "--layout: {} is duplicated: in stage {} ('{}') and stage {} ('{}')",
            names[static_cast<size_t>(u)], other->stage, other->text, item.stage, item.text));
      }
      owner[static_cast<size_t>(u)] = &item;
    }
  }
  for (int64_t u = 0; u < N; ++u) {
    if (owner[static_cast<size_t>(u)] == nullptr) {
      throw InvalidArgument(
          fmt::format("--layout: {} is in no stage (dropped): every {} must be placed",
                      names[static_cast<size_t>(u)], gpt ? "layer, embed and head" : "unit"));
    }
  }
  // Now the items tile [0, N); they must do so in order, embed first and head last.
  const auto stage_of = [&](int64_t unit) { return owner[static_cast<size_t>(unit)]->stage; };
  if (items.front().first != 0) {
    throw InvalidArgument(
        fmt::format("--layout stage {}: {} must come first, at the start of stage 0", stage_of(0),
                    names.front()));
  }
  if (items.back().end != N) {
    throw InvalidArgument(
        fmt::format("--layout stage {}: {} must come last, at the end of stage {}", stage_of(N - 1),
                    names.back(), S - 1));
  }
  int64_t next = 0;
  for (const Item& item : items) {
    if (item.first != next) {
      throw InvalidArgument(
          fmt::format("--layout stage {}: '{}' is out of order: {} comes next in the model",
                      item.stage, item.text, names[static_cast<size_t>(next)]));
    }
    next = item.end;
  }
  Partition p;
  for (int s = 0; s < S; ++s) {
    int64_t first = -1, end = -1;
    for (const Item& item : items) {
      if (item.stage != s) continue;
      if (first < 0) first = item.first;
      end = item.end;
    }
    p.stages.push_back({first, end});
  }
  return p;
}

std::string FormatLayout(const Partition& p, const std::vector<std::string>& names) {
  // Runs of numbered units of one family are written P.i-j.
  auto numbered = [&](int64_t u) -> std::optional<std::pair<std::string, int64_t>> {
    const std::string& n = names.at(static_cast<size_t>(u));
    const size_t dot = n.rfind('.');
    if (dot == std::string::npos) return std::nullopt;
    std::optional<int64_t> i = ParseIndex(std::string_view(n).substr(dot + 1));
    if (!i) return std::nullopt;
    return std::pair{n.substr(0, dot), *i};
  };
  std::vector<std::string> stages;
  for (const UnitRange& r : p.stages) {
    std::vector<std::string> items;
    for (int64_t u = r.first; u < r.end;) {
      auto first = numbered(u);
      int64_t v = u + 1;
      while (first && v < r.end) {
        auto next = numbered(v);
        if (!next || next->first != first->first || next->second != first->second + (v - u)) break;
        ++v;
      }
      if (v - u > 1) {
        items.push_back(
            fmt::format("{}.{}-{}", first->first, first->second, first->second + (v - u - 1)));
      } else {
        items.push_back(names.at(static_cast<size_t>(u)));
      }
      u = v;
    }
    stages.push_back(fmt::format("{}", fmt::join(items, ",")));
  }
  return fmt::format("{}", fmt::join(stages, "|"));
}

std::vector<double> EstimateStageCosts(const Partition& p, const ModelUnits& units) {
  std::vector<double> out;
  for (const UnitRange& r : p.stages) {
    double sum = 0;
    for (int64_t u = r.first; u < r.end; ++u) sum += units.costs.at(static_cast<size_t>(u));
    out.push_back(sum);
  }
  return out;
}

namespace {

GptPartition ToGpt(const Partition& p, int64_t layers) {
  GptPartition out;
  for (const UnitRange& r : p.stages) out.stages.push_back(GptSliceOfUnits(r, layers));
  return out;
}

UnitRange FromGpt(const GptSlice& s, int64_t layers) {
  const int64_t end = s.end_layer < 0 ? layers : s.end_layer;
  return {.first = s.embed ? 0 : s.first_layer + 1, .end = s.head ? layers + 2 : end + 1};
}

}  // namespace

GptPartition PartitionGpt(const GptConfig& c, int64_t batch, int64_t seq_len, int S,
                          PartitionKind kind, Placement placement) {
  return ToGpt(PartitionUnits(GptUnits(c, batch, seq_len), S, kind, placement), c.layers);
}

GptPartition ParseGptLayout(std::string_view layout, const GptConfig& c, int S,
                            Placement placement) {
  ValidateGptConfig(c);
  return ToGpt(ParseLayout(layout, GptUnits(c, 1, 0), S, placement), c.layers);
}

std::string FormatLayout(const GptPartition& p) {
  std::vector<std::string> stages;
  for (size_t s = 0; s < p.stages.size(); ++s) {
    if (p.stages[s].end_layer < 0) {
      throw InvalidArgument(
          fmt::format("partition stage {}: end_layer -1 (the model's last layer) cannot be "
                      "written as a layout without the model's --layers",
                      s));
    }
    stages.push_back(SliceText(p.stages[s], p.stages[s].end_layer));
  }
  return fmt::format("{}", fmt::join(stages, "|"));
}

std::vector<double> EstimateStageCosts(const GptPartition& p, const GptConfig& c, int64_t batch,
                                       int64_t seq_len) {
  Partition units;
  for (const GptSlice& s : p.stages) units.stages.push_back(FromGpt(s, c.layers));
  return EstimateStageCosts(units, GptUnits(c, batch, seq_len));
}

}  // namespace sluice::pipeline
