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

// Where an op running bf16 gets its bf16 output (for arithmetic's rule, below):
//   kMakes     it computes it: an activation (a product gives f32, and is made f32);
//   kCarries   a shape op: it moves the bytes it is given, so what it gives is made bf16 only where
//              what it takes was;
//   kPromotes  arithmetic (add, mul): bf16 only where each operand is made bf16, as PyTorch's type
//              promotion gives bf16 for bf16 operands only; it never rounds an f32 operand (a
//              product's f32 result included: the residual stream a linear starts stays f32).
enum class Bf16Origin { kMakes, kCarries, kPromotes };

// An op that takes bf16: the inputs it takes as bf16, and whether it gives bf16 (an activation,
// a shape op) or f32 (a product).
struct Bf16Rule {
  std::string_view op;
  std::span<const int> positions;  // empty: every input (concat)
  bool bf16_output;                // its first output is bf16
  Bf16Origin origin = Bf16Origin::kMakes;
  bool every_output = false;  // every output is bf16 (split)
};

constexpr int kOperands[] = {0, 1};
constexpr int kFirst[] = {0};
constexpr int kQkv[] = {0, 1, 2};
constexpr Bf16Origin kCarries = Bf16Origin::kCarries, kPromotes = Bf16Origin::kPromotes;
constexpr Bf16Rule kRules[] = {
    {"matmul", kOperands, false},            // products: bf16 operands, f32 result
    {"linear", kOperands, false},            //
    {"gelu", kFirst, true},                  // activations: bf16 in, bf16 out
    {"layer_norm", kFirst, true},            //
    {"causal_attention_qkv", kFirst, true},  //
    {"causal_attention", kQkv, true},        //
    {"attention", kQkv, true},               //
    {"attention_key_bias", kQkv, true},      // (the key bias stays f32)
    {"rms_norm", kFirst, true},              //
    {"swiglu", kOperands, true},             //
    // Shape ops move bytes of any dtype.
    {"reshape", kFirst, true, kCarries},
    {"transpose", kFirst, true, kCarries},
    {"permute", kFirst, true, kCarries},
    {"slice", kFirst, true, kCarries},
    {"slice_view", kFirst, true, kCarries},
    {"split", kFirst, true, kCarries, true},
    {"split_view", kFirst, true, kCarries, true},
    {"concat", {}, true, kCarries},
    // Arithmetic: f32 inside, bf16 out.
    {"add", kOperands, true, kPromotes},
    {"mul", kOperands, true, kPromotes},
    {"dropout", kFirst, true, kPromotes},  // x · keep / (1 − p): bf16 where x is (the key stays)
};

const Bf16Rule* RuleOf(std::string_view op) {
  for (const Bf16Rule& r : kRules) {
    if (r.op == op) return &r;
  }
  return nullptr;
}

bool TakesBf16At(const Bf16Rule* rule, int position) {
  return rule != nullptr &&
         (rule->positions.empty() || std::find(rule->positions.begin(), rule->positions.end(),
                                               position) != rule->positions.end());
}

// The input positions of `ins` that `rule` takes bf16.
std::vector<int> Bf16Positions(const Bf16Rule& rule, const Instruction& ins) {
  if (!rule.positions.empty()) return {rule.positions.begin(), rule.positions.end()};
  std::vector<int> all(ins.inputs.size());
  for (size_t k = 0; k < all.size(); ++k) all[k] = static_cast<int>(k);
  return all;
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
      Attrs attrs = ins.attrs;
      for (size_t k = 0; k < ins.inputs.size(); ++k) {
        const bool wants_bf16 = TakesBf16At(rule, static_cast<int>(k));
        if (wants_bf16 && RoundsOnLoad(ins, static_cast<int>(k))) {
          inputs.push_back(New(ins.inputs[k]));
          attrs.Set(ins.op->name == "linear" ? "round_w" : "round_b", true);
          continue;
        }
        inputs.push_back(Operand(ins.inputs[k], i, wants_bf16));
      }
      std::vector<std::string> names;
      for (ValueId v : ins.outputs) names.push_back(Name(v));
      const bool stores_rounded = StoresRounded(i, ins);
      if (stores_rounded) {
        attrs.Set("dtype", std::string(sluice::Name(DType::kBF16)));
        names[0] = Unique(names[0] + ".bf16");
      }
      const ValueList made = out_.AddInstruction(ins.op->name, inputs, attrs, names);
      for (size_t k = 0; k < ins.outputs.size(); ++k) {
        new_of_[static_cast<size_t>(ins.outputs[k])] = made[k];
      }
      if (stores_rounded) rounded_[static_cast<size_t>(ins.outputs[0])] = made[0];
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

  // Whether instruction i's rule can apply at all: the inputs it takes bf16 are f32, the other
  // float inputs (a bias, a layer norm's weight) f32 as the op takes them.
  bool Applies(const Bf16Rule& rule, const Instruction& ins) const {
    for (int k : Bf16Positions(rule, ins)) {
      if (static_cast<size_t>(k) >= ins.inputs.size() || !IsF32(in_, ins.inputs[k])) return false;
    }
    for (size_t k = 0; k < ins.inputs.size(); ++k) {
      const DType t = Type(ins.inputs[k]).dtype;
      if (!TakesBf16At(&rule, static_cast<int>(k)) && IsFloating(t) && t != DType::kF32) {
        return false;
      }
    }
    return true;
  }

  // Whether every reader of y takes bf16 where it reads it (and y is no program output).
  bool EveryReaderTakesBf16(ValueId y) const {
    const std::vector<Reader>& readers = readers_[static_cast<size_t>(y)];
    return !in_.IsOutput(y) && !readers.empty() &&
           std::all_of(readers.begin(), readers.end(), [&](const Reader& r) {
             return bf16_[static_cast<size_t>(r.instruction)] &&
                    TakesBf16At(
                        RuleOf(in_.instructions()[static_cast<size_t>(r.instruction)].op->name),
                        r.position);
           });
  }

  bool Decide(const Bf16Rule& rule, const Instruction& ins) const {
    if (rule.origin == Bf16Origin::kPromotes) {
      for (int k : Bf16Positions(rule, ins)) {
        if (!made_bf16_[static_cast<size_t>(ins.inputs[k])]) return false;
      }
    }
    if (!rule.bf16_output) return true;
    if (rule.every_output) {
      return std::all_of(ins.outputs.begin(), ins.outputs.end(),
                         [&](ValueId y) { return EveryReaderTakesBf16(y); });
    }
    return EveryReaderTakesBf16(ins.outputs[0]);
  }

  // Which values are made bf16 (Bf16Origin) under the present choice, first to last.
  void FindMadeBf16() {
    made_bf16_.assign(in_.values().size(), false);
    for (size_t i = 0; i < in_.instructions().size(); ++i) {
      if (!bf16_[i]) continue;
      const Instruction& ins = in_.instructions()[i];
      const Bf16Rule& rule = *RuleOf(ins.op->name);
      if (!rule.bf16_output) continue;  // a product: f32
      bool made = true;
      if (rule.origin != Bf16Origin::kMakes) {
        for (int k : Bf16Positions(rule, ins)) made = made && made_bf16_[ins.inputs[k]];
      }
      const size_t bf16_outputs = rule.every_output ? ins.outputs.size() : 1;
      for (size_t k = 0; k < bf16_outputs; ++k) made_bf16_[ins.outputs[k]] = made;
    }
  }

  // Which instructions run bf16. An activation runs bf16 only when every reader of its output
  // takes bf16 there, which a sweep from the last instruction to the first decides before it;
  // arithmetic also needs its operands made bf16, which depends on earlier instructions. So: start
  // from every instruction whose rule applies, then find what is made bf16 and sweep, again until
  // nothing changes — choices only turn from bf16 to f32, so this ends, with the largest
  // consistent choice (the first sweep decides a program without such arithmetic).
  void DecideBf16() {
    const int32_t n = static_cast<int32_t>(in_.instructions().size());
    bf16_.assign(static_cast<size_t>(n), false);
    for (int32_t i = 0; i < n; ++i) {
      const Instruction& ins = in_.instructions()[static_cast<size_t>(i)];
      const Bf16Rule* rule = RuleOf(ins.op->name);
      bf16_[static_cast<size_t>(i)] = rule != nullptr && Applies(*rule, ins);
    }
    for (bool changed = true; changed;) {
      changed = false;
      FindMadeBf16();
      for (int32_t i = n - 1; i >= 0; --i) {
        if (!bf16_[static_cast<size_t>(i)]) continue;
        const Instruction& ins = in_.instructions()[static_cast<size_t>(i)];
        if (!Decide(*RuleOf(ins.op->name), ins)) {
          bf16_[static_cast<size_t>(i)] = false;
          changed = true;
        }
      }
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

  // A bf16 linear whose f32 result nothing reads as f32 (its own unit's readers all take it bf16;
  // other units read the rounded copy anyway): it stores the rounded result itself (the linear's
  // dtype attribute, the bits of linear then cast), and the f32 result never exists.
  bool StoresRounded(int32_t i, const Instruction& ins) const {
    if (ins.op->name != "linear" || !bf16_[static_cast<size_t>(i)] || ins.attrs.Has("dtype")) {
      return false;
    }
    const ValueId y = ins.outputs[0];
    const std::vector<Reader>& readers = readers_[static_cast<size_t>(y)];
    return !in_.IsOutput(y) && !readers.empty() &&
           std::all_of(readers.begin(), readers.end(), [&](const Reader& r) {
             const auto at = static_cast<size_t>(r.instruction);
             return UnitOf(r.instruction) != UnitOf(i) ||
                    (bf16_[at] && TakesBf16At(RuleOf(in_.instructions()[at].op->name), r.position));
           });
  }

  // Whether a product reads its second operand (matmul's b, linear's w) f32 and rounds it to bf16
  // as it loads it (round_b / round_w) rather than through a cast: a parameter or input, whose
  // bf16 copy would otherwise be made in each unit reading it (a weight's, twice a step: forward
  // and again in backward) and read by products only.
  bool RoundsOnLoad(const Instruction& ins, int position) const {
    const std::string& op = ins.op->name;
    return (op == "matmul" || op == "linear") && position == 1 &&
           in_.value(ins.inputs[1]).producer < 0 && IsF32(in_, ins.inputs[1]);
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
  std::vector<bool> made_bf16_;               // value -> made bf16 (Bf16Origin)
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
