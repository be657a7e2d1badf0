#include "sluice/step/array_dataset.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <random>

#include <fmt/format.h>

#include "sluice/core/error.h"
#include "sluice/io/safetensors.h"

namespace sluice {

namespace {

// MixSeed streams of the training and validation draws (nn/data.h lists the streams in use).
constexpr uint64_t kTrainStream = 10;
constexpr uint64_t kValidationStream = 11;

bool IsSupported(DType dtype) {
  return dtype == DType::kF32 || dtype == DType::kF64 || dtype == DType::kI32 ||
         dtype == DType::kI64;
}

}  // namespace

ArrayDataset::ArrayDataset(const std::string& path) : path_(path) {
  SafetensorsFile file = ReadSafetensors(path);
  if (file.tensors.empty()) {
    throw InvalidArgument(fmt::format(
        "array file '{}' holds no arrays; write one array per input of the program, the first "
        "axis the example (e.g. \"x\" f32[N, 16] and \"labels\" i64[N])",
        path));
  }
  for (const auto& [name, tensor] : file.tensors) {
    if (!IsSupported(tensor.dtype())) {
      throw InvalidArgument(fmt::format(
          "array '{}' of '{}' is {}: array data holds f32, f64, i32 or i64; convert it (numpy: "
          "a.astype(np.float32))",
          name, path, Name(tensor.dtype())));
    }
    if (tensor.rank() < 1) {
      throw InvalidArgument(
          fmt::format("array '{}' of '{}' is a scalar: every array needs a first axis, one entry "
                      "per example (write it as [N, ...])",
                      name, path));
    }
    const Shape& shape = tensor.shape();
    example_types_.emplace(name, TensorType{tensor.dtype(), Shape(shape.dims().subspan(1))});
    arrays_.emplace(name, tensor.Contiguous());
  }
  n_ = arrays_.begin()->second.shape()[0];
  const bool agree = std::all_of(arrays_.begin(), arrays_.end(),
                                 [&](const auto& entry) { return entry.second.shape()[0] == n_; });
  if (!agree) {
    std::string counts;
    for (const auto& [name, tensor] : arrays_) {
      counts += fmt::format("{}'{}' {}", counts.empty() ? "" : ", ", name, tensor.shape()[0]);
    }
    throw InvalidArgument(fmt::format(
        "arrays of '{}' disagree on the number of examples (the first axis): {}; every array "
        "needs one entry per example",
        path, counts));
  }
  if (n_ < 2) {
    throw InvalidArgument(fmt::format(
        "array file '{}' holds {} example(s): at least 2 are needed, one to train on and one held "
        "out for validation",
        path, n_));
  }
  train_end_ = n_ - std::max<int64_t>(1, n_ / 10);
}

std::vector<std::string> ArrayDataset::names() const {
  std::vector<std::string> out;
  out.reserve(arrays_.size());
  for (const auto& entry : arrays_) out.push_back(entry.first);
  return out;
}

std::map<std::string, Tensor> ArrayDataset::GetBatch(DataSplit split, int64_t index, int64_t batch,
                                                     uint64_t seed) const {
  if (batch < 1) {
    throw InvalidArgument(
        fmt::format("array data '{}': a batch of {} examples; the batch size must be at least 1",
                    path_, batch));
  }
  const bool train = split == DataSplit::kTrain;
  std::mt19937_64 rng(
      MixSeed(seed, train ? kTrainStream : kValidationStream, static_cast<uint64_t>(index)));
  std::uniform_int_distribution<int64_t> pick(train ? 0 : train_end_,
                                              train ? train_end_ - 1 : n_ - 1);
  std::vector<int64_t> rows(static_cast<size_t>(batch));
  for (int64_t& row : rows) row = pick(rng);

  std::map<std::string, Tensor> out;
  for (const auto& [name, array] : arrays_) {
    const TensorType& type = example_types_.at(name);
    std::vector<int64_t> dims{batch};
    dims.insert(dims.end(), type.shape.dims().begin(), type.shape.dims().end());
    Tensor t = Tensor::Empty(Shape(dims), type.dtype);
    const size_t row_bytes = static_cast<size_t>(type.shape.numel()) * SizeOf(type.dtype);
    // An example of no elements ([N, 0]): nothing to copy, and an empty array has no storage (a
    // null pointer, which memcpy may not be given even for 0 bytes).
    if (row_bytes == 0) {
      out.emplace(name, std::move(t));
      continue;
    }
    const char* src = static_cast<const char*>(array.raw_data());
    char* dst = static_cast<char*>(t.raw_data());
    for (size_t r = 0; r < rows.size(); ++r) {
      std::memcpy(dst + r * row_bytes, src + static_cast<size_t>(rows[r]) * row_bytes, row_bytes);
    }
    out.emplace(name, std::move(t));
  }
  return out;
}

std::optional<int64_t> ArrayDataset::LargestValue(const std::string& name) const {
  auto it = arrays_.find(name);
  if (it == arrays_.end() || IsFloating(it->second.dtype())) return std::nullopt;
  // Read as the integers they are (contiguous, as held): through FlatAt's double, 2^63 - 1
  // rounded to 2^63, which no int64_t holds (the cast back was undefined behaviour).
  const Tensor& array = it->second;
  if (array.numel() == 0) return std::numeric_limits<int64_t>::min();  // [N, 0]: no value
  if (array.dtype() == DType::kI32) {
    const int32_t* v = array.data<int32_t>();
    return *std::max_element(v, v + array.numel());
  }
  const int64_t* v = array.data<int64_t>();
  return *std::max_element(v, v + array.numel());
}

}  // namespace sluice
