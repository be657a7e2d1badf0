// Partitioning the GPT into virtual stages: uniform and balanced splits for a few sizes, balanced
// checked against every possible cut (per stage, and per rank for the V-shaped placement), the
// layout text round trip, and every layout error.
#include "sluice/pipeline/partition.h"

#include <algorithm>
#include <bit>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "sluice/core/error.h"
#include "source_dir.h"

namespace sluice::pipeline {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// C = 64, T = 16: a block costs 24·C² + 4·T·C = 102400 FLOPs per token, embed C = 64,
// head 2·C·vocab.
GptConfig Config(int64_t layers, int64_t vocab) {
  return {.vocab = vocab, .seq = 16, .layers = layers, .heads = 4, .dim = 64};
}
constexpr int64_t kB = 2, kT = 16;

std::string Layout(const GptConfig& cfg, int S, PartitionKind kind) {
  return FormatLayout(PartitionGpt(cfg, kB, kT, S, kind));
}

double MaxCost(const GptPartition& p, const GptConfig& cfg) {
  const std::vector<double> costs = EstimateStageCosts(p, cfg, kB, kT);
  return *std::max_element(costs.begin(), costs.end());
}

// Embed first, head last, every block once and in order, no stage empty.
void ExpectWellFormed(const GptPartition& p, const GptConfig& cfg, int S) {
  ASSERT_EQ(static_cast<int>(p.stages.size()), S);
  int64_t next = 0;
  for (int s = 0; s < S; ++s) {
    const GptSlice& g = p.stages[static_cast<size_t>(s)];
    EXPECT_EQ(g.embed, s == 0) << s;
    EXPECT_EQ(g.head, s == S - 1) << s;
    EXPECT_EQ(g.first_layer, next) << s;
    EXPECT_GE(g.end_layer, g.first_layer) << s;
    EXPECT_TRUE(g.embed || g.head || g.end_layer > g.first_layer) << s;
    next = g.end_layer;
  }
  EXPECT_EQ(next, cfg.layers);
}

// The least possible maximum stage cost, trying every way to cut embed, h.0 … h.L−1, head into S
// contiguous non-empty groups.
double BruteForceBest(const GptConfig& cfg, int S) {
  const int64_t N = cfg.layers + 2;
  double best = 1e300;
  for (uint32_t cuts = 0; cuts < (1u << (N - 1)); ++cuts) {  // bit u: a stage ends after unit u
    if (std::popcount(cuts) != S - 1) continue;
    GptPartition p;
    int64_t first = 0;
    for (int64_t u = 0; u < N; ++u) {
      if (u == N - 1 || (cuts >> u & 1u)) {
        p.stages.push_back({.embed = first == 0,
                            .first_layer = std::max<int64_t>(first, 1) - 1,
                            .end_layer = std::min<int64_t>(u + 1, cfg.layers + 1) - 1,
                            .head = u == N - 1});
        first = u + 1;
      }
    }
    best = std::min(best, MaxCost(p, cfg));
  }
  return best;
}

TEST(Partition, KindNamesRoundTripAndOthersAreRefused) {
  EXPECT_EQ(Name(PartitionKind::kBalanced), "balanced");
  for (PartitionKind k : {PartitionKind::kUniform, PartitionKind::kBalanced}) {
    EXPECT_EQ(ParsePartitionKind(Name(k)), k);
  }
  EXPECT_EQ(ParsePartitionKind("greedy"), std::nullopt);
  EXPECT_EQ(EnumNames(kPartitionKindNames, " or "), "uniform or balanced");
}

TEST(Partition, UniformGivesTheRemainderToMiddleStagesThenStageZero) {
  const int64_t vocab = 50;
  EXPECT_EQ(Layout(Config(4, vocab), 1, PartitionKind::kUniform), "embed,h.0-3,head");
  EXPECT_EQ(Layout(Config(4, vocab), 2, PartitionKind::kUniform), "embed,h.0-1|h.2-3,head");
  EXPECT_EQ(Layout(Config(3, vocab), 2, PartitionKind::kUniform), "embed,h.0-1|h.2,head");
  EXPECT_EQ(Layout(Config(6, vocab), 4, PartitionKind::kUniform), "embed,h.0|h.1-2|h.3-4|h.5,head");
  EXPECT_EQ(Layout(Config(7, vocab), 4, PartitionKind::kUniform),
            "embed,h.0-1|h.2-3|h.4-5|h.6,head");
  EXPECT_EQ(Layout(Config(4, vocab), 4, PartitionKind::kUniform), "embed,h.0|h.1|h.2|h.3,head");
}

TEST(Partition, UniformWithFewerLayersThanStagesSuggestsBalancedOrLayout) {
  try {
    PartitionGpt(Config(2, 50), kB, kT, 4, PartitionKind::kUniform);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("the model has 2 layers for 4 virtual stages"));
    EXPECT_THAT(e.what(), HasSubstr("use --partition balanced"));
    EXPECT_THAT(e.what(), HasSubstr("--layout"));
  }
}

TEST(Partition, CostsFollowTheDocumentedFormulas) {
  const GptConfig cfg = Config(6, 1600);  // head = 2·64·1600 = 204800 per token: two blocks
  const GptCosts c = EstimateGptCosts(cfg, kB, kT);
  EXPECT_EQ(c.embed, 2.0 * 16 * 64);
  EXPECT_EQ(c.block, 24.0 * 2 * 16 * 64 * 64 + 4.0 * 2 * 16 * 16 * 64);
  EXPECT_EQ(c.head, 2.0 * 2 * 16 * 64 * 1600);
  const GptPartition p = ParseGptLayout("embed,h.0-1|h.2-3|h.4-5|head", cfg, 4);
  EXPECT_THAT(EstimateStageCosts(p, cfg, kB, kT),
              ElementsAre(c.embed + 2 * c.block, 2 * c.block, 2 * c.block, c.head));
}

TEST(Partition, BalancedGivesAnExpensiveHeadItsOwnStage) {
  const GptConfig cfg = Config(6, 1600);  // head = two blocks
  EXPECT_EQ(Layout(cfg, 4, PartitionKind::kBalanced), "embed,h.0-1|h.2-3|h.4-5|head");
  // Uniform leaves the head with a block: 3 blocks' worth on the last stage against 2 + embed.
  const GptPartition uniform = PartitionGpt(cfg, kB, kT, 4, PartitionKind::kUniform);
  const GptPartition balanced = PartitionGpt(cfg, kB, kT, 4, PartitionKind::kBalanced);
  EXPECT_LT(MaxCost(balanced, cfg), MaxCost(uniform, cfg));
}

TEST(Partition, BalancedTiesLeaveEarlierStagesTheFewestUnits) {
  // The head costs ten blocks and decides the optimum; the rest may go anywhere below it, and
  // the earlier stages (most micro-batches in flight) take as little as they can.
  EXPECT_EQ(Layout(Config(5, 8000), 3, PartitionKind::kBalanced), "embed|h.0-4|head");
}

TEST(Partition, BalancedGivesEveryUnitAStageWhenThereAreLPlusTwo) {
  EXPECT_EQ(Layout(Config(4, 50), 6, PartitionKind::kBalanced), "embed|h.0|h.1|h.2|h.3|head");
  try {
    PartitionGpt(Config(4, 50), kB, kT, 7, PartitionKind::kBalanced);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(),
                HasSubstr("7 virtual stages (--stages × --chunks) exceed the model's 6 units "
                          "(embed, 4 layers, head)"));
  }
}

TEST(Partition, BalancedIsOptimalAndNeverWorseThanUniform) {
  for (int64_t L = 1; L <= 7; ++L) {
    for (int64_t vocab : {2, 800, 1600, 8000}) {
      const GptConfig cfg = Config(L, vocab);
      for (int S = 1; S <= L + 2; ++S) {
        SCOPED_TRACE(testing::Message() << "L " << L << " vocab " << vocab << " S " << S);
        const GptPartition balanced = PartitionGpt(cfg, kB, kT, S, PartitionKind::kBalanced);
        ExpectWellFormed(balanced, cfg, S);
        EXPECT_EQ(MaxCost(balanced, cfg), BruteForceBest(cfg, S));
        if (S <= L) {
          const GptPartition uniform = PartitionGpt(cfg, kB, kT, S, PartitionKind::kUniform);
          ExpectWellFormed(uniform, cfg, S);
          EXPECT_LE(MaxCost(balanced, cfg), MaxCost(uniform, cfg));
        }
      }
    }
  }
}

TEST(Partition, LayoutParsesToSlicesAndFormatsBack) {
  const GptConfig cfg = Config(4, 50);
  const GptPartition p = ParseGptLayout(" embed , h.0-1 | h.2 | h.3,head ", cfg, 3);
  EXPECT_THAT(
      p.stages,
      ElementsAre(GptSlice{.embed = true, .first_layer = 0, .end_layer = 2, .head = false},
                  GptSlice{.embed = false, .first_layer = 2, .end_layer = 3, .head = false},
                  GptSlice{.embed = false, .first_layer = 3, .end_layer = 4, .head = true}));
  EXPECT_EQ(FormatLayout(p), "embed,h.0-1|h.2|h.3,head");
  // Embed or head alone is a stage; a stage without blocks sits where its blocks would be.
  const GptPartition ends = ParseGptLayout("embed|h.0,h.1-3|head", cfg, 3);
  EXPECT_THAT(
      ends.stages,
      ElementsAre(GptSlice{.embed = true, .first_layer = 0, .end_layer = 0, .head = false},
                  GptSlice{.embed = false, .first_layer = 0, .end_layer = 4, .head = false},
                  GptSlice{.embed = false, .first_layer = 4, .end_layer = 4, .head = true}));
  EXPECT_EQ(FormatLayout(ends), "embed|h.0-3|head");
}

TEST(Partition, EveryPartitionSurvivesTheLayoutRoundTrip) {
  for (int64_t L = 1; L <= 6; ++L) {
    const GptConfig cfg = Config(L, 1600);
    for (int S = 1; S <= L + 2; ++S) {
      std::vector<GptPartition> all = {PartitionGpt(cfg, kB, kT, S, PartitionKind::kBalanced)};
      if (S <= L) all.push_back(PartitionGpt(cfg, kB, kT, S, PartitionKind::kUniform));
      for (const GptPartition& p : all) {
        EXPECT_EQ(ParseGptLayout(FormatLayout(p), cfg, S), p) << FormatLayout(p);
      }
    }
  }
}

std::string LayoutError(std::string_view layout, int S, int64_t layers = 4) {
  try {
    ParseGptLayout(layout, Config(layers, 50), S);
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "no error";
}

TEST(Partition, LayoutErrorsNameTheStageAndTheItem) {
  EXPECT_EQ(LayoutError("embed,h.0-1|h.2-3,tail", 2),
            "--layout stage 1: 'tail' is not an item: expected embed, head, h.i or h.i-j");
  EXPECT_EQ(LayoutError("embed,h.x|h.0-3,head", 2),
            "--layout stage 0: 'h.x' is not an item: expected embed, head, h.i or h.i-j");
  EXPECT_EQ(LayoutError("embed,h.0-1|h.2-4,head", 2),
            "--layout stage 1: 'h.2-4' is out of range: the model has layers h.0-3 (--layers 4)");
  EXPECT_EQ(LayoutError("embed,h.0-2|h.2-3,head", 2),
            "--layout: h.2 is duplicated: in stage 0 ('h.0-2') and stage 1 ('h.2-3')");
  EXPECT_EQ(LayoutError("embed,h.0|h.2-3,head", 2),
            "--layout: h.1 is in no stage (dropped): every layer, embed and head must be placed");
  EXPECT_EQ(LayoutError("h.0-1|h.2-3,head", 2),
            "--layout: embed is in no stage (dropped): every layer, embed and head must be placed");
  EXPECT_EQ(LayoutError("embed,h.0-1||h.2-3,head", 3),
            "--layout stage 1 is empty: every stage needs embed, head or a layer");
  EXPECT_EQ(LayoutError("embed,h.0-3,head|", 2),
            "--layout stage 1 is empty: every stage needs embed, head or a layer");
  EXPECT_EQ(LayoutError("embed,,h.0-3,head", 1), "--layout stage 0: an empty item (two commas?)");
  EXPECT_EQ(LayoutError("embed,h.2-3|h.0-1,head", 2),
            "--layout stage 0: 'h.2-3' is out of order: h.0 comes next in the model");
  EXPECT_EQ(LayoutError("embed,h.3-2|h.0-1,head", 2),
            "--layout stage 0: 'h.3-2' runs backwards: layers are out of order (write h.2-3)");
  EXPECT_EQ(LayoutError("h.0,embed,h.1|h.2-3,head", 2),
            "--layout stage 0: embed must come first, at the start of stage 0");
  EXPECT_EQ(LayoutError("embed,h.0-1|head,h.2-3", 2),
            "--layout stage 1: head must come last, at the end of stage 1");
  EXPECT_EQ(LayoutError("embed,h.0-1,head|h.2-3", 2),
            "--layout stage 0: head must come last, at the end of stage 1");
  EXPECT_EQ(LayoutError("embed,h.0-1|h.2-3,head", 4),
            "--layout has 2 stages, but --stages × --chunks asks for 4 virtual stages ('|' "
            "separates stages, ',' the items of one)");
  EXPECT_EQ(LayoutError("embed,h.0-3,head", 2),
            "--layout has 1 stage, but --stages × --chunks asks for 2 virtual stages ('|' "
            "separates stages, ',' the items of one)");
}

// The most expensive rank of a V-shaped placement: rank r runs virtual stages r and S − 1 − r.
double MaxRankCostV(const GptPartition& p, const GptConfig& cfg) {
  const std::vector<double> costs = EstimateStageCosts(p, cfg, kB, kT);
  const size_t S = costs.size();
  double most = 0;
  for (size_t r = 0; r < S / 2; ++r) most = std::max(most, costs[r] + costs[S - 1 - r]);
  return most;
}

// The least possible most expensive rank over every cut into S groups, placed V-shaped.
double BruteForceBestV(const GptConfig& cfg, int S) {
  const int64_t N = cfg.layers + 2;
  double best = 1e300;
  for (uint32_t cuts = 0; cuts < (1u << (N - 1)); ++cuts) {
    if (std::popcount(cuts) != S - 1) continue;
    GptPartition p;
    int64_t first = 0;
    for (int64_t u = 0; u < N; ++u) {
      if (u + 1 < N && !(cuts & (1u << u))) continue;
      p.stages.push_back({.embed = first == 0,
                          .first_layer = std::max<int64_t>(first, 1) - 1,
                          .end_layer = std::min<int64_t>(u + 1, cfg.layers + 1) - 1,
                          .head = u + 1 == N});
      first = u + 1;
    }
    best = std::min(best, MaxRankCostV(p, cfg));
  }
  return best;
}

TEST(Partition, BalancedVShapeEvensOutTheRanksAndIsOptimal) {
  // Rank 0 runs the first and the last virtual stage: embed and head. The cut balances the ranks'
  // sums, not the stages, and no cut does better.
  for (int64_t L = 2; L <= 8; ++L) {
    for (int64_t vocab : {2, 800, 1600, 8000}) {
      const GptConfig cfg = Config(L, vocab);
      for (int S = 2; S <= L + 2; S += 2) {
        SCOPED_TRACE(testing::Message() << "L " << L << " vocab " << vocab << " S " << S);
        const GptPartition v =
            PartitionGpt(cfg, kB, kT, S, PartitionKind::kBalanced, Placement::kVShape);
        ExpectWellFormed(v, cfg, S);
        EXPECT_EQ(MaxRankCostV(v, cfg), BruteForceBestV(cfg, S));
        EXPECT_EQ(ParseGptLayout(FormatLayout(v), cfg, S, Placement::kVShape), v);
      }
    }
  }
}

// The least possible most expensive rank, V-shaped, by the direct dynamic program over every
// rank's pair of groups (O(P·N⁴)): best(k, i, j) for ranks k … P − 1 on units [i, j).
double DirectBestV(const GptConfig& cfg, int S) {
  const GptCosts g = EstimateGptCosts(cfg, kB, kT);
  std::vector<double> units(static_cast<size_t>(cfg.layers) + 2, g.block);
  units.front() = g.embed;
  units.back() = g.head;
  const int64_t N = static_cast<int64_t>(units.size());
  const int P = S / 2;
  auto cost = [&](int64_t i, int64_t j) {
    double c = 0;
    for (int64_t u = i; u < j; ++u) c += units[u];
    return c;
  };
  const double inf = std::numeric_limits<double>::infinity();
  std::vector<std::vector<std::vector<double>>> best(
      P + 1, std::vector<std::vector<double>>(N + 1, std::vector<double>(N + 1, inf)));
  for (int64_t i = 0; i <= N; ++i) best[P][i][i] = 0;
  for (int k = P - 1; k >= 0; --k) {
    for (int64_t i = 0; i <= N; ++i) {
      for (int64_t j = i + 2; j <= N; ++j) {
        for (int64_t a = i + 1; a < j; ++a) {
          for (int64_t e = a; e < j; ++e) {
            best[k][i][j] =
                std::min(best[k][i][j], std::max(cost(i, a) + cost(e, j), best[k + 1][a][e]));
          }
        }
      }
    }
  }
  return best[0][0][N];
}

TEST(Partition, BalancedVShapeIsOptimalBeyondBruteForce) {
  // Models too deep to try every cut: the bisection over bounds finds the direct program's
  // optimum, and the cut is one of the model's.
  for (int64_t L : {14, 22, 30}) {
    for (int64_t vocab : {2, 1600, 8000}) {
      const GptConfig cfg = Config(L, vocab);
      for (int S : {2, 6, 10, 16}) {
        SCOPED_TRACE(testing::Message() << "L " << L << " vocab " << vocab << " S " << S);
        const GptPartition v =
            PartitionGpt(cfg, kB, kT, S, PartitionKind::kBalanced, Placement::kVShape);
        ExpectWellFormed(v, cfg, S);
        EXPECT_EQ(MaxRankCostV(v, cfg), DirectBestV(cfg, S));
      }
    }
  }
}

TEST(Partition, BalancedVShapeBeatsBalancingTheStages) {
  // 4 layers and a head worth 2 blocks, P = 2: balancing the stages gives embed|h.0-1|h.2-3|head,
  // which leaves rank 1 four blocks (h.0-1 and h.2-3) against rank 0's embed and head; balancing
  // the ranks gets every rank down to about 3.
  const GptConfig cfg = Config(4, 1600);
  const GptPartition looped = PartitionGpt(cfg, kB, kT, 4, PartitionKind::kBalanced);
  EXPECT_EQ(FormatLayout(looped), "embed|h.0-1|h.2-3|head");
  const GptPartition v = PartitionGpt(cfg, kB, kT, 4, PartitionKind::kBalanced, Placement::kVShape);
  EXPECT_LT(MaxRankCostV(v, cfg), 0.8 * MaxRankCostV(looped, cfg)) << FormatLayout(v);
}

TEST(Partition, VShapeLayoutErrorsExplainTheV) {
  const GptConfig cfg = Config(4, 50);
  try {
    ParseGptLayout("embed,h.0-1|h.2-3,head", cfg, 4, Placement::kVShape);
    FAIL() << "a layout of 2 stages for a V of 2 ranks";
  } catch (const InvalidArgument& e) {
    EXPECT_EQ(std::string(e.what()),
              "--layout has 2 stages, but a V-shaped schedule (zb-v, v-half, v-min) runs 4 virtual "
              "stages: 2 per rank, listed in model order — stage k runs on rank k for k < 2, on "
              "rank 3 − k after, so rank 0 runs the first stage (embed) and the last (head)");
  }
  EXPECT_THAT([&] { PartitionGpt(cfg, kB, kT, 3, PartitionKind::kBalanced, Placement::kVShape); },
              ::testing::ThrowsMessage<InvalidArgument>(HasSubstr("an even number (got 3)")));
}

// The fuzzer's seed corpus (fuzz/corpus/layout: the low 3 bits of byte 0 are the stages − 1, its
// bit 3 the V-shaped placement, byte 1 the layers − 1, then the layout) doubles as a regression
// suite: valid_* parse and format back to themselves up to spaces, the others fail with
// InvalidArgument.
TEST(Partition, FuzzSeedCorpusParsesOrFailsCleanly) {
  int count = 0;
  for (const std::filesystem::path& file : testing_support::FuzzCorpus("layout")) {
    ++count;
    std::ifstream in(file, std::ios::binary);
    const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_GE(bytes.size(), 2u) << file;
    const int stages = 1 + static_cast<uint8_t>(bytes[0]) % 8;
    const Placement placement = (bytes[0] & 8) != 0 ? Placement::kVShape : Placement::kLooped;
    GptConfig cfg = Config(1 + static_cast<uint8_t>(bytes[1]) % 16, 32);
    const std::string layout = bytes.substr(2);
    if (file.filename().string().starts_with("valid_")) {
      const GptPartition p = ParseGptLayout(layout, cfg, stages, placement);
      std::string compact = layout;
      std::erase(compact, ' ');
      EXPECT_EQ(FormatLayout(p), compact) << file;
    } else {
      EXPECT_THROW(ParseGptLayout(layout, cfg, stages, placement), InvalidArgument) << file;
    }
  }
  EXPECT_GT(count, 0);
}

TEST(Partition, FormatNeedsExplicitLayers) {
  EXPECT_THROW(FormatLayout(GptPartition{.stages = {GptSlice{}}}), InvalidArgument);
}

}  // namespace
}  // namespace sluice::pipeline
