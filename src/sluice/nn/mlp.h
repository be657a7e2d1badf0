// MLP classifier: x [B, F] → (Linear → ReLU) × layers → Linear → logits [B, K] → cross-entropy
// with labels [B]. Parameters "fc.<i>.weight" [in, out], "fc.<i>.bias" [out] (docs/models.md).
//
// Its default data is "blobs": K Gaussian clusters in F dimensions (BlobsDataset), a task a small
// MLP learns to near-perfect accuracy in seconds.
#pragma once

#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "sluice/core/tensor.h"
#include "sluice/nn/data.h"
#include "sluice/nn/model.h"

namespace sluice {

struct MlpConfig {
  int64_t features = 16;
  int64_t hidden = 64;
  int64_t classes = 4;
  int64_t layers = 2;  // hidden layers
};

// Throws InvalidArgument naming the bad size.
void ValidateMlpConfig(const MlpConfig& config);

enum class MlpOutput { kLoss, kLogits };

// Inputs "x" f32 [B, F] and (kLoss) "labels" i64 [B]; output "loss" or "logits" [B, K].
Model BuildMlp(const MlpConfig& config, int64_t batch, MlpOutput output);

// K Gaussian clusters (σ = 1) around centres drawn uniformly in [-4, 4]^F from the seed.
// The centres [K, F] are drawn at the first GetBatch, not at construction: `sluice plan` and
// `simulate` build the task without reading a batch (at K = F = 65536 the centres are 16 GiB, and
// plan took 80 s and that much memory). Thread-safety: GetBatch may be called concurrently.
class BlobsDataset {
 public:
  BlobsDataset(const MlpConfig& config, uint64_t seed);
  // x f32 [B, F] and labels i64 [B]; deterministic in (split, index).
  std::pair<Tensor, Tensor> GetBatch(DataSplit split, int64_t index, int64_t batch_size) const;

 private:
  // The centres, drawn on first use (under centres_once_).
  const std::vector<float>& Centres() const;

  MlpConfig config_;
  uint64_t seed_;
  mutable std::once_flag centres_once_;
  mutable std::vector<float> centres_;  // [K, F]; written once, under centres_once_
};

}  // namespace sluice
