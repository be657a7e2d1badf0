// Analysis: everything the interpreter decides before the first run — the execution order, which
// values share a storage, the free list of every step, the dependency graph for parallel runs and
// the liveness lower bound. The result (ExecutionPlan) is immutable and knows nothing about
// tensors; the interpreter (exec/interpreter.h) only follows it.
//
// Storage groups. A kCompute instruction's outputs get fresh storages; a kView instruction's
// outputs alias the storage of its input 0 (transitively: a view of a view shares the first base's
// storage). A *storage group* is one storage and every value aliasing it: its root (a program
// input, a parameter or a kCompute output) and the views of it. The group is the unit of freeing:
// it dies after the last use of *any* member, so a base outlives its views.
//
// Pinned groups are never freed by the interpreter: groups containing a program input (unless
// donated), a parameter, a program output, or a value named in `keep` (values another program
// reads later, such as the activations a backward program saves).
//
// Execution order (OrderPolicy):
//   kProgram  the instructions in program order (already topological);
//   kGreedy   Kahn's algorithm that, among the ready instructions, runs the one with the smallest
//             net growth (bytes it allocates − bytes its completion frees), ties broken by the
//             lower program index. A heuristic: it can lose to program order;
//   kBest     (default) both, keeping the one with the smaller liveness bound; program order on a
//             tie. Deterministic: it depends on the program only.
// Every order respects data dependencies and the hazards of in-place instructions (readers of a
// group before an in-place update in program order run before it, readers after run after it).
//
// Cost. Near-linear in the program, for programs of millions of instructions: the hazards are
// chained (each user of a group is tied to its nearest in-place users, never one edge per pair),
// so the dependency edges are at most one per input plus two per (group, reader); every list is a
// flat CsrLists; the greedy order keeps its ready instructions in a min-heap — O((instructions +
// reads) · log instructions). Figures: docs/benchmarks.md, "Setup".
//
// Free lists. For the chosen order, step s's free list holds the unpinned groups whose last user
// is the instruction at step s (a group nobody reads is freed right after its producer).
//
// Parallel runs. The dependency graph (successor lists, predecessor counts) drives a pool of
// threads; the order of independent instructions is then unknown, so a group read by several
// instructions is released by an atomic count of its users (`num_users`), decremented by each
// user when it finishes; the one reaching zero frees. A group with one user (or none) is freed by
// that user (or its producer) without any atomic.
//
// Writing in place. An instruction whose op lists input j in OpDef::in_place_inputs (elementwise
// ops: unary functions, their gradients, binary ops on an operand of the output's shape) may write
// output 0 into input j's storage instead of a fresh one, when, in the chosen order, that input
// dies at this instruction. The input's group g must be: rooted at a kCompute output of this
// program (not an input, a parameter or a donated input, whose storage another may share),
// unpinned, read by the instruction through one operand only, its root or a reshape of it (an
// imported linear's [B·T, n] result read as [B, T, n]; no other view of it among the operands), of
// the output's shape and element width (so of its bytes), with no later reader — the instruction is
// g's last user; and no other output took g over. Under InPlace::kAnyOrder (parallel runs, whose
// order is not fixed) g must also have this instruction as its only user (besides the reshapes
// leading to its operand). Then the output's group takes over g's storage (groups[out].in_place_of
// = g, groups[g].handed_to = out): g's free list entry at this step only drops its handles (the
// memory now belongs to the output), and the bytes count once: live(s) below subtracts bytes(g)
// at the step. Chains (relu over a conv output, then relu_grad over the incoming gradient, then an
// add of gradients over that) pass one storage along.
//
// Liveness lower bound. bytes(g) is the size of a group's root when the interpreter allocates it
// (kCompute outputs); groups rooted at inputs and parameters belong to the caller and cost 0 here,
// except donated inputs, which the run frees and which count from step 0; views cost nothing (they
// are members of their base's group). Group g is alive during steps def(g)..last(g) (its
// producer's step, or 0 when donated, through its last user's; to the end when pinned). Step s
// allocates its outputs before running and frees its free list after, so
//     live(s) = Σ bytes(g) over groups with def(g) ≤ s ≤ last(g)
//               − Σ bytes(g) over groups handed over at step s (the output's bytes are g's),
//     liveness_bound = max over s of live(s)   (0 for an empty program).
// This is exactly the peak of allocated bytes (requested-bytes accounting) of a trace run with sync
// GC on an allocator that holds nothing else, as long as kernels take no scratch memory from it.
//
// Thread-safety: Analyze is a pure function; an ExecutionPlan is immutable and may be shared.
// Failure modes: Analyze throws ProgramError when `keep` names a value the program does not have or
// `donate` names something other than a program input.
//
// Example:
//   ExecutionPlan plan = Analyze(program, {.order = OrderPolicy::kBest, .keep = {"h"}});
//   for (int32_t g : plan.FreeList(0)) ...;        // groups to free after step 0
//   fmt::print("{}", plan.Describe(program));      // order, frees and live bytes, by value name
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/enum_names.h"
#include "sluice/ir/program.h"

namespace sluice {

enum class OrderPolicy : uint8_t { kProgram, kGreedy, kBest };

inline constexpr EnumEntry<OrderPolicy> kOrderPolicyNames[] = {
    {OrderPolicy::kProgram, "program"},
    {OrderPolicy::kGreedy, "greedy"},
    {OrderPolicy::kBest, "best"},
};
static_assert(IsCompleteEnumTable(kOrderPolicyNames));

// The policy's name in kOrderPolicyNames, and back (nullopt for any other text).
std::string_view Name(OrderPolicy policy);
std::optional<OrderPolicy> ParseOrderPolicy(std::string_view name);

// Whether outputs may be written into dying inputs (see "Writing in place" above).
enum class InPlace : uint8_t {
  kOff,         // every kCompute output in fresh storage
  kTraceOrder,  // (default) an input whose last user, in the chosen order, is the instruction
  kAnyOrder,    // an input whose only user is the instruction (parallel runs)
};

struct AnalysisOptions {
  OrderPolicy order = OrderPolicy::kBest;
  InPlace in_place = InPlace::kTraceOrder;
  // Values (by name) never freed and left in the scope after a run, in addition to the outputs.
  std::vector<std::string> keep;
  // Program inputs (by name) handed over to the run: taken out of the scope and freed at their last
  // use like intermediates (a backward program donating the activations the forward saved). A
  // donated input that is also an output or kept stays pinned.
  std::vector<std::string> donate;
};

// One storage and the values aliasing it.
struct StorageGroup {
  ValueId root = kNoValue;  // an input, a parameter or a kCompute output
  int64_t bytes = 0;      // bytes the run holds for the root; 0 for inputs (unless donated), params
  bool pinned = false;    // never freed by the interpreter
  int32_t num_users = 0;  // distinct instructions reading any member
  int32_t def_step = -1;  // step of the root's producer (0 if donated); -1 for inputs and params
  int32_t last_step = -1;  // step after which it is freed; -1 when pinned
  // Writing in place: the group whose storage this group's root is written into (its producer
  // is the input group's last user), and the other way round; -1 for none.
  int32_t in_place_of = -1;
  int32_t handed_to = -1;
};

// Offsets into a flat array: the items of entry i are [begin[i], begin[i + 1]).
struct CsrLists {
  std::vector<int32_t> begin{0};
  std::vector<int32_t> items;

  std::span<const int32_t> operator[](size_t i) const {
    return {items.data() + begin[i], static_cast<size_t>(begin[i + 1] - begin[i])};
  }
  size_t size() const { return begin.size() - 1; }
  void Append(std::span<const int32_t> list) {
    items.insert(items.end(), list.begin(), list.end());
    begin.push_back(static_cast<int32_t>(items.size()));
  }
};

struct ExecutionPlan {
  OrderPolicy policy = OrderPolicy::kBest;     // as asked
  OrderPolicy chosen = OrderPolicy::kProgram;  // kProgram or kGreedy
  int64_t program_order_bound = 0;             // liveness bound of program order (for reports)
  int64_t greedy_order_bound = -1;  // liveness bound of the greedy order; -1 when not computed

  std::vector<int32_t> order;    // step -> instruction index
  std::vector<int32_t> step_of;  // instruction index -> step

  std::vector<StorageGroup> groups;
  std::vector<int32_t> group_of;  // value -> its group
  CsrLists members;               // group -> its values, root first, views in program order

  CsrLists free_lists;              // step -> groups freed after it (trace runs)
  std::vector<int64_t> live_bytes;  // step -> live(s)
  int64_t liveness_bound = 0;
  int32_t peak_step = -1;      // first step reaching the bound; -1 for an empty program
  int32_t num_in_place = 0;    // outputs written into a dying input's storage
  int64_t in_place_bytes = 0;  // their bytes (what fresh storage for them would have added)

  // Parallel runs, indexed by instruction (not step).
  CsrLists successors;  // instructions that wait for this one (deduplicated)
  std::vector<int32_t> num_predecessors;
  CsrLists releases;  // unpinned groups this instruction finishes using: the groups
                      // it reads, plus its own outputs' groups nobody reads

  size_t num_steps() const { return order.size(); }
  std::span<const int32_t> FreeList(int32_t step) const {
    return free_lists[static_cast<size_t>(step)];
  }
  // Number of unpinned groups (the frees of one run, whatever the GC mode).
  int32_t NumFreeable() const;

  // A readable listing: every step with its instruction ("%h = matmul(%x, %w)"), live bytes and
  // free list by value name, then the bound. For --verbose / SLUICE_VERBOSE=1.
  std::string Describe(const Program& program) const;
};

// Analyses a verified program. See the top of this file for what is computed.
ExecutionPlan Analyze(const Program& program, const AnalysisOptions& options = {});

// Instruction `instruction` as Describe lists it: "%h = matmul(%x, %w)".
std::string DescribeInstruction(const Program& program, int32_t instruction);

// "1.5 MiB", "512 B": bytes for humans (reports and Describe).
std::string FormatBytes(int64_t bytes);

}  // namespace sluice
