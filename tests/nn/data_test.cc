#include "sluice/nn/data.h"

#include <cstdio>
#include <fstream>
#include <set>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "sluice/nn/mlp.h"

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
  EXPECT_TRUE(BitwiseEqual(data.GetBatch(DataSplit::kTrain, 7, 4, 1).ids,
                           data.GetBatch(DataSplit::kTrain, 7, 4, 1).ids));
  EXPECT_FALSE(BitwiseEqual(data.GetBatch(DataSplit::kTrain, 7, 4, 1).ids,
                            data.GetBatch(DataSplit::kTrain, 8, 4, 1).ids));
  EXPECT_FALSE(BitwiseEqual(data.GetBatch(DataSplit::kTrain, 7, 4, 1).ids,
                            data.GetBatch(DataSplit::kTrain, 7, 4, 2).ids));
}

// The digits of every row of a batch's ids (the first n tokens of each row).
std::set<std::vector<int64_t>> DigitSequences(const Batch& b, int64_t n) {
  std::set<std::vector<int64_t>> sequences;
  const int64_t rows = b.ids.shape()[0], T = b.ids.shape()[1];
  const int64_t* ids = b.ids.data<int64_t>();
  for (int64_t r = 0; r < rows; ++r) sequences.emplace(ids + r * T, ids + r * T + n);
  return sequences;
}

TEST(SortDataset, HeldOutSequencesNeverAppearInTraining) {
  // 3 digits in base 4: 64 sequences in all, few enough that the batches below draw nearly all.
  const int64_t n = 3, base = 4;
  SortDataset data(n, base);
  int held_out = 0;
  for (int64_t code = 0; code < 64; ++code) {
    const int64_t digits[] = {code / 16, code / 4 % 4, code % 4};
    held_out += data.IsHeldOut(digits) ? 1 : 0;
  }
  // Both splits exist (a split that no sequence falls in would make GetBatch draw forever).
  ASSERT_GT(held_out, 0);
  ASSERT_LT(held_out, 64);

  std::set<std::vector<int64_t>> train, validation;
  for (int i = 0; i < 20; ++i) {
    train.merge(DigitSequences(data.GetBatch(DataSplit::kTrain, i, 16, 3), n));
    validation.merge(DigitSequences(data.GetBatch(DataSplit::kValidation, i, 16, 3), n));
  }
  // Independently of how the split is decided: no sequence is drawn for both.
  for (const std::vector<int64_t>& seq : validation) {
    EXPECT_EQ(train.count(seq), 0u)
        << "sequence " << seq[0] << seq[1] << seq[2] << " is in both splits";
  }
  // And each split is the one IsHeldOut describes, all of it drawn (320 draws each).
  for (const std::vector<int64_t>& seq : train) EXPECT_FALSE(data.IsHeldOut(seq.data()));
  for (const std::vector<int64_t>& seq : validation) EXPECT_TRUE(data.IsHeldOut(seq.data()));
  EXPECT_EQ(static_cast<int>(validation.size()), held_out);
  EXPECT_GT(train.size(), 40u);
}

TEST(SortDataset, RefusesTooFewDigitsOrTooSmallABase) {
  EXPECT_THROW(SortDataset(1, 10), InvalidArgument);
  EXPECT_THROW(SortDataset(4, 1), InvalidArgument);
}

// The centres are drawn at the first batch, not at construction (plan builds the task without
// reading a batch); threads racing to that first batch get the same centres.
TEST(BlobsDataset, ConcurrentFirstBatchesAgreeWithASequentialOne) {
  const MlpConfig config{.features = 8, .hidden = 4, .classes = 3};
  BlobsDataset shared(config, 7), alone(config, 7);
  std::vector<std::pair<Tensor, Tensor>> got(4);
  std::vector<std::thread> threads;
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] { got[i] = shared.GetBatch(DataSplit::kTrain, i, 5); });
  }
  for (std::thread& t : threads) t.join();
  for (int i = 0; i < 4; ++i) {
    const auto [x, labels] = alone.GetBatch(DataSplit::kTrain, i, 5);
    EXPECT_TRUE(BitwiseEqual(got[i].first, x)) << i;
    EXPECT_TRUE(BitwiseEqual(got[i].second, labels)) << i;
  }
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
