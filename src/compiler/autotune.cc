// Note [autotuning]
// max-autotune builds whole-graph candidates and times each (median of 15 calls on one set of
// random inputs, after a warm-up round):
//   1. the target's candidates (Target::autotune_candidates; CPU: convolution layout policies,
//      Winograd, generated vs library GEMV). Candidates are whole graphs because layouts
//      interact across neighbours. A candidate that rounds differently from the default
//      configuration (not `exact`, e.g. Winograd) is first run on the same inputs as the first
//      candidate (the default configuration) and rejected when its outputs differ by more than
//      `autotune_tolerance` relative to the largest reference output (a bfloat16 or float16
//      compile: 4 units of its precision, 4/256 and 4/2048). Every candidate's second
//      call is timed once: one over `autotune_slow_cutoff` (10x, +10 ms) slower than the
//      default's — confirmed by a third call, the faster of the two counting — is rejected there
//      (a layout the library has only a reference kernel for on this ISA: nChw16c on an AVX2
//      machine), so a pathological candidate costs two calls, not the timing rounds. The others
//      are timed in interleaved rounds; the fastest wins (a lone candidate is not timed).
//   2. code-generation variants of the winner (Target::autotune_variants; CPU: 256-bit vectors
//      on AVX-512, 4 accumulators per SIMD reduction). Each must agree with the reference (lanes
//      and accumulators combine in another order); all are timed together with the winner, and
//      a variant replaces it only when at least 3% faster.
//   3. per-launch runtime parameters of the result (Target::tune_launches; CPU: the thread count
//      of every parallel loop kernel).
// The report lists every candidate with its time or rejection. The choice ("NAME" or
// "NAME\nLAUNCH-RECORD") is persisted in the tuning store under the target's tuning context
// (CPU: ISA and thread count) and the graph's text, so the next compile of the same graph on the
// same machine builds only the chosen configuration.
#include "compiler/autotune.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>

#include <fmt/format.h>

#include "ir/printer.h"
#include "support/tuning_store.h"

namespace kiln::compiler {

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void progress(bool on, int done, int total, const std::string& what) {
  if (!on) return;
  int width = 24, fill = total ? done * width / total : width;
  std::fprintf(stderr, "\r[kiln] autotuning [%s%s] %d/%d %s\033[K",
               std::string(size_t(fill), '#').c_str(), std::string(size_t(width - fill), '.').c_str(),
               done, total, what.c_str());
  if (done == total) std::fprintf(stderr, "\n");
  std::fflush(stderr);
}

std::string name_of(const Knobs& k) { return k.str(); }

// Splits a recorded choice "CANDIDATE[,k=v...]" against the candidates: the longest candidate
// name that is the whole choice or followed by ','; the rest parsed as added knobs.
bool parse_choice(const std::string& choice, const std::vector<Target::Candidate>& cands,
                  const Target::Candidate** cand, Knobs* added) {
  size_t best_len = 0;
  *cand = nullptr;
  for (const Target::Candidate& c : cands) {
    std::string n = name_of(c.knobs);
    if (choice.compare(0, n.size(), n) != 0) continue;
    if (choice.size() != n.size() && choice[n.size()] != ',') continue;
    if (!*cand || n.size() > best_len) {
      *cand = &c;
      best_len = n.size();
    }
  }
  if (!*cand) return false;
  std::string rest = choice.substr(best_len);
  *added = Knobs{};
  size_t at = 0;
  while (at < rest.size()) {
    if (rest[at] != ',') return false;
    size_t end = rest.find(',', at + 1);
    if (end == std::string::npos) end = rest.size();
    std::string item = rest.substr(at + 1, end - at - 1);
    size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0) return false;
    added->set(item.substr(0, eq), item.substr(eq + 1));
    at = end;
  }
  return true;
}

Knobs merged(const Knobs& base, const Knobs& added) {
  Knobs k = base;
  for (const auto& [n, v] : added.items) k.set(n, v);
  return k;
}

}  // namespace

TensorList random_inputs(const Executable& exe, uint64_t seed) {
  Generator gen(seed);
  TensorList in;
  for (const Executable::InputSpec& s : exe.inputs) {
    if (is_floating(s.dtype))
      in.push_back(Tensor::randn(s.sizes, gen, s.dtype));
    else
      in.push_back(Tensor::randint(s.sizes, gen, 0, 2, s.dtype));
  }
  return in;
}

double max_relative_error(const TensorList& a, const TensorList& b) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) {
    if (!is_floating(b[i].dtype())) continue;
    // Outputs of a device's candidates are compared on the host.
    Tensor x = a[i].to(Device::cpu()).to(DType::Float64).contiguous();
    Tensor y = b[i].to(Device::cpu()).to(DType::Float64).contiguous();
    const double* px = x.data<double>();
    const double* py = y.data<double>();
    for (int64_t k = 0; k < y.numel(); ++k) {
      bool nx = std::isnan(px[k]), ny = std::isnan(py[k]);
      if (nx != ny) return std::numeric_limits<double>::infinity();  // NaN on one side only
      if (nx) continue;
      if (std::isinf(px[k]) || std::isinf(py[k])) {
        if (px[k] != py[k]) return std::numeric_limits<double>::infinity();
        continue;
      }
      diff = std::max(diff, std::fabs(px[k] - py[k]));
      scale = std::max(scale, std::fabs(py[k]));
    }
  }
  return diff / std::max(scale, 1e-30);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::vector<double> time_interleaved(const std::vector<Executable*>& exes, const TensorList& in,
                                     int rounds, const std::function<void(int)>& on_round) {
  std::vector<TensorList> outs(exes.size());
  for (size_t j = 0; j < exes.size(); ++j)
    for (const Executable::OutputSpec& o : exes[j]->outputs) outs[j].push_back(Tensor::empty(o.sizes, o.dtype));
  std::vector<std::vector<double>> t(exes.size());
  for (int r = -1; r < rounds; ++r) {
    if (r >= 0 && on_round) on_round(r);
    for (size_t j = 0; j < exes.size(); ++j) {
      auto a = std::chrono::steady_clock::now();
      exes[j]->run(in.data(), in.size(), outs[j].data(), outs[j].size());
      if (r >= 0) t[j].push_back(seconds_since(a));
    }
  }
  std::vector<double> med;
  for (std::vector<double>& v : t) med.push_back(median(std::move(v)));
  return med;
}

Built autotune(const Graph& graph, const Target& target, const Options& options,
               const BuildFn& build) {
  auto t0 = std::chrono::steady_clock::now();
  std::string note;
  std::vector<Target::Candidate> cands = target.autotune_candidates(graph, options, &note);
  KILN_ASSERT(!cands.empty());
  // The precision is part of the key: a bfloat16 compile of a graph is another search than its
  // float32 one.
  std::string key = "inductor-autotune-v5\n" + target.tuning_context() + "\n" +
                    dtype_name(options.precision) + "\n" + print_graph(graph);
  // The accuracy gate: `autotune_tolerance` for float32; a low-precision compile's candidates
  // (other library kernels round differently at every layer) within 4 units of its precision.
  const double tolerance =
      options.precision == DType::BFloat16 ? std::max(options.autotune_tolerance, 4.0 / 256)
      : options.precision == DType::Float16 ? std::max(options.autotune_tolerance, 4.0 / 2048)
                                            : options.autotune_tolerance;

  std::string record;  // "NAME" or "NAME\nLAUNCH-RECORD"
  if (tuning_get(key, &record)) {
    size_t nl = record.find('\n');
    std::string choice = record.substr(0, nl);
    std::string launches = nl == std::string::npos ? "" : record.substr(nl + 1);
    const Target::Candidate* cand = nullptr;
    Knobs added;
    if (parse_choice(choice, cands, &cand, &added)) {
      Built b = build(merged(cand->knobs, added));
      b.report.autotune = "cached choice " + choice;
      b.report.autotune_choice = choice;
      if (!launches.empty()) target.apply_launch_record(b.tunable, launches, &b.report.autotune);
      b.report.compile_s = seconds_since(t0);
      return b;
    }
  }

  bool bar = options.progress && isatty(2);
  const int rounds = 15;
  int steps = int(cands.size()) + rounds, step = 0;
  std::vector<Built> built;
  std::vector<std::string> notes(cands.size());
  std::vector<bool> rejected(cands.size(), false);
  TensorList in;
  TensorList reference;  // outputs of the first (default, exact) candidate on `in`
  double default_call_s = 0;
  for (size_t i = 0; i < cands.size(); ++i) {
    progress(bar, step++, steps, "building " + name_of(cands[i].knobs));
    built.push_back(build(cands[i].knobs));
    Executable& exe = *built.back().exe;
    if (i == 0) in = random_inputs(exe, 1234);
    TensorList out = exe.run(in);
    // One timed call: a candidate far slower than the default (a layout for which the library
    // has only a reference kernel on this machine) is rejected before the timing rounds, so a
    // pathological choice costs one call, not 15 rounds.
    auto t_call = std::chrono::steady_clock::now();
    exe.run(in);
    double call_s = seconds_since(t_call);
    if (i == 0) {
      reference = out;
      default_call_s = call_s;
    }
    const double cutoff = options.autotune_slow_cutoff;
    if (i > 0 && cutoff > 0 && call_s > cutoff * default_call_s + 0.01) {
      // One call can be a stall (another process took the cores): confirm with a second call
      // before a candidate is cut for being slow.
      auto t_again = std::chrono::steady_clock::now();
      exe.run(in);
      call_s = std::min(call_s, seconds_since(t_again));
    }
    double err = cands[i].exact ? 0 : max_relative_error(out, reference);
    // Accuracy first: a candidate that computes something else is rejected as such whatever its
    // speed (the reason must not depend on how loaded the machine was during one call).
    if (!(err <= tolerance)) {
      rejected[i] = true;
      notes[i] = fmt::format(" rejected (relative error {:.1e} > {:.0e})", err, tolerance);
    } else if (i > 0 && cutoff > 0 && call_s > cutoff * default_call_s + 0.01) {
      rejected[i] = true;
      notes[i] = fmt::format(" rejected (one call {:.1f} ms, over {:g}x the default's {:.3f} ms)",
                             call_s * 1e3, cutoff, default_call_s * 1e3);
    } else if (!cands[i].exact) {
      notes[i] = fmt::format(" (relative error {:.1e})", err);
    }
  }
  // The candidates that were not rejected, timed together (a lone candidate is not timed).
  std::vector<double> times(cands.size(), std::numeric_limits<double>::infinity());
  if (cands.size() > 1) {
    std::vector<Executable*> timed;
    std::vector<size_t> which;
    for (size_t i = 0; i < cands.size(); ++i)
      if (!rejected[i]) {
        timed.push_back(built[i].exe.get());
        which.push_back(i);
      }
    std::vector<double> med = time_interleaved(timed, in, rounds, [&](int r) {
      progress(bar, step++, steps, fmt::format("timing round {}/{}", r + 1, rounds));
    });
    for (size_t j = 0; j < which.size(); ++j) times[which[j]] = med[j];
  }
  std::string log;
  for (size_t i = 0; i < cands.size(); ++i)
    log += fmt::format("{}{}{}{}", log.empty() ? "" : ", ", name_of(cands[i].knobs),
                       rejected[i]          ? ""
                       : cands.size() == 1 ? " the only candidate"
                                           : fmt::format(" {:.3f} ms", times[i] * 1e3),
                       notes[i]);
  progress(bar, int(cands.size()), int(cands.size()), "done");
  size_t best = cands.size() == 1 ? 0 : size_t(std::min_element(times.begin(), times.end()) - times.begin());
  Built b = std::move(built[best]);
  std::string name = name_of(cands[best].knobs);
  built.clear();  // the other candidates' arenas and library kernels

  std::string vec_log;
  Target::Variants vs = target.autotune_variants(b.report);
  {
    std::vector<Built> vb;
    std::vector<std::string> vnames = {vs.current_label};
    std::vector<Executable*> exes = {b.exe.get()};
    for (const Target::Candidate& v : vs.variants) {
      Built bv = build(merged(cands[best].knobs, v.knobs));
      double err = max_relative_error(bv.exe->run(in), reference);
      if (!(err <= tolerance)) {
        vec_log += fmt::format("{}{} rejected (relative error {:.1e})",
                               vec_log.empty() ? "; variants: " : ", ", v.knobs.str(), err);
        continue;
      }
      vnames.push_back(v.knobs.str());
      vb.push_back(std::move(bv));
      exes.push_back(vb.back().exe.get());
    }
    if (exes.size() > 1) {
      std::vector<double> med = time_interleaved(exes, in, rounds);
      for (size_t j = 0; j < exes.size(); ++j)
        vec_log += fmt::format("{}{} {:.3f} ms", vec_log.empty() ? "; variants: " : ", ", vnames[j],
                               med[j] * 1e3);
      size_t pick = 0;
      for (size_t j = 1; j < exes.size(); ++j)
        if (med[j] < 0.97 * med[0] && med[j] < med[pick]) pick = j;
      if (pick > 0) {
        b = std::move(vb[pick - 1]);
        name += "," + vnames[pick];
      }
    }
  }
  std::string launch_log;
  std::string launches = target.tune_launches(*b.exe, b.tunable, in, rounds, &launch_log);
  tuning_put(key, launches.empty() ? name : name + "\n" + launches);
  b.report.autotune = fmt::format("chose {} ({}){}{}{}", name, log, note, vec_log, launch_log);
  b.report.autotune_choice = name;
  b.report.compile_s = seconds_since(t0);
  return b;
}

}  // namespace kiln::compiler
