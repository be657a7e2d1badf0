// Subcommands of the `sluice` binary: one row of the table in commands.cc per subcommand.
//
// Adding a subcommand `foo`: write cli/foo_command.cc defining
//     CommandRunner SetupFooCommand(CLI::App& sub);
// which adds foo's options to `sub` (binding them to state it owns) and returns the function that
// runs foo once the arguments are parsed; declare it below and add {"foo", "...", SetupFooCommand}
// to kCommands in commands.cc.
//
// Exit status: a runner returns the process status (0 on success). Bad input is reported by
// throwing sluice::Error (main prints "sluice: error: ..." and exits 1); option syntax and
// validation errors are CLI11's (printed with usage, non-zero status).
//
// Thread-safety: called from main only.
#pragma once

#include <functional>
#include <span>

#include <CLI/CLI.hpp>

namespace sluice::cli {

using CommandRunner = std::function<int()>;
using CommandSetup = CommandRunner (*)(CLI::App& sub);

struct CommandSpec {
  const char* name;
  const char* description;
  CommandSetup setup;
};

// The table of subcommands, in the order `sluice --help` lists them.
std::span<const CommandSpec> Commands();

// Adds every subcommand of the table to `app`.
void RegisterCommands(CLI::App& app);
// Runs the subcommand the user chose; returns the exit status. Throws sluice::Error on bad input.
int RunSelected(CLI::App& app);

// One per command file.
CommandRunner SetupRunCommand(CLI::App& sub);  // run_command.cc
CommandRunner SetupTrainCommand(CLI::App& sub);  // train_command.cc
CommandRunner SetupScheduleCommand(CLI::App& sub);  // schedule_command.cc

}  // namespace sluice::cli
