// Fuzzes the safetensors reader (runtime/safetensors.h): any bytes are either tensors or a
// kiln::Error. Accepted contents must serialize and parse back to the same names, dtypes,
// shapes, bytes and metadata.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/error.h"
#include "fuzz_util.h"
#include "runtime/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  SafetensorsContents first;
  try {
    first = parse_safetensors(std::span<const uint8_t>(data, size), "fuzz.safetensors");
  } catch (const Error&) {
    return 0;
  }
  std::vector<uint8_t> bytes = safetensors_bytes(first.tensors, first.metadata);
  SafetensorsContents second;
  try {
    second = parse_safetensors(bytes, "rewritten.safetensors");
  } catch (const Error& e) {
    fuzz::finding("rewritten safetensors does not parse", e.what());
  }
  if (second.metadata != first.metadata) fuzz::finding("metadata changed in a round trip");
  if (second.tensors.size() != first.tensors.size()) fuzz::finding("tensor count changed");
  for (size_t i = 0; i < first.tensors.size(); ++i) {
    const auto& [name, a] = first.tensors[i];
    const auto& [name2, b] = second.tensors[i];
    if (name != name2 || a.dtype() != b.dtype() || a.sizes() != b.sizes() ||
        std::memcmp(a.raw_data(), b.raw_data(), size_t(a.nbytes())) != 0)
      fuzz::finding("tensor changed in a round trip", name);
  }
  return 0;
}
