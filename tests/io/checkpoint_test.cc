// Checkpoints: atomic single files, and sharded ones (a shard per stage + an index) read whole or
// only where a stage's tensors are, with clear errors when shards and index disagree.
#include "sluice/io/checkpoint.h"

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <limits>

#include <fmt/format.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "sluice/core/error.h"
#include "sluice/io/safetensors.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;

struct Sharded {
  std::string path;  // what --save names; the shards and the index lie beside it
  Sharded()
      : path(::testing::TempDir() + "/sharded_" + std::to_string(::getpid()) + "/ck.safetensors") {
    std::filesystem::create_directories(std::filesystem::path(path).parent_path());
    const std::map<std::string, std::string> metadata = {{"step", "7"}};
    SaveCheckpointAtomic(CheckpointShardPath(path, 0, 2),
                         {{"a", Tensor::Full({2}, 1.0, DType::kF32)}}, metadata);
    SaveCheckpointAtomic(
        CheckpointShardPath(path, 1, 2),
        {{"b", Tensor::Full({3}, 2.0, DType::kF32)}, {"c", Tensor::Full({}, 3.0, DType::kF32)}},
        metadata);
    SaveCheckpointIndex(path, {{"a"}, {"b", "c"}}, metadata);
  }
  ~Sharded() { std::filesystem::remove_all(std::filesystem::path(path).parent_path()); }
};

TEST(Checkpoint, ShardsAreNamedBesideThePathAndIndexed) {
  EXPECT_EQ(CheckpointShardPath("runs/ck.safetensors", 1, 4), "runs/ck-stage1-of-4.safetensors");
  EXPECT_EQ(CheckpointShardPath("runs/ck.safetensors", 1, 4, "12"),
            "runs/ck-step12-stage1-of-4.safetensors");
  // A rescue path names its step already.
  EXPECT_EQ(CheckpointShardPath("runs/ck.safetensors.rescue-step12.safetensors", 0, 2, "12"),
            "runs/ck.safetensors.rescue-step12-stage0-of-2.safetensors");
  EXPECT_EQ(CheckpointIndexPath("runs/ck.safetensors"), "runs/ck.safetensors.index.json");
}

// A save whose shards are written but whose index is not (a rank lost, a full disk, a signal
// between the two) leaves the previous checkpoint whole: the new shards are named by their step and
// overwrite nothing. Once the new index is written, the previous save's shards go.
TEST(Checkpoint, AnInterruptedSaveLeavesThePreviousCheckpointWhole) {
  const std::filesystem::path dir =
      ::testing::TempDir() + "/interrupted_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string path = (dir / "ck.safetensors").string();
  const auto save_shards = [&](const std::string& step, double value) {
    const std::map<std::string, std::string> metadata = {{"step", step}};
    SaveCheckpointAtomic(CheckpointShardPath(path, 0, 2, step),
                         {{"a", Tensor::Full({2}, value, DType::kF32)}}, metadata);
    SaveCheckpointAtomic(CheckpointShardPath(path, 1, 2, step),
                         {{"b", Tensor::Full({1}, value, DType::kF32)}}, metadata);
    return metadata;
  };
  SaveCheckpointIndex(path, {{"a"}, {"b"}}, save_shards("7", 1.0), "7");
  // Step 9's shards are written; its index is not.
  const std::map<std::string, std::string> nine = save_shards("9", 2.0);
  Checkpoint ck = LoadCheckpoint(path);
  EXPECT_EQ(ck.metadata.at("step"), "7");
  EXPECT_EQ(ck.tensors.at("a").data<float>()[0], 1.0f);
  EXPECT_EQ(ck.tensors.at("b").data<float>()[0], 1.0f);
  // The save completes: the index names step 9's shards, and step 7's are removed. A file of
  // another checkpoint, or of another number of shards, stays.
  SaveCheckpointIndex(path, {{"a"}, {"b"}}, nine, "9");
  std::ofstream((dir / "ck-step7-stage0-of-4.safetensors").string()) << "x";
  std::ofstream((dir / "other-step7-stage0-of-2.safetensors").string()) << "x";
  std::ofstream((dir / "ck-stage1-of-2.safetensors").string()) << "x";  // an earlier version's
  EXPECT_EQ(RemoveShardsOfOtherSaves(path, 0, 2, "9").size(), 1u);
  EXPECT_EQ(RemoveShardsOfOtherSaves(path, 1, 2, "9").size(), 2u);
  EXPECT_FALSE(std::filesystem::exists(CheckpointShardPath(path, 0, 2, "7")));
  EXPECT_FALSE(std::filesystem::exists(CheckpointShardPath(path, 1, 2, "7")));
  EXPECT_FALSE(std::filesystem::exists(dir / "ck-stage1-of-2.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(dir / "ck-step7-stage0-of-4.safetensors"));
  EXPECT_TRUE(std::filesystem::exists(dir / "other-step7-stage0-of-2.safetensors"));
  ck = LoadCheckpoint(path);
  EXPECT_EQ(ck.metadata.at("step"), "9");
  EXPECT_EQ(ck.tensors.at("a").data<float>()[0], 2.0f);
  std::filesystem::remove_all(dir);
}

TEST(Checkpoint, AShardedCheckpointLoadsThroughItsIndex) {
  Sharded ck;
  Checkpoint all = LoadCheckpoint(ck.path);
  ASSERT_EQ(all.tensors.size(), 3u);
  EXPECT_EQ(all.tensors.at("b").FlatAt(2), 2.0);
  EXPECT_EQ(all.metadata.at("step"), "7");
}

TEST(Checkpoint, AStageReadsOnlyTheTensorsOfTheShardsHoldingItsOwn) {
  Sharded ck;
  // Shard 0's tensor bytes rewritten in place (1.0 → 5.0, its size kept): a stage holding "b" and
  // "c" reads only shard 0's header, so it loads as before; the whole checkpoint reads the bytes.
  const std::string shard0 = CheckpointShardPath(ck.path, 0, 2);
  uint64_t header_len = 0;
  {
    std::fstream f(shard0, std::ios::binary | std::ios::in | std::ios::out);
    f.read(reinterpret_cast<char*>(&header_len), 8);
    const float fives[2] = {5.0f, 5.0f};
    f.seekp(static_cast<std::streamoff>(8 + header_len));
    f.write(reinterpret_cast<const char*>(fives), sizeof(fives));
  }
  Checkpoint mine =
      LoadCheckpoint(ck.path, DefaultAllocator(), [](const std::string& n) { return n != "a"; });
  EXPECT_EQ(mine.tensors.size(), 2u);
  EXPECT_EQ(mine.tensors.at("c").FlatAt(0), 3.0);
  EXPECT_EQ(LoadCheckpoint(ck.path).tensors.at("a").FlatAt(1), 5.0);

  // Cut short after its header, shard 0 is refused by that stage too, by its size: every rank of a
  // job refuses it, not only the one that reads its tensors.
  std::filesystem::resize_file(shard0, 8 + header_len);
  try {
    LoadCheckpoint(ck.path, DefaultAllocator(), [](const std::string& n) { return n != "a"; });
    FAIL() << "a shard cut short was accepted by the stage that does not read its tensors";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr("ck-stage0-of-2.safetensors"));
    EXPECT_THAT(e.what(), HasSubstr("run past the data buffer"));
  }
  EXPECT_THROW(LoadCheckpoint(ck.path), IoError);
}

// Issue 38: every rank of a job refuses a checkpoint with a shard missing, not only the ranks that
// would read it, so that none starts (and writes metrics) while the others fail.
TEST(Checkpoint, AMissingShardIsRefusedByEveryStageNamingIt) {
  Sharded ck;
  std::filesystem::remove(CheckpointShardPath(ck.path, 0, 2));
  for (bool whole : {true, false}) {
    try {
      if (whole) {
        LoadCheckpoint(ck.path);
      } else {
        LoadCheckpoint(ck.path, DefaultAllocator(), [](const std::string& n) { return n != "a"; });
      }
      FAIL() << "a checkpoint missing shard 0 was accepted" << (whole ? "" : " by stage 1");
    } catch (const IoError& e) {
      EXPECT_THAT(e.what(), HasSubstr("is incomplete"));
      EXPECT_THAT(e.what(), HasSubstr("ck-stage0-of-2.safetensors', which does not exist"));
    }
  }
}

TEST(Checkpoint, AnIndexPlacingATensorInTheWrongShardIsAnError) {
  Sharded ck;
  SaveCheckpointIndex(ck.path, {{"a", "b"}, {"c"}}, {{"step", "7"}});
  try {
    LoadCheckpoint(ck.path);
    FAIL() << "a tensor in a shard its index does not place there was accepted";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr("'b'"));
    EXPECT_THAT(e.what(), HasSubstr("ck-stage1-of-2.safetensors"));
  }
}

// A distributed save whose second shard failed leaves the first shard of the new step beside the
// index and second shard of the previous save: loading it must not mix the two states.
TEST(Checkpoint, AShardOfAnotherSaveIsAnError) {
  Sharded ck;
  SaveCheckpointAtomic(CheckpointShardPath(ck.path, 0, 2),
                       {{"a", Tensor::Full({2}, 5.0, DType::kF32)}},
                       {{"step", "9"}, {"shard", "0 of 2"}});
  try {
    LoadCheckpoint(ck.path);
    FAIL() << "a shard of step 9 was mixed into the checkpoint of step 7";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr("ck-stage0-of-2.safetensors' has step '9'"));
    EXPECT_THAT(e.what(), HasSubstr("has '7'"));
  }
  // A stage that reads only the other shard refuses it too (issue 38), from its header alone.
  try {
    LoadCheckpoint(ck.path, DefaultAllocator(), [](const std::string& n) { return n != "a"; });
    FAIL() << "stage 1 accepted a checkpoint whose shard 0 is of step 9";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr("ck-stage0-of-2.safetensors' has step '9'"));
    EXPECT_THAT(e.what(), HasSubstr("the shard is from another save"));
  }
}

TEST(Checkpoint, AnIndexNamingAShardOutsideItsFolderIsRefused) {
  Sharded ck;
  for (const char* shard : {"../ck-stage0-of-2.safetensors", "/etc/passwd", "sub/x.safetensors",
                            "..", "", "a\\b.safetensors"}) {
    const nlohmann::json index = {{"metadata", {{"step", "7"}}}, {"weight_map", {{"a", shard}}}};
    std::ofstream(CheckpointIndexPath(ck.path)) << index.dump();
    try {
      LoadCheckpoint(ck.path);
      ADD_FAILURE() << "an index placing 'a' in '" << shard << "' was followed";
    } catch (const IoError& e) {
      EXPECT_THAT(e.what(), HasSubstr("a shard must be a file name in the index's folder"));
      EXPECT_THAT(e.what(), HasSubstr("ck.safetensors.index.json"));
    }
  }
}

TEST(Checkpoint, AMalformedIndexIsAnErrorNamingIt) {
  Sharded ck;
  std::ofstream(CheckpointIndexPath(ck.path)) << "{\"weight_map\": 3}";
  try {
    LoadCheckpoint(ck.path);
    FAIL() << "a malformed index was accepted";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr("ck.safetensors.index.json"));
  }
}

}  // namespace
}  // namespace sluice

namespace sluice {
namespace {

std::string ScratchDir(const std::string& name) {
  const std::string dir = ::testing::TempDir() + "/" + name + "_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  return dir;
}

// Regression: a run whose weights went NaN saved them over a good checkpoint with exit 0.
TEST(Checkpoint, ATensorHoldingNanOrInfIsNeverSaved) {
  const std::string dir = ScratchDir("nonfinite");
  const std::string path = dir + "/ck.safetensors";
  SaveCheckpointAtomic(path, {{"w", Tensor::Full({3}, 1.0, DType::kF32)}}, {});
  const auto good_size = std::filesystem::file_size(path);
  Tensor bad = Tensor::Full({3}, 1.0, DType::kF32);
  bad.data<float>()[2] = std::numeric_limits<float>::quiet_NaN();
  try {
    SaveCheckpointAtomic(path, {{"a", Tensor::Full({2}, 0.5, DType::kF64)}, {"w", bad}}, {});
    FAIL() << "a NaN was saved";
  } catch (const NonFiniteError& e) {
    EXPECT_THAT(e.what(), HasSubstr("tensor 'w' holds nan at flat index 2"));
    EXPECT_THAT(e.what(), HasSubstr(path));
  }
  Tensor inf = Tensor::Full({2}, 1.0, DType::kF64);
  inf.data<double>()[0] = -std::numeric_limits<double>::infinity();
  EXPECT_THROW(SaveCheckpointAtomic(path, {{"v", inf}}, {}), NonFiniteError);
  // The good checkpoint is untouched, and integer tensors are not checked (they cannot be NaN).
  EXPECT_EQ(std::filesystem::file_size(path), good_size);
  EXPECT_EQ(LoadCheckpoint(path).tensors.count("w"), 1u);
  std::filesystem::remove_all(dir);
}

// A save streamed one tensor at a time writes the bytes the whole-state serialization does, asks
// for each tensor once in name order, and a non-finite tensor part way leaves nothing written and
// asks for nothing after it.
TEST(Checkpoint, AStreamedSaveWritesTheSameFileOneTensorAtATime) {
  const std::string dir = ScratchDir("streamed");
  const std::string path = dir + "/ck.safetensors";
  Tensor w = Tensor::Full({2, 3}, 0.25, DType::kF32);
  w.data<float>()[4] = -0.0f;
  const std::map<std::string, Tensor> tensors = {
      {"w", w},
      {"a.exp_avg", Tensor::Full({5}, -1.5, DType::kF32)},
      {"b", Tensor::Full({}, 3.0, DType::kF64)},
      {"i", Tensor::Full({4}, 7, DType::kI64)},
      {"empty", Tensor::Full({0, 2}, 1.0, DType::kF32)},
      {"t", Tensor::Full({3, 2}, 2.0, DType::kF32).Transpose(0, 1)}};  // not contiguous
  const std::map<std::string, std::string> metadata = {{"step", "3"}, {"shard", "0 of 2"}};
  std::map<std::string, SafetensorsEntry> entries;
  for (const auto& [name, t] : tensors)
    entries.emplace(name, SafetensorsEntry{t.dtype(), t.shape()});
  std::vector<std::string> asked;
  SaveCheckpointStreamed(path, entries, metadata, [&](const std::string& name) {
    asked.push_back(name);
    return tensors.at(name).Contiguous();
  });
  std::ifstream in(path, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(bytes, SerializeSafetensors(tensors, metadata));
  EXPECT_EQ(asked, (std::vector<std::string>{"a.exp_avg", "b", "empty", "i", "t", "w"}));
  // SaveCheckpointAtomic streams the same bytes.
  const std::string whole = dir + "/whole.safetensors";
  SaveCheckpointAtomic(whole, tensors, metadata);
  std::ifstream in2(whole, std::ios::binary);
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(in2)), std::istreambuf_iterator<char>()),
            bytes);

  // A NaN in "empty"'s successor: the file keeps the previous save, no temporary is left, and the
  // tensors after it are not asked for.
  Tensor bad = Tensor::Full({4}, 7.0, DType::kF32);
  bad.data<float>()[1] = std::numeric_limits<float>::quiet_NaN();
  std::map<std::string, SafetensorsEntry> with_bad = entries;
  with_bad["i"] = SafetensorsEntry{DType::kF32, Shape({4})};
  asked.clear();
  try {
    SaveCheckpointStreamed(path, with_bad, metadata, [&](const std::string& name) {
      asked.push_back(name);
      return name == "i" ? bad : tensors.at(name);
    });
    FAIL() << "a NaN was saved";
  } catch (const NonFiniteError& e) {
    EXPECT_THAT(e.what(), HasSubstr("tensor 'i' holds nan at flat index 1"));
  }
  EXPECT_EQ(asked, (std::vector<std::string>{"a.exp_avg", "b", "empty", "i"}));
  std::ifstream in3(path, std::ios::binary);
  EXPECT_EQ(std::string((std::istreambuf_iterator<char>(in3)), std::istreambuf_iterator<char>()),
            bytes);
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    EXPECT_THAT(entry.path().filename().string(), ::testing::Not(HasSubstr(".tmp-")));
  // A tensor made with another shape than its entry's is a bug in the caller, not a file.
  EXPECT_THROW(
      SaveCheckpointStreamed(path, entries, metadata, [&](const std::string&) { return bad; }),
      InternalError);
  std::filesystem::remove_all(dir);
}

// No save writes NaN or ±inf, so one in a file is damage: loading it is an IoError naming the
// tensor, not weights that diverge at the first step.
TEST(Checkpoint, ATensorHoldingNanOrInfIsRefusedWhenLoaded) {
  const std::string dir = ScratchDir("load_nonfinite");
  const std::string path = dir + "/ck.safetensors";
  Tensor w = Tensor::Full({4}, 1.0, DType::kF32);
  w.data<float>()[1] = std::numeric_limits<float>::infinity();
  WriteSafetensors(path, {{"a", Tensor::Full({2}, 0.5, DType::kF32)}, {"w", w}});
  try {
    LoadCheckpoint(path);
    FAIL() << "an inf was loaded";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr("checkpoint '" + path +
                                    "': tensor 'w' holds inf at flat index 1; sluice never saves "
                                    "NaN or infinite values"));
  }
  std::filesystem::remove_all(dir);
}

// Regression: the rename of a save replaced a device or a pipe at the checkpoint's path.
TEST(Checkpoint, ASaveNeverReplacesADeviceOrAPipe) {
  const std::string dir = ScratchDir("fifo");
  const std::string fifo = dir + "/ck.safetensors";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  try {
    SaveCheckpointAtomic(fifo, {{"w", Tensor::Full({3}, 1.0, DType::kF32)}}, {});
    FAIL() << "saved over a pipe";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr("checkpoint '" + fifo + "' is a pipe"));
  }
  EXPECT_TRUE(std::filesystem::is_fifo(fifo));
  std::filesystem::remove_all(dir);
}

// Regression: kill -9 during a save left "<path>.tmp-<pid>" files that were never removed.
TEST(Checkpoint, TheNextSaveRemovesTheTemporariesOfDeadProcesses) {
  const std::string dir = ScratchDir("stale_tmp");
  const std::string path = dir + "/ck.safetensors";
  pid_t gone = 4'000'000;  // a pid that runs nothing (above most pid_max; probed to be sure)
  while (::kill(gone, 0) == 0 || errno != ESRCH) --gone;
  const std::string stale = fmt::format("{}.tmp-{}", path, gone);
  const std::string live = fmt::format("{}.tmp-{}", path, ::getppid());  // our parent runs
  const std::string other = dir + "/other.safetensors.tmp-" + std::to_string(gone);
  const std::string not_ours = path + ".tmp-notapid";
  for (const std::string& f : {stale, live, other, not_ours}) std::ofstream(f) << "partial";
  SaveCheckpointAtomic(path, {{"w", Tensor::Full({1}, 1.0, DType::kF32)}}, {});
  EXPECT_FALSE(std::filesystem::exists(stale));
  EXPECT_TRUE(std::filesystem::exists(live)) << "a running process's temporary was removed";
  EXPECT_TRUE(std::filesystem::exists(other)) << "another checkpoint's temporary was removed";
  EXPECT_TRUE(std::filesystem::exists(not_ours));
  EXPECT_TRUE(std::filesystem::exists(path));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sluice
