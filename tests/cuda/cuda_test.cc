// kiln_cuda_tests: Kiln's CUDA path end to end: host<->device copies, the CUDA eager kernels
// (src/eager/cuda) against the CPU eager results on fresh random inputs, the caching allocator,
// and the errors for mixed devices, missing kernels and unsupported dtypes.
//
// Without a CUDA device main() prints "no CUDA device: <reason>" and exits 77, which CTest
// reports as skipped (SKIP_RETURN_CODE), never as passed. scripts/cuda_tests.sh runs it on a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "../support/compare.h"
#include "core/allocator.h"
#include "core/cuda_runtime.h"
#include "ops/api.h"
#include "ops/kernel_path.h"
#include "ops/op.h"

namespace kiln {
namespace {

const Device kCuda = Device::cuda(0);

const std::vector<DType> kAllDTypes = {DType::Float32, DType::Float16, DType::BFloat16,
                                       DType::Float64, DType::Int64,   DType::Int32,
                                       DType::Int8,    DType::UInt8,   DType::Bool};
const std::vector<DType> kFloatDTypes = {DType::Float32, DType::Float16, DType::BFloat16,
                                         DType::Float64};

// Fresh random values of dtype d on the CPU: normal * scale for floats, the whole range for
// 8-bit integers and bool, [-int_range, int_range) for wider integers.
Tensor random_tensor(Generator& g, const Dims& sizes, DType d, double scale = 1.0,
                     int64_t int_range = 1000) {
  if (is_floating(d)) {
    Tensor t = Tensor::randn(sizes, g, DType::Float64);
    double* p = t.data<double>();
    for (int64_t i = 0; i < t.numel(); ++i) p[i] *= scale;
    return t.to(d);
  }
  switch (d) {
    case DType::Bool: return Tensor::randint(sizes, g, 0, 2, d);
    case DType::UInt8: return Tensor::randint(sizes, g, 0, 256, d);
    case DType::Int8: return Tensor::randint(sizes, g, -128, 128, d);
    default: return Tensor::randint(sizes, g, -int_range, int_range, d);
  }
}

Tensor to_host(const Tensor& t) { return t.device().is_cpu() ? t : t.to(Device::cpu()); }

struct Tol {
  double rtol = 0, atol = 0;
};

// got (any device) must have want's dtype and shape and match it element by element within
// atol + rtol * |want| (tests/support/compare.h: NaN matches NaN only, an infinity the same
// infinity only; integers and bool exactly).
void expect_close(const Tensor& got_any, const Tensor& want_any, Tol tol, const std::string& what) {
  ASSERT_TRUE(got_any.defined()) << what;
  Tensor got = to_host(got_any), want = to_host(want_any);
  ASSERT_EQ(dtype_name(got.dtype()), std::string(dtype_name(want.dtype()))) << what;
  EXPECT_TRUE(test::close(got, want, test::Tolerance::rel(tol.rtol, tol.atol)))
      << what << " (CUDA vs CPU)";
}

// Both tensors' bytes must be identical, except that any NaN matches any NaN (payloads differ
// between the CPU and CUDA conversion routines).
void expect_bitwise(const Tensor& got, const Tensor& want, const std::string& what) {
  expect_close(got, want, Tol{}, what);
}

// Per dtype tolerances for transcendental unary ops: CUDA's float functions are within 2 ulp,
// the CPU reference is float64 rounded once; a 16-bit result may land one ulp apart.
Tol unary_tol(DType d) {
  switch (d) {
    case DType::Float32: return {3e-6, 3e-6};
    case DType::Float16: return {1e-3, 1e-3};
    case DType::BFloat16: return {8e-3, 8e-3};
    case DType::Float64: return {1e-13, 1e-13};
    default: return {};
  }
}

// ---- host <-> device ----------------------------------------------------------------------------
TEST(CudaCopy, HostDeviceRoundTripEveryDtype) {
  Generator g(101);
  for (DType d : kAllDTypes) {
    for (const Dims& sizes : {Dims{37, 129}, Dims{}, Dims{0, 5}, Dims{3, 1, 1000}}) {
      Tensor host = random_tensor(g, sizes, d, 1.0, int64_t(1) << 40);
      Tensor dev = host.to(kCuda);
      EXPECT_EQ(dev.device(), kCuda);
      EXPECT_EQ(dev.dtype(), d);
      Tensor back = dev.to(Device::cpu());
      ASSERT_EQ(to_string(back.sizes()), to_string(sizes));
      EXPECT_EQ(std::memcmp(back.raw_data(), host.raw_data(), host.nbytes()), 0)
          << dtype_name(d) << " " << to_string(sizes);
      // A device-to-device copy (clone) keeps the bytes too.
      Tensor again = dev.clone().to(Device::cpu());
      EXPECT_EQ(std::memcmp(again.raw_data(), host.raw_data(), host.nbytes()), 0)
          << "clone " << dtype_name(d);
    }
  }
}

// A strided CUDA view brought to the host (Tensor::to, which core does without kernels).
TEST(CudaCopy, StridedViewToHost) {
  Generator g(102);
  Tensor host = random_tensor(g, {9, 14}, DType::Float32);
  Tensor view = transpose(host.to(kCuda), 0, 1);
  ASSERT_FALSE(view.is_contiguous());
  expect_bitwise(view.to(Device::cpu()), copy(transpose(host, 0, 1)), "transposed view to host");
}

// ---- copy (strided -> contiguous) ---------------------------------------------------------------
TEST(CudaCopy, StridedViewsEveryDtype) {
  Generator g(103);
  for (DType d : kAllDTypes) {
    Tensor host = random_tensor(g, {6, 40, 33}, d, 1.0, int64_t(1) << 40);
    Tensor dev = host.to(kCuda);
    struct Case {
      const char* note;
      Tensor (*view)(const Tensor&);
    };
    const Case cases[] = {
        {"permute(2,0,1)", [](const Tensor& t) { return permute(t, {2, 0, 1}); }},
        {"slice step 3 with offset",
         [](const Tensor& t) { return slice(slice(t, 1, 5, 38, 3), 2, 1, 30); }},
        {"expand (stride 0)",
         [](const Tensor& t) { return expand(slice(t, 0, 2, 3), {4, 40, 33}); }},
        {"transpose of a slice", [](const Tensor& t) { return transpose(slice(t, 2, 7, 9), 0, 2); }},
        {"contiguous", [](const Tensor& t) { return t; }},
    };
    for (const Case& c : cases) {
      Tensor dv = c.view(dev), hv = c.view(host);
      ASSERT_EQ(dv.device(), kCuda) << c.note;
      Tensor out = copy(dv);
      EXPECT_EQ(out.device(), kCuda);
      EXPECT_TRUE(out.is_contiguous());
      expect_bitwise(out, copy(hv), std::string(dtype_name(d)) + " " + c.note);
    }
  }
}

// ---- cast ---------------------------------------------------------------------------------------
TEST(CudaCast, EveryPairMatchesCpu) {
  Generator g(104);
  // Random values plus the edge cases of the conversion rules: NaN, infinities, saturation of
  // every integer type, half overflow and subnormals, bfloat16 rounding ties.
  Tensor base = Tensor::randn({41, 17}, g, DType::Float64);
  double* p = base.data<double>();
  for (int64_t i = 0; i < base.numel(); ++i) p[i] *= (i % 3 == 0) ? 300.0 : 4.0;
  const double specials[] = {std::nan(""), INFINITY, -INFINITY, 1e10, -1e10, 3e38, -3e38, 0.5,
                             -0.5, 255.5, 256, -129, 127.9, 65504, 65520, 70000, 1e-7, 6e-8,
                             -0.0, 2147483648.0, -2147483649.0, 9.3e18, 1.00390625, 1.01171875};
  for (size_t i = 0; i < std::size(specials); ++i) p[i * 7] = specials[i];
  for (DType src : kAllDTypes) {
    Tensor host = base.to(src);
    Tensor dev = host.to(kCuda);
    for (DType dst : kAllDTypes) {
      std::string what = std::string(dtype_name(src)) + " -> " + dtype_name(dst);
      Tensor out = cast(dev, dst);
      EXPECT_EQ(out.device(), kCuda) << what;
      expect_bitwise(out, cast(host, dst), what);
      // Strided source too.
      expect_bitwise(cast(transpose(dev, 0, 1), dst), cast(transpose(host, 0, 1), dst),
                     what + " (transposed)");
    }
  }
}

// ---- binary ops ---------------------------------------------------------------------------------
using BinaryFn = Tensor (*)(const Tensor&, const Tensor&);

struct BinaryCase {
  const char* name;
  BinaryFn fn;
  bool ints;
};
const BinaryCase kBinaryOps[] = {
    {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }, true},
    {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }, true},
    {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }, true},
    {"div", [](const Tensor& a, const Tensor& b) { return div(a, b); }, false},
    {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }, true},
    {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }, true},
};

// Each binary op rounds once from exactly representable operands (float for the 16-bit types,
// whose double rounding through float is innocuous), so CUDA matches the CPU exactly.
TEST(CudaBinary, BroadcastingEveryDtypeMatchesCpuExactly) {
  Generator g(105);
  struct Shapes {
    Dims a, b;
    bool transpose_a;
  };
  const Shapes shapes[] = {
      {{5, 7, 9}, {5, 7, 9}, false},  {{4, 1, 6}, {5, 1}, false}, {{3, 1}, {1, 7}, false},
      {{}, {2, 3}, false},            {{2, 3, 4}, {4}, false},    {{9, 5}, {9}, true},
      {{513, 1029}, {1029}, false},   {{0, 3}, {3}, false},       {{17, 31}, {31, 17}, true},
  };
  const DType dtypes[] = {DType::Float32, DType::Float16, DType::BFloat16,
                          DType::Float64, DType::Int32,   DType::Int64};
  for (const BinaryCase& op : kBinaryOps) {
    for (DType d : dtypes) {
      if (!is_floating(d) && !op.ints) continue;
      for (const Shapes& s : shapes) {
        Tensor a = random_tensor(g, s.a, d, 3.0), b = random_tensor(g, s.b, d, 3.0);
        if (s.transpose_a) a = transpose(a, 0, 1);
        std::string what = std::string(op.name) + " " + dtype_name(d) + " " + to_string(a.sizes()) +
                           " x " + to_string(b.sizes());
        Tensor want = op.fn(a, b);
        Tensor got = op.fn(a.to(kCuda), b.to(kCuda));
        EXPECT_EQ(got.device(), kCuda) << what;
        expect_bitwise(got, want, what);
      }
    }
  }
}

TEST(CudaBinary, MixedDtypesPromoteLikeCpu) {
  Generator g(106);
  const std::pair<DType, DType> pairs[] = {{DType::Float16, DType::Float32},
                                           {DType::BFloat16, DType::Float16},
                                           {DType::Int32, DType::Float32},
                                           {DType::Int32, DType::Int64},
                                           {DType::Float32, DType::Float64},
                                           {DType::UInt8, DType::Int32}};
  for (auto [da, db] : pairs) {
    for (const BinaryCase& op : kBinaryOps) {
      Tensor a = random_tensor(g, {6, 1, 8}, da, 3.0), b = random_tensor(g, {7, 8}, db, 3.0);
      if (!is_floating(promote_types(da, db)) && !op.ints) continue;
      std::string what = std::string(op.name) + " " + dtype_name(da) + " x " + dtype_name(db);
      Tensor want = op.fn(a, b);
      Tensor got = op.fn(a.to(kCuda), b.to(kCuda));
      expect_bitwise(got, want, what);
    }
  }
}

TEST(CudaBinary, ScalarOperandsAndOperators) {
  Generator g(107);
  Tensor a = random_tensor(g, {33, 65}, DType::Float32);
  Tensor b = random_tensor(g, {65}, DType::Float32);
  Tensor da = a.to(kCuda), db = b.to(kCuda);
  expect_bitwise((da + db) * 0.5 - da / 3.0, (a + b) * 0.5 - a / 3.0, "expression with scalars");
}

// ---- unary ops ----------------------------------------------------------------------------------
TEST(CudaUnary, ReluEveryDtype) {
  Generator g(108);
  for (DType d : {DType::Float32, DType::Float16, DType::BFloat16, DType::Float64, DType::Int32,
                  DType::Int64}) {
    Tensor x = random_tensor(g, {257, 129}, d, 2.0);
    expect_bitwise(relu(x.to(kCuda)), relu(x), std::string("relu ") + dtype_name(d));
    Tensor xt = transpose(x, 0, 1);
    expect_bitwise(relu(transpose(x.to(kCuda), 0, 1)), relu(xt),
                   std::string("relu transposed ") + dtype_name(d));
  }
  // NaN propagates, -0 and +-inf are handled like the CPU.
  Tensor special = Tensor::from_vector<float>({NAN, -0.0f, INFINITY, -INFINITY, 1.5f, -2.f}, {6});
  expect_bitwise(relu(special.to(kCuda)), relu(special), "relu specials");
}

TEST(CudaUnary, EveryKernelMatchesCpu) {
  Generator g(109);
  using UnaryFn = Tensor (*)(const Tensor&);
  struct Case {
    const char* name;
    UnaryFn fn;
    int domain;  // 0: any value, 1: positive, 2: quarter values (rounding ops)
    bool ints;
  };
  const Case cases[] = {
      {"neg", [](const Tensor& x) { return neg(x); }, 0, true},
      {"abs", [](const Tensor& x) { return abs(x); }, 0, true},
      {"sign", [](const Tensor& x) { return sign(x); }, 0, true},
      {"exp", [](const Tensor& x) { return exp(x); }, 0, false},
      {"log", [](const Tensor& x) { return log(x); }, 1, false},
      {"sqrt", [](const Tensor& x) { return sqrt(x); }, 1, false},
      {"rsqrt", [](const Tensor& x) { return rsqrt(x); }, 1, false},
      {"reciprocal", [](const Tensor& x) { return reciprocal(x); }, 1, false},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }, 0, false},
      {"tanh", [](const Tensor& x) { return tanh(x); }, 0, false},
      {"silu", [](const Tensor& x) { return silu(x); }, 0, false},
      {"gelu", [](const Tensor& x) { return gelu(x); }, 0, false},
      {"gelu tanh", [](const Tensor& x) { return gelu(x, "tanh"); }, 0, false},
      {"erf", [](const Tensor& x) { return erf(x); }, 0, false},
      {"sin", [](const Tensor& x) { return sin(x); }, 0, false},
      {"cos", [](const Tensor& x) { return cos(x); }, 0, false},
      {"floor", [](const Tensor& x) { return floor(x); }, 2, false},
      {"ceil", [](const Tensor& x) { return ceil(x); }, 2, false},
      {"round", [](const Tensor& x) { return round(x); }, 2, false},
  };
  for (const Case& c : cases) {
    for (DType d : {DType::Float32, DType::Float16, DType::BFloat16, DType::Float64, DType::Int32,
                    DType::Int64}) {
      if (!is_floating(d) && !c.ints) continue;
      Tensor x64;
      if (c.domain == 1) {
        x64 = Tensor::rand({31, 47}, g, 0.05, 6.0, DType::Float64);
      } else {
        x64 = Tensor::randn({31, 47}, g, DType::Float64);
        double* p = x64.data<double>();
        for (int64_t i = 0; i < x64.numel(); ++i)
          p[i] = c.domain == 2 ? std::floor(p[i] * 4) + 0.25 + 0.5 * double(i % 2) : p[i] * 2.5;
      }
      Tensor x = is_floating(d) ? x64.to(d) : random_tensor(g, {31, 47}, d);
      Tol tol = c.domain == 2 || !is_floating(d) ? Tol{} : unary_tol(d);
      std::string what = std::string(c.name) + " " + dtype_name(d);
      expect_close(c.fn(x.to(kCuda)), c.fn(x), tol, what);
      expect_close(c.fn(transpose(x.to(kCuda), 0, 1)), c.fn(transpose(x, 0, 1)), tol,
                   what + " (transposed)");
    }
  }
}

// ---- sum and mean -------------------------------------------------------------------------------
// The CUDA result against the CPU eager sum of the float64 input. Bound (Note [CUDA sum]):
// ~1.2e-6 * sum|x| for float accumulation, plus one rounding of the result to a 16-bit dtype.
void expect_sum_close(const Tensor& got_dev, const Tensor& x, std::vector<int64_t> dims,
                      bool keepdim, bool is_mean, const std::string& what) {
  Tensor x64 = x.to(DType::Float64);
  Tensor want = is_mean ? mean(x64, dims, keepdim) : sum(x64, dims, keepdim);
  Tensor mag = is_mean ? mean(abs(x64), dims, keepdim) : sum(abs(x64), dims, keepdim);
  Tensor got = to_host(got_dev);
  ASSERT_EQ(dtype_name(got.dtype()), std::string(dtype_name(x.dtype()))) << what;
  ASSERT_EQ(to_string(got.sizes()), to_string(want.sizes())) << what;
  double acc_eps = x.dtype() == DType::Float64 ? 1e-15 : 2e-6;
  double out_eps = x.dtype() == DType::Float16    ? 1.0 / 2048
                   : x.dtype() == DType::BFloat16 ? 1.0 / 256
                                                  : 0.0;
  // acc_eps * sum|x| (per output) + out_eps * |want| + 1e-30 (tests/support/compare.h).
  EXPECT_TRUE(test::close(got, want,
                          test::Tolerance::of_scales(mag.contiguous().to_vector<double>(), acc_eps,
                                                     1e-30).plus_rel(out_eps)))
      << what << " (CUDA vs CPU float64)";
}

TEST(CudaSum, AnyDimsKeepdimEveryFloatDtype) {
  Generator g(110);
  const std::vector<std::vector<int64_t>> dim_sets = {{}, {0}, {1}, {2}, {-1}, {0, 1},
                                                      {0, 2}, {1, 2}, {0, 1, 2}};
  for (DType d : kFloatDTypes) {
    Tensor x = random_tensor(g, {7, 33, 65}, d);
    Tensor base = random_tensor(g, {65, 7, 33}, d);
    // {host, device} pairs: contiguous, and the same permuted (non-contiguous) view of a base.
    const std::pair<Tensor, Tensor> inputs[] = {
        {x, x.to(kCuda)}, {permute(base, {1, 2, 0}), permute(base.to(kCuda), {1, 2, 0})}};
    for (const auto& [in, dev] : inputs) {
      for (const auto& dims : dim_sets) {
        for (bool keepdim : {false, true}) {
          std::string what = std::string(dtype_name(d)) + (in.is_contiguous() ? "" : " permuted") +
                             " dims " + std::to_string(dims.size()) + "{" +
                             (dims.empty() ? "" : std::to_string(dims[0])) + "..} keepdim " +
                             std::to_string(keepdim);
          expect_sum_close(sum(dev, dims, keepdim), in, dims, keepdim, false, "sum " + what);
          expect_sum_close(mean(dev, dims, keepdim), in, dims, keepdim, true, "mean " + what);
        }
      }
    }
  }
}

TEST(CudaSum, SplitReductionsAndEdgeCases) {
  Generator g(111);
  struct Case {
    Dims sizes;
    std::vector<int64_t> dims;
  };
  // Few outputs over long rows (inner, split) and long columns (outer, split); a scalar; empty.
  const Case cases[] = {{{3, 50000}, {1}},   {{50000, 3}, {0}}, {{40, 300, 7}, {0, 1}},
                        {{11, 2, 4099}, {0, 2}}, {{}, {}},       {{5}, {0}}};
  for (DType d : kFloatDTypes) {
    for (const Case& c : cases) {
      Tensor x = random_tensor(g, c.sizes, d);
      std::string what = std::string(dtype_name(d)) + " " + to_string(c.sizes);
      expect_sum_close(sum(x.to(kCuda), c.dims), x, c.dims, false, false, "sum " + what);
      expect_sum_close(mean(x.to(kCuda), c.dims), x, c.dims, false, true, "mean " + what);
    }
  }
  // Empty reductions: sum 0, mean NaN (0/0), as on the CPU.
  Tensor empty = Tensor::empty({0, 4}, DType::Float32);
  expect_close(sum(empty.to(kCuda), {0}), sum(empty, {0}), Tol{}, "sum over an empty dim");
  expect_close(mean(empty.to(kCuda), {0}), mean(empty, {0}), Tol{}, "mean over an empty dim");
  // inf and NaN propagate through the compensated sum.
  Tensor special = Tensor::from_vector<float>({1.f, INFINITY, 2.f, NAN, 3.f, 4.f, -INFINITY, 5.f},
                                              {2, 4});
  expect_close(sum(special.to(kCuda), {1}), sum(special, {1}), Tol{}, "sum with inf and NaN");
}

// 10M-element float32 reductions in every layout the planner distinguishes.
TEST(CudaSum, TenMillionElements) {
  Generator g(112);
  Tensor x = random_tensor(g, {2500, 4000}, DType::Float32);
  Tensor dev = x.to(kCuda);
  expect_sum_close(sum(dev), x, {}, false, false, "sum of 10M (all)");
  expect_sum_close(sum(dev, {0}), x, {0}, false, false, "sum of 10M over dim 0 (outer)");
  expect_sum_close(sum(dev, {1}, true), x, {1}, true, false, "sum of 10M over dim 1 (inner)");
  expect_sum_close(mean(dev, {1}), x, {1}, false, true, "mean of 10M over dim 1");
  Tensor x3 = x.as_strided({100, 1000, 100}, {100000, 100, 1}, 0);
  Tensor dev3 = dev.as_strided({100, 1000, 100}, {100000, 100, 1}, 0);
  expect_sum_close(sum(dev3, {0, 2}), x3, {0, 2}, false, false, "sum of 10M over dims {0,2}");
  Tensor row = random_tensor(g, {10, 1000000}, DType::Float32);
  expect_sum_close(sum(row.to(kCuda), {1}), row, {1}, false, false, "sum of 10 rows of 1M");
  // A transposed 10M view: the planner reorders the reduced dims for coalesced reads.
  expect_sum_close(sum(transpose(dev, 0, 1)), transpose(x, 0, 1), {}, false, false,
                   "sum of a transposed 10M view");
}

// max/min pick one input element each: exact in every dtype, NaN propagating.
TEST(CudaReduce, MaxMinExactEveryFloatDtype) {
  Generator g(120);
  struct Case {
    Dims sizes;
    std::vector<int64_t> dims;
  };
  const Case cases[] = {{{7, 33, 65}, {}},      {{7, 33, 65}, {2}},    {{7, 33, 65}, {0}},
                        {{7, 33, 65}, {0, 2}},  {{3, 50000}, {1}},     {{50000, 3}, {0}},
                        {{2500, 4000}, {}}};
  for (DType d : kFloatDTypes) {
    for (const Case& c : cases) {
      if (numel(c.sizes) > 1000000 && d != DType::Float32) continue;
      Tensor x = random_tensor(g, c.sizes, d);
      Tensor dev = x.to(kCuda);
      std::string what = std::string(dtype_name(d)) + " " + to_string(c.sizes);
      expect_bitwise(amax(dev, c.dims), amax(x, c.dims), "amax " + what);
      expect_bitwise(amin(dev, c.dims, true), amin(x, c.dims, true), "amin keepdim " + what);
    }
  }
  Tensor special = Tensor::from_vector<float>({1.f, NAN, 2.f, 0.f, -INFINITY, 5.f}, {2, 3});
  expect_bitwise(amax(special.to(kCuda), {1}), amax(special, {1}), "amax with NaN");
  expect_bitwise(amin(special.to(kCuda), {0}), amin(special, {0}), "amin with NaN");
}

TEST(CudaReduce, VarMatchesCpu) {
  Generator g(121);
  for (DType d : kFloatDTypes) {
    Tensor x = random_tensor(g, {6, 40, 50}, d, 2.0);
    Tensor xt = transpose(x, 0, 2);
    Tensor dev = x.to(kCuda), devt = transpose(dev, 0, 2);
    Tol tol = d == DType::Float64 ? Tol{1e-12, 1e-12} : d == DType::Float32 ? Tol{2e-5, 1e-6}
                                                                              : unary_tol(d);
    for (const auto& dims : std::vector<std::vector<int64_t>>{{}, {1}, {0, 2}, {-1}}) {
      for (int64_t corr : {0, 1}) {
        std::string what = std::string("var ") + dtype_name(d) + " dims " +
                           std::to_string(dims.size()) + " correction " + std::to_string(corr);
        expect_close(var(dev, dims, corr), var(x, dims, corr), tol, what);
        expect_close(var(devt, dims, corr, true), var(xt, dims, corr, true), tol,
                     what + " (transposed, keepdim)");
      }
    }
  }
}

// softmax, log_softmax and layer_norm have no CUDA kernels of their own: they run on CUDA
// through their decompositions into the ops above.
TEST(CudaDecomposed, SoftmaxAndLayerNormMatchCpu) {
  Generator g(122);
  for (DType d : kFloatDTypes) {
    Tensor x = random_tensor(g, {8, 16, 77}, d, 3.0);
    Tensor dev = x.to(kCuda);
    Tol tol = d == DType::Float64 ? Tol{1e-12, 1e-13} : d == DType::Float32 ? Tol{2e-5, 2e-6}
                                                                              : unary_tol(d);
    for (int64_t dim : {-1, 0, 1}) {
      std::string what = std::string(dtype_name(d)) + " dim " + std::to_string(dim);
      expect_close(softmax(dev, dim), softmax(x, dim), tol, "softmax " + what);
      expect_close(log_softmax(dev, dim), log_softmax(x, dim), tol, "log_softmax " + what);
    }
    Tensor w = random_tensor(g, {77}, d), b = random_tensor(g, {77}, d);
    expect_close(layer_norm(dev, {77}, w.to(kCuda), b.to(kCuda)), layer_norm(x, {77}, w, b), tol,
                 std::string("layer_norm ") + dtype_name(d));
  }
}

// ---- caching allocator --------------------------------------------------------------------------
TEST(CudaAllocator, FreedBlockIsReusedAndCacheEmpties) {
  cuda_synchronize(0);
  cuda_empty_cache();
  const CudaAllocatorStats s0 = cuda_allocator_stats(0);
  // 40 MiB of float32. Earlier tests of this process leave segments in use, whose free ends
  // may hold it (the best fit, Note [Device memory from segments]), so a block needs at most one
  // cudaMalloc, not exactly one.
  const int64_t n = int64_t(10) << 20;
  const size_t bytes = size_t(n) * 4;
  Generator g(113);
  Tensor host = random_tensor(g, {n}, DType::Float32);
  CudaAllocatorStats s1;
  {
    Tensor t = host.to(kCuda);
    s1 = cuda_allocator_stats(0);
    EXPECT_LE(s1.cuda_malloc_calls, s0.cuda_malloc_calls + 1);
    EXPECT_EQ(s1.allocated_bytes, s0.allocated_bytes + bytes);
    EXPECT_GE(s1.reserved_bytes, s1.allocated_bytes);
    EXPECT_GE(s1.peak_allocated_bytes, s1.allocated_bytes);
  }
  const CudaAllocatorStats s2 = cuda_allocator_stats(0);
  EXPECT_EQ(s2.allocated_bytes, s0.allocated_bytes) << "freeing did not return the block";
  EXPECT_EQ(s2.reserved_bytes, s1.reserved_bytes) << "freed memory should stay cached";
  CudaAllocatorStats s3, s4;
  {
    // Same size again: from the cache (the free list, or the segment it left empty), no
    // cudaMalloc; the data is intact.
    Tensor t = host.to(kCuda);
    s3 = cuda_allocator_stats(0);
    EXPECT_EQ(s3.cuda_malloc_calls, s2.cuda_malloc_calls);
    EXPECT_EQ(s3.reserved_bytes, s2.reserved_bytes);
    expect_bitwise(t, host, "data through reused memory");
    // A second live block of the same size: both counted, the peak raised.
    Tensor u = host.to(kCuda);
    s4 = cuda_allocator_stats(0);
    EXPECT_LE(s4.cuda_malloc_calls, s3.cuda_malloc_calls + 1);
    EXPECT_EQ(s4.allocated_bytes, s0.allocated_bytes + 2 * bytes);
    EXPECT_GE(s4.peak_allocated_bytes, s0.allocated_bytes + 2 * bytes);
    expect_bitwise(u, host, "a second block");
    expect_bitwise(t, host, "the first block beside the second");
  }
  cuda_empty_cache();
  const CudaAllocatorStats s5 = cuda_allocator_stats(0);
  EXPECT_EQ(s5.allocated_bytes, s0.allocated_bytes);
  EXPECT_LE(s5.reserved_bytes, s4.reserved_bytes);
  EXPECT_GE(s5.reserved_bytes, s5.allocated_bytes);
  // The numbers docs/cuda.md records (cumulative over the process: earlier tests count too).
  std::printf("[allocator] 40 MiB block: alloc -> cudaMalloc calls %lld -> %lld; free + alloc "
              "again -> cudaMalloc calls %lld; second live block -> cudaMalloc calls %lld; "
              "reserved %zu -> %zu bytes after empty_cache; process peak allocated %zu bytes\n",
              (long long)s0.cuda_malloc_calls, (long long)s1.cuda_malloc_calls,
              (long long)s3.cuda_malloc_calls, (long long)s4.cuda_malloc_calls, s4.reserved_bytes,
              s5.reserved_bytes, s5.peak_allocated_bytes);
}

// Weights of awkward sizes cost what they hold: a 768 x 768 bfloat16 matrix (1.1 MiB) took a
// 2 MiB block before the segments, now 1.1 MiB rounded to 512 bytes.
TEST(CudaAllocator, BlocksAreSizedToTheirTensors) {
  cuda_synchronize(0);
  const CudaAllocatorStats s0 = cuda_allocator_stats(0);
  std::vector<Tensor> ws;
  for (int i = 0; i < 8; ++i) ws.push_back(Tensor::empty({768, 768}, DType::BFloat16, kCuda));
  const CudaAllocatorStats s1 = cuda_allocator_stats(0);
  EXPECT_EQ(s1.allocated_bytes - s0.allocated_bytes, size_t(8) * 768 * 768 * 2);
  EXPECT_LE(s1.cuda_malloc_calls - s0.cuda_malloc_calls, 1);  // at most one new segment
}

// Eager ops allocate their outputs and scratch through the cache: a steady-state loop makes no
// cudaMalloc calls once warm, and reserves nothing more (its blocks come from the free lists,
// or are carved again from a segment that the last iteration left empty).
TEST(CudaAllocator, SteadyStateEagerLoopHitsTheCache) {
  Generator g(114);
  Tensor a = random_tensor(g, {64, 4096}, DType::Float32).to(kCuda);
  Tensor b = random_tensor(g, {4096}, DType::Float32).to(kCuda);
  // Two warm-up iterations: the second finds the blocks the first freed (its output is alive
  // while the next one is made, so output blocks alternate between two).
  Tensor warm = sum(relu(add(a, b)), {0});
  warm = sum(relu(add(a, b)), {0});
  const CudaAllocatorStats before = cuda_allocator_stats(0);
  for (int i = 0; i < 20; ++i) warm = sum(relu(add(a, b)), {0});
  const CudaAllocatorStats after = cuda_allocator_stats(0);
  EXPECT_EQ(after.cuda_malloc_calls, before.cuda_malloc_calls);
  EXPECT_EQ(after.reserved_bytes, before.reserved_bytes);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  std::printf("[allocator] 20 iterations of sum(relu(add(a, b))): %lld cache hits, %lld "
              "cudaMalloc calls\n",
              (long long)(after.cache_hits - before.cache_hits),
              (long long)(after.cuda_malloc_calls - before.cuda_malloc_calls));
}

// ---- errors -------------------------------------------------------------------------------------
TEST(CudaErrors, MixingCpuAndCudaInputsNamesBothDevices) {
  Generator g(115);
  Tensor a = random_tensor(g, {4, 5}, DType::Float32);
  Tensor b = random_tensor(g, {4, 5}, DType::Float32).to(kCuda);
  try {
    add(a, b);
    FAIL() << "add(cpu, cuda) did not throw";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("add"), std::string::npos) << m;
    EXPECT_NE(m.find("cuda:0"), std::string::npos) << m;
    EXPECT_NE(m.find("cpu"), std::string::npos) << m;
  }
}

// Ops without a hand-written CUDA kernel, and dtypes a hand-written kernel does not take, run
// eagerly through the CUDA compiler (Note [Compiled eager kernels on CUDA]): matmul, int8 add,
// int32 sum and int8 relu match the CPU (exactly for integers), a second call of the same
// signature reuses the compiled graph, and integer division matches the CPU and fails on a zero
// divisor as the CPU does.
TEST(CudaEagerCompiled, OpsWithoutAKernelRunThroughTheCompiler) {
  const OpDef& def = op_def(OpId::Matmul);
  ASSERT_EQ(def.eager_cuda, nullptr) << "matmul gained a CUDA kernel: pick another op here";
  ASSERT_NE(def.eager_cuda_compiled, nullptr);
  Generator g(116);
  for (int round = 0; round < 2; ++round) {
    Tensor a = random_tensor(g, {4, 5}, DType::Float32);
    Tensor b = random_tensor(g, {5, 3}, DType::Float32);
    Tensor got = matmul(a.to(kCuda), b.to(kCuda));
    EXPECT_STREQ(last_kernel_path(), "eager_cuda_compiled");
    EXPECT_EQ(got.device(), kCuda);
    Tensor want = matmul(a.to(DType::Float64), b.to(DType::Float64));
    EXPECT_TRUE(test::close(got.to(Device::cpu()), want, test::Tolerance::for_dtype(DType::Float32)))
        << "round " << round;
  }
  Tensor i8 = random_tensor(g, {4, 5}, DType::Int8);
  Tensor i32 = random_tensor(g, {4, 5}, DType::Int32);
  auto same = [](const Tensor& cuda, const Tensor& cpu, const char* what) {
    EXPECT_EQ(cuda.device(), kCuda) << what;
    EXPECT_STREQ(last_kernel_path(), "eager_cuda_compiled") << what;
    EXPECT_TRUE(test::close(cuda.to(Device::cpu()), cpu, test::Tolerance::exact())) << what;
  };
  same(add(i8.to(kCuda), i8.to(kCuda)), add(i8, i8), "add int8");
  same(sum(i32.to(kCuda)), sum(i32), "sum int32");
  same(relu(i8.to(kCuda)), relu(i8), "relu int8");
  // Integer division reports a zero divisor through the status record (Note [Device status]).
  Tensor den = Tensor::randint({4, 5}, g, 1, 9, DType::Int32);
  same(div(i32.to(kCuda), den.to(kCuda)), div(i32, den), "div int32");
  den.data<int32_t>()[7] = 0;
  try {
    div(i32.to(kCuda), den.to(kCuda));
    FAIL() << "div int32 by zero on CUDA did not throw";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_EQ(e.kind(), ErrorKind::InvalidArgument) << m;
    EXPECT_NE(m.find("'div'"), std::string::npos) << m;
    EXPECT_NE(m.find("integer division by 0"), std::string::npos) << m;
  }
  // The next call of the same signature is right again (the record was cleared).
  den.data<int32_t>()[7] = 3;
  same(div(i32.to(kCuda), den.to(kCuda)), div(i32, den), "div int32 after the error");
}

// The hand-written kernels still run the dtypes they list.
TEST(CudaEagerCompiled, HandWrittenKernelsKeepTheirDtypes) {
  Generator g(117);
  Tensor a = random_tensor(g, {4, 5}, DType::Float32).to(kCuda);
  add(a, a);
  EXPECT_STREQ(last_kernel_path(), "eager_cuda");
  relu(a);
  EXPECT_STREQ(last_kernel_path(), "eager_cuda");
}

TEST(CudaErrors, MissingDeviceIndexIsReported) {
  Tensor t = Tensor::ones({3}, DType::Float32);
  try {
    t.to(Device::cuda(cuda_device_count()));
    FAIL() << "a copy to a missing device did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln

int main(int argc, char** argv) {
  if (kiln::cuda_device_count() == 0) {
    // 77: CTest's SKIP_RETURN_CODE for this suite; the suite did not run, it did not pass.
    std::printf("%s\n", kiln::cuda_status().c_str());
    return 77;
  }
  std::printf("%s\n", kiln::cuda_status().c_str());
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
