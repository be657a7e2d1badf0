// `sluice plan --explain` from the library: the tensors a plan lists at each stage's peak are
// exactly what the peak holds — their bytes add up to the predicted peak, and by use to its
// breakdown — for one stage and a 4-stage 1F1B pipeline, of the GPT and of --program examples;
// each says why it is alive (the micro-batch a saved activation waits for) and what made it.
// Explaining changes no forecast.
#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "sluice/plan/planner.h"
#include "source_dir.h"

namespace sluice {
namespace {

TrainConfig Gpt(int64_t microbatches) {
  TrainConfig c;
  c.gpt = {.vocab = 0, .seq = 0, .layers = 4, .heads = 2, .dim = 32};
  c.steps = 2;
  c.batch = 2 * microbatches;
  c.microbatches = microbatches;
  c.threads = 1;
  c.eval_every = 0;
  return c;
}

TrainConfig Program(const char* example, int64_t microbatches) {
  TrainConfig c = Gpt(microbatches);
  c.gpt = {};
  c.model = "program";
  c.program = (testing_support::SourceDir() / "examples" / example).string();
  return c;
}

PlanRequest OneStage(TrainConfig config) { return {.config = std::move(config)}; }

PlanRequest FourStages(TrainConfig config) {
  return {.config = std::move(config),
          .pipeline = true,
          .pipe = {.stages = 4,
                   .schedule = pipeline::ScheduleKind::kOneFOneB,
                   .partition = pipeline::PartitionKind::kBalanced}};
}

// The explained plan of `request`, after checking that explaining changed no forecast.
PlanChoice Explained(PlanRequest request) {
  const PlanChoice plain = ChoosePlan(request);
  request.explain = true;
  PlanChoice explained = ChoosePlan(request);
  EXPECT_EQ(plain.plan.stages.size(), explained.plan.stages.size());
  for (size_t s = 0; s < plain.plan.stages.size(); ++s) {
    const StageMemoryForecast& a = plain.plan.stages[s].forecast;
    const StageMemoryForecast& b = explained.plan.stages[s].forecast;
    EXPECT_EQ(a.peak_allocated_bytes, b.peak_allocated_bytes) << "stage " << s;
    EXPECT_EQ(a.at_peak.bytes, b.at_peak.bytes) << "stage " << s;
    EXPECT_TRUE(a.live_at_peak.empty()) << "only an explained plan lists tensors";
  }
  return explained;
}

// What every explained stage must satisfy; `label` names the case in failures.
void ExpectExactList(const StageMemoryForecast& f, const std::string& label) {
  ASSERT_FALSE(f.live_at_peak.empty()) << label;
  int64_t sum = 0;
  MemoryBreakdown by_use;
  std::set<std::string> parameters;
  for (const LiveTensor& t : f.live_at_peak) {
    sum += t.bytes;
    by_use.bytes[static_cast<size_t>(t.use)] += t.bytes;
    EXPECT_FALSE(t.name.empty()) << label << ": a tensor of " << t.bytes << " B without a name";
    EXPECT_FALSE(t.made_by.empty()) << label << ": " << t.name;
    if (t.reason == LiveReason::kParameter) parameters.insert(t.name);
    if (t.reason == LiveReason::kSavedForBackward) {
      EXPECT_EQ(t.use, MemoryUse::kActivations) << label << ": " << t.name;
      EXPECT_GE(t.micro_batch, 0) << label << ": " << t.name << " saved for no micro-batch";
    }
  }
  EXPECT_EQ(sum, f.peak_allocated_bytes) << label;
  EXPECT_EQ(by_use.bytes, f.at_peak.bytes) << label;
  EXPECT_TRUE(
      std::is_sorted(f.live_at_peak.begin(), f.live_at_peak.end(),
                     [](const LiveTensor& a, const LiveTensor& b) { return a.bytes > b.bytes; }))
      << label << ": largest first";
  EXPECT_FALSE(parameters.empty()) << label << ": every stage holds parameters";
}

TEST(Explain, OneStageGptListsExactlyThePeak) {
  const PlanChoice c = Explained(OneStage(Gpt(2)));
  ASSERT_EQ(c.plan.stages.size(), 1u);
  const StageMemoryForecast& f = c.plan.stages[0].forecast;
  ExpectExactList(f, "one stage");
  // Every parameter of the model is live (the GPT's: tok, pos, 4 blocks, the final norm).
  int64_t parameters = 0, gradients = 0;
  for (const LiveTensor& t : f.live_at_peak) {
    parameters += t.reason == LiveReason::kParameter;
    gradients += t.reason == LiveReason::kGradient;
  }
  EXPECT_GT(parameters, 4 * 4) << "at least four per block";
  EXPECT_EQ(f.at_peak[MemoryUse::kGradients] > 0, gradients > 0);
}

TEST(Explain, FourStageOneFOneBGptListsExactlyEachPeak) {
  const PlanChoice c = Explained(FourStages(Gpt(8)));
  ASSERT_EQ(c.plan.stages.size(), 4u);
  for (size_t s = 0; s < 4; ++s) {
    const StageMemoryForecast& f = c.plan.stages[s].forecast;
    ExpectExactList(f, fmt::format("stage {}", s));
  }
  // Stage 0 under 1F1B holds forwards of several micro-batches at once, waiting for their
  // backward: saved activations of more than one micro-batch, each read again by a backward.
  std::set<int> waiting;
  for (const LiveTensor& t : c.plan.stages[0].forecast.live_at_peak) {
    if (t.reason != LiveReason::kSavedForBackward) continue;
    waiting.insert(t.micro_batch);
    EXPECT_NE(t.next_read_in.find("B of micro-batch " + std::to_string(t.micro_batch)),
              std::string::npos)
        << t.name << " read next in " << t.next_read_in;
  }
  EXPECT_GT(waiting.size(), 1u);
  // The middle stages receive from their neighbours: messages are part of what they hold.
  bool messages = false;
  for (const LiveTensor& t : c.plan.stages[1].forecast.live_at_peak) {
    messages = messages || t.use == MemoryUse::kMessages;
  }
  EXPECT_EQ(messages, c.plan.stages[1].forecast.at_peak[MemoryUse::kMessages] > 0);
}

TEST(Explain, ProgramExamplesListExactlyTheirPeaks) {
  {
    const PlanChoice c = Explained(OneStage(Program("prenorm.sluice", 2)));
    ExpectExactList(c.plan.stages.at(0).forecast, "prenorm.sluice, one stage");
  }
  // tied_lm: the head reads the embedding's weight, so its stages exchange gradient shares.
  const PlanChoice c = Explained(FourStages(Program("tied_lm.sluice", 8)));
  ASSERT_EQ(c.plan.stages.size(), 4u);
  for (size_t s = 0; s < 4; ++s) {
    ExpectExactList(c.plan.stages[s].forecast, fmt::format("tied_lm.sluice, stage {}", s));
  }
}

// --recompute sublayer: the lists still add up to each peak, for the GPT and a program of its own
// units, on one stage and four; and one stage peaks lower than under full, holding no recomputed
// attention value while its MLP back-propagates.
TEST(Explain, SublayerRecomputeListsExactlyEachPeak) {
  auto with = [](PlanRequest r, RecomputePolicy policy) {
    r.config.recompute = {policy};
    return r;
  };
  // The recomputed packed q|k|v of an attention held at the peak: made by a backward's linear
  // that reads a c_attn weight.
  auto qkv_held = [](const StageMemoryForecast& f) {
    return std::count_if(f.live_at_peak.begin(), f.live_at_peak.end(), [](const LiveTensor& t) {
      return t.made_by.find("backward") != std::string::npos &&
             t.made_by.find("= linear(") != std::string::npos &&
             t.made_by.find("attn.c_attn.weight") != std::string::npos;
    });
  };
  const PlanChoice full = Explained(with(OneStage(Gpt(2)), RecomputePolicy::kFull));
  const PlanChoice one = Explained(with(OneStage(Gpt(2)), RecomputePolicy::kSublayer));
  const StageMemoryForecast& f = one.plan.stages.at(0).forecast;
  ExpectExactList(f, "sublayer, one stage");
  EXPECT_LT(f.peak_allocated_bytes, full.plan.stages.at(0).forecast.peak_allocated_bytes);
  EXPECT_EQ(qkv_held(full.plan.stages.at(0).forecast), 1) << "full holds the whole block";
  EXPECT_EQ(qkv_held(f), 0) << "sublayer holds one sub-layer at " << f.peak_instruction;
  const PlanChoice four = Explained(with(FourStages(Gpt(8)), RecomputePolicy::kSublayer));
  for (size_t s = 0; s < 4; ++s) {
    ExpectExactList(four.plan.stages[s].forecast, fmt::format("sublayer, stage {}", s));
  }
  const PlanChoice prenorm =
      Explained(with(OneStage(Program("prenorm.sluice", 2)), RecomputePolicy::kSublayer));
  ExpectExactList(prenorm.plan.stages.at(0).forecast, "sublayer, prenorm.sluice");
}

// A budget: the stages are explained under the policies the plan chose.
TEST(Explain, ABudgetedPlanIsExplainedUnderItsChosenPolicies) {
  PlanRequest r = FourStages(Gpt(8));
  const PlanChoice free = ChoosePlan(r);
  int64_t largest = 0;
  for (const StagePlan& p : free.plan.stages) {
    largest = std::max(largest, p.forecast.peak_reserved_bytes);
  }
  // 0.85x: on this small model a stage's pages (a page span per sub-page tensor) leave no policy
  // under 0.80x.
  r.budget.assign(4, largest * 17 / 20);
  r.budget_text = std::to_string(largest * 17 / 20);
  const PlanChoice c = Explained(r);
  for (size_t s = 0; s < 4; ++s) {
    ExpectExactList(c.plan.stages[s].forecast, fmt::format("budgeted stage {}", s));
  }
}

}  // namespace
}  // namespace sluice
