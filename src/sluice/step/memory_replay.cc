#include "sluice/step/memory_replay.h"

#include <algorithm>
#include <string_view>
#include <unordered_set>

#include <fmt/format.h>

#include "sluice/core/caching_allocator.h"
#include "sluice/core/error.h"
#include "sluice/exec/analysis.h"

namespace sluice {

std::string_view Name(MemoryUse use) { return EnumName(kMemoryUseNames, use); }
std::string_view Name(LiveReason reason) { return EnumName(kLiveReasonNames, reason); }

std::string LiveTensor::Why() const {
  const std::string of =
      micro_batch < 0 ? std::string()
                      : fmt::format("micro-batch {}{}", micro_batch,
                                    chunk < 0 ? std::string() : fmt::format(", chunk {}", chunk));
  if (reason == LiveReason::kSavedForBackward && !of.empty()) {
    return "saved for backward of " + of;
  }
  std::string out(Name(reason));
  if (!detail.empty()) out += ": " + detail;
  if (!of.empty()) out += " (" + of + ")";
  return out;
}

int64_t MemoryBreakdown::total() const {
  int64_t sum = 0;
  for (int64_t b : bytes) sum += b;
  return sum;
}

// ---- MemoryLedger ----

size_t MemoryLedger::UseOf(const Storage& s) {
  size_t use = 0;
  while (use + 1 < s.refs.size() && s.refs[use] == 0) ++use;
  return use;
}

MemoryLedger::Id MemoryLedger::Allocate(int64_t bytes, MemoryUse use) {
  SLUICE_CHECK(bytes >= 0, "a storage of {} bytes", bytes);
  FlushCapture();
  if (explaining()) origins_.emplace_back().made_in = phase_;
  const Id id = static_cast<Id>(storages_.size());
  Storage& s = storages_.emplace_back();
  s.bytes = bytes;
  s.refs[static_cast<size_t>(use)] = 1;
  s.live = true;
  if (bytes > 0) {
    s.address = mirror_->AllocateWithToken(static_cast<size_t>(bytes), &s.token);
    spans_ += static_cast<int64_t>(CachingAllocator::PageSpanBytes(static_cast<size_t>(bytes)));
    peak_spans_ = std::max(peak_spans_, spans_);
  }
  allocated_ += bytes;
  now_.bytes[static_cast<size_t>(use)] += bytes;
  if (allocated_ > peak_) Snapshot();
  return id;
}

void MemoryLedger::Retain(Id id, MemoryUse use) {
  if (id == kExternal) return;
  FlushCapture();
  Storage& s = storages_.at(static_cast<size_t>(id));
  SLUICE_CHECK(s.live, "storage {} retained after it was freed", id);
  const size_t before = UseOf(s);
  ++s.refs[static_cast<size_t>(use)];
  Reclassify(s, before);
}

void MemoryLedger::Release(Id id, MemoryUse use) {
  if (id == kExternal) return;
  FlushCapture();
  Storage& s = storages_.at(static_cast<size_t>(id));
  int32_t& refs = s.refs[static_cast<size_t>(use)];
  SLUICE_CHECK(refs > 0, "storage {} released by {}, which holds no reference", id, Name(use));
  const size_t before = UseOf(s);
  --refs;
  for (int32_t r : s.refs) {
    if (r > 0) {
      Reclassify(s, before);
      return;
    }
  }
  allocated_ -= s.bytes;
  now_.bytes[before] -= s.bytes;
  s.live = false;
  if (s.address != nullptr) {
    mirror_->DeallocateWithToken(s.address, static_cast<size_t>(s.bytes), s.token);
    s.address = nullptr;
    spans_ -= static_cast<int64_t>(CachingAllocator::PageSpanBytes(static_cast<size_t>(s.bytes)));
  }
  if (auto it = awaiting_reader_.find(id); it != awaiting_reader_.end()) {
    live_[it->second].next_read_in = "freed in " + phase_;
    awaiting_reader_.erase(it);
  }
}

void MemoryLedger::Reclassify(const Storage& s, size_t before) {
  const size_t after = UseOf(s);
  if (after == before) return;
  now_.bytes[before] -= s.bytes;
  now_.bytes[after] += s.bytes;
}

void MemoryLedger::Transfer(Id id, MemoryUse from, MemoryUse to) {
  if (from == to) return;
  Retain(id, to);
  Release(id, from);
}

void MemoryLedger::ResetPeak() {
  FlushCapture();
  peak_ = -1;  // the next Snapshot records the present
  mirror_->ResetPeak();
  peak_spans_ = spans_;
  armed_ = explaining();
  Snapshot();
}

// ---- MemoryLedger: explaining the peak ----

void MemoryLedger::ExplainAt(int64_t peak) {
  SLUICE_CHECK(storages_.empty(), "ExplainAt after {} allocations", storages_.size());
  SLUICE_CHECK(peak >= 0, "explaining a peak of {} bytes", peak);
  explain_at_ = peak;
}

MemoryLedger::Origin* MemoryLedger::OriginOf(Id id) {
  if (!explaining() || id < 0) return nullptr;  // kExternal, or no storage
  return &origins_.at(static_cast<size_t>(id));
}

void MemoryLedger::Made(Id id, const Program& program, int32_t instruction, ValueId value) {
  if (Origin* o = OriginOf(id)) {
    o->program = &program;
    o->instruction = instruction;
    o->value = value;
  }
}

void MemoryLedger::Made(Id id, std::string name, std::string type, std::string made_by) {
  if (Origin* o = OriginOf(id)) {
    o->name = std::move(name);
    o->type = std::move(type);
    o->made_by = std::move(made_by);
  }
}

void MemoryLedger::Note(Id id, MemoryUse use, LiveReason reason, std::string detail,
                        int micro_batch, int chunk) {
  if (Origin* o = OriginOf(id)) {
    o->why[static_cast<size_t>(use)] = {reason, std::move(detail), micro_batch, chunk, true};
  }
}

void MemoryLedger::ReadBy(Id id, std::string_view reader) {
  FlushCapture();
  auto it = awaiting_reader_.find(id);
  if (it == awaiting_reader_.end()) return;
  live_[it->second].next_reader = std::string(reader);
  live_[it->second].next_read_in = phase_;
  awaiting_reader_.erase(it);
}

void MemoryLedger::ReadBy(Id id, const Program& program, int32_t instruction) {
  FlushCapture();
  if (!awaiting_reader_.contains(id)) return;
  ReadBy(id, fmt::format("{}: {}", program.name(), DescribeInstruction(program, instruction)));
}

void MemoryLedger::FlushCapture() {
  if (!capture_pending_) return;
  capture_pending_ = false;
  // The reason a use implies when its holder said nothing more.
  constexpr LiveReason kDefault[] = {LiveReason::kParameter, LiveReason::kOptimizerState,
                                     LiveReason::kGradient,  LiveReason::kSavedForBackward,
                                     LiveReason::kMessage,   LiveReason::kWorking};
  std::vector<Id> ids;
  for (size_t id = 0; id < storages_.size(); ++id) {
    if (storages_[id].live) ids.push_back(static_cast<Id>(id));
  }
  std::stable_sort(ids.begin(), ids.end(), [&](Id a, Id b) {
    return storages_[static_cast<size_t>(a)].bytes > storages_[static_cast<size_t>(b)].bytes;
  });
  for (Id id : ids) {
    const Storage& s = storages_[static_cast<size_t>(id)];
    const Origin& o = origins_[static_cast<size_t>(id)];
    const size_t use = UseOf(s);
    LiveTensor& t = live_.emplace_back();
    t.bytes = s.bytes;
    t.use = static_cast<MemoryUse>(use);
    t.reason = kDefault[use];
    if (o.why[use].set) {
      t.reason = o.why[use].reason;
      t.detail = o.why[use].detail;
      t.micro_batch = o.why[use].micro_batch;
      t.chunk = o.why[use].chunk;
    }
    if (o.program != nullptr) {
      t.name = o.program->value(o.value).name;
      t.type = o.program->type(o.value).ToString();
      t.made_by =
          fmt::format("{}: {}", o.program->name(), DescribeInstruction(*o.program, o.instruction));
    } else {
      t.name = o.name;
      t.type = o.type;
      t.made_by = o.made_by;
    }
    t.made_in = o.made_in;
    awaiting_reader_.emplace(id, live_.size() - 1);
  }
}

std::vector<LiveTensor> MemoryLedger::LiveAtPeak() {
  if (!explaining()) return {};
  FlushCapture();
  SLUICE_CHECK(captured_, "the replay explained did not reach its peak of {} bytes", explain_at_);
  int64_t sum = 0;
  for (const LiveTensor& t : live_) sum += t.bytes;
  SLUICE_CHECK(sum == explain_at_, "the tensors live at the peak hold {} bytes, not {}", sum,
               explain_at_);
  return live_;
}

void MemoryLedger::Snapshot() {
  if (armed_ && allocated_ == explain_at_ && !captured_) {
    capture_pending_ = true;  // taken at the next change, once the caller has noted what it made
    captured_ = true;
  }
  peak_ = allocated_;
  at_peak_ = now_;
  peak_phase_ = phase_;
  peak_program_ = program_;
  peak_instruction_index_ = instruction_;
}

std::string MemoryLedger::peak_instruction() const {
  if (peak_program_ == nullptr || peak_instruction_index_ < 0) return {};
  return DescribeInstruction(*peak_program_, peak_instruction_index_);
}

// ---- SymbolicScope ----

void SymbolicScope::Set(const std::string& name, MemoryLedger::Id id) { Set(name, id, use_); }

void SymbolicScope::Set(const std::string& name, MemoryLedger::Id id, MemoryUse use) {
  ledger_.Retain(id, use);
  if (use == MemoryUse::kActivations && micro_batch_ >= 0 && ledger_.explaining()) {
    ledger_.Note(id, use, LiveReason::kSavedForBackward, {}, micro_batch_, chunk_);
  }
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    entries_.emplace(name, Entry{id, use});
    return;
  }
  const Entry old = it->second;
  it->second = {id, use};
  ledger_.Release(old.id, old.use);
}

MemoryLedger::Id SymbolicScope::Get(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw ProgramError(fmt::format("scope has no value %{}", name));
  return it->second.id;
}

MemoryLedger::Id SymbolicScope::Take(const std::string& name, MemoryUse to) {
  auto it = entries_.find(name);
  if (it == entries_.end()) throw ProgramError(fmt::format("scope has no value %{}", name));
  const Entry e = it->second;
  entries_.erase(it);
  ledger_.Transfer(e.id, e.use, to);
  return e.id;
}

void SymbolicScope::Erase(const std::string& name) {
  auto it = entries_.find(name);
  if (it == entries_.end()) return;
  const Entry e = it->second;
  entries_.erase(it);
  ledger_.Release(e.id, e.use);
}

void SymbolicScope::Clear() {
  while (!entries_.empty()) Erase(entries_.begin()->first);
}

std::vector<std::string> SymbolicScope::Names() const {
  std::vector<std::string> names;
  names.reserve(entries_.size());
  for (const auto& [name, e] : entries_) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

// ---- ReplayRun ----

void ReplayRun(const Executable& exe, SymbolicScope& scope) {
  const Program& program = exe.program();
  const ExecutionPlan& plan = exe.plan();
  const ExecutableOptions& options = exe.options();
  MemoryLedger& ledger = scope.ledger();
  constexpr MemoryUse kRun = MemoryUse::kWorking;

  std::vector<ValueId> results = program.outputs();
  for (const std::string& name : options.keep) results.push_back(program.Get(name));
  // Results the program computes replace what the scope holds under their names, first.
  for (ValueId v : results) {
    if (program.value(v).kind == ValueKind::kIntermediate) scope.Erase(program.value(v).name);
  }

  std::vector<MemoryLedger::Id> storage(plan.groups.size(), MemoryLedger::kExternal);
  std::vector<char> held(plan.groups.size(), 0);
  const std::unordered_set<std::string_view> donate(options.donate.begin(), options.donate.end());
  auto bind = [&](ValueId v) {
    const std::string& name = program.value(v).name;
    if (!scope.Has(name)) {
      throw ProgramError(
          fmt::format("program '{}': %{} is not bound in the scope", program.name(), name));
    }
    const size_t g = static_cast<size_t>(plan.group_of[static_cast<size_t>(v)]);
    const bool donated = donate.contains(name);
    storage[g] = donated ? scope.Take(name, kRun) : scope.Get(name);
    if (!donated) ledger.Retain(storage[g], kRun);
    if (donated)
      ledger.Note(storage[g], kRun, LiveReason::kWorking, "donated to " + program.name());
    held[g] = 1;
  };
  for (ValueId v : program.inputs()) bind(v);
  for (ValueId v : program.params()) bind(v);
  // A static memory plan: one arena for the planned groups, held from here to the end of the run.
  const ArenaPlan& arena = exe.arena();
  const MemoryLedger::Id arena_storage =
      arena.arena_bytes > 0 ? ledger.Allocate(arena.arena_bytes, kRun) : MemoryLedger::kExternal;
  ledger.Made(arena_storage, "arena:" + program.name(), "", "the static memory plan");

  for (size_t s = 0; s < plan.num_steps(); ++s) {
    const int32_t i = plan.order[s];
    ledger.SetInstruction(&program, i);
    for (ValueId v : program.instructions()[static_cast<size_t>(i)].outputs) {
      const size_t g = static_cast<size_t>(plan.group_of[static_cast<size_t>(v)]);
      if (plan.groups[g].root != v) continue;  // a view: a member of its input's group
      if (!arena.offset.empty() && arena.planned(static_cast<int32_t>(g))) continue;  // in it
      held[g] = 1;
      if (const int32_t source = plan.groups[g].in_place_of; source >= 0) {
        // Written in place: the dying input's storage, one more reference (its free drops one).
        storage[g] = storage[static_cast<size_t>(source)];
        ledger.Retain(storage[g], kRun);
        continue;
      }
      storage[g] = ledger.Allocate(plan.groups[g].bytes, kRun);
      ledger.Made(storage[g], program, i, v);
    }
    const Instruction& ins = program.instructions()[static_cast<size_t>(i)];
    if (ins.op->scratch_bytes != nullptr) {  // the kernel's scratch, freed before it returns
      std::vector<TensorType> types;
      for (ValueId in : ins.inputs) types.push_back(program.type(in));
      const int64_t bytes = ins.op->scratch_bytes(types, ins.attrs);
      if (bytes > 0) {
        const MemoryLedger::Id scratch = ledger.Allocate(bytes, kRun);
        if (ledger.explaining())
          ledger.Made(scratch, fmt::format("scratch of {}", ins.op->name), "",
                      fmt::format("{}: the kernel of instruction {}", program.name(), i));
        ledger.Release(scratch, kRun);
      }
    }
    if (ledger.explaining()) {  // the instruction reads its inputs after its outputs exist
      for (ValueId in : program.instructions()[static_cast<size_t>(i)].inputs) {
        ledger.ReadBy(storage[static_cast<size_t>(plan.group_of[static_cast<size_t>(in)])], program,
                      i);
      }
    }
    if (ledger.frees() == ReplayFrees::kAtRunEnd) continue;  // all of them below, at the end
    for (int32_t g : plan.FreeList(static_cast<int32_t>(s))) {
      if (!held[static_cast<size_t>(g)]) continue;
      held[static_cast<size_t>(g)] = 0;
      ledger.Release(storage[static_cast<size_t>(g)], kRun);
    }
  }
  ledger.SetInstruction(nullptr, -1);
  for (ValueId v : results) {
    scope.Set(program.value(v).name, storage[static_cast<size_t>(plan.group_of[v])]);
  }
  for (size_t g = 0; g < held.size(); ++g) {
    if (held[g]) ledger.Release(storage[g], kRun);
  }
  if (arena.arena_bytes > 0) ledger.Release(arena_storage, kRun);
}

ReplayFrees ReplayFreesFor(const TrainConfig& config) {
  const bool sync = config.gc == GcMode::kSync || config.gc == GcMode::kAuto;
  return sync && config.mode == RunMode::kTrace ? ReplayFrees::kAtLastUse : ReplayFrees::kAtRunEnd;
}

// ---- SymbolicGradients ----

void SymbolicGradients::AddFrom(SymbolicScope& scope, const std::string& name) {
  if (!scope.Has(name)) return;
  const MemoryLedger::Id id = scope.Take(name, MemoryUse::kWorking);
  // The first gradient is kept; a later one is added into it and freed.
  if (!grads_.Has(name)) {
    grads_.Set(name, id);
  } else if (grads_.ledger().explaining()) {
    grads_.ledger().ReadBy(id, "added into the accumulated " + name);
  }
  grads_.ledger().Release(id, MemoryUse::kWorking);
}

// ---- StageReplay ----

namespace {

int64_t F32Bytes(const Shape& shape) { return shape.numel() * static_cast<int64_t>(sizeof(float)); }
std::string F32Type(const Shape& shape) { return "f32" + shape.ToString(); }

}  // namespace

StageReplay::StageReplay(const StageProgram& program, MemoryLedger& ledger)
    : program_(program), state_(ledger, MemoryUse::kParameters) {
  // InitParams, then InitOptimizerState, in the order StageProgram allocates them.
  for (const ParamSpec& p : program.params()) {
    const MemoryLedger::Id id = ledger.Allocate(F32Bytes(p.shape), MemoryUse::kParameters);
    ledger.Made(id, p.name, F32Type(p.shape), "initialisation");
    state_.Set(p.name, id, MemoryUse::kParameters);
    ledger.Release(id, MemoryUse::kParameters);
  }
  for (const ParamSpec& p : program.params()) {
    // With a sharded optimizer, the replica's slice (StageProgram::OptimizerStateNumel).
    const Shape kept{program.OptimizerStateNumel(p)};
    const Shape& shape = program.shards() > 1 ? kept : p.shape;
    for (const std::string& s : OptimizerStateNames(p, program.config().optimizer)) {
      const MemoryLedger::Id id = ledger.Allocate(F32Bytes(shape), MemoryUse::kOptimizerState);
      ledger.Made(id, s, F32Type(shape), "initialisation");
      state_.Set(s, id, MemoryUse::kOptimizerState);
      ledger.Release(id, MemoryUse::kOptimizerState);
    }
  }
}

void StageReplay::BindParams(int c, SymbolicScope& scope) const {
  for (const Chunk::ParamRead& p : program_.chunk(c).params)
    scope.Set(p.value, state_.Get(p.param));
}

void StageReplay::TakeGradients(int c, SymbolicScope& scope, SymbolicGradients& grads) const {
  for (const Chunk::ParamRead& p : program_.chunk(c).params)
    grads.AddFrom(scope, p.value + ".grad");
  for (const Chunk::ParamRead& p : program_.chunk(c).params) scope.Erase(p.value);
}

void StageReplay::ReceiveTiedShares(SymbolicGradients& grads) const {
  MemoryLedger& ledger = grads.scope().ledger();
  for (const StageProgram::TiedShare& share : program_.tied_shares()) {
    if (share.local) continue;
    auto spec = std::find_if(program_.params().begin(), program_.params().end(),
                             [&](const ParamSpec& p) { return p.name == share.param; });
    const MemoryLedger::Id id = ledger.Allocate(F32Bytes(spec->shape), MemoryUse::kMessages);
    ledger.Made(id, share.grad, F32Type(spec->shape), "received from the stages sharing it");
    ledger.Note(id, MemoryUse::kMessages, LiveReason::kMessage,
                "the share of tied " + share.param + " accumulated elsewhere");
    grads.scope().Set(share.grad, id);
    ledger.Release(id, MemoryUse::kMessages);
  }
}

// StageProgram::FinishGradients: the first share of a tied parameter holds the sum, later ones are
// added into it and freed.
void StageReplay::SumTiedShares(SymbolicGradients& grads) const {
  SymbolicScope& g = grads.scope();
  for (const StageProgram::TiedShare& share : program_.tied_shares()) {
    if (!g.Has(share.grad)) continue;
    const std::string total = share.param + ".grad";
    const MemoryLedger::Id id = g.Take(share.grad, MemoryUse::kWorking);
    if (!g.Has(total)) g.Set(total, id);
    g.ledger().Release(id, MemoryUse::kWorking);
  }
}

void StageReplay::Forward(int c, SymbolicScope& scope) const {
  const Chunk& ch = program_.chunk(c);
  BindParams(c, scope);
  ReplayRun(*ch.forward, scope);
  work_ += EstimateWork(ch.forward->program());
  const std::string output = ch.last ? ch.model.loss : std::string(kChunkOutput);
  const std::unordered_set<std::string_view> saved(ch.backward.saved.begin(),
                                                   ch.backward.saved.end());
  for (const std::string& name : scope.Names()) {
    if (name != output && !saved.contains(name)) scope.Erase(name);
  }
}

// StageProgram's RunBackward: the accumulating program once every gradient it adds into has a
// buffer, bound in the scope for the run.
void StageReplay::RunBackward(int c, const Executable& plain, const Chunk::Accumulating& acc,
                              SymbolicScope& scope, SymbolicGradients& grads) const {
  SymbolicScope& g = grads.scope();
  const bool in_place =
      acc.exe != nullptr && std::all_of(acc.grads.begin(), acc.grads.end(),
                                        [&](const std::string& name) { return g.Has(name); });
  const Executable& exe = in_place ? *acc.exe : plain;
  if (in_place) {
    for (const std::string& name : acc.grads) scope.Set(name, g.Get(name));
  }
  ReplayRun(exe, scope);
  work_ += EstimateWork(exe.program());
  if (in_place) {
    for (const std::string& name : acc.grads) scope.Erase(name);
  }
  TakeGradients(c, scope, grads);
}

void StageReplay::Backward(int c, SymbolicScope& scope, SymbolicGradients& grads) const {
  const Chunk& ch = program_.chunk(c);
  BindParams(c, scope);
  if (program_.split_backward()) {
    RunBackward(c, *ch.b_exe, ch.b_acc, scope, grads);
  } else {
    RunBackward(c, *ch.backward_exe, ch.backward_acc, scope, grads);
  }
}

void StageReplay::Weight(int c, SymbolicScope& scope, SymbolicGradients& grads) const {
  const Chunk& ch = program_.chunk(c);
  SLUICE_CHECK(ch.w_exe != nullptr, "W of chunk {} without a split backward", c);
  BindParams(c, scope);
  RunBackward(c, *ch.w_exe, ch.w_acc, scope, grads);
}

void StageReplay::Update(SymbolicGradients& grads) {
  SumTiedShares(grads);
  MemoryLedger& ledger = state_.ledger();
  std::vector<std::string> names = grads.scope().Names();
  for (const std::string& name : names) {
    state_.Set(name, grads.scope().Get(name), MemoryUse::kGradients);
  }
  grads.scope().Clear();
  for (const char* scalar : {"lr", "step"}) {
    const MemoryLedger::Id id = ledger.Allocate(sizeof(float), MemoryUse::kWorking);
    ledger.Made(id, scalar, "f32[]", "the optimizer's step");
    state_.Set(scalar, id, MemoryUse::kWorking);
    ledger.Release(id, MemoryUse::kWorking);
  }
  ReplayRun(program_.optimizer(), state_);
  for (const std::string& name : names) state_.Erase(name);
  state_.Erase("lr");
  state_.Erase("step");
}

double EstimateWork(const Program& program) {
  double work = 0;
  for (const Instruction& instr : program.instructions()) {
    if (instr.op->name == "matmul_accumulate") {  // the matmul it stands for (AccumulateGradients)
      const Shape& a = program.type(instr.inputs[1]).shape;
      const int64_t k = a[instr.attrs.GetBool("transpose_a", false) ? 0 : 1];
      work += 2.0 * static_cast<double>(program.type(instr.inputs[0]).shape.numel()) *
              static_cast<double>(k);
      continue;
    }
    if (instr.op->name == "linear_cross_entropy" || instr.op->name == "linear_cross_entropy_grad") {
      // x [..., C] · w [vocab, C]ᵀ in chunks of tokens: the forward's one GEMM, the gradient's
      // three (the chunk's logits again, then x's and w's gradients).
      const double gemm = 2.0 * static_cast<double>(program.type(instr.inputs[2]).shape.numel()) *
                          static_cast<double>(program.type(instr.inputs[1]).shape.numel());
      work += instr.op->name == "linear_cross_entropy" ? gemm : 3 * gemm;
      continue;
    }
    // Other in-place ops (accumulate: the gradient adds the accumulator always made) count none.
    if (instr.outputs.empty()) continue;
    const TensorType& out = program.type(instr.outputs[0]);
    if (instr.inputs.empty()) {
      work += static_cast<double>(out.shape.numel());
      continue;
    }
    const TensorType& in = program.type(instr.inputs[0]);
    const bool matmul = instr.op->name == "matmul" && in.shape.rank() >= 2;
    if (matmul || (instr.op->name == "linear" && in.shape.rank() >= 1)) {
      const bool ta = matmul && instr.attrs.GetBool("transpose_a", false);
      const int64_t k = in.shape[in.shape.rank() - (ta ? 2 : 1)];
      work += 2.0 * static_cast<double>(out.shape.numel()) * static_cast<double>(k);
    } else {
      work += static_cast<double>(std::max(out.shape.numel(), in.shape.numel()));
    }
  }
  return work;
}

// ---- the single stage ----

namespace {

// One step of SingleStageEngine on `ledger`: its micro-batches' forward and backward, then the
// optimizer.
StageMemoryForecast ReplaySingleStage(const StageProgram& program, const TrainConfig& config,
                                      MemoryLedger& ledger) {
  StageReplay stage(program, ledger);
  StageMemoryForecast out;
  out.persistent_bytes = ledger.allocated();
  ledger.ResetPeak();
  SymbolicGradients grads(ledger);
  const Chunk& ch = program.chunk(0);
  for (int64_t k = 0; k < config.microbatches; ++k) {
    SymbolicScope scope(ledger, MemoryUse::kActivations);
    scope.HoldFor(static_cast<int>(k));
    for (ValueId v : ch.model.forward.inputs()) {  // the batch: another allocator's
      scope.Set(ch.model.forward.value(v).name, MemoryLedger::kExternal);
    }
    ledger.SetPhase(fmt::format("forward of micro-batch {}", k));
    stage.Forward(0, scope);
    scope.Erase(ch.model.loss);
    ledger.SetPhase(fmt::format("backward of micro-batch {}", k));
    stage.Backward(0, scope, grads);
  }
  ledger.SetPhase("optimizer");
  stage.Update(grads);
  out.peak_allocated_bytes = out.least_peak_allocated_bytes = ledger.peak();
  out.peak_reserved_bytes = ledger.peak_reserved();
  out.work = stage.work();
  out.at_peak = ledger.at_peak();
  out.peak_phase = ledger.peak_phase();
  out.peak_instruction = ledger.peak_instruction();
  out.live_at_peak = ledger.LiveAtPeak();
  return out;
}

}  // namespace

StageMemoryForecast ForecastSingleStage(const Model& model, const TrainConfig& config,
                                        bool explain) {
  TrainConfig replayed = config;  // what the forecast is exact for (see the top of the header)
  replayed.gc = GcMode::kSync;
  replayed.mode = RunMode::kTrace;
  CachingAllocator unused;  // a plan-only program allocates nothing
  const StageProgram program({{.model = model}}, replayed,
                             {.allocator = &unused,
                              .recompute = RecomputeForStage(config, /*stage=*/0, /*stages=*/1),
                              .plan_only = true});
  MemoryLedger ledger(ReplayFreesFor(config), config.reserved_headroom);
  StageMemoryForecast out = ReplaySingleStage(program, config, ledger);
  if (!explain) return out;
  MemoryLedger again(ReplayFreesFor(config),
                     config.reserved_headroom);  // the same replay, listing what the peak holds
  again.ExplainAt(out.peak_allocated_bytes);
  out.live_at_peak = ReplaySingleStage(program, config, again).live_at_peak;
  return out;
}

}  // namespace sluice
