// Fuzzes the package loader (runtime/package.h): any bytes are either a loaded package or a
// kiln::Error, never a crash; a package that loads also runs once (on zero inputs) without
// touching memory outside its buffers. Two forms, by the first byte:
//   even: the rest is a whole package file (the container parser and its hashes);
//   odd:  the rest is [u32 manifest length][manifest][weights], packed into a container with
//         valid hashes here (format version 2; 6 when bit 1 of the first byte is set, 7 when
//         bit 2 is), so that the fuzzer reaches the manifest's and the weights' meaning
//         (slots, offsets, shapes, launch records) instead of stopping at a hash mismatch.
// The second form never carries a kernels section: dlopen of arbitrary bytes would run their
// constructors, which no loader can make safe (packages are code; load only trusted ones).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/error.h"
#include "fuzz_util.h"
#include "runtime/package.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  if (size < 1) return 0;
  std::string_view rest(reinterpret_cast<const char*>(data + 1), size - 1);
  std::string bytes;
  if (data[0] % 2 == 0) {
    bytes = std::string(rest);
  } else {
    if (rest.size() < 4) return 0;
    uint32_t n;
    std::memcpy(&n, rest.data(), 4);
    if (n > rest.size() - 4) return 0;
    // Bits 1 and 2 of the first byte pick the header's format version: 2, 6 (oneDNN concat
    // nodes) or 7 (channels-last operands).
    const uint32_t version = data[0] & 4   ? kChannelsLastFormatVersion
                             : data[0] & 2 ? kOnednnConcatFormatVersion
                                           : kCpuPackageFormatVersion;
    bytes = package_container({{"manifest", std::string(rest.substr(4, n))},
                               {"weights", std::string(rest.substr(4 + n))}},
                              version);
  }
  LoadedPackage p;
  try {
    p = load_package_bytes(bytes, "fuzz.kiln");
  } catch (const Error&) {
    return 0;
  }
  // Inputs and outputs are the caller's memory: a manifest may declare any size, and the harness
  // runs only what fits a small budget.
  double io_bytes = 0;
  auto add = [&](const Dims& d) {
    double n = 8;
    for (int64_t x : d) n *= double(x);
    io_bytes += n;
  };
  for (const Executable::InputSpec& s : p.exe->inputs) add(s.sizes);
  for (const Executable::OutputSpec& s : p.exe->outputs) add(s.sizes);
  if (io_bytes > double(int64_t(1) << 26)) return 0;
  TensorList in, out;
  try {
    for (const Executable::InputSpec& s : p.exe->inputs) in.push_back(Tensor::zeros(s.sizes, s.dtype));
    for (const Executable::OutputSpec& s : p.exe->outputs) out.push_back(Tensor::empty(s.sizes, s.dtype));
    p.exe->run(in.data(), in.size(), out.data(), out.size());
  } catch (const Error&) {
    // A bad index in a gather, say: an error is a fine answer.
  }
  return 0;
}
