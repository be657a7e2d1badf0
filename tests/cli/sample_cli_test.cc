// `sluice sample` as a user runs it: greedy decoding of the `make run` checkpoint sorts digits,
// the same seed gives the same text, tokens/s is printed, and bad prompts, a non-GPT checkpoint
// or a non-positive temperature are clear errors.
#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>

#include "cli/cli_fixture.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using ::testing::MatchesRegex;

class SampleCli : public CliTest {
 protected:
  // A small GPT on the sort task, a few steps: enough to exercise sampling and its errors.
  std::string SmallSortCheckpoint() {
    const std::string path = (dir_ / "small.safetensors").string();
    const CliResult r = Sluice(fmt::format(
        "train --layers 1 --dim 16 --heads 2 --batch 8 --steps 2 --threads 1 --eval-every 0 "
        "--quiet --save {}",
        path));
    EXPECT_EQ(r.status, 0) << r.err;
    return path;
  }
};

// The default job of `make run` (Makefile: 4 stages, 1F1B, 4 layers, 4 micro-batches), trained to
// the end; its greedy answers are the prompts' digits sorted.
TEST_F(SampleCli, GreedyDecodingOfTheMakeRunCheckpointSortsDigits) {
  const std::string ckpt = (dir_ / "checkpoint.safetensors").string();
  CliResult r = Sluice(fmt::format(
      "train --stages 4 --schedule 1f1b --layers 4 --microbatches 4 --quiet --save {}", ckpt));
  ASSERT_EQ(r.status, 0) << r.err;
  for (const std::string digits : {"315402", "999000", "123456", "707070", "860213"}) {
    r = Sluice(fmt::format("sample --checkpoint {} --prompt {} --greedy", ckpt, digits));
    ASSERT_EQ(r.status, 0) << r.err;
    std::string sorted = digits;
    std::sort(sorted.begin(), sorted.end());
    EXPECT_EQ(r.out, digits + "|" + sorted + "\n") << r.err;
    EXPECT_THAT(r.err, HasSubstr("sample: 6 tokens in"));
    EXPECT_THAT(r.err, HasSubstr("tokens/s (prompt of 7 tokens encoded in"));
  }
  // The separator may be given; a prompt that already holds part of the answer is continued.
  r = Sluice(fmt::format("sample --checkpoint {} --prompt '531|13' --greedy", ckpt));
  EXPECT_NE(r.status, 0);
  EXPECT_THAT(r.err, HasSubstr("the model sorts sequences of 6 digits, the prompt has 3"));
  r = Sluice(fmt::format("sample --checkpoint {} --prompt '315402|01' --greedy", ckpt));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "315402|012345\n");
}

TEST_F(SampleCli, TheSameSeedGivesTheSameText) {
  const std::string ckpt = SmallSortCheckpoint();
  auto sample = [&](int seed) {
    CliResult r = Sluice(fmt::format(
        "sample --checkpoint {} --prompt 554433 --temperature 2 --top-k 5 --tokens 5 --seed {}",
        ckpt, seed));
    EXPECT_EQ(r.status, 0) << r.err;
    EXPECT_THAT(r.out, MatchesRegex("554433\\|[0-9|]{5}\n"));
    EXPECT_THAT(r.err, HasSubstr("temperature 2, top-k 5, seed"));
    return r.out;
  };
  EXPECT_EQ(sample(1), sample(1));
  std::vector<std::string> texts;
  for (int seed = 1; seed <= 4; ++seed) texts.push_back(sample(seed));
  EXPECT_THAT(texts, ::testing::Not(::testing::Each(texts[0])))
      << "four seeds at temperature 2 all gave the same text";
}

TEST_F(SampleCli, ByteLevelModelsContinueTextAndSlideTheirWindow) {
  const std::string text_file =
      Write("text.txt", std::string(200, 'a') + "ab\nba\n" + std::string(200, 'b')).string();
  const std::string ckpt = (dir_ / "text.safetensors").string();
  CliResult r = Sluice(fmt::format(
      "train --data {} --seq 8 --layers 1 --dim 16 --heads 2 --batch 4 --steps 2 --threads 1 "
      "--eval-every 0 --quiet --save {}",
      text_file, ckpt));
  ASSERT_EQ(r.status, 0) << r.err;
  // 20 tokens with 8 positions: the window slides; every byte is a token.
  r = Sluice(fmt::format("sample --checkpoint {} --prompt 'ab' --tokens 20 --seed 3", ckpt));
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out.size(), 2u + 20u + 1u);
  EXPECT_EQ(r.out.substr(0, 2), "ab");
  EXPECT_THAT(r.err, HasSubstr("sample: 20 tokens in"));
  EXPECT_THAT(r.err, HasSubstr("the full window slid"));
  // Longer than the model's positions.
  r = Sluice(fmt::format("sample --checkpoint {} --prompt 'abcdefghij'", ckpt));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("--prompt is 10 tokens long but the model takes at most 8 "
                               "positions (it was trained with --seq 8)"));
}

TEST_F(SampleCli, BadPromptsAndOptionsAreClearErrors) {
  const std::string ckpt = SmallSortCheckpoint();
  CliResult r = Sluice(fmt::format("sample --checkpoint {} --prompt 31x402", ckpt));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("--prompt: 'x' at byte 2 is not in the sort task's vocabulary "
                               "(digits 0-9 and the separator '|')"));
  r = Sluice(fmt::format("sample --checkpoint {}", ckpt));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("needs --prompt with the 6 digits to sort"));
  r = Sluice(fmt::format("sample --checkpoint {} --prompt 3154021", ckpt));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("the model sorts sequences of 6 digits, the prompt has 7"));
  for (const char* t : {"0", "-0.5"}) {
    r = Sluice(fmt::format("sample --checkpoint {} --prompt 315402 --temperature {}", ckpt, t));
    EXPECT_EQ(r.status, 1);
    EXPECT_THAT(r.err, HasSubstr("--temperature must be a positive number when sampling"));
  }
  // Greedy decoding draws nothing: the options of the draws are refused rather than ignored.
  for (const char* o : {"--temperature 0", "--top-k 5", "--seed 3"}) {
    r = Sluice(fmt::format("sample --checkpoint {} --prompt 315402 {} --greedy", ckpt, o));
    EXPECT_EQ(r.status, 1) << o;
    EXPECT_THAT(r.err, HasSubstr("shapes the sampling, and --greedy samples nothing")) << o;
  }
  r = Sluice(fmt::format("sample --checkpoint {} --prompt 315402 --seed -1", ckpt));
  EXPECT_EQ(r.status, static_cast<int>(CLI::ExitCodes::ValidationError)) << r.err;
  EXPECT_THAT(r.err, HasSubstr("a seed is an integer from 0 to 18446744073709551615, got '-1'"));
  r = Sluice(fmt::format("sample --checkpoint {} --prompt 315402 --top-k -2", ckpt));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("--top-k must be 0 (all tokens) or positive, got -2"));
  r = Sluice(fmt::format("sample --checkpoint {} --prompt 315402 --top-k 100000", ckpt));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("--top-k 100000 is more than the model's vocabulary of"));
  r = Sluice(fmt::format("sample --checkpoint {} --prompt 315402 --tokens -3", ckpt));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("--tokens must be 0 to 1000000, got -3"));
  r = Sluice(fmt::format("sample --checkpoint {}/missing.safetensors --prompt 1", dir_.string()));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("missing.safetensors"));
}

TEST_F(SampleCli, ACheckpointThatIsNotAGptIsAClearError) {
  const std::string mlp = (dir_ / "mlp.safetensors").string();
  CliResult r = Sluice(
      fmt::format("train --model mlp --steps 1 --threads 1 --eval-every 0 --quiet --save {}", mlp));
  ASSERT_EQ(r.status, 0) << r.err;
  r = Sluice(fmt::format("sample --checkpoint {} --prompt 1", mlp));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("the checkpoint holds a 'mlp' model, not a GPT"));
  EXPECT_THAT(r.err, HasSubstr(mlp));
  // A safetensors file without sluice's metadata (written by another framework, say).
  const std::string bare =
      Write("bare.safetensors", std::string("\x36\0\0\0\0\0\0\0", 8) +
                                    R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})" +
                                    std::string(4, '\0'))
          .string();
  r = Sluice(fmt::format("sample --checkpoint {} --prompt 1", bare));
  EXPECT_EQ(r.status, 1);
  EXPECT_THAT(r.err, HasSubstr("no 'config' in the checkpoint's metadata"));
}

}  // namespace
}  // namespace sluice
