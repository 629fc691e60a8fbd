// The CUDA runtime seen from core: device discovery that never crashes where no GPU or driver
// exists. Binaries link the static cudart (which loads the driver at run time), never -lcuda.
#pragma once
#include <string>

namespace kiln {

// Number of usable CUDA devices; 0 when there is no driver or no device.
int cuda_device_count();
// "no CUDA device: <reason from the runtime>" or "N CUDA device(s): <name> (sm_XY), ..."
std::string cuda_status();
// Throws kiln::Error naming `what` if CUDA device `index` is unavailable.
void require_cuda_device(int index, const char* what);
// Throws kiln::Error if a CUDA runtime call failed; `what` names the call site.
void check_cuda(int cuda_error_code, const char* what);
void cuda_synchronize(int index);
// Copies between host and device (or device and device) memory.
enum class CopyKind { HostToDevice, DeviceToHost, DeviceToDevice };
void cuda_memcpy(void* dst, const void* src, size_t bytes, CopyKind kind);

}  // namespace kiln
