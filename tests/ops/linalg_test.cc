// Op table: matmul and linear (linalg family).
#include "op_harness.h"

namespace sluice::testing {
std::vector<OpCase> LinalgCases() {
  Attrs ta{{"transpose_a", true}}, tb{{"transpose_b", true}},
      tab{{"transpose_a", true}, {"transpose_b", true}};
  return {
      {.label = "matmul_2d", .op = "matmul", .inputs = {F({3, 5}), F({5, 4})}},
      {.label = "matmul_odd", .op = "matmul", .inputs = {F({1, 7}), F({7, 1})}},
      {.label = "matmul_ta", .op = "matmul", .inputs = {F({5, 3}), F({5, 4})}, .attrs = ta},
      {.label = "matmul_tb", .op = "matmul", .inputs = {F({3, 5}), F({4, 5})}, .attrs = tb},
      {.label = "matmul_tab", .op = "matmul", .inputs = {F({5, 3}), F({4, 5})}, .attrs = tab},
      {.label = "matmul_weight_shared", .op = "matmul", .inputs = {F({2, 3, 5}), F({5, 4})}},
      {.label = "matmul_weight_shared_tb",
       .op = "matmul",
       .inputs = {F({2, 3, 5}), F({4, 5})},
       .attrs = tb},
      {.label = "matmul_weight_shared_ta",
       .op = "matmul",
       .inputs = {F({2, 5, 3}), F({5, 4})},
       .attrs = ta},
      {.label = "matmul_weight_shared_tab",
       .op = "matmul",
       .inputs = {F({2, 5, 3}), F({4, 5})},
       .attrs = tab},
      {.label = "matmul_batched", .op = "matmul", .inputs = {F({2, 2, 3, 4}), F({2, 2, 4, 3})}},
      {.label = "matmul_batched_tb",
       .op = "matmul",
       .inputs = {F({2, 3, 4}), F({2, 5, 4})},
       .attrs = tb},
      {.label = "matmul_batched_ta",
       .op = "matmul",
       .inputs = {F({2, 4, 3}), F({2, 4, 5})},
       .attrs = ta},
      {.label = "matmul_big", .op = "matmul", .inputs = {F({33, 65}), F({65, 17})}, .grad = false},
      {.label = "matmul_gelu_grad",
       .op = "matmul_gelu_grad",
       .inputs = {F({2, 3, 5}), F({4, 5}), F({2, 3, 4})},
       .attrs = tb,
       .fills = {{}, {}, Uniform(-3, 3)},
       .grad = false},
      {.label = "matmul_gelu_grad_big",
       .op = "matmul_gelu_grad",
       .inputs = {F({33, 65}), F({65, 17}), F({33, 17})},
       .grad = false},
      {.label = "matmul_accumulate_ta",
       .op = "matmul_accumulate",
       .inputs = {F({3, 4}), F({5, 3}), F({5, 4})},
       .attrs = ta,
       .grad = false},
      {.label = "matmul_accumulate_tb",
       .op = "matmul_accumulate",
       .inputs = {F({3, 4}), F({3, 5}), F({4, 5})},
       .attrs = tb,
       .grad = false},
      {.label = "matmul_accumulate_big",
       .op = "matmul_accumulate",
       .inputs = {F({17, 33}), F({65, 17}), F({65, 33})},
       .attrs = ta,
       .grad = false},
      {.label = "linear_2d", .op = "linear", .inputs = {F({3, 5}), F({5, 4}), F({4})}},
      {.label = "linear_3d", .op = "linear", .inputs = {F({2, 3, 5}), F({5, 4}), F({4})}},
      {.label = "linear_one", .op = "linear", .inputs = {F({1, 1}), F({1, 7}), F({7})}},
      {.label = "linear_4d", .op = "linear", .inputs = {F({2, 1, 3, 2}), F({2, 3}), F({3})}},
      {.label = "linear_no_inputs",
       .op = "linear",
       .inputs = {F({3, 0}), F({0, 4}), F({4})},
       .grad = false},
      {.label = "linear_big",
       .op = "linear",
       .inputs = {F({33, 65}), F({65, 17}), F({17})},
       .grad = false},
  };
}

namespace {

std::vector<OpErrorCase> LinalgErrors() {
  return {
      {.label = "matmul_inner", .op = "matmul", .inputs = {F({3, 5}), F({4, 4})}},
      {.label = "matmul_rank1", .op = "matmul", .inputs = {F({3}), F({3, 4})}},
      {.label = "matmul_batch", .op = "matmul", .inputs = {F({2, 3, 4}), F({3, 4, 5})}},
      {.label = "matmul_dtype", .op = "matmul", .inputs = {F({3, 4}), {DType::kF64, Shape{4, 5}}}},
      {.label = "linear_w_rows", .op = "linear", .inputs = {F({3, 5}), F({4, 4}), F({4})}},
      {.label = "linear_w_rank", .op = "linear", .inputs = {F({3, 5}), F({1, 5, 4}), F({4})}},
      {.label = "linear_bias", .op = "linear", .inputs = {F({3, 5}), F({5, 4}), F({3})}},
      {.label = "linear_bias_rank", .op = "linear", .inputs = {F({3, 5}), F({5, 4}), F({1, 4})}},
      {.label = "linear_rank1", .op = "linear", .inputs = {F({5}), F({5, 4}), F({4})}},
      {.label = "matmul_accumulate_acc",
       .op = "matmul_accumulate",
       .inputs = {F({4, 3}), F({5, 3}), F({5, 4})},
       .attrs = {{"transpose_a", true}}},
      {.label = "matmul_accumulate_batched",
       .op = "matmul_accumulate",
       .inputs = {F({3, 4}), F({2, 3, 5}), F({5, 4})}},
      {.label = "matmul_gelu_grad_x",
       .op = "matmul_gelu_grad",
       .inputs = {F({3, 5}), F({5, 4}), F({3, 5})}},
      {.label = "linear_dtype",
       .op = "linear",
       .inputs = {F({3, 5}), F({5, 4}), {DType::kF64, Shape{4}}}},
  };
}

INSTANTIATE_TEST_SUITE_P(Linalg, OpHarness, ::testing::ValuesIn(LinalgCases()), CaseName());
INSTANTIATE_TEST_SUITE_P(Linalg, OpErrors, ::testing::ValuesIn(LinalgErrors()), CaseName());

}  // namespace
}  // namespace sluice::testing
