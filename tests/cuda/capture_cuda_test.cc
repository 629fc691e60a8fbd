// Capture with CUDA inputs: the device guard recompiles, and the replay runs on the device.
#include <gtest/gtest.h>

#include "capture/compile.h"
#include "nn/compile.h"
#include "ops/api.h"

using namespace kiln;

TEST(CaptureCuda, DeviceChangeRecompilesAndRunsOnTheDevice) {
  Generator g(21);
  CompiledFunction f = compile([](const TensorList& in) { return TensorList{relu(in[0] + in[0])}; });
  Tensor x = Tensor::randn({257, 33}, g);
  Tensor cpu_out = f({x})[0];
  Tensor xc = x.to(Device::cuda(0));
  Tensor cuda_out = f({xc})[0];
  EXPECT_EQ(cuda_out.device(), Device::cuda(0));
  EXPECT_EQ(cuda_out.to(Device::cpu()).to_vector<float>(), cpu_out.to_vector<float>());
  auto r = f.report();
  ASSERT_FALSE(r.recompiles.empty());
  EXPECT_EQ(r.recompiles.back(), "input 0: device expected cpu, got cuda:0");
  // Both entries replay without tracing.
  f({x});
  f({xc});
  EXPECT_EQ(f.stats().traces, 2);
}
