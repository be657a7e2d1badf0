#include "sluice/step/config_checks.h"

#include <cmath>
#include <cstdint>
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
  CheckReal("--min-lr", o.min_lr, 0, o.lr, false,
            fmt::format("a finite number from 0 to --lr ({})", o.lr));
  CheckReal("--weight-decay", o.weight_decay, 0, kInf, false, "a finite number, 0 or more");
  CheckReal("--beta1", o.beta1, 0, 1, true, "in [0, 1)");
  CheckReal("--beta2", o.beta2, 0, 1, true, "in [0, 1)");
  CheckReal("--momentum", o.momentum, 0, 1, true, "in [0, 1)");
  ValidateReservedHeadroom(c.reserved_headroom);
  CheckReal("--clip", o.clip_norm, 0, kInf, false, "a finite number, 0 (off) or more");
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
