// `sluice train --stages P` as a user runs it: every schedule trains bitwise like one stage, the
// metrics summary reports memory and time per stage, --trace writes one track per stage, an
// explicit --layout is used, a checkpoint taken in the pipeline resumes bitwise, and bad requests,
// bad layouts and failing stages end with exit status 1 and a message naming the problem —
// never a crash or a hang.
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli/cli_fixture.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

// A small GPT that trains in well under a second per step. --threads 1 keeps every summation in
// one order, so the pipeline's losses equal the single stage's bitwise.
constexpr const char* kJob = "--dim 32 --heads 2 --batch 8 --threads 1 --eval-every 0 --quiet";

class TrainPipelineCli : public CliTest {
 protected:
  // `timeout` turns a hang into a failing exit status (124) instead of a test that never ends.
  CliResult Train(const std::string& args, int steps = 3) {
    return Sluice(fmt::format("train {} --steps {} {}", kJob, steps, args), "timeout 120");
  }

  // Trains and returns the metrics lines; fails the test when the job fails.
  std::vector<nlohmann::json> TrainMetrics(const std::string& args,
                                           const std::string& name = "m.jsonl", int steps = 3) {
    const fs::path metrics = dir_ / name;
    const CliResult r = Train(fmt::format("{} --metrics {}", args, metrics.string()), steps);
    EXPECT_EQ(r.status, 0) << args << "\n" << r.err;
    std::vector<nlohmann::json> lines;
    std::ifstream in(metrics);
    for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
    return lines;
  }

  static std::vector<double> Losses(const std::vector<nlohmann::json>& lines) {
    std::vector<double> losses;
    for (const auto& j : lines) {
      if (j.contains("loss") && !j.contains("summary")) losses.push_back(j["loss"].get<double>());
    }
    return losses;
  }

  static nlohmann::json Summary(const std::vector<nlohmann::json>& lines) {
    for (const auto& j : lines) {
      if (j.value("summary", false)) return j;
    }
    ADD_FAILURE() << "no summary line in the metrics";
    return nlohmann::json::object();
  }

  // Runs a job that must fail: exit status 1 (an error, not a signal or an internal error), the
  // message on stderr, and no metrics written.
  std::string Refused(const std::string& args) {
    const fs::path metrics = dir_ / "refused.jsonl";
    fs::remove(metrics);
    const CliResult r = Train(fmt::format("{} --metrics {}", args, metrics.string()));
    EXPECT_EQ(r.status, 1) << args << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr("sluice: error: ")) << args;
    EXPECT_TRUE(!fs::exists(metrics) || fs::file_size(metrics) == 0)
        << args << " wrote " << ReadFile(metrics);
    return r.err;
  }
};

TEST_F(TrainPipelineCli, OneFOneBSummaryReportsEveryStage) {
  const nlohmann::json s =
      Summary(TrainMetrics("--layers 4 --microbatches 4 --stages 4 --schedule 1f1b"));
  ASSERT_TRUE(s.contains("stages")) << s.dump();
  ASSERT_EQ(s["stages"].size(), 4u) << s.dump();
  for (int stage = 0; stage < 4; ++stage) {
    const nlohmann::json& r = s["stages"][stage];
    SCOPED_TRACE(r.dump());
    EXPECT_EQ(r["stage"].get<int>(), stage);
    EXPECT_GT(r["peak_allocated_bytes"].get<int64_t>(), 0);
    EXPECT_GE(r["released_output_bytes"].get<int64_t>(), 0);
    // 1F1B: stage s keeps min(P − s, M) micro-batches between their F and B.
    EXPECT_EQ(r["theoretical_inflight"].get<int>(), 4 - stage);
    EXPECT_EQ(r["inflight_peak"].get<int>(), r["theoretical_inflight"].get<int>());
    EXPECT_GT(r["busy_ms"].get<double>(), 0);
    EXPECT_GE(r["idle_ms"].get<double>(), 0);
  }
  // Every stage but the last sends its output on, and release frees each micro-batch's output
  // after its send: M outputs per step. The loss stage sends nothing.
  for (int stage = 0; stage < 3; ++stage) {
    const nlohmann::json& r = s["stages"][stage];
    EXPECT_GT(r["output_bytes"].get<int64_t>(), 0) << r.dump();
    EXPECT_EQ(r["released_output_bytes"].get<int64_t>(), 4 * r["output_bytes"].get<int64_t>())
        << r.dump();
  }
  EXPECT_EQ(s["stages"][3]["released_output_bytes"].get<int64_t>(), 0);
  EXPECT_EQ(s["pipeline"]["schedule"], "1f1b");
  EXPECT_EQ(s["pipeline"]["stages"], 4);
  EXPECT_EQ(s["pipeline"]["layout"], "embed,h.0|h.1|h.2|h.3,head");
}

// Each schedule against the single-stage job with the same micro-batching: bitwise the same
// losses, and every stage's in-flight peak as the schedule's theory says.
TEST_F(TrainPipelineCli, EveryScheduleTrainsLikeOneStage) {
  struct Case {
    std::string name, model, pipeline;
  };
  const std::vector<Case> cases = {
      {"gpipe", "--layers 4 --microbatches 4", "--stages 4 --schedule gpipe"},
      {"1f1b", "--layers 4 --microbatches 4", "--stages 4 --schedule 1f1b"},
      {"interleaved P=2", "--layers 4 --microbatches 4",
       "--stages 2 --schedule interleaved --chunks 2"},
      {"interleaved P=4", "--layers 8 --microbatches 4",
       "--stages 4 --schedule interleaved --chunks 2"},
      {"zb-h1", "--layers 4 --microbatches 4", "--stages 4 --schedule zb-h1"},
      {"zb-h2", "--layers 4 --microbatches 4", "--stages 4 --schedule zb-h2"},
      {"zb-v P=2", "--layers 4 --microbatches 4", "--stages 2 --schedule zb-v"},
      {"zb-v P=4", "--layers 8 --microbatches 8", "--stages 4 --schedule zb-v"},
      {"v-half P=2", "--layers 4 --microbatches 4", "--stages 2 --schedule v-half"},
      {"v-min P=4", "--layers 8 --microbatches 8", "--stages 4 --schedule v-min"},
      {"interleaved P=2, receives posted ahead", "--layers 4 --microbatches 4",
       "--stages 2 --schedule interleaved --post-receives-ahead"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::vector<double> single = Losses(TrainMetrics(c.model, "single.jsonl"));
    const std::vector<nlohmann::json> lines =
        TrainMetrics(c.model + " " + c.pipeline, "pipe.jsonl");
    ASSERT_EQ(single.size(), 3u);
    EXPECT_EQ(Losses(lines), single);
    const nlohmann::json s = Summary(lines);
    for (const nlohmann::json& r : s["stages"]) {
      EXPECT_EQ(r["inflight_peak"].get<int>(), r["theoretical_inflight"].get<int>()) << r.dump();
    }
  }
}

TEST_F(TrainPipelineCli, NoReleaseOutputsKeepsOutputsAndTheLosses) {
  const std::string job = "--layers 4 --microbatches 4 --stages 4 --schedule 1f1b";
  const std::vector<nlohmann::json> on = TrainMetrics(job, "on.jsonl");
  const std::vector<nlohmann::json> off = TrainMetrics(job + " --no-release-outputs", "off.jsonl");
  EXPECT_EQ(Losses(on), Losses(off));
  EXPECT_EQ(Losses(on).size(), 3u);
  const nlohmann::json s = Summary(off);
  EXPECT_EQ(s["pipeline"]["release_outputs"], false);
  ASSERT_EQ(s["stages"].size(), 4u);
  for (const nlohmann::json& r : s["stages"])
    EXPECT_EQ(r["released_output_bytes"].get<int64_t>(), 0) << r.dump();
  EXPECT_EQ(Summary(on)["pipeline"]["release_outputs"], true);
}

TEST_F(TrainPipelineCli, TraceHasAProcessPerStage) {
  const fs::path trace = dir_ / "trace.json";
  const CliResult r =
      Train(fmt::format("--layers 4 --microbatches 4 --stages 4 --trace {}", trace.string()));
  ASSERT_EQ(r.status, 0) << r.err;
  ASSERT_TRUE(fs::exists(trace));
  const nlohmann::json j = nlohmann::json::parse(ReadFile(trace));
  ASSERT_TRUE(j.contains("traceEvents"));
  std::set<int> processes, busy;
  for (const nlohmann::json& e : j["traceEvents"]) {
    if (e.value("name", "") == "process_name" && e.value("ph", "") == "M")
      processes.insert(e["pid"].get<int>());
    if (e.value("ph", "") == "X") busy.insert(e["pid"].get<int>());
  }
  EXPECT_EQ(processes.size(), 4u) << j.dump().substr(0, 2000);
  EXPECT_EQ(busy, processes) << "every stage's process has spans";
}

TEST_F(TrainPipelineCli, ExplicitLayoutIsUsed) {
  // Three stages over four layers: the middle one takes two. The summary writes ranges.
  const nlohmann::json s = Summary(
      TrainMetrics("--layers 4 --microbatches 4 --stages 3 --layout 'embed,h.0|h.1,h.2|h.3,head'"));
  EXPECT_EQ(s["pipeline"]["layout"], "embed,h.0|h.1-2|h.3,head");
  EXPECT_EQ(s["stages"].size(), 3u);
  // The uniform split of 4 layers over 3 stages is the layout above; one that differs from it
  // shows the layout is the one used.
  const nlohmann::json own = Summary(TrainMetrics(
      "--layers 4 --microbatches 4 --stages 3 --layout 'embed|h.0-3|head'", "own.jsonl"));
  EXPECT_EQ(own["pipeline"]["layout"], "embed|h.0-3|head");
}

TEST_F(TrainPipelineCli, VShapedLayoutPutsEmbedAndHeadOnRankZero) {
  // zb-v, P = 2: the layout lists 4 virtual stages in model order; rank 0 runs the first and the
  // last, rank 1 the middle two.
  const nlohmann::json s =
      Summary(TrainMetrics("--layers 4 --microbatches 4 --stages 2 --schedule zb-v --layout "
                           "'embed,h.0|h.1|h.2|h.3,head'"));
  EXPECT_EQ(s["pipeline"]["layout"], "embed,h.0|h.1|h.2|h.3,head");
  EXPECT_EQ(s["pipeline"]["chunks"], 2);
  ASSERT_EQ(s["stages"].size(), 2u);
  // One output sent (and released) per micro-batch on each rank: rank 0's chunk 1 holds the loss,
  // and rank 1 hands chunk 0's output to its own chunk 1 without a message (the turn of the V).
  const int64_t released = s["stages"][0]["released_output_bytes"].get<int64_t>();
  EXPECT_EQ(released, s["stages"][0]["output_bytes"].get<int64_t>() * 4);
  EXPECT_EQ(s["stages"][1]["released_output_bytes"].get<int64_t>(), released);
}

TEST_F(TrainPipelineCli, BadLayoutsNameTheProblem) {
  const std::string job = "--layers 4 --microbatches 4 --stages 3 --layout ";
  EXPECT_THAT(Refused(job + "'embed,h.0|h.1|h.3,head'"), HasSubstr("h.2 is in no stage (dropped)"));
  EXPECT_THAT(Refused(job + "'embed,h.0-1|h.1,h.2|h.3,head'"), HasSubstr("h.1 is duplicated"));
  EXPECT_THAT(Refused(job + "'embed,h.0-1||h.2-3,head'"), HasSubstr("--layout stage 1 is empty"));
  EXPECT_THAT(Refused(job + "'embed,h.0-1|h.2-3,head'"), HasSubstr("--layout has 2 stages"));
  EXPECT_THAT(Refused(job + "'embed,h.0|h.1-2|h.3-4,head'"), HasSubstr("'h.3-4' is out of range"));
  EXPECT_THAT(
      Refused("--layers 4 --microbatches 4 --stages 2 --schedule zb-v --layout "
              "'embed,h.0-1|h.2-3,head'"),
      HasSubstr(
          "--layout has 2 stages, but a V-shaped schedule (zb-v, v-half, v-min) runs 4 virtual "
          "stages: 2 per rank, listed in model order"));
}

// `sluice train --stages P` without --microbatches runs: the fewest micro-batches the schedule
// takes that divide --batch (8 here), not 1, which every schedule but gpipe refuses.
TEST_F(TrainPipelineCli, WithoutMicrobatchesAPipelineRunsTheFewestItsScheduleTakes) {
  for (const auto& [args, expected] :
       std::vector<std::pair<std::string, int>>{{"--layers 4 --stages 4", 4},
                                                {"--layers 3 --stages 3", 4},
                                                {"--layers 8 --stages 4 --schedule zb-v", 8},
                                                {"--layers 4 --stages 2 --schedule interleaved", 2},
                                                {"--layers 4 --stages 2 --schedule auto", 2}}) {
    const nlohmann::json summary = Summary(TrainMetrics(args, "m.jsonl", 1));
    EXPECT_EQ(summary["pipeline"]["micro_batches"], expected) << args << "\n" << summary.dump();
  }
  // None divides the batch: the schedule's own error with the count it would have had.
  EXPECT_THAT(Refused("--layers 4 --stages 3 --schedule interleaved"),
              HasSubstr("interleaved: the micro-batch count must be a multiple of the stage count "
                        "(M=1, P=3)"));
}

// Fewer layers than stages and no --partition: balanced, embed and head on stages of their own;
// --partition uniform asked for is still refused naming the fixes.
TEST_F(TrainPipelineCli, FewerLayersThanStagesSplitBalancedUnlessUniformIsAskedFor) {
  const nlohmann::json summary = Summary(TrainMetrics("--layers 2 --stages 4", "m.jsonl", 1));
  EXPECT_EQ(summary["pipeline"]["layout"], "embed|h.0|h.1|head") << summary.dump();
  EXPECT_EQ(Summary(TrainMetrics("--layers 4 --stages 4", "u.jsonl", 1))["pipeline"]["layout"],
            "embed,h.0|h.1|h.2|h.3,head");  // enough layers: uniform, as before
  EXPECT_THAT(Refused("--layers 2 --stages 4 --partition uniform"),
              HasSubstr("use --partition balanced (embed and head may take a stage of their own), "
                        "name the layers of each stage with --layout, or give the model --layers "
                        "4 or more"));
  EXPECT_THAT(Refused("--layers 2 --stages 5"),
              HasSubstr("the model has 2 layers for 5 virtual stages (--stages × --chunks): give "
                        "the model --layers 5 or more (3 with --partition balanced: embed and head "
                        "may take a stage of their own), or use fewer stages"));
}

TEST_F(TrainPipelineCli, BadRequestsSayWhatToChange) {
  const std::string gpt = "--layers 4 --microbatches 4";
  EXPECT_THAT(Refused(gpt + " --stages 4 --schedule bogus"), HasSubstr("unknown schedule 'bogus'"));
  EXPECT_THAT(Refused("--layers 4 --microbatches 2 --stages 4 --schedule 1f1b"),
              HasSubstr("needs at least as many micro-batches as stages (M=2 < P=4)"));
  EXPECT_THAT(
      Refused("--layers 6 --microbatches 4 --stages 3 --schedule interleaved"),
      HasSubstr("must be a multiple of the stage count (M=4, P=3): use 3 or 6 micro-batches"));
  EXPECT_THAT(Refused("--layers 8 --microbatches 4 --stages 4 --schedule zb-v"),
              HasSubstr("zb-v: needs at least 2P − 1 micro-batches (M=4 < 7 for P=4)"));
  EXPECT_THAT(Refused(gpt + " --stages 2 --schedule zb-v --chunks 3"),
              HasSubstr("zb-v: runs exactly 2 chunks per rank, V-shaped (got 3 chunks)"));
  EXPECT_THAT(Refused(gpt + " --stages 0"), HasSubstr("--stages must be at least 1, got 0"));
  // Without kJob: its GPT shape options would be refused for an MLP first. The MLP's layers are
  // units like the GPT's blocks; three units do not fill four stages.
  const CliResult mlp = Sluice("train --model mlp --stages 4 --steps 3", "timeout 120");
  EXPECT_EQ(mlp.status, 1) << mlp.err;
  EXPECT_THAT(mlp.err, HasSubstr("4 virtual stages (--stages × --chunks) exceed the model's 3 "
                                 "units (fc.0, fc.1, fc.2)"));
  EXPECT_THAT(Refused(gpt + " --stages 2 --comm-timeout 0"),
              HasSubstr("--comm-timeout must be at least 0.001 s"));
  EXPECT_THAT(Refused("--layers 2 --microbatches 4 --stages 4 --partition uniform"),
              HasSubstr("--partition uniform puts at least one layer on every stage"));
  EXPECT_THAT(Refused(gpt + " --stages 2 --partition even"), HasSubstr("unknown partition 'even'"));
  EXPECT_THAT(
      Refused(gpt + " --stages 2 --recompute full,some"),
      HasSubstr("--recompute: 'some' is not a policy; use none|cheap|full|selective|sublayer"));
  EXPECT_THAT(Refused(gpt + " --stages 4 --recompute full,cheap"),
              HasSubstr("--recompute lists 2 policies but training runs in 4 stages"));
}

// --post-validate hides the cross-stage reduction of the norm: one stage has none, and is refused
// with the reason rather than run as if the flag did something.
TEST_F(TrainPipelineCli, PostValidateWithoutAPipelineIsRefusedSayingWhy) {
  for (const char* command : {"train", "plan", "simulate"}) {
    const CliResult r = Sluice(fmt::format("{} --post-validate --steps 1", command));
    EXPECT_EQ(r.status, 1) << command;
    EXPECT_THAT(r.err, HasSubstr("--stages 1 has no such reduction to hide: give --stages 2 or "
                                 "more, or drop --post-validate"))
        << command;
  }
}

// A clip far below the gradient norms fires on every step, so post-validation redoes each one:
// the run says what that cost and what to do; a clip that never fires says nothing.
TEST_F(TrainPipelineCli, PostValidationThatRedoesMostStepsSaysSo) {
  const std::string job = "--layers 2 --microbatches 2 --stages 2 --steps 3 --post-validate";
  const CliResult fired = Sluice("train " + job + " --clip 1e-6");
  ASSERT_EQ(fired.status, 0) << fired.err;
  EXPECT_THAT(fired.err, HasSubstr("post-validation: 3 step(s) rolled back and redone"));
  EXPECT_THAT(fired.err, HasSubstr("note: post-validation redid 3 of 3 steps"));
  const CliResult quiet = Sluice("train " + job + " --clip 1e6");
  ASSERT_EQ(quiet.status, 0) << quiet.err;
  EXPECT_THAT(quiet.err, HasSubstr("post-validation: 0 step(s) rolled back and redone"));
  EXPECT_THAT(quiet.err, Not(HasSubstr("note: post-validation")));
}

TEST_F(TrainPipelineCli, AFailingStageStopsThePipelineWithItsName) {
  const std::string job = "--layers 4 --microbatches 4 --stages 4 --schedule 1f1b";
  std::string err = Refused(job + " --inject-fault throw:1:F:0");
  EXPECT_THAT(err, HasSubstr("stage 1 failed at step 1"));
  EXPECT_THAT(err, HasSubstr("(F0, chunk 0, micro-batch 0): injected fault"));
  // A send that never happens: the stages waiting on it (directly or through a later message) give
  // up after the timeout; whichever fails first is reported, so only the wait is asserted.
  err = Refused(job + " --inject-fault skip:0:SEND_F:1 --comm-timeout 0.5");
  EXPECT_THAT(err, HasSubstr("did not complete within 500 ms"));
  EXPECT_THAT(err, HasSubstr("micro-batch"));
  EXPECT_THAT(Refused(job + " --inject-fault explode:1:F:0"),
              HasSubstr("expected MODE:STAGE:ACTION:MICRO_BATCH"));
}

TEST_F(TrainPipelineCli, ResumesInThePipelineBitwise) {
  const std::string job = "--layers 4 --microbatches 4 --stages 4 --schedule 1f1b";
  const fs::path ckpt = dir_ / "ckpt.safetensors";
  const std::vector<double> full = Losses(TrainMetrics(job, "full.jsonl", 4));
  TrainMetrics(fmt::format("{} --save {}", job, ckpt.string()), "split.jsonl", 2);
  ASSERT_TRUE(fs::exists(ckpt));
  const std::vector<double> split =
      Losses(TrainMetrics(fmt::format("{} --resume {}", job, ckpt.string()), "split.jsonl", 4));
  EXPECT_EQ(full.size(), 4u);
  EXPECT_EQ(split, full);
}

}  // namespace
}  // namespace sluice
