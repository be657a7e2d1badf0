// Training throughput and peak tensor memory of `sluice train` (one stage), for the side-by-side
// comparison with PyTorch in bench/torch_train.py. Same model (GPT, by default vocab 256, 4 layers,
// 4 heads, C = 128, T = 64, batch 16, AdamW), random bytes as data (token ids below 256 whatever
// the vocabulary).
//
// Run: build/bench/train_bench [--threads N] [--steps 20] [--warmup 3] [--gc auto|none|sync|async]
//                              [--no-recompute] [--attention fused|naive] [--precision fp32|bf16]
//                              [--vocab 256] [--reserved-headroom 0.04]
//                              [--layers 4] [--heads 4] [--dim 128] [--seq 64] [--batch 16]
// Prints one JSON object: tokens_per_s (median step), step_ms_median, cpu_ms_median and cpu_ms_min
// (the process's CPU time per step, user + system, every thread: on a shared machine it moves less
// with the load than the wall time does, the minimum least, so A/B runs compare those), and
// peak_tensor_bytes — the
// trainer allocator's peak of requested bytes during a step: parameters, optimizer state,
// gradients and activations, every tensor the step holds (what the PyTorch side measures) — and
// minor_faults_median, the process's minor page faults a step (median): pages the allocator's
// headroom returned and a later request faulted in again (docs/memory.md, "Reserved bytes"), a
// count the load does not move. --reserved-headroom sets the allocator's headroom (sluice train's
// option of that name; 0 keeps the holes' pages).
// bench/compare_train.sh runs both sides at 1 and 2 threads and prints the ratios.
#include <sys/resource.h>
#include <unistd.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <random>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "sluice/kernels/blas.h"
#include "sluice/kernels/simd_kernels.h"
#include "sluice/train/trainer.h"

namespace {

// CPU time of the whole process (user + system, all threads), in ms.
double ProcessCpuMs() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto ms = [](const timeval& t) { return t.tv_sec * 1e3 + t.tv_usec / 1e3; };
  return ms(u.ru_utime) + ms(u.ru_stime);
}

// Minor page faults of the whole process so far.
int64_t ProcessMinorFaults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_minflt;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace sluice;
  int threads = 1;
  int64_t steps = 20, warmup = 3;
  std::string gc = "auto";  // the default of sluice train
  std::string attention = "fused";
  std::string precision = "fp32";
  bool recompute = true;
  GptConfig gpt{.vocab = 256, .seq = 64, .layers = 4, .heads = 4, .dim = 128};
  int64_t batch = 16;
  double reserved_headroom = TrainConfig{}.reserved_headroom;
  for (int i = 1; i < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--no-recompute") {
      recompute = false;
      --i;
      continue;
    }
    if (i + 1 >= argc) {
      fmt::print(stderr, "train_bench: {} needs a value\n", flag);
      return 2;
    }
    if (flag == "--threads")
      threads = std::atoi(argv[i + 1]);
    else if (flag == "--steps")
      steps = std::atoll(argv[i + 1]);
    else if (flag == "--warmup")
      warmup = std::atoll(argv[i + 1]);
    else if (flag == "--gc")
      gc = argv[i + 1];
    else if (flag == "--attention")
      attention = argv[i + 1];
    else if (flag == "--precision")
      precision = argv[i + 1];
    else if (flag == "--vocab")
      gpt.vocab = std::atoll(argv[i + 1]);
    else if (flag == "--layers")
      gpt.layers = std::atoll(argv[i + 1]);
    else if (flag == "--heads")
      gpt.heads = std::atoll(argv[i + 1]);
    else if (flag == "--dim")
      gpt.dim = std::atoll(argv[i + 1]);
    else if (flag == "--seq")
      gpt.seq = std::atoll(argv[i + 1]);
    else if (flag == "--batch")
      batch = std::atoll(argv[i + 1]);
    else if (flag == "--reserved-headroom") {
      char* end = nullptr;
      reserved_headroom = std::strtod(argv[i + 1], &end);
      if (end == argv[i + 1] || *end != '\0' ||
          !(reserved_headroom >= 0 && reserved_headroom <= 1)) {
        fmt::print(stderr,
                   "train_bench: --reserved-headroom must be a fraction from 0 to 1, not '{}'\n",
                   argv[i + 1]);
        return 2;
      }
    } else {
      fmt::print(stderr, "train_bench: unknown option {}\n", flag);
      return 2;
    }
  }
  const std::string data = fmt::format("/tmp/sluice_train_bench_{}.txt", ::getpid());
  {
    std::mt19937 rng(0);
    std::ofstream out(data, std::ios::binary);
    for (int i = 0; i < (1 << 20); ++i) out.put(static_cast<char>(rng() & 0xff));
  }
  TrainConfig c;
  c.data = data;
  const std::optional<GptAttention> attention_kind = ParseGptAttention(attention);
  if (!attention_kind) {
    fmt::print(stderr, "train_bench: --attention must be fused or naive, not '{}'\n", attention);
    return 2;
  }
  gpt.attention = *attention_kind;
  const std::optional<Precision> precision_kind = ParsePrecision(precision);
  if (!precision_kind) {
    fmt::print(stderr, "train_bench: --precision must be fp32 or bf16, not '{}'\n", precision);
    return 2;
  }
  gpt.precision = *precision_kind;
  c.gpt = gpt;
  c.batch = batch;
  c.steps = warmup + steps;
  c.optimizer = {.kind = OptimizerKind::kAdamW, .lr = 1e-3, .weight_decay = 0.1};
  c.threads = threads;
  const std::optional<GcMode> gc_mode = ParseGcMode(gc);
  if (!gc_mode) {
    fmt::print(stderr, "train_bench: --gc must be auto, none, sync or async, not '{}'\n", gc);
    return 2;
  }
  c.gc = *gc_mode;
  c.recompute = {recompute ? RecomputePolicy::kCheap : RecomputePolicy::kNone};
  c.reserved_headroom = reserved_headroom;
  Trainer trainer(c);
  std::vector<double> ms, cpu_ms;
  std::vector<int64_t> faults;
  int64_t peak = 0;
  for (int64_t s = 0; s < warmup + steps; ++s) {
    const double cpu0 = ProcessCpuMs();
    const int64_t faults0 = ProcessMinorFaults();
    StepRecord r = trainer.Step();
    if (s >= warmup) {
      cpu_ms.push_back(ProcessCpuMs() - cpu0);
      faults.push_back(ProcessMinorFaults() - faults0);
      ms.push_back(r.step_ms);
      peak = std::max(peak, r.peak_allocated_bytes);
    }
  }
  std::remove(data.c_str());
  std::sort(ms.begin(), ms.end());
  std::sort(cpu_ms.begin(), cpu_ms.end());
  std::sort(faults.begin(), faults.end());
  const double median = ms[ms.size() / 2];
  nlohmann::json out = {{"framework", "sluice"},
                        {"threads", threads},
                        {"gc", gc},
                        {"recompute", recompute},
                        {"attention", attention},
                        {"precision", precision},
                        {"simd", kernels::SimdTarget()},
                        {"blas", kernels::EnsureBlasKernels().core},
                        {"tokens_per_s", static_cast<double>(batch * gpt.seq) / (median / 1000.0)},
                        {"step_ms_median", median},
                        {"cpu_ms_median", cpu_ms[cpu_ms.size() / 2]},
                        {"cpu_ms_min", cpu_ms.front()},
                        {"reserved_headroom", reserved_headroom},
                        {"minor_faults_median", faults[faults.size() / 2]},
                        {"peak_tensor_bytes", peak}};
  fmt::print("{}\n", out.dump());
  return 0;
}
