// Op table: reductions (sum, mean over axes with keepdims) and the broadcast pair sum_to,
// broadcast_to.
#include "op_harness.h"

namespace sluice::testing {
namespace {

Attrs Axes(std::vector<int64_t> axes, bool keepdims = false) {
  return {{"axes", std::move(axes)}, {"keepdims", keepdims}};
}

Attrs Target(std::vector<int64_t> shape) { return {{"shape", std::move(shape)}}; }

}  // namespace

// Tables keep one case per line.
// clang-format off
std::vector<OpCase> ReductionCases() {
  return {
      {.label = "sum_all_default", .op = "sum", .inputs = {F({7, 13})}},
      {.label = "sum_all_keepdims", .op = "sum", .inputs = {F({7, 13})}, .attrs = Axes({}, true)},
      {.label = "sum_last", .op = "sum", .inputs = {F({7, 13})}, .attrs = Axes({-1})},
      {.label = "sum_first", .op = "sum", .inputs = {F({7, 13})}, .attrs = Axes({0})},
      {.label = "sum_middle_keepdims", .op = "sum", .inputs = {F({3, 7, 5})}, .attrs = Axes({1}, true)},
      {.label = "sum_outer_two", .op = "sum", .inputs = {F({3, 7, 5})}, .attrs = Axes({0, 2})},
      {.label = "sum_alternate_keepdims", .op = "sum", .inputs = {F({2, 3, 4, 5})}, .attrs = Axes({3, 1}, true)},
      {.label = "sum_size_one_axes", .op = "sum", .inputs = {F({1, 7, 1})}, .attrs = Axes({0, 2})},
      {.label = "sum_scalar", .op = "sum", .inputs = {F({})}},
      {.label = "sum_one", .op = "sum", .inputs = {F({1})}, .attrs = Axes({0})},
      {.label = "sum_empty_axis", .op = "sum", .inputs = {F({0, 3})}, .attrs = Axes({0})},
      {.label = "sum_long_rows", .op = "sum", .inputs = {F({3, 1001})}, .attrs = Axes({1}), .grad = false},
      {.label = "sum_long_columns", .op = "sum", .inputs = {F({1001, 3})}, .attrs = Axes({0}), .grad = false},
      {.label = "mean_all", .op = "mean", .inputs = {F({7, 13})}},
      {.label = "mean_last_keepdims", .op = "mean", .inputs = {F({2, 7, 13})}, .attrs = Axes({-1}, true)},
      {.label = "mean_first", .op = "mean", .inputs = {F({33, 7})}, .attrs = Axes({0})},
      {.label = "mean_two", .op = "mean", .inputs = {F({3, 7, 5})}, .attrs = Axes({-1, 0}, true)},
      {.label = "mean_long", .op = "mean", .inputs = {F({2, 3, 333})}, .attrs = Axes({0, 2}), .grad = false},
      {.label = "sum_to_rows", .op = "sum_to", .inputs = {F({7, 13})}, .attrs = Target({13})},
      {.label = "sum_to_column", .op = "sum_to", .inputs = {F({7, 13})}, .attrs = Target({7, 1})},
      {.label = "sum_to_middle", .op = "sum_to", .inputs = {F({3, 4, 5})}, .attrs = Target({1, 4, 1})},
      {.label = "sum_to_scalar", .op = "sum_to", .inputs = {F({7, 13})}, .attrs = Target({})},
      {.label = "sum_to_lead", .op = "sum_to", .inputs = {F({2, 3, 7})}, .attrs = Target({3, 1})},
      {.label = "broadcast_to_rows", .op = "broadcast_to", .single_kernel = true, .inputs = {F({13})}, .attrs = Target({7, 13})},
      {.label = "broadcast_to_column", .op = "broadcast_to", .single_kernel = true, .inputs = {F({7, 1})}, .attrs = Target({7, 13})},
      {.label = "broadcast_to_scalar", .op = "broadcast_to", .single_kernel = true, .inputs = {F({})}, .attrs = Target({2, 3})},
  };
}
// clang-format on

namespace {

// clang-format off
std::vector<OpErrorCase> ReductionErrors() {
  return {
      {.label = "sum_axis_out_of_range", .op = "sum", .inputs = {F({3, 4})}, .attrs = Axes({2})},
      {.label = "sum_negative_axis_out_of_range", .op = "sum", .inputs = {F({3, 4})}, .attrs = Axes({-3})},
      {.label = "sum_axis_twice", .op = "sum", .inputs = {F({3, 4})}, .attrs = Axes({1, -1})},
      {.label = "sum_int", .op = "sum", .inputs = {I64({3})}},
      {.label = "mean_axes_not_a_list", .op = "mean", .inputs = {F({3, 4})}, .attrs = {{"axes", int64_t{0}}}},
      {.label = "mean_scalar_axis", .op = "mean", .inputs = {F({})}, .attrs = Axes({0})},
      {.label = "sum_to_no_broadcast", .op = "sum_to", .inputs = {F({3, 4})}, .attrs = Target({5})},
      {.label = "broadcast_to_no_broadcast", .op = "broadcast_to", .inputs = {F({3})}, .attrs = Target({4})},
  };
}
// clang-format on

INSTANTIATE_TEST_SUITE_P(Reduction, OpHarness, ::testing::ValuesIn(ReductionCases()), CaseName());
INSTANTIATE_TEST_SUITE_P(Reduction, OpErrors, ::testing::ValuesIn(ReductionErrors()), CaseName());

}  // namespace
}  // namespace sluice::testing
