// Checkpoints: atomic single files, and sharded ones (a shard per stage + an index) read whole or
// only where a stage's tensors are, with clear errors when shards and index disagree.
#include "sluice/io/checkpoint.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sluice/core/error.h"

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
  EXPECT_EQ(CheckpointIndexPath("runs/ck.safetensors"), "runs/ck.safetensors.index.json");
}

TEST(Checkpoint, AShardedCheckpointLoadsThroughItsIndex) {
  Sharded ck;
  Checkpoint all = LoadCheckpoint(ck.path);
  ASSERT_EQ(all.tensors.size(), 3u);
  EXPECT_EQ(all.tensors.at("b").FlatAt(2), 2.0);
  EXPECT_EQ(all.metadata.at("step"), "7");
}

TEST(Checkpoint, AStageReadsOnlyTheShardsHoldingItsTensors) {
  Sharded ck;
  std::filesystem::remove(CheckpointShardPath(ck.path, 0, 2));  // never read for "b" and "c"
  Checkpoint mine =
      LoadCheckpoint(ck.path, DefaultAllocator(), [](const std::string& n) { return n != "a"; });
  EXPECT_EQ(mine.tensors.size(), 2u);
  EXPECT_EQ(mine.tensors.at("c").FlatAt(0), 3.0);
  EXPECT_THROW(LoadCheckpoint(ck.path), IoError);  // the whole checkpoint needs the missing shard
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
