// The files a command reads and writes, checked before it does any work (core/files.h): an output
// that is one of the inputs or another output is refused, and every output's folder must be
// writable — so that a mistyped path fails at once, not after the training it would have saved.
//
// Failure: InvalidArgument (paths that clash) or IoError (an output that cannot be written), each
// naming the options and the paths. Thread-safety: called from main only.
#pragma once

#include <string>

#include "sluice/step/train_config.h"

namespace sluice::cli {

// `sluice train`: inputs --data (a file), --resume, --init-from; outputs --save (its shards and
// index beside it; written by rename, so never over a device or pipe), --metrics, --trace,
// --profile-out.
void CheckTrainFiles(const TrainConfig& config, const std::string& trace_path,
                     const std::string& profile_path);

// `sluice run`: inputs the program and --inputs; output --trace.
void CheckRunFiles(const std::string& program, const std::string& inputs,
                   const std::string& trace_path);

}  // namespace sluice::cli
