// Op table: shape family (reshape, transpose, permute, slice and slice_view, concat, split and
// split_view), plus the builder's choice between views and copies.
#include "op_harness.h"
#include "sluice/autodiff/autodiff.h"
#include "sluice/exec/reference_runner.h"
#include "sluice/ir/ops.h"

namespace sluice::testing {
namespace {

using Ints = std::vector<int64_t>;

Attrs SliceAttrs(int64_t axis, int64_t start, int64_t end) {
  return {{"axis", axis}, {"start", start}, {"end", end}};
}
Attrs SplitAttrs(int64_t axis, Ints sizes) { return {{"axis", axis}, {"sizes", std::move(sizes)}}; }
Attrs Order(Ints order) { return {{"order", std::move(order)}}; }
Attrs Axis(int64_t axis) { return {{"axis", axis}}; }

}  // namespace

// Tables keep one case per line.
// clang-format off
std::vector<OpCase> ShapeCases() {
  return {
      {.label = "reshape", .op = "reshape", .single_kernel = true, .inputs = {F({7, 13})}, .attrs = {{"shape", Ints{13, -1}}}},
      {.label = "transpose_2d", .op = "transpose", .inputs = {F({7, 13})}, .attrs = {{"dim0", int64_t{0}}, {"dim1", int64_t{1}}}},
      {.label = "transpose_3d", .op = "transpose", .inputs = {F({2, 7, 13})}, .attrs = {{"dim0", int64_t{-1}}, {"dim1", int64_t{-3}}}},
      {.label = "permute_2d", .op = "permute", .inputs = {F({7, 13})}, .attrs = Order({1, 0})},
      {.label = "permute_3d", .op = "permute", .inputs = {F({2, 7, 13})}, .attrs = Order({2, 0, 1})},
      {.label = "permute_heads", .op = "permute", .inputs = {F({2, 3, 5, 7})}, .attrs = Order({0, 2, 1, 3})},
      {.label = "permute_identity", .op = "permute", .inputs = {F({7, 13})}, .attrs = Order({0, 1})},
      {.label = "permute_negative", .op = "permute", .inputs = {F({2, 3, 4})}, .attrs = Order({-1, 0, 1})},
      {.label = "permute_size_one", .op = "permute", .inputs = {F({1, 7, 1, 13})}, .attrs = Order({3, 2, 1, 0})},
      {.label = "permute_i64", .op = "permute", .inputs = {I64({3, 4})}, .attrs = Order({1, 0}), .fills = {Indices(100)}},
      {.label = "slice_first_axis", .op = "slice", .inputs = {F({7, 13})}, .attrs = SliceAttrs(0, 2, 5)},
      {.label = "slice_middle_axis", .op = "slice", .inputs = {F({3, 7, 13})}, .attrs = SliceAttrs(1, 1, 6)},
      {.label = "slice_last_axis", .op = "slice", .inputs = {F({7, 13})}, .attrs = SliceAttrs(-1, 0, 7)},
      {.label = "slice_empty", .op = "slice", .inputs = {F({7, 13})}, .attrs = SliceAttrs(1, 4, 4)},
      {.label = "slice_whole", .op = "slice", .inputs = {F({7, 13})}, .attrs = SliceAttrs(1, 0, 13)},
      {.label = "slice_i32", .op = "slice", .inputs = {I32({4, 7})}, .attrs = SliceAttrs(1, 2, 7), .fills = {Indices(9)}},
      {.label = "slice_view_first_axis", .op = "slice_view", .single_kernel = true, .inputs = {F({7, 13})}, .attrs = SliceAttrs(0, 2, 5)},
      {.label = "slice_view_after_ones", .op = "slice_view", .single_kernel = true, .inputs = {F({1, 1, 33})}, .attrs = SliceAttrs(2, 3, 32)},
      {.label = "slice_view_tail", .op = "slice_view", .single_kernel = true, .inputs = {F({7, 13})}, .attrs = SliceAttrs(0, 6, 7)},
      {.label = "concat_first_axis", .op = "concat", .inputs = {F({2, 3}), F({5, 3})}, .attrs = Axis(0)},
      {.label = "concat_last_axis", .op = "concat", .inputs = {F({7, 2}), F({7, 13}), F({7, 1})}, .attrs = Axis(1)},
      {.label = "concat_middle_axis", .op = "concat", .inputs = {F({2, 3, 4}), F({2, 1, 4})}, .attrs = Axis(-2)},
      {.label = "concat_one", .op = "concat", .inputs = {F({7})}, .attrs = Axis(0)},
      {.label = "concat_with_empty", .op = "concat", .inputs = {F({0, 3}), F({2, 3})}, .attrs = Axis(0)},
      {.label = "concat_i64", .op = "concat", .inputs = {I64({2}), I64({3})}, .attrs = Axis(0), .fills = {Indices(9), Indices(9)}},
      {.label = "split_last_axis", .op = "split", .inputs = {F({7, 13})}, .attrs = SplitAttrs(1, {3, 10})},
      {.label = "split_middle_axis", .op = "split", .inputs = {F({2, 7, 3})}, .attrs = SplitAttrs(-2, {1, 2, 4})},
      {.label = "split_zero_piece", .op = "split", .inputs = {F({3, 13})}, .attrs = SplitAttrs(1, {0, 13})},
      {.label = "split_one_piece", .op = "split", .inputs = {F({3, 13})}, .attrs = SplitAttrs(0, {3})},
      {.label = "split_view_first_axis", .op = "split_view", .single_kernel = true, .inputs = {F({7, 13})}, .attrs = SplitAttrs(0, {2, 5})},
      {.label = "split_view_after_one", .op = "split_view", .single_kernel = true, .inputs = {F({1, 33})}, .attrs = SplitAttrs(1, {13, 7, 13})},
      // Mixed precision (op_harness.h): bf16 moved as it is, the twin's values exactly; gradients
      // f32 (the zeros a slice's gradient pads with too), the twin's exactly.
      {.label = "slice_bf16", .op = "slice", .inputs = {F({3, 7, 13})}, .attrs = SliceAttrs(-1, 4, 9), .bf16 = true, .bf16_inputs = {0}, .bf16_tolerance = 0, .bf16_grad_tolerance = 0},
      {.label = "slice_view_bf16", .op = "slice_view", .single_kernel = true, .inputs = {F({7, 13})}, .attrs = SliceAttrs(0, 2, 5), .bf16 = true, .bf16_inputs = {0}, .bf16_tolerance = 0, .bf16_grad_tolerance = 0},
      {.label = "split_bf16", .op = "split", .inputs = {F({2, 7, 12})}, .attrs = SplitAttrs(2, {4, 4, 4}), .bf16 = true, .bf16_inputs = {0}, .bf16_tolerance = 0, .bf16_grad_tolerance = 0},
      {.label = "split_view_bf16", .op = "split_view", .single_kernel = true, .inputs = {F({1, 33})}, .attrs = SplitAttrs(1, {13, 20}), .bf16 = true, .bf16_inputs = {0}, .bf16_tolerance = 0, .bf16_grad_tolerance = 0},
      {.label = "concat_bf16", .op = "concat", .inputs = {F({2, 3, 4}), F({2, 3, 5})}, .attrs = Axis(-1), .bf16 = true, .bf16_inputs = {0, 1}, .bf16_tolerance = 0, .bf16_grad_tolerance = 0},
  };
}
// clang-format on

namespace {

// clang-format off
std::vector<OpErrorCase> ShapeErrors() {
  return {
      {.label = "reshape_count", .op = "reshape", .inputs = {F({2, 3})}, .attrs = {{"shape", Ints{4}}}},
      {.label = "transpose_axis", .op = "transpose", .inputs = {F({2, 3})}, .attrs = {{"dim0", int64_t{0}}, {"dim1", int64_t{2}}}},
      {.label = "permute_repeat", .op = "permute", .inputs = {F({2, 3})}, .attrs = Order({0, 0})},
      {.label = "permute_rank", .op = "permute", .inputs = {F({2, 3})}, .attrs = Order({0})},
      {.label = "permute_axis", .op = "permute", .inputs = {F({2, 3})}, .attrs = Order({0, 2})},
      {.label = "slice_past_end", .op = "slice", .inputs = {F({7, 13})}, .attrs = SliceAttrs(1, 3, 14)},
      {.label = "slice_backwards", .op = "slice", .inputs = {F({7, 13})}, .attrs = SliceAttrs(1, 5, 4)},
      {.label = "slice_negative_start", .op = "slice", .inputs = {F({7, 13})}, .attrs = SliceAttrs(1, -1, 4)},
      {.label = "slice_axis", .op = "slice", .inputs = {F({7, 13})}, .attrs = SliceAttrs(2, 0, 1)},
      {.label = "slice_missing_end", .op = "slice", .inputs = {F({7})}, .attrs = {{"axis", int64_t{0}}, {"start", int64_t{0}}}},
      {.label = "slice_view_not_contiguous", .op = "slice_view", .inputs = {F({2, 7})}, .attrs = SliceAttrs(1, 0, 3)},
      {.label = "concat_rank", .op = "concat", .inputs = {F({2, 3}), F({3})}, .attrs = Axis(0)},
      {.label = "concat_other_axis", .op = "concat", .inputs = {F({2, 3}), F({3, 3})}, .attrs = Axis(1)},
      {.label = "concat_dtype", .op = "concat", .inputs = {F({2}), {DType::kF64, Shape{3}}}, .attrs = Axis(0)},
      {.label = "concat_axis", .op = "concat", .inputs = {F({2}), F({3})}, .attrs = Axis(1)},
      {.label = "concat_no_inputs", .op = "concat", .inputs = {}, .attrs = Axis(0)},
      {.label = "split_sum", .op = "split", .inputs = {F({7})}, .attrs = SplitAttrs(0, {3, 3})},
      {.label = "split_negative", .op = "split", .inputs = {F({7})}, .attrs = SplitAttrs(0, {-1, 8})},
      {.label = "split_no_sizes", .op = "split", .inputs = {F({7})}, .attrs = SplitAttrs(0, {})},
      {.label = "split_axis", .op = "split", .inputs = {F({7})}, .attrs = SplitAttrs(-2, {7})},
      {.label = "split_view_not_contiguous", .op = "split_view", .inputs = {F({2, 6})}, .attrs = SplitAttrs(1, {3, 3})},
  };
}
// clang-format on

INSTANTIATE_TEST_SUITE_P(Shape, OpHarness, ::testing::ValuesIn(ShapeCases()), CaseName());
INSTANTIATE_TEST_SUITE_P(Shape, OpErrors, ::testing::ValuesIn(ShapeErrors()), CaseName());

const std::string& OpOf(Var v) {
  return v.builder()->program().instructions()[v.value().producer].op->name;
}

TEST(ShapeBuilder, SliceAndSplitAreViewsOnlyWhenContiguous) {
  Builder b("views");
  Var x = b.Input("x", DType::kF32, {4, 6});
  Var row = b.Input("row", DType::kF32, {1, 6});
  EXPECT_EQ(OpOf(Slice(x, 0, 1, 3)), "slice_view");
  EXPECT_EQ(OpOf(Slice(x, 1, 1, 3)), "slice");
  EXPECT_EQ(OpOf(Slice(row, -1, 1, 3)), "slice_view");
  EXPECT_EQ(OpOf(Split(x, 0, {1, 3})[0]), "split_view");
  EXPECT_EQ(OpOf(Split(x, -1, {2, 4})[1]), "split");
  EXPECT_THROW(Slice(x, 2, 0, 1), ShapeError);
}

TEST(ShapeBuilder, ViewOpsShareTheInputStorage) {
  Builder b("views");
  Var x = b.Input("x", DType::kF32, {4, 3});
  b.Output(b.Name(Slice(x, 0, 1, 3), "rows"));
  std::vector<Var> parts = Split(x, 0, {1, 3});
  b.Output(b.Name(parts[1], "tail"));
  Program p = b.Build();
  Scope scope;
  std::vector<float> values(12);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i);
  scope.Set("x", Tensor::FromVector<float>({4, 3}, values));
  RunReference(p, scope);
  const Tensor& rows = scope.Get("rows");
  const Tensor& tail = scope.Get("tail");
  EXPECT_EQ(rows.storage(), scope.Get("x").storage());
  EXPECT_EQ(tail.storage(), scope.Get("x").storage());
  EXPECT_TRUE(rows.is_contiguous());
  EXPECT_EQ(rows.At({0, 0}), 3.0);   // x[1, 0]
  EXPECT_EQ(tail.At({2, 2}), 11.0);  // x[3, 2]
}

// Split's gradient joins the output gradients, with zeros where an output has none.
TEST(ShapeAutodiff, SplitGradientFillsUnusedPiecesWithZeros) {
  Builder b("split");
  Var x = b.Input("x", DType::kF64, {2, 5});
  std::vector<Var> parts = Split(x, 1, {2, 3});
  b.Output(b.Name(Sum(parts[1]), "loss"));
  Program p = b.Build();
  Backward bwd = BuildBackward(p, {.loss = "loss", .wrt = {"x"}});
  Scope scope;
  scope.Set("x", Tensor::Full({2, 5}, 0.5, DType::kF64));
  RunReference(p, scope);
  RunReference(bwd.program, scope);
  const Tensor& dx = scope.Get("x.grad");
  for (int64_t i = 0; i < 2; ++i) {
    for (int64_t j = 0; j < 5; ++j) EXPECT_EQ(dx.At({i, j}), j < 2 ? 0.0 : 1.0) << i << ", " << j;
  }
}

}  // namespace
}  // namespace sluice::testing
