// Op table: elementwise family.
#include "op_harness.h"

namespace sluice::testing {
namespace {

std::vector<OpCase> ElementwiseCases() {
  return {
      {.label = "add_same", .op = "add", .inputs = {F({4, 3}), F({4, 3})}},
      {.label = "add_row", .op = "add", .inputs = {F({4, 3}), F({3})}},
      {.label = "add_col", .op = "add", .inputs = {F({4, 1}), F({4, 3})}},
      {.label = "add_scalar", .op = "add", .inputs = {F({}), F({2, 5})}},
      {.label = "add_both_stretch", .op = "add", .inputs = {F({3, 1, 5}), F({1, 4, 1})}},
      {.label = "add_odd", .op = "add", .inputs = {F({7, 1, 13}), F({13})}, .grad = false},
      {.label = "copy", .op = "copy", .inputs = {F({3, 7})}},
  };
}

std::vector<OpErrorCase> ElementwiseErrors() {
  return {
      {.label = "add_mismatch", .op = "add", .inputs = {F({4, 3}), F({4})}},
      {.label = "add_dtype", .op = "add", .inputs = {F({3}), {DType::kF64, Shape{3}}}},
      {.label = "add_int", .op = "add", .inputs = {I64({3}), I64({3})}},
  };
}

INSTANTIATE_TEST_SUITE_P(Elementwise, OpHarness, ::testing::ValuesIn(ElementwiseCases()), CaseName());
INSTANTIATE_TEST_SUITE_P(Elementwise, OpErrors, ::testing::ValuesIn(ElementwiseErrors()), CaseName());

}  // namespace
}  // namespace sluice::testing
