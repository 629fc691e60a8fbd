// bench/compare.py (Kiln against ONNX Runtime, PyTorch eager and TorchScript): a quick run on mlp
// must produce the raw JSON, the Markdown tables, the HTML report and the docs region with every
// system present and sane numbers; bad names must fail with a clear message. Structural checks
// only, never timing thresholds. The script runs under the Kiln venv's Python ($KILN_PYTHON, else
// ~/.cache/kiln/venv/bin/python) against the kiln binary built next to this test.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "core/cuda_runtime.h"

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

const std::vector<std::string> kQuickSystems = {"kiln-eager", "kiln-compiled", "ort",
                                                "torch-eager", "torchscript"};

std::string python() {
  if (const char* p = std::getenv("KILN_PYTHON")) return p;
  return std::string(std::getenv("HOME") ? std::getenv("HOME") : "/root") +
         "/.cache/kiln/venv/bin/python";
}

// The repository root: $KILN_TEST_DATA/.. or the tests/ path CMake wrote next to this binary.
fs::path repo_root() {
  if (const char* env = std::getenv("KILN_TEST_DATA")) return fs::path(env).parent_path();
  fs::path exe = fs::read_symlink("/proc/self/exe");
  std::ifstream f(exe.parent_path() / "kiln_test_data.txt");
  std::string line;
  if (!f || !std::getline(f, line)) return {};
  return fs::path(line).parent_path();
}

// build/tests/kiln_unit_tests -> build/kiln
fs::path kiln_binary() {
  return fs::read_symlink("/proc/self/exe").parent_path().parent_path() / "kiln";
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct ScriptResult {
  int rc = -1;
  std::string output;  // stdout and stderr together
};

ScriptResult run_compare(const std::string& args, const fs::path& dir) {
  fs::path log = dir / "compare.log";
  std::string cmd = "'" + python() + "' '" + (repo_root() / "bench" / "compare.py").string() +
                    "' " + args + " > '" + log.string() + "' 2>&1";
  int status = std::system(cmd.c_str());
  ScriptResult r;
  r.rc = WIFEXITED(status) ? WEXITSTATUS(status) : 128;
  r.output = slurp(log);
  return r;
}

fs::path temp_dir(const std::string& tag) {
  fs::path d = fs::temp_directory_path() / ("kiln_compare_test_" + tag + "_" +
                                            std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Checks that every element is closed in order (the report is written in XHTML syntax).
// Returns "" or what is wrong.
std::string check_tags_balanced(const std::string& s) {
  std::vector<std::string> stack;
  size_t i = 0;
  while ((i = s.find('<', i)) != std::string::npos) {
    if (s.compare(i, 4, "<!--") == 0) {
      size_t e = s.find("-->", i);
      if (e == std::string::npos) return "unterminated comment";
      i = e + 3;
      continue;
    }
    // Find the closing '>' outside quoted attribute values.
    size_t j = i + 1;
    char quote = 0;
    for (; j < s.size(); ++j) {
      if (quote) {
        if (s[j] == quote) quote = 0;
      } else if (s[j] == '"' || s[j] == '\'') {
        quote = s[j];
      } else if (s[j] == '>') {
        break;
      }
    }
    if (j >= s.size()) return "unterminated tag at offset " + std::to_string(i);
    std::string tag = s.substr(i + 1, j - i - 1);
    i = j + 1;
    if (tag.empty()) return "empty tag";
    if (tag[0] == '!' || tag[0] == '?') continue;  // <!DOCTYPE ...>
    bool closing = tag[0] == '/';
    bool self_closing = tag.back() == '/';
    std::string name = tag.substr(closing ? 1 : 0);
    name = name.substr(0, name.find_first_of(" \t\n/"));
    if (name.empty()) return "tag without a name: <" + tag + ">";
    if (closing) {
      if (stack.empty()) return "</" + name + "> without an open element";
      if (stack.back() != name) return "</" + name + "> closes <" + stack.back() + ">";
      stack.pop_back();
    } else if (!self_closing) {
      stack.push_back(name);
    }
  }
  if (!stack.empty()) return "<" + stack.back() + "> is never closed";
  return "";
}

bool finite_positive(const json& v) {
  return v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() > 0;
}

// Nearest rank, as kiln::percentile and compare.py compute it.
double nearest_rank(std::vector<double> s, double p) {
  std::sort(s.begin(), s.end());
  size_t rank = size_t(std::ceil(p / 100.0 * double(s.size())));
  return s[rank == 0 ? 0 : rank - 1];
}

// The Markdown table row of `system` ("| name | cells... |"), or "".
std::string md_row(const std::string& md, const std::string& system) {
  size_t b = md.find("\n| " + system + " | ");
  if (b == std::string::npos) return "";
  size_t e = md.find('\n', b + 1);
  return md.substr(b + 1, e == std::string::npos ? std::string::npos : e - b - 1);
}

class CompareScript : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(fs::exists(python())) << "Python venv missing at " << python()
                                      << ": run scripts/setup_python.sh";
    ASSERT_FALSE(repo_root().empty())
        << "cannot find the repository: set KILN_TEST_DATA=<repo>/tests";
    ASSERT_TRUE(fs::exists(repo_root() / "bench" / "compare.py"));
  }
};

TEST_F(CompareScript, QuickRunOnMlpReportsEverySystem) {
  ASSERT_TRUE(fs::exists(kiln_binary())) << "the kiln binary is missing at " << kiln_binary()
                                         << ": build the kiln_cli target";
  fs::path dir = temp_dir("quick");
  fs::path out = dir / "out";
  // A docs file with text around the compare region: --update-docs must replace only the region.
  fs::path docs = dir / "benchmarks.md";
  std::ofstream(docs) << "# Benchmarks\n\nbefore the region\n\n<!-- compare:begin -->\nstale "
                         "table\n<!-- compare:end -->\n\nafter the region\n";
  std::string systems;
  for (const auto& s : kQuickSystems) systems += (systems.empty() ? "" : ",") + s;
  ScriptResult r = run_compare("--models mlp --systems " + systems +
                          " --iters 9 --rounds 3 --warmup 1 --threads 2 --kiln '" +
                          kiln_binary().string() + "' --out '" + out.string() +
                          "' --update-docs --docs '" + docs.string() + "' --quiet",
                      dir);
  ASSERT_EQ(r.rc, 0) << r.output;

  // (1) Raw JSON: every system present and ok, with sane numbers.
  json j = json::parse(slurp(out / "compare.json"));
  for (const char* key : {"command", "date", "host", "versions", "settings", "load_avg_start"})
    EXPECT_TRUE(j.contains(key)) << key;
  EXPECT_FALSE(j["host"]["cpu_model"].get<std::string>().empty());
  ASSERT_EQ(j["models"].size(), 1u);
  const json& m = j["models"][0];
  EXPECT_EQ(m["model"], "mlp");
  ASSERT_EQ(m["systems"].size(), kQuickSystems.size());
  // kiln bench --json has per-call samples, so every system's statistics come from all calls.
  EXPECT_EQ(m["latency_method"], "all-calls");
  for (const auto& name : kQuickSystems) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(m["systems"].contains(name));
    const json& s = m["systems"][name];
    ASSERT_EQ(s["status"], "ok") << s["error"] << "\n" << s["error_detail"];
    const json& lat = s["latency"];
    for (const char* k : {"min_ms", "p50_ms", "p90_ms", "p99_ms", "max_ms", "mean_ms"})
      EXPECT_TRUE(finite_positive(lat[k])) << k << " = " << lat[k];
    EXPECT_LE(lat["min_ms"].get<double>(), lat["p50_ms"].get<double>());
    EXPECT_LE(lat["p50_ms"].get<double>(), lat["p90_ms"].get<double>());
    EXPECT_LE(lat["p90_ms"].get<double>(), lat["p99_ms"].get<double>());
    EXPECT_LE(lat["p99_ms"].get<double>(), lat["max_ms"].get<double>());
    EXPECT_EQ(lat["n"], 9);  // 3 rounds x 3 calls
    // One statistic for every system of a model (all calls, or pooled rounds for all).
    EXPECT_EQ(s["latency_method"], m["latency_method"]);
    EXPECT_EQ(s["rounds"].size(), 3u);
    EXPECT_TRUE(finite_positive(s["first_call_s"])) << s["first_call_s"];
    EXPECT_TRUE(finite_positive(s["peak_rss_bytes"])) << s["peak_rss_bytes"];
    if (s["latency_source"] == "samples") {
      ASSERT_EQ(s["samples_ms"].size(), 9u);
      for (const auto& x : s["samples_ms"]) EXPECT_TRUE(finite_positive(x));
    }
    if (name.rfind("kiln-", 0) == 0) {
      // Kiln's row comes from its per-call samples (3 rounds x 3 calls), like every peer's.
      EXPECT_EQ(s["latency_source"], "samples");
      EXPECT_EQ(s["latency_method"], "all-calls");
      ASSERT_TRUE(s["samples_ms"].is_array());
      std::vector<double> all = s["samples_ms"].get<std::vector<double>>();
      ASSERT_EQ(all.size(), 9u);
      EXPECT_EQ(lat["p50_ms"].get<double>(), nearest_rank(all, 50));
      EXPECT_EQ(lat["p99_ms"].get<double>(), nearest_rank(all, 99));
      EXPECT_EQ(lat["max_ms"].get<double>(), nearest_rank(all, 100));
      EXPECT_EQ(s["kiln_bench"]["samples_ms"].size(), 3u);
      // Every kiln bench JSON key is kept.
      const json& kb = s["kiln_bench"];
      for (const char* k : {"compile_s", "first_call_s", "p50_ms", "peak_rss_bytes", "backend",
                            "steady_state_allocs_per_call", "kiln_version", "host"})
        EXPECT_TRUE(kb.contains(k)) << k;
      EXPECT_EQ(kb["threads"], 2);
    }
  }
  EXPECT_EQ(m["systems"]["kiln-compiled"]["kiln_bench"]["backend"].get<std::string>().rfind(
                "compiled", 0),
            0u);
  EXPECT_EQ(m["systems"]["torch-eager"]["config"]["torch_threads"], 2);
  EXPECT_EQ(m["systems"]["ort"]["config"]["intra_op_num_threads"], 2);

  // (2) Markdown: a row per system.
  std::string md = slurp(out / "compare.md");
  EXPECT_NE(md.find("| system | p50 ms | p99 ms | p99/p50 |"), std::string::npos) << md;
  for (const auto& name : kQuickSystems) {
    std::string row = md_row(md, name);
    EXPECT_FALSE(row.empty()) << name << "\n" << md;
    // No "pooled from per-round summaries" marker: all systems, Kiln included, use all calls.
    EXPECT_EQ(row.find("†"), std::string::npos) << row;
  }
  EXPECT_EQ(md.find("iteration-weighted medians"), std::string::npos) << md;

  // (3) HTML: one self-contained file, well-formed, with inline SVG plots and no scripts.
  std::string html = slurp(out / "compare.html");
  EXPECT_NE(html.find("<svg"), std::string::npos);
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("<link"), std::string::npos);
  EXPECT_EQ(check_tags_balanced(html), "");
  for (const auto& name : kQuickSystems) EXPECT_NE(html.find(">" + name + "<"), std::string::npos);

  // (4) --update-docs: the region is rewritten, the rest of the file kept.
  std::string d = slurp(docs);
  EXPECT_EQ(d.rfind("# Benchmarks\n\nbefore the region\n\n<!-- compare:begin -->\n", 0), 0u) << d;
  EXPECT_NE(d.find("<!-- compare:end -->\n\nafter the region\n"), std::string::npos) << d;
  EXPECT_EQ(d.find("stale table"), std::string::npos) << d;
  EXPECT_NE(d.find("| kiln-compiled | "), std::string::npos) << d;
  EXPECT_NE(d.find("compare.py --models mlp"), std::string::npos) << d;

  // (5) The fallback for kiln binaries without samples_ms: the same run with Kiln's samples
  // removed, re-rendered, pools every system's per-round summaries and marks them with †.
  fs::path old = dir / "old";
  fs::create_directories(old);
  json stripped = j;
  for (auto& [name, sys] : stripped["models"][0]["systems"].items()) {
    if (name.rfind("kiln-", 0) != 0) continue;
    sys["samples_ms"] = nullptr;
    sys["latency_source"] = "round-summaries";
    sys["kiln_bench"].erase("samples_ms");
  }
  std::ofstream(old / "compare.json") << stripped.dump(1);
  ScriptResult rr = run_compare("--render '" + (old / "compare.json").string() + "'", dir);
  ASSERT_EQ(rr.rc, 0) << rr.output;
  std::string old_md = slurp(old / "compare.md");
  for (const auto& name : kQuickSystems) {
    std::string row = md_row(old_md, name);
    EXPECT_NE(row.find("†"), std::string::npos) << name << ": " << row;
  }
  EXPECT_NE(old_md.find("iteration-weighted medians"), std::string::npos) << old_md;
  fs::remove_all(dir);
}

TEST_F(CompareScript, UnknownModelIsAClearError) {
  fs::path dir = temp_dir("badmodel");
  ScriptResult r = run_compare("--models mlp,no_such_model --systems torch-eager --iters 1 --kiln '" +
                          kiln_binary().string() + "' --out '" + (dir / "out").string() + "'",
                      dir);
  EXPECT_NE(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("unknown model 'no_such_model'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("resnet18"), std::string::npos) << "lists the known models\n" << r.output;
  EXPECT_FALSE(fs::exists(dir / "out" / "compare.json"));
  fs::remove_all(dir);
}

TEST_F(CompareScript, UnknownSystemIsAClearError) {
  fs::path dir = temp_dir("badsystem");
  ScriptResult r = run_compare("--models mlp --systems kiln-compiled,tensorflow --iters 1 --out '" +
                          (dir / "out").string() + "'",
                      dir);
  EXPECT_NE(r.rc, 0) << r.output;
  EXPECT_NE(r.output.find("unknown system 'tensorflow'"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("torch-compile"), std::string::npos) << "lists the systems\n" << r.output;
  fs::remove_all(dir);
}

TEST_F(CompareScript, CudaWithoutDeviceExitsWithTwo) {
  if (kiln::cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  fs::path dir = temp_dir("cuda");
  // Both probes answer: Kiln's (`kiln device --json`) and torch's.
  ScriptResult r = run_compare("--models mlp --systems kiln-eager,torch-eager --device cuda "
                               "--iters 1 --kiln '" + kiln_binary().string() + "' --out '" +
                                   (dir / "out").string() + "'",
                               dir);
  EXPECT_EQ(r.rc, 2) << r.output;
  EXPECT_NE(r.output.find("--device cuda: no usable CUDA device"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("kiln device: no CUDA device"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("torch"), std::string::npos) << r.output;
  EXPECT_FALSE(fs::exists(dir / "out" / "compare.json"));
  fs::remove_all(dir);
}

}  // namespace
