// The `sluice` command: one binary, one subcommand per job. Every subcommand turns bad input into
// a message on stderr and a non-zero exit status; nothing escapes as a crash.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "sluice/cli/commands.h"
#include "sluice/core/error.h"
#include "sluice/kernels/onednn_matmul.h"

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

// oneDNN runs its products on libgomp's OpenMP workers, and libgomp reads OMP_WAIT_POLICY once,
// when the process loads it, before main. Unset, the workers spin after every product and take
// the cores the stage threads, the intra-op pool and OpenBLAS need, so oneDNN then stays on the
// calling thread (kernels/onednn_matmul.h) and leaves --threads unused. So, when the variable is
// unset, sluice starts itself once more with OMP_WAIT_POLICY=passive (the workers sleep): the
// medium bf16 GPT on AMX at --threads 2 ran 1.37x the tokens/s (docs/benchmarks.md, "bf16 on
// AMX"). Only the commands that run kernels restart (train, run, sample: CommandSpec::
// runs_kernels); the others would pay a second start-up for nothing (docs/benchmarks.md,
// "Defaults on 2 cores"). A policy the user set is kept; SLUICE_NO_RESTART=1 skips the restart.
// Should the exec fail, the process goes on as before, with the variable unset again. The others
// forecast the runs that restart (plan, simulate: their memory forecast holds oneDNN's scratchpads,
// sized for the threads the run's products use), so they size oneDNN's primitives as a run with
// sleeping workers does (SizeOneDnnForSleepingWorkers), without restarting.
void RestartWithSleepingOpenMpWorkers(int argc, char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("SLUICE_NO_RESTART") != nullptr) {
    return;
  }
  // The subcommand is the first argument (sluice takes no options before it but --help and
  // --version, which run nothing).
  const auto commands = sluice::cli::Commands();
  if (argc < 2 || std::none_of(commands.begin(), commands.end(), [&](const auto& c) {
        return c.runs_kernels && std::string_view(argv[1]) == c.name;
      })) {
    sluice::kernels::SizeOneDnnForSleepingWorkers();
    return;
  }
  if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
  if (const char* v = std::getenv("SLUICE_VERBOSE");
      v != nullptr && *v != '\0' && std::string_view(v) != "0") {
    std::fprintf(stderr,
                 "sluice: restarting with OMP_WAIT_POLICY=passive (SLUICE_NO_RESTART=1 "
                 "skips it)\n");
  }
  execv("/proc/self/exe", argv);
  unsetenv("OMP_WAIT_POLICY");
}

// Started with standard input, output or error closed (`sluice train ... 2>&-`), the next file
// sluice opens would take that descriptor and receive what is printed there: progress lines and
// error messages went into the --metrics file. Each closed one of fds 0 to 2 is opened on
// /dev/null first (what goes there is lost, as the closing asked), before anything else opens a
// file. Without /dev/null (a bare chroot) the process ends with status 1 rather than run so.
void OpenClosedStandardDescriptors() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    // The lowest free descriptor is `fd`: those below it are open.
    const int opened = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
    if (opened != fd) _exit(1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  OpenClosedStandardDescriptors();
  RestartWithSleepingOpenMpWorkers(argc, argv);
  CLI::App app{"sluice: train neural networks with as little memory as the work allows"};
  app.set_version_flag("--version", sluice::cli::kSluiceVersion);
  app.require_subcommand(1);
  sluice::cli::RegisterCommands(app);
  try {
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      const int status = app.exit(e);  // --help and --version print on standard output
      sluice::cli::FlushStdout();
      return status;
    }
    const int status = sluice::cli::RunSelected(app);
    sluice::cli::FlushStdout();
    return status;
  } catch (const sluice::cli::StdoutClosed&) {
    return 128 + SIGPIPE;  // quietly, as a process SIGPIPE ends
  } catch (const sluice::Error& e) {
    sluice::cli::PrintToStderr("sluice: error: {}\n", ForTerminal(e.what()));
    return 1;
  } catch (const std::exception& e) {
    sluice::cli::PrintToStderr("sluice: internal error: {}\n", ForTerminal(e.what()));
    return 2;
  }
}
