#include "passes/pass.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

#include "core/allocator.h"
#include "ir/printer.h"
#include "passes/graph_rewrite.h"
#include "support/files.h"
#include "ir/verifier.h"

namespace kiln {

namespace {

class VerifyPass : public Pass {
 public:
  std::string_view name() const override { return "verify"; }
  std::string_view description() const override {
    return "check the graph's invariants (ir/verifier.h); never changes the graph";
  }
  bool run(Graph& g) override {
    verify(g);
    return false;
  }
};

std::string available_passes() {
  std::string s;
  for (const PassEntry& e : registered_passes()) s += (s.empty() ? "" : ", ") + std::string(e.name);
  return s;
}

bool verify_enabled() {
  const char* v = std::getenv("KILN_VERIFY");
  return !(v && std::string_view(v) == "0");
}

void dump_ir(const char* dir, int index, std::string_view pass_name, const Graph& g) {
  make_dirs(dir, "KILN_DUMP_IR");
  write_file_atomic((std::filesystem::path(dir) / fmt::format("{:02d}-{}.kir", index, pass_name)).string(),
                    print_graph(g, PrintOptions{}));
}

}  // namespace

std::unique_ptr<Pass> make_verify_pass() { return std::make_unique<VerifyPass>(); }

bool memory_trace_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("KILN_TRACE_MEMORY");
    return e && *e && std::string_view(e) != "0";
  }();
  return on;
}

void trace_memory(std::string_view phase, const Graph& g) {
  if (!memory_trace_enabled()) return;
  std::vector<const Storage*> seen;
  size_t bytes = 0;
  int cuda_index = -1;
  for (const Value& v : g.values) {
    if (!has_data(v)) continue;
    const Storage* st = v.data.impl()->storage.get();
    if (std::find(seen.begin(), seen.end(), st) != seen.end()) continue;
    seen.push_back(st);
    bytes += st->nbytes();
    if (v.data.device().is_cuda()) cuda_index = v.data.device().index;
  }
  std::string line = fmt::format("[kiln] memory {:<24} graph weights {:8.1f} MiB in {:4}", phase,
                                 double(bytes) / 1048576.0, seen.size());
  if (cuda_index >= 0) {
    CudaAllocatorStats st = cuda_allocator_stats(cuda_index);
    line += fmt::format(" | device allocated {:8.1f} MiB, peak {:8.1f} MiB",
                        double(st.allocated_bytes) / 1048576.0,
                        double(st.peak_allocated_bytes) / 1048576.0);
  }
  std::fprintf(stderr, "%s\n", line.c_str());
}

std::vector<std::string> default_pipeline() {
  std::vector<std::string> out;
  for (const PassEntry& e : registered_passes())
    if (e.in_default_pipeline) out.push_back(e.name);
  return out;
}

std::unique_ptr<Pass> find_pass(std::string_view name) {
  for (const PassEntry& e : registered_passes())
    if (name == e.name) return e.make();
  fail("unknown pass '{}' (available passes: {})", name, available_passes());
}

std::vector<std::string> split_pass_list(std::string_view list) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= list.size()) {
    size_t comma = list.find(',', start);
    if (comma == std::string_view::npos) comma = list.size();
    std::string_view item = list.substr(start, comma - start);
    while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.remove_prefix(1);
    while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) item.remove_suffix(1);
    if (!item.empty()) out.emplace_back(item);
    start = comma + 1;
  }
  return out;
}

bool run_passes(Graph& g, std::span<const std::string> names) {
  // Resolve every name first: a typo fails before any work is done.
  std::vector<std::unique_ptr<Pass>> owned;
  std::vector<Pass*> passes;
  for (const std::string& n : names) {
    owned.push_back(find_pass(n));
    passes.push_back(owned.back().get());
  }
  return run_passes(g, std::span<Pass* const>(passes));
}

bool run_passes(Graph& g, std::span<Pass* const> passes) {
  const bool check = verify_enabled();
  const char* dump_dir = std::getenv("KILN_DUMP_IR");
  if (dump_dir && !*dump_dir) dump_dir = nullptr;

  if (dump_dir) dump_ir(dump_dir, 0, "input", g);
  if (check) {
    try {
      verify(g);
    } catch (const Error& e) {
      throw_error(e.kind(), "the input to run_passes is invalid: " + e.message());
    }
  }
  bool changed = false;
  for (size_t i = 0; i < passes.size(); ++i) {
    KILN_ASSERT(passes[i] != nullptr);
    Pass& p = *passes[i];
    try {
      changed |= p.run(g);
    } catch (const Error& e) {
      throw_error(e.kind(), fmt::format("pass '{}': {}", p.name(), e.message()));
    }
    if (dump_dir) dump_ir(dump_dir, int(i + 1), p.name(), g);
    trace_memory(p.name(), g);
    if (check) {
      try {
        verify(g);
      } catch (const Error& e) {
        throw_error(ErrorKind::Internal,
                    fmt::format("pass '{}' left an invalid graph (a bug in the pass): {}", p.name(),
                                e.message()));
      }
    }
  }
  return changed;
}

}  // namespace kiln
