// Malformed program text: every case must fail with a ParseError at the offending token
// (line:col) whose message contains a fragment naming the problem. One table entry per case.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sluice/core/error.h"
#include "sluice/ir/text_format.h"
#include "source_dir.h"

namespace sluice {
namespace {

struct BadText {
  std::string label;
  std::string text;
  int line;
  int col;
  std::string fragment;
};

// Wraps statements in a program with one f32[2] input %x (statements start on line 3).
std::string Body(const std::string& statements) {
  return "program p {\n  input %x: f32[2]\n" + statements + "}\n";
}

std::vector<BadText> Cases() {
  return {
      {"empty", "", 1, 1, "expected 'program', found end of input"},
      {"not_a_program", "graph g {}", 1, 1, "expected 'program', found 'graph'"},
      {"missing_name", "program {", 1, 9, "expected the program's name"},
      {"missing_brace", "program p input", 1, 11, "expected '{' to open the program body"},
      {"garbage_char", Body("  %y: f32[2] = copy(%x) $\n"), 3, 25, "unexpected character '$'"},
      {"const_updated",
       Body("  const %c: f32[2]\n  input %lr: f32[]\n  param %m: f32[2]\n  sgd_update(%c, %x, %m, "
            "%lr)\n"),
       6, 3, "%c is a constant, and sgd_update updates its inputs in place"},
      {"nul_byte", Body(std::string("  \0\n", 4)), 3, 3, "unexpected character '\\x00'"},
      {"high_byte", Body("  \xff\n"), 3, 3, "unexpected character '\\xff'"},
      {"bad_statement", Body("  let %y\n"), 3, 3, "expected a statement"},
      {"bad_statement_token", Body("  [\n"), 3, 3, "expected a statement"},
      {"unknown_op", Body("  %y: f32[2] = frobnicate(%x)\n"), 3, 16, "unknown op 'frobnicate'"},
      {"unknown_op_no_outputs", Body("  frobnicate(%x)\n"), 3, 3, "unknown op 'frobnicate'"},
      {"unknown_dtype", Body("  input %z: f33[2]\n"), 3, 13, "unknown dtype 'f33'"},
      {"undefined_value", Body("  %y: f32[2] = copy(%z)\n"), 3, 21, "undefined value %z"},
      {"use_before_definition", Body("  %y: f32[2] = copy(%w)\n  %w: f32[2] = copy(%x)\n"), 3, 21,
       "undefined value %w"},
      {"self_reference", Body("  %y: f32[2] = copy(%y)\n"), 3, 21, "undefined value %y"},
      {"duplicate_input", Body("  input %x: f32[3]\n"), 3, 9, "%x is already defined at 2:9"},
      {"duplicate_output_name", Body("  %x: f32[2] = copy(%x)\n"), 3, 3,
       "%x is already defined at 2:9"},
      {"duplicate_quoted", Body("  param %\"x\": f32[2]\n"), 3, 9, "%x is already defined"},
      {"duplicate_results", Body("  %a: f32[2], %a: f32[2] = layer_norm_grad_params(%x, %x)\n"), 3,
       15, "%a is already defined at 3:3"},
      {"arity", Body("  %y: f32[2] = matmul(%x)\n"), 3, 16, "matmul takes 2 inputs, got 1"},
      {"arity_zero", Body("  %y: f32[2] = copy()\n"), 3, 16, "copy takes 1 input, got 0"},
      {"declared_shape_differs", Body("  %y: f32[3] = copy(%x)\n"), 3, 3,
       "%y is declared f32[3] but copy gives f32[2]"},
      {"declared_dtype_differs", Body("  %y: f64[2] = copy(%x)\n"), 3, 3,
       "%y is declared f64[2] but copy gives f32[2]"},
      {"declared_rank_differs", Body("  %y: f32[] = copy(%x)\n"), 3, 3,
       "%y is declared f32[] but copy gives f32[2]"},
      {"inference_error", Body("  %y: f32[2, 2] = matmul(%x, %x)\n"), 3, 19,
       "both operands need rank 2"},
      {"inference_dtype_error", Body("  input %i: i64[2]\n  %y: f32[2] = add(%x, %i)\n"), 4, 16,
       "dtypes differ"},
      {"missing_attribute", Body("  %y: f32[2] = transpose(%x)\n"), 3, 16,
       "missing attribute 'dim0'"},
      {"wrong_attribute_type", Body("  %y: f32[2] = transpose(%x) {dim0 = 0.5, dim1 = 0}\n"), 3, 16,
       "attribute 'dim0' must be an integer"},
      // Regression: an attribute the op does not declare was ignored ({tranpose_b = true} ran a
      // plain matmul); it is an error at the attribute's name now.
      {"misspelled_attribute",
       Body("  input %m: f32[2, 2]\n  %y: f32[2, 2] = matmul(%m, %m) {tranpose_b = true}\n"), 4, 35,
       "matmul has no attribute 'tranpose_b' (did you mean 'transpose_b'?); its attributes are "
       "transpose_a, transpose_b"},
      {"unknown_attribute_no_hint",
       Body("  input %m: f32[2, 2]\n  %y: f32[2, 2] = matmul(%m, %m) {axis = 1}\n"), 4, 35,
       "matmul has no attribute 'axis'; its attributes are transpose_a, transpose_b"},
      {"unknown_attribute_after_a_known_one",
       Body("  %y: f32[2] = scale(%x) {factor = 2.0, factr = 3.0}\n"), 3, 41,
       "scale has no attribute 'factr' (did you mean 'factor'?)"},
      {"attribute_of_an_op_without_attributes", Body("  %y: f32[2] = copy(%x) {a = 1}\n"), 3, 26,
       "copy takes no attributes, got 'a'"},
      {"too_many_results", Body("  %a: f32[2], %b: f32[2] = copy(%x)\n"), 3, 28,
       "produces 1 outputs but 2 names"},
      {"missing_results", Body("  copy(%x)\n"), 3, 3,
       "copy produces 1 output, the instruction names 0"},
      {"result_without_type", Body("  %y = copy(%x)\n"), 3, 6,
       "expected ':' after %y (every output is written with its type)"},
      {"missing_equals", Body("  %y: f32[2] copy(%x)\n"), 3, 14, "expected '=' after the outputs"},
      {"missing_op", Body("  %y: f32[2] = (%x)\n"), 3, 16,
       "expected a name (an op name) after '='"},
      {"unclosed_inputs", Body("  %y: f32[2] = copy(%x\n"), 4, 1,
       "expected ')' to close the inputs of copy, found '}'"},
      {"input_not_a_value", Body("  %y: f32[2] = copy(x)\n"), 3, 21,
       "expected a value (%name) as an input of copy"},
      {"attr_missing_equals", Body("  %y: f32[2] = copy(%x) {a 1}\n"), 3, 28,
       "expected '=' after attribute 'a'"},
      {"attr_missing_value", Body("  %y: f32[2] = copy(%x) {a = }\n"), 3, 30,
       "expected an attribute value"},
      {"attr_bad_name", Body("  %y: f32[2] = copy(%x) {1 = 1}\n"), 3, 26,
       "expected an attribute name"},
      {"attr_duplicate", Body("  %y: f32[2] = copy(%x) {a = 1, a = 2}\n"), 3, 33,
       "attribute 'a' is given twice"},
      {"attr_float_list", Body("  %y: f32[2] = copy(%x) {a = [1, 1.5]}\n"), 3, 34,
       "attribute lists hold integers only, found '1.5'"},
      {"attr_nested_list", Body("  %y: f32[2] = copy(%x) {a = [[1]]}\n"), 3, 31,
       "attribute lists hold integers only"},
      {"attr_unclosed_list", Body("  %y: f32[2] = copy(%x) {a = [1 2]}\n"), 3, 33,
       "expected ']' to close the list"},
      {"attr_unclosed", "program p {\n  input %x: f32[2]\n  %y: f32[2] = copy(%x) {a = 1\n", 4, 1,
       "expected '}' to close the attributes, found end of input"},
      {"attr_bare_word", Body("  %y: f32[2] = copy(%x) {a = yes}\n"), 3, 30,
       "expected an attribute value"},
      {"unterminated_string", Body("  %y: f32[2] = copy(%x) {s = \"abc}\n"), 3, 30,
       "unterminated string"},
      {"unterminated_string_eof",
       "program p {\n  input %x: f32[2]\n  %y: f32[2] = copy(%x) {s = \"abc", 3, 30,
       "unterminated string"},
      {"unterminated_escape", "program \"p\\", 1, 9, "unterminated string"},
      {"bad_escape", Body("  %y: f32[2] = copy(%x) {s = \"a\\qb\"}\n"), 3, 32,
       "unknown escape '\\q'"},
      {"bad_hex_escape", Body("  %y: f32[2] = copy(%x) {s = \"\\x4\"}\n"), 3, 31,
       "\\x needs two hex digits"},
      {"control_char_in_string", Body("  %y: f32[2] = copy(%x) {s = \"a\tb\"}\n"), 3, 32,
       "control character '\\x09' in a string"},
      {"unterminated_program", "program p {\n  input %x: f32[2]\n", 3, 1,
       "unterminated program: expected '}' to close the '{' at 1:11"},
      {"unterminated_after_comment", "program p { # }\n", 2, 1, "unterminated program"},
      {"trailing_program", "program p {\n}\nprogram q {\n}\n", 3, 1,
       "unexpected 'program' after the end of the program"},
      {"trailing_brace", "program p {}}", 1, 13, "unexpected '}' after the end of the program"},
      {"negative_dim", Body("  input %z: f32[2, -3]\n"), 3, 20, "dimension -3 is negative"},
      {"rank_over_8", Body("  input %z: f32[1, 1, 1, 1, 1, 1, 1, 1, 1]\n"), 3, 41,
       "at most 8 dimensions"},
      {"too_many_elements", Body("  input %z: f32[1048576, 1048577]\n"), 3, 26,
       "more than 2^40 elements"},
      {"product_would_overflow", Body("  input %z: f32[4294967296, 4294967296, 4294967296]\n"), 3,
       29, "more than 2^40 elements"},
      {"zero_does_not_hide_huge_dims", Body("  input %z: f32[0, 2000000, 2000000]\n"), 3, 29,
       "more than 2^40 elements"},
      {"dim_over_int64", Body("  input %z: f32[99999999999999999999]\n"), 3, 17,
       "does not fit in 64 bits"},
      {"float_dim", Body("  input %z: f32[2.0]\n"), 3, 17,
       "expected a dimension (an integer or a size name such as B)"},
      {"missing_dims", Body("  input %z: f32\n"), 4, 1, "expected '[' to open the dimensions"},
      {"unclosed_dims", Body("  input %z: f32[2\n"), 4, 1, "expected ']' to close the dimensions"},
      {"float_out_of_range", Body("  %y: f32[2] = copy(%x) {a = 1e999}\n"), 3, 30,
       "float literal 1e999 is out of range"},
      {"malformed_number", Body("  %y: f32[2] = copy(%x) {a = 12abc}\n"), 3, 30,
       "malformed number '12a'"},
      {"dangling_point", Body("  %y: f32[2] = copy(%x) {a = 1.}\n"), 3, 30,
       "expected digits after '.'"},
      {"dangling_exponent", Body("  %y: f32[2] = copy(%x) {a = 1e+}\n"), 3, 30,
       "expected digits in the exponent"},
      {"lone_minus", Body("  %y: f32[2] = copy(%x) {a = - 1}\n"), 3, 30,
       "'-' must be followed by a number"},
      {"minus_word", Body("  %y: f32[2] = copy(%x) {a = -true}\n"), 3, 30,
       "'-' only starts a number"},
      {"lone_percent", Body("  input % : f32[2]\n"), 3, 9, "expected a value name after '%'"},
      {"empty_quoted_name", Body("  input %\"\": f32[2]\n"), 3, 9, "a value name cannot be empty"},
      {"input_without_percent", Body("  input z: f32[2]\n"), 3, 9,
       "expected a value (%name) after 'input'"},
      {"output_undefined", Body("  output %nope\n"), 3, 10, "undefined value %nope"},
      {"conv2d_groups_not_dividing_channels",
       Body("  input %i: f32[1, 6, 8, 8]\n  input %w: f32[4, 2, 3, 3]\n  %y: f32[1, 4, 6, 6] = "
            "conv2d(%i, %w) {groups = 4}\n"),
       5, 25, "groups = 4 must divide x's channels C = 6"},
      {"conv2d_filters_not_per_group",
       Body("  input %i: f32[1, 6, 8, 8]\n  input %w: f32[4, 6, 3, 3]\n  %y: f32[1, 4, 6, 6] = "
            "conv2d(%i, %w) {groups = 2}\n"),
       5, 25, "w must be filters [O, C/G, KH, KW] with x's C = 6 (2 groups: C/G = 3)"},
      {"conv2d_groups_not_dividing_outputs",
       Body("  input %i: f32[1, 6, 8, 8]\n  input %w: f32[4, 2, 3, 3]\n  %y: f32[1, 4, 6, 6] = "
            "conv2d(%i, %w) {groups = 3}\n"),
       5, 25, "groups = 3 must divide w's output channels O = 4"},
      {"conv2d_groups_zero",
       Body("  input %i: f32[1, 6, 8, 8]\n  input %w: f32[4, 6, 3, 3]\n  %y: f32[1, 4, 6, 6] = "
            "conv2d(%i, %w) {groups = 0}\n"),
       5, 25, "groups must be at least 1, got 0"},
      {"conv2d_dilation_zero",
       Body("  input %i: f32[1, 6, 8, 8]\n  input %w: f32[4, 6, 3, 3]\n  %y: f32[1, 4, 6, 6] = "
            "conv2d(%i, %w) {dilation = [0, 1]}\n"),
       5, 25, "dilation must be two integers [rows, columns] of at least 1, got [0, 1]"},
      {"conv2d_dilated_window_too_large",
       Body("  input %i: f32[1, 6, 8, 8]\n  input %w: f32[4, 6, 3, 3]\n  %y: f32[1, 4, 6, 6] = "
            "conv2d(%i, %w) {dilation = [5, 1]}\n"),
       5, 25, "a window of 3x3 (dilated [5, 1]: 11x3) does not fit images of 8x8 padded by [0, 0]"},
      {"output_twice", Body("  output %x\n  output %x\n"), 4, 10, "%x is already an output"},
      // Regression: what the verifier refuses once the whole program is read failed at the
      // program (1:1); it is at the instruction, or the output statement, it concerns now.
      {"update_reads_what_it_writes",
       Body("  input %b: f32[4, 2]\n  buffer %m: f32[2] = zeros\n"
            "  batch_norm_update_stats(%b, %m, %m) {momentum = 0.1}\n"),
       5, 3,
       "updates %m in place as 'running_mean' (input 1) and also reads it as 'running_var' (input "
       "2)"},
      {"update_reads_a_view_of_what_it_writes",
       Body("  input %b: f32[4, 2]\n  buffer %m: f32[2] = zeros\n"
            "  %v: f32[2] = reshape(%m) {shape = [2]}\n"
            "  batch_norm_update_stats(%b, %m, %v) {momentum = 0.1}\n"),
       6, 3, "and also reads %v as 'running_var' (input 2), which shares its storage"},
      {"view_read_after_update",
       Body("  input %b: f32[4, 2]\n  buffer %m: f32[2] = zeros\n  buffer %r: f32[2] = ones\n"
            "  %v: f32[2] = reshape(%m) {shape = [2]}\n"
            "  batch_norm_update_stats(%b, %m, %r) {momentum = 0.1}\n"
            "  %y: f32[2] = copy(%v)\n"),
       8, 16, "reads %v, a view of %m taken at instruction 0, after instruction 1"},
      {"view_output_after_update",
       Body("  input %b: f32[4, 2]\n  buffer %m: f32[2] = zeros\n  buffer %r: f32[2] = ones\n"
            "  %v: f32[2] = reshape(%m) {shape = [2]}\n  output %v\n"
            "  batch_norm_update_stats(%b, %m, %r) {momentum = 0.1}\n"),
       7, 10, "outputs %v, a view of %m taken at instruction 0, which instruction 1"},
  };
}

void PrintTo(const BadText& c, std::ostream* os) { *os << c.label; }

class TextFormatErrors : public ::testing::TestWithParam<BadText> {};

TEST_P(TextFormatErrors, FailsAtTheOffendingToken) {
  const BadText& c = GetParam();
  try {
    ParseProgram(c.text, "bad.sluice");
    FAIL() << "parsed without error:\n" << c.text;
  } catch (const ParseError& e) {
    EXPECT_EQ(e.file(), "bad.sluice");
    EXPECT_EQ(e.line(), c.line) << e.what();
    EXPECT_EQ(e.col(), c.col) << e.what();
    EXPECT_THAT(e.what(), ::testing::HasSubstr(c.fragment));
    EXPECT_THAT(e.what(),
                ::testing::StartsWith(fmt::format("bad.sluice:{}:{}: ", e.line(), e.col())));
  }
}

INSTANTIATE_TEST_SUITE_P(Table, TextFormatErrors, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.label; });

// Inputs the fuzzer found (or that guard against what it could find), kept in tests/ir/data/.
// Each must fail with a ParseError and nothing else.
TEST(TextFormatRegressions, CheckedInMalformedFilesFailCleanly) {
  const auto dir = testing_support::SourceDir() / "tests/ir/data";
  int count = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    ++count;
    std::ifstream in(entry.path(), std::ios::binary);
    std::stringstream text;
    text << in.rdbuf();
    EXPECT_THROW(ParseProgram(text.str(), entry.path().string()), ParseError) << entry.path();
  }
  EXPECT_GT(count, 0);
}

}  // namespace
}  // namespace sluice
