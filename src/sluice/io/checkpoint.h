// Checkpoints: safetensors files holding weights and optimizer state, with the run's metadata
// (step, configuration, data seed and position) in the safetensors "__metadata__" map, so that
// other frameworks can read the weights and sluice can resume bitwise.
//
// Saving is atomic: the bytes go to "<path>.tmp-<pid>", are fsync'ed, renamed over <path>, and the
// directory is fsync'ed. A crash at any moment leaves either the previous checkpoint or the new
// one, never a torn file.
//
// Failure: IoError naming the path (unwritable directory, full disk, unreadable or malformed file).
#pragma once

#include <map>
#include <string>

#include "sluice/core/allocator.h"
#include "sluice/core/tensor.h"

namespace sluice {

struct Checkpoint {
  std::string path;
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

void SaveCheckpointAtomic(const std::string& path, const std::map<std::string, Tensor>& tensors,
                          const std::map<std::string, std::string>& metadata);

Checkpoint LoadCheckpoint(const std::string& path, Allocator& allocator = DefaultAllocator());

}  // namespace sluice
