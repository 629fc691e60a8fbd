// kiln device [--json]: which CUDA devices this process sees. Exits 0 whether or not there is
// one: "no CUDA device: <reason>" is an answer, not an error (CI machines have no GPU).
#include <cstdio>
#include <string>

#include <cuda_runtime_api.h>

#include <nlohmann/json.hpp>

#include "core/cuda_runtime.h"
#include "tools/commands.h"

namespace kiln::cli {
namespace {

std::string version_str(int v) {  // CUDA encodes 13.0 as 13000
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

nlohmann::json device_json() {
  nlohmann::json j;
  int count = cuda_device_count();
  j["status"] = cuda_status();
  j["cuda_available"] = count > 0;
  j["device_count"] = count;
  int runtime = 0, driver = 0;
  if (cudaRuntimeGetVersion(&runtime) == cudaSuccess) j["runtime_version"] = version_str(runtime);
  // 0 when no driver is installed; the runtime's own error is already in "status".
  if (cudaDriverGetVersion(&driver) == cudaSuccess && driver > 0)
    j["driver_version"] = version_str(driver);
  else
    j["driver_version"] = nullptr;
  cudaGetLastError();
  j["devices"] = nlohmann::json::array();
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp p{};
    if (cudaGetDeviceProperties(&p, i) != cudaSuccess) {
      cudaGetLastError();
      j["devices"].push_back({{"index", i}, {"error", "cudaGetDeviceProperties failed"}});
      continue;
    }
    j["devices"].push_back({
        {"index", i},
        {"name", p.name},
        {"sm", "sm_" + std::to_string(p.major) + std::to_string(p.minor)},
        {"memory_bytes", p.totalGlobalMem},
        {"multiprocessors", p.multiProcessorCount},
        {"l2_cache_bytes", p.l2CacheSize},
    });
  }
  return j;
}

}  // namespace

void add_device_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("device", "Show the CUDA devices Kiln can use (exit 0 either way)");
  static bool json = false;
  cmd->add_flag("--json", json, "Print the devices as JSON");
  cmd->callback([] {
    if (json) {
      std::printf("%s\n", device_json().dump(2).c_str());
    } else {
      std::printf("%s\n", cuda_status().c_str());
      int runtime = 0, driver = 0;
      if (cuda_device_count() > 0 && cudaRuntimeGetVersion(&runtime) == cudaSuccess &&
          cudaDriverGetVersion(&driver) == cudaSuccess)
        std::printf("CUDA runtime %s, driver %s\n", version_str(runtime).c_str(),
                    version_str(driver).c_str());
      cudaGetLastError();
    }
    exit_code() = 0;
  });
}

}  // namespace kiln::cli
