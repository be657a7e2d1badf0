#include "sluice/exec/analysis.h"

#include <algorithm>
#include <limits>
#include <unordered_set>

#include <fmt/format.h>

namespace sluice {

namespace {

// The order-independent facts: groups, who reads them, the dependency graph.
struct Facts {
  std::vector<StorageGroup> groups;
  std::vector<int32_t> group_of;
  CsrLists members;
  CsrLists reads;       // instruction -> distinct groups it reads
  CsrLists users;       // group -> distinct instructions reading it, ascending
  CsrLists successors;  // instruction -> distinct dependants, ascending
  std::vector<int32_t> num_predecessors;
  std::vector<int32_t> producer_of_group;  // instruction defining the root; -1 for inputs/params
};

Facts CollectFacts(const Program& program, const AnalysisOptions& options) {
  const auto& instrs = program.instructions();
  const int32_t n = static_cast<int32_t>(instrs.size());
  Facts f;
  f.group_of.assign(program.values().size(), -1);
  auto new_group = [&](ValueId root, int64_t bytes, int32_t producer) {
    f.group_of[root] = static_cast<int32_t>(f.groups.size());
    f.groups.push_back({.root = root, .bytes = bytes});
    f.producer_of_group.push_back(producer);
  };
  std::vector<bool> donated(program.values().size(), false);
  for (const std::string& name : options.donate) {
    std::optional<ValueId> v = program.Find(name);
    if (!v || program.value(*v).kind != ValueKind::kInput) {
      throw ProgramError(fmt::format("program '{}': donate names %{}, which is not an input of it",
                                     program.name(), name));
    }
    donated[*v] = true;
  }
  for (ValueId v : program.inputs()) {
    new_group(v, donated[v] ? static_cast<int64_t>(program.Bytes(v)) : 0, -1);
  }
  for (ValueId v : program.params()) new_group(v, 0, -1);
  for (int32_t i = 0; i < n; ++i) {
    const Instruction& instr = instrs[i];
    for (ValueId out : instr.outputs) {
      if (instr.op->kind == OpKind::kView) {
        SLUICE_CHECK(!instr.inputs.empty(), "view op '{}' has no input to alias", instr.op->name);
        f.group_of[out] = f.group_of[instr.inputs[0]];
      } else {
        new_group(out, static_cast<int64_t>(program.Bytes(out)), i);
      }
    }
  }
  const size_t num_groups = f.groups.size();

  // Members, root first then views in definition order.
  std::vector<std::vector<int32_t>> members(num_groups);
  for (size_t g = 0; g < num_groups; ++g) members[g].push_back(f.groups[g].root);
  for (const Instruction& instr : instrs) {
    if (instr.op->kind != OpKind::kView) continue;
    for (ValueId out : instr.outputs) members[f.group_of[out]].push_back(out);
  }
  for (const auto& m : members) f.members.Append(m);

  // Pinned groups.
  auto pin = [&](ValueId v) { f.groups[f.group_of[v]].pinned = true; };
  for (ValueId v : program.inputs()) {
    if (!donated[v]) pin(v);
  }
  for (ValueId v : program.params()) pin(v);
  for (ValueId v : program.outputs()) pin(v);
  for (const std::string& name : options.keep) {
    std::optional<ValueId> v = program.Find(name);
    if (!v) {
      throw ProgramError(fmt::format(
          "program '{}': keep names %{}, which the program does not have", program.name(), name));
    }
    pin(*v);
  }

  // Reads (distinct groups per instruction) and users (distinct instructions per group).
  std::vector<std::vector<int32_t>> users(num_groups);
  std::vector<int32_t> seen(num_groups, -1);
  std::vector<int32_t> list;
  for (int32_t i = 0; i < n; ++i) {
    list.clear();
    for (ValueId v : instrs[i].inputs) {
      const int32_t g = f.group_of[v];
      if (seen[g] == i) continue;
      seen[g] = i;
      list.push_back(g);
      users[g].push_back(i);
    }
    f.reads.Append(list);
  }
  for (size_t g = 0; g < num_groups; ++g) {
    f.groups[g].num_users = static_cast<int32_t>(users[g].size());
    f.users.Append(users[g]);
  }

  // Dependency graph: data edges, plus the hazards of in-place updates on every group they touch:
  // each user of a group must stay on its side of every in-place user of it (program order).
  // Rather than an edge per such pair — quadratic when thousands of updates share one input such
  // as the learning rate — the users of a group are walked in program order and each is tied to
  // its nearest in-place neighbours only: the previous in-place user → this user, and every user
  // since the previous in-place one → the next in-place user. The transitive closure is the same
  // partial order; the edges are at most two per (group, user).
  std::vector<std::vector<int32_t>> succ(n);
  for (int32_t i = 0; i < n; ++i) {
    for (ValueId v : instrs[i].inputs) {
      const int32_t p = program.value(v).producer;
      if (p >= 0) succ[p].push_back(i);
    }
  }
  std::vector<int32_t> since_update;  // users of the group since its last in-place user
  for (size_t g = 0; g < num_groups; ++g) {
    const std::span<const int32_t> group_users = f.users[g];
    if (std::none_of(group_users.begin(), group_users.end(),
                     [&](int32_t u) { return instrs[u].op->kind == OpKind::kInPlace; })) {
      continue;
    }
    int32_t last_update = -1;
    since_update.clear();
    for (int32_t u : group_users) {
      if (last_update >= 0) succ[last_update].push_back(u);
      if (instrs[u].op->kind == OpKind::kInPlace) {
        for (int32_t r : since_update) succ[r].push_back(u);
        since_update.clear();
        last_update = u;
      } else {
        since_update.push_back(u);
      }
    }
  }
  f.num_predecessors.assign(n, 0);
  for (int32_t i = 0; i < n; ++i) {
    std::sort(succ[i].begin(), succ[i].end());
    succ[i].erase(std::unique(succ[i].begin(), succ[i].end()), succ[i].end());
    for (int32_t s : succ[i]) ++f.num_predecessors[s];
    f.successors.Append(succ[i]);
  }
  return f;
}

// Liveness of `order`: fills def/last steps of the groups, live bytes per step, the bound.
struct Liveness {
  std::vector<int32_t> def_step, last_step;
  std::vector<int64_t> live_bytes;
  int64_t bound = 0;
  int32_t peak_step = -1;
};

Liveness ComputeLiveness(const Facts& f, const std::vector<int32_t>& order) {
  const int32_t n = static_cast<int32_t>(order.size());
  std::vector<int32_t> step_of(n);
  for (int32_t s = 0; s < n; ++s) step_of[order[s]] = s;
  Liveness l;
  const size_t num_groups = f.groups.size();
  l.def_step.assign(num_groups, -1);
  l.last_step.assign(num_groups, -1);
  std::vector<int64_t> delta(static_cast<size_t>(n) + 1, 0);
  for (size_t g = 0; g < num_groups; ++g) {
    const int32_t producer = f.producer_of_group[g];
    // Inputs and params cost 0 here (the caller's), except donated inputs: alive from the start.
    if (producer < 0 && f.groups[g].bytes == 0) continue;
    if (n == 0) continue;
    const int32_t def = producer >= 0 ? step_of[producer] : 0;
    int32_t last = def;
    for (int32_t u : f.users[g]) last = std::max(last, step_of[u]);
    l.def_step[g] = def;
    if (!f.groups[g].pinned) l.last_step[g] = last;
    const int32_t end = f.groups[g].pinned ? n - 1 : last;
    delta[def] += f.groups[g].bytes;
    delta[end + 1] -= f.groups[g].bytes;
  }
  l.live_bytes.resize(n);
  int64_t live = 0;
  l.peak_step = n > 0 ? 0 : -1;
  for (int32_t s = 0; s < n; ++s) {
    live += delta[s];
    l.live_bytes[s] = live;
    if (live > l.bound) {
      l.bound = live;
      l.peak_step = s;
    }
  }
  return l;
}

// Kahn's algorithm choosing, among ready instructions, the smallest net growth in live bytes.
std::vector<int32_t> GreedyOrder(const Program& program, const Facts& f) {
  const auto& instrs = program.instructions();
  const int32_t n = static_cast<int32_t>(instrs.size());
  std::vector<int32_t> remaining_users(f.groups.size());
  for (size_t g = 0; g < f.groups.size(); ++g) remaining_users[g] = f.groups[g].num_users;
  std::vector<int32_t> pending = f.num_predecessors;
  std::vector<int64_t> alloc(n, 0), dead(n, 0);
  for (int32_t i = 0; i < n; ++i) {
    if (instrs[i].op->kind != OpKind::kCompute) continue;
    for (ValueId out : instrs[i].outputs) {
      const StorageGroup& g = f.groups[f.group_of[out]];
      alloc[i] += g.bytes;
      if (!g.pinned && g.num_users == 0) dead[i] += g.bytes;
    }
  }
  std::vector<int32_t> ready;
  for (int32_t i = 0; i < n; ++i) {
    if (pending[i] == 0) ready.push_back(i);
  }
  std::vector<int32_t> order;
  order.reserve(n);
  while (!ready.empty()) {
    size_t best = 0;
    int64_t best_growth = std::numeric_limits<int64_t>::max();
    for (size_t k = 0; k < ready.size(); ++k) {
      const int32_t i = ready[k];
      int64_t growth = alloc[i] - dead[i];
      for (int32_t g : f.reads[i]) {
        if (!f.groups[g].pinned && remaining_users[g] == 1) growth -= f.groups[g].bytes;
      }
      if (growth < best_growth || (growth == best_growth && i < ready[best])) {
        best = k;
        best_growth = growth;
      }
    }
    const int32_t i = ready[best];
    ready.erase(ready.begin() + static_cast<std::ptrdiff_t>(best));
    order.push_back(i);
    for (int32_t g : f.reads[i]) --remaining_users[g];
    for (int32_t s : f.successors[i]) {
      if (--pending[s] == 0) ready.push_back(s);
    }
  }
  SLUICE_CHECK(static_cast<int32_t>(order.size()) == n, "dependency graph of '{}' has a cycle",
               program.name());
  return order;
}

std::string ValueList(const Program& program, std::span<const ValueId> values) {
  std::string s;
  for (ValueId v : values) {
    if (!s.empty()) s += ", ";
    s += "%" + program.value(v).name;
  }
  return s;
}

}  // namespace

std::string_view Name(OrderPolicy policy) { return EnumName(kOrderPolicyNames, policy); }

std::optional<OrderPolicy> ParseOrderPolicy(std::string_view name) {
  return ParseEnum(kOrderPolicyNames, name);
}

std::string FormatBytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (bytes < 1024) return fmt::format("{} B", bytes);
  if (bytes < (int64_t{1} << 20)) return fmt::format("{:.1f} KiB", b / 1024);
  if (bytes < (int64_t{1} << 30)) return fmt::format("{:.1f} MiB", b / (1024.0 * 1024));
  return fmt::format("{:.2f} GiB", b / (1024.0 * 1024 * 1024));
}

int32_t ExecutionPlan::NumFreeable() const {
  int32_t count = 0;
  for (const StorageGroup& g : groups) count += g.pinned ? 0 : 1;
  return count;
}

ExecutionPlan Analyze(const Program& program, const AnalysisOptions& options) {
  Facts f = CollectFacts(program, options);
  const int32_t n = static_cast<int32_t>(program.instructions().size());

  std::vector<int32_t> program_order(n);
  for (int32_t i = 0; i < n; ++i) program_order[i] = i;
  Liveness by_program = ComputeLiveness(f, program_order);

  ExecutionPlan plan;
  plan.policy = options.order;
  plan.program_order_bound = by_program.bound;
  std::vector<int32_t> order = program_order;
  Liveness live = std::move(by_program);
  if (options.order != OrderPolicy::kProgram) {
    std::vector<int32_t> greedy = GreedyOrder(program, f);
    Liveness by_greedy = ComputeLiveness(f, greedy);
    plan.greedy_order_bound = by_greedy.bound;
    if (options.order == OrderPolicy::kGreedy || by_greedy.bound < live.bound) {
      order = std::move(greedy);
      live = std::move(by_greedy);
      plan.chosen = OrderPolicy::kGreedy;
    }
  }

  plan.order = std::move(order);
  plan.step_of.assign(n, -1);
  for (int32_t s = 0; s < n; ++s) plan.step_of[plan.order[s]] = s;
  for (size_t g = 0; g < f.groups.size(); ++g) {
    f.groups[g].def_step = live.def_step[g];
    f.groups[g].last_step = live.last_step[g];
  }
  std::vector<std::vector<int32_t>> frees(n);
  for (size_t g = 0; g < f.groups.size(); ++g) {
    if (!f.groups[g].pinned && f.groups[g].last_step >= 0) {
      frees[f.groups[g].last_step].push_back(static_cast<int32_t>(g));
    }
  }
  for (const auto& list : frees) plan.free_lists.Append(list);
  plan.live_bytes = std::move(live.live_bytes);
  plan.liveness_bound = live.bound;
  plan.peak_step = live.peak_step;

  // What each instruction releases in a parallel run. A donated input nobody reads goes with the
  // first instruction of the order.
  std::vector<int32_t> list;
  for (int32_t i = 0; i < n; ++i) {
    list.clear();
    for (int32_t g : f.reads[i]) {
      if (!f.groups[g].pinned) list.push_back(g);
    }
    if (i == plan.order[0]) {
      for (size_t g = 0; g < f.groups.size(); ++g) {
        const StorageGroup& group = f.groups[g];
        if (f.producer_of_group[g] < 0 && !group.pinned && group.num_users == 0) {
          list.push_back(static_cast<int32_t>(g));
        }
      }
    }
    const Instruction& instr = program.instructions()[i];
    if (instr.op->kind == OpKind::kCompute) {
      for (ValueId out : instr.outputs) {
        const int32_t g = f.group_of[out];
        if (!f.groups[g].pinned && f.groups[g].num_users == 0) list.push_back(g);
      }
    }
    plan.releases.Append(list);
  }

  plan.groups = std::move(f.groups);
  plan.group_of = std::move(f.group_of);
  plan.members = std::move(f.members);
  plan.successors = std::move(f.successors);
  plan.num_predecessors = std::move(f.num_predecessors);
  return plan;
}

std::string DescribeInstruction(const Program& program, int32_t instruction) {
  const Instruction& instr = program.instructions()[static_cast<size_t>(instruction)];
  if (instr.outputs.empty()) {
    return fmt::format("{}({})", instr.op->name, ValueList(program, instr.inputs));
  }
  return fmt::format("{} = {}({})", ValueList(program, instr.outputs), instr.op->name,
                     ValueList(program, instr.inputs));
}

std::string ExecutionPlan::Describe(const Program& program) const {
  std::string out = fmt::format(
      "program '{}': {} instructions, {} storage groups ({} freed per run); order {} (asked {})\n",
      program.name(), num_steps(), groups.size(), NumFreeable(), Name(chosen), Name(policy));
  out += fmt::format("  liveness bound: program order {}", FormatBytes(program_order_bound));
  if (greedy_order_bound >= 0) {
    out += fmt::format(", greedy order {}", FormatBytes(greedy_order_bound));
  }
  out += "\n  step  instr  live        instruction  →  frees after it\n";
  for (size_t s = 0; s < num_steps(); ++s) {
    const std::string text = DescribeInstruction(program, order[s]);
    std::string freed;
    for (int32_t g : FreeList(static_cast<int32_t>(s))) {
      if (!freed.empty()) freed += ", ";
      freed += fmt::format("{} ({})", ValueList(program, members[g]), FormatBytes(groups[g].bytes));
    }
    out += fmt::format("  {:>4}  #{:<5} {:>10}  {}{}{}\n", s, order[s], FormatBytes(live_bytes[s]),
                       text, freed.empty() ? "" : "  →  ", freed);
  }
  out += fmt::format("  liveness lower bound: {} ({} bytes) at step {}\n",
                     FormatBytes(liveness_bound), liveness_bound, peak_step);
  return out;
}

}  // namespace sluice
