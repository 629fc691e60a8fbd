// torch's _safe_softmax through the CPU compiler (BERT's attention mask as the Python frontend
// lowers aten.any/all, as max / min over bool): softmax over rows with -inf entries, a row that
// is all -inf gives zeros instead of NaN, then a residual add and a second block that reuses
// the arena. Compared with the interpreter (eager kernels, node by node) on fresh random inputs;
// every element must agree, NaN only where the interpreter has NaN.
//
// The bug it found (the "any/all" bug of docs/python.md): the SIMD online softmax made a lane's
// running sum NaN when the lane's first element was -inf (exp(-inf - -inf)), and the NaN
// survived the lane's later finite elements, so a row with a lone -inf came out all NaN.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "../support/compare.h"
#include "compiler/compile.h"
#include "ir/graph.h"
#include "ir/interpreter.h"

using namespace kiln;

namespace {

// y = where(all(x == -inf, -1, keepdim), 0, softmax(x)) + r; twice (the second on y), so that
// buffers of the first block are reused by the second.
Graph safe_softmax_graph(OpId reduce) {
  Graph g;
  g.name = std::string("safe_softmax_") + (reduce == OpId::Min ? "min" : "max");
  const Shape s{2, 3, 8, 16};
  ValueId x = g.add_input("x", TensorType(DType::Float32, s));
  ValueId r = g.add_input("r", TensorType(DType::Float32, s));
  ValueId ninf = g.add_const(Tensor::scalar(-std::numeric_limits<float>::infinity()), "ninf");
  ValueId zero = g.add_const(Tensor::scalar(0.0f), "zero");
  ValueId cur = x;
  for (int block = 0; block < 2; ++block) {
    ValueId sm = g.add_node1(OpId::Softmax, {cur}, {{"dim", int64_t(-1)}});
    ValueId masked = g.add_node1(OpId::Eq, {cur, ninf});
    // all(masked) = min over bool; any(masked) = max over bool
    ValueId rows = g.add_node1(reduce, {masked}, {{"dims", Ints{-1}}, {"keepdim", true}});
    ValueId safe = g.add_node1(OpId::Where, {rows, zero, sm});
    cur = g.add_node1(OpId::Add, {safe, r});
  }
  g.outputs = {cur};

  return g;
}

TensorList inputs(uint64_t seed) {
  Generator gen(seed);
  Tensor x = Tensor::randn({2, 3, 8, 16}, gen, DType::Float32);
  Tensor r = Tensor::randn({2, 3, 8, 16}, gen, DType::Float32);
  float* p = x.data<float>();
  const float ninf = -std::numeric_limits<float>::infinity();
  for (int row : {0, 5, 17, 40}) // whole rows of -inf (all() true), and a few lone ones
    for (int j = 0; j < 16; ++j) p[row * 16 + j] = ninf;
  for (int i : {100, 333, 610}) p[i] = ninf;
  return {x, r};
}

// Within 1e-5 * (1 + |interpreter|), NaN where NaN (tests/support/compare.h).
void expect_same(const Tensor& got, const Tensor& want, const std::string& what) {
  EXPECT_TRUE(test::close(got, want, test::Tolerance::rel(1e-5, 1e-5))) << what << " vs the interpreter";
}

}  // namespace

TEST(InductorMaskedSoftmax, SafeSoftmaxMatchesTheInterpreter) {
  for (OpId reduce : {OpId::Min, OpId::Max}) {
    Graph g = safe_softmax_graph(reduce);
    auto compiled = compiler::compile(g, Device::cpu(), compiler::Options{});
    for (uint64_t seed : {11u, 12u, 13u}) {
      TensorList in = inputs(seed);
      TensorList want = run(g, in);
      TensorList got = compiled->run(in);
      expect_same(got[0], want[0], g.name + " seed " + std::to_string(seed) + " (" +
                                       compiled->report().str() + ")");
    }
  }
}
