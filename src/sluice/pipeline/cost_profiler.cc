#include "sluice/pipeline/cost_profiler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <unordered_map>

#include <fmt/format.h>

#include "sluice/core/clock.h"

namespace sluice::pipeline {

namespace {

double Median(std::vector<int64_t> v) {
  if (v.empty()) return 0;
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid), v.end());
  double m = static_cast<double>(v[mid]);
  if (v.size() % 2 == 0) {
    m = (m + static_cast<double>(
                 *std::max_element(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(mid)))) /
        2;
  }
  return m;
}

template <typename T>
double Mean(const std::vector<T>& v) {
  double sum = 0;
  for (T x : v) sum += static_cast<double>(x);
  return v.empty() ? 0 : sum / static_cast<double>(v.size());
}

double MedianD(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t mid = v.size() / 2;
  return v.size() % 2 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
}

}  // namespace

nlohmann::json ProfileJob(const StageSetup& setup, const std::string& layout) {
  std::string recompute;
  for (int r = 0; r < setup.schedule.stages; ++r) {
    recompute += fmt::format("{}{}", r ? "," : "",
                             Name(RecomputeForStage(*setup.config, r, setup.schedule.stages)));
  }
  nlohmann::json job;
  if (const GptConfig* gpt = setup.task->gpt()) {
    job = {{"model", "gpt"},
           {"vocab", gpt->vocab},
           {"seq", setup.seq_len},
           {"layers", gpt->layers},
           {"heads", gpt->heads},
           {"dim", gpt->dim},
           {"attention", std::string(Name(gpt->attention))},
           {"precision", std::string(Name(gpt->precision))}};
  } else {
    job = setup.task->Describe();  // the model, its sizes or file, and the data
    job["seq"] = setup.seq_len;
  }
  job["micro_batch_size"] = setup.micro_batch_size;
  job["layout"] = layout;
  job["recompute"] = recompute;
  job["threads"] = setup.config->threads;
  return job;
}

CostProfiler::CostProfiler(const Schedule& schedule, nlohmann::json job)
    : schedule_(schedule), job_(std::move(job)) {
  const size_t P = static_cast<size_t>(schedule.stages), V = static_cast<size_t>(schedule.chunks);
  wall_.assign(
      P, std::vector<std::vector<std::vector<int64_t>>>(5, std::vector<std::vector<int64_t>>(V)));
  cpu_ = wall_;
  bubble_.assign(P, {});
  core_wait_.assign(P, {});
  overhead_per_compute_.assign(P, {});
}

void CostProfiler::Add(const std::vector<StageStep>& steps, int64_t step_wall_ns) {
  const int64_t span = StepSpanNs(steps);
  // Whether every stage thread had a core: the waits of such a step are the model's machine's.
  const bool own_cores = std::ranges::all_of(steps, [&](const StageStep& s) {
    return s.core_wait_ns == 0 ||
           (s.core_wait_ns > 0 &&
            static_cast<double>(s.core_wait_ns) < kCoreWaitShareNoted * static_cast<double>(span));
  });
  ++added_steps_;
  if (own_cores) ++own_core_steps_;
  own_core_overhead_.resize(steps.size());
  for (size_t r = 0; r < steps.size(); ++r) {
    const size_t before = overhead_per_compute_[r].size();
    AddRank(static_cast<int>(r), steps[r], span);
    if (own_cores && overhead_per_compute_[r].size() > before) {
      own_core_overhead_[r].push_back(overhead_per_compute_[r].back());
    }
  }
  AddStep(step_wall_ns, span);
  Record(steps, step_wall_ns, span);
  // Wake-ups: a receive blocked on a message resumes this long after the Isend that copied it.
  std::unordered_map<int64_t, int64_t> arrived;  // message → end of the Isend that copied it
  for (const StageStep& s : steps) {
    for (const StageStep::MessageEvent& e : s.copied_sends) arrived[e.message] = e.end_ns;
  }
  for (const StageStep& s : steps) {
    for (const StageStep::MessageEvent& e : s.blocked_receives) {
      auto it = arrived.find(e.message);
      if (it != arrived.end() && it->second >= e.begin_ns) {
        wake_.push_back(std::max<int64_t>(0, e.end_ns - it->second));
        if (own_cores) own_core_wake_.push_back(wake_.back());
      }
    }
  }
  // The all-reduce as the last rank to reach it sees it (the others' also holds their wait).
  const StageStep* last = nullptr;
  for (const StageStep& s : steps) {
    if (s.allreduce_end_ns > 0 &&
        (last == nullptr || s.allreduce_begin_ns > last->allreduce_begin_ns))
      last = &s;
  }
  if (last != nullptr) {
    allreduce_.push_back(last->allreduce_end_ns - last->allreduce_begin_ns);
    if (own_cores) own_core_allreduce_.push_back(allreduce_.back());
  }
}

void CostProfiler::AddRank(int r, const StageStep& s, int64_t span_ns) {
  for (int kind = 0; kind < 5; ++kind) {
    // OPT's two halves are one sample each per step, recorded under chunk 0.
    for (const StageStep::Sample& x : s.computes[kind]) {
      wall_[r][kind][kind >= 3 ? 0 : x.chunk].push_back(x.wall_ns);
      cpu_[r][kind][kind >= 3 ? 0 : x.chunk].push_back(x.cpu_ns);
    }
  }
  post_.insert(post_.end(), s.post_ns.begin(), s.post_ns.end());
  copy_.insert(copy_.end(), s.post_copy_ns.begin(), s.post_copy_ns.end());
  message_bytes_ = std::max(message_bytes_, s.message_bytes);
  rank_allreduce_ms_.push_back(
      s.allreduce_end_ns > 0 ? static_cast<double>(s.allreduce_end_ns - s.allreduce_begin_ns) / 1e6
                             : 0);
  if (s.data_allreduce_ns >= 0)
    rank_data_allreduce_ms_.push_back(static_cast<double>(s.data_allreduce_ns) / 1e6);
  // This rank's halves of the message round trips (RoundTrips).
  const int VS = schedule_.virtual_stages(), M = schedule_.micro_batches;
  if (VS > 1 && round_trips_.size() < static_cast<size_t>(kMaxRecordedSteps) * schedule_.stages) {
    std::vector<double>& halves = round_trips_.emplace_back(
        static_cast<size_t>(VS - 1) * M * 2, std::numeric_limits<double>::quiet_NaN());
    std::unordered_map<int64_t, int64_t> posted, returned;  // message → send's post, receive's end
    for (const StageStep::MessageEvent& e : s.sends) posted[e.message] = e.begin_ns;
    for (const StageStep::MessageEvent& e : s.blocked_receives) returned[e.message] = e.end_ns;
    for (int u = 0; u + 1 < VS; ++u) {
      const int lower = schedule_.RankOf(u), upper = schedule_.RankOf(u + 1);
      if (lower == upper || (lower != r && upper != r)) continue;
      for (int m = 0; m < M; ++m) {
        const int64_t forward = (static_cast<int64_t>(u + 1) * M + m) * 2;   // F(m) to u + 1
        const int64_t backward = (static_cast<int64_t>(u) * M + m) * 2 + 1;  // B(m) to u
        const auto sent = posted.find(lower == r ? forward : backward);
        const auto back = returned.find(lower == r ? backward : forward);
        if (sent == posted.end() || back == returned.end()) continue;
        const size_t at = (static_cast<size_t>(u) * M + m) * 2 + (lower == r ? 0 : 1);
        halves[at] = static_cast<double>(lower == r ? back->second - sent->second
                                                    : sent->second - back->second);
      }
    }
  }
  bubble_[r].push_back(
      span_ns > 0 ? static_cast<double>(span_ns - s.busy_ns) / static_cast<double>(span_ns) : 0);
  if (s.core_wait_ns >= 0) core_wait_[r].push_back(static_cast<double>(s.core_wait_ns) / 1e6);
  // Bookkeeping: the rank's time neither computing nor inside the communicator, per compute.
  const size_t computes = s.computes[0].size() + s.computes[1].size() + s.computes[2].size();
  if (computes > 0) {
    overhead_per_compute_[r].push_back(
        static_cast<double>(std::max<int64_t>(0, s.wall_ns - s.busy_ns - s.comm_ns)) /
        static_cast<double>(computes));
  }
}

double CostProfiler::MeanCoreWaitMs(int r) const {
  const std::vector<double>& waits = core_wait_.at(static_cast<size_t>(r));
  return waits.empty() ? -1 : Mean(waits);
}

void CostProfiler::AddStep(int64_t step_wall_ns, int64_t span_ns) {
  overhead_.push_back(std::max<int64_t>(0, step_wall_ns - span_ns));
  step_wall_.push_back(step_wall_ns);
}

StepCosts CostProfiler::Costs() const {
  StepCosts c;
  c.source = "profile";
  c.stages = schedule_.stages;
  c.chunks = schedule_.chunks;
  c.split_backward = schedule_.split_backward;
  c.job = job_;
  auto ms = [](double ns) { return ns / 1e6; };
  // The waits' means: of the steps that ran with a core per stage when they are at least half.
  const bool own_cores = own_core_steps_ > 0 && 2 * own_core_steps_ >= added_steps_;
  for (size_t r = 0; r < wall_.size(); ++r) {
    RankCosts rc;
    for (int v = 0; v < c.chunks; ++v) {
      ChunkCosts ch;
      ch.forward_ms = ms(Median(wall_[r][0][v]));
      ch.backward_ms = ms(Median(wall_[r][1][v]));
      ch.weight_ms = ms(Median(wall_[r][2][v]));
      ch.forward_cpu_ms = ms(Median(cpu_[r][0][v]));
      ch.backward_cpu_ms = ms(Median(cpu_[r][1][v]));
      ch.weight_cpu_ms = ms(Median(cpu_[r][2][v]));
      rc.chunks.push_back(ch);
    }
    rc.optimizer_ms = ms(Median(wall_[r][3][0]));
    rc.update_ms = ms(Median(wall_[r][4][0]));
    rc.overhead_ms =
        ms(Mean(own_cores && r < own_core_overhead_.size() && !own_core_overhead_[r].empty()
                    ? own_core_overhead_[r]
                    : overhead_per_compute_[r]));
    c.ranks.push_back(std::move(rc));
  }
  c.message_bytes = message_bytes_;
  c.post_ms = ms(Median(post_));
  c.copy_ms = std::max(0.0, ms(Median(copy_)) - c.post_ms);
  // Means, not medians: what these waits add to a step is their sum, and their rare long ones (a
  // thread waiting for a core to wake on) are much of it.
  c.wake_ms = ms(Mean(own_cores ? own_core_wake_ : wake_));
  c.allreduce_ms = ms(Mean(own_cores ? own_core_allreduce_ : allreduce_));
  c.step_overhead_ms = ms(Median(overhead_));
  nlohmann::json bubbles = nlohmann::json::array();
  for (const std::vector<double>& b : bubble_) bubbles.push_back(MedianD(b));
  c.recorded = recorded_;
  c.micro_batches = recorded_.empty() ? 0 : schedule_.micro_batches;
  c.measured = {{"schedule", schedule_.Describe()},
                {"steps", step_wall_.size()},
                {"step_ms", ms(Median(step_wall_))},
                {"stage_bubble", bubbles}};
  // Means, as the waits they are; only where every stage's thread said (in-process runs).
  if (std::ranges::all_of(core_wait_, [](const auto& v) { return !v.empty(); })) {
    nlohmann::json waits = nlohmann::json::array();
    for (const std::vector<double>& w : core_wait_) waits.push_back(Mean(w));
    c.measured["stage_core_wait_ms"] = waits;
    c.measured["steps_without_core_wait"] = own_core_steps_;
  }
  return c;
}

void CostProfiler::Record(const std::vector<StageStep>& steps, int64_t step_wall_ns,
                          int64_t span_ns) {
  if (recorded_.size() >= static_cast<size_t>(kMaxRecordedSteps)) return;
  const size_t V = static_cast<size_t>(schedule_.chunks),
               M = static_cast<size_t>(schedule_.micro_batches);
  auto ms = [](int64_t ns) { return static_cast<double>(ns) / 1e6; };
  RecordedStep& rec = recorded_.emplace_back();
  rec.step_ms = ms(step_wall_ns);
  rec.span_ms = ms(span_ns);
  for (const StageStep& s : steps) {
    rec.stage_bubble.push_back(
        span_ns > 0 ? static_cast<double>(span_ns - s.busy_ns) / static_cast<double>(span_ns) : 0);
    RecordedStep::Rank& rank = rec.ranks.emplace_back();
    rank.chunks.assign(V, RecordedStep::Chunk{.forward_ms = std::vector<double>(M),
                                              .backward_ms = std::vector<double>(M),
                                              .weight_ms = std::vector<double>(M)});
    for (int kind = 0; kind < 3; ++kind) {
      for (const StageStep::Sample& x : s.computes[kind]) {
        RecordedStep::Chunk& ch = rank.chunks[static_cast<size_t>(x.chunk)];
        std::vector<double>& to = kind == 0   ? ch.forward_ms
                                  : kind == 1 ? ch.backward_ms
                                              : ch.weight_ms;
        to[static_cast<size_t>(x.micro_batch)] = ms(x.wall_ns);
      }
    }
    if (s.core_wait_ns >= 0) rank.core_wait_ms = ms(s.core_wait_ns);
    for (const StageStep::Sample& x : s.computes[3]) rank.optimizer_ms = ms(x.wall_ns);
    for (const StageStep::Sample& x : s.computes[4]) rank.update_ms = ms(x.wall_ns);
  }
}

std::optional<TransitFit> MeasureTransit(Communicator& pipe, int64_t message_bytes) {
  const int P = pipe.size(), s = pipe.rank();
  constexpr int kWarmup = 2, kTag = 0;
  Allocator& allocator = DefaultAllocator();
  const int64_t n = std::max<int64_t>(2, message_bytes / 4);  // the large message's f32 elements
  const Tensor small = Tensor::Zeros({1}, DType::kF32, allocator);
  const Tensor large = Tensor::Zeros({n}, DType::kF32, allocator);
  std::vector<int64_t> round_trip[2];  // [small, large] ns
  for (int parity = 0; parity < 2; ++parity) {
    const bool pings = s % 2 == parity && s + 1 < P;
    const bool answers = s >= 1 && (s - 1) % 2 == parity;
    // The sizes alternate, so that a slower stretch of the machine slows both alike.
    for (int k = 0; k < 2 * (kWarmup + kTransitRounds); ++k) {
      const Tensor& x = k % 2 == 0 ? small : large;
      if (pings) {
        const int64_t begin = NowNs();
        Request back = pipe.Irecv(s + 1, kTag, DType::kF32, x.shape(), allocator);
        pipe.Send(x, s + 1, kTag);
        back.Wait();
        if (k >= 2 * kWarmup) round_trip[k % 2].push_back(NowNs() - begin);
      } else if (answers) {
        const Tensor got = pipe.Recv(s - 1, kTag, DType::kF32, x.shape(), allocator);
        pipe.Send(got, s - 1, kTag);
      }
    }
    pipe.Barrier();
  }
  if (s + 1 >= P) return std::nullopt;
  // One way: half a round trip.
  const double small_ms = Median(round_trip[0]) / 2e6, large_ms = Median(round_trip[1]) / 2e6;
  const double extra_bytes = static_cast<double>(large.nbytes() - small.nbytes());
  return TransitFit{.latency_ms = small_ms,
                    .ms_per_byte = std::max(0.0, (large_ms - small_ms) / extra_bytes)};
}

std::optional<double> TransitInStepMs(const std::vector<double>& halves) {
  double sum = 0;
  int n = 0;
  for (size_t i = 0; i + 1 < halves.size(); i += 2) {
    if (std::isnan(halves[i]) || std::isnan(halves[i + 1])) continue;
    sum += std::max(0.0, (halves[i] - halves[i + 1]) / 2);
    ++n;
  }
  if (n == 0) return std::nullopt;
  return sum / n / 1e6;
}

}  // namespace sluice::pipeline
