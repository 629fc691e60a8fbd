// A small key-value store next to the kernel cache for autotuning decisions, so that a later
// compile of the same graph on the same machine picks the same kernels without timing again.
// Records live in <cache_dir>/tuning/<sha256(key)>.rec with the whole key inside (no collision
// can return another key's value) and a SHA-256 trailer; a truncated or altered record reads as
// absent. Keys and values are arbitrary bytes.
#pragma once
#include <string>

namespace kiln {

// False when the key is absent or its record unreadable or corrupt.
bool tuning_get(const std::string& key, std::string* value);
// Replaces the record atomically.
void tuning_put(const std::string& key, const std::string& value);

}  // namespace kiln
