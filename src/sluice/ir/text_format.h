// The program text format: print a Program as text, parse text back into a verified Program.
// The grammar, with examples, is in docs/program-format.md; files use the extension `.sluice`.
//
//   # a comment runs to the end of the line
//   program affine {
//     input %x: f32[8, 16]
//     param %w: f32[16, 4]
//     %y: f32[8, 4] = matmul(%x, %w) {transpose_b = false}
//     output %y
//   }
//
// Every instruction writes the type of each output, so the text says what it computes without
// running inference in one's head; the parser runs the op's inference and rejects a declared type
// that differs from it. Printing then parsing then printing gives the same text, for every program
// the Builder can make: attribute types round-trip (an integer prints as `2`, a float as `2.0`,
// floats in their shortest exact form), and a name outside the bare charset prints quoted
// (`%"odd name"`).
//
// Failures: ParseProgram throws ParseError("file:line:col: message") at the offending token for
// every bad input — unknown op or dtype, undefined or duplicate value, wrong arity, a declared
// type that differs from inference (naming the value and both types), bad attribute syntax,
// unterminated string or program, stray characters, trailing content, absurd types (more than
// kMaxRank dimensions, or more than kMaxTextElements elements). Errors an op's inference raises
// become ParseErrors at the op. The parser never recurses, and its memory is proportional to the
// text. LoadProgramFile throws IoError naming the path when the file cannot be read.
//
// Thread-safety: all functions are reentrant; they share only the (read-only) op registry.
//
// Example:
//   Program p = LoadProgramFile("examples/mlp.sluice");
//   std::string text = PrintProgram(p);
//   Program q = ParseProgram(text, "mlp (reprinted)");
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "sluice/ir/program.h"

namespace sluice {

// Types written in text may not exceed this many elements (counting dimensions of size 0 as 1, so
// that no product of dimensions can overflow int64 in inference).
inline constexpr int64_t kMaxTextElements = int64_t{1} << 40;

// The text of `program`, ending in a newline. Prints any program, also one that fails Verify.
std::string PrintProgram(const Program& program);

// Parses one program; `filename` only labels error messages. The result has passed Verify().
Program ParseProgram(std::string_view text, std::string_view filename = "<input>");

// Reads and parses the file at `path` (errors are labelled with the path).
Program LoadProgramFile(const std::string& path);

// A float as the text format writes it: shortest exact decimal, always with '.', 'e', inf or nan
// so that it reads back as a float ("2.0", "1e-05", "-inf").
std::string FormatFloat(double value);

}  // namespace sluice
