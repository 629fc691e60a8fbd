// One compiled CUDA model called from several threads at once (Note [Execution contexts] in
// runtime/executable.cc): each calling thread takes an execution context — its own arena,
// stream, input staging and CUDA graph — while cuBLASLt and cuDNN plans are shared and guard
// what they change per call (the bias pointer, the cuDNN variant pack) with a lock. Every
// result must be bitwise the one a single thread gets for the same inputs: a context that
// shared an arena or a stream with another, or a library plan that enqueued with another
// call's pointers, shows up as a difference. The CPU's concurrency tests are
// tests/e2e/concurrent_calls_test.cc. CudaStreamOrder.* checks the ordering of a call with eager
// work on the legacy stream.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "../support/compare.h"
#include "capture/compile.h"
#include "core/cuda_runtime.h"
#include "nn/compile.h"
#include "nn/models/zoo.h"
#include "ops/api.h"

using namespace kiln;

namespace {

struct Case {
  const char* model;
  const char* mode;
  DType precision;
};

class CudaConcurrentCalls : public testing::TestWithParam<Case> {};

TEST_P(CudaConcurrentCalls, FourThreadsGetBitwiseTheSingleThreadResults) {
  const Case c = GetParam();
  const Device cuda = Device::cuda(0);
  constexpr int kThreads = 4, kSets = 2, kRounds = 3;
  nn::ZooModel model = nn::make_zoo_model(c.model, /*batch=*/1, /*seed=*/11);
  model.module->to(cuda);
  CompileOptions co;
  co.mode = c.mode;
  co.precision = c.precision;
  CompiledFunction f = compile(model.module, co);

  // Per thread, kSets input sets of fresh random values, and what one thread alone gets for
  // each.
  std::vector<std::vector<TensorList>> in(kThreads, std::vector<TensorList>(kSets));
  std::vector<std::vector<TensorList>> want(kThreads, std::vector<TensorList>(kSets));
  Generator gen(77);
  for (int t = 0; t < kThreads; ++t)
    for (int s = 0; s < kSets; ++s) {
      for (const Tensor& x : model.inputs) {
        Tensor v = x;
        if (is_floating(x.dtype())) {
          v = Tensor::randn(x.sizes(), gen, x.dtype());
        } else {  // token ids: fresh ones in the zoo's range; a 0/1 mask as it is
          std::vector<double> vals = x.to_vector<double>();
          int64_t lo = int64_t(*std::min_element(vals.begin(), vals.end()));
          int64_t hi = int64_t(*std::max_element(vals.begin(), vals.end()));
          if (hi > 1) v = Tensor::randint(x.sizes(), gen, lo, hi + 1, x.dtype());
        }
        in[t][s].push_back(v.to(cuda));
      }
      for (const Tensor& y : f(in[t][s])) {
        ASSERT_EQ(y.device(), cuda) << c.model;
        Tensor host = y.to(Device::cpu());
        if (is_floating(host.dtype())) {
          ASSERT_TRUE(test::usable_reference(host)) << c.model;
        }
        want[t][s].push_back(host);
      }
    }
  // Distinct inputs give distinct outputs (else the comparison below could not tell threads
  // apart).
  ASSERT_NE(test::first_byte_difference(want[0][0][0], want[1][0][0]), "") << c.model;

  std::vector<std::string> errors(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      try {
        TensorList out;
        for (int r = 0; r < kRounds; ++r)
          for (int s = 0; s < kSets; ++s) {
            f.run_into(in[t][s], out);
            for (size_t i = 0; i < out.size(); ++i) {
              std::string d = test::first_byte_difference(out[i].to(Device::cpu()), want[t][s][i]);
              if (!d.empty() && errors[t].empty())
                errors[t] = "round " + std::to_string(r) + " set " + std::to_string(s) +
                            " output " + std::to_string(i) + ": " + d;
            }
          }
      } catch (const std::exception& e) {
        errors[t] = std::string("threw: ") + e.what();
      }
    });
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t)
    EXPECT_EQ(errors[t], "") << c.model << " " << c.mode << " " << dtype_name(c.precision)
                             << ": thread " << t;
}

// One thread keeps capturing reduce-overhead graphs of resnet18 (a new compiled function each
// time: its first call captures every cuDNN convolution into the context's graph) while another
// calls a default-mode resnet18 with a new device input each time (its first convolution reads
// the input in place, so it calls cuDNN directly every call, on the one shared cuDNN handle).
// The handle must never be left on a stream that is being captured (cudnn_backend.cc,
// GraphPlans::execute); every result bitwise its single-thread value.
TEST(CudaConcurrentCalls, ReduceOverheadCapturesBesideDefaultModeCudnnCalls) {
  const Device cuda = Device::cuda(0);
  nn::ZooModel model = nn::make_zoo_model("resnet18", /*batch=*/1, /*seed=*/13);
  model.module->to(cuda);
  CompileOptions co;
  co.strict = true;
  CompiledFunction direct = compile(model.module, co);
  Generator gen(41);
  constexpr int kInputs = 6;
  std::vector<Tensor> in;
  std::vector<Tensor> want;
  for (int i = 0; i < kInputs; ++i) {
    in.push_back(Tensor::randn(model.inputs[0].sizes(), gen).to(cuda));
    want.push_back(direct({in.back()})[0].to(Device::cpu()));
  }
  ASSERT_TRUE(test::usable_reference(want[0]));
  std::atomic<bool> done{false};
  std::string err_a, err_b;
  std::thread a([&] {
    try {
      CompileOptions ro = co;
      ro.mode = "reduce-overhead";
      for (int k = 0; k < 6; ++k) {
        CompiledFunction f = compile(model.module, ro);
        std::string d = test::first_byte_difference(f({in[size_t(k)]})[0].to(Device::cpu()), want[size_t(k)]);
        if (!d.empty() && err_a.empty()) err_a = "capture " + std::to_string(k) + ": " + d;
      }
    } catch (const std::exception& e) {
      err_a = std::string("threw: ") + e.what();
    }
    done = true;
  });
  std::thread b([&] {
    try {
      int calls = 0;
      while (!done || calls < 12) {
        const int i = calls++ % kInputs;
        Tensor fresh = in[size_t(i)].clone();  // a new address every call
        std::string d = test::first_byte_difference(direct({fresh})[0].to(Device::cpu()), want[size_t(i)]);
        if (!d.empty() && err_b.empty()) err_b = "call " + std::to_string(calls) + ": " + d;
      }
    } catch (const std::exception& e) {
      err_b = std::string("threw: ") + e.what();
    }
  });
  a.join();
  b.join();
  EXPECT_EQ(err_a, "") << "reduce-overhead thread";
  EXPECT_EQ(err_b, "") << "default-mode thread";
}

// relu(x) * 2 compiled for `mode`: the stream-order tests' graph (generated kernels only, so its
// context's stream is non-blocking).
CompiledFunction compile_relu_twice(const char* mode) {
  CompileOptions co;
  co.strict = true;
  co.mode = mode;
  return compile([](const TensorList& in) { return TensorList{relu(in[0]) * 2.0}; }, co);
}

// Note [CUDA streams of contexts]: a compiled call runs on a non-blocking stream, so it must wait
// explicitly for eager work still queued on the legacy stream that writes its device input.
// Each eager producer below is long (a chain over 16M elements) and nothing synchronizes
// between it and the compiled call. The other half of the rule (eager work still reading a
// device output buffer that run_into overwrites) is CompiledCallsWaitForEagerReadersOfTheirOutputs.
TEST(CudaStreamOrder, CompiledCallsWaitForEagerWorkOnTheirDeviceTensors) {
  const Device cuda = Device::cuda(0);
  for (const char* mode : {"default", "reduce-overhead"}) {
    CompiledFunction f = compile_relu_twice(mode);
    Generator gen(9);
    Tensor host = Tensor::randn({1 << 24}, gen);
    Tensor dev = host.to(cuda);
    TensorList out;
    f.run_into({dev}, out);  // compiles, makes the context and (reduce-overhead) captures
    for (int round = 0; round < 3; ++round) {
      // The input is rewritten by eager kernels queued just before the call.
      Tensor x = exp(mul(dev, 1e-3 * (round + 1)));
      for (int k = 0; k < 8; ++k) x = add(mul(x, 0.5), 0.25);
      f.run_into({x}, out);
      Tensor want = mul(relu(x), 2.0).to(Device::cpu());  // eager on the device, then synchronized
      EXPECT_EQ(test::first_byte_difference(out[0].to(Device::cpu()), want), "") << mode << " round " << round;
    }
  }
}

// A non-contiguous device input is gathered into a contiguous temporary on the legacy stream
// inside the call, after the call's wait on the legacy stream: the copy into the context's
// staging buffer must wait for that gather too. (Found by the op harness's non-contiguous
// samples of conv2d and attention, which run through compiled executables, when context streams
// became non-blocking.) A large transposed input makes the gather long.
TEST(CudaStreamOrder, NonContiguousDeviceInputsAreGatheredBeforeTheyAreCopiedIn) {
  const Device cuda = Device::cuda(0);
  for (const char* mode : {"default", "reduce-overhead"}) {
    CompiledFunction f = compile_relu_twice(mode);
    Generator gen(23);
    for (int round = 0; round < 3; ++round) {
      Tensor x = Tensor::randn({4096, 4096}, gen).to(cuda);
      Tensor xt = transpose(x, 0, 1);  // a view: non-contiguous
      ASSERT_FALSE(xt.is_contiguous());
      TensorList out = f({xt});
      Tensor want = mul(relu(xt.contiguous()), 2.0).to(Device::cpu());
      EXPECT_EQ(test::first_byte_difference(out[0].to(Device::cpu()), want), "") << mode << " round " << round;
    }
  }
}

// The output half: eager work queued on the legacy stream still reads the device tensor that the
// next run_into overwrites. A long eager chain on an unrelated tensor goes first, so that the
// reader runs late; the compiled call must not write the output before the reader has read it.
TEST(CudaStreamOrder, CompiledCallsWaitForEagerReadersOfTheirOutputs) {
  const Device cuda = Device::cuda(0);
  for (const char* mode : {"default", "reduce-overhead"}) {
    CompiledFunction f = compile_relu_twice(mode);
    Generator gen(19);
    constexpr int64_t kN = 1 << 22;
    Tensor busy = Tensor::randn({1 << 24}, gen).to(cuda);
    std::vector<Tensor> inputs;
    for (int round = 0; round < 4; ++round) inputs.push_back(Tensor::randn({kN}, gen).to(cuda));
    TensorList out;
    f.run_into({inputs[0]}, out);  // compiles, makes the context and (reduce-overhead) captures
    ASSERT_EQ(out[0].device(), cuda);
    for (int round = 1; round < 4; ++round) {
      // What the reader must see: the output of the previous call, copied after a full sync.
      Tensor before = out[0].to(Device::cpu());
      Tensor y = busy;
      for (int k = 0; k < 12; ++k) y = add(mul(y, 0.5), 0.25);  // ~12 passes over 64 MiB
      Tensor read = mul(out[0], 3.0);  // queued after the chain: reads the old output late
      f.run_into({inputs[size_t(round)]}, out);
      Tensor want = mul(before, 3.0);
      EXPECT_EQ(test::first_byte_difference(read.to(Device::cpu()), want), "") << mode << " round " << round;
      // And the call itself computed the new output.
      Tensor now = mul(relu(inputs[size_t(round)]), 2.0).to(Device::cpu());
      EXPECT_EQ(test::first_byte_difference(out[0].to(Device::cpu()), now), "") << mode << " round " << round;
      ASSERT_NE(test::first_byte_difference(before, now), "");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Zoo, CudaConcurrentCalls,
    testing::Values(Case{"resnet18", "default", DType::Float32},
                    Case{"resnet18", "reduce-overhead", DType::Float32},
                    Case{"vit_b_16", "reduce-overhead", DType::BFloat16},  // cuDNN attention
                    Case{"bert_base", "default", DType::Float32},          // flash kernel, mask
                    Case{"branchy", "reduce-overhead", DType::Float32}),   // graph breaks
    [](const testing::TestParamInfo<Case>& i) {
      std::string n = std::string(i.param.model) + "_" + i.param.mode + "_" + dtype_name(i.param.precision);
      for (char& ch : n)
        if (ch == '-') ch = '_';
      return n;
    });

}  // namespace
