// The data fuzzer's seed corpus (fuzz/corpus/data, fuzz/data_fuzz.cc) as a regression suite for
// the --data readers: byte 0 picks text, a .bin token file or a safetensors array file, byte 1
// the sequence length, byte 2 the token file's vocabulary, as the fuzzer reads them. valid_* open
// and give batches; the others fail with IoError or InvalidArgument.
#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>

#include <gtest/gtest.h>

#include "sluice/core/error.h"
#include "sluice/io/safetensors.h"
#include "sluice/nn/data.h"
#include "sluice/step/array_dataset.h"
#include "source_dir.h"

namespace sluice {
namespace {

TEST(DataCorpus, EveryInputOpensOrFailsCleanly) {
  const std::filesystem::path dir =
      ::testing::TempDir() + "/data_corpus_" + std::to_string(::getpid());
  std::filesystem::create_directories(dir);
  int count = 0;
  for (const std::filesystem::path& file : testing_support::FuzzCorpus("data")) {
    ++count;
    std::ifstream in(file, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_GE(bytes.size(), 3u) << file;
    const int kind = static_cast<uint8_t>(bytes[0]) % 3;
    const int64_t seq = 1 + static_cast<uint8_t>(bytes[1]) % 16;
    const int64_t vocab = int64_t{static_cast<uint8_t>(bytes[2])} * 257;
    static const char* const kNames[] = {"data.txt", "tokens.bin", "arrays.safetensors"};
    const std::string path = (dir / kNames[kind]).string();
    std::ofstream(path, std::ios::binary) << bytes.substr(3);
    auto open = [&] {
      if (kind == 2) {
        const ArrayDataset data(path);
        for (const std::string& name : data.names()) data.LargestValue(name);
        return data.GetBatch(DataSplit::kValidation, 0, 2, 1).size();
      }
      const auto data = OpenTokenData(path, seq, kind == 1 ? vocab : 0);
      return static_cast<size_t>(data->GetBatch(DataSplit::kValidation, 0, 2, 1).ids.numel());
    };
    if (file.filename().string().starts_with("valid_")) {
      EXPECT_NO_THROW(open()) << file;
    } else {
      try {
        open();
        ADD_FAILURE() << file << " opened";
      } catch (const IoError&) {
      } catch (const InvalidArgument&) {
      }
    }
  }
  EXPECT_GT(count, 0);
  std::filesystem::remove_all(dir);
}

// Regression: the largest value of an i64 array was read through a double, and 2^63 - 1 rounded
// to 2^63, which no int64_t holds (undefined behaviour; fuzz/corpus/data/valid_arrays_largest_i64).
TEST(ArrayDataset, TheLargestValueOfAnI64ArrayIsExact) {
  const std::filesystem::path path = std::filesystem::path(::testing::TempDir()) /
                                     ("largest_" + std::to_string(::getpid()) + ".safetensors");
  constexpr int64_t kMax = INT64_MAX;
  WriteSafetensors(
      path.string(),
      {{"x", Tensor::Zeros({3, 1}, DType::kF32)},
       {"big", Tensor::FromVector<int64_t>({3}, {kMax, INT64_MIN, (int64_t{1} << 53) + 1})},
       {"odd", Tensor::FromVector<int64_t>({3}, {1, (int64_t{1} << 53) + 1, 0})},
       {"empty", Tensor::Zeros({3, 0}, DType::kI32)}});
  const ArrayDataset data(path.string());
  EXPECT_EQ(data.LargestValue("big"), kMax);
  EXPECT_EQ(data.LargestValue("odd"), (int64_t{1} << 53) + 1);  // a double rounds it to 2^53
  EXPECT_EQ(data.LargestValue("empty"), INT64_MIN);
  EXPECT_EQ(data.LargestValue("x"), std::nullopt);
  std::filesystem::remove(path);
}

// Regression (data_fuzz, fuzz/corpus/data/valid_arrays_empty_rows): an array whose examples hold
// no elements ([N, 0]) has no storage, and a batch copied its rows from that null pointer
// (memcpy of 0 bytes from null: undefined behaviour, UBSan's report).
TEST(ArrayDataset, ExamplesOfNoElementsBatchToEmptyRows) {
  const std::filesystem::path path = std::filesystem::path(::testing::TempDir()) /
                                     ("empty_rows_" + std::to_string(::getpid()) + ".safetensors");
  WriteSafetensors(path.string(), {{"x", Tensor::Zeros({3, 0}, DType::kF32)},
                                   {"labels", Tensor::FromVector<int64_t>({3}, {0, 1, 2})}});
  const ArrayDataset data(path.string());
  const std::map<std::string, Tensor> batch = data.GetBatch(DataSplit::kTrain, 0, 4, 1);
  EXPECT_EQ(batch.at("x").shape(), Shape({4, 0}));
  EXPECT_EQ(batch.at("labels").shape(), Shape({4}));
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace sluice
