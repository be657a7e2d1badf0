// The f32 GEMM engine as a user sees it (kernels/matmul.h): the training summary names the engine,
// what chose it and what the f32 linear fuses into the product; SLUICE_GEMM=onednn trains the same
// losses as OpenBLAS to float rounding (the bias in oneDNN's epilogue); an unknown engine is
// refused naming the variable and the choices.
#include <cmath>
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
namespace fs = std::filesystem;

class GemmEngineCli : public CliTest {
 protected:
  // Trains 4 steps with `env` set; returns the losses and the summary line.
  std::pair<std::vector<double>, nlohmann::json> Train(const std::string& name,
                                                       const std::string& env) {
    const fs::path metrics = dir_ / name;
    const CliResult r = Sluice(
        fmt::format("train --layers 1 --dim 16 --heads 2 --batch 8 --threads 1 --eval-every 0 "
                    "--quiet --steps 4 --metrics {}",
                    metrics.string()),
        env);
    EXPECT_EQ(r.status, 0) << r.err;
    std::vector<double> losses;
    nlohmann::json summary;
    for (const auto& j : Lines(metrics)) {
      if (j.contains("summary")) summary = j;
      if (j.contains("loss") && !j.contains("summary")) losses.push_back(j["loss"].get<double>());
    }
    return {losses, summary};
  }
};

TEST_F(GemmEngineCli, TheSummaryNamesTheEngineWhatChoseItAndTheEpilogue) {
  const auto [blas_losses, blas] = Train("openblas.jsonl", "");
  EXPECT_EQ(blas["kernels"]["gemm"], "openblas");
  EXPECT_EQ(blas["kernels"]["gemm_chosen_by"], "default: measured");
  EXPECT_EQ(blas["kernels"]["gemm_epilogue"], "none");
  EXPECT_EQ(blas["kernels"]["conv"], "onednn");
  EXPECT_FALSE(blas["kernels"].contains("omp_wait_policy"));

  const auto [dnn_losses, dnn] =
      Train("onednn.jsonl", "SLUICE_GEMM=onednn OMP_WAIT_POLICY=passive");
  EXPECT_EQ(dnn["kernels"]["gemm"], "onednn");
  EXPECT_EQ(dnn["kernels"]["gemm_chosen_by"], "SLUICE_GEMM");
  EXPECT_EQ(dnn["kernels"]["gemm_epilogue"], "bias");
  EXPECT_EQ(dnn["kernels"]["omp_wait_policy"], "passive");
  // Another engine sums the products in another order: the same training to float rounding.
  ASSERT_EQ(dnn_losses.size(), blas_losses.size());
  ASSERT_EQ(blas_losses.size(), 4u);
  for (size_t i = 0; i < blas_losses.size(); ++i) {
    EXPECT_NEAR(dnn_losses[i], blas_losses[i], 1e-4 * std::fabs(blas_losses[i])) << "step " << i;
  }
}

// With OMP_WAIT_POLICY unset, sluice restarts itself with passive (cli/main.cc) for the commands
// that run kernels, and only for them: the others would pay a second start-up for nothing.
TEST_F(GemmEngineCli, OnlyTheCommandsThatRunKernelsRestartWithPassiveOpenMp) {
  const std::string env = "env -u OMP_WAIT_POLICY -u SLUICE_NO_RESTART SLUICE_VERBOSE=1";
  const std::string restart = "restarting with OMP_WAIT_POLICY=passive";
  const CliResult train =
      Sluice("train --layers 1 --dim 16 --heads 2 --batch 8 --steps 1 --eval-every 0 --quiet", env);
  EXPECT_EQ(train.status, 0) << train.err;
  EXPECT_THAT(train.err, HasSubstr(restart));
  for (const std::string args : {"ops matmul", "schedule --stages 2 --microbatches 2",
                                 "plan --layers 1 --dim 16 --heads 2 --batch 8"}) {
    const CliResult r = Sluice(args, env);
    EXPECT_EQ(r.status, 0) << args << ": " << r.err;
    EXPECT_THAT(r.err, ::testing::Not(HasSubstr(restart))) << args;
  }
  // A policy the user set is kept: no restart.
  const CliResult kept = Sluice("train --layers 1 --dim 16 --heads 2 --batch 8 --steps 1 --quiet",
                                "OMP_WAIT_POLICY=active SLUICE_VERBOSE=1");
  EXPECT_EQ(kept.status, 0) << kept.err;
  EXPECT_THAT(kept.err, ::testing::Not(HasSubstr(restart)));
}

// cli/main.cc: started with OMP_WAIT_POLICY unset, the command execs itself once with it set to
// passive, so that oneDNN's products may use --threads; a policy the user set is kept, and
// SLUICE_NO_RESTART=1 runs on without the restart (oneDNN then stays on the calling thread).
TEST_F(GemmEngineCli, TheCommandRestartsWithSleepingOpenMpWorkersUnlessTheUserChose) {
  const std::string unset = "env -u OMP_WAIT_POLICY -u SLUICE_NO_RESTART SLUICE_GEMM=onednn";
  const auto [restarted_losses, restarted] = Train("restarted.jsonl", unset);
  EXPECT_EQ(restarted["kernels"]["omp_wait_policy"], "passive");
  const auto [kept_losses, kept] = Train("kept.jsonl", unset + " OMP_WAIT_POLICY=active");
  EXPECT_EQ(kept["kernels"]["omp_wait_policy"], "active");
  const auto [told_losses, told] = Train("told.jsonl", unset + " SLUICE_NO_RESTART=1");
  EXPECT_THAT(told["kernels"]["omp_wait_policy"].get<std::string>(), HasSubstr("unset"));
  // --threads 1: the wait policy changes no product, so the three runs train alike.
  EXPECT_EQ(restarted_losses, told_losses);
  EXPECT_EQ(kept_losses, told_losses);
}

TEST_F(GemmEngineCli, AnUnknownEngineIsRefusedNamingTheVariableAndTheChoices) {
  const CliResult r =
      Sluice("train --layers 1 --dim 16 --heads 2 --batch 8 --steps 1 --quiet", "SLUICE_GEMM=mkl");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("SLUICE_GEMM='mkl'"));
  EXPECT_THAT(r.err, HasSubstr("openblas or onednn"));
}

}  // namespace
}  // namespace sluice
