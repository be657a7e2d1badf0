#include "sluice/nn/data.h"

#include <algorithm>
#include <fstream>
#include <iterator>
#include <random>

#include <fmt/format.h>

#include "sluice/core/error.h"
#include "sluice/core/files.h"
#include "sluice/core/fnv1a.h"

namespace sluice {

namespace {

// Windows of T + 1 consecutive tokens of a sequence, starts drawn uniformly from the tokens
// [begin, end) (token(i) is token i): ids [B, T] the first T of each, targets [B, T] the last T.
// The one window sampler of TextDataset and TokenFileDataset; `rng_seed` is MixSeed(...).
template <typename TokenAt>
Batch DrawWindows(const TokenAt& token, size_t begin, size_t end, int64_t T, int64_t batch_size,
                  uint64_t rng_seed) {
  Batch b{Tensor::Empty({batch_size, T}, DType::kI64), Tensor::Empty({batch_size, T}, DType::kI64)};
  int64_t* ids = b.ids.data<int64_t>();
  int64_t* targets = b.targets.data<int64_t>();
  std::mt19937_64 rng(rng_seed);
  std::uniform_int_distribution<size_t> start(begin, end - static_cast<size_t>(T) - 1);
  for (int64_t r = 0; r < batch_size; ++r) {
    size_t s = start(rng);
    for (int64_t t = 0; t < T; ++t) {
      ids[r * T + t] = token(s + t);
      targets[r * T + t] = token(s + t + 1);
    }
  }
  return b;
}

// The fewest tokens a file needs so that both splits — the first 90% (rounded down) for training,
// the rest for validation — hold a window of `need` tokens. The validation split of n tokens holds
// n - floor(9n / 10) = ceil(n / 10) of them, so n >= 10 (need - 1) + 1; the training split needs
// floor(9n / 10) >= need. The error for a shorter file states this figure, and the check is the
// same inequality: 641 bytes train sequences of 64 (a message that said 650 let 641 to 649 pass).
size_t LeastTokensForSplits(size_t need) {
  return std::max<size_t>(10 * (need - 1) + 1, (10 * need + 8) / 9);
}

}  // namespace

uint64_t MixSeed(uint64_t seed, uint64_t stream, uint64_t index) {
  uint64_t z = seed ^ (stream * 0x9E3779B97F4A7C15ull) ^ (index * 0xBF58476D1CE4E5B9ull);
  // SplitMix64 finalizer.
  z += 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

Tensor RandomKey(DataSplit split, int64_t index, int64_t batch, uint64_t seed) {
  const uint64_t base =
      MixSeed(seed, split == DataSplit::kTrain ? 12 : 13, static_cast<uint64_t>(index));
  Tensor keys = Tensor::Empty(Shape{batch}, DType::kI64);
  for (int64_t r = 0; r < batch; ++r) {
    keys.data<int64_t>()[r] = static_cast<int64_t>(MixSeed(base, 0, static_cast<uint64_t>(r)));
  }
  return keys;
}

SortDataset::SortDataset(int64_t num_digits, int64_t base) : n_(num_digits), base_(base) {
  if (n_ < 2 || base_ < 2) {
    throw InvalidArgument(
        fmt::format("sort data: need at least 2 digits in base 2 or more, got {} digits in base {}",
                    n_, base_));
  }
}

bool SortDataset::IsHeldOut(const int64_t* digits) const {
  // FNV-1a over the digits, from the basis this split was first made with (a digit short of FNV's
  // own): another basis would move the held-out sequences and every pinned figure with them.
  Fnv1a h(1469598103934665603ull);
  for (int64_t i = 0; i < n_; ++i) h.Add(static_cast<uint64_t>(digits[i]));
  return h.value() % 10 == 0;  // one sequence in ten is held out
}

Batch SortDataset::GetBatch(DataSplit split, int64_t index, int64_t batch_size,
                            uint64_t seed) const {
  const int64_t T = seq_len();
  Batch b{Tensor::Empty({batch_size, T}, DType::kI64), Tensor::Empty({batch_size, T}, DType::kI64)};
  int64_t* ids = b.ids.data<int64_t>();
  int64_t* targets = b.targets.data<int64_t>();
  std::mt19937_64 rng(
      MixSeed(seed, split == DataSplit::kTrain ? 1 : 2, static_cast<uint64_t>(index)));
  std::uniform_int_distribution<int64_t> digit(0, base_ - 1);
  std::vector<int64_t> seq(2 * n_ + 1);
  for (int64_t r = 0; r < batch_size; ++r) {
    // Draw until the sequence falls in the requested split.
    do {
      for (int64_t i = 0; i < n_; ++i) seq[i] = digit(rng);
    } while (IsHeldOut(seq.data()) != (split == DataSplit::kValidation));
    seq[n_] = base_;
    std::copy(seq.begin(), seq.begin() + n_, seq.begin() + n_ + 1);
    std::sort(seq.begin() + n_ + 1, seq.end());
    // Input is the sequence without its last token; the target at position t is token t + 1, and
    // only positions whose target is a sorted digit count.
    for (int64_t t = 0; t < T; ++t) {
      ids[r * T + t] = seq[t];
      targets[r * T + t] = t >= n_ ? seq[t + 1] : kernels::kIgnoreTarget;
    }
  }
  return b;
}

TextDataset::TextDataset(const std::string& path, int64_t seq_len)
    : path_(path), seq_len_(seq_len) {
  const std::string bytes = ReadWholeFile("data file", path);
  bytes_.assign(bytes.begin(), bytes.end());
  train_end_ = bytes_.size() * 9 / 10;
  for (uint8_t b : bytes_) largest_id_ = std::max<int64_t>(largest_id_, b);
  const size_t need = static_cast<size_t>(std::max<int64_t>(seq_len, 0)) + 1;
  if (seq_len < 1 || bytes_.size() < LeastTokensForSplits(need)) {
    throw InvalidArgument(fmt::format(
        "data file '{}' has {} bytes: too short for sequences of {} tokens (needs at least {} "
        "bytes so that the 10% validation split holds one sequence); use a larger file or a "
        "smaller --seq",
        path, bytes_.size(), seq_len, LeastTokensForSplits(need)));
  }
}

Batch TextDataset::GetBatch(DataSplit split, int64_t index, int64_t batch_size,
                            uint64_t seed) const {
  const bool train = split == DataSplit::kTrain;
  return DrawWindows([this](size_t i) { return int64_t{bytes_[i]}; }, train ? 0 : train_end_,
                     train ? train_end_ : bytes_.size(), seq_len_, batch_size,
                     MixSeed(seed, train ? 3 : 4, static_cast<uint64_t>(index)));
}

TokenFileDataset::TokenFileDataset(const std::string& path, int64_t seq_len, int64_t vocab)
    : path_(path), seq_len_(seq_len), vocab_(vocab) {
  if (vocab < 0) {
    throw InvalidArgument(fmt::format(
        "token file '{}': the vocabulary {} is negative; pass the model's --vocab, or 0 to take "
        "the largest id in the file + 1",
        path, vocab));
  }
  bytes_ = ReadWholeFile("token file", path);
  if (bytes_.size() % 2 != 0) {
    throw IoError(fmt::format(
        "token file '{}': {} bytes is not a whole number of 16-bit tokens; a .bin token file holds "
        "little-endian unsigned 16-bit ids (numpy: ids.astype(np.uint16).tofile(path)), or name a "
        "file not ending in .bin to read it as bytes",
        path, bytes_.size()));
  }
  const size_t n = bytes_.size() / 2;
  train_end_ = n * 9 / 10;
  const size_t need = static_cast<size_t>(std::max<int64_t>(seq_len, 0)) + 1;
  if (seq_len < 1 || n < LeastTokensForSplits(need)) {
    throw InvalidArgument(fmt::format(
        "token file '{}' has {} tokens: too short for sequences of {} tokens (needs at least {} "
        "tokens so that the 10% validation split holds one sequence); use a larger file or a "
        "smaller --seq",
        path, n, seq_len, LeastTokensForSplits(need)));
  }
  for (size_t i = 0; i < n; ++i) largest_id_ = std::max(largest_id_, token(i));
  if (vocab_ == 0) {
    vocab_ = largest_id_ + 1;
  } else {
    for (size_t i = 0; i < n; ++i) {
      if (token(i) >= vocab_) {
        throw InvalidArgument(fmt::format(
            "token file '{}': token {} (byte offset {}) is {}, outside the vocabulary of {}; raise "
            "--vocab to at least {} (or 0 to take the largest id in the file + 1)",
            path, i, 2 * i, token(i), vocab_, token(i) + 1));
      }
    }
  }
}

Batch TokenFileDataset::GetBatch(DataSplit split, int64_t index, int64_t batch_size,
                                 uint64_t seed) const {
  const bool train = split == DataSplit::kTrain;
  return DrawWindows([this](size_t i) { return token(i); }, train ? 0 : train_end_,
                     train ? train_end_ : bytes_.size() / 2, seq_len_, batch_size,
                     MixSeed(seed, train ? 8 : 9, static_cast<uint64_t>(index)));
}

std::unique_ptr<Dataset> OpenTokenData(const std::string& spec, int64_t seq_len, int64_t vocab) {
  if (spec == "sort") return std::make_unique<SortDataset>();
  if (spec.ends_with(".bin")) return std::make_unique<TokenFileDataset>(spec, seq_len, vocab);
  return std::make_unique<TextDataset>(spec, seq_len);
}

}  // namespace sluice
