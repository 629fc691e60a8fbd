// Runs the IR text tests: every tests/ir/*.kir file, split into cases at `// -----` lines.
// Each case is parsed, the `// RUN: passes=a,b` passes run, and the printed result is matched
// against its CHECK lines (filecheck.h) and must round-trip exactly. A case with
// `// ERROR: text` lines must instead fail with a kiln::Error whose message contains each text.
// See docs/ir.md.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <stdexcept>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "filecheck.h"
#include "compiler/compile.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "lower/scheduler.h"
#include "passes/pass.h"

namespace kiln::test {
namespace {

struct KirCase {
  std::string file;    // path
  std::string name;    // gtest name: <stem>_L<line>
  int first_line = 1;  // line of the case's first line in the file
  std::string text;    // padded with newlines so that parser line numbers match the file
};

std::string sanitize(std::string s) {
  for (char& c : s)
    if (!std::isalnum((unsigned char)c)) c = '_';
  return s;
}

std::vector<KirCase> load_cases() {
  std::vector<KirCase> out;
  // The tests/ folder: $KILN_TEST_DATA, else the path CMake wrote next to this binary
  // (tests/CMakeLists.txt). Not a compile definition: absolute paths in compile flags would
  // defeat ccache across clones.
  std::filesystem::path data;
  if (const char* env = std::getenv("KILN_TEST_DATA")) {
    data = env;
  } else {
    std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe");
    std::ifstream f(exe.parent_path() / "kiln_test_data.txt");
    std::string line;
    if (!f || !std::getline(f, line))
      throw std::runtime_error("cannot find the test data: set KILN_TEST_DATA=<repo>/tests");
    data = line;
  }
  std::filesystem::path dir = data / "ir";
  std::vector<std::filesystem::path> files;
  for (auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".kir") files.push_back(e.path());
  std::sort(files.begin(), files.end());
  for (const auto& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    std::string text = ss.str();
    KirCase cur;
    cur.file = f.string();
    cur.first_line = 1;
    int line = 0;
    size_t pos = 0;
    auto flush = [&] {
      // Skip chunks with nothing but blanks and comments (e.g. a file header).
      bool has_code = false;
      std::istringstream ls(cur.text);
      std::string l;
      while (std::getline(ls, l)) {
        size_t b = l.find_first_not_of(" \t\r");
        if (b != std::string::npos && l.compare(b, 2, "//") != 0 && l[b] != '#') has_code = true;
      }
      if (has_code) {
        cur.name = sanitize(f.stem().string()) + "_L" + std::to_string(cur.first_line);
        cur.text = std::string(size_t(cur.first_line - 1), '\n') + cur.text;
        out.push_back(cur);
      }
      cur.text.clear();
    };
    while (pos < text.size()) {
      size_t nl = text.find('\n', pos);
      size_t end = nl == std::string::npos ? text.size() : nl + 1;
      std::string l = text.substr(pos, end - pos);
      ++line;
      std::string t = l;
      while (!t.empty() && (t.back() == '\n' || t.back() == '\r' || t.back() == ' ')) t.pop_back();
      if (t == "// -----") {
        flush();
        cur.first_line = line + 1;
      } else {
        cur.text += l;
      }
      pos = end;
    }
    flush();
  }
  return out;
}

const std::vector<KirCase>& all_cases() {
  static const std::vector<KirCase> cases = load_cases();
  return cases;
}

// Values of `// KEY: value` comment lines.
std::vector<std::string> directive_values(const std::string& text, const std::string& key) {
  std::vector<std::string> out;
  std::istringstream ls(text);
  std::string l;
  std::string marker = key + ":";
  while (std::getline(ls, l)) {
    size_t b = l.find_first_not_of(" \t");
    if (b == std::string::npos) continue;
    size_t c = l.compare(b, 2, "//") == 0 ? b + 2 : (l[b] == '#' ? b + 1 : std::string::npos);
    if (c == std::string::npos) continue;
    c = l.find_first_not_of(" \t", c);
    if (c == std::string::npos || l.compare(c, marker.size(), marker) != 0) continue;
    std::string v = l.substr(c + marker.size());
    size_t vb = v.find_first_not_of(" \t");
    v = vb == std::string::npos ? "" : v.substr(vb);
    while (!v.empty() && (v.back() == ' ' || v.back() == '\r')) v.pop_back();
    out.push_back(v);
  }
  return out;
}

// gtest prints parameters of failing tests; a byte dump of KirCase would be noise.
void PrintTo(const KirCase& c, std::ostream* os) { *os << c.file << ":" << c.first_line; }

class KirTest : public ::testing::TestWithParam<KirCase> {};

TEST_P(KirTest, Case) {
  const KirCase& c = GetParam();
  SCOPED_TRACE(c.file + ":" + std::to_string(c.first_line));

  std::vector<std::string> passes;
  for (const std::string& run : directive_values(c.text, "RUN")) {
    ASSERT_EQ(run.rfind("passes=", 0), 0u)
        << "RUN lines look like '// RUN: passes=a,b', got: " << run;
    for (std::string& p : split_pass_list(run.substr(7))) passes.push_back(p);
  }
  std::vector<std::string> errors = directive_values(c.text, "ERROR");
  std::string parse_problems;
  std::vector<CheckDirective> checks = parse_check_directives(c.text, 1, &parse_problems);
  ASSERT_EQ(parse_problems, "");

  if (!errors.empty()) {
    ASSERT_TRUE(checks.empty()) << "an ERROR case has no output to CHECK";
    try {
      Graph g = parse_graph(c.text, c.file);
      run_passes(g, passes);
      FAIL() << "expected an error containing '" << errors[0] << "', but the case succeeded:\n"
             << print_graph(g);
    } catch (const Error& e) {
      for (const std::string& want : errors)
        EXPECT_NE(std::string(e.what()).find(want), std::string::npos)
            << "the error message lacks '" << want << "':\n"
            << e.what();
    }
    return;
  }

  std::string printed;
  // `// SCHEDULE:` cases check the CPU compiler's schedule, loop kernels and memory plan
  // (compiler::describe_schedule) instead of the printed graph.
  bool schedule = !directive_values(c.text, "SCHEDULE").empty();
  try {
    Graph g = parse_graph(c.text, c.file);
    run_passes(g, passes);
    printed = schedule ? compiler::describe_schedule(g, compiler::target_for(Device::cpu())) : print_graph(g);
  } catch (const Error& e) {
    FAIL() << "unexpected error: " << e.what();
  }
  if (schedule) {
    EXPECT_EQ(filecheck(printed, checks), "") << "in " << c.file << "\noutput:\n" << printed;
    return;
  }
  // The printed form is canonical: parsing it and printing again changes nothing.
  try {
    Graph again = parse_graph(printed, "<printed>");
    EXPECT_EQ(print_graph(again), printed) << "print -> parse -> print is not the identity";
  } catch (const Error& e) {
    FAIL() << "the printed IR does not parse: " << e.what() << "\n" << printed;
  }
  std::string failure = filecheck(printed, checks);
  EXPECT_EQ(failure, "") << "in " << c.file << "\noutput:\n" << printed;
}

INSTANTIATE_TEST_SUITE_P(Kir, KirTest, ::testing::ValuesIn(all_cases()),
                         [](const ::testing::TestParamInfo<KirCase>& info) {
                           return info.param.name;
                         });

TEST(KirFiles, CasesWereFound) {
  // Guards against a path or split bug that would make every file's cases vanish silently.
  EXPECT_GE(all_cases().size(), 50u);
}

}  // namespace
}  // namespace kiln::test
