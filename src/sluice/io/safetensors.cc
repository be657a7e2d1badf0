#include "sluice/io/safetensors.h"

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "sluice/core/files.h"
#include "sluice/core/json_text.h"

namespace sluice {

static_assert(std::endian::native == std::endian::little,
              "safetensors I/O assumes a little-endian host");

namespace {

using Json = nlohmann::json;

struct DTypeName {
  DType dtype;
  const char* name;
};
constexpr DTypeName kDTypeNames[] = {{DType::kF32, "F32"},   {DType::kF64, "F64"},
                                     {DType::kI32, "I32"},   {DType::kI64, "I64"},
                                     {DType::kBF16, "BF16"}, {DType::kF16, "F16"}};

const char* SafetensorsName(DType t) {
  for (const DTypeName& d : kDTypeNames) {
    if (d.dtype == t) return d.name;
  }
  return "?";
}

// Where a tensor's bytes are, before its data is copied.
struct Entry {
  std::string name;
  DType dtype;
  Shape shape;
  uint64_t begin, end;
};

class Reader {
 public:
  Reader(std::string_view bytes, std::string_view label) : bytes_(bytes), label_(label) {}

  [[noreturn]] void Fail(const std::string& message) const {
    throw IoError(fmt::format("{}: {}", label_, message));
  }
  [[noreturn]] void FailTensor(const std::string& name, const std::string& message) const {
    throw IoError(fmt::format("{}: tensor '{}': {}", label_, name, message));
  }

  // The header's __metadata__, its tensors' entries checked as Parse checks them against a data
  // buffer of `data_size` bytes (what follows the header in the file), which is not read: the
  // bytes may end after the header.
  std::map<std::string, std::string> Metadata(uint64_t data_size) const {
    uint64_t header_len;
    std::memcpy(&header_len, bytes_.data(), 8);
    const Json json = ParseHeader(bytes_.substr(8, header_len));
    std::map<std::string, std::string> metadata;
    std::vector<Entry> entries;
    for (const auto& [name, value] : json.items()) {
      if (name == "__metadata__") {
        metadata = ParseMetadata(value);
      } else {
        entries.push_back(ParseEntry(name, value, data_size));
      }
    }
    CheckLayout(entries, data_size);
    return metadata;
  }

  SafetensorsFile Parse(Allocator& allocator) {
    if (bytes_.size() < 8) {
      Fail(fmt::format("truncated: {} bytes, but the 8-byte header length alone needs 8",
                       bytes_.size()));
    }
    uint64_t header_len;
    std::memcpy(&header_len, bytes_.data(), 8);
    if (header_len > kMaxSafetensorsHeaderBytes) {
      Fail(fmt::format("header length {} exceeds the limit of {} bytes", header_len,
                       kMaxSafetensorsHeaderBytes));
    }
    if (header_len > bytes_.size() - 8) {
      Fail(fmt::format("truncated: the header claims {} bytes but only {} follow the length",
                       header_len, bytes_.size() - 8));
    }
    const std::string_view header = bytes_.substr(8, header_len);
    const std::string_view data = bytes_.substr(8 + header_len);

    Json json = ParseHeader(header);
    SafetensorsFile file;
    std::vector<Entry> entries;
    for (auto& [name, value] : json.items()) {
      if (name == "__metadata__") {
        file.metadata = ParseMetadata(value);
      } else {
        entries.push_back(ParseEntry(name, value, data.size()));
      }
    }
    CheckLayout(entries, data.size());
    for (const Entry& e : entries) {
      Tensor t = Tensor::Empty(e.shape, e.dtype, allocator);
      if (e.end > e.begin) std::memcpy(t.raw_data(), data.data() + e.begin, e.end - e.begin);
      file.tensors.emplace(e.name, std::move(t));
    }
    return file;
  }

 private:
  Json ParseHeader(std::string_view header) const {
    std::set<std::string> names;
    // Rejects a name given twice (nlohmann would silently keep the last one).
    auto on_event = [&](int depth, Json::parse_event_t event, Json& parsed) {
      if (depth == 1 && event == Json::parse_event_t::key &&
          !names.insert(parsed.get<std::string>()).second) {
        Fail(fmt::format("header names '{}' twice", parsed.get<std::string>()));
      }
      return true;
    };
    Json json;
    try {
      json = ParseJsonText(header, on_event);
    } catch (const Json::exception& e) {
      Fail(fmt::format("header is not valid JSON: {}", e.what()));
    }
    if (!json.is_object()) {
      Fail(fmt::format("header must be a JSON object, not {}", json.type_name()));
    }
    return json;
  }

  std::map<std::string, std::string> ParseMetadata(const Json& value) const {
    if (!value.is_object()) Fail("__metadata__ must be an object of strings");
    std::map<std::string, std::string> metadata;
    for (const auto& [key, v] : value.items()) {
      if (!v.is_string()) {
        Fail(fmt::format("__metadata__ entry '{}' must be a string, not {}", key, v.type_name()));
      }
      metadata[key] = v.get<std::string>();
    }
    return metadata;
  }

  Entry ParseEntry(const std::string& name, const Json& value, uint64_t data_size) const {
    if (!value.is_object()) {
      FailTensor(name, fmt::format("entry must be an object, not {}", value.type_name()));
    }
    for (const char* field : {"dtype", "shape", "data_offsets"}) {
      if (!value.contains(field)) FailTensor(name, fmt::format("missing field '{}'", field));
    }
    if (name.empty()) FailTensor(name, "a tensor needs a name (sluice never writes an empty one)");
    Entry e;
    e.name = name;
    const Json& dtype = value["dtype"];
    if (!dtype.is_string()) FailTensor(name, "dtype must be a string");
    const auto* found =
        std::find_if(std::begin(kDTypeNames), std::end(kDTypeNames),
                     [&](const DTypeName& d) { return dtype.get<std::string>() == d.name; });
    if (found == std::end(kDTypeNames)) {
      FailTensor(name,
                 fmt::format("unsupported dtype '{}' (sluice reads F32, F64, I32, I64, BF16, F16)",
                             dtype.get<std::string>()));
    }
    e.dtype = found->dtype;

    const Json& shape = value["shape"];
    if (!shape.is_array()) FailTensor(name, "shape must be an array of non-negative integers");
    if (shape.size() > static_cast<size_t>(kMaxRank)) {
      FailTensor(name, fmt::format("rank {} exceeds the maximum of {}", shape.size(), kMaxRank));
    }
    std::vector<int64_t> dims;
    // Shape and Tensor multiply dimensions in int64 (numel, strides) in every order: the product
    // of the non-zero dimensions, elements and bytes, must fit, even when a zero makes numel 0.
    constexpr uint64_t kMax = std::numeric_limits<int64_t>::max();
    uint64_t numel = 1, nonzero = 1;
    bool overflow = false;
    for (const Json& d : shape) {
      if (!d.is_number_unsigned()) {
        FailTensor(name, "shape must be an array of non-negative integers");
      }
      const uint64_t dim = d.get<uint64_t>();
      if (dim > kMax || (dim != 0 && nonzero > kMax / dim)) {
        overflow = true;
        break;
      }
      dims.push_back(static_cast<int64_t>(dim));
      numel *= dim;
      nonzero *= std::max<uint64_t>(dim, 1);
    }
    const uint64_t element = SizeOf(e.dtype);
    if (overflow || nonzero > kMax / element) FailTensor(name, "shape is too large to address");
    e.shape = Shape(std::span<const int64_t>(dims));

    const Json& offsets = value["data_offsets"];
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      FailTensor(name, "data_offsets must be [begin, end] with non-negative integers");
    }
    e.begin = offsets[0].get<uint64_t>();
    e.end = offsets[1].get<uint64_t>();
    if (e.begin > e.end) {
      FailTensor(name, fmt::format("data_offsets [{}, {}] begin after end", e.begin, e.end));
    }
    if (e.end > data_size) {
      FailTensor(name,
                 fmt::format(
                     "data_offsets [{}, {}] run past the data buffer of {} bytes (truncated file?)",
                     e.begin, e.end, data_size));
    }
    if (e.end - e.begin != numel * element) {
      FailTensor(name, fmt::format("{} bytes for {}{} ({} bytes expected)", e.end - e.begin,
                                   SafetensorsName(e.dtype), e.shape.ToString(), numel * element));
    }
    return e;
  }

  // Tensors must tile the data buffer: no overlap, no hole.
  void CheckLayout(std::vector<Entry>& entries, uint64_t data_size) const {
    std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
      return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    uint64_t covered = 0;
    const Entry* previous = nullptr;
    for (const Entry& e : entries) {
      if (e.begin == e.end) continue;  // an empty tensor occupies no bytes
      if (e.begin < covered) {
        FailTensor(e.name, fmt::format("bytes [{}, {}) overlap tensor '{}'", e.begin, e.end,
                                       previous->name));
      }
      if (e.begin > covered) {
        Fail(
            fmt::format("bytes [{}, {}) of the data buffer belong to no tensor", covered, e.begin));
      }
      covered = e.end;
      previous = &e;
    }
    if (covered != data_size) {
      Fail(
          fmt::format("bytes [{}, {}) of the data buffer belong to no tensor", covered, data_size));
    }
  }

  std::string_view bytes_;
  std::string_view label_;
};

}  // namespace

SafetensorsFile ParseSafetensors(std::string_view bytes, std::string_view label,
                                 Allocator& allocator) {
  return Reader(bytes, label).Parse(allocator);
}

SafetensorsFile ReadSafetensors(const std::string& path, Allocator& allocator) {
  const std::string bytes = ReadWholeFile("safetensors file", path);
  return ParseSafetensors(bytes, path, allocator);
}

std::map<std::string, std::string> ReadSafetensorsMetadata(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw IoError(fmt::format("cannot read safetensors file '{}': {}", path, std::strerror(errno)));
  }
  std::error_code error;
  if (std::filesystem::is_directory(path, error)) {
    throw IoError(fmt::format("cannot read safetensors file '{}': it is a directory", path));
  }
  // The file's size first: the header length it claims is checked against it before a byte of
  // the header is allocated (a 16-byte file claiming 100 MB is refused without 100 MB).
  in.seekg(0, std::ios::end);
  const std::streamoff end = in.tellg();
  in.seekg(0, std::ios::beg);
  if (end < 0 || !in) {
    throw IoError(
        fmt::format("cannot read safetensors file '{}': its size cannot be found (a "
                    "pipe or device?); name a regular file",
                    path));
  }
  const auto size = static_cast<uint64_t>(end);
  std::string bytes(8, '\0');
  if (size < 8 || !in.read(bytes.data(), 8)) {
    throw IoError(fmt::format("{}: truncated: {} bytes, but the 8-byte header length alone needs 8",
                              path, size));
  }
  uint64_t header_len;
  std::memcpy(&header_len, bytes.data(), 8);
  if (header_len > kMaxSafetensorsHeaderBytes) {
    throw IoError(fmt::format("{}: header length {} exceeds the limit of {} bytes", path,
                              header_len, kMaxSafetensorsHeaderBytes));
  }
  if (header_len > size - 8) {
    throw IoError(
        fmt::format("{}: truncated: the header claims {} bytes but only {} follow the length", path,
                    header_len, size - 8));
  }
  bytes.resize(8 + header_len);
  if (!in.read(bytes.data() + 8, static_cast<std::streamsize>(header_len))) {
    throw IoError(fmt::format("{}: truncated: its header claims {} bytes", path, header_len));
  }
  return Reader(bytes, path).Metadata(size - 8 - header_len);
}

std::string SafetensorsHeaderBytes(const std::map<std::string, SafetensorsEntry>& entries,
                                   const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const auto& [name, e] : entries) {
    if (name.empty() || name == "__metadata__") {
      throw InvalidArgument(fmt::format("safetensors: '{}' cannot name a tensor", name));
    }
    const uint64_t nbytes = static_cast<uint64_t>(e.shape.numel()) * SizeOf(e.dtype);
    header[name] = {{"dtype", SafetensorsName(e.dtype)},
                    {"shape", std::vector<int64_t>(e.shape.dims().begin(), e.shape.dims().end())},
                    {"data_offsets", {offset, offset + nbytes}}};
    offset += nbytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t header_len = text.size();
  std::string out(8, '\0');
  std::memcpy(out.data(), &header_len, 8);
  out += text;
  return out;
}

std::string SerializeSafetensors(const std::map<std::string, Tensor>& tensors,
                                 const std::map<std::string, std::string>& metadata) {
  std::map<std::string, SafetensorsEntry> entries;
  std::vector<Tensor> contiguous;
  uint64_t bytes = 0;
  for (const auto& [name, t] : tensors) {
    if (!t.defined()) {
      throw InvalidArgument(fmt::format("safetensors: tensor '{}' is undefined", name));
    }
    entries.emplace(name, SafetensorsEntry{t.dtype(), t.shape()});
    contiguous.push_back(t.Contiguous());
    bytes += t.nbytes();
  }
  std::string out = SafetensorsHeaderBytes(entries, metadata);
  out.reserve(out.size() + bytes);
  for (const Tensor& t : contiguous) {
    if (t.nbytes() > 0) out.append(static_cast<const char*>(t.raw_data()), t.nbytes());
  }
  return out;
}

void WriteSafetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  const std::string bytes = SerializeSafetensors(tensors, metadata);
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) {
    throw IoError(fmt::format("{}: cannot open for writing: {}", path, std::strerror(errno)));
  }
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  out.close();
  if (!out) throw IoError(fmt::format("{}: write failed", path));
}

}  // namespace sluice
