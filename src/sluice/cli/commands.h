// Subcommands of the `sluice` binary. Each command file adds itself in RegisterCommands and runs
// through RunSelected, which returns the process exit status.
#pragma once

#include <CLI/CLI.hpp>

namespace sluice::cli {

// Adds every subcommand (run, ...) to `app`.
void RegisterCommands(CLI::App& app);
// Runs the subcommand the user chose; returns the exit status. Throws sluice::Error on bad input.
int RunSelected(CLI::App& app);

}  // namespace sluice::cli
