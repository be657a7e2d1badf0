// What the text format says for training: sizes named B and T, initializers, the data arrays inputs
// bind, units — parsed, printed back, and refused at the offending token when malformed.
#include <string>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sluice/core/error.h"
#include "sluice/ir/text_format.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr const char* kClassifier = R"(program classifier {
  input %x: f32[B, 16]
  input %y: i64[B] = labels
  param %w: f32[16, 10] = normal(0, 0.02)
  param %b: f32[10] = zeros
  param %s: f32[10] = uniform(-0.5, 0.5)
  param %v: f32[10] = loaded
  unit fc {
    %logits: f32[B, 10] = linear(%x, %w, %b)
    %r: f32[B*5, 2] = reshape(%logits) {shape = [B*5, 2]}
  }
  unit "loss head" {
    %loss: f32[] = cross_entropy(%logits, %y)
  }
  output %loss
}
)";

TEST(TrainingText, SizesAreBoundWhereTheyAreWritten) {
  ProgramAnnotations a;
  const Program p = ParseProgram(kClassifier, "c.sluice", {{"B", 8}}, &a);
  EXPECT_EQ(p.type(p.Get("x")).shape, (Shape{8, 16}));
  EXPECT_EQ(p.type(p.Get("r")).shape, (Shape{40, 2}));
  EXPECT_EQ(a.sizes, (std::set<std::string>{"B"}));
  const Program q = ParseProgram(kClassifier, "c.sluice", {{"B", 3}});
  EXPECT_EQ(q.type(q.Get("logits")).shape, (Shape{3, 10}));
}

TEST(TrainingText, InitializersDataArraysAndUnitsAreRead) {
  ProgramAnnotations a;
  const Program p = ParseProgram(kClassifier, "c.sluice", {{"B", 8}}, &a);
  EXPECT_EQ(a.initializers.at("w"), (Initializer{"normal", {0, 0.02}}));
  EXPECT_EQ(a.initializers.at("b"), (Initializer{"zeros", {}}));
  EXPECT_EQ(a.initializers.at("s"), (Initializer{"uniform", {-0.5, 0.5}}));
  EXPECT_EQ(a.initializers.at("v"), (Initializer{"loaded", {}}));
  EXPECT_EQ(a.data.size(), 1u);
  EXPECT_EQ(a.data.at("y"), "labels");
  EXPECT_EQ(a.declared_at.at("w"), (std::pair<int, int>{4, 9}));
  ASSERT_EQ(p.units().size(), 2u);
  EXPECT_EQ(p.units()[0], (ProgramUnit{"fc", 0, 2}));
  EXPECT_EQ(p.units()[1], (ProgramUnit{"loss head", 2, 3}));
}

TEST(TrainingText, PrintingWithAnnotationsReadsBackTheSame) {
  ProgramAnnotations a;
  const Program p = ParseProgram(kClassifier, "c.sluice", {{"B", 8}}, &a);
  const std::string text = PrintProgram(p, &a);
  EXPECT_THAT(text, HasSubstr("  unit fc {\n    %logits: f32[8, 10]"));
  EXPECT_THAT(text, HasSubstr("param %w: f32[16, 10] = normal(0, 0.02)"));
  EXPECT_THAT(text, HasSubstr("input %y: i64[8] = labels"));
  ProgramAnnotations b;
  const Program q = ParseProgram(text, "reprinted", {}, &b);
  EXPECT_EQ(PrintProgram(q, &b), text);
  EXPECT_EQ(q.units(), p.units());
  EXPECT_EQ(b.initializers, a.initializers);
  EXPECT_EQ(b.data, a.data);
  // Without annotations the computation alone is printed, units included.
  EXPECT_THAT(PrintProgram(p), Not(HasSubstr("normal")));
  EXPECT_THAT(PrintProgram(p), HasSubstr("unit \"loss head\" {"));
}

TEST(TrainingText, EmptyUnitsPrintAndReadBack) {
  Program p("p");
  ValueId x = p.AddInput("x", {DType::kF32, Shape{2}});
  p.BeginUnit("a");
  p.EndUnit();
  p.BeginUnit("b");
  ValueId y = p.AddInstruction("copy", {x}, {}, {"y"})[0];
  p.EndUnit();
  p.BeginUnit("c");
  p.EndUnit();
  p.AddOutput(y);
  const Program q = ParseProgram(PrintProgram(p));
  EXPECT_EQ(q.units(), p.units());
}

TEST(TrainingText, GeneraliseSizesWritesProductsOfTheSizes) {
  const std::string a =
      "program p {\n  input %x: f32[6, 35, 4]\n  %y: f32[210, 4] = "
      "reshape(%x) {shape = [210, 4]}\n  output %y\n}\n";
  const std::string b =
      "program p {\n  input %x: f32[2, 55, 4]\n  %y: f32[110, 4] = "
      "reshape(%x) {shape = [110, 4]}\n  output %y\n}\n";
  const std::string g = GeneraliseSizes(a, {{"B", 3}, {"T", 7}}, b, {{"B", 1}, {"T", 11}});
  EXPECT_EQ(g,
            "program p {\n  input %x: f32[2*B, 5*T, 4]\n  %y: f32[10*B*T, 4] = "
            "reshape(%x) {shape = [10*B*T, 4]}\n  output %y\n}\n");
  const Program p = ParseProgram(g, "g", {{"B", 1}, {"T", 11}});
  EXPECT_EQ(PrintProgram(p), b);
}

TEST(TrainingText, GeneraliseSizesRefusesTextsThatDifferInMoreThanNumbers) {
  EXPECT_THROW(GeneraliseSizes("program p {}", {{"B", 2}}, "program q {}", {{"B", 3}}),
               InvalidArgument);
  EXPECT_THROW(GeneraliseSizes("program p { input %x: f32[7] }", {{"B", 2}},
                               "program p { input %x: f32[8] }", {{"B", 3}}),
               InvalidArgument);
}

struct BadText {
  std::string text;
  int line, col;
  std::string fragment;
};

TEST(TrainingText, MalformedTrainingTextFailsAtTheToken) {
  auto body = [](const std::string& s) { return "program p {\n  input %x: f32[2]\n" + s + "}\n"; };
  const BadText cases[] = {
      {body("  param %w: f32[2] = gaussian(0, 1)\n"), 3, 22, "unknown initializer 'gaussian'"},
      {body("  param %w: f32[2] = normal(0)\n"), 3, 22,
       "normal takes 2 arguments (mean, std), got 1"},
      {body("  param %w: f32[2] = normal(0, -1)\n"), 3, 22, "normal's std must be positive"},
      {body("  param %w: f32[2] = uniform(1, 1)\n"), 3, 22, "uniform's low must be below its high"},
      {body("  param %w: f32[2] = zeros(1)\n"), 3, 22, "zeros takes 0 arguments"},
      {body("  param %w: f32[2] = normal(0, inf)\n"), 3, 32, "arguments are numbers, found 'inf'"},
      {body("  param %w: f32[2] = normal(0, \"a\")\n"), 3, 32, "arguments are numbers"},
      {body("  input %t: i64[2] = 3\n"), 3, 22, "expected the name of the data array %t binds"},
      {body("  input %t: f32[B, 2]\n"), 3, 17, "size 'B' is not bound here"},
      {body("  input %t: f32[2*, 2]\n"), 3, 19, "expected an integer or a size name after '*'"},
      {body("  unit u {\n  unit v {\n  }\n  }\n"), 4, 3, "unit 'v' opens inside unit 'u'"},
      {body("  unit u {\n  }\n  unit u {\n  }\n"), 5, 8, "unit 'u' is defined twice"},
      {"program p {\n  unit u {\n", 3, 1,
       "unterminated unit 'u': expected '}' to close the '{' at 2:10"},
      {body("  unit {\n  }\n"), 3, 8, "expected the unit's name after 'unit'"},
  };
  for (const BadText& c : cases) {
    try {
      ParseProgram(c.text, "t.sluice");
      ADD_FAILURE() << "parsed: " << c.text;
    } catch (const ParseError& e) {
      EXPECT_THAT(e.what(), HasSubstr(fmt::format("t.sluice:{}:{}:", c.line, c.col))) << c.text;
      EXPECT_THAT(e.what(), HasSubstr(c.fragment)) << c.text;
    }
  }
}

}  // namespace
}  // namespace sluice
