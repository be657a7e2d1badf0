// `sluice train --program FILE --precision bf16` as a user runs it: the program trains as its
// mixed-precision form (ir/autocast.h), names the ops that run f32 (the fallback) in its output and
// summary, resumes bitwise from its own checkpoint and refuses one of the other precision; `sluice
// plan` forecasts its peak to the byte; a program that already has bf16 values, and an unknown
// precision, are refused with the fix.
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli/cli_fixture.h"
#include "source_dir.h"

namespace sluice {
namespace {

using ::testing::Contains;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

std::string Example(const std::string& name) {
  return (testing_support::SourceDir() / "examples" / name).string();
}

class ProgramPrecisionCli : public CliTest {
 protected:
  std::vector<double> Losses(const fs::path& p) {
    std::vector<double> l;
    for (const auto& j : Lines(p)) {
      if (j.contains("loss") && !j.contains("summary")) l.push_back(j["loss"].get<double>());
    }
    return l;
  }
};

const std::string kProgram =
    fmt::format("--program {} --threads 1 --eval-every 0", Example("prenorm.sluice"));
const std::string kPrenorm = kProgram + " --batch 8";

TEST_F(ProgramPrecisionCli, Bf16TrainsNamesItsFallbackAndResumesBitwise) {
  const fs::path full = dir_ / "full.jsonl", first = dir_ / "first.jsonl",
                 rest = dir_ / "rest.jsonl", ckpt = dir_ / "ckpt.safetensors";
  CliResult r = Sluice(
      fmt::format("train {} --precision bf16 --steps 4 --metrics {}", kPrenorm, full.string()));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("ops running bf16: causal_attention_qkv, matmul, rms_norm; running "
                               "f32 (the fp32 fallback): add, cross_entropy, embedding, relu"));
  const nlohmann::json summary = Lines(full).back();
  EXPECT_EQ(summary["config"]["precision"], "bf16");
  EXPECT_THAT(summary["precision"]["f32_ops"], Contains("relu"));
  EXPECT_THAT(summary["precision"]["bf16_ops"], Contains("rms_norm"));
  EXPECT_THAT(summary["precision"]["bf16_ops"], Contains("matmul"));
  EXPECT_EQ(summary["kernels"]["bf16"]["storage"], "bf16");
  // Not fp32's losses: the products round their operands.
  const fs::path fp32 = dir_ / "fp32.jsonl";
  ASSERT_EQ(Sluice(fmt::format("train {} --steps 4 --metrics {}", kPrenorm, fp32.string())).status,
            0);
  EXPECT_NE(Losses(full), Losses(fp32));
  EXPECT_FALSE(Lines(fp32).back().contains("precision"));

  ASSERT_EQ(Sluice(fmt::format("train {} --precision bf16 --steps 2 --metrics {} --save {}",
                               kPrenorm, first.string(), ckpt.string()))
                .status,
            0);
  r = Sluice(fmt::format("train {} --precision bf16 --steps 4 --metrics {} --resume {}", kPrenorm,
                         rest.string(), ckpt.string()));
  ASSERT_EQ(r.status, 0) << r.err;
  std::vector<double> resumed = Losses(first);
  for (double l : Losses(rest)) resumed.push_back(l);
  EXPECT_EQ(Losses(full), resumed);
  // The checkpoint holds f32 weights: another precision continues from it as a new run only.
  r = Sluice(fmt::format("train {} --steps 4 --resume {}", kPrenorm, ckpt.string()));
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("--precision bf16 (this run: fp32)"));
  EXPECT_THAT(r.err, HasSubstr("--init-from"));
  r = Sluice(fmt::format("train {} --steps 1 --init-from {}", kPrenorm, ckpt.string()));
  EXPECT_EQ(r.status, 0) << r.err;
}

// The plan of the bf16 program is the measured peak to the byte, and prints the fallback.
TEST_F(ProgramPrecisionCli, PlanForecastsTheBf16PeakExactly) {
  for (const char* extra : {"--recompute none", "--recompute cheap"}) {
    const std::string job =
        fmt::format("{} --batch 16 --microbatches 2 --precision bf16 {}", kProgram, extra);
    CliResult p = Sluice(fmt::format("plan {} --format json", job));
    ASSERT_EQ(p.status, 0) << p.err;
    const nlohmann::json plan = nlohmann::json::parse(p.out);
    const fs::path metrics = dir_ / "m.jsonl";
    CliResult t = Sluice(fmt::format("train {} --steps 2 --metrics {}", job, metrics.string()));
    ASSERT_EQ(t.status, 0) << t.err;
    const nlohmann::json summary = Lines(metrics).back();
    ASSERT_EQ(plan["stages"].size(), 1u);
    EXPECT_EQ(plan["stages"][0]["predicted_peak_allocated_bytes"].get<int64_t>(),
              summary["peak_allocated_bytes"].get<int64_t>())
        << extra;
    fs::remove(metrics);
  }
  CliResult r = Sluice(fmt::format("plan {} --precision bf16", kPrenorm));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("running f32 (the fp32 fallback): add, cross_entropy"));
  // bf16 stores the activations at two bytes: below fp32's peak.
  auto peak = [&](const std::string& precision) {
    CliResult q = Sluice(fmt::format(
        "plan {} --batch 32 --no-recompute --precision {} --format json", kProgram, precision));
    EXPECT_EQ(q.status, 0) << q.err;
    return nlohmann::json::parse(q.out)["stages"][0]["predicted_peak_allocated_bytes"]
        .get<int64_t>();
  };
  EXPECT_LT(peak("bf16"), peak("fp32"));
}

// A program holding bf16 sets its own precision; fp16 is no precision sluice trains in.
TEST_F(ProgramPrecisionCli, BadInputSaysWhatToChange) {
  const fs::path program = dir_ / "cast.sluice";
  std::ofstream(program) << R"(program cast {
  input %x: f32[B, 16]
  input %labels: i64[B]
  param %fc.weight: f32[16, 4] = normal(0, 0.1)
  %x.half: bf16[B, 16] = cast(%x) {dtype = "bf16"}
  %w.half: bf16[16, 4] = cast(%fc.weight) {dtype = "bf16"}
  %logits: f32[B, 4] = matmul(%x.half, %w.half)
  %loss: f32[] = cross_entropy(%logits, %labels)
  output %loss
}
)";
  CliResult r = Sluice(
      fmt::format("train --program {} --precision bf16 --steps 1 --quiet", program.string()));
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("already has the bf16 value %x.half"));
  EXPECT_THAT(r.err, HasSubstr("without --precision bf16"));
  // As written, it trains.
  r = Sluice(fmt::format("train --program {} --steps 1 --quiet", program.string()));
  EXPECT_EQ(r.status, 0) << r.err;
  r = Sluice(fmt::format("train {} --precision fp16 --steps 1", kPrenorm));
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("--precision must be one of fp32, bf16, not 'fp16'"));
  r = Sluice(fmt::format("plan {} --precision fp16", kPrenorm));
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("--precision must be one of fp32, bf16, not 'fp16'"));
}

// simulate takes --precision for a program too.
TEST_F(ProgramPrecisionCli, SimulateTakesBf16) {
  CliResult r = Sluice(fmt::format("simulate {} --stages 2 --precision bf16", kPrenorm));
  EXPECT_EQ(r.status, 0) << r.err;
}

}  // namespace
}  // namespace sluice
