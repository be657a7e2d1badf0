#include "torch_reference.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "sluice/core/error.h"
#include "source_dir.h"

namespace sluice::testing {

nlohmann::json LoadTorchReference(std::string_view file, std::string_view script) {
  const std::filesystem::path path = testing_support::SourceDir() / "tests/ops/data" / file;
  std::ifstream in(path);
  if (!in) {
    throw IoError("cannot open " + path.string() + " (regenerate with " + std::string(script) +
                  ")");
  }
  return nlohmann::json::parse(in);
}

Tensor TensorFromJson(const nlohmann::json& values, const Shape& shape, DType dtype) {
  Tensor t = Tensor::Empty(shape, dtype);
  for (int64_t i = 0; i < t.numel(); ++i) t.FlatSet(i, values.at(i).get<double>());
  return t;
}

double RelativeErrorToTorch(const Tensor& ours, const nlohmann::json& torch_values) {
  double scale = 1e-12, worst = 0;
  for (int64_t i = 0; i < ours.numel(); ++i) {
    scale = std::max(scale, std::abs(torch_values.at(i).get<double>()));
  }
  for (int64_t i = 0; i < ours.numel(); ++i) {
    const double want = torch_values.at(i).get<double>();
    const double denominator =
        ours.dtype() == DType::kF64 ? std::max(std::abs(want), 1e-12) : scale;
    worst = std::max(worst, std::abs(ours.FlatAt(i) - want) / denominator);
  }
  return worst;
}

}  // namespace sluice::testing
