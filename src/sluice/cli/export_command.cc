// `sluice export [model options] --out FILE.sluice`: writes the training program `sluice train
// --model ...` trains with the same options — forward and loss, each parameter's initializer, the
// data arrays its inputs bind, units — with the batch and sequence sizes written B and T, so that
// `sluice train --program FILE.sluice` trains it at any batch, micro-batching and pipeline split
// with bitwise the losses of --model (nn/training_program.h). The vocabulary comes from --data as
// for train.
//
// Example:
//   sluice export --model gpt --layers 4 --out gpt.sluice
//   sluice train --program gpt.sluice --steps 100
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include <fmt/format.h>

#include "sluice/cli/commands.h"
#include "sluice/cli/train_options.h"
#include "sluice/core/error.h"
#include "sluice/core/files.h"
#include "sluice/step/program_task.h"

namespace sluice::cli {

namespace {}  // namespace

CommandRunner SetupExportCommand(CLI::App& sub) {
  TrainOptions options = AddTrainOptions(sub, TrainCommand::kNoTraining);
  auto out = std::make_shared<std::string>();
  sub.add_option("--out", *out, "the program file to write (.sluice)")
      ->required()
      ->check(NonEmptyPath());
  return [options, out] {
    options.finish();
    TrainArgs& a = *options.args;
    Configure(a);
    const TrainConfig& c = a.config;
    if (c.model == "program") {
      throw InvalidArgument(
          "--program: export writes the program of a built-in --model (gpt or "
          "mlp); a program file is one already");
    }
    CheckOutputPaths({}, {{"--out", *out, /*replaced=*/true}});
    const std::string text = ExportBuiltinProgram(c);
    WriteFileAtomic("program", *out, text);  // a failed write leaves what was there
    PrintToStdout("wrote {} (--model {}): train it with sluice train --program {} --data {}\n",
                  *out, c.model, *out, c.data);
    return 0;
  };
}

}  // namespace sluice::cli
