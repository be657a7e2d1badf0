#include "sluice/schedule/validator.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

namespace sluice::pipeline {

namespace {

// The message a send or receive carries, named from the sender's side.
struct Message {
  bool forward;      // activation (SEND_F/RECV_F) or gradient (SEND_B/RECV_B)
  int from_virtual;  // virtual stage that produced it
  int micro_batch;
  bool operator==(const Message&) const = default;
};

class Validator {
 public:
  explicit Validator(const Schedule& s) : s_(s) {}

  void Run() {
    CheckShape();
    sequence_.assign(2 * static_cast<size_t>(s_.virtual_stages()) * s_.micro_batches, 0);
    // A rank's steps are counted on from the previous rank's, so that steps_ needs no clearing
    // between ranks (only when the count would leave an int).
    const size_t slots = static_cast<size_t>(kSlotKinds) * s_.chunks * s_.micro_batches;
    for (int r = 0, size = 0; r < s_.stages; ++r) {
      first_step_ += size;
      size = static_cast<int>(s_.ranks[r].size());
      if (r == 0 || first_step_ + size > std::numeric_limits<int>::max()) {
        steps_.assign(slots, -1);
        first_step_ = 0;
      }
      chunks_.clear();
      for (int c = 0; c < s_.chunks; ++c) {
        chunks_.push_back({.vs = s_.VirtualStage(r, c),
                           .prev_peer = PeerOf(ActionKind::kRecvF, r, c).value_or(-1),
                           .next_peer = PeerOf(ActionKind::kSendF, r, c).value_or(-1)});
      }
      peers_.clear();
      for (int i = 0; i < static_cast<int>(s_.ranks[r].size()); ++i) CheckAction(r, i);
      CheckComplete(r);
    }
    // The walk of every pair of lists, only to name the first message out of order.
    if (out_of_order_) CheckPairing();
    CheckNoDeadlock();
  }

 private:
  static constexpr int kKinds = 7;      // every kind but OPT has a (chunk, micro-batch) slot
  static constexpr int kSlotKinds = 8;  // slots of one chunk-micro-batch side by side, padded

  // ---- naming -------------------------------------------------------------------------------

  std::string Name(const Action& a) const { return ActionName(a, s_.chunks); }
  std::string Name(ActionKind kind, int chunk, int mb) const {
    return Name(Action{.kind = kind, .chunk = static_cast<int8_t>(chunk), .micro_batch = mb});
  }
  std::string At(int rank, int step) const {
    return fmt::format("rank {}, step {} ({})", rank, step, Name(s_.ranks[rank][step]));
  }
  [[noreturn]] void Fail(const std::string& what) const {
    throw ScheduleError(fmt::format("{}: {}", s_.Describe(), what));
  }

  // ---- topology -----------------------------------------------------------------------------

  // The rank a send or receive of `kind` on (rank, chunk) must name, or nullopt when the message
  // cannot exist: no neighbouring virtual stage, or the neighbour lives on the same rank.
  std::optional<int> PeerOf(ActionKind kind, int rank, int chunk) const {
    const int vs = s_.VirtualStage(rank, chunk);
    const int neighbour =
        (kind == ActionKind::kSendF || kind == ActionKind::kRecvB) ? vs + 1 : vs - 1;
    if (neighbour < 0 || neighbour >= s_.virtual_stages()) return std::nullopt;
    if (s_.RankOf(neighbour) == rank) return std::nullopt;
    return s_.RankOf(neighbour);
  }

  bool Needed(ActionKind kind, int rank, int chunk) const {
    if (kind == ActionKind::kWeight) return s_.split_backward;
    if (IsCompute(kind)) return true;
    return PeerOf(kind, rank, chunk).has_value();
  }

  // Checks 2 to 4 walk one rank at a time: steps_ holds the rank being walked, the kinds of one
  // chunk-micro-batch side by side (an action and what it needs share a cache line).
  int& Slot(int rank, ActionKind kind, int chunk, int mb) {
    return steps_[(static_cast<size_t>(chunk) * s_.micro_batches + mb) * kSlotKinds +
                  static_cast<size_t>(kind)];
  }
  bool Done(int rank, ActionKind kind, int chunk, int mb) {
    return Slot(rank, kind, chunk, mb) >= first_step_;
  }

  // ---- 1. shape -----------------------------------------------------------------------------

  void CheckShape() const {
    if (s_.stages < 1 || s_.micro_batches < 1 || s_.chunks < 1) {
      Fail(fmt::format(
          "stages, micro-batches and chunks must all be at least 1 (got P={}, M={}, V={})",
          s_.stages, s_.micro_batches, s_.chunks));
    }
    if (s_.v_shape && s_.chunks != 2) {
      Fail(fmt::format("a V-shaped placement holds exactly 2 chunks per rank (got V={})",
                       s_.chunks));
    }
    if (static_cast<int>(s_.ranks.size()) != s_.stages) {
      Fail(fmt::format("has {} action lists for {} ranks: one list per rank", s_.ranks.size(),
                       s_.stages));
    }
  }

  // ---- 2. and 3. one action, in the order of its rank's list --------------------------------

  void CheckAction(int r, int i) {
    const Action& a = s_.ranks[r][i];
    // The place is formatted only for an error: this runs once per action of every schedule.
    if (a.kind == ActionKind::kOptimizer) {
      if (i + 1 != static_cast<int>(s_.ranks[r].size())) {
        Fail(fmt::format("{}: OPT must be the rank's last action, once", At(r, i)));
      }
      return;
    }
    if (a.chunk < 0 || a.chunk >= s_.chunks)
      Fail(fmt::format("{}: chunk {} is outside [0, {})", At(r, i), a.chunk, s_.chunks));
    if (a.micro_batch < 0 || a.micro_batch >= s_.micro_batches) {
      Fail(fmt::format("{}: micro-batch {} is outside [0, {})", At(r, i), a.micro_batch,
                       s_.micro_batches));
    }
    if (a.kind == ActionKind::kWeight && !s_.split_backward) {
      Fail(fmt::format(
          "{}: W in a schedule whose backward is not split (B computes weight gradients too)",
          At(r, i)));
    }
    if (IsCompute(a.kind) && a.peer != -1)
      Fail(fmt::format("{}: a compute action names peer {}", At(r, i), a.peer));
    if (IsSend(a.kind) || IsRecv(a.kind)) CheckPeer(r, i, a);

    const int c = a.chunk, m = a.micro_batch;
    if (Done(r, a.kind, c, m)) {
      Fail(fmt::format("{}: {} already ran at step {}", At(r, i), Name(a.kind, c, m),
                       Slot(r, a.kind, c, m) - first_step_));
    }
    CheckPrerequisites(r, i, a);
    Slot(r, a.kind, c, m) = static_cast<int>(first_step_ + i);
    if (IsSend(a.kind) || IsRecv(a.kind)) Sequence(r, a);
  }

  // Check 5 without walking lists twice: the k-th send from r to q records k + 1 at its message,
  // the k-th receive on q from r −(k + 1); the other side of the message must find the same k.
  void Sequence(int r, const Action& a) {
    const bool send = IsSend(a.kind);
    const int to = static_cast<int>(a.peer);
    auto peer = std::ranges::find(peers_, to, &PeerCount::peer);
    if (peer == peers_.end()) peer = peers_.insert(peer, {.peer = to});
    const int k = send ? ++peer->sends : ++peer->receives;
    const Message msg = MessageOf(r, a);
    int& other =
        sequence_[(static_cast<size_t>(msg.from_virtual) * s_.micro_batches + msg.micro_batch) * 2 +
                  (msg.forward ? 0 : 1)];
    if (other == 0) {
      other = send ? k : -k;
    } else if (other != (send ? -k : k)) {
      out_of_order_ = true;
    }
  }

  void CheckPeer(int r, int i, const Action& a) const {
    const ChunkPlace& place = chunks_[a.chunk];
    const bool outward = a.kind == ActionKind::kSendF || a.kind == ActionKind::kRecvB;
    if (a.peer == (outward ? place.next_peer : place.prev_peer) && a.peer >= 0) return;
    const std::optional<int> expected = PeerOf(a.kind, r, a.chunk);
    const int vs = s_.VirtualStage(r, a.chunk);
    if (!expected) {
      const bool outward = a.kind == ActionKind::kSendF || a.kind == ActionKind::kRecvB;
      const int neighbour = outward ? vs + 1 : vs - 1;
      if (neighbour < 0 || neighbour >= s_.virtual_stages()) {
        Fail(fmt::format("{}: virtual stage {} is the {} stage: it has no {}", At(r, i), vs,
                         outward ? "last" : "first", ActionKindName(a.kind)));
      }
      Fail(fmt::format(
          "{}: virtual stages {} and {} are both on rank {}: the hand-off is local, no {}",
          At(r, i), vs, neighbour, r, ActionKindName(a.kind)));
    }
    if (a.peer != *expected) {
      Fail(fmt::format("{}: names peer {}, but the neighbouring virtual stage lives on rank {}",
                       At(r, i), a.peer, *expected));
    }
  }

  // What action `a` at step i needs to have run earlier on the same rank.
  void CheckPrerequisites(int r, int i, const Action& a) {
    const int c = a.chunk, m = a.micro_batch;
    auto need = [&](ActionKind kind, int chunk, const char* why) {
      if (Done(r, kind, chunk, m)) return;
      Fail(fmt::format("{}: runs before {} ({})", At(r, i), Name(kind, chunk, m), why));
    };
    const ChunkPlace& place = chunks_[c];
    const int vs = place.vs;
    switch (a.kind) {
      case ActionKind::kForward:
        if (vs > 0) {
          if (place.prev_peer >= 0)
            need(ActionKind::kRecvF, c, "its input arrives there");
          else
            need(ActionKind::kForward, s_.ChunkOf(vs - 1), "its input is made there, on this rank");
        }
        break;
      case ActionKind::kBackward:
        need(ActionKind::kForward, c, "a backward needs its forward");
        if (vs + 1 < s_.virtual_stages()) {
          if (place.next_peer >= 0)
            need(ActionKind::kRecvB, c, "its output gradient arrives there");
          else
            need(ActionKind::kBackward, s_.ChunkOf(vs + 1),
                 "its output gradient is made there, on this rank");
        }
        break;
      case ActionKind::kWeight:
        need(ActionKind::kBackward, c, "W follows its B");
        break;
      case ActionKind::kSendF:
        need(ActionKind::kForward, c, "it sends that forward's output");
        break;
      case ActionKind::kSendB:
        need(ActionKind::kBackward, c, "it sends that backward's input gradient");
        break;
      default:
        break;
    }
  }

  // ---- 4. completeness ----------------------------------------------------------------------

  void CheckComplete(int r) {
    const std::vector<Action>& list = s_.ranks[r];
    if (list.empty() || list.back().kind != ActionKind::kOptimizer) {
      Fail(fmt::format("rank {} does not end with OPT (the optimizer step, once per rank)", r));
    }
    for (int k = 0; k < kKinds; ++k) {
      const auto kind = static_cast<ActionKind>(k);
      for (int c = 0; c < s_.chunks; ++c) {
        if (!Needed(kind, r, c)) continue;
        for (int m = 0; m < s_.micro_batches; ++m) {
          if (!Done(r, kind, c, m)) Fail(fmt::format("rank {} never runs {}", r, Name(kind, c, m)));
        }
      }
    }
  }

  // ---- 5. sends and receives pair up in order -----------------------------------------------

  Message MessageOf(int r, const Action& a) const {
    const int vs = s_.VirtualStage(r, a.chunk);
    const int m = static_cast<int>(a.micro_batch);
    switch (a.kind) {
      case ActionKind::kSendF:
        return {true, vs, m};
      case ActionKind::kSendB:
        return {false, vs, m};
      case ActionKind::kRecvF:
        return {true, vs - 1, m};
      default:
        return {false, vs + 1, m};  // kRecvB
    }
  }

  void CheckPairing() const {
    // Every ordered pair (r → q) that exchanges a message; peers are neighbours (check 2), so a
    // rank has at most 2V of them.
    const int P = s_.stages;
    std::vector<std::pair<int, int>> pairs;
    for (int r = 0; r < P; ++r) {
      const size_t first = pairs.size();
      for (const Action& a : s_.ranks[r]) {
        if (!IsSend(a.kind) && !IsRecv(a.kind)) continue;
        const std::pair<int, int> pair =
            IsSend(a.kind) ? std::pair{r, +a.peer} : std::pair{+a.peer, r};
        if (std::find(pairs.begin() + static_cast<std::ptrdiff_t>(first), pairs.end(), pair) ==
            pairs.end()) {
          pairs.push_back(pair);
        }
      }
    }
    std::sort(pairs.begin(), pairs.end());
    pairs.erase(std::unique(pairs.begin(), pairs.end()), pairs.end());
    for (const auto& pair : pairs) {
      // Not a structured binding: the lambdas below read r and q, which clang before 16 cannot
      // capture.
      const int r = pair.first, q = pair.second;
      // The k-th send from r to q against the k-th receive on q from r, walking both lists.
      const std::vector<Action>& out = s_.ranks[r];
      const std::vector<Action>& in = s_.ranks[q];
      size_t i = 0, j = 0;
      auto next_send = [&] {
        while (i < out.size() && !(IsSend(out[i].kind) && out[i].peer == q)) ++i;
      };
      auto next_receive = [&] {
        while (j < in.size() && !(IsRecv(in[j].kind) && in[j].peer == r)) ++j;
      };
      for (int k = 0;; ++k, ++i, ++j) {
        next_send();
        next_receive();
        // Completeness made the counts equal.
        SLUICE_CHECK((i < out.size()) == (j < in.size()),
                     "rank {} → {}: message {} is sent but not received, or the reverse", r, q, k);
        if (i == out.size()) break;
        if (MessageOf(r, out[i]) == MessageOf(q, in[j])) continue;
        Fail(fmt::format(
            "message {} from rank {} to rank {} does not pair up: {} sends it, but {} expects it "
            "(sends and receives between two ranks must come in the same order)",
            k, r, q, At(r, static_cast<int>(i)), At(q, static_cast<int>(j))));
      }
    }
  }

  // ---- 6. no deadlock under blocking rendezvous ---------------------------------------------

  void CheckNoDeadlock() const {
    const int P = s_.stages;
    std::vector<size_t> next(P, 0);
    auto current = [&](int r) -> const Action* {
      return next[r] < s_.ranks[r].size() ? &s_.ranks[r][next[r]] : nullptr;
    };
    // Each rank runs until it blocks; a rank that moves its peer, or reaches a receive its
    // blocked sender waits for, wakes it. Which rank runs first does not change where they all
    // end up (completing one send never prevents another).
    std::vector<int> work;
    std::vector<bool> queued(P, true);
    for (int r = P - 1; r >= 0; --r) work.push_back(r);
    auto wake = [&](int r) {
      if (!queued[r]) {
        queued[r] = true;
        work.push_back(r);
      }
    };
    while (!work.empty()) {
      const int r = work.back();
      work.pop_back();
      queued[r] = false;
      while (const Action* a = current(r)) {
        if (IsSend(a->kind)) {
          // Pairing (5) guarantees that a receive from r at the peer's front is this message.
          const Action* b = current(a->peer);
          if (b == nullptr || !IsRecv(b->kind) || b->peer != r) break;
          ++next[a->peer];
          wake(a->peer);
        } else if (IsRecv(a->kind)) {
          wake(a->peer);  // completes when its sender reaches the matching send
          break;
        }
        ++next[r];
      }
    }
    std::string blocked;
    for (int r = 0; r < P; ++r) {
      const Action* a = current(r);
      if (a == nullptr) continue;
      // Pairing and completeness leave a peer with work for every message still owed to it.
      const Action* b = current(a->peer);
      SLUICE_CHECK(b != nullptr, "rank {} waits for rank {}, which has finished", r, a->peer);
      blocked += fmt::format(
          "{}rank {} waits at step {} ({}) for rank {}, which waits at step {} ({})",
          blocked.empty() ? "" : "; ", r, next[r], Name(*a), a->peer, next[a->peer], Name(*b));
    }
    if (!blocked.empty()) Fail("deadlock under blocking send/receive: " + blocked);
  }

  const Schedule& s_;
  // [chunk, mb, kind] → first_step_ + the step of the rank walked that ran it; less than
  // first_step_ when it has not run (a step of an earlier rank, or -1).
  std::vector<int> steps_;
  int64_t first_step_ = 0;
  // Per chunk of the rank walked: its virtual stage and the ranks its messages go to and come
  // from (−1: none, the first or last stage or a hand-off on the rank).
  struct ChunkPlace {
    int vs, prev_peer, next_peer;
  };
  std::vector<ChunkPlace> chunks_;
  // The rank walked's messages so far, per peer (at most 2V).
  struct PeerCount {
    int peer, sends = 0, receives = 0;
  };
  std::vector<PeerCount> peers_;
  // [producing virtual stage, mb, F or B]: the index of the message's send in its pair of ranks
  // (k + 1) or of its receive (−(k + 1)), whichever was walked first; 0 before either.
  std::vector<int> sequence_;
  bool out_of_order_ = false;  // some message's send and receive have different indices
};

}  // namespace

void ValidateSchedule(const Schedule& schedule) { Validator(schedule).Run(); }

}  // namespace sluice::pipeline
