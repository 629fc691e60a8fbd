// Safetensors I/O, implemented by Kiln (no external library). In the runtime because a
// package's weights section is safetensors; nn/safetensors.h re-exports it for modules.
//
// Note [Safetensors format]
// A file is: an 8-byte little-endian header length N; N bytes of JSON, an object mapping each
// tensor name to {"dtype": "F32"|"F16"|"BF16"|"F64"|"I64"|"I32"|"I8"|"U8"|"BOOL", "shape": [...],
// "data_offsets": [begin, end]} plus an optional "__metadata__" object of string -> string; then
// the raw little-endian bytes of every tensor, offsets relative to the end of the header.
// Writing pads the header with spaces to a multiple of 8 (so every tensor starts aligned) and is
// atomic: a temp file in the target directory, fsync, rename — a reader never sees half a file.
// Reading trusts nothing: header length against the file size, JSON shape, dtype names, offsets
// in range and non-overlapping, byte count = numel * dtype size, duplicate names. Allocation is
// bounded by the file size, so a hostile file cannot ask for more memory than it occupies.
#pragma once
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/tensor.h"

namespace kiln {

// Ordered (name, tensor) pairs: state dicts, safetensors contents.
using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

struct SafetensorsContents {
  NamedTensors tensors;                         // in file order (by data offset)
  std::map<std::string, std::string> metadata;  // "__metadata__"
};

// Writes `tensors` (CPU or CUDA, any strides; copied to contiguous host bytes) to `path`
// atomically. Throws kiln::Error naming the file (and tensor) on failure; on failure `path` is
// untouched and no temp file remains.
void save_safetensors(const std::string& path, const NamedTensors& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// Serializes to bytes in memory (the same bytes save_safetensors writes).
std::vector<uint8_t> safetensors_bytes(const NamedTensors& tensors,
                                       const std::map<std::string, std::string>& metadata = {});

// Reads a safetensors file into CPU tensors. Throws kiln::Error (ParseError) naming the file and,
// where it applies, the tensor.
SafetensorsContents load_safetensors(const std::string& path);

// Parses safetensors bytes; `source` names them in errors.
SafetensorsContents parse_safetensors(std::span<const uint8_t> bytes,
                                      const std::string& source = "<memory>");

// The tensors of safetensors bytes without their data: each one's name, dtype, shape and the
// byte range of its data in `bytes` (the header checked as parse_safetensors checks it). For a
// reader that puts the data elsewhere itself (a CUDA package's weights, uploaded straight from
// the mapped file).
struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::Float32;
  Dims sizes;
  uint64_t offset = 0, nbytes = 0;  // in `bytes`
};
std::vector<SafetensorsEntry> parse_safetensors_entries(std::span<const uint8_t> bytes,
                                                        const std::string& source = "<memory>");
// One entry of `bytes` (as parse_safetensors_entries returned it) as a host tensor, as
// parse_safetensors makes it (a bool tensor's bytes normalized to 0 and 1).
Tensor safetensors_entry_tensor(std::span<const uint8_t> bytes, const SafetensorsEntry& e);

// "F32" etc. for a dtype (every Kiln dtype has one).
const char* safetensors_dtype_name(DType d);

}  // namespace kiln
