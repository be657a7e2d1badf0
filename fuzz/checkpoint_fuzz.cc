// Fuzz target for the checkpoint readers: safetensors (io/safetensors.h), the index of a sharded
// checkpoint (io/checkpoint.h) and the training metadata (train/training_checkpoint.h).
//
// Byte 0 of the input picks what the rest is:
//   even  the bytes of a safetensors file, parsed in memory (ParseSafetensors);
//   odd   the "<path>.index.json" of a sharded checkpoint, loaded through LoadCheckpoint from a
//         scratch directory that holds two valid shards (ckpt-stage0-of-2.safetensors with tensor
//         "a", ckpt-stage1-of-2.safetensors with tensor "b") and no <path> itself.
// For every input:
//   * reading returns or throws IoError; any other exception escapes and libFuzzer reports it as
//     a crash, as it does hangs, sanitizer reports and huge allocations;
//   * a safetensors file that parses writes back (SerializeSafetensors) to bytes that parse to the
//     same tensors (dtype, shape, bytes) and metadata;
//   * the metadata of what was read parses as training metadata or throws IoError.
//
// Run: make fuzz (FUZZ_SECONDS=300 for longer), or build-fuzz/fuzz/checkpoint_fuzz
// -dict=fuzz/checkpoint.dict CORPUS_DIR fuzz/corpus/checkpoint. Add each input that found a bug to
// tests/io/safetensors_test.cc or tests/io/checkpoint_test.cc.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <string_view>

#include "scratch_dir.h"
#include "sluice/core/error.h"
#include "sluice/core/system_allocator.h"
#include "sluice/io/checkpoint.h"
#include "sluice/io/safetensors.h"
#include "sluice/train/training_checkpoint.h"

namespace {

[[noreturn]] void Die(const char* what, std::string_view detail) {
  std::fprintf(stderr, "checkpoint_fuzz: %s\n%.*s\n", what, static_cast<int>(detail.size()),
               detail.data());
  std::abort();
}

// The checkpoint path in the scratch directory, beside its two shards (made once per process).
const std::string& ScratchCheckpoint() {
  static const std::string* const path = [] {
    auto* ckpt = new std::string(sluice::fuzz::ScratchDir("checkpoint_fuzz") + "/ckpt.safetensors");
    sluice::WriteSafetensors(sluice::CheckpointShardPath(*ckpt, 0, 2),
                             {{"a", sluice::Tensor::Full({2}, 1.5, sluice::DType::kF32)}});
    sluice::WriteSafetensors(sluice::CheckpointShardPath(*ckpt, 1, 2),
                             {{"b", sluice::Tensor::Full({1}, 7, sluice::DType::kI64)}});
    return ckpt;
  }();
  return *path;
}

bool SameTensors(const std::map<std::string, sluice::Tensor>& x,
                 const std::map<std::string, sluice::Tensor>& y) {
  if (x.size() != y.size()) return false;
  for (auto i = x.begin(), j = y.begin(); i != x.end(); ++i, ++j) {
    const sluice::Tensor& a = i->second;
    const sluice::Tensor& b = j->second;
    if (i->first != j->first || a.dtype() != b.dtype() || a.shape() != b.shape()) return false;
    const sluice::Tensor ca = a.Contiguous(), cb = b.Contiguous();
    if (a.nbytes() > 0 && std::memcmp(ca.raw_data(), cb.raw_data(), a.nbytes()) != 0) return false;
  }
  return true;
}

void CheckMetadata(const std::map<std::string, std::string>& metadata) {
  try {
    sluice::ParseTrainingCheckpointMetadata("fuzz", metadata);
  } catch (const sluice::IoError&) {
  }
}

void FuzzSafetensors(std::string_view bytes) {
  sluice::SystemAllocator allocator;
  sluice::SafetensorsFile file;
  try {
    file = sluice::ParseSafetensors(bytes, "fuzz", allocator);
  } catch (const sluice::IoError&) {
    return;
  }
  CheckMetadata(file.metadata);
  std::string written;
  try {
    written = sluice::SerializeSafetensors(file.tensors, file.metadata);
  } catch (const sluice::Error& e) {
    Die("a file that reads does not write back", e.what());
  }
  sluice::SafetensorsFile again;
  try {
    again = sluice::ParseSafetensors(written, "written", allocator);
  } catch (const sluice::IoError& e) {
    Die("the written file does not read", e.what());
  }
  if (!SameTensors(file.tensors, again.tensors) || file.metadata != again.metadata) {
    Die("the written file reads differently", written);
  }
}

void FuzzIndex(std::string_view text) {
  const std::string& ckpt = ScratchCheckpoint();
  sluice::fuzz::WriteScratchFile(sluice::CheckpointIndexPath(ckpt), text);
  sluice::SystemAllocator allocator;
  try {
    CheckMetadata(sluice::LoadCheckpoint(ckpt, allocator).metadata);
  } catch (const sluice::IoError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 2 == 0) {
    FuzzSafetensors(rest);
  } else {
    FuzzIndex(rest);
  }
  return 0;
}
