#include "sluice/cli/commands.h"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "sluice/core/error.h"

namespace sluice::cli {

namespace {

constexpr CommandSpec kCommands[] = {
    {"run", "Run a program (text format) with last-use freeing; report time and memory",
     SetupRunCommand, /*runs_kernels=*/true},
    {"train",
     "Train a GPT, an MLP or your own program (--program); progress on the terminal, JSON-lines "
     "metrics, checkpoints",
     SetupTrainCommand, /*runs_kernels=*/true},
    {"export", "Write the training program of --model gpt or mlp, to train with --program",
     SetupExportCommand},
    {"plan",
     "Predict each stage's peak memory before training (the train options); --memory-budget "
     "plans recompute to fit it",
     SetupPlanCommand},
    {"simulate",
     "Predict a pipeline step's time per stage (measured costs of --profile-out, or unit costs) "
     "beside its memory forecast",
     SetupSimulateCommand},
    {"schedule",
     "Print a pipeline schedule (gpipe, 1f1b, interleaved, zb-h1, zb-h2, zb-v, v-half, v-min) as "
     "an action grid or JSON",
     SetupScheduleCommand},
    {"ops", "List the ops programs can use: signature, doc, kernels and gradient of each",
     SetupOpsCommand},
    {"sample", "Generate text from a GPT checkpoint (KV cache): greedy or sampled, seeded",
     SetupSampleCommand, /*runs_kernels=*/true},
    {"report", "Write one self-contained HTML page of a run: losses, memory, the pipeline step",
     SetupReportCommand},
};

struct Registered {
  CLI::App* app;
  CommandRunner run;
};

std::vector<Registered>& RegisteredCommands() {
  static std::vector<Registered> registered;
  return registered;
}

}  // namespace

std::span<const CommandSpec> Commands() { return kCommands; }

void RegisterCommands(CLI::App& app) {
  for (const CommandSpec& spec : kCommands) {
    CLI::App* sub = app.add_subcommand(spec.name, spec.description);
    RegisteredCommands().push_back({sub, spec.setup(*sub)});
  }
}

int RunSelected(CLI::App& app) {
  for (const Registered& c : RegisteredCommands()) {
    if (c.app->parsed()) return c.run();
  }
  return 0;
}

void FailStdout(int error) {
  if (error == EPIPE) throw StdoutClosed{};
  throw IoError(
      fmt::format("cannot write to standard output{}: what was printed there is incomplete",
                  error == 0 ? std::string() : fmt::format(" ({})", std::strerror(error))));
}

void FlushStdout() {
  // An earlier write that failed (CLI11's --help through std::cout, a buffered fwrite) left the
  // stream's error flag and, on this thread, most likely its errno: the reason given, when known.
  const int earlier = errno;
  errno = 0;
  if (std::fflush(stdout) != 0) FailStdout(errno);
  if (std::ferror(stdout)) FailStdout(earlier);
}

}  // namespace sluice::cli
