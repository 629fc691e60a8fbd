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

// Generated sources put `// kiln-kernel: NAME` before each kernel; the NAME of the last such
// marker at or before 1-based `line_number` ("" when there is none), so that a compile error can
// name the kernel it is in.
inline std::string kernel_at_line(const std::string& source, int line_number) {
  std::string kernel;
  int n = 0;
  for (std::string_view line : split_lines(source)) {
    if (++n > line_number) break;
    const size_t start = line.find_first_not_of(" \t");
    if (start == std::string_view::npos) continue;
    line.remove_prefix(start);
    constexpr std::string_view marker = "// kiln-kernel:";
    if (line.substr(0, marker.size()) != marker) continue;
    line.remove_prefix(marker.size());
    const size_t b = line.find_first_not_of(" \t");
    const size_t e = line.find_last_not_of(" \t\r");
    kernel = b == std::string_view::npos ? "" : std::string(line.substr(b, e - b + 1));
  }
  return kernel;
}

// Where a compile error at 1-based `line` of a generated `source` is, for the error message:
// " in kernel 'k3_add' (line 12)", " at line 4, before the first kernel", or "" (line <= 0).
inline std::string error_location(const std::string& source, int line) {
  if (line <= 0) return "";
  const std::string kernel = kernel_at_line(source, line);
  const std::string n = std::to_string(line);
  return kernel.empty() ? " at line " + n + ", before the first kernel"
                        : " in kernel '" + kernel + "' (line " + n + ")";
}

// An excerpt of a compiler log for an error message: up to `max_lines` lines from two before
// line `first` (from the start when `first` is past the end), each cut to 400 characters,
// indented by two spaces, with `from` replaced by `to` (a temporary file's name by the kept
// copy's); `if_empty` when there are no lines.
inline std::string log_excerpt(const std::vector<std::string_view>& lines, size_t first,
                               size_t max_lines, std::string_view from, std::string_view to,
                               const std::string& if_empty) {
  const size_t begin = first < lines.size() && first > 2 ? first - 2 : 0;
  std::string excerpt;
  for (size_t i = begin; i < lines.size() && i < begin + max_lines; ++i)
    excerpt += "  " + replace_all(std::string(lines[i].substr(0, 400)), from, to) + "\n";
  return excerpt.empty() ? if_empty : excerpt;
}

}  // namespace kiln
