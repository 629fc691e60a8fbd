// kiln ops [--json] [--family F]: the op registry, generated from the op records (never a
// hand-written table): schema and capabilities of every op.
#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "frontends/aten/aten_mapping.h"
#include "frontends/onnx/op_table.h"
#include "compiler/target.h"
#include "ops/op.h"
#include "tools/commands.h"

namespace kiln::cli {
namespace {

nlohmann::json attr_default_json(const AttrValue& v) {
  if (std::holds_alternative<std::monostate>(v)) return nullptr;
  return attr_value_str(v);
}

const char* cuda_eager_path(const OpDef& d) {
  if (d.eager_cuda && d.eager_cuda_compiled) return "kernel+compiled";
  if (d.eager_cuda) return "kernel";
  if (d.eager_cuda_compiled) return "compiled";
  return d.decompose ? "decomposition" : "none";
}

// The dtypes an eager CUDA call may take: every dtype of the op where the compiled path is
// attached (a signature the target cannot take still fails, naming the op), else the kernel's.
nlohmann::json cuda_dtypes_json(const OpDef& d) {
  nlohmann::json a = nlohmann::json::array();
  const std::vector<DType>& list = d.eager_cuda_compiled ? d.dtypes : d.eager_cuda_dtypes;
  for (DType t : list) a.push_back(dtype_name(t));
  return a;
}

nlohmann::json op_json(const OpDef& d) {
  nlohmann::json j;
  j["name"] = d.name;
  j["family"] = d.family;
  j["doc"] = d.doc;
  j["inputs"] = nlohmann::json::array();
  for (const InputSpec& in : d.inputs)
    j["inputs"].push_back({{"name", in.name}, {"optional", in.optional}, {"variadic", in.variadic}});
  j["attributes"] = nlohmann::json::array();
  for (const AttrSpec& a : d.attrs)
    j["attributes"].push_back({{"name", a.name},
                               {"type", attr_type_name(a.type)},
                               {"default", attr_default_json(a.default_value)},
                               {"optional", a.optional}});
  j["num_outputs"] = d.num_outputs;
  j["is_view"] = d.is_view;
  j["traits"] = op_traits_str(d.traits);
  j["dtypes"] = nlohmann::json::array();
  for (DType t : d.dtypes) j["dtypes"].push_back(dtype_name(t));
  j["capabilities"] = {
      {"inference", d.infer != nullptr},
      {"reference_kernel", d.reference != nullptr},
      {"decomposition", d.decompose != nullptr},
      {"eager_cpu_kernel", d.eager_cpu != nullptr},
      {"cuda_eager_kernel", d.eager_cuda != nullptr},
      // How an eager call on CUDA tensors runs (Note [Dispatch]): "kernel" (hand-written, for
      // eager_cuda_dtypes), "kernel+compiled" (the others through the CUDA compiler),
      // "compiled" (the op compiled alone by the CUDA target), "decomposition" or "none".
      {"cuda_eager", cuda_eager_path(d)},
      {"cuda_eager_dtypes", cuda_dtypes_json(d)},
      {"gradient", d.gradient != nullptr},
      {"onnx", d.onnx_ops},
      {"aten", d.aten_ops},
      {"test_samples", d.samples != nullptr},
  };
  // How each compiler target runs the op (its support table, compiler/target.h).
  nlohmann::json targets = nlohmann::json::object();
  for (const compiler::Target* t : compiler::registered_targets()) {
    const compiler::OpSupport& s = t->support()[size_t(d.id)];
    targets[t->name()] = {{"generated", s.generated},
                          {"library", s.library},
                          {"vector_body", s.vector_body},
                          {"how", s.how}};
  }
  j["targets"] = std::move(targets);
  return j;
}

const char* yn(bool b) { return b ? "yes" : "-"; }

}  // namespace

void add_ops_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("ops", "List the op registry: schemas and capabilities");
  static bool json = false;
  static std::string family;
  cmd->add_flag("--json", json, "Print the registry as JSON");
  cmd->add_option("--family", family, "Only ops of this family (unary, binary, reduce, ...)");
  cmd->callback([] {
    onnx::register_onnx_mappings();  // OpDef::onnx_ops comes from the ONNX op table
    aten::register_aten_mappings();  // OpDef::aten_ops from the Python frontend's ATen table
    auto ops = all_ops();
    bool found = family.empty();
    for (const OpDef& d : ops) found |= family == d.family;
    if (!found) fail("unknown op family '{}'", family);
    if (json) {
      nlohmann::json out;
      out["num_ops"] = 0;
      out["ops"] = nlohmann::json::array();
      for (const OpDef& d : ops)
        if (family.empty() || family == d.family) out["ops"].push_back(op_json(d));
      out["num_ops"] = out["ops"].size();
      auto problems = registry_problems();
      out["registry_problems"] = problems;
      std::printf("%s\n", out.dump(2).c_str());
      return;
    }
    std::printf("%-30s %-10s %-5s %-5s %-6s %-6s %-6s %-15s %-5s %s\n", "op", "family", "infer",
                "ref", "decomp", "eager", "cpu", "cuda", "grad", "schema");
    for (const OpDef& d : ops) {
      if (!family.empty() && family != d.family) continue;
      std::string schema = "(";
      for (size_t i = 0; i < d.inputs.size(); ++i)
        schema += (i ? ", " : "") + d.inputs[i].name + (d.inputs[i].optional ? "?" : "") +
                  (d.inputs[i].variadic ? "..." : "");
      schema += ")";
      if (!d.attrs.empty()) {
        schema += " {";
        for (size_t i = 0; i < d.attrs.size(); ++i)
          schema += (i ? ", " : "") + d.attrs[i].name + ": " + attr_type_name(d.attrs[i].type);
        schema += "}";
      }
      // cpu: "gen" (loop code), "lib" (a library kernel) or "-" (eager kernel, view, decomposed)
      const char* cpu = "-";
      for (const compiler::Target* t : compiler::registered_targets()) {
        if (std::string_view(t->name()) != "cpu") continue;
        const compiler::OpSupport& s = t->support()[size_t(d.id)];
        cpu = s.generated ? "gen" : s.library ? "lib" : "-";
      }
      std::printf("%-30s %-10s %-5s %-5s %-6s %-6s %-6s %-15s %-5s %s\n", d.name, d.family,
                  yn(d.infer), yn(d.reference), yn(d.decompose), yn(d.eager_cpu), cpu,
                  cuda_eager_path(d), yn(d.gradient), schema.c_str());
    }
    std::printf("%zu ops\n", ops.size());
  });
}

}  // namespace kiln::cli
