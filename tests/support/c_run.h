// Runs a package through the C example (examples/c_run, linked against the runtime alone) in a
// separate process with a bare environment: no compiler or Python on PATH (PATH names an empty
// place), HOME an empty directory (no ~/.cache/kiln), no KILN_CACHE_DIR; `extra_env` adds what
// the caller needs (a thread count, a library path). Inputs go in as raw files, outputs come back
// as tensors of `like`'s dtypes and shapes (undefined when the program failed or wrote another
// size). Used by the CPU and CUDA package tests.
#pragma once
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "files.h"
#include "process.h"

namespace kiln::test {

struct CRunResult {
  int status = -1;     // the program's exit status
  TensorList outputs;  // one per `like`
};

inline CRunResult run_c_example(const std::string& runner, const std::string& package,
                                const TensorList& inputs, const TensorList& like,
                                const std::string& dir, std::vector<std::string> extra_env) {
  std::vector<std::string> args = {runner, package};
  for (size_t i = 0; i < inputs.size(); ++i) {
    Tensor in = inputs[i].contiguous();
    std::string f = dir + "/in" + std::to_string(i) + ".bin";
    std::ofstream(f, std::ios::binary)
        .write(static_cast<const char*>(in.raw_data()), std::streamsize(in.nbytes()));
    args.push_back("-i");
    args.push_back(f);
  }
  args.push_back("-o");
  args.push_back(dir + "/out");
  std::string home = dir + "/home";
  std::filesystem::create_directories(home);
  std::vector<std::string> env = {"PATH=" + dir + "/nothing", "HOME=" + home};
  for (std::string& e : extra_env) env.push_back(std::move(e));
  CRunResult r;
  r.status = run_with_env(args, env);
  for (size_t i = 0; i < like.size(); ++i) {
    std::string bytes = read_bytes(dir + "/out" + std::to_string(i) + ".bin");
    Tensor got;
    if (r.status == 0 && bytes.size() == size_t(like[i].nbytes())) {
      got = Tensor::empty(like[i].sizes(), like[i].dtype());
      std::memcpy(got.raw_data(), bytes.data(), bytes.size());
    }
    r.outputs.push_back(got);
  }
  return r;
}

}  // namespace kiln::test
