// PipelineEngine: every schedule trains exactly like one stage, release on and off agree bit for
// bit, the in-flight peaks match the schedules' theory, release saves what it should, failures
// stop every stage with an error naming the place, and traces have one track per stage.
#include "sluice/pipeline/pipeline_engine.h"
#include "sluice/step/program_task.h"
#include "source_dir.h"

#include <algorithm>
#include <fstream>
#include <set>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "schedule_cases.h"
#include "scratch_path.h"
#include "sluice/comm/communicator.h"
#include "sluice/schedule/schedules.h"
#include "sluice/train/trainer.h"
#include "trained_run.h"

namespace sluice::pipeline {
namespace {

// A small GPT on the sort task. One intra-op thread, so GEMMs sum in the same order everywhere
// and results can be compared bit for bit.
TrainConfig Small(int layers, int64_t microbatches = 4) {
  TrainConfig c;
  c.gpt = {.vocab = 0, .seq = 0, .layers = layers, .heads = 2, .dim = 32};
  c.steps = 3;
  c.batch = 2 * microbatches;
  c.microbatches = microbatches;
  c.optimizer.lr = 1e-2;
  c.threads = 1;
  c.eval_every = 0;
  return c;
}

// A run's losses, gradient norms and final state (tests/trained_run.h), with the pipeline's
// reports.
struct RunResult : testing_support::TrainedRun {
  std::vector<StageReport> reports;
  nlohmann::json post_validation;  // the engine's summary of it (null when off)
};

RunResult Train(const TrainConfig& config, const PipelineOptions* options) {
  const PipelineEngine* engine = nullptr;
  EngineFactory factory;
  if (options != nullptr) {
    factory = [&](const EngineContext& ctx) -> std::unique_ptr<StepEngine> {
      auto e = std::make_unique<PipelineEngine>(ctx, *options);
      engine = e.get();
      return e;
    };
  }
  // The engine's reports are read before the trainer (which owns it) goes.
  Trainer trainer(config, factory);
  RunResult run;
  for (int64_t s = 0; s < config.steps; ++s) {
    const StepRecord r = trainer.Step();
    run.losses.push_back(r.loss);
    run.norms.push_back(r.grad_norm);
  }
  run.state = testing_support::KeepState(trainer, config.optimizer);
  if (engine != nullptr) {
    run.reports = engine->reports();
    run.post_validation = engine->Summary()["post_validation"];
  }
  return run;
}

void ExpectBitwiseEqual(const RunResult& a, const RunResult& b, const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size()) << what;
  for (size_t i = 0; i < a.losses.size(); ++i)
    EXPECT_EQ(a.losses[i], b.losses[i]) << what << ": loss of step " << i + 1;
  ASSERT_EQ(a.norms.size(), b.norms.size()) << what;
  for (size_t i = 0; i < a.norms.size(); ++i) {
    EXPECT_EQ(a.norms[i], b.norms[i]) << what << ": gradient norm of step " << i + 1;
  }
  ASSERT_EQ(a.state.size(), b.state.size()) << what;
  for (const auto& [name, values] : a.state) {
    EXPECT_TRUE(values == b.state.at(name)) << what << ": " << name << " differs";
  }
}

using Case = testing_support::ScheduleCase;
constexpr const auto& kCases = testing_support::kScheduleCases;

std::string Describe(const Case& c) {
  return fmt::format("{} P={}", ScheduleKindName(c.kind), c.stages);
}

// Micro-batches in flight on stage s at M micro-batches: the closed forms of docs/pipeline.md,
// written out here rather than taken from TheoreticalInFlight, which the engine's report copies.
int ExpectedInFlight(const Case& c, int M, int s) {
  const int P = c.stages, V = 2;  // interleaved runs its default two chunks
  switch (c.kind) {
    case ScheduleKind::kGPipe:
      return M;
    case ScheduleKind::kOneFOneB:
    case ScheduleKind::kZeroBubbleH1:
      return std::min(P - s, M);
    case ScheduleKind::kZeroBubbleH2:
      return std::min(2 * (P - s) - 1, M);
    case ScheduleKind::kInterleaved:
      return std::min(V * P + P - 1 - 2 * s, V * M);
    case ScheduleKind::kZeroBubbleV:
      return 2 * P;
    // No closed form per rank (docs/pipeline.md): the lists' peaks at M = 8, below the paper's
    // bounds 2⌊(P + 2)/2⌋ and 2⌊(P + 4)/3⌋.
    case ScheduleKind::kVHalf:
      return P == 2 ? 4 : 6;
    case ScheduleKind::kVMin:
      return P == 2 ? (s == 0 ? 3 : 2) : 4;
  }
  return -1;
}

TEST(PipelineEngine, EveryScheduleTrainsBitwiseLikeOneStage) {
  for (const Case& c : kCases) {
    const TrainConfig config = Small(c.layers, c.microbatches);
    const RunResult single = Train(config, nullptr);
    const PipelineOptions options{.stages = c.stages, .schedule = c.kind};
    ExpectBitwiseEqual(single, Train(config, &options), Describe(c));
  }
}

// The GPT with --dropout 0.1 (the embedding, every attention and MLP branch): every schedule
// draws the masks of one stage, from the examples' keys, so it trains bitwise like one stage; its
// losses are not those without dropout.
TEST(PipelineEngine, EveryScheduleTrainsBitwiseLikeOneStageWithDropout) {
  for (const Case& c : kCases) {
    TrainConfig config = Small(c.layers, c.microbatches);
    config.gpt.dropout = 0.1;
    const RunResult single = Train(config, nullptr);
    const PipelineOptions options{.stages = c.stages, .schedule = c.kind};
    ExpectBitwiseEqual(single, Train(config, &options), Describe(c) + " with dropout");
    EXPECT_NE(single.losses, Train(Small(c.layers, c.microbatches), nullptr).losses);
  }
}

// Mixed precision: the bf16 casts and oneDNN's products run on each stage as on one (oneDNN with
// one thread sums in a fixed order), and what crosses a stage boundary is rounded to bf16 at
// every unit boundary on one stage too (ir/autocast.h): so every schedule at P = 2 and 4 stays
// bitwise, its forward messages bf16 and its gradient messages f32.
TEST(PipelineEngine, EveryScheduleTrainsBitwiseLikeOneStageUnderBf16) {
  for (const Case& c : kCases) {
    TrainConfig config = Small(c.layers, c.microbatches);
    config.gpt.precision = Precision::kBf16;
    const RunResult single = Train(config, nullptr);
    const PipelineOptions options{.stages = c.stages, .schedule = c.kind};
    ExpectBitwiseEqual(single, Train(config, &options), Describe(c) + " bf16");
  }
}

// The settings the autocast pass handles beyond the default GPT (nn/gpt.h) — --attention naive
// (bf16 attention products) with the unfused head (bf16 logits product) — train under bf16 on two
// stages bitwise as on one, and within rounding of their fp32 run (the same 1e-2 as the parity
// with PyTorch's autocast), which they do not copy.
TEST(PipelineEngine, NaiveAttentionAndUnfusedHeadTrainUnderBf16) {
  TrainConfig config = Small(2, 4);
  config.gpt.attention = GptAttention::kNaive;
  config.gpt.head_chunk = -1;
  const RunResult fp32 = Train(config, nullptr);
  config.gpt.precision = Precision::kBf16;
  const RunResult single = Train(config, nullptr);
  for (const ScheduleKind kind : {ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubbleH1}) {
    const PipelineOptions options{.stages = 2, .schedule = kind};
    ExpectBitwiseEqual(single, Train(config, &options),
                       fmt::format("{} bf16", ScheduleKindName(kind)));
  }
  ASSERT_EQ(single.losses.size(), fp32.losses.size());
  for (size_t s = 0; s < fp32.losses.size(); ++s) {
    EXPECT_NEAR(single.losses[s], fp32.losses[s], 1e-2 * fp32.losses[s]) << "step " << s;
  }
  EXPECT_NE(single.losses, fp32.losses);
}

// Clipping scales every gradient by the global norm: bitwise only because every rank sums the
// per-parameter squares in model order, as one stage does.
TEST(PipelineEngine, ClippedTrainingIsBitwiseLikeOneStage) {
  for (const Case& c : kCases) {
    TrainConfig config = Small(c.layers, c.microbatches);
    config.optimizer.clip_norm = 0.05;
    const RunResult single = Train(config, nullptr);
    EXPECT_GT(*std::max_element(single.norms.begin(), single.norms.end()),
              config.optimizer.clip_norm)
        << "the norm must exceed the clip for clipping to be tested";
    const PipelineOptions options{.stages = c.stages, .schedule = c.kind};
    ExpectBitwiseEqual(single, Train(config, &options), Describe(c) + " clipped");
  }
}

// Post-validation (`--post-validate`): every rank updates before the norm's all-reduce and
// validates afterwards, under every schedule at P = 2 and 4 — bitwise the synchronous pipeline
// (itself bitwise one stage, above) when clipping fires at every step (each one rolled back and
// redone) and when it never does (no rollback), with the bytes kept for a rollback reported.
TEST(PipelineEngine, PostValidationIsBitwiseTheSynchronousRunUnderEverySchedule) {
  for (const Case& c : kCases) {
    for (const double clip : {0.05, 1e6}) {
      TrainConfig config = Small(c.layers, c.microbatches);
      config.optimizer.clip_norm = clip;
      const PipelineOptions sync{.stages = c.stages, .schedule = c.kind};
      PipelineOptions eager = sync;
      eager.post_validate = true;
      const RunResult expected = Train(config, &sync), got = Train(config, &eager);
      const std::string what = fmt::format("{} clip {}", Describe(c), clip);
      ExpectBitwiseEqual(expected, got, what);
      int64_t fired = 0;
      for (double norm : expected.norms) fired += ClipCoefficient(norm, clip) < 1 ? 1 : 0;
      EXPECT_EQ(fired, clip < 1 ? config.steps : 0) << what << ": the clip must fire every step "
                                                    << "or never for both cases to be tested";
      ASSERT_TRUE(got.post_validation.is_object()) << what;
      EXPECT_EQ(got.post_validation["rollbacks"].get<int64_t>(), fired) << what;
      EXPECT_TRUE(expected.post_validation.is_null()) << what;
      int64_t bytes = 0;  // every rank's parameters and AdamW's two moments: 3 × 4 bytes each
      for (const StageReport& r : got.reports) {
        EXPECT_GT(r.rollback_bytes, 0) << what << ": stage " << r.stage;
        bytes += r.rollback_bytes;
      }
      EXPECT_EQ(got.post_validation["rollback_bytes"].get<int64_t>(), bytes) << what;
      int64_t state_bytes = 0;
      for (const auto& [name, values] : got.state) {
        state_bytes += static_cast<int64_t>(values.size()) * 4;
      }
      // A tied parameter is held (and kept) by each rank reading it, counted once in the state.
      EXPECT_GE(bytes, state_bytes) << what;
    }
  }
}

// A policy per stage (`--recompute full,selective,…`): still bitwise the single stage without
// recomputation, split backward (zb-h1), interleaved and V-shaped chunks included.
TEST(PipelineEngine, PerStageRecomputeTrainsBitwiseLikeOneStage) {
  TrainConfig config = Small(4);
  config.recompute = {RecomputePolicy::kNone};
  const RunResult single = Train(config, nullptr);
  for (ScheduleKind kind :
       {ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubbleH1, ScheduleKind::kInterleaved,
        ScheduleKind::kZeroBubbleV, ScheduleKind::kVHalf, ScheduleKind::kVMin}) {
    config.recompute = {RecomputePolicy::kFull, RecomputePolicy::kSelective};
    const PipelineOptions options{.stages = 2, .schedule = kind};
    ExpectBitwiseEqual(single, Train(config, &options),
                       fmt::format("{} full,selective", ScheduleKindName(kind)));
  }
  // One sub-layer at a time, at P = 2 and P = 4, on every stage or beside another policy.
  for (ScheduleKind kind : {ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubbleH1,
                            ScheduleKind::kInterleaved, ScheduleKind::kZeroBubbleV}) {
    for (int P : {2, 4}) {
      if (kind != ScheduleKind::kOneFOneB && kind != ScheduleKind::kZeroBubbleH1 && P == 4)
        continue;  // V = 2 chunks on 4 stages need 8 units; the model has 6
      config.recompute = {RecomputePolicy::kSublayer};
      const PipelineOptions options{.stages = P, .schedule = kind};
      ExpectBitwiseEqual(single, Train(config, &options),
                         fmt::format("{} P={} sublayer", ScheduleKindName(kind), P));
    }
  }
  config.recompute = {RecomputePolicy::kSublayer, RecomputePolicy::kCheap, RecomputePolicy::kFull,
                      RecomputePolicy::kSublayer};
  const PipelineOptions four{.stages = 4, .schedule = ScheduleKind::kOneFOneB};
  ExpectBitwiseEqual(single, Train(config, &four), "1f1b P=4 sublayer,cheap,full,sublayer");
}

TEST(PipelineEngine, ReleaseOnAndOffAreBitwiseIdentical) {
  for (const Case& c : kCases) {
    const TrainConfig config = Small(c.layers, c.microbatches);
    const PipelineOptions on{.stages = c.stages, .schedule = c.kind, .release_outputs = true};
    const PipelineOptions off{.stages = c.stages, .schedule = c.kind, .release_outputs = false};
    ExpectBitwiseEqual(Train(config, &on), Train(config, &off), Describe(c));
  }
}

TEST(PipelineEngine, OneStageAndLocalChunkHandOffMatchOneStage) {
  const TrainConfig config = Small(2);
  const RunResult single = Train(config, nullptr);
  const PipelineOptions one{.stages = 1, .schedule = ScheduleKind::kOneFOneB};
  ExpectBitwiseEqual(single, Train(config, &one), "1f1b P=1");
  // Two chunks on one rank hand activations and gradients over without messages.
  const PipelineOptions chunks{.stages = 1, .schedule = ScheduleKind::kInterleaved, .chunks = 2};
  ExpectBitwiseEqual(single, Train(config, &chunks), "interleaved P=1 V=2");
  for (ScheduleKind kind :
       {ScheduleKind::kZeroBubbleV, ScheduleKind::kVHalf, ScheduleKind::kVMin}) {
    const PipelineOptions v{.stages = 1, .schedule = kind};
    ExpectBitwiseEqual(single, Train(config, &v), fmt::format("{} P=1", ScheduleKindName(kind)));
  }
}

// Output release applies to every send: each rank releases, every step, one output per SEND_F in
// its list — both chunks' under zb-v, whose turn (rank P − 1, chunk 0 → chunk 1) and loss chunk
// send none — and with release off none.
TEST(PipelineEngine, ReleaseCoversEverySend) {
  for (const Case& c : kCases) {
    TrainConfig config = Small(c.layers, c.microbatches);
    config.steps = 1;
    const PipelineOptions on{.stages = c.stages, .schedule = c.kind};
    const PipelineOptions off{.stages = c.stages, .schedule = c.kind, .release_outputs = false};
    const RunResult with = Train(config, &on), without = Train(config, &off);
    const Schedule s = MakeSchedule(
        {.kind = c.kind, .stages = c.stages, .micro_batches = static_cast<int>(c.microbatches)});
    for (int r = 0; r < c.stages; ++r) {
      const int64_t sends = std::ranges::count(s.ranks[r], ActionKind::kSendF, &Action::kind);
      EXPECT_EQ(with.reports[r].released_output_bytes, sends * 2 * 12 * 32 * 4)
          << Describe(c) << " stage " << r;  // f32[B, T, C] of one micro-batch
      EXPECT_EQ(without.reports[r].released_output_bytes, 0) << Describe(c) << " stage " << r;
    }
  }
}

TEST(PipelineEngine, InFlightPeaksMatchTheScheduleTheory) {
  for (const Case& c : kCases) {
    TrainConfig config = Small(c.layers, 8);
    config.steps = 1;
    const PipelineOptions options{.stages = c.stages, .schedule = c.kind};
    const RunResult run = Train(config, &options);
    ASSERT_EQ(run.reports.size(), static_cast<size_t>(c.stages));
    for (const StageReport& r : run.reports) {
      const int theory = ExpectedInFlight(c, 8, r.stage);
      EXPECT_EQ(r.inflight_peak, theory) << Describe(c) << " stage " << r.stage;
      EXPECT_EQ(r.theoretical_inflight, theory) << Describe(c) << " stage " << r.stage;
      // A compute's CPU time on its own thread cannot exceed its wall time (one BLAS thread here).
      EXPECT_GT(r.busy_cpu_ms, 0) << Describe(c) << " stage " << r.stage;
      EXPECT_LE(r.busy_cpu_ms, r.busy_ms + 1.0) << Describe(c) << " stage " << r.stage;
    }
  }
}

// What release saves where the in-flight count peaks (right before each stage's first backward):
// release on and off differ there by exactly the outputs released. Under GPipe every output's send
// has completed by then (the next stage ran all its forwards before the backward that unblocks
// this one): the saving is in-flight × output bytes exactly. Under 1F1B and ZB-H1 the newest
// output may still be in transit (its receiver posts the receive after its own first backward):
// in-flight − 1 or in-flight outputs. Sync GC keeps frees deterministic.
TEST(PipelineEngine, ReleaseSavesInFlightTimesOutputBytes) {
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB,
                            ScheduleKind::kZeroBubbleH1, ScheduleKind::kZeroBubbleH2}) {
    TrainConfig config = Small(4, 8);
    config.steps = 1;
    config.gc = GcMode::kSync;
    const PipelineOptions on{.stages = 4, .schedule = kind, .release_outputs = true};
    const PipelineOptions off{.stages = 4, .schedule = kind, .release_outputs = false};
    const RunResult with = Train(config, &on), without = Train(config, &off);
    for (int s = 0; s < 4; ++s) {
      const StageReport& r = with.reports[s];
      const std::string where = fmt::format("{} stage {}", ScheduleKindName(kind), s);
      const int64_t saved =
          without.reports[s].allocated_at_inflight_peak_bytes - r.allocated_at_inflight_peak_bytes;
      if (s == 3) {  // the loss stage sends no outputs
        EXPECT_EQ(r.output_bytes, 0) << where;
        EXPECT_EQ(saved, 0) << where;
        continue;
      }
      EXPECT_EQ(r.output_bytes, 2 * 12 * 32 * 4) << where;  // f32[B, T, C] of one micro-batch
      EXPECT_EQ(r.released_output_bytes, 8 * r.output_bytes) << where;
      EXPECT_EQ(without.reports[s].released_output_bytes, 0) << where;
      // The zero-bubble schedules peak in their W tail, after every output is gone.
      if (kind != ScheduleKind::kZeroBubbleH1 && kind != ScheduleKind::kZeroBubbleH2) {
        EXPECT_LT(r.peak_allocated_bytes, without.reports[s].peak_allocated_bytes) << where;
      }
      if (kind == ScheduleKind::kGPipe) {
        EXPECT_EQ(saved, r.inflight_peak * r.output_bytes) << where;
      } else {
        EXPECT_TRUE(saved == r.inflight_peak * r.output_bytes ||
                    saved == (r.inflight_peak - 1) * r.output_bytes)
            << where << ": saved " << saved << " B, in flight " << r.inflight_peak;
      }
    }
  }
}

// --skip-nonfinite on a pipeline: every stage withholds the update of a step whose loss (known
// to the last stage only) or gradient norm is not finite — the decision is made on all-reduced
// figures — so the pipeline skips exactly the steps one stage skips and ends in the same state.
// Steps that skip: a learning rate of 1e30 makes the loss or the norm overflow within a few steps,
// and --skip-nonfinite lets training go on past them.
TrainConfig Overflowing(int layers) {
  TrainConfig c = Small(layers);
  c.steps = 5;
  c.optimizer.lr = 1e30;
  c.optimizer.schedule = LrSchedule::kConstant;
  c.optimizer.warmup_steps = 0;
  c.optimizer.clip_norm = 0;
  c.skip_nonfinite = 100;
  return c;
}

// Which steps a run of `c` skipped, its final state and its engine's post-validation summary.
struct Skipping {
  std::vector<bool> skipped;
  std::map<std::string, std::vector<float>> state;
  nlohmann::json post_validation;
};

Skipping TrainSkipping(const TrainConfig& c, const PipelineOptions* options) {
  Trainer t(c, options != nullptr ? PipelineEngineFactory(*options) : EngineFactory());
  Skipping s;
  while (t.step() < c.steps) s.skipped.push_back(t.Step().skipped);
  s.state = testing_support::KeepState(t, c.optimizer);
  if (options != nullptr) s.post_validation = t.engine().Summary()["post_validation"];
  return s;
}

TEST(PipelineEngine, SkipsTheSameNonFiniteStepsAsOneStage) {
  const TrainConfig c = Overflowing(2);
  auto run = [&](const PipelineOptions* options) { return TrainSkipping(c, options); };
  const PipelineOptions options{.stages = 2, .schedule = ScheduleKind::kOneFOneB};
  const Skipping one = run(nullptr), pipe = run(&options);
  EXPECT_GE(std::count(one.skipped.begin(), one.skipped.end(), true), 2);
  EXPECT_EQ(pipe.skipped, one.skipped);
  EXPECT_TRUE(pipe.state == one.state) << "a stage applied the update of a skipped step";
}

// Post-validation with --skip-nonfinite: every rank's eager update of a non-finite step is rolled
// back, so the pipeline skips the steps the synchronous one skips and ends in its state, at P = 2
// and 4.
TEST(PipelineEngine, PostValidationRollsBackTheNonFiniteStepsTheSynchronousRunSkips) {
  const TrainConfig c = Overflowing(4);
  for (const int P : {2, 4}) {
    for (const ScheduleKind kind : {ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubbleH2}) {
      const PipelineOptions sync{.stages = P, .schedule = kind};
      PipelineOptions eager = sync;
      eager.post_validate = true;
      const Skipping expected = TrainSkipping(c, &sync), got = TrainSkipping(c, &eager);
      const std::string what = fmt::format("{} P={}", ScheduleKindName(kind), P);
      const auto skips = std::count(expected.skipped.begin(), expected.skipped.end(), true);
      EXPECT_GE(skips, 2) << what;
      EXPECT_EQ(got.skipped, expected.skipped) << what;
      EXPECT_TRUE(got.state == expected.state) << what << ": a rank kept a skipped step's update";
      EXPECT_EQ(got.post_validation["rollbacks"].get<int64_t>(), skips) << what;
    }
  }
}

TEST(PipelineEngine, AFailingStageStopsEveryStageAndNamesThePlace) {
  PipelineOptions options{.stages = 4, .schedule = ScheduleKind::kOneFOneB};
  options.fault = {.mode = FaultInjection::Mode::kThrow,
                   .rank = 2,
                   .kind = ActionKind::kBackward,
                   .micro_batch = 1};
  Trainer trainer(Small(4), PipelineEngineFactory(options));
  try {
    trainer.Step();
    FAIL() << "the injected fault did not surface";
  } catch (const StageError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("stage 2 failed at step 1"), std::string::npos) << what;
    EXPECT_NE(what.find("(B1, chunk 0, micro-batch 1)"), std::string::npos) << what;
    EXPECT_NE(what.find("injected fault"), std::string::npos) << what;
  }
  EXPECT_THROW(trainer.Step(), StageError);  // the pipeline stays stopped
}

// Every place a stage can fail, in both ways: each ends in a StageError or a finished step — no
// crash, no hang, no leak or race in the teardown (the suite runs under ASan and TSan) — and a
// pipeline that failed stays stopped. zb-h1 adds the W actions 1F1B lacks.
TEST(PipelineEngine, EveryFaultPointEndsCleanly) {
  for (ScheduleKind schedule : {ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubbleH1}) {
    for (const auto& [kind, kind_name] : kActionKindNames) {
      for (FaultInjection::Mode mode :
           {FaultInjection::Mode::kThrow, FaultInjection::Mode::kSkip}) {
        for (int rank = 0; rank < 2; ++rank) {
          const bool throws = mode == FaultInjection::Mode::kThrow;
          SCOPED_TRACE(fmt::format("{} {}:{}:{}", EnumName(kScheduleKindNames, schedule),
                                   throws ? "throw" : "skip", rank, kind_name));
          // A skipped message surfaces when its receiver times out: 200 ms. A thrown fault aborts
          // the other rank at once, so there the timeout only guards against a hang — short, a
          // loaded machine could time a rank out before its peer reached the fault, and the step
          // would fail with the timeout instead of the fault (seen at load average 19).
          PipelineOptions options{.stages = 2,
                                  .schedule = schedule,
                                  .timeout = std::chrono::milliseconds(throws ? 60'000 : 200)};
          options.fault = {.mode = mode,
                           .rank = rank,
                           .kind = kind,
                           .micro_batch = kind == ActionKind::kOptimizer ? 0 : 1};
          // The actions a rank of two never has: no receive of activations on the first, no send
          // of them on the last, the mirror for gradients, and W under 1F1B (B computes it).
          const bool absent =
              (kind == ActionKind::kWeight && schedule == ScheduleKind::kOneFOneB) ||
              (rank == 0 && (kind == ActionKind::kRecvF || kind == ActionKind::kSendB)) ||
              (rank == 1 && (kind == ActionKind::kSendF || kind == ActionKind::kRecvB));
          Trainer trainer(Small(2), PipelineEngineFactory(options));
          bool failed = false;
          try {
            trainer.Step();
          } catch (const StageError& e) {
            failed = true;
            if (throws) {
              EXPECT_NE(std::string(e.what()).find("injected fault"), std::string::npos)
                  << e.what();
            }
          }
          EXPECT_EQ(failed && throws, throws && !absent);
          if (failed) {
            EXPECT_THROW(trainer.Step(), StageError);
          }
        }
      }
    }
  }
}

TEST(PipelineEngine, AMissingMessageTimesOutInsteadOfHanging) {
  PipelineOptions options{
      .stages = 2, .schedule = ScheduleKind::kGPipe, .timeout = std::chrono::milliseconds(200)};
  options.fault = {
      .mode = FaultInjection::Mode::kSkip, .rank = 0, .kind = ActionKind::kSendF, .micro_batch = 2};
  Trainer trainer(Small(2), PipelineEngineFactory(options));
  try {
    trainer.Step();
    FAIL() << "the skipped send did not surface";
  } catch (const StageError& e) {
    const std::string what = e.what();
    // Both stages end up waiting (stage 1 for F2's input, stage 0 for a gradient that never comes);
    // whichever times out first names itself, its action and micro-batch, and the missing message.
    EXPECT_NE(what.find("failed at step 1"), std::string::npos) << what;
    EXPECT_NE(what.find(", micro-batch "), std::string::npos) << what;
    EXPECT_NE(what.find("did not complete within 200 ms"), std::string::npos) << what;
  }
}

std::string WriteTemp(const std::string& name, const std::string& text) {
  const std::string path = testing_support::ScratchPath(name);
  std::ofstream(path) << text;
  return path;
}

TrainConfig AsProgram(TrainConfig c, const std::string& path) {
  c.model = "program";
  c.program = path;
  return c;
}

// `sluice export`'s program of the GPT, trained with --program, runs every schedule bitwise like
// --model gpt (which is bitwise like one stage, above): the program is cut at its units as the
// GPT is cut at its layers.
TEST(PipelineEngine, AnExportedGptProgramTrainsEveryScheduleBitwiseLikeModelGpt) {
  for (const Case& c : kCases) {
    TrainConfig config = Small(c.layers, c.microbatches);
    config.optimizer.clip_norm = 0.05;
    const std::string path = WriteTemp("gpt.sluice", ExportBuiltinProgram(config));
    const PipelineOptions options{.stages = c.stages, .schedule = c.kind};
    ExpectBitwiseEqual(Train(config, &options), Train(AsProgram(config, path), &options),
                       Describe(c) + " --program");
  }
}

// Any model with units is split: the MLP (units fc.0 … fc.L) and a hand-written classifier.
TEST(PipelineEngine, ModelsOtherThanTheGptTrainBitwiseLikeOneStage) {
  TrainConfig mlp = Small(2);
  mlp.model = "mlp";
  mlp.data = "blobs";
  mlp.mlp.layers = 3;
  TrainConfig classifier =
      AsProgram(Small(2), (testing_support::SourceDir() / "examples/classifier.sluice").string());
  classifier.data = "blobs";
  for (const TrainConfig& config : {mlp, classifier}) {
    const RunResult single = Train(config, nullptr);
    for (ScheduleKind kind :
         {ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubbleH1, ScheduleKind::kZeroBubbleV}) {
      for (PartitionKind partition : {PartitionKind::kBalanced, PartitionKind::kUniform}) {
        // Uniform spreads the units between the first and the last: the classifier has one.
        if (partition == PartitionKind::kUniform &&
            (kind == ScheduleKind::kZeroBubbleV || config.model == "program")) {
          continue;
        }
        const PipelineOptions options{.stages = 2, .schedule = kind, .partition = partition};
        ExpectBitwiseEqual(
            single, Train(config, &options),
            fmt::format("{} {} {}", config.model, ScheduleKindName(kind), Name(partition)));
      }
    }
  }
}

// A cut passes one value from stage to stage; a parameter read on both sides of a cut (tied) is
// held by both stages and trains as on one stage.
TEST(PipelineEngine, ACutThatPassesTwoValuesIsRefusedAndOneThatSplitsATiedWeightTrains) {
  const std::string skip = R"(program skip {
  input %x: f32[B, 16]
  input %labels: i64[B]
  param %a.weight: f32[16, 16] = normal(0, 0.1)
  param %b.weight: f32[16, 4] = normal(0, 0.1)
  unit a {
    %h: f32[B, 16] = matmul(%x, %a.weight)
  }
  unit b {
    %g: f32[B, 16] = gelu(%h)
  }
  unit c {
    %r: f32[B, 16] = add(%g, %h)
    %logits: f32[B, 4] = matmul(%r, %b.weight)
    %loss: f32[] = cross_entropy(%logits, %labels)
  }
  output %loss
}
)";
  TrainConfig config = AsProgram(Small(2), WriteTemp("skip.sluice", skip));
  config.data = "blobs";
  const PipelineOptions cut_b{.stages = 2, .layout = "a,b|c"};
  EXPECT_THAT([&] { Trainer(config, PipelineEngineFactory(cut_b)); },
              ::testing::ThrowsMessage<InvalidArgument>(::testing::HasSubstr(
                  "cannot be cut between units 'b' and 'c': a pipeline cut passes one value, and "
                  "2 pass there: %g, %h")));
  const PipelineOptions cut_a{.stages = 2, .layout = "a|b,c"};
  EXPECT_NO_THROW(Trainer(config, PipelineEngineFactory(cut_a)));

  std::string tied = skip;
  tied.replace(tied.find("matmul(%r, %b.weight)"), 21, "matmul(%r, %a.weight)");
  tied.replace(tied.find("f32[B, 4] = matmul"), 9, "f32[B, 16]");
  tied.erase(tied.find("  param %b.weight"),
             tied.find("  unit a") - tied.find("  param %b.weight"));
  config.program = WriteTemp("tied.sluice", tied);
  ExpectBitwiseEqual(Train(config, nullptr), Train(config, &cut_a), "tied weight cut a|b,c");
}

TEST(PipelineEngine, CheckpointsMoveBetweenOneStageAndAPipeline) {
  const std::string path = testing_support::ScratchPath("pipeline.safetensors");
  TrainConfig config = Small(4);
  config.steps = 4;
  const RunResult uninterrupted = Train(config, nullptr);
  const PipelineOptions options{.stages = 2, .schedule = ScheduleKind::kOneFOneB};
  {
    Trainer pipe(config, PipelineEngineFactory(options));
    pipe.Step();
    pipe.Step();
    pipe.SaveCheckpoint(path);
  }
  config.resume_path = path;
  Trainer single(config);
  EXPECT_EQ(single.step(), 2);
  EXPECT_EQ(single.Step().loss, uninterrupted.losses[2]);
  EXPECT_EQ(single.Step().loss, uninterrupted.losses[3]);
}

TEST(PipelineEngine, TraceHasATrackAndAMemoryCounterPerStage) {
  const std::string path = testing_support::ScratchPath("pipeline_trace.json");
  TrainConfig config = Small(4);
  config.steps = 2;
  PipelineOptions options{.stages = 4, .schedule = ScheduleKind::kOneFOneB, .trace_path = path};
  Train(config, &options);
  std::ifstream in(path);
  ASSERT_TRUE(in) << path;
  const nlohmann::json trace = nlohmann::json::parse(in);
  std::set<std::string> processes;
  std::map<int, int> forwards, backwards, counters, sends;
  for (const auto& e : trace.at("traceEvents")) {
    const int pid = e.at("pid");
    // Every span runs forward in time, the sends' too (their ends were once read before their
    // beginnings: two clock reads as arguments of one call, in either order).
    if (e.at("ph") == "X") {
      EXPECT_GE(e.at("dur").get<double>(), 0) << e.dump();
    }
    if (e.at("ph") == "X" && e.at("name").get<std::string>().starts_with("SEND_")) ++sends[pid];
    if (e.at("ph") == "M" && e.at("name") == "process_name")
      processes.insert(e.at("args").at("name"));
    if (e.at("ph") == "X" && e.at("name").get<std::string>().starts_with("F")) ++forwards[pid];
    if (e.at("ph") == "X" && e.at("name").get<std::string>().starts_with("B")) ++backwards[pid];
    if (e.at("ph") == "C") ++counters[pid];
  }
  EXPECT_EQ(processes, (std::set<std::string>{"stage 0", "stage 1", "stage 2", "stage 3"}));
  for (int pid = 1; pid <= 4; ++pid) {
    EXPECT_EQ(forwards[pid], 4) << "stage "
                                << pid - 1;  // one F per micro-batch, the last step only
    EXPECT_EQ(backwards[pid], 4) << "stage " << pid - 1;
    // SEND_F to the next stage, SEND_B to the previous one, per micro-batch.
    EXPECT_EQ(sends[pid], 4 * ((pid > 1) + (pid < 4))) << "stage " << pid - 1;
    EXPECT_GT(counters[pid], 0) << "stage " << pid - 1;
  }
}

}  // namespace
}  // namespace sluice::pipeline
