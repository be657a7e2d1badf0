#include "sluice/nn/data.h"

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "scratch_path.h"
#include "sluice/nn/mlp.h"

namespace sluice {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

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

// A batch's random keys (dropout's masks) are a pure function of (split, index, row, seed),
// i64[batch], and differ from example to example, batch to batch, split to split and seed to
// seed: 200 batches of 8, 1600 keys; the first rows of a larger batch have the smaller one's keys.
TEST(RandomKey, IsAPureFunctionOfSplitIndexRowAndSeedAndDiffersBetweenExamples) {
  auto keys = [](DataSplit split, int64_t index, int64_t batch, uint64_t seed) {
    const Tensor k = RandomKey(split, index, batch, seed);
    EXPECT_EQ(k.dtype(), DType::kI64);
    EXPECT_EQ(k.shape(), Shape{batch});
    return std::vector<int64_t>(k.data<int64_t>(), k.data<int64_t>() + batch);
  };
  EXPECT_EQ(keys(DataSplit::kTrain, 7, 8, 1), keys(DataSplit::kTrain, 7, 8, 1));
  std::set<int64_t> all;
  for (int64_t i = 0; i < 200; ++i) {
    for (int64_t k : keys(DataSplit::kTrain, i, 8, 1)) all.insert(k);
  }
  EXPECT_EQ(all.size(), 1600u);
  const std::vector<int64_t> four = keys(DataSplit::kTrain, 7, 4, 1);
  const std::vector<int64_t> eight = keys(DataSplit::kTrain, 7, 8, 1);
  EXPECT_TRUE(std::equal(four.begin(), four.end(), eight.begin()));
  EXPECT_NE(keys(DataSplit::kTrain, 7, 8, 1), keys(DataSplit::kValidation, 7, 8, 1));
  EXPECT_NE(keys(DataSplit::kTrain, 7, 8, 1), keys(DataSplit::kTrain, 7, 8, 2));
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
  std::string path = testing_support::ScratchPath("text_dataset.txt");
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
  std::string path = testing_support::ScratchPath("short.txt");
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

// The least size the error names is the one the check takes: 640 bytes are refused for sequences
// of 64 naming 641, and 641 bytes train (the message said 650 while 641 to 649 trained).
TEST(TextDataset, TheLeastSizeNamedIsTheLeastThatTrains) {
  const std::string path = testing_support::ScratchPath("bytes_640.txt");
  { std::ofstream(path) << std::string(640, 'a'); }
  EXPECT_THAT([&] { TextDataset(path, 64); },
              ThrowsMessage<InvalidArgument>(
                  AllOf(HasSubstr("640 bytes"), HasSubstr("needs at least 641 bytes"))));
  { std::ofstream(path) << std::string(641, 'a'); }
  EXPECT_EQ(TextDataset(path, 64).seq_len(), 64);
  for (const int64_t T : {1, 7, 8, 63, 64, 100}) {  // the named size trains; one byte less does not
    const size_t least = [&] {
      try {
        { std::ofstream(path) << "a"; }
        TextDataset(path, T);
      } catch (const InvalidArgument& e) {
        const std::string m = e.what();
        const size_t at = m.find("needs at least ") + 15;
        return static_cast<size_t>(std::stoll(m.substr(at)));
      }
      return size_t{0};
    }();
    ASSERT_GT(least, 1u) << T;
    { std::ofstream(path) << std::string(least, 'b'); }
    EXPECT_EQ(TextDataset(path, T).seq_len(), T);
    { std::ofstream(path) << std::string(least - 1, 'b'); }
    EXPECT_THROW(TextDataset(path, T), InvalidArgument) << T << " at " << least - 1;
  }
  std::remove(path.c_str());
}

// Where the windows of a batch start, pinned from TextDataset before its sampler became the one
// TokenFileDataset shares: a resumed run draws the same batches as the run it resumes, across
// versions.
TEST(TextDataset, WindowStartsArePinned) {
  const std::string path = testing_support::ScratchPath("text_pinned.txt");
  {
    std::ofstream out(path, std::ios::binary);
    for (int i = 0; i < 200; ++i) out << static_cast<char>(i);  // byte i is i: ids name positions
  }
  TextDataset data(path, 8);
  const Batch train = data.GetBatch(DataSplit::kTrain, 3, 4, 9);
  const Batch validation = data.GetBatch(DataSplit::kValidation, 3, 4, 9);
  const int64_t train_starts[] = {42, 111, 28, 160}, validation_starts[] = {191, 186, 191, 190};
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(train.ids.At({r, 0}), train_starts[r]) << r;
    EXPECT_EQ(validation.ids.At({r, 0}), validation_starts[r]) << r;
  }
  std::remove(path.c_str());
}

// Writes `tokens` as little-endian unsigned 16-bit ids, byte by byte (whatever the host's order).
std::string WriteTokenFile(const std::string& name, const std::vector<uint16_t>& tokens) {
  const std::string path = testing_support::ScratchPath(name);
  std::ofstream out(path, std::ios::binary);
  for (uint16_t t : tokens) out << static_cast<char>(t & 0xff) << static_cast<char>(t >> 8);
  return path;
}

// Token i of the file is 1000 + i: ids above 255 need both bytes, and an id names its position.
std::vector<uint16_t> CountingTokens(int n) {
  std::vector<uint16_t> tokens(n);
  for (int i = 0; i < n; ++i) tokens[i] = static_cast<uint16_t>(1000 + i);
  return tokens;
}

TEST(TokenFileDataset, WindowsPredictTheNextToken) {
  const std::string path = WriteTokenFile("tokens_round_trip.bin", CountingTokens(200));
  TokenFileDataset data(path, 8, 0);
  EXPECT_EQ(data.name(), path);
  EXPECT_EQ(data.seq_len(), 8);
  EXPECT_EQ(data.num_tokens(), 200);
  EXPECT_EQ(data.vocab_size(), 1200);  // vocab 0: the largest id + 1
  EXPECT_EQ(data.token(0), 1000);
  EXPECT_EQ(data.token(199), 1199);
  const Batch b = data.GetBatch(DataSplit::kTrain, 3, 4, 9);
  ASSERT_EQ(b.ids.shape(), (Shape{4, 8}));
  ASSERT_EQ(b.targets.shape(), (Shape{4, 8}));
  ASSERT_EQ(b.ids.dtype(), DType::kI64);
  ASSERT_EQ(b.targets.dtype(), DType::kI64);
  for (int r = 0; r < 4; ++r) {
    const double start = b.ids.At({r, 0});
    for (int t = 0; t < 8; ++t) {
      EXPECT_EQ(b.ids.At({r, t}), start + t) << r << "," << t;  // consecutive tokens of the file
      EXPECT_EQ(b.targets.At({r, t}), start + t + 1) << r << "," << t;  // each one's next
    }
  }
  std::remove(path.c_str());
}

TEST(TokenFileDataset, KeepsTheFullSixteenBitsAndAGivenVocabulary) {
  std::vector<uint16_t> tokens = CountingTokens(100);
  tokens[50] = 65535;
  const std::string path = WriteTokenFile("tokens_wide.bin", tokens);
  EXPECT_EQ(TokenFileDataset(path, 4, 0).vocab_size(), 65536);
  EXPECT_EQ(TokenFileDataset(path, 4, 65536).token(50), 65535);
  EXPECT_EQ(TokenFileDataset(path, 4, 70000).vocab_size(), 70000);  // a model wider than its data
  std::remove(path.c_str());
}

TEST(TokenFileDataset, BatchesAreAPureFunctionOfSeedAndIndex) {
  const std::string path = WriteTokenFile("tokens_determinism.bin", CountingTokens(2000));
  const TokenFileDataset data(path, 16, 0), again(path, 16, 0);
  const auto ids = [](const Dataset& d, DataSplit split, int64_t index, uint64_t seed) {
    return d.GetBatch(split, index, 8, seed).ids;
  };
  EXPECT_TRUE(
      BitwiseEqual(ids(data, DataSplit::kTrain, 7, 1), ids(again, DataSplit::kTrain, 7, 1)));
  EXPECT_TRUE(BitwiseEqual(ids(data, DataSplit::kValidation, 7, 1),
                           ids(again, DataSplit::kValidation, 7, 1)));
  EXPECT_FALSE(
      BitwiseEqual(ids(data, DataSplit::kTrain, 7, 1), ids(data, DataSplit::kTrain, 8, 1)));
  EXPECT_FALSE(
      BitwiseEqual(ids(data, DataSplit::kTrain, 7, 1), ids(data, DataSplit::kTrain, 7, 2)));
  std::remove(path.c_str());
}

// 100 tokens: the first 90 train (window starts 0..85 for T = 4), the last 10 validate (starts
// 90..95). Enough draws reach both ends of each range and never cross them.
TEST(TokenFileDataset, SplitsAtNinetyPercentOfTheTokens) {
  const std::string path = WriteTokenFile("tokens_split.bin", CountingTokens(100));
  const TokenFileDataset data(path, 4, 0);
  EXPECT_EQ(data.train_tokens(), 90);
  const auto start_range = [&](DataSplit split) {
    int64_t lo = 1 << 20, hi = -1, last = -1;
    for (int i = 0; i < 100; ++i) {
      const Batch b = data.GetBatch(split, i, 16, 5);
      for (int r = 0; r < 16; ++r) {
        const int64_t start = static_cast<int64_t>(b.ids.At({r, 0})) - 1000;
        lo = std::min(lo, start);
        hi = std::max(hi, start);
        last = std::max(last, static_cast<int64_t>(b.targets.At({r, 3})) - 1000);
      }
    }
    return std::array<int64_t, 3>{lo, hi, last};
  };
  EXPECT_EQ(start_range(DataSplit::kTrain), (std::array<int64_t, 3>{0, 85, 89}));
  EXPECT_EQ(start_range(DataSplit::kValidation), (std::array<int64_t, 3>{90, 95, 99}));
  std::remove(path.c_str());
}

TEST(TokenFileDataset, ErrorsNameTheFileAndTheFix) {
  EXPECT_THAT([] { TokenFileDataset("/nonexistent/tokens.bin", 8, 0); },
              ThrowsMessage<IoError>(HasSubstr("/nonexistent/tokens.bin")));

  const std::string odd = testing_support::ScratchPath("tokens_odd.bin");
  { std::ofstream(odd, std::ios::binary) << "abc"; }
  EXPECT_THAT([&] { TokenFileDataset(odd, 8, 0); },
              ThrowsMessage<IoError>(
                  AllOf(HasSubstr(odd), HasSubstr("3 bytes is not a whole number of 16-bit tokens"),
                        HasSubstr("little-endian unsigned 16-bit"))));
  std::remove(odd.c_str());

  std::vector<uint16_t> tokens(100, 7);
  tokens[42] = 150;
  const std::string big_id = WriteTokenFile("tokens_big_id.bin", tokens);
  EXPECT_THAT([&] { TokenFileDataset(big_id, 8, 100); },
              ThrowsMessage<InvalidArgument>(AllOf(
                  HasSubstr(big_id), HasSubstr("token 42 (byte offset 84) is 150"),
                  HasSubstr("vocabulary of 100"), HasSubstr("raise --vocab to at least 151"))));
  EXPECT_EQ(TokenFileDataset(big_id, 8, 151).vocab_size(), 151);
  EXPECT_THAT([&] { TokenFileDataset(big_id, 8, -1); },
              ThrowsMessage<InvalidArgument>(AllOf(HasSubstr(big_id), HasSubstr("negative"))));
  std::remove(big_id.c_str());

  // 50 tokens: the validation split holds 5, too few for a window of 8 + 1.
  const std::string short_file = WriteTokenFile("tokens_short.bin", CountingTokens(50));
  EXPECT_THAT(
      [&] { TokenFileDataset(short_file, 8, 0); },
      ThrowsMessage<InvalidArgument>(AllOf(HasSubstr(short_file), HasSubstr("50 tokens"),
                                           HasSubstr("at least 81 tokens"), HasSubstr("--seq"))));
  EXPECT_THAT([&] { TokenFileDataset(short_file, 0, 0); },
              ThrowsMessage<InvalidArgument>(HasSubstr("--seq")));
  EXPECT_EQ(TokenFileDataset(short_file, 4, 0).seq_len(), 4);  // 5 validation tokens: T = 4 fits
  std::remove(short_file.c_str());

  const std::string empty = WriteTokenFile("tokens_empty.bin", {});
  EXPECT_THAT([&] { TokenFileDataset(empty, 8, 0); },
              ThrowsMessage<InvalidArgument>(AllOf(HasSubstr(empty), HasSubstr("0 tokens"))));
  std::remove(empty.c_str());
}

TEST(OpenTokenData, PicksTheSourceFromTheSpec) {
  EXPECT_NE(dynamic_cast<SortDataset*>(OpenTokenData("sort", 64, 0).get()), nullptr);

  const std::string bin = WriteTokenFile("open_tokens.bin", CountingTokens(200));
  const std::unique_ptr<Dataset> tokens = OpenTokenData(bin, 8, 5000);
  ASSERT_NE(dynamic_cast<TokenFileDataset*>(tokens.get()), nullptr);
  EXPECT_EQ(tokens->vocab_size(), 5000);
  EXPECT_EQ(tokens->seq_len(), 8);

  // Any other name is text, read as bytes: the same file named .txt has vocabulary 256.
  const std::string txt = testing_support::ScratchPath("open_tokens.txt");
  std::filesystem::copy_file(bin, txt, std::filesystem::copy_options::overwrite_existing);
  const std::unique_ptr<Dataset> text = OpenTokenData(txt, 8, 5000);
  ASSERT_NE(dynamic_cast<TextDataset*>(text.get()), nullptr);
  EXPECT_EQ(text->vocab_size(), 256);
  std::remove(bin.c_str());
  std::remove(txt.c_str());
}

}  // namespace
}  // namespace sluice
