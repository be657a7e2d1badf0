#include "sluice/exec/random_inputs.h"

#include <algorithm>
#include <limits>
#include <random>
#include <vector>

#include <fmt/format.h>

namespace sluice {

int64_t IntegerInputBound(const Program& program, ValueId v) {
  int64_t bound = std::numeric_limits<int64_t>::max();
  std::vector<ValueId> aliases{v};  // v and the views of it, found in program order
  for (const Instruction& instr : program.instructions()) {
    const bool reads = std::any_of(instr.inputs.begin(), instr.inputs.end(), [&](ValueId in) {
      return std::find(aliases.begin(), aliases.end(), in) != aliases.end();
    });
    if (!reads) continue;
    if (instr.op->kind == OpKind::kView &&
        std::find(aliases.begin(), aliases.end(), instr.inputs[0]) != aliases.end()) {
      aliases.insert(aliases.end(), instr.outputs.begin(), instr.outputs.end());
    }
    for (ValueId in : instr.inputs) {
      const TensorType& t = program.type(in);
      if (!IsFloating(t.dtype)) continue;
      for (int64_t d : t.shape.dims()) bound = std::min(bound, d);
    }
  }
  if (bound == std::numeric_limits<int64_t>::max()) return 2;
  return std::max<int64_t>(bound, 1);
}

namespace {

template <typename T>
void FillUniform(const Tensor& t, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(-1.0, 1.0);
  T* p = t.data<T>();
  for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = static_cast<T>(u(rng));
}

template <typename T>
void FillIntegers(const Tensor& t, int64_t bound, std::mt19937_64& rng) {
  std::uniform_int_distribution<int64_t> u(0, bound - 1);
  T* p = t.data<T>();
  for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = static_cast<T>(u(rng));
}

}  // namespace

void BindRandomInputs(const Program& program, uint64_t seed, Scope& scope, Allocator& allocator) {
  std::mt19937_64 rng(seed);
  std::vector<ValueId> values = program.inputs();
  values.insert(values.end(), program.params().begin(), program.params().end());
  for (ValueId v : values) {
    const Value& value = program.value(v);
    if (scope.Has(value.name)) continue;
    Tensor t = Tensor::Empty(program.type(v).shape, program.type(v).dtype, allocator);
    switch (program.type(v).dtype) {
      case DType::kF32:
        FillUniform<float>(t, rng);
        break;
      case DType::kF64:
        FillUniform<double>(t, rng);
        break;
      case DType::kI32:
        FillIntegers<int32_t>(t, IntegerInputBound(program, v), rng);
        break;
      case DType::kI64:
        FillIntegers<int64_t>(t, IntegerInputBound(program, v), rng);
        break;
      default:
        throw ShapeError(fmt::format("program '{}': cannot draw random values for %{} of dtype {}",
                                     program.name(), value.name, Name(program.type(v).dtype)));
    }
    scope.Set(value.name, std::move(t));
  }
}

}  // namespace sluice
