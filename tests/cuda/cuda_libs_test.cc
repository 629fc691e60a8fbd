// The CUDA target's library layer on the GPU (src/targets/cuda): the driver wrapper and NVRTC
// (compile, load, launch, errors), cuBLASLt GEMMs, cuDNN convolutions and cuDNN attention, each
// against a float64 CPU reference on fresh random inputs. Part of kiln_cuda_tests (main() in
// cuda_test.cc exits 77 without a GPU); the no-GPU half lives in tests/unit/cuda_nvrtc_test.cc.
//
// Tolerances, as max|got - ref| <= tol * max|ref| over the whole output (the reference is
// computed from the inputs as rounded to the dtype, so only the computation's error counts):
//   float32: 1e-5 (f32 accumulation, no TF32: a TF32 engine would miss this by ~50x for
//            K ~ 2000), 1e-3 with cuBLASLt's GELU epilogue (its tanh may be the hardware
//            approximation, 2^-11 relative; GemmGelu.IsTheTanhForm checks the form);
//   float16: 1e-2, bfloat16: 1e-2 (f32 accumulation; the output's own rounding is 2^-11 / 2^-8).
// A NaN where the reference has none (or the reverse) always fails.
#include <gtest/gtest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "core/cuda_runtime.h"
#include "core/dtype.h"
#include "core/error.h"
#include "kernels/cuda/cublaslt_gemm.h"
#include "kernels/cuda/cudnn_backend.h"
#include "kernels/cuda/cuda_driver.h"
#include "kernels/cuda/cudnn_conv.h"
#include "kernels/cuda/cudnn_sdpa.h"
#include "targets/cuda/nvrtc.h"
#include "../support/compare.h"
#include "../support/files.h"

namespace kiln {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
const DType kDTypes[] = {DType::Float32, DType::Float16, DType::BFloat16};
const DType kHalfDTypes[] = {DType::Float16, DType::BFloat16};

double tolerance(DType d) { return d == DType::Float32 ? 1e-5 : 1e-2; }

// ---- host data -------------------------------------------------------------------------------

std::mt19937_64 rng_for_test() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  return std::mt19937_64(std::hash<std::string>()(std::string(info->test_suite_name()) + "." +
                                                  info->name()));
}

std::vector<double> randn(size_t n, std::mt19937_64& g, double scale = 1.0) {
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<double> v(n);
  for (double& x : v) x = dist(g);
  return v;
}

std::string encode(const std::vector<double>& v, DType d) {
  std::string bytes(v.size() * size_t(dtype_size(d)), '\0');
  for (size_t i = 0; i < v.size(); ++i) {
    const float f = float(v[i]);
    if (d == DType::Float32) {
      std::memcpy(&bytes[i * 4], &f, 4);
    } else if (d == DType::Float16) {
      const uint16_t b = Half::from_float(f);
      std::memcpy(&bytes[i * 2], &b, 2);
    } else {
      const uint16_t b = BFloat16::from_float(f);
      std::memcpy(&bytes[i * 2], &b, 2);
    }
  }
  return bytes;
}

std::vector<double> decode(const std::string& bytes, DType d) {
  const size_t n = bytes.size() / size_t(dtype_size(d));
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) {
    if (d == DType::Float32) {
      float f;
      std::memcpy(&f, &bytes[i * 4], 4);
      v[i] = f;
    } else {
      uint16_t b;
      std::memcpy(&b, &bytes[i * 2], 2);
      v[i] = d == DType::Float16 ? Half::to_float(b) : BFloat16::to_float(b);
    }
  }
  return v;
}

// The values as the GPU sees them after rounding to `d`.
std::vector<double> rounded(const std::vector<double>& v, DType d) {
  return decode(encode(v, d), d);
}

// ---- device memory ---------------------------------------------------------------------------

class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes) check_cuda(cudaMalloc(&ptr_, bytes), "cudaMalloc (test buffer)");
  }
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

std::unique_ptr<DeviceBuffer> upload(const std::vector<double>& v, DType d) {
  const std::string bytes = encode(v, d);
  auto buf = std::make_unique<DeviceBuffer>(std::max<size_t>(bytes.size(), 1));
  check_cuda(cudaMemcpy(buf->get(), bytes.data(), bytes.size(), cudaMemcpyHostToDevice),
             "cudaMemcpy (upload)");
  return buf;
}

std::vector<double> download(const DeviceBuffer& buf, size_t n, DType d) {
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize (before download)");
  std::string bytes(n * size_t(dtype_size(d)), '\0');
  check_cuda(cudaMemcpy(bytes.data(), buf.get(), bytes.size(), cudaMemcpyDeviceToHost),
             "cudaMemcpy (download)");
  return decode(bytes, d);
}

// NaN-filled output buffers: an element the library forgets to write fails the comparison.
std::unique_ptr<DeviceBuffer> nan_buffer(size_t n, DType d) {
  return upload(std::vector<double>(n, kNaN), d);
}

// |got - ref| <= tol * max|ref| everywhere (tests/support/compare.h).
::testing::AssertionResult close_to(const std::vector<double>& got,
                                    const std::vector<double>& ref, double tol,
                                    const std::string& what) {
  ::testing::AssertionResult r = test::close(
      got, ref, test::Tolerance::of_scale(std::max(test::max_abs(ref), 1e-30), tol));
  if (!r) return ::testing::AssertionFailure() << what << ": " << r.message();
  return r;
}

template <typename F>
Error error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e;
  }
  return Error(ErrorKind::Internal, "<no error>");
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// ---- driver + NVRTC --------------------------------------------------------------------------

const char* kKernelSource = R"(#include <cuda_fp16.h>

// kiln-kernel: k_axpy
extern "C" __global__ void k_axpy(int n, float a, const float* x, float* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a * x[i] + y[i];
}

// kiln-kernel: k_half_relu
extern "C" __global__ void k_half_relu(int n, const __half* x, __half* y) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    float v = __half2float(x[i]);
    y[i] = __float2half(v != v ? v : (v > 0.0f ? v : 0.0f));
  }
}

// kiln-kernel: k_block_sum
// Sums each block's slice through dynamic shared memory (one float per thread).
extern "C" __global__ void k_block_sum(const float* x, float* out) {
  extern __shared__ float tile[];
  tile[threadIdx.x] = x[blockIdx.x * blockDim.x + threadIdx.x];
  __syncthreads();
  if (threadIdx.x == 0) {
    float s = 0;
    for (unsigned i = 0; i < blockDim.x; ++i) s += tile[i];
    out[blockIdx.x] = s;
  }
}
)";

std::shared_ptr<cuda::CudaModule> load_test_module() {
  cuda::CudaCompileRequest req;
  req.source = kKernelSource;
  req.program_name = "cuda_libs_test";
  req.arch = cuda::device_arch(0);
  auto cubin = cuda::compile_cuda(req);
  return cuda::CudaModule::load(cubin->cubin, 0, "cuda_libs_test");
}

TEST(CudaDriver, CompileLoadLaunchAndCheckResults) {
  std::string why;
  ASSERT_TRUE(cuda::driver_available(&why)) << why;
  EXPECT_TRUE(contains(cuda::device_arch(0), "sm_"));
  auto module = load_test_module();
  cuda::CudaKernel axpy = module->kernel("k_axpy");
  EXPECT_TRUE(module->has_kernel("k_half_relu"));
  EXPECT_FALSE(module->has_kernel("k_missing"));
  const cuda::KernelAttributes attrs = axpy.attributes();
  EXPECT_GT(attrs.registers_per_thread, 0);
  EXPECT_GE(attrs.max_threads_per_block, 256);

  auto g = rng_for_test();
  const int n = 10007;
  const auto x = randn(n, g), y0 = randn(n, g);
  auto dx = upload(x, DType::Float32), dy = upload(y0, DType::Float32);
  float a = 1.75f;
  void* px = dx->get();
  void* py = dy->get();
  int nn = n;
  void* args[] = {&nn, &a, &px, &py};
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  axpy.launch({.grid = {unsigned((n + 255) / 256)}, .block = {256}, .stream = stream}, args);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  cudaStreamDestroy(stream);
  std::vector<double> ref(n);
  for (int i = 0; i < n; ++i) ref[size_t(i)] = double(float(a * float(x[size_t(i)]) + float(y0[size_t(i)])));
  EXPECT_TRUE(close_to(download(*dy, n, DType::Float32), ref, 1e-6, "k_axpy"));

  // Half relu keeps NaN (Kiln's relu semantics in generated code).
  std::vector<double> h = randn(1000, g);
  h[3] = kNaN;
  auto dh = upload(h, DType::Float16), dr = nan_buffer(1000, DType::Float16);
  void* ph = dh->get();
  void* pr = dr->get();
  int hn = 1000;
  void* hargs[] = {&hn, &ph, &pr};
  module->kernel("k_half_relu").launch({.grid = {4}, .block = {256}}, hargs);
  std::vector<double> href = rounded(h, DType::Float16);
  for (double& v : href) v = std::isnan(v) ? v : std::max(v, 0.0);
  EXPECT_TRUE(close_to(download(*dr, 1000, DType::Float16), href, 0, "k_half_relu"));
}

TEST(CudaDriver, DynamicSharedMemoryAbove48KiB) {
  auto module = load_test_module();
  cuda::CudaKernel k = module->kernel("k_block_sum");
  const unsigned threads = 1024, blocks = 3;
  const unsigned shared = 64 * 1024;  // more than the 48 KiB default limit
  auto g = rng_for_test();
  const auto x = randn(threads * blocks, g);
  auto dx = upload(x, DType::Float32), dout = nan_buffer(blocks, DType::Float32);
  void* px = dx->get();
  void* po = dout->get();
  void* args[] = {&px, &po};
  const Error before = error_of(
      [&] { k.launch({.grid = {blocks}, .block = {threads}, .shared_bytes = shared}, args); });
  EXPECT_TRUE(contains(before.message(), "k_block_sum")) << before.message();
  k.set_max_dynamic_shared_bytes(int(shared));
  EXPECT_GE(k.attributes().max_dynamic_shared_bytes, int(shared));
  k.launch({.grid = {blocks}, .block = {threads}, .shared_bytes = shared}, args);
  std::vector<double> ref(blocks, 0.0);
  for (unsigned b = 0; b < blocks; ++b) {
    float s = 0;  // the kernel's own order, in float
    for (unsigned i = 0; i < threads; ++i) s += float(x[b * threads + i]);
    ref[b] = s;
  }
  EXPECT_TRUE(close_to(download(*dout, blocks, DType::Float32), ref, 1e-6, "k_block_sum"));
}

TEST(CudaDriver, ErrorsNameKernelModuleAndGeometry) {
  auto module = load_test_module();
  const Error missing = error_of([&] { module->kernel("k_not_there"); });
  EXPECT_TRUE(contains(missing.message(), "'k_not_there'")) << missing.message();
  EXPECT_TRUE(contains(missing.message(), "'cuda_libs_test'")) << missing.message();

  cuda::CudaKernel axpy = module->kernel("k_axpy");
  int n = 1;
  float a = 1;
  void* p = nullptr;
  void* args[] = {&n, &a, &p, &p};
  const Error bad = error_of([&] { axpy.launch({.grid = {1}, .block = {4096}}, args); });
  EXPECT_EQ(bad.kind(), ErrorKind::Runtime) << bad.message();
  EXPECT_TRUE(contains(bad.message(), "kernel 'k_axpy' of module 'cuda_libs_test'"))
      << bad.message();
  EXPECT_TRUE(contains(bad.message(), "block 4096x1x1")) << bad.message();

  // A cubin for another architecture does not load, and the error says so.
  cuda::CudaCompileRequest other;
  other.source = kKernelSource;
  other.program_name = "other_arch";
  other.arch = cuda::device_arch(0) == "sm_90" ? "sm_80" : "sm_90";
  auto cubin = cuda::compile_cuda(other);
  const Error wrong = error_of([&] { cuda::CudaModule::load(cubin->cubin, 0, "other_arch"); });
  EXPECT_TRUE(contains(wrong.message(), "loading CUDA module 'other_arch'")) << wrong.message();
  EXPECT_TRUE(contains(wrong.message(), cuda::device_arch(0))) << wrong.message();
}

// ---- cuBLASLt --------------------------------------------------------------------------------

double gelu_tanh(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}
double gelu_erf(double x) { return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))); }

struct GemmData {
  std::vector<double> a, b, c, bias;  // rounded to the dtype
};

// D = act(alpha * op(A) op(B) + beta * C + bias) in float64, Kiln's semantics (relu keeps NaN).
std::vector<double> gemm_reference(const cuda::GemmDesc& g, const GemmData& in) {
  const int64_t lda = g.lda ? g.lda : (g.trans_a ? g.m : g.k);
  const int64_t ldb = g.ldb ? g.ldb : (g.trans_b ? g.k : g.n);
  const int64_t ldc = g.ldc ? g.ldc : g.n;
  const int64_t ldd = g.ldd ? g.ldd : g.n;
  const int64_t sa = g.stride_a >= 0 ? g.stride_a : (g.trans_a ? g.k : g.m) * lda;
  const int64_t sb = g.stride_b >= 0 ? g.stride_b : (g.trans_b ? g.n : g.k) * ldb;
  const int64_t sc = g.stride_c >= 0 ? g.stride_c : g.m * ldc;
  const int64_t sd = g.stride_d >= 0 ? g.stride_d : g.m * ldd;
  std::vector<double> d(size_t((g.batch - 1) * sd + g.m * ldd), kNaN);
  for (int64_t bt = 0; bt < g.batch; ++bt)
    for (int64_t i = 0; i < g.m; ++i)
      for (int64_t j = 0; j < g.n; ++j) {
        double acc = 0;
        for (int64_t p = 0; p < g.k; ++p) {
          const double av = in.a[size_t(bt * sa + (g.trans_a ? p * lda + i : i * lda + p))];
          const double bv = in.b[size_t(bt * sb + (g.trans_b ? j * ldb + p : p * ldb + j))];
          acc += av * bv;
        }
        double v = double(g.alpha) * acc;
        if (g.beta != 0) v += double(g.beta) * in.c[size_t(bt * sc + i * ldc + j)];
        if (cuda::gemm_epilogue_has_bias(g.epilogue)) v += in.bias[size_t(j)];
        switch (g.epilogue) {
          case cuda::GemmEpilogue::Relu:
          case cuda::GemmEpilogue::BiasRelu: v = std::isnan(v) ? v : std::max(v, 0.0); break;
          case cuda::GemmEpilogue::Gelu:
          case cuda::GemmEpilogue::BiasGelu: v = gelu_tanh(v); break;
          default: break;
        }
        d[size_t(bt * sd + i * ldd + j)] = v;
      }
  return d;
}

size_t span_of(int64_t batch, int64_t stride, int64_t rows, int64_t ld) {
  return size_t((batch - 1) * stride + rows * ld);
}

// Runs `g` through a plan (the default algorithm, or `algo`) on fresh inputs and compares.
::testing::AssertionResult check_gemm(const cuda::GemmDesc& g, std::mt19937_64& rng,
                                      const cuda::GemmAlgo* algo = nullptr,
                                      bool in_place_c = false) {
  auto plan = cuda::GemmPlan::create(g);
  const cuda::GemmDesc& r = plan->desc();  // strides resolved
  GemmData in;
  in.a = rounded(randn(span_of(r.stride_a ? r.batch : 1, r.stride_a, r.trans_a ? r.k : r.m, r.lda), rng), r.dtype);
  in.b = rounded(randn(span_of(r.stride_b ? r.batch : 1, r.stride_b, r.trans_b ? r.n : r.k, r.ldb), rng), r.dtype);
  in.c = rounded(randn(span_of(r.stride_c ? r.batch : 1, r.stride_c, r.m, r.ldc), rng), r.dtype);
  in.bias = rounded(randn(size_t(r.n), rng), r.dtype);
  const size_t d_elems = span_of(r.batch, r.stride_d, r.m, r.ldd);
  auto da = upload(in.a, r.dtype), db = upload(in.b, r.dtype), dbias = upload(in.bias, r.dtype);
  std::unique_ptr<DeviceBuffer> dc, dd;
  if (in_place_c) {
    std::vector<double> c_full = in.c;
    c_full.resize(d_elems, 0.0);
    in.c = c_full;
    dd = upload(in.c, r.dtype);
  } else {
    dc = upload(in.c, r.dtype);
    dd = nan_buffer(d_elems, r.dtype);
  }
  const cuda::GemmAlgo& use = algo ? *algo : plan->algo();
  DeviceBuffer ws(use.workspace_bytes);
  cuda::GemmArgs args{.a = da->get(), .b = db->get(), .c = in_place_c ? dd->get() : dc->get(),
                      .d = dd->get(), .bias = dbias->get(), .workspace = ws.get(),
                      .workspace_bytes = ws.bytes()};
  plan->run(args, use);
  std::vector<double> got = download(*dd, d_elems, r.dtype);
  std::vector<double> ref = gemm_reference(r, in);
  // Elements between rows (ld > n) or batches are not outputs: compare only the outputs.
  std::vector<double> got_out, ref_out;
  for (int64_t bt = 0; bt < r.batch; ++bt)
    for (int64_t i = 0; i < r.m; ++i)
      for (int64_t j = 0; j < r.n; ++j) {
        got_out.push_back(got[size_t(bt * r.stride_d + i * r.ldd + j)]);
        ref_out.push_back(ref[size_t(bt * r.stride_d + i * r.ldd + j)]);
      }
  const bool gelu = r.epilogue == cuda::GemmEpilogue::Gelu ||
                    r.epilogue == cuda::GemmEpilogue::BiasGelu;
  const double tol = r.dtype == DType::Float32 && gelu ? 1e-3 : tolerance(r.dtype);
  return close_to(got_out, ref_out, tol, plan->describe());
}

const cuda::GemmEpilogue kEpilogues[] = {
    cuda::GemmEpilogue::None, cuda::GemmEpilogue::Bias, cuda::GemmEpilogue::Relu,
    cuda::GemmEpilogue::BiasRelu, cuda::GemmEpilogue::Gelu, cuda::GemmEpilogue::BiasGelu};

TEST(CublasLtGemm, EveryDtypeEpilogueAndOddShape) {
  ASSERT_TRUE(cuda::cublaslt_available());
  auto rng = rng_for_test();
  struct Shape {
    int64_t m, n, k;
  };
  // Not multiples of 8, K = 1, a long K (a TF32 engine would fail float32's 1e-5 here).
  const Shape shapes[] = {{37, 53, 71}, {1, 129, 1}, {5, 7, 3}, {64, 40, 2048}, {130, 3, 17}};
  for (DType dt : kDTypes)
    for (const Shape& s : shapes)
      for (cuda::GemmEpilogue e : kEpilogues) {
        cuda::GemmDesc g{.dtype = dt, .m = s.m, .n = s.n, .k = s.k, .epilogue = e};
        EXPECT_TRUE(check_gemm(g, rng));
      }
}

TEST(CublasLtGemm, TransposesLeadingDimsAlphaAndResidual) {
  auto rng = rng_for_test();
  for (DType dt : kDTypes)
    for (int t = 0; t < 4; ++t) {
      cuda::GemmDesc g{.dtype = dt, .m = 29, .n = 45, .k = 33, .trans_a = bool(t & 1),
                       .trans_b = bool(t & 2), .epilogue = cuda::GemmEpilogue::BiasRelu};
      EXPECT_TRUE(check_gemm(g, rng));
      g.lda = (g.trans_a ? g.m : g.k) + 8;  // padded rows
      g.ldb = (g.trans_b ? g.k : g.n) + 16;
      g.ldd = g.n + 8;
      g.ldc = g.n + 24;
      g.alpha = 0.5f;
      g.beta = 1.0f;  // residual through C
      EXPECT_TRUE(check_gemm(g, rng));
    }
  // The residual in place: C is D.
  cuda::GemmDesc in_place{.dtype = DType::Float32, .m = 31, .n = 17, .k = 9, .beta = 1.0f,
                          .epilogue = cuda::GemmEpilogue::Bias};
  EXPECT_TRUE(check_gemm(in_place, rng, nullptr, /*in_place_c=*/true));
}

TEST(CublasLtGemm, StridedBatchAndBroadcastB) {
  auto rng = rng_for_test();
  for (DType dt : kDTypes) {
    cuda::GemmDesc g{.dtype = dt, .m = 19, .n = 24, .k = 40, .batch = 3,
                     .epilogue = cuda::GemmEpilogue::BiasGelu};
    EXPECT_TRUE(check_gemm(g, rng));
    g.stride_b = 0;  // one weight for the whole batch (a linear layer over [batch, M, K])
    g.epilogue = cuda::GemmEpilogue::Bias;
    EXPECT_TRUE(check_gemm(g, rng));
    g.trans_b = true;
    g.beta = 1.0f;  // batched residual
    EXPECT_TRUE(check_gemm(g, rng));
    g.stride_c = 0;  // one residual for the batch
    EXPECT_TRUE(check_gemm(g, rng));
    cuda::GemmDesc padded{.dtype = dt, .m = 8, .n = 9, .k = 10, .batch = 4, .stride_a = 8 * 10 + 16,
                          .stride_d = 8 * 9 + 32};
    EXPECT_TRUE(check_gemm(padded, rng));
  }
}

TEST(CublasLtGemm, EveryCandidateAlgorithmIsCorrect) {
  auto rng = rng_for_test();
  for (DType dt : kDTypes) {
    cuda::GemmDesc g{.dtype = dt, .m = 96, .n = 80, .k = 136, .epilogue = cuda::GemmEpilogue::Bias};
    auto plan = cuda::GemmPlan::create(g);
    const std::vector<cuda::GemmAlgo> cs = plan->candidates(8);
    ASSERT_FALSE(cs.empty());
    EXPECT_EQ(cs[0].index, 0);
    // The same algorithm: its configuration (Note [cuBLASLt algorithm identity]; the opaque
    // bytes of two heuristic queries differed on the H100 for one of these dtypes).
    EXPECT_FALSE(cs[0].config.empty());
    EXPECT_EQ(cs[0].config, plan->algo().config);
    for (const cuda::GemmAlgo& a : cs) {
      EXPECT_EQ(a.index, &a - cs.data());
      EXPECT_TRUE(check_gemm(g, rng, &a)) << "candidate " << a.index;
    }
    plan->set_algo(cs.back());
    EXPECT_EQ(plan->algo().index, cs.back().index);
  }
}

// Note [cuBLASLt split-K and tile variants]: what the autotuner times beyond the heuristic's
// list. Every variant cuBLASLt accepted computes the GEMM (against float64 on fresh inputs), is
// none of the heuristic's, and is rebuilt from its configuration text alone, as the tuning store
// and packages rebuild it; K long enough gives split-K variants. Malformed or unknown texts
// give nothing.
TEST(CublasLtGemm, VariantsAreCorrectAndRebuiltFromTheirConfiguration) {
  auto rng = rng_for_test();
  for (DType dt : {DType::BFloat16, DType::Float32}) {
    cuda::GemmDesc g{.dtype = dt, .m = 64, .n = 256, .k = 1024, .trans_b = true,
                     .epilogue = cuda::GemmEpilogue::Bias};
    auto plan = cuda::GemmPlan::create(g);
    const std::vector<cuda::GemmAlgo> base = plan->candidates(8);
    ASSERT_FALSE(base.empty());
    const std::vector<cuda::GemmAlgo> vs = plan->variants(base, 40);
    ASSERT_FALSE(vs.empty()) << plan->describe();
    int split = 0;
    for (size_t i = 0; i < vs.size(); ++i) {
      const cuda::GemmAlgo& v = vs[i];
      EXPECT_EQ(v.index, int(base.size() + i));
      for (const cuda::GemmAlgo& b : base) EXPECT_NE(v.config, b.config);
      int k = 0;
      const size_t at = v.config.find("splitk");
      ASSERT_NE(at, std::string::npos) << v.config;
      k = std::atoi(v.config.c_str() + at + 6);
      split += k > 1;
      EXPECT_TRUE(check_gemm(g, rng, &v)) << v.config;
      std::optional<cuda::GemmAlgo> r = plan->algo_from_config(v.config);
      ASSERT_TRUE(r.has_value()) << v.config;
      EXPECT_EQ(r->config, v.config);
      EXPECT_EQ(r->workspace_bytes, v.workspace_bytes) << v.config;
      EXPECT_TRUE(check_gemm(g, rng, &*r)) << "rebuilt " << v.config;
    }
    EXPECT_GT(split, 0) << "no split-K variant for " << plan->describe();
    std::optional<cuda::GemmAlgo> first = plan->algo_from_config(base[0].config);
    ASSERT_TRUE(first.has_value()) << base[0].config;
    EXPECT_TRUE(check_gemm(g, rng, &*first)) << "rebuilt " << base[0].config;
    std::printf("%s: %zu heuristic algorithms, %zu variants (%d split-K)\n",
                plan->describe().c_str(), base.size(), vs.size(), split);
    EXPECT_FALSE(plan->algo_from_config(""));
    EXPECT_FALSE(plan->algo_from_config("id66 tile"));
    EXPECT_FALSE(plan->algo_from_config(
        "id99999 tile0 stages0 splitk1 red0 swz0 custom0 inner0 cluster0"));
    EXPECT_FALSE(plan->algo_from_config(
        "id66 tile-5 stages35 splitk1 red0 swz0 custom0 inner0 cluster0"));
  }
}

// Kiln's relu propagates NaN; cuBLASLt's RELU epilogue is documented as max(x, 0). The flag must
// match what the GPU does, for every epilogue.
TEST(CublasLtGemm, NanBehaviourMatchesTheNanExactFlag) {
  auto rng = rng_for_test();
  for (DType dt : kDTypes)
    for (cuda::GemmEpilogue e : kEpilogues) {
      cuda::GemmDesc g{.dtype = dt, .m = 4, .n = 16, .k = 8, .epilogue = e};
      auto plan = cuda::GemmPlan::create(g);
      std::vector<double> a = randn(4 * 8, rng), b = randn(8 * 16, rng), bias = randn(16, rng);
      a[1 * 8 + 3] = kNaN;  // row 1 of D is all NaN before the activation
      auto da = upload(a, dt), db = upload(b, dt), dbias = upload(bias, dt);
      auto dd = upload(std::vector<double>(4 * 16, 0.0), dt);
      DeviceBuffer ws(plan->workspace_bytes());
      plan->run({.a = da->get(), .b = db->get(), .d = dd->get(), .bias = dbias->get(),
                 .workspace = ws.get(), .workspace_bytes = ws.bytes()});
      const std::vector<double> d = download(*dd, 4 * 16, dt);
      int nan_in_row1 = 0, nan_elsewhere = 0;
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 16; ++j) (i == 1 ? nan_in_row1 : nan_elsewhere) += std::isnan(d[size_t(i * 16 + j)]);
      EXPECT_EQ(nan_elsewhere, 0) << plan->describe();
      if (cuda::gemm_epilogue_nan_exact(e)) {
        EXPECT_EQ(nan_in_row1, 16) << plan->describe() << ": the epilogue is flagged NaN-exact";
      } else {
        EXPECT_EQ(nan_in_row1, 0) << plan->describe()
                                  << ": the epilogue is flagged as mapping NaN to 0 (update "
                                     "gemm_epilogue_nan_exact if cuBLASLt now keeps NaN)";
      }
    }
}

// kGemmGeluIsTanhApproximation: the output is closer to the tanh form than to the erf form, over
// the range where they differ most (|x| < 4, where they differ by up to ~5e-4).
TEST(CublasLtGemm, GeluIsTheTanhForm) {
  ASSERT_TRUE(cuda::kGemmGeluIsTanhApproximation);
  const int64_t n = 4096;
  cuda::GemmDesc g{.dtype = DType::Float32, .m = 1, .n = n, .k = 1,
                   .epilogue = cuda::GemmEpilogue::Gelu};
  auto plan = cuda::GemmPlan::create(g);
  std::vector<double> a = {1.0};
  std::vector<double> b(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) b[size_t(j)] = double(float(-4.0 + 8.0 * double(j) / double(n)));
  auto da = upload(a, DType::Float32), db = upload(b, DType::Float32);
  auto dd = nan_buffer(size_t(n), DType::Float32);
  DeviceBuffer ws(plan->workspace_bytes());
  plan->run({.a = da->get(), .b = db->get(), .d = dd->get(), .workspace = ws.get(),
             .workspace_bytes = ws.bytes()});
  const std::vector<double> d = download(*dd, size_t(n), DType::Float32);
  std::vector<double> want_tanh(static_cast<size_t>(n)), want_erf(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) {
    want_tanh[size_t(j)] = gelu_tanh(b[size_t(j)]);
    want_erf[size_t(j)] = gelu_erf(b[size_t(j)]);
  }
  // The largest |diff| of each (infinite for a NaN on one side).
  const double err_tanh = test::compare(d, want_tanh, test::Tolerance::exact()).worst_diff;
  const double err_erf = test::compare(d, want_erf, test::Tolerance::exact()).worst_diff;
  std::printf("cuBLASLt GELU epilogue: max |d - gelu_tanh| = %.3g, max |d - gelu_erf| = %.3g\n",
              err_tanh, err_erf);
  EXPECT_LT(err_tanh, err_erf);
  EXPECT_LT(err_tanh, 2e-3);
}

TEST(CublasLtGemm, ErrorsNameTheGemm) {
  cuda::GemmDesc g{.dtype = DType::Float16, .m = 16, .n = 16, .k = 16,
                   .epilogue = cuda::GemmEpilogue::Bias};
  auto plan = cuda::GemmPlan::create(g);
  DeviceBuffer a(4096), b(4096), d(4096), bias(256);
  const Error misaligned = error_of([&] {
    plan->run({.a = static_cast<char*>(a.get()) + 2, .b = b.get(), .d = d.get(),
               .bias = bias.get()});
  });
  EXPECT_TRUE(contains(misaligned.message(), "gemm f16 16x16x16")) << misaligned.message();
  EXPECT_TRUE(contains(misaligned.message(), "A pointer")) << misaligned.message();
  const Error no_bias =
      error_of([&] { plan->run({.a = a.get(), .b = b.get(), .d = d.get()}); });
  EXPECT_TRUE(contains(no_bias.message(), "bias pointer is null")) << no_bias.message();
  EXPECT_EQ(error_of([] { cuda::GemmPlan::create({.m = 4, .n = 4, .k = 0}); }).kind(),
            ErrorKind::InvalidArgument);
  EXPECT_EQ(error_of([] { cuda::GemmPlan::create({.dtype = DType::Float64, .m = 4, .n = 4, .k = 4}); })
                .kind(),
            ErrorKind::NotSupported);
  EXPECT_EQ(error_of([] {
              cuda::GemmPlan::create({.m = 4, .n = 4, .k = 4, .batch = 2, .stride_d = 0});
            }).kind(),
            ErrorKind::InvalidArgument);
}

// ---- cuDNN convolution -----------------------------------------------------------------------

// Logical NCHW <-> the memory order of `layout` (for weights: KCRS <-> KRSC).
std::vector<double> to_layout(const std::vector<double>& nchw, const std::array<int64_t, 4>& d,
                              cuda::ConvLayout layout) {
  if (layout == cuda::ConvLayout::NCHW) return nchw;
  std::vector<double> out(nchw.size());
  for (int64_t n = 0; n < d[0]; ++n)
    for (int64_t c = 0; c < d[1]; ++c)
      for (int64_t h = 0; h < d[2]; ++h)
        for (int64_t w = 0; w < d[3]; ++w)
          out[size_t(((n * d[2] + h) * d[3] + w) * d[1] + c)] =
              nchw[size_t(((n * d[1] + c) * d[2] + h) * d[3] + w)];
  return out;
}
std::vector<double> from_layout(const std::vector<double>& mem, const std::array<int64_t, 4>& d,
                                cuda::ConvLayout layout) {
  if (layout == cuda::ConvLayout::NCHW) return mem;
  std::vector<double> out(mem.size());
  for (int64_t n = 0; n < d[0]; ++n)
    for (int64_t c = 0; c < d[1]; ++c)
      for (int64_t h = 0; h < d[2]; ++h)
        for (int64_t w = 0; w < d[3]; ++w)
          out[size_t(((n * d[1] + c) * d[2] + h) * d[3] + w)] =
              mem[size_t(((n * d[2] + h) * d[3] + w) * d[1] + c)];
  return out;
}

// float64 conv2d / conv_transpose2d in logical NCHW, then bias, residual, relu (NaN-keeping).
std::vector<double> conv_reference(const cuda::ConvDesc& d, const std::vector<double>& x,
                                   const std::vector<double>& w, const std::vector<double>& bias,
                                   const std::vector<double>& residual) {
  const auto o = cuda::conv_output_dims(d);
  const int64_t G = d.groups, OH = o[2], OW = o[3];
  std::vector<double> y(size_t(d.n * d.c_out * OH * OW), 0.0);
  auto X = [&](int64_t n, int64_t c, int64_t h, int64_t ww) {
    return x[size_t(((n * d.c_in + c) * d.h + h) * d.w + ww)];
  };
  if (d.kind == cuda::ConvKind::Forward) {
    const int64_t cg = d.c_in / G, kg = d.c_out / G;
    for (int64_t n = 0; n < d.n; ++n)
      for (int64_t k = 0; k < d.c_out; ++k)
        for (int64_t oy = 0; oy < OH; ++oy)
          for (int64_t ox = 0; ox < OW; ++ox) {
            double acc = 0;
            const int64_t g = k / kg;
            for (int64_t c = 0; c < cg; ++c)
              for (int64_t r = 0; r < d.kh; ++r)
                for (int64_t s = 0; s < d.kw; ++s) {
                  const int64_t iy = oy * d.stride[0] - d.pad_pre[0] + r * d.dilation[0];
                  const int64_t ix = ox * d.stride[1] - d.pad_pre[1] + s * d.dilation[1];
                  if (iy < 0 || iy >= d.h || ix < 0 || ix >= d.w) continue;
                  acc += X(n, g * cg + c, iy, ix) * w[size_t(((k * cg + c) * d.kh + r) * d.kw + s)];
                }
            y[size_t(((n * d.c_out + k) * OH + oy) * OW + ox)] = acc;
          }
  } else {
    // y[n, co, Y, X] = sum x[n, ci, iy, ix] * w[ci, co % cog, r, s] where
    // Y = iy * stride - pad_pre + r * dilation (the scatter form of the transpose).
    const int64_t cig = d.c_in / G, cog = d.c_out / G;
    for (int64_t n = 0; n < d.n; ++n)
      for (int64_t ci = 0; ci < d.c_in; ++ci)
        for (int64_t iy = 0; iy < d.h; ++iy)
          for (int64_t ix = 0; ix < d.w; ++ix) {
            const int64_t g = ci / cig;
            for (int64_t co = 0; co < cog; ++co)
              for (int64_t r = 0; r < d.kh; ++r)
                for (int64_t s = 0; s < d.kw; ++s) {
                  const int64_t oy = iy * d.stride[0] - d.pad_pre[0] + r * d.dilation[0];
                  const int64_t ox = ix * d.stride[1] - d.pad_pre[1] + s * d.dilation[1];
                  if (oy < 0 || oy >= OH || ox < 0 || ox >= OW) continue;
                  y[size_t(((n * d.c_out + g * cog + co) * OH + oy) * OW + ox)] +=
                      X(n, ci, iy, ix) * w[size_t(((ci * cog + co) * d.kh + r) * d.kw + s)];
                }
          }
  }
  for (int64_t n = 0; n < d.n; ++n)
    for (int64_t k = 0; k < d.c_out; ++k)
      for (int64_t i = 0; i < OH * OW; ++i) {
        double& v = y[size_t((n * d.c_out + k) * OH * OW + i)];
        if (d.bias) v += bias[size_t(k)];
        if (d.residual) v += residual[size_t((n * d.c_out + k) * OH * OW + i)];
        if (d.relu) v = std::isnan(v) ? v : std::max(v, 0.0);
      }
  return y;
}

struct ConvResult {
  bool ran = false;       // false: cuDNN had no engine (why_not says why)
  std::string why_not;
  ::testing::AssertionResult ok = ::testing::AssertionSuccess();
};

// Runs `d` on fresh inputs with every candidate engine (all_engines) or the default one.
ConvResult check_conv(const cuda::ConvDesc& d, std::mt19937_64& rng, bool all_engines = false,
                      const std::function<void(std::vector<double>&)>& edit_x = nullptr) {
  ConvResult res;
  auto plan = cuda::ConvPlan::try_create(d, &res.why_not);
  if (!plan) return res;
  res.ran = true;
  const auto o = plan->output_dims();
  const std::array<int64_t, 4> xd = {d.n, d.c_in, d.h, d.w};
  const std::array<int64_t, 4> wd =
      d.kind == cuda::ConvKind::Forward
          ? std::array<int64_t, 4>{d.c_out, d.c_in / d.groups, d.kh, d.kw}
          : std::array<int64_t, 4>{d.c_in, d.c_out / d.groups, d.kh, d.kw};
  const size_t xn = size_t(xd[0] * xd[1] * xd[2] * xd[3]);
  const size_t wn = size_t(wd[0] * wd[1] * wd[2] * wd[3]);
  const size_t yn = size_t(o[0] * o[1] * o[2] * o[3]);
  std::vector<double> x = randn(xn, rng);
  if (edit_x) edit_x(x);
  x = rounded(x, d.dtype);
  const std::vector<double> w = rounded(randn(wn, rng, 1.0 / std::sqrt(double(wn / size_t(wd[0])))), d.dtype);
  const std::vector<double> bias = rounded(randn(size_t(d.c_out), rng), d.dtype);
  const std::vector<double> residual = rounded(randn(yn, rng), d.dtype);
  const std::vector<double> ref = conv_reference(d, x, w, bias, residual);
  auto dx = upload(to_layout(x, xd, d.layout), d.dtype);
  auto dw = upload(to_layout(w, wd, d.layout), d.dtype);
  auto db = upload(bias, d.dtype);
  auto dr = upload(to_layout(residual, o, d.layout), d.dtype);
  const std::vector<cuda::ConvEngine> engines = plan->candidates();
  const size_t count = all_engines ? engines.size() : 1;
  for (size_t e = 0; e < count; ++e) {
    plan->select(int(e));
    auto dy = nan_buffer(yn, d.dtype);
    DeviceBuffer ws(plan->workspace_bytes());
    cudaStream_t stream = nullptr;
    check_cuda(cudaStreamCreate(&stream), "cudaStreamCreate");
    plan->run({.x = dx->get(), .w = dw->get(), .y = dy->get(), .bias = db->get(),
               .residual = dr->get(), .workspace = ws.get(), .workspace_bytes = ws.bytes(),
               .stream = stream});
    check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    cudaStreamDestroy(stream);
    const std::vector<double> got = from_layout(download(*dy, yn, d.dtype), o, d.layout);
    res.ok = close_to(got, ref, tolerance(d.dtype),
                      cuda::describe(d) + " engine " + engines[e].tag);
    if (!res.ok) return res;
  }
  return res;
}

struct ConvCase {
  const char* name;
  cuda::ConvDesc d;
};

std::vector<ConvCase> resnet_mobilenet_convs() {
  using cuda::ConvDesc;
  return {
      {"1x1 (bottleneck)", ConvDesc{.n = 2, .c_in = 32, .h = 14, .w = 14, .c_out = 48}},
      {"3x3 stride 2, odd sizes",
       ConvDesc{.n = 1, .c_in = 16, .h = 15, .w = 17, .c_out = 24, .kh = 3, .kw = 3,
                .stride = {2, 2}, .pad_pre = {1, 1}, .pad_post = {1, 1}}},
      {"depthwise 3x3",
       ConvDesc{.n = 2, .c_in = 32, .h = 12, .w = 12, .c_out = 32, .kh = 3, .kw = 3,
                .groups = 32, .pad_pre = {1, 1}, .pad_post = {1, 1}}},
      {"7x7 stride 2 stem",
       ConvDesc{.n = 1, .c_in = 3, .h = 32, .w = 30, .c_out = 16, .kh = 7, .kw = 7,
                .stride = {2, 2}, .pad_pre = {3, 3}, .pad_post = {3, 3}}},
      {"dilated 3x3",
       ConvDesc{.n = 1, .c_in = 16, .h = 20, .w = 20, .c_out = 16, .kh = 3, .kw = 3,
                .pad_pre = {2, 2}, .pad_post = {2, 2}, .dilation = {2, 2}}},
      {"asymmetric padding (SAME, stride 2)",
       ConvDesc{.n = 1, .c_in = 8, .h = 16, .w = 16, .c_out = 16, .kh = 3, .kw = 3,
                .stride = {2, 2}, .pad_pre = {0, 0}, .pad_post = {1, 1}}},
      {"grouped 3x3 (4 groups)",
       ConvDesc{.n = 1, .c_in = 32, .h = 9, .w = 9, .c_out = 64, .kh = 3, .kw = 3, .groups = 4,
                .pad_pre = {1, 1}, .pad_post = {1, 1}}},
  };
}

TEST(CudnnConv, ResNetAndMobileNetShapesEveryDtypeAndLayout) {
  std::string why;
  ASSERT_TRUE(cuda::conv_fused_supported({.c_in = 8, .h = 8, .w = 8, .c_out = 8}, &why)) << why;
  auto rng = rng_for_test();
  for (const ConvCase& c : resnet_mobilenet_convs())
    for (DType dt : kDTypes)
      for (cuda::ConvLayout layout : {cuda::ConvLayout::NCHW, cuda::ConvLayout::NHWC}) {
        cuda::ConvDesc d = c.d;
        d.dtype = dt;
        d.layout = layout;
        // The plain convolution must always have an engine.
        ConvResult plain = check_conv(d, rng);
        EXPECT_TRUE(plain.ran) << c.name << ": " << cuda::describe(d) << ": " << plain.why_not;
        EXPECT_TRUE(plain.ok) << c.name;
        // The fused epilogue where an engine takes it; where none does, try_create returns
        // null with the reason (printed), and conv_fused_supported agrees.
        d.bias = d.residual = d.relu = true;
        ConvResult fused = check_conv(d, rng);
        if (fused.ran) {
          EXPECT_TRUE(fused.ok) << c.name;
        } else {
          std::printf("not fused: %s: %s\n", cuda::describe(d).c_str(), fused.why_not.c_str());
        }
        if (dt == DType::Float16 && layout == cuda::ConvLayout::NHWC) {  // the query agrees
          EXPECT_EQ(fused.ran, cuda::conv_fused_supported(d)) << cuda::describe(d);
        }
      }
}

// The ResNet pattern (conv + folded-BN bias + identity + relu) on half types, channels last, is
// what cuDNN's runtime-fusion engines exist for: it must fuse.
TEST(CudnnConv, ResNetBlockEpilogueFusesInHalfPrecisionNhwc) {
  auto rng = rng_for_test();
  for (DType dt : kHalfDTypes) {
    cuda::ConvDesc d{.dtype = dt, .layout = cuda::ConvLayout::NHWC, .n = 2, .c_in = 64, .h = 14,
                     .w = 14, .c_out = 64, .kh = 3, .kw = 3, .pad_pre = {1, 1},
                     .pad_post = {1, 1}, .bias = true, .residual = true, .relu = true};
    ConvResult r = check_conv(d, rng);
    ASSERT_TRUE(r.ran) << cuda::describe(d) << ": " << r.why_not;
    EXPECT_TRUE(r.ok);
    for (int mask = 1; mask < 8; ++mask) {  // each sub-epilogue alone and in pairs
      d.bias = mask & 1;
      d.residual = mask & 2;
      d.relu = mask & 4;
      ConvResult sub = check_conv(d, rng);
      if (sub.ran) {
        EXPECT_TRUE(sub.ok);
      } else {
        std::printf("not fused: %s: %s\n", cuda::describe(d).c_str(), sub.why_not.c_str());
      }
    }
  }
}

TEST(CudnnConv, EveryCandidateEngineIsCorrectAndTagsSelect) {
  auto rng = rng_for_test();
  for (DType dt : kDTypes) {
    cuda::ConvDesc d{.dtype = dt, .layout = cuda::ConvLayout::NHWC, .n = 2, .c_in = 24, .h = 11,
                     .w = 13, .c_out = 40, .kh = 3, .kw = 3, .stride = {2, 2}, .pad_pre = {1, 1},
                     .pad_post = {1, 1}};
    ConvResult r = check_conv(d, rng, /*all_engines=*/true);
    ASSERT_TRUE(r.ran) << r.why_not;
    EXPECT_TRUE(r.ok);
    auto plan = cuda::ConvPlan::create(d);
    const auto cs = plan->candidates();
    ASSERT_FALSE(cs.empty());
    for (const auto& c : cs) {
      EXPECT_FALSE(c.tag.empty());
      if (dt == DType::Float32) {
        EXPECT_FALSE(c.tensor_cores) << c.tag << ": TF32 was not asked for";
      }
    }
    EXPECT_TRUE(plan->select_tag(cs.back().tag));
    EXPECT_EQ(plan->engine().index, cs.back().index);
    EXPECT_FALSE(plan->select_tag("no such engine"));
  }
}

TEST(CudnnConv, TransposeTwoByTwoStrideTwoAndOthers) {
  auto rng = rng_for_test();
  using cuda::ConvDesc;
  const ConvCase cases[] = {
      {"2x2 stride 2 (upsampling)",
       ConvDesc{.kind = cuda::ConvKind::Transpose, .n = 2, .c_in = 16, .h = 7, .w = 9, .c_out = 8,
                .kh = 2, .kw = 2, .stride = {2, 2}}},
      {"3x3 stride 2 pad 1 output_padding 1",
       ConvDesc{.kind = cuda::ConvKind::Transpose, .n = 1, .c_in = 8, .h = 6, .w = 5, .c_out = 12,
                .kh = 3, .kw = 3, .stride = {2, 2}, .pad_pre = {1, 1}, .pad_post = {1, 1},
                .output_padding = {1, 1}}},
      {"4x4 stride 2 pad 1, 2 groups",
       ConvDesc{.kind = cuda::ConvKind::Transpose, .n = 1, .c_in = 8, .h = 5, .w = 5, .c_out = 8,
                .kh = 4, .kw = 4, .groups = 2, .stride = {2, 2}, .pad_pre = {1, 1},
                .pad_post = {1, 1}}},
  };
  for (const ConvCase& c : cases)
    for (DType dt : kDTypes)
      for (cuda::ConvLayout layout : {cuda::ConvLayout::NCHW, cuda::ConvLayout::NHWC}) {
        ConvDesc d = c.d;
        d.dtype = dt;
        d.layout = layout;
        ConvResult r = check_conv(d, rng);
        EXPECT_TRUE(r.ran) << c.name << ": " << cuda::describe(d) << ": " << r.why_not;
        EXPECT_TRUE(r.ok) << c.name;
        d.bias = d.relu = true;
        ConvResult fused = check_conv(d, rng);
        EXPECT_EQ(fused.ran, cuda::conv_fused_supported(d));
        if (fused.ran) {
          EXPECT_TRUE(fused.ok) << c.name;
        }
      }
  const auto o = cuda::conv_output_dims(cases[0].d);
  EXPECT_EQ(o[2], 14);
  EXPECT_EQ(o[3], 18);
}

// An executable calls a plan again and again with the same arena pointers (the variant pack is
// then reused) and sometimes with others: both must compute on the data of this call.
TEST(CudnnConv, RepeatedRunsWithSameAndNewPointers) {
  auto rng = rng_for_test();
  cuda::ConvDesc d{.dtype = DType::Float16, .layout = cuda::ConvLayout::NHWC, .n = 1, .c_in = 16,
                   .h = 10, .w = 10, .c_out = 16, .kh = 3, .kw = 3, .pad_pre = {1, 1},
                   .pad_post = {1, 1}, .bias = true};
  std::string why;
  auto plan = cuda::ConvPlan::try_create(d, &why);
  if (!plan) {
    d.bias = false;
    plan = cuda::ConvPlan::create(d);
  }
  const std::array<int64_t, 4> xd = {1, 16, 10, 10}, wd = {16, 16, 3, 3};
  const auto o = plan->output_dims();
  const size_t yn = size_t(o[0] * o[1] * o[2] * o[3]);
  auto dx = upload(std::vector<double>(1600, 0.0), d.dtype);
  auto dw = upload(std::vector<double>(2304, 0.0), d.dtype);
  auto db = upload(std::vector<double>(16, 0.0), d.dtype);
  auto dy1 = nan_buffer(yn, d.dtype), dy2 = nan_buffer(yn, d.dtype);
  DeviceBuffer ws(plan->workspace_bytes());
  for (int round = 0; round < 3; ++round) {
    const auto x = rounded(randn(1600, rng), d.dtype), w = rounded(randn(2304, rng, 0.1), d.dtype);
    const auto b = rounded(randn(16, rng), d.dtype);
    const std::string xb = encode(to_layout(x, xd, d.layout), d.dtype);
    const std::string wb = encode(to_layout(w, wd, d.layout), d.dtype), bb = encode(b, d.dtype);
    check_cuda(cudaMemcpy(dx->get(), xb.data(), xb.size(), cudaMemcpyHostToDevice), "upload x");
    check_cuda(cudaMemcpy(dw->get(), wb.data(), wb.size(), cudaMemcpyHostToDevice), "upload w");
    check_cuda(cudaMemcpy(db->get(), bb.data(), bb.size(), cudaMemcpyHostToDevice), "upload b");
    DeviceBuffer& y = round == 2 ? *dy2 : *dy1;  // rounds 0 and 1: same pointers
    plan->run({.x = dx->get(), .w = dw->get(), .y = y.get(), .bias = db->get(),
               .workspace = ws.get(), .workspace_bytes = ws.bytes()});
    const auto ref = conv_reference(d, x, w, b, {});
    EXPECT_TRUE(close_to(from_layout(download(y, yn, d.dtype), o, d.layout), ref, 1e-2,
                         fmt::format("round {}", round)));
  }
}

// One NaN input element makes the outputs that read it NaN; after the fused relu they stay NaN
// exactly when ConvPlan::relu_nan_exact() says so.
TEST(CudnnConv, FusedReluNanBehaviourMatchesTheFlag) {
  auto rng = rng_for_test();
  for (DType dt : kHalfDTypes) {
    cuda::ConvDesc d{.dtype = dt, .layout = cuda::ConvLayout::NHWC, .n = 1, .c_in = 8, .h = 6,
                     .w = 6, .c_out = 8, .relu = true};  // 1x1: NaN stays in one pixel
    std::string why;
    auto plan = cuda::ConvPlan::try_create(d, &why);
    if (!plan) GTEST_SKIP() << "cuDNN fuses no relu here: " << why;
    std::vector<double> x = randn(8 * 36, rng);
    x[0] = kNaN;  // NCHW element (n 0, c 0, h 0, w 0)
    auto dx = upload(to_layout(x, {1, 8, 6, 6}, d.layout), dt);
    auto dw = upload(randn(64, rng), dt);
    const std::vector<cuda::ConvEngine> engines = plan->candidates();
    ASSERT_FALSE(engines.empty());
    for (size_t e = 0; e < engines.size(); ++e) {  // the claim holds for every engine
      plan->select(int(e));
      auto dy = upload(std::vector<double>(8 * 36, 0.0), dt);
      DeviceBuffer ws(plan->workspace_bytes());
      plan->run({.x = dx->get(), .w = dw->get(), .y = dy->get(), .workspace = ws.get(),
                 .workspace_bytes = ws.bytes()});
      const std::vector<double> y = from_layout(download(*dy, 8 * 36, dt), {1, 8, 6, 6}, d.layout);
      int nan_at_pixel = 0, nan_elsewhere = 0;
      for (int k = 0; k < 8; ++k)
        for (int i = 0; i < 36; ++i) (i == 0 ? nan_at_pixel : nan_elsewhere) += std::isnan(y[size_t(k * 36 + i)]);
      EXPECT_EQ(nan_elsewhere, 0) << engines[e].tag;
      EXPECT_EQ(nan_at_pixel, cuda::ConvPlan::relu_nan_exact() ? 8 : 0)
          << cuda::describe(d) << " engine " << engines[e].tag
          << ": update ConvPlan::relu_nan_exact() to what cuDNN does";
    }
  }
}

// Whether two runs' outputs (downloaded as doubles) are the same bits.
::testing::AssertionResult same_bits(const std::vector<double>& a, const std::vector<double>& b,
                                     const std::string& what) {
  if (a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0)
    return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << " computed other bits";
}

// Runs a convolution with fused bias and residual into a NaN-filled output of `yn` elements;
// the output as doubles.
std::vector<double> run_bias_residual(const cuda::ConvPlan& plan, const DeviceBuffer& x,
                                      const DeviceBuffer& w, const DeviceBuffer& bias,
                                      const DeviceBuffer& residual, size_t yn, DType dt) {
  auto dy = nan_buffer(yn, dt);
  DeviceBuffer ws(plan.workspace_bytes());
  plan.run({.x = x.get(), .w = w.get(), .y = dy->get(), .bias = bias.get(),
            .residual = residual.get(), .workspace = ws.get(), .workspace_bytes = ws.bytes()});
  check_cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
  return download(*dy, yn, dt);
}

// The files of the plan cache under `dir` (Note [cuDNN plan cache]).
std::vector<std::filesystem::path> plan_cache_files(const std::string& dir, const char* ext) {
  std::vector<std::filesystem::path> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir + "/cudnn-plans", ec))
    if (e.path().extension() == ext) out.push_back(e.path());
  return out;
}

// Note [Serialized cuDNN plans], Note [cuDNN plan cache]: a runtime-fusion plan (ResNet-50's
// conv + bias + residual + relu, half precision, channels last) serializes; the plan restored
// from its bytes computes the same bits as the built one, and the reference's values; bytes cut
// short or not cuDNN's are refused, not run. A second create() of the descriptor comes from the
// cache (one candidate until more are asked for, then the graph is built and the selected engine
// keeps its tag); a damaged cache entry is a miss, rebuilt.
TEST(CudnnConv, SerializedPlanRestoresAndTheCacheServesIt) {
  auto rng = rng_for_test();
  test::TempDir cache("kiln-plan-cache");
  test::ScopedEnv env("KILN_CACHE_DIR", cache.path);
  ASSERT_TRUE(cuda::cudnn::plan_cache_enabled()) << "KILN_CUDNN_PLAN_CACHE is off";
  for (DType dt : kHalfDTypes) {
    cuda::ConvDesc d{.dtype = dt, .layout = cuda::ConvLayout::NHWC, .n = 1, .c_in = 64, .h = 28,
                     .w = 28, .c_out = 128, .kh = 3, .kw = 3, .pad_pre = {1, 1},
                     .pad_post = {1, 1}, .bias = true, .residual = true, .relu = true};
    const size_t entries_before = plan_cache_files(cache.path, ".plan").size();
    auto t0 = std::chrono::steady_clock::now();
    auto built = cuda::ConvPlan::create(d);
    const double build_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string bytes = built->serialize();
    ASSERT_FALSE(bytes.empty()) << cuda::describe(d) << ": engine " << built->engine().tag
                                << " did not serialize";
    // Two entries: the descriptor's first choice ("") and its engine by tag.
    EXPECT_EQ(plan_cache_files(cache.path, ".plan").size(), entries_before + 2);
    std::string why;
    t0 = std::chrono::steady_clock::now();
    auto restored = cuda::ConvPlan::try_restore(d, built->engine().tag, bytes, &why);
    const double restore_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(restored) << why;
    EXPECT_EQ(restored->engine().tag, built->engine().tag);
    EXPECT_EQ(restored->workspace_bytes(), built->workspace_bytes());
    t0 = std::chrono::steady_clock::now();
    auto cached = cuda::ConvPlan::create(d);
    const double cached_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(cached->engine().tag, built->engine().tag);
    std::printf("%s: engine %s, %zu bytes serialized; built in %.1f ms, restored in %.1f ms, "
                "created from the cache in %.1f ms\n",
                cuda::describe(d).c_str(), built->engine().tag.c_str(), bytes.size(),
                build_s * 1e3, restore_s * 1e3, cached_s * 1e3);

    const auto o = built->output_dims();
    const std::array<int64_t, 4> xd = {d.n, d.c_in, d.h, d.w}, wd = {d.c_out, d.c_in, d.kh, d.kw};
    const size_t xn = size_t(d.n * d.c_in * d.h * d.w), wn = size_t(d.c_out * d.c_in * d.kh * d.kw);
    const size_t yn = size_t(o[0] * o[1] * o[2] * o[3]);
    const auto x = rounded(randn(xn, rng), dt);
    const auto w = rounded(randn(wn, rng, 1.0 / std::sqrt(double(wn / size_t(d.c_out)))), dt);
    const auto bias = rounded(randn(size_t(d.c_out), rng), dt);
    const auto residual = rounded(randn(yn, rng), dt);
    const auto ref = conv_reference(d, x, w, bias, residual);
    auto dx = upload(to_layout(x, xd, d.layout), dt);
    auto dw = upload(to_layout(w, wd, d.layout), dt);
    auto db = upload(bias, dt);
    auto dr = upload(to_layout(residual, o, d.layout), dt);
    auto run = [&](const cuda::ConvPlan& plan) {
      return run_bias_residual(plan, *dx, *dw, *db, *dr, yn, dt);
    };
    const std::vector<double> a = run(*built), b = run(*restored), c = run(*cached);
    EXPECT_TRUE(same_bits(a, b, "the restored plan"));
    EXPECT_TRUE(same_bits(a, c, "the cached plan"));
    EXPECT_TRUE(close_to(from_layout(b, o, d.layout), ref, tolerance(dt),
                         cuda::describe(d) + " restored"));

    // The cached plan's other candidates: its graph is built, its engine keeps its tag.
    const std::vector<cuda::ConvEngine> all = cached->candidates();
    ASSERT_FALSE(all.empty());
    EXPECT_EQ(cached->engine().tag, built->engine().tag);
    EXPECT_EQ(all[size_t(cached->engine().index)].tag, built->engine().tag);
    const std::vector<double> c2 = run(*cached);
    EXPECT_TRUE(same_bits(a, c2, "the cached plan, built out"));

    // Damaged bytes: refused with cuDNN's reason, never run.
    EXPECT_FALSE(cuda::ConvPlan::try_restore(d, built->engine().tag,
                                             bytes.substr(0, bytes.size() / 2), &why));
    EXPECT_FALSE(why.empty());
    EXPECT_FALSE(cuda::ConvPlan::try_restore(d, built->engine().tag, "{}", &why));
    // A damaged cache entry: a miss; the plan is built again and computes the same bits.
    for (const auto& f : plan_cache_files(cache.path, ".plan")) {
      std::string text = test::read_bytes(f.string());
      text[text.size() / 2] ^= 0x20;
      test::write_bytes(f.string(), text);
    }
    auto rebuilt = cuda::ConvPlan::create(d);
    const std::vector<double> r = run(*rebuilt);
    EXPECT_TRUE(same_bits(a, r, "the plan rebuilt over a damaged entry"));
  }
}

// Note [One engine finalized by tag]: an engine chosen by select() (the autotuner's) and kept
// is in the plan cache, so that a later plan pinning it restores it (one plan, no graph); with
// an empty cache, pinning it finalizes the heuristic's first and that engine only, not every
// candidate. Each way computes the bits the chosen engine computed.
TEST(CudnnConv, APinnedEngineIsKeptAndBuiltAlone) {
  auto rng = rng_for_test();
  test::TempDir cache("kiln-plan-cache");
  test::ScopedEnv env("KILN_CACHE_DIR", cache.path);
  ASSERT_TRUE(cuda::cudnn::plan_cache_enabled()) << "KILN_CUDNN_PLAN_CACHE is off";
  const DType dt = DType::BFloat16;
  cuda::ConvDesc d{.dtype = dt, .layout = cuda::ConvLayout::NHWC, .n = 1, .c_in = 64, .h = 28,
                   .w = 28, .c_out = 128, .kh = 3, .kw = 3, .pad_pre = {1, 1},
                   .pad_post = {1, 1}, .bias = true, .residual = true, .relu = true};
  auto tuned = cuda::ConvPlan::create(d);
  const std::vector<cuda::ConvEngine> all = tuned->candidates();
  ASSERT_EQ(tuned->plans_finalized(), all.size());
  // The last candidate that serializes (a runtime-fusion engine), not the first.
  int pick = -1;
  for (int i = int(all.size()) - 1; i > 0 && pick < 0; --i) {
    tuned->select(all[size_t(i)].index);
    if (!tuned->serialize().empty()) pick = i;
  }
  ASSERT_GE(pick, 1) << cuda::describe(d) << ": cuDNN " << cuda::cudnn::version() << " offers "
                     << all.size() << " engines, none but the first serializes; pick another "
                     << "descriptor for this test";
  tuned->select(all[size_t(pick)].index);
  const std::string tag = tuned->engine().tag;
  ASSERT_NE(tag, all[0].tag);
  const size_t entries = plan_cache_files(cache.path, ".plan").size();
  tuned->keep();
  EXPECT_EQ(plan_cache_files(cache.path, ".plan").size(), entries + 1) << "engine " << tag;

  const auto o = tuned->output_dims();
  const size_t xn = size_t(d.n * d.c_in * d.h * d.w), wn = size_t(d.c_out * d.c_in * d.kh * d.kw);
  const size_t yn = size_t(o[0] * o[1] * o[2] * o[3]);
  auto dx = upload(randn(xn, rng), dt);
  auto dw = upload(randn(wn, rng, 1.0 / std::sqrt(double(wn / size_t(d.c_out)))), dt);
  auto db = upload(randn(size_t(d.c_out), rng), dt);
  auto dr = upload(randn(yn, rng), dt);
  auto run = [&](const cuda::ConvPlan& plan) {
    return run_bias_residual(plan, *dx, *dw, *db, *dr, yn, dt);
  };
  const std::vector<double> want = run(*tuned);
  size_t nan = 0;
  for (double v : want) nan += std::isnan(v);
  ASSERT_EQ(nan, 0u) << "engine " << tag << " left NaN in its output";

  // A package's load on this machine: the cache's first choice, then the pinned engine from
  // its own entry. No graph is built.
  auto restored = cuda::ConvPlan::create(d);
  ASSERT_TRUE(restored->select_tag(tag));
  EXPECT_EQ(restored->engine().tag, tag);
  EXPECT_EQ(restored->plans_finalized(), 1u);
  EXPECT_TRUE(same_bits(want, run(*restored), "the kept engine, restored"));

  // A fresh machine: an empty cache. The heuristic's first and the pinned engine are finalized,
  // no other.
  test::TempDir empty("kiln-plan-cache-empty");
  test::ScopedEnv env2("KILN_CACHE_DIR", empty.path);
  auto fresh = cuda::ConvPlan::create(d);
  ASSERT_TRUE(fresh->select_tag(tag));
  EXPECT_EQ(fresh->engine().tag, tag);
  EXPECT_EQ(fresh->plans_finalized(), 2u) << all.size() << " candidates";
  EXPECT_TRUE(same_bits(want, run(*fresh), "the pinned engine, built alone"));
  // Its index stays valid when the autotuner asks for every candidate afterwards.
  const std::vector<cuda::ConvEngine> later = fresh->candidates();
  EXPECT_EQ(later.size(), all.size());
  EXPECT_EQ(later[size_t(fresh->engine().index)].tag, tag);
  EXPECT_TRUE(same_bits(want, run(*fresh), "the pinned engine after the others were built"));
}

TEST(CudnnConv, ErrorsNameTheConvolution) {
  const Error groups = error_of([] {
    cuda::ConvPlan::create({.c_in = 6, .h = 4, .w = 4, .c_out = 8, .groups = 4});
  });
  EXPECT_EQ(groups.kind(), ErrorKind::InvalidArgument);
  EXPECT_TRUE(contains(groups.message(), "conv2d f32 NCHW 1x6x4x4 -> 8")) << groups.message();
  const Error big = error_of([] {
    cuda::ConvPlan::create({.c_in = 2, .h = 2, .w = 2, .c_out = 2, .kh = 5, .kw = 5});
  });
  EXPECT_TRUE(contains(big.message(), "kernel extent")) << big.message();
  auto plan = cuda::ConvPlan::create({.dtype = DType::Float16, .c_in = 8, .h = 4, .w = 4,
                                      .c_out = 8, .bias = true});
  DeviceBuffer x(4096), w(4096), y(4096);
  const Error no_bias = error_of([&] { plan->run({.x = x.get(), .w = w.get(), .y = y.get()}); });
  EXPECT_TRUE(contains(no_bias.message(), "bias pointer is null")) << no_bias.message();
  const Error misaligned = error_of([&] {
    plan->run({.x = static_cast<char*>(x.get()) + 2, .w = w.get(), .y = y.get()});
  });
  EXPECT_TRUE(contains(misaligned.message(), "not 16-byte aligned")) << misaligned.message();
}

// ---- cuDNN attention -------------------------------------------------------------------------

// float64 attention on logical [B,H,S,D] data read through strides.
std::vector<double> sdpa_reference(const cuda::SdpaDesc& d, const std::vector<double>& q,
                                   const std::vector<double>& k, const std::vector<double>& v,
                                   const std::vector<double>& mask,
                                   const std::array<int64_t, 4>& qs,
                                   const std::array<int64_t, 4>& ks,
                                   const std::array<int64_t, 4>& vs) {
  const int64_t B = d.batch, H = d.heads, Sq = d.seq_q, Skv = d.seq_kv, D = d.head_dim;
  const int64_t Dv = d.head_dim_v ? d.head_dim_v : D;
  const double scale = d.scale != 0 ? d.scale : 1.0 / std::sqrt(double(D));
  std::vector<double> o(size_t(B * H * Sq * Dv));
  std::vector<double> s(static_cast<size_t>(Skv));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < Sq; ++i) {
        double mx = -INFINITY;
        for (int64_t j = 0; j < Skv; ++j) {
          double acc = 0;
          for (int64_t e = 0; e < D; ++e)
            acc += q[size_t(b * qs[0] + h * qs[1] + i * qs[2] + e)] *
                   k[size_t(b * ks[0] + h * ks[1] + j * ks[2] + e)];
          acc *= scale;
          if (d.mask) {
            const int64_t mb = d.mask_batch == 1 ? 0 : b, mh = d.mask_heads == 1 ? 0 : h;
            acc += mask[size_t(((mb * d.mask_heads + mh) * Sq + i) * Skv + j)];
          }
          if (d.causal && j > i) acc = -INFINITY;
          s[size_t(j)] = acc;
          mx = std::max(mx, acc);
        }
        double sum = 0;
        for (int64_t j = 0; j < Skv; ++j) sum += (s[size_t(j)] = std::exp(s[size_t(j)] - mx));
        for (int64_t e = 0; e < Dv; ++e) {
          double acc = 0;
          for (int64_t j = 0; j < Skv; ++j)
            acc += s[size_t(j)] * v[size_t(b * vs[0] + h * vs[1] + j * vs[2] + e)];
          o[size_t(((b * H + h) * Sq + i) * Dv + e)] = acc / sum;  // NaN for an all -inf row
        }
      }
  return o;
}

struct SdpaRun {
  bool ran = false;
  std::string why_not;
  std::vector<double> got, ref;
};

// `bshd`: q, k, v live in [B, S, H, D] buffers (the layout projections produce), read through
// strides; o is contiguous [B, H, S, Dv].
SdpaRun run_sdpa(cuda::SdpaDesc d, std::mt19937_64& rng, bool bshd = false,
                 const std::function<void(std::vector<double>&)>& edit_mask = nullptr,
                 int engine = 0, double fill = kNaN) {
  SdpaRun out;
  const int64_t B = d.batch, H = d.heads, Sq = d.seq_q, Skv = d.seq_kv, D = d.head_dim;
  const int64_t Dv = d.head_dim_v ? d.head_dim_v : D;
  auto strides = [&](int64_t S, int64_t E) {
    return bshd ? std::array<int64_t, 4>{S * H * E, E, H * E, 1}
                : std::array<int64_t, 4>{H * S * E, S * E, E, 1};
  };
  const auto qs = strides(Sq, D), ks = strides(Skv, D), vs = strides(Skv, Dv);
  if (bshd) {
    d.q_stride = qs;
    d.k_stride = ks;
    d.v_stride = vs;
  }
  auto plan = cuda::SdpaPlan::try_create(d, &out.why_not);
  if (!plan) return out;
  out.ran = true;
  const auto q = rounded(randn(size_t(B * H * Sq * D), rng), d.dtype);
  const auto k = rounded(randn(size_t(B * H * Skv * D), rng), d.dtype);
  const auto v = rounded(randn(size_t(B * H * Skv * Dv), rng), d.dtype);
  std::vector<double> mask;
  if (d.mask) {
    mask = randn(size_t(d.mask_batch * d.mask_heads * Sq * Skv), rng);
    if (edit_mask) edit_mask(mask);
    mask = rounded(mask, d.dtype);
  }
  out.ref = sdpa_reference(d, q, k, v, mask, qs, ks, vs);
  auto dq = upload(q, d.dtype), dk = upload(k, d.dtype), dv = upload(v, d.dtype);
  auto dm = upload(d.mask ? mask : std::vector<double>{0.0}, d.dtype);
  auto dout = upload(std::vector<double>(out.ref.size(), fill), d.dtype);  // NaN: unwritten fails
  if (engine != 0) plan->select(engine);
  DeviceBuffer ws(plan->workspace_bytes());
  plan->run({.q = dq->get(), .k = dk->get(), .v = dv->get(), .mask = dm->get(), .o = dout->get(),
             .workspace = ws.get(), .workspace_bytes = ws.bytes()});
  out.got = download(*dout, out.ref.size(), d.dtype);
  return out;
}

TEST(CudnnSdpa, CausalMaskedOddLengthsAndStrides) {
  auto rng = rng_for_test();
  struct Case {
    const char* name;
    cuda::SdpaDesc d;
    bool bshd;
  };
  const Case cases[] = {
      {"plain, odd lengths", {.batch = 2, .heads = 3, .seq_q = 17, .seq_kv = 33, .head_dim = 64}, false},
      {"causal square", {.batch = 1, .heads = 4, .seq_q = 128, .seq_kv = 128, .head_dim = 64, .causal = true}, false},
      {"causal Sq < Skv (top-left)", {.batch = 2, .heads = 2, .seq_q = 20, .seq_kv = 50, .head_dim = 32, .causal = true}, false},
      {"mask per head", {.batch = 2, .heads = 3, .seq_q = 24, .seq_kv = 40, .head_dim = 64, .mask = true, .mask_heads = 3}, false},
      {"mask per batch", {.batch = 2, .heads = 3, .seq_q = 16, .seq_kv = 16, .head_dim = 128, .mask = true, .mask_batch = 2}, false},
      {"BSHD strides, explicit scale", {.batch = 2, .heads = 4, .seq_q = 31, .seq_kv = 31, .head_dim = 64, .scale = 0.3}, true},
      {"ViT-like", {.batch = 1, .heads = 12, .seq_q = 197, .seq_kv = 197, .head_dim = 64}, true},
  };
  for (const Case& c : cases)
    for (DType dt : kHalfDTypes) {
      cuda::SdpaDesc d = c.d;
      d.dtype = dt;
      if (&c == &cases[0]) {  // the query and the plan agree (each asks cuDNN: once is enough)
        const cuda::SdpaSupport s = cuda::sdpa_supported(d);
        EXPECT_TRUE(s.supported) << cuda::describe(d) << ": " << s.reason;
        EXPECT_TRUE(s.reason.empty()) << s.reason;
      }
      SdpaRun r = run_sdpa(d, rng, c.bshd);
      ASSERT_TRUE(r.ran) << c.name << ": " << cuda::describe(d) << ": " << r.why_not;
      EXPECT_TRUE(close_to(r.got, r.ref, tolerance(dt), std::string(c.name) + ": " + cuda::describe(d)));
    }
}

// As CudnnConv.SerializedPlanRestoresAndTheCacheServesIt, for attention (ViT-B/16's).
TEST(CudnnSdpa, SerializedPlanRestoresAndTheCacheServesIt) {
  auto rng = rng_for_test();
  test::TempDir cache("kiln-plan-cache");
  test::ScopedEnv env("KILN_CACHE_DIR", cache.path);
  for (DType dt : kHalfDTypes) {
    cuda::SdpaDesc d{.dtype = dt, .batch = 1, .heads = 12, .seq_q = 197, .seq_kv = 197,
                     .head_dim = 64};
    auto t0 = std::chrono::steady_clock::now();
    auto built = cuda::SdpaPlan::create(d);
    const double build_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::string bytes = built->serialize();
    ASSERT_FALSE(bytes.empty()) << cuda::describe(d) << ": engine " << built->engine().tag
                                << " did not serialize";
    std::string why;
    t0 = std::chrono::steady_clock::now();
    auto restored = cuda::SdpaPlan::try_restore(d, built->engine().tag, bytes, &why);
    const double restore_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(restored) << why;
    EXPECT_EQ(restored->workspace_bytes(), built->workspace_bytes());
    auto cached = cuda::SdpaPlan::create(d);
    EXPECT_EQ(cached->engine().tag, built->engine().tag);
    EXPECT_EQ(cached->workspace_bytes(), built->workspace_bytes());
    std::printf("%s: engine %s, %zu bytes serialized; built in %.1f ms, restored in %.1f ms\n",
                cuda::describe(d).c_str(), built->engine().tag.c_str(), bytes.size(),
                build_s * 1e3, restore_s * 1e3);
    const size_t n = size_t(d.batch * d.heads * d.seq_q * d.head_dim);
    const auto q = rounded(randn(n, rng), dt), k = rounded(randn(n, rng), dt),
               v = rounded(randn(n, rng), dt);
    auto dq = upload(q, dt), dk = upload(k, dt), dv = upload(v, dt);
    const std::array<int64_t, 4> st = {197 * 12 * 64, 197 * 64, 64, 1};
    const auto ref = sdpa_reference(d, q, k, v, {}, st, st, st);
    auto run = [&](const cuda::SdpaPlan& plan) {
      auto out = nan_buffer(n, dt);
      DeviceBuffer ws(plan.workspace_bytes());
      plan.run({.q = dq->get(), .k = dk->get(), .v = dv->get(), .o = out->get(),
                .workspace = ws.get(), .workspace_bytes = ws.bytes()});
      return download(*out, n, dt);
    };
    const std::vector<double> a = run(*built), b = run(*restored), c = run(*cached);
    EXPECT_TRUE(same_bits(a, b, "the restored plan"));
    EXPECT_TRUE(same_bits(a, c, "the cached plan"));
    EXPECT_TRUE(close_to(b, ref, tolerance(dt), cuda::describe(d) + " restored"));
    const std::vector<cuda::SdpaEngine> all = cached->candidates();
    EXPECT_EQ(all[size_t(cached->engine().index)].tag, built->engine().tag);
    const std::vector<double> c2 = run(*cached);
    EXPECT_TRUE(same_bits(a, c2, "the cached plan, built out"));
    EXPECT_FALSE(cuda::SdpaPlan::try_restore(d, built->engine().tag,
                                             bytes.substr(0, bytes.size() / 2), &why));
    EXPECT_FALSE(cuda::SdpaPlan::try_restore(d, built->engine().tag, "x", &why));
  }
}

TEST(CudnnSdpa, NotSupportedHasReasons) {
  cuda::SdpaDesc d{.dtype = DType::Float32, .batch = 1, .heads = 1, .seq_q = 8, .seq_kv = 8,
                   .head_dim = 64};
  cuda::SdpaSupport s = cuda::sdpa_supported(d);
  EXPECT_FALSE(s.supported);
  EXPECT_TRUE(contains(s.reason, "float16 and bfloat16")) << s.reason;
  d.dtype = DType::Float16;
  d.head_dim = 12;
  s = cuda::sdpa_supported(d);
  EXPECT_FALSE(s.supported);
  EXPECT_TRUE(contains(s.reason, "multiples of 8")) << s.reason;
  std::string why;
  EXPECT_EQ(cuda::SdpaPlan::try_create(d, &why), nullptr);
  EXPECT_EQ(error_of([&] { cuda::SdpaPlan::create(d); }).kind(), ErrorKind::NotSupported);
  d.head_dim = 64;
  d.causal = d.mask = true;
  EXPECT_EQ(error_of([&] { cuda::sdpa_supported(d); }).kind(), ErrorKind::InvalidArgument);
}

// Kiln defines an all-masked row as NaN; the flag says whether cuDNN agrees.
TEST(CudnnSdpa, FullyMaskedRowMatchesTheFlag) {
  auto rng = rng_for_test();
  cuda::SdpaDesc d{.dtype = DType::Float16, .batch = 1, .heads = 2, .seq_q = 8, .seq_kv = 16,
                   .head_dim = 64, .mask = true, .mask_heads = 2};
  SdpaRun r = run_sdpa(d, rng, false, [](std::vector<double>& m) {
    for (int j = 0; j < 16; ++j) m[size_t(3 * 16 + j)] = -INFINITY;  // row 3 of head 0
  });
  ASSERT_TRUE(r.ran) << r.why_not;
  int nan_row3 = 0, nan_elsewhere = 0;
  for (size_t i = 0; i < r.got.size(); ++i) {
    const bool row3 = i / 64 == 3;  // head 0, query row 3
    (row3 ? nan_row3 : nan_elsewhere) += std::isnan(r.got[i]);
  }
  EXPECT_EQ(nan_elsewhere, 0);
  EXPECT_EQ(nan_row3, cuda::sdpa_fully_masked_row_is_nan() ? 64 : 0)
      << "update sdpa_fully_masked_row_is_nan() to what cuDNN does";
  // The other rows still match the reference.
  for (size_t i = 3 * 64; i < 4 * 64; ++i) r.got[i] = r.ref[i];
  EXPECT_TRUE(close_to(r.got, r.ref, 1e-2, "rows other than the masked one"));
}

// Note [guarded attention masks] (passes/attention_mask_guard.h): a NaN in a row's mask makes
// the row NaN, as the reference has it, on every candidate engine: a row whose mask is all NaN
// (what the guard makes of a row masked whole), one with a single NaN, and one with a +inf. The
// output starts finite (7), so a NaN is the engine's. The other rows, some with keys masked
// -inf and one attending a single key, match the reference.
TEST(CudnnSdpa, ANaNMaskRowIsANaNRow) {
  auto rng = rng_for_test();
  for (DType dt : {DType::BFloat16, DType::Float16}) {
    cuda::SdpaDesc d{.dtype = dt, .batch = 2, .heads = 2, .seq_q = 8, .seq_kv = 40,
                     .head_dim = 64, .mask = true, .mask_batch = 2, .mask_heads = 1};
    std::string why;
    auto probe = cuda::SdpaPlan::try_create(d, &why);
    ASSERT_NE(probe, nullptr) << why;
    const int engines = int(probe->candidates().size());
    ASSERT_GT(engines, 0);
    const int64_t S = d.seq_kv, L = d.seq_q;
    auto edit = [&](std::vector<double>& m) {
      for (size_t x = 0; x < m.size(); x += 4) m[x] = -INFINITY;   // a quarter of the keys
      for (int64_t j = 0; j < S; ++j) m[size_t(3 * S + j)] = kNaN;  // batch 0, row 3: all NaN
      m[size_t(5 * S + 17)] = kNaN;                                 // batch 0, row 5: one NaN
      m[size_t((L + 2) * S + 9)] = INFINITY;                        // batch 1, row 2: one +inf
      for (int64_t j = 0; j < S; ++j) m[size_t((L + 4) * S + j)] = j == 6 ? 0.0 : -INFINITY;
    };
    for (int e = 0; e < engines; ++e) {
      SCOPED_TRACE(fmt::format("{} engine {} of {}", dtype_name(dt), e, engines));
      SdpaRun r = run_sdpa(d, rng, false, edit, e, 7.0);
      ASSERT_TRUE(r.ran) << r.why_not;
      const int64_t Dv = d.head_dim;
      int64_t nan_rows = 0;
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t h = 0; h < 2; ++h)
          for (int64_t i = 0; i < L; ++i) {
            const size_t row = size_t(((b * 2 + h) * L + i) * Dv);
            const bool want_nan = (b == 0 && (i == 3 || i == 5)) || (b == 1 && i == 2);
            EXPECT_EQ(std::isnan(r.ref[row]), want_nan) << "reference b" << b << " row " << i;
            int64_t nans = 0;
            for (int64_t x = 0; x < Dv; ++x) nans += std::isnan(r.got[row + size_t(x)]);
            EXPECT_EQ(nans, want_nan ? Dv : 0) << "b" << b << " h" << h << " row " << i;
            nan_rows += want_nan;
          }
      EXPECT_EQ(nan_rows, 6);
      EXPECT_TRUE(close_to(r.got, r.ref, 1e-2, "the rows without a NaN"));
    }
  }
}

TEST(CudnnSdpa, EveryCandidateEngineIsCorrect) {
  auto rng = rng_for_test();
  cuda::SdpaDesc d{.dtype = DType::BFloat16, .batch = 2, .heads = 2, .seq_q = 64, .seq_kv = 64,
                   .head_dim = 64, .causal = true};
  auto plan = cuda::SdpaPlan::create(d);
  const auto cs = plan->candidates();
  ASSERT_FALSE(cs.empty());
  EXPECT_EQ(cs[0].tag, plan->engine().tag);
  for (size_t i = 0; i < cs.size(); ++i) {
    SdpaRun r = run_sdpa(d, rng, false, nullptr, int(i));
    ASSERT_TRUE(r.ran);
    EXPECT_TRUE(close_to(r.got, r.ref, 1e-2, "engine " + cs[i].tag));
  }
}

}  // namespace
}  // namespace kiln
