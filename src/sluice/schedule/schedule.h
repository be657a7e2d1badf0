// The pipeline schedule IR: for every rank, the ordered list of actions its stage runtime executes.
//
// One representation, four users: generators produce it (schedules.h), the validator checks it
// (validator.h), the stage runtime executes it rank by rank, and the analysis, simulator and
// trace cost and draw it (schedule_analysis.h, schedule_format.h).
//
// Glossary — P stages (= ranks), M micro-batches, V chunks per rank (V > 1 when interleaved or
// V-shaped). Ranks, chunks and micro-batches count from 0. The model runs through *virtual
// stages* 0, 1, …, V·P − 1, placed on the ranks in one of two ways:
//   looped (interleaved)  chunk c of rank r is virtual stage c·P + r: the first (embeddings) is
//                         chunk 0 of rank 0, the last (loss) chunk V − 1 of rank P − 1;
//   V-shaped (V = 2)      chunk 0 of rank r is virtual stage r, chunk 1 is 2P − 1 − r: the model
//                         runs down the ranks and back up, so rank 0 holds both the first and the
//                         last virtual stage, and rank P − 1 hands chunk 0's output to its own
//                         chunk 1 (virtual stages P − 1 → P) without a message.
//
//   action        what the rank does                                    grid cell (V > 1)
//   F(c, m)       forward of chunk c on micro-batch m                   "Fm"  ("Fc.m")
//   B(c, m)       backward: input gradients, and the weight gradients   "Bm"  ("Bc.m")
//                 too unless the schedule splits the backward
//   W(c, m)       weight gradients of a split backward                  "Wm"  ("Wc.m")
//   SEND_F(c, m)  send the output of F(c, m) to `peer` (next virtual stage)
//   RECV_F(c, m)  receive from `peer` the input of F(c, m)
//   SEND_B(c, m)  send the input gradient made by B(c, m) to `peer` (previous virtual stage)
//   RECV_B(c, m)  receive from `peer` the output gradient that B(c, m) needs
//   OPT           the optimizer step: once per rank, the last action
//
// The chunk of a send or receive is always the chunk of *this* rank that produces or consumes the
// message, so SEND_F(0, m) on rank P − 1 pairs with RECV_F(1, m) on rank 0 when interleaved.
// A hand-off between neighbouring virtual stages of the same rank (P = 1, or the turn of a V) is
// local: there is no SEND/RECV, the consuming F (or B) simply follows the producing one in the
// rank's list. Who neighbours whom is always asked of the Schedule (VirtualStage, RankOf,
// ChunkOf), never computed from c·P + r.
//
// What a valid schedule promises its executor (validator.h checks all of it): every action a
// rank needs appears exactly once; F before B before W; a F (B) after the RECV_F (RECV_B) of
// its input, a SEND_F (SEND_B) after the F (B) that produced it; for each pair of ranks the sends
// of one and the receives of the other name the same messages in the same order; OPT last; and
// executing each rank's list in order with *blocking rendezvous* sends and receives (a send
// completes only once the receiver has taken the message) cannot deadlock. A runtime with
// buffered sends, or one that posts receives ahead and waits where the message is read, runs
// any such schedule too.
//
// Ownership and thread-safety: plain values, copied freely; concurrent reads are safe.
//
// Example:
//   Schedule s = MakeSchedule({.kind = ScheduleKind::kOneFOneB, .stages = 4, .micro_batches = 8});
//   for (const Action& a : s.ranks[2]) fmt::print("{} ", ActionName(a, s.chunks));
//   // RECV_F0<1 F0 SEND_F0>3 RECV_F1<1 F1 SEND_F1>3 RECV_F2<1 RECV_B0<3 B0 SEND_B0>1 F2 …
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/enum_names.h"
#include "sluice/core/error.h"

namespace sluice::pipeline {

// A schedule is malformed or cannot run (validator.h), or a generator was asked for one that
// cannot exist (schedules.h). The message names the schedule, and the rank, step and action.
class ScheduleError : public Error {
  using Error::Error;
};

enum class ActionKind : uint8_t {
  kForward,
  kBackward,
  kWeight,
  kSendF,
  kRecvF,
  kSendB,
  kRecvB,
  kOptimizer
};

inline constexpr EnumEntry<ActionKind> kActionKindNames[] = {
    {ActionKind::kForward, "F"},    {ActionKind::kBackward, "B"},    {ActionKind::kWeight, "W"},
    {ActionKind::kSendF, "SEND_F"}, {ActionKind::kRecvF, "RECV_F"},  {ActionKind::kSendB, "SEND_B"},
    {ActionKind::kRecvB, "RECV_B"}, {ActionKind::kOptimizer, "OPT"},
};
static_assert(IsCompleteEnumTable(kActionKindNames));

// The kind's name in kActionKindNames: "F", "SEND_F", "OPT", ...
std::string_view ActionKindName(ActionKind kind);

// F, B, W
constexpr bool IsCompute(ActionKind kind) {
  return kind == ActionKind::kForward || kind == ActionKind::kBackward ||
         kind == ActionKind::kWeight;
}
// SEND_F, SEND_B
constexpr bool IsSend(ActionKind kind) {
  return kind == ActionKind::kSendF || kind == ActionKind::kSendB;
}
// RECV_F, RECV_B
constexpr bool IsRecv(ActionKind kind) {
  return kind == ActionKind::kRecvF || kind == ActionKind::kRecvB;
}

// An action takes 8 bytes (a schedule of P = 1024, M = 8192 holds 50 M of them): a schedule has
// at most kMaxStages ranks and kMaxChunks chunks per rank; MakeSchedule refuses more.
inline constexpr int kMaxStages = INT16_MAX;
inline constexpr int kMaxChunks = INT8_MAX;

// Eight bytes: micro_batch and peer are bit-fields (read them as values; they bind to no
// reference — `+a.micro_batch` where a function takes its argument by reference, as fmt does).
struct Action {
  ActionKind kind = ActionKind::kForward;
  int8_t chunk = 0;              // local chunk of this rank, in [0, V); 0 for OPT
  int64_t micro_batch : 32 = 0;  // in [0, M); 0 for OPT
  int64_t peer : 16 = -1;        // the other rank of a send or receive; -1 for every other

  bool operator==(const Action&) const = default;
};
static_assert(sizeof(Action) == 8);

// Compact name: "F3", "B1.2" (chunk.micro-batch when chunks > 1), "SEND_F3>2" (to rank 2),
// "RECV_B3<2" (from rank 2; the peer is left out while it is -1), "OPT". The same text as a grid
// cell for F/B/W.
std::string ActionName(const Action& action, int chunks);

struct Schedule {
  std::string name;             // the generator's name ("1f1b", …); appears in every error
  int stages = 1;               // P: ranks
  int micro_batches = 1;        // M
  int chunks = 1;               // V: chunks per rank
  bool split_backward = false;  // backward is B (input gradients) then W (weight gradients)
  bool v_shape = false;         // V-shaped placement (chunks = 2), else looped (glossary above)
  std::vector<std::vector<Action>> ranks;  // [P][steps]: each rank's actions in execution order

  int virtual_stages() const { return stages * chunks; }
  int VirtualStage(int rank, int chunk) const {
    return v_shape && chunk == 1 ? 2 * stages - 1 - rank : chunk * stages + rank;
  }
  int RankOf(int virtual_stage) const {
    return v_shape && virtual_stage >= stages ? 2 * stages - 1 - virtual_stage
                                              : virtual_stage % stages;
  }
  int ChunkOf(int virtual_stage) const { return virtual_stage / stages; }

  // "1f1b (P=4, M=8)" or "interleaved (P=4, M=8, V=2)": how errors and headings name it.
  std::string Describe() const;

  bool operator==(const Schedule&) const = default;
};

}  // namespace sluice::pipeline
