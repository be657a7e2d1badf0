#include "sluice/exec/interpreter.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>
#include <typeinfo>

#include <fmt/format.h>

#include "sluice/core/clock.h"
#include "sluice/core/error.h"
#include "sluice/core/thread_pool.h"
#include "sluice/exec/cycle_clock.h"
#include "sluice/exec/ready_queue.h"
#include "sluice/exec/reference_runner.h"
#include "sluice/ir/verifier.h"

namespace sluice {

namespace {

// Drops one reference to a tensor's storage (the handle DetachStorage returns dies at once),
// leaving the tensor undefined. Cheaper than assigning Tensor(), which rewrites the whole shape.
void Drop(Tensor& t) { (void)t.DetachStorage(); }

bool VerboseFromEnv() {
  const char* v = std::getenv("SLUICE_VERBOSE");
  return v != nullptr && std::strcmp(v, "") != 0 && std::strcmp(v, "0") != 0;
}

// What one instruction needs at run time, with its operands as offsets into flat arrays.
struct Step {
  const OpDef* op = nullptr;
  const Attrs* attrs = nullptr;
  int32_t in_begin = 0, in_count = 0;
  int32_t out_begin = 0, out_count = 0;
  ValueId first_output = kNoValue;
  // Output ids are consecutive: the kernel writes the slots directly.
  bool outputs_adjacent = false;
};

// A slot a trace run with sync GC empties after a step (Executable::Impl::sync_drops).
struct SlotDrop {
  Tensor* slot;
  bool vacate;  // the root of a group the run computes
};

// Empties a slot of the sync drops. A computed root whose slot holds the only reference keeps its
// storage object, vacated (Storage::Vacate): the memory goes back to the allocator at the moment
// the last reference's drop would have freed it, and the next run's Tensor::AssignEmpty refills the
// storage instead of making a new one. Anything else drops its reference.
void Release(const SlotDrop& d) {
  const std::shared_ptr<Storage>& storage = d.slot->storage();
  if (d.vacate && storage != nullptr && storage.use_count() == 1 && !storage->borrowed()) {
    storage->Vacate();
  } else {
    Drop(*d.slot);
  }
}

// GC timing samples one freeing instruction in kGcTimingSample, the first included, and scales
// the timed ticks by freeing instructions / timed ones: two CycleClock reads around every free
// cost 36 ns per instruction on a VM whose time-stamp counter is slow to read (the 64-float add
// chain: 30 ns untimed, 66 ns timed), where one in eight costs 5 ns.
constexpr int64_t kGcTimingSample = 8;

// The state of one executing thread.
struct Worker {
  // Scratch outputs, sized to the largest arity, for an instruction whose outputs are not adjacent.
  std::vector<Tensor> outs;
  int64_t gc_ticks = 0;        // CycleClock ticks of the timed GC steps
  int64_t gc_steps = 0;        // GC steps (the releases after one instruction) while timing is on
  int64_t gc_timed_steps = 0;  // those of them timed
  int64_t frees = 0;
  int64_t fallbacks = 0;
  ThreadTrace* trace = nullptr;  // null when the run is not traced
  int64_t origin_ns = 0;

  // Whether to time this GC step (counts it either way while timing is on).
  bool TimeGcStep(bool timing) { return timing && gc_steps++ % kGcTimingSample == 0; }
  void AddTimedGcStep(int64_t ticks) {
    gc_ticks += ticks;
    ++gc_timed_steps;
  }
  // The estimate of the thread's GC time: the timed steps' mean, times the steps.
  int64_t GcNs() const {
    if (gc_timed_steps == 0) return 0;
    return static_cast<int64_t>(static_cast<double>(CycleClock::ToNs(gc_ticks)) *
                                static_cast<double>(gc_steps) /
                                static_cast<double>(gc_timed_steps));
  }
};

// Records the async GC worker's batches into a run trace (runs on the worker thread).
class TraceListener final : public GcListener {
 public:
  TraceListener(ThreadTrace& thread, Allocator& allocator, int64_t origin_ns)
      : thread_(thread), allocator_(allocator), origin_ns_(origin_ns) {}
  void OnBatchDestroyed(int32_t tag, int32_t storages, int64_t bytes, int64_t begin_ns,
                        int64_t end_ns) override {
    thread_.gc.push_back({tag, storages, bytes, begin_ns - origin_ns_, end_ns - origin_ns_});
    thread_.memory.push_back({end_ns - origin_ns_, allocator_.Stats().allocated_bytes});
  }

 private:
  ThreadTrace& thread_;
  Allocator& allocator_;
  int64_t origin_ns_;
};

}  // namespace

std::string_view Name(RunMode mode) { return EnumName(kRunModeNames, mode); }

std::optional<RunMode> ParseRunMode(std::string_view name) {
  return ParseEnum(kRunModeNames, name);
}

struct Executable::Impl {
  Program program;
  ExecutableOptions options;
  Allocator* allocator;
  GcMode gc_mode;  // options.gc resolved against the allocator: never kAuto
  ExecutionPlan plan;

  std::vector<Step> steps;              // by instruction
  std::vector<ValueId> operand_values;  // flat inputs of every instruction
  // The tensors of operand_values, where their slots (or the scope) hold them: a kernel reads its
  // inputs through these pointers, so passing them costs no handle copy and no reference-count
  // update. Fixed at construction for values with slots of their own; rewritten by Bind at the
  // positions in bound_operands (inputs and parameters). A slot is only written by its value's
  // producer, before any reader runs, and cleared after its group's last reader (parallel runs
  // count the readers), so the pointers stay valid while a reader runs.
  std::vector<const Tensor*> operand_slots;
  std::vector<int32_t> bound_operands;
  std::vector<ValueId> result_values;  // flat outputs of every instruction
  // Their types: pointers into program's values, which never change.
  std::vector<const TensorType*> result_types;
  std::vector<ValueId> bound;    // inputs and params, bound from the scope
  std::vector<ValueId> results;  // outputs and kept values, left in the scope
  std::vector<ValueId> stale;    // results computed by the program: dropped from the scope first
  // Values of pinned groups with slots of their own: the only ones set after a GC run.
  std::vector<ValueId> held_at_end;
  std::vector<bool> donated;  // value -> taken out of the scope when bound

  // value -> its tensor during a run. A value the run computes (or a donated input) has a slot of
  // its own in `own`, fixed at construction, in value order (so that an instruction's adjacent
  // outputs have adjacent slots); an input or parameter is read where the scope holds it (set by
  // Bind) — a slot per bound value would cost 168 bytes each (docs/benchmarks.md, "Setup").
  std::vector<Tensor*> slots;
  std::vector<Tensor> own;
  // Contiguous copies of the bindings that are not contiguous (this run only). Reserved for every
  // bound value at the first copy, so that pointers into it stay valid.
  std::vector<Tensor> bound_copies;

  // Static memory plan (empty in dynamic mode). A planned group's storage is borrowed: created
  // once, pointed at its offset of the arena while a run holds the arena.
  ArenaPlan arena;
  std::vector<int32_t> planned_groups;
  std::vector<std::shared_ptr<Storage>> group_storage;  // group -> borrowed storage, or null
  // Flat result index -> its planned storage (null: allocated); empty in dynamic mode.
  std::vector<const std::shared_ptr<Storage>*> result_storage;
  // Flat result index -> the slot of the dying input whose storage it is written into (null:
  // allocated); empty when the plan writes nothing in place.
  std::vector<const Tensor*> result_source;
  void* arena_data = nullptr;  // held from AcquireArena to ReleaseArena
  std::vector<Worker> workers;

  // Trace runs with sync GC: step -> the slots its free list empties, each group's views before its
  // root (so that the root's slot then holds the last reference), a planned root excepted (it
  // keeps its tensor; see ReleaseGroup).
  std::vector<SlotDrop> sync_drops;
  std::vector<int32_t> sync_drops_begin;

  // GC: one preallocated batch per instruction, sized for everything it can release.
  std::vector<std::shared_ptr<Storage>> handles;
  std::vector<GarbageBatch> batches;
  std::unique_ptr<AsyncGarbageCollector> gc;

  // Parallel runs.
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<ReadyQueue> ready;
  std::unique_ptr<std::atomic<int32_t>[]> pending;     // instruction -> predecessors not done
  std::unique_ptr<std::atomic<int32_t>[]> users_left;  // group -> users not done
  std::atomic<int32_t> remaining{0};                   // instructions not done
  std::mutex error_mu;
  std::exception_ptr error;  // guarded by error_mu: first failure of a parallel run

  std::atomic<bool> running{false};

  Impl(Program p, ExecutableOptions o);
  void Prepare();
  RunStats Run(Scope& scope, RunTrace* trace);
  void Bind(Scope& scope);
  void PrepareSyncDrops();
  // Runs instruction i; a user-facing error it raises names the instruction.
  void Execute(int32_t i, Worker& w);
  void ExecuteUnnamed(int32_t i, Worker& w);
  void AcquireArena();
  void ReleaseArena();
  bool Planned(int32_t g) const { return !arena.offset.empty() && arena.offset[g] >= 0; }
  void ReleaseGroup(int32_t g);
  void DetachGroup(int32_t g, GarbageBatch& batch);
  void ReleaseAfter(int32_t i, std::span<const int32_t> groups, bool counted, Worker& w);
  void RunTraceMode();
  void RunParallelMode();
  void ParallelMember(int member);
  int64_t ReleaseUnpinned();
  void DropSlots(bool all);
};

Executable::Impl::Impl(Program p, ExecutableOptions o)
    : program(std::move(p)),
      options(std::move(o)),
      allocator(options.allocator != nullptr ? options.allocator : &DefaultAllocator()),
      gc_mode(ResolveGcMode(options.gc, *allocator)) {
  VerifyOnce(program);
  InPlace in_place = InPlace::kTraceOrder;
  if (!options.in_place || options.memory_plan == MemoryPlanMode::kStatic) {
    in_place = InPlace::kOff;  // a static plan places every intermediate in its own arena slot
  } else if (options.mode == RunMode::kParallel) {
    in_place = InPlace::kAnyOrder;
  }
  plan = Analyze(program, {.order = options.order,
                           .in_place = in_place,
                           .keep = options.keep,
                           .donate = options.donate});
  if (options.threads < 0) {
    throw InvalidArgument(fmt::format("executable '{}': threads must be ≥ 0, got {}",
                                      program.name(), options.threads));
  }
  if (options.memory_plan == MemoryPlanMode::kStatic && options.mode != RunMode::kTrace) {
    throw InvalidArgument(fmt::format(
        "executable '{}': memory plan static needs run mode trace (the plan follows the trace "
        "order), not {}",
        program.name(), Name(options.mode)));
  }
  Prepare();
  if (options.verbose || VerboseFromEnv()) {
    // Written as far as stderr takes it: a debug line on a full or closed stderr
    // (`SLUICE_VERBOSE=1 sluice train 2>/dev/full`) is lost, not an exception that ends the run.
    const std::string line = fmt::format(
        "{}  run mode {}, gc {}, memory plan {}{}, {} executor thread(s)\n", plan.Describe(program),
        Name(options.mode), DescribeGcMode(options.gc, gc_mode), Name(options.memory_plan),
        options.memory_plan == MemoryPlanMode::kStatic ? ": " + arena.Describe() : "",
        workers.size());
    [[maybe_unused]] const size_t written = std::fwrite(line.data(), 1, line.size(), stderr);
  }
}

void Executable::Impl::Prepare() {
  const auto& instrs = program.instructions();
  const size_t n = instrs.size();
  size_t max_out = 0;
  steps.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const Instruction& instr = instrs[i];
    Step& st = steps[i];
    st.op = instr.op;
    st.attrs = &instr.attrs;
    st.in_begin = static_cast<int32_t>(operand_values.size());
    st.in_count = static_cast<int32_t>(instr.inputs.size());
    operand_values.insert(operand_values.end(), instr.inputs.begin(), instr.inputs.end());
    st.out_begin = static_cast<int32_t>(result_values.size());
    st.out_count = static_cast<int32_t>(instr.outputs.size());
    for (ValueId v : instr.outputs) {
      result_values.push_back(v);
      result_types.push_back(&program.type(v));
    }
    st.first_output = instr.outputs.empty() ? kNoValue : instr.outputs[0];
    st.outputs_adjacent = true;
    for (size_t k = 0; k < instr.outputs.size(); ++k) {
      st.outputs_adjacent &= instr.outputs[k] == st.first_output + static_cast<ValueId>(k);
    }
    max_out = std::max(max_out, instr.outputs.size());
  }
  bound = program.inputs();
  bound.insert(bound.end(), program.params().begin(), program.params().end());
  results = program.outputs();
  for (const std::string& name : options.keep) results.push_back(program.Get(name));
  std::sort(results.begin(), results.end());
  results.erase(std::unique(results.begin(), results.end()), results.end());
  for (ValueId v : results) {
    if (program.value(v).kind == ValueKind::kIntermediate) stale.push_back(v);
  }
  donated.assign(program.values().size(), false);
  for (const std::string& name : options.donate) donated[program.Get(name)] = true;
  // A slot of its own for every value but the inputs and parameters read from the scope.
  auto owns_slot = [&](ValueId v) {
    return program.value(v).kind == ValueKind::kIntermediate || donated[v];
  };
  const size_t num_values = program.values().size();
  size_t num_own = 0;
  for (size_t v = 0; v < num_values; ++v) num_own += owns_slot(static_cast<ValueId>(v));
  own.resize(num_own);
  slots.assign(num_values, nullptr);
  for (size_t v = 0, k = 0; v < num_values; ++v) {
    if (owns_slot(static_cast<ValueId>(v))) slots[v] = &own[k++];
  }
  operand_slots.resize(operand_values.size());
  for (size_t p = 0; p < operand_values.size(); ++p) {
    operand_slots[p] = slots[operand_values[p]];
    if (operand_slots[p] == nullptr) bound_operands.push_back(static_cast<int32_t>(p));
  }
  for (size_t g = 0; g < plan.groups.size(); ++g) {
    if (!plan.groups[g].pinned) continue;
    for (ValueId v : plan.members[g]) {
      if (owns_slot(v)) held_at_end.push_back(v);
    }
  }
  for (const std::string& name : options.donate) {
    held_at_end.push_back(program.Get(name));  // freed by the free lists, unless nothing runs
  }

  if (options.memory_plan == MemoryPlanMode::kStatic) {
    arena = PlanArena(program, plan);
    group_storage.resize(plan.groups.size());
    for (size_t g = 0; g < plan.groups.size(); ++g) {
      if (!arena.planned(static_cast<int32_t>(g))) continue;
      planned_groups.push_back(static_cast<int32_t>(g));
      group_storage[g] = Storage::Borrowed(*allocator, static_cast<size_t>(plan.groups[g].bytes));
    }
    result_storage.assign(result_values.size(), nullptr);
    for (size_t r = 0; r < result_values.size(); ++r) {
      const int32_t g = plan.group_of[result_values[r]];
      if (Planned(g) && plan.groups[g].root == result_values[r]) {
        result_storage[r] = &group_storage[g];
      }
    }
  }

  if (plan.num_in_place > 0) {
    result_source.assign(result_values.size(), nullptr);
    for (size_t r = 0; r < result_values.size(); ++r) {
      const StorageGroup& group = plan.groups[plan.group_of[result_values[r]]];
      if (group.root != result_values[r] || group.in_place_of < 0) continue;
      result_source[r] = slots[plan.groups[group.in_place_of].root];
    }
  }

  const bool parallel = options.mode == RunMode::kParallel;
  int threads = 1;
  if (parallel) {
    threads = options.threads > 0
                  ? options.threads
                  : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    pool = std::make_unique<ThreadPool>(threads);
    ready = std::make_unique<ReadyQueue>(n);
    pending = std::make_unique<std::atomic<int32_t>[]>(n);
    users_left = std::make_unique<std::atomic<int32_t>[]>(plan.groups.size());
  }
  workers.resize(static_cast<size_t>(threads));
  for (Worker& w : workers) w.outs.resize(max_out);
  if (!parallel && gc_mode == GcMode::kSync) PrepareSyncDrops();

  if (gc_mode == GcMode::kAsync) {
    // Batch i holds what instruction i can release: its trace free list or its parallel releases.
    std::vector<int32_t> capacity(n, 0);
    for (size_t i = 0; i < n; ++i) {
      capacity[i] = static_cast<int32_t>(parallel ? plan.releases[i].size()
                                                  : plan.FreeList(plan.step_of[i]).size());
    }
    int64_t total = 0;
    for (int32_t c : capacity) total += c;
    handles.resize(static_cast<size_t>(total));
    batches.reserve(n);
    int64_t offset = 0;
    for (size_t i = 0; i < n; ++i) {
      batches.emplace_back(
          std::span(handles).subspan(static_cast<size_t>(offset), static_cast<size_t>(capacity[i])),
          static_cast<int32_t>(i));
      offset += capacity[i];
    }
    gc = std::make_unique<AsyncGarbageCollector>(options.async, /*multi_producer=*/parallel);
  }
}

void Executable::Impl::PrepareSyncDrops() {
  sync_drops_begin.assign(1, 0);
  for (size_t s = 0; s < plan.num_steps(); ++s) {
    for (int32_t g : plan.FreeList(static_cast<int32_t>(s))) {
      std::span<const int32_t> members = plan.members[g];
      for (size_t k = 1; k < members.size(); ++k) sync_drops.push_back({slots[members[k]], false});
      if (Planned(g)) continue;
      const ValueId root = members[0];
      // A group handed over to an output written in place only drops its reference.
      sync_drops.push_back({slots[root], program.value(root).kind == ValueKind::kIntermediate &&
                                             plan.groups[g].handed_to < 0});
    }
    sync_drops_begin.push_back(static_cast<int32_t>(sync_drops.size()));
  }
}

void Executable::Impl::Bind(Scope& scope) {
  for (ValueId v : stale) scope.Erase(program.value(v).name);
  for (ValueId v : bound) {
    const Value& value = program.value(v);
    const Tensor* t = scope.Find(value.name);
    if (t == nullptr) {
      throw ProgramError(fmt::format("program '{}': {} %{} ({}) is not bound in the scope",
                                     program.name(),
                                     value.kind == ValueKind::kParam ? "parameter" : "input",
                                     value.name, program.type(v).ToString()));
    }
    CheckBinding(program, v, *t);
  }
  // Every binding is valid: only now take the donated inputs out of the scope.
  for (ValueId v : bound) {
    const std::string& name = program.value(v).name;
    if (donated[v]) {
      Tensor t = scope.Take(name);
      *slots[v] = t.is_contiguous() ? std::move(t) : t.Contiguous(*allocator);
      continue;
    }
    Tensor* t = scope.FindMutable(name);
    if (t->is_contiguous()) {
      slots[v] = t;
      continue;
    }
    if (bound_copies.empty()) bound_copies.reserve(bound.size());
    bound_copies.push_back(t->Contiguous(*allocator));
    slots[v] = &bound_copies.back();
  }
  for (int32_t p : bound_operands) operand_slots[p] = slots[operand_values[p]];
}

// Allocates instruction i's outputs, runs its kernel and leaves its outputs in their slots.
// Rethrows the error in flight with the instruction that raised it named in front — "program
// 'gpt', instruction 41 (cross_entropy %loss): target -7 at position 0 …" — as its own type, for
// the user-facing types of core/error.h; any other error (a communicator's, a stage's) unchanged.
[[noreturn]] void RethrowNamingInstruction(const Error& e, const std::string& where) {
  const std::string m = fmt::format("{}: {}", where, e.what());
  const std::type_info& t = typeid(e);
  if (t == typeid(InvalidArgument)) throw InvalidArgument(m);
  if (t == typeid(ShapeError)) throw ShapeError(m);
  if (t == typeid(ProgramError)) throw ProgramError(m);
  if (t == typeid(IoError)) throw IoError(m);
  if (t == typeid(OutOfMemory)) throw OutOfMemory(m);
  if (t == typeid(ResourceError)) throw ResourceError(m);
  if (t == typeid(NonFiniteError)) throw NonFiniteError(m);
  if (t == typeid(Error)) throw Error(m);
  throw;
}

void Executable::Impl::Execute(int32_t i, Worker& w) {
  try {
    ExecuteUnnamed(i, w);
  } catch (const Error& e) {
    const Step& st = steps[i];
    const std::string out =
        st.out_count > 0 ? "%" + program.value(result_values[st.out_begin]).name : "-";
    RethrowNamingInstruction(e, fmt::format("program '{}', instruction {} ({} {})", program.name(),
                                            i, st.op->name, out));
  }
}

void Executable::Impl::ExecuteUnnamed(int32_t i, Worker& w) {
  const Step& st = steps[i];
  // Outputs go straight into their slots when adjacent (always, for programs built by Program).
  Tensor* outs = st.outputs_adjacent && st.out_count > 0 ? slots[st.first_output] : w.outs.data();
  if (st.op->kind == OpKind::kCompute) {
    for (int32_t k = 0; k < st.out_count; ++k) {
      const TensorType& t = *result_types[st.out_begin + k];
      const std::shared_ptr<Storage>* planned =
          result_storage.empty() ? nullptr : result_storage[st.out_begin + k];
      const Tensor* source = result_source.empty() ? nullptr : result_source[st.out_begin + k];
      if (source != nullptr) {
        // Written in place: the dying input's storage (its group only drops its handles after).
        if (outs[k].storage() != source->storage()) {
          outs[k] = Tensor::OnStorage(source->storage(), t.shape, t.dtype);
        }
      } else if (planned == nullptr) {
        outs[k].AssignEmpty(t.shape, t.dtype, *allocator);
      } else if (outs[k].storage() != *planned) {
        // Made at the first run; the slot keeps it from then on (ReleaseGroup leaves a planned
        // root alone), so a planned output costs no handle and no reference count per run.
        outs[k] = Tensor::OnStorage(*planned, t.shape, t.dtype);
      }
    }
    if (w.trace != nullptr) {
      w.trace->memory.push_back({NowNs() - w.origin_ns, allocator->Stats().allocated_bytes});
    }
  }
  const Tensor* const* ins = operand_slots.data() + st.in_begin;
  KernelContext ctx{KernelInputs({ins, static_cast<size_t>(st.in_count)}),
                    {outs, static_cast<size_t>(st.out_count)},
                    *st.attrs,
                    *allocator};
  st.op->kernel(ctx);
  const ValueId* out = result_values.data() + st.out_begin;
  if (st.op->kind == OpKind::kView) {
    for (int32_t k = 0; k < st.out_count; ++k) {
      SLUICE_CHECK(outs[k].defined() && outs[k].storage() == ins[0]->storage(),
                   "view op '{}' did not alias its input for %{}", st.op->name,
                   program.value(out[k]).name);
    }
  }
  if (outs == w.outs.data()) {
    for (int32_t k = 0; k < st.out_count; ++k) *slots[out[k]] = std::move(outs[k]);
  }
}

// Drops every reference to group g's storage; the last one frees it (sync GC). A planned group's
// root (members[0]) keeps its handle on the borrowed storage in its slot for the next run: its
// arena bytes stay held either way, and its next writer finds the tensor made.
void Executable::Impl::ReleaseGroup(int32_t g) {
  std::span<const int32_t> members = plan.members[g];
  for (size_t k = Planned(g) ? 1 : 0; k < members.size(); ++k) Drop(*slots[members[k]]);
}

// Drops the views' references and moves the root's storage into `batch` (async GC).
void Executable::Impl::DetachGroup(int32_t g, GarbageBatch& batch) {
  std::span<const int32_t> members = plan.members[g];
  for (size_t k = 1; k < members.size(); ++k) Drop(*slots[members[k]]);
  batch.Add(slots[members[0]]->DetachStorage());
}

// Releases `groups` after instruction i ran. With `counted` (parallel runs) a group read by several
// instructions is released only by the user whose decrement reaches zero.
void Executable::Impl::ReleaseAfter(int32_t i, std::span<const int32_t> groups, bool counted,
                                    Worker& w) {
  if (groups.empty()) return;
  const bool timed = w.TimeGcStep(options.measure_gc_time);
  const int64_t begin_ticks = timed ? CycleClock::Now() : 0;
  const int64_t begin_ns = w.trace != nullptr ? NowNs() : 0;
  int32_t freed = 0, storages = 0, planned = 0, handed = 0;
  int64_t bytes = 0;
  GarbageBatch* batch = gc_mode == GcMode::kAsync ? &batches[i] : nullptr;
  for (int32_t g : groups) {
    if (counted && plan.groups[g].num_users >= 2 &&
        users_left[g].fetch_sub(1, std::memory_order_acq_rel) != 1) {
      continue;
    }
    ++freed;
    if (Planned(g)) {  // its arena bytes stay held: only the handles go
      ReleaseGroup(g);
      ++planned;
      continue;
    }
    if (plan.groups[g].handed_to >= 0) {  // the output written in place holds the storage now
      ReleaseGroup(g);
      ++handed;
      continue;
    }
    bytes += plan.groups[g].bytes;
    if (batch != nullptr) {
      DetachGroup(g, *batch);
    } else {
      ReleaseGroup(g);
    }
  }
  if (batch != nullptr && !batch->empty()) {
    storages = batch->count();
    if (batch->bytes() < options.async.min_batch_bytes) {
      batch->Destroy();  // too small to be worth a hand-over
    } else if (!gc->Submit(batch)) {
      batch->Destroy();  // back-pressure: the queue or the pending budget is full
      ++w.fallbacks;
    }
  }
  if (timed) w.AddTimedGcStep(CycleClock::Now() - begin_ticks);
  w.frees += freed;
  if (w.trace != nullptr && freed > 0) {
    const int64_t end_ns = NowNs();
    w.trace->gc.push_back({i, batch != nullptr ? storages + planned + handed : freed, bytes,
                           begin_ns - w.origin_ns, end_ns - w.origin_ns});
    w.trace->memory.push_back({end_ns - w.origin_ns, allocator->Stats().allocated_bytes});
  }
}

void Executable::Impl::RunTraceMode() {
  Worker& w = workers[0];
  if (!sync_drops_begin.empty() && w.trace == nullptr) {
    // Sync GC with nothing to record: each step's free list is its precomputed drops.
    const bool timing = options.measure_gc_time;
    for (size_t s = 0; s < plan.num_steps(); ++s) {
      Execute(plan.order[s], w);
      const int32_t begin = sync_drops_begin[s], end = sync_drops_begin[s + 1];
      if (begin == end) continue;
      const bool timed = w.TimeGcStep(timing);
      const int64_t begin_ticks = timed ? CycleClock::Now() : 0;
      for (int32_t d = begin; d < end; ++d) Release(sync_drops[d]);
      if (timed) w.AddTimedGcStep(CycleClock::Now() - begin_ticks);
    }
    w.frees += static_cast<int64_t>(plan.free_lists.items.size());
    return;
  }
  const bool release = gc_mode != GcMode::kNone;
  for (size_t s = 0; s < plan.num_steps(); ++s) {
    const int32_t i = plan.order[s];
    if (w.trace != nullptr) {
      const int64_t begin = NowNs();
      Execute(i, w);
      w.trace->instructions.push_back({i, begin - w.origin_ns, NowNs() - w.origin_ns});
    } else {
      Execute(i, w);
    }
    if (release) ReleaseAfter(i, plan.FreeList(static_cast<int32_t>(s)), /*counted=*/false, w);
  }
}

void Executable::Impl::RunParallelMode() {
  const int32_t n = static_cast<int32_t>(plan.num_steps());
  if (n == 0) return;
  for (int32_t i = 0; i < n; ++i) {
    pending[i].store(plan.num_predecessors[i], std::memory_order_relaxed);
  }
  for (size_t g = 0; g < plan.groups.size(); ++g) {
    users_left[g].store(plan.groups[g].num_users, std::memory_order_relaxed);
  }
  remaining.store(n, std::memory_order_relaxed);
  error = nullptr;
  ready->Reset();
  for (int32_t i = 0; i < n; ++i) {
    if (plan.num_predecessors[i] == 0) ready->Push(i);
  }
  pool->RunOnAll([this](int member) { ParallelMember(member); });
  if (error) std::rethrow_exception(error);
}

// One member of a parallel run: take a ready instruction, run it, release what it finished using,
// make its successors ready — continuing with the first one directly (no queue round trip on a
// chain) and queueing the others.
void Executable::Impl::ParallelMember(int member) {
  Worker& w = workers[static_cast<size_t>(member)];
  const bool release = gc_mode != GcMode::kNone;
  int32_t i = ready->Pop();
  while (i >= 0) {
    try {
      const int64_t begin = w.trace != nullptr ? NowNs() : 0;
      Execute(i, w);
      if (w.trace != nullptr) {
        w.trace->instructions.push_back({i, begin - w.origin_ns, NowNs() - w.origin_ns});
      }
      if (release) ReleaseAfter(i, plan.releases[i], /*counted=*/true, w);
    } catch (...) {
      {
        std::lock_guard lock(error_mu);
        if (!error) error = std::current_exception();
      }
      ready->Stop();
      return;
    }
    int32_t next = -1;
    for (int32_t s : plan.successors[i]) {
      if (pending[s].fetch_sub(1, std::memory_order_acq_rel) != 1) continue;
      if (next < 0) {
        next = s;
      } else {
        ready->Push(s);
      }
    }
    if (remaining.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      ready->Stop();
      return;
    }
    i = (next >= 0 && !ready->stopped()) ? next : ready->Pop();
  }
}

// Allocates the arena and points the planned storages at it (static memory plan).
void Executable::Impl::AcquireArena() {
  if (arena.arena_bytes == 0) return;
  arena_data = allocator->Allocate(static_cast<size_t>(arena.arena_bytes));
  char* base = static_cast<char*>(arena_data);
  for (int32_t g : planned_groups) group_storage[g]->Rebind(base + arena.offset[g]);
}

// Unbinds the planned storages and frees the arena. Every handle a run made of them must be gone
// but the one its root's slot keeps: one that escaped would read the next run's (or freed) memory,
// so the arena is leaked instead.
void Executable::Impl::ReleaseArena() {
  if (arena_data == nullptr) return;
  for (int32_t g : planned_groups) {
    const bool in_slot = slots[plan.groups[g].root]->storage() == group_storage[g];
    SLUICE_CHECK(group_storage[g].use_count() == (in_slot ? 2 : 1),
                 "executable '{}': planned value %{} is still referenced after the run",
                 program.name(), program.value(plan.groups[g].root).name);
    group_storage[g]->Rebind(nullptr);
  }
  allocator->Deallocate(arena_data, static_cast<size_t>(arena.arena_bytes));
  arena_data = nullptr;
}

// Releases every unpinned group still held (all of them in a GC-none run); returns how many.
int64_t Executable::Impl::ReleaseUnpinned() {
  int64_t freed = 0;
  for (size_t g = 0; g < plan.groups.size(); ++g) {
    if (plan.groups[g].pinned || !slots[plan.groups[g].root]->defined()) continue;
    ++freed;
    ReleaseGroup(static_cast<int32_t>(g));
  }
  return freed;
}

// Drops the executable's references. After a successful run with GC only pinned groups' slots
// can still be set; after a failure (`all`) anything can, scratch operands included.
void Executable::Impl::DropSlots(bool all) {
  if (all) {
    for (Tensor& t : own) Drop(t);
    bound_copies.clear();
    for (Worker& w : workers) {
      for (Tensor& t : w.outs) Drop(t);
    }
    return;
  }
  for (ValueId v : held_at_end) Drop(*slots[v]);
  bound_copies.clear();
}

RunStats Executable::Impl::Run(Scope& scope, RunTrace* trace) {
  if (running.exchange(true, std::memory_order_acq_rel)) {
    throw InvalidArgument(fmt::format(
        "executable '{}': Run called while another run is in progress", program.name()));
  }
  struct Guard {
    std::atomic<bool>& flag;
    ~Guard() { flag.store(false, std::memory_order_release); }
  } guard{running};

  const int64_t start = NowNs();
  RunStats stats;
  stats.instructions = static_cast<int64_t>(plan.num_steps());
  stats.liveness_lower_bound_bytes = plan.liveness_bound;
  std::unique_ptr<TraceListener> listener;
  for (Worker& w : workers) {
    w.gc_ticks = w.gc_steps = w.gc_timed_steps = w.frees = w.fallbacks = 0;
    w.trace = nullptr;
    w.origin_ns = start;
  }
  if (trace != nullptr) {
    trace->origin_ns = start;
    trace->threads.assign(workers.size() + (gc ? 1 : 0), ThreadTrace{});
    for (size_t k = 0; k < workers.size(); ++k) {
      trace->threads[k].name = fmt::format("executor {}", k);
      workers[k].trace = &trace->threads[k];
    }
    if (gc) {
      trace->threads.back().name = "gc worker";
      trace->threads.back().gc_worker = true;
      listener = std::make_unique<TraceListener>(trace->threads.back(), *allocator, start);
    }
  }
  if (gc) {
    gc->SetListener(listener.get());
    gc->TakePendingPeak();
  }

  try {
    Bind(scope);
    stats.baseline_allocated_bytes = allocator->Stats().allocated_bytes;
    if (options.reset_peak) allocator->ResetPeak();
    AcquireArena();
    stats.arena_bytes = arena.arena_bytes;
    if (options.mode == RunMode::kTrace) {
      RunTraceMode();
    } else {
      RunParallelMode();
    }
    for (ValueId v : results) scope.Set(program.value(v).name, *slots[v]);
  } catch (...) {
    DropSlots(/*all=*/true);
    ReleaseArena();
    if (gc) {
      try {
        gc->Drain();
      } catch (...) {  // the run's own error is the one to report
      }
      gc->SetListener(nullptr);
    }
    throw;
  }

  int64_t end_release_ns = 0;  // gc none frees everything here, once: timed whole
  if (gc_mode == GcMode::kNone) {
    const int64_t begin = CycleClock::Now();
    workers[0].frees += ReleaseUnpinned();
    if (options.measure_gc_time) end_release_ns = CycleClock::ToNs(CycleClock::Now() - begin);
  }
  DropSlots(/*all=*/false);
  ReleaseArena();
  if (gc) {
    const int64_t begin = NowNs();
    try {
      gc->Drain();
    } catch (...) {
      gc->SetListener(nullptr);
      throw;
    }
    stats.drain_wait_ns = NowNs() - begin;
    stats.async_pending_peak_bytes = gc->TakePendingPeak();
    gc->SetListener(nullptr);
  }
  stats.gc_thread_ns = end_release_ns;
  for (const Worker& w : workers) {
    stats.gc_thread_ns += w.GcNs();
    stats.frees += w.frees;
    stats.sync_fallbacks += w.fallbacks;
  }
  const MemoryStats mem = allocator->Stats();
  stats.peak_allocated_bytes = mem.peak_allocated_bytes;
  stats.peak_reserved_bytes = mem.peak_reserved_bytes;
  stats.wall_ns = NowNs() - start;
  return stats;
}

Executable::Executable(Program program, ExecutableOptions options)
    : impl_(std::make_unique<Impl>(std::move(program), std::move(options))) {}

Executable::~Executable() = default;

RunStats Executable::Run(Scope& scope, RunTrace* trace) { return impl_->Run(scope, trace); }
const Program& Executable::program() const { return impl_->program; }
const ExecutionPlan& Executable::plan() const { return impl_->plan; }
const ArenaPlan& Executable::arena() const { return impl_->arena; }
const ExecutableOptions& Executable::options() const { return impl_->options; }
GcMode Executable::gc_mode() const { return impl_->gc_mode; }
int Executable::num_executors() const { return static_cast<int>(impl_->workers.size()); }

}  // namespace sluice
