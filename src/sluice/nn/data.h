// Training data: token batches for next-token prediction.
//
// A Dataset yields batches of ids [B, T] and targets [B, T] (int64). A target of
// kernels::kIgnoreTarget (kernels/cross_entropy.h) marks a position that does not count in the
// loss (the prompt of the sort task).
// Sampling is a pure function of (seed, batch index): batch k of a run is the same whether the run
// was interrupted or not, so a checkpoint only records the next batch index to resume bitwise.
//
//   SortDataset  "sort": n random digits in [0, base), a separator, then the digits sorted.
//                Needs nothing downloaded. Sequences are split into train and held-out by a hash
//                of their digits, so validation sequences are never trained on.
//   TextDataset  byte-level language modelling on any file: vocabulary 256, the first 90% of the
//                bytes for training, the last 10% for validation, windows drawn uniformly.
//   TokenFileDataset  language modelling on a file of token ids, each a little-endian unsigned
//                16-bit integer (the `.bin` of nanoGPT-style pipelines: `np.array(ids,
//                dtype=np.uint16).tofile(path)`); split and windows as TextDataset's.
// OpenTokenData picks one of them from a --data spec, so that every caller decides alike.
//
// Thread-safety: const methods are safe to call concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "sluice/core/tensor.h"
#include "sluice/kernels/cross_entropy.h"

namespace sluice {

struct Batch {
  Tensor ids;      // i64 [B, T]
  Tensor targets;  // i64 [B, T]; kernels::kIgnoreTarget where the loss ignores a position
};

enum class DataSplit { kTrain, kValidation };

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual std::string name() const = 0;
  virtual int64_t vocab_size() const = 0;
  // The largest token id the data holds (ids and targets alike; below vocab_size()), found from
  // what the dataset holds in memory when it was made: the data is never read again for it.
  virtual int64_t largest_id() const = 0;
  // The sequence length T of every batch.
  virtual int64_t seq_len() const = 0;
  // Batch number `index` of `split`, deterministic in (seed, index).
  virtual Batch GetBatch(DataSplit split, int64_t index, int64_t batch_size,
                         uint64_t seed) const = 0;
};

class SortDataset final : public Dataset {
 public:
  // n digits in [0, base); T = 2n. Token `base` is the separator. Throws InvalidArgument when
  // n < 2 or base < 2.
  SortDataset(int64_t num_digits = 6, int64_t base = 10);
  std::string name() const override { return "sort"; }
  int64_t vocab_size() const override { return base_ + 1; }
  int64_t largest_id() const override { return base_; }  // the separator
  int64_t seq_len() const override { return 2 * n_; }
  Batch GetBatch(DataSplit split, int64_t index, int64_t batch_size, uint64_t seed) const override;

  int64_t num_digits() const { return n_; }
  int64_t separator() const { return base_; }
  // Whether a digit sequence belongs to the held-out split.
  bool IsHeldOut(const int64_t* digits) const;

 private:
  int64_t n_, base_;
};

class TextDataset final : public Dataset {
 public:
  // Reads the whole file. Throws IoError naming the path when unreadable, InvalidArgument when
  // either split is shorter than seq_len + 1 bytes (saying how long the file must be).
  TextDataset(const std::string& path, int64_t seq_len);
  std::string name() const override { return path_; }
  int64_t vocab_size() const override { return 256; }
  int64_t largest_id() const override { return largest_id_; }
  int64_t seq_len() const override { return seq_len_; }
  Batch GetBatch(DataSplit split, int64_t index, int64_t batch_size, uint64_t seed) const override;

 private:
  std::string path_;
  int64_t seq_len_;
  std::vector<uint8_t> bytes_;
  size_t train_end_;  // bytes [0, train_end_) train, [train_end_, size) validation
  int64_t largest_id_ = 0;
};

class TokenFileDataset final : public Dataset {
 public:
  // Reads the whole file: ids [B, T], targets [B, T] are windows of T + 1 consecutive tokens, the
  // first 90% of the tokens for training and the last 10% for validation. `vocab` bounds the ids
  // (every id < vocab); 0 takes the largest id in the file + 1. Throws, naming the path and the
  // fix: IoError when the file cannot be read or its size is odd (not whole 16-bit tokens);
  // InvalidArgument when vocab < 0, when an id is >= vocab (its position and value: raise
  // --vocab), or when either split is shorter than seq_len + 1 tokens (or seq_len < 1).
  // Memory: the file's bytes, 2 per token, held for the dataset's life.
  TokenFileDataset(const std::string& path, int64_t seq_len, int64_t vocab = 0);
  std::string name() const override { return path_; }
  int64_t vocab_size() const override { return vocab_; }
  int64_t largest_id() const override { return largest_id_; }
  int64_t seq_len() const override { return seq_len_; }
  Batch GetBatch(DataSplit split, int64_t index, int64_t batch_size, uint64_t seed) const override;

  // Tokens in the file, and in the training split (tokens [0, train_tokens()); the rest validate).
  int64_t num_tokens() const { return static_cast<int64_t>(bytes_.size() / 2); }
  int64_t train_tokens() const { return static_cast<int64_t>(train_end_); }
  // Token i of the file (0 <= i < num_tokens()).
  int64_t token(size_t i) const {
    return static_cast<uint8_t>(bytes_[2 * i]) | (static_cast<uint8_t>(bytes_[2 * i + 1]) << 8);
  }

 private:
  std::string path_;
  int64_t seq_len_;
  int64_t vocab_;
  int64_t largest_id_ = 0;
  std::string bytes_;  // the file as read: token i is bytes 2i (low) and 2i + 1 (high)
  size_t train_end_;   // tokens [0, train_end_) train, [train_end_, num_tokens()) validation
};

// The token data a --data spec names: "sort" → SortDataset() (its own T = 12 and vocabulary 11:
// seq_len and vocab are not used), a path ending in ".bin" → TokenFileDataset(spec, seq_len,
// vocab), any other path → TextDataset(spec, seq_len) (vocabulary 256: vocab is not used). The
// caller checks its model's vocabulary and T against the result's. Throws what the constructor
// throws.
//
// Example:
//   std::unique_ptr<Dataset> data = OpenTokenData("train.bin", 256, 0);  // vocab from the file
std::unique_ptr<Dataset> OpenTokenData(const std::string& spec, int64_t seq_len, int64_t vocab);

// SplitMix64 of (seed, stream, index): the seed of every random draw in data and initialization.
// Streams in use, one per kind of draw so that no two share a sequence: 1-2 sort (train,
// validation), 3-4 text, 5-7 blobs (centres, train, validation), 8-9 token file, 10-11 arrays
// (step/array_dataset.h), 12-13 random keys (RandomKey: train, validation), 100 parameter
// initialization (nn/model.h). A new source takes new ones.
uint64_t MixSeed(uint64_t seed, uint64_t stream, uint64_t index);

// The data array every source offers beside its own: one random key per example, what dropout's
// masks are drawn from (ir/ops/dropout.h). A program input reads it as
// `input %key: i64[B] = random_key`.
inline constexpr const char* kRandomKeyArray = "random_key";

// The random keys of batch `index` of `split`, `batch` examples: i64[batch], row r's key the bits
// of MixSeed(MixSeed(seed, 12 or 13, index), 0, r). A pure function like the batch itself, so
// every stage, rank, recompute and resumed run that binds batch `index` draws the same masks from
// it, and a data-parallel replica's rows have the keys of those rows of the whole batch.
Tensor RandomKey(DataSplit split, int64_t index, int64_t batch, uint64_t seed);

}  // namespace sluice
