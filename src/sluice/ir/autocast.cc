#include "sluice/ir/autocast.h"

#include <algorithm>
#include <map>
#include <set>
#include <span>
#include <string_view>
#include <unordered_set>
#include <utility>

namespace sluice {

namespace {

// An op that takes bf16: the inputs it takes as bf16, and whether it gives bf16 (an activation,
// a shape op) or f32 (a product).
struct Bf16Rule {
  std::string_view op;
  std::span<const int> positions;
  bool bf16_output;
};

constexpr int kOperands[] = {0, 1};
constexpr int kFirst[] = {0};
constexpr Bf16Rule kRules[] = {
    {"matmul", kOperands, false},            // products: bf16 operands, f32 result
    {"linear", kOperands, false},            //
    {"gelu", kFirst, true},                  // activations: bf16 in, bf16 out
    {"layer_norm", kFirst, true},            //
    {"causal_attention_qkv", kFirst, true},  //
    {"rms_norm", kFirst, true},              //
    {"swiglu", kOperands, true},             //
    {"reshape", kFirst, true},               // shape ops move bytes of any dtype
    {"transpose", kFirst, true},             //
    {"permute", kFirst, true},               //
};

const Bf16Rule* RuleOf(std::string_view op) {
  for (const Bf16Rule& r : kRules) {
    if (r.op == op) return &r;
  }
  return nullptr;
}

bool TakesBf16At(const Bf16Rule* rule, int position) {
  return rule != nullptr && std::find(rule->positions.begin(), rule->positions.end(), position) !=
                                rule->positions.end();
}

bool IsF32(const Program& p, ValueId v) { return p.type(v).dtype == DType::kF32; }

class Autocast {
 public:
  explicit Autocast(const Program& in) : in_(in), out_(in.name()) {
    for (const Value& v : in_.values()) taken_.insert(v.name);
    const int32_t n = static_cast<int32_t>(in_.instructions().size());
    // The last unit beginning at or before each instruction; the first for those before it.
    unit_of_.assign(static_cast<size_t>(n), in_.units().empty() ? -1 : 0);
    for (size_t u = 0, i = 0; i < static_cast<size_t>(n); ++i) {
      while (u + 1 < in_.units().size() && in_.units()[u + 1].begin <= static_cast<int32_t>(i)) ++u;
      if (!in_.units().empty()) unit_of_[i] = static_cast<int64_t>(u);
    }
    readers_.resize(in_.values().size());
    for (int32_t i = 0; i < n; ++i) {
      const ValueList& inputs = in_.instructions()[static_cast<size_t>(i)].inputs;
      for (size_t k = 0; k < inputs.size(); ++k) {
        readers_[static_cast<size_t>(inputs[k])].push_back({i, static_cast<int>(k)});
      }
    }
    DecideBf16();
  }

  AutocastResult Run() {
    const int32_t n = static_cast<int32_t>(in_.instructions().size());
    new_of_.assign(in_.values().size(), kNoValue);
    rounded_.assign(in_.values().size(), kNoValue);
    for (ValueId v : in_.inputs())
      new_of_[static_cast<size_t>(v)] = out_.AddInput(Name(v), Type(v));
    for (ValueId v : in_.params()) new_of_[static_cast<size_t>(v)] = out_.AddParamLike(in_, v);
    std::set<std::string> bf16_ops, f32_ops;
    for (int32_t i = 0; i < n; ++i) {
      UnitsAt(i);
      const Instruction& ins = in_.instructions()[static_cast<size_t>(i)];
      const Bf16Rule* rule = bf16_[static_cast<size_t>(i)] ? RuleOf(ins.op->name) : nullptr;
      std::vector<ValueId> inputs;
      for (size_t k = 0; k < ins.inputs.size(); ++k) {
        inputs.push_back(Operand(ins.inputs[k], i, TakesBf16At(rule, static_cast<int>(k))));
      }
      std::vector<std::string> names;
      for (ValueId v : ins.outputs) names.push_back(Name(v));
      const ValueList made = out_.AddInstruction(ins.op->name, inputs, ins.attrs, names);
      for (size_t k = 0; k < ins.outputs.size(); ++k) {
        new_of_[static_cast<size_t>(ins.outputs[k])] = made[k];
      }
      if (rule != nullptr) {
        bf16_ops.insert(ins.op->name);
      } else if (ReadsOrMakesF32(ins)) {
        f32_ops.insert(ins.op->name);
      }
      // The bf16 copy of an output that a product reads or another unit reads: made here, once.
      for (ValueId v : ins.outputs) {
        if (NeedsRoundedCopy(v)) rounded_[static_cast<size_t>(v)] = Cast(New(v), DType::kBF16);
      }
    }
    UnitsAt(n);
    for (ValueId v : in_.outputs()) out_.AddOutput(New(v));
    return {.program = std::move(out_),
            .bf16_ops = {bf16_ops.begin(), bf16_ops.end()},
            .f32_ops = {f32_ops.begin(), f32_ops.end()},
            .already_bf16 = {}};
  }

 private:
  struct Reader {
    int32_t instruction;
    int position;
  };

  const std::string& Name(ValueId v) const { return in_.value(v).name; }
  const TensorType& Type(ValueId v) const { return in_.type(v); }
  ValueId New(ValueId v) const { return new_of_[static_cast<size_t>(v)]; }
  int64_t UnitOf(int32_t instruction) const { return unit_of_[static_cast<size_t>(instruction)]; }

  // Which instructions run bf16, last to first: an activation runs bf16 only when every reader of
  // its output takes bf16 there, which is decided before it.
  void DecideBf16() {
    const int32_t n = static_cast<int32_t>(in_.instructions().size());
    bf16_.assign(static_cast<size_t>(n), false);
    for (int32_t i = n - 1; i >= 0; --i) {
      const Instruction& ins = in_.instructions()[static_cast<size_t>(i)];
      const Bf16Rule* rule = RuleOf(ins.op->name);
      if (rule == nullptr) continue;
      bool ok = std::all_of(rule->positions.begin(), rule->positions.end(), [&](int k) {
        return static_cast<size_t>(k) < ins.inputs.size() && IsF32(in_, ins.inputs[k]);
      });
      // Every other float input (a bias, a layer norm's weight) stays f32: the op takes it so.
      for (size_t k = 0; k < ins.inputs.size(); ++k) {
        const DType t = Type(ins.inputs[k]).dtype;
        if (!TakesBf16At(rule, static_cast<int>(k)) && IsFloating(t) && t != DType::kF32) {
          ok = false;
        }
      }
      if (ok && rule->bf16_output) {
        const ValueId y = ins.outputs[0];
        const std::vector<Reader>& readers = readers_[static_cast<size_t>(y)];
        ok = !in_.IsOutput(y) && !readers.empty() &&
             std::all_of(readers.begin(), readers.end(), [&](const Reader& r) {
               return bf16_[static_cast<size_t>(r.instruction)] &&
                      TakesBf16At(
                          RuleOf(in_.instructions()[static_cast<size_t>(r.instruction)].op->name),
                          r.position);
             });
      }
      bf16_[static_cast<size_t>(i)] = ok;
    }
  }

  // Whether an f32 intermediate crosses a unit boundary: an instruction of another unit reads it.
  bool CrossesUnits(ValueId v) const {
    const int32_t producer = in_.value(v).producer;
    if (producer < 0 || in_.units().empty()) return false;
    const std::vector<Reader>& readers = readers_[static_cast<size_t>(v)];
    return std::any_of(readers.begin(), readers.end(),
                       [&](const Reader& r) { return UnitOf(r.instruction) != UnitOf(producer); });
  }

  bool ReadByBf16(ValueId v) const {
    const std::vector<Reader>& readers = readers_[static_cast<size_t>(v)];
    return std::any_of(readers.begin(), readers.end(), [&](const Reader& r) {
      return bf16_[static_cast<size_t>(r.instruction)] &&
             TakesBf16At(RuleOf(in_.instructions()[static_cast<size_t>(r.instruction)].op->name),
                         r.position);
    });
  }

  bool NeedsRoundedCopy(ValueId v) const {
    return IsF32(in_, v) && out_.type(New(v)).dtype == DType::kF32 &&
           (CrossesUnits(v) || ReadByBf16(v));
  }

  bool ReadsOrMakesF32(const Instruction& ins) const {
    return std::any_of(ins.inputs.begin(), ins.inputs.end(),
                       [&](ValueId v) { return IsF32(in_, v); }) ||
           std::any_of(ins.outputs.begin(), ins.outputs.end(),
                       [&](ValueId v) { return IsF32(in_, v); });
  }

  // The value instruction `i` reads for `v`: bf16 where it takes bf16 there, v's own dtype
  // otherwise; another unit's f32 value through its rounded copy.
  ValueId Operand(ValueId v, int32_t i, bool wants_bf16) {
    const int32_t producer = in_.value(v).producer;
    const int64_t unit = UnitOf(i);
    ValueId source = New(v);
    if (rounded_[static_cast<size_t>(v)] != kNoValue && producer >= 0 &&
        (wants_bf16 || UnitOf(producer) != unit)) {
      source = rounded_[static_cast<size_t>(v)];
    }
    const DType has = out_.type(source).dtype;
    if (wants_bf16) {
      if (has == DType::kBF16) return source;
      // An input or a parameter: a copy per unit, just before its first reader there.
      auto [it, made] = unit_copies_.try_emplace({source, unit}, kNoValue);
      if (made) it->second = Cast(source, DType::kBF16);
      return it->second;
    }
    if (has != DType::kBF16) return source;
    auto [it, made] = widened_.try_emplace({source, unit}, kNoValue);
    if (made) it->second = Cast(source, DType::kF32);
    return it->second;
  }

  // `v` cast to `to`, named after it: x -> x.bf16; x.bf16 (or a bf16 activation x) -> x.f32.
  ValueId Cast(ValueId v, DType to) {
    std::string base = out_.value(v).name;
    if (to == DType::kF32 && base.ends_with(".bf16")) base.resize(base.size() - 5);
    const std::string name = Unique(base + (to == DType::kBF16 ? ".bf16" : ".f32"));
    return out_.AddInstruction("cast", {v}, {{"dtype", std::string(sluice::Name(to))}}, {name})[0];
  }

  // `name`, or `name_N` with the smallest free N: never a name of the program given (a later
  // value there would collide) nor one made already.
  std::string Unique(const std::string& name) {
    std::string candidate = name;
    for (int k = 0; taken_.count(candidate) > 0; ++k) candidate = name + "_" + std::to_string(k);
    taken_.insert(candidate);
    return candidate;
  }

  // Before instruction i (and at the end, i = the instruction count): closes the unit ending at i
  // and opens those beginning at i (an empty unit opens and closes at once).
  void UnitsAt(int32_t i) {
    const std::vector<ProgramUnit>& units = in_.units();
    if (open_ >= 0 && units[static_cast<size_t>(open_)].end == i) {
      out_.EndUnit();
      open_ = -1;
    }
    for (; next_unit_ < units.size() && units[next_unit_].begin == i; ++next_unit_) {
      out_.BeginUnit(units[next_unit_].name);
      open_ = static_cast<int64_t>(next_unit_);
      if (units[next_unit_].end == i) {
        out_.EndUnit();
        open_ = -1;
      }
    }
  }

  const Program& in_;
  Program out_;
  std::unordered_set<std::string> taken_;
  std::vector<int64_t> unit_of_;              // instruction -> its unit (-1 without units)
  std::vector<std::vector<Reader>> readers_;  // value -> the instructions reading it
  std::vector<bool> bf16_;                    // instruction -> runs with bf16 operands
  std::vector<ValueId> new_of_;               // value -> the same value in out_
  std::vector<ValueId> rounded_;              // value -> its bf16 copy in out_, made after it
  std::map<std::pair<ValueId, int64_t>, ValueId> unit_copies_;  // (out_ value, unit) -> bf16
  std::map<std::pair<ValueId, int64_t>, ValueId> widened_;      // (out_ value, unit) -> f32
  size_t next_unit_ = 0;                                        // the next unit of in_ to open
  int64_t open_ = -1;  // the unit of in_ open in out_, -1 when none
};

}  // namespace

AutocastResult AutocastBf16(const Program& program) {
  for (ValueId v = 0; v < static_cast<ValueId>(program.values().size()); ++v) {
    if (program.type(v).dtype == DType::kBF16) {
      return {
          .program = program, .bf16_ops = {}, .f32_ops = {}, .already_bf16 = program.value(v).name};
    }
  }
  return Autocast(program).Run();
}

}  // namespace sluice
