// The `sluice` command: one binary, one subcommand per job. Every subcommand turns bad input into
// a message on stderr and a non-zero exit status; nothing escapes as a crash.
#include <cstdio>
#include <exception>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "sluice/cli/commands.h"
#include "sluice/core/error.h"

int main(int argc, char** argv) {
  CLI::App app{"sluice: train neural networks with as little memory as the work allows"};
  app.set_version_flag("--version", "sluice 0.1.0");
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
    fmt::print(stderr, "sluice: error: {}\n", e.what());
    return 1;
  } catch (const std::exception& e) {
    fmt::print(stderr, "sluice: internal error: {}\n", e.what());
    return 2;
  }
}
