#include "sluice/cli/file_checks.h"

#include "sluice/core/files.h"
#include "sluice/io/checkpoint.h"

namespace sluice::cli {

void CheckTrainFiles(const TrainConfig& c, const std::string& trace_path,
                     const std::string& profile_path) {
  // The GPT and programs read a file; MakeTask refuses any other --data of the MLP before reading.
  const bool data_file = c.model != "mlp" && c.data != "sort" && c.data != "blobs";
  std::vector<NamedPath> inputs = {{"--program", c.program},
                                   {"--data", data_file ? c.data : ""},
                                   {"--resume", c.resume_path},
                                   {"--init-from", c.init_from}};
  // A sharded checkpoint is read through its index.
  for (const std::string& ckpt : {c.resume_path, c.init_from}) {
    if (!ckpt.empty()) inputs.push_back({"the index of " + ckpt, CheckpointIndexPath(ckpt)});
  }
  CheckOutputPaths(
      inputs, {{"--save", c.save_path, /*replaced=*/true},
               {"--metrics", c.metrics_path},
               {"--trace", trace_path},
               {"--profile-out", profile_path},
               {"the index of --save", c.save_path.empty() ? "" : CheckpointIndexPath(c.save_path),
                /*replaced=*/true}});
}

void CheckRunFiles(const std::string& program, const std::string& inputs,
                   const std::string& trace_path) {
  CheckOutputPaths({{"program", program}, {"--inputs", inputs}}, {{"--trace", trace_path}});
}

}  // namespace sluice::cli
