#include "sluice/nn/model.h"

#include <random>

#include "sluice/nn/data.h"

namespace sluice {

namespace {
constexpr uint64_t kInitStream = 100;
}

Var ModelBuilder::Param(std::string_view name, const Shape& shape, Init init, double std) {
  std::string full = b_.Prefixed(name);
  params_.push_back({full, shape, init, std, next_init_index_});
  if (next_init_index_ >= 0) ++next_init_index_;
  return b_.Param(std::move(full), DType::kF32, shape);
}

Model ModelBuilder::Finish(std::string loss) {
  Model m{b_.Build(), std::move(params_), std::move(loss), std::move(block_inputs_),
          std::move(attention_values_)};
  params_.clear();
  block_inputs_.clear();
  attention_values_.clear();
  next_init_index_ = -1;
  return m;
}

std::map<std::string, Tensor> InitParams(const std::vector<ParamSpec>& specs, uint64_t seed,
                                         Allocator& allocator) {
  std::map<std::string, Tensor> out;
  for (size_t i = 0; i < specs.size(); ++i) {
    const ParamSpec& s = specs[i];
    Tensor t = Tensor::Empty(s.shape, DType::kF32, allocator);
    float* p = t.data<float>();
    const int64_t n = t.numel();
    const uint64_t index = s.init_index >= 0 ? static_cast<uint64_t>(s.init_index) : i;
    switch (s.init) {
      case Init::kZeros:
        std::fill_n(p, n, 0.0f);
        break;
      case Init::kOnes:
        std::fill_n(p, n, 1.0f);
        break;
      case Init::kLoaded:
        std::fill_n(p, n, 0.0f);  // the caller loads it (--init-from)
        break;
      case Init::kNormal: {
        std::mt19937_64 rng(MixSeed(seed, kInitStream, index));
        std::normal_distribution<float> normal(static_cast<float>(s.mean),
                                               static_cast<float>(s.std));
        for (int64_t k = 0; k < n; ++k) p[k] = normal(rng);
        break;
      }
      case Init::kUniform: {
        std::mt19937_64 rng(MixSeed(seed, kInitStream, index));
        std::uniform_real_distribution<float> uniform(static_cast<float>(s.low),
                                                      static_cast<float>(s.high));
        for (int64_t k = 0; k < n; ++k) p[k] = uniform(rng);
        break;
      }
    }
    out.emplace(s.name, std::move(t));
  }
  return out;
}

int64_t CountParams(const std::vector<ParamSpec>& specs) {
  int64_t n = 0;
  for (const ParamSpec& s : specs) n += s.constant ? 0 : s.shape.numel();
  return n;
}

}  // namespace sluice
