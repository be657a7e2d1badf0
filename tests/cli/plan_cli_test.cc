// `sluice plan` and `--memory-budget` from the command line: the forecast brackets what the same
// job measures when it trains; a budget of 0.75× the largest unbudgeted stage peak trains with
// every stage within it and the very same losses; budgets that cannot be met or are written
// wrongly are refused before any step, naming the option and what is allowed.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli/cli_fixture.h"

namespace sluice {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A small job of the default task in 4 stages (the shapes of `make run`, fewer steps).
#define SLUICE_MODEL "--layers 4 --batch 16 --microbatches 4 --threads 1 --steps 2 --eval-every 0"
constexpr const char* kModel = SLUICE_MODEL;
constexpr const char* kJob = SLUICE_MODEL " --stages 4 --schedule 1f1b";
#undef SLUICE_MODEL

class PlanCli : public CliTest {
 protected:
  nlohmann::json Plan(const std::string& args, const std::string& env = "") {
    const CliResult r = Sluice(fmt::format("plan {} --format json", args), env);
    EXPECT_EQ(r.status, 0) << args << "\n" << r.err;
    return nlohmann::json::parse(r.out.empty() ? "{}" : r.out);
  }

  // The step losses and the summary of a training run.
  struct Trained {
    std::vector<double> losses;
    nlohmann::json summary;
  };
  Trained Train(const std::string& args, const std::string& env = "") {
    const fs::path metrics = dir_ / "m.jsonl";
    fs::remove(metrics);
    const CliResult r = Sluice(fmt::format("train {} --quiet --metrics {}", args, metrics.string()),
                               env + " timeout 300");
    EXPECT_EQ(r.status, 0) << args << "\n" << r.err;
    Trained t;
    std::ifstream in(metrics);
    for (std::string line; std::getline(in, line);) {
      nlohmann::json j = nlohmann::json::parse(line);
      if (j.value("summary", false)) {
        t.summary = j;
      } else if (j.contains("loss") && !j.contains("val_loss")) {
        t.losses.push_back(j["loss"].get<double>());
      }
    }
    return t;
  }
};

TEST_F(PlanCli, ForecastBracketsTheMeasuredPeaks) {
  const nlohmann::json plan = Plan(kJob);
  ASSERT_EQ(plan["stages"].size(), 4u) << plan.dump();
  const Trained run = Train(kJob);
  ASSERT_EQ(run.summary["stages"].size(), 4u) << run.summary.dump();
  // One stage output: 4 sequences × T × C f32 (T from the sort task, C = 64 by default).
  for (size_t s = 0; s < 4; ++s) {
    const int64_t predicted = plan["stages"][s]["predicted_peak_allocated_bytes"].get<int64_t>();
    const int64_t measured = run.summary["stages"][s]["peak_allocated_bytes"].get<int64_t>();
    const int64_t output = run.summary["stages"][0]["output_bytes"].get<int64_t>();
    // The run's summary carries the same forecast beside what it measured (for sluice report).
    EXPECT_EQ(run.summary["stages"][s]["predicted_peak_allocated_bytes"].get<int64_t>(), predicted)
        << "stage " << s;
    EXPECT_LE(measured, predicted) << "stage " << s;
    EXPECT_GE(measured, predicted - output) << "stage " << s;
    int64_t parts = 0;
    for (const auto& [use, bytes] : plan["stages"][s]["breakdown"].items())
      parts += bytes.get<int64_t>();
    EXPECT_EQ(parts, predicted) << "stage " << s;
  }
}

// --post-validate: the plan counts the copy each stage keeps for a rollback and the gradients an
// interlocked step keeps for a redo, the run (its steps interlocked) reports the same copy and its
// rollbacks (--clip fires at every step), the forecast still brackets the measured peaks, and the
// losses are those of the synchronous run.
TEST_F(PlanCli, PostValidationsRollbackCopyIsPlannedAndMeasured) {
  const std::string job = fmt::format("{} --stages 4 --schedule zb-h2 --clip 0.01", kModel);
  const nlohmann::json plan = Plan(job + " --post-validate");
  EXPECT_EQ(plan["post_validate"], true);
  const Trained run = Train(job + " --post-validate"), sync = Train(job);
  EXPECT_EQ(run.losses, sync.losses);
  ASSERT_EQ(plan["stages"].size(), 4u) << plan.dump();
  ASSERT_TRUE(run.summary.contains("post_validation")) << run.summary.dump();
  EXPECT_EQ(run.summary["post_validation"]["rollbacks"], 2);
  int64_t kept = 0;
  for (size_t s = 0; s < 4; ++s) {
    const nlohmann::json& p = plan["stages"][s];
    EXPECT_GT(p["rollback_bytes"].get<int64_t>(), 0) << "stage " << s;
    EXPECT_GT(p["interlock_bytes"].get<int64_t>(), 0) << "stage " << s;
    EXPECT_EQ(run.summary["stages"][s]["rollback_bytes"], p["rollback_bytes"]) << "stage " << s;
    kept += p["rollback_bytes"].get<int64_t>();
    const int64_t measured = run.summary["stages"][s]["peak_allocated_bytes"].get<int64_t>();
    EXPECT_LE(measured, p["predicted_peak_allocated_bytes"].get<int64_t>()) << "stage " << s;
    EXPECT_GE(measured, p["least_peak_allocated_bytes"].get<int64_t>()) << "stage " << s;
  }
  EXPECT_EQ(run.summary["post_validation"]["rollback_bytes"], kept);
  const CliResult table = Sluice(fmt::format("plan {} --post-validate", job));
  EXPECT_EQ(table.status, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("zb-h2 (steady-state bubble "));
  EXPECT_THAT(table.out, HasSubstr("% at unit cost with post-validation"));
  EXPECT_THAT(table.out, HasSubstr("post-validation keeps a copy of each stage's parameters"));
  EXPECT_THAT(table.out, HasSubstr("the previous step's gradients for its redo"));
}

TEST_F(PlanCli, OneStageForecastIsExact) {
  const std::string job =
      "--layers 2 --batch 8 --microbatches 2 --threads 1 --steps 2 --eval-every 0";
  const nlohmann::json plan = Plan(job);
  const Trained run = Train(job);
  ASSERT_EQ(plan["stages"].size(), 1u);
  EXPECT_EQ(plan["stages"][0]["predicted_peak_allocated_bytes"].get<int64_t>(),
            run.summary["peak_allocated_bytes"].get<int64_t>());
  EXPECT_EQ(run.summary["predicted_peak_allocated_bytes"].get<int64_t>(),
            run.summary["peak_allocated_bytes"].get<int64_t>());
}

// Under bf16 on the f32-compute engine the products and the attention widen their operands into
// scratch from the executor's allocator: the forecast holds it at its instruction (OpDef::
// scratch_bytes), so the plan still equals the measured peak, fused and naive attention (whose
// batched products take the per-entry scratch), with and without recompute, at 2 threads.
TEST_F(PlanCli, OneStageForecastIsExactUnderBf16) {
  for (const char* extra : {"--recompute none", "--recompute cheap --attention naive"}) {
    const std::string job = fmt::format(
        "--layers 2 --batch 8 --microbatches 2 --threads 2 --steps 2 --eval-every 0 "
        "--precision bf16 {}",
        extra);
    const nlohmann::json plan = Plan(job);
    const Trained run = Train(job);
    ASSERT_EQ(plan["stages"].size(), 1u);
    EXPECT_EQ(plan["stages"][0]["predicted_peak_allocated_bytes"].get<int64_t>(),
              run.summary["peak_allocated_bytes"].get<int64_t>())
        << extra;
    EXPECT_EQ(run.summary["predicted_peak_allocated_bytes"].get<int64_t>(),
              run.summary["peak_allocated_bytes"].get<int64_t>())
        << extra;
  }
}

// Regression: oneDNN's bf16 products were made under the OpenMP thread count of the thread that
// first asked for them — on a thread that never set one, the process's default (OMP_NUM_THREADS,
// else every core) — not under the run's, so their scratchpads (a buffer per thread), and the
// forecast counting them, grew with that default: at --threads 1 under OMP_NUM_THREADS=4 plan and
// run held four threads' buffers a product. They are made for the run's threads now (kernels/
// onednn_runtime.h OneDnnCache): the same forecast whatever OMP_NUM_THREADS says, and still the
// measured peak.
TEST_F(PlanCli, OneDnnScratchIsForTheRunsThreadsWhateverOpenMpsDefault) {
  const std::string job =
      "--layers 2 --batch 8 --microbatches 2 --threads 1 --steps 2 --eval-every 0 "
      "--precision bf16";
  int64_t first = -1;
  for (const char* omp : {"1", "4"}) {
    const std::string env = fmt::format("OMP_NUM_THREADS={} SLUICE_BF16_GEMM=onednn", omp);
    const nlohmann::json plan = Plan(job, env);
    const Trained run = Train(job, env);
    ASSERT_EQ(plan["stages"].size(), 1u) << plan.dump();
    const int64_t predicted = plan["stages"][0]["predicted_peak_allocated_bytes"].get<int64_t>();
    EXPECT_EQ(predicted, run.summary["peak_allocated_bytes"].get<int64_t>()) << env;
    if (first < 0) first = predicted;
    EXPECT_EQ(predicted, first) << env << " against OMP_NUM_THREADS=1";
  }
}

TEST_F(PlanCli, TableNamesWhereThePeakIs) {
  const CliResult r = Sluice(fmt::format("plan {}", kJob));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("peak at"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("of micro-batch"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("activations"), std::string::npos) << r.out;
}

TEST_F(PlanCli, ABudgetOfFourFifthsTrainsWithinItAndLosesNothing) {
  const nlohmann::json plan = Plan(fmt::format("{} --recompute none", kJob));
  int64_t largest = 0;
  for (const auto& s : plan["stages"])
    largest = std::max(largest, s["predicted_peak_reserved_bytes"].get<int64_t>());
  const int64_t budget = largest * 4 / 5;
  const Trained free_run = Train(fmt::format("{} --recompute none", kJob));
  const Trained budgeted = Train(fmt::format("{} --memory-budget {}", kJob, budget));
  ASSERT_EQ(budgeted.summary["stages"].size(), 4u) << budgeted.summary.dump();
  for (const auto& s : budgeted.summary["stages"]) {
    EXPECT_LE(s["peak_allocated_bytes"].get<int64_t>(), budget) << s.dump();
  }
  ASSERT_EQ(free_run.losses.size(), 2u);
  EXPECT_EQ(budgeted.losses, free_run.losses);  // recompute changes no bit of the gradients
}

TEST_F(PlanCli, ABudgetNothingFitsIsRefusedBeforeTraining) {
  const fs::path metrics = dir_ / "m.jsonl";
  const CliResult r =
      Sluice(fmt::format("train {} --memory-budget 1KiB --metrics {}", kJob, metrics.string()));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--memory-budget 1KiB"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("smallest achievable peak"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("stage 3"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(metrics)) << "nothing may be written before the plan fits";
  const CliResult p = Sluice(fmt::format("plan {} --memory-budget 1KiB", kJob));
  EXPECT_NE(p.status, 0);
  EXPECT_NE(p.err.find("smallest achievable peak"), std::string::npos) << p.err;
}

// Regression: a budget no recompute policy fits at the job's micro-batch count was refused without
// saying that splitting the batch further fits it (bench/memory_budget.py's one-stage-accum). The
// refusal now names the count, from the same forecast: planned with it, the budget fits, and one
// fewer (a count dividing the batch) does not.
TEST_F(PlanCli, ABudgetNoPolicyFitsNamesTheMicroBatchesThatFit) {
  const std::string model = "--layers 2 --threads 1 --steps 1 --eval-every 0";
  const nlohmann::json small = Plan(model + " --batch 8 --microbatches 1 --recompute none");
  const int64_t budget = small["stages"][0]["predicted_peak_allocated_bytes"].get<int64_t>();
  const std::string job = fmt::format("{} --batch 64 --memory-budget {}", model, budget);
  for (const char* command : {"plan", "train"}) {
    SCOPED_TRACE(command);
    const CliResult r = Sluice(fmt::format("{} {} --microbatches 1", command, job));
    ASSERT_EQ(r.status, 1) << r.err;
    EXPECT_THAT(r.err, HasSubstr("no recompute policy fits every stage")) << r.err;
    const size_t at = r.err.find("\n--microbatches ");
    ASSERT_NE(at, std::string::npos) << r.err;
    const int m = std::stoi(r.err.substr(at + 16));
    EXPECT_THAT(r.err, HasSubstr(fmt::format("--microbatches {} fits it (batch 64 in "
                                             "micro-batches of {}; forecast peak ",
                                             m, 64 / m)));
    EXPECT_GT(m, 1);
    Plan(fmt::format("{} --microbatches {}", job, m));  // fits: status 0
    int fewer = m - 1;
    while (64 % fewer != 0) --fewer;
    if (fewer > 1) {
      EXPECT_NE(Sluice(fmt::format("plan {} --microbatches {}", job, fewer)).status, 0) << fewer;
    }
  }
  // GPipe keeps every micro-batch in flight: with a budget below what the parameters alone take,
  // no split fits, and the refusal says so.
  const CliResult none = Sluice(fmt::format("plan {} --batch 64 --memory-budget 1KiB", model));
  EXPECT_THAT(none.err, HasSubstr("no split of the batch into more micro-batches fits it either"));
}

// Above the forecast's action limit (memory_forecast.h) plan says so at once instead of replaying
// millions of actions; --schedule auto refuses each schedule for that reason.
TEST_F(PlanCli, JobsOverTheForecastLimitAreRefusedNamingIt) {
  const std::string job = "--layers 8 --stages 8 --batch 16384 --microbatches 16384 --threads 1";
  const CliResult r = Sluice(fmt::format("plan {} --schedule 1f1b", job));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("memory not forecast: 720904 actions, over the forecast's 400000"),
            std::string::npos)
      << r.err;
  const CliResult a = Sluice(fmt::format("plan {} --schedule auto --memory-budget 1GiB", job));
  EXPECT_NE(a.status, 0);
  EXPECT_NE(a.err.find("1f1b: memory not forecast"), std::string::npos) << a.err;
}

// Regression: building the MLP's task drew its blob centres [K, F] at once — at the widest sizes
// 16 GiB and 80 s before plan printed a line. plan reads no batch, so it draws none.
TEST_F(PlanCli, AnMlpAtTheWidestSizesIsForecastWithoutDrawingItsData) {
  const CliResult r = Sluice(
      "plan --model mlp --features 65536 --hidden 65536 --classes 65536 --batch 16384 --threads 1");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.out.find("196.00 GiB"), std::string::npos) << r.out;
}

TEST_F(PlanCli, BadBudgetsAreClearErrors) {
  const std::pair<const char*, const char*> cases[] = {
      {"--memory-budget 6MB/s", "unknown unit 'MB/s'"},
      {"--memory-budget -1", "not positive"},
      {"--memory-budget 0", "not positive"},
      {"--memory-budget nan", "not a number"},
      {"--memory-budget 6MiB,6MiB", "lists 2 sizes but training runs in 4 stages"},
      {"--memory-budget 6MiB --recompute full", "--recompute and --memory-budget"},
  };
  for (const auto& [args, message] : cases) {
    const CliResult r = Sluice(fmt::format("plan {} {}", kJob, args));
    EXPECT_NE(r.status, 0) << args;
    EXPECT_NE(r.err.find(message), std::string::npos) << args << "\n" << r.err;
    EXPECT_EQ(r.err.find("internal error"), std::string::npos) << args << "\n" << r.err;
  }
  const CliResult r = Sluice(fmt::format("plan {} --stages 1 --schedule auto", kModel));
  EXPECT_NE(r.status, 0);
  EXPECT_NE(r.err.find("--schedule auto chooses a pipeline schedule"), std::string::npos) << r.err;
}

TEST_F(PlanCli, AutoScheduleFitsTheBudget) {
  const std::string job = fmt::format("{} --stages 4", kModel);
  const nlohmann::json none = Plan(fmt::format("{} --recompute none --schedule gpipe", job));
  const int64_t stage0 = none["stages"][0]["predicted_peak_allocated_bytes"].get<int64_t>();
  // Below gpipe's stage 0 without recompute: auto must pick a schedule or policies that fit.
  const nlohmann::json plan =
      Plan(fmt::format("{} --schedule auto --memory-budget {}", job, stage0 * 9 / 10));
  EXPECT_TRUE(plan["fits"].get<bool>()) << plan.dump();
  for (const auto& s : plan["stages"]) {
    EXPECT_LE(s["predicted_peak_allocated_bytes"].get<int64_t>(), stage0 * 9 / 10) << s.dump();
  }
  EXPECT_TRUE(plan["schedule"].is_string());
}

// Without a budget auto takes the least step time: the unit-cost makespan per chunk (an action of
// a two-chunk rank does half its work). P = 2, M = 4: zb-v 25/2 beats zb-h1 and zb-h2 (13) and
// interleaved (27/2).
TEST_F(PlanCli, AutoScheduleCountsAChunkAsPartOfAStage) {
  const nlohmann::json plan = Plan(fmt::format("{} --stages 2 --schedule auto", kModel));
  EXPECT_EQ(plan["schedule"], "zb-v") << plan.dump();
  EXPECT_NEAR(plan["bubble"].get<double>(), 1.0 / 25, 1e-12);
}

// Regression (issue 37): the forecast replayed sync GC whatever --gc said, so a budget planned for
// `--gc none` chose policies whose run then failed over the budget at its first backward. The
// forecast follows --gc: the run it plans trains, every stage within the budget and as forecast.
TEST_F(PlanCli, ABudgetPlannedUnderGcNoneTrainsWithinIt) {
  const std::string job = fmt::format("{} --gc none", kJob);
  const nlohmann::json none = Plan(fmt::format("{} --recompute none", job));
  const nlohmann::json sync = Plan(fmt::format("{} --recompute none", kJob));
  int64_t largest = 0;
  for (size_t s = 0; s < 4; ++s) {
    const int64_t peak = none["stages"][s]["predicted_peak_allocated_bytes"].get<int64_t>();
    EXPECT_GT(peak, sync["stages"][s]["predicted_peak_allocated_bytes"].get<int64_t>())
        << "stage " << s << ": gc none holds a run's values to its end";
    largest = std::max(largest, peak);
  }
  const int64_t budget = largest * 9 / 10;
  const Trained run = Train(fmt::format("{} --memory-budget {}", job, budget));
  ASSERT_EQ(run.summary["stages"].size(), 4u) << run.summary.dump();
  for (const auto& s : run.summary["stages"]) {
    EXPECT_LE(s["peak_allocated_bytes"].get<int64_t>(), budget) << s.dump();
    EXPECT_LE(s["peak_allocated_bytes"].get<int64_t>(),
              s["predicted_peak_allocated_bytes"].get<int64_t>())
        << s.dump();
  }
}

}  // namespace
}  // namespace sluice
