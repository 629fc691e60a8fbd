// The model zoo: reference models built with the module API, with random deterministic weights
// and example inputs. Used by tests, benchmarks and `kiln models`.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "nn/module.h"

namespace kiln::nn {

struct ZooInputSpec {
  std::string name;
  Dims shape;  // with the batch dim first
  DType dtype;
};

struct ZooEntry {
  std::string name;
  std::string description;  // one line
  std::vector<ZooInputSpec> inputs;  // shapes for batch 1
  std::vector<std::string> outputs;
};

struct ZooModel {
  std::string name;
  ModulePtr module;  // in eval mode
  TensorList inputs;  // example inputs, in call() order
  std::vector<std::string> input_names, output_names;
};

// Every zoo model, in a fixed order.
const std::vector<ZooEntry>& zoo_models();
// Input specs for a given batch size. Throws for an unknown name (listing the available ones).
std::vector<ZooInputSpec> zoo_input_specs(const std::string& name, int64_t batch = 1);

// The example inputs alone (the same tensors make_zoo_model returns for these arguments).
TensorList zoo_example_inputs(const std::string& name, int64_t batch = 1, uint64_t seed = 0);

// Builds `name` with weights from Generator(seed) and fresh example inputs from a second stream
// of the same seed: the same (name, batch, seed) always gives bitwise-identical weights and
// inputs. Throws naming the available models for an unknown name.
ZooModel make_zoo_model(const std::string& name, int64_t batch = 1, uint64_t seed = 0);

}  // namespace kiln::nn
