// kiln models [--json]: the model zoo (src/nn/models): name, parameter count, input shapes and
// a one-line description per model. Parameter counts come from building each model.
#include <cstdio>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "nn/models/zoo.h"
#include "tools/commands.h"

namespace kiln::cli {
namespace {

// "x: f32[B, 3, 224, 224]"
std::string input_str(const nn::ZooInputSpec& s) {
  std::string dims = "B";
  for (size_t i = 1; i < s.shape.size(); ++i) dims += fmt::format(", {}", s.shape[i]);
  return fmt::format("{}: {}[{}]", s.name, info(s.dtype).short_name, dims);
}

// 11689512 -> "11,689,512"
std::string grouped(int64_t n) {
  std::string digits = std::to_string(n), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

}  // namespace

void add_models_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("models", "List the model zoo: parameters, inputs, description");
  static bool json = false;
  cmd->add_flag("--json", json, "Print the list as JSON");
  cmd->callback([] {
    nlohmann::ordered_json out = nlohmann::ordered_json::array();
    if (!json)
      std::printf("%-10s %12s  %-52s %s\n", "model", "params", "inputs (B = batch)",
                  "description");
    for (const nn::ZooEntry& e : nn::zoo_models()) {
      int64_t params = nn::make_zoo_model(e.name).module->num_parameters();
      if (json) {
        nlohmann::ordered_json inputs = nlohmann::ordered_json::array();
        for (const auto& s : e.inputs) {
          nlohmann::ordered_json shape = nlohmann::ordered_json::array({"B"});
          for (size_t i = 1; i < s.shape.size(); ++i) shape.push_back(s.shape[i]);
          inputs.push_back({{"name", s.name}, {"dtype", dtype_name(s.dtype)}, {"shape", shape}});
        }
        out.push_back({{"name", e.name},
                       {"params", params},
                       {"inputs", inputs},
                       {"outputs", e.outputs},
                       {"description", e.description}});
        continue;
      }
      std::string inputs;
      for (const auto& s : e.inputs) inputs += (inputs.empty() ? "" : ", ") + input_str(s);
      std::printf("%-10s %12s  %-52s %s\n", e.name.c_str(), grouped(params).c_str(),
                  inputs.c_str(), e.description.c_str());
    }
    if (json) std::printf("%s\n", out.dump(2).c_str());
  });
}

}  // namespace kiln::cli
