#include "sluice/io/checkpoint.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "sluice/core/error.h"
#include "sluice/core/files.h"
#include "sluice/core/json_text.h"
#include "sluice/io/safetensors.h"

namespace sluice {

namespace {

// tmp + fsync + rename + directory fsync (core/files.h); never in place: a device or pipe at
// `path` is refused.
void SaveFileAtomic(const std::string& path, const std::string& bytes) {
  CheckReplaceable("checkpoint", path);  // the rename would replace a device or pipe at `path`
  WriteFileAtomic("checkpoint", path, bytes);
}

}  // namespace

namespace {

struct NonFiniteValue {
  const std::string* tensor;
  int64_t index;  // flat
  double value;
};

// The first value of `tensors` (in name order) that is NaN or ±inf.
std::optional<NonFiniteValue> FirstNonFinite(const std::map<std::string, Tensor>& tensors) {
  for (const auto& [name, t] : tensors) {
    if (!IsFloating(t.dtype())) continue;
    const int64_t n = t.numel();
    int64_t bad = -1;
    if (t.dtype() == DType::kF32 && t.is_contiguous()) {
      const float* p = t.data<float>();
      for (int64_t i = 0; i < n && bad < 0; ++i) {
        if (!std::isfinite(p[i])) bad = i;
      }
    } else {
      for (int64_t i = 0; i < n && bad < 0; ++i) {
        if (!std::isfinite(t.FlatAt(i))) bad = i;
      }
    }
    if (bad >= 0) return NonFiniteValue{&name, bad, t.FlatAt(bad)};
  }
  return std::nullopt;
}

}  // namespace

void CheckFinite(const std::string& path, const std::map<std::string, Tensor>& tensors) {
  if (const auto bad = FirstNonFinite(tensors)) {
    throw NonFiniteError(fmt::format(
        "not saving checkpoint '{}': tensor '{}' holds {} at flat index {}; the file on disk "
        "(if any) is left as it was",
        path, *bad->tensor, bad->value, bad->index));
  }
}

void SaveCheckpointAtomic(const std::string& path, const std::map<std::string, Tensor>& tensors,
                          const std::map<std::string, std::string>& metadata) {
  CheckFinite(path, tensors);
  // Streamed from the tensors: the save holds no serialized copy of them.
  std::map<std::string, SafetensorsEntry> entries;
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) {
      throw InvalidArgument(fmt::format("safetensors: tensor '{}' is undefined", name));
    }
    entries.emplace(name, SafetensorsEntry{t.dtype(), t.shape()});
  }
  SaveCheckpointStreamed(path, entries, metadata,
                         [&](const std::string& name) { return tensors.at(name); });
}

void SaveCheckpointStreamed(const std::string& path,
                            const std::map<std::string, SafetensorsEntry>& entries,
                            const std::map<std::string, std::string>& metadata,
                            const std::function<Tensor(const std::string&)>& tensor) {
  const std::string header = SafetensorsHeaderBytes(entries, metadata);
  CheckReplaceable("checkpoint", path);  // the rename would replace a device or pipe at `path`
  WriteFileAtomic("checkpoint", path, [&](const ByteSink& sink) {
    sink(header);
    for (const auto& [name, entry] : entries) {
      const Tensor t = tensor(name).Contiguous();
      SLUICE_CHECK(t.dtype() == entry.dtype && t.shape() == entry.shape,
                   "checkpoint '{}': tensor '{}' made as {}{}, its header says {}{}", path, name,
                   Name(t.dtype()), t.shape().ToString(), Name(entry.dtype),
                   entry.shape.ToString());
      CheckFinite(path, {{name, t}});
      if (t.nbytes() > 0) sink({static_cast<const char*>(t.raw_data()), t.nbytes()});
    }
  });
}

std::string CheckpointIndexPath(const std::string& path) { return path + ".index.json"; }

namespace {

// <path> without ".safetensors".
std::string CheckpointStem(const std::string& path) {
  std::string stem = path;
  if (stem.ends_with(".safetensors")) stem.resize(stem.size() - std::string(".safetensors").size());
  return stem;
}

}  // namespace

std::string CheckpointShardPath(const std::string& path, int shard, int shards,
                                const std::string& step) {
  std::string stem = CheckpointStem(path);
  if (!step.empty() && !stem.ends_with("-step" + step)) stem += "-step" + step;
  return fmt::format("{}-stage{}-of-{}.safetensors", stem, shard, shards);
}

std::vector<std::string> RemoveShardsOfOtherSaves(const std::string& path, int shard, int shards,
                                                  const std::string& step) {
  const std::filesystem::path keep(CheckpointShardPath(path, shard, shards, step));
  const std::string stem = std::filesystem::path(CheckpointStem(path)).filename().string();
  const std::string tail = fmt::format("-stage{}-of-{}.safetensors", shard, shards);
  // Another save's shard: "<stem><tail>" or "<stem>-step<digits><tail>".
  const auto of_another_save = [&](const std::string& name) {
    if (name == keep.filename().string() || !name.starts_with(stem) || !name.ends_with(tail) ||
        name.size() < stem.size() + tail.size()) {
      return false;
    }
    const std::string middle = name.substr(stem.size(), name.size() - stem.size() - tail.size());
    if (middle.empty()) return true;
    return middle.starts_with("-step") && middle.size() > 5 &&
           std::all_of(middle.begin() + 5, middle.end(),
                       [](unsigned char c) { return std::isdigit(c) != 0; });
  };
  std::vector<std::string> removed;
  std::error_code ec;
  const std::filesystem::path dir =
      keep.has_parent_path() ? keep.parent_path() : std::filesystem::path(".");
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (!entry.is_regular_file(ec) || !of_another_save(entry.path().filename().string())) continue;
    if (std::filesystem::remove(entry.path(), ec)) removed.push_back(entry.path().string());
  }
  return removed;
}

void SaveCheckpointIndex(const std::string& path,
                         const std::vector<std::vector<std::string>>& names_per_shard,
                         const std::map<std::string, std::string>& metadata,
                         const std::string& step) {
  nlohmann::json weight_map = nlohmann::json::object();
  const int shards = static_cast<int>(names_per_shard.size());
  for (int k = 0; k < shards; ++k) {
    const std::string file =
        std::filesystem::path(CheckpointShardPath(path, k, shards, step)).filename().string();
    for (const std::string& name : names_per_shard[k]) weight_map[name] = file;
  }
  const nlohmann::json index = {{"metadata", metadata}, {"weight_map", weight_map}};
  SaveFileAtomic(CheckpointIndexPath(path), index.dump(1) + "\n");
}

namespace {

// Throws IoError unless the shard's metadata agrees with its index's on every key both have.
void CheckShardOfThisSave(const std::string& shard,
                          const std::map<std::string, std::string>& metadata,
                          const std::map<std::string, std::string>& index_metadata,
                          const std::string& index_path) {
  // The step first: a shard of another step is the usual case, and the clearest to name.
  std::vector<std::pair<std::string, std::string>> keys(index_metadata.begin(),
                                                        index_metadata.end());
  std::stable_partition(keys.begin(), keys.end(), [](const auto& k) { return k.first == "step"; });
  for (const auto& [key, value] : keys) {
    auto it = metadata.find(key);
    if (it != metadata.end() && it->second != value) {
      throw IoError(fmt::format(
          "checkpoint shard '{}' has {} '{}' but its index '{}' has '{}': the shard is from "
          "another save",
          shard, key, it->second, index_path, value));
    }
  }
}

// A sharded checkpoint: the index's metadata, and every shard's tensors merged, each checked to be
// where the index says.
Checkpoint LoadSharded(const std::string& path, Allocator& allocator,
                       const std::function<bool(const std::string&)>& wanted) {
  const std::string index_path = CheckpointIndexPath(path);
  nlohmann::json index;
  const std::string text = ReadWholeFile("checkpoint index", index_path);
  try {
    index = ParseJsonText(text);
  } catch (const nlohmann::json::exception& e) {
    throw IoError(fmt::format("cannot read checkpoint index '{}': {}", index_path, e.what()));
  }
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object() ||
      !index.contains("metadata") || !index["metadata"].is_object()) {
    throw IoError(fmt::format(
        "checkpoint index '{}' needs the objects \"metadata\" and \"weight_map\"", index_path));
  }
  Checkpoint ckpt{path, {}, {}};
  std::set<std::string> files;
  for (const auto& [key, value] : index["metadata"].items()) {
    if (!value.is_string())
      throw IoError(
          fmt::format("checkpoint index '{}': metadata '{}' is not a string", index_path, key));
    ckpt.metadata[key] = value.get<std::string>();
  }
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (!file.is_string())
      throw IoError(fmt::format("checkpoint index '{}': '{}' names no file", index_path, name));
    // Shards lie beside their index (SaveCheckpointIndex writes bare file names): an index that
    // reaches elsewhere ("../x", "/etc/x", "sub/x") is refused rather than followed.
    const std::string& shard = file.get_ref<const std::string&>();
    if (shard.empty() || shard == "." || shard == ".." ||
        shard.find_first_of("/\\") != std::string::npos) {
      throw IoError(fmt::format(
          "checkpoint index '{}' places '{}' in '{}': a shard must be a file name in the index's "
          "folder",
          index_path, name, shard));
    }
    if (!wanted || wanted(name)) files.insert(file.get<std::string>());
  }
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  // Every shard the index names must be there and of this save, even those this reader skips:
  // a rank that reads one shard refuses a checkpoint with another missing or from another step,
  // as the ranks reading those do, so that no rank of a job starts on it.
  std::set<std::string> all_files;
  for (const auto& [name, file] : index["weight_map"].items())
    all_files.insert(file.get<std::string>());
  for (const std::string& file : all_files) {
    const std::string shard = (dir / file).string();
    if (!std::filesystem::exists(shard)) {
      throw IoError(fmt::format(
          "checkpoint '{}' is incomplete: its index '{}' names the shard '{}', which does not "
          "exist",
          path, index_path, shard));
    }
    if (files.count(file)) continue;  // read in full below, and checked there
    CheckShardOfThisSave(shard, ReadSafetensorsMetadata(shard), ckpt.metadata, index_path);
  }
  for (const std::string& file : files) {
    SafetensorsFile f = ReadSafetensors((dir / file).string(), allocator);
    // Every shard of one save carries the index's metadata: a shard left by another save (one
    // rank's part written before another's failed) must not be mixed into this state.
    CheckShardOfThisSave((dir / file).string(), f.metadata, ckpt.metadata, index_path);
    for (auto& [name, t] : f.tensors) {
      auto it = index["weight_map"].find(name);
      if (it == index["weight_map"].end() || it->get<std::string>() != file) {
        throw IoError(fmt::format(
            "checkpoint shard '{}' holds '{}', which its index '{}' does not place there",
            (dir / file).string(), name, index_path));
      }
      ckpt.tensors.emplace(name, std::move(t));
    }
  }
  for (const auto& [name, file] : index["weight_map"].items()) {
    if (files.count(file.get<std::string>()) && !ckpt.tensors.count(name)) {
      throw IoError(fmt::format("checkpoint index '{}' places '{}' in '{}', which does not hold it",
                                index_path, name, file.get<std::string>()));
    }
  }
  return ckpt;
}

// A single file or, where only its index exists, a sharded checkpoint.
Checkpoint LoadAnyCheckpoint(const std::string& path, Allocator& allocator,
                             const std::function<bool(const std::string&)>& wanted) {
  if (!std::filesystem::exists(path) && std::filesystem::exists(CheckpointIndexPath(path))) {
    return LoadSharded(path, allocator, wanted);
  }
  SafetensorsFile f = ReadSafetensors(path, allocator);
  return Checkpoint{path, std::move(f.tensors), std::move(f.metadata)};
}

}  // namespace

Checkpoint LoadCheckpoint(const std::string& path, Allocator& allocator,
                          const std::function<bool(const std::string&)>& wanted) {
  Checkpoint ckpt = LoadAnyCheckpoint(path, allocator, wanted);
  // sluice never saves such a value (SaveCheckpointAtomic): it is damage, and loaded it would
  // surface as a diverging first step (blamed on --lr) or, in sample, as garbage text.
  if (const auto bad = FirstNonFinite(ckpt.tensors)) {
    throw IoError(fmt::format(
        "checkpoint '{}': tensor '{}' holds {} at flat index {}; sluice never saves NaN or "
        "infinite values, so the file is damaged or was not written by sluice train",
        path, *bad->tensor, bad->value, bad->index));
  }
  return ckpt;
}

}  // namespace sluice
