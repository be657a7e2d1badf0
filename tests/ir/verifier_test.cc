// Verifier: every defect it checks for is reported with the program, the instruction (index, op,
// first output) and the value concerned.
//
// The Program API checks as it builds, so it cannot make most malformed programs; passes that edit
// programs in place could. These tests make the defects by editing a program's containers
// directly (Edit below), which is what such a faulty pass would do.
#include "sluice/ir/verifier.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sluice/core/error.h"
#include "sluice/ir/ops.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

// Write access to a program's internals, as a buggy pass would have it.
struct Edit {
  Program& p;
  std::vector<Instruction>& instructions() {
    return const_cast<std::vector<Instruction>&>(p.instructions());
  }
  std::vector<Value>& values() { return const_cast<std::vector<Value>&>(p.values()); }
};

// x [2, 3] -> %a = copy(x) -> %b = copy(%a) -> %y = matmul(%b, w [3, 4]); output %y.
Program Chain() {
  Program p("net");
  ValueId x = p.AddInput("x", {DType::kF32, Shape{2, 3}});
  ValueId w = p.AddParam("w", {DType::kF32, Shape{3, 4}});
  ValueId a = p.AddInstruction("copy", {x}, {}, {"a"})[0];
  ValueId b = p.AddInstruction("copy", {a}, {}, {"b"})[0];
  p.AddOutput(p.AddInstruction("matmul", {b, w}, {}, {"y"})[0]);
  return p;
}

std::string VerifyError(const Program& p) {
  try {
    Verify(p);
  } catch (const ProgramError& e) {
    return e.what();
  }
  ADD_FAILURE() << "Verify accepted the program";
  return "";
}

TEST(Verifier, AcceptsWellFormedPrograms) {
  EXPECT_NO_THROW(Verify(Chain()));
  Builder b("built");
  Var x = b.Input("x", DType::kF32, {4, 8});
  Var w = b.Param("w", DType::kF32, {8, 2});
  b.Output(b.Name(MatMul(x, w), "y"));
  EXPECT_NO_THROW(b.Build());  // Build verifies
  EXPECT_NO_THROW(Verify(Program("empty")));
}

TEST(Verifier, AttributesTheOpDoesNotDeclareAreNamed) {
  Program p = Chain();
  Edit{p}.instructions()[2].attrs.Set("transpose_c", true);
  EXPECT_THAT(
      VerifyError(p),
      ::testing::AllOf(HasSubstr("program 'net', instruction 2 (matmul %y)"),
                       HasSubstr("matmul has no attribute 'transpose_c' (did you mean "
                                 "'transpose_a'?); its attributes are transpose_a, transpose_b")));
}

TEST(Verifier, AnInPlaceUpdateOfAConstantIsNamed) {
  Program p("opt");
  const ValueId w = p.AddParam("w", {DType::kF32, Shape{4}});
  const ValueId g = p.AddInput("rope_cos.grad", {DType::kF32, Shape{4}});
  const ValueId buf = p.AddParam("buf", {DType::kF32, Shape{4}});
  const ValueId lr = p.AddInput("lr", {DType::kF32, Shape{}});
  p.AddInstruction("sgd_update", {w, g, buf, lr}, {{"momentum", 0.0}, {"weight_decay", 0.0}});
  // AddInstruction refuses the update of a constant; a faulty pass could still make one.
  EXPECT_THROW(
      p.AddInstruction("sgd_update", {p.AddConst("c", {DType::kF32, Shape{4}}), g, buf, lr},
                       {{"momentum", 0.0}, {"weight_decay", 0.0}}),
      ProgramError);
  const ValueId c = p.AddConst("rope_cos", {DType::kF32, Shape{4}});
  Edit{p}.instructions()[0].inputs[0] = c;
  EXPECT_THAT(VerifyError(p), HasSubstr("instruction 0 (sgd_update -): %rope_cos is a constant, "
                                        "and sgd_update updates its inputs in place"));
}

TEST(Verifier, UseBeforeDefinitionNamesTheInstructionAndTheValue) {
  Program p = Chain();
  std::swap(Edit{p}.instructions()[0], Edit{p}.instructions()[1]);
  EXPECT_THAT(VerifyError(p),
              HasSubstr("program 'net', instruction 0 (copy %b): %a is used before it is defined"));
}

TEST(Verifier, DeclaredTypeDifferentFromInferenceNamesBothTypes) {
  Program p = Chain();
  Edit{p}.values()[p.Get("y")].type_id = p.InternType({DType::kF64, Shape{2, 4}});
  EXPECT_THAT(VerifyError(p),
              HasSubstr("instruction 2 (matmul %y): %y is declared f64[2, 4] but the op "
                        "gives f32[2, 4]"));
}

TEST(Verifier, WrongArityNamesTheOp) {
  Program p = Chain();
  Edit{p}.instructions()[2].inputs.pop_back();
  EXPECT_THAT(VerifyError(p), HasSubstr("instruction 2 (matmul %y): takes 2 inputs, has 1"));
}

TEST(Verifier, ValueDefinedTwiceIsNamed) {
  Program p = Chain();
  Edit{p}.instructions()[1].outputs =
      Edit{p}.instructions()[0].outputs;  // copy(%a) now "defines" %a
  EXPECT_THAT(VerifyError(p), HasSubstr("instruction 1 (copy %a): %a is defined twice"));
}

TEST(Verifier, InputDeclaredAsAnOutputOfAnInstructionIsDefinedTwice) {
  Program p = Chain();
  Edit{p}.instructions()[0].outputs = {p.Get("x")};
  Edit{p}.values()[p.Get("x")].producer = 0;
  EXPECT_THAT(VerifyError(p), HasSubstr("instruction 0 (copy %x): %x is defined twice"));
}

TEST(Verifier, WrongProducerIsNamed) {
  Program p = Chain();
  Edit{p}.values()[p.Get("b")].producer = 0;
  EXPECT_THAT(VerifyError(p), HasSubstr("instruction 1 (copy %b): %b records the wrong producer"));
}

TEST(Verifier, OutputNeverDefinedIsNamed) {
  Program p = Chain();
  Edit{p}.instructions().pop_back();  // drop the matmul that defined %y, keep %y as an output
  EXPECT_THAT(VerifyError(p), HasSubstr("program 'net': output %y is never defined"));
}

TEST(Verifier, InferenceFailureNamesTheInstruction) {
  Program p = Chain();
  Edit{p}.instructions()[2].attrs.Set("transpose_a", true);  // [3, 2] x [3, 4] no longer fits
  EXPECT_THAT(VerifyError(p), HasSubstr("instruction 2 (matmul %y): matmul (a transposed)"));
}

TEST(Verifier, OutputCountDifferentFromTheOpIsNamed) {
  Program p = Chain();
  Edit{p}.instructions()[0].outputs.push_back(p.Get("b"));
  EXPECT_THAT(VerifyError(p),
              HasSubstr("instruction 0 (copy %a): op produces 1 outputs, instruction lists 2"));
}

TEST(Verifier, DanglingReferencesAndMissingOpsAreReported) {
  Program p = Chain();
  Edit{p}.instructions()[1].inputs[0] = 99;
  EXPECT_THAT(VerifyError(p), HasSubstr("instruction 1 (copy %b): input refers to no value"));
  Program q = Chain();
  Edit{q}.instructions()[0].op = nullptr;
  EXPECT_THAT(VerifyError(q), HasSubstr("instruction 0 (<no op> %a): no op"));
}

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

// In-place updates (issue "Nothing lost"): these programs ran, updating a parameter through an
// alias of itself or showing a view the values of an update that came after it.
std::string BuildError(void (*body)(Builder&, Var w, Var g, Var m, Var lr)) {
  Builder b("opt");
  Var lr = b.Input("lr", DType::kF32, {});
  Var g = b.Input("g", DType::kF32, {4, 4});
  Var w = b.Param("w", DType::kF32, {4, 4});
  Var m = b.Param("m", DType::kF32, {4, 4});
  body(b, w, g, m, lr);
  try {
    b.Build();  // verifies
  } catch (const ProgramError& e) {
    return e.what();
  }
  return "";
}

TEST(Verifier, AnInPlaceUpdateThroughAnAliasIsNamed) {
  EXPECT_THAT(BuildError([](Builder&, Var w, Var, Var, Var lr) { SgdUpdate(w, w, w, lr); }),
              HasSubstr("program 'opt', instruction 0 (sgd_update -): updates %w in place as "
                        "'param' (input 0) and also reads it as 'grad' (input 1): an in-place "
                        "update may not read what it writes through another input"));
  // Through a view: the same storage under another name.
  EXPECT_THAT(BuildError([](Builder& b, Var w, Var, Var m, Var lr) {
                SgdUpdate(w, b.Name(Reshape(w, {4, 4}), "v"), m, lr);
              }),
              HasSubstr("updates %w in place as 'param' (input 0) and also reads %v as 'grad' "
                        "(input 1), which shares its storage"));
  // The momentum buffer is written too.
  EXPECT_THAT(BuildError([](Builder&, Var w, Var g, Var, Var lr) { SgdUpdate(w, g, g, lr); }),
              HasSubstr("updates %g in place as 'momentum_buf' (input 2) and also reads it as "
                        "'grad' (input 1)"));
}

TEST(Verifier, AViewReadAfterAnUpdateOfItsStorageIsNamed) {
  EXPECT_THAT(BuildError([](Builder& b, Var w, Var g, Var m, Var lr) {
                Var v = b.Name(Reshape(w, {16}), "v");
                SgdUpdate(w, g, m, lr);
                b.Output(b.Name(Copy(v), "y"));
              }),
              HasSubstr("instruction 2 (copy %y): reads %v, a view of %w taken at instruction "
                        "0, after instruction 1 (sgd_update) updated %w in place"));
  // An output is read after the program: the same holds.
  EXPECT_THAT(BuildError([](Builder& b, Var w, Var g, Var m, Var lr) {
                b.Output(b.Name(Reshape(w, {16}), "v"));
                SgdUpdate(w, g, m, lr);
              }),
              HasSubstr("program 'opt': outputs %v, a view of %w taken at instruction 0, which "
                        "instruction 1 (sgd_update) then updates in place"));
  // The value updated, and a view taken after the update, read the new values: both allowed.
  EXPECT_EQ(BuildError([](Builder& b, Var w, Var g, Var m, Var lr) {
              Var before = b.Name(Reshape(w, {16}), "before");
              b.Output(b.Name(Copy(before), "old"));  // read before the update
              SgdUpdate(w, g, m, lr);
              b.Output(b.Name(Copy(w), "y"));
              b.Output(b.Name(Copy(Reshape(w, {16})), "z"));
            }),
            "");
}

}  // namespace
}  // namespace sluice
