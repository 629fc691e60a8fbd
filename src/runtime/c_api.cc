// The runtime's C API (include/kiln/kiln_runtime.h) over load_package and
// Executable::run_buffers, which binds the caller's buffers directly: a steady-state call
// allocates nothing in Kiln's code (oneDNN's execute() allocates a few small objects itself).
#include "kiln/kiln_runtime.h"

#include <cstring>
#include <string>
#include <vector>

#include "core/error.h"
#include "runtime/package.h"

struct kiln_model {
  kiln::LoadedPackage package;
  std::vector<std::string> input_dtypes, output_dtypes;  // kiln_tensor_info's strings
};

namespace {

thread_local std::string t_last_error;

void set_error(const char* what) { t_last_error = what; }

void fill(const std::string& name, kiln::DType dtype, const kiln::Dims& sizes,
          kiln_tensor_info* info) {
  info->name = name.c_str();
  info->dtype = kiln::dtype_name(dtype);
  info->rank = int32_t(sizes.size());
  size_t bytes = size_t(kiln::dtype_size(dtype));
  for (size_t d = 0; d < sizes.size() && d < KILN_MAX_RANK; ++d) {
    info->shape[d] = sizes[d];
    bytes *= size_t(sizes[d]);
  }
  info->bytes = bytes;
}

}  // namespace

extern "C" {

int kiln_runtime_format_version(void) { return int(kiln::kPackageFormatVersion); }

kiln_model* kiln_model_open(const char* path) {
  try {
    if (!path) throw std::invalid_argument("kiln_model_open: path is NULL");
    auto* m = new kiln_model;
    try {
      m->package = kiln::load_package(path);
    } catch (...) {
      delete m;
      throw;
    }
    return m;
  } catch (const std::exception& e) {
    set_error(e.what());
    return nullptr;
  }
}

void kiln_model_close(kiln_model* model) { delete model; }

int kiln_model_num_inputs(const kiln_model* m) {
  return m ? int(m->package.exe->inputs.size()) : 0;
}
int kiln_model_num_outputs(const kiln_model* m) {
  return m ? int(m->package.exe->outputs.size()) : 0;
}

int kiln_model_input(const kiln_model* m, int i, kiln_tensor_info* info) {
  if (!m || !info || i < 0 || size_t(i) >= m->package.exe->inputs.size()) {
    set_error("kiln_model_input: index out of range");
    return -1;
  }
  const auto& s = m->package.exe->inputs[size_t(i)];
  fill(s.name, s.dtype, s.sizes, info);
  return 0;
}

int kiln_model_output(const kiln_model* m, int i, kiln_tensor_info* info) {
  if (!m || !info || i < 0 || size_t(i) >= m->package.exe->outputs.size()) {
    set_error("kiln_model_output: index out of range");
    return -1;
  }
  const auto& s = m->package.exe->outputs[size_t(i)];
  fill(s.name, s.dtype, s.sizes, info);
  return 0;
}

namespace {
const char* dim_name(const std::vector<std::string>& names, int dim) {
  if (dim < 0 || size_t(dim) >= names.size() || names[size_t(dim)].empty()) return nullptr;
  return names[size_t(dim)].c_str();
}
}  // namespace

const char* kiln_model_input_dim_name(const kiln_model* m, int i, int dim) {
  if (!m || i < 0 || size_t(i) >= m->package.exe->inputs.size()) return nullptr;
  return dim_name(m->package.exe->inputs[size_t(i)].dim_names, dim);
}

const char* kiln_model_output_dim_name(const kiln_model* m, int i, int dim) {
  if (!m || i < 0 || size_t(i) >= m->package.exe->outputs.size()) return nullptr;
  return dim_name(m->package.exe->outputs[size_t(i)].dim_names, dim);
}

int kiln_model_run(kiln_model* m, const void* const* inputs, size_t num_inputs,
                   void* const* outputs, size_t num_outputs) {
  try {
    if (!m) throw std::invalid_argument("kiln_model_run: model is NULL");
    kiln::Executable& exe = *m->package.exe;
    if (num_inputs != exe.inputs.size() || num_outputs != exe.outputs.size())
      throw std::invalid_argument("kiln_model_run: the model takes " +
                                  std::to_string(exe.inputs.size()) + " inputs and " +
                                  std::to_string(exe.outputs.size()) + " outputs");
    exe.run_buffers(inputs, num_inputs, outputs, num_outputs);
    return 0;
  } catch (const std::exception& e) {
    set_error(e.what());
    return -1;
  }
}

const char* kiln_last_error(void) { return t_last_error.c_str(); }

}  // extern "C"
