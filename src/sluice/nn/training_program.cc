#include "sluice/nn/training_program.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sluice/autodiff/autodiff.h"
#include "sluice/core/error.h"
#include "sluice/ir/autocast.h"

namespace sluice {

namespace {

ParamSpec SpecOf(const Program& p, ValueId id, const Initializer& init, int64_t index) {
  ParamSpec spec{.name = p.value(id).name, .shape = p.type(id).shape, .init_index = index};
  spec.constant = p.IsConstant(id);
  spec.buffer = p.IsBuffer(id);
  if (init.kind == "normal") {
    spec.init = Init::kNormal;
    spec.mean = init.args.at(0);
    spec.std = init.args.at(1);
  } else if (init.kind == "uniform") {
    spec.init = Init::kUniform;
    spec.low = init.args.at(0);
    spec.high = init.args.at(1);
  } else if (init.kind == "zeros") {
    spec.init = Init::kZeros;
  } else if (init.kind == "ones") {
    spec.init = Init::kOnes;
  } else {
    spec.init = Init::kLoaded;
  }
  return spec;
}

Initializer InitializerOf(const ParamSpec& spec) {
  switch (spec.init) {
    case Init::kNormal:
      return {"normal", {spec.mean, spec.std}};
    case Init::kUniform:
      return {"uniform", {spec.low, spec.high}};
    case Init::kZeros:
      return {"zeros", {}};
    case Init::kOnes:
      return {"ones", {}};
    case Init::kLoaded:
      return {"loaded", {}};
  }
  return {"loaded", {}};
}

}  // namespace

std::vector<std::string> SquareInSequence(const Program& p, int64_t T) {
  std::vector<std::string> out;
  if (T <= 1) return out;  // at T = 1 every value would look square
  for (size_t i = 0; i < p.values().size(); ++i) {
    const auto id = static_cast<ValueId>(i);
    if (p.value(id).kind != ValueKind::kIntermediate) continue;
    const Shape& s = p.type(id).shape;
    if (s.rank() >= 3 && s[s.rank() - 1] == T && s[s.rank() - 2] == T) {
      out.push_back(p.value(id).name);
    }
  }
  return out;
}

std::vector<std::string> UnitInputs(const Program& p) {
  std::vector<std::string> kept;
  std::set<ValueId> seen;
  for (const ProgramUnit& u : p.units()) {
    for (int32_t i = u.begin; i < u.end; ++i) {
      for (ValueId v : p.instructions()[static_cast<size_t>(i)].inputs) {
        const int32_t producer = p.value(v).producer;
        if (producer >= 0 && producer < u.begin && seen.insert(v).second) {
          kept.push_back(p.value(v).name);
        }
      }
    }
  }
  return kept;
}

std::vector<std::string> SublayerInputs(const Program& p) {
  const auto& ins = p.instructions();
  const size_t n = ins.size();
  // Crossing values by sweep: a value made by instruction i and last read by instruction j > i
  // (or a program output) crosses the points i + 1 .. j (the point before instruction c is c).
  std::vector<int32_t> last(p.values().size(), -1);
  for (size_t i = 0; i < n; ++i) {
    for (ValueId v : ins[i].inputs) last[v] = static_cast<int32_t>(i);
  }
  for (ValueId v : p.outputs()) last[v] = static_cast<int32_t>(n);
  std::vector<int64_t> count(n + 2, 0), id_sum(n + 2, 0);  // differences over the points
  for (size_t v = 0; v < p.values().size(); ++v) {
    const int32_t producer = p.value(static_cast<ValueId>(v)).producer;
    if (producer < 0 || last[v] <= producer) continue;
    count[static_cast<size_t>(producer) + 1] += 1;
    count[static_cast<size_t>(last[v]) + 1] -= 1;
    id_sum[static_cast<size_t>(producer) + 1] += static_cast<int64_t>(v);
    id_sum[static_cast<size_t>(last[v]) + 1] -= static_cast<int64_t>(v);
  }
  for (size_t c = 1; c < count.size(); ++c) {
    count[c] += count[c - 1];
    id_sum[c] += id_sum[c - 1];
  }
  std::vector<int64_t> made(n, 0);  // bytes each instruction makes (views make none)
  for (size_t i = 0; i < n; ++i) {
    if (ins[i].op->kind == OpKind::kView) continue;
    for (ValueId o : ins[i].outputs) {
      made[i] += p.type(o).shape.numel() * static_cast<int64_t>(SizeOf(p.type(o).dtype));
    }
  }
  std::vector<std::string> cuts;
  for (const ProgramUnit& u : p.units()) {
    int64_t total = 0;
    for (int32_t i = u.begin; i < u.end; ++i) total += made[static_cast<size_t>(i)];
    int64_t before = made[static_cast<size_t>(u.begin)], best_gap = -1;
    std::string best;
    for (int32_t c = u.begin + 1; c < u.end; before += made[static_cast<size_t>(c)], ++c) {
      if (count[static_cast<size_t>(c)] != 1) continue;
      const auto v = static_cast<ValueId>(id_sum[static_cast<size_t>(c)]);
      if (p.value(v).producer < u.begin) continue;  // the unit's input: nothing to cut
      const int64_t gap = std::abs(2 * before - total);
      if (best_gap < 0 || gap < best_gap) {
        best_gap = gap;
        best = p.value(v).name;
      }
    }
    if (!best.empty()) cuts.push_back(best);
  }
  return cuts;
}

int64_t UnitOfInstruction(const Program& p, int32_t instruction) {
  const std::vector<ProgramUnit>& units = p.units();
  if (units.empty()) return -1;
  // Units begin in program order (BeginUnit opens one at the end of the program), so the last
  // that begins at or before `instruction` is found by bisection: TiedParams and its kin ask
  // once per instruction, and a scan per ask made them quadratic in the layers.
  const auto after = std::upper_bound(units.begin(), units.end(), instruction,
                                      [](int32_t i, const ProgramUnit& u) { return i < u.begin; });
  return after == units.begin() ? 0 : (after - units.begin()) - 1;
}

std::vector<TiedParam> TiedParams(const Program& p) {
  std::vector<TiedParam> out;
  if (p.units().empty()) return out;
  std::map<ValueId, std::set<int64_t>> readers;  // parameter -> the units reading it
  for (size_t i = 0; i < p.instructions().size(); ++i) {
    for (ValueId v : p.instructions()[i].inputs) {
      if (p.value(v).kind == ValueKind::kParam)
        readers[v].insert(UnitOfInstruction(p, static_cast<int32_t>(i)));
    }
  }
  for (ValueId v : p.params()) {
    if (p.IsConstant(v)) continue;  // read by every holder, never trained: nothing to sum
    auto it = readers.find(v);
    if (it == readers.end() || it->second.size() < 2) continue;
    TiedParam tied{.name = p.value(v).name};
    for (int64_t u : it->second) tied.units.push_back(p.units()[static_cast<size_t>(u)].name);
    out.push_back(std::move(tied));
  }
  return out;
}

std::string TiedReadName(std::string_view param, std::string_view unit) {
  return fmt::format("{}@{}", param, unit);
}

Program SeparateTiedReads(const Program& p, const std::vector<TiedParam>& tied) {
  std::map<std::string, const TiedParam*> by_name;
  for (const TiedParam& t : tied) by_name.emplace(t.name, &t);
  std::vector<bool> is_tied(p.values().size(), false);
  for (ValueId v : p.params()) is_tied[static_cast<size_t>(v)] = by_name.contains(p.value(v).name);
  for (ValueId v : p.outputs()) {
    if (is_tied[static_cast<size_t>(v)]) {
      throw InvalidArgument(fmt::format("program {}: the tied parameter %{} is an output", p.name(),
                                        p.value(v).name));
    }
  }
  Program q(p.name());
  std::vector<ValueId> map(p.values().size(), kNoValue);
  for (ValueId v : p.inputs()) map[static_cast<size_t>(v)] = q.AddInput(p.value(v).name, p.type(v));
  // Untied parameters keep their place; each tied one becomes a parameter per unit reading it
  // here, in unit order, where it stood.
  std::map<std::pair<ValueId, int64_t>, ValueId> reads;  // (tied parameter, unit) -> its read
  std::map<ValueId, std::set<int64_t>> units_reading;
  for (size_t i = 0; i < p.instructions().size(); ++i) {
    for (ValueId v : p.instructions()[i].inputs) {
      if (is_tied[static_cast<size_t>(v)])
        units_reading[v].insert(UnitOfInstruction(p, static_cast<int32_t>(i)));
    }
  }
  for (ValueId v : p.params()) {
    if (!is_tied[static_cast<size_t>(v)]) {
      map[static_cast<size_t>(v)] = q.AddParam(p.value(v).name, p.type(v));
      continue;
    }
    for (int64_t u : units_reading[v]) {
      const std::string name =
          TiedReadName(p.value(v).name, p.units()[static_cast<size_t>(u)].name);
      if (p.Find(name)) {
        throw InvalidArgument(fmt::format(
            "program {}: %{} is the name given to unit '{}'s read of the tied parameter %{}: "
            "rename the value",
            p.name(), name, p.units()[static_cast<size_t>(u)].name, p.value(v).name));
      }
      reads[{v, u}] = q.AddParam(name, p.type(v));
    }
  }
  const auto& units = p.units();
  const auto n = static_cast<int32_t>(p.instructions().size());
  size_t next = 0;  // the next unit to open
  for (int32_t i = 0; i <= n; ++i) {
    if (q.unit_open() && units[next - 1].end <= i) q.EndUnit();
    while (next < units.size() && units[next].begin <= i) {
      q.BeginUnit(units[next].name);
      ++next;
      if (units[next - 1].end > i) break;
      q.EndUnit();  // an empty unit
    }
    if (i == n) break;
    const Instruction& ins = p.instructions()[static_cast<size_t>(i)];
    const int64_t unit = UnitOfInstruction(p, i);
    ValueList inputs;
    for (ValueId v : ins.inputs) {
      inputs.push_back(is_tied[static_cast<size_t>(v)] ? reads.at({v, unit})
                                                       : map[static_cast<size_t>(v)]);
    }
    std::vector<std::string> names;
    for (ValueId v : ins.outputs) names.push_back(p.value(v).name);
    const ValueList outs =
        q.AddInstruction(ins.op->name, std::move(inputs), ins.attrs, std::move(names));
    for (size_t k = 0; k < outs.size(); ++k) map[static_cast<size_t>(ins.outputs[k])] = outs[k];
  }
  if (q.unit_open()) q.EndUnit();
  for (ValueId v : p.outputs()) q.AddOutput(map[static_cast<size_t>(v)]);
  return q;
}

TrainingProgram ParseTrainingProgram(std::string_view text, std::string_view file,
                                     const SizeBindings& sizes, const InputCheck& check_input,
                                     bool loaded_by_default) {
  TrainingProgram out;
  Program program = ParseProgram(text, file, sizes, &out.annotations, check_input);
  const ProgramAnnotations& a = out.annotations;
  // file:line:col of a declaration (or, in `where`, of an output statement), else the file.
  auto at = [&](const std::string& name, const auto& where) {
    auto it = where.find(name);
    return it == where.end() ? std::string(file)
                             : fmt::format("{}:{}:{}", file, it->second.first, it->second.second);
  };

  // The loss: the output named "loss", or the only output.
  std::optional<ValueId> loss;
  for (ValueId v : program.outputs()) {
    if (program.value(v).name == "loss") loss = v;
  }
  if (!loss && program.outputs().size() == 1) loss = program.outputs()[0];
  if (!loss) {
    throw InvalidArgument(fmt::format(
        "{}: a training program outputs its loss: an output named %loss, or a single output "
        "(this program has {} output{})",
        file, program.outputs().size(), program.outputs().size() == 1 ? "" : "s"));
  }
  const TensorType& loss_type = program.type(*loss);
  if (loss_type.shape.rank() != 0 ||
      (loss_type.dtype != DType::kF32 && loss_type.dtype != DType::kF64)) {
    throw InvalidArgument(
        fmt::format("{}: the loss %{} is {}; a training loss is a float scalar "
                    "(f32[]), such as cross_entropy gives",
                    at(program.value(*loss).name, a.output_at), program.value(*loss).name,
                    loss_type.ToString()));
  }

  std::vector<ParamSpec> params;
  std::vector<std::string> missing;
  for (ValueId id : program.params()) {
    const std::string& name = program.value(id).name;
    if (program.type(id).dtype != DType::kF32) {
      throw InvalidArgument(fmt::format("{}: param %{} is {}; training keeps f32 parameters",
                                        at(name, a.declared_at), name,
                                        program.type(id).ToString()));
    }
    auto init = a.initializers.find(name);
    if (init == a.initializers.end() && !loaded_by_default) {
      missing.push_back(fmt::format("%{} ({})", name, at(name, a.declared_at)));
      continue;
    }
    const Initializer loaded{"loaded", {}};
    params.push_back(SpecOf(program, id, init == a.initializers.end() ? loaded : init->second,
                            static_cast<int64_t>(params.size())));
  }
  if (!missing.empty()) {
    throw InvalidArgument(fmt::format(
        "{}: {} without an initializer: {}. Write one after the type, e.g. `param %w: f32[16, 32] "
        "= normal(0, 0.02)` (or zeros, ones, uniform(low, high), loaded), or give --init-from a "
        "file that holds every parameter",
        file, missing.size() == 1 ? "a parameter" : "parameters", fmt::join(missing, ", ")));
  }
  for (ValueId id : program.inputs()) {
    const std::string& name = program.value(id).name;
    auto it = a.data.find(name);
    out.data[name] = it == a.data.end() ? name : it->second;
  }
  out.model.loss = program.value(*loss).name;
  out.model.block_inputs = UnitInputs(program);
  if (auto t = sizes.find("T"); t != sizes.end()) {
    out.model.attention_values = SquareInSequence(program, t->second);
  }
  // PyTorch skips a parameter whose .grad is None; so does training: no gradient, no optimizer
  // state, no update, no share of the gradient norm, as a constant (still bound and saved).
  out.unused_params = ParamsOffLossPath(program, out.model.loss);
  for (ParamSpec& spec : params) {
    if (std::find(out.unused_params.begin(), out.unused_params.end(), spec.name) !=
        out.unused_params.end())
      spec.constant = true;
  }
  out.model.params = std::move(params);
  out.model.forward = std::move(program);
  return out;
}

Model AutocastTrainingModel(const Model& model, AutocastOps* ops) {
  AutocastResult r = AutocastBf16(model.forward);
  if (!r.already_bf16.empty()) {
    throw InvalidArgument(fmt::format(
        "--precision bf16: program {} already has the bf16 value %{}, so it sets its own "
        "precision; train it without --precision bf16, or write it in f32 and let --precision "
        "bf16 place the casts",
        model.forward.name(), r.already_bf16));
  }
  Model out = model;
  const std::set<std::string> square(model.attention_values.begin(), model.attention_values.end());
  for (const Instruction& ins : r.program.instructions()) {
    if (ins.op->name == "cast" && square.count(r.program.value(ins.inputs[0]).name) > 0) {
      out.attention_values.push_back(r.program.value(ins.outputs[0]).name);
    }
  }
  out.block_inputs = UnitInputs(r.program);
  out.forward = std::move(r.program);
  if (ops != nullptr) *ops = {.bf16 = std::move(r.bf16_ops), .f32 = std::move(r.f32_ops)};
  return out;
}

std::string PrintTrainingProgram(const Model& model,
                                 const std::map<std::string, std::string>& data) {
  ProgramAnnotations a;
  for (const ParamSpec& spec : model.params) a.initializers[spec.name] = InitializerOf(spec);
  for (const auto& [input, array] : data) {
    if (input != array) a.data[input] = array;
  }
  return PrintProgram(model.forward, &a);
}

namespace {

// The instructions [begin, end) of units [first, end) of `p`.
std::pair<int32_t, int32_t> InstructionRange(const Program& p, const UnitRange& r) {
  const auto n = static_cast<int64_t>(p.units().size());
  const int32_t all = static_cast<int32_t>(p.instructions().size());
  const int32_t begin = r.first == 0 ? 0 : p.units()[static_cast<size_t>(r.first)].begin;
  const int32_t end = r.end >= n ? all : p.units()[static_cast<size_t>(r.end)].begin;
  return {begin, end};
}

// The values computed before instruction `cut` and read at or after it (or handed back).
std::vector<ValueId> LiveAcross(const Program& p, int32_t cut) {
  std::vector<ValueId> live;
  std::vector<bool> seen(p.values().size(), false);
  const auto& ins = p.instructions();
  for (size_t i = static_cast<size_t>(cut); i < ins.size(); ++i) {
    for (ValueId v : ins[i].inputs) {
      const int32_t producer = p.value(v).producer;
      if (producer >= 0 && producer < cut && !seen[static_cast<size_t>(v)]) {
        seen[static_cast<size_t>(v)] = true;
        live.push_back(v);
      }
    }
  }
  for (ValueId v : p.outputs()) {
    const int32_t producer = p.value(v).producer;
    if (producer >= 0 && producer < cut && !seen[static_cast<size_t>(v)]) live.push_back(v);
  }
  return live;
}

std::string UnitName(const Program& p, int64_t u) { return p.units()[static_cast<size_t>(u)].name; }

// The one value crossing the cut before unit `u`; throws naming the values otherwise.
ValueId CrossingValue(const Program& p, int64_t u) {
  const std::vector<ValueId> live = LiveAcross(p, p.units()[static_cast<size_t>(u)].begin);
  if (live.size() == 1) return live[0];
  std::vector<std::string> names;
  for (ValueId v : live) names.push_back("%" + p.value(v).name);
  throw InvalidArgument(fmt::format(
      "program {} cannot be cut between units '{}' and '{}': a pipeline cut passes one value, and "
      "{} pass{} there{}{}; cut at another unit (--layout) or join these units",
      p.name(), UnitName(p, u - 1), UnitName(p, u),
      live.empty() ? "none" : fmt::format("{}", live.size()), live.size() == 1 ? "es" : "",
      live.empty() ? "" : ": ", fmt::format("{}", fmt::join(names, ", "))));
}

}  // namespace

Model SliceTrainingModel(const Model& whole, const UnitRange& r) {
  const Program& p = whole.forward;
  const auto n = static_cast<int64_t>(p.units().size());
  if (n == 0 && r.first == 0 && r.end <= 1) return whole;
  if (r.first < 0 || r.first >= r.end || r.end > n) {
    throw InvalidArgument(fmt::format("units [{}, {}) are not a range within program {}'s {} units",
                                      r.first, r.end, p.name(), n));
  }
  if (r.first == 0 && r.end == n) return whole;
  const auto [begin, end] = InstructionRange(p, r);
  const ValueId x = r.first > 0 ? CrossingValue(p, r.first) : kNoValue;
  const ValueId y = r.end < n ? CrossingValue(p, r.end) : kNoValue;
  // A model without a loss (one giving logits) hands on its only output instead.
  const ValueId loss =
      whole.loss.empty() && p.outputs().size() == 1 ? p.outputs()[0] : p.Get(whole.loss);
  if (r.end == n && p.value(loss).producer < begin) {
    throw InvalidArgument(
        fmt::format("program {}: the loss %{} is computed before unit '{}', so "
                    "the last stage cannot start there",
                    p.name(), whole.loss, UnitName(p, r.first)));
  }

  // What the piece reads: values made before it (x), data inputs, parameters.
  std::vector<bool> read(p.values().size(), false);
  for (int32_t i = begin; i < end; ++i) {
    for (ValueId v : p.instructions()[static_cast<size_t>(i)].inputs)
      read[static_cast<size_t>(v)] = true;
  }
  // A parameter no instruction reads (a head forward never uses) goes with the first piece, so
  // that some stage holds it, binds it from --init-from and writes it to the checkpoint.
  if (r.first == 0) {
    std::vector<bool> read_anywhere(p.values().size(), false);
    for (const Instruction& ins : p.instructions()) {
      for (ValueId v : ins.inputs) read_anywhere[static_cast<size_t>(v)] = true;
    }
    for (ValueId v : p.params()) {
      if (!read_anywhere[static_cast<size_t>(v)]) read[static_cast<size_t>(v)] = true;
    }
  }
  Model m;
  m.loss = r.end == n ? whole.loss : "";
  Program& q = m.forward;
  q = Program(fmt::format("{}[{}-{}]", p.name(), UnitName(p, r.first), UnitName(p, r.end - 1)));
  std::vector<ValueId> map(p.values().size(), kNoValue);
  if (x != kNoValue) map[static_cast<size_t>(x)] = q.AddInput("x", p.type(x));
  for (ValueId v : p.inputs()) {
    if (!read[static_cast<size_t>(v)]) continue;
    if (x != kNoValue && p.value(v).name == "x") {
      throw InvalidArgument(fmt::format(
          "program {}: units from '{}' on read the data input %x, a name a later pipeline stage "
          "gives the value it receives: rename the input (and bind it with `= x`)",
          p.name(), UnitName(p, r.first)));
    }
    map[static_cast<size_t>(v)] = q.AddInput(p.value(v).name, p.type(v));
  }
  for (size_t i = 0; i < p.params().size(); ++i) {
    const ValueId v = p.params()[i];
    if (!read[static_cast<size_t>(v)]) continue;
    map[static_cast<size_t>(v)] = q.AddParamLike(p, v);
    ParamSpec spec = whole.params.at(i);
    SLUICE_CHECK(spec.name == p.value(v).name, "parameter {} has the spec of {}", p.value(v).name,
                 spec.name);
    if (spec.init_index < 0) spec.init_index = static_cast<int64_t>(i);
    m.params.push_back(std::move(spec));
  }
  size_t u = static_cast<size_t>(r.first);
  for (int32_t i = begin; i < end; ++i) {
    while (q.unit_open() && u < p.units().size() && p.units()[u].end <= i) {
      q.EndUnit();
      ++u;
    }
    while (!q.unit_open() && u < static_cast<size_t>(r.end) && p.units()[u].begin <= i) {
      q.BeginUnit(p.units()[u].name);
      if (p.units()[u].end > i) break;
      q.EndUnit();
      ++u;
    }
    const Instruction& ins = p.instructions()[static_cast<size_t>(i)];
    ValueList inputs;
    for (ValueId v : ins.inputs) {
      SLUICE_CHECK(map[static_cast<size_t>(v)] != kNoValue, "%{} is read before it is defined",
                   p.value(v).name);
      inputs.push_back(map[static_cast<size_t>(v)]);
    }
    std::vector<std::string> names;
    for (ValueId v : ins.outputs) names.push_back(v == y ? std::string("y") : p.value(v).name);
    const ValueList outs =
        q.AddInstruction(ins.op->name, std::move(inputs), ins.attrs, std::move(names));
    for (size_t k = 0; k < outs.size(); ++k) map[static_cast<size_t>(ins.outputs[k])] = outs[k];
  }
  if (q.unit_open()) q.EndUnit();
  q.AddOutput(map[static_cast<size_t>(y != kNoValue ? y : loss)]);
  m.block_inputs = UnitInputs(q);
  for (const std::string& name : whole.attention_values) {
    if (q.Find(name)) m.attention_values.push_back(name);
  }
  return m;
}

std::vector<double> EstimateUnitCosts(const Program& p) {
  std::vector<double> costs;
  for (const ProgramUnit& u : p.units()) {
    double flops = 0;
    for (int32_t i = u.begin; i < u.end; ++i) {
      const Instruction& ins = p.instructions()[static_cast<size_t>(i)];
      if (ins.outputs.empty()) continue;
      const Shape& out = p.type(ins.outputs[0]).shape;
      const double elements = static_cast<double>(out.numel());
      const std::string& op = ins.op->name;
      if ((op == "matmul" || op == "linear") && !ins.inputs.empty()) {
        const Shape& a = p.type(ins.inputs[0]).shape;
        const bool ta = op == "matmul" && ins.attrs.GetBool("transpose_a", false);
        const int64_t k =
            a.rank() == 0 ? 1 : (ta && a.rank() >= 2 ? a[a.rank() - 2] : a[a.rank() - 1]);
        flops += 2 * elements * static_cast<double>(k);
      } else if (op.find("attention") != std::string::npos && out.rank() >= 2) {
        flops += 2 * elements * static_cast<double>(out[1]);  // each query meets up to T keys
      } else {
        flops += elements;
      }
    }
    costs.push_back(flops);
  }
  return costs;
}

ModelUnits UnitsOf(const Program& p) {
  ModelUnits units{.costs = EstimateUnitCosts(p)};
  for (const ProgramUnit& u : p.units()) {
    units.names.push_back(u.name);
    units.cuttable.push_back(units.names.size() > 1 && LiveAcross(p, u.begin).size() == 1);
  }
  return units;
}

std::string ExportTrainingProgram(const std::function<Model(int64_t B, int64_t T)>& build,
                                  const std::map<std::string, std::string>& data) {
  // Primes, apart from each other and from the sizes of models (powers of two, multiples of 64).
  const SizeBindings a{{"B", 1009}, {"T", 1013}}, b{{"B", 1019}, {"T", 1021}};
  const std::string text_a = PrintTrainingProgram(build(1009, 1013), data);
  const std::string text_b = PrintTrainingProgram(build(1019, 1021), data);
  return GeneraliseSizes(text_a, a, text_b, b);
}

}  // namespace sluice
