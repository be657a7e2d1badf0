// `sluice train --precision` as a user runs it: a bf16 run trains, resumes bitwise from its own
// checkpoint (which holds f32 weights), names its kernels in the summary, and refuses an unknown
// precision, a resume into the other precision (pointing at --init-from) and --precision for the
// MLP; `sluice plan` counts the bf16 values.
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "cli/cli_fixture.h"
#include "sluice/io/safetensors.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

class PrecisionCli : public CliTest {
 protected:
  CliResult Train(const std::string& args) { return Sluice("train " + args); }

  std::vector<double> Losses(const fs::path& p) {
    std::vector<double> l;
    for (const auto& j : Lines(p)) {
      if (j.contains("loss") && !j.contains("summary")) l.push_back(j["loss"].get<double>());
    }
    return l;
  }
};

constexpr const char* kCommon =
    "--layers 1 --dim 16 --heads 2 --batch 8 --threads 1 --eval-every 0 --quiet";

TEST_F(PrecisionCli, Bf16TrainsResumesBitwiseAndNamesItsKernels) {
  const fs::path full = dir_ / "full.jsonl", first = dir_ / "first.jsonl",
                 ckpt = dir_ / "ckpt.safetensors";
  CliResult r =
      Train(fmt::format("{} --precision bf16 --steps 4 --metrics {}", kCommon, full.string()));
  ASSERT_EQ(r.status, 0) << r.err;
  r = Train(fmt::format("{} --precision bf16 --steps 2 --metrics {} --save {}", kCommon,
                        first.string(), ckpt.string()));
  ASSERT_EQ(r.status, 0) << r.err;
  r = Train(fmt::format("{} --precision bf16 --steps 4 --metrics {} --resume {}", kCommon,
                        first.string(), ckpt.string()));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(Losses(full), Losses(first));
  const nlohmann::json summary = Lines(full).back();
  EXPECT_EQ(summary["config"]["precision"], "bf16");
  EXPECT_EQ(summary["kernels"]["gemm"], "openblas");
  EXPECT_FALSE(summary["kernels"]["bf16_gemm"].get<std::string>().empty());
  EXPECT_TRUE(summary["kernels"]["bf16_native"].is_boolean());
  // What bf16 does here: storage bf16, compute f32 unless oneDNN multiplies (SLUICE_BF16_GEMM),
  // with the CPU's flags and the measured dot-product rate (a number: 0 without AVX512_BF16).
  const nlohmann::json& bf16 = summary["kernels"]["bf16"];
  EXPECT_EQ(bf16["storage"], "bf16");
  EXPECT_EQ(
      bf16["compute"],
      summary["kernels"]["bf16_gemm"].get<std::string>().starts_with("onednn") ? "bf16" : "f32");
  EXPECT_GE(bf16["dot_vs_fma"].get<double>(), 0.0);
  EXPECT_FALSE(bf16["cpu_flags"].get<std::string>().empty());
  EXPECT_THAT(bf16["text"].get<std::string>(), HasSubstr("bf16: storage bf16, compute "));
  // The GPT goes through the autocast pass as a --program does: its summary names what ran bf16
  // (the block linears) and what ran f32 (the fused head, the residual additions).
  EXPECT_THAT(summary["precision"]["bf16_ops"], ::testing::Contains("linear"));
  EXPECT_THAT(summary["precision"]["f32_ops"], ::testing::Contains("linear_cross_entropy"));
  EXPECT_THAT(summary["precision"]["f32_ops"], ::testing::Contains("add"));
  // The checkpoint's weights are the f32 masters.
  const SafetensorsFile f = ReadSafetensors(ckpt.string());
  EXPECT_EQ(f.tensors.at("h.0.mlp.c_fc.weight").dtype(), DType::kF32);

  // fp32 of the same run differs (the products were bf16), and says fp32.
  const fs::path fp32 = dir_ / "fp32.jsonl";
  ASSERT_EQ(Train(fmt::format("{} --steps 4 --metrics {}", kCommon, fp32.string())).status, 0);
  EXPECT_NE(Losses(fp32), Losses(full));
  EXPECT_EQ(Lines(fp32).back()["config"]["precision"], "fp32");
  EXPECT_FALSE(Lines(fp32).back()["kernels"].contains("bf16_gemm"));
  EXPECT_FALSE(Lines(fp32).back()["kernels"].contains("bf16"));

  // The text says it too, after the summary line (not under --quiet, nor for fp32).
  const std::string loud =
      "--layers 1 --dim 16 --heads 2 --batch 8 --threads 1 --eval-every 0 "
      "--steps 1";
  r = Train(loud + " --precision bf16");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("bf16: storage bf16, compute "));
  EXPECT_THAT(r.err, HasSubstr("; cpu: "));
  EXPECT_THAT(r.err, HasSubstr("ops running bf16: causal_attention_qkv, gelu, layer_norm, linear; "
                               "running f32 (the fp32 fallback): "));
  r = Train(loud);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, ::testing::Not(HasSubstr("bf16: storage")));
}

// `sluice sample` decodes in the precision the checkpoint was trained in (the summary line names
// bf16), --precision overrides it, and an unknown one is refused naming the choices.
TEST_F(PrecisionCli, SampleDecodesInTheCheckpointsPrecision) {
  const fs::path ckpt = dir_ / "bf16.safetensors";
  ASSERT_EQ(
      Train(fmt::format("{} --precision bf16 --steps 2 --save {}", kCommon, ckpt.string())).status,
      0);
  const std::string sample =
      fmt::format("sample --checkpoint {} --prompt 315402 --greedy", ckpt.string());
  CliResult r = Sluice(sample);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("(sort, bf16)"));
  r = Sluice(sample + " --precision fp32");
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.err, HasSubstr("(sort)"));
  r = Sluice(sample + " --precision fp8");
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("--precision must be one of fp32, bf16, not 'fp8'"));
}

TEST_F(PrecisionCli, BadPrecisionsSayWhatToChange) {
  CliResult r = Train(fmt::format("{} --precision fp16 --steps 1", kCommon));
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("--precision must be one of fp32, bf16, not 'fp16'"));
  r = Train("--model mlp --precision bf16 --steps 1");
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("--precision"));
  // A resume continues the same run: another precision is refused, --init-from offered.
  const fs::path ckpt = dir_ / "bf16.safetensors";
  ASSERT_EQ(
      Train(fmt::format("{} --precision bf16 --steps 1 --save {}", kCommon, ckpt.string())).status,
      0);
  r = Train(fmt::format("{} --steps 2 --resume {}", kCommon, ckpt.string()));
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("--precision bf16 (this run: fp32)"));
  EXPECT_THAT(r.err, HasSubstr("--init-from"));
  r = Train(fmt::format("{} --steps 2 --init-from {}", kCommon, ckpt.string()));
  EXPECT_EQ(r.status, 0) << r.err;
}

// The forecast counts each bf16 value at two bytes: without recompute the products' saved inputs
// shrink, so where activations outweigh the weights the bf16 plan's peak is below fp32's
// (docs/benchmarks.md: both equal the measured peaks to the byte).
TEST_F(PrecisionCli, PlanCountsBf16Bytes) {
  const fs::path text = dir_ / "text.txt";
  {
    std::ofstream out(text);
    for (int i = 0; i < 400; ++i) out << "to be or not to be, that is the question. ";
  }
  // Activations large beside the weights (whose bf16 copies are saved too): T = 64, batch 16.
  const std::string model = fmt::format(
      "--layers 2 --dim 64 --heads 2 --batch 16 --seq 64 --data {} --no-recompute --format json",
      text.string());
  auto peak = [&](const std::string& precision) {
    CliResult r = Sluice(fmt::format("plan {} --precision {}", model, precision));
    EXPECT_EQ(r.status, 0) << r.err;
    return nlohmann::json::parse(r.out)["stages"][0]["predicted_peak_allocated_bytes"]
        .get<int64_t>();
  };
  const int64_t fp32 = peak("fp32"), bf16 = peak("bf16");
  EXPECT_LT(bf16, fp32);
  EXPECT_GT(bf16, fp32 / 2);
  // The text plan says what bf16 does on this CPU; fp32's does not.
  const std::string text_model = model.substr(0, model.find(" --format json"));
  CliResult r = Sluice(fmt::format("plan {} --precision bf16", text_model));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, HasSubstr("bf16: storage bf16, compute "));
  r = Sluice(fmt::format("plan {}", text_model));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_THAT(r.out, ::testing::Not(HasSubstr("bf16: storage")));
}

}  // namespace
}  // namespace sluice
