// `sluice schedule`: prints a pipeline schedule (schedule/schedules.h) before anything runs it —
// as the action grid, ranks × time steps at unit cost with the in-flight micro-batches and the
// bubble of every rank, or with --format json as the full action lists (sends and receives
// included) that the stage runtime executes. Every printed schedule has passed the validator.
// A request no schedule can meet (1f1b with fewer micro-batches than stages, …) is an error that
// names the fix.
//
// Example:
//   sluice schedule --stages 4 --microbatches 8 --schedule 1f1b
//   sluice schedule --stages 4 --microbatches 8 --schedule interleaved --chunks 2 --format json
//   sluice schedule -p 8 -m 32 -s interleaved --post-receives-ahead   # receives posted early
//   sluice schedule -p 8 -m 32 -s zb-h2 --post-validate   # steady-state bubble of interlocked
//   steps
#include <cerrno>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include <fmt/format.h>

#include "sluice/cli/commands.h"
#include "sluice/core/enum_names.h"
#include "sluice/core/error.h"
#include "sluice/schedule/schedule_format.h"
#include "sluice/schedule/schedules.h"

namespace sluice::cli {

namespace {

struct ScheduleArgs {
  int stages = 0;
  int micro_batches = 0;
  std::string schedule = "1f1b";
  int chunks = 0;
  bool post_receives_ahead = false;
  bool post_validate = false;
  std::string format = "table";
};

int RunSchedule(const ScheduleArgs& args) {
  const std::optional<pipeline::ScheduleKind> kind = pipeline::ParseScheduleKind(args.schedule);
  if (!kind) {
    throw InvalidArgument(fmt::format("unknown schedule '{}': choose one of {}", args.schedule,
                                      EnumNames(pipeline::kScheduleKindNames, ", ")));
  }
  const pipeline::Schedule schedule =
      pipeline::MakeSchedule({.kind = *kind,
                              .stages = args.stages,
                              .micro_batches = args.micro_batches,
                              .chunks = args.chunks,
                              .post_receives_ahead = args.post_receives_ahead});
  if (args.post_validate && args.stages < 2) {
    throw InvalidArgument(fmt::format(
        "--post-validate interlocks the steps of a pipeline's stages, and --stages {} has none "
        "to interlock: give --stages 2 or more, or drop --post-validate",
        args.stages));
  }
  std::optional<pipeline::SteadyState> steady;
  if (args.post_validate) steady = pipeline::GridSteadyState(schedule);
  // Streamed: at P = 1024, M = 8192 the JSON is 2 GB. A failed write leaves its errno.
  errno = 0;
  if (args.format == "json") {
    pipeline::WriteScheduleJson(schedule, std::cout, /*validated=*/true,  // MakeSchedule did
                                steady ? &*steady : nullptr);
    std::cout << "\n";
  } else {
    pipeline::WriteScheduleTable(schedule, std::cout, /*validated=*/true);
    if (steady) std::cout << pipeline::FormatSteadyState(*steady);
  }
  std::cout.flush();
  if (!std::cout) FailStdout(errno);
  return 0;
}

}  // namespace

CommandRunner SetupScheduleCommand(CLI::App& sub) {
  auto args = std::make_shared<ScheduleArgs>();
  sub.add_option("--stages,-p", args->stages, "Pipeline stages P (ranks)")->required();
  sub.add_option("--microbatches,-m", args->micro_batches, "Micro-batches M per step")->required();
  sub.add_option("--schedule,-s", args->schedule,
                 "One of " + EnumNames(pipeline::kScheduleKindNames, ", "))
      ->capture_default_str();
  sub.add_option("--chunks,-v", args->chunks,
                 "Chunks V per rank (interleaved: default 2; zb-v, v-half, v-min: exactly 2; "
                 "0: the default)");
  sub.add_flag("--post-receives-ahead", args->post_receives_ahead,
               "List each receive right after the rank's previous message (for sends that block "
               "until their receive is posted; default off)");
  sub.add_flag("--post-validate", args->post_validate,
               "Optimizer post-validation: the steps interlock; print the steady-state bubble "
               "beside the synchronous one, and the first fill and last drain (default off)");
  sub.add_option("--format", args->format,
                 "table (the action grid) or json (every action, in order)")
      ->check(CLI::IsMember({"table", "json"}))
      ->capture_default_str();
  return [args] { return RunSchedule(*args); };
}

}  // namespace sluice::cli
