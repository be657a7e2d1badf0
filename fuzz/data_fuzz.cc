// Fuzz target for the data files `sluice train --data` reads: text (bytes are tokens), a .bin
// token file (little-endian uint16 ids; nn/data.h) and the safetensors array file of a
// classifier's program (step/array_dataset.h), each written to a scratch file and opened as the
// CLI opens it.
//
// Input: byte 0 picks the kind (its value mod 3: text, token file, arrays); byte 1 the sequence
// length (1 + its value mod 16); byte 2 the token file's --vocab (0: the largest id + 1, else
// its value times 257); the rest is the file. For every input:
//   * opening returns a dataset or throws IoError or InvalidArgument. Any other exception escapes
//     and libFuzzer reports it as a crash; so do hangs, sanitizer reports and huge allocations.
//   * Token data: batches of both splits are [B, T] of ids and targets within the vocabulary.
//   * Arrays: N >= 2, both splits hold examples, and a batch holds, per array, B rows of the
//     array's example type whose integers are at most its LargestValue.
//
// Run: make fuzz (FUZZ_SECONDS=300 for longer), or build-fuzz/fuzz/data_fuzz
// -dict=fuzz/data.dict CORPUS_DIR fuzz/corpus/data. Add each input that found a bug to
// tests/nn/data_test.cc or tests/step/array_dataset_test.cc.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "scratch_dir.h"
#include "sluice/core/error.h"
#include "sluice/nn/data.h"
#include "sluice/step/array_dataset.h"

namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "data_fuzz: %s\n", what.c_str());
  std::abort();
}

void CheckTokens(const sluice::Dataset& data) {
  const int64_t vocab = data.vocab_size(), T = data.seq_len();
  if (vocab < 1 || data.largest_id() >= vocab || T < 1) {
    Die(fmt::format("vocab {}, largest id {}, T {}", vocab, data.largest_id(), T));
  }
  for (const sluice::DataSplit split :
       {sluice::DataSplit::kTrain, sluice::DataSplit::kValidation}) {
    for (int64_t index : {0, 1}) {
      const sluice::Batch b = data.GetBatch(split, index, /*batch_size=*/3, /*seed=*/7);
      if (b.ids.shape() != sluice::Shape({3, T}) || b.targets.shape() != sluice::Shape({3, T}))
        Die("a batch is not [B, T]");
      for (int64_t i = 0; i < 3 * T; ++i) {
        const int64_t id = b.ids.data<int64_t>()[i], target = b.targets.data<int64_t>()[i];
        if (id < 0 || id >= vocab || target < 0 || target >= vocab)
          Die(fmt::format("id {} or target {} outside the vocabulary of {}", id, target, vocab));
      }
    }
  }
}

void CheckArrays(const sluice::ArrayDataset& data) {
  const int64_t n = data.num_examples();
  const int64_t train = data.split_size(sluice::DataSplit::kTrain);
  const int64_t validation = data.split_size(sluice::DataSplit::kValidation);
  if (n < 2 || train < 1 || validation < 1 || train + validation != n)
    Die(fmt::format("N {} splits into {} and {}", n, train, validation));
  for (const sluice::DataSplit split :
       {sluice::DataSplit::kTrain, sluice::DataSplit::kValidation}) {
    const std::map<std::string, sluice::Tensor> batch = data.GetBatch(split, 1, 2, /*seed=*/7);
    if (batch.size() != data.example_types().size()) Die("a batch lacks an array");
    for (const auto& [name, type] : data.example_types()) {
      const sluice::Tensor& t = batch.at(name);
      if (t.dtype() != type.dtype || t.rank() != type.shape.rank() + 1 || t.shape()[0] != 2)
        Die(fmt::format("array '{}': a batch of 2 is {}", name, t.shape().ToString()));
      if (const std::optional<int64_t> largest = data.LargestValue(name)) {
        for (int64_t i = 0; i < t.numel(); ++i) {  // the batch is contiguous, as read
          const int64_t v =
              t.dtype() == sluice::DType::kI32 ? t.data<int32_t>()[i] : t.data<int64_t>()[i];
          if (v > *largest)
            Die(fmt::format("array '{}': {} above its largest value {}", name, v, *largest));
        }
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 3) return 0;
  const int kind = data[0] % 3;
  const int64_t seq = 1 + data[1] % 16;
  const int64_t vocab = int64_t{data[2]} * 257;
  const std::string_view bytes(reinterpret_cast<const char*>(data) + 3, size - 3);
  static const char* const kNames[] = {"data.txt", "tokens.bin", "arrays.safetensors"};
  const std::string path = sluice::fuzz::ScratchDir("data_fuzz") + "/" + kNames[kind];
  sluice::fuzz::WriteScratchFile(path, bytes);
  try {
    if (kind == 2) {
      CheckArrays(sluice::ArrayDataset(path));
    } else {
      CheckTokens(*sluice::OpenTokenData(path, seq, kind == 1 ? vocab : 0));
    }
  } catch (const sluice::IoError&) {
  } catch (const sluice::InvalidArgument&) {
  }
  return 0;
}
