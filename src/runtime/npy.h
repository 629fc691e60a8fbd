// NumPy .npy files (format version 1.0/2.0/3.0, little-endian, C order) for tensors on the
// command line. Writing is atomic (temp file + rename): never a half-written file.
//
// Reading trusts nothing: magic, version, header length against the file size, the header
// dict's syntax, dtype, shape (rank <= 8, sizes whose product fits the data) and the byte count.
// A malformed file is a kiln::Error naming it; memory is bounded by the file's size.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace kiln {

Tensor read_npy(const std::string& path);
void write_npy(const std::string& path, const Tensor& t);

// The same, in memory: parse_npy reads the bytes of a .npy file (`source` names them in
// errors); npy_bytes serializes a tensor exactly as write_npy writes it.
Tensor parse_npy(std::span<const uint8_t> bytes, const std::string& source = "<memory>");
std::vector<uint8_t> npy_bytes(const Tensor& t);

}  // namespace kiln
