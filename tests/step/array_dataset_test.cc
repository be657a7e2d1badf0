// ArrayDataset: batches of examples from a safetensors file of named arrays, the rows of one batch
// the same examples in every array, the validation rows only from the held-out tail.
#include "sluice/step/array_dataset.h"

#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "scratch_path.h"
#include "sluice/core/error.h"
#include "sluice/io/safetensors.h"

namespace sluice {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::ThrowsMessage;

std::string TempPath(const std::string& name) { return testing_support::ScratchPath(name); }

// N examples: x[i] = f32 {i, i + 0.5, i + 0.25}, labels[i] = i64 3i, w[i] = f64 [[i, -i]] (a rank-3
// array), k[i] = i32 i % 7 — so that every row of a batch says which example it came from.
std::map<std::string, Tensor> Examples(int64_t n) {
  std::vector<float> x;
  std::vector<int64_t> labels;
  std::vector<double> w;
  std::vector<int32_t> k;
  for (int64_t i = 0; i < n; ++i) {
    const float f = static_cast<float>(i);
    x.insert(x.end(), {f, f + 0.5f, f + 0.25f});
    labels.push_back(3 * i);
    w.insert(w.end(), {static_cast<double>(i), -static_cast<double>(i)});
    k.push_back(static_cast<int32_t>(i % 7));
  }
  return {{"x", Tensor::FromVector({n, 3}, x)},
          {"labels", Tensor::FromVector({n}, labels)},
          {"w", Tensor::FromVector({n, 1, 2}, w)},
          {"k", Tensor::FromVector({n}, k)}};
}

// The examples batch `b` holds, read from x, after checking every array's row is that example.
std::vector<int64_t> ExamplesOf(const std::map<std::string, Tensor>& b) {
  const Tensor& x = b.at("x");
  std::vector<int64_t> rows;
  for (int64_t r = 0; r < x.shape()[0]; ++r) {
    const int64_t i = static_cast<int64_t>(x.At({r, 0}));
    EXPECT_EQ(x.At({r, 1}), i + 0.5) << "row " << r;
    EXPECT_EQ(x.At({r, 2}), i + 0.25) << "row " << r;
    EXPECT_EQ(b.at("labels").At({r}), 3 * i) << "row " << r;
    EXPECT_EQ(b.at("w").At({r, 0, 0}), i) << "row " << r;
    EXPECT_EQ(b.at("w").At({r, 0, 1}), -i) << "row " << r;
    EXPECT_EQ(b.at("k").At({r}), i % 7) << "row " << r;
    rows.push_back(i);
  }
  return rows;
}

TEST(ArrayDataset, DescribesTheFile) {
  const std::string path = TempPath("arrays_describe.safetensors");
  WriteSafetensors(path, Examples(50));
  const ArrayDataset data(path);
  EXPECT_EQ(data.name(), path);
  EXPECT_EQ(data.names(), (std::vector<std::string>{"k", "labels", "w", "x"}));
  EXPECT_EQ(data.num_examples(), 50);
  EXPECT_EQ(data.split_size(DataSplit::kTrain), 45);
  EXPECT_EQ(data.split_size(DataSplit::kValidation), 5);
  const std::map<std::string, TensorType> types = {
      {"x", {DType::kF32, Shape{3}}},
      {"labels", {DType::kI64, Shape{}}},
      {"w", {DType::kF64, Shape{1, 2}}},
      {"k", {DType::kI32, Shape{}}},
  };
  EXPECT_EQ(data.example_types(), types);
  std::remove(path.c_str());
}

TEST(ArrayDataset, BatchesPairTheSameExampleInEveryArray) {
  const std::string path = TempPath("arrays_pairs.safetensors");
  WriteSafetensors(path, Examples(50));
  const ArrayDataset data(path);
  const std::map<std::string, Tensor> b = data.GetBatch(DataSplit::kTrain, 0, 16, 3);
  ASSERT_EQ(b.size(), 4u);
  EXPECT_EQ(b.at("x").shape(), (Shape{16, 3}));
  EXPECT_EQ(b.at("x").dtype(), DType::kF32);
  EXPECT_EQ(b.at("labels").shape(), (Shape{16}));
  EXPECT_EQ(b.at("labels").dtype(), DType::kI64);
  EXPECT_EQ(b.at("w").shape(), (Shape{16, 1, 2}));
  EXPECT_EQ(b.at("w").dtype(), DType::kF64);
  EXPECT_EQ(b.at("k").shape(), (Shape{16}));
  EXPECT_EQ(b.at("k").dtype(), DType::kI32);
  const std::vector<int64_t> rows = ExamplesOf(b);
  // Not one example repeated: the rows of a batch are drawn one by one.
  EXPECT_GT(std::set<int64_t>(rows.begin(), rows.end()).size(), 1u);
  std::remove(path.c_str());
}

TEST(ArrayDataset, BatchesAreAPureFunctionOfSeedAndIndex) {
  const std::string path = TempPath("arrays_determinism.safetensors");
  WriteSafetensors(path, Examples(1000));
  const ArrayDataset data(path), again(path);
  const auto x = [](const ArrayDataset& d, DataSplit split, int64_t index, uint64_t seed) {
    return d.GetBatch(split, index, 8, seed).at("x");
  };
  for (DataSplit split : {DataSplit::kTrain, DataSplit::kValidation}) {
    EXPECT_TRUE(BitwiseEqual(x(data, split, 7, 1), x(again, split, 7, 1)));
    EXPECT_FALSE(BitwiseEqual(x(data, split, 7, 1), x(data, split, 8, 1)));
    EXPECT_FALSE(BitwiseEqual(x(data, split, 7, 1), x(data, split, 7, 2)));
  }
  std::remove(path.c_str());
}

// 25 examples: 23 train ([0, 23)), 2 held out (N / 10 = 2). Many draws reach every example of
// each split and none of the other.
TEST(ArrayDataset, ValidationDrawsOnlyTheHeldOutTail) {
  const std::string path = TempPath("arrays_split.safetensors");
  WriteSafetensors(path, Examples(25));
  const ArrayDataset data(path);
  std::set<int64_t> train, validation;
  for (int i = 0; i < 40; ++i) {
    for (int64_t e : ExamplesOf(data.GetBatch(DataSplit::kTrain, i, 16, 11))) train.insert(e);
    for (int64_t e : ExamplesOf(data.GetBatch(DataSplit::kValidation, i, 16, 11))) {
      validation.insert(e);
    }
  }
  std::set<int64_t> all_train;
  for (int64_t e = 0; e < 23; ++e) all_train.insert(e);
  EXPECT_EQ(train, all_train);
  EXPECT_EQ(validation, (std::set<int64_t>{23, 24}));
  std::remove(path.c_str());
}

TEST(ArrayDataset, SmallFilesHoldOutOneExample) {
  const std::string path = TempPath("arrays_two.safetensors");
  WriteSafetensors(path, Examples(2));
  const ArrayDataset data(path);
  EXPECT_EQ(data.split_size(DataSplit::kTrain), 1);
  EXPECT_EQ(data.split_size(DataSplit::kValidation), 1);
  EXPECT_EQ(ExamplesOf(data.GetBatch(DataSplit::kTrain, 0, 4, 0)),
            (std::vector<int64_t>{0, 0, 0, 0}));
  EXPECT_EQ(ExamplesOf(data.GetBatch(DataSplit::kValidation, 0, 4, 0)),
            (std::vector<int64_t>{1, 1, 1, 1}));
  std::remove(path.c_str());
}

TEST(ArrayDataset, ErrorsNameTheFileAndTheArray) {
  EXPECT_THAT([] { ArrayDataset("/nonexistent/arrays.safetensors"); },
              ThrowsMessage<IoError>(HasSubstr("/nonexistent/arrays.safetensors")));

  const std::string path = TempPath("arrays_errors.safetensors");
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    std::fputs("not a safetensors file", f);
    std::fclose(f);
  }
  EXPECT_THAT([&] { ArrayDataset{path}; }, ThrowsMessage<IoError>(HasSubstr(path)));

  WriteSafetensors(path, {});
  EXPECT_THAT([&] { ArrayDataset{path}; },
              ThrowsMessage<InvalidArgument>(AllOf(HasSubstr(path), HasSubstr("no arrays"))));

  std::map<std::string, Tensor> arrays = Examples(10);
  arrays["half"] = Tensor::Zeros({10, 4}, DType::kF16);
  WriteSafetensors(path, arrays);
  EXPECT_THAT([&] { ArrayDataset{path}; },
              ThrowsMessage<InvalidArgument>(AllOf(HasSubstr("array 'half'"), HasSubstr(path),
                                                   HasSubstr("is f16"),
                                                   HasSubstr("f32, f64, i32 or i64"))));

  arrays = Examples(10);
  arrays["scale"] = Tensor::Full({}, 2.0, DType::kF32);
  WriteSafetensors(path, arrays);
  EXPECT_THAT([&] { ArrayDataset{path}; },
              ThrowsMessage<InvalidArgument>(
                  AllOf(HasSubstr("array 'scale'"), HasSubstr(path), HasSubstr("scalar"))));

  arrays = Examples(10);
  arrays["labels"] = Tensor::Zeros({9}, DType::kI64);
  WriteSafetensors(path, arrays);
  EXPECT_THAT([&] { ArrayDataset{path}; },
              ThrowsMessage<InvalidArgument>(AllOf(HasSubstr(path),
                                                   HasSubstr("disagree on the number of examples"),
                                                   HasSubstr("'labels' 9"), HasSubstr("'x' 10"))));

  WriteSafetensors(path, Examples(1));
  EXPECT_THAT([&] { ArrayDataset{path}; },
              ThrowsMessage<InvalidArgument>(
                  AllOf(HasSubstr(path), HasSubstr("1 example(s)"), HasSubstr("at least 2"))));

  WriteSafetensors(path, Examples(10));
  const ArrayDataset data(path);
  EXPECT_THAT([&] { data.GetBatch(DataSplit::kTrain, 0, 0, 1); },
              ThrowsMessage<InvalidArgument>(AllOf(HasSubstr(path), HasSubstr("at least 1"))));
  std::remove(path.c_str());
}

}  // namespace
}  // namespace sluice
