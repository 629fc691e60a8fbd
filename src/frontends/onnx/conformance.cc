// The ONNX conformance runner. See Note [Conformance].
#include "frontends/onnx/conformance.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "frontends/onnx/importer.h"
#include "frontends/onnx/op_table.h"
#include "ir/interpreter.h"

namespace kiln {

namespace fs = std::filesystem;

const char* case_status_name(CaseStatus s) {
  switch (s) {
    case CaseStatus::Passed: return "passed";
    case CaseStatus::Failed: return "failed";
    case CaseStatus::Skipped: return "skipped";
  }
  return "?";
}

std::vector<std::string> default_conformance_dirs() {
  std::vector<std::string> out;
  for (const char* suite : {"node", "simple", "pytorch-converted", "pytorch-operator"}) {
    std::string d = std::string("/usr/share/libonnx-testdata/data/") + suite;
    std::error_code ec;
    if (fs::is_directory(d, ec)) out.push_back(d);
  }
  return out;
}

namespace {

bool is_case_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p / "model.onnx", ec);
}

void add_case(std::vector<ConformanceCase>& out, const fs::path& dir, const std::string& filter) {
  ConformanceCase c;
  c.dir = dir.string();
  c.name = dir.filename().string();
  c.suite = dir.parent_path().filename().string();
  if (!filter.empty() && (c.suite + "/" + c.name).find(filter) == std::string::npos) return;
  out.push_back(std::move(c));
}

std::vector<fs::path> sorted_children(const fs::path& dir) {
  std::vector<fs::path> v;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_directory(ec)) v.push_back(e.path());
  std::sort(v.begin(), v.end());
  return v;
}

// Files named prefix_<N>.pb in N order.
std::vector<fs::path> numbered(const fs::path& dir, const std::string& prefix) {
  std::vector<std::pair<long, fs::path>> v;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string f = e.path().filename().string();
    if (f.rfind(prefix, 0) != 0 || f.size() < prefix.size() + 4 || f.substr(f.size() - 3) != ".pb")
      continue;
    std::string num = f.substr(prefix.size(), f.size() - prefix.size() - 3);
    if (num.empty() || !std::all_of(num.begin(), num.end(), ::isdigit)) continue;
    v.emplace_back(std::stol(num), e.path());
  }
  std::sort(v.begin(), v.end());
  std::vector<fs::path> out;
  for (auto& [n, p] : v) out.push_back(p);
  return out;
}

// Empty when `got` matches `want`; otherwise what differs.
std::string compare(const Tensor& got, const Tensor& want, double rtol, double atol) {
  if (got.dtype() != want.dtype())
    return fmt::format("dtype {} (expected {})", dtype_name(got.dtype()), dtype_name(want.dtype()));
  if (got.sizes() != want.sizes())
    return fmt::format("shape {} (expected {})", to_string(got.sizes()), to_string(want.sizes()));
  // Tolerances per dtype: integers and bool exactly; float64 at 1e-7 relative (its kernels
  // compute in double); the given rtol/atol for float32 and the 16-bit floats.
  const DType dt = want.dtype();
  if (!is_floating(dt)) rtol = atol = 0;
  else if (dt == DType::Float64) rtol = std::min(rtol, 1e-7), atol = std::min(atol, 1e-12);
  std::vector<double> g = got.to_vector<double>(), w = want.to_vector<double>();
  int64_t bad = 0, first = -1;
  double worst = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    double a = g[i], b = w[i];
    bool ok;
    if (std::isnan(a) || std::isnan(b)) ok = std::isnan(a) && std::isnan(b);
    else if (std::isinf(a) || std::isinf(b)) ok = a == b;
    else ok = std::fabs(a - b) <= atol + rtol * std::fabs(b);
    if (!ok) {
      if (first < 0) first = int64_t(i);
      ++bad;
      if (!std::isnan(a - b)) worst = std::max(worst, std::fabs(a - b));
    }
  }
  if (bad == 0) return "";
  return fmt::format("{} of {} values differ beyond rtol {} atol {} (max |diff| {:.4g}; first at flat "
                     "index {}: got {:.7g}, expected {:.7g})", bad, g.size(), rtol, atol, worst, first,
                     g[size_t(first)], w[size_t(first)]);
}

// Imports the model, binding graph inputs that the importer needs at import time to their
// values in `inputs` (by position in c.input_names). Returns the indices of bound inputs.
Graph import_specialized(ConformanceCase& c, const TensorList& inputs, std::vector<size_t>* bound) {
  std::string path = (fs::path(c.dir) / "model.onnx").string();
  ImportOptions opts;
  std::vector<std::string> needed;
  opts.needed_constant_inputs = &needed;
  for (int attempt = 0;; ++attempt) {
    if (attempt > 2 * int(c.input_names.size()) + 2)
      fail("import did not settle after binding/reshaping inputs {} times", attempt);
    needed.clear();
    try {
      Graph g = import_onnx(path, opts);
      // Inputs whose data disagrees with the declared shape: import again with the data's.
      bool reshaped = false;
      for (size_t k = 0, gi = 0; k < inputs.size() && gi < g.inputs.size(); ++k) {
        if (std::find(bound->begin(), bound->end(), k) != bound->end()) continue;
        const TensorType& t = g.type(g.inputs[gi++]);
        bool match = t.rank() == inputs[k].dim();
        for (int d = 0; match && d < t.rank(); ++d)
          match = t.shape[size_t(d)].is_symbolic() || t.shape[size_t(d)].value() == inputs[k].size(d);
        if (match) continue;
        const Dims& s = inputs[k].sizes();
        opts.input_shapes.emplace_back(c.input_names[k], std::vector<int64_t>(s.begin(), s.end()));
        if (std::find(c.reshaped_inputs.begin(), c.reshaped_inputs.end(), c.input_names[k]) ==
            c.reshaped_inputs.end())
          c.reshaped_inputs.push_back(c.input_names[k]);
        reshaped = true;
      }
      if (!reshaped) return g;
    } catch (const Error& e) {
      bool progress = false;
      for (const std::string& n : needed) {
        auto it = std::find(c.input_names.begin(), c.input_names.end(), n);
        if (it == c.input_names.end()) continue;
        size_t k = size_t(it - c.input_names.begin());
        if (k >= inputs.size() || std::find(bound->begin(), bound->end(), k) != bound->end())
          continue;
        bound->push_back(k);
        opts.constant_inputs.emplace_back(n, inputs[k]);
        progress = true;
      }
      if (!progress) throw;
    }
  }
}

void run_case_inline(ConformanceCase& c, const ConformanceOptions& opt) {
  fs::path dir(c.dir);
  std::vector<fs::path> sets;
  for (const fs::path& p : sorted_children(dir))
    if (p.filename().string().rfind("test_data_set_", 0) == 0) sets.push_back(p);
  if (sets.empty()) {
    c.status = CaseStatus::Failed;
    c.reason = "no test_data_set_* directory";
    return;
  }
  Graph g;
  bool have_graph = false;  // an unspecialized graph serves every data set
  for (const fs::path& set : sets) {
    std::string where = set.filename().string();
    TensorList inputs, expected;
    std::vector<size_t> bound;
    try {
      for (const fs::path& p : numbered(set, "input_"))
        inputs.push_back(read_onnx_tensor_file(p.string(), nullptr, {}, true));
      for (const fs::path& p : numbered(set, "output_"))
        expected.push_back(read_onnx_tensor_file(p.string(), nullptr, {}, true));
      if (inputs.size() != c.input_names.size())
        fail("{} has {} inputs, the model takes {}", where, inputs.size(), c.input_names.size());
    } catch (const Error& e) {
      c.status = CaseStatus::Failed;
      c.reason = std::string("test data: ") + e.what();
      return;
    }
    if (!have_graph) {
      try {
        g = import_specialized(c, inputs, &bound);
      } catch (const Error& e) {
        c.status = CaseStatus::Failed;
        c.reason = std::string("import: ") + e.what();
        return;
      }
      have_graph = bound.empty();
      for (size_t k : bound)
        if (std::find(c.specialized_inputs.begin(), c.specialized_inputs.end(), c.input_names[k]) ==
            c.specialized_inputs.end())
          c.specialized_inputs.push_back(c.input_names[k]);
    }
    try {
      TensorList args;
      for (size_t k = 0; k < inputs.size(); ++k)
        if (std::find(bound.begin(), bound.end(), k) == bound.end()) args.push_back(inputs[k]);
      if (expected.size() != g.outputs.size())
        fail("{} has {} expected outputs, the imported graph returns {}", where, expected.size(),
             g.outputs.size());
      TensorList got = opt.runner ? opt.runner(g, args) : run(g, args);
      for (size_t k = 0; k < got.size(); ++k) {
        std::string diff = opt.compare ? opt.compare(got[k], expected[k], opt.rtol, opt.atol)
                                       : compare(got[k], expected[k], opt.rtol, opt.atol);
        if (!diff.empty())
          fail("{}: output {} ('{}'): {}", where, k, g.value(g.outputs[k]).name, diff);
      }
      ++c.data_sets;
    } catch (const Error& e) {
      c.status = CaseStatus::Failed;
      c.reason = e.what();
      return;
    }
  }
  c.status = CaseStatus::Passed;
}

// Classifies by scanning; returns true when the case is skipped.
bool classify(ConformanceCase& c) {
  OnnxModelScan scan;
  try {
    scan = scan_onnx_model((fs::path(c.dir) / "model.onnx").string());
  } catch (const Error& e) {
    c.status = CaseStatus::Failed;
    c.reason = std::string("import: ") + e.what();
    return true;  // nothing more to run
  }
  c.opset = scan.opset;
  c.op_types = scan.op_types;
  c.input_names = scan.input_names;
  for (auto& [op, nodes] : scan.unmapped_ops) c.unmapped.push_back(op);
  std::string reason;
  if (!c.unmapped.empty()) {
    reason = "unmapped op type";
    reason += c.unmapped.size() > 1 ? "s: " : ": ";
    for (size_t i = 0; i < c.unmapped.size(); ++i) reason += (i ? ", " : "") + c.unmapped[i];
  }
  if (!scan.unsupported_types.empty()) {
    if (!reason.empty()) reason += "; ";
    reason += "types Kiln cannot represent: ";
    for (size_t i = 0; i < scan.unsupported_types.size() && i < 4; ++i)
      reason += (i ? ", " : "") + scan.unsupported_types[i];
    if (scan.unsupported_types.size() > 4) reason += ", ...";
  }
  if (reason.empty()) return false;
  c.status = CaseStatus::Skipped;
  c.reason = reason;
  return true;
}

// Runs the case in a forked child; the result comes back through a pipe.
void run_case_isolated(ConformanceCase& c, const ConformanceOptions& opt) {
  int fd[2];
  if (pipe(fd) != 0) fail_kind(ErrorKind::Runtime, "pipe() failed: {}", std::strerror(errno));
  pid_t pid = fork();
  if (pid < 0) fail_kind(ErrorKind::Runtime, "fork() failed: {}", std::strerror(errno));
  if (pid == 0) {
    close(fd[0]);
    ConformanceCase r = c;
    try {
      run_case_inline(r, opt);
    } catch (const std::exception& e) {
      r.status = CaseStatus::Failed;
      r.reason = std::string("internal error: ") + e.what();
    }
    std::string msg = nlohmann::json{{"status", int(r.status)}, {"data_sets", r.data_sets},
                                     {"reason", r.reason}, {"specialized", r.specialized_inputs},
                                     {"reshaped", r.reshaped_inputs}}.dump();
    size_t off = 0;
    while (off < msg.size()) {
      ssize_t n = write(fd[1], msg.data() + off, msg.size() - off);
      if (n <= 0) break;
      off += size_t(n);
    }
    close(fd[1]);
    _exit(0);
  }
  close(fd[1]);
  std::string msg;
  char buf[4096];
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::milliseconds(int64_t(opt.case_timeout_s * 1000));
  int status = 0;
  bool done = false, timed_out = false;
  // Read until EOF (the child exits) or the deadline.
  fcntl(fd[0], F_SETFL, O_NONBLOCK);
  while (!done) {
    ssize_t n = read(fd[0], buf, sizeof buf);
    if (n > 0) {
      msg.append(buf, size_t(n));
      continue;
    }
    if (n == 0) {
      waitpid(pid, &status, 0);
      done = true;
      break;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      timed_out = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  close(fd[0]);
  if (timed_out) {
    c.status = CaseStatus::Failed;
    c.reason = fmt::format("timed out after {} s", opt.case_timeout_s);
    return;
  }
  if (WIFSIGNALED(status)) {
    c.status = CaseStatus::Failed;
    c.reason = fmt::format("crashed (signal {}: {})", WTERMSIG(status), strsignal(WTERMSIG(status)));
    return;
  }
  nlohmann::json j = nlohmann::json::parse(msg, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    c.status = CaseStatus::Failed;
    c.reason = fmt::format("the child exited with status {} without a result", WEXITSTATUS(status));
    return;
  }
  c.status = CaseStatus(j["status"].get<int>());
  c.data_sets = j["data_sets"].get<int>();
  c.reason = j["reason"].get<std::string>();
  c.specialized_inputs = j["specialized"].get<std::vector<std::string>>();
  c.reshaped_inputs = j["reshaped"].get<std::vector<std::string>>();
}

}  // namespace

std::vector<ConformanceCase> discover_conformance_cases(const std::vector<std::string>& dirs,
                                                        const std::string& filter) {
  std::vector<ConformanceCase> out;
  for (const std::string& d : dirs) {
    fs::path p(d);
    std::error_code ec;
    if (!fs::is_directory(p, ec)) fail("--data {}: not a directory", d);
    if (is_case_dir(p)) {
      add_case(out, p, filter);
      continue;
    }
    for (const fs::path& child : sorted_children(p)) {
      if (is_case_dir(child)) {
        add_case(out, child, filter);
        continue;
      }
      for (const fs::path& grand : sorted_children(child))
        if (is_case_dir(grand)) add_case(out, grand, filter);
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const ConformanceCase& a, const ConformanceCase& b) {
    return std::tie(a.suite, a.name) < std::tie(b.suite, b.name);
  });
  return out;
}

void run_conformance_case(ConformanceCase& c, const ConformanceOptions& options) {
  auto t0 = std::chrono::steady_clock::now();
  if (!classify(c)) {
    if (options.isolate) run_case_isolated(c, options);
    else run_case_inline(c, options);
  }
  c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

ConformanceReport run_conformance(const ConformanceOptions& options,
                                  const std::function<void(const ConformanceCase&)>& progress) {
  ConformanceReport r;
  r.searched_dirs = options.data_dirs.empty() ? default_conformance_dirs() : options.data_dirs;
  if (r.searched_dirs.empty())
    fail("no conformance data: install libonnx-testdata (scripts/setup.sh) or pass --data DIR");
  r.cases = discover_conformance_cases(r.searched_dirs, options.filter);
  for (ConformanceCase& c : r.cases) {
    run_conformance_case(c, options);
    switch (c.status) {
      case CaseStatus::Passed: ++r.passed; break;
      case CaseStatus::Failed: ++r.failed; break;
      case CaseStatus::Skipped: ++r.skipped; break;
    }
    if (progress) progress(c);
  }
  return r;
}

std::string conformance_json(const ConformanceReport& r, const ConformanceOptions& options) {
  using nlohmann::json;
  json j;
  int specialized = 0;
  for (const ConformanceCase& c : r.cases)
    specialized += c.status == CaseStatus::Passed && !c.specialized_inputs.empty();
  j["summary"] = {{"passed", r.passed}, {"failed", r.failed}, {"skipped", r.skipped},
                  {"total", r.cases.size()}, {"passed_with_specialized_inputs", specialized}};
  j["options"] = {{"data_dirs", r.searched_dirs}, {"filter", options.filter},
                  {"rtol", options.rtol}, {"atol", options.atol}, {"backend", "eager (interpreter)"}};
  // Per ONNX op type: cases that use it, by outcome, and its Kiln mapping.
  struct Row { int cases = 0, passed = 0, failed = 0, skipped = 0; };
  std::map<std::string, Row> rows;
  for (const onnx::OnnxOpEntry& e : onnx::onnx_op_table()) rows[std::string(e.op_type)];
  for (const ConformanceCase& c : r.cases)
    for (const std::string& op : c.op_types) {
      Row& row = rows[op];
      ++row.cases;
      (c.status == CaseStatus::Passed ? row.passed : c.status == CaseStatus::Failed ? row.failed : row.skipped)++;
    }
  json ops = json::array();
  for (auto& [op, row] : rows) {
    const onnx::OnnxOpEntry* e = onnx::find_onnx_op(op);
    json kiln = json::array();
    if (e)
      for (OpId id : e->kiln_ops) kiln.push_back(op_def(id).name);
    ops.push_back({{"onnx_op", op}, {"mapped", e != nullptr}, {"kiln_ops", kiln},
                   {"note", e ? std::string(e->note) : std::string()}, {"cases", row.cases},
                   {"passed", row.passed}, {"failed", row.failed}, {"skipped", row.skipped}});
  }
  j["ops"] = ops;
  j["mapped_op_types"] = onnx::onnx_op_table().size();
  json cases = json::array();
  for (const ConformanceCase& c : r.cases)
    cases.push_back({{"suite", c.suite}, {"name", c.name}, {"status", case_status_name(c.status)},
                     {"reason", c.reason}, {"opset", c.opset}, {"op_types", c.op_types},
                     {"specialized_inputs", c.specialized_inputs},
                     {"reshaped_inputs", c.reshaped_inputs},
                     {"data_sets", c.data_sets}, {"seconds", c.seconds}});
  j["cases"] = cases;
  return j.dump(2);
}

std::string conformance_markdown(const ConformanceReport& r) {
  struct Row { int cases = 0, passed = 0, failed = 0, skipped = 0; };
  std::map<std::string, Row> rows;
  for (const ConformanceCase& c : r.cases)
    for (const std::string& op : c.op_types) {
      Row& row = rows[op];
      ++row.cases;
      (c.status == CaseStatus::Passed ? row.passed : c.status == CaseStatus::Failed ? row.failed : row.skipped)++;
    }
  std::string out = fmt::format("{} ONNX op types mapped. Suites: {} passed, {} failed, {} skipped.\n\n",
                                onnx::onnx_op_table().size(), r.passed, r.failed, r.skipped);
  out += "| ONNX op | Kiln ops | cases | passed | failed | skipped | notes |\n";
  out += "|---|---|---|---|---|---|---|\n";
  for (const onnx::OnnxOpEntry& e : onnx::onnx_op_table()) {
    std::string kiln;
    for (OpId id : e.kiln_ops) kiln += (kiln.empty() ? "" : ", ") + std::string(op_def(id).name);
    Row row = rows.count(std::string(e.op_type)) ? rows[std::string(e.op_type)] : Row{};
    out += fmt::format("| {} | {} | {} | {} | {} | {} | {} |\n", e.op_type,
                       kiln.empty() ? "(constant)" : kiln, row.cases, row.passed, row.failed,
                       row.skipped, e.note);
  }
  std::string unmapped;
  for (auto& [op, row] : rows)
    if (!onnx::find_onnx_op(op)) unmapped += fmt::format("{}{} ({})", unmapped.empty() ? "" : ", ", op, row.cases);
  if (!unmapped.empty()) out += "\nNot mapped (cases in the suites): " + unmapped + "\n";
  return out;
}

}  // namespace kiln
