#include "sluice/autodiff/autodiff.h"

#include <algorithm>
#include <limits>
#include <map>
#include <optional>
#include <unordered_set>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "sluice/core/error.h"
#include "sluice/ir/builder.h"
#include "sluice/ir/gradient_type.h"
#include "sluice/ir/ops.h"

namespace sluice {

namespace {

std::string GradName(std::string_view v) { return std::string(v) + ".grad"; }

// The live part of a program: the instructions whose results reach a program output (in-place
// ops always stay) and the values they read or give.
struct Liveness {
  std::vector<bool> keep;  // instruction -> kept
  std::vector<bool> live;  // value -> an output or read by a kept instruction
  // Whether value v is in the program that keeps only the live part: a live input or param, or
  // any output of a kept instruction.
  bool Kept(const Program& p, ValueId v) const {
    const int32_t producer = p.value(v).producer;
    return producer < 0 ? live[v] : keep[producer];
  }
};
Liveness FindLive(const Program& p);

std::vector<ValueId> RecomputableSaved(const Program& fwd, std::vector<bool> kept);

// Whether `v` is a `cast` of a parameter.
bool IsParamCast(const Program& fwd, ValueId v) {
  const Value& value = fwd.value(v);
  if (value.kind != ValueKind::kIntermediate) return false;
  const Instruction& ins = fwd.instructions().at(value.producer);
  return ins.op->name == "cast" && fwd.value(ins.inputs.at(0)).kind == ValueKind::kParam;
}
Program PrunedWithRecomputation(const Program& fwd, const Program& bwd, const Liveness& liveness,
                                const std::vector<bool>& dropped, const std::vector<int32_t>& part);
std::vector<int32_t> PartsOf(const Program& fwd, const std::vector<std::string>& cuts);
Program Pruned(const Program& p, const Liveness& liveness);
Program FuseMatMulIntoGeluGrad(Program p);
Program RoundGradientsWhereMade(const Program& p);
Program WidenAtEachReader(const Program& p, const std::unordered_set<std::string>& widened);

class BackwardBuilder {
 public:
  BackwardBuilder(const Program& fwd, const GradientSpec& spec)
      : fwd_(fwd),
        spec_(spec),
        b_(fwd.name() + ".backward"),
        imported_(fwd.values().size()),
        first_part_(fwd.values().size(), -1),
        last_part_(fwd.values().size(), -1),
        grad_(fwd.values().size()),
        bf16_grad_(fwd.values().size(), false),
        rounded_(fwd.values().size()),
        depends_on_wrt_(fwd.values().size(), false),
        wrt_(fwd.values().size(), false) {}

  Backward Build();

  // Used by the VJP context.
  Builder& builder() { return b_; }
  Var Import(ValueId v);
  Var GradOf(ValueId v);
  bool DependsOnWrt(ValueId v) const { return depends_on_wrt_[v]; }

 private:
  void MarkGradName(Var v, ValueId forward_value);

  const Program& fwd_;
  const GradientSpec& spec_;
  Builder b_;
  std::vector<Var> imported_;  // forward value -> its copy in the backward program
  // Adds a gradient part (a contribution to the gradient) of forward value v.
  void AddPart(ValueId v, Var part);
  bool GradNamed(Var v) const {
    return static_cast<size_t>(v.id()) < grad_named_.size() && grad_named_[v.id()];
  }
  // Whether `g` is the gradient of a cast of parameter `param` (its bf16 copy) that nothing else
  // names: no value requested, no bf16 gradient. Looks up param_casts_ (filled by Build): a
  // parameter's own casts, so that asking for every parameter costs O(casts), not
  // O(parameters × instructions).
  bool IsGradThroughParamCast(ValueId param, Var g) const;
  void FindParamCasts();
  void MarkGradNamed(Var v) {
    if (static_cast<size_t>(v.id()) >= grad_named_.size()) grad_named_.resize(v.id() + 1, false);
    grad_named_[v.id()] = true;
  }

  // Gradient parts of every forward value, in arrival order: a list per value through one flat
  // vector (a million values would otherwise hold a heap block each).
  struct Part {
    Var var;
    int32_t next = -1;
  };
  std::vector<Part> parts_;
  std::vector<int32_t> first_part_, last_part_;  // forward value -> its first, last part; -1: none
  std::vector<Var> grad_;                        // forward value -> summed gradient, once final
  // GradientSpec::bf16_gradients: forward value -> its gradient is bf16; that gradient, once final
  // (grad_ holds it widened to f32); the widening casts made (backward values).
  std::vector<bool> bf16_grad_;
  std::vector<Var> rounded_;
  std::vector<ValueId> widened_;
  std::vector<bool> depends_on_wrt_;
  std::vector<bool> wrt_;         // forward value -> in GradientSpec::wrt
  std::vector<bool> grad_named_;  // backward value -> already named "<v>.grad"
  // Every cast of a parameter: (the parameter, the cast's output), sorted by parameter.
  std::vector<std::pair<ValueId, ValueId>> param_casts_;
};

class Context final : public VjpContext {
 public:
  Context(BackwardBuilder& bb, const Program& fwd, const Instruction& ins)
      : bb_(bb), fwd_(fwd), ins_(ins) {}
  Builder& builder() override { return bb_.builder(); }
  const Attrs& attrs() const override { return ins_.attrs; }
  int num_inputs() const override { return static_cast<int>(ins_.inputs.size()); }
  int num_outputs() const override { return static_cast<int>(ins_.outputs.size()); }
  Var x(int i) override { return bb_.Import(ins_.inputs.at(i)); }
  Var y(int i) override { return bb_.Import(ins_.outputs.at(i)); }
  const TensorType& x_type(int i) const override { return fwd_.type(ins_.inputs.at(i)); }
  const TensorType& y_type(int i) const override { return fwd_.type(ins_.outputs.at(i)); }
  Var dy(int i) override { return bb_.GradOf(ins_.outputs.at(i)); }
  bool needs(int i) const override {
    ValueId v = ins_.inputs.at(i);
    return bb_.DependsOnWrt(v) && IsFloating(fwd_.type(v).dtype);
  }

 private:
  BackwardBuilder& bb_;
  const Program& fwd_;
  const Instruction& ins_;
};

Var BackwardBuilder::Import(ValueId v) {
  if (!imported_[v].valid()) {
    const Value& value = fwd_.value(v);
    imported_[v] = value.kind == ValueKind::kParam
                       ? Var(&b_, b_.mutable_program().AddParamLike(fwd_, v))
                       : b_.Input(value.name, fwd_.type(v).dtype, fwd_.type(v).shape);
  }
  return imported_[v];
}

void BackwardBuilder::MarkGradName(Var v, ValueId forward_value) {
  // Only values computed by a backward instruction and not yet another value's gradient are
  // renamed.
  const std::string name = GradName(fwd_.value(forward_value).name);
  if (v.value().producer >= 0 && !GradNamed(v) && !b_.program().Find(name)) {
    b_.mutable_program().Rename(v.id(), name);
    MarkGradNamed(v);
  }
}

void BackwardBuilder::AddPart(ValueId v, Var part) {
  const int32_t k = static_cast<int32_t>(parts_.size());
  parts_.push_back({part, -1});
  if (first_part_[v] < 0) {
    first_part_[v] = k;
  } else {
    parts_[last_part_[v]].next = k;
  }
  last_part_[v] = k;
}

void BackwardBuilder::FindParamCasts() {
  for (const Instruction& ins : fwd_.instructions()) {
    if (ins.op->name == "cast" && fwd_.value(ins.inputs.at(0)).kind == ValueKind::kParam)
      param_casts_.emplace_back(ins.inputs.at(0), ins.outputs.at(0));
  }
  std::sort(param_casts_.begin(), param_casts_.end());
}

bool BackwardBuilder::IsGradThroughParamCast(ValueId param, Var g) const {
  auto it =
      std::lower_bound(param_casts_.begin(), param_casts_.end(),
                       std::pair<ValueId, ValueId>(param, std::numeric_limits<ValueId>::min()));
  for (; it != param_casts_.end() && it->first == param; ++it) {
    const ValueId copy = it->second;
    if (grad_[copy].valid() && grad_[copy].id() == g.id() && !bf16_grad_[copy] && !wrt_[copy])
      return true;
  }
  return false;
}

Var BackwardBuilder::GradOf(ValueId v) {
  if (grad_[v].valid()) return grad_[v];
  int32_t k = first_part_[v];
  if (k < 0) return Var();
  if (!bf16_grad_[v]) {
    Var sum = parts_[k].var;
    for (k = parts_[k].next; k >= 0; k = parts_[k].next) sum = Add(sum, parts_[k].var);
    MarkGradName(sum, v);
    grad_[v] = sum;
    return sum;
  }
  // A bf16 gradient (GradientSpec::bf16_gradients): a bf16 seed alone is it; otherwise the parts
  // (a seed among them widened) are summed in f32 and rounded once.
  if (parts_[k].next < 0 && parts_[k].var.dtype() == DType::kBF16) {
    rounded_[v] = parts_[k].var;
  } else {
    auto f32 = [](Var part) {
      return part.dtype() == DType::kBF16 ? Cast(part, DType::kF32) : part;
    };
    Var sum = f32(parts_[k].var);
    for (k = parts_[k].next; k >= 0; k = parts_[k].next) sum = Add(sum, f32(parts_[k].var));
    rounded_[v] = Cast(sum, DType::kBF16);
    MarkGradName(rounded_[v], v);
  }
  grad_[v] = Cast(rounded_[v], DType::kF32);  // the producer's VJP reads GradientType
  widened_.push_back(grad_[v].id());
  return grad_[v];
}

Backward BackwardBuilder::Build() {
  // Backward temporaries must not shadow forward values: both programs share one scope.
  for (const Value& v : fwd_.values()) b_.mutable_program().ReserveName(v.name);
  // Which forward values depend on something we differentiate with respect to.
  for (const std::string& name : spec_.wrt) {
    ValueId v = fwd_.Get(name);
    if (fwd_.IsConstant(v)) {
      throw ProgramError(fmt::format(
          "autodiff: cannot differentiate with respect to %{}: it is a constant (never trained)",
          name));
    }
    if (!IsFloating(fwd_.type(v).dtype)) {
      throw ProgramError(
          fmt::format("autodiff: cannot differentiate with respect to %{} of dtype {}", name,
                      Name(fwd_.type(v).dtype)));
    }
    depends_on_wrt_[v] = true;
    wrt_[v] = true;
  }
  for (const std::string& name : spec_.bf16_gradients) {
    const std::optional<ValueId> v = fwd_.Find(name);
    if (!v) {
      throw ProgramError(
          fmt::format("autodiff: a bf16 gradient is asked for %{}, which does not exist", name));
    }
    if (fwd_.type(*v).dtype != DType::kBF16) {
      throw ProgramError(fmt::format(
          "autodiff: a bf16 gradient is asked for %{}, which is {}: only a bf16 value has one",
          name, fwd_.type(*v).ToString()));
    }
    bf16_grad_[*v] = true;
  }
  for (const Instruction& ins : fwd_.instructions()) {
    bool any = std::any_of(ins.inputs.begin(), ins.inputs.end(),
                           [&](ValueId v) { return depends_on_wrt_[v]; });
    for (ValueId o : ins.outputs) depends_on_wrt_[o] = any;
  }

  // Seeds: the loss gets 1 inside the program; other seeds come in as "<v>.grad" inputs.
  if (!spec_.loss.empty()) {
    ValueId loss = fwd_.Get(spec_.loss);
    const TensorType& t = fwd_.type(loss);
    if (t.shape.numel() != 1) {
      throw ProgramError(fmt::format("autodiff: the loss %{} must be a scalar, it is {}",
                                     spec_.loss, t.ToString()));
    }
    Var one = Full(b_, t.shape, 1.0, GradientType(t).dtype);
    b_.mutable_program().Rename(one.id(), GradName(spec_.loss));
    MarkGradNamed(one);
    AddPart(loss, one);
  }
  for (const std::string& name : spec_.seeds) {
    ValueId v = fwd_.Get(name);
    const TensorType& t = fwd_.type(v);
    Var seed =
        b_.Input(GradName(name), bf16_grad_[v] ? DType::kBF16 : GradientType(t).dtype, t.shape);
    MarkGradNamed(seed);
    AddPart(v, seed);
  }

  // Reverse sweep: every instruction whose outputs carry a gradient and whose inputs need one.
  const auto& instrs = fwd_.instructions();
  for (size_t k = instrs.size(); k-- > 0;) {
    const Instruction& ins = instrs[k];
    if (ins.op->kind == OpKind::kInPlace) continue;
    Context ctx(*this, fwd_, ins);
    bool any_needed = false;
    for (int i = 0; i < ctx.num_inputs(); ++i) any_needed |= ctx.needs(i);
    bool any_grad = false;
    for (ValueId o : ins.outputs) any_grad |= GradOf(o).valid();
    if (!any_needed || !any_grad) continue;
    // Formatted only for a message (the sweep visits a million instructions of a deep model).
    auto where = [&] {
      return fmt::format("{} %{}", ins.op->name, fwd_.value(ins.outputs.at(0)).name);
    };
    if (ins.op->vjp == nullptr) {
      throw ProgramError(fmt::format("autodiff: op {} has no gradient rule", where()));
    }
    std::vector<Var> grads = ins.op->vjp(ctx);
    SLUICE_CHECK(grads.size() == ins.inputs.size(), "VJP of {} returned {} gradients for {} inputs",
                 where(), grads.size(), ins.inputs.size());
    for (size_t i = 0; i < grads.size(); ++i) {
      if (!ctx.needs(static_cast<int>(i)) || !grads[i].valid()) continue;
      SLUICE_CHECK(grads[i].type() == GradientType(ctx.x_type(static_cast<int>(i))),
                   "VJP of {}: gradient of input {} is {}, expected {}", where(), i,
                   grads[i].type().ToString(),
                   GradientType(ctx.x_type(static_cast<int>(i))).ToString());
      AddPart(ins.inputs[i], grads[i]);
    }
  }

  // Outputs: one "<wrt>.grad" per requested value (zeros when nothing depends on it).
  FindParamCasts();
  Backward out;
  for (const std::string& name : spec_.wrt) {
    ValueId v = fwd_.Get(name);
    const TensorType& t = fwd_.type(v);
    Var g = GradOf(v);
    if (g.valid() && bf16_grad_[v]) g = rounded_[v];
    if (!g.valid()) g = Full(b_, t.shape, 0.0, GradientType(t).dtype);
    if (bf16_grad_[v]) g = Cast(g, DType::kBF16);
    if (g.name() != GradName(name)) {
      // The gradient of a parameter's bf16 copy passes through its cast (f32 both sides) and is
      // the parameter's gradient: renamed, not copied. Any other gradient named already aliases
      // a value the program reads under that name.
      if (g.value().producer < 0 || (GradNamed(g) && !IsGradThroughParamCast(v, g)))
        g = Copy(g);  // the gradient aliases another value
      b_.mutable_program().Rename(g.id(), GradName(name));
      MarkGradNamed(g);
    }
    b_.Output(g);
    out.grads.push_back(GradName(name));
  }

  // The program handed out is b_'s without dead code (PruneDeadCode) and, when saved values are
  // dropped, with their recomputation: built in one copy, the same as pruning and then recomputing.
  const Program& bwd = b_.program();
  const Liveness liveness = FindLive(bwd);
  std::unordered_set<std::string> seed_names;
  for (const std::string& s : spec_.seeds) seed_names.insert(GradName(s));
  {
    // Sets of forward values, by id: a backward input other than a seed is a forward value
    // imported under its own name.
    const size_t nf = fwd_.values().size();
    std::vector<ValueId> fwd_of(bwd.values().size(), kNoValue);
    for (size_t f = 0; f < nf; ++f) {
      if (imported_[f].valid()) fwd_of[imported_[f].id()] = static_cast<ValueId>(f);
    }
    std::vector<bool> saved(nf, false);
    for (ValueId v : bwd.inputs()) {
      if (liveness.live[v] && fwd_of[v] != kNoValue) saved[fwd_of[v]] = true;
    }
    // Checkpointing first: what is not kept at all; then the cheap ops among what is still kept.
    std::vector<bool> dropped(nf, false);
    auto is_forward_input = [&](size_t f) {
      return fwd_.value(static_cast<ValueId>(f)).kind == ValueKind::kInput;
    };
    if (spec_.checkpoints) {
      const std::unordered_set<std::string> keep(spec_.checkpoints->begin(),
                                                 spec_.checkpoints->end());
      for (size_t f = 0; f < nf; ++f) {
        if (saved[f] && !keep.count(fwd_.value(static_cast<ValueId>(f)).name) &&
            !is_forward_input(f)) {
          dropped[f] = true;
        }
      }
    }
    for (const std::string& name : spec_.recompute_values) {
      const std::optional<ValueId> f = fwd_.Find(name);
      if (f && saved[*f] && !is_forward_input(*f)) dropped[*f] = true;
    }
    // A parameter's cast (its bf16 copy under mixed precision) is remade in backward under every
    // policy: the parameter is always at hand, and one pass over a weight costs about 1/(B·T) of
    // the products that read the copy, which would otherwise stay alive from forward to backward.
    for (size_t f = 0; f < nf; ++f) {
      if (saved[f] && IsParamCast(fwd_, static_cast<ValueId>(f))) dropped[f] = true;
    }
    std::vector<bool> kept(nf, false);
    for (size_t f = 0; f < nf; ++f) kept[f] = saved[f] && !dropped[f];
    if (spec_.recompute) {
      for (ValueId v : RecomputableSaved(fwd_, std::move(kept))) dropped[v] = true;
    }
    std::vector<bool> bwd_dropped(bwd.values().size(), false);
    bool any_dropped = false;
    for (ValueId v : bwd.inputs()) {
      if (liveness.live[v] && fwd_of[v] != kNoValue && dropped[fwd_of[v]]) {
        bwd_dropped[v] = any_dropped = true;
      }
    }
    out.program = RoundGradientsWhereMade(FuseMatMulIntoGeluGrad(
        any_dropped ? PrunedWithRecomputation(fwd_, bwd, liveness, bwd_dropped,
                                              PartsOf(fwd_, spec_.recompute_cuts))
                    : Pruned(bwd, liveness)));
    if (!widened_.empty()) {
      std::unordered_set<std::string> widened;
      for (ValueId w : widened_) widened.insert(bwd.value(w).name);
      out.program = WidenAtEachReader(out.program, widened);
    }
  }
  for (ValueId v : out.program.inputs()) {
    const std::string& n = out.program.value(v).name;
    if (!seed_names.count(n)) out.saved.push_back(n);
  }
  for (ValueId v : out.program.params()) out.params_read.push_back(out.program.value(v).name);
  return out;
}

// Appends `ins` (an instruction of `src`) to `dst`, whose values of the same names it reads and
// defines. `to_dst` maps values of `src` to their copies in `dst` (kNoValue: not mapped yet, found
// by name); the outputs' copies are added to it.
void CopyInstruction(const Program& src, const Instruction& ins, Program& dst,
                     std::vector<ValueId>& to_dst) {
  ValueList inputs;
  for (ValueId v : ins.inputs) {
    inputs.push_back(to_dst[v] != kNoValue ? to_dst[v] : dst.Get(src.value(v).name));
  }
  std::vector<std::string> names;
  names.reserve(ins.outputs.size());
  for (ValueId v : ins.outputs) names.push_back(src.value(v).name);
  const ValueList outputs =
      dst.AddInstruction(ins.op->name, std::move(inputs), ins.attrs, std::move(names));
  for (size_t k = 0; k < outputs.size(); ++k) to_dst[ins.outputs[k]] = outputs[k];
}

// Copies the values and instructions of `src` selected by `keep_instr` into a new program.
// Inputs and params are kept when `keep_value` says so. `to_dst` (sized to src's values) receives
// the copies' ids.
template <typename KeepInstr, typename KeepValue>
Program CopyProgram(const Program& src, const std::string& name, KeepInstr keep_instr,
                    KeepValue keep_value, std::vector<ValueId>& to_dst) {
  Program dst(name);
  to_dst.assign(src.values().size(), kNoValue);
  for (const Value& v : src.values()) dst.ReserveName(v.name);
  for (ValueId v : src.inputs()) {
    if (keep_value(v)) to_dst[v] = dst.AddInput(src.value(v).name, src.type(v));
  }
  for (ValueId v : src.params()) {
    if (keep_value(v)) to_dst[v] = dst.AddParamLike(src, v);
  }
  const auto& instrs = src.instructions();
  for (size_t i = 0; i < instrs.size(); ++i) {
    if (keep_instr(i)) CopyInstruction(src, instrs[i], dst, to_dst);
  }
  return dst;
}

Liveness FindLive(const Program& p) {
  Liveness l;
  l.live.assign(p.values().size(), false);
  for (ValueId v : p.outputs()) l.live[v] = true;
  const auto& instrs = p.instructions();
  l.keep.assign(instrs.size(), false);
  for (size_t i = instrs.size(); i-- > 0;) {
    const Instruction& ins = instrs[i];
    l.keep[i] =
        ins.op->kind == OpKind::kInPlace ||
        std::any_of(ins.outputs.begin(), ins.outputs.end(), [&](ValueId v) { return l.live[v]; });
    if (l.keep[i]) {
      for (ValueId v : ins.inputs) l.live[v] = true;
    }
  }
  return l;
}

Program Pruned(const Program& p, const Liveness& liveness) {
  std::vector<ValueId> to_dst;
  Program out = CopyProgram(
      p, p.name(), [&](size_t i) { return liveness.keep[i]; },
      [&](ValueId v) { return liveness.live[v]; }, to_dst);
  for (ValueId v : p.outputs()) out.AddOutput(to_dst[v]);
  return out;
}

// Saved values that the backward program can recompute from values it reads anyway (see
// GradientSpec::recompute), in forward order. A saved view (reshape, …) of a recomputable op's
// output that is not saved itself counts as that output: the backward recomputes the op and takes
// the view again (an exported `matmul` reads its input through such views). So does a short chain
// of recomputable ops over values the backward has: relu(batch_norm(x)) is recomputed from x,
// which batch norm's gradient reads anyway, the normalised value between them never saved.
// `kept`: forward value -> saved and not dropped.
std::vector<ValueId> RecomputableSaved(const Program& fwd, std::vector<bool> kept) {
  // Recomputable ops a chain may pass through before it reaches values the backward has.
  constexpr int kMaxChain = 3;
  std::vector<ValueId> chosen;
  const std::vector<bool> saved = kept;
  // Whether the producer of `v` is a recomputable op whose inputs the backward has or can
  // recompute (at most `depth` more ops deep), looking through views of values that are not
  // saved.
  auto recomputable = [&](auto& self, ValueId v, int depth) -> bool {
    while (true) {
      const Value& value = fwd.value(v);
      if (value.kind != ValueKind::kIntermediate) return false;
      const Instruction& ins = fwd.instructions().at(value.producer);
      if (ins.outputs.size() != 1) return false;
      if (ins.op->kind == OpKind::kView && !ins.op->recomputable) {
        v = ins.inputs.at(0);
        if (saved[v]) return false;  // the storage stays anyway: nothing to gain
        continue;
      }
      if (!ins.op->recomputable) return false;
      return std::all_of(ins.inputs.begin(), ins.inputs.end(), [&](ValueId in) {
        // A kept value, or a view of one (taken again on the way), is at hand.
        for (ValueId base = in;;) {
          if (fwd.value(base).kind == ValueKind::kParam || kept[base]) return true;
          if (fwd.value(base).kind != ValueKind::kIntermediate) break;
          const Instruction& producer = fwd.instructions().at(fwd.value(base).producer);
          if (producer.op->kind != OpKind::kView || producer.op->recomputable) break;
          base = producer.inputs.at(0);
        }
        // An input the forward does not keep (or no longer keeps) made again on the way.
        return depth > 0 && fwd.value(in).kind == ValueKind::kIntermediate &&
               self(self, in, depth - 1);
      });
    }
  };
  for (const Instruction& ins : fwd.instructions()) {
    if (ins.outputs.size() != 1) continue;
    const ValueId out = ins.outputs[0];
    if (!kept[out] || !recomputable(recomputable, out, kMaxChain - 1)) continue;
    kept[out] = false;
    chosen.push_back(out);
  }
  return chosen;
}

// The part (GradientSpec::recompute_cuts) of each forward value: the number of cut values made at
// or before its instruction; parameters and inputs are in part 0. Unknown names are skipped (a
// cut of another piece of the model).
std::vector<int32_t> PartsOf(const Program& fwd, const std::vector<std::string>& cuts) {
  std::vector<int32_t> part(fwd.values().size(), 0);
  if (cuts.empty()) return part;
  std::vector<int32_t> starts(fwd.instructions().size(), 0);  // instruction -> cuts made there
  for (const std::string& name : cuts) {
    const std::optional<ValueId> v = fwd.Find(name);
    if (v && fwd.value(*v).producer >= 0) ++starts[static_cast<size_t>(fwd.value(*v).producer)];
  }
  int32_t current = 0;
  for (size_t i = 0; i < fwd.instructions().size(); ++i) {
    current += starts[i];
    for (ValueId o : fwd.instructions()[i].outputs) part[o] = current;
  }
  return part;
}

// The live part of `bwd` (as Pruned gives it) without the `dropped` inputs (forward values, by
// backward value id): each is computed by its forward instruction right before its first use
// instead, as is — transitively — every forward value such an instruction reads that the program
// does not have. Parameters and forward inputs are read as such. `part` (PartsOf, by forward
// value): a value of an earlier part than the one recomputed is made as a transient copy under a
// fresh name, so that it dies once read here and its part's backward recomputes it again.
Program PrunedWithRecomputation(const Program& fwd, const Program& bwd, const Liveness& liveness,
                                const std::vector<bool>& dropped,
                                const std::vector<int32_t>& part) {
  Program dst(bwd.name());
  // The names the pruned program has (it reserves those) and the forward's.
  for (ValueId v = 0; v < static_cast<ValueId>(bwd.values().size()); ++v) {
    if (liveness.Kept(bwd, v)) dst.ReserveName(bwd.value(v).name);
  }
  for (const Value& v : fwd.values()) dst.ReserveName(v.name);
  std::vector<ValueId> to_dst(bwd.values().size(), kNoValue);
  for (ValueId v : bwd.inputs()) {
    if (liveness.live[v] && !dropped[v]) to_dst[v] = dst.AddInput(bwd.value(v).name, bwd.type(v));
  }
  for (ValueId v : bwd.params()) {
    if (liveness.live[v]) to_dst[v] = dst.AddParamLike(bwd, v);
  }
  // Makes the forward value `name` available in dst. Iterative (a deep model recomputes long
  // chains): a stack of values whose producers wait for their inputs.
  auto ensure = [&](const std::string& name) {
    if (dst.Find(name) || !fwd.Find(name)) return;
    const int32_t own = part[fwd.Get(name)];
    std::map<ValueId, ValueId> transient;  // forward value of an earlier part -> its copy here
    // The copy of forward value `v` this recomputation reads, if made.
    auto made = [&](ValueId v) -> std::optional<ValueId> {
      if (auto it = transient.find(v); it != transient.end()) return it->second;
      return dst.Find(fwd.value(v).name);
    };
    std::vector<ValueId> stack = {fwd.Get(name)};
    while (!stack.empty()) {
      const Value& value = fwd.value(stack.back());
      if (made(stack.back())) {
        stack.pop_back();
        continue;
      }
      if (value.kind == ValueKind::kParam) {
        dst.AddParamLike(fwd, stack.back());
        stack.pop_back();
        continue;
      }
      if (value.kind == ValueKind::kInput) {
        dst.AddInput(value.name, fwd.type(stack.back()));
        stack.pop_back();
        continue;
      }
      const Instruction& ins = fwd.instructions().at(value.producer);
      bool ready = true;
      for (ValueId in : ins.inputs) {
        if (!made(in)) {
          stack.push_back(in);
          ready = false;
        }
      }
      if (!ready) continue;
      std::vector<ValueId> inputs;
      for (ValueId in : ins.inputs) inputs.push_back(*made(in));
      // Outputs the backward already has (another output of a multi-output op, kept) get fresh
      // names: the recomputed copy is the same value. So do transient copies of an earlier part.
      const bool earlier = part[stack.back()] < own;
      std::vector<std::string> names;
      for (ValueId o : ins.outputs) {
        const std::string& n = fwd.value(o).name;
        names.push_back(earlier || dst.Find(n) ? dst.FreshName(n) : n);
      }
      const ValueList outputs =
          dst.AddInstruction(ins.op->name, std::move(inputs), ins.attrs, std::move(names));
      if (earlier) {
        for (size_t k = 0; k < outputs.size(); ++k) transient[ins.outputs[k]] = outputs[k];
      }
      stack.pop_back();
    }
  };
  auto available = [&](ValueId v) {  // a dropped input: recomputed before its first use
    if (dropped[v] && to_dst[v] == kNoValue) {
      ensure(bwd.value(v).name);
      to_dst[v] = dst.Get(bwd.value(v).name);
    }
  };
  const auto& instrs = bwd.instructions();
  for (size_t i = 0; i < instrs.size(); ++i) {
    if (!liveness.keep[i]) continue;
    for (ValueId v : instrs[i].inputs) available(v);
    CopyInstruction(bwd, instrs[i], dst, to_dst);
  }
  for (ValueId v : bwd.outputs()) {
    available(v);
    dst.AddOutput(to_dst[v] != kNoValue ? to_dst[v] : dst.Get(bwd.value(v).name));
  }
  return dst;
}

// The values named in `widened` (casts of a bf16 gradient to f32: GradientSpec::bf16_gradients)
// made again right before each instruction that reads them (once for a run of instructions in a
// row that do), from their bf16 source: between two readers only the bf16 gradient is alive, not
// its f32 copy (a block's output gradient through the MLP's backward, until the residual's add
// reads it). Bitwise the same: widening is exact. One that is an output or that an in-place op
// reads stays as it is.
Program WidenAtEachReader(const Program& p, const std::unordered_set<std::string>& widened) {
  const auto& instrs = p.instructions();
  std::vector<bool> rewiden(p.values().size(), false);
  for (const Instruction& ins : instrs) {
    if (ins.op->name == "cast" && ins.outputs.size() == 1 &&
        widened.count(p.value(ins.outputs[0]).name) && !p.IsOutput(ins.outputs[0])) {
      rewiden[ins.outputs[0]] = true;
    }
  }
  for (const Instruction& ins : instrs) {
    if (ins.op->kind != OpKind::kInPlace) continue;
    for (ValueId v : ins.inputs) rewiden[v] = false;
  }
  std::vector<ValueId> to_dst;
  Program dst = CopyProgram(
      p, p.name(), [](size_t) { return false; }, [](ValueId) { return true; }, to_dst);
  std::vector<const Instruction*> widening(p.values().size(), nullptr);  // its cast in p
  std::vector<size_t> made_for(p.values().size(), 0);  // 1 + the reader its last copy was made for
  for (size_t i = 0; i < instrs.size(); ++i) {
    const Instruction& ins = instrs[i];
    if (ins.op->name == "cast" && ins.outputs.size() == 1 && rewiden[ins.outputs[0]]) {
      widening[ins.outputs[0]] = &ins;
      continue;
    }
    for (ValueId v : ins.inputs) {
      if (widening[v] == nullptr || made_for[v] == i + 1) continue;
      if (made_for[v] != i) {  // the last copy was not for the instruction just before
        const std::string name =
            to_dst[v] == kNoValue ? p.value(v).name : dst.FreshName(p.value(v).name);
        to_dst[v] = dst.AddInstruction("cast", {to_dst[widening[v]->inputs[0]]}, widening[v]->attrs,
                                       {name})[0];
      }
      made_for[v] = i + 1;
    }
    CopyInstruction(p, ins, dst, to_dst);
  }
  for (ValueId v : p.outputs()) dst.AddOutput(to_dst[v]);
  return dst;
}

// Per value of `p`: how many instructions read it (and 1 more for a program output), and the last
// instruction that reads it (-1: none).
struct Readers {
  std::vector<int> uses;
  std::vector<int32_t> last;
  explicit Readers(const Program& p) : uses(p.values().size(), 0), last(p.values().size(), -1) {
    const auto& instrs = p.instructions();
    for (size_t i = 0; i < instrs.size(); ++i) {
      for (ValueId v : instrs[i].inputs) {
        ++uses[v];
        last[v] = static_cast<int32_t>(i);
      }
    }
    for (ValueId v : p.outputs()) ++uses[v];
  }
};

// gelu_grad(dy, x) whose dy is a matmul's result that nothing else reads, as it is or through
// reshapes that nothing else reads (an imported linear's [B·T, n] product viewed as [B, T, n]),
// becomes one matmul_gelu_grad at the gelu_grad's place (see autodiff.h), on x viewed in the
// product's shape and its result viewed back in dx's.
Program FuseMatMulIntoGeluGrad(Program p) {
  const auto& instrs = p.instructions();
  const Readers readers(p);
  std::vector<int32_t> fused_matmul(instrs.size(), -1);  // per gelu_grad: the matmul it absorbs
  std::vector<bool> absorbed(instrs.size(), false);
  bool any = false;
  for (size_t i = 0; i < instrs.size(); ++i) {
    if (instrs[i].op->name != "gelu_grad") continue;
    ValueId dy = instrs[i].inputs[0];
    std::vector<int32_t> views;  // the reshapes between the matmul and the gelu_grad
    int32_t producer = p.value(dy).producer;
    while (producer >= 0 && readers.uses[dy] == 1 && instrs[producer].op->name == "reshape") {
      views.push_back(producer);
      dy = instrs[producer].inputs[0];
      producer = p.value(dy).producer;
    }
    if (producer < 0 || readers.uses[dy] != 1 || instrs[producer].op->name != "matmul") continue;
    fused_matmul[i] = producer;
    absorbed[producer] = any = true;
    for (int32_t v : views) absorbed[v] = true;
  }
  if (!any) return p;
  std::vector<ValueId> to_dst;
  Program out = CopyProgram(
      p, p.name(), [](size_t) { return false; }, [](ValueId) { return true; }, to_dst);
  auto view = [&](ValueId v, const Shape& shape, const std::string& name) {
    return out.AddInstruction(
        "reshape", {v}, {{"shape", std::vector<int64_t>(shape.dims().begin(), shape.dims().end())}},
        {name})[0];
  };
  for (size_t i = 0; i < instrs.size(); ++i) {
    if (absorbed[i]) continue;
    if (fused_matmul[i] < 0) {
      CopyInstruction(p, instrs[i], out, to_dst);
      continue;
    }
    const Instruction& mm = instrs[fused_matmul[i]];
    const ValueId dx = instrs[i].outputs[0], product = mm.outputs[0];
    const Shape& shape = p.type(product).shape;
    ValueId x = to_dst[instrs[i].inputs[1]];
    if (shape == p.type(dx).shape) {
      to_dst[dx] =
          out.AddInstruction("matmul_gelu_grad", {to_dst[mm.inputs[0]], to_dst[mm.inputs[1]], x},
                             mm.attrs, {p.value(dx).name})[0];
      continue;
    }
    x = view(x, shape, out.FreshName(out.value(x).name + ".view"));
    const ValueId fused =
        out.AddInstruction("matmul_gelu_grad", {to_dst[mm.inputs[0]], to_dst[mm.inputs[1]], x},
                           mm.attrs, {p.value(product).name})[0];
    to_dst[dx] = view(fused, p.type(dx).shape, p.value(dx).name);
  }
  for (ValueId v : p.outputs()) out.AddOutput(to_dst[v]);
  return out;
}

// The ops that can round the gradients they make to bf16 as they store them, bit for bit what a
// cast of their f32 results gives, when asked by the attribute dtype = "bf16": all of an
// instruction's outputs together.
constexpr std::string_view kRoundWhereMade[] = {"swiglu_grad", "cross_entropy_grad"};

// An f32 gradient made by one of those ops whose one reader, as it is or through views that
// nothing else reads, is a cast to bf16 — a bf16 product's VJP rounding its operand (ir/ops/
// linalg.cc) — is made bf16 by its op; the views pass the bf16 gradient on, the cast goes (its
// readers read the last view or the gradient). Bitwise the same gradients, half the bytes between
// the op and the products (autodiff.h).
Program RoundGradientsWhereMade(const Program& p) {
  const auto& instrs = p.instructions();
  const Readers readers(p);
  // The cast to bf16 that f32 value v ends in, or -1.
  auto rounding_cast = [&](ValueId v) -> int32_t {
    if (p.type(v).dtype != DType::kF32) return -1;
    for (; readers.uses[v] == 1 && !p.IsOutput(v); v = instrs[readers.last[v]].outputs[0]) {
      const Instruction& r = instrs[readers.last[v]];
      if (r.op->name == "cast") {
        const bool rounds =
            r.attrs.GetString("dtype") == Name(DType::kBF16) && !p.IsOutput(r.outputs[0]);
        return rounds ? readers.last[v] : -1;
      }
      if (r.op->kind != OpKind::kView || r.outputs.size() != 1) return -1;
    }
    return -1;
  };
  std::vector<bool> rounded(instrs.size(), false), dropped(instrs.size(), false);
  bool any = false;
  for (size_t i = 0; i < instrs.size(); ++i) {
    const Instruction& ins = instrs[i];
    if (std::find(std::begin(kRoundWhereMade), std::end(kRoundWhereMade), ins.op->name) ==
        std::end(kRoundWhereMade)) {
      continue;
    }
    std::vector<int32_t> casts;
    for (ValueId v : ins.outputs) casts.push_back(rounding_cast(v));
    if (std::find(casts.begin(), casts.end(), -1) != casts.end()) continue;
    rounded[i] = any = true;
    for (int32_t c : casts) dropped[c] = true;
  }
  if (!any) return p;
  std::vector<ValueId> to_dst;
  Program out = CopyProgram(
      p, p.name(), [](size_t) { return false; }, [](ValueId) { return true; }, to_dst);
  for (size_t i = 0; i < instrs.size(); ++i) {
    const Instruction& ins = instrs[i];
    if (dropped[i]) {
      to_dst[ins.outputs[0]] = to_dst[ins.inputs[0]];
    } else if (rounded[i]) {
      Instruction bf16 = ins;
      bf16.attrs.Set("dtype", std::string(Name(DType::kBF16)));
      CopyInstruction(p, bf16, out, to_dst);
    } else {
      CopyInstruction(p, ins, out, to_dst);
    }
  }
  for (ValueId v : p.outputs()) out.AddOutput(to_dst[v]);
  return out;
}

}  // namespace

Program PruneDeadCode(const Program& p) { return Pruned(p, FindLive(p)); }

Backward BuildBackward(const Program& forward, const GradientSpec& spec) {
  return BackwardBuilder(forward, spec).Build();
}

SplitBackward SplitBW(const Backward& backward, const std::vector<std::string>& b_wrt) {
  const Program& p = backward.program;
  const auto& instrs = p.instructions();
  const size_t nv = p.values().size();

  // B: the backward slice of the gradients of b_wrt.
  std::vector<bool> b_value(nv, false), in_b(instrs.size(), false);
  std::vector<ValueId> b_outputs;
  std::vector<bool> is_b_output(nv, false);
  for (const std::string& name : b_wrt) {
    ValueId g = p.Get(name + ".grad");
    b_value[g] = true;
    b_outputs.push_back(g);
    is_b_output[g] = true;
  }
  for (size_t i = instrs.size(); i-- > 0;) {
    const Instruction& ins = instrs[i];
    in_b[i] =
        std::any_of(ins.outputs.begin(), ins.outputs.end(), [&](ValueId v) { return b_value[v]; });
    if (in_b[i]) {
      for (ValueId v : ins.inputs) b_value[v] = true;
    }
  }
  // W: everything else that reaches the remaining outputs.
  std::vector<bool> w_value(nv, false), in_w(instrs.size(), false);
  std::vector<ValueId> w_outputs;
  for (ValueId v : p.outputs()) {
    bool defined_in_b = p.value(v).producer >= 0 && in_b[p.value(v).producer];
    if (is_b_output[v]) continue;
    if (defined_in_b || p.value(v).producer < 0) {
      b_outputs.push_back(v);  // already computed by B (or passed through): B hands it out
      is_b_output[v] = true;
    } else {
      w_outputs.push_back(v);
      w_value[v] = true;
    }
  }
  for (size_t i = instrs.size(); i-- > 0;) {
    const Instruction& ins = instrs[i];
    if (in_b[i]) continue;
    in_w[i] =
        std::any_of(ins.outputs.begin(), ins.outputs.end(), [&](ValueId v) { return w_value[v]; });
    if (in_w[i]) {
      for (ValueId v : ins.inputs) w_value[v] = true;
    }
  }

  SplitBackward out;
  // Values computed in B that W reads.
  std::vector<ValueId> crossing;
  for (ValueId v = 0; v < static_cast<ValueId>(nv); ++v) {
    int32_t prod = p.value(v).producer;
    if (prod >= 0 && in_b[prod] && w_value[v]) crossing.push_back(v);
  }
  std::vector<ValueId> to_b;
  out.b = CopyProgram(
      p, p.name() + ".b", [&](size_t i) { return in_b[i]; }, [&](ValueId v) { return b_value[v]; },
      to_b);
  auto in_b_program = [&](ValueId v) {
    return to_b[v] != kNoValue ? to_b[v] : out.b.Get(p.value(v).name);
  };
  for (ValueId v : b_outputs) out.b.AddOutput(in_b_program(v));
  for (ValueId v : crossing) {
    out.b.AddOutput(in_b_program(v));
    out.b_to_w.push_back(p.value(v).name);
  }

  Program w(p.name() + ".w");
  std::vector<ValueId> to_w(nv, kNoValue);
  for (ValueId v : p.inputs()) {
    if (w_value[v]) {
      to_w[v] = w.AddInput(p.value(v).name, p.type(v));
      out.w_saved.push_back(p.value(v).name);
    }
  }
  for (ValueId v : crossing) to_w[v] = w.AddInput(p.value(v).name, p.type(v));
  for (ValueId v : p.params()) {
    if (w_value[v]) to_w[v] = w.AddParamLike(p, v);
  }
  for (size_t i = 0; i < instrs.size(); ++i) {
    if (in_w[i]) CopyInstruction(p, instrs[i], w, to_w);
  }
  for (ValueId v : w_outputs) w.AddOutput(to_w[v] != kNoValue ? to_w[v] : w.Get(p.value(v).name));
  out.w = std::move(w);
  return out;
}

Program AccumulateGradients(const Program& p, const std::vector<std::string>& grads,
                            int64_t one_block_k) {
  std::vector<bool> into(p.values().size(), false);  // a gradient to add into its buffer
  for (const std::string& name : grads) {
    const std::optional<ValueId> v = p.Find(name);
    if (!v || !p.IsOutput(*v)) {
      throw ProgramError(
          fmt::format("program {}: %{} is not an output to accumulate", p.name(), name));
    }
    if (p.value(*v).kind != ValueKind::kIntermediate) {
      throw ProgramError(
          fmt::format("program {}: %{} is not computed by the program, so it cannot "
                      "be added into a buffer",
                      p.name(), name));
    }
    into[static_cast<size_t>(*v)] = true;
  }
  std::vector<int32_t> readers(p.values().size(), 0);
  for (const Instruction& ins : p.instructions()) {
    for (ValueId v : ins.inputs) ++readers[static_cast<size_t>(v)];
  }
  Program dst(p.name() + ".accumulate");
  std::vector<ValueId> to_dst(p.values().size(), kNoValue);
  for (const Value& v : p.values()) dst.ReserveName(v.name);
  for (ValueId v : p.inputs()) to_dst[v] = dst.AddInput(p.value(v).name, p.type(v));
  std::map<ValueId, ValueId> buffer;  // gradient -> the accumulated buffer, an input of dst
  for (const std::string& name : grads) {
    const ValueId v = p.Get(name);
    buffer[v] = dst.AddInput(name, p.type(v));
  }
  for (ValueId v : p.params()) to_dst[v] = dst.AddParamLike(p, v);
  for (const Instruction& ins : p.instructions()) {
    ValueList inputs;
    for (ValueId v : ins.inputs) inputs.push_back(to_dst[v]);
    const bool one_gradient = ins.outputs.size() == 1 && into[static_cast<size_t>(ins.outputs[0])];
    // (matmul_accumulate multiplies operands of the gradient's dtype: a mixed-precision product
    // of bf16 operands is added in after it.)
    const DType grad_dtype = one_gradient ? p.type(ins.outputs[0]).dtype : DType::kF32;
    if (one_gradient && ins.op->name == "matmul" && readers[ins.outputs[0]] == 0 &&
        p.type(ins.inputs[0]).dtype == grad_dtype && p.type(ins.inputs[1]).dtype == grad_dtype) {
      const Shape& a = p.type(ins.inputs[0]).shape;
      const bool ta = ins.attrs.GetBool("transpose_a", false);
      const int64_t k = a.rank() == 2 ? a[ta ? 0 : 1] : -1;
      if (a.rank() == 2 && p.type(ins.inputs[1]).shape.rank() == 2 && k <= one_block_k) {
        // The product goes straight into the buffer: bitwise buffer + product (k fits one block).
        dst.AddInstruction("matmul_accumulate", {buffer.at(ins.outputs[0]), inputs[0], inputs[1]},
                           ins.attrs);
        continue;
      }
    }
    std::vector<std::string> names;
    for (ValueId v : ins.outputs) {
      names.push_back(into[static_cast<size_t>(v)] ? dst.FreshName(p.value(v).name + ".part")
                                                   : p.value(v).name);
    }
    const ValueList outputs =
        dst.AddInstruction(ins.op->name, std::move(inputs), ins.attrs, std::move(names));
    for (size_t k = 0; k < outputs.size(); ++k) {
      to_dst[ins.outputs[k]] = outputs[k];
      // Added in at once, so that the part dies here unless a later instruction reads it.
      if (into[static_cast<size_t>(ins.outputs[k])])
        dst.AddInstruction("accumulate", {buffer.at(ins.outputs[k]), outputs[k]}, {});
    }
  }
  for (ValueId v : p.outputs()) {
    if (!into[static_cast<size_t>(v)]) dst.AddOutput(to_dst[v]);
  }
  return dst;
}

std::vector<std::string> ParamsOffLossPath(const Program& forward, const std::string& loss) {
  std::vector<bool> on_path(forward.values().size(), false);
  on_path[forward.Get(loss)] = true;
  const auto& instrs = forward.instructions();
  for (size_t i = instrs.size(); i-- > 0;) {
    const Instruction& ins = instrs[i];
    if (std::none_of(ins.outputs.begin(), ins.outputs.end(), [&](ValueId v) { return on_path[v]; }))
      continue;
    for (ValueId v : ins.inputs) on_path[v] = true;
  }
  std::vector<std::string> off;
  for (ValueId v : forward.params()) {
    if (!on_path[v] && !forward.IsConstant(v)) off.push_back(forward.value(v).name);
  }
  return off;
}

}  // namespace sluice
