// Memory budgets: sizes are parsed strictly (units, lists, refusals with the allowed forms), and
// the plan gives each stage the least-work recompute policy whose forecast fits its budget.
#include "sluice/step/memory_budget.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "sluice/core/error.h"

namespace sluice {
namespace {

TEST(MemoryBudget, SizesWithUnits) {
  EXPECT_EQ(ParseByteSize("1048576"), 1048576);
  EXPECT_EQ(ParseByteSize("6MiB"), 6 * 1024 * 1024);
  EXPECT_EQ(ParseByteSize("6mib"), 6 * 1024 * 1024);
  EXPECT_EQ(ParseByteSize("1.5GB"), 1500000000);
  EXPECT_EQ(ParseByteSize("1KiB"), 1024);
  EXPECT_EQ(ParseByteSize("2 kB"), 2000);
  EXPECT_EQ(ParseByteSize("512B"), 512);
}

TEST(MemoryBudget, WrongSizesNameTheOptionAndTheForms) {
  const std::pair<const char*, const char*> cases[] = {
      {"6MB/s", "unknown unit 'MB/s'"}, {"-1", "not positive"},      {"0", "not positive"},
      {"0.1", "not positive"},          {"nan", "not a number"},     {"", "empty"},
      {"1e999", "unknown unit 'e999'"}, {"99999999TB", "too large"},
  };
  for (const auto& [text, why] : cases) {
    try {
      ParseByteSize(text);
      ADD_FAILURE() << "'" << text << "' was accepted";
    } catch (const InvalidArgument& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(fmt::format("--memory-budget '{}'", text)), std::string::npos)
          << message;
      EXPECT_NE(message.find(why), std::string::npos) << message;
      EXPECT_NE(message.find("such as 6MiB"), std::string::npos) << message;
    }
  }
}

TEST(MemoryBudget, OneSizeOrOnePerStage) {
  EXPECT_EQ(ParseMemoryBudget("1KiB", 3), (std::vector<int64_t>{1024, 1024, 1024}));
  EXPECT_EQ(ParseMemoryBudget("1KiB,2KiB,3KiB", 3), (std::vector<int64_t>{1024, 2048, 3072}));
  EXPECT_THROW(ParseMemoryBudget("1KiB,2KiB", 3), InvalidArgument);
  EXPECT_THROW(ParseMemoryBudget("1KiB,", 2), InvalidArgument);
}

TEST(MemoryBudget, SpacesAroundASizeAreNotPartOfIt) {
  EXPECT_EQ(ParseByteSize(" 5MiB "), 5 * 1024 * 1024);
  EXPECT_EQ(ParseByteSize("\t5 MiB"), 5 * 1024 * 1024);
  EXPECT_EQ(ParseMemoryBudget("1KiB, 2KiB , 3KiB", 3), (std::vector<int64_t>{1024, 2048, 3072}));
  try {
    ParseByteSize(" ");
    ADD_FAILURE() << "' ' was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--memory-budget ' ': empty"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(ParseByteSize("5 M iB"), InvalidArgument);
}

// A forecaster of two stages whose peaks and work depend on the policy as recompute's do: less
// memory for more work.
std::vector<StageMemoryForecast> Fake(const TrainConfig& config) {
  const RecomputePolicy p = config.recompute.at(0);
  const int64_t level = static_cast<int64_t>(p == RecomputePolicy::kNone        ? 0
                                             : p == RecomputePolicy::kCheap     ? 1
                                             : p == RecomputePolicy::kSelective ? 2
                                                                                : 3);
  std::vector<StageMemoryForecast> out(2);
  for (int s = 0; s < 2; ++s) {
    out[s].stage = s;
    out[s].peak_allocated_bytes = (s == 0 ? 1000 : 600) - 100 * level;
    out[s].peak_reserved_bytes = out[s].peak_allocated_bytes;  // what the budget bounds
    out[s].at_peak.bytes[static_cast<size_t>(MemoryUse::kActivations)] =
        out[s].peak_allocated_bytes;
    out[s].work = 100 + 10 * static_cast<double>(level);
  }
  return out;
}

TEST(MemoryBudget, EachStageTakesTheLeastWorkThatFits) {
  const MemoryPlan plan = PlanForBudget(TrainConfig{}, {750, 750}, Fake);
  ASSERT_TRUE(plan.fits);
  EXPECT_EQ(plan.stages[0].policy, RecomputePolicy::kFull);  // 700 ≤ 750; selective is 800
  EXPECT_EQ(plan.stages[1].policy, RecomputePolicy::kNone);  // 600 fits without recompute
  EXPECT_NEAR(plan.stages[0].extra_work, 0.3, 1e-12);
  EXPECT_EQ(plan.Policies(),
            (std::vector<RecomputePolicy>{RecomputePolicy::kFull, RecomputePolicy::kNone}));
}

TEST(MemoryBudget, NothingFitsNamesTheSmallestPeak) {
  const std::vector<int64_t> budget = {650, 1000};
  const MemoryPlan plan = PlanForBudget(TrainConfig{}, budget, Fake);
  EXPECT_FALSE(plan.fits);
  const std::string why = plan.Explain(budget);
  EXPECT_NE(why.find("stage 0: budget 650 B"), std::string::npos) << why;
  EXPECT_NE(why.find("smallest achievable peak 700 B"), std::string::npos) << why;
  EXPECT_NE(why.find("--recompute full"), std::string::npos) << why;
  EXPECT_NE(why.find("activations"), std::string::npos) << why;
  EXPECT_EQ(why.find("stage 1"), std::string::npos) << why;  // stage 1 fits
}

}  // namespace
}  // namespace sluice
