// NumPy .npy files (format version 1.0/2.0/3.0, little-endian, C order) for tensors on the
// command line. Writing is atomic (temp file + rename): never a half-written file.
#pragma once
#include <string>

#include "core/tensor.h"

namespace kiln {

Tensor read_npy(const std::string& path);
void write_npy(const std::string& path, const Tensor& t);

}  // namespace kiln
