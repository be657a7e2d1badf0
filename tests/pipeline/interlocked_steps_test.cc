// Interlocked steps (post-validation on threads, PipelineEngine "Interlocked steps"): a run driven
// by Trainer::Run, which announces each next step, is bitwise the synchronous run under every
// schedule at P = 2 and 4 — clipping firing at every step, at none and at some, non-finite steps
// skipped — with the rollbacks counted exactly; evaluation, checkpoint, resume and stop boundaries
// inside such a run change nothing; and the steps really overlap: a rank begins step k + 1 before
// the last rank has finished step k (a causal record, not a clock).
#include <algorithm>
#include <bit>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "schedule_cases.h"
#include "scratch_path.h"
#include "sluice/nn/optimizer.h"
#include "sluice/pipeline/pipeline_engine.h"
#include "sluice/schedule/schedules.h"
#include "sluice/train/trainer.h"
#include "trained_run.h"

namespace sluice::pipeline {
namespace {

namespace fs = std::filesystem;

// A small GPT on the sort task, one intra-op thread (bitwise comparable), no evaluation between
// steps.
TrainConfig Small(int layers, int64_t microbatches = 4, int64_t steps = 4) {
  TrainConfig c;
  c.gpt = {.vocab = 0, .seq = 0, .layers = layers, .heads = 2, .dim = 32};
  c.steps = steps;
  c.batch = 2 * microbatches;
  c.microbatches = microbatches;
  c.optimizer.lr = 1e-2;
  c.threads = 1;
  c.eval_every = 0;
  c.eval_batches = 1;
  return c;
}

struct Result {
  std::vector<double> losses, norms;
  std::vector<bool> skipped;
  std::map<std::string, std::vector<float>> state;
  nlohmann::json post_validation;
  int64_t overlapped = 0;
  TrainSummary summary;
};

// `interlocked`: Trainer::Run (each next step announced); otherwise Trainer::Step, one at a time.
// `stop_at`: Run's stop function names SIGTERM from its stop_at-th query (0-based) on; -1 never.
Result Train(const TrainConfig& config, const PipelineOptions& options, bool interlocked,
             int stop_at = -1) {
  const PipelineEngine* engine = nullptr;
  EngineFactory factory = [&](const EngineContext& ctx) -> std::unique_ptr<StepEngine> {
    auto e = std::make_unique<PipelineEngine>(ctx, options);
    engine = e.get();
    return e;
  };
  Trainer trainer(config, factory);
  Result run;
  auto keep = [&](const StepRecord& r) {
    run.losses.push_back(r.loss);
    run.norms.push_back(r.grad_norm);
    run.skipped.push_back(r.skipped);
  };
  if (interlocked) {
    int queries = 0;
    run.summary = trainer.Run(keep, nullptr, [&] {
      return stop_at >= 0 && queries++ >= stop_at ? 15 : 0;  // SIGTERM
    });
  } else {
    while (trainer.step() < config.steps) keep(trainer.Step());
  }
  run.state = testing_support::KeepState(trainer, config.optimizer);
  run.post_validation = engine->Summary()["post_validation"];
  run.overlapped = engine->overlapped_starts();
  return run;
}

void ExpectBitwise(const Result& a, const Result& b, const std::string& what) {
  ASSERT_EQ(a.losses.size(), b.losses.size()) << what;
  // Bit for bit: a non-finite step's NaNs included.
  const auto bits = [](double x) { return std::bit_cast<uint64_t>(x); };
  for (size_t i = 0; i < a.losses.size(); ++i) {
    EXPECT_EQ(bits(a.losses[i]), bits(b.losses[i]))
        << what << ": loss of step " << i + 1 << ", " << a.losses[i] << " vs " << b.losses[i];
    EXPECT_EQ(bits(a.norms[i]), bits(b.norms[i])) << what << ": gradient norm of step " << i + 1
                                                  << ", " << a.norms[i] << " vs " << b.norms[i];
  }
  EXPECT_EQ(a.skipped, b.skipped) << what;
  ASSERT_EQ(a.state.size(), b.state.size()) << what;
  for (const auto& [name, values] : a.state)
    EXPECT_TRUE(values == b.state.at(name)) << what << ": " << name << " differs";
}

using Case = testing_support::ScheduleCase;
constexpr const auto& kCases = testing_support::kScheduleCases;

int64_t Fired(const std::vector<double>& norms, double clip) {
  int64_t fired = 0;
  for (double n : norms) fired += ClipCoefficient(n, clip) < 1 ? 1 : 0;
  return fired;
}

// Under every schedule at P = 2 and 4, clipping at every step, at none, and at some (a threshold
// among the unclipped run's norms, chosen so that the clipped run fires on some steps and not on
// others): the interlocked run is bitwise the synchronous pipeline, and it rolled back exactly
// the steps whose clip fired.
TEST(InterlockedSteps, AreBitwiseTheSynchronousRunUnderEveryScheduleWithAnyClipping) {
  for (const Case& c : kCases) {
    const PipelineOptions sync{.stages = c.stages, .schedule = c.kind};
    PipelineOptions eager = sync;
    eager.post_validate = true;
    TrainConfig config = Small(c.layers, c.microbatches);
    config.optimizer.clip_norm = 0;
    std::vector<double> unclipped = Train(config, sync, false).norms;
    std::sort(unclipped.begin(), unclipped.end());
    std::vector<double> clips = {0.05, 1e6};
    for (size_t i = 1; i < unclipped.size(); ++i)
      clips.push_back((unclipped[i - 1] + unclipped[i]) / 2);
    bool some_tested = false;
    for (const double clip : clips) {
      config.optimizer.clip_norm = clip;
      const Result expected = Train(config, sync, false);
      const int64_t fired = Fired(expected.norms, clip);
      const bool some = fired > 0 && fired < config.steps;
      if (clip != 0.05 && clip != 1e6 && (!some || some_tested)) continue;
      some_tested = some_tested || some;
      const std::string what =
          fmt::format("{} P={} clip {}", ScheduleKindName(c.kind), c.stages, clip);
      if (clip == 0.05) {
        EXPECT_EQ(fired, config.steps) << what;
      } else if (clip == 1e6) {
        EXPECT_EQ(fired, 0) << what;
      }
      const Result got = Train(config, eager, true);
      ExpectBitwise(expected, got, what);
      EXPECT_EQ(got.post_validation["rollbacks"].get<int64_t>(), fired) << what;
    }
    EXPECT_TRUE(some_tested) << ScheduleKindName(c.kind) << " P=" << c.stages
                             << ": no threshold made the clip fire on some steps only";
  }
}

TrainConfig Overflowing(int layers) {
  TrainConfig c = Small(layers, 4, 5);
  c.optimizer.lr = 1e30;
  c.optimizer.schedule = LrSchedule::kConstant;
  c.optimizer.warmup_steps = 0;
  c.optimizer.clip_norm = 0;
  c.skip_nonfinite = 100;
  return c;
}

// Non-finite steps skipped (--skip-nonfinite): the interlocked run skips the synchronous run's
// steps, redoes the step after each one, and ends in its state.
TEST(InterlockedSteps, SkipTheSynchronousRunsNonFiniteSteps) {
  const TrainConfig c = Overflowing(4);
  for (const int P : {2, 4}) {
    for (const ScheduleKind kind :
         {ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubbleH2, ScheduleKind::kZeroBubbleV}) {
      if (kind == ScheduleKind::kZeroBubbleV && P == 4) continue;  // needs M ≥ 2P − 1
      const PipelineOptions sync{.stages = P, .schedule = kind};
      PipelineOptions eager = sync;
      eager.post_validate = true;
      const Result expected = Train(c, sync, false), got = Train(c, eager, true);
      const std::string what = fmt::format("{} P={}", ScheduleKindName(kind), P);
      const auto skips = std::count(expected.skipped.begin(), expected.skipped.end(), true);
      EXPECT_GE(skips, 2) << what;
      ExpectBitwise(expected, got, what);
      EXPECT_EQ(got.post_validation["rollbacks"].get<int64_t>(), skips) << what;
    }
  }
}

// The steps overlap: the last rank holds before its last action of step 2 until rank 0 has begun
// step 3 — which only an interlocked run allows — and the causal record counts the overlap. The
// same hold in a run of one step at a time (Trainer::Step: no step announced) cannot be met, and
// fails saying so: the test tells the two apart.
TEST(InterlockedSteps, RankZeroBeginsTheNextStepBeforeTheLastRankEndsThisOne) {
  for (const ScheduleKind kind : {ScheduleKind::kZeroBubbleH2, ScheduleKind::kZeroBubbleV}) {
    for (const int P : {2, 4}) {
      TrainConfig config = Small(P == 4 && kind == ScheduleKind::kZeroBubbleV ? 8 : 4,
                                 P == 4 && kind == ScheduleKind::kZeroBubbleV ? 8 : 4);
      config.optimizer.clip_norm = 1e6;
      const PipelineOptions sync{.stages = P, .schedule = kind};
      PipelineOptions eager = sync;
      eager.post_validate = true;
      eager.fault.rank = P - 1;
      eager.fault.hold_step = 1;
      const std::string what = fmt::format("{} P={}", ScheduleKindName(kind), P);
      const Result got = Train(config, eager, true);
      EXPECT_GE(got.overlapped, 1) << what;
      ExpectBitwise(Train(config, sync, false), got, what);

      eager.timeout = std::chrono::milliseconds(300);
      try {
        Train(config, eager, false);
        ADD_FAILURE() << what << ": the hold was met without interlocked steps";
      } catch (const StageError& e) {
        EXPECT_NE(std::string(e.what()).find("consecutive steps do not interlock"),
                  std::string::npos)
            << e.what();
      }
    }
  }
}

// Boundaries inside an interlocked run: evaluation and a checkpoint every 2 steps (Run announces
// no step across them), a resume from that checkpoint, and a stop signal that finds a step running
// ahead (finished first, then the run stops after it): every state is the synchronous run's.
TEST(InterlockedSteps, EvaluationCheckpointResumeAndStopBoundariesKeepTheRunBitwise) {
  const fs::path dir = testing_support::ScratchPath("interlocked_steps_boundaries");
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const ScheduleKind kind : {ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubbleH2}) {
    const PipelineOptions sync{.stages = 2, .schedule = kind};
    PipelineOptions eager = sync;
    eager.post_validate = true;
    const std::string what(ScheduleKindName(kind));
    TrainConfig config = Small(4, 4, 6);
    config.optimizer.clip_norm = 0.3;  // fires on some steps
    const Result expected = Train(config, sync, false);

    TrainConfig saving = config;
    saving.eval_every = 2;
    saving.save_every = 2;
    saving.save_path = (dir / fmt::format("{}.safetensors", what)).string();
    const Result bounded = Train(saving, eager, true);
    ExpectBitwise(expected, bounded, what + " with evaluation and checkpoints every 2 steps");

    // Resume from the step-6 checkpoint's predecessor: train 4 steps saving, then resume to 6.
    TrainConfig first = config;
    first.steps = 4;
    first.save_path = (dir / fmt::format("{}-4.safetensors", what)).string();
    Train(first, eager, true);
    TrainConfig resumed = config;
    resumed.resume_path = first.save_path;
    const Result rest = Train(resumed, eager, true);
    EXPECT_TRUE(rest.state == expected.state) << what << ": resumed at step 4";
    ASSERT_EQ(rest.losses.size(), 2u) << what;
    EXPECT_EQ(rest.losses[1], expected.losses[5]) << what;

    // A stop at the second query: step 2 runs ahead by then, so it is finished and the run stops
    // after it, in the synchronous run's state after 2 steps.
    TrainConfig two = config;
    two.steps = 2;
    const Result expected_two = Train(two, sync, false);
    TrainConfig stopping = config;
    stopping.save_path = (dir / fmt::format("{}-stop.safetensors", what)).string();
    const Result stopped = Train(stopping, eager, true, /*stop_at=*/1);
    EXPECT_EQ(stopped.summary.stop_signal, 15) << what;
    EXPECT_TRUE(stopped.summary.stopped_ahead) << what;
    EXPECT_EQ(stopped.summary.steps, 2) << what;
    EXPECT_TRUE(stopped.state == expected_two.state) << what << ": stopped after step 2";
  }
  fs::remove_all(dir);
}

// A non-finite step that stops training (no --skip-nonfinite left) while the next step runs
// ahead: the engine drains it, and the state is the synchronous run's at the error.
TEST(InterlockedSteps, ANonFiniteStopDrainsTheStepRunningAhead) {
  TrainConfig c = Overflowing(4);
  c.skip_nonfinite = 0;
  auto run = [&](const PipelineOptions& options, bool interlocked) {
    Trainer trainer(c, PipelineEngineFactory(options));
    try {
      if (interlocked) {
        trainer.Run();
      } else {
        while (trainer.step() < c.steps) trainer.Step();
      }
      ADD_FAILURE() << "no step was non-finite";
    } catch (const NonFiniteError&) {
    }
    return std::make_pair(trainer.step(), testing_support::KeepState(trainer, c.optimizer));
  };
  const PipelineOptions sync{.stages = 2, .schedule = ScheduleKind::kZeroBubbleH2};
  PipelineOptions eager = sync;
  eager.post_validate = true;
  const auto expected = run(sync, false), got = run(eager, true);
  EXPECT_EQ(got.first, expected.first);
  EXPECT_TRUE(got.second == expected.second) << "the drained step left its update behind";
}

}  // namespace
}  // namespace sluice::pipeline
