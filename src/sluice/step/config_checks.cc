#include "sluice/step/config_checks.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>

#include <fmt/format.h>

#include "sluice/core/error.h"
#include "sluice/core/thread_pool.h"

namespace sluice {

namespace {

[[noreturn]] void Refuse(std::string_view option, double value, std::string_view allowed) {
  throw InvalidArgument(fmt::format("{} must be {}, got {}", option, allowed, value));
}

// lo ≤ value (< hi when hi_open, ≤ hi otherwise), and finite.
void CheckReal(std::string_view option, double value, double lo, double hi, bool hi_open,
               std::string_view allowed) {
  if (!std::isfinite(value) || value < lo || value > hi || (hi_open && value == hi)) {
    Refuse(option, value, allowed);
  }
}

// The optimizer's rates reach the kernels as f32: a positive value below the smallest normal f32
// (`--lr 1e-320`, a subnormal even of a double) becomes 0 or a subnormal there, and one above the
// largest becomes infinite. 0 passes (the callers refuse it where it makes no sense).
constexpr double kMinNormalF32 = std::numeric_limits<float>::min();
constexpr double kMaxF32 = std::numeric_limits<float>::max();
void CheckF32(std::string_view option, double value, bool zero_allowed = true) {
  if (value != 0 && value < kMinNormalF32) {
    throw InvalidArgument(fmt::format(
        "{} must be {}at least {:.3g} (the smallest normal f32: the optimizer computes in f32, "
        "where {} is 0 or loses its precision), got {}",
        option, zero_allowed ? "0 or " : "", kMinNormalF32, value, value));
  }
  if (value > kMaxF32) {
    throw InvalidArgument(fmt::format(
        "{} must be at most {:.3g} (the largest f32: the optimizer computes in f32, where {} is "
        "infinite), got {}",
        option, kMaxF32, value, value));
  }
}

void CheckCount(std::string_view option, int64_t value, int64_t lo, std::string_view allowed,
                int64_t hi = INT64_MAX) {
  if (value < lo || value > hi) {
    throw InvalidArgument(fmt::format("{} must be {}, got {}", option, allowed, value));
  }
}

}  // namespace

void ValidateReservedHeadroom(double headroom) {
  CheckReal("--reserved-headroom", headroom, 0, 1, false,
            "a finite fraction from 0 (keep free blocks' pages) to 1");
}

void ValidateTrainRanges(const TrainConfig& c) {
  const OptimizerConfig& o = c.optimizer;
  constexpr double kInf = INFINITY;
  CheckReal("--lr", o.lr, 0, kInf, false, "a finite number above 0");
  if (o.lr == 0) Refuse("--lr", o.lr, "a finite number above 0");
  CheckF32("--lr", o.lr, /*zero_allowed=*/false);
  CheckReal("--min-lr", o.min_lr, 0, o.lr, false,
            fmt::format("a finite number from 0 to --lr ({})", o.lr));
  CheckF32("--min-lr", o.min_lr);
  CheckReal("--weight-decay", o.weight_decay, 0, kInf, false, "a finite number, 0 or more");
  CheckF32("--weight-decay", o.weight_decay);
  CheckReal("--beta1", o.beta1, 0, 1, true, "in [0, 1)");
  CheckReal("--beta2", o.beta2, 0, 1, true, "in [0, 1)");
  CheckReal("--momentum", o.momentum, 0, 1, true, "in [0, 1)");
  ValidateReservedHeadroom(c.reserved_headroom);
  CheckReal("--clip", o.clip_norm, 0, kInf, false, "a finite number, 0 (off) or more");
  if (o.clip_norm > 0 && o.clip_norm < kMinNormalF32) {
    Refuse("--clip", o.clip_norm,
           fmt::format("0 (off) or at least {:.3g} (the smallest normal f32: the f32 gradients "
                       "scaled to a smaller norm are 0)",
                       kMinNormalF32));
  }
  CheckCount("--warmup", o.warmup_steps, 0, "0 or more");
  CheckCount("--eval-every", c.eval_every, 0, "0 (only at the end) or more");
  CheckCount("--save-every", c.save_every, 0, "0 (only at the end) or more");
  CheckCount("--skip-nonfinite", c.skip_nonfinite, 0, "0 (stop at the first) or more");
  CheckCount("--seq", c.gpt.seq, 0, fmt::format("0 (the data's) to {}", kMaxSeq), kMaxSeq);
  CheckCount("--vocab", c.gpt.vocab, 0, fmt::format("0 (the data's) to {}", kMaxVocab), kMaxVocab);
  CheckCount("--batch", c.batch, 1, fmt::format("1 to {}", kMaxBatch), kMaxBatch);
  CheckCount("--eval-batches", c.eval_batches, 1, fmt::format("1 to {}", kMaxEvalBatches),
             kMaxEvalBatches);
  if (c.threads > ThreadPool::kMaxThreads) {
    throw InvalidArgument(fmt::format("--threads must be 0 (every core) to {}, got {}",
                                      ThreadPool::kMaxThreads, c.threads));
  }
  if (c.model == "gpt") {
    const std::string width = fmt::format("1 to {}", kMaxWidth);
    CheckCount("--layers", c.gpt.layers, 1, fmt::format("1 to {}", kMaxLayers), kMaxLayers);
    CheckCount("--heads", c.gpt.heads, 1, width, kMaxWidth);
    CheckCount("--dim", c.gpt.dim, 1, width, kMaxWidth);
  } else if (c.model == "mlp") {
    const std::string width = fmt::format("1 to {}", kMaxWidth);
    CheckCount("--features", c.mlp.features, 1, width, kMaxWidth);
    CheckCount("--hidden", c.mlp.hidden, 1, width, kMaxWidth);
    CheckCount("--classes", c.mlp.classes, 1, width, kMaxWidth);
  }
}

}  // namespace sluice
