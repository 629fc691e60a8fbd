#include "support/host_isa.h"

namespace kiln {

namespace {
std::vector<std::string> split_plus(const std::string& s) {
  std::vector<std::string> out;
  size_t at = 0;
  while (at <= s.size()) {
    size_t end = s.find('+', at);
    if (end == std::string::npos) end = s.size();
    out.push_back(s.substr(at, end - at));
    at = end + 1;
  }
  return out;
}
}  // namespace

std::vector<std::string> missing_isa_features(const std::string& required, const std::string& host) {
  std::vector<std::string> req = split_plus(required), have = split_plus(host), missing;
  for (size_t i = 0; i < req.size(); ++i) {
    bool found = false;
    for (size_t j = 0; j < have.size() && !found; ++j)
      found = req[i] == have[j] && (i == 0) == (j == 0);  // the base architecture comes first
    if (!found) missing.push_back(req[i]);
  }
  return missing;
}

std::string host_isa() {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  __builtin_cpu_init();
  std::string isa = "x86-64";
  // Baseline x86-64 (cmov, mmx, sse, sse2) is implied. The string lists every feature GCC 12
  // can query; any of them may change what -march=native emits.
#define KILN_ISA_FEATURE(name)                    \
  if (__builtin_cpu_supports(name)) {             \
    isa += "+";                                   \
    isa += name;                                  \
  }
  KILN_ISA_FEATURE("sse3")
  KILN_ISA_FEATURE("ssse3")
  KILN_ISA_FEATURE("sse4.1")
  KILN_ISA_FEATURE("sse4.2")
  KILN_ISA_FEATURE("popcnt")
  KILN_ISA_FEATURE("aes")
  KILN_ISA_FEATURE("pclmul")
  KILN_ISA_FEATURE("avx")
  KILN_ISA_FEATURE("f16c")
  KILN_ISA_FEATURE("avx2")
  KILN_ISA_FEATURE("fma")
  KILN_ISA_FEATURE("bmi")
  KILN_ISA_FEATURE("bmi2")
  KILN_ISA_FEATURE("movbe")
  KILN_ISA_FEATURE("lzcnt")
  KILN_ISA_FEATURE("sha")
  KILN_ISA_FEATURE("sse4a")
  KILN_ISA_FEATURE("fma4")
  KILN_ISA_FEATURE("xop")
  KILN_ISA_FEATURE("gfni")
  KILN_ISA_FEATURE("vaes")
  KILN_ISA_FEATURE("vpclmulqdq")
  KILN_ISA_FEATURE("avxvnni")
  KILN_ISA_FEATURE("avx512f")
  KILN_ISA_FEATURE("avx512bw")
  KILN_ISA_FEATURE("avx512vl")
  KILN_ISA_FEATURE("avx512dq")
  KILN_ISA_FEATURE("avx512cd")
  KILN_ISA_FEATURE("avx512er")
  KILN_ISA_FEATURE("avx512pf")
  KILN_ISA_FEATURE("avx512ifma")
  KILN_ISA_FEATURE("avx512vbmi")
  KILN_ISA_FEATURE("avx512vbmi2")
  KILN_ISA_FEATURE("avx512vnni")
  KILN_ISA_FEATURE("avx512bitalg")
  KILN_ISA_FEATURE("avx512vpopcntdq")
  KILN_ISA_FEATURE("avx5124vnniw")
  KILN_ISA_FEATURE("avx5124fmaps")
  KILN_ISA_FEATURE("avx512vp2intersect")
  KILN_ISA_FEATURE("avx512bf16")
  KILN_ISA_FEATURE("avx512fp16")
  KILN_ISA_FEATURE("amx-tile")
  KILN_ISA_FEATURE("amx-int8")
  KILN_ISA_FEATURE("amx-bf16")
#undef KILN_ISA_FEATURE
  return isa;
#elif defined(__x86_64__)
  __builtin_cpu_init();
  std::string isa = "x86-64";
  // clang's __builtin_cpu_supports takes only a string literal, so no loop over names.
#define KILN_ISA_FEATURE(name)                    \
  if (__builtin_cpu_supports(name)) {             \
    isa += "+";                                   \
    isa += name;                                  \
  }
  KILN_ISA_FEATURE("avx")
  KILN_ISA_FEATURE("avx2")
  KILN_ISA_FEATURE("fma")
  KILN_ISA_FEATURE("avx512f")
  KILN_ISA_FEATURE("avx512bw")
  KILN_ISA_FEATURE("avx512vl")
  KILN_ISA_FEATURE("avx512dq")
#undef KILN_ISA_FEATURE
  return isa;
#elif defined(__aarch64__)
  return "aarch64";
#else
  return "unknown-isa";
#endif
}

}  // namespace kiln
