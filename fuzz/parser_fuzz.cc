// Fuzz target for the program text parser and printer (ir/text_format.h).
//
// For every input:
//   * ParseProgram either returns a program or throws ParseError. Any other exception (an
//     InternalError, a ProgramError the parser failed to convert, std::out_of_range, ...) escapes
//     this function and libFuzzer reports it as a crash; so does a ParseError that wraps an
//     internal error of an op's inference. Crashes, hangs, sanitizer reports and huge allocations
//     are bugs too.
//   * A parsed program prints to text that parses again and prints identically, with what it
//     says for training (sizes B = 3 and T = 5 bound, initializers, data arrays, units).
//
// Run: make fuzz (FUZZ_SECONDS=300 for longer), or build-fuzz/fuzz/parser_fuzz
// -dict=fuzz/parser.dict CORPUS_DIR fuzz/corpus/parser. Add each input that found a bug to
// tests/ir/data/ (must-fail inputs) or to tests/ir/text_format_test.cc.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "sluice/core/error.h"
#include "sluice/ir/text_format.h"

namespace {

[[noreturn]] void Die(const char* what, std::string_view detail) {
  std::fprintf(stderr, "parser_fuzz: %s\n%.*s\n", what, static_cast<int>(detail.size()),
               detail.data());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  std::string printed;
  const sluice::SizeBindings sizes{{"B", 3}, {"T", 5}};
  try {
    sluice::ProgramAnnotations annotations;
    printed =
        sluice::PrintProgram(sluice::ParseProgram(text, "fuzz", sizes, &annotations), &annotations);
  } catch (const sluice::ParseError& e) {
    // "fuzz:L:C: internal error in <op> ...": the parser's wrapping of an exception that is not a
    // sluice::Error (user text never starts a message, so it cannot fake this).
    std::string_view message = e.what();
    message.remove_prefix(
        std::min(message.size(), fmt::format("fuzz:{}:{}: ", e.line(), e.col()).size()));
    if (message.starts_with("internal error in "))
      Die("an op's inference failed with an internal error", e.what());
    return 0;
  }
  std::string reprinted;
  try {
    sluice::ProgramAnnotations annotations;
    reprinted = sluice::PrintProgram(sluice::ParseProgram(printed, "reprinted", {}, &annotations),
                                     &annotations);
  } catch (const sluice::Error& e) {
    Die("the printed program does not parse", std::string(e.what()) + "\n--- printed:\n" + printed);
  }
  if (reprinted != printed)
    Die("printing is not stable", "--- first:\n" + printed + "--- second:\n" + reprinted);
  return 0;
}
