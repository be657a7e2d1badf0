#include "sluice/step/stage_program.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "sluice/core/error.h"
#include "sluice/kernels/matmul.h"
#include "sluice/kernels/onednn_matmul.h"
#include "sluice/kernels/parallel.h"

namespace sluice {

namespace {

bool Contains(const std::vector<std::string>& v, const std::string& s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// Every input of `program` (not its parameters), except `except`: what a backward run may free at
// its last use — saved activations and "y.grad".
std::vector<std::string> InputNames(const Program& program,
                                    const std::vector<std::string>& except = {}) {
  std::vector<std::string> names;
  for (ValueId v : program.inputs()) {
    const std::string& name = program.value(v).name;
    if (!Contains(except, name)) names.push_back(name);
  }
  return names;
}

// The parameter gradients among `program`'s outputs, in the chunk's parameter order.
std::vector<std::string> GradientOutputs(const Program& program,
                                         const std::vector<Chunk::ParamRead>& params) {
  std::vector<std::string> out;
  for (const Chunk::ParamRead& p : params) {
    const std::optional<ValueId> v = program.Find(p.value + ".grad");
    if (v && program.IsOutput(*v) && program.value(*v).kind == ValueKind::kIntermediate)
      out.push_back(p.value + ".grad");
  }
  return out;
}

// The accumulating form of `program` (AccumulateGradients), with `options`; none when the program
// gives out no parameter gradient.
Chunk::Accumulating MakeAccumulating(const Program& program,
                                     const std::vector<Chunk::ParamRead>& params,
                                     ExecutableOptions options) {
  Chunk::Accumulating acc;
  acc.grads = GradientOutputs(program, params);
  if (acc.grads.empty()) return acc;
  acc.exe = std::make_unique<Executable>(
      AccumulateGradients(program, acc.grads, kernels::GemmOneBlockK()), options);
  return acc;
}

// The bf16 values crossing a unit boundary — those a later unit reads (UnitInputs), the chunk's
// input and its output — whose gradients are bf16 (GradientSpec::bf16_gradients): a pipeline's
// gradient messages are bf16, and one stage rounds each where a cut would, so every schedule
// stays bitwise one stage.
std::vector<std::string> Bf16Boundaries(const Program& forward, bool first, bool last) {
  std::vector<std::string> names = UnitInputs(forward);
  if (!first) names.push_back(kChunkInput);
  if (!last) names.push_back(kChunkOutput);
  std::erase_if(names, [&](const std::string& n) {
    return forward.type(forward.Get(n)).dtype != DType::kBF16;
  });
  return names;
}

}  // namespace

StageProgram::StageProgram(std::vector<ChunkModel> chunks, const TrainConfig& config,
                           StageProgramOptions options)
    : config_(config), options_(options) {
  SLUICE_CHECK(options_.allocator != nullptr, "StageProgram needs an allocator");
  // Peaks run on across the runs of a step: the engine restarts them once per step.
  exe_options_ = {.allocator = options_.allocator,
                  .mode = config.mode,
                  .gc = config.gc,
                  .threads = options_.threads,
                  .memory_plan = config.memory_plan,
                  .in_place = config.in_place,
                  .reset_peak = false};
  const ExecutableOptions& base = exe_options_;
  const bool whole = chunks.size() == 1 && chunks[0].first && chunks[0].last;
  const std::vector<TiedParam> tied = whole ? TiedParams(chunks[0].model.forward) : options_.tied;
  std::set<std::string> local_shares;  // the tied shares this rank's chunks read
  std::set<std::string> held;          // the names in params_
  chunks_.resize(chunks.size());
  for (size_t c = 0; c < chunks.size(); ++c) {
    Chunk& ch = chunks_[c];
    ch.model = std::move(chunks[c].model);
    ch.first = chunks[c].first;
    ch.last = chunks[c].last;
    // The model stays as given; its programs read each tied parameter once per unit.
    const Program forward =
        tied.empty() ? ch.model.forward : SeparateTiedReads(ch.model.forward, tied);
    std::map<std::string, const ParamSpec*> spec_of;  // what each program parameter reads
    for (const ParamSpec& p : ch.model.params) spec_of[p.name] = &p;
    for (const TiedParam& t : tied) {
      auto it = spec_of.find(t.name);
      if (it == spec_of.end()) continue;
      for (const std::string& unit : t.units) spec_of[TiedReadName(t.name, unit)] = it->second;
    }
    std::vector<std::string> wrt;
    for (ValueId v : forward.params()) {
      const std::string& name = forward.value(v).name;
      auto found = spec_of.find(name);
      SLUICE_CHECK(found != spec_of.end(), "chunk {} reads %{} without its ParamSpec", c, name);
      const ParamSpec* spec = found->second;
      if (!spec->constant) wrt.push_back(name);  // a constant is bound, never differentiated
      ch.params.push_back({.value = name, .param = spec->name});
      if (name != spec->name) local_shares.insert(name + ".grad");
      // A set, not a search of params_: that was quadratic in the parameters (--layers 10000
      // spent minutes here before its memory forecast).
      if (held.insert(spec->name).second) params_.push_back(*spec);
    }
    if (!ch.first) wrt.push_back(kChunkInput);
    GradientSpec spec{.wrt = wrt,
                      .recompute = options_.recompute != RecomputePolicy::kNone,
                      .bf16_gradients = Bf16Boundaries(forward, ch.first, ch.last)};
    if (options_.recompute == RecomputePolicy::kFull ||
        options_.recompute == RecomputePolicy::kSublayer)
      spec.checkpoints = ch.model.block_inputs;
    if (options_.recompute == RecomputePolicy::kSublayer)
      spec.recompute_cuts = SublayerInputs(ch.model.forward);
    if (options_.recompute == RecomputePolicy::kSelective)
      spec.recompute_values = ch.model.attention_values;
    if (ch.last) {
      spec.loss = ch.model.loss;
    } else {
      spec.seeds = {kChunkOutput};
    }
    ch.backward = BuildBackward(forward, spec);
    ch.output_saved = !ch.last && Contains(ch.backward.saved, kChunkOutput);

    ExecutableOptions fwd = base;
    fwd.keep = ch.backward.saved;
    ch.forward = std::make_unique<Executable>(forward, fwd);
    if (options_.split_backward) {
      ch.split = SplitBW(ch.backward, ch.first ? std::vector<std::string>{}
                                               : std::vector<std::string>{kChunkInput});
      ExecutableOptions b = base;
      b.donate = InputNames(ch.split.b, ch.split.w_saved);  // W still reads w_saved
      ch.b_exe = std::make_unique<Executable>(ch.split.b, b);
      ExecutableOptions w = base;
      w.donate = InputNames(ch.split.w);
      ch.w_exe = std::make_unique<Executable>(ch.split.w, w);
      if (config.accumulate_in_place) {
        ch.b_acc = MakeAccumulating(ch.split.b, ch.params, b);  // buffers are inputs, not donated
        ch.w_acc = MakeAccumulating(ch.split.w, ch.params, w);
      }
    } else {
      ExecutableOptions bwd = base;
      bwd.donate =
          InputNames(ch.backward.program);  // saved activations and "y.grad" die at last use
      ch.backward_exe = std::make_unique<Executable>(ch.backward.program, bwd);
      if (config.accumulate_in_place)
        ch.backward_acc = MakeAccumulating(ch.backward.program, ch.params, bwd);
    }
  }
  for (const TiedParam& t : tied) {
    if (!held.contains(t.name)) continue;
    tied_.push_back(t);
    for (const std::string& unit : t.units) {
      const std::string grad = TiedReadName(t.name, unit) + ".grad";
      tied_shares_.push_back(
          {.param = t.name, .unit = unit, .grad = grad, .local = local_shares.contains(grad)});
    }
  }
  if (options_.shards < 1 || options_.shard < 0 || options_.shard >= options_.shards) {
    throw InvalidArgument(fmt::format("optimizer shard {} of {}: the shard must be in [0, {})",
                                      options_.shard, options_.shards, options_.shards));
  }
  // Sharded: the optimizer program sees each parameter as its slice (same name, 1-D), so its
  // state and its update cover the slice alone; Update binds views of the slices.
  const std::vector<ParamSpec>* updated = &params_;
  if (options_.shards > 1) {
    for (const ParamSpec& p : params_) {
      ParamSpec slice = p;
      slice.shape =
          Shape({OptimizerShard(p.shape.numel(), options_.shard, options_.shards).size()});
      shard_specs_.push_back(std::move(slice));
    }
    updated = &shard_specs_;
  }
  optimizer_ = std::make_unique<Executable>(BuildOptimizer(*updated, config.optimizer), base);
  if (options_.plan_only) return;
  Allocator& allocator = *options_.allocator;
  for (auto& [name, t] : InitParams(params_, config.seed, allocator))
    state_.Set(name, std::move(t));
  for (auto& [name, t] : InitOptimizerState(*updated, config.optimizer, allocator))
    state_.Set(name, std::move(t));
}

ShardRange OptimizerShard(int64_t numel, int shard, int shards) {
  SLUICE_CHECK(shards >= 1 && shard >= 0 && shard < shards, "shard {} of {}", shard, shards);
  return {.begin = numel * shard / shards, .end = numel * (shard + 1) / shards};
}

int64_t StageProgram::OptimizerStateNumel(const ParamSpec& param) const {
  if (options_.shards == 1) return param.shape.numel();
  return OptimizerShard(param.shape.numel(), options_.shard, options_.shards).size();
}

StageProgram::~StageProgram() = default;

void StageProgram::Forward(int c, Scope& scope) const {
  const Chunk& ch = chunks_[c];
  for (const Chunk::ParamRead& p : ch.params) scope.Set(p.value, state_.Get(p.param));
  ch.forward->Run(scope);
  // The hand-off: the scope keeps exactly what the backward reads, and the chunk's output.
  const std::string& output = ch.last ? ch.model.loss : std::string(kChunkOutput);
  for (const std::string& name : scope.Names()) {
    if (name != output && !Contains(ch.backward.saved, name)) scope.Erase(name);
  }
}

namespace {

// Parameter gradients a backward run left in the scope go to the accumulator.
// A tied parameter's share is accumulated under its own name ("<param>@<unit>.grad").
void TakeGradients(const Chunk& ch, Scope& scope, GradientAccumulator& grads) {
  for (const Chunk::ParamRead& p : ch.params) {
    Tensor g = scope.Take(p.value + ".grad");
    if (g.defined()) grads.Add(p.value + ".grad", std::move(g));
  }
}

void UnbindParams(const Chunk& ch, Scope& scope) {
  for (const Chunk::ParamRead& p : ch.params) scope.Erase(p.value);
}

// Runs `plain`, or `acc` once `grads` holds a buffer for each of its gradients: the buffers are
// bound under the gradients' names, updated in place, and unbound after.
void RunBackward(const Chunk& ch, Executable& plain, const Chunk::Accumulating& acc, Scope& scope,
                 GradientAccumulator& grads) {
  const bool in_place =
      acc.exe != nullptr && std::all_of(acc.grads.begin(), acc.grads.end(),
                                        [&](const auto& g) { return grads.Find(g) != nullptr; });
  if (!in_place) {
    plain.Run(scope);
    TakeGradients(ch, scope, grads);
    return;
  }
  for (const std::string& g : acc.grads) scope.Set(g, *grads.Find(g));
  acc.exe->Run(scope);
  for (const std::string& g : acc.grads) scope.Erase(g);
  TakeGradients(ch, scope, grads);  // any the program still gives out
}

}  // namespace

void StageProgram::Backward(int c, Scope& scope, GradientAccumulator& grads) const {
  const Chunk& ch = chunks_[c];
  for (const Chunk::ParamRead& p : ch.params) scope.Set(p.value, state_.Get(p.param));
  if (options_.split_backward) {
    RunBackward(ch, *ch.b_exe, ch.b_acc, scope, grads);
  } else {
    RunBackward(ch, *ch.backward_exe, ch.backward_acc, scope, grads);
  }
  UnbindParams(ch, scope);
}

void StageProgram::Weight(int c, Scope& scope, GradientAccumulator& grads) const {
  const Chunk& ch = chunks_[c];
  SLUICE_CHECK(options_.split_backward, "W of chunk {} without a split backward", c);
  for (const Chunk::ParamRead& p : ch.params) scope.Set(p.value, state_.Get(p.param));
  RunBackward(ch, *ch.w_exe, ch.w_acc, scope, grads);
  UnbindParams(ch, scope);
}

std::vector<double> StageProgram::FinishGradients(GradientAccumulator& grads, int64_t micro_batches,
                                                  std::map<std::string, Tensor> others) const {
  // Unit order, the same shares in the same order on every copy and on one stage.
  for (const TiedShare& share : tied_shares_) {
    Tensor g = grads.Take(share.grad);
    if (!share.local) {
      auto it = others.find(share.grad);
      SLUICE_CHECK(it != others.end(), "no share {} of tied parameter %{} from its rank",
                   share.grad, share.param);
      g = std::move(it->second);
    }
    if (g.defined()) grads.Add(share.param + ".grad", std::move(g));
  }
  const std::map<std::string, double> by_name = grads.MeanAndSumSquares(micro_batches);
  std::vector<double> out;
  out.reserve(params_.size());
  for (const ParamSpec& p : params_) {
    auto it = by_name.find(p.name + ".grad");
    out.push_back(it == by_name.end() ? 0.0 : it->second);
  }
  return out;
}

void StageProgram::Apply(const GradientAccumulator& grads, double lr, int64_t step,
                         bool into_spares) {
  Allocator& allocator = *options_.allocator;
  Scope run;  // the state, the gradients, lr and step; the spares under their UpdatedName
  for (const std::string& name : state_.Names()) run.Set(name, state_.Get(name));
  for (const auto& [name, g] : grads.grads()) run.Set(name, g);
  if (into_spares) {
    for (const Spare& s : spares_) run.Set(UpdatedName(s.name), s.tensor);
  }
  run.Set("lr", Tensor::Full({}, lr, DType::kF32, allocator));
  run.Set("step", Tensor::Full({}, static_cast<double>(step + 1), DType::kF32, allocator));
  if (options_.shards > 1) {
    // The slices: views into the parameters (and their spares) and their gradients, updated in
    // place; the optimizer state is this replica's slice already.
    for (const ParamSpec& p : params_) {
      const ShardRange r = OptimizerShard(p.shape.numel(), options_.shard, options_.shards);
      const auto slice = [&](const std::string& name) {
        if (run.Has(name))
          run.Set(name, run.Get(name).Reshape({p.shape.numel()}).Slice(0, r.begin, r.end));
      };
      slice(p.name);
      slice(p.name + ".grad");
      if (into_spares) slice(UpdatedName(p.name));
    }
  }
  (into_spares ? *optimizer_into_ : *optimizer_).Run(run);
}

void StageProgram::Update(GradientAccumulator& grads, double global_norm, double lr, int64_t step) {
  grads.Clip(global_norm, config_.optimizer.clip_norm);
  Apply(grads, lr, step);
  grads.Clear();
}

void StageProgram::GatherParams(const std::function<void(const Tensor&)>& all_reduce_sum) {
  SLUICE_CHECK(options_.shards > 1, "GatherParams without a sharded optimizer");
  for (const ParamSpec& p : params_) {
    if (p.constant) continue;  // never updated: the same on every replica
    const Tensor param = state_.Get(p.name);
    SLUICE_CHECK(param.dtype() == DType::kF32 && param.is_contiguous(),
                 "parameter '{}' is not contiguous f32", p.name);
    const ShardRange r = OptimizerShard(p.shape.numel(), options_.shard, options_.shards);
    float* x = param.data<float>();
    std::fill(x, x + r.begin, -0.0f);
    std::fill(x + r.end, x + p.shape.numel(), -0.0f);
    all_reduce_sum(param);
  }
}

bool StageProgram::UpdateIfFinite(GradientAccumulator& grads, double global_norm, double loss,
                                  double lr, int64_t step) {
  if (!std::isfinite(loss) || !std::isfinite(global_norm)) {
    grads.Clear();
    return false;
  }
  Update(grads, global_norm, lr, step);
  return true;
}

std::vector<std::string> StageProgram::UpdatedStateNames() const {
  std::vector<std::string> names;
  for (const ParamSpec& p : params_) {
    if (p.constant) continue;
    names.push_back(p.name);
    for (const std::string& s : OptimizerStateNames(p, config_.optimizer)) names.push_back(s);
  }
  return names;
}

int64_t StageProgram::RollbackBytes() const {
  return sluice::RollbackBytes(params_, config_.optimizer);
}

int64_t RollbackBytes(const std::vector<ParamSpec>& params, const OptimizerConfig& optimizer) {
  int64_t bytes = 0;
  for (const ParamSpec& p : params) {
    if (p.constant && !p.buffer) continue;
    const int64_t tensors =
        p.constant ? 1 : 1 + static_cast<int64_t>(OptimizerStateNames(p, optimizer).size());
    bytes += tensors * p.shape.numel() * static_cast<int64_t>(sizeof(float));
  }
  return bytes;
}

void StageProgram::SaveBuffers() {
  if (saved_buffers_.empty()) {
    for (const ParamSpec& p : params_) {
      if (p.buffer)
        saved_buffers_.push_back({p.name, state_.Get(p.name).Clone(*options_.allocator)});
    }
    return;
  }
  for (Spare& b : saved_buffers_) b.tensor.CopyFrom(state_.Get(b.name));
}

void StageProgram::AverageBuffers(const std::function<void(const Tensor&)>& all_reduce_sum,
                                  int replicas) {
  for (const ParamSpec& p : params_) {
    if (!p.buffer) continue;
    const Tensor& b = state_.Get(p.name);
    all_reduce_sum(b);
    auto divide = [&]<typename T>(T* x) {
      for (int64_t i = 0; i < b.numel(); ++i) x[i] /= static_cast<T>(replicas);
    };
    if (b.dtype() == DType::kF64) {
      divide(b.data<double>());
    } else {
      SLUICE_CHECK(b.dtype() == DType::kF32, "buffer '{}' is {}, not f32 or f64", p.name,
                   Name(b.dtype()));
      divide(b.data<float>());
    }
  }
}

void StageProgram::RestoreBuffers() {
  const bool any =
      std::any_of(params_.begin(), params_.end(), [](const ParamSpec& p) { return p.buffer; });
  SLUICE_CHECK(!any || !saved_buffers_.empty(),
               "restoring the buffers of a discarded run found none saved");
  for (const Spare& b : saved_buffers_) state_.Get(b.name).CopyFrom(b.tensor);
}

void StageProgram::UpdateEagerly(GradientAccumulator& grads, double lr, int64_t step) {
  SLUICE_CHECK(pending_step_ < 0,
               "step {}'s eager update began while step {}'s still awaits its validation", step + 1,
               pending_step_ + 1);
  // The first eager update makes the optimizer into the spares, and the spares (a rank without
  // parameters keeps none).
  if (optimizer_into_ == nullptr) {
    optimizer_into_ = std::make_unique<Executable>(
        BuildOptimizerInto(options_.shards > 1 ? shard_specs_ : params_, config_.optimizer),
        exe_options_);
    // Copies of the state, once: what the update does not write (SGD's momentum buffer at
    // momentum 0, the other replicas' elements of a sharded parameter) then matches either way.
    for (const std::string& name : UpdatedStateNames())
      spares_.push_back({name, state_.Get(name).Clone(*options_.allocator)});
  }
  Apply(grads, lr, step, /*into_spares=*/true);
  SwapSpares();  // the live tensors hold the update, the spares the state before it
  pending_grads_ = std::move(grads);
  grads.Clear();
  pending_step_ = step;
}

void StageProgram::SwapSpares() {
  for (Spare& s : spares_) {
    const Tensor& live = state_.Get(s.name);
    // The swap exchanges whole allocations: the state tensor must be one of its own.
    SLUICE_CHECK(live.offset() == 0 && live.is_contiguous() &&
                     live.storage()->nbytes() == s.tensor.storage()->nbytes(),
                 "post-validation's double buffer of '{}': the state tensor is not an allocation "
                 "of its own of {} bytes",
                 s.name, s.tensor.storage()->nbytes());
    Storage::SwapMemory(*live.storage(), *s.tensor.storage());
  }
}

StageProgram::Validation StageProgram::ValidateEagerUpdate(double global_norm, double loss,
                                                           double lr, int64_t step) {
  SLUICE_CHECK(pending_step_ == step,
               "post-validation of step {} found no saved state to roll back to ({})", step + 1,
               pending_step_ < 0 ? "no eager update is pending"
                                 : fmt::format("the pending one is step {}'s", pending_step_ + 1));
  pending_step_ = -1;
  const Validation verdict = EagerUpdateVerdict(global_norm, loss, config_.optimizer.clip_norm);
  if (verdict == Validation::kAccepted) {
    pending_grads_.Clear();
    return verdict;
  }
  SwapSpares();  // the state before the eager update is live again
  if (verdict == Validation::kSkipped) {
    pending_grads_.Clear();
    return verdict;
  }
  Update(pending_grads_, global_norm, lr, step);
  return verdict;
}

void StageProgram::DiscardEagerUpdate(int64_t step) {
  SLUICE_CHECK(pending_step_ == step,
               "discarding step {}'s eager update found no saved state to restore ({})", step + 1,
               pending_step_ < 0 ? "no eager update is pending"
                                 : fmt::format("the pending one is step {}'s", pending_step_ + 1));
  pending_step_ = -1;
  SwapSpares();
  pending_grads_.Clear();
}

StageProgram::Validation EagerUpdateVerdict(double global_norm, double loss, double clip_norm) {
  if (!std::isfinite(loss) || !std::isfinite(global_norm))
    return StageProgram::Validation::kSkipped;
  return ClipCoefficient(global_norm, clip_norm) == 1.0 ? StageProgram::Validation::kAccepted
                                                        : StageProgram::Validation::kRedone;
}

std::map<std::string, Tensor> StageProgram::State() const {
  std::map<std::string, Tensor> out;
  for (const ParamSpec& p : params_) {
    out.emplace(p.name, state_.Get(p.name));
    for (const std::string& s : OptimizerStateNames(p, config_.optimizer))
      out.emplace(s, state_.Get(s));
  }
  return out;
}

double GlobalNorm(const std::vector<double>& sum_squares_in_model_order) {
  double total = 0;
  for (double s : sum_squares_in_model_order) total += s;
  return std::sqrt(total);
}

RecomputePolicy RecomputeForStage(const TrainConfig& config, int stage, int stages) {
  const size_t n = config.recompute.size();
  if (n == 1) return config.recompute[0];
  if (n != static_cast<size_t>(stages)) {
    throw InvalidArgument(fmt::format(
        "--recompute lists {} policies but training runs in {} stage{}: give one policy "
        "for all stages or one per stage",
        n, stages, stages == 1 ? "" : "s"));
  }
  return config.recompute[stage];
}

int IntraOpThreadsPerRank(int threads, int ranks) {
  const int all =
      threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, all / std::max(1, ranks));
}

void ShareForecastThreads(int threads, int ranks) {
  kernels::SetOneDnnThreads(IntraOpThreadsPerRank(threads, ranks));
}

int ShareIntraOpThreads(int threads, int ranks) {
  const int per_rank = IntraOpThreadsPerRank(threads, ranks);
  kernels::SetBlasThreads(per_rank);
  kernels::SetOneDnnThreads(per_rank);
  kernels::SetIntraOpThreads(per_rank);
  return per_rank;
}

}  // namespace sluice
