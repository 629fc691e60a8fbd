// Kiln's C++ API: tensors, the op functions, modules and layers, kiln::compile and explain,
// and the runtime's Executable. One include for a C++ user:
//
//   #include <kiln/kiln.h>
//
//   struct Net : kiln::nn::UnaryModule {
//     std::shared_ptr<kiln::nn::Linear> fc =
//         register_module("fc", std::make_shared<kiln::nn::Linear>(4, 2));
//     kiln::Tensor forward(const kiln::Tensor& x) override { return kiln::relu(fc->forward(x)); }
//   };
//   auto net = std::make_shared<Net>();
//   kiln::CompiledFunction f = kiln::compile(net);   // the compiler ("inductor"), default mode
//   kiln::TensorList y = f({x});
//
// Link with Kiln::kiln (CMake: find_package(Kiln)) or `pkg-config --libs kiln`. The headers
// under kiln/detail/ are Kiln's own layers; this file is the supported entry point (docs/cpp.md).
#pragma once

#include "core/device.h"      // Device
#include "core/dtype.h"       // DType
#include "core/error.h"       // kiln::Error
#include "core/tensor.h"      // Tensor, TensorList, Generator
#include "ops/api.h"          // kiln::add, kiln::matmul, kiln::conv2d, ... (eager, op by op)
#include "nn/module.h"        // nn::Module
#include "nn/layers.h"        // nn::Linear, nn::Conv2d, nn::BatchNorm2d, nn::LayerNorm, ...
#include "nn/safetensors.h"   // load/save weights
#include "nn/compile.h"       // kiln::compile(module)
#include "capture/compile.h"  // kiln::compile(fn), CompileOptions, CompiledFunction, explain
#include "kiln/runtime.h"     // Executable, .npy I/O
#include "kiln/version.h"     // KILN_VERSION (generated)

namespace kiln {
// The library's version, "MAJOR.MINOR.PATCH".
inline constexpr const char* kVersion = KILN_VERSION;
}  // namespace kiln
