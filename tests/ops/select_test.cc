// Op table: comparisons and selection (compare, where), plus their values on chosen operands —
// every relation, a -inf put where a padding mask is 0 (PyTorch's masked_fill). The harness's
// finite differences check where's gradient: dy to a where the condition holds, to b elsewhere.
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "op_harness.h"
#include "sluice/ir/ops.h"

namespace sluice::testing {

// clang-format off
std::vector<OpCase> SelectCases() {
  auto relation = [](const char* r) { return Attrs{{"relation", std::string(r)}}; };
  // Small integers as floats, so that eq, le and ge meet equal operands.
  const Fill ints = {Fill::kIndex, -2, 3};
  return {
      {.label = "compare_eq", .op = "compare", .inputs = {F({4, 5}), F({4, 5})}, .attrs = relation("eq"), .fills = {ints, ints}, .grad = false},
      {.label = "compare_gt_row", .op = "compare", .inputs = {F({3, 4, 5}), F({5})}, .attrs = relation("gt"), .grad = false},
      {.label = "compare_le_scalar", .op = "compare", .inputs = {F({7, 13}), F({})}, .attrs = relation("le"), .fills = {ints, ints}, .grad = false},
      {.label = "compare_ne_outer", .op = "compare", .inputs = {F({4, 1}), F({1, 6})}, .attrs = relation("ne"), .fills = {ints, ints}, .grad = false},
      // where: the condition 0 or 1 (not differentiated), a and b broadcast both ways.
      {.label = "where", .op = "where", .single_kernel = true, .inputs = {F({4, 5}), F({4, 5}), F({4, 5})}, .fills = {{Fill::kIndex, 0, 2}}, .no_grad_inputs = {0}},
      {.label = "where_padding_mask", .op = "where", .single_kernel = true, .inputs = {F({2, 1, 1, 5}), F({}), F({2, 3, 5, 5})}, .fills = {{Fill::kIndex, 0, 2}}, .no_grad_inputs = {0}},
      {.label = "where_broadcast_a", .op = "where", .single_kernel = true, .inputs = {F({3, 4}), F({4}), F({3, 1})}, .fills = {{Fill::kIndex, 0, 2}}, .no_grad_inputs = {0}},
  };
}

std::vector<OpErrorCase> SelectErrors() {
  return {
      {.label = "compare_relation", .op = "compare", .inputs = {F({3}), F({3})}, .attrs = {{"relation", std::string("gte")}}},
      {.label = "compare_shapes", .op = "compare", .inputs = {F({3}), F({4})}, .attrs = {{"relation", std::string("eq")}}},
      {.label = "compare_int", .op = "compare", .inputs = {I64({3}), I64({3})}, .attrs = {{"relation", std::string("eq")}}},
      {.label = "where_shapes", .op = "where", .inputs = {F({3}), F({4}), F({3})}},
      {.label = "where_dtypes", .op = "where", .inputs = {I64({3}), F({3}), F({3})}},
  };
}

// clang-format on

INSTANTIATE_TEST_SUITE_P(Select, OpHarness, ::testing::ValuesIn(SelectCases()), CaseName());
INSTANTIATE_TEST_SUITE_P(Select, OpErrors, ::testing::ValuesIn(SelectErrors()), CaseName());

namespace {

Tensor Vec(const std::vector<double>& v) {
  return Tensor::FromVector<double>(Shape{static_cast<int64_t>(v.size())}, v);
}

}  // namespace

TEST(Compare, EveryRelationGivesOneWhereItHolds) {
  const Tensor a = Vec({-1.0, 0.0, 2.0}), b = Vec({0.0, 0.0, 1.0});
  const std::vector<std::pair<std::string, std::vector<double>>> expected = {
      {"eq", {0, 1, 0}}, {"ne", {1, 0, 1}}, {"lt", {1, 0, 0}},
      {"le", {1, 1, 0}}, {"gt", {0, 0, 1}}, {"ge", {0, 1, 1}}};
  for (const auto& [relation, want] : expected) {
    for (bool reference : {true, false}) {
      EXPECT_EQ(RunF64("compare", {a, b}, reference, {{"relation", relation}}), want)
          << relation << " reference=" << reference;
    }
  }
}

// masked_fill(scores, pad == 0, -inf) as a padding mask: -inf exactly where the key is padding,
// the scores untouched elsewhere (no 0 · ∞ = NaN, which an arithmetic blend would give).
TEST(Where, PutsMinusInfinityWhereAPaddingMaskIsZero) {
  const double inf = std::numeric_limits<double>::infinity();
  const Tensor pad = Tensor::FromVector<double>(Shape{1, 3}, {1, 1, 0});
  const Tensor minus_inf = Tensor::Full(Shape{}, -inf, DType::kF64);
  const Tensor scores = Tensor::FromVector<double>(Shape{2, 3}, {0.5, -2.0, 3.0, 1.0, 2.0, -1.0});
  const Tensor zero = Tensor::Full(Shape{}, 0.0, DType::kF64);
  const std::vector<double> is_pad = RunF64("compare", {pad, zero}, true, {{"relation", "eq"}});
  const Tensor cond = Tensor::FromVector<double>(Shape{1, 3}, is_pad);
  const std::vector<double> y = RunF64("where", {cond, minus_inf, scores}, true);
  EXPECT_EQ(y, (std::vector<double>{0.5, -2.0, -inf, 1.0, 2.0, -inf}));
}

}  // namespace sluice::testing
