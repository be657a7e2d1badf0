// One harness for every op (tests/ops/): a single OpCase table entry drives
//   1. fast kernel vs reference kernel, in f32 and f64, on the case's shapes;
//   2. a finite-difference gradient check in f64 (central differences, relative error ≤ 1e-6)
//      of the op's VJP rule as autodiff uses it;
// and OpErrorCase entries check that shape/dtype mistakes are reported as errors, not crashes.
//
// Adding an op to the tests = adding entries to its family's table, e.g. in elementwise_test.cc:
//   {.label = "add_row", .op = "add", .inputs = {F({4, 3}), F({3})}},
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
  std::vector<TensorType> inputs;
  Attrs attrs;
  std::vector<Fill> fills;   // per input; missing entries are kUniform(-1, 1)
  bool grad = true;          // run the gradient check (ops without VJP: false)
  double f32_tolerance = 2e-5;  // fast vs reference, relative, in f32
  double grad_tolerance = 1e-6;
  // Inputs the gradient check skips (e.g. in-place state); empty = all floating inputs.
  std::vector<int> no_grad_inputs;
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
void RunOpErrorCase(const OpErrorCase& c);

class OpHarness : public ::testing::TestWithParam<OpCase> {};
class OpErrors : public ::testing::TestWithParam<OpErrorCase> {};

struct CaseName {
  template <typename T>
  std::string operator()(const ::testing::TestParamInfo<T>& info) const { return info.param.label; }
};

}  // namespace sluice::testing
