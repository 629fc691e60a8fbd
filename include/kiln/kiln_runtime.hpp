// A thin C++ wrapper over the runtime's C API (kiln_runtime.h): RAII for the model, errors as
// exceptions. Header-only; links libkiln_runtime like the C API.
//
//   kiln::runtime::Model m("model.kiln");
//   std::vector<float> x(m.input(0).bytes / 4), y(m.output(0).bytes / 4);
//   m.run({x.data()}, {y.data()});
#pragma once
#include <stdexcept>
#include <string>
#include <vector>

#include "kiln/kiln_runtime.h"

namespace kiln::runtime {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Model {
 public:
  explicit Model(const std::string& path) : m_(kiln_model_open(path.c_str())) {
    if (!m_) throw Error(kiln_last_error());
  }
  ~Model() { kiln_model_close(m_); }
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;
  Model(Model&& o) noexcept : m_(o.m_) { o.m_ = nullptr; }

  int num_inputs() const { return kiln_model_num_inputs(m_); }
  int num_outputs() const { return kiln_model_num_outputs(m_); }
  kiln_tensor_info input(int i) const { return info(i, kiln_model_input); }
  kiln_tensor_info output(int i) const { return info(i, kiln_model_output); }
  // A dim's symbolic name in the source model ("batch_size"), "" for a fixed dim.
  std::string input_dim_name(int i, int dim) const {
    const char* n = kiln_model_input_dim_name(m_, i, dim);
    return n ? n : "";
  }
  std::string output_dim_name(int i, int dim) const {
    const char* n = kiln_model_output_dim_name(m_, i, dim);
    return n ? n : "";
  }
  // Safe from several threads at once (see kiln_runtime.h).
  void run(const std::vector<const void*>& inputs, const std::vector<void*>& outputs) {
    if (kiln_model_run(m_, inputs.data(), inputs.size(), outputs.data(), outputs.size()) != 0)
      throw Error(kiln_last_error());
  }

 private:
  kiln_tensor_info info(int i, int (*get)(const kiln_model*, int, kiln_tensor_info*)) const {
    kiln_tensor_info t;
    if (get(m_, i, &t) != 0) throw Error(kiln_last_error());
    return t;
  }
  kiln_model* m_;
};

}  // namespace kiln::runtime
