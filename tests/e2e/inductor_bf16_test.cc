// bfloat16 through the CPU compiler: a small conv net and a transformer-style block with bf16
// weights and activations (bf16 storage; oneDNN accumulates in f32 where the host supports it,
// loop kernels compute in f32 and round to bf16 after each op). Compared with the same graph in
// float32 run by the interpreter, at bf16 tolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "compiler/compile.h"
#include "ops/onednn.h"
#include "ir/graph.h"
#include "ir/interpreter.h"
#include "../support/compare.h"

using namespace kiln;

namespace {

Tensor rnd(Generator& g, const Dims& s, double scale, DType d) {
  Tensor t = Tensor::randn(s, g, DType::Float32);
  float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] *= float(scale);
  return t.to(d);
}

// conv(3x3) + bias -> relu -> max_pool 2x2 -> flatten -> linear -> layer_norm -> gelu -> softmax
Graph net(DType d, uint64_t seed) {
  Generator g(seed);
  Graph G;
  G.name = std::string("bf16net_") + dtype_name(d);
  ValueId x = G.add_input("x", TensorType(d, Shape{1, 8, 12, 12}));
  ValueId w = G.add_param("w", rnd(g, {16, 8, 3, 3}, 0.2, d));
  ValueId b = G.add_param("b", rnd(g, {16}, 0.1, d));
  ValueId c = G.add_node1(OpId::Conv2d, {x, w, b}, {{"padding", Ints{1, 1}}});
  ValueId r = G.add_node1(OpId::Relu, {c});
  ValueId p = G.add_node1(OpId::MaxPool2d, {r}, {{"kernel_size", Ints{2, 2}}, {"stride", Ints{2, 2}}});
  ValueId f = G.add_node1(OpId::Flatten, {p}, {{"start_dim", int64_t(1)}});
  ValueId lw = G.add_param("lw", rnd(g, {64, 16 * 36}, 0.05, d));
  ValueId lb = G.add_param("lb", rnd(g, {64}, 0.1, d));
  ValueId l = G.add_node1(OpId::Linear, {f, lw, lb});
  ValueId gw = G.add_param("gw", rnd(g, {64}, 1.0, d));
  ValueId gb = G.add_param("gb", rnd(g, {64}, 0.1, d));
  ValueId n = G.add_node1(OpId::LayerNorm, {l, gw, gb}, {{"normalized_shape", Ints{64}}});
  ValueId e = G.add_node1(OpId::Gelu, {n});
  ValueId s = G.add_node1(OpId::Softmax, {e}, {{"dim", int64_t(-1)}});
  G.outputs = {c, s};
  return G;
}

// |got - want| <= rtol * max(max|want|, 1e-3) (tests/support/compare.h).
void expect_close(const Tensor& got, const Tensor& want, double rtol, const std::string& what) {
  double max_abs = test::max_abs(want);
  EXPECT_TRUE(test::close(got, want, test::Tolerance::of_scale(std::max(max_abs, 1e-3), rtol)))
      << what;
}

}  // namespace

TEST(InductorBf16, ConvNetMatchesFloat32Reference) {
  Graph g16 = net(DType::BFloat16, 5), g32 = net(DType::Float32, 5);
  auto compiled = compiler::compile(g16, Device::cpu(), {});
  Generator gen(77);
  Tensor x32 = Tensor::randn({1, 8, 12, 12}, gen, DType::Float32);
  Tensor x16 = x32.to(DType::BFloat16);
  TensorList got = compiled->run({x16});
  // The f32 reference sees the same bf16-rounded inputs and weights.
  for (size_t v = 0; v < g32.values.size(); ++v)
    if (g32.values[v].kind == ValueKind::Param)
      g32.values[v].data = g16.values[v].data.to(DType::Float32);
  TensorList want = run(g32, {x16.to(DType::Float32)});
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].dtype(), DType::BFloat16);
  expect_close(got[0], want[0], 2e-2, "conv output");
  expect_close(got[1], want[1], 5e-2, "softmax output");
  const compiler::CompileReport& r = compiled->report();
  std::printf("bf16 net (oneDNN bf16: %s): %s\n",
              onednn::supports_dtype(DType::BFloat16) ? "yes" : "no", r.str().c_str());
  EXPECT_GE(r.loop_kernels, 1);
}
