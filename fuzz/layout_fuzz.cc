// Fuzz target for the --layout parser (pipeline/partition.h: ParseGptLayout, FormatLayout).
//
// Input: byte 0 picks the number of virtual stages (1–8, its low 3 bits) and the placement (bit
// 3: V-shaped, as zb-v reads layouts), byte 1 the model's blocks (1–16); the rest is the layout
// text. For every input:
//   * ParseGptLayout returns a partition or throws InvalidArgument. Any other exception escapes
//     and libFuzzer reports it as a crash; so do hangs and sanitizer reports.
//   * A partition it returns is one: S stages in model order, the embeddings on the first, the
//     head on the last, every block on exactly one stage, none empty.
//   * FormatLayout of it parses back to the same partition.
//
// Run: make fuzz (FUZZ_SECONDS=300 for longer), or build-fuzz/fuzz/layout_fuzz
// -dict=fuzz/layout.dict CORPUS_DIR fuzz/corpus/layout. Add each input that found a bug to
// tests/pipeline/partition_test.cc.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include "sluice/core/error.h"
#include "sluice/pipeline/partition.h"

namespace {

[[noreturn]] void Die(const char* what, std::string_view layout) {
  std::fprintf(stderr, "layout_fuzz: %s\nlayout: \"%.*s\"\n", what, static_cast<int>(layout.size()),
               layout.data());
  std::abort();
}

// Whether `p` is a partition of `layers` blocks into `stages` stages (partition.h's invariants).
bool IsPartition(const sluice::pipeline::GptPartition& p, int64_t layers, int stages) {
  if (static_cast<int>(p.stages.size()) != stages) return false;
  int64_t next = 0;
  for (size_t k = 0; k < p.stages.size(); ++k) {
    const sluice::GptSlice& s = p.stages[k];
    if (s.embed != (k == 0) || s.head != (k + 1 == p.stages.size())) return false;
    if (s.first_layer != next || s.end_layer < s.first_layer) return false;
    if (!s.embed && !s.head && s.end_layer == s.first_layer) return false;  // empty
    next = s.end_layer;
  }
  return next == layers;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const int stages = 1 + data[0] % 8;
  const auto placement = (data[0] & 8) != 0 ? sluice::pipeline::Placement::kVShape
                                            : sluice::pipeline::Placement::kLooped;
  sluice::GptConfig config;
  config.layers = 1 + data[1] % 16;
  const std::string_view layout(reinterpret_cast<const char*>(data) + 2, size - 2);
  sluice::pipeline::GptPartition partition;
  try {
    partition = sluice::pipeline::ParseGptLayout(layout, config, stages, placement);
  } catch (const sluice::InvalidArgument&) {
    return 0;
  }
  if (!IsPartition(partition, config.layers, stages))
    Die("accepted a layout that is no partition", layout);
  const std::string formatted = sluice::pipeline::FormatLayout(partition);
  try {
    if (sluice::pipeline::ParseGptLayout(formatted, config, stages, placement) != partition) {
      Die("FormatLayout does not parse back to the same partition", formatted);
    }
  } catch (const sluice::InvalidArgument& e) {
    Die("FormatLayout's text does not parse", formatted + "\n" + e.what());
  }
  return 0;
}
