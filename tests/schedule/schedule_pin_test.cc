// Pins what the generators, the validator, the unit-cost analysis and the step simulator give for
// every schedule kind at small and middling sizes, so that work on their speed and memory cannot
// change a single action or a single bit of a figure: a digest (FNV-1a, 64 bits) of every
// action's name in every rank's list, of Simulate's times under each CommMode (every action's
// start and end, as exact hexadecimal floats), of InFlightPeaks and of SimulateStep's prediction
// at unit costs, at uneven costs with message costs, and with shared cores. The digests were
// taken from the generators before they were made compact (docs/simulator.md, "Scale"); a change
// that is meant to alter schedules updates them and says why.
#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "sluice/schedule/schedule_analysis.h"
#include "sluice/schedule/schedules.h"
#include "sluice/schedule/step_simulator.h"

namespace sluice::pipeline {
namespace {

class Digest {
 public:
  void Add(std::string_view text) {
    for (unsigned char c : text) hash_ = (hash_ ^ c) * 0x100000001b3ULL;
    hash_ = (hash_ ^ 0xffU) * 0x100000001b3ULL;  // a separator: "ab","c" ≠ "a","bc"
  }
  void Add(double x) { Add(fmt::format("{:a}", x)); }
  void Add(int64_t x) { Add(fmt::format("{}", x)); }
  std::string Hex() const { return fmt::format("{:016x}", hash_); }

 private:
  uint64_t hash_ = 0xcbf29ce484222325ULL;
};

// Costs that differ per rank and chunk, with messages that cost something.
StepCosts UnevenCosts(const Schedule& s) {
  StepCosts c = UnitCosts(s);
  for (int r = 0; r < s.stages; ++r) {
    for (int v = 0; v < s.chunks; ++v) {
      ChunkCosts& ch = c.ranks[r].chunks[v];
      ch.forward_ms = 1.0 + 0.125 * r + 0.25 * v;
      ch.backward_ms = 2.0 + 0.0625 * ((r * 7 + v) % 5);
      ch.weight_ms = 0.75 + 0.1 * (r % 3);
      ch.forward_cpu_ms = 0.9 * ch.forward_ms;
      ch.backward_cpu_ms = 0.8 * ch.backward_ms;
      ch.weight_cpu_ms = ch.weight_ms;
    }
    c.ranks[r].optimizer_ms = 0.3 + 0.01 * r;
    c.ranks[r].update_ms = 0.2;
  }
  c.post_ms = 0.01;
  c.copy_ms = 0.05;
  c.step_overhead_ms = 0.5;
  return c;
}

void AddPrediction(Digest& d, const StepPrediction& p) {
  d.Add(p.makespan_ms);
  d.Add(p.step_ms);
  d.Add(p.bubble);
  for (const RankPrediction& r : p.ranks) {
    d.Add(r.busy_ms);
    d.Add(r.idle_ms);
    d.Add(r.bubble);
    d.Add(r.end_ms);
  }
}

// The schedule's actions and every figure read off it.
std::string DigestOf(const ScheduleOptions& o) {
  const Schedule s = MakeSchedule(o);
  Digest d;
  d.Add(s.Describe());
  for (const std::vector<Action>& rank : s.ranks) {
    for (const Action& a : rank) d.Add(ActionName(a, s.chunks));
  }
  for (CommMode mode : {CommMode::kRendezvous, CommMode::kRendezvousPosted, CommMode::kBuffered,
                        CommMode::kAsync}) {
    const Simulation sim = Simulate(s, CostModel{.forward = 1, .backward = 2, .weight = 0.5}, mode);
    d.Add(sim.makespan);
    d.Add(sim.bubble);
    for (const RankTime& r : sim.ranks) {
      d.Add(r.busy);
      d.Add(r.bubble);
      for (const ActionTime& t : r.actions) {
        d.Add(t.start);
        d.Add(t.end);
      }
    }
  }
  for (const InFlight& f : InFlightPeaks(s)) {
    d.Add(int64_t{f.peak});
    d.Add(int64_t{f.peak_awaiting_weight});
    d.Add(int64_t{f.peak_until_weight});
    for (int peak : f.peak_per_chunk) d.Add(int64_t{peak});
  }
  AddPrediction(d, SimulateStep(s, UnitCosts(s)));
  const StepCosts uneven = UnevenCosts(s);
  AddPrediction(d, SimulateStep(s, uneven));
  AddPrediction(d, SimulateStep(s, uneven, {.cores = 2}));
  return d.Hex();
}

struct Pin {
  ScheduleOptions options;
  const char* digest;
};

std::string Name(const ScheduleOptions& o) {
  return fmt::format("{} P={} M={} V={}{}", ScheduleKindName(o.kind), o.stages, o.micro_batches,
                     ChunksOf(o), PostsReceivesAhead(o) ? " receives posted ahead" : "");
}

TEST(SchedulePin, EveryKindGivesThePinnedActionsAndFigures) {
  using K = ScheduleKind;
  const std::vector<Pin> pins = {
      {{.kind = K::kGPipe, .stages = 1, .micro_batches = 1}, "9c4a642760092207"},
      {{.kind = K::kGPipe, .stages = 4, .micro_batches = 8}, "09d675114c17e5e8"},
      {{.kind = K::kGPipe, .stages = 8, .micro_batches = 3}, "6b35aac393d6639a"},
      {{.kind = K::kOneFOneB, .stages = 2, .micro_batches = 2}, "5c1681d722e9908d"},
      {{.kind = K::kOneFOneB, .stages = 4, .micro_batches = 8}, "530903e00f12d5a7"},
      {{.kind = K::kOneFOneB, .stages = 16, .micro_batches = 64}, "60cad8f5a5e045e0"},
      {{.kind = K::kOneFOneB, .stages = 5, .micro_batches = 7, .post_receives_ahead = true},
       "325693cb8230f566"},
      {{.kind = K::kInterleaved, .stages = 4, .micro_batches = 8}, "25bc6ef37e3e5f0d"},
      {{.kind = K::kInterleaved, .stages = 3, .micro_batches = 9, .chunks = 3}, "68d9f802f7c3c9b0"},
      {{.kind = K::kInterleaved, .stages = 8, .micro_batches = 32}, "7b8ab0621be5e55d"},
      {{.kind = K::kInterleaved, .stages = 8, .micro_batches = 32, .post_receives_ahead = true},
       "4a8618b60496b693"},
      {{.kind = K::kZeroBubbleH1, .stages = 4, .micro_batches = 8}, "389664e63043ca50"},
      {{.kind = K::kZeroBubbleH1, .stages = 16, .micro_batches = 48}, "ca9f25c2456256cd"},
      {{.kind = K::kZeroBubbleH2, .stages = 4, .micro_batches = 4}, "e8ffe13d80a0f212"},
      {{.kind = K::kZeroBubbleH2, .stages = 8, .micro_batches = 40}, "6dac7be3b0c9711f"},
      {{.kind = K::kZeroBubbleV, .stages = 4, .micro_batches = 7}, "baa1b33b5f450e91"},
      {{.kind = K::kZeroBubbleV, .stages = 8, .micro_batches = 32}, "e044644c838487cd"},
      {{.kind = K::kZeroBubbleV, .stages = 8, .micro_batches = 32, .post_receives_ahead = true},
       "ff4290b2cf1da10d"},
      {{.kind = K::kVHalf, .stages = 4, .micro_batches = 8}, "7cbd3a6d654c52bf"},
      {{.kind = K::kVHalf, .stages = 7, .micro_batches = 7}, "b191b2f0668af79f"},
      {{.kind = K::kVMin, .stages = 3, .micro_batches = 3}, "1fd2d019ec15c655"},
      {{.kind = K::kVMin, .stages = 8, .micro_batches = 32}, "3d224abdcbdf0b7e"},
  };
  for (const Pin& pin : pins) {
    EXPECT_EQ(DigestOf(pin.options), pin.digest) << Name(pin.options);
  }
}

}  // namespace
}  // namespace sluice::pipeline
