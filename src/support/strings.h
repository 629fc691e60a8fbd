// Small string helpers shared by the layers (kept header-only and light).
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

// Every occurrence of `from` in `s` replaced by `to` (left to right, non-overlapping).
inline std::string replace_all(std::string s, std::string_view from, std::string_view to) {
  if (from.empty()) return s;
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size()))
    s.replace(at, from.size(), to);
  return s;
}

// Lines of `text` without their '\n' (a trailing newline adds no empty line).
inline std::vector<std::string_view> split_lines(std::string_view text) {
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    const size_t nl = text.find('\n');
    lines.push_back(text.substr(0, nl));
    if (nl == std::string_view::npos) break;
    text.remove_prefix(nl + 1);
  }
  return lines;
}

}  // namespace kiln
