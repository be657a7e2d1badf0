// Pipeline benchmark (issue 6, "Memory and time per stage"): time and memory per stage of
// pipeline-parallel training, per schedule, P and M, beside the schedule's theory.
//
// Job: a GPT on the sort task (vocabulary 11, T = 12: the embedding, head and loss are cheap, so
// stages holding equal numbers of blocks cost about the same — "equal-cost stages"), --layers
// blocks of width --dim, micro-batches of --micro-batch-size sequences (the batch is M of them, so
// one micro-batch costs the same at every M). Each configuration trains --warmup untimed steps,
// then --steps timed ones, twice: with output release (the default) and without.
//
// Reported per configuration (schedule, P, M), one JSON object a line on stdout and a table on
// stderr:
//   bubble           measured, per stage and overall: idle / (busy + idle) over the timed steps,
//                    from the runtime's StageReport (busy = F, B, W and OPT compute; idle = the
//                    rank's step wall time − busy: receive waits, sends, the all-reduce)
//   theory           TheoreticalBubble (F = B = W, free messages, no optimizer) and the ratio
//   tokens_per_s     batch · T / median step time, release on (and off)
//   memory           per stage: peak_allocated_bytes with release on and off, the difference,
//                    and beside it the outputs release drops at the in-flight peak × output bytes
// P stages run on P threads with max(1, threads / P) intra-op threads each: with P above the
// core count the stages share cores and the measured bubble mixes in time slicing
// ("oversubscribed": true).
//
// Run: build/bench/pipeline_bench [--quick] [--threads N] [--layers 8] [--dim 256]
//                                 [--micro-batch-size 16] [--steps 3] [--warmup 1] [--gc sync]
//                                 [--schedules gpipe,1f1b,...] [--stages 2,4] [--microbatches
//                                 4,8,16]
// (--schedules defaults to every schedule: gpipe, 1f1b, interleaved, zb-h1, zb-h2, zb-v, v-half,
// v-min; a configuration a schedule refuses, zb-v at M < 2P − 1, is reported as skipped.)
#include <algorithm>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "sluice/pipeline/pipeline_engine.h"
#include "sluice/train/trainer.h"

namespace {

using namespace sluice;
using pipeline::PipelineEngine;
using pipeline::ScheduleKind;
using pipeline::StageReport;

struct Options {
  int threads = 0;  // 0: every core
  int64_t layers = 8, dim = 256, heads = 4, micro_batch_size = 16;
  int64_t steps = 3, warmup = 1;
  std::string optimizer = "adamw";
  std::string gc = "sync";  // deterministic peaks: async frees land at the worker's pace
  std::vector<std::string> schedules = [] {  // every schedule sluice has
    std::vector<std::string> names;
    for (const auto& [kind, name] : sluice::pipeline::kScheduleKindNames) names.emplace_back(name);
    return names;
  }();
  std::vector<int> stages = {2, 4};
  std::vector<int> microbatches = {4, 8, 16};
};

// One training run of a configuration: the timed steps' share of every rank's report.
struct Measured {
  std::vector<StageReport> reports;  // busy/idle over the timed steps only; memory over all steps
  int chunks = 1;
  std::vector<int>
      held_outputs;  // per rank: outputs held at the in-flight peak (the loss chunk's excluded)
  double step_ms_median = 0;
  double tokens_per_s = 0;
};

Measured Train(const Options& o, ScheduleKind kind, int P, int M, bool release) {
  TrainConfig c;
  c.data = "sort";
  c.gpt = {.vocab = 0, .seq = 0, .layers = o.layers, .heads = o.heads, .dim = o.dim};
  c.batch = M * o.micro_batch_size;
  c.microbatches = M;
  c.steps = o.warmup + o.steps;
  c.optimizer = {.kind = *ParseOptimizerKind(o.optimizer), .lr = 1e-3};
  c.threads = o.threads;
  c.gc = *ParseGcMode(o.gc);
  c.eval_every = 0;
  PipelineEngine* engine = nullptr;
  pipeline::PipelineOptions p{.stages = P, .schedule = kind, .release_outputs = release};
  EngineFactory factory = [&](const EngineContext& ctx) -> std::unique_ptr<StepEngine> {
    auto e = std::make_unique<PipelineEngine>(ctx, p);
    engine = e.get();
    return e;
  };
  Trainer trainer(c, factory);
  for (int64_t s = 0; s < o.warmup; ++s) trainer.Step();
  const std::vector<StageReport> before = engine->reports();
  std::vector<StepRecord> timed;
  for (int64_t s = 0; s < o.steps; ++s) timed.push_back(trainer.Step());
  std::sort(timed.begin(), timed.end(),
            [](const StepRecord& a, const StepRecord& b) { return a.step_ms < b.step_ms; });

  Measured out;
  out.reports = engine->reports();
  for (size_t r = 0; r < out.reports.size(); ++r) {
    out.reports[r].busy_ms -= before[r].busy_ms;
    out.reports[r].idle_ms -= before[r].idle_ms;
  }
  const pipeline::Schedule& sched = engine->schedule();
  out.chunks = sched.chunks;
  for (int r = 0; r < P; ++r) {
    const StageReport& rep = out.reports[r];
    int held = 0;
    bool holds_loss = false;
    for (int ch = 0; ch < sched.chunks; ++ch) {
      if (sched.VirtualStage(r, ch) == sched.virtual_stages() - 1) {
        holds_loss = true;
      } else {
        held += rep.inflight_peak_per_chunk[ch];
      }
    }
    // Chunk peaks need not coincide; the rank's own peak bounds them unless a chunk's output is the
    // loss.
    out.held_outputs.push_back(holds_loss ? held : rep.inflight_peak);
  }
  out.step_ms_median = timed[timed.size() / 2].step_ms;
  out.tokens_per_s = timed[timed.size() / 2].per_s;  // a GPT: tokens
  return out;
}

double Bubble(const std::vector<StageReport>& reports) {
  double busy = 0, idle = 0;
  for (const StageReport& r : reports) {
    busy += r.busy_ms;
    idle += r.idle_ms;
  }
  return busy + idle > 0 ? idle / (busy + idle) : 0;
}

double MiB(int64_t bytes) { return static_cast<double>(bytes) / (1 << 20); }

}  // namespace

int main(int argc, char** argv) {
  Options o;
  bool quick = false;
  CLI::App app{
      "Pipeline benchmark: bubble per stage vs theory, throughput, and the memory output release "
      "saves"};
  app.add_flag("--quick", quick, "1f1b and zb-h1 at P = 2, M = 4 and 8 (under a minute)");
  app.add_option("--threads", o.threads,
                 "intra-op threads in all, divided among the stages (0: every core)")
      ->capture_default_str();
  app.add_option("--layers", o.layers, "transformer blocks")->capture_default_str();
  app.add_option("--dim", o.dim, "width C")->capture_default_str();
  app.add_option("--heads", o.heads, "attention heads")->capture_default_str();
  app.add_option("--micro-batch-size", o.micro_batch_size, "sequences per micro-batch (T = 12)")
      ->capture_default_str();
  app.add_option("--steps", o.steps, "timed steps per run")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  app.add_option("--warmup", o.warmup, "untimed steps before them")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  app.add_option("--optimizer", o.optimizer, "adamw | sgd")
      ->capture_default_str()
      ->check(CLI::IsMember({"adamw", "sgd"}));
  app.add_option("--gc", o.gc, "none | sync | async (sync: peaks independent of thread timing)")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "sync", "async"}));
  app.add_option("--schedules", o.schedules, "schedules to run")
      ->delimiter(',')
      ->capture_default_str()
      ->check(CLI::IsMember([] {
        std::vector<std::string> names;
        for (const auto& [kind, name] : pipeline::kScheduleKindNames) names.emplace_back(name);
        return names;
      }()));
  app.add_option("--stages", o.stages, "stage counts P")->delimiter(',')->capture_default_str();
  app.add_option("--microbatches", o.microbatches, "micro-batch counts M")
      ->delimiter(',')
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  if (quick) {
    o.schedules = {"1f1b", "zb-h1"};
    o.stages = {2};
    o.microbatches = {4, 8};
  }

  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int threads = o.threads > 0 ? o.threads : cores;
  fmt::print(stderr,
             "GPT on sort: {} layers, C = {}, {} heads, T = 12, {} sequences per micro-batch, {}; "
             "GC {}; {} timed steps after {} warm-up; {} cores, {} intra-op threads\n",
             o.layers, o.dim, o.heads, o.micro_batch_size, o.optimizer, o.gc, o.steps, o.warmup,
             cores, threads);
  fmt::print(stderr, "{:<11} {:>2} {:>3} {:>2} | {:>6} {:>6} {:>5} | {:<23} | {:>8} {:>8} | {}\n",
             "schedule", "P", "M", "V", "bubble", "theory", "ratio", "bubble per stage", "tok/s",
             "tok/s off",
             "per stage: release saving at the peak / at the in-flight peak / held outputs × "
             "output bytes, MiB");
  for (const std::string& name : o.schedules) {
    const ScheduleKind kind = *pipeline::ParseScheduleKind(name);  // --schedules checked the name
    for (int P : o.stages) {
      for (int M : o.microbatches) {
        Measured on, off;
        try {
          on = Train(o, kind, P, M, true);
          off = Train(o, kind, P, M, false);
        } catch (const std::exception& e) {
          fmt::print(stderr, "{:<11} {:>2} {:>3}    | skipped: {}\n", name, P, M, e.what());
          continue;
        }
        const int per_stage = std::max(1, threads / P);
        const bool oversubscribed = P * per_stage > cores;
        const double theory = pipeline::TheoreticalBubble(
            {.kind = kind, .stages = P, .micro_batches = M, .chunks = on.chunks});
        const double bubble = Bubble(on.reports);
        nlohmann::json stages = nlohmann::json::array();
        std::string bubbles, memory;
        for (int r = 0; r < P; ++r) {
          const StageReport& a = on.reports[r];
          const StageReport& b = off.reports[r];
          const int64_t saving = b.peak_allocated_bytes - a.peak_allocated_bytes;
          const int64_t expected = static_cast<int64_t>(on.held_outputs[r]) * a.output_bytes;
          // Where the in-flight count peaks (before the first backward), off − on is the outputs
          // released.
          const int64_t saving_at_inflight =
              b.allocated_at_inflight_peak_bytes - a.allocated_at_inflight_peak_bytes;
          stages.push_back({{"stage", r},
                            {"busy_ms", a.busy_ms},
                            {"idle_ms", a.idle_ms},
                            {"bubble", a.bubble()},
                            {"bubble_no_release", b.bubble()},
                            {"peak_allocated_bytes", a.peak_allocated_bytes},
                            {"peak_allocated_bytes_no_release", b.peak_allocated_bytes},
                            {"release_saving_bytes", saving},
                            {"release_saving_at_inflight_peak_bytes", saving_at_inflight},
                            {"inflight_peak", a.inflight_peak},
                            {"inflight_peak_per_chunk", a.inflight_peak_per_chunk},
                            {"theoretical_inflight", a.theoretical_inflight},
                            {"held_outputs", on.held_outputs[r]},
                            {"output_bytes", a.output_bytes},
                            {"held_outputs_x_output_bytes", expected},
                            {"released_output_bytes", a.released_output_bytes}});
          bubbles += fmt::format("{}{:.3f}", r ? " " : "", a.bubble());
          memory += fmt::format("{}{:.2f}/{:.2f}/{:.2f}", r ? "  " : "", MiB(saving),
                                MiB(saving_at_inflight), MiB(expected));
        }
        nlohmann::json row = {{"schedule", name},
                              {"stages", P},
                              {"chunks", on.chunks},
                              {"micro_batches", M},
                              {"layers", o.layers},
                              {"dim", o.dim},
                              {"heads", o.heads},
                              {"micro_batch_size", o.micro_batch_size},
                              {"optimizer", o.optimizer},
                              {"gc", o.gc},
                              {"steps", o.steps},
                              {"warmup", o.warmup},
                              {"threads", threads},
                              {"threads_per_stage", per_stage},
                              {"cores", cores},
                              {"oversubscribed", oversubscribed},
                              {"bubble", bubble},
                              {"bubble_no_release", Bubble(off.reports)},
                              {"theoretical_bubble", theory},
                              {"bubble_ratio", theory > 0 ? bubble / theory : 0.0},
                              {"tokens_per_s", on.tokens_per_s},
                              {"tokens_per_s_no_release", off.tokens_per_s},
                              {"step_ms_median", on.step_ms_median},
                              {"stages_detail", stages}};
        fmt::print("{}\n", row.dump());
        std::fflush(stdout);
        fmt::print(stderr,
                   "{:<11} {:>2} {:>3} {:>2} | {:>6.3f} {:>6.3f} {:>5.2f} | {:<23} | {:>8.0f} "
                   "{:>8.0f} | {}{}\n",
                   name, P, M, on.chunks, bubble, theory, theory > 0 ? bubble / theory : 0.0,
                   bubbles, on.tokens_per_s, off.tokens_per_s, memory,
                   oversubscribed ? "  (oversubscribed)" : "");
      }
    }
  }
  return 0;
}
