// Op table: convolution and pooling (conv2d, max_pool2d, avg_pool2d and their gradients), plus
// their values and gradients against PyTorch's (tests/ops/data/conv_reference.json, written by
// tests/parity/conv_reference.py): strides, padding, a 1x1 filter, groups (depthwise, also on
// oneDNN in f32) and dilation, and max-pooling windows with ties (PyTorch's gradient goes to the
// first largest element).
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "op_harness.h"
#include "sluice/autodiff/autodiff.h"
#include "sluice/exec/reference_runner.h"
#include "sluice/ir/ops.h"
#include "torch_reference.h"

namespace sluice::testing {

std::vector<OpCase> ConvCases() {
  using Ints = std::vector<int64_t>;
  const Attrs same{{"stride", Ints{1, 1}}, {"padding", Ints{1, 1}}};
  const Attrs strided{{"stride", Ints{2, 3}}, {"padding", Ints{1, 0}}};
  const Attrs pool{{"kernel", Ints{2, 2}}, {"stride", Ints{2, 2}}};
  const Attrs pool_padded{{"kernel", Ints{3, 3}}, {"stride", Ints{2, 1}}, {"padding", Ints{1, 1}}};
  return {
      {.label = "conv2d",
       .op = "conv2d",
       .inputs = {F({2, 3, 5, 4}), F({4, 3, 3, 3})},
       .attrs = same},
      {.label = "conv2d_strided",
       .op = "conv2d",
       .inputs = {F({2, 2, 7, 7}), F({3, 2, 3, 2})},
       .attrs = strided},
      {.label = "conv2d_default_attrs",
       .op = "conv2d",
       .inputs = {F({1, 2, 4, 4}), F({2, 2, 2, 2})}},
      {.label = "conv2d_grad_input",
       .op = "conv2d_grad_input",
       .inputs = {F({2, 3, 4, 2}), F({3, 2, 3, 2})},
       .attrs = {{"stride", Ints{2, 3}},
                 {"padding", Ints{1, 0}},
                 {"height", int64_t{7}},
                 {"width", int64_t{7}}}},
      {.label = "conv2d_grad_weight",
       .op = "conv2d_grad_weight",
       .inputs = {F({2, 3, 4, 2}), F({2, 2, 7, 7})},
       .attrs = {{"stride", Ints{2, 3}}, {"padding", Ints{1, 0}}, {"kernel", Ints{3, 2}}},
       .grad = false},
      // Groups and dilation, off oneDNN (f64, and these small f32 shapes whose oneDNN scratch
      // would outgrow their activations): im2col with a GEMM per group, and the direct depthwise
      // kernels (one input channel per group).
      {.label = "conv2d_grouped",
       .op = "conv2d",
       .inputs = {F({2, 4, 6, 5}), F({6, 2, 3, 3})},
       .attrs = {{"padding", Ints{1, 1}}, {"groups", int64_t{2}}}},
      {.label = "conv2d_depthwise_strided",
       .op = "conv2d",
       .inputs = {F({2, 3, 7, 6}), F({3, 1, 3, 3})},
       .attrs = {{"stride", Ints{2, 2}}, {"padding", Ints{1, 1}}, {"groups", int64_t{3}}}},
      {.label = "conv2d_depthwise_multiplier",  // two filters per input channel, dilated
       .op = "conv2d",
       .inputs = {F({1, 3, 7, 6}), F({6, 1, 3, 2})},
       .attrs = {{"stride", Ints{1, 2}},
                 {"padding", Ints{1, 0}},
                 {"dilation", Ints{2, 1}},
                 {"groups", int64_t{3}}}},
      {.label = "conv2d_grad_input_depthwise",
       .op = "conv2d_grad_input",
       .inputs = {F({2, 6, 4, 3}), F({6, 1, 3, 3})},
       .attrs = {{"stride", Ints{2, 2}},
                 {"padding", Ints{1, 1}},
                 {"dilation", Ints{1, 2}},
                 {"groups", int64_t{3}},
                 {"height", int64_t{8}},
                 {"width", int64_t{7}}}},
      {.label = "conv2d_grad_weight_depthwise",
       .op = "conv2d_grad_weight",
       .inputs = {F({2, 6, 4, 3}), F({2, 3, 8, 7})},
       .attrs = {{"stride", Ints{2, 2}},
                 {"padding", Ints{1, 1}},
                 {"dilation", Ints{1, 2}},
                 {"groups", int64_t{3}},
                 {"kernel", Ints{3, 3}}},
       .grad = false},
      {.label = "conv2d_dilated",
       .op = "conv2d",
       .inputs = {F({2, 2, 9, 8}), F({3, 2, 3, 2})},
       .attrs = {{"padding", Ints{2, 1}}, {"dilation", Ints{2, 3}}}},
      {.label = "conv2d_dilated_grouped_strided",
       .op = "conv2d",
       .inputs = {F({1, 4, 9, 10}), F({4, 2, 2, 3})},
       .attrs = {{"stride", Ints{2, 1}}, {"dilation", Ints{3, 2}}, {"groups", int64_t{2}}}},
      {.label = "conv2d_grad_input_grouped_dilated",  // nn.ConvTranspose2d's op
       .op = "conv2d_grad_input",
       .inputs = {F({2, 4, 4, 3}), F({4, 1, 3, 2})},
       .attrs = {{"stride", Ints{2, 2}},
                 {"padding", Ints{1, 0}},
                 {"dilation", Ints{1, 2}},
                 {"groups", int64_t{2}},
                 {"height", int64_t{8}},
                 {"width", int64_t{7}}}},
      {.label = "conv2d_grad_weight_grouped_dilated",
       .op = "conv2d_grad_weight",
       .inputs = {F({2, 4, 4, 3}), F({2, 2, 8, 7})},
       .attrs = {{"stride", Ints{2, 2}},
                 {"padding", Ints{1, 0}},
                 {"dilation", Ints{1, 2}},
                 {"groups", int64_t{2}},
                 {"kernel", Ints{3, 2}}},
       .grad = false},
      // f32 grouped and dilated convolutions on oneDNN: depthwise (oneDNN's depthwise kernels)
      // in chunks, grouped with dilation, and a dilated one of 16 channels; each pass.
      {.label = "conv2d_onednn_depthwise",
       .op = "conv2d",
       .inputs = {F({6, 32, 20, 18}), F({32, 1, 3, 3})},
       .attrs = {{"padding", Ints{1, 1}}, {"groups", int64_t{32}}},
       .grad = false},
      {.label = "conv2d_grad_input_onednn_depthwise",
       .op = "conv2d_grad_input",
       .inputs = {F({6, 32, 10, 9}), F({32, 1, 3, 3})},
       .attrs = {{"stride", Ints{2, 2}},
                 {"padding", Ints{1, 1}},
                 {"groups", int64_t{32}},
                 {"height", int64_t{20}},
                 {"width", int64_t{18}}},
       .grad = false},
      {.label = "conv2d_grad_weight_onednn_depthwise",
       .op = "conv2d_grad_weight",
       .inputs = {F({6, 32, 10, 9}), F({6, 32, 20, 18})},
       .attrs = {{"stride", Ints{2, 2}},
                 {"padding", Ints{1, 1}},
                 {"groups", int64_t{32}},
                 {"kernel", Ints{3, 3}}},
       .grad = false},
      {.label = "conv2d_grouped_1x1",  // ShuffleNet's pointwise group convolution
       .op = "conv2d",
       .inputs = {F({2, 8, 5, 5}), F({16, 2, 1, 1})},
       .attrs = {{"groups", int64_t{4}}}},
      {.label = "conv2d_onednn_grouped_dilated",
       .op = "conv2d",
       .inputs = {F({3, 16, 12, 12}), F({32, 4, 3, 3})},
       .attrs = {{"padding", Ints{2, 2}}, {"dilation", Ints{2, 2}}, {"groups", int64_t{4}}},
       .grad = false},
      {.label = "conv2d_grad_input_onednn_dilated",
       .op = "conv2d_grad_input",
       .inputs = {F({3, 16, 8, 10}), F({16, 16, 3, 3})},
       .attrs = {{"dilation", Ints{2, 1}}, {"height", int64_t{12}}, {"width", int64_t{12}}},
       .grad = false},
      {.label = "conv2d_grad_weight_onednn_dilated",
       .op = "conv2d_grad_weight",
       .inputs = {F({3, 16, 8, 10}), F({3, 16, 12, 12})},
       .attrs = {{"dilation", Ints{2, 1}}, {"kernel", Ints{3, 3}}},
       .grad = false},
      // f32 convolutions on oneDNN (kernels/onednn_conv.h: a window past 1x1, 16 channels or
      // more): one image a chunk (40x30 images), chunks of 4 and a remainder of 3 (strided, the
      // right padding short of the left), and a 5x3 window in one chunk. Their gradient rules are
      // the cases above' (f64, which runs im2col).
      {.label = "conv2d_onednn_chunks",
       .op = "conv2d",
       .inputs = {F({5, 16, 40, 30}), F({20, 16, 3, 3})},
       .attrs = same,
       .grad = false},
      {.label = "conv2d_onednn_strided",
       .op = "conv2d",
       .inputs = {F({7, 16, 33, 21}), F({16, 16, 3, 3})},
       .attrs = {{"stride", Ints{2, 2}}, {"padding", Ints{1, 0}}},
       .grad = false},
      {.label = "conv2d_onednn_cut",  // the last row and column of x in no window
       .op = "conv2d",
       .inputs = {F({3, 16, 8, 8}), F({16, 16, 3, 3})},
       .attrs = {{"stride", Ints{2, 2}}, {"padding", Ints{0, 0}}},
       .grad = false},
      {.label = "conv2d_grad_input_onednn_cut",
       .op = "conv2d_grad_input",
       .inputs = {F({3, 16, 3, 3}), F({16, 16, 3, 3})},
       .attrs = {{"stride", Ints{2, 2}},
                 {"padding", Ints{0, 0}},
                 {"height", int64_t{8}},
                 {"width", int64_t{8}}},
       .grad = false},
      {.label = "conv2d_grad_weight_onednn_cut",
       .op = "conv2d_grad_weight",
       .inputs = {F({3, 16, 3, 3}), F({3, 16, 8, 8})},
       .attrs = {{"stride", Ints{2, 2}}, {"padding", Ints{0, 0}}, {"kernel", Ints{3, 3}}},
       .grad = false},
      {.label = "conv2d_onednn_window",
       .op = "conv2d",
       .inputs = {F({2, 16, 12, 12}), F({24, 16, 5, 3})},
       .attrs = {{"stride", Ints{1, 1}}, {"padding", Ints{2, 1}}},
       .grad = false},
      {.label = "conv2d_grad_input_onednn",
       .op = "conv2d_grad_input",
       .inputs = {F({7, 16, 17, 10}), F({16, 16, 3, 3})},
       .attrs = {{"stride", Ints{2, 2}},
                 {"padding", Ints{1, 0}},
                 {"height", int64_t{33}},
                 {"width", int64_t{21}}},
       .grad = false},
      {.label = "conv2d_grad_input_onednn_chunks",
       .op = "conv2d_grad_input",
       .inputs = {F({5, 20, 40, 30}), F({20, 16, 3, 3})},
       .attrs = {{"stride", Ints{1, 1}},
                 {"padding", Ints{1, 1}},
                 {"height", int64_t{40}},
                 {"width", int64_t{30}}},
       .grad = false},
      {.label = "conv2d_grad_weight_onednn",
       .op = "conv2d_grad_weight",
       .inputs = {F({7, 16, 17, 10}), F({7, 16, 33, 21})},
       .attrs = {{"stride", Ints{2, 2}}, {"padding", Ints{1, 0}}, {"kernel", Ints{3, 3}}},
       .grad = false},
      {.label = "conv2d_grad_weight_onednn_chunks",
       .op = "conv2d_grad_weight",
       .inputs = {F({5, 20, 40, 30}), F({5, 16, 40, 30})},
       .attrs = {{"stride", Ints{1, 1}}, {"padding", Ints{1, 1}}, {"kernel", Ints{3, 3}}},
       .grad = false},
      {.label = "max_pool2d", .op = "max_pool2d", .inputs = {F({2, 3, 6, 6})}, .attrs = pool},
      {.label = "max_pool2d_padded",
       .op = "max_pool2d",
       .inputs = {F({1, 2, 7, 5})},
       .attrs = pool_padded},
      {.label = "max_pool2d_grad",
       .op = "max_pool2d_grad",
       .inputs = {F({2, 3, 3, 3}), F({2, 3, 6, 6})},
       .attrs = pool,
       .grad = false},
      {.label = "avg_pool2d", .op = "avg_pool2d", .inputs = {F({2, 3, 6, 6})}, .attrs = pool},
      {.label = "avg_pool2d_padded",
       .op = "avg_pool2d",
       .inputs = {F({1, 2, 7, 5})},
       .attrs = pool_padded},
      {.label = "avg_pool2d_grad",
       .op = "avg_pool2d_grad",
       .inputs = {F({1, 2, 4, 5})},
       .attrs = {{"kernel", Ints{3, 3}},
                 {"stride", Ints{2, 1}},
                 {"padding", Ints{1, 1}},
                 {"height", int64_t{7}},
                 {"width", int64_t{5}}},
       .grad = false},
  };
}

namespace {

std::vector<OpErrorCase> ConvErrors() {
  using Ints = std::vector<int64_t>;
  return {
      {.label = "conv2d_not_images", .op = "conv2d", .inputs = {F({2, 3, 5}), F({4, 3, 3, 3})}},
      {.label = "conv2d_channels", .op = "conv2d", .inputs = {F({2, 3, 5, 5}), F({4, 2, 3, 3})}},
      {.label = "conv2d_too_large", .op = "conv2d", .inputs = {F({1, 1, 2, 2}), F({1, 1, 3, 3})}},
      {.label = "conv2d_stride_zero",
       .op = "conv2d",
       .inputs = {F({1, 1, 4, 4}), F({1, 1, 3, 3})},
       .attrs = {{"stride", Ints{0, 1}}}},
      {.label = "conv2d_padding_three",
       .op = "conv2d",
       .inputs = {F({1, 1, 4, 4}), F({1, 1, 3, 3})},
       .attrs = {{"padding", Ints{1, 1, 1}}}},
      {.label = "conv2d_groups_not_dividing",
       .op = "conv2d",
       .inputs = {F({1, 6, 5, 5}), F({4, 2, 3, 3})},
       .attrs = {{"groups", int64_t{4}}}},
      {.label = "conv2d_filters_not_per_group",
       .op = "conv2d",
       .inputs = {F({1, 6, 5, 5}), F({4, 6, 3, 3})},
       .attrs = {{"groups", int64_t{2}}}},
      {.label = "conv2d_groups_not_dividing_outputs",
       .op = "conv2d",
       .inputs = {F({1, 6, 5, 5}), F({4, 2, 3, 3})},
       .attrs = {{"groups", int64_t{3}}}},
      {.label = "conv2d_dilation_zero",
       .op = "conv2d",
       .inputs = {F({1, 1, 4, 4}), F({1, 1, 3, 3})},
       .attrs = {{"dilation", Ints{1, 0}}}},
      {.label = "conv2d_dilated_too_large",
       .op = "conv2d",
       .inputs = {F({1, 1, 4, 4}), F({1, 1, 3, 3})},
       .attrs = {{"dilation", Ints{2, 2}}}},
      {.label = "conv2d_grad_input_dy",
       .op = "conv2d_grad_input",
       .inputs = {F({1, 1, 3, 3}), F({1, 1, 3, 3})},
       .attrs = {{"height", int64_t{4}}, {"width", int64_t{4}}}},
      {.label = "max_pool2d_no_kernel", .op = "max_pool2d", .inputs = {F({1, 1, 4, 4})}},
      {.label = "max_pool2d_padding_past_half",
       .op = "max_pool2d",
       .inputs = {F({1, 1, 4, 4})},
       .attrs = {{"kernel", Ints{2, 2}}, {"stride", Ints{2, 2}}, {"padding", Ints{2, 0}}}},
      {.label = "avg_pool2d_grad_dy",
       .op = "avg_pool2d_grad",
       .inputs = {F({1, 1, 3, 3})},
       .attrs = {{"kernel", Ints{2, 2}},
                 {"stride", Ints{2, 2}},
                 {"height", int64_t{4}},
                 {"width", int64_t{4}}}},
  };
}

}  // namespace

INSTANTIATE_TEST_SUITE_P(Conv, OpHarness, ::testing::ValuesIn(ConvCases()), CaseName());
INSTANTIATE_TEST_SUITE_P(Conv, OpErrors, ::testing::ValuesIn(ConvErrors()), CaseName());

namespace {

Shape ShapeOf(const nlohmann::json& dims) {
  const std::vector<int64_t> v = dims.get<std::vector<int64_t>>();
  return Shape(std::span<const int64_t>(v));
}

std::array<int64_t, 2> PairOf(const nlohmann::json& v) {
  return {v.at(0).get<int64_t>(), v.at(1).get<int64_t>()};
}

// Each case of conv_reference.json in f64 and f32, fast and reference kernels: the output and the
// gradients autodiff gives (conv2d's of x and w, a pool's of x) against PyTorch's.
TEST(ConvParity, OutputsAndGradientsMatchPyTorch) {
  const nlohmann::json ref =
      LoadTorchReference("conv_reference.json", "tests/parity/conv_reference.py");
  ASSERT_FALSE(ref.at("cases").empty());
  for (const nlohmann::json& c : ref.at("cases")) {
    const std::string op = c.at("op").get<std::string>();
    const Shape x_shape = ShapeOf(c.at("x_shape")), y_shape = ShapeOf(c.at("y_shape"));
    for (const auto& [label, dtype, tolerance] :
         {std::tuple{"f64", DType::kF64, 1e-12}, std::tuple{"f32", DType::kF32, 2e-6}}) {
      Builder b(c.at("name").get<std::string>());
      Var x = b.Input("x", dtype, x_shape);
      std::vector<std::string> wrt = {"x"};
      Var y;
      if (op == "conv2d") {
        const ConvOptions options{.stride = PairOf(c.at("stride")),
                                  .padding = PairOf(c.at("padding")),
                                  .dilation = PairOf(c.at("dilation")),
                                  .groups = c.at("groups").get<int64_t>()};
        y = Conv2d(x, b.Input("w", dtype, ShapeOf(c.at("w_shape"))), options);
        wrt.push_back("w");
      } else {
        const auto pool = op == "max_pool2d" ? MaxPool2d : AvgPool2d;
        y = pool(x, PairOf(c.at("kernel")), PairOf(c.at("stride")), PairOf(c.at("padding")));
      }
      b.Output(b.Name(y, "y"));
      const Program forward = b.Build();
      const Backward backward = BuildBackward(forward, {.seeds = {"y"}, .wrt = wrt});
      for (bool reference_kernels : {false, true}) {
        SCOPED_TRACE(fmt::format("{} {} {} kernels", c.at("name").get<std::string>(), label,
                                 reference_kernels ? "reference" : "fast"));
        Scope scope;
        scope.Set("x", TensorFromJson(c.at("x"), x_shape, dtype));
        if (op == "conv2d")
          scope.Set("w", TensorFromJson(c.at("w"), ShapeOf(c.at("w_shape")), dtype));
        RunReference(forward, scope, DefaultAllocator(), reference_kernels, backward.saved);
        scope.Set("y.grad", TensorFromJson(c.at("dy"), y_shape, dtype));
        RunReference(backward.program, scope, DefaultAllocator(), reference_kernels);
        EXPECT_LE(RelativeErrorToTorch(scope.Get("y"), c.at("y")), tolerance) << "y";
        EXPECT_LE(RelativeErrorToTorch(scope.Get("x.grad"), c.at("dx")), tolerance) << "dx";
        if (op == "conv2d") {
          EXPECT_LE(RelativeErrorToTorch(scope.Get("w.grad"), c.at("dw")), tolerance) << "dw";
        }
      }
    }
  }
}

}  // namespace
}  // namespace sluice::testing
