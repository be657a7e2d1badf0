// V-Min and V-Half: V-shaped schedules built by repeating a *building block* (Qi, Wan, Amar and
// Lin, "Pipeline Parallelism with Controllable Memory", NeurIPS 2024), as compute orders for the
// schedule generators (schedules.h), which add the messages and validate.
//
// Placement is V-shaped (schedule.h): rank r runs chunk 0 (virtual stage r, the way down) and
// chunk 1 (virtual stage 2P − 1 − r, the way back up). One micro-batch visits rank r four times —
// F of chunk 0, F of chunk 1, B of chunk 1, B of chunk 0 — and leaves two W (one per chunk) that
// nothing downstream waits for. Time runs in *slots*, one per F, B or W (they cost the same).
//
// The building block is the slot of each of those four computes of micro-batch 0 on every rank
// (BuildingBlockOffsets); micro-batch m runs the same block 6m slots later. In the steady state a
// rank therefore runs 4 computes and 2 W in every 6 slots, and holds the activations of a
// micro-batch's chunk from its F to its W: the *lifespan* of the block, summed over the two
// chunks and divided by the interval 6, is the steady state's activation count. The offsets
// choose that lifespan:
//   V-Min   F0 at r, F1 at 2P − 1 − r, B1 at 2P + g + r, B0 at 4P + g − 1 − r (g = 2 when 3 | P,
//           else 0: the gap that keeps two computes of a rank off one slot modulo 6). Both passes
//           move one rank per slot; lifespans 4P + g − 1 − 2r and 2r + g + 1, about 4P in all:
//           ≈ 2P/3 chunk-micro-batches, a third of 1F1B's stage 0 (2P chunk-micro-batches).
//   V-Half  F0 at 2r, F1 at 3P − 2 − r, B1 at 3P + g − 1 + 2r, B0 at 6P + g − 2 − r (g = 3 when P
//           is even, else 0). F0 and B1 move one rank per two slots; lifespans sum to about 6P:
//           ≈ P chunk-micro-batches, half of 1F1B's.
// Building the schedule from the block (the paper's "squeeze and reorder"):
//   1. lay out M blocks, 6 slots apart; each W goes to the first free slot of its rank after its
//      B (earliest B first);
//   2. *squeeze* the warm-up (slots before rank 0's first chunk-0 backward) and the cool-down
//      (slots after rank 0's last chunk-0 forward): in slot order, move each compute to the
//      earliest free slot after its inputs at which its rank's activation peak stays within the
//      laid-out schedule's highest rank peak — so squeezing makes no rank hold more than the
//      block does; the steady state stays as laid out. Then run the order as soon as inputs allow
//      (unit slots);
//   3. drop the W, squeeze the cool-down once more with every W run in the first free slot after
//      its B, and run the order as soon as inputs allow again;
//   4. the compute order is the slot order, with each W in its rank's first free slot after its
//      B (chunk 1's before chunk 0's when both wait).
// The paper's figures (activations with F = B = W, in stage-micro-batches = 2 chunk-micro-
// batches): V-Min ⌊(P + 4)/3⌋, V-Half ⌊(P + 2)/2⌋; bubble ≈ 2P/(3M) and P/(2M). docs/pipeline.md
// derives and measures them.
//
// Failure: throws InvalidArgument for P < 1 or M < 1. Thread-safety: pure functions.
// Deterministic.
//
// Example:
//   auto order = BuildingBlockOrder(BuildingBlock::kVMin, 4, 8);
//   order[0].front();  // F(0, 0): rank 0 starts with chunk 0 of micro-batch 0
#pragma once

#include <vector>

#include "sluice/schedule/schedule.h"

namespace sluice::pipeline {

enum class BuildingBlock { kVMin, kVHalf };

// Slots of micro-batch 0's four computes on `rank` of P (the table above).
struct BlockOffsets {
  int forward0 = 0;   // F of chunk 0
  int forward1 = 0;   // F of chunk 1
  int backward1 = 0;  // B of chunk 1
  int backward0 = 0;  // B of chunk 0
};
BlockOffsets BuildingBlockOffsets(BuildingBlock block, int stages, int rank);

// The paper's peak activation memory for the block, in chunk-micro-batches (each half a stage's
// activations): 2⌊(P + 4)/3⌋ for V-Min, 2⌊(P + 2)/2⌋ for V-Half. A micro-batch's chunk counts
// from its F to its W, as in the paper (InFlight::peak_until_weight in schedule_analysis.h).
int BuildingBlockPeakActivations(BuildingBlock block, int stages);

// Every rank's compute order — F, B and W actions (peer −1), chunks 0 and 1, 6M per rank.
std::vector<std::vector<Action>> BuildingBlockOrder(BuildingBlock block, int stages,
                                                    int micro_batches);

}  // namespace sluice::pipeline
