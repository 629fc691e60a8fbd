// kiln opt FILE [--passes=a,b] [-o OUT] [--split-input-file] [--list-passes] [--memory-plan]:
// reads IR text
// (FILE, or - for stdin), runs the named passes (verifying after each; see Note [Passes]) and
// prints the canonical IR text. This is how passes are tested: IR in, CHECK lines on IR out.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/error.h"
#include "support/files.h"
#include "compiler/compile.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "lower/memory_planner.h"
#include "lower/scheduler.h"
#include "passes/pass.h"
#include "tools/commands.h"

namespace kiln::cli {
namespace {

std::string read_all(std::FILE* f, const std::string& what) {
  std::string text;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  if (std::ferror(f))
    fail_kind(ErrorKind::Runtime, "cannot read {}: {}", what, std::strerror(errno));
  return text;
}

std::string read_input(const std::string& file) {
  if (file == "-") return read_all(stdin, "standard input");
  std::FILE* f = std::fopen(file.c_str(), "rb");
  if (!f) fail("cannot open '{}': {}", file, std::strerror(errno));
  std::string text = read_all(f, "'" + file + "'");
  std::fclose(f);
  return text;
}

void write_output(const std::string& path, const std::string& text) {
  if (path.empty() || path == "-") {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
    return;
  }
  // Temp file + rename: a failed run never leaves a half-written OUT.
  AtomicFile f(path, "cannot write");
  f.write(text);
  f.commit();
}

// Whether a chunk holds anything but blanks and comments.
bool has_code(const std::string& chunk) {
  size_t pos = 0;
  while (pos < chunk.size()) {
    size_t nl = chunk.find('\n', pos);
    if (nl == std::string::npos) nl = chunk.size();
    size_t b = chunk.find_first_not_of(" \t\r", pos);
    if (b != std::string::npos && b < nl && chunk[b] != '#' && chunk.compare(b, 2, "//") != 0)
      return true;
    pos = nl + 1;
  }
  return false;
}

// Splits on lines that are exactly "// -----" (what IR test files use between cases), dropping
// chunks with only comments (a file header), as the IR test runner does. Each chunk is
// prefixed with newlines so that error line numbers match the whole file.
std::vector<std::string> split_cases(const std::string& text) {
  std::vector<std::string> out;
  std::string cur;
  int line = 0, chunk_start = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    size_t end = nl == std::string::npos ? text.size() : nl + 1;
    std::string_view l(text.data() + pos, end - pos);
    std::string_view trimmed = l;
    while (!trimmed.empty() &&
           (trimmed.back() == '\n' || trimmed.back() == '\r' || trimmed.back() == ' '))
      trimmed.remove_suffix(1);
    ++line;
    if (trimmed == "// -----") {
      if (has_code(cur)) out.push_back(std::string(size_t(chunk_start), '\n') + cur);
      cur.clear();
      chunk_start = line;
    } else {
      cur.append(l);
    }
    pos = end;
  }
  if (has_code(cur) || out.empty()) out.push_back(std::string(size_t(chunk_start), '\n') + cur);
  return out;
}

}  // namespace

void add_opt_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("opt", "Run graph passes on IR text and print the result");
  static std::string file;
  static std::string passes;
  static std::string out_path;
  static bool split = false;
  static bool list = false;
  static bool memory_plan = false;
  static bool schedule = false;
  cmd->add_option("FILE", file, "IR text file, or - for standard input");
  cmd->add_option("--passes", passes, "Comma-separated passes to run, in order");
  cmd->add_option("-o,--output", out_path, "Write the result here instead of standard output");
  cmd->add_flag("--split-input-file", split,
                "Treat '// -----' lines as separators between independent graphs");
  cmd->add_flag("--list-passes", list, "List the available passes and exit");
  cmd->add_flag("--memory-plan", memory_plan,
                "After the passes, print the arena memory plan (see docs/memory.md)");
  cmd->add_flag("--schedule", schedule,
                "After the passes, print the CPU compiler's schedule: fused loop kernels, extern "
                "and eager steps, and the memory plan over the kernels (see docs/compiler.md)");
  cmd->callback([] {
    if (list) {
      std::string text;
      for (const PassEntry& e : registered_passes())
        text += fmt::format("{:<24} {}\n", e.name, e.make()->description());
      write_output(out_path, text);
      return;
    }
    if (file.empty()) fail("kiln opt: give an IR file (or - for standard input)");
    std::vector<std::string> names = split_pass_list(passes);
    for (const std::string& n : names) (void)find_pass(n);  // reject typos before reading input
    std::string text = read_input(file);
    std::string source = file == "-" ? "<stdin>" : file;
    std::vector<std::string> cases = split ? split_cases(text) : std::vector<std::string>{text};
    std::string result;
    for (size_t i = 0; i < cases.size(); ++i) {
      Graph g = parse_graph(cases[i], source);
      run_passes(g, names);
      if (i) result += "// -----\n";
      result += print_graph(g);
      if (memory_plan) {
        MemoryPlan plan = plan_memory(g);
        verify_memory_plan(g, plan);
        result += memory_plan_str(g, plan);
      }
      if (schedule) result += compiler::describe_schedule(g, compiler::target_for(Device::cpu()));
    }
    write_output(out_path, result);
  });
}

}  // namespace kiln::cli
