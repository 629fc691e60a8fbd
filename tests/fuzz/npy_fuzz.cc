// Fuzzes the .npy reader (runtime/npy.h): any bytes are either a tensor or a kiln::Error. An
// accepted tensor must serialize and parse back to the same dtype, shape and bytes, and its data
// must be exactly what the file held after the header.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/error.h"
#include "fuzz_util.h"
#include "runtime/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  Tensor t;
  try {
    t = parse_npy(std::span<const uint8_t>(data, size), "fuzz.npy");
  } catch (const Error&) {
    return 0;
  }
  if (size_t(t.nbytes()) > size) fuzz::finding("tensor larger than the file");
  if (t.nbytes() &&
      std::memcmp(t.raw_data(), data + size - size_t(t.nbytes()), size_t(t.nbytes())) != 0)
    fuzz::finding("tensor data is not the file's trailing bytes");
  std::vector<uint8_t> bytes = npy_bytes(t);
  Tensor back;
  try {
    back = parse_npy(bytes, "rewritten.npy");
  } catch (const Error& e) {
    fuzz::finding("rewritten .npy does not parse", e.what());
  }
  if (back.dtype() != t.dtype() || back.sizes() != t.sizes() ||
      std::memcmp(back.raw_data(), t.raw_data(), size_t(t.nbytes())) != 0)
    fuzz::finding("tensor changed in a round trip");
  return 0;
}
