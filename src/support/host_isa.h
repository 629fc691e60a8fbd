// The host CPU's instruction-set features as one string ("x86-64+sse3+...+avx512f"), and the
// check a package loader makes against a required string.
#pragma once
#include <string>
#include <vector>

namespace kiln {

// Every feature GCC can query that may change what -march=native emits, in a fixed order.
std::string host_isa();
// The features of `required` (a host_isa() string of the machine a package was built on) that
// `host` lacks; empty when `host` runs everything built for `required`. Different base
// architectures ("x86-64" vs "aarch64") count as a missing feature.
std::vector<std::string> missing_isa_features(const std::string& required, const std::string& host);

}  // namespace kiln
