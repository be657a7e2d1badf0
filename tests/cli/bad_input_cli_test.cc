// Bad input and faults against the built binary, as a hostile but ordinary user would try them:
// every case must end with exit status 1, "sluice: error: " and a message naming the option or
// file and what is allowed — never "internal error", a signal or a silent success. Each case was
// a crash, a loss of data or a silent acceptance before (the issue "Bad input and faults").
#include <sys/stat.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>

#include "cli/cli_fixture.h"
#include "sluice/io/safetensors.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
namespace fs = std::filesystem;

// A model small enough that a step takes milliseconds: kTiny has one layer, kTwoStages two layers
// on two pipeline stages.
#define SLUICE_TINY \
  "--dim 16 --heads 2 --batch 4 --threads 1 --eval-every 0 --eval-batches 1 --quiet"
constexpr const char* kTiny = "--layers 1 " SLUICE_TINY;
constexpr const char* kTwoStages = "--layers 2 --stages 2 " SLUICE_TINY;

class BadInputCli : public CliTest {
 protected:
  std::string Train(const std::string& args) {
    return Refused(fmt::format("train {} {}", kTiny, args));
  }
  // A real checkpoint after `steps` steps of the tiny model.
  fs::path Checkpoint(const std::string& name, int steps = 1) {
    const fs::path ck = dir_ / name;
    const CliResult r =
        Sluice(fmt::format("train {} --steps {} --save {}", kTiny, steps, ck.string()));
    EXPECT_EQ(r.status, 0) << r.err;
    return ck;
  }
  // `ck` with its metadata key set to `value` (erased when value is null), written to `name`.
  fs::path WithMetadata(const fs::path& ck, const std::string& name, const std::string& key,
                        const char* value) {
    SafetensorsFile f = ReadSafetensors(ck.string());
    if (value == nullptr) {
      f.metadata.erase(key);
    } else {
      f.metadata[key] = value;
    }
    const fs::path out = dir_ / name;
    WriteSafetensors(out.string(), f.tensors, f.metadata);
    return out;
  }
};

struct Case {
  std::string args;
  std::string message;
};

TEST_F(BadInputCli, NumericFlagsMustBeFiniteAndInRange) {
  const std::vector<Case> cases = {
      {"--lr nan", "--lr must be a finite number above 0, got nan"},
      {"--lr inf", "--lr must be a finite number above 0, got inf"},
      {"--lr -1", "--lr must be a finite number above 0, got -1"},
      {"--lr 0", "--lr must be a finite number above 0, got 0"},
      {"--min-lr -1", "--min-lr must be a finite number from 0 to --lr (0.003), got -1"},
      {"--lr 0.001 --min-lr 0.01", "--min-lr must be a finite number from 0 to --lr (0.001)"},
      {"--weight-decay nan", "--weight-decay must be a finite number, 0 or more, got nan"},
      {"--clip -1", "--clip must be a finite number, 0 (off) or more, got -1"},
      // The optimizer computes in f32: a subnormal rate was 0 there (`--lr 1e-320` trained
      // nothing without a word), one past f32's largest infinite.
      {"--lr 1e-320", "--lr must be at least 1.18e-38 (the smallest normal f32"},
      {"--lr 1e39", "--lr must be at most 3.4e+38 (the largest f32"},
      {"--min-lr 1e-40", "--min-lr must be 0 or at least 1.18e-38"},
      {"--weight-decay 1e-320", "--weight-decay must be 0 or at least 1.18e-38"},
      {"--weight-decay 1e300", "--weight-decay must be at most 3.4e+38"},
      {"--clip 1e-320", "--clip must be 0 (off) or at least 1.18e-38"},
      {"--reserved-headroom -0.5",
       "--reserved-headroom must be a finite fraction from 0 (keep free blocks' pages) to 1, got "
       "-0.5"},
      {"--reserved-headroom nan", "--reserved-headroom must be a finite fraction"},
      {"--reserved-headroom 1.5", "--reserved-headroom must be a finite fraction"},
      {"--beta1 1", "--beta1 must be in [0, 1), got 1"},
      {"--beta2 -0.1", "--beta2 must be in [0, 1), got -0.1"},
      {"--optimizer sgd --momentum 1.5", "--momentum must be in [0, 1), got 1.5"},
      {"--warmup -5", "--warmup must be 0 or more, got -5"},
      {"--eval-every -1", "--eval-every must be 0 (only at the end) or more, got -1"},
      {"--save-every -2", "--save-every must be 0 (only at the end) or more, got -2"},
      {"--seq -1", "--seq must be 0 (the data's) to 16384, got -1"},
      {"--vocab 1000000000000", "--vocab must be 0 (the data's) to 1048576, got 1000000000000"},
      // Sizes that overflowed a tensor's byte count (an internal error) or took hours of setup.
      {"--layers 1000000000", "--layers must be 1 to 10000, got 1000000000"},
      {"--dim 1000000000", "--dim must be 1 to 65536, got 1000000000"},
      {"--batch 1000000000", "--batch must be 1 to 16384, got 1000000000"},
      // Regression: "must divide --batch" for 0; an evaluation of 10^12 batches was accepted.
      {"--microbatches 0", "--microbatches must be 1 or more, got 0"},
      {"--eval-batches 1000000000000", "--eval-batches must be 1 to 10000, got 1000000000000"},
      {"--threads 100000", "--threads must be 0 (every core) to 1024, got 100000"},
      // Regression: refused by the thread pool only after 97 s of building 2000 stages.
      {"--stages 2000",
       "--stages must be 1 to 1024, got 2000: each stage is a thread of this "
       "process (more run as MPI processes: --comm mpi)"},
      {"--batch -4", "--batch must be at least 1, got -4"},
  };
  for (const Case& c : cases) {
    // Without kTiny: each case must fail in validation, before any model is built.
    EXPECT_THAT(Refused("train --steps 1 " + c.args), HasSubstr(c.message)) << c.args;
  }
  // An unsigned seed: "-1" wrapped around to 2^64 − 1 before; refused now (usage error), by the
  // same check in every command that takes one, its message one line, not a 300-digit bound.
  for (const char* command : {"train --steps 1", "run examples/mlp.sluice"}) {
    for (const char* seed : {"-1", "18446744073709551616", "1e3"}) {
      const CliResult r = Sluice(fmt::format("{} --seed {}", command, seed));
      EXPECT_EQ(r.status, static_cast<int>(CLI::ExitCodes::ValidationError)) << r.err;
      EXPECT_THAT(r.err,
                  HasSubstr(fmt::format(
                      "a seed is an integer from 0 to 18446744073709551615, got '{}'", seed)))
          << command;
      EXPECT_LT(r.err.size(), 400u) << r.err;
    }
  }
  const CliResult r = Sluice(fmt::format("train {} --steps 1 --seed 18446744073709551615", kTiny));
  EXPECT_EQ(r.status, 0) << r.err;
}

// --shard-optimizer shards over data-parallel replicas: without them, a clear error before
// anything is built or written.
TEST_F(BadInputCli, ShardOptimizerNeedsDataParallelism) {
  const fs::path ck = dir_ / "ck.safetensors";
  for (const std::string command : {std::string("train --steps 1"), std::string("plan"),
                                    fmt::format("train --steps 1 --save {}", ck.string())}) {
    EXPECT_THAT(Refused(fmt::format("{} --shard-optimizer", command)),
                HasSubstr("--shard-optimizer shards the optimizer state over data-parallel "
                          "replicas, but --data-parallel is 1"))
        << command;
  }
  EXPECT_FALSE(fs::exists(ck));
}

TEST_F(BadInputCli, AnOmittedMinLrFollowsALowerLr) {
  // --min-lr's default (0.0003) above a smaller --lr is no error: the floor follows --lr.
  const CliResult r = Sluice(fmt::format("train {} --steps 1 --lr 0.0001", kTiny));
  EXPECT_EQ(r.status, 0) << r.err;
}

TEST_F(BadInputCli, InputFilesMustBeRegularFiles) {
  EXPECT_THAT(Train("--steps 1 --data " + dir_.string()),
              HasSubstr("cannot read data file '" + dir_.string() + "': it is a directory"));
  EXPECT_THAT(Train("--steps 1 --data /dev/zero"),
              HasSubstr("data file '/dev/zero' is a character device and yields more than 64 MiB"));
  EXPECT_THAT(Train("--steps 1 --resume " + dir_.string()),
              HasSubstr("cannot read safetensors file '" + dir_.string() + "'"));
  EXPECT_THAT(Refused("run " + dir_.string()),
              HasSubstr("cannot read program file '" + dir_.string() + "': it is a directory"));
  EXPECT_THAT(Refused("run /dev/zero"),
              HasSubstr("program file '/dev/zero' is a character device"));
}

// Regression: a --data (or --program) pipe was read once per dataset sluice built from it, so the
// second build found it drained: `head -c 5000 big.txt | sluice train --data /dev/stdin` failed
// with "data file '/dev/stdin' has 0 bytes". A pipe or device is read once; later reads of it in
// the process give those bytes.
TEST_F(BadInputCli, APipeIsReadOnceAndTrainsAsAFileWould) {
  std::string text;
  for (int i = 0; text.size() < 5000; ++i) text += fmt::format("line {} of a piped corpus\n", i);
  const fs::path corpus = Write("corpus.txt", text);
  auto train = [&](const std::string& data, const std::string& metrics, const std::string& pipe) {
    return Sluice(fmt::format("train {} --steps 2 --seq 16 --metrics {} --data {}", kTiny,
                              (dir_ / metrics).string(), data),
                  pipe);
  };
  // Sluice() puts its second argument before the binary: here a pipe into it.
  const CliResult piped = train("/dev/stdin", "piped.jsonl", "cat " + corpus.string() + " |");
  ASSERT_EQ(piped.status, 0) << piped.err;
  const CliResult file = train(corpus.string(), "file.jsonl", "");
  ASSERT_EQ(file.status, 0) << file.err;
  const auto piped_lines = Lines(dir_ / "piped.jsonl"), file_lines = Lines(dir_ / "file.jsonl");
  ASSERT_EQ(piped_lines.size(), file_lines.size());
  EXPECT_EQ(piped_lines[0]["loss"], file_lines[0]["loss"]);
  EXPECT_EQ(piped_lines[1]["loss"], file_lines[1]["loss"]);

  const fs::path program = Write("p.sluice", R"(program p {
  input %x: f32[3]
  %y: f32[3] = add(%x, %x)
  output %y
}
)");
  const CliResult run = Sluice("run /dev/stdin", "cat " + program.string() + " |");
  EXPECT_EQ(run.status, 0) << run.err;
}

TEST_F(BadInputCli, OutputsMayNotOverwriteInputsOrEachOther) {
  const fs::path corpus = Write("corpus.txt", std::string(4096, 'a'));
  const std::string before = ReadFile(corpus);
  EXPECT_THAT(Train(fmt::format("--steps 1 --data {0} --metrics {0}", corpus.string())),
              HasSubstr("--metrics '" + corpus.string() + "' is the --data file"));
  EXPECT_THAT(Train(fmt::format("--steps 1 --data {0} --save {0}", corpus.string())),
              HasSubstr("--save '" + corpus.string() + "' is the --data file"));
  EXPECT_EQ(ReadFile(corpus), before);
  const fs::path ck = Checkpoint("ck.safetensors");
  const std::string saved = ReadFile(ck);
  EXPECT_THAT(Train(fmt::format("--steps 2 --resume {0} --save {0}", ck.string())),
              HasSubstr("--save '" + ck.string() + "' is the --resume file"));
  EXPECT_THAT(Train(fmt::format("--steps 2 --resume {0} --metrics {0}", ck.string())),
              HasSubstr("is the --resume file"));
  EXPECT_EQ(ReadFile(ck), saved);
  const fs::path out = dir_ / "out.json";
  EXPECT_THAT(Train(fmt::format("--steps 1 --save {0} --metrics {0}", out.string())),
              HasSubstr("are the same file"));
  const fs::path program = Write(
      "p.sluice", "program p {\n  input %x: f32[2]\n  %y: f32[2] = copy(%x)\n  output %y\n}\n");
  const std::string text = ReadFile(program);
  EXPECT_THAT(Refused(fmt::format("run {0} --trace {0}", program.string())),
              HasSubstr("--trace '" + program.string() + "' is the program file"));
  EXPECT_EQ(ReadFile(program), text);
}

// Regression: a misspelled attribute was ignored, and `run` computed a plain matmul.
TEST_F(BadInputCli, AnUndeclaredAttributeIsAnErrorAtItsName) {
  const fs::path program = Write("typo.sluice",
                                 "program p {\n  input %a: f32[2, 3]\n"
                                 "  %y: f32[2, 2] = matmul(%a, %a) {tranpose_b = true}\n"
                                 "  output %y\n}\n");
  EXPECT_THAT(
      Refused("run " + program.string()),
      HasSubstr(program.string() + ":3:35: matmul has no attribute 'tranpose_b' (did you mean "
                                   "'transpose_b'?); its attributes are transpose_a, transpose_b"));
}

TEST_F(BadInputCli, UnwritableOutputsFailBeforeTheFirstStep) {
  const fs::path missing = dir_ / "no" / "such" / "ck.safetensors";
  const fs::path metrics = dir_ / "m.jsonl";
  EXPECT_THAT(
      Train(fmt::format("--steps 1 --metrics {} --save {}", metrics.string(), missing.string())),
      HasSubstr("--save '" + missing.string() + "': its folder"));
  EXPECT_FALSE(fs::exists(metrics)) << "a step ran before the output check";
  const fs::path file = Write("plain.txt", "x");
  EXPECT_THAT(
      Refused(fmt::format("train {} --steps 1 --trace {}/t.json", kTwoStages, file.string())),
      HasSubstr("is not a directory"));
  EXPECT_THAT(Train("--steps 1 --save " + dir_.string()), HasSubstr("is a directory"));
}

TEST_F(BadInputCli, CheckpointMetadataIsReadStrictly) {
  const fs::path ck = Checkpoint("ck.safetensors");
  const std::vector<std::tuple<std::string, const char*, std::string>> cases = {
      {"step", nullptr, "has no metadata \"step\""},
      {"step", "2 apples", "metadata \"step\" is \"2 apples\", not a step count"},
      {"step", "", "metadata \"step\" is \"\""},
      {"step", "-3", "metadata \"step\" is -3, not 0 or more"},
      {"step", "99999999999999999999", "not a step count"},
      {"data_seed", "one", "metadata \"data_seed\" is \"one\", not a seed"},
      {"data_position", nullptr, "has no metadata \"data_position\""},
      {"format", "sluice-checkpoint-0", "metadata \"format\" is \"sluice-checkpoint-0\""},
      {"config", "{not json", "metadata \"config\" is not a JSON object"},
  };
  int n = 0;
  for (const auto& [key, value, message] : cases) {
    const fs::path bad = WithMetadata(ck, fmt::format("bad{}.safetensors", n++), key, value);
    const std::string err = Train(fmt::format("--steps 5 --resume {}", bad.string()));
    EXPECT_THAT(err, HasSubstr(message)) << key << " = " << (value ? value : "(missing)");
    EXPECT_THAT(err, HasSubstr(bad.string()));
  }
}

TEST_F(BadInputCli, ACheckpointAtOrPastStepsIsAnError) {
  const fs::path ck = Checkpoint("ck.safetensors", 2);
  EXPECT_THAT(Train(fmt::format("--steps 2 --resume {}", ck.string())),
              HasSubstr("is at step 2, at or past --steps 2: nothing is left to train"));
}

// Regression: the weights went to NaN and were saved over a good checkpoint with exit 0.
TEST_F(BadInputCli, ADivergingRunStopsAtTheStepAndKeepsTheLastCheckpoint) {
  const fs::path ck = Checkpoint("ck.safetensors");
  const std::string good = ReadFile(ck);
  const std::string err =
      Train(fmt::format("--steps 4 --lr 1e30 --lr-schedule constant --save {}", ck.string()));
  EXPECT_THAT(err, HasSubstr("training stopped there, no checkpoint of it is saved"));
  EXPECT_THAT(err, HasSubstr("or skip such steps with --skip-nonfinite N"));
  EXPECT_EQ(ReadFile(ck), good) << "the checkpoint was overwritten";
}

// The other commands, with hostile arguments: each was an internal error, a hang, or a loss of
// data (the report written over its own metrics).
TEST_F(BadInputCli, OtherCommandsRefuseHostileArgumentsCleanly) {
  const fs::path metrics = Write("m.jsonl", "{\"step\": 1, \"loss\": 2.5}\n");
  const std::string before = ReadFile(metrics);
  EXPECT_THAT(Refused(fmt::format("report {0} --out {0}", metrics.string())),
              HasSubstr("--out '" + metrics.string() + "' is the metrics file"));
  EXPECT_EQ(ReadFile(metrics), before);
  EXPECT_THAT(Refused("report /dev/zero"),
              HasSubstr("metrics file '/dev/zero' is a character device"));
  EXPECT_THAT(Refused(fmt::format("report {} --trace /dev/zero --out {}/r.html", metrics.string(),
                                  dir_.string())),
              HasSubstr("trace file '/dev/zero' is a character device"));
  EXPECT_THAT(Refused("report " + dir_.string()),
              HasSubstr("cannot read metrics file '" + dir_.string() + "': it is a directory"));
  // Metrics without a step (a summary alone, an evaluation alone) name the file.
  const fs::path no_step = Write("no_step.jsonl", "{\"summary\": true}\n");
  EXPECT_THAT(Refused(fmt::format("report {} --out {}/r.html", no_step.string(), dir_.string())),
              HasSubstr("the metrics '" + no_step.string() + "' hold no step"));
  EXPECT_THAT(Refused("simulate --stages 2 --microbatches 2 --costs " + dir_.string()),
              HasSubstr("cannot read --costs file '" + dir_.string() + "': it is a directory"));
  EXPECT_THAT(Refused("simulate --stages 2 --microbatches 0"),
              HasSubstr("--microbatches must be 1 or more, got 0"));
  EXPECT_THAT(Refused("plan --layers 1000000000"), HasSubstr("--layers must be 1 to 10000"));
  EXPECT_THAT(Refused("plan --dim 1000000000"), HasSubstr("--dim must be 1 to 65536"));
  EXPECT_THAT(Refused("plan --eval-batches 100000"), HasSubstr("--eval-batches must be 1 to"));
  // An empty path names no file: it quietly meant "not given" (no checkpoint, no trace).
  for (const char* option : {"--save", "--metrics", "--resume", "--init-from", "--trace"}) {
    const CliResult r = Sluice(fmt::format("train --steps 1 {} ''", option));
    EXPECT_EQ(r.status, static_cast<int>(CLI::ExitCodes::ValidationError)) << option << r.err;
    EXPECT_THAT(r.err, HasSubstr("an empty path names no file")) << option;
  }
  for (const std::string& args : {std::string("run p.sluice --trace ''"),
                                  fmt::format("report {} --out ''", metrics.string())}) {
    const CliResult r = Sluice(args);
    EXPECT_EQ(r.status, static_cast<int>(CLI::ExitCodes::ValidationError)) << args << r.err;
    EXPECT_THAT(r.err, HasSubstr("an empty path names no file")) << args;
  }
  // Regression: 10^12 tokens were generated for days; --threads had no bound.
  const fs::path ck = Checkpoint("ck.safetensors");
  EXPECT_THAT(Refused(fmt::format("sample --checkpoint {} --prompt 315402 --tokens 1000000000000",
                                  ck.string())),
              HasSubstr("--tokens must be 0 to 1000000, got 1000000000000"));
  EXPECT_EQ(Sluice(fmt::format("sample --checkpoint {} --threads 100000", ck.string())).status,
            static_cast<int>(CLI::ExitCodes::ValidationError));
  // Cases that were already clean, kept so that they stay so.
  for (const std::string& args : std::vector<std::string>{
           "schedule -p 0 -m 4", "schedule -p 4 -m -3", "schedule -p 4 -m 1000000000",
           "schedule -p 2 -m 4 -s interleaved -v -1", "schedule -p 2 -m 4 -s bogus",
           "plan --stages -1", "plan --memory-budget nan", "plan --memory-budget -1",
           "plan --data /dev/zero", "plan --recompute ,,,", "sample --checkpoint /dev/zero",
           "sample --checkpoint " + dir_.string(), "run /dev/null",
           "simulate --stages 2 --microbatches 2 --costs /dev/zero"}) {
    Refused(args);
  }
}

// Regression: JSON nested 100000 deep (a 200 KB file) overflowed the stack — a segfault — when a
// message or the report page printed the value: a metrics line, a trace, a costs file, a
// checkpoint's config for sample and for --resume. Every JSON a user hands over is refused past
// 128 levels (core/json_text.h), naming the file and the byte.
TEST_F(BadInputCli, DeeplyNestedJsonIsRefusedNotRecursedInto) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const fs::path metrics = Write("m.jsonl", "{\"step\": 1, \"loss\": 2.5}\n");
  const fs::path deep_metrics = Write("deep.jsonl", "{\"step\": " + deep + ", \"loss\": 1}\n");
  const fs::path trace = Write("trace.json", "[{\"ph\": \"X\", \"pid\": " + deep + "}]");
  const fs::path costs =
      Write("costs.json", "{\"format\": \"sluice-step-costs/1\", \"measured\": " + deep + "}");
  const std::string nesting = "nesting deeper than 128 levels of arrays and objects";
  const std::string out = (dir_ / "r.html").string();
  EXPECT_THAT(Refused(fmt::format("report {} --out {}", deep_metrics.string(), out)),
              HasSubstr(deep_metrics.string() +
                        ":1:137: not a JSON line of sluice train "
                        "--metrics: [json.exception.parse_error.101] "
                        "parse error at byte 137: " +
                        nesting));
  EXPECT_THAT(
      Refused(fmt::format("report {} --trace {} --out {}", metrics.string(), trace.string(), out)),
      HasSubstr(trace.string() + ":1:147: not a Chrome trace (JSON): "));
  EXPECT_THAT(
      Refused("simulate --costs " + costs.string()),
      HasSubstr("--costs " + costs.string() +
                ": not valid JSON: [json.exception.parse_error.101] parse error at byte 174: " +
                nesting));
  const fs::path ck = Checkpoint("ck.safetensors");
  const fs::path bad =
      WithMetadata(ck, "deep.safetensors", "config", ("{\"model\": " + deep + "}").c_str());
  EXPECT_THAT(Refused(fmt::format("sample --checkpoint {} --prompt 315402", bad.string())),
              HasSubstr(bad.string() + ": the 'config' metadata is not JSON: "));
  EXPECT_THAT(Train(fmt::format("--steps 4 --resume {}", bad.string())),
              HasSubstr(fmt::format("checkpoint '{}': metadata \"config\" is not a JSON object",
                                    bad.string())));
}

// Regression: `sample` read the checkpoint's config with unchecked JSON accessors (a config that
// was an array, or a model that was a number, was an internal error) and used its sizes before
// checking them (a vocabulary of -5 was blamed on --top-k).
TEST_F(BadInputCli, SampleChecksTheCheckpointConfigBeforeUsingIt) {
  const fs::path ck = Checkpoint("ck.safetensors");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"[1, 2]", "the 'config' metadata is array, not a JSON object"},
      {R"({"model": 5})", "the checkpoint holds a '5' model, not a GPT"},
      {R"({"model": "gpt", "data": "sort", "vocab": -5, "seq": 12, "layers": 1, "heads": 2,
          "dim": 16})",
       "the 'config' metadata describes no GPT: GPT sizes must be positive (vocab -5"},
      {R"({"model": "gpt", "data": "sort", "vocab": 11, "seq": 0, "layers": 1, "heads": 2,
          "dim": 16})",
       "the 'config' metadata describes no GPT: GPT sizes must be positive (vocab 11, seq 0"},
  };
  int n = 0;
  for (const auto& [config, message] : cases) {
    const fs::path bad =
        WithMetadata(ck, fmt::format("config{}.safetensors", n++), "config", config.c_str());
    const std::string err =
        Refused(fmt::format("sample --checkpoint {} --prompt 315402", bad.string()));
    EXPECT_THAT(err, HasSubstr(bad.string() + ": " + message)) << config;
  }
}

// Regression: a checkpoint holding NaN (damaged: no save writes one) loaded silently; training
// then stopped at its first step advising a lower --lr, and sample printed garbage with exit 0.
TEST_F(BadInputCli, ACheckpointHoldingNaNIsRefusedWhenLoaded) {
  const fs::path ck = Checkpoint("ck.safetensors");
  SafetensorsFile f = ReadSafetensors(ck.string());
  f.tensors.at("wte.weight").data<float>()[3] = std::nanf("");
  const fs::path bad = dir_ / "nan.safetensors";
  WriteSafetensors(bad.string(), f.tensors, f.metadata);
  const std::string message = fmt::format(
      "checkpoint '{}': tensor 'wte.weight' holds nan at flat index 3; sluice never saves NaN or "
      "infinite values",
      bad.string());
  EXPECT_THAT(Train(fmt::format("--steps 4 --resume {}", bad.string())), HasSubstr(message));
  EXPECT_THAT(Train(fmt::format("--steps 4 --init-from {}", bad.string())), HasSubstr(message));
  EXPECT_THAT(Refused(fmt::format("sample --checkpoint {} --prompt 315402", bad.string())),
              HasSubstr(message));
}

// Regression: a checkpoint is written beside its path and renamed over it, so `--save` naming a
// device or a pipe replaced it with a regular file (as root, `--save /dev/full` did so to the
// system's /dev/full). A symbolic link is replaced, not what it points to.
TEST_F(BadInputCli, SaveNeverReplacesADeviceOrAPipe) {
  const fs::path fifo = dir_ / "fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_THAT(Train(fmt::format("--steps 1 --save {}", fifo.string())),
              HasSubstr(fmt::format("--save '{}' is a pipe: this output is written to a new file "
                                    "renamed over its path, which would replace it",
                                    fifo.string())));
  EXPECT_TRUE(fs::is_fifo(fifo));
  const fs::path link = dir_ / "link.safetensors";
  fs::create_symlink(fifo, link);
  const CliResult r = Sluice(fmt::format("train {} --steps 1 --save {}", kTiny, link.string()));
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(fs::is_fifo(fifo));
  EXPECT_TRUE(fs::is_regular_file(fs::symlink_status(link)));
}

// Regression: --profile-out was not among the outputs checked before training, so a folder or a
// missing directory failed only after the last step, with no reason given.
TEST_F(BadInputCli, ProfileOutIsCheckedBeforeTheFirstStep) {
  const fs::path metrics = dir_ / "m.jsonl";
  EXPECT_THAT(Refused(fmt::format("train {} --steps 1 --metrics {} --profile-out {}", kTwoStages,
                                  metrics.string(), dir_.string())),
              HasSubstr("--profile-out '" + dir_.string() + "' is a directory"));
  EXPECT_FALSE(fs::exists(metrics)) << "a step ran before the output check";
}

// Regression: messages quote text read from files, and a checkpoint whose metadata held an ESC
// sequence wrote it to the terminal as is. Control bytes are printed as \xHH.
TEST_F(BadInputCli, ControlBytesFromAFileReachTheTerminalEscaped) {
  const fs::path ck = Checkpoint("ck.safetensors");
  const fs::path bad = WithMetadata(ck, "esc.safetensors", "step", "\x1b[2J\x1b[31m7");
  const std::string err = Train(fmt::format("--steps 9 --resume {}", bad.string()));
  EXPECT_THAT(err, HasSubstr("metadata \"step\" is \"\\x1b[2J\\x1b[31m7\", not a step count"));
  EXPECT_EQ(err.find('\x1b'), std::string::npos) << "an ESC byte reached stderr";
}

// Regression: a fault at a stage or micro-batch the run does not have never fired, and the run
// succeeded: a failure-handling test asking for it passed without testing anything.
TEST_F(BadInputCli, AFaultNoStageReachesIsRefused) {
  for (const char* fault : {"throw:2:F:0", "throw:-1:F:0", "throw:0:F:4", "skip:1:B:-1"}) {
    EXPECT_THAT(Refused(fmt::format("train {} --steps 1 --microbatches 4 --inject-fault {}",
                                    kTwoStages, fault)),
                HasSubstr(fmt::format("--inject-fault '{}': stage", fault)))
        << fault;
  }
  EXPECT_THAT(Refused(fmt::format("train {} --steps 1 --microbatches 4 --inject-fault throw:1:F:3",
                                  kTwoStages)),
              HasSubstr("stage 1 failed at step 1"));
}

// Regression: an empty value quietly meant "not given": no budget, the default partition, no
// ranking.
TEST_F(BadInputCli, AnEmptyValueIsNotTakenForAnOmittedOption) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"train --steps 1 --memory-budget ''", "--memory-budget: an empty value gives no size"},
      {"train --steps 1 --stages 2 --layout ''", "--layout: an empty layout places no layer"},
      {"simulate --stages 2 --compare ''", "--compare: an empty list names no schedule"},
  };
  for (const auto& [args, message] : cases) {
    const CliResult r = Sluice(args);
    EXPECT_EQ(r.status, static_cast<int>(CLI::ExitCodes::ValidationError)) << args << r.err;
    EXPECT_THAT(r.err, HasSubstr(message)) << args;
  }
}

// --skip-nonfinite N: a diverging run goes on past its non-finite steps, warning about each, and
// the checkpoint it saves holds the last good state; on two stages alike.
TEST_F(BadInputCli, SkippedNonFiniteStepsAreWarnedCountedAndNotSaved) {
  for (const char* model : {kTiny, kTwoStages}) {
    const fs::path ck = dir_ / "ck.safetensors", metrics = dir_ / "m.jsonl";
    const CliResult r = Sluice(fmt::format(
        "train {} --steps 4 --microbatches 2 --lr 1e30 --lr-schedule constant --skip-nonfinite 10 "
        "--metrics {} "
        "--save {}",
        model, metrics.string(), ck.string()));
    ASSERT_EQ(r.status, 0) << model << "\n" << r.err;
    EXPECT_THAT(r.err, HasSubstr("sluice: warning: step 4: the loss is")) << model;
    EXPECT_THAT(r.err, HasSubstr("of --skip-nonfinite 10)")) << model;
    std::string line, summary;  // the last line
    for (std::istringstream in(ReadFile(metrics)); std::getline(in, line);) summary = line;
    EXPECT_THAT(summary, HasSubstr("\"summary\":true")) << model;
    EXPECT_THAT(summary, HasSubstr("\"skipped\":")) << model;
    EXPECT_THAT(summary, Not(HasSubstr("\"skipped\":0"))) << model;
    EXPECT_TRUE(fs::exists(ck)) << model;  // a checkpoint holding NaN would have been refused
    fs::remove(ck);
    fs::remove(metrics);
  }
  EXPECT_THAT(Refused("train --steps 1 --skip-nonfinite -1"),
              HasSubstr("--skip-nonfinite must be 0 (stop at the first) or more, got -1"));
}

// Regression: a stage failing mid-step (a skipped receive) read past its micro-batches and could
// crash; every skipped or failing action of either stage is now an error naming the stage.
TEST_F(BadInputCli, EveryFaultInjectionPointIsACleanError) {
  for (const char* action : {"F", "B", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "OPT"}) {
    for (const std::string mode : {"skip", "throw"}) {
      for (int stage : {0, 1}) {
        const std::string fault = fmt::format("{}:{}:{}:0", mode, stage, action);
        const CliResult r = Sluice(
            fmt::format("train {} --steps 1 --microbatches 2 --comm-timeout 0.5 --inject-fault {}",
                        kTwoStages, fault));
        // A skip that finds no such action on the stage skips nothing and trains normally.
        EXPECT_TRUE(r.status == 0 || r.status == 1) << fault << "\n" << r.err;
        EXPECT_THAT(r.err, Not(HasSubstr("internal error"))) << fault;
        // Stage 0 receives no forward and sends no gradient; stage 1 the other way round.
        const std::string a = action;
        const bool exists =
            stage == 0 ? a != "RECV_F" && a != "SEND_B" : a != "SEND_F" && a != "RECV_B";
        if (mode == "throw") {
          EXPECT_EQ(r.status, exists ? 1 : 0) << fault << "\n" << r.err;
        }
        if (r.status == 1) {
          EXPECT_THAT(r.err, HasSubstr("stage ")) << fault << "\n" << r.err;
        }
      }
    }
  }
}

}  // namespace
}  // namespace sluice
