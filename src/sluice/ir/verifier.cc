#include "sluice/ir/verifier.h"

#include <cstdint>
#include <vector>

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
  // Storage: a view's output shares the storage of its input 0; every other value has its own.
  // root[v] is the value that owns v's storage; updated[r] the last in-place instruction that
  // wrote storage r (-1: none yet).
  std::vector<ValueId> root(values.size());
  for (size_t v = 0; v < values.size(); ++v) root[v] = static_cast<ValueId>(v);
  std::vector<int64_t> updated(values.size(), -1);
  auto input_name = [](const Instruction& ins, size_t k) {
    const auto& listed = ins.op->signature.inputs;
    return k < listed.size() ? fmt::format("'{}' (input {})", listed[k].name, k)
                             : fmt::format("input {}", k);
  };
  std::vector<TensorType> in_types;
  for (size_t i = 0; i < instrs.size(); ++i) {
    const Instruction& ins = instrs[i];
    if (ins.op == nullptr) throw VerifyError(static_cast<int64_t>(i), describe(i, ins) + ": no op");
    if (ins.op->num_inputs >= 0 && static_cast<int>(ins.inputs.size()) != ins.op->num_inputs) {
      throw VerifyError(static_cast<int64_t>(i),
                        fmt::format("{}: takes {} inputs, has {}", describe(i, ins),
                                    ins.op->num_inputs, ins.inputs.size()));
    }
    if (std::string undeclared = UndeclaredAttrsMessage(*ins.op, ins.attrs); !undeclared.empty()) {
      throw VerifyError(static_cast<int64_t>(i),
                        fmt::format("{}: {}", describe(i, ins), undeclared));
    }
    in_types.clear();
    for (size_t k = 0; k < ins.inputs.size(); ++k) {
      const ValueId v = ins.inputs[k];
      if (!value_ok(v))
        throw VerifyError(static_cast<int64_t>(i), describe(i, ins) + ": input refers to no value");
      if (defined[v] == 0) {
        throw VerifyError(
            static_cast<int64_t>(i),
            fmt::format("{}: %{} is used before it is defined", describe(i, ins), values[v].name));
      }
      if (std::string problem = InPlaceInputProblem(p, *ins.op, static_cast<int>(k), v);
          !problem.empty()) {
        throw VerifyError(static_cast<int64_t>(i),
                          fmt::format("{}: {}", describe(i, ins), problem));
      }
      in_types.push_back(p.type(v));
      // A view taken before an in-place update of its storage would show the updated values,
      // not those it was taken of: reading it after the update is refused (docs/program-format.md).
      const int32_t view_at = values[v].producer;
      if (root[v] != v && updated[root[v]] > view_at) {
        throw VerifyError(
            static_cast<int64_t>(i),
            fmt::format(
                "{}: reads %{}, a view of %{} taken at instruction {}, after instruction {} ({}) "
                "updated %{} in place; a view shares its storage, so it would show the updated "
                "values: take the view after the update, or read it before",
                describe(i, ins), values[v].name, values[root[v]].name, view_at, updated[root[v]],
                instrs[updated[root[v]]].op->name, values[root[v]].name));
      }
    }
    if (ins.op->kind == OpKind::kInPlace) {
      // An input the kernel writes may share its storage with no other input: the kernel would
      // read values it is overwriting (`sgd_update(%w, %w, %w, %lr)`).
      for (int u : ins.op->updates) {
        for (size_t k = 0; k < ins.inputs.size(); ++k) {
          if (static_cast<int>(k) == u || root[ins.inputs[k]] != root[ins.inputs[u]]) continue;
          const ValueId w = ins.inputs[u], other = ins.inputs[k];
          throw VerifyError(
              static_cast<int64_t>(i),
              fmt::format("{}: updates %{} in place as {} and also reads {} as {}{}: an in-place "
                          "update may "
                          "not read what it writes through another input; give each input a value "
                          "of its own",
                          describe(i, ins), values[w].name, input_name(ins, u),
                          other == w ? "it" : "%" + values[other].name, input_name(ins, k),
                          other == w ? "" : ", which shares its storage"));
        }
      }
    }
    std::vector<TensorType> expected;
    try {
      expected = ins.op->infer(in_types, ins.attrs);
    } catch (const Error& e) {
      throw VerifyError(static_cast<int64_t>(i), fmt::format("{}: {}", describe(i, ins), e.what()));
    }
    if (expected.size() != ins.outputs.size()) {
      throw VerifyError(static_cast<int64_t>(i),
                        fmt::format("{}: op produces {} outputs, instruction lists {}",
                                    describe(i, ins), expected.size(), ins.outputs.size()));
    }
    for (size_t k = 0; k < ins.outputs.size(); ++k) {
      ValueId v = ins.outputs[k];
      if (!value_ok(v))
        throw VerifyError(static_cast<int64_t>(i),
                          describe(i, ins) + ": output refers to no value");
      if (++defined[v] > 1) {
        throw VerifyError(static_cast<int64_t>(i), fmt::format("{}: %{} is defined twice",
                                                               describe(i, ins), values[v].name));
      }
      if (p.type(v) != expected[k]) {
        throw VerifyError(
            static_cast<int64_t>(i),
            fmt::format("{}: %{} is declared {} but the op gives {}", describe(i, ins),
                        values[v].name, p.type(v).ToString(), expected[k].ToString()));
      }
      if (values[v].producer != static_cast<int32_t>(i)) {
        throw VerifyError(static_cast<int64_t>(i), fmt::format("{}: %{} records the wrong producer",
                                                               describe(i, ins), values[v].name));
      }
      if (ins.op->kind == OpKind::kView && !ins.inputs.empty()) root[v] = root[ins.inputs[0]];
    }
    if (ins.op->kind == OpKind::kInPlace) {
      for (int u : ins.op->updates) updated[root[ins.inputs[u]]] = static_cast<int64_t>(i);
    }
  }
  for (size_t v = 0; v < values.size(); ++v) {
    if (defined[v] > 1)
      throw ProgramError(
          fmt::format("program '{}': %{} is defined twice", p.name(), values[v].name));
  }
  for (ValueId v : p.outputs()) {
    if (!value_ok(v) || defined[v] == 0) {
      throw VerifyError(-1,
                        fmt::format("program '{}': output {} is never defined", p.name(),
                                    value_ok(v) ? "%" + values[v].name : std::string("?")),
                        v);
    }
    // An output is read after the last instruction: a view updated under it is read stale too.
    if (root[v] != v && updated[root[v]] > values[v].producer) {
      throw VerifyError(
          -1,
          fmt::format(
              "program '{}': outputs %{}, a view of %{} taken at instruction {}, which instruction "
              "{} "
              "({}) then updates in place; a view shares its storage, so it would show the updated "
              "values: take the view after the update, or output a copy",
              p.name(), values[v].name, values[root[v]].name, values[v].producer, updated[root[v]],
              instrs[updated[root[v]]].op->name),
          v);
    }
  }
}

void VerifyOnce(Program& program) {
  if (program.verified_) return;
  Verify(program);
  program.verified_ = true;
}

}  // namespace sluice
