#include "sluice/ir/verifier.h"

#include <fmt/format.h>

#include "sluice/core/error.h"

namespace sluice {

void Verify(const Program& p) {
  const auto& values = p.values();
  std::vector<int> defined(values.size(), 0);
  auto value_ok = [&](ValueId v) { return v >= 0 && static_cast<size_t>(v) < values.size(); };
  auto describe = [&](size_t i, const Instruction& ins) {
    std::string first = ins.outputs.empty() || !value_ok(ins.outputs[0])
                            ? std::string("-")
                            : "%" + values[ins.outputs[0]].name;
    return fmt::format("program '{}', instruction {} ({} {})", p.name(), i,
                       ins.op ? ins.op->name : "<no op>", first);
  };
  for (ValueId v : p.inputs()) ++defined.at(v);
  for (ValueId v : p.params()) ++defined.at(v);
  const auto& instrs = p.instructions();
  std::vector<TensorType> in_types;
  for (size_t i = 0; i < instrs.size(); ++i) {
    const Instruction& ins = instrs[i];
    if (ins.op == nullptr) throw ProgramError(describe(i, ins) + ": no op");
    if (ins.op->num_inputs >= 0 && static_cast<int>(ins.inputs.size()) != ins.op->num_inputs) {
      throw ProgramError(fmt::format("{}: takes {} inputs, has {}", describe(i, ins),
                                     ins.op->num_inputs, ins.inputs.size()));
    }
    if (std::string undeclared = UndeclaredAttrsMessage(*ins.op, ins.attrs); !undeclared.empty()) {
      throw ProgramError(fmt::format("{}: {}", describe(i, ins), undeclared));
    }
    in_types.clear();
    for (ValueId v : ins.inputs) {
      if (!value_ok(v)) throw ProgramError(describe(i, ins) + ": input refers to no value");
      if (defined[v] == 0) {
        throw ProgramError(
            fmt::format("{}: %{} is used before it is defined", describe(i, ins), values[v].name));
      }
      in_types.push_back(p.type(v));
    }
    std::vector<TensorType> expected;
    try {
      expected = ins.op->infer(in_types, ins.attrs);
    } catch (const Error& e) {
      throw ProgramError(fmt::format("{}: {}", describe(i, ins), e.what()));
    }
    if (expected.size() != ins.outputs.size()) {
      throw ProgramError(fmt::format("{}: op produces {} outputs, instruction lists {}",
                                     describe(i, ins), expected.size(), ins.outputs.size()));
    }
    for (size_t k = 0; k < ins.outputs.size(); ++k) {
      ValueId v = ins.outputs[k];
      if (!value_ok(v)) throw ProgramError(describe(i, ins) + ": output refers to no value");
      if (++defined[v] > 1) {
        throw ProgramError(
            fmt::format("{}: %{} is defined twice", describe(i, ins), values[v].name));
      }
      if (p.type(v) != expected[k]) {
        throw ProgramError(fmt::format("{}: %{} is declared {} but the op gives {}",
                                       describe(i, ins), values[v].name, p.type(v).ToString(),
                                       expected[k].ToString()));
      }
      if (values[v].producer != static_cast<int32_t>(i)) {
        throw ProgramError(
            fmt::format("{}: %{} records the wrong producer", describe(i, ins), values[v].name));
      }
    }
  }
  for (size_t v = 0; v < values.size(); ++v) {
    if (defined[v] > 1)
      throw ProgramError(
          fmt::format("program '{}': %{} is defined twice", p.name(), values[v].name));
  }
  for (ValueId v : p.outputs()) {
    if (!value_ok(v) || defined[v] == 0) {
      throw ProgramError(fmt::format("program '{}': output {} is never defined", p.name(),
                                     value_ok(v) ? "%" + values[v].name : std::string("?")));
    }
  }
}

void VerifyOnce(Program& program) {
  if (program.verified_) return;
  Verify(program);
  program.verified_ = true;
}

}  // namespace sluice
