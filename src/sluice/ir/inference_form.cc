// The inference form of a program (see inference_form.h).
#include "sluice/ir/inference_form.h"

#include <algorithm>
#include <string>
#include <vector>

namespace sluice {

namespace {

bool DeclaresTraining(const OpDef& op) {
  return std::any_of(op.signature.attrs.begin(), op.signature.attrs.end(),
                     [](const OpParam& a) { return a.name == "training"; });
}

}  // namespace

bool HasTrainingMode(const Program& program) {
  return std::any_of(
      program.instructions().begin(), program.instructions().end(),
      [](const Instruction& ins) { return ins.op->updates_buffers || DeclaresTraining(*ins.op); });
}

Program InferenceForm(const Program& program) {
  Program out(program.name());
  std::vector<ValueId> new_of(program.values().size(), kNoValue);
  for (ValueId v : program.inputs()) {
    new_of[static_cast<size_t>(v)] = out.AddInput(program.value(v).name, program.type(v));
  }
  for (ValueId v : program.params()) new_of[static_cast<size_t>(v)] = out.AddParamLike(program, v);
  const std::vector<ProgramUnit>& units = program.units();
  size_t next_unit = 0;
  bool open = false;
  // Before instruction i: closes the unit ending there and opens those beginning there.
  auto units_at = [&](int32_t i) {
    if (open && units[next_unit - 1].end == i) {
      out.EndUnit();
      open = false;
    }
    for (; next_unit < units.size() && units[next_unit].begin == i; ++next_unit) {
      out.BeginUnit(units[next_unit].name);
      open = true;
      if (units[next_unit].end == i) {
        out.EndUnit();
        open = false;
      }
    }
  };
  const auto& instructions = program.instructions();
  for (size_t i = 0; i < instructions.size(); ++i) {
    units_at(static_cast<int32_t>(i));
    const Instruction& ins = instructions[i];
    if (ins.op->updates_buffers) continue;
    std::vector<ValueId> inputs;
    for (ValueId v : ins.inputs) inputs.push_back(new_of[static_cast<size_t>(v)]);
    Attrs attrs = ins.attrs;
    if (DeclaresTraining(*ins.op)) attrs.Set("training", false);
    std::vector<std::string> names;
    for (ValueId v : ins.outputs) names.push_back(program.value(v).name);
    const ValueList made = out.AddInstruction(ins.op->name, inputs, std::move(attrs), names);
    for (size_t k = 0; k < ins.outputs.size(); ++k) {
      new_of[static_cast<size_t>(ins.outputs[k])] = made[k];
    }
  }
  units_at(static_cast<int32_t>(instructions.size()));
  for (ValueId v : program.outputs()) out.AddOutput(new_of[static_cast<size_t>(v)]);
  return out;
}

}  // namespace sluice
