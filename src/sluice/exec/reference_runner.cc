#include "sluice/exec/reference_runner.h"

#include <fmt/format.h>

namespace sluice {

void CheckBinding(const Program& program, ValueId v, const Tensor& t) {
  const Value& value = program.value(v);
  if (!t.defined() || t.dtype() != program.type(v).dtype || t.shape() != program.type(v).shape) {
    throw ProgramError(fmt::format("program '{}': %{} must be {} but is bound to {}",
                                   program.name(), value.name, program.type(v).ToString(),
                                   t.defined()
                                       ? fmt::format("{}{}", Name(t.dtype()), t.shape().ToString())
                                       : std::string("nothing")));
  }
}

void RunReference(const Program& program, Scope& scope, Allocator& allocator,
                  bool use_reference_kernels, const std::vector<std::string>& keep) {
  std::vector<Tensor> slots(program.values().size());
  auto bind = [&](ValueId v) {
    slots[v] = scope.Get(program.value(v).name);
    CheckBinding(program, v, slots[v]);
    if (!slots[v].is_contiguous()) slots[v] = slots[v].Contiguous(allocator);
  };
  for (ValueId v : program.inputs()) bind(v);
  for (ValueId v : program.params()) bind(v);

  std::vector<Tensor> ins, outs;
  for (const Instruction& instr : program.instructions()) {
    ins.clear();
    outs.clear();
    for (ValueId v : instr.inputs) ins.push_back(slots[v]);
    for (ValueId v : instr.outputs) {
      const TensorType& t = program.type(v);
      outs.push_back(instr.op->kind == OpKind::kCompute ? Tensor::Empty(t.shape, t.dtype, allocator)
                                                        : Tensor());
    }
    KernelContext ctx{ins, outs, instr.attrs, allocator};
    (use_reference_kernels ? instr.op->reference : instr.op->kernel)(ctx);
    for (size_t i = 0; i < instr.outputs.size(); ++i) slots[instr.outputs[i]] = std::move(outs[i]);
  }
  for (ValueId v : program.outputs()) scope.Set(program.value(v).name, slots[v]);
  for (const std::string& name : keep) {
    ValueId v = program.Get(name);
    scope.Set(name, slots[v]);
  }
}

}  // namespace sluice
