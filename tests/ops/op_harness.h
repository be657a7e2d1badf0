// One harness for every op (tests/ops/): a single OpCase table entry drives
//   1. fast kernel vs reference kernel, in f32 and f64, on the case's shapes — or, for an op with
//      a single kernel (the registry's kernel == reference), one run in each dtype instead: the
//      case says so with single_kernel, and the harness fails when that mark and the registry
//      disagree, so a comparison of a kernel with itself can never pass for a real one;
//   2. a finite-difference gradient check in f64 (central differences, relative error ≤ 1e-6)
//      of the op's VJP rule as autodiff uses it;
//   3. the op's signature (OpDef::signature) against the case: its attributes are ones the
//      signature names, and the op gives as many outputs as the signature lists;
//   4. for every input the op lists in OpDef::in_place_inputs that has output 0's shape and
//      element width (mixed-precision cases too): each kernel with output 0 on that input's
//      storage gives bitwise its result into fresh memory;
// A mixed-precision case (bf16 = true) runs instead, with the inputs bf16_inputs in bf16 and the
// other floating inputs in f32 (an attribute dtype = "bf16" kept):
//   1. fast vs reference kernel (f32_tolerance, relative to the largest magnitude);
//   2. against its f32 twin — the same op on the same (bf16-representable) values all in f32, an
//      attribute dtype = "bf16" read as "f32" — within bf16_tolerance: what bf16 costs the op;
//   3. with grad, its backward program against the twin's (bf16_grad_tolerance): autodiff gives
//      each input a gradient of its GradientType (f32 for bf16), within bf16's rounding of the
//      twin's.
// and OpErrorCase entries check that shape/dtype mistakes are reported as errors, not crashes.
// op_coverage_test.cc fails for every registered op that no table has a case for.
//
// Adding an op to the tests = adding entries to its family's table, e.g. in elementwise_test.cc:
//   {.label = "add_row", .op = "add", .inputs = {F({4, 3}), F({3})}},
//   {.label = "relu_odd", .op = "relu", .single_kernel = true, .inputs = {F({7, 13})}},
#pragma once

#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "sluice/ir/attrs.h"
#include "sluice/ir/op_registry.h"

namespace sluice::testing {

// How the harness fills an input.
struct Fill {
  enum Kind { kUniform, kPositive, kIndex } kind = kUniform;
  double low = -1.0, high = 1.0;  // uniform range; kIndex draws integers in [low, high)
};

inline Fill Positive() { return {Fill::kPositive, 0.5, 2.0}; }
inline Fill Indices(int64_t n) { return {Fill::kIndex, 0, static_cast<double>(n)}; }
// Indices in [-1, n): -1 is the ignored target of cross_entropy.
inline Fill IndicesOrIgnored(int64_t n) { return {Fill::kIndex, -1, static_cast<double>(n)}; }
inline Fill Uniform(double lo, double hi) { return {Fill::kUniform, lo, hi}; }

// A floating input (run as f32 and as f64) / an integer input of the given dtype.
inline TensorType F(std::initializer_list<int64_t> dims) { return {DType::kF32, Shape(dims)}; }
inline TensorType I64(std::initializer_list<int64_t> dims) { return {DType::kI64, Shape(dims)}; }
inline TensorType I32(std::initializer_list<int64_t> dims) { return {DType::kI32, Shape(dims)}; }

struct OpCase {
  std::string label;  // unique, [A-Za-z0-9_]
  std::string op;
  // The op has one kernel (the registry's reference and fast kernel are the same function): the
  // harness runs it instead of comparing it with itself, and says so in the test's output.
  bool single_kernel = false;
  std::vector<TensorType> inputs;
  Attrs attrs;
  std::vector<Fill> fills;      // per input; missing entries are kUniform(-1, 1)
  bool grad = true;             // run the gradient check (ops without VJP: false)
  double f32_tolerance = 2e-5;  // fast vs reference, relative, in f32
  double grad_tolerance = 1e-6;
  // Inputs the gradient check skips (e.g. in-place state); empty = all floating inputs.
  std::vector<int> no_grad_inputs;
  // Mixed precision (see the top of this file).
  bool bf16 = false;
  std::vector<int> bf16_inputs;
  double bf16_tolerance = 1e-5;
  double bf16_grad_tolerance = 1e-2;
};

struct OpErrorCase {
  std::string label;
  std::string op;
  std::vector<TensorType> inputs;
  Attrs attrs;
};

// gtest prints parameters with these (the label) instead of a byte dump.
inline void PrintTo(const OpCase& c, std::ostream* os) { *os << c.label; }
inline void PrintTo(const OpErrorCase& c, std::ostream* os) { *os << c.label; }

void RunOpCase(const OpCase& c);

// Runs a one-instruction program op(inputs...) in f64 (integer inputs as they are) with the fast or
// the reference kernels and returns output 0's elements (for tests of values an op must give).
std::vector<double> RunF64(const std::string& op, const std::vector<Tensor>& inputs, bool reference,
                           const Attrs& attrs = {});
void RunOpErrorCase(const OpErrorCase& c);

// The op tables, one per family file (tests/ops/<family>_test.cc); op_coverage_test.cc checks that
// together they have a case for every registered op.
std::vector<OpCase> AttentionCases();
std::vector<OpCase> BatchNormCases();
std::vector<OpCase> ConvCases();
std::vector<OpCase> DropoutCases();
std::vector<OpCase> ElementwiseCases();
std::vector<OpCase> LinalgCases();
std::vector<OpCase> NnCases();
std::vector<OpCase> OptimizerCases();
std::vector<OpCase> ReductionCases();
std::vector<OpCase> SelectCases();
std::vector<OpCase> ShapeCases();

class OpHarness : public ::testing::TestWithParam<OpCase> {};
class OpErrors : public ::testing::TestWithParam<OpErrorCase> {};

struct CaseName {
  template <typename T>
  std::string operator()(const ::testing::TestParamInfo<T>& info) const {
    return info.param.label;
  }
};

}  // namespace sluice::testing
