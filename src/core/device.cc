#include "core/device.h"

#include <charconv>

#include "core/error.h"

namespace kiln {

std::string Device::str() const {
  return type == DeviceType::CPU ? "cpu" : "cuda:" + std::to_string(int(index));
}

Device parse_device(std::string_view s) {
  if (s == "cpu") return Device::cpu();
  if (s == "cuda") return Device::cuda(0);
  if (s.substr(0, 5) == "cuda:") {
    int idx = -1;
    auto r = std::from_chars(s.data() + 5, s.data() + s.size(), idx);
    if (r.ec == std::errc() && r.ptr == s.data() + s.size() && idx >= 0 && idx < 128)
      return Device::cuda(idx);
  }
  fail("unknown device '{}': expected 'cpu', 'cuda' or 'cuda:N'", s);
}

}  // namespace kiln
