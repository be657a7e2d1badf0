// ArrayDataset: examples for a user's own model (`sluice train --program`), read from one
// safetensors file of named arrays whose first axis is the example.
//
// A file holding "x" f32[N, 16] and "labels" i64[N] has N examples; example i is x[i] (f32[16])
// with labels[i] (i64[]). A batch of B examples binds, for every array, a tensor [B, ...rest] in
// the file's dtype, the rows of one batch being the same examples in every array. The last
// max(1, N / 10) examples are held out for validation, the rest train; each row of a batch is
// drawn uniformly, with replacement, from its split. Sampling is a pure function of (seed, index),
// as for the token data (nn/data.h): batch k is the same whether the run was resumed or not.
//
// Invariants after construction: at least one array; every array has rank >= 1, dtype f32, f64,
// i32 or i64, and the same first dimension N >= 2.
//
// Thread-safety: const methods are safe to call concurrently. Memory: every array of the file,
// held for the dataset's life.
//
// Example:
//   WriteSafetensors("data.safetensors", {{"x", x}, {"labels", labels}});  // [N, 16], [N]
//   ArrayDataset data("data.safetensors");
//   std::map<std::string, Tensor> b = data.GetBatch(DataSplit::kTrain, step, 32, seed);
//   b.at("x");       // f32[32, 16]
//   b.at("labels");  // i64[32]
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "sluice/core/tensor.h"
#include "sluice/ir/op_registry.h"
#include "sluice/nn/data.h"

namespace sluice {

class ArrayDataset {
 public:
  // Reads the file. Throws IoError naming the path when it cannot be read or is not a valid
  // safetensors file (io/safetensors.h); InvalidArgument naming the path when it holds no arrays,
  // and naming the array for a scalar (rank 0) or a dtype other than f32, f64, i32 and i64; when
  // the arrays disagree on N (naming each array with its N); when N < 2.
  explicit ArrayDataset(const std::string& path);

  // The file's path.
  const std::string& name() const { return path_; }
  // The arrays' names, sorted.
  std::vector<std::string> names() const;
  // Per array, the type of one example: the file's dtype and its shape without the first axis
  // ("x" f32[N, 16] → f32[16]; "labels" i64[N] → i64[]).
  const std::map<std::string, TensorType>& example_types() const { return example_types_; }
  // N, and the examples of each split: train [0, N - held out), validation the rest.
  int64_t num_examples() const { return n_; }
  // The largest value of integer array `name` (i32, i64), from the arrays held in memory; nullopt
  // for a float array or a name the file does not hold.
  std::optional<int64_t> LargestValue(const std::string& name) const;
  int64_t split_size(DataSplit split) const {
    return split == DataSplit::kTrain ? train_end_ : n_ - train_end_;
  }

  // Batch number `index` of `split`: for every array, a new contiguous tensor [batch, ...rest] in
  // its dtype, row r being example e_r of the array, with the same e_r in every array; the e_r are
  // drawn uniformly from the split, deterministic in (seed, index). Throws InvalidArgument when
  // batch < 1.
  std::map<std::string, Tensor> GetBatch(DataSplit split, int64_t index, int64_t batch,
                                         uint64_t seed) const;

 private:
  std::string path_;
  std::map<std::string, Tensor> arrays_;  // as read: contiguous, [N, ...rest]
  std::map<std::string, TensorType> example_types_;
  int64_t n_ = 0;
  int64_t train_end_ = 0;  // examples [0, train_end_) train, [train_end_, n_) validation
};

}  // namespace sluice
