// Note [Replacing weights]
// A package holds the weights after the compiler's passes: batch norm folded into convolutions,
// param-only subgraphs folded (a transposed weight), weights converted to bfloat16 by autocast,
// epilogues fused. New weights arrive named as the model's own parameters
// (`layer1.0.bn1.running_var`, an ONNX initializer), so they cannot be copied in; they must go
// through the same passes. So a package (format version 2) carries a `source` section: the graph
// compile() was given, as IR text with its parameters declared by type only, its parameter list,
// and what decides the pass pipeline (target, precision, the pipeline's pass names).
//
// replace_weights then: checks the new file against the parameter list (every difference in
// one error); parses the source graph and binds the new tensors to its parameters; runs phase 1
// of the compiler alone (run_compiler_passes: the same function compile() runs, with the same
// target and precision) — no kernel choice, no library lowering, no code generation; takes
// every package constant by name from the result; and writes the package again with only the
// weights section (and the hashes) new. The manifest (memory plan, launch records, oneDNN
// descriptors) and the kernels are kept: they depend on the graph's structure, names, dtypes
// and shapes, never on weight values, provided that the passes make the same structure from any
// weights. They do, because a value computed from a param stays a param (Note [Folded weights
// stay params] in passes/constant_fold.h), so no pass decides on a weight's value. The checks
// below catch what would break that promise:
//   - every package constant must come out of the passes with the same name, dtype and shape,
//     and the passes must make no constant the package lacks (Internal errors naming it);
//   - a const (not a param: a value of the model's code, which the scheduler may have compiled
//     into the kernels as a literal) must come out with the same bytes as the package holds;
//   - the package must come from this Kiln version, and this Kiln's pipeline for the recorded
//     target and precision must have the recorded pass names.
// The passes are deterministic, so compiling with weights B gives the same package bytes as
// replacing the weights of the package compiled with weights A by B's
// (tests/e2e/package_test.cc checks it, zoo and ONNX models, float32 and bfloat16).
// What can still differ is a decision a pass takes on values that the checks above report:
// autocast keeps a pointwise op in float32 when a weight it reads underflows or overflows the
// low dtype (then the constant's dtype or name differs, an Internal error). And one kernel
// choice reads weight values: a CPU convolution takes Winograd only where it agrees with the
// direct convolution on the weights it was compiled with (Note [measured Winograd] in
// targets/cpu/onednn_lowering.cc), so Target::check_replaced_weights runs that check again on
// the new weights and refuses the replacement, naming the convolution, where it fails.
#include "compiler/replace_weights.h"

#include <chrono>
#include <cstring>
#include <map>
#include <set>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "passes/pipeline.h"
#include "runtime/package.h"
#include "runtime/safetensors.h"
#include "support/files.h"

namespace kiln::compiler {

namespace {

using json = nlohmann::json;

// Consts with more elements than this are stored as tensors of the section, not as IR text.
constexpr int64_t kMaxInlineConstElements = 256;

json dims_json(const Dims& d) {
  json a = json::array();
  for (int64_t x : d) a.push_back(x);
  return a;
}

std::string pipeline_names(const Target& target, DType precision) {
  std::string names;
  for (const auto& p : compiler_passes(target, precision))
    names += (names.empty() ? "" : ",") + std::string(p->name());
  return names;
}

std::span<const uint8_t> as_bytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

std::string describe(DType dt, const Dims& shape) {
  return fmt::format("{}{}", dtype_name(dt), to_string(shape));
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.sizes() != b.sizes()) return false;
  Tensor x = a.contiguous(), y = b.contiguous();
  return x.nbytes() == y.nbytes() &&
         std::memcmp(x.raw_data(), y.raw_data(), size_t(x.nbytes())) == 0;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The source section, parsed: the graph's text, its parameters, its large consts.
struct Source {
  std::string graph_text, precision, target, pipeline;
  std::vector<std::tuple<std::string, DType, Dims>> params;  // name, dtype, shape
  std::vector<std::tuple<std::string, DType, Dims>> unused;  // the model's, not read
  // Parameters a weights file need not hold (the model's non-persistent buffers), with their
  // values among `consts` (Note [Replacing weights]).
  std::vector<std::tuple<std::string, DType, Dims>> fixed;
  std::map<std::string, Tensor> consts;
};

Source parse_source(std::string_view bytes, const std::string& package) {
  std::string where = fmt::format("package '{}': section 'source'", package);
  SafetensorsContents c = parse_safetensors(as_bytes(bytes), where);
  Source s;
  try {
    s.graph_text = c.metadata.at("graph");
    s.precision = c.metadata.at("precision");
    s.target = c.metadata.at("target");
    s.pipeline = c.metadata.at("pipeline");
    for (const char* key : {"params", "unused", "fixed"}) {
      if (key == std::string("fixed") && !c.metadata.count(key)) continue;  // written before it
      for (const json& p : json::parse(c.metadata.at(key))) {
        DType dt;
        std::string name = p.at("name").get<std::string>();
        if (!parse_dtype(p.at("dtype").get<std::string>(), &dt))
          throw std::out_of_range("tensor '" + name + "': unknown dtype");
        Dims shape;
        for (int64_t d : p.at("shape").get<std::vector<int64_t>>()) shape.push_back(d);
        (key == std::string("params")   ? s.params
         : key == std::string("unused") ? s.unused
                                        : s.fixed)
            .emplace_back(std::move(name), dt, shape);
      }
    }
  } catch (const std::exception& e) {
    fail_kind(ErrorKind::ParseError, "{}: {}", where, e.what());
  }
  for (auto& [name, t] : c.tensors) s.consts.emplace(name, t);
  return s;
}

// Every difference between the file's tensors and the source parameters, in one error. The
// model's unused tensors may be present (with their dtype and shape) or not. Returns how many
// of them the file holds (they are ignored).
int check_weights(const Source& src, const NamedTensors& given, const std::string& weights_path,
                  const std::string& package_path) {
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, t] : given) by_name.emplace(name, &t);
  std::vector<std::string> missing, wrong_dtype, wrong_shape, unexpected;
  std::set<std::string> known;
  int ignored = 0;
  auto check = [&](const std::string& name, DType dt, const Dims& shape, bool required) {
    known.insert(name);
    auto it = by_name.find(name);
    if (it == by_name.end()) {
      if (required) missing.push_back(fmt::format("{} {}", name, describe(dt, shape)));
      return;
    }
    ignored += !required;
    const Tensor& t = *it->second;
    if (t.dtype() != dt)
      wrong_dtype.push_back(fmt::format("{}: expected {}, found {}", name, dtype_name(dt),
                                        dtype_name(t.dtype())));
    if (t.sizes() != shape)
      wrong_shape.push_back(fmt::format("{}: expected {}, found {}", name, to_string(shape),
                                        to_string(t.sizes())));
  };
  for (const auto& [name, dt, shape] : src.params) check(name, dt, shape, true);
  for (const auto& [name, dt, shape] : src.unused) check(name, dt, shape, false);
  for (const auto& [name, dt, shape] : src.fixed) check(name, dt, shape, false);
  for (const auto& [name, t] : given)
    if (!known.count(name))
      unexpected.push_back(fmt::format("{} {}", name, describe(t.dtype(), t.sizes())));
  if (missing.empty() && wrong_dtype.empty() && wrong_shape.empty() && unexpected.empty())
    return ignored;
  std::string msg = fmt::format(
      "replace-weights: '{}' does not match the parameters of package '{}' ({} missing, {} "
      "unexpected, {} of another dtype, {} of another shape; `kiln explain {}` lists the "
      "parameters):",
      weights_path, package_path, missing.size(), unexpected.size(), wrong_dtype.size(),
      wrong_shape.size(), package_path);
  auto list = [&](const char* what, const std::vector<std::string>& items) {
    for (const std::string& i : items) msg += fmt::format("\n  {}: {}", what, i);
  };
  list("missing", missing);
  list("unexpected", unexpected);
  list("wrong dtype", wrong_dtype);
  list("wrong shape", wrong_shape);
  fail_kind(ErrorKind::InvalidArgument, "{}", msg);
}

}  // namespace

std::string source_section_bytes(const Graph& source, const Target& target,
                                 const Options& options, const NamedTensors& model_state,
                                 const NamedTensors& fixed_params) {
  json params = json::array(), unused = json::array(), fixed = json::array();
  std::set<std::string> param_names;
  NamedTensors large_consts;
  std::map<std::string, const Tensor*> fixed_by_name;
  for (const auto& [name, t] : fixed_params) fixed_by_name.emplace(name, &t);
  for (ValueId v : source.params()) {
    const Value& val = source.value(v);
    if (!is_concrete(val.type.shape))
      fail_kind(ErrorKind::NotSupported, "package: parameter '{}' has symbolic shape {}",
                val.name, to_string(val.type.shape));
    if (val.kind == ValueKind::Param) {
      json entry = {{"name", val.name}, {"dtype", dtype_name(val.type.dtype)},
                    {"shape", dims_json(to_dims(val.type.shape))}};
      auto f = fixed_by_name.find(val.name);
      if (f != fixed_by_name.end() && f->second->defined()) {
        // Its value travels in the section; a weights file may replace it or leave it out.
        if (f->second->dtype() != val.type.dtype || to_shape(f->second->sizes()) != val.type.shape)
          fail_kind(ErrorKind::Internal, "package: buffer '{}' is {}, the graph's parameter {}",
                    val.name, describe(f->second->dtype(), f->second->sizes()), val.type.str());
        fixed.push_back(entry);
        large_consts.emplace_back(val.name, *f->second);
      } else {
        params.push_back(entry);
      }
      param_names.insert(val.name);
    } else if (val.data.defined() && val.data.numel() > kMaxInlineConstElements) {
      large_consts.emplace_back(val.name, val.data);
    } else if (!val.data.defined()) {
      fail_kind(ErrorKind::InvalidArgument, "package: const '{}' has no data", val.name);
    }
  }
  for (const auto& [name, t] : model_state)
    if (t.defined() && !param_names.count(name))
      unused.push_back({{"name", name}, {"dtype", dtype_name(t.dtype())}, {"shape", dims_json(t.sizes())}});
  PrintOptions po;
  po.max_inline_const_elements = kMaxInlineConstElements;
  std::map<std::string, std::string> meta = {
      {"graph", print_graph(source, po)},
      {"params", params.dump()},
      {"unused", unused.dump()},
      {"fixed", fixed.dump()},
      {"precision", dtype_name(options.precision)},
      {"target", target.name()},
      {"pipeline", pipeline_names(target, options.precision)},
  };
  std::vector<uint8_t> bytes = safetensors_bytes(large_consts, meta);
  return std::string(bytes.begin(), bytes.end());
}

std::string ReplaceWeightsReport::str() const {
  return fmt::format("{} parameters -> {} constants ({} unused tensors ignored), {} bytes; "
                     "{:.3f} s (read {:.3f}, passes {:.3f}, write {:.3f})",
                     parameters, constants, ignored, package_bytes, total_s, read_s, passes_s,
                     write_s);
}

ReplaceWeightsReport replace_weights(const std::string& package_path,
                                     const std::string& weights_path, const std::string& out_path) {
  auto t0 = std::chrono::steady_clock::now();
  ReplaceWeightsReport rep;
  uint32_t version = 0;
  std::vector<PackageSection> sections = read_package_sections(package_path, &version);
  PackageSection* weights_section = nullptr;
  const PackageSection* source_section = nullptr;
  for (PackageSection& s : sections) {
    if (s.name == "weights") weights_section = &s;
    if (s.name == "source") source_section = &s;
  }
  KILN_ASSERT(weights_section);  // the container requires it
  if (!source_section)
    fail_kind(ErrorKind::NotSupported,
              "package '{}': has no source graph (format version {}{}), so its weights cannot be "
              "replaced; compile it again with this Kiln's `kiln compile`",
              package_path, version, version < 2 ? ", written before version 2 added it" : "");

  // The manifest: which Kiln wrote it, and every constant the package holds, in order.
  struct Constant {
    std::string name;
    DType dtype;
    Dims shape;
  };
  std::vector<Constant> constants;
  std::string kiln_version, launches;
  try {
    json m = json::parse(sections[0].bytes);
    kiln_version = m.at("kiln_version").get<std::string>();
    launches = m.at("launches").dump();
    for (const json& c : m.at("constants")) {
      Constant k;
      k.name = c.at("name").get<std::string>();
      if (!parse_dtype(c.at("dtype").get<std::string>(), &k.dtype))
        throw std::out_of_range("constant '" + k.name + "': unknown dtype");
      for (int64_t d : c.at("shape").get<std::vector<int64_t>>()) k.shape.push_back(d);
      constants.push_back(std::move(k));
    }
  } catch (const std::exception& e) {
    fail_kind(ErrorKind::ParseError, "package '{}': section 'manifest': {}", package_path,
              e.what());
  }
  if (kiln_version != KILN_VERSION)
    fail_kind(ErrorKind::NotSupported,
              "package '{}': written by Kiln {}, this is Kiln {}: the passes that made its "
              "weights may differ; replace its weights with Kiln {}, or compile it again",
              package_path, kiln_version, KILN_VERSION, kiln_version);
  Source src = parse_source(source_section->bytes, package_path);
  DType precision;
  if (!parse_dtype(src.precision, &precision))
    fail_kind(ErrorKind::ParseError, "package '{}': section 'source': unknown precision '{}'",
              package_path, src.precision);
  Device device;
  // The passes need no device: a CUDA package's weights are remade here as a CPU package's
  // are (the target decides the pipeline, e.g. its decompositions), and stored as host copies.
  if (src.target == "cpu") device = Device::cpu();
  else if (src.target == "cuda") device = Device::cuda(0);
  else
    fail_kind(ErrorKind::NotSupported, "package '{}': section 'source': target '{}' (this Kiln "
              "replaces the weights of cpu and cuda packages)", package_path, src.target);
  const Target& target = target_for(device);
  if (pipeline_names(target, precision) != src.pipeline)
    fail_kind(ErrorKind::NotSupported,
              "package '{}': compiled with the pass pipeline [{}], this Kiln's is [{}]; compile "
              "it again", package_path, src.pipeline, pipeline_names(target, precision));

  SafetensorsContents given = load_safetensors(weights_path);
  rep.ignored = check_weights(src, given.tensors, weights_path, package_path);
  rep.read_s = seconds_since(t0);

  // The source graph with the new weights, through the compiler's passes.
  auto t1 = std::chrono::steady_clock::now();
  // A package compiled on the GPU declares its source graph's values on the device; the passes
  // run on the host, as for a cross-build's host graph, so the graph is read with host types
  // and its inline consts stay host data (found by CudaPackage.ReplacedWeightsGiveThe
  // PackageBuiltWithThem: host weights for device types failed the graph's verification).
  Graph g = parse_graph_on_host(src.graph_text, package_path + ": section 'source'");
  std::map<std::string, Tensor> by_name;
  for (auto& [name, t] : given.tensors) by_name.emplace(name, t);
  std::set<std::string> fixed_names;
  for (const auto& f : src.fixed) fixed_names.insert(std::get<0>(f));
  for (Value& val : g.values) {
    if (val.kind == ValueKind::Param) {
      auto it = by_name.find(val.name);  // (an unused name is never a parameter of the graph)
      if (it == by_name.end() && fixed_names.count(val.name)) {
        auto c = src.consts.find(val.name);  // a non-persistent buffer the file leaves out
        if (c == src.consts.end() || c->second.dtype() != val.type.dtype ||
            to_shape(c->second.sizes()) != val.type.shape)
          fail_kind(ErrorKind::ParseError, "package '{}': section 'source': no data of type {} "
                    "for buffer '{}'", package_path, val.type.str(), val.name);
        val.data = c->second;
        ++rep.parameters;
        continue;
      }
      if (it == by_name.end())  // the parameter list and the graph disagree: a corrupt section
        fail_kind(ErrorKind::ParseError, "package '{}': section 'source': the graph's parameter "
                  "'{}' is not in its parameter list", package_path, val.name);
      val.data = it->second.contiguous();
      ++rep.parameters;
    } else if (val.kind == ValueKind::Const && !val.data.defined()) {
      auto it = src.consts.find(val.name);
      if (it == src.consts.end() || it->second.dtype() != val.type.dtype ||
          to_shape(it->second.sizes()) != val.type.shape)
        fail_kind(ErrorKind::ParseError, "package '{}': section 'source': no data of type {} "
                  "for const '{}'", package_path, val.type.str(), val.name);
      val.data = it->second;
    }
  }
  if (size_t(rep.parameters) != src.params.size() + src.fixed.size())
    fail_kind(ErrorKind::ParseError, "package '{}': section 'source': the graph has {} "
              "parameters, its parameter list {}", package_path, rep.parameters,
              src.params.size() + src.fixed.size());
  run_compiler_passes(g, target, precision);
  rep.passes_s = seconds_since(t1);

  // Every package constant, by name, from the passes' result; nothing more, nothing less.
  auto t2 = std::chrono::steady_clock::now();
  std::map<std::string, const Value*> made;
  for (const Value& val : g.values)
    if (val.kind == ValueKind::Param || val.kind == ValueKind::Const) made.emplace(val.name, &val);
  std::map<std::string, Tensor> old_weights;
  {
    SafetensorsContents old = parse_safetensors(
        as_bytes(weights_section->bytes), package_path + ": section 'weights'");
    for (auto& [name, t] : old.tensors) old_weights.emplace(name, t);
  }
  auto internal = [&](const std::string& what) {
    fail_kind(ErrorKind::Internal,
              "replace-weights: package '{}': {}. The compiler's passes made a different graph "
              "from these weights than from the package's; compile the model with these weights "
              "(`kiln compile`) instead",
              package_path, what);
  };
  NamedTensors weights;
  for (const Constant& c : constants) {
    auto it = made.find(c.name);
    if (it == made.end())
      internal(fmt::format("constant '{}' ({}) is not made by the passes", c.name,
                           describe(c.dtype, c.shape)));
    const Value& val = *it->second;
    Dims shape = val.data.defined() ? val.data.sizes() : Dims{};
    if (!val.data.defined() || val.data.dtype() != c.dtype || shape != c.shape)
      internal(fmt::format("constant '{}': the package holds {}, the passes made {}", c.name,
                           describe(c.dtype, c.shape),
                           val.data.defined() ? describe(val.data.dtype(), shape) : "no data"));
    if (val.kind == ValueKind::Const) {
      // Not computed from a parameter: it must be the value the kernels were built with.
      auto old = old_weights.find(c.name);
      if (old == old_weights.end() || !same_bytes(old->second, val.data))
        internal(fmt::format("const '{}' changed with the parameters (the kernels may hold it as "
                             "a literal)", c.name));
    }
    weights.emplace_back(c.name, val.data);
    made.erase(it);
  }
  if (!made.empty())
    internal(fmt::format("the passes made constant '{}', which the package lacks ({} such)",
                         made.begin()->first, made.size()));
  rep.constants = int(weights.size());
  // Choices the compiler made on the old weights' values, checked on the new ones.
  std::map<std::string, Tensor> by_constant(weights.begin(), weights.end());
  target.check_replaced_weights(
      launches,
      [&](const std::string& name) {
        auto it = by_constant.find(name);
        KILN_CHECK(it != by_constant.end(), "replace-weights: package '{}' has no constant '{}'",
                   package_path, name);
        return it->second;
      },
      package_path);

  // The section as the writer composes it: prepacked weights (Note [prepacked weights] in
  // kernels/onednn_node.cc) are made from the new plain weights by the package's own nodes.
  std::vector<uint8_t> w = safetensors_bytes(package_weights(
      sections[0].bytes,
      [&](const std::string& name) {
        auto it = by_constant.find(name);
        KILN_CHECK(it != by_constant.end(), "replace-weights: package '{}' has no constant '{}'",
                   package_path, name);
        return it->second;
      },
      package_path));
  weights_section->bytes.assign(w.begin(), w.end());
  std::vector<uint8_t>().swap(w);
  std::string out = package_container(sections, version);
  rep.package_bytes = int64_t(out.size());
  AtomicFile f(out_path, "replace-weights");
  f.write(out);
  f.commit();
  rep.write_s = seconds_since(t2);
  rep.total_s = seconds_since(t0);
  return rep;
}

}  // namespace kiln::compiler
