// The memory forecast against real runs: on one stage it equals the allocator's measured peak to
// the byte; on every pipeline stage the measured peak lies in [least, forecast] — the peak if
// every send completed at once, and the peak if each completed only once its receive was
// certainly posted — a bracket one stage output wide at most for gpipe and 1f1b (two for zb-h1,
// three for zb-h2 and the V-shaped, four chunk outputs for interleaved): over every schedule, P =
// 1, 2 and 4, every recompute policy and two model sizes. Also: what the peak consists of adds up,
// and the per-stage policy list is honoured.
#include "sluice/pipeline/memory_forecast.h"

#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <string_view>

#include <gtest/gtest.h>

#include "sluice/kernels/conv.h"
#include "sluice/kernels/onednn_conv.h"
#include "sluice/pipeline/pipeline_engine.h"
#include "sluice/train/single_stage.h"
#include "sluice/train/trainer.h"

namespace sluice::pipeline {
namespace {

struct Size {
  const char* name;
  int layers, heads, dim;
};
constexpr Size kSizes[] = {{"small", 8, 2, 32}, {"wider", 8, 4, 64}};

TrainConfig Config(const Size& size, RecomputePolicy policy, int64_t microbatches) {
  TrainConfig c;
  c.gpt = {.vocab = 0, .seq = 0, .layers = size.layers, .heads = size.heads, .dim = size.dim};
  c.steps = 2;
  c.batch = 2 * microbatches;
  c.microbatches = microbatches;
  c.threads = 1;
  c.eval_every = 0;
  c.recompute = {policy};
  return c;
}

// The forecast and the measured peaks (max over two steps), one entry per stage.
struct Compared {
  std::vector<StageMemoryForecast> forecast;
  std::vector<int64_t> measured;
  int64_t output_bytes = 0;  // one stage output: [micro-batch, T, C] f32
};

// `interlocked`: through Trainer::Run, which announces each next step (post-validation then
// interlocks the steps); otherwise one Trainer::Step at a time.
Compared Compare(const TrainConfig& config, const PipelineOptions* options,
                 bool interlocked = false) {
  Compared out;
  auto output_bytes = [&](const EngineContext& ctx) {
    return config.batch / config.microbatches * ctx.task.seq_len() * ctx.task.gpt()->dim *
           static_cast<int64_t>(sizeof(float));
  };
  const PipelineEngine* engine = nullptr;
  EngineFactory factory;
  if (options != nullptr) {
    factory = [&](const EngineContext& ctx) -> std::unique_ptr<StepEngine> {
      out.forecast = ForecastPipeline(ctx, *options);
      out.output_bytes = output_bytes(ctx);
      auto e = std::make_unique<PipelineEngine>(ctx, *options);
      engine = e.get();
      return e;
    };
  } else {
    factory = [&](const EngineContext& ctx) -> std::unique_ptr<StepEngine> {
      out.forecast = {ForecastSingleStage(ctx.model, ctx.config)};
      return MakeSingleStageEngine(ctx);
    };
  }
  Trainer trainer(config, factory);
  int64_t single_peak = 0;
  if (interlocked) {
    trainer.Run(
        [&](const StepRecord& r) { single_peak = std::max(single_peak, r.peak_allocated_bytes); });
  } else {
    for (int64_t s = 0; s < config.steps; ++s) {
      single_peak = std::max(single_peak, trainer.Step().peak_allocated_bytes);
    }
  }
  if (engine != nullptr) {
    for (const StageReport& r : engine->reports()) out.measured.push_back(r.peak_allocated_bytes);
  } else {
    out.measured = {single_peak};
  }
  return out;
}

std::string Describe(const StageMemoryForecast& f) {
  std::string s = fmt::format("forecast {} B at {} [{}]:", f.peak_allocated_bytes, f.peak_phase,
                              f.peak_instruction);
  for (const auto& [use, name] : kMemoryUseNames) s += fmt::format(" {} {}", name, f.at_peak[use]);
  return s;
}

constexpr RecomputePolicy kPolicies[] = {RecomputePolicy::kNone, RecomputePolicy::kCheap,
                                         RecomputePolicy::kSelective, RecomputePolicy::kFull,
                                         RecomputePolicy::kSublayer};

TEST(MemoryForecast, OneStageIsExact) {
  for (const Size& size : kSizes) {
    for (RecomputePolicy policy : kPolicies) {
      const Compared c = Compare(Config(size, policy, 4), nullptr);
      ASSERT_EQ(c.forecast.size(), 1u);
      EXPECT_EQ(c.forecast[0].peak_allocated_bytes, c.measured[0])
          << size.name << " " << Name(policy) << ": " << Describe(c.forecast[0]);
      EXPECT_EQ(c.forecast[0].at_peak.total(), c.forecast[0].peak_allocated_bytes);
    }
  }
}

// Trains `program` (text) two steps of batch 4 in micro-batches of 2 on the blobs under every
// recompute policy: the one-stage forecast must equal the measured peak and hold at least
// `scratch_bytes`, the largest convolution's im2col scratch.
void ExpectExactWithScratch(const std::string& program, int64_t scratch_bytes) {
  const std::string path =
      fmt::format("{}/conv_forecast_{}.sluice", ::testing::TempDir(), static_cast<int>(getpid()));
  std::ofstream(path) << program;
  for (RecomputePolicy policy : kPolicies) {
    TrainConfig c;
    c.model = "program";
    c.program = path;
    c.data = "blobs";
    c.steps = 2;
    c.batch = 4;
    c.microbatches = 2;
    c.threads = 1;
    c.eval_every = 0;
    c.recompute = {policy};
    const Compared compared = Compare(c, nullptr);
    ASSERT_EQ(compared.forecast.size(), 1u);
    EXPECT_EQ(compared.forecast[0].peak_allocated_bytes, compared.measured[0])
        << Name(policy) << ": " << Describe(compared.forecast[0]);
    EXPECT_GE(compared.forecast[0].peak_allocated_bytes, scratch_bytes)
        << "the convolution's scratch";
  }
  std::remove(path.c_str());
}

// A convolution's kernel takes one image's im2col matrix as scratch (8·5·5 · 12·12 floats here,
// larger than every activation of the micro-batch): the forecast holds it at the instruction, so
// the one-stage forecast stays exact, under every recompute policy.
TEST(MemoryForecast, OneStageIsExactWithAConvolutionsScratch) {
  ExpectExactWithScratch(R"(program conv {
  input %x: f32[B, 144] = x
  input %y: i64[B] = labels
  param %c1.weight: f32[8, 1, 5, 5] = normal(0, 0.2)
  param %c2.weight: f32[8, 8, 5, 5] = normal(0, 0.1)
  param %out.weight: f32[8, 4] = normal(0, 0.1)
  unit conv {
    %image: f32[B, 1, 12, 12] = reshape(%x) {shape = [B, 1, 12, 12]}
    %h1: f32[B, 8, 12, 12] = conv2d(%image, %c1.weight) {padding = [2, 2], stride = [1, 1]}
    %a1: f32[B, 8, 12, 12] = relu(%h1)
    %h2: f32[B, 8, 12, 12] = conv2d(%a1, %c2.weight) {padding = [2, 2], stride = [1, 1]}
    %p: f32[B, 8, 1, 1] = avg_pool2d(%h2) {kernel = [12, 12], stride = [12, 12]}
  }
  unit head {
    %f: f32[B, 8] = reshape(%p) {shape = [B, 8]}
    %logits: f32[B, 4] = matmul(%f, %out.weight)
    %loss: f32[] = cross_entropy(%logits, %y)
  }
  output %loss
}
)",
                         8 * 25 * 144 * int64_t{4});
}

// A convolution on oneDNN (kernels/onednn_conv.h: 16 channels in, 32 out, a 5x5 window, on 38x38
// images, one image a chunk) takes the blocked chunk, the blocked weights and, for its weight
// gradient, a blocked and a plain gradient as scratch: the forecast holds it.
TEST(MemoryForecast, OneStageIsExactWithAOneDnnConvolutionsScratch) {
  const kernels::Conv2dDims d = kernels::Conv2dShape(2, 16, 38, 38, 32, 5, 5, {1, 1}, {2, 2});
  ASSERT_TRUE(kernels::OneDnnConvolves(d));
  ExpectExactWithScratch(R"(program conv {
  input %x: f32[B, 144] = x
  input %y: i64[B] = labels
  param %c1.weight: f32[16, 1, 3, 3] = normal(0, 0.2)
  param %c2.weight: f32[32, 16, 5, 5] = normal(0, 0.05)
  param %out.weight: f32[32, 4] = normal(0, 0.1)
  unit conv {
    %image: f32[B, 1, 12, 12] = reshape(%x) {shape = [B, 1, 12, 12]}
    %h1: f32[B, 16, 38, 38] = conv2d(%image, %c1.weight) {padding = [14, 14], stride = [1, 1]}
    %a1: f32[B, 16, 38, 38] = relu(%h1)
    %h2: f32[B, 32, 38, 38] = conv2d(%a1, %c2.weight) {padding = [2, 2], stride = [1, 1]}
    %p: f32[B, 32, 1, 1] = avg_pool2d(%h2) {kernel = [38, 38], stride = [38, 38]}
  }
  unit head {
    %f: f32[B, 32] = reshape(%p) {shape = [B, 32]}
    %logits: f32[B, 4] = matmul(%f, %out.weight)
    %loss: f32[] = cross_entropy(%logits, %y)
  }
  output %loss
}
)",
                         kernels::Conv2dScratchBytes(d, kernels::Conv2dPass::kGradWeight, 4));
}

// Grouped, dilated and transposed convolutions: a dilated depthwise one, one in 4 groups (strided)
// and nn.ConvTranspose2d's conv2d_grad_input back to 38x38, each with its scratch (oneDNN's
// chunks, or none for the direct depthwise kernels) and its gradients' scratch in the backward:
// the forecast holds them all.
TEST(MemoryForecast, OneStageIsExactWithGroupedDilatedAndTransposedConvolutions) {
  const kernels::Conv2dDims grouped =
      kernels::Conv2dShape(2, 16, 38, 38, 32, 3, 3, {2, 2}, {1, 1}, {1, 1}, 4);
  ExpectExactWithScratch(R"(program conv {
  input %x: f32[B, 144] = x
  input %y: i64[B] = labels
  param %c1.weight: f32[16, 1, 3, 3] = normal(0, 0.2)
  param %dw.weight: f32[16, 1, 3, 3] = normal(0, 0.2)
  param %g.weight: f32[32, 4, 3, 3] = normal(0, 0.1)
  param %up.weight: f32[32, 8, 2, 2] = normal(0, 0.1)
  param %out.weight: f32[8, 4] = normal(0, 0.1)
  unit conv {
    %image: f32[B, 1, 12, 12] = reshape(%x) {shape = [B, 1, 12, 12]}
    %h1: f32[B, 16, 38, 38] = conv2d(%image, %c1.weight) {padding = [14, 14], stride = [1, 1]}
    %a1: f32[B, 16, 38, 38] = relu(%h1)
    %h2: f32[B, 16, 38, 38] = conv2d(%a1, %dw.weight) {dilation = [2, 2], groups = 16, padding = [2, 2], stride = [1, 1]}
    %h3: f32[B, 32, 19, 19] = conv2d(%h2, %g.weight) {groups = 4, padding = [1, 1], stride = [2, 2]}
    %a3: f32[B, 32, 19, 19] = relu(%h3)
    %h4: f32[B, 8, 38, 38] = conv2d_grad_input(%a3, %up.weight) {height = 38, padding = [0, 0], stride = [2, 2], width = 38}
    %p: f32[B, 8, 1, 1] = avg_pool2d(%h4) {kernel = [38, 38], stride = [38, 38]}
  }
  unit head {
    %f: f32[B, 8] = reshape(%p) {shape = [B, 8]}
    %logits: f32[B, 4] = matmul(%f, %out.weight)
    %loss: f32[] = cross_entropy(%logits, %y)
  }
  output %loss
}
)",
                         kernels::Conv2dScratchBytes(grouped, kernels::Conv2dPass::kGradWeight, 4));
}

// A small batch's convolution stays on im2col where oneDNN's blocked weights and weight gradients
// would outgrow the convolution's own input and output: the same 64-channel 3x3 convolution on
// 8x8 images runs on im2col at batch 1 and on oneDNN at batch 32.
TEST(MemoryForecast, ASmallBatchsConvolutionStaysOnIm2colWhereOneDnnsScratchIsLarger) {
  if (std::string_view(kernels::Fp32ConvEngineName()) != "onednn") GTEST_SKIP() << "SLUICE_CONV";
  const auto at = [](int64_t batch) {
    return kernels::Conv2dShape(batch, 64, 8, 8, 64, 3, 3, {1, 1}, {1, 1});
  };
  EXPECT_FALSE(kernels::OneDnnConvolves(at(1)));
  EXPECT_TRUE(kernels::OneDnnConvolves(at(32)));
}

// Past kConv2dColsBudget the im2col comes in blocks of output rows (here 3 of the 38 rows of the
// second convolution, 16·5·5 · 3·38 floats, within the micro-batch's input of 2·16·38·38): the
// forecast counts the block, which the kernel allocates, not a whole image's matrix.
TEST(MemoryForecast, OneStageIsExactWithABlockedConvolutionsScratch) {
  const kernels::Conv2dDims d = kernels::Conv2dShape(2, 16, 38, 38, 8, 5, 5, {1, 1}, {2, 2});
  ASSERT_LT(kernels::Conv2dBlockRows(d), d.out_h);
  ExpectExactWithScratch(R"(program conv {
  input %x: f32[B, 144] = x
  input %y: i64[B] = labels
  param %c1.weight: f32[16, 1, 3, 3] = normal(0, 0.2)
  param %c2.weight: f32[8, 16, 5, 5] = normal(0, 0.1)
  param %out.weight: f32[8, 4] = normal(0, 0.1)
  unit conv {
    %image: f32[B, 1, 12, 12] = reshape(%x) {shape = [B, 1, 12, 12]}
    %h1: f32[B, 16, 38, 38] = conv2d(%image, %c1.weight) {padding = [14, 14], stride = [1, 1]}
    %a1: f32[B, 16, 38, 38] = relu(%h1)
    %h2: f32[B, 8, 38, 38] = conv2d(%a1, %c2.weight) {padding = [2, 2], stride = [1, 1]}
    %p: f32[B, 8, 1, 1] = avg_pool2d(%h2) {kernel = [38, 38], stride = [38, 38]}
  }
  unit head {
    %f: f32[B, 8] = reshape(%p) {shape = [B, 8]}
    %logits: f32[B, 4] = matmul(%f, %out.weight)
    %loss: f32[] = cross_entropy(%logits, %y)
  }
  output %loss
}
)",
                         kernels::Conv2dColsElements(d) * int64_t{4});
}

// An image whose im2col needs blocks gets blocks of at most kConv2dColsBudget values, and at
// most as many as the convolution's input holds (one output row at least): at batch 1 a ResNet's
// 3x3 convolution of 32 channels on 16x16 takes one row (4,608 values) where the budget alone
// would give 14 (64,512 values, 8x the input); from batch 8 the budget binds. An image within the
// budget stays one block.
TEST(MemoryForecast, ASmallBatchsIm2colStaysWithinItsInput) {
  using kernels::Conv2dBlockRows;
  using kernels::Conv2dShape;
  EXPECT_EQ(Conv2dBlockRows(Conv2dShape(1, 32, 16, 16, 32, 3, 3, {1, 1}, {1, 1})), 1);
  EXPECT_EQ(Conv2dBlockRows(Conv2dShape(4, 32, 16, 16, 32, 3, 3, {1, 1}, {1, 1})), 7);
  EXPECT_EQ(Conv2dBlockRows(Conv2dShape(8, 32, 16, 16, 32, 3, 3, {1, 1}, {1, 1})), 14);
  EXPECT_EQ(Conv2dBlockRows(Conv2dShape(64, 32, 16, 16, 32, 3, 3, {1, 1}, {1, 1})), 14);
  EXPECT_EQ(Conv2dBlockRows(Conv2dShape(1, 1, 12, 12, 8, 5, 5, {1, 1}, {2, 2})), 12);
  // A row of more values than the input (1024·3·3 · 4 against 1024·4·4) is still one block.
  EXPECT_EQ(Conv2dBlockRows(Conv2dShape(1, 1024, 4, 4, 8, 3, 3, {1, 1}, {1, 1})), 1);
}

// Batch norm (a ResNet's convolution, batch norm and ReLU, twice, the second a residual): its
// kernels take no scratch, the running statistics are buffers held like parameters, and the
// update writes them in place; the one-stage forecast stays exact under every recompute policy.
TEST(MemoryForecast, OneStageIsExactWithBatchNorm) {
  ExpectExactWithScratch(R"(program resnet {
  input %x: f32[B, 144] = x
  input %y: i64[B] = labels
  param %c1.weight: f32[8, 1, 3, 3] = normal(0, 0.2)
  param %bn1.weight: f32[8] = ones
  param %bn1.bias: f32[8] = zeros
  buffer %bn1.running_mean: f32[8] = zeros
  buffer %bn1.running_var: f32[8] = ones
  param %c2.weight: f32[8, 8, 3, 3] = normal(0, 0.1)
  param %bn2.weight: f32[8] = ones
  param %bn2.bias: f32[8] = zeros
  buffer %bn2.running_mean: f32[8] = zeros
  buffer %bn2.running_var: f32[8] = ones
  param %out.weight: f32[8, 4] = normal(0, 0.1)
  unit stem {
    %image: f32[B, 1, 12, 12] = reshape(%x) {shape = [B, 1, 12, 12]}
    %h1: f32[B, 8, 12, 12] = conv2d(%image, %c1.weight) {padding = [1, 1], stride = [1, 1]}
    %n1: f32[B, 8, 12, 12] = batch_norm(%h1, %bn1.weight, %bn1.bias, %bn1.running_mean, %bn1.running_var)
    batch_norm_update_stats(%h1, %bn1.running_mean, %bn1.running_var) {momentum = 0.1}
    %a1: f32[B, 8, 12, 12] = relu(%n1)
  }
  unit block {
    %h2: f32[B, 8, 12, 12] = conv2d(%a1, %c2.weight) {padding = [1, 1], stride = [1, 1]}
    %n2: f32[B, 8, 12, 12] = batch_norm(%h2, %bn2.weight, %bn2.bias, %bn2.running_mean, %bn2.running_var)
    batch_norm_update_stats(%h2, %bn2.running_mean, %bn2.running_var) {momentum = 0.1}
    %r: f32[B, 8, 12, 12] = add(%n2, %a1)
    %a2: f32[B, 8, 12, 12] = relu(%r)
    %p: f32[B, 8, 1, 1] = avg_pool2d(%a2) {kernel = [12, 12], stride = [12, 12]}
  }
  unit head {
    %f: f32[B, 8] = reshape(%p) {shape = [B, 8]}
    %logits: f32[B, 4] = matmul(%f, %out.weight)
    %loss: f32[] = cross_entropy(%logits, %y)
  }
  output %loss
}
)",
                         0);
}

// Dropout keeps no mask: backward draws it again from the examples' keys (8 bytes each, an input
// like the data). The one-stage forecast stays exact under every recompute policy with two
// dropouts, one on the residual branch, one on the hidden layer.
TEST(MemoryForecast, OneStageIsExactWithDropout) {
  ExpectExactWithScratch(R"(program dropout {
  input %x: f32[B, 16] = x
  input %y: i64[B] = labels
  input %key: i64[B] = random_key
  param %in.weight: f32[16, 32] = normal(0, 0.2)
  param %fc.weight: f32[32, 64] = normal(0, 0.1)
  param %back.weight: f32[64, 32] = normal(0, 0.1)
  param %out.weight: f32[32, 4] = normal(0, 0.1)
  unit in {
    %h: f32[B, 32] = matmul(%x, %in.weight)
  }
  unit block {
    %f: f32[B, 64] = matmul(%h, %fc.weight)
    %g: f32[B, 64] = gelu(%f)
    %gd: f32[B, 64] = dropout(%g, %key) {p = 0.2, stream = 0}
    %b: f32[B, 32] = matmul(%gd, %back.weight)
    %bd: f32[B, 32] = dropout(%b, %key) {p = 0.1, stream = 1}
    %r: f32[B, 32] = add(%h, %bd)
  }
  unit head {
    %logits: f32[B, 4] = matmul(%r, %out.weight)
    %loss: f32[] = cross_entropy(%logits, %y)
  }
  output %loss
}
)",
                         0);
}

TEST(MemoryForecast, PipelineStagesLieBetweenTheLeastAndTheForecastPeak) {
  const ScheduleKind kinds[] = {ScheduleKind::kGPipe,        ScheduleKind::kOneFOneB,
                                ScheduleKind::kInterleaved,  ScheduleKind::kZeroBubbleH1,
                                ScheduleKind::kZeroBubbleH2, ScheduleKind::kZeroBubbleV,
                                ScheduleKind::kVHalf,        ScheduleKind::kVMin};
  for (const Size& size : kSizes) {
    for (RecomputePolicy policy : kPolicies) {
      for (ScheduleKind kind : kinds) {
        for (int P : {2, 4}) {
          const PipelineOptions options{.stages = P, .schedule = kind};
          const Compared c = Compare(Config(size, policy, 8), &options);
          ASSERT_EQ(c.forecast.size(), c.measured.size());
          for (size_t s = 0; s < c.measured.size(); ++s) {
            const std::string what =
                fmt::format("{} {} {} P={} stage {}: measured {} B, {}", size.name, Name(policy),
                            ScheduleKindName(kind), P, s, c.measured[s], Describe(c.forecast[s]));
            const StageMemoryForecast& f = c.forecast[s];
            EXPECT_LE(c.measured[s], f.peak_allocated_bytes) << what;
            EXPECT_GE(c.measured[s], f.least_peak_allocated_bytes) << what;
            // How many messages' timing is in doubt at the peak, at most (docs/memory.md).
            // GPipe holds every forward's output until the backwards begin: once weight
            // gradients accumulate in place the backwards peak lower, and its bracket is set by
            // the forwards' messages (1 output and a few hundred bytes on the small model). 1F1B's
            // middle stages without recompute peak at the receive of a gradient once outputs are
            // written over dying inputs (the backward's working set is smaller): two messages.
            const int64_t doubt = kind == ScheduleKind::kInterleaved                       ? 4
                                  : kind == ScheduleKind::kZeroBubbleH2 || IsVShaped(kind) ? 3
                                                                                           : 2;
            EXPECT_LE(f.peak_allocated_bytes - f.least_peak_allocated_bytes, doubt * c.output_bytes)
                << what;
            EXPECT_EQ(c.forecast[s].at_peak.total(), c.forecast[s].peak_allocated_bytes) << what;
          }
        }
      }
    }
  }
}

// Under bf16 the pipeline's messages, their gradients and the unit inputs full recompute keeps
// are bf16 (ir/autocast.h, StageProgram): the forecast still equals one stage's measured peak and
// brackets every rank's, at P = 2 and 4, under every policy.
TEST(MemoryForecast, HoldsUnderBf16) {
  const Size& size = kSizes[0];
  for (RecomputePolicy policy : kPolicies) {
    TrainConfig config = Config(size, policy, 8);
    config.gpt.precision = Precision::kBf16;
    const Compared one = Compare(config, nullptr);
    EXPECT_EQ(one.forecast[0].peak_allocated_bytes, one.measured[0])
        << Name(policy) << ": " << Describe(one.forecast[0]);
    for (int P : {2, 4}) {
      const PipelineOptions options{.stages = P, .schedule = ScheduleKind::kOneFOneB};
      const Compared c = Compare(config, &options);
      ASSERT_EQ(c.forecast.size(), c.measured.size());
      for (size_t s = 0; s < c.measured.size(); ++s) {
        const std::string what = fmt::format("{} P={} stage {}: measured {} B, {}", Name(policy), P,
                                             s, c.measured[s], Describe(c.forecast[s]));
        EXPECT_LE(c.measured[s], c.forecast[s].peak_allocated_bytes) << what;
        EXPECT_GE(c.measured[s], c.forecast[s].least_peak_allocated_bytes) << what;
      }
    }
  }
}

// The forecast of each rank, with every tensor live at its peak (explained).
std::vector<StageMemoryForecast> Explained(const TrainConfig& config,
                                           const PipelineOptions& options) {
  std::vector<StageMemoryForecast> out;
  Trainer trainer(config, [&](const EngineContext& ctx) -> std::unique_ptr<StepEngine> {
    out = ForecastPipeline(ctx, options, /*replicas=*/1, /*explain=*/true);
    return std::make_unique<PipelineEngine>(ctx, options);
  });
  return out;
}

// What a rank holds of its received messages at its peak, by name and type: under bf16 the
// inputs it keeps ("x", one per micro-batch in flight under full recompute) and a received
// gradient ("y.grad") take half fp32's bytes.
TEST(MemoryForecast, Bf16MessagesAndTheirGradientsTakeHalfTheBytes) {
  TrainConfig config = Config(kSizes[0], RecomputePolicy::kFull, 4);
  const PipelineOptions options{.stages = 2, .schedule = ScheduleKind::kGPipe};
  const std::vector<StageMemoryForecast> fp32 = Explained(config, options);
  config.gpt.precision = Precision::kBf16;
  const std::vector<StageMemoryForecast> bf16 = Explained(config, options);
  auto held = [](const StageMemoryForecast& f, const std::string& name, const std::string& type) {
    int64_t count = 0, bytes = 0;
    for (const LiveTensor& t : f.live_at_peak) {
      if (t.name != name) continue;
      EXPECT_EQ(t.type.substr(0, type.size()), type) << name << ": " << t.type;
      ++count;
      bytes += t.bytes;
    }
    return std::pair{count, bytes};
  };
  const auto [n32, bytes32] = held(fp32[1], "x", "f32[");
  const auto [n16, bytes16] = held(bf16[1], "x", "bf16[");
  EXPECT_GT(n32, 0) << "the last stage keeps no received input at its peak: nothing is compared";
  EXPECT_EQ(n16, n32);
  EXPECT_EQ(2 * bytes16, bytes32);
  held(fp32[0], "y.grad", "f32[");
  held(bf16[0], "y.grad", "bf16[");
}

// Post-validation keeps a copy of every rank's parameters and optimizer state for a rollback, and,
// as consecutive steps interlock, the previous step's gradients for its redo: the forecast holds
// both for the whole step (a run's steps after the first do), exactly their bytes above the
// synchronous forecast, and still brackets the measured peaks of runs one step at a time and of
// interlocked runs (Trainer::Run) alike.
TEST(MemoryForecast, PostValidationsRollbackCopyIsForecastAndBracketsTheMeasuredPeak) {
  for (ScheduleKind kind :
       {ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubbleH2, ScheduleKind::kZeroBubbleV}) {
    for (int P : {2, 4}) {
      const PipelineOptions sync{.stages = P, .schedule = kind};
      PipelineOptions eager = sync;
      eager.post_validate = true;
      TrainConfig config = Config(kSizes[0], RecomputePolicy::kCheap, 8);
      config.steps = 3;
      config.optimizer.clip_norm = 0.05;  // every step rolled back and redone
      const Compared with = Compare(config, &eager), without = Compare(config, &sync),
                     interlocked = Compare(config, &eager, /*interlocked=*/true);
      ASSERT_EQ(with.forecast.size(), with.measured.size());
      for (size_t s = 0; s < with.measured.size(); ++s) {
        const StageMemoryForecast& f = with.forecast[s];
        const std::string what =
            fmt::format("{} P={} stage {}: measured {} B, {}", ScheduleKindName(kind), P, s,
                        with.measured[s], Describe(f));
        EXPECT_GT(f.rollback_bytes, 0) << what;
        EXPECT_EQ(without.forecast[s].rollback_bytes, 0) << what;
        EXPECT_GT(f.interlock_bytes, 0) << what;
        EXPECT_EQ(without.forecast[s].interlock_bytes, 0) << what;
        const int64_t kept = f.rollback_bytes + f.interlock_bytes;
        EXPECT_EQ(f.peak_allocated_bytes, without.forecast[s].peak_allocated_bytes + kept) << what;
        EXPECT_EQ(f.persistent_bytes, without.forecast[s].persistent_bytes + kept) << what;
        EXPECT_LE(with.measured[s], f.peak_allocated_bytes) << what;
        EXPECT_LE(interlocked.measured[s], f.peak_allocated_bytes) << what << " (interlocked)";
        // The least peak assumes the gradients kept for a redo, which only interlocked steps hold.
        EXPECT_GE(interlocked.measured[s], f.least_peak_allocated_bytes)
            << what << " (interlocked)";
        EXPECT_GE(with.measured[s], f.least_peak_allocated_bytes - f.interlock_bytes) << what;
      }
    }
  }
}

TEST(MemoryForecast, PerStagePoliciesApplyToTheirStage) {
  TrainConfig config = Config(kSizes[0], RecomputePolicy::kNone, 8);
  config.recompute = {RecomputePolicy::kFull, RecomputePolicy::kNone};
  const PipelineOptions options{.stages = 2, .schedule = ScheduleKind::kOneFOneB};
  const Compared mixed = Compare(config, &options);
  config.recompute = {RecomputePolicy::kNone};
  const Compared none = Compare(config, &options);
  EXPECT_LT(mixed.forecast[0].peak_allocated_bytes, none.forecast[0].peak_allocated_bytes);
  EXPECT_EQ(mixed.forecast[1].peak_allocated_bytes, none.forecast[1].peak_allocated_bytes);
  for (size_t s = 0; s < 2; ++s)
    EXPECT_LE(mixed.measured[s], mixed.forecast[s].peak_allocated_bytes);
}

TEST(MemoryForecast, TheBreakdownNamesWhatDominates) {
  const PipelineOptions options{.stages = 2, .schedule = ScheduleKind::kGPipe};
  const Compared c = Compare(Config(kSizes[1], RecomputePolicy::kNone, 8), &options);
  const StageMemoryForecast& f = c.forecast[0];
  // GPipe holds every micro-batch's activations on stage 0 when its first backward starts.
  EXPECT_GT(f.at_peak[MemoryUse::kActivations], f.at_peak[MemoryUse::kParameters]);
  EXPECT_GT(f.at_peak[MemoryUse::kParameters], 0);
  EXPECT_EQ(f.at_peak[MemoryUse::kOptimizerState], 2 * f.at_peak[MemoryUse::kParameters]);
  EXPECT_NE(f.peak_phase.find("B of micro-batch"), std::string::npos) << f.peak_phase;
}

}  // namespace
}  // namespace sluice::pipeline

namespace sluice::pipeline {
namespace {

TEST(MemoryForecast, AStepThatWouldExceedTheBudgetStopsWithAClearError) {
  TrainConfig config = Config(kSizes[0], RecomputePolicy::kCheap, 4);
  const PipelineOptions options{.stages = 2, .schedule = ScheduleKind::kOneFOneB};
  const Compared free_run = Compare(config, &options);
  // Stage 1 gets room for its parameters and state (and the pages and 512-byte blocks they are
  // reserved in), not for its step.
  const int64_t stage1 = free_run.forecast[1].persistent_bytes + (64 << 10);
  ASSERT_LT(stage1, free_run.forecast[1].peak_reserved_bytes);
  config.memory_budget = {free_run.forecast[0].peak_reserved_bytes, stage1};
  Trainer trainer(config, PipelineEngineFactory(options));
  try {
    trainer.Step();
    FAIL() << "the step exceeded its budget";
  } catch (const StageError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("stage 1 failed at step 1"), std::string::npos) << message;
    EXPECT_NE(message.find("over the memory budget"), std::string::npos) << message;
  }
}

}  // namespace
}  // namespace sluice::pipeline
