// `sluice train` under the machine's limits: threads that an address-space limit (`ulimit -v`)
// cannot hold are refused before OpenBLAS starts them — they hung the run for ever before, in
// OpenBLAS's allocator, at the first GEMM or at exit — and a model the memory cannot hold is
// refused before its first allocation, naming the options that make it big. Each run is bounded
// by `timeout -s KILL`: a hang fails the test instead of stalling the suite.
#include <string>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cli/cli_fixture.h"

namespace sluice {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr const char* kTiny =
    "--layers 1 --dim 16 --heads 2 --batch 4 --eval-every 0 --eval-batches 1 --quiet --steps 1";

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool kSanitized = true;  // their shadow memory needs terabytes of address space
#else
constexpr bool kSanitized = false;
#endif

class ResourceLimitsCli : public CliTest {
 protected:
  // `sluice args` under `ulimit -v kib`, killed after 120 s (a hang: status -1).
  CliResult Limited(int64_t kib, const std::string& args) {
    const std::filesystem::path out = dir_ / "stdout.txt", err = dir_ / "stderr.txt";
    const std::string cmd = fmt::format(
        "timeout -s KILL 120 bash -c 'ulimit -v {} && exec \"$0\" \"$@\"' '{}' {} > '{}' 2> '{}'",
        kib, binary_, args, out.string(), err.string());
    const int raw = std::system(cmd.c_str());
    const int status = WIFEXITED(raw) ? WEXITSTATUS(raw) : -1;
    return {status == 137 ? -1 : status, ReadFile(out), ReadFile(err)};
  }
};

TEST_F(ResourceLimitsCli, ThreadsTheAddressSpaceCannotHoldAreRefusedNotHung) {
  if (kSanitized) GTEST_SKIP() << "a sanitizer's shadow memory does not fit under ulimit -v";
  struct Case {
    int64_t kib;
    int threads;
  };
  for (const Case c : {Case{8388608, 64}, Case{8388608, 1000}, Case{2097152, 16}}) {
    const CliResult r = Limited(c.kib, fmt::format("train {} --threads {}", kTiny, c.threads));
    EXPECT_EQ(r.status, 1) << "ulimit -v " << c.kib << ", --threads " << c.threads << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr(fmt::format("sluice: error: {} intra-op threads need", c.threads)))
        << c.threads;
    EXPECT_THAT(r.err, HasSubstr("the address-space limit (ulimit -v")) << c.threads;
    EXPECT_THAT(r.err, HasSubstr("ask for at most")) << c.threads;
  }
  // A count that fits trains under the same limit.
  const CliResult r = Limited(8388608, fmt::format("train {} --threads 2", kTiny));
  EXPECT_EQ(r.status, 0) << r.err;
}

// A model the memory cannot hold is refused before its first allocation, naming the options
// that make it big (`--dim 65536` failed in the allocator, `--dim 8192` only after 39 s and
// 7.3 GB). The limit is an address-space limit here, so that the test does not depend on the
// machine's memory: 4 GiB, and a GPT of --dim 4096 needs about 6 GiB (402 M parameters, AdamW).
TEST_F(ResourceLimitsCli, AModelTheMemoryCannotHoldIsRefusedBeforeAllocation) {
  if (kSanitized) GTEST_SKIP() << "a sanitizer's shadow memory does not fit under ulimit -v";
  for (const char* dim : {"4096", "65536"}) {
    const CliResult r = Limited(
        4194304, fmt::format("train --dim {} --heads 4 --steps 1 --threads 1 --quiet", dim));
    EXPECT_EQ(r.status, 1) << dim << ": " << r.err;
    EXPECT_THAT(r.err, HasSubstr("sluice: error: this run needs ")) << dim;
    EXPECT_THAT(r.err, HasSubstr("of tensor memory at its peak (the forecast of sluice plan: "
                                 "parameters "))
        << dim;
    EXPECT_THAT(r.err, HasSubstr("the address-space limit (ulimit -v, 4.00 GiB) leaves")) << dim;
    EXPECT_THAT(r.err, HasSubstr(fmt::format("the model's size makes most of it: --dim {} and "
                                             "--layers 2",
                                             dim)))
        << dim;
    EXPECT_THAT(r.err, HasSubstr("or pass --no-memory-check to try anyway")) << dim;
  }
  // What fits trains under the same limit.
  const CliResult r = Limited(4194304, fmt::format("train {} --threads 1", kTiny));
  EXPECT_EQ(r.status, 0) << r.err;
}

// `sluice run` of a program whose inputs and values the memory cannot hold is refused before
// its inputs are made (a program of 60000² inputs was attempted: an allocator failure, or the
// machine out of memory while the random inputs were written).
TEST_F(ResourceLimitsCli, ARunThatCannotFitIsRefusedBeforeItsInputsAreMade) {
  if (kSanitized) GTEST_SKIP() << "a sanitizer's shadow memory does not fit under ulimit -v";
  const std::filesystem::path program = Write("big.sluice", R"(program big {
  input %x: f32[B, 30000]
  %y: f32[B, 30000] = add(%x, %x)
  output %y
}
)");
  const CliResult r = Limited(2097152, fmt::format("run {} --size B=30000", program.string()));
  EXPECT_EQ(r.status, 1) << r.err;
  EXPECT_THAT(r.err, HasSubstr(fmt::format(
                         "sluice: error: {} needs at least 6.71 GiB of tensor memory (3.35 GiB of "
                         "inputs and parameters, 3.35 GiB at the peak of its order), and ",
                         program.string())));
  EXPECT_THAT(r.err, HasSubstr("the address-space limit (ulimit -v, 2.00 GiB) leaves"));
  EXPECT_THAT(r.err, HasSubstr("bind smaller sizes (--size) or pass --no-memory-check"));
  // What fits runs under the same limit.
  const CliResult small = Limited(2097152, fmt::format("run {} --size B=3", program.string()));
  EXPECT_EQ(small.status, 0) << small.err;
}

}  // namespace
}  // namespace sluice
