// bf16 in the program text (ir/text_format.h) and the verifier's dtype rules for mixed precision:
// bf16 values declare, print and parse back; a product of bf16 operands is f32; an op without a
// bf16 kernel is refused at parse time with the op and the place named. Kernels and gradients of
// each op under bf16 are the op tables' mixed cases (op_harness.h).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "sluice/core/error.h"
#include "sluice/exec/reference_runner.h"
#include "sluice/ir/builder.h"
#include "sluice/ir/ops.h"
#include "sluice/ir/program.h"
#include "sluice/ir/text_format.h"

namespace sluice {
namespace {

constexpr const char* kMixed = R"(program mixed {
  input %x: f32[4, 8]
  param %w: f32[8, 3]
  param %b: f32[3]
  %x16: bf16[4, 8] = cast(%x) {dtype = "bf16"}
  %w16: bf16[8, 3] = cast(%w) {dtype = "bf16"}
  %y: f32[4, 3] = linear(%x16, %w16, %b)
  %z: f32[4, 8] = cast(%x16) {dtype = "f32"}
  output %y
  output %z
}
)";

TEST(MixedPrecisionText, Bf16ValuesParsePrintAndParseBack) {
  const Program p = ParseProgram(kMixed, "mixed.sluice");
  const std::string printed = PrintProgram(p);
  EXPECT_NE(printed.find("bf16[4, 8]"), std::string::npos) << printed;
  EXPECT_EQ(PrintProgram(ParseProgram(printed, "printed.sluice")), printed);
}

TEST(MixedPrecisionText, RunsAndRoundsThroughBf16) {
  const Program p = ParseProgram(kMixed, "mixed.sluice");
  Scope scope;
  Tensor x = Tensor::Empty({4, 8}, DType::kF32), w = Tensor::Empty({8, 3}, DType::kF32),
         b = Tensor::Empty({3}, DType::kF32);
  for (int64_t i = 0; i < x.numel(); ++i) x.FlatSet(i, 1.0 + 1.0 / 1024 * i);  // 1 + i/1024
  for (int64_t i = 0; i < w.numel(); ++i) w.FlatSet(i, 0.25);
  for (int64_t i = 0; i < b.numel(); ++i) b.FlatSet(i, 0.5);
  scope.Set("x", x);
  scope.Set("w", w);
  scope.Set("b", b);
  RunReference(p, scope);
  const Tensor& z = scope.Get("z");
  // bf16's ulp at 1 is 2^-7 = 8/1024: 1 + 1/1024 rounds down to 1; 1 + 4/1024 is a tie between
  // 1 (even) and 1 + 8/1024 (odd): 1; 1 + 12/1024 a tie between 1 + 8/1024 (odd) and
  // 1 + 16/1024 (even): up.
  EXPECT_EQ(z.FlatAt(1), 1.0);
  EXPECT_EQ(z.FlatAt(4), 1.0);
  EXPECT_EQ(z.FlatAt(12), 1.0 + 16.0 / 1024);
  // y = Σ_k x16[i, k] · 0.25 + 0.5, exactly representable here.
  double want = 0.5;
  for (int64_t k = 0; k < 8; ++k) want += z.FlatAt(k) * 0.25;
  EXPECT_EQ(scope.Get("y").FlatAt(0), want);
}

// The linear's VJP under bf16 rounds dy and sums it in one pass (cast_bf16_and_sum): the bits of
// the cast and sum_to it replaces, with the fast kernels (columns past the parallel chunks' first,
// a tail of scalar columns, rows past the prefetch distance) and the reference ones.
TEST(CastBf16AndSum, IsBitwiseCastAndSumTo) {
  const Shape s{3, 37, 200};
  Builder b("fused_and_apart");
  Var dy = b.Input("dy", DType::kF32, s);
  std::vector<Var> fused = CastBf16AndSum(dy);
  b.Output(b.Name(fused[0], "y_fused"));
  b.Output(b.Name(fused[1], "sum_fused"));
  b.Output(b.Name(Cast(dy, DType::kBF16), "y"));
  b.Output(b.Name(SumTo(dy, Shape{200}), "sum"));
  const Program p = b.Build();
  Tensor x = Tensor::Empty(s, DType::kF32);
  for (int64_t i = 0; i < x.numel(); ++i)
    x.FlatSet(i, std::sin(0.37 * static_cast<double>(i)) * 1e3);
  for (const bool reference : {false, true}) {
    Scope scope;
    scope.Set("dy", x);
    RunReference(p, scope, DefaultAllocator(), reference);
    for (const auto& [fused_name, name] : {std::pair{"y_fused", "y"}, {"sum_fused", "sum"}}) {
      const Tensor &f = scope.Get(fused_name), &want = scope.Get(name);
      ASSERT_EQ(f.dtype(), want.dtype());
      ASSERT_EQ(f.nbytes(), want.nbytes());
      EXPECT_EQ(std::memcmp(f.raw_data(), want.raw_data(), f.nbytes()), 0)
          << name << (reference ? " (reference kernels)" : " (fast kernels)");
    }
  }
}

// A linear storing its result bf16 (dtype = "bf16", autocast's fusion of linear and cast) gives
// the bits of the linear then the cast, with k within one block of the packed engine's k (the
// rounding in its register tiles) and past it (the f32 result through the scratch), partial
// tiles of rows and columns, fast and reference kernels; and so does one whose f32 weight it
// rounds as it loads it (round_w) beside the weight's cast.
TEST(LinearRoundedToBf16, IsBitwiseLinearThenCast) {
  for (const int64_t k : {100, 300}) {
    const std::string ks = std::to_string(k);
    const Program p = ParseProgram(R"(program rounded {
  input %x: bf16[3, 37, )" + ks + R"(]
  input %w32: f32[)" + ks + R"(, 70]
  input %b: f32[70]
  %w: bf16[)" + ks + R"(, 70] = cast(%w32) {dtype = "bf16"}
  %y32: f32[3, 37, 70] = linear(%x, %w, %b)
  %y: bf16[3, 37, 70] = cast(%y32) {dtype = "bf16"}
  %fused: bf16[3, 37, 70] = linear(%x, %w, %b) {dtype = "bf16"}
  %fused_w: bf16[3, 37, 70] = linear(%x, %w32, %b) {dtype = "bf16", round_w = true}
  output %y
  output %fused
  output %fused_w
}
)",
                                   "rounded.sluice");
    Tensor x = Tensor::Empty({3, 37, k}, DType::kBF16), w = Tensor::Empty({k, 70}, DType::kF32),
           b = Tensor::Empty({70}, DType::kF32);
    for (int64_t i = 0; i < x.numel(); ++i) x.FlatSet(i, std::sin(0.37 * static_cast<double>(i)));
    for (int64_t i = 0; i < w.numel(); ++i) w.FlatSet(i, std::cos(0.11 * static_cast<double>(i)));
    for (int64_t i = 0; i < b.numel(); ++i) b.FlatSet(i, 0.1 * static_cast<double>(i));
    for (const bool reference : {false, true}) {
      Scope scope;
      scope.Set("x", x);
      scope.Set("w32", w);
      scope.Set("b", b);
      RunReference(p, scope, DefaultAllocator(), reference);
      const Tensor& want = scope.Get("y");
      for (const char* name : {"fused", "fused_w"}) {
        const Tensor& fused = scope.Get(name);
        ASSERT_EQ(fused.dtype(), DType::kBF16);
        ASSERT_EQ(fused.nbytes(), want.nbytes());
        EXPECT_EQ(std::memcmp(fused.raw_data(), want.raw_data(), want.nbytes()), 0)
            << name << " k " << k << (reference ? " (reference kernels)" : " (fast kernels)");
      }
    }
  }
}

TEST(LinearRoundedToBf16, NeedsBf16OperandsAndNamesTheDtype) {
  for (const auto& [body, what] :
       {std::pair{"%r: bf16[4, 3] = linear(%x, %w, %b) {dtype = \"bf16\"}", "bf16 x and w"},
        {"%r: bf16[4, 3] = linear(%x16, %w16, %b) {dtype = \"f16\"}", "\"f16\""}}) {
    std::string text = kMixed;
    text.replace(text.find("  %z: f32[4, 8] = cast(%x16)"), 0, std::string("  ") + body + "\n");
    try {
      ParseProgram(text, "mixed.sluice");
      ADD_FAILURE() << body << " was accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("mixed.sluice:8"), std::string::npos) << e.what();
    }
  }
}

TEST(MixedPrecisionText, AProductDeclaredBf16IsAnErrorAtItsLine) {
  std::string text = kMixed;
  text.replace(text.find("%y: f32[4, 3]"), 13, "%y: bf16[4, 3]");
  try {
    ParseProgram(text, "mixed.sluice");
    FAIL() << "a linear of bf16 operands gives f32";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("mixed.sluice:7"), std::string::npos) << what;
    EXPECT_NE(what.find("f32[4, 3]"), std::string::npos) << what;
  }
}

TEST(MixedPrecisionText, AnOpWithoutBf16KernelsIsNamed) {
  std::string text = kMixed;
  text.replace(text.find("  %z: f32[4, 8] = cast(%x16)"), 0, "  %g: bf16[4, 8] = tanh(%x16)\n");
  try {
    ParseProgram(text, "mixed.sluice");
    FAIL() << "tanh has no bf16 kernel";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("tanh"), std::string::npos) << what;
    EXPECT_NE(what.find("bf16"), std::string::npos) << what;
    EXPECT_NE(what.find("mixed.sluice:8"), std::string::npos) << what;
  }
}

}  // namespace
}  // namespace sluice
