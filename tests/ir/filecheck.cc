#include "filecheck.h"

#include <regex>

#include <fmt/format.h>

namespace kiln::test {
namespace {

const char* kind_name(CheckDirective::Kind k) {
  switch (k) {
    case CheckDirective::Check: return "CHECK";
    case CheckDirective::Next: return "CHECK-NEXT";
    case CheckDirective::Same: return "CHECK-SAME";
    case CheckDirective::Not: return "CHECK-NOT";
    case CheckDirective::Label: return "CHECK-LABEL";
  }
  return "?";
}

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && (s[b] == ' ' || s[b] == '\t')) ++b;
  while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t' || s[e - 1] == '\r')) --e;
  return std::string(s.substr(b, e - b));
}

std::regex compile_pattern(const std::string& pattern) {
  std::string re;
  for (size_t i = 0; i < pattern.size();) {
    if (pattern.compare(i, 2, "{{") == 0) {
      size_t close = pattern.find("}}", i + 2);
      if (close != std::string::npos) {
        re += "(?:" + pattern.substr(i + 2, close - i - 2) + ")";
        i = close + 2;
        continue;
      }
    }
    char c = pattern[i];
    if (c == ' ' || c == '\t') {
      while (i < pattern.size() && (pattern[i] == ' ' || pattern[i] == '\t')) ++i;
      re += "[ \\t]+";
      continue;
    }
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) re += '\\';
    re += c;
    ++i;
  }
  return std::regex(re, std::regex::ECMAScript);
}

struct Output {
  std::string_view text;
  std::vector<size_t> line_starts;

  explicit Output(std::string_view t) : text(t) {
    line_starts.push_back(0);
    for (size_t i = 0; i < t.size(); ++i)
      if (t[i] == '\n') line_starts.push_back(i + 1);
  }
  size_t num_lines() const { return line_starts.size(); }
  size_t line_of(size_t off) const {
    size_t l = 0;
    while (l + 1 < line_starts.size() && line_starts[l + 1] <= off) ++l;
    return l;
  }
  size_t line_end(size_t l) const {
    return l + 1 < line_starts.size() ? line_starts[l + 1] - 1 : text.size();
  }
  std::string_view line(size_t l) const {
    return l < num_lines() ? text.substr(line_starts[l], line_end(l) - line_starts[l]) : "";
  }
};

struct Match {
  bool found = false;
  size_t begin = 0, end = 0;
};

// First match of re in [from, to), never spanning a line break.
Match search(const Output& out, const std::regex& re, size_t from, size_t to, bool one_line) {
  Match m;
  if (from > to) return m;
  for (size_t l = out.line_of(from); l < out.num_lines(); ++l) {
    size_t b = std::max(from, out.line_starts[l]);
    if (b > to) break;
    size_t e = std::min(out.line_end(l), to);
    if (e >= b) {
      std::cmatch cm;
      const char* base = out.text.data();
      if (std::regex_search(base + b, base + e, cm, re)) {
        m.found = true;
        m.begin = b + size_t(cm.position(0));
        m.end = m.begin + size_t(cm.length(0));
        return m;
      }
    }
    if (one_line) break;
  }
  return m;
}

}  // namespace

std::vector<CheckDirective> parse_check_directives(std::string_view text, int first_line,
                                                   std::string* error) {
  static const std::regex kLine(R"(^\s*(?://|#)\s*CHECK(-[A-Z]+)?:(.*)$)");
  static const std::regex kTypo(R"(^\s*(?://|#)\s*CHECK[-A-Z]*\s*:)");
  std::vector<CheckDirective> out;
  int line = first_line - 1;
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t nl = text.find('\n', pos);
    if (nl == std::string_view::npos) nl = text.size();
    std::string l(text.substr(pos, nl - pos));
    ++line;
    pos = nl + 1;
    std::smatch m;
    if (std::regex_match(l, m, kLine)) {
      std::string suffix = m[1].str();
      CheckDirective d;
      d.line = line;
      d.pattern = trim(m[2].str());
      if (suffix.empty()) d.kind = CheckDirective::Check;
      else if (suffix == "-NEXT") d.kind = CheckDirective::Next;
      else if (suffix == "-SAME") d.kind = CheckDirective::Same;
      else if (suffix == "-NOT") d.kind = CheckDirective::Not;
      else if (suffix == "-LABEL") d.kind = CheckDirective::Label;
      else {
        *error += fmt::format("line {}: unknown directive 'CHECK{}'\n", line, suffix);
        continue;
      }
      if (d.pattern.empty()) {
        *error += fmt::format("line {}: {} has an empty pattern\n", line, kind_name(d.kind));
        continue;
      }
      try {
        compile_pattern(d.pattern);
      } catch (const std::regex_error& e) {
        *error += fmt::format("line {}: bad regex in '{}': {}\n", line, d.pattern, e.what());
        continue;
      }
      out.push_back(std::move(d));
    } else if (std::regex_search(l, kTypo)) {
      *error += fmt::format("line {}: malformed CHECK directive: {}\n", line, l);
    }
    if (nl == text.size()) break;
  }
  return out;
}

std::string filecheck(std::string_view output, const std::vector<CheckDirective>& checks) {
  Output out(output);
  std::vector<std::regex> res;
  for (const CheckDirective& d : checks) res.push_back(compile_pattern(d.pattern));
  auto fail_msg = [&](const CheckDirective& d, const std::string& what) {
    return fmt::format("line {}: {}: {}: {}", d.line, kind_name(d.kind), d.pattern, what);
  };

  // Labels first: they fix the blocks that the other directives are confined to.
  std::vector<Match> labels;
  size_t cursor = 0;
  for (size_t i = 0; i < checks.size(); ++i) {
    if (checks[i].kind != CheckDirective::Label) continue;
    Match m = search(out, res[i], cursor, output.size(), false);
    if (!m.found) return fail_msg(checks[i], "label not found in the output");
    labels.push_back(m);
    cursor = m.end;
  }

  size_t label_index = 0;
  size_t region_end = labels.empty() ? output.size() : labels[0].begin;
  cursor = 0;
  long last_line = -1;  // line of the previous match
  std::vector<size_t> pending_nots;
  auto check_nots = [&](size_t from, size_t to) -> std::string {
    for (size_t k : pending_nots) {
      Match m = search(out, res[k], from, to, false);
      if (m.found)
        return fail_msg(checks[k],
                        fmt::format("found on output line {}: {}", out.line_of(m.begin) + 1,
                                    out.line(out.line_of(m.begin))));
    }
    pending_nots.clear();
    return "";
  };

  for (size_t i = 0; i < checks.size(); ++i) {
    const CheckDirective& d = checks[i];
    Match m;
    switch (d.kind) {
      case CheckDirective::Not: pending_nots.push_back(i); continue;
      case CheckDirective::Label: {
        if (std::string e = check_nots(cursor, region_end); !e.empty()) return e;
        const Match& l = labels[label_index++];
        cursor = l.end;
        last_line = long(out.line_of(l.begin));
        region_end = label_index < labels.size() ? labels[label_index].begin : output.size();
        continue;
      }
      case CheckDirective::Check:
        m = search(out, res[i], cursor, region_end, false);
        if (!m.found)
          return fail_msg(d, fmt::format("not found after output line {}", last_line + 1));
        break;
      case CheckDirective::Next: {
        size_t l = size_t(last_line + 1);
        if (l >= out.num_lines()) return fail_msg(d, "no line after the previous match");
        m = search(out, res[i], std::max(cursor, out.line_starts[l]), region_end, true);
        if (!m.found || out.line_of(m.begin) != l)
          return fail_msg(
              d, fmt::format("not on the next line (output line {}: {})", l + 1, out.line(l)));
        break;
      }
      case CheckDirective::Same: {
        size_t l = size_t(std::max(last_line, 0L));
        m = search(out, res[i], cursor, region_end, true);
        if (!m.found || out.line_of(m.begin) != l)
          return fail_msg(d, fmt::format("not found on the same line (output line {}: {})", l + 1,
                                         out.line(l)));
        break;
      }
    }
    if (std::string e = check_nots(cursor, m.begin); !e.empty()) return e;
    cursor = m.end;
    last_line = long(out.line_of(m.begin));
  }
  return check_nots(cursor, region_end);
}

}  // namespace kiln::test
