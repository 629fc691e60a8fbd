// Safetensors I/O for modules: the runtime's implementation (runtime/safetensors.h, Note
// [Safetensors format]), under the names nn has always used.
#pragma once
#include "runtime/safetensors.h"

namespace kiln::nn {

using kiln::load_safetensors;
using kiln::NamedTensors;
using kiln::parse_safetensors;
using kiln::safetensors_bytes;
using kiln::safetensors_dtype_name;
using kiln::save_safetensors;
using kiln::SafetensorsContents;

}  // namespace kiln::nn
