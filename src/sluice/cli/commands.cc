#include "sluice/cli/commands.h"

#include <functional>
#include <vector>

namespace sluice::cli {

namespace {
struct Command {
  CLI::App* app;
  std::function<int()> run;
};
std::vector<Command>& Commands() {
  static std::vector<Command> commands;
  return commands;
}
}  // namespace

void RegisterCommands(CLI::App& app) {
  // Subcommands are added here as they are written (run, train, schedule, ...).
  (void)app;
}

int RunSelected(CLI::App& app) {
  for (const Command& c : Commands()) {
    if (c.app->parsed()) return c.run();
  }
  return 0;
}

}  // namespace sluice::cli
