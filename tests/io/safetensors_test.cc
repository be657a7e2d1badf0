// Safetensors: round trips, and a clear IoError naming the file and tensor for every malformed
// file (truncated, bad JSON, bad fields, offsets out of range, overlaps, holes, size mismatches).
#include "sluice/io/safetensors.h"
#include "scratch_path.h"

#include <cstdio>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace sluice {
namespace {

using ::testing::HasSubstr;

// A file with the given header text and `data_bytes` bytes of data.
std::string FileWith(const std::string& header, size_t data_bytes) {
  std::string out(8, '\0');
  const uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  return out + header + std::string(data_bytes, '\x01');
}

void ExpectIoError(const std::string& bytes, const std::string& fragment) {
  try {
    ParseSafetensors(bytes, "bad.safetensors");
    FAIL() << "expected IoError containing: " << fragment;
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr("bad.safetensors: "));
    EXPECT_THAT(e.what(), HasSubstr(fragment));
  }
}

TEST(Safetensors, RoundTripsEveryDtypeAndMetadata) {
  std::map<std::string, Tensor> tensors;
  tensors["a.f32"] = Tensor::FromVector<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  tensors["b.f64"] = Tensor::FromVector<double>({3}, {0.5, -1e300, 7});
  tensors["c.i32"] = Tensor::FromVector<int32_t>({1, 2}, {-3, 9});
  tensors["d.i64"] = Tensor::FromVector<int64_t>({}, {int64_t{1} << 40});
  tensors["e.bf16"] = Tensor::Zeros({4}, DType::kBF16);
  static_cast<uint16_t*>(tensors["e.bf16"].raw_data())[1] = 0x3f80;  // 1.0 in bf16
  tensors["f.empty"] = Tensor::Zeros({0, 5}, DType::kF32);
  tensors["g.transposed"] = Tensor::FromVector<float>({2, 2}, {1, 2, 3, 4}).Transpose(0, 1);
  const std::string bytes = SerializeSafetensors(tensors, {{"step", "12"}});
  uint64_t header_len;
  std::memcpy(&header_len, bytes.data(), 8);
  EXPECT_EQ(header_len % 8, 0u);  // the data buffer starts aligned

  SafetensorsFile f = ParseSafetensors(bytes, "mem");
  EXPECT_EQ(f.metadata, (std::map<std::string, std::string>{{"step", "12"}}));
  ASSERT_EQ(f.tensors.size(), tensors.size());
  for (const auto& [name, t] : tensors) {
    ASSERT_TRUE(f.tensors.count(name)) << name;
    const Tensor& r = f.tensors.at(name);
    EXPECT_EQ(r.shape(), t.shape()) << name;
    EXPECT_EQ(r.dtype(), t.dtype()) << name;
    ASSERT_EQ(r.nbytes(), t.nbytes()) << name;
    if (t.nbytes() > 0) {
      EXPECT_EQ(std::memcmp(r.raw_data(), t.Contiguous().raw_data(), t.nbytes()), 0) << name;
    }
  }
  EXPECT_EQ(f.tensors.at("g.transposed").At({0, 1}), 3.0);
}

TEST(Safetensors, ReadsWhatPyTorchStyleWritersProduce) {
  // Hand-written like the reference implementation: no padding, metadata first, offsets in order.
  std::string header =
      R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  std::string bytes = FileWith(header, 0);
  const float w[2] = {1.5f, -2.0f};
  bytes.append(reinterpret_cast<const char*>(w), 8);
  SafetensorsFile f = ParseSafetensors(bytes, "pt");
  EXPECT_EQ(f.tensors.at("w").At({1}), -2.0);
  EXPECT_EQ(f.metadata.at("format"), "pt");
}

TEST(Safetensors, FileRoundTripAndMissingFile) {
  const std::string path = testing_support::ScratchPath("sluice_safetensors_test.safetensors");
  WriteSafetensors(path, {{"x", Tensor::Full({3}, 2.0, DType::kF32)}});
  EXPECT_EQ(ReadSafetensors(path).tensors.at("x").At({2}), 2.0);
  std::remove(path.c_str());
  try {
    ReadSafetensors(path);
    FAIL();
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr(path));
  }
  EXPECT_THROW(WriteSafetensors("/nonexistent-dir/x.safetensors", {}), IoError);
}

// A checkpoint cut short at any byte (a full disk, a copy interrupted) is an IoError, read in
// memory or from disk, its metadata alone too — never a crash or a file read as shorter.
TEST(Safetensors, EveryTruncationIsAnIoError) {
  const std::string bytes =
      SerializeSafetensors({{"wte.weight", Tensor::FromVector<float>({2, 3}, {1, 2, 3, 4, 5, 6})},
                            {"wte.weight.exp_avg", Tensor::Zeros({2, 3}, DType::kF32)},
                            {"step.count", Tensor::FromVector<int64_t>({}, {7})},
                            {"z.empty", Tensor::Zeros({0, 4}, DType::kF32)}},
                           {{"step", "3"}, {"config", "{\"model\": \"gpt\"}"}});
  const std::filesystem::path path = testing_support::ScratchPath("sluice_truncated.safetensors");
  for (size_t n = 0; n < bytes.size(); ++n) {
    const std::string cut = bytes.substr(0, n);
    EXPECT_THROW(ParseSafetensors(cut, "cut.safetensors"), IoError) << n << " bytes";
    {
      std::FILE* f = std::fopen(path.c_str(), "wb");
      ASSERT_NE(f, nullptr);
      ASSERT_EQ(std::fwrite(cut.data(), 1, cut.size(), f), cut.size());
      std::fclose(f);
    }
    EXPECT_THROW(ReadSafetensors(path.string()), IoError) << n << " bytes";
    EXPECT_THROW(ReadSafetensorsMetadata(path.string()), IoError) << n << " bytes";
  }
  std::filesystem::remove(path);
  EXPECT_EQ(ParseSafetensors(bytes, "whole").tensors.size(), 4u);
}

TEST(Safetensors, RejectsTruncatedFiles) {
  ExpectIoError(std::string(5, '\0'), "truncated");
  ExpectIoError(FileWith("{}", 0).substr(0, 9), "truncated: the header claims 2 bytes");
  const std::string good = SerializeSafetensors({{"w", Tensor::Zeros({4}, DType::kF32)}});
  ExpectIoError(good.substr(0, good.size() - 1),
                "tensor 'w': data_offsets [0, 16] run past the data buffer of 15");
  std::string huge(8, '\0');
  const uint64_t n = kMaxSafetensorsHeaderBytes + 1;
  std::memcpy(huge.data(), &n, 8);
  ExpectIoError(huge, "exceeds the limit");
}

// Reading the header alone (what checkpoint readers do with every shard) still refuses a file cut
// short in its data, or with bytes after it, by the file's size.
TEST(Safetensors, MetadataAloneRefusesAFileCutShortInItsData) {
  const std::string path =
      testing_support::ScratchPath("sluice_safetensors_metadata_test.safetensors");
  const std::string good =
      SerializeSafetensors({{"w", Tensor::Zeros({4}, DType::kF32)}}, {{"step", "3"}});
  const auto write = [&](const std::string& bytes) {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
    std::fclose(f);
  };
  write(good);
  EXPECT_EQ(ReadSafetensorsMetadata(path).at("step"), "3");
  write(good.substr(0, good.size() - 1));
  try {
    ReadSafetensorsMetadata(path);
    FAIL() << "a file one byte short was accepted";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr(path + ": "));
    EXPECT_THAT(e.what(), HasSubstr("tensor 'w': data_offsets [0, 16] run past the data buffer"));
  }
  write(good + "xx");
  EXPECT_THROW(ReadSafetensorsMetadata(path), IoError);
  std::remove(path.c_str());
}

// A header length is checked against the file's size before the header is read: an 8-byte file
// claiming the largest header allowed is refused by its size, not after allocating 100 MB for it.
TEST(Safetensors, MetadataAloneChecksTheHeaderLengthAgainstTheFileSizeFirst) {
  const std::string path =
      testing_support::ScratchPath("sluice_safetensors_claims_too_much.safetensors");
  std::string bytes(8, '\0');
  const uint64_t n = kMaxSafetensorsHeaderBytes;
  std::memcpy(bytes.data(), &n, 8);
  bytes += "{}";
  {
    std::FILE* f = std::fopen(path.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(std::fwrite(bytes.data(), 1, bytes.size(), f), bytes.size());
    std::fclose(f);
  }
  try {
    ReadSafetensorsMetadata(path);
    FAIL() << "a header longer than the file was accepted";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr(fmt::format("{}: truncated: the header claims {} bytes but "
                                                "only 2 follow the length",
                                                path, n)));
  }
  std::remove(path.c_str());
  const std::string dir = std::filesystem::temp_directory_path().string();
  try {
    ReadSafetensorsMetadata(dir);
    FAIL() << "a directory was accepted";
  } catch (const IoError& e) {
    EXPECT_THAT(e.what(), HasSubstr("it is a directory"));
  }
}

TEST(Safetensors, RejectsBadHeaders) {
  ExpectIoError(FileWith("{\"w\": [", 0), "header is not valid JSON");
  ExpectIoError(FileWith("[1, 2]", 0), "header must be a JSON object, not array");
  ExpectIoError(
      FileWith(
          R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},"w":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})",
          0),
      "header names 'w' twice");
  ExpectIoError(FileWith(R"({"__metadata__":{"k":1}})", 0),
                "__metadata__ entry 'k' must be a string");
  ExpectIoError(FileWith(R"({"w":3})", 0), "tensor 'w': entry must be an object");
  ExpectIoError(FileWith(R"({"w":{"dtype":"F32","shape":[1]}})", 4),
                "tensor 'w': missing field 'data_offsets'");
  ExpectIoError(FileWith(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})", 1),
                "tensor 'w': unsupported dtype 'U8'");
  ExpectIoError(FileWith(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4),
                "tensor 'w': shape must be");
  ExpectIoError(
      FileWith(R"({"w":{"dtype":"F32","shape":[1,1,1,1,1,1,1,1,1],"data_offsets":[0,4]}})", 4),
      "rank 9");
  ExpectIoError(
      FileWith(R"({"w":{"dtype":"F64","shape":[4294967296,4294967296,4],"data_offsets":[0,8]}})",
               8),
      "too large");
  ExpectIoError(FileWith(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4]}})", 4),
                "data_offsets must be [begin, end]");
}

// Regression: a zero-element shape passed the size check even when its other dimensions
// multiply past int64 ([2^62, 3, 0], or [0, 2^62, 3] whose contiguous strides overflow); Shape and
// Tensor then multiplied them in int64 (undefined behaviour, a UBSan report).
TEST(Safetensors, RejectsEmptyShapesWhoseDimensionsOverflow) {
  ExpectIoError(
      FileWith(R"({"w":{"dtype":"F32","shape":[4611686018427387904,3,0],"data_offsets":[0,0]}})",
               0),
      "tensor 'w': shape is too large to address");
  ExpectIoError(
      FileWith(R"({"w":{"dtype":"F32","shape":[0,4611686018427387904,3],"data_offsets":[0,0]}})",
               0),
      "tensor 'w': shape is too large to address");
  // Large but addressable: fine.
  const SafetensorsFile ok = ParseSafetensors(
      FileWith(R"({"w":{"dtype":"F32","shape":[0,1152921504606846976],"data_offsets":[0,0]}})", 0),
      "ok.safetensors");
  EXPECT_EQ(ok.tensors.at("w").numel(), 0);
}

// Regression: the reader accepted a tensor named "", which the writer refuses (and no scope can
// bind): a checkpoint read back could not be saved again.
TEST(Safetensors, RejectsAnEmptyTensorName) {
  ExpectIoError(FileWith(R"({"":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 4),
                "tensor '': a tensor needs a name");
}

TEST(Safetensors, RejectsBadOffsets) {
  ExpectIoError(FileWith(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4),
                "tensor 'w': 4 bytes for F32[2] (8 bytes expected)");
  ExpectIoError(FileWith(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", 8),
                "begin after end");
  ExpectIoError(
      FileWith(
          R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
          12),
      "tensor 'b': bytes [4, 12) overlap tensor 'a'");
  ExpectIoError(FileWith(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
                "bytes [0, 4) of the data buffer belong to no tensor");
  ExpectIoError(FileWith(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 8),
                "bytes [4, 8) of the data buffer belong to no tensor");
}

TEST(Safetensors, RejectsUnwritableNames) {
  EXPECT_THROW(SerializeSafetensors({{"__metadata__", Tensor::Zeros({1}, DType::kF32)}}),
               InvalidArgument);
  EXPECT_THROW(SerializeSafetensors({{"", Tensor::Zeros({1}, DType::kF32)}}), InvalidArgument);
  EXPECT_THROW(SerializeSafetensors({{"u", Tensor()}}), InvalidArgument);
}

}  // namespace
}  // namespace sluice
