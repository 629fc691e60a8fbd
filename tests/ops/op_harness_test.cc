// The generated op harness: every op in the registry that has samples, in every dtype it
// declares, against its reference kernel computed in float64. A new op is covered by being
// registered; nothing here names an op except the symbolic-inference allow-list.
//
// Note [Op harness]
// Cases are (op x dtype x device), named like `add_float16` (CPU) or `add_float16_cuda`: every
// device the process sees (harness_devices: the CPU, and CUDA device 0 when there is one) with
// every (op, dtype) it has an eager kernel for (the CPU: all; CUDA: OpDef::eager_cuda_dtypes,
// and every dtype of an op compiled alone by the CUDA target, less the known gaps),
// and, for the compiled harness, every device a compiler target is registered for. A device
// gets its tests by registering kernels and a target; nothing here names a device's ops. Inputs
// are made on the host and moved to the device keeping their layout; results come back to the
// host for the comparison. For every sample of the op:
//   Values   - floating sample inputs are cast to the tested dtype (integer and bool inputs,
//              i.e. indices and masks, are passed unchanged; see Note [Integer cases] in
//              harness_util.cc for integer/bool test dtypes). The expected result ("oracle")
//              is the reference kernel run on the float64 versions of those already-rounded
//              inputs, so the only error measured is the op's own; for integer/bool dtypes it
//              is the reference on the same inputs, compared exactly. The actual result is
//              eager dispatch (call_op) in the tested dtype, which takes eager_cpu fast paths.
//              A decomposition, when the op has one, is run in the tested dtype and compared
//              with the same oracle. The reference and eager kernels must not write to their
//              inputs.
//   Types    - the eager outputs' dtype, shape and device equal the inferred types; then input
//              0's dim 0 becomes a symbol and inference must either give shapes that evaluate
//              to the concrete ones or throw a kiln::Error (only for ops in kSymbolicAllowList).
//   Layouts  - every input is made non-contiguous (same values): the reference result must be
//              bitwise identical to the contiguous run, the eager result within tolerance of
//              the oracle.
//   Paths    - every result names the path that produced it (Note [Kernel paths]): eager:f32,
//              eager:onednn, eager:reference, ...; compiled:loop(pointwise, SIMD),
//              compiled:oneDNN, compiled:eager:<eager path>, compiled:no launch. Each case
//              prints its paths ("[ paths ] ..."). Where the path is the reference kernel
//              itself, and for every float64 case, the oracle would be the very computation
//              under test: the result is compared with the independent long-double evaluation
//              (Note [Independent oracle] in independent.h) instead, and the float64 reference
//              is checked against it too. Ops it does not cover whose only eager path is the
//              reference are listed by OpHarnessSelf.ReferenceOnlyOps (and docs/ops.md).
// Comparisons go through tests/support/compare.h (Note [Honest comparisons]): |actual -
// expected| <= atol + rtol*|expected|, both scaled by the op's tolerance_scale, with the
// per-dtype defaults f64 1e-10, f32 1e-5, f16 1e-2, bf16 2e-2 (rtol = atol; a case takes the
// looser of its dtype's and its output dtype's); integer and bool outputs exact. NaN must appear
// exactly where the oracle has NaN, +-inf exactly where it has the same infinity (or where the
// oracle value overflows the output dtype). The samples hold NaN, +-inf, -0 and denormals for
// every pointwise op and reduction (docs/ops.md, "Special values").
// Samples come from a generator seeded by the op name (reproducible); KILN_HARNESS_SEED=<n>
// mixes in another seed for fresh inputs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <optional>
#include <ostream>

#include <fmt/format.h>

#include "compiler/compile.h"
#include "compiler/target.h"
#include "core/cuda_runtime.h"
#include "ops/dispatch.h"
#include "harness_util.h"
#include "independent.h"
#include "ir/graph.h"
#include "ops/kernel_path.h"
#include "ops/op.h"

namespace kiln {
namespace {

using harness::compare_bitwise;
using harness::compare_tolerance;
using harness::compare_values;

// ---- symbolic inference exceptions ------------------------------------------------------------
// Ops whose inference may throw (it must never return a wrong shape) when input 0's dim 0 is a
// symbol, for some of their samples. Each entry says why that cannot be inferred symbolically.
struct SymbolicException {
  const char* op;
  const char* reason;
};
const SymbolicException kSymbolicAllowList[] = {
    {"reshape", "the target shape is a concrete attribute; a symbolic input numel cannot be "
                "proven equal to it"},
    {"expand", "the target shape attribute names concrete sizes that a symbolic dim cannot be "
               "proven to match"},
    {"split", "the sizes attribute must sum to the split dim; not provable when it is dim 0"},
    {"matmul", "a 1-D first operand's only dim is the contraction dim; a symbolic K cannot be "
               "proven equal to the other operand's concrete rows"},
    {"linear", "a 1-D x's only dim is in_features; a symbolic size cannot be proven equal to "
               "the weight's"},
};

const SymbolicException* symbolic_exception(std::string_view op) {
  for (const auto& e : kSymbolicAllowList)
    if (op == e.op) return &e;
  return nullptr;
}

// ---- cases ------------------------------------------------------------------------------------
struct OpCase {
  const OpDef* op;
  DType dtype;
  Device device = Device::cpu();
};

void PrintTo(const OpCase& c, std::ostream* os) {
  *os << c.op->name << " " << dtype_name(c.dtype) << " on " << c.device.str();
}

// The devices this process can run ops on.
std::vector<Device> harness_devices() {
  std::vector<Device> d = {Device::cpu()};
  if (cuda_device_count() > 0) d.push_back(Device::cuda(0));
  return d;
}

const std::map<DeviceType, std::set<std::string>>& known_gaps();

// Whether `device` has an eager kernel for (op, dtype): on CUDA a hand-written kernel that lists
// the dtype, or the op compiled alone by the CUDA target (Note [Compiled eager kernels on
// CUDA]), which has the compiled harness's known gaps.
bool eager_supported(const OpDef& op, DType dtype, Device device) {
  if (device.is_cpu()) return true;
  if (op.eager_cuda)
    for (DType d : op.eager_cuda_dtypes)
      if (d == dtype) return true;
  if (!op.eager_cuda_compiled) return false;
  const std::set<std::string>& gaps = known_gaps().at(device.type);
  return !gaps.count(fmt::format("{} {}", op.name, dtype_name(dtype)));
}

std::vector<OpCase> all_cases() {
  std::vector<OpCase> cases;
  for (Device dev : harness_devices())
    for (const OpDef& op : all_ops()) {
      if (!op.samples) continue;  // registry_test reports ops without samples
      for (DType d : op.dtypes)
        if (eager_supported(op, d, dev)) cases.push_back({&op, d, dev});
    }
  return cases;
}

// "" for the CPU (the names cases had before devices), "_cuda" for CUDA device 0.
std::string device_suffix(Device d) {
  if (d.is_cpu()) return "";
  return d.index == 0 ? "_cuda" : fmt::format("_cuda{}", d.index);
}

std::string case_name(const testing::TestParamInfo<OpCase>& info) {
  return std::string(info.param.op->name) + "_" + dtype_name(info.param.dtype) +
         device_suffix(info.param.device);
}

// `t` on `device` with the same sizes, strides and offset (a view stays a view): the storage
// span it addresses is copied and the view rebuilt over the copy.
Tensor to_device_keep_layout(const Tensor& t, Device device) {
  if (!t.defined() || t.device() == device) return t;
  if (t.numel() == 0 || (t.is_contiguous() && t.offset() == 0)) return t.to(device);
  int64_t last = t.offset();
  for (int i = 0; i < t.dim(); ++i) last += (t.size(i) - 1) * t.stride(i);
  char* base = static_cast<char*>(t.raw_data()) - t.offset() * t.element_size();
  Tensor span = Tensor::from_blob(base, Dims{last + 1}, t.dtype(), t.device());
  return span.to(device).as_strided(t.sizes(), t.strides(), t.offset());
}

uint64_t case_seed(const OpDef& op) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a of the op name
  for (const char* p = op.name; *p; ++p) h = (h ^ uint8_t(*p)) * 1099511628211ull;
  if (const char* env = std::getenv("KILN_HARNESS_SEED"))
    h ^= std::strtoull(env, nullptr, 10) * 0x9e3779b97f4a7c15ull;
  return h;
}

std::vector<OpSample> samples_of(const OpDef& op) {
  Generator g(case_seed(op));
  return op.samples(g);
}

constexpr std::string_view kWhere = "op harness";

// ---- running one sample -----------------------------------------------------------------------
struct SampleRun {
  const OpDef& op;
  DType dtype;
  const OpSample& sample;
  size_t index;
  Device device = Device::cpu();

  std::string label() const {
    return fmt::format("op '{}' dtype {}{} sample {} \"{}\"", op.name, dtype_name(dtype),
                       device.is_cpu() ? "" : " on " + device.str(), index, sample.note);
  }
  Attrs canonical() const { return op.canonicalize(sample.attrs, kWhere); }

  // Sample inputs in the tested dtype (floating ones cast, indices and masks unchanged).
  TensorList inputs() const {
    TensorList out;
    for (const Tensor& t : sample.inputs) out.push_back(harness::to_test_dtype(t, dtype));
    return out;
  }

  // The oracle runs the reference on float64 copies of the dtype-rounded floating inputs. An
  // op that does not accept float64 gets its reference run in the tested dtype instead (the
  // reference computes in float64 internally either way).
  bool oracle_in_f64() const {
    return is_floating(dtype) && dtype != DType::Float64 && op.supports_dtype(DType::Float64);
  }
  TensorList oracle_inputs(const TensorList& inputs) const {
    if (!oracle_in_f64()) return inputs;
    TensorList out;
    for (size_t i = 0; i < inputs.size(); ++i) {
      bool cast = sample.inputs[i].defined() && is_floating(sample.inputs[i].dtype());
      out.push_back(cast ? harness::convert_keep_layout(inputs[i], DType::Float64) : inputs[i]);
    }
    return out;
  }

  TensorList reference(const TensorList& inputs) const {
    Attrs attrs = canonical();
    std::vector<TensorType> types = infer_types(op, inputs, attrs, kWhere);
    if (op.reference) return run_kernel(op, op.reference, inputs, attrs, types);
    return op.decompose(inputs, attrs);  // decomposition-only op: its oracle is the composite
  }

  // The oracle, checking on the way that the reference leaves its inputs alone.
  TensorList oracle(const TensorList& inputs) const {
    TensorList in = oracle_inputs(inputs);
    TensorList before = harness::snapshot(in);
    TensorList out = reference(in);
    expect_unchanged(in, before, "the reference kernel");
    return out;
  }

  // The independent evaluation (Note [Independent oracle]) on the oracle's inputs; nothing
  // where it does not cover the op (or an integer result leaves int64).
  std::optional<TensorList> independent(const TensorList& inputs) const {
    TensorList in = oracle_inputs(inputs);
    Attrs attrs = canonical();
    std::vector<TensorType> types = infer_types(op, in, attrs, kWhere);
    return harness::independent(op, in, attrs, types);
  }

  // Whether comparing `path`'s result with the oracle would compare the reference kernel
  // with itself: the reference ran, eagerly or as a compiled graph's eager launch (or, for an
  // op without one, the decomposition that is its oracle).
  bool compares_with_itself(const std::string& path) const {
    auto is = [&](const char* p) { return path == std::string("eager:") + p ||
                                          path == std::string("compiled:eager:") + p; };
    return is("reference") || (!op.reference && is("decomposition"));
  }
  // Where the independent evaluation is preferred to the oracle: the paths above, and every
  // float64 case (its oracle is the reference on the very inputs under test, and long double
  // is the more accurate of the two).
  bool prefers_independent(const std::string& path) const {
    return dtype == DType::Float64 || compares_with_itself(path);
  }

  // Eager dispatch on the case's device; the results come back to the host. `path` (when
  // given) receives the kernel path that ran (Note [Kernel paths]): "eager:<path>".
  TensorList eager(const TensorList& inputs, std::string* path = nullptr) const {
    if (device.is_cpu()) {
      TensorList out = call_op(op.id, inputs, sample.attrs);
      if (path) *path = std::string("eager:") + last_kernel_path();
      return out;
    }
    TensorList on_device;
    for (const Tensor& t : inputs) on_device.push_back(to_device_keep_layout(t, device));
    TensorList out = call_op(op.id, on_device, sample.attrs);
    if (path) *path = std::string("eager:") + last_kernel_path();
    for (Tensor& t : out) {
      if (t.device() != device)
        ADD_FAILURE() << label() << ": an output is on " << t.device().str();
      t = t.to(Device::cpu());
    }
    return out;
  }

  void expect_unchanged(const TensorList& now, const TensorList& before, const char* who) const {
    for (size_t i = 0; i < now.size(); ++i) {
      std::string diff = compare_bitwise(before[i], now[i]);
      if (!diff.empty())
        ADD_FAILURE() << label() << ": " << who << " modified input " << i << ": " << diff;
    }
  }

  // Compares every output with the oracle; `what` names the path under test.
  void expect_close(const TensorList& expected, const TensorList& actual, const std::string& what,
                    const char* against = nullptr) const {
    if (expected.size() != actual.size()) {
      ADD_FAILURE() << label() << ": " << what << " returned " << actual.size()
                    << " outputs, the reference " << expected.size();
      return;
    }
    for (size_t i = 0; i < expected.size(); ++i) {
      harness::Tolerance tol =
          compare_tolerance(dtype, actual[i].dtype(), op.tolerance_scale);
      std::string diff = compare_values(expected[i], actual[i], tol);
      if (!diff.empty())
        ADD_FAILURE() << label() << ": " << what << " output " << i << " vs "
                      << (against ? against : oracle_in_f64() ? "float64 oracle" : "reference")
                      << ": " << diff;
    }
  }
};

// What a case checked, per path (Note [Op harness]: "Paths").
struct PathLog {
  std::map<std::string, int> samples;  // "eager:f32" -> samples that ran it
  int independent = 0;                 // results checked against the independent evaluation
  int self_only = 0;                   // results only comparable with the reference itself

  // "[ paths ] add float32: eager:f32 x13, eager:reference x2; ..." (one line per case).
  void print(const OpCase& c) const {
    std::string s;
    for (const auto& [path, n] : samples) s += fmt::format("{}{} x{}", s.empty() ? "" : ", ", path, n);
    std::string line = fmt::format(
        "[ paths ] {} {}{}: {}; {} results checked against the independent evaluation", c.op->name,
        dtype_name(c.dtype), c.device.is_cpu() ? "" : " on " + c.device.str(), s, independent);
    if (self_only)
      line += fmt::format(", {} only against the reference itself (no independent evaluation "
                          "of this op)", self_only);
    std::printf("%s\n", line.c_str());
  }
};

// Checks the result of `path` (see SampleRun::compares_with_itself): against the independent
// evaluation where comparing with the oracle would compare the reference with itself, else
// against the oracle.
void check_path(const SampleRun& run, const std::string& path, const TensorList& oracle,
                const std::optional<TensorList>& indep, const TensorList& actual,
                const std::string& what, PathLog& log) {
  ++log.samples[path];
  if (run.prefers_independent(path) && indep) {
    ++log.independent;
    run.expect_close(*indep, actual, what + " [" + path + "]", "independent long-double evaluation");
    return;
  }
  if (run.compares_with_itself(path)) ++log.self_only;
  run.expect_close(oracle, actual, what + " [" + path + "]");
}

// The float64 oracle itself against the independent evaluation, at float64's tolerance.
void check_oracle(const SampleRun& run, const TensorList& oracle,
                  const std::optional<TensorList>& indep) {
  if (!indep) return;
  if (indep->size() != oracle.size()) {
    ADD_FAILURE() << run.label() << ": the independent evaluation gave " << indep->size()
                  << " outputs, the reference " << oracle.size();
    return;
  }
  for (size_t i = 0; i < oracle.size(); ++i) {
    DType od = oracle[i].dtype();
    harness::Tolerance tol = is_floating(od)
                                 ? harness::compare_tolerance(DType::Float64, DType::Float64,
                                                              run.op.tolerance_scale)
                                 : harness::Tolerance::exact();
    std::string diff = compare_values((*indep)[i], oracle[i], tol);
    if (!diff.empty())
      ADD_FAILURE() << run.label() << ": the reference kernel (" << (run.oracle_in_f64() ? "float64" : dtype_name(run.dtype))
                    << ") output " << i << " vs the independent long-double evaluation: " << diff;
  }
}

// Runs `f` for every sample of the case, turning exceptions into failures that name the stage.
template <typename F>
void for_each_sample(const OpCase& c, F&& f) {
  std::vector<OpSample> samples = samples_of(*c.op);
  ASSERT_FALSE(samples.empty()) << c.op->name << ": samples() returned no samples";
  for (size_t i = 0; i < samples.size(); ++i) {
    SampleRun run{*c.op, c.dtype, samples[i], i, c.device};
    std::string stage = "start";
    try {
      f(run, stage);
    } catch (const std::exception& e) {
      ADD_FAILURE() << run.label() << ": " << stage << " threw: " << e.what();
    }
  }
}

class OpHarness : public testing::TestWithParam<OpCase> {};

// ---- values -------------------------------------------------------------------------------------
TEST_P(OpHarness, Values) {
  PathLog log;
  for_each_sample(GetParam(), [&](const SampleRun& run, std::string& stage) {
    TensorList inputs = run.inputs();
    TensorList before = harness::snapshot(inputs);
    stage = "the reference (oracle)";
    TensorList expected = run.oracle(inputs);
    stage = "the independent evaluation";
    std::optional<TensorList> indep = run.independent(inputs);
    check_oracle(run, expected, indep);
    stage = "eager dispatch";
    std::string path;
    TensorList actual = run.eager(inputs, &path);
    run.expect_unchanged(inputs, before, "eager dispatch");
    check_path(run, path, expected, indep, actual, "eager", log);
    if (run.op.decompose) {
      stage = "the decomposition";
      TensorList dec = run.op.decompose(inputs, run.canonical());
      run.expect_unchanged(inputs, before, "the decomposition");
      // The decomposition is a second formulation, independent of the reference kernel; for
      // an op without one it is the oracle itself, so it is checked against the independent
      // evaluation instead.
      check_path(run, run.op.reference ? "decomposition" : "eager:decomposition", expected,
                 indep, dec, "decomposition", log);
    }
  });
  log.print(GetParam());
}

// ---- types: concrete and symbolic inference -----------------------------------------------------
struct SymbolicOutcome {
  bool ok = false;          // some variant inferred the right shapes
  bool wrong = false;       // some variant returned a wrong shape (already reported)
  std::string last_error;   // a kiln::Error from the last variant that threw
};

// Input types with strides dropped: shapes are what inference decides, and concrete strides
// of a view would contradict a symbolic size.
std::vector<std::optional<TensorType>> plain_types(const TensorList& inputs) {
  std::vector<std::optional<TensorType>> out;
  for (const Tensor& t : inputs) {
    if (!t.defined()) {
      out.emplace_back();
      continue;
    }
    TensorType ty = t.type();
    ty.strides = Shape();
    out.emplace_back(ty);
  }
  return out;
}

std::vector<TensorType> infer_from(const OpDef& op, const Attrs& attrs,
                                   const std::vector<std::optional<TensorType>>& types) {
  std::vector<const TensorType*> ptrs;
  for (const auto& t : types) ptrs.push_back(t ? &*t : nullptr);
  InferContext ctx{op, kWhere, std::span<const TensorType* const>(ptrs.data(), ptrs.size()),
                   attrs};
  return op.infer(ctx);
}

// Note [Symbolic inference check]
// Dim 0 of input 0 becomes the symbol `hs0` (sizes 0 and 1 are skipped: like PyTorch, size-1
// dims are specialized because they broadcast). Two variants are tried: first with the same
// symbol also at dim 0 of every other input of the same rank and the same dim-0 size (a batch
// dim shared by the operands, as in a real graph), then input 0 alone. A variant may throw a
// kiln::Error (never an internal one). A variant that returns claims its shapes for every value
// of hs0, so they are evaluated twice: at the real size n, against the concrete inference, and
// at n + 1, against the concrete inference of the variant with hs0 = n + 1 -- which must accept
// it (otherwise the symbolic inference returned a shape it could not prove, e.g. a reshape to a
// concrete target: it must throw instead). If every variant throws, the op must be in
// kSymbolicAllowList.
using OptTypes = std::vector<std::optional<TensorType>>;

OptTypes bind_symbol(const OptTypes& types, SymInt sym, int64_t value) {
  OptTypes out = types;
  for (auto& t : out)
    if (t && t->rank() > 0 && t->shape[0] == sym) t->shape[0] = value;
  return out;
}

std::string types_str(const OptTypes& types) {
  std::string s;
  for (const auto& t : types) s += (s.empty() ? "" : ", ") + (t ? t->str() : "none");
  return s;
}

// "" when `symbolic` evaluated at hs0 = value equals `concrete`.
std::string symbolic_mismatch(const std::vector<TensorType>& symbolic,
                              const std::vector<TensorType>& concrete, int64_t value) {
  if (symbolic.size() != concrete.size())
    return fmt::format("{} outputs, concrete inference {}", symbolic.size(), concrete.size());
  const std::vector<std::pair<std::string, int64_t>> binding = {{"hs0", value}};
  for (size_t i = 0; i < symbolic.size(); ++i) {
    Dims evaluated;
    bool evaluates = symbolic[i].rank() == concrete[i].rank();
    for (size_t d = 0; evaluates && d < symbolic[i].shape.size(); ++d) {
      try {
        evaluated.push_back(symbolic[i].shape[d].evaluate(binding));
      } catch (const Error&) {
        evaluates = false;
      }
    }
    if (!evaluates || symbolic[i].dtype != concrete[i].dtype ||
        to_shape(evaluated) != concrete[i].shape)
      return fmt::format("output {} {}, which is not {} at hs0 = {}", i, symbolic[i].str(),
                         concrete[i].str(), value);
  }
  return "";
}

SymbolicOutcome check_symbolic(const SampleRun& run, const TensorList& inputs,
                               const Attrs& attrs) {
  SymbolicOutcome outcome;
  const OptTypes types = plain_types(inputs);
  const int64_t size = inputs[0].size(0);
  const std::vector<TensorType> concrete = infer_from(run.op, attrs, types);
  const SymInt sym = SymInt::symbol("hs0");

  std::vector<OptTypes> variants;
  OptTypes solo = types;
  solo[0]->shape[0] = sym;
  OptTypes shared = solo;
  bool any_shared = false;
  for (size_t i = 1; i < shared.size(); ++i) {
    if (shared[i] && shared[i]->rank() == types[0]->rank() && shared[i]->shape[0] == size) {
      shared[i]->shape[0] = sym;
      any_shared = true;
    }
  }
  if (any_shared) variants.push_back(shared);
  variants.push_back(solo);

  for (const OptTypes& v : variants) {
    std::vector<TensorType> out;
    try {
      out = infer_from(run.op, attrs, v);
    } catch (const Error& e) {
      if (e.kind() == ErrorKind::Internal)
        ADD_FAILURE() << run.label() << ": symbolic inference hit an internal error: "
                      << e.what();
      outcome.last_error = e.what();
      continue;
    }
    std::string bad = symbolic_mismatch(out, concrete, size);
    if (bad.empty()) {
      std::vector<TensorType> other;
      try {
        other = infer_from(run.op, attrs, bind_symbol(v, sym, size + 1));
      } catch (const Error& e) {
        bad = fmt::format("outputs {} although hs0 = {} is rejected concretely ({}); inference "
                          "must throw when it cannot prove a shape",
                          out.empty() ? std::string("no outputs") : out[0].str(), size + 1, e.what());
      }
      if (bad.empty()) bad = symbolic_mismatch(out, other, size + 1);
    }
    if (!bad.empty()) {
      ADD_FAILURE() << run.label() << ": symbolic inference on (" << types_str(v)
                    << ") is wrong: " << bad;
      outcome.wrong = true;
      continue;
    }
    outcome.ok = true;
  }
  return outcome;
}

TEST_P(OpHarness, Types) {
  int symbolic_checked = 0, symbolic_thrown = 0;
  std::string thrown_example;
  for_each_sample(GetParam(), [&](const SampleRun& run, std::string& stage) {
    TensorList inputs = run.inputs();
    Attrs attrs = run.canonical();
    stage = "inference";
    std::vector<TensorType> inferred = infer_types(run.op, inputs, attrs, kWhere);
    stage = "eager dispatch";
    TensorList actual = run.eager(inputs);
    if (actual.size() != inferred.size()) {
      ADD_FAILURE() << run.label() << ": eager returned " << actual.size()
                    << " outputs, inference says " << inferred.size();
      return;
    }
    for (size_t i = 0; i < actual.size(); ++i) {
      const Tensor& t = actual[i];
      if (t.dtype() != inferred[i].dtype || to_shape(t.sizes()) != inferred[i].shape ||
          t.device() != inferred[i].device)
        ADD_FAILURE() << run.label() << ": eager output " << i << " is " << t.type().str()
                      << ", inference says " << inferred[i].str();
    }
    if (inputs.empty() || !inputs[0].defined() || inputs[0].dim() == 0 || inputs[0].size(0) <= 1)
      return;
    stage = "symbolic inference";
    ++symbolic_checked;
    SymbolicOutcome o = check_symbolic(run, inputs, attrs);
    if (o.ok || o.wrong) return;
    ++symbolic_thrown;
    if (thrown_example.empty()) thrown_example = run.label() + ": " + o.last_error;
    if (!symbolic_exception(run.op.name))
      ADD_FAILURE() << run.label() << ": inference fails when dim 0 of input 0 is symbolic ("
                    << o.last_error << "); fix the inference or add the op to "
                    << "kSymbolicAllowList with the reason";
  });
  if (symbolic_thrown > 0) {
    if (const SymbolicException* e = symbolic_exception(GetParam().op->name))
      std::printf("[ symbolic ] %s: %d of %d samples cannot infer symbolically (allowed: %s); "
                  "e.g. %s\n",
                  GetParam().op->name, symbolic_thrown, symbolic_checked, e->reason,
                  thrown_example.c_str());
  }
}

// ---- layouts: non-contiguous inputs -------------------------------------------------------------
TEST_P(OpHarness, Layouts) {
  PathLog log;
  for_each_sample(GetParam(), [&](const SampleRun& run, std::string& stage) {
    TensorList inputs = run.inputs();
    TensorList strided;
    for (const Tensor& t : inputs) strided.push_back(harness::make_noncontiguous(t));
    TensorList strided_before = harness::snapshot(strided);
    stage = "the reference (oracle)";
    TensorList expected = run.oracle(inputs);
    stage = "the reference on contiguous inputs";
    TensorList ref = run.reference(inputs);
    run.expect_close(expected, ref, "reference in the tested dtype");
    stage = "the reference on non-contiguous inputs";
    TensorList ref_strided = run.reference(strided);
    run.expect_unchanged(strided, strided_before, "the reference kernel (non-contiguous)");
    if (ref.size() != ref_strided.size()) {
      ADD_FAILURE() << run.label() << ": reference gave " << ref.size() << " outputs, "
                    << ref_strided.size() << " for non-contiguous inputs";
      return;
    }
    for (size_t i = 0; i < ref.size(); ++i) {
      std::string diff = compare_bitwise(ref[i], ref_strided[i]);
      if (!diff.empty())
        ADD_FAILURE() << run.label() << ": reference output " << i
                      << " changes when inputs are non-contiguous " << harness::types_str(strided)
                      << ": " << diff;
    }
    stage = "eager dispatch on non-contiguous inputs";
    std::string path;
    TensorList eager_strided = run.eager(strided, &path);
    run.expect_unchanged(strided, strided_before, "eager dispatch (non-contiguous)");
    stage = "the independent evaluation";
    std::optional<TensorList> indep =
        run.prefers_independent(path) ? run.independent(inputs) : std::nullopt;
    check_path(run, path, expected, indep, eager_strided, "eager (non-contiguous inputs)", log);
  });
  log.print(GetParam());
}

INSTANTIATE_TEST_SUITE_P(Registry, OpHarness, testing::ValuesIn(all_cases()), case_name);

// ---- the CPU compiler ---------------------------------------------------------------------------
// Note [Compiled op harness]
// Every op, every dtype it lists, every sample, on every device with a compiler target: one
// graph per op holds a node per (dtype, sample) with its inputs as graph inputs, compiled once
// by the compiler for that device's target (CPU: loop code where the op has it, oneDNN or the
// op's eager kernel otherwise) and compared with the float64 oracle at the dtype's tolerance.
// One graph per op keeps it to one toolchain run per op and device.
struct CompiledCase {
  const OpDef* op;
  Device device;
};
void PrintTo(const CompiledCase& c, std::ostream* os) { *os << c.op->name << " on " << c.device.str(); }

class CompiledOpHarness : public testing::TestWithParam<CompiledCase> {};

// The path a compiled graph took for the node named `label`, from the report's kernel lines
// (compiler/bind.cc): "compiled:loop(pointwise, SIMD)" for generated loop code,
// "compiled:oneDNN" (the target's library), "compiled:eager" for an eager launch, joined
// with "+" when the node became several kernels (a decomposition), "compiled:no launch" when
// the passes removed it (a view, an identity).
std::string compiled_path(const compiler::CompileReport& r, const std::string& label) {
  std::set<std::string> kinds;
  for (const std::string& line : r.kernels) {
    size_t at = line.find(label);
    if (at == std::string::npos) continue;
    // Library and eager lines are "op:<node> [kind]..."; loop lines "kname [kind]: nodes".
    size_t open = line.compare(at + label.size(), 2, " [") == 0 ? at + label.size() + 1
                                                                : line.find('[');
    size_t close = line.find(']', open);
    if (open == std::string::npos || close == std::string::npos) continue;
    std::string kind = line.substr(open + 1, close - open - 1);
    if (kind == "eager kernel") kinds.insert("eager");
    else if (kind == r.library) kinds.insert(kind);
    else kinds.insert("loop(" + kind + ")");
  }
  if (kinds.empty()) return "compiled:no launch";
  std::string s = "compiled:";
  for (const std::string& k : kinds) s += (s.back() == ':' ? "" : "+") + k;
  return s;
}

// Known gaps of a target: "op dtype" pairs with at least one sample that the target cannot
// compile (a NotSupported error naming the node). The list is a ratchet: a new gap fails the
// harness, and so does a listed gap that now compiles (remove it from the list). The CPU has
// none. CUDA's are the ops docs/cuda.md lists under "Not yet on CUDA" (measured on the H200).
const std::map<DeviceType, std::set<std::string>>& known_gaps() {
  static const std::map<DeviceType, std::set<std::string>> gaps = {
      {DeviceType::CPU, {}},
      // Integer div / pow report bad values through the status record (Note [Device status]).
      {DeviceType::CUDA, {}},
  };
  return gaps;
}

TEST_P(CompiledOpHarness, MatchesReference) {
  const OpDef& op = *GetParam().op;
  const Device device = GetParam().device;
  std::map<DType, PathLog> logs;  // per dtype, printed at the end
  const std::vector<OpSample> samples = samples_of(op);  // SampleRun refers to its elements
  struct Entry {
    std::unique_ptr<SampleRun> run;
    TensorList inputs;
    std::vector<size_t> outputs;  // indices into the graph's outputs
  };
  // One graph of the given (dtype, sample) pairs, compiled, run and compared with the oracle.
  // Returns the compile error ("" when it compiled), with its kind.
  auto compile_and_check = [&](const std::vector<std::pair<DType, size_t>>& picks,
                               const std::string& name, ErrorKind* kind) -> std::string {
    Graph g;
    g.name = name;
    std::vector<Entry> entries;
    TensorList graph_inputs;
    for (auto [d, i] : picks) {
      Entry e;
      e.run = std::make_unique<SampleRun>(SampleRun{op, d, samples[i], i, device});
      e.inputs = e.run->inputs();
      std::vector<ValueId> ids;
      for (size_t k = 0; k < e.inputs.size(); ++k) {
        if (!e.inputs[k].defined()) {
          ids.push_back(kNoValue);
          continue;
        }
        Tensor c = e.inputs[k].contiguous().to(device);
        ids.push_back(g.add_input("", c.type()));
        graph_inputs.push_back(c);
      }
      std::vector<ValueId> outs = g.add_node(op.id, ids, e.run->sample.attrs, e.run->label());
      for (ValueId o : outs) {
        e.outputs.push_back(g.outputs.size());
        g.outputs.push_back(o);
      }
      entries.push_back(std::move(e));
    }
    std::unique_ptr<compiler::CompiledExecutable> compiled;
    try {
      compiled = compiler::compile(g, device, compiler::Options{});
    } catch (const Error& e) {
      *kind = e.kind();
      return e.what();
    }
    TensorList actual = compiled->run(graph_inputs);
    for (Tensor& t : actual) t = t.to(Device::cpu());
    // The report says what ran how (printed for the record, checked for sanity).
    const compiler::CompileReport& r = compiled->report();
    for (Entry& e : entries) {
      TensorList expected = e.run->oracle(e.inputs);
      TensorList got;
      for (size_t o : e.outputs) got.push_back(actual[o]);
      std::string path = compiled_path(r, e.run->label());
      if (path == "compiled:eager") {
        // Which kernel the eager launch is: the one eager dispatch picks for these inputs.
        std::string eager_path;
        e.run->eager(e.inputs, &eager_path);
        path = "compiled:" + eager_path;
      }
      std::optional<TensorList> indep =
          e.run->prefers_independent(path) ? e.run->independent(e.inputs) : std::nullopt;
      check_path(*e.run, path, expected, indep, got, "compiled", logs[e.run->dtype]);
    }
    // (a graph the passes emptied, an identity pad, launches nothing)
    EXPECT_EQ(r.nodes == 0 || r.loop_kernels + r.library_launches + r.eager_launches > 0, true)
        << r.str();
    std::printf("%s (%zu samples): %s\n", name.c_str(), picks.size(), r.str().c_str());
    return "";
  };

  const size_t n_samples = samples.size();
  std::vector<std::pair<DType, size_t>> all;
  for (DType d : op.dtypes)
    for (size_t i = 0; i < n_samples; ++i) all.push_back({d, i});
  std::set<std::string> gaps;
  ErrorKind kind = ErrorKind::Internal;
  std::string err = compile_and_check(all, std::string("harness_") + op.name, &kind);
  if (!err.empty()) {
    // Something does not compile: find what, dtype by dtype and then sample by sample, so that
    // everything else is still checked. Only NotSupported naming the sample's node is a gap.
    ASSERT_EQ(kind, ErrorKind::NotSupported) << err;
    for (DType d : op.dtypes) {
      std::vector<std::pair<DType, size_t>> picks;
      for (size_t i = 0; i < n_samples; ++i) picks.push_back({d, i});
      std::string base = fmt::format("harness_{}_{}", op.name, dtype_name(d));
      if (compile_and_check(picks, base, &kind).empty()) continue;
      for (size_t i = 0; i < n_samples; ++i) {
        std::string why = compile_and_check({{d, i}}, fmt::format("{}_{}", base, i), &kind);
        if (why.empty()) continue;
        SampleRun run{op, d, samples[i], i, device};
        EXPECT_EQ(kind, ErrorKind::NotSupported) << why;
        EXPECT_NE(why.find(run.label()), std::string::npos) << "the error must name the node: " << why;
        std::printf("gap: %s: %s\n", run.label().c_str(), why.c_str());
        gaps.insert(fmt::format("{} {}", op.name, dtype_name(d)));
      }
    }
  }
  for (const auto& [d, log] : logs) log.print(OpCase{&op, d, device});
  // The ratchet: exactly the listed gaps of this op on this device.
  std::set<std::string> listed;
  auto it = known_gaps().find(device.type);
  ASSERT_NE(it, known_gaps().end()) << "no known_gaps() entry for " << device.str();
  for (const std::string& gap : it->second)
    if (gap.rfind(std::string(op.name) + " ", 0) == 0) listed.insert(gap);
  for (const std::string& gap : gaps)
    EXPECT_TRUE(listed.count(gap)) << "new gap on " << device.str() << ": \"" << gap
                                   << "\" (add a kernel, or list it in the known gaps)";
  for (const std::string& gap : listed)
    EXPECT_TRUE(gaps.count(gap)) << "\"" << gap << "\" now compiles on " << device.str()
                                 << ": remove it from the known gaps";
}

// Every op with samples on every device this process sees that a compiler target compiles for.
std::vector<CompiledCase> compiled_cases() {
  std::vector<CompiledCase> out;
  for (Device dev : harness_devices()) {
    bool has_target = false;
    for (const compiler::Target* t : compiler::registered_targets())
      has_target = has_target || t->device().type == dev.type;
    if (!has_target) continue;
    for (const OpDef& op : all_ops())
      if (op.samples) out.push_back({&op, dev});
  }
  return out;
}
INSTANTIATE_TEST_SUITE_P(Registry, CompiledOpHarness, testing::ValuesIn(compiled_cases()),
                         [](const testing::TestParamInfo<CompiledCase>& i) {
                           return std::string(i.param.op->name) + device_suffix(i.param.device);
                         });

TEST(OpHarnessSelf, EveryDeviceWithATargetHasCompiledCases) {
  // The CPU always has a target and cases; a registered target for a device the process sees
  // must get cases for every op with samples.
  size_t with_samples = 0;
  for (const OpDef& op : all_ops()) with_samples += op.samples != nullptr;
  std::map<int, size_t> per_device;
  for (const CompiledCase& c : compiled_cases()) ++per_device[int(c.device.type)];
  EXPECT_EQ(per_device[int(DeviceType::CPU)], with_samples);
  for (auto [type, n] : per_device) EXPECT_EQ(n, with_samples) << "device type " << type;
}

// ---- the harness itself -------------------------------------------------------------------------
TEST(OpHarnessSelf, KnownGapsNameRealOpsAndDtypes) {
  // An entry for an unknown op or a dtype the op does not list would never be checked.
  for (const auto& [device, gaps] : known_gaps())
    for (const std::string& gap : gaps) {
      size_t space = gap.find(' ');
      ASSERT_NE(space, std::string::npos) << gap;
      const OpDef* op = find_op(gap.substr(0, space));
      ASSERT_NE(op, nullptr) << "known gap names unknown op: " << gap;
      EXPECT_NE(op->samples, nullptr) << gap << ": the op has no samples, so no harness case";
      bool listed = false;
      for (DType d : op->dtypes) listed = listed || gap.substr(space + 1) == dtype_name(d);
      EXPECT_TRUE(listed) << "known gap names a dtype the op does not take: " << gap;
    }
}

// Ops whose only CPU eager path is the reference kernel (no dtype and no sample takes another
// path; see Note [Kernel paths]), with whether the independent evaluation (Note [Independent
// oracle]) covers them. For those it does not cover, the eager results are compared with the
// reference itself: their checks come from the compiled harness (loop code, oneDNN), the
// decomposition where there is one, and the per-family semantics tests. docs/ops.md lists
// them; a change either way updates both.
const std::set<std::string>& reference_only_ops() {
  static const std::set<std::string> ops = {
      // covered by the independent evaluation
      "not", "clamp", "cast", "where", "sign", "floor", "ceil", "round", "sin", "cos",
      // not covered: data movement and indexing (each output element is a copy of an input
      // element or a pad value), and the arithmetic of scatter_add and grid_sample
      "reshape", "permute", "transpose", "expand", "squeeze", "unsqueeze", "flatten", "slice",
      "concat", "split", "pad", "copy", "gather", "index_select", "embedding", "scatter_add",
      "grid_sample",
  };
  return ops;
}

TEST(OpHarnessSelf, ReferenceOnlyOps) {
  std::set<std::string> found;
  std::string report;
  for (const OpDef& op : all_ops()) {
    if (!op.samples) continue;
    std::map<std::string, int> paths;
    std::vector<OpSample> samples = samples_of(op);
    for (DType d : op.dtypes)
      for (size_t i = 0; i < samples.size(); ++i) {
        SampleRun run{op, d, samples[i], i};
        std::string path;
        try {
          run.eager(run.inputs(), &path);
        } catch (const Error&) {
          continue;  // reported by the harness cases
        }
        EXPECT_NE(path, "eager:eager_cpu")
            << run.label() << ": the eager kernel does not say which path it took (call "
            << "note_kernel_path, Note [Kernel paths])";
        ++paths[path];
      }
    bool reference_only = !paths.empty();
    for (const auto& [p, n] : paths)
      reference_only = reference_only && (p == "eager:reference" ||
                                          (!op.reference && p == "eager:decomposition"));
    if (!reference_only) continue;
    found.insert(op.name);
    report += fmt::format("  {}{}\n", op.name,
                          harness::has_independent(op.id) ? " (independent evaluation)"
                                                          : " (no independent evaluation)");
  }
  std::printf("[ reference only ] %zu ops have only the reference path on the CPU:\n%s",
              found.size(), report.c_str());
  for (const std::string& op : found)
    EXPECT_TRUE(reference_only_ops().count(op))
        << op << " has only the reference path: add it to reference_only_ops() and docs/ops.md";
  for (const std::string& op : reference_only_ops())
    EXPECT_TRUE(found.count(op)) << op << " now has another eager path: remove it from "
                                 << "reference_only_ops() and docs/ops.md";
}

// The independent evaluation states the semantics itself (it is what the reference paths are
// checked against), so check it on values whose results are known.
TEST(OpHarnessSelf, IndependentEvaluationFollowsTheDocumentedSemantics) {
  const double nan = std::nan(""), inf = INFINITY;
  auto eval = [](OpId id, TensorList in, Attrs attrs = {}) {
    const OpDef& op = op_def(id);
    Attrs a = op.canonicalize(attrs, "test");
    std::vector<TensorType> types = infer_types(op, in, a, "test");
    std::optional<TensorList> out = harness::independent(op, in, a, types);
    EXPECT_TRUE(out.has_value()) << op.name;
    return out ? (*out)[0] : Tensor();
  };
  auto f64 = [](std::vector<double> v) { return Tensor::from_vector(v, {int64_t(v.size())}); };
  auto same = [](const Tensor& got, std::vector<double> want) {  // values, any shape
    return test::close(got.to_vector<double>(), want, test::Tolerance::rel(1e-15, 0));
  };
  Tensor x = f64({1, nan, -inf, 3});
  EXPECT_TRUE(same(eval(OpId::Max, {x}), {nan}));  // NaN propagates through max / min
  EXPECT_TRUE(same(eval(OpId::Min, {x}), {nan}));
  EXPECT_TRUE(same(eval(OpId::Max, {f64({1, -inf, 3})}), {3}));
  EXPECT_EQ(eval(OpId::Argmax, {x}).to_vector<int64_t>(), std::vector<int64_t>{1});  // first NaN
  EXPECT_EQ(eval(OpId::Argmin, {f64({2, -inf, -inf})}).to_vector<int64_t>(), std::vector<int64_t>{1});
  EXPECT_TRUE(same(eval(OpId::Relu, {x}), {1, nan, 0, 3}));
  EXPECT_TRUE(same(eval(OpId::Clamp, {x}, {{"min", 0.0}, {"max", 2.0}}), {1, nan, 0, 2}));
  EXPECT_TRUE(same(eval(OpId::Maximum, {x, f64({nan, 0, 0, 5})}), {nan, nan, 0, 5}));
  EXPECT_TRUE(same(eval(OpId::Sum, {f64({inf, -inf, 1})}), {nan}));
  EXPECT_TRUE(same(eval(OpId::Sign, {x}), {1, nan, -1, 1}));
  // Casts: float -> int saturates with NaN -> 0; int -> int wraps.
  EXPECT_EQ(eval(OpId::Cast, {f64({nan, inf, -inf, -2.7})}, {{"dtype", DType::Int8}})
                .to_vector<int8_t>(),
            (std::vector<int8_t>{0, 127, -128, -2}));
  EXPECT_EQ(eval(OpId::Cast, {Tensor::from_vector<int32_t>({300, -129}, {2})},
                 {{"dtype", DType::Int8}}).to_vector<int8_t>(),
            (std::vector<int8_t>{44, 127}));
  // Integer arithmetic wraps at the stored type.
  EXPECT_EQ(eval(OpId::Add, {Tensor::from_vector<int8_t>({127}, {1}),
                             Tensor::from_vector<int8_t>({1}, {1})}).to_vector<int8_t>(),
            std::vector<int8_t>{-128});
}

TEST(OpHarnessSelf, SymbolicAllowListNamesRealOps) {
  for (const auto& e : kSymbolicAllowList) {
    EXPECT_NE(find_op(e.op), nullptr) << "kSymbolicAllowList names unknown op '" << e.op << "'";
    EXPECT_GT(std::string_view(e.reason).size(), 20u) << e.op << ": say why";
  }
}

TEST(OpHarnessSelf, SymbolicAllowListIsNeeded) {
  // An entry whose op now infers every sample symbolically is stale: remove it, so the
  // allow-list keeps meaning "these cannot be done".
  for (const auto& e : kSymbolicAllowList) {
    const OpDef* op = find_op(e.op);
    if (!op || !op->samples || op->dtypes.empty() || !op->infer) continue;
    std::vector<OpSample> samples = samples_of(*op);
    int thrown = 0, wrong = 0;
    for (size_t i = 0; i < samples.size(); ++i) {
      SampleRun run{*op, op->dtypes[0], samples[i], i};
      TensorList inputs = run.inputs();
      if (inputs.empty() || !inputs[0].defined() || inputs[0].dim() == 0 ||
          inputs[0].size(0) <= 1)
        continue;
      try {
        SymbolicOutcome o = check_symbolic(run, inputs, run.canonical());
        thrown += !o.ok && !o.wrong;
        wrong += o.wrong;  // reported by check_symbolic; the entry is still needed
      } catch (const Error&) {
        // invalid samples are reported by the harness cases
      }
    }
    EXPECT_GT(thrown + wrong, 0) << "kSymbolicAllowList entry '" << e.op
                         << "' is stale: every sample infers symbolically now";
  }
}

TEST(OpHarnessSelf, EveryOpWithSamplesHasCases) {
  std::map<std::string, int> per_op;
  for (const OpCase& c : all_cases()) ++per_op[c.op->name];
  for (const OpDef& op : all_ops()) {
    if (!op.samples) continue;
    EXPECT_GT(per_op[op.name], 0) << op.name << " has samples but no dtypes";
  }
}

TEST(OpHarnessSelf, CompareDetectsMismatches) {
  Generator g(7);
  Tensor e = Tensor::randn({3, 4}, g, DType::Float64);
  Tensor a = e.to(DType::Float32);
  harness::Tolerance f32 = compare_tolerance(DType::Float32, DType::Float32, 1.0);
  EXPECT_EQ(compare_values(e, a, f32), "");
  // A perturbation of 1e-3 is outside float32 tolerance and inside float16's.
  Tensor b = a.clone();
  b.data<float>()[5] += 1e-3f;
  std::string report = compare_values(e, b, f32);
  EXPECT_NE(report.find("worst at [1, 1] (flat 5)"), std::string::npos) << report;
  EXPECT_NE(report.find("1 of 12"), std::string::npos) << report;
  EXPECT_EQ(compare_values(e, b, compare_tolerance(DType::Float16, DType::Float16, 1.0)), "");
  // tolerance_scale widens the band.
  EXPECT_EQ(compare_values(e, b, compare_tolerance(DType::Float32, DType::Float32, 200.0)), "");
  // NaN must match NaN; inf must match the same inf.
  Tensor n = a.clone();
  n.data<float>()[0] = std::nanf("");
  EXPECT_NE(compare_values(e, n, f32), "");
  Tensor en = e.clone();
  en.data<double>()[0] = std::nan("");
  EXPECT_EQ(compare_values(en, n, f32), "");
  Tensor ei = e.clone();
  ei.data<double>()[2] = -INFINITY;
  Tensor ai = a.clone();
  ai.data<float>()[2] = INFINITY;
  EXPECT_NE(compare_values(ei, ai, f32), "");
  ai.data<float>()[2] = -INFINITY;
  EXPECT_EQ(compare_values(ei, ai, f32), "");
  // Shapes and integer values are exact.
  EXPECT_NE(compare_values(e, Tensor::randn({4, 3}, g, DType::Float64), f32), "");
  Tensor i1 = Tensor::randint({5}, g, -100, 100);
  Tensor i2 = i1.clone();
  i2.data<int64_t>()[4] += 1;
  harness::Tolerance exact = compare_tolerance(DType::Int64, DType::Int64, 1.0);
  EXPECT_TRUE(exact.is_exact());
  EXPECT_EQ(compare_values(i1, i1.clone(), exact), "");
  EXPECT_NE(compare_values(i1, i2, exact), "");
}

TEST(OpHarnessSelf, TestDtypeConversion) {
  Generator g(11);
  Tensor x = Tensor::randn({4, 6}, g, DType::Float64);
  // Floating: rounded to the dtype.
  Tensor h = harness::to_test_dtype(x, DType::Float16);
  EXPECT_EQ(h.dtype(), DType::Float16);
  EXPECT_EQ(compare_values(x, h, compare_tolerance(DType::Float16, DType::Float16, 1.0)), "");
  // Integer: round(4v), sign kept; uint8 takes magnitudes; bool is v > 0.
  Tensor i = harness::to_test_dtype(x, DType::Int32);
  Tensor u = harness::to_test_dtype(x, DType::UInt8);
  Tensor b = harness::to_test_dtype(x, DType::Bool);
  auto xv = x.to_vector<double>();
  auto iv = i.to_vector<int32_t>();
  auto uv = u.to_vector<uint8_t>();
  auto bv = b.to_vector<bool>();
  int distinct_nonzero = 0;
  for (size_t k = 0; k < xv.size(); ++k) {
    EXPECT_EQ(iv[k], int32_t(std::round(4 * xv[k])));
    EXPECT_EQ(uv[k], uint8_t(std::fabs(std::round(4 * xv[k]))));
    EXPECT_EQ(bv[k], xv[k] > 0);
    distinct_nonzero += iv[k] != 0;
  }
  EXPECT_GT(distinct_nonzero, 12);
  // Integer-valued inputs are kept; int64 indices pass through untouched (same tensor).
  Tensor mask = Tensor::from_vector<double>({0, 1, 1, 0, 3, -2}, {6});
  EXPECT_EQ(harness::to_test_dtype(mask, DType::Int8).to_vector<int8_t>(),
            (std::vector<int8_t>{0, 1, 1, 0, 3, -2}));
  Tensor idx = Tensor::randint({5}, g, 0, 9);
  EXPECT_TRUE(same_tensor(harness::to_test_dtype(idx, DType::Float16), idx));
  // A view stays a view with the same strides.
  Tensor base = Tensor::randn({6, 4}, g, DType::Float64);
  Tensor view = base.as_strided({4, 6}, {1, 4}, 0);
  Tensor v16 = harness::to_test_dtype(view, DType::BFloat16);
  EXPECT_FALSE(v16.is_contiguous());
  EXPECT_EQ(v16.strides(), view.strides());
  EXPECT_EQ(compare_values(view, v16, compare_tolerance(DType::BFloat16, DType::BFloat16, 1.0)),
            "");
}

TEST(OpHarnessSelf, NonContiguousKeepsValues) {
  Generator g(3);
  for (Dims sizes : {Dims{3, 5}, Dims{2, 3, 4}, Dims{1, 1, 33}, Dims{7}, Dims{4, 1}}) {
    for (DType d : {DType::Float32, DType::Float16, DType::Int64, DType::Bool}) {
      Tensor x = Tensor::randn(sizes, g, DType::Float64).to(d);
      Tensor y = harness::make_noncontiguous(x);
      EXPECT_FALSE(y.is_contiguous()) << to_string(sizes) << " " << dtype_name(d);
      EXPECT_EQ(compare_bitwise(x, y), "") << to_string(sizes) << " " << dtype_name(d);
    }
  }
  Tensor s = Tensor::scalar(2.5, DType::Float64);
  EXPECT_EQ(harness::make_noncontiguous(s).item(), 2.5);
}

}  // namespace
}  // namespace kiln
