#include "sluice/nn/mlp.h"

#include <mutex>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "sluice/core/error.h"
#include "sluice/ir/ops.h"
#include "sluice/nn/layers.h"

namespace sluice {

void ValidateMlpConfig(const MlpConfig& c) {
  if (c.features < 1 || c.hidden < 1 || c.classes < 2 || c.layers < 1) {
    throw InvalidArgument(
        fmt::format("MLP needs features ≥ 1, hidden ≥ 1, classes ≥ 2 and layers ≥ 1 "
                    "(got {}, {}, {}, {})",
                    c.features, c.hidden, c.classes, c.layers));
  }
}

Model BuildMlp(const MlpConfig& c, int64_t B, MlpOutput output) {
  ValidateMlpConfig(c);
  ModelBuilder m(output == MlpOutput::kLoss ? "mlp" : "mlp_logits");
  Builder& b = m.b();
  Var h = b.Input("x", DType::kF32, {B, c.features});
  int64_t in = c.features;
  for (int64_t l = 0; l < c.layers; ++l) {
    Builder::Unit unit(b, fmt::format("fc.{}", l));
    h = Relu(LinearLayer(m, fmt::format("fc.{}", l), h, in, c.hidden));  // [B, hidden]
    in = c.hidden;
  }
  Var logits, loss;
  {
    Builder::Unit unit(b, fmt::format("fc.{}", c.layers));
    logits = b.Name(LinearLayer(m, fmt::format("fc.{}", c.layers), h, in, c.classes),
                    "logits");  // [B, K]
    if (output == MlpOutput::kLoss) {
      Var labels = b.Input("labels", DType::kI64, {B});
      loss = b.Name(CrossEntropy(logits, labels), "loss");
    }
  }
  if (output == MlpOutput::kLogits) {
    b.Output(logits);
    return m.Finish("");
  }
  b.Output(loss);
  return m.Finish("loss");
}

BlobsDataset::BlobsDataset(const MlpConfig& config, uint64_t seed) : config_(config), seed_(seed) {
  ValidateMlpConfig(config);
}

const std::vector<float>& BlobsDataset::Centres() const {
  std::call_once(centres_once_, [this] {
    std::mt19937_64 rng(MixSeed(seed_, 5, 0));
    std::uniform_real_distribution<float> u(-4.0f, 4.0f);
    centres_.resize(static_cast<size_t>(config_.classes * config_.features));
    for (float& v : centres_) v = u(rng);
  });
  return centres_;
}

std::pair<Tensor, Tensor> BlobsDataset::GetBatch(DataSplit split, int64_t index, int64_t B) const {
  const int64_t F = config_.features;
  Tensor x = Tensor::Empty({B, F}, DType::kF32);
  Tensor labels = Tensor::Empty({B}, DType::kI64);
  std::mt19937_64 rng(
      MixSeed(seed_, split == DataSplit::kTrain ? 6 : 7, static_cast<uint64_t>(index)));
  std::uniform_int_distribution<int64_t> cls(0, config_.classes - 1);
  std::normal_distribution<float> noise(0.0f, 1.0f);
  const std::vector<float>& centres = Centres();
  for (int64_t r = 0; r < B; ++r) {
    int64_t k = cls(rng);
    labels.data<int64_t>()[r] = k;
    for (int64_t f = 0; f < F; ++f) x.data<float>()[r * F + f] = centres[k * F + f] + noise(rng);
  }
  return {x, labels};
}

}  // namespace sluice
