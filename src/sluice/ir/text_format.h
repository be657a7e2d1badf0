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
#include <functional>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "sluice/ir/program.h"

namespace sluice {

// Types written in text may not exceed this many elements (counting dimensions of size 0 as 1, so
// that no product of dimensions can overflow int64 in inference).
inline constexpr int64_t kMaxTextElements = int64_t{1} << 40;

// How a parameter gets its first value, as a training program writes it after its type:
//   param %w: f32[16, 32] = normal(0, 0.02)     normal(mean, std), std > 0
//   param %b: f32[32] = zeros                   zeros, ones
//   param %e: f32[16] = uniform(-0.1, 0.1)      uniform(low, high), low < high
//   param %v: f32[16] = loaded                  taken from the --init-from file, never drawn
// The parser checks the name and the arguments (count, finite, ranges) at the initializer.
struct Initializer {
  std::string kind;          // normal, uniform, zeros, ones, loaded
  std::vector<double> args;  // normal: mean, std; uniform: low, high; otherwise none

  bool operator==(const Initializer&) const = default;
};

// What a program's text says beyond its computation: what training needs (docs/program-format.md,
// "Training programs"). Every map is keyed by value name.
struct ProgramAnnotations {
  std::map<std::string, Initializer> initializers;  // params written with `= init`
  std::map<std::string, std::string> data;          // inputs written with `= array`: the array
  std::map<std::string, std::pair<int, int>> declared_at;  // inputs and params: line, column
  std::map<std::string, std::pair<int, int>> output_at;  // output statements' values: line, column
  std::set<std::string> sizes;                           // size names the text uses (B, T)
};

// Values of the size names a program may use in place of numbers (`f32[B, T, 64]`, `[B*T, 3]`):
// training binds B to the micro-batch size and T to the sequence length.
using SizeBindings = std::map<std::string, int64_t, std::less<>>;

// Called by ParseProgram on each input as soon as it is declared, with its name, type and the data
// array it binds (its own name unless written); an InvalidArgument it throws becomes a ParseError
// at the declaration. Training checks inputs against its data this way, before the instructions
// that read them can fail on a wrong shape.
using InputCheck =
    std::function<void(const std::string& name, const TensorType& type, const std::string& array)>;

// The text of `program`, ending in a newline. Prints any program, also one that fails Verify.
// With `annotations`, parameters and inputs are printed with their initializer and data array.
// Units are printed as `unit NAME { ... }` around their instructions.
std::string PrintProgram(const Program& program, const ProgramAnnotations* annotations = nullptr);

// Parses one program; `filename` only labels error messages. The result has passed Verify().
// A size name in a type or an integer attribute reads its value from `sizes`; one missing there
// is an error at the name. `annotations`, when given, receives what the text says for training
// (initializers and data arrays are parsed and checked either way).
Program ParseProgram(std::string_view text, std::string_view filename = "<input>",
                     const SizeBindings& sizes = {}, ProgramAnnotations* annotations = nullptr,
                     const InputCheck& check_input = {});

// The text of one program printed at two bindings of its sizes, with every integer that differs
// between them written as the product of sizes and a factor that gives both (`B`, `B*T`, `3*T`):
// how a program built at concrete sizes becomes one that trains at any. Throws InvalidArgument
// when the texts differ in anything but integers, or an integer fits no such product (naming the
// line of `text_a`); the bindings should take values no constant of the program takes.
std::string GeneraliseSizes(std::string_view text_a, const SizeBindings& sizes_a,
                            std::string_view text_b, const SizeBindings& sizes_b);

// Reads and parses the file at `path` (errors are labelled with the path).
Program LoadProgramFile(const std::string& path);

// A float as the text format writes it: shortest exact decimal, always with '.', 'e', inf or nan
// so that it reads back as a float ("2.0", "1e-05", "-inf").
std::string FormatFloat(double value);

}  // namespace sluice
