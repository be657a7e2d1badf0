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

#include <cerrno>
#include <charconv>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "sluice/core/enum_names.h"

namespace sluice::cli {

// What `sluice --version` prints; the ranks of an MPI job check that they all run it.
inline constexpr const char* kSluiceVersion = "sluice 0.1.0";

using CommandRunner = std::function<int()>;
using CommandSetup = CommandRunner (*)(CLI::App& sub);

struct CommandSpec {
  const char* name;
  const char* description;
  CommandSetup setup;
  // Whether the command runs programs' kernels, oneDNN's products among them: for these alone
  // `sluice` restarts itself with OMP_WAIT_POLICY=passive when it is unset (cli/main.cc); the
  // others never start an OpenMP worker and would only pay a second start-up.
  bool runs_kernels = false;
};

// The table of subcommands, in the order `sluice --help` lists them.
std::span<const CommandSpec> Commands();

// Adds every subcommand of the table to `app`.
void RegisterCommands(CLI::App& app);
// Runs the subcommand the user chose; returns the exit status. Throws sluice::Error on bad input.
int RunSelected(CLI::App& app);

// fmt::print(stderr, ...) that never throws: a message to the user is written as far as stderr
// takes it (closed, a full disk, a pipe nobody reads while SIGPIPE is ignored: the rest is lost),
// and the command goes on to its own exit status. fmt::print throws std::system_error instead,
// which aborted a training run at its first progress line, and main's own error message then
// threw again (std::terminate).
template <typename... Args>
void PrintToStderr(fmt::format_string<Args...> format, Args&&... args) {
  const std::string text = fmt::format(format, std::forward<Args>(args)...);
  [[maybe_unused]] const size_t written = std::fwrite(text.data(), 1, text.size(), stderr);
}

// Standard output, written by the commands that print their result there (plan, simulate, run,
// schedule, ops, sample, report, export). A write that fails is an error naming standard output,
// never an exception of the standard library ("internal error") nor a silent success with the
// output lost (a buffered `sluice plan > /dev/full` exited 0):
//   - a full disk, a device that takes nothing (/dev/full), any error but EPIPE: IoError
//     "cannot write to standard output (No space left on device): what was printed is incomplete";
//   - a reader that went away (EPIPE, reached only while SIGPIPE is ignored; by default SIGPIPE
//     ends the process first, as it ends `cat`): StdoutClosed, which main turns into a quiet exit
//     with status 141 (128 + SIGPIPE), what a shell reports for a process SIGPIPE ended.
struct StdoutClosed {};
[[noreturn]] void FailStdout(int error);  // `error`: the errno of the failed write, 0 if unknown

// fmt::print(...) to standard output, failing as above.
template <typename... Args>
void PrintToStdout(fmt::format_string<Args...> format, Args&&... args) {
  const std::string text = fmt::format(format, std::forward<Args>(args)...);
  if (std::fwrite(text.data(), 1, text.size(), stdout) != text.size()) FailStdout(errno);
}

// Writes out what standard output still buffers (main calls it after every command, and a command
// that streams calls it as it goes), failing as above, also for a failure of an earlier write.
void FlushStdout();

// A CLI11 check that accepts exactly the names of an enum table (core/enum_names.h), so that an
// option's choices are written once: sub.add_option("--mode", mode)->check(OneOf(kRunModeNames)).
template <typename E, size_t N>
CLI::Validator OneOf(const EnumEntry<E> (&table)[N]) {
  std::vector<std::string> names;
  for (const EnumEntry<E>& entry : table) names.emplace_back(entry.name);
  return CLI::IsMember(std::move(names));
}

// A CLI11 check that refuses an empty value, which would otherwise quietly mean "not given";
// `why` is the message CLI11 prints after the option's name.
inline CLI::Validator NonEmpty(std::string why) {
  return CLI::Validator(
      [why = std::move(why)](std::string& value) { return value.empty() ? why : std::string(); },
      "");
}

// A CLI11 check for a file option: refuses an empty path, which names no file. Without it
// `--save ''` or `--resume ''` would quietly mean "not given": no checkpoint, a run from scratch.
inline CLI::Validator NonEmptyPath() { return NonEmpty("an empty path names no file"); }

// A CLI11 check for a seed bound to a uint64_t: a decimal integer from 0 to 2^64 - 1. CLI11 alone
// would wrap "-1" around to 2^64 - 1, and its NonNegativeNumber prints a 300-digit upper bound.
inline CLI::Validator Seed() {
  return CLI::Validator(
      [](std::string& text) {
        const bool digits = !text.empty() && text.size() <= 20 &&
                            text.find_first_not_of("0123456789") == std::string::npos;
        if (digits && (text.size() < 20 || text <= "18446744073709551615")) return std::string();
        return "a seed is an integer from 0 to 18446744073709551615, got '" + text + "'";
      },
      "UINT64");
}

// A CLI11 check for an option bound to an int64_t: a decimal integer beyond 64 bits is refused
// naming the range. CLI11 alone clamps it (`--steps 99999999999999999999` ran 2^63 - 1 steps).
// Other text passes on to CLI11's own parsing (and its error for what is not a number).
inline CLI::Validator Int64() {
  return CLI::Validator(
      [](std::string& text) {
        int64_t value = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, value);
        if (ec != std::errc::result_out_of_range) return std::string();
        return "'" + text + "' is out of range: an integer from -9223372036854775808 to " +
               "9223372036854775807 (2^63 - 1) is expected";
      },
      "");
}

// One per command file.
CommandRunner SetupRunCommand(CLI::App& sub);       // run_command.cc
CommandRunner SetupTrainCommand(CLI::App& sub);     // train_command.cc
CommandRunner SetupPlanCommand(CLI::App& sub);      // plan_command.cc (train_options.h)
CommandRunner SetupSimulateCommand(CLI::App& sub);  // simulate_command.cc (train_options.h)
CommandRunner SetupScheduleCommand(CLI::App& sub);  // schedule_command.cc
CommandRunner SetupOpsCommand(CLI::App& sub);       // ops_command.cc
CommandRunner SetupSampleCommand(CLI::App& sub);    // sample_command.cc
CommandRunner SetupReportCommand(CLI::App& sub);    // report_command.cc
CommandRunner SetupExportCommand(CLI::App& sub);    // export_command.cc

}  // namespace sluice::cli
