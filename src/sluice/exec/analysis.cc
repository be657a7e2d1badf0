#include "sluice/exec/analysis.h"

#include <algorithm>
#include <functional>
#include <queue>
#include <utility>

#include <fmt/format.h>

namespace sluice {

namespace {

// The order-independent facts: groups, who reads them, the dependency graph. Every list is flat
// (CsrLists built by counting): a million instructions make millions of groups, and a vector per
// group or per instruction would cost more than the facts themselves.
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

// Lists from (key, item) pairs: entry k holds the items of the pairs with key k, in pair order.
CsrLists GroupByKey(size_t num_keys, std::span<const std::pair<int32_t, int32_t>> pairs) {
  CsrLists lists;
  lists.begin.assign(num_keys + 1, 0);
  for (const auto& [key, item] : pairs) ++lists.begin[static_cast<size_t>(key) + 1];
  for (size_t k = 0; k < num_keys; ++k) lists.begin[k + 1] += lists.begin[k];
  lists.items.resize(pairs.size());
  std::vector<int32_t> cursor(lists.begin.begin(), lists.begin.end() - 1);
  for (const auto& [key, item] : pairs) lists.items[cursor[key]++] = item;
  return lists;
}

Facts CollectFacts(const Program& program, const AnalysisOptions& options) {
  const auto& instrs = program.instructions();
  const int32_t n = static_cast<int32_t>(instrs.size());
  const size_t num_values = program.values().size();
  Facts f;
  f.group_of.assign(num_values, -1);
  auto new_group = [&](ValueId root, int64_t bytes, int32_t producer) {
    f.group_of[root] = static_cast<int32_t>(f.groups.size());
    f.groups.push_back({.root = root, .bytes = bytes});
    f.producer_of_group.push_back(producer);
  };
  std::vector<bool> donated(num_values, false);
  for (const std::string& name : options.donate) {
    std::optional<ValueId> v = program.Find(name);
    if (!v || program.value(*v).kind != ValueKind::kInput) {
      throw ProgramError(fmt::format("program '{}': donate names %{}, which is not an input of it",
                                     program.name(), name));
    }
    donated[*v] = true;
  }
  f.groups.reserve(num_values);
  f.producer_of_group.reserve(num_values);
  for (ValueId v : program.inputs()) {
    new_group(v, donated[v] ? static_cast<int64_t>(program.Bytes(v)) : 0, -1);
  }
  for (ValueId v : program.params()) new_group(v, 0, -1);
  // (group, view) pairs in definition order: the members after each root.
  std::vector<std::pair<int32_t, int32_t>> views;
  for (int32_t i = 0; i < n; ++i) {
    const Instruction& instr = instrs[i];
    for (ValueId out : instr.outputs) {
      if (instr.op->kind == OpKind::kView) {
        SLUICE_CHECK(!instr.inputs.empty(), "view op '{}' has no input to alias", instr.op->name);
        f.group_of[out] = f.group_of[instr.inputs[0]];
        views.emplace_back(f.group_of[out], out);
      } else {
        new_group(out, static_cast<int64_t>(program.Bytes(out)), i);
      }
    }
  }
  f.groups.shrink_to_fit();
  f.producer_of_group.shrink_to_fit();
  const size_t num_groups = f.groups.size();

  // Members, root first then views in definition order.
  {
    CsrLists view_lists = GroupByKey(num_groups, views);
    f.members.begin.resize(num_groups + 1);
    f.members.items.reserve(num_groups + views.size());
    for (size_t g = 0; g < num_groups; ++g) {
      f.members.items.push_back(f.groups[g].root);
      const std::span<const int32_t> list = view_lists[g];
      f.members.items.insert(f.members.items.end(), list.begin(), list.end());
      f.members.begin[g + 1] = static_cast<int32_t>(f.members.items.size());
    }
  }

  // Reads (distinct groups per instruction) and users (distinct instructions per group).
  {
    std::vector<int32_t> seen(num_groups, -1);
    f.reads.begin.resize(static_cast<size_t>(n) + 1);
    for (int32_t i = 0; i < n; ++i) {
      for (ValueId v : instrs[i].inputs) {
        const int32_t g = f.group_of[v];
        if (seen[g] == i) continue;
        seen[g] = i;
        f.reads.items.push_back(g);
        ++f.groups[g].num_users;
      }
      f.reads.begin[i + 1] = static_cast<int32_t>(f.reads.items.size());
    }
    f.reads.items.shrink_to_fit();
  }
  // Users by counting: the instructions in order, so each list is ascending.
  f.users.begin.assign(num_groups + 1, 0);
  for (size_t g = 0; g < num_groups; ++g) {
    f.users.begin[g + 1] = f.users.begin[g] + f.groups[g].num_users;
  }
  f.users.items.resize(f.reads.items.size());
  {
    std::vector<int32_t> cursor(f.users.begin.begin(), f.users.begin.end() - 1);
    for (int32_t i = 0; i < n; ++i) {
      for (int32_t g : f.reads[i]) f.users.items[cursor[g]++] = i;
    }
  }

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

  // Dependency graph: data edges, plus the hazards of in-place updates on every group they touch:
  // each user of a group must stay on its side of every in-place user of it (program order).
  // Rather than an edge per such pair — quadratic when thousands of updates share one input such
  // as the learning rate — the users of a group are walked in program order and each is tied to
  // its nearest in-place neighbours only: the previous in-place user → this user, and every user
  // since the previous in-place one → the next in-place user. The transitive closure is the same
  // partial order; the edges are at most two per (group, user).
  std::vector<std::pair<int32_t, int32_t>> edges;  // (from, to)
  for (int32_t i = 0; i < n; ++i) {
    for (ValueId v : instrs[i].inputs) {
      const int32_t p = program.value(v).producer;
      if (p >= 0) edges.emplace_back(p, i);
    }
  }
  for (size_t g = 0; g < num_groups; ++g) {
    const std::span<const int32_t> group_users = f.users[g];
    if (std::none_of(group_users.begin(), group_users.end(),
                     [&](int32_t u) { return instrs[u].op->kind == OpKind::kInPlace; })) {
      continue;
    }
    int32_t last_update = -1;
    size_t since_update = 0;  // users [since_update, k) came after the last in-place user
    for (size_t k = 0; k < group_users.size(); ++k) {
      const int32_t u = group_users[k];
      if (last_update >= 0) edges.emplace_back(last_update, u);
      if (instrs[u].op->kind == OpKind::kInPlace) {
        for (size_t r = since_update; r < k; ++r) edges.emplace_back(group_users[r], u);
        since_update = k + 1;
        last_update = u;
      }
    }
  }
  // By source, each list sorted and deduplicated in place.
  CsrLists succ = GroupByKey(static_cast<size_t>(n), edges);
  edges = {};
  f.num_predecessors.assign(n, 0);
  f.successors.begin.resize(static_cast<size_t>(n) + 1);
  f.successors.items.reserve(succ.items.size());
  for (int32_t i = 0; i < n; ++i) {
    auto first = succ.items.begin() + succ.begin[i];
    auto last = succ.items.begin() + succ.begin[i + 1];
    std::sort(first, last);
    last = std::unique(first, last);
    for (auto it = first; it != last; ++it) {
      ++f.num_predecessors[*it];
      f.successors.items.push_back(*it);
    }
    f.successors.begin[i + 1] = static_cast<int32_t>(f.successors.items.size());
  }
  return f;
}

// Liveness of `order`: fills def/last steps of the groups, the outputs written in place, live
// bytes per step, the bound.
struct Liveness {
  std::vector<int32_t> def_step, last_step;
  std::vector<int32_t> in_place_of;  // group -> the group whose storage it takes over, or -1
  std::vector<int64_t> live_bytes;
  int64_t bound = 0;
  int32_t peak_step = -1;
};

// The reshapes between `root` and `x` when x is root or a reshape of it (reshapes all the way
// up): a view of the whole storage, laid out as the root is (contiguous from offset 0), so an
// output of x's shape written there puts the same bytes where x's elements were. -1 otherwise.
int32_t ReshapesFromRoot(const Program& program, ValueId x, ValueId root) {
  int32_t reshapes = 0;
  for (; x != root; ++reshapes) {
    const Value& value = program.value(x);
    if (value.producer < 0) return -1;
    const Instruction& ins = program.instructions()[static_cast<size_t>(value.producer)];
    if (ins.op->name != "reshape") return -1;
    x = ins.inputs[0];
  }
  return reshapes;
}

// The group whose storage instruction i may write its output 0 into (exec/analysis.h, "Writing in
// place"), or -1. `last_step` is each group's last user's step; `taken` marks the groups already
// handed over.
int32_t InPlaceSource(const Program& program, const Facts& f, int32_t i, int32_t step,
                      std::span<const int32_t> last_step, std::span<const char> taken,
                      InPlace policy) {
  const Instruction& instr = program.instructions()[static_cast<size_t>(i)];
  if (policy == InPlace::kOff || instr.op->kind != OpKind::kCompute || instr.outputs.empty()) {
    return -1;
  }
  const ValueId out = instr.outputs[0];
  const TensorType& out_type = program.type(out);
  for (int j : instr.op->in_place_inputs) {
    const ValueId x = instr.inputs[static_cast<size_t>(j)];
    const int32_t g = f.group_of[x];
    const StorageGroup& group = f.groups[g];
    const TensorType& x_type = program.type(x);
    if (group.pinned || f.producer_of_group[g] < 0 || taken[g]) continue;
    const int32_t reshapes = ReshapesFromRoot(program, x, group.root);
    if (reshapes < 0) continue;
    if (x_type.shape != out_type.shape || SizeOf(x_type.dtype) != SizeOf(out_type.dtype) ||
        group.bytes != f.groups[f.group_of[out]].bytes || group.bytes == 0) {
      continue;
    }
    // In any order the reshapes leading to x (which run before this instruction and read no
    // element) may be the group's other users, nothing else.
    if (last_step[g] != step || (policy == InPlace::kAnyOrder && group.num_users != 1 + reshapes)) {
      continue;
    }
    // Read through x only: another view of it among the operands would be read after (or
    // differently from how) the output is written.
    if (std::any_of(instr.inputs.begin(), instr.inputs.end(),
                    [&](ValueId v) { return f.group_of[v] == g && v != x; })) {
      continue;
    }
    return g;
  }
  return -1;
}

Liveness ComputeLiveness(const Program& program, const Facts& f, const std::vector<int32_t>& order,
                         InPlace in_place) {
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
  // Writing in place: the output's bytes are its source's at the step they meet.
  l.in_place_of.assign(num_groups, -1);
  if (in_place != InPlace::kOff) {
    std::vector<int32_t> last_user(num_groups, -1);  // unpinned or not: who reads it last
    for (size_t g = 0; g < num_groups; ++g) {
      for (int32_t u : f.users[g]) last_user[g] = std::max(last_user[g], step_of[u]);
    }
    std::vector<char> taken(num_groups, 0);
    for (int32_t s = 0; s < n; ++s) {
      const int32_t i = order[s];
      const int32_t source = InPlaceSource(program, f, i, s, last_user, taken, in_place);
      if (source < 0) continue;
      taken[source] = 1;
      const ValueId out = program.instructions()[static_cast<size_t>(i)].outputs[0];
      l.in_place_of[f.group_of[out]] = source;
      delta[s] -= f.groups[source].bytes;
      delta[s + 1] += f.groups[source].bytes;
    }
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

// Kahn's algorithm choosing, among ready instructions, the smallest net growth in live bytes (ties:
// the lower index). The ready instructions wait in a min-heap keyed by (growth, index). A ready
// instruction's growth only falls while it waits — when it becomes the last remaining user of a
// group it reads, it will free that group — and then it is pushed again with the new key; the
// stale entry is skipped when it surfaces. O((instructions + reads) · log).
std::vector<int32_t> GreedyOrder(const Program& program, const Facts& f) {
  const auto& instrs = program.instructions();
  const int32_t n = static_cast<int32_t>(instrs.size());
  std::vector<int32_t> remaining_users(f.groups.size());
  for (size_t g = 0; g < f.groups.size(); ++g) remaining_users[g] = f.groups[g].num_users;
  std::vector<int32_t> pending = f.num_predecessors;
  std::vector<int64_t> growth(n, 0);  // alloc − dead at first; the full figure once ready
  for (int32_t i = 0; i < n; ++i) {
    if (instrs[i].op->kind != OpKind::kCompute) continue;
    for (ValueId out : instrs[i].outputs) {
      const StorageGroup& g = f.groups[f.group_of[out]];
      growth[i] += g.bytes;
      if (!g.pinned && g.num_users == 0) growth[i] -= g.bytes;
    }
  }
  // Freed by its last remaining user: counts against that user's growth.
  auto frees_when_last = [&](int32_t g) { return !f.groups[g].pinned && f.groups[g].bytes > 0; };
  using Entry = std::pair<int64_t, int32_t>;  // (growth, instruction)
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> ready;
  std::vector<bool> done(n, false);
  auto make_ready = [&](int32_t i) {
    for (int32_t g : f.reads[i]) {
      if (remaining_users[g] == 1 && frees_when_last(g)) growth[i] -= f.groups[g].bytes;
    }
    ready.emplace(growth[i], i);
  };
  for (int32_t i = 0; i < n; ++i) {
    if (pending[i] == 0) make_ready(i);
  }
  std::vector<int32_t> order;
  order.reserve(n);
  while (!ready.empty()) {
    const auto [key, i] = ready.top();
    ready.pop();
    if (done[i] || key != growth[i]) continue;  // stale
    done[i] = true;
    order.push_back(i);
    for (int32_t g : f.reads[i]) {
      if (--remaining_users[g] != 1 || !frees_when_last(g)) continue;
      for (int32_t u : f.users[g]) {  // once per group: the count reaches 1 once
        if (done[u]) continue;
        if (pending[u] == 0) {  // waiting in the heap: re-key it
          growth[u] -= f.groups[g].bytes;
          ready.emplace(growth[u], u);
        }
        break;
      }
    }
    for (int32_t s : f.successors[i]) {
      if (--pending[s] == 0) make_ready(s);
    }
  }
  SLUICE_CHECK(static_cast<int32_t>(order.size()) == n, "dependency graph of '{}' has a cycle",
               program.name());
  return order;
}

std::string ValueNames(const Program& program, std::span<const ValueId> values) {
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
  Liveness by_program = ComputeLiveness(program, f, program_order, options.in_place);

  ExecutionPlan plan;
  plan.policy = options.order;
  plan.program_order_bound = by_program.bound;
  std::vector<int32_t> order = program_order;
  Liveness live = std::move(by_program);
  if (options.order != OrderPolicy::kProgram) {
    std::vector<int32_t> greedy = GreedyOrder(program, f);
    Liveness by_greedy = ComputeLiveness(program, f, greedy, options.in_place);
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
    const int32_t source = live.in_place_of[g];
    if (source < 0) continue;
    f.groups[g].in_place_of = source;
    f.groups[source].handed_to = static_cast<int32_t>(g);
    ++plan.num_in_place;
    plan.in_place_bytes += f.groups[g].bytes;
  }
  {
    std::vector<std::pair<int32_t, int32_t>> frees;  // (step, group), groups ascending
    for (size_t g = 0; g < f.groups.size(); ++g) {
      if (!f.groups[g].pinned && f.groups[g].last_step >= 0) {
        frees.emplace_back(f.groups[g].last_step, static_cast<int32_t>(g));
      }
    }
    plan.free_lists = GroupByKey(static_cast<size_t>(n), frees);
  }
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
    return fmt::format("{}({})", instr.op->name, ValueNames(program, instr.inputs));
  }
  return fmt::format("{} = {}({})", ValueNames(program, instr.outputs), instr.op->name,
                     ValueNames(program, instr.inputs));
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
    std::string text = DescribeInstruction(program, order[s]);
    const Instruction& instr = program.instructions()[static_cast<size_t>(order[s])];
    if (instr.op->kind == OpKind::kCompute && !instr.outputs.empty()) {
      const int32_t source = groups[group_of[instr.outputs[0]]].in_place_of;
      if (source >= 0)
        text += fmt::format(" [in place of %{}]", program.value(groups[source].root).name);
    }
    std::string freed;
    for (int32_t g : FreeList(static_cast<int32_t>(s))) {
      if (!freed.empty()) freed += ", ";
      freed += groups[g].handed_to >= 0
                   ? fmt::format("{} (handed to %{})", ValueNames(program, members[g]),
                                 program.value(groups[groups[g].handed_to].root).name)
                   : fmt::format("{} ({})", ValueNames(program, members[g]),
                                 FormatBytes(groups[g].bytes));
    }
    out += fmt::format("  {:>4}  #{:<5} {:>10}  {}{}{}\n", s, order[s], FormatBytes(live_bytes[s]),
                       text, freed.empty() ? "" : "  →  ", freed);
  }
  out += fmt::format("  liveness lower bound: {} ({} bytes) at step {}\n",
                     FormatBytes(liveness_bound), liveness_bound, peak_step);
  if (num_in_place > 0) {
    out += fmt::format("  written in place: {} outputs, {} not allocated anew\n", num_in_place,
                       FormatBytes(in_place_bytes));
  }
  return out;
}

}  // namespace sluice
