#include "sluice/nn/data.h"

#include <cstdio>
#include <fstream>
#include <set>

#include <gtest/gtest.h>

namespace sluice {
namespace {

TEST(SortDataset, TargetsAreTheSortedDigits) {
  SortDataset data(4, 10);
  Batch b = data.GetBatch(DataSplit::kTrain, 0, 8, 42);
  ASSERT_EQ(b.ids.shape(), (Shape{8, 8}));
  const int64_t* ids = b.ids.data<int64_t>();
  const int64_t* tg = b.targets.data<int64_t>();
  for (int r = 0; r < 8; ++r) {
    const int64_t* row = ids + r * 8;
    EXPECT_EQ(row[4], data.separator());
    std::vector<int64_t> digits(row, row + 4);
    std::sort(digits.begin(), digits.end());
    for (int t = 0; t < 4; ++t) EXPECT_EQ(tg[r * 8 + t], kernels::kIgnoreTarget);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(tg[r * 8 + 4 + i], digits[i]);
    // Teacher forcing: the input after the separator is the target shifted by one.
    for (int i = 0; i < 3; ++i) EXPECT_EQ(row[5 + i], tg[r * 8 + 4 + i]);
  }
}

TEST(SortDataset, BatchesAreAPureFunctionOfSeedAndIndex) {
  SortDataset data;
  EXPECT_TRUE(BitwiseEqual(data.GetBatch(DataSplit::kTrain, 7, 4, 1).ids, data.GetBatch(DataSplit::kTrain, 7, 4, 1).ids));
  EXPECT_FALSE(BitwiseEqual(data.GetBatch(DataSplit::kTrain, 7, 4, 1).ids, data.GetBatch(DataSplit::kTrain, 8, 4, 1).ids));
  EXPECT_FALSE(BitwiseEqual(data.GetBatch(DataSplit::kTrain, 7, 4, 1).ids, data.GetBatch(DataSplit::kTrain, 7, 4, 2).ids));
}

TEST(SortDataset, HeldOutSequencesNeverAppearInTraining) {
  SortDataset data(3, 4);
  for (int i = 0; i < 20; ++i) {
    Batch tr = data.GetBatch(DataSplit::kTrain, i, 16, 3);
    Batch va = data.GetBatch(DataSplit::kValidation, i, 16, 3);
    for (int r = 0; r < 16; ++r) {
      EXPECT_FALSE(data.IsHeldOut(tr.ids.data<int64_t>() + r * 6));
      EXPECT_TRUE(data.IsHeldOut(va.ids.data<int64_t>() + r * 6));
    }
  }
  EXPECT_THROW(SortDataset(1, 10), InvalidArgument);
}

TEST(TextDataset, WindowsPredictTheNextByte) {
  std::string path = ::testing::TempDir() + "/text_dataset.txt";
  {
    std::ofstream out(path);
    for (int i = 0; i < 200; ++i) out << static_cast<char>('a' + i % 26);
  }
  TextDataset data(path, 8);
  EXPECT_EQ(data.vocab_size(), 256);
  Batch b = data.GetBatch(DataSplit::kTrain, 3, 4, 9);
  for (int r = 0; r < 4; ++r) {
    for (int t = 0; t < 8; ++t) {
      EXPECT_EQ(b.targets.At({r, t}), 'a' + (static_cast<int>(b.ids.At({r, t})) - 'a' + 1) % 26);
    }
  }
  std::remove(path.c_str());
}

TEST(TextDataset, ClearErrorsForMissingOrShortFiles) {
  EXPECT_THROW(TextDataset("/nonexistent/file.txt", 8), IoError);
  std::string path = ::testing::TempDir() + "/short.txt";
  { std::ofstream(path) << "tiny"; }
  try {
    TextDataset(path, 8);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("--seq"), std::string::npos);
  }
  std::remove(path.c_str());
}

}  // namespace
}  // namespace sluice
