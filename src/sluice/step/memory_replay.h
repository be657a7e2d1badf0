// Memory replay: the bytes a training step holds, predicted before any kernel runs by replaying
// the step on a symbolic allocator — the execution plans the interpreter follows (exec/analysis.h:
// order, storage groups, free lists) and the engines' own hand-offs between runs, with byte counts
// in place of tensors. Nothing is allocated, nothing computed. `sluice plan` and
// `--memory-budget` are built on it (the single stage here, pipeline ranks in
// pipeline/memory_forecast.h).
//
//   MemoryLedger    a symbolic allocator: storages with sizes and reference counts, the allocated
//                   bytes (requested-bytes accounting, as core/memory_stats.h counts them), their
//                   peak, and at the peak what the bytes are (MemoryUse) and where the step was;
//                   beside them, the reserved bytes: every allocation and free is also made on a
//                   model of the stage's CachingAllocator (address space only, never touched), so
//                   the forecast says what the allocator would take from the system.
//   SymbolicScope   a Scope (exec/scope.h) of storage ids: names bound to storages.
//   ReplayRun       one Executable::Run: binds, takes donated inputs, allocates each instruction's
//                   outputs at its step, frees each step's free list, leaves outputs and kept
//                   values in the scope — exactly the interpreter's trace-mode, sync-GC run;
//                   under a static memory plan, one arena for the run in place of the planned
//                   values (exec/memory_plan.h).
//   StageReplay     one StageProgram (step/stage_program.h): parameters and optimizer state, and
//                   Forward / Backward / Weight / Update as StageProgram runs them.
//
// What a storage *is* at the peak comes from who holds it (MemoryUse, first match in this order):
// the rank's parameters, optimizer state, accumulated gradients, activations kept for a backward
// (a micro-batch's scope between runs), messages (received inputs and gradients, outputs awaiting
// their send), and the working set of the run in progress.
//
// Exact (equal to the allocator's peak_allocated_bytes) when the real run is: trace mode, sync
// GC (what --gc auto is on the caching allocator), every bound input contiguous and no kernel
// taking scratch memory from the allocator (exec/analysis.h says the same of the liveness bound).
// The frees follow the config (ReplayFrees): at last use for sync GC in trace mode; at the run's
// end for --gc none (exact in trace mode) and as the upper bound of --gc async and --mode
// parallel, whose frees thread timing decides but which drain before a run returns.
//
// Explaining the peak (`sluice plan --explain`): a replay found its peak; the same replay run again
// on a ledger told that peak (ExplainAt) records where each storage came from, captures every
// live storage the first time the bytes reach it (after ResetPeak: the moment at_peak describes)
// and, replaying on, the next instruction or send that reads each one. The captured bytes add up
// to the peak exactly. Without ExplainAt nothing of this is recorded.
//
// Thread-safety: none; one thread replays. Failure: ReplayRun throws ProgramError when a value the
// program reads is not bound, like Executable::Run.
//
// Example (what ForecastSingleStage does per micro-batch):
//   MemoryLedger ledger;
//   StageReplay stage(program, ledger);        // parameters and optimizer state
//   SymbolicScope scope(ledger, MemoryUse::kActivations);
//   scope.Set("ids", MemoryLedger::kExternal); // the batch lives in another allocator
//   stage.Forward(0, scope);
//   ledger.peak();                             // bytes; ledger.PeakReport() says of what
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "sluice/core/caching_allocator.h"
#include "sluice/core/enum_names.h"
#include "sluice/exec/interpreter.h"
#include "sluice/step/stage_program.h"

namespace sluice {

enum class MemoryUse : uint8_t {
  kParameters,
  kOptimizerState,
  kGradients,
  kActivations,
  kMessages,
  kWorking
};
inline constexpr int kNumMemoryUses = 6;

inline constexpr EnumEntry<MemoryUse> kMemoryUseNames[] = {
    {MemoryUse::kParameters, "parameters"}, {MemoryUse::kOptimizerState, "optimizer_state"},
    {MemoryUse::kGradients, "gradients"},   {MemoryUse::kActivations, "activations"},
    {MemoryUse::kMessages, "messages"},     {MemoryUse::kWorking, "working"},
};
static_assert(IsCompleteEnumTable(kMemoryUseNames));
std::string_view Name(MemoryUse use);

// Bytes by use, at one moment.
struct MemoryBreakdown {
  std::array<int64_t, kNumMemoryUses> bytes{};
  int64_t operator[](MemoryUse use) const { return bytes[static_cast<size_t>(use)]; }
  int64_t total() const;
};

// Why a tensor is alive at the peak (LiveTensor::reason).
enum class LiveReason : uint8_t {
  kParameter,
  kOptimizerState,
  kGradient,
  kSavedForBackward,  // by the micro-batch (and chunk) named
  kInFlight,          // a send made and not yet complete
  kMessage,           // received, or an output or gradient awaiting its send
  kWorking,           // the run in progress (or the optimizer's scalars)
};
inline constexpr EnumEntry<LiveReason> kLiveReasonNames[] = {
    {LiveReason::kParameter, "parameter"}, {LiveReason::kOptimizerState, "optimizer state"},
    {LiveReason::kGradient, "gradient"},   {LiveReason::kSavedForBackward, "saved for backward"},
    {LiveReason::kInFlight, "in flight"},  {LiveReason::kMessage, "message"},
    {LiveReason::kWorking, "working"},
};
static_assert(IsCompleteEnumTable(kLiveReasonNames));
std::string_view Name(LiveReason reason);

// One storage live at a stage's peak (--explain).
struct LiveTensor {
  std::string name;   // the value that made it ("h", "blocks.0.w", "x" of a receive)
  std::string type;   // "f32[4, 64, 128]"; "" for an arena or a scalar of the runtime
  int64_t bytes = 0;  // what the allocator holds for it
  MemoryUse use = MemoryUse::kWorking;  // what it counts as in MemoryBreakdown
  LiveReason reason = LiveReason::kWorking;
  std::string detail;        // of the reason: "SEND_F to stage 1", "received from stage 0", ""
  int micro_batch = -1;      // the micro-batch it belongs to, where it belongs to one
  int chunk = -1;            // and the chunk, on a rank of several
  std::string made_by;       // "gpt: %h = linear(%x, %w)", "initialisation", "RECV_F from stage 0"
  std::string made_in;       // the phase: "F of micro-batch 2 (action 5 of 16)"
  std::string next_reader;   // the next instruction or send reading it; "" when none does
  std::string next_read_in;  // its phase, or "freed in <phase>" / "" when nothing reads it again
  // "saved for backward of micro-batch 2", "in flight: SEND_F to stage 1 (micro-batch 2)",
  // "parameter".
  std::string Why() const;
};

// When a replayed run (ReplayRun) releases what it no longer reads.
enum class ReplayFrees : uint8_t {
  kAtLastUse,  // after each step, its free list: the interpreter's trace mode with sync GC
  kAtRunEnd,   // when the run ends: gc none; an upper bound for async GC and parallel mode
};

// The frees of training with `config`: kAtLastUse for trace mode under sync GC (auto resolves
// to sync on the caching allocators training uses), kAtRunEnd otherwise.
ReplayFrees ReplayFreesFor(const TrainConfig& config);

class MemoryLedger {
 public:
  using Id = int32_t;
  // A storage of another allocator (the batch's ids and targets): binding it costs nothing.
  static constexpr Id kExternal = -1;

  // `reserved_headroom`: the modelled allocator's (CachingAllocatorOptions), as the run's.
  explicit MemoryLedger(ReplayFrees frees = ReplayFrees::kAtLastUse,
                        double reserved_headroom = CachingAllocatorOptions{}.reserved_headroom)
      : frees_(frees),
        mirror_(std::make_unique<CachingAllocator>(CachingAllocatorOptions{
            .reserved_headroom = reserved_headroom, .address_space_only = true})) {}
  // How the runs replayed on this ledger free their values.
  ReplayFrees frees() const { return frees_; }

  // A new storage of `bytes` held once by `use`.
  Id Allocate(int64_t bytes, MemoryUse use);
  // One more / one fewer reference by `use`; the last release frees the bytes. No-ops on
  // kExternal.
  void Retain(Id id, MemoryUse use);
  void Release(Id id, MemoryUse use);
  // Moves one reference from `from` to `to`.
  void Transfer(Id id, MemoryUse from, MemoryUse to);

  int64_t allocated() const { return allocated_; }
  int64_t peak() const { return peak_; }
  // The reserved bytes of a CachingAllocator that saw the same allocations and frees, and their
  // peak since ResetPeak (what the stage's allocator reports as peak_reserved_bytes).
  int64_t reserved() const { return mirror_->Stats().reserved_bytes; }
  int64_t peak_reserved() const { return mirror_->Stats().peak_reserved_bytes; }
  // The peak since ResetPeak of the page spans of the live storages (CachingAllocator::
  // PageSpanBytes summed): the reserved bytes an allocator under a budget of at least this holds
  // at most, in any order of frees that holds no more storages than this replay (it returns the
  // pages of free blocks before it would cross the budget).
  int64_t peak_page_spans() const { return peak_spans_; }
  // Restarts the peak from the current bytes (an engine's step start).
  void ResetPeak();

  // --explain (see the top of this file): `peak` is what this same replay peaked at since
  // ResetPeak. Call before the first Allocate.
  void ExplainAt(int64_t peak);
  bool explaining() const { return explain_at_ >= 0; }
  // What a storage is, when explaining (no-ops otherwise and on kExternal): made by instruction
  // `instruction` of `program` as value `value`, or named outright.
  void Made(Id id, const Program& program, int32_t instruction, ValueId value);
  void Made(Id id, std::string name, std::string type, std::string made_by);
  // Why `use` holds `id` (its reason when that use is what the storage counts as).
  void Note(Id id, MemoryUse use, LiveReason reason, std::string detail = {}, int micro_batch = -1,
            int chunk = -1);
  // `id` is read now by `reader` ("SEND_F to stage 1"): its next reader if it was live at the
  // peak and nothing read it since. ReadBy(..., program, instruction) formats only then.
  void ReadBy(Id id, std::string_view reader);
  void ReadBy(Id id, const Program& program, int32_t instruction);
  // The storages live at the peak, largest first (ties: allocation order); empty unless
  // explaining. Their bytes add up to peak(); throws Internal when the peak was not reached.
  std::vector<LiveTensor> LiveAtPeak();

  // Where the step is, for the peak's report: the action ("B of micro-batch 3, chunk 0") and,
  // set by ReplayRun, the instruction whose outputs were being allocated.
  void SetPhase(std::string phase) { phase_ = std::move(phase); }
  void SetInstruction(const Program* program, int32_t instruction) {
    program_ = program;
    instruction_ = instruction;
  }

  // The bytes by use at the (first) peak since ResetPeak, and where it happened.
  const MemoryBreakdown& at_peak() const { return at_peak_; }
  const std::string& peak_phase() const { return peak_phase_; }
  // "%h = matmul(%x, %w)" of the instruction at the peak; empty when it was not inside a run.
  // Described on request: the program of SetInstruction must still be alive.
  std::string peak_instruction() const;

 private:
  struct Storage {
    int64_t bytes = 0;
    std::array<int32_t, kNumMemoryUses> refs{};
    bool live = false;        // false once the last reference is released
    void* address = nullptr;  // its block in mirror_ (nullptr for 0 bytes)
    uintptr_t token = 0;
  };
  // What a storage counts as: the first use (in MemoryUse order) holding a reference to it.
  static size_t UseOf(const Storage& s);
  // Moves the storage's bytes in now_ from `before` to what its references now make it.
  void Reclassify(const Storage& s, size_t before);
  // Records the present as the peak: O(1), the breakdown being kept as references change (a
  // walk over the live storages at every new peak made a replay quadratic in its storages).
  void Snapshot();

  // Explaining: where each storage came from and why each use holds it.
  struct Origin {
    const Program* program = nullptr;  // made by a run: its instruction and value
    int32_t instruction = -1;
    ValueId value = -1;
    std::string name, type, made_by, made_in;
    struct Why {
      LiveReason reason;
      std::string detail;
      int micro_batch = -1, chunk = -1;
      bool set = false;
    };
    std::array<Why, kNumMemoryUses> why{};
  };
  // Takes the capture the peak asked for (capture_pending_): called before anything changes.
  void FlushCapture();
  Origin* OriginOf(Id id);

  ReplayFrees frees_;
  // The allocator model: Storage's own calls (AllocateWithToken, DeallocateWithToken), on this one
  // thread, as a stage under sync GC makes them. Behind a pointer so that a ledger moves.
  std::unique_ptr<CachingAllocator> mirror_;
  std::vector<Storage> storages_;  // by id; never reused
  int64_t explain_at_ = -1;        // the peak to explain; -1: not explaining
  bool armed_ = false;             // ResetPeak was called: the next reach of explain_at_ counts
  bool captured_ = false, capture_pending_ = false;
  std::vector<Origin> origins_;                     // by id, when explaining
  std::vector<LiveTensor> live_;                    // captured at the peak
  std::unordered_map<Id, size_t> awaiting_reader_;  // captured storages not yet read: → live_
  int64_t allocated_ = 0, peak_ = 0;
  int64_t spans_ = 0, peak_spans_ = 0;  // page spans of the live storages, and their peak
  MemoryBreakdown now_;                 // the allocated bytes by use, now
  MemoryBreakdown at_peak_;
  std::string phase_, peak_phase_;
  const Program* program_ = nullptr;
  int32_t instruction_ = -1;
  const Program* peak_program_ = nullptr;  // the instruction at the peak, described on request
  int32_t peak_instruction_index_ = -1;
};

// Names bound to storages, each binding one reference of the scope's use (or the one given).
class SymbolicScope {
 public:
  SymbolicScope(MemoryLedger& ledger, MemoryUse use) : ledger_(ledger), use_(use) {}
  ~SymbolicScope() { Clear(); }
  SymbolicScope(const SymbolicScope&) = delete;
  SymbolicScope& operator=(const SymbolicScope&) = delete;

  // The scope of micro-batch `micro_batch` (of chunk `chunk`): what it holds as activations is
  // saved for that micro-batch's backward (LiveReason::kSavedForBackward, when explaining).
  void HoldFor(int micro_batch, int chunk = -1) {
    micro_batch_ = micro_batch;
    chunk_ = chunk;
  }

  // Binds `name` (retaining `id`), replacing and releasing a previous binding.
  void Set(const std::string& name, MemoryLedger::Id id);
  void Set(const std::string& name, MemoryLedger::Id id, MemoryUse use);
  bool Has(const std::string& name) const { return entries_.contains(name); }
  // The storage bound to `name`; throws ProgramError when there is none.
  MemoryLedger::Id Get(const std::string& name) const;
  // Unbinds `name`, moving its reference to `to` (the caller now holds it). Throws when absent.
  MemoryLedger::Id Take(const std::string& name, MemoryUse to);
  void Erase(const std::string& name);
  void Clear();
  std::vector<std::string> Names() const;  // sorted
  MemoryLedger& ledger() const { return ledger_; }

 private:
  struct Entry {
    MemoryLedger::Id id;
    MemoryUse use;
  };
  MemoryLedger& ledger_;
  MemoryUse use_;
  int micro_batch_ = -1, chunk_ = -1;
  std::unordered_map<std::string, Entry> entries_;
};

// One Executable::Run of `exe` on `scope`, on the scope's ledger (see the top of this file).
void ReplayRun(const Executable& exe, SymbolicScope& scope);

// A GradientAccumulator of storages: the first gradient of a parameter is kept, later ones are
// added into it (and freed).
class SymbolicGradients {
 public:
  explicit SymbolicGradients(MemoryLedger& ledger) : grads_(ledger, MemoryUse::kGradients) {}
  // Takes `name` out of `scope` when it is bound there.
  void AddFrom(SymbolicScope& scope, const std::string& name);
  SymbolicScope& scope() { return grads_; }

 private:
  SymbolicScope grads_;
};

class StageReplay {
 public:
  // Allocates the program's parameters and optimizer state on `ledger`, as StageProgram does.
  StageReplay(const StageProgram& program, MemoryLedger& ledger);

  void Forward(int c, SymbolicScope& scope) const;
  void Backward(int c, SymbolicScope& scope, SymbolicGradients& grads) const;
  void Weight(int c, SymbolicScope& scope, SymbolicGradients& grads) const;
  // A pipeline rank's OPT: the shares of its tied parameters that other ranks accumulated arrive
  // (StageProgram::tied_shares), each a message of the parameter's size, into `grads`.
  void ReceiveTiedShares(SymbolicGradients& grads) const;
  // Clipping and the optimizer: each tied parameter's shares are summed into its gradient (the
  // first holds the sum), the gradients join the state for the optimizer run, then go.
  void Update(SymbolicGradients& grads);

  const StageProgram& program() const { return program_; }
  // The estimated work (EstimateWork) of the F, B and W runs replayed so far.
  double work() const { return work_; }

 private:
  void BindParams(int c, SymbolicScope& scope) const;
  void TakeGradients(int c, SymbolicScope& scope, SymbolicGradients& grads) const;
  void RunBackward(int c, const Executable& plain, const Chunk::Accumulating& acc,
                   SymbolicScope& scope, SymbolicGradients& grads) const;
  void SumTiedShares(SymbolicGradients& grads) const;

  const StageProgram& program_;
  mutable SymbolicScope state_;  // parameters and optimizer state
  mutable double work_ = 0;
};

// A program's arithmetic, estimated for comparing recompute policies: 2·M·N·K for a matmul or
// linear, the larger of its output's and first input's elements for any other instruction.
double EstimateWork(const Program& program);

// The forecast of one stage (the whole model on one stage, or one pipeline rank).
struct StageMemoryForecast {
  int stage = 0;
  int64_t peak_allocated_bytes = 0;  // predicted: the allocator's peak over a step
  // Predicted: the allocator's peak reserved bytes over a step (what `--memory-budget` bounds),
  // the least budget the step is sure to run within. One stage: the replay's own reserved peak,
  // exact. A pipeline rank, whose frees thread timing orders: the peak page spans of what it
  // holds (MemoryLedger::peak_page_spans), an upper bound under any budget at least this; a run
  // without a budget keeps its free blocks' pages and may reserve more.
  int64_t peak_reserved_bytes = 0;
  // Where thread timing decides (a pipeline send completing before or after a compute): the peak
  // if every send completed at once. The measured peak lies in [least, peak]; equal elsewhere.
  int64_t least_peak_allocated_bytes = 0;
  MemoryBreakdown at_peak;       // what the peak consists of
  std::string peak_phase;        // where in the step: the action
  std::string peak_instruction;  // and the instruction being run ("" between runs)
  int64_t persistent_bytes = 0;  // parameters and optimizer state: held between steps
  // Post-validation (--post-validate): the copy of parameters and optimizer state kept for a
  // rollback (RollbackBytes), held between steps — in persistent_bytes and, at the peak, in
  // optimizer_state. 0 without it.
  int64_t rollback_bytes = 0;
  // Post-validation's interlocked steps (on threads): the previous step's gradients, kept for its
  // redo until this step's update point validates it, and its pending reduction's operand (an f64
  // per model parameter and the loss sum) — held through the whole step, in persistent_bytes and,
  // at the peak, in gradients (an upper bound: every non-constant parameter's f32 gradient).
  // 0 without post-validation.
  int64_t interlock_bytes = 0;
  double work = 0;  // EstimateWork of the step's F, B and W runs
  // Explained forecasts only: every tensor live at the peak, largest first; their bytes add up to
  // peak_allocated_bytes and, by use, to at_peak.
  std::vector<LiveTensor> live_at_peak;
};

// The forecast of SingleStageEngine (train/single_stage.h) for `config` on `model`, with the
// frees of its --gc and --mode (ReplayFreesFor). `explain`: replays once more to list the tensors
// live at the peak (live_at_peak).
StageMemoryForecast ForecastSingleStage(const Model& model, const TrainConfig& config,
                                        bool explain = false);

}  // namespace sluice
