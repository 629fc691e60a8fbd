// Reading and writing launch records (Note [Launch records] in launch_library.cc): the pieces
// every launch kind's record and rebuild share — buffer references, the check that a buffer lies
// inside its slot, dtypes by name. Internal to the runtime (launch_library.cc, launch_cuda.cc,
// package.cc).
#pragma once
#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "core/dtype.h"
#include "runtime/launch_library.h"

namespace kiln::records {

// A buffer reference as [slot, byte_offset] (slot -1: absent).
nlohmann::json ref_json(MemRef r);
// The reverse; throws std::out_of_range for a slot below -1 or implausibly large, or an offset
// below 0 or above 2^44.
MemRef ref_from(const nlohmann::json& j);
// A buffer of `bytes` at `r` must lie inside its slot's memory (LaunchEnv::slot_bytes), else a
// ParseError naming `where` (and the buffer, `what`, when given). Absent buffers (slot -1) and
// environments without slot sizes pass.
void check_buffer(LaunchEnv& env, MemRef r, int64_t bytes, const std::string& where,
                  const char* what = nullptr);
// A dtype by its name ("float32"); throws std::out_of_range "<where>: unknown dtype '<name>'".
DType dtype_from(const nlohmann::json& j, const std::string& where);

}  // namespace kiln::records
