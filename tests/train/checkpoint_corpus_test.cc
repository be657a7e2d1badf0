// The checkpoint fuzzer's seed corpus (fuzz/corpus/checkpoint, fuzz/checkpoint_fuzz.cc) as a
// regression suite for the readers it fuzzes: safetensors, the index of a sharded checkpoint and
// the training metadata. Inputs the fuzzer found bugs with are added to the corpus.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <string_view>

#include <gtest/gtest.h>

#include "sluice/core/error.h"
#include "sluice/io/checkpoint.h"
#include "sluice/io/safetensors.h"
#include "sluice/train/training_checkpoint.h"
#include "source_dir.h"

namespace sluice {
namespace {

// Byte 0 of a corpus file says what the rest is, as the fuzzer reads it: even, a safetensors
// file; odd, the index of a sharded checkpoint whose shards ckpt-stage0-of-2.safetensors (tensor
// "a") and ckpt-stage1-of-2.safetensors (tensor "b") lie beside it. valid_* read, the others fail
// with IoError; whatever reads has training metadata that parses or fails with IoError.
TEST(CheckpointCorpus, EveryInputReadsOrFailsWithIoError) {
  const std::filesystem::path dir =
      ::testing::TempDir() + "/checkpoint_corpus_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  const std::string ckpt = (dir / "ckpt.safetensors").string();
  WriteSafetensors(CheckpointShardPath(ckpt, 0, 2), {{"a", Tensor::Full({2}, 1.5, DType::kF32)}});
  WriteSafetensors(CheckpointShardPath(ckpt, 1, 2), {{"b", Tensor::Full({1}, 7, DType::kI64)}});
  int count = 0;
  for (const std::filesystem::path& file : testing_support::FuzzCorpus("checkpoint")) {
    ++count;
    std::ifstream in(file, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_FALSE(bytes.empty()) << file;
    auto read = [&] {
      if (static_cast<uint8_t>(bytes[0]) % 2 == 0) {
        return ParseSafetensors(std::string_view(bytes).substr(1), file.string()).metadata;
      }
      std::ofstream(CheckpointIndexPath(ckpt), std::ios::binary) << bytes.substr(1);
      return LoadCheckpoint(ckpt).metadata;
    };
    if (file.filename().string().starts_with("valid_")) {
      std::map<std::string, std::string> metadata;
      ASSERT_NO_THROW(metadata = read()) << file;
      try {
        ParseTrainingCheckpointMetadata(file.string(), metadata);
      } catch (const IoError&) {
      }
    } else {
      EXPECT_THROW(read(), IoError) << file;
    }
  }
  EXPECT_GT(count, 0);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sluice
