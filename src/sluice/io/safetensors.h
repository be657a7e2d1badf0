// Safetensors: named tensors in one file, the format Hugging Face uses for weights. sluice reads it
// for `sluice run --inputs` and writes it for checkpoints.
//
// Layout (little-endian):
//   8 bytes   N, the header length (unsigned 64-bit)
//   N bytes   a JSON object: {"name": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
//             ..., "__metadata__": {"key": "value", ...}}  (metadata optional, strings only)
//   the rest  the data buffer; each tensor's bytes are [begin, end) of it, row-major
// dtypes: F32, F64, I32, I64, BF16, F16 (the DTypes sluice stores).
//
// Reading is strict. An IoError names the file (and the tensor, when one is at fault) for: a file
// shorter than its header claims (truncated), a header that is not JSON or not an object, a
// duplicate name, a missing or mistyped field, an unknown dtype, a negative or oversized shape,
// offsets out of the data buffer, begin > end, a byte count that differs from dtype × shape,
// overlapping tensors, and bytes of the buffer no tensor covers (the format forbids holes).
// Writing puts tensors in name order, back to back, and pads the header with spaces to a multiple
// of 8 bytes so that the data buffer starts aligned.
//
// Thread-safety: reentrant functions. Memory: reading holds the whole file once plus the tensors.
//
// Example:
//   WriteSafetensors("w.safetensors", {{"w", w}, {"b", b}}, {{"step", "100"}});
//   SafetensorsFile f = ReadSafetensors("w.safetensors");
//   const Tensor& w2 = f.tensors.at("w");
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "sluice/core/allocator.h"
#include "sluice/core/tensor.h"

namespace sluice {

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

// Upper bound on the header length, as in the reference implementation (100 MB).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

// Parses the bytes of a file; `label` names it in errors (a path, or "<memory>").
SafetensorsFile ParseSafetensors(std::string_view bytes, std::string_view label,
                                 Allocator& allocator = DefaultAllocator());
// Reads and parses the file at `path`; IoError naming the path when it cannot be read.
SafetensorsFile ReadSafetensors(const std::string& path, Allocator& allocator = DefaultAllocator());

// The metadata of the file at `path`, reading its header only (not the tensors): IoError naming
// the path when it cannot be read, its header is malformed, or its tensors do not tile the bytes
// that follow the header (a file cut short in its data is refused without reading the data).
std::map<std::string, std::string> ReadSafetensorsMetadata(const std::string& path);

// A tensor of a file written one tensor at a time (io/checkpoint.h SaveCheckpointStreamed): what
// the header says of it before its bytes exist.
struct SafetensorsEntry {
  DType dtype;
  Shape shape;
};

// The bytes before the data buffer of a file holding tensors of `entries`: the header's length and
// the header, padded, exactly as SerializeSafetensors writes them. The data buffer that follows is
// each entry's bytes in name order. Throws InvalidArgument for a name SerializeSafetensors refuses.
std::string SafetensorsHeaderBytes(const std::map<std::string, SafetensorsEntry>& entries,
                                   const std::map<std::string, std::string>& metadata = {});

// The bytes of a safetensors file holding `tensors` (non-contiguous ones are written contiguous).
// Throws InvalidArgument for a name that is empty or "__metadata__", or an undefined tensor.
std::string SerializeSafetensors(const std::map<std::string, Tensor>& tensors,
                                 const std::map<std::string, std::string>& metadata = {});
// Writes SerializeSafetensors(...) to `path` (IoError naming the path on failure).
void WriteSafetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

}  // namespace sluice
