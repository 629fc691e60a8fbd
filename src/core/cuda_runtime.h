// The CUDA runtime seen from core: device discovery that never crashes where no GPU or driver
// exists. Binaries link the static cudart (which loads the driver at run time), never -lcuda.
#pragma once
#include <string>
#include <vector>

namespace kiln {

// Number of usable CUDA devices; 0 when there is no driver or no device.
int cuda_device_count();
// "no CUDA device: <reason from the runtime>" or "N CUDA device(s): <name> (sm_XY), ..."
std::string cuda_status();
// CUDA versions as "13.0"; "" when unknown (the runtime's is always known; the driver's is ""
// where no driver is installed).
std::string cuda_runtime_version();
std::string cuda_driver_version();
struct CudaDeviceInfo {
  std::string name;
  int sm_major = 0, sm_minor = 0;
  size_t memory_bytes = 0;
  int multiprocessors = 0;
  int l2_cache_bytes = 0;
  std::string error;  // non-empty when the properties could not be read
};
CudaDeviceInfo cuda_device_info(int index);
// Throws kiln::Error naming `what` if CUDA device `index` is unavailable.
void require_cuda_device(int index, const char* what);
// Throws kiln::Error if a CUDA runtime call failed; `what` names the call site.
void check_cuda(int cuda_error_code, const char* what);
void cuda_synchronize(int index);
// Copies between host and device (or device and device) memory.
enum class CopyKind { HostToDevice, DeviceToHost, DeviceToDevice };
void cuda_memcpy(void* dst, const void* src, size_t bytes, CopyKind kind);

// Times device work with a pair of CUDA events on the legacy default stream of device `index`
// (the stream the eager kernels launch on). start() and stop() enqueue the events; elapsed_ms()
// waits for the stop event and returns the device time between the two, in ms (the events'
// resolution is about half a microsecond). Throws kiln::Error ("no CUDA device ...") where the
// device does not exist.
class CudaEventTimer {
 public:
  explicit CudaEventTimer(int index);
  ~CudaEventTimer();
  CudaEventTimer(const CudaEventTimer&) = delete;
  CudaEventTimer& operator=(const CudaEventTimer&) = delete;
  void start();
  void stop();
  double elapsed_ms();

 private:
  int index_;
  void* start_ = nullptr;  // cudaEvent_t
  void* stop_ = nullptr;
};

// Events recorded on any stream and read together after one synchronization: `kiln profile
// --device cuda` brackets every launch with two, so each launch's device time is measured
// without a synchronization between launches. Events are created on first use and reused
// after clear().
class CudaEventLog {
 public:
  explicit CudaEventLog(int index);
  ~CudaEventLog();
  CudaEventLog(const CudaEventLog&) = delete;
  CudaEventLog& operator=(const CudaEventLog&) = delete;
  int record(void* stream);  // cudaStream_t (nullptr: the legacy stream); the event's index
  // Holds `stream` for `microseconds` (a host function on the stream that sleeps), so that the
  // launches enqueued after it wait in the queue and then run back to back: the events between
  // them then time the kernels, not the host's submissions.
  void hold(void* stream, int microseconds);
  void synchronize();        // waits for every recorded event
  double elapsed_ms(int a, int b) const;  // after synchronize()
  void clear();              // forgets the recorded events (keeps them for reuse)
  int size() const { return used_; }

 private:
  int index_;
  std::vector<void*> events_;  // cudaEvent_t
  int used_ = 0;
};

}  // namespace kiln
