// Neural-network ops beyond the generated harness: oneDNN eager kernels against the float64
// reference on realistic (ResNet-like) shapes, PyTorch's output-size rules checked against
// hand-computed values, numerical stability of softmax / layer_norm, validation messages and the
// oneDNN primitive cache.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "harness_util.h"
#include "ops/api.h"
#include "ops/dispatch.h"
#include "ops/onednn.h"
#include "ops/op.h"

namespace kiln {
namespace {

using harness::error_of;

// The reference kernel of `id` on `inputs` (the oracle).
Tensor reference(OpId id, const std::vector<Tensor>& inputs, const Attrs& attrs) {
  const OpDef& d = op_def(id);
  Attrs a = d.canonicalize(attrs, "nn_ops_test");
  std::vector<TensorType> types = infer_types(d, inputs, a, "nn_ops_test");
  return run_kernel(d, d.reference, inputs, a, types)[0];
}

std::vector<double> values(const Tensor& t) {
  Tensor c = t.to(DType::Float64).contiguous();
  const double* p = c.data<double>();
  return std::vector<double>(p, p + c.numel());
}

Tensor abs_copy(const Tensor& t) {
  if (!t.defined()) return t;
  Tensor c = t.to(DType::Float64).clone();
  double* p = c.data<double>();
  for (int64_t i = 0; i < c.numel(); ++i) p[i] = std::fabs(p[i]);
  return c.to(t.dtype());
}

// |actual - expected| <= atol + rtol * |expected| (tests/support/compare.h).
void expect_close(const Tensor& expected, const Tensor& actual, double rtol, double atol,
                  const std::string& what) {
  EXPECT_TRUE(test::close(actual, expected, test::Tolerance::rel(rtol, atol))) << what;
}

// Note [Convolution tolerance]
// A float32 dot product of K terms, summed in any order (blocked, FMA or not), is within
// gamma_K * sum|x_i w_i| of the exact value, gamma_K = K u / (1 - K u), u = 2^-24 (Higham,
// "Accuracy and Stability of Numerical Algorithms", 3.1). sum|x_i w_i| per output is exactly the
// reference convolution of |x| and |w|, so each element gets its own rigorous bound, plus the
// final rounding of the output and the bias. For a 7x7x3 stem (K = 147) that is ~9e-6 of
// sum|x w| — loose against the typical error (about sqrt(K) u), but it holds for any
// implementation that oneDNN picks, while a dropped or doubled term (|x w| ~ 0.6 on average)
// still fails. A second, statistical check keeps the bound honest: the RMS error must stay
// below 1e-6 of the output RMS.
test::Tolerance dot_product_bound(const Tensor& abs_ref, int64_t k, DType dtype) {
  double u = dtype == DType::BFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -24);
  // bf16: inputs are exact bf16 values, oneDNN accumulates in f32; only the output rounds to
  // bf16 (relative 2^-8 on top of the f32 accumulation bound).
  double acc_u = std::ldexp(1.0, -24);
  double gamma = double(k + 1) * acc_u / (1.0 - double(k + 1) * acc_u);
  // gamma * sum|x w| (the per-element error scale) + u * |expected| + 1e-30.
  return test::Tolerance::of_scales(values(abs_ref), gamma, 1e-30).plus_rel(u);
}

void expect_rms_error_below(const Tensor& expected, const Tensor& actual, double rel,
                            const std::string& what) {
  std::vector<double> e = values(expected), a = values(actual);
  double err2 = 0, ref2 = 0;
  for (size_t i = 0; i < e.size(); ++i) {
    err2 += (a[i] - e[i]) * (a[i] - e[i]);
    ref2 += e[i] * e[i];
  }
  EXPECT_LE(std::sqrt(err2), rel * std::sqrt(ref2)) << what << ": RMS error too large";
}

struct ConvCase {
  Dims x, w;
  bool bias;
  Ints stride, padding, dilation;
  int64_t groups;
  const char* note;
};

Attrs conv_attrs(const ConvCase& c) {
  return {{"stride", c.stride}, {"padding", c.padding}, {"dilation", c.dilation},
          {"groups", c.groups}};
}

class NnOps : public testing::Test {
 protected:
  Generator gen{20240611};
  Tensor randn(const Dims& sizes, DType d = DType::Float32) { return Tensor::randn(sizes, gen, d); }

  // Eager (oneDNN) conv2d against the float64 reference with the per-element bound of
  // Note [Convolution tolerance].
  void check_conv(const ConvCase& c, DType dtype = DType::Float32) {
    Tensor x = randn(c.x, dtype), w = randn(c.w, dtype);
    Tensor b = c.bias ? randn({c.w[0]}, dtype) : Tensor();
    Tensor y = conv2d(x, w, b, c.stride, c.padding, c.dilation, c.groups);
    Attrs attrs = conv_attrs(c);
    Tensor ref = reference(OpId::Conv2d, {x.to(DType::Float64), w.to(DType::Float64),
                                          b.defined() ? b.to(DType::Float64) : b}, attrs);
    Tensor abs_ref = reference(OpId::Conv2d, {abs_copy(x).to(DType::Float64),
                                              abs_copy(w).to(DType::Float64),
                                              b.defined() ? abs_copy(b).to(DType::Float64) : b},
                               attrs);
    int64_t k = c.w[1] * c.w[2] * c.w[3];
    std::string what = std::string(c.note) + " (" + dtype_name(dtype) + ", " +
                       onednn::last_impl_name() + ")";
    EXPECT_EQ(y.dtype(), dtype);
    EXPECT_TRUE(test::close(y, ref, dot_product_bound(abs_ref, k, dtype))) << what;
    if (dtype == DType::Float32) expect_rms_error_below(ref, y, 1e-6, what);
  }
};

// ---- convolution ------------------------------------------------------------------------------
TEST_F(NnOps, ResNetConvShapesMatchReference) {
  std::vector<ConvCase> cases = {
      {{1, 64, 56, 56}, {64, 64, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 1, "[1,64,56,56] 3x3 pad 1"},
      {{1, 3, 224, 224}, {64, 3, 7, 7}, false, {2, 2}, {3, 3}, {1, 1}, 1,
       "stem 7x7 stride 2 pad 3"},
      {{1, 64, 28, 28}, {128, 64, 1, 1}, true, {2, 2}, {0, 0}, {1, 1}, 1,
       "1x1 stride 2 downsample"},
      {{2, 32, 14, 14}, {32, 32, 3, 3}, true, {1, 1}, {2, 2}, {2, 2}, 1, "batch 2 dilation 2"},
  };
  for (const ConvCase& c : cases) check_conv(c);
}

TEST_F(NnOps, ConvBothLayoutPoliciesMatchReference) {
  onednn::ConvLayout saved = onednn::conv_layout();
  for (onednn::ConvLayout layout : {onednn::ConvLayout::Blocked, onednn::ConvLayout::Plain}) {
    onednn::set_conv_layout(layout);
    check_conv({{1, 16, 12, 12}, {24, 16, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 1, "3x3"});
    check_conv({{1, 16, 9, 9}, {16, 4, 3, 3}, false, {2, 2}, {1, 0, 2, 1}, {1, 1}, 4,
                "groups 4, asymmetric pad"});
    check_conv({{1, 8, 7, 7}, {8, 1, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 8, "depthwise"});
  }
  onednn::set_conv_layout(saved);
}

TEST_F(NnOps, ConvAsymmetricPadding) {
  // padding [top, left, bottom, right] = [0, 2, 1, 3]: OH = (10 + 0 + 1 - 3)/2 + 1 = 5,
  // OW = (11 + 2 + 3 - 3)/2 + 1 = 7.
  Tensor x = randn({1, 8, 10, 11}), w = randn({16, 8, 3, 3});
  Tensor y = conv2d(x, w, Tensor(), {2, 2}, {0, 2, 1, 3});
  EXPECT_EQ(to_string(y.sizes()), "[1, 16, 5, 7]");
  check_conv({{1, 8, 10, 11}, {16, 8, 3, 3}, false, {2, 2}, {0, 2, 1, 3}, {1, 1}, 1,
              "asymmetric [0,2,1,3] stride 2"});
  check_conv({{1, 4, 6, 6}, {4, 4, 2, 2}, true, {1, 1}, {1, 0, 0, 1}, {1, 1}, 1,
              "asymmetric 'same' padding for an even kernel"});
  // The same as convolving the explicitly zero-padded input without padding.
  Tensor padded = pad(x, {0, 2, 1, 3});  // ONNX order over (H, W): top, left, bottom, right
  ASSERT_EQ(to_string(padded.sizes()), "[1, 8, 11, 16]");
  Tensor y_explicit = conv2d(padded, w, Tensor(), {2, 2}, {0, 0});
  expect_close(y_explicit, y, 1e-5, 1e-5, "padding [0,2,1,3] vs explicit zero padding");
}

TEST_F(NnOps, ConvBiasAndGroups) {
  check_conv({{2, 8, 9, 9}, {12, 2, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 4, "groups 4 + bias"});
  check_conv({{1, 32, 14, 14}, {32, 1, 3, 3}, true, {2, 2}, {1, 1}, {1, 1}, 32,
              "depthwise stride 2 + bias"});
  check_conv({{1, 6, 5, 5}, {4, 3, 1, 1}, true, {1, 1}, {0, 0}, {1, 1}, 2, "grouped 1x1"});
}

TEST_F(NnOps, ConvNonContiguousInputs) {
  Tensor base = randn({1, 7, 7, 8});  // NHWC storage viewed as NCHW
  Tensor x = permute(base, {0, 3, 1, 2});
  ASSERT_FALSE(x.is_contiguous());
  Tensor w = randn({5, 8, 3, 3}), b = randn({5});
  Tensor y = conv2d(x, w, b, {1, 1}, {1, 1});
  Tensor ref = reference(OpId::Conv2d, {x.to(DType::Float64), w.to(DType::Float64),
                                        b.to(DType::Float64)},
                         {{"padding", Ints{1, 1}}});
  expect_close(ref, y, 1e-5, 1e-5, "channels-last view input");
}

TEST_F(NnOps, ConvBFloat16) {
  // Through oneDNN where the CPU has AVX-512 (bf16 emulated or native), else the reference.
  check_conv({{1, 16, 10, 10}, {8, 16, 3, 3}, true, {1, 1}, {1, 1}, {1, 1}, 1, "bf16 3x3"},
             DType::BFloat16);
  check_conv({{1, 8, 9, 9}, {8, 2, 3, 3}, false, {2, 2}, {1, 0, 1, 1}, {1, 1}, 4,
              "bf16 groups asym"},
             DType::BFloat16);
}

// ---- transposed convolution -------------------------------------------------------------------
TEST_F(NnOps, ConvTransposeOutputSizeRules) {
  struct Case {
    Dims x, w;
    Ints stride, padding, output_padding, dilation;
    int64_t groups;
    const char* expected_shape;
  };
  // out = (in - 1)*stride - 2*padding + dilation*(k - 1) + output_padding + 1
  std::vector<Case> cases = {
      {{1, 4, 5, 5}, {4, 3, 3, 3}, {2, 2}, {1, 1}, {1, 1}, {1, 1}, 1, "[1, 3, 10, 10]"},
      {{1, 4, 5, 5}, {4, 3, 3, 3}, {1, 1}, {0, 0}, {0, 0}, {2, 2}, 1, "[1, 3, 9, 9]"},
      {{1, 2, 4, 4}, {2, 2, 2, 2}, {3, 3}, {0, 0}, {2, 2}, {1, 1}, 1, "[1, 2, 13, 13]"},
      {{2, 6, 3, 4}, {6, 2, 3, 2}, {2, 1}, {1, 0}, {1, 0}, {1, 1}, 3, "[2, 6, 6, 5]"},
      {{1, 8, 14, 14}, {8, 8, 4, 4}, {2, 2}, {1, 1}, {0, 0}, {1, 1}, 1, "[1, 8, 28, 28]"},
  };
  for (const Case& c : cases) {
    Tensor x = randn(c.x), w = randn(c.w), b = randn({c.w[1] * c.groups});
    Tensor y = conv_transpose2d(x, w, b, c.stride, c.padding, c.output_padding, c.dilation,
                                c.groups);
    EXPECT_EQ(to_string(y.sizes()), c.expected_shape);
    Attrs attrs{{"stride", c.stride}, {"padding", c.padding},
                {"output_padding", c.output_padding}, {"dilation", c.dilation},
                {"groups", c.groups}};
    Tensor ref = reference(OpId::ConvTranspose2d,
                           {x.to(DType::Float64), w.to(DType::Float64), b.to(DType::Float64)},
                           attrs);
    expect_close(ref, y, 1e-5, 1e-5,
                 std::string("conv_transpose2d ") + c.expected_shape + " (" +
                     onednn::last_impl_name() + ")");
  }
}

TEST_F(NnOps, ConvTransposeIsTheAdjointOfConv) {
  // <conv(x, w), y> == <x, conv_transpose(y, w)>: ties the two references to each other.
  Tensor x = randn({1, 3, 7, 6}, DType::Float64), w = randn({4, 3, 3, 3}, DType::Float64);
  Tensor cx = conv2d(x, w, Tensor(), {2, 2}, {1, 1});
  Tensor y = randn(cx.sizes(), DType::Float64);
  // conv of a 7x6 input at stride 2 pad 1 gives 4x3; transposing back needs output_padding
  // (0, 1) to recover 7x6.
  Tensor ty = conv_transpose2d(y, w, Tensor(), {2, 2}, {1, 1}, {0, 1});
  ASSERT_EQ(to_string(ty.sizes()), to_string(x.sizes()));
  double lhs = sum(mul(cx, y)).item(), rhs = sum(mul(x, ty)).item();
  EXPECT_NEAR(lhs, rhs, 1e-9 * (std::fabs(lhs) + 1));
}

// ---- pooling ----------------------------------------------------------------------------------
TEST_F(NnOps, PoolingCeilModeOutputSizes) {
  Tensor x = randn({1, 2, 6, 6});
  EXPECT_EQ(to_string(max_pool2d(x, {3, 3}, {2, 2}).sizes()), "[1, 2, 2, 2]");
  EXPECT_EQ(to_string(max_pool2d(x, {3, 3}, {2, 2}, {0, 0}, {1, 1}, true).sizes()),
            "[1, 2, 3, 3]");
  // ceil would give 4, but the 4th window would start in the right padding: PyTorch drops it.
  Tensor x5 = randn({1, 1, 5, 5});
  EXPECT_EQ(to_string(max_pool2d(x5, {2, 2}, {2, 2}, {1, 1}, {1, 1}, true).sizes()),
            "[1, 1, 3, 3]");
  EXPECT_EQ(to_string(avg_pool2d(x5, {2, 2}, {2, 2}, {1, 1}, true).sizes()), "[1, 1, 3, 3]");
  // ResNet stem max pool.
  EXPECT_EQ(to_string(max_pool2d(randn({1, 4, 112, 112}), {3, 3}, {2, 2}, {1, 1}).sizes()),
            "[1, 4, 56, 56]");
}

TEST_F(NnOps, PoolingMatchesReference) {
  struct Case {
    OpId op;
    Dims x;
    Attrs attrs;
    const char* note;
  };
  auto maxp = [](Ints k, Ints s, Ints p, Ints d, bool ceil) {
    return Attrs{{"kernel_size", k}, {"stride", s}, {"padding", p}, {"dilation", d},
                 {"ceil_mode", ceil}};
  };
  auto avgp = [](Ints k, Ints s, Ints p, bool ceil, bool cip) {
    return Attrs{{"kernel_size", k}, {"stride", s}, {"padding", p}, {"ceil_mode", ceil},
                 {"count_include_pad", cip}};
  };
  std::vector<Case> cases = {
      {OpId::MaxPool2d, {1, 64, 112, 112}, maxp({3, 3}, {2, 2}, {1, 1}, {1, 1}, false),
       "ResNet max pool"},
      {OpId::MaxPool2d, {2, 3, 9, 9}, maxp({3, 3}, {2, 2}, {1, 1}, {1, 1}, true), "max ceil"},
      {OpId::MaxPool2d, {1, 3, 10, 10}, maxp({2, 3}, {1, 2}, {0, 1}, {2, 1}, true),
       "max dilation + ceil"},
      {OpId::AvgPool2d, {1, 8, 14, 14}, avgp({2, 2}, {2, 2}, {0, 0}, false, true), "avg 2x2"},
      {OpId::AvgPool2d, {1, 8, 14, 14}, avgp({3, 3}, {2, 2}, {1, 1}, true, true),
       "avg ceil include pad (clipped windows)"},
      {OpId::AvgPool2d, {1, 8, 14, 14}, avgp({3, 3}, {2, 2}, {1, 1}, true, false),
       "avg ceil exclude pad"},
      {OpId::AvgPool2d, {2, 4, 7, 7}, avgp({3, 3}, {2, 2}, {1, 1}, false, true),
       "avg include pad"},
      {OpId::AvgPool2d, {1, 4, 7, 7}, avgp({2, 2}, {2, 2}, {0, 0}, true, true),
       "avg ceil no pad"},
  };
  for (const Case& c : cases) {
    Tensor x = randn(c.x);
    Tensor y = call_op1(c.op, {x}, c.attrs);
    Tensor ref = reference(c.op, {x.to(DType::Float64)}, c.attrs);
    expect_close(ref, y, 1e-6, 1e-6, c.note);
  }
}

TEST_F(NnOps, AvgPoolDivisorFollowsPyTorch) {
  // 4x4 of ones, k 3, s 2, pad 1, ceil_mode, count_include_pad: 3x3 outputs. The last window
  // row/col starts at 3 and is clipped at in + pad = 5: it counts 2 padded rows, not 3.
  Tensor ones = Tensor::full({1, 1, 4, 4}, 1.0);
  Tensor y = avg_pool2d(ones, {3, 3}, {2, 2}, {1, 1}, true, true);
  ASSERT_EQ(to_string(y.sizes()), "[1, 1, 3, 3]");
  const std::vector<double> e = {4.0 / 9, 6.0 / 9, 2.0 / 6, 6.0 / 9, 1.0,
                                 3.0 / 6, 2.0 / 6, 3.0 / 6, 0.25};
  EXPECT_TRUE(test::close(y.to_vector<double>(), e, test::Tolerance::rel(0, 1e-6), Dims{3, 3}));
  // Excluding padding, every window averages ones.
  std::vector<double> ex = avg_pool2d(ones, {3, 3}, {2, 2}, {1, 1}, true, false).to_vector<double>();
  EXPECT_TRUE(test::close(ex, std::vector<double>(ex.size(), 1.0), test::Tolerance::rel(0, 1e-6)));
}

TEST_F(NnOps, AdaptiveAvgPoolWindows) {
  // [0 1 2 3 4] -> 3: windows [0,2), [1,4), [3,5) -> 0.5, 2, 3.5
  Tensor x = reshape(cast(Tensor::arange(5), DType::Float32), {1, 1, 1, 5});
  std::vector<float> v = adaptive_avg_pool2d(x, {1, 3}).to_vector<float>();
  ASSERT_EQ(v.size(), 3u);
  EXPECT_FLOAT_EQ(v[0], 0.5f);
  EXPECT_FLOAT_EQ(v[1], 2.0f);
  EXPECT_FLOAT_EQ(v[2], 3.5f);
  Tensor r = randn({2, 16, 7, 7});
  for (Ints out : {Ints{1, 1}, Ints{3, 3}, Ints{2, 5}, Ints{9, 9}}) {
    Tensor y = adaptive_avg_pool2d(r, out);
    Tensor ref = reference(OpId::AdaptiveAvgPool2d, {r.to(DType::Float64)},
                           {{"output_size", out}});
    expect_close(ref, y, 1e-6, 1e-6, "adaptive " + std::to_string(out[0]) + "x" +
                                         std::to_string(out[1]));
  }
}

// ---- matmul / linear --------------------------------------------------------------------------
TEST_F(NnOps, MatmulBroadcastingAndPromotion) {
  struct Case {
    Dims a, b;
    const char* expected_shape;
  };
  std::vector<Case> cases = {
      {{2, 1, 5, 7}, {3, 7, 4}, "[2, 3, 5, 4]"},
      {{7}, {2, 7, 3}, "[2, 3]"},
      {{5, 7}, {7}, "[5]"},
      {{7}, {7}, "[]"},
      {{4, 1, 6}, {1, 6, 3}, "[4, 1, 3]"},
      {{64, 256}, {256, 96}, "[64, 96]"},
      {{3, 1, 2, 8}, {1, 4, 8, 5}, "[3, 4, 2, 5]"},
  };
  for (const Case& c : cases) {
    Tensor a = randn(c.a), b = randn(c.b);
    Tensor y = matmul(a, b);
    EXPECT_EQ(to_string(y.sizes()), c.expected_shape);
    Tensor ref = reference(OpId::Matmul, {a.to(DType::Float64), b.to(DType::Float64)}, {});
    int64_t k = c.a.back();
    // Accumulation of k products: see Note [Convolution tolerance]; |a b| ~ 1 per term.
    expect_close(ref, y, 1e-5, 4e-7 * double(k), std::string("matmul ") + c.expected_shape);
  }
}

TEST_F(NnOps, MatmulStridedOperands) {
  Tensor a = transpose(randn({2, 9, 6}), 1, 2);  // [2, 6, 9] with transposed strides
  Tensor b = transpose(randn({5, 9}), 0, 1);     // [9, 5]
  Tensor y = matmul(a, b);
  Tensor ref = reference(OpId::Matmul, {a.to(DType::Float64), b.to(DType::Float64)}, {});
  expect_close(ref, y, 1e-5, 1e-5, "transposed operands");
  Tensor sliced = slice(randn({4, 12}), 1, 1, 12, 2);  // every other column
  Tensor y2 = matmul(sliced, randn({6, 3}));
  EXPECT_EQ(to_string(y2.sizes()), "[4, 3]");
}

TEST_F(NnOps, LinearWithBias) {
  Tensor x = randn({4, 10, 32}), w = randn({16, 32}), b = randn({16});
  Tensor y = linear(x, w, b);
  EXPECT_EQ(to_string(y.sizes()), "[4, 10, 16]");
  Tensor ref = reference(OpId::Linear, {x.to(DType::Float64), w.to(DType::Float64),
                                        b.to(DType::Float64)}, {});
  expect_close(ref, y, 1e-5, 2e-5, "linear [4,10,32] -> 16");
  // Non-contiguous x takes the batched path.
  Tensor xt = transpose(randn({32, 6}), 0, 1);
  Tensor yt = linear(xt, w, b);
  Tensor ref_t = reference(OpId::Linear, {xt.to(DType::Float64), w.to(DType::Float64),
                                          b.to(DType::Float64)}, {});
  expect_close(ref_t, yt, 1e-5, 2e-5, "linear, transposed x");
}

TEST_F(NnOps, MatmulBFloat16AndIntegers) {
  Tensor a = randn({8, 32}, DType::BFloat16), b = randn({32, 8}, DType::BFloat16);
  Tensor y = matmul(a, b);
  ASSERT_EQ(y.dtype(), DType::BFloat16);
  Tensor ref = reference(OpId::Matmul, {a.to(DType::Float64), b.to(DType::Float64)}, {});
  // Inputs are exact bf16 values; the product is accumulated in f32 and rounded once to bf16.
  expect_close(ref, y, std::ldexp(1.0, -8), 32 * 4e-7, "bf16 matmul");

  Tensor ia = Tensor::randint({3, 5}, gen, -20, 20), ib = Tensor::randint({5, 4}, gen, -20, 20);
  Tensor iy = matmul(ia, ib);
  ASSERT_EQ(iy.dtype(), DType::Int64);
  std::vector<int64_t> av = ia.to_vector<int64_t>(), bv = ib.to_vector<int64_t>(),
                       yv = iy.to_vector<int64_t>();
  for (int i = 0; i < 3; ++i)
    for (int j = 0; j < 4; ++j) {
      int64_t s = 0;
      for (int k = 0; k < 5; ++k) s += av[size_t(i * 5 + k)] * bv[size_t(k * 4 + j)];
      EXPECT_EQ(yv[size_t(i * 4 + j)], s);
    }
}

// ---- normalization stability ------------------------------------------------------------------
TEST_F(NnOps, SoftmaxOnLargeMagnitudeRows) {
  Tensor x = mul(randn({8, 100}), 1000.0);  // scores of +-3000: naive exp overflows
  for (OpId id : {OpId::Softmax, OpId::LogSoftmax}) {
    Tensor y = call_op1(id, {x}, {{"dim", int64_t(-1)}});
    Tensor ref = reference(id, {x.to(DType::Float64)}, {{"dim", int64_t(-1)}});
    for (double v : values(y)) ASSERT_TRUE(std::isfinite(v)) << op_def(id).name;
    expect_close(ref, y, 1e-5, 1e-6, op_def(id).name);
  }
  std::vector<double> s = values(softmax(x, -1));
  for (int r = 0; r < 8; ++r) {
    double total = 0;
    for (int k = 0; k < 100; ++k) total += s[size_t(r * 100 + k)];
    EXPECT_NEAR(total, 1.0, 1e-5) << "row " << r;
  }
  // Along a non-last dim (strided rows).
  Tensor y0 = softmax(x, 0);
  expect_close(reference(OpId::Softmax, {x.to(DType::Float64)}, {{"dim", int64_t(0)}}), y0,
               1e-5, 1e-6, "softmax dim 0");
}

TEST_F(NnOps, LayerNormOnOffsetRows) {
  // Rows of 1e4 + N(0, 1): E[x^2] - E[x]^2 in float32 would lose every digit of the variance.
  Tensor x = add(randn({16, 256}), 1e4);
  Tensor w = randn({256}), b = randn({256});
  Tensor y = layer_norm(x, {256}, w, b);
  Tensor ref = reference(OpId::LayerNorm, {x.to(DType::Float64), w.to(DType::Float64),
                                           b.to(DType::Float64)},
                         {{"normalized_shape", Ints{256}}});
  expect_close(ref, y, 1e-5, 1e-5, "layer_norm on 1e4-offset rows");
  Tensor gx = add(randn({2, 8, 4, 4}), -3e4);
  Tensor gw = randn({8}), gb = randn({8});
  Tensor gy = group_norm(gx, 4, gw, gb);
  Tensor gref = reference(OpId::GroupNorm, {gx.to(DType::Float64), gw.to(DType::Float64),
                                     gb.to(DType::Float64)},
                   {{"num_groups", int64_t(4)}});
  expect_close(gref, gy, 1e-5, 1e-5, "group_norm on -3e4-offset groups");
}

TEST_F(NnOps, BatchNormMatchesReference) {
  Tensor x = add(randn({2, 16, 9, 9}), 50.0);
  Tensor m = add(randn({16}), 50.0), v = Tensor::rand({16}, gen, 0.5, 2.0);
  Tensor w = randn({16}), b = randn({16});
  Tensor y = batch_norm(x, m, v, w, b, 1e-3);
  Tensor ref = reference(OpId::BatchNorm, {x.to(DType::Float64), m.to(DType::Float64),
                                           v.to(DType::Float64), w.to(DType::Float64),
                                           b.to(DType::Float64)},
                         {{"eps", 1e-3}});
  expect_close(ref, y, 1e-5, 1e-5, "batch_norm");
}

// ---- validation -------------------------------------------------------------------------------
void expect_contains(const std::string& msg, std::vector<std::string> parts) {
  for (const auto& p : parts)
    EXPECT_NE(msg.find(p), std::string::npos) << "message lacks \"" << p << "\":\n  " << msg;
}

TEST_F(NnOps, ValidationMessagesNameInputsAndNumbers) {
  expect_contains(error_of([&] { conv2d(randn({1, 5, 8, 8}), randn({4, 3, 3, 3}), Tensor()); }),
                  {"conv2d", "'x'", "5 channels", "'weight'", "expects 3"});
  expect_contains(error_of([&] {
                    conv2d(randn({1, 8, 8, 8}), randn({6, 2, 3, 3}), Tensor(), {1, 1}, {0, 0},
                           {1, 1}, 4);
                  }),
                  {"6 output channels", "groups 4"});
  expect_contains(error_of([&] {
                    conv2d(randn({1, 3, 8, 8}), randn({4, 3, 3, 3}), randn({5}));
                  }),
                  {"'bias'", "[5]", "[4]"});
  expect_contains(error_of([&] { conv2d(randn({1, 3, 4, 4}), randn({4, 3, 7, 7}), Tensor()); }),
                  {"'x'", "padded to 4", "kernel extent 7"});
  expect_contains(error_of([&] {
                    conv2d(randn({1, 3, 8, 8}), randn({4, 3, 3, 3}), Tensor(), {1, 1}, {1, 1, 1});
                  }),
                  {"'padding'", "2 or 4"});
  expect_contains(error_of([&] {
                    conv_transpose2d(randn({1, 4, 5, 5}), randn({4, 2, 3, 3}), Tensor(), {2, 2},
                                     {0, 0}, {2, 2});
                  }),
                  {"output_padding", "stride", "dilation"});
  expect_contains(error_of([&] {
                    conv_transpose2d(randn({1, 4, 5, 5}), randn({3, 2, 3, 3}), Tensor());
                  }),
                  {"4 channels", "expects 3"});
  expect_contains(error_of([&] { max_pool2d(randn({1, 1, 2, 2}), {5, 5}); }),
                  {"max_pool2d", "too small", "5x5"});
  expect_contains(error_of([&] { max_pool2d(randn({1, 1, 8, 8}), {2, 2}, {}, {2, 2}); }),
                  {"padding", "half of kernel_size"});
  expect_contains(error_of([&] { group_norm(randn({2, 6, 4}), 4, Tensor(), Tensor()); }),
                  {"group_norm", "6 channels", "num_groups 4"});
  expect_contains(error_of([&] { layer_norm(randn({2, 5}), {4}, Tensor(), Tensor()); }),
                  {"layer_norm", "normalized_shape [4]", "[2, 5]"});
  expect_contains(error_of([&] {
                    batch_norm(randn({2, 3, 4}), randn({4}), randn({3}), Tensor(), Tensor());
                  }),
                  {"batch_norm", "'running_mean'", "[4]", "[3]"});
  expect_contains(error_of([&] { matmul(randn({2, 3, 4}), randn({5, 6})); }),
                  {"matmul", "[2, 3, 4]", "[5, 6]", "4 columns", "5 rows"});
  expect_contains(error_of([&] { matmul(randn({2, 3, 4}), randn({3, 4, 6})); }),
                  {"batch dims", "[2, 3, 4]", "[3, 4, 6]"});
  expect_contains(error_of([&] { linear(randn({3, 8}), randn({4, 7}), Tensor()); }),
                  {"linear", "8 features", "expects 7"});
  expect_contains(error_of([&] { matmul(randn({2, 3}), randn({3, 2}, DType::Float64)); }),
                  {"'b'", "float64", "float32"});
}

// ---- primitive cache --------------------------------------------------------------------------
TEST_F(NnOps, RepeatedCallsHitThePrimitiveCache) {
  onednn::clear_primitive_cache();
  Tensor x = randn({1, 8, 10, 10}), w = randn({8, 8, 3, 3}), b = randn({8});
  Tensor y1 = conv2d(x, w, b, {1, 1}, {1, 1});
  onednn::PrimitiveCacheStats s1 = onednn::primitive_cache_stats();
  EXPECT_EQ(s1.misses, 1);
  EXPECT_EQ(s1.hits, 0);
  EXPECT_EQ(s1.entries, 1);
  // Same problem, fresh tensors of the same shapes: served from the cache, same result.
  Tensor y2 = conv2d(x.clone(), w.clone(), b.clone(), {1, 1}, {1, 1});
  onednn::PrimitiveCacheStats s2 = onednn::primitive_cache_stats();
  EXPECT_EQ(s2.misses, 1);
  EXPECT_EQ(s2.hits, 1);
  EXPECT_EQ(values(y1), values(y2));
  // A different stride is a different primitive.
  conv2d(x, w, b, {2, 2}, {1, 1});
  EXPECT_EQ(onednn::primitive_cache_stats().misses, 2);
  // Matmul and pooling are cached too.
  Tensor a = randn({4, 6}), c = randn({6, 5});
  matmul(a, c);
  matmul(a, c);
  max_pool2d(x, {2, 2});
  max_pool2d(x, {2, 2});
  onednn::PrimitiveCacheStats s3 = onednn::primitive_cache_stats();
  EXPECT_EQ(s3.misses, 4);
  EXPECT_EQ(s3.hits, 3);
  EXPECT_LE(s3.entries, s3.capacity);
}

}  // namespace
}  // namespace kiln
