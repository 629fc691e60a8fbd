// Edited packages for the loader's refusal tests: a package's sections relabelled as an older
// format version, header and manifest alike, every hash recomputed, so that only the loader's
// version check can catch what the older version does not hold.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "runtime/package.h"

namespace kiln::test {

// The loader's error for `bytes` (a whole package) relabelled as format `version`; "" when it
// loads.
inline std::string load_error_as_version(const std::string& bytes, uint32_t version,
                                         const std::string& name) {
  std::vector<PackageSection> sections = parse_package_container(bytes, name);
  nlohmann::json m = nlohmann::json::parse(sections[0].bytes);
  m["format_version"] = version;
  sections[0].bytes = m.dump(1);
  try {
    load_package_bytes(package_container(sections, version), name + "-relabelled");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace kiln::test
