// Program: declarations, duplicate names, FreshName, Rename, instruction errors that name the op
// and the values, and that a failed AddInstruction leaves the program unchanged.
#include "sluice/ir/program.h"

#include <limits>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sluice/core/error.h"
#include "sluice/ir/builder.h"
#include "sluice/ir/ops.h"
#include "sluice/ir/verifier.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

const TensorType kF32x2x3{DType::kF32, Shape{2, 3}};
const TensorType kF32x3x4{DType::kF32, Shape{3, 4}};

// Runs `f`, expecting an exception of type E whose message contains every fragment.
template <typename E, typename F>
void ExpectError(F&& f, std::initializer_list<const char*> fragments) {
  try {
    f();
    FAIL() << "no exception";
  } catch (const E& e) {
    for (const char* fragment : fragments) EXPECT_THAT(e.what(), HasSubstr(fragment));
  }
}

TEST(Program, DeclarationsAreFoundByName) {
  Program p("net");
  ValueId x = p.AddInput("x", kF32x2x3);
  ValueId w = p.AddParam("w", kF32x3x4);
  ValueId y = p.AddInstruction("matmul", {x, w}, {}, {"y"})[0];
  p.AddOutput(y);
  EXPECT_EQ(p.Get("x"), x);
  EXPECT_EQ(p.Find("w"), w);
  EXPECT_EQ(p.Find("nope"), std::nullopt);
  EXPECT_EQ(p.type(y), (TensorType{DType::kF32, Shape{2, 4}}));
  EXPECT_EQ(p.value(y).kind, ValueKind::kIntermediate);
  EXPECT_EQ(p.value(y).producer, 0);
  EXPECT_EQ(p.value(x).kind, ValueKind::kInput);
  EXPECT_EQ(p.value(w).kind, ValueKind::kParam);
  EXPECT_EQ(p.Bytes(y), 2u * 4u * 4u);
  EXPECT_EQ(p.inputs(), std::vector<ValueId>{x});
  EXPECT_EQ(p.params(), std::vector<ValueId>{w});
}

TEST(Program, GetNamesTheMissingValueAndTheProgram) {
  Program p("net");
  ExpectError<ProgramError>([&] { p.Get("ghost"); }, {"'net'", "%ghost"});
}

TEST(Program, RejectsDuplicateDeclarations) {
  Program p("net");
  p.AddInput("x", kF32x2x3);
  ExpectError<ProgramError>([&] { p.AddInput("x", kF32x2x3); }, {"%x is defined twice"});
  ExpectError<ProgramError>([&] { p.AddParam("x", kF32x2x3); }, {"%x is defined twice"});
  ExpectError<ProgramError>([&] { p.AddInput("", kF32x2x3); }, {"needs a name"});
  EXPECT_EQ(p.values().size(), 1u);
}

TEST(Program, FailedInstructionLeavesTheProgramUnchanged) {
  Program p("net");
  ValueId x = p.AddInput("x", kF32x2x3);
  ExpectError<ProgramError>([&] { p.AddInstruction("copy", {x}, {}, {"x"}); },
                            {"copy %x", "defined twice"});
  ExpectError<ProgramError>(
      [&] {
        p.AddInstruction("split", {x},
                         {{"axis", int64_t{1}}, {"sizes", std::vector<int64_t>{1, 2}}}, {"a", "a"});
      },
      {"%a is defined twice"});
  EXPECT_EQ(p.values().size(), 1u);
  EXPECT_TRUE(p.instructions().empty());
  EXPECT_FALSE(p.Find("a").has_value());
}

TEST(Program, InstructionErrorsNameTheOpAndTheValues) {
  Program p("net");
  ValueId x = p.AddInput("x", kF32x2x3);
  ExpectError<ProgramError>([&] { p.AddInstruction("frobnicate", {x}, {}); },
                            {"unknown op 'frobnicate'"});
  ExpectError<ProgramError>([&] { p.AddInstruction("matmul", {x}, {}, {"y"}); },
                            {"matmul %y", "takes 2 inputs, got 1"});
  ExpectError<ProgramError>([&] { p.AddInstruction("copy", {42}, {}, {"y"}); },
                            {"copy %y", "undefined value"});
  ExpectError<ShapeError>(
      [&] {
        p.AddInstruction("matmul", {x, x}, {}, {"y"});
      },
      {"matmul %y(%x: f32[2, 3], %x: f32[2, 3])", "inner dimensions differ"});
  ExpectError<ProgramError>(
      [&] {
        p.AddInstruction("copy", {x}, {}, {"a", "b"});
      },
      {"produces 1 outputs but 2 names were given"});
  EXPECT_TRUE(p.instructions().empty());
}

// Regression: an attribute the op does not declare was accepted and ignored.
TEST(Program, AttributesTheOpDoesNotDeclareAreRefused) {
  Program p("net");
  ValueId x = p.AddInput("x", kF32x2x3);
  ExpectError<ProgramError>(
      [&] {
        p.AddInstruction("transpose", {x}, {{"dim0", int64_t{0}}, {"dim_1", int64_t{1}}}, {"t"});
      },
      {"transpose %t: transpose has no attribute 'dim_1' (did you mean 'dim1'?); its attributes "
       "are dim0, dim1"});
  ExpectError<ProgramError>(
      [&] {
        p.AddInstruction("copy", {x}, {{"eps", 1e-5}}, {"c"});
      },
      {"copy %c: copy takes no attributes, got 'eps'"});
  EXPECT_TRUE(p.instructions().empty());
  Builder b("built");
  Var m = b.Input("m", DType::kF32, {2, 2});
  EXPECT_THROW(b.Emit1("matmul", {m, m}, {{"tranpose_b", true}}), ProgramError);
  EXPECT_NO_THROW(b.Emit1("matmul", {m, m}, {{"transpose_b", true}}));
}

TEST(Program, FreshNamesCountPerHintAndSkipTakenNames) {
  Program p("net");
  p.AddInput("matmul_1", kF32x2x3);
  EXPECT_EQ(p.FreshName("matmul"), "matmul_0");
  EXPECT_EQ(p.FreshName("matmul"), "matmul_2");  // matmul_1 is taken
  EXPECT_EQ(p.FreshName("add"), "add_0");
  ValueId x = p.Get("matmul_1");
  // Unnamed outputs get fresh names from the op's name.
  EXPECT_EQ(p.value(p.AddInstruction("copy", {x}, {})[0]).name, "copy_0");
  EXPECT_EQ(p.value(p.AddInstruction("copy", {x}, {})[0]).name, "copy_1");
}

TEST(Program, RenameMovesTheNameAndRefusesTakenOnes) {
  Program p("net");
  ValueId x = p.AddInput("x", kF32x2x3);
  ValueId y = p.AddInstruction("copy", {x}, {})[0];
  p.Rename(y, "h.0.attn.out");
  EXPECT_EQ(p.value(y).name, "h.0.attn.out");
  EXPECT_EQ(p.Get("h.0.attn.out"), y);
  EXPECT_FALSE(p.Find("copy_0").has_value());
  p.Rename(y, "h.0.attn.out");  // renaming to its own name is a no-op
  EXPECT_EQ(p.Get("h.0.attn.out"), y);
  ExpectError<ProgramError>([&] { p.Rename(y, "x"); },
                            {"cannot rename %h.0.attn.out to %x", "taken"});
  EXPECT_EQ(p.value(y).name, "h.0.attn.out");
  // The old name is free again.
  EXPECT_EQ(p.value(p.AddInstruction("copy", {x}, {}, {"copy_0"})[0]).name, "copy_0");
}

// The name index is an open-addressing table whose removals shift later entries back: after
// thousands of renames in every order (so that removals land inside long probe runs), every
// current name is found, every old one is gone.
TEST(Program, ManyRenamesKeepEveryNameFindable) {
  constexpr int kValues = 3000;
  Program p("net");
  for (int i = 0; i < kValues; ++i) p.AddInput(fmt::format("v{}", i), kF32x2x3);
  for (int round = 0; round < 3; ++round) {
    for (int k = 0; k < kValues; ++k) {
      const ValueId id = static_cast<ValueId>((k * 7 + round * 13) % kValues);
      p.Rename(id, fmt::format("r{}.{}", round, id));
    }
    for (ValueId id = 0; id < kValues; ++id) {
      ASSERT_EQ(p.Find(fmt::format("r{}.{}", round, id)), id) << "round " << round;
      ASSERT_FALSE(p.Find(fmt::format("v{}", id)).has_value());
      if (round > 0) {
        ASSERT_FALSE(p.Find(fmt::format("r{}.{}", round - 1, id)).has_value());
      }
    }
  }
  EXPECT_EQ(p.values().size(), static_cast<size_t>(kValues));
}

// FreshName skips names reserved for another program's values, whatever their number.
TEST(Program, FreshNamesAvoidReservedNames) {
  Program p("bwd");
  p.ReserveName("add_0");
  p.ReserveName("add_2");
  p.ReserveName("h.0.weight");  // not a name FreshName makes; nothing to avoid
  EXPECT_EQ(p.FreshName("add"), "add_1");
  EXPECT_EQ(p.FreshName("add"), "add_3");
}

// Reserved names are kept once each, however often they are reserved, and many of them stay
// findable as the set grows.
TEST(Program, ManyReservedNamesAreAllAvoided) {
  Program p("bwd");
  for (int round = 0; round < 2; ++round) {
    for (int i = 0; i < 5000; i += 2) p.ReserveName(fmt::format("mul_{}", i));
  }
  for (int i = 1; i < 5000; i += 2) EXPECT_EQ(p.FreshName("mul"), fmt::format("mul_{}", i));
  EXPECT_EQ(p.FreshName("mul"), "mul_5000");
}

// An instruction with thousands of outputs is checked for repeated names in one pass: the first
// repeated name is the one reported, and the program is left unchanged.
TEST(Program, RepeatedNamesAmongManyOutputsAreFound) {
  Program p("net");
  ValueId x = p.AddInput("x", {DType::kF32, Shape{1, 4000}});
  std::vector<std::string> names;
  for (int i = 0; i < 4000; ++i) names.push_back(fmt::format("part{}", i));
  names[3999] = "part7";
  const Attrs split{{"axis", int64_t{1}}, {"sizes", std::vector<int64_t>(4000, 1)}};
  ExpectError<ProgramError>([&] { p.AddInstruction("split", {x}, split, names); },
                            {"split %part0: value %part7 is defined twice"});
  EXPECT_EQ(p.values().size(), 1u);
  names[3999] = "part3999";
  EXPECT_EQ(p.AddInstruction("split", {x}, split, names).size(), 4000u);
}

// Instructions with the same attributes share one block of them; a copy changed by Set is its own.
TEST(Program, EqualAttributesAreStoredOnce) {
  Program p("net");
  ValueId x = p.AddInput("x", {DType::kF32, Shape{2, 3}});
  const double nan = std::numeric_limits<double>::quiet_NaN();
  ValueId a = p.AddInstruction("scale", {x}, {{"factor", 0.5}}, {"a"})[0];
  p.AddInstruction("scale", {a}, {{"factor", 0.5}}, {"b"});
  p.AddInstruction("scale", {a}, {{"factor", 2.0}}, {"c"});
  p.AddInstruction("scale", {a}, {{"factor", nan}}, {"d"});
  p.AddInstruction("scale", {a}, {{"factor", nan}}, {"e"});
  const auto& ins = p.instructions();
  EXPECT_TRUE(ins[0].attrs.SharesItemsWith(ins[1].attrs));
  EXPECT_FALSE(ins[0].attrs.SharesItemsWith(ins[2].attrs));
  EXPECT_TRUE(ins[3].attrs.SharesItemsWith(ins[4].attrs));  // NaN is identical to itself
  Attrs changed = ins[1].attrs;
  changed.Set("factor", 3.0);
  EXPECT_EQ(ins[1].attrs.GetFloat("factor"), 0.5);
  EXPECT_EQ(ins[0].attrs.GetFloat("factor"), 0.5);
  EXPECT_EQ(changed.GetFloat("factor"), 3.0);
}

// Verify runs once per program state: VerifyOnce marks a program that passes, and any change
// clears the mark, so that the next VerifyOnce checks again.
TEST(Program, VerifiedUntilChanged) {
  Program p("net");
  ValueId x = p.AddInput("x", kF32x2x3);
  EXPECT_FALSE(p.verified());
  VerifyOnce(p);
  EXPECT_TRUE(p.verified());
  Program copy = p;
  EXPECT_TRUE(copy.verified());
  ValueId y = p.AddInstruction("copy", {x}, {}, {"y"})[0];
  EXPECT_FALSE(p.verified());
  VerifyOnce(p);
  p.AddOutput(y);
  EXPECT_FALSE(p.verified());
  VerifyOnce(p);
  p.Rename(y, "z");
  EXPECT_FALSE(p.verified());
  VerifyOnce(p);
  p.AddParam("w", kF32x3x4);
  EXPECT_FALSE(p.verified());
  Builder b("built");
  b.Output(b.Name(Copy(b.Input("x", DType::kF32, {4})), "y"));
  EXPECT_TRUE(b.Build().verified());
}

TEST(Program, OutputsKeepOrderAndAreListedOnce) {
  Program p("net");
  ValueId a = p.AddInput("a", kF32x2x3);
  ValueId b = p.AddInput("b", kF32x2x3);
  p.AddOutput(b);
  p.AddOutput(a);
  p.AddOutput(b);
  EXPECT_EQ(p.outputs(), (std::vector<ValueId>{b, a}));
}

}  // namespace
}  // namespace sluice
