// Partitioning: which units of the model each pipeline (virtual) stage runs.
//
// A model is a sequence of units (nn/model.h ModelUnits: the GPT's embed, h.0 … h.L−1, head; a
// program's `unit` blocks), each with an estimated cost. A partition is one UnitRange per virtual
// stage, in model order: virtual stage k is chunk k / P of rank k % P (schedule.h), so stage 0 —
// chunk 0 of rank 0 — always holds the first unit and the last virtual stage the last (the loss).
// Every unit lies in exactly one stage, and the stages take them in order. For the GPT the same
// partition is also written as GptSlices (GptPartition, below).
//
// Three ways to make one:
//   * kUniform: the units between the first and the last (the GPT's L blocks) split as evenly as
//     possible, the first unit with stage 0, the last with stage S − 1; L mod S stages get one
//     block more. Those
//     go to the middle stages first (1, 2, …), since the two ends already carry extra work: the
//     head's lm_head costs 2·B·T·C·vocab FLOPs (often several blocks' worth) and its logits
//     [B, T, vocab] are the largest activation, the embedding does little. Only when every middle
//     stage has its extra block does stage 0 take one; the last stage never does.
//   * kBalanced: the units, each with its estimated cost (the GPT's: EstimateGptCosts, nn/gpt.h;
//     a program's: EstimateUnitCosts, nn/training_program.h), are cut into S contiguous non-empty
//     groups so that the most expensive group is as cheap as possible (exact, by dynamic
//     programming). Among the optimal cuts the earlier stages take as few units as they can: under
//     1F1B stage s keeps min(P−s, M) micro-batches in flight, so memory is dearest at the front.
//     Placement::kVShape (zb-v, schedule.h): S = 2P groups, and rank r runs groups r and
//     2P − 1 − r — rank 0 both embed's and head's. The cut makes the most expensive *rank* (the
//     sum of its two groups) as cheap as possible, exact: the least bound every rank can meet,
//     found by bisection over the doubles, each test a dynamic program in O(P·N²) for N = L + 2
//     units (P = 8, L = 512: 0.35 s; the program over every rank's pair of cuts it replaced was
//     O(P·N⁴), 16 s).
//   * ParseLayout: an explicit layout, the text of the CLI's --layout. Stages are separated by
//     '|', items by ','; an item is a unit's name, or a range "P.i-j" (inclusive) of the units
//     P.i … P.j — for the GPT "embed", "head", "h.i" or "h.i-j":
//       "embed,h.0-1|h.2-3,head"      two stages of two blocks each
//       "embed|h.0-3|head"            embeddings and head on stages of their own
//     A layout always lists the virtual stages in model order; the placement says which rank runs
//     each. V-shaped with P = 2, "embed,h.0|h.1|h.2|h.3,head" puts embed,h.0 and h.3,head on
//     rank 0, h.1 and h.2 on rank 1.
//
// Costs are forward FLOPs (a multiply-add counts 2); the GPT's formulas are in nn/gpt.h.
//
// Failures throw InvalidArgument with a message naming the stage and the item at fault, and the
// fix where there is one.
//
// Thread-safety: plain functions over values.
//
// Example:
//   GptPartition p = PartitionGpt(cfg, /*batch=*/8, /*seq_len=*/0, /*virtual_stages=*/4,
//                                 PartitionKind::kBalanced);
//   FormatLayout(p);                      // e.g. "embed,h.0|h.1-2|h.3-4|h.5,head"
//   Model stage = BuildGptSlice(cfg, 8, GptOutput::kLoss, 0, p.stages[1]);
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/enum_names.h"
#include "sluice/nn/gpt.h"

namespace sluice::pipeline {

enum class PartitionKind { kUniform, kBalanced };

inline constexpr EnumEntry<PartitionKind> kPartitionKindNames[] = {
    {PartitionKind::kUniform, "uniform"},
    {PartitionKind::kBalanced, "balanced"},
};
static_assert(IsCompleteEnumTable(kPartitionKindNames));

// Which rank runs virtual stage k of S = V·P (schedule.h): kLooped k mod P (one chunk per rank,
// or interleaved), kVShape k for k < P and 2P − 1 − k after (zb-v; S = 2P).
enum class Placement { kLooped, kVShape };

// The kind's name in kPartitionKindNames ("uniform", "balanced"), and back: nullopt for any other
// text (a caller's error lists EnumNames(kPartitionKindNames, " or ")).
std::string_view Name(PartitionKind kind);
std::optional<PartitionKind> ParsePartitionKind(std::string_view name);

struct Partition {
  std::vector<UnitRange> stages;  // one per virtual stage, in model order

  bool operator==(const Partition&) const = default;
};

// S = virtual_stages (--stages × --chunks) ranges of `units`.
// Throws InvalidArgument: a model without units, kUniform with fewer units between the first and
// the last than stages (suggesting --partition balanced or --layout), kBalanced with more stages
// than units, kVShape with S odd.
Partition PartitionUnits(const ModelUnits& units, int virtual_stages, PartitionKind kind,
                         Placement placement = Placement::kLooped);

// Throws InvalidArgument naming the stage and item: unknown item (listing the forms the model's
// units take), a range out of range, a unit in two stages (duplicated), a unit in no stage
// (dropped), an empty stage, units out of order, or a number of stages other than
// virtual_stages (for kVShape the message explains the V: 2P stages in model order, rank 0
// running the first and the last).
Partition ParseLayout(std::string_view layout, const ModelUnits& units, int virtual_stages,
                      Placement placement = Placement::kLooped);

// The layout text, runs of numbered units written P.i-j:
// ParseLayout(FormatLayout(p, units.names), units, p.stages.size()) == p.
std::string FormatLayout(const Partition& partition, const std::vector<std::string>& unit_names);

// Forward FLOPs per stage: the sum of its units' costs.
std::vector<double> EstimateStageCosts(const Partition& partition, const ModelUnits& units);

// The GPT's partitions as GptSlices (nn/gpt.h): the same partitions over GptUnits.
struct GptPartition {
  // One per virtual stage, in model order. end_layer is explicit (never -1); a stage without
  // blocks has first_layer == end_layer == the number of blocks on the stages before it.
  std::vector<GptSlice> stages;

  bool operator==(const GptPartition&) const = default;
};

// S = virtual_stages (--stages × --chunks) slices; seq_len 0 means config.seq.
// Throws InvalidArgument: kUniform with fewer blocks than stages (suggesting --partition balanced
// or --layout), kBalanced with S > L + 2, non-positive sizes, kVShape with S odd.
GptPartition PartitionGpt(const GptConfig& config, int64_t batch, int64_t seq_len,
                          int virtual_stages, PartitionKind kind,
                          Placement placement = Placement::kLooped);

// Throws InvalidArgument naming the stage and item: unknown item, layer out of range, a layer in
// two stages (duplicated), a layer in no stage (dropped), an empty stage, layers out of order,
// embed not first or head not last, or a number of stages other than virtual_stages (for
// kVShape the message explains the V: 2P stages in model order, rank 0 running the first and the
// last).
GptPartition ParseGptLayout(std::string_view layout, const GptConfig& config, int virtual_stages,
                            Placement placement = Placement::kLooped);

// The layout text: ParseGptLayout(FormatLayout(p), config, p.stages.size()) == p.
std::string FormatLayout(const GptPartition& partition);

// Forward FLOPs per stage: the sum of its units' costs.
std::vector<double> EstimateStageCosts(const GptPartition& partition, const GptConfig& config,
                                       int64_t batch, int64_t seq_len);

}  // namespace sluice::pipeline
