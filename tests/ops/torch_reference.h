// PyTorch reference data for the parity checks of tests/ops: JSON files in tests/ops/data/, written
// by the scripts of tests/parity/ (PyTorch 1.13 at /usr/bin/python3) and checked in, so the tests
// read them without Python. Used by optimizer_test.cc (optimizer_reference.json) and nn_test.cc
// (rms_norm_reference.json).
//
// Example:
//   const nlohmann::json ref =
//       LoadTorchReference("rms_norm_reference.json", "tests/parity/rms_norm_reference.py");
//   Tensor x = TensorFromJson(ref["cases"][0]["f32"]["x"], shape, DType::kF32);
//   EXPECT_LE(RelativeErrorToTorch(ours, ref["cases"][0]["f32"]["y"]), 1e-6);
#pragma once

#include <string_view>

#include <nlohmann/json.hpp>

#include "sluice/core/tensor.h"

namespace sluice::testing {

// tests/ops/data/<file>, parsed. Throws IoError naming the file and the script that regenerates it
// when it cannot be opened.
nlohmann::json LoadTorchReference(std::string_view file, std::string_view script);

// A tensor of `shape` and `dtype` from a flat JSON array of numbers (row-major).
Tensor TensorFromJson(const nlohmann::json& values, const Shape& shape, DType dtype);

// Largest relative difference of `ours` from PyTorch's values. In f64 it is elementwise:
// |ours − torch| / |torch|. In f32 it is relative to the tensor's largest magnitude, because an
// element that cancels to near zero legitimately differs by an ulp of its terms when the two
// implementations round in a different order.
double RelativeErrorToTorch(const Tensor& ours, const nlohmann::json& torch_values);

}  // namespace sluice::testing
