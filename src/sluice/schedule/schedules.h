// Schedule generators: gpipe, 1f1b, interleaved, zb-h1, zb-h2, zb-v, v-half and v-min as schedule
// IR (schedule.h), plus the closed-form figures they are held to (derived in docs/pipeline.md).
//
// Each generator first fixes the order of compute actions on every rank (the schedule's rule,
// below), then times that order at CostModel{} costs (schedule_analysis.h: F, B and W take 1
// each, an unsplit backward 2; messages are free; a compute starts once its inputs exist) and
// gives each message one instant, used on both ranks: the end of the compute that produced it,
// or, if the receiver is inside a compute then, the first later instant before the consumer
// starts at which neither rank is inside one (so a blocking send need not wait; this moves a
// few interleaved sends, no others). The SEND goes there in the sender's list and the RECV in
// the receiver's: after every compute that starts earlier, before every compute that starts
// then or later. Each rank's list is thereby one projection of a single global order in which
// every send meets its receive, so the schedule cannot deadlock even with rendezvous sends
// (MakeSchedule still runs ValidateSchedule on every result), and at CostModel{} no receive
// waits for a message its rank does not yet need. Messages of one instant go forward ones
// first, and within a direction the one furthest along the pipeline first. On request
// (ScheduleOptions::post_receives_ahead, off by default) receives are posted ahead: each RECV
// moves up past the
// computes before it, to just after the rank's previous send or receive, so a send that blocks
// until its receive is posted never waits out the receiver's compute (bubble 0.241 → 0.099 at
// P = 8, M = 32 under CommMode::kRendezvousPosted), at the price of receive buffers allocated
// that much earlier (docs/pipeline.md).
//
// Compute order on rank (stage) s, with P stages and M micro-batches:
//   gpipe        F0 … F(M−1), then B0 … B(M−1).
//   1f1b         w = P−1−s forwards, then M−w pairs (F(i+w), B(i)), then the last w backwards.
//                The last stage runs every B right after its F.
//   interleaved  Megatron's interleaved 1F1B, V chunks per rank (chunk c of rank r is virtual
//                stage c·P + r): forward k of the V·M runs chunk (k div P) mod V of micro-batch
//                (k div PV)·P + k mod P, backward k the chunk V−1−((k div P) mod V) of the same
//                micro-batch; w = min((V−1)·P + 2(P−1−s), V·M) forwards, then pairs, then the
//                last w backwards. Needs M a multiple of P.
//   zb-h1        Zero Bubble H1 (Qi et al., 2024): the backward split into B (input gradients)
//                and W (weight gradients); P−s forwards, s pairs (B, F), M−P triples (B, W, F),
//                P−s pairs (B, W), then the last s W. The s W postponed on stage s fill the
//                bubble 1F1B leaves at its end; as many micro-batches are in flight between F
//                and B as under 1F1B, and at most P between F and W — 1F1B's peak.
//   zb-h2        Zero Bubble H2 (Qi et al., 2024): split backward, and the order a unit-time list
//                scheduler gives: at every step each stage runs B if its output gradient has
//                arrived, else F if its input has arrived and the stage then holds at most
//                2(P−s)−1 micro-batches between F and B and 2P−1 between F and W, else a W.
//                The 2(P−s)−1 warm-up forwards fill the time until the first B comes back, the
//                B-first rule lets the last backward climb the pipeline unhindered and the W
//                postponed meanwhile fill the end: with M ≥ 2P−1, stage s computes without a
//                gap from step s to step s + 3M (the paper's parallelogram), at up to twice
//                1F1B's in-flight micro-batches. Needs M ≥ P.
//   zb-v         ZB-V (Qi et al., "Pipeline Parallelism with Controllable Memory", 2024; PyTorch's
//                ScheduleZBVZeroBubble): split backward, 2 chunks per rank placed V-shaped
//                (schedule.h: rank r holds virtual stages r and 2P−1−r, so embeddings and loss
//                are both on rank 0). With F0/B0/W0 chunk 0 and F1/B1/W1 chunk 1: 2(P−r)−1 F0,
//                r pairs (F1, F0), P−r triples (F1, B1, W1); then, while forwards remain,
//                (F0 if any is left, B0, W0, F1, B1, W1); then r pairs (B0, B1), P−r pairs
//                (B0, W0), and the W still owed, chunk 1's first. Every rank holds 2P chunk-
//                micro-batches between F and B — each half a stage, so 1F1B's stage-0 peak —
//                and computes without a gap from step r to step r + 6M. Needs M ≥ 2P−1.
//   v-half,      V-Half and V-Min (Qi et al., "Pipeline Parallelism with Controllable Memory",
//   v-min        2024): zb-v's placement and split backward, the order built by repeating the
//                paper's building block — each micro-batch's F, B of both chunks at fixed slots
//                on every rank, 6 slots apart, W in the free slots — and squeezing its warm-up
//                and cool-down (building_block.h). The block's lifespan bounds the activations:
//                at most 2⌊(P+2)/2⌋ (V-Half) or 2⌊(P+4)/3⌋ (V-Min) chunk-micro-batches between F
//                and W on any rank, about a half and a third of 1F1B's stage 0. Any M ≥ 1.
//
// Failure: MakeSchedule throws InvalidArgument for a request that cannot be met, naming the fix.
// Thread-safety: pure functions. Deterministic: equal options give equal schedules.
//
// Example:
//   Schedule s = MakeSchedule({.kind = ScheduleKind::kInterleaved, .stages = 4,
//                              .micro_batches = 8, .chunks = 2});
//   s.ranks[0].front();  // F(0, 0)
#pragma once

#include <optional>
#include <string_view>

#include "sluice/core/enum_names.h"
#include "sluice/schedule/schedule.h"

namespace sluice::pipeline {

enum class ScheduleKind {
  kGPipe,
  kOneFOneB,
  kInterleaved,
  kZeroBubbleH1,
  kZeroBubbleH2,
  kZeroBubbleV,
  kVHalf,
  kVMin
};

inline constexpr EnumEntry<ScheduleKind> kScheduleKindNames[] = {
    {ScheduleKind::kGPipe, "gpipe"},
    {ScheduleKind::kOneFOneB, "1f1b"},
    {ScheduleKind::kInterleaved, "interleaved"},
    {ScheduleKind::kZeroBubbleH1, "zb-h1"},
    {ScheduleKind::kZeroBubbleH2, "zb-h2"},
    {ScheduleKind::kZeroBubbleV, "zb-v"},
    {ScheduleKind::kVHalf, "v-half"},
    {ScheduleKind::kVMin, "v-min"},
};
static_assert(IsCompleteEnumTable(kScheduleKindNames));

// The kind's name in kScheduleKindNames ("gpipe", "1f1b", "interleaved", "zb-h1", …), and back:
// nullopt for any other text (a caller's error lists EnumNames(kScheduleKindNames, ", ")).
std::string_view ScheduleKindName(ScheduleKind kind);
std::optional<ScheduleKind> ParseScheduleKind(std::string_view name);

struct ScheduleOptions {
  ScheduleKind kind = ScheduleKind::kOneFOneB;
  int stages = 1;         // P ≥ 1
  int micro_batches = 1;  // M ≥ 1; ≥ P for 1f1b, zb-h1 and zb-h2; a multiple of P for interleaved;
                          // ≥ 2P − 1 for zb-v
  int chunks = 0;  // V: 0 means the schedule's default (2 for interleaved and the V-shaped
                   // zb-v, v-half and v-min, else 1)
  // Receives posted ahead (docs/pipeline.md): each RECV listed right after the rank's previous
  // send or receive instead of at its message's instant, for a runtime whose sends block until
  // the receive is posted. nullopt: the default, off (sluice's runtimes gain no time from it and
  // hold receive buffers longer).
  std::optional<bool> post_receives_ahead;
};

// options.post_receives_ahead with the default resolved.
bool PostsReceivesAhead(const ScheduleOptions& options);

// V with the default resolved: options.chunks, or the schedule's default when it is 0.
int ChunksOf(const ScheduleOptions& options);

// Whether the schedule places its two chunks per rank V-shaped (schedule.h): zb-v, v-half, v-min.
bool IsVShaped(ScheduleKind kind);

// Generates and validates the schedule. Throws InvalidArgument when P < 1, M < 1, M < P for
// 1f1b, zb-h1 or zb-h2, M not a multiple of P or V < 2 for interleaved, M < 2P − 1 for zb-v,
// V ≠ 2 for the V-shaped ones, V ≠ 1 for the others, P > kMaxStages or V > kMaxChunks
// (schedule.h), or when the schedule would exceed 10⁹ actions (8 GB). Time and memory are
// linear in the actions: 8 bytes held per action.
Schedule MakeSchedule(const ScheduleOptions& options);

// The micro-batch count a pipeline runs with when the user gives none: the fewest that divide
// `batch` (every micro-batch the same size), are at least P (fewer leave every stage idle for
// most of the step) and that the schedule accepts (MakeSchedule's rules: M ≥ 2P − 1 for zb-v, a
// multiple of P for interleaved). nullopt when no divisor of `batch` qualifies — MakeSchedule's
// error with the user's count then says what to change.
std::optional<int> DefaultMicroBatches(const ScheduleOptions& options, int64_t batch);

// The peak number of chunk-micro-batches on `rank` whose F has run and whose B has not (what
// InFlightPeaks in schedule_analysis.h measures from the action lists):
//   gpipe M;  1f1b and zb-h1 min(P−s, M);  zb-h2 min(2(P−s)−1, M);
//   interleaved min(V·P + P − 1 − 2s, V·M);  zb-v 2P;
//   v-half and v-min: the peak of the generated lists (InFlightPeaks) — the squeezed warm-up
//   leaves no closed form per rank; every rank is at most the block's 2⌊(P+2)/2⌋ resp.
//   2⌊(P+4)/3⌋ (building_block.h), and the tests hold the lists to that
// (interleaved and the V-shaped count chunk-micro-batches, each 1/V of a stage's activations).
int TheoreticalInFlight(const ScheduleOptions& options, int rank);

// The bubble fraction (idle share of every rank's time) with F, B and W all of equal cost and
// an unsplit backward costing B + W (CostModel{} in schedule_analysis.h):
//   gpipe and 1f1b (P−1)/(M+P−1);  interleaved (P−1)/(V·M+P−1);  zb-v (P−1)/(6M+P−1);
//   zb-h1 and zb-h2 (P−1)/(3M+P−1);  v-min and v-half X/(6M+X) with X the idle slots of every
//   rank: v-min 4P−5 (4P−7 when 3 | P), v-half 6⌊(P−1)/2⌋−1 (1 at P = 2), 0 at P = 1 —
//   exact for M ≥ 2P (measured, P ≤ 8; docs/pipeline.md), a lower bound for P ≤ M < 2P.
//   For zb-h2 and zb-v that is only the skew — s idle steps before stage s's first F, P−1−s
//   after its last W — which a synchronous optimizer step keeps (docs/pipeline.md: where zb-h2
//   gains over zb-h1).
double TheoreticalBubble(const ScheduleOptions& options);

}  // namespace sluice::pipeline
