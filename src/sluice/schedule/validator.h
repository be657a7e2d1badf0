// ValidateSchedule: proves a schedule (schedule.h) safe to execute before any stage runs it, so
// that a wrong schedule is a clear error instead of wrong gradients or a hang.
//
// Checks, in this order; the first fault found is thrown:
//   1. shape: P, M, V ≥ 1 (V = 2 when V-shaped) and one action list per rank;
//   2. each action on its own: chunk in [0, V), micro-batch in [0, M), W only when the backward
//      is split, a send or receive only between adjacent virtual stages on different ranks and
//      naming that neighbour as its peer (so a first stage never has RECV_F, a last never SEND_F);
//   3. per rank, walking its list: no action twice, and each runs after what it needs —
//      F(c, m) after RECV_F(c, m) (or, for a hand-off within the rank, after the previous
//      chunk's F), B after its F and after RECV_B (or the next chunk's B), W after B, SEND_F after
//      F, SEND_B after B, OPT last and only once;
//   4. per rank, completeness: every F, B (and W when split) of every chunk and micro-batch, and
//      every send and receive those imply;
//   5. per ordered pair of ranks (r → q): the k-th send from r to q and the k-th receive on q from
//      r name the same message (kind, micro-batch, virtual stage);
//   6. no deadlock: executing every rank's list in order where a compute action always proceeds
//      and a send proceeds only together with the matching receive on its peer (blocking
//      rendezvous, the strictest semantics a runtime may have) runs every list to its end.
//
// Failure: throws ScheduleError whose message names the schedule and the rank, step (index into
// the rank's list, from 0) and action at fault — for a deadlock, every blocked rank and what it
// waits for. Runs in O(total actions) time — each rank's list is walked once for checks 2 to 5
// (a message's send and receive compare their indices among their pair's messages; only a
// mismatch walks the pair's lists, to name the first message out of order), and check 6 runs
// each rank until it blocks, woken by its peers — and O(V · P · M) memory beyond the schedule:
// 4 bytes a message.
// Thread-safety: a pure function.
//
// Example:
//   ValidateSchedule(s);
//   // ScheduleError: "1f1b (P=2, M=2): deadlock under blocking send/receive: rank 0 waits at
//   //   step 3 (SEND_F1>1) for rank 1, which waits at step 3 (SEND_B0>0); rank 1 waits at
//   //   step 3 (SEND_B0>0) for rank 0, which waits at step 3 (SEND_F1>1)"
#pragma once

#include "sluice/schedule/schedule.h"

namespace sluice::pipeline {

void ValidateSchedule(const Schedule& schedule);

}  // namespace sluice::pipeline
