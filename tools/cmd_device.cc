// kiln device [--json]: which CUDA devices this process sees. Exits 0 whether or not there is
// one: "no CUDA device: <reason>" is an answer, not an error (CI machines have no GPU).
#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "core/cuda_runtime.h"
#include "tools/commands.h"

namespace kiln::cli {
namespace {

nlohmann::json device_json() {
  nlohmann::json j;
  int count = cuda_device_count();
  j["status"] = cuda_status();
  j["cuda_available"] = count > 0;
  j["device_count"] = count;
  std::string runtime = cuda_runtime_version(), driver = cuda_driver_version();
  if (!runtime.empty()) j["runtime_version"] = runtime;
  // Absent where no driver is installed; the runtime's own error is already in "status".
  j["driver_version"] = driver.empty() ? nlohmann::json(nullptr) : nlohmann::json(driver);
  j["devices"] = nlohmann::json::array();
  for (int i = 0; i < count; ++i) {
    CudaDeviceInfo p = cuda_device_info(i);
    if (!p.error.empty()) {
      j["devices"].push_back({{"index", i}, {"error", p.error}});
      continue;
    }
    j["devices"].push_back({
        {"index", i},
        {"name", p.name},
        {"sm", "sm_" + std::to_string(p.sm_major) + std::to_string(p.sm_minor)},
        {"memory_bytes", p.memory_bytes},
        {"multiprocessors", p.multiprocessors},
        {"l2_cache_bytes", p.l2_cache_bytes},
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
      std::string runtime = cuda_runtime_version(), driver = cuda_driver_version();
      if (cuda_device_count() > 0 && !runtime.empty() && !driver.empty())
        std::printf("CUDA runtime %s, driver %s\n", runtime.c_str(), driver.c_str());
    }
    exit_code() = 0;
  });
}

}  // namespace kiln::cli
