// Checkpoints: safetensors files holding weights and optimizer state, with the run's metadata
// (step, configuration, data seed and position) in the safetensors "__metadata__" map, so that
// other frameworks can read the weights and sluice can resume bitwise.
//
// Saving is atomic (core/files.h WriteFileAtomic, never in place): the bytes go to
// "<path>.tmp-<pid>", are fsync'ed, renamed over <path>, and the directory is fsync'ed. A crash at
// any moment leaves either the previous checkpoint or the new one, never a torn file. A process
// killed mid-save leaves its "<path>.tmp-<pid>" behind; the next save of <path> removes it
// (core/files.h RemoveStaleTemporaries).
//
// Sharded checkpoints (one shard per pipeline stage, written by distributed runs): shard k of n of
// the save at step S is "<stem>-step<S>-stage<k>-of-<n>.safetensors" beside <path> (<stem> = <path>
// without ".safetensors"), and "<path>.index.json" holds {"metadata": {...}, "weight_map": {tensor
// name: shard file name}} — the layout Hugging Face uses. The index is written last, after every
// shard, with one atomic rename: a checkpoint with an index is complete, and since a save's shards
// never overwrite the previous save's (their names differ by step), a save interrupted anywhere
// (a full disk, a rank or host lost, a signal) leaves the previous checkpoint whole. The previous
// save's shards are removed once the new index is written (RemoveShardsOfOtherSaves).
// LoadCheckpoint(path) reads the index when <path> itself does not exist and follows its file
// names, so any run can resume from a sharded checkpoint, those of earlier versions (shards named
// without their step) included.
//
// Failure: IoError naming the path (unwritable directory, full disk, unreadable or malformed file,
// a shard that does not hold what its index says).
#pragma once

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "sluice/core/allocator.h"
#include "sluice/core/tensor.h"
#include "sluice/io/safetensors.h"

namespace sluice {

struct Checkpoint {
  std::string path;
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

// Refuses (NonFiniteError naming the tensor, nothing written) tensors holding NaN or ±inf: a
// diverged run never replaces a good checkpoint. Removes stale temporaries of `path` first.
void SaveCheckpointAtomic(const std::string& path, const std::map<std::string, Tensor>& tensors,
                          const std::map<std::string, std::string>& metadata);

// SaveCheckpointAtomic of tensors made one at a time, so that a save holds one tensor beside the
// file, not the whole state: `tensor(name)` is called once for each name of `entries`, in name
// order, and what it returns is checked, written and dropped before the next call. The file is
// byte for byte SaveCheckpointAtomic's of the same tensors. A tensor holding NaN or ±inf throws
// NonFiniteError naming it and the temporary is removed (nothing written) — the calls for the
// names after it are not made; a tensor whose dtype or shape is not its entry's is an internal
// error. The tensors the caller hands over are its own: tensor() may return a view of one it keeps.
// Example (replica 0 of a sharded optimizer gathers each state tensor as it is written,
// pipeline/pipeline_engine.cc):
//   std::map<std::string, SafetensorsEntry> entries = {{"w", {DType::kF32, Shape({512, 128})}}};
//   SaveCheckpointStreamed(path, entries, metadata,
//                          [&](const std::string& name) { return gather(name); });
void SaveCheckpointStreamed(const std::string& path,
                            const std::map<std::string, SafetensorsEntry>& entries,
                            const std::map<std::string, std::string>& metadata,
                            const std::function<Tensor(const std::string&)>& tensor);

// NonFiniteError naming `path`, the first tensor holding NaN or ±inf and its flat index.
void CheckFinite(const std::string& path, const std::map<std::string, Tensor>& tensors);

// A single-file checkpoint, or a sharded one through its index (shards merged). With `wanted`, a
// sharded checkpoint reads the tensors of only the shards that hold a tensor it accepts (a pipeline
// stage reads its own), and the header of every other shard: a shard the index names that is
// missing, or whose metadata (its step first) differs from the index's, is an IoError naming it on
// every reader, so that no rank of a job starts from a checkpoint another rank refuses. A single
// file is read whole. A tensor holding NaN or ±inf, which no save writes, is an
// IoError naming it (the file is damaged).
Checkpoint LoadCheckpoint(const std::string& path, Allocator& allocator = DefaultAllocator(),
                          const std::function<bool(const std::string&)>& wanted = nullptr);

std::string CheckpointIndexPath(const std::string& path);  // "<path>.index.json"
// Shard `shard` of `shards` of the save at `step`: "<stem>-step<step>-stage<k>-of-<n>.safetensors"
// (a stem already ending in "-step<step>", as a rescue path's does, does not name it twice).
// Without a step: "<stem>-stage<k>-of-<n>.safetensors", as earlier versions named every shard.
// Example: CheckpointShardPath("runs/ck.safetensors", 1, 4, "12") ==
// "runs/ck-step12-stage1-of-4.safetensors"
std::string CheckpointShardPath(const std::string& path, int shard, int shards,
                                const std::string& step = "");
// Writes the index of a checkpoint whose shard k (CheckpointShardPath with `step`) holds
// names_per_shard[k] (atomically).
void SaveCheckpointIndex(const std::string& path,
                         const std::vector<std::vector<std::string>>& names_per_shard,
                         const std::map<std::string, std::string>& metadata,
                         const std::string& step = "");
// After the index of the save at `step` is written: removes the files beside `path` that are shard
// `shard` of `shards` of another save (another step, or named without one), which no index of
// `path` names any more. Best effort (a file that cannot be removed stays; the checkpoint is whole
// either way); returns the files removed.
std::vector<std::string> RemoveShardsOfOtherSaves(const std::string& path, int shard, int shards,
                                                  const std::string& step);

}  // namespace sluice
