// Fuzzes the parse-only checks of the CUDA launch records (validate_launch_record,
// runtime/launch_library.h) on any machine: a CUDA package's loader runs the same parsing before
// it creates any cuBLASLt or cuDNN plan, and the whole-package fuzzer (package_fuzz.cc) cannot
// reach it without a GPU (the loader stops at "no CUDA device"). Input: the first byte picks the
// kind (cuda_kernel, cublaslt, cudnn_conv, cudnn_sdpa), the rest is the record's JSON params.
// Every result is accepted or a kiln::Error, never a crash, an overflow or another exception.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "fuzz_util.h"
#include "runtime/launch_library.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  if (size < 1) return 0;
  static const char* const kKinds[] = {"cuda_kernel", "cublaslt", "cudnn_conv", "cudnn_sdpa"};
  // Sixteen slots: the arena (slot 0) and inputs / constants of a few sizes, some small, so that
  // both sides of every bound are reachable.
  static const int64_t kSlotBytes[16] = {int64_t(1) << 26, int64_t(1) << 22, 4096, 256,
                                         int64_t(1) << 20, int64_t(1) << 24, 8192, 64,
                                         int64_t(1) << 16, 0, 16, int64_t(1) << 26,
                                         1 << 12, 1 << 14, 1 << 18, 1 << 10};
  LaunchRecord r{kKinds[data[0] % 4], std::string(reinterpret_cast<const char*>(data + 1), size - 1)};
  LaunchEnv env;
  env.slot_bytes = [](int32_t slot) -> int64_t {
    return slot >= 0 && slot < 16 ? kSlotBytes[slot] : 0;
  };
  env.num_slots = 16;
  try {
    if (!validate_launch_record(r, env, "fuzz launch"))
      fuzz::finding("a CUDA launch kind has no parse-only check", r.kind);
  } catch (const Error&) {
  }
  return 0;
}
