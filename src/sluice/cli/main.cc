// The `sluice` command: one binary, one subcommand per job. Every subcommand turns bad input into
// a message on stderr and a non-zero exit status; nothing escapes as a crash.
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "sluice/cli/commands.h"
#include "sluice/core/error.h"

namespace {

// A message as it may reach a terminal: messages quote text read from files (a checkpoint's
// metadata, a JSON parser's "last read: '...'"), and a control byte there (ESC) would drive the
// terminal. Control bytes but the newline and the tab of multi-line messages become \xHH.
std::string ForTerminal(std::string_view message) {
  std::string out;
  out.reserve(message.size());
  for (const char c : message) {
    const auto byte = static_cast<unsigned char>(c);
    if ((byte < 0x20 && c != '\n' && c != '\t') || byte == 0x7f) {
      out += fmt::format("\\x{:02x}", byte);
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"sluice: train neural networks with as little memory as the work allows"};
  app.set_version_flag("--version", sluice::cli::kSluiceVersion);
  app.require_subcommand(1);
  sluice::cli::RegisterCommands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    return sluice::cli::RunSelected(app);
  } catch (const sluice::Error& e) {
    fmt::print(stderr, "sluice: error: {}\n", ForTerminal(e.what()));
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "sluice: internal error: {}\n", ForTerminal(e.what()));
    return 2;
  }
}
