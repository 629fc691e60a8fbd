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

// Note [softmax statistics] in targets/cpu/emitter.cc: with SIMD lanes, softmax and log_softmax
// take the row's max and then the sum of exp(x - max). Rows of window attention's length (49:
// three vectors and a scalar tail at 16 lanes), shorter and longer ones, a scaled prologue and
// an epilogue; values up to +-80 (exp overflows float32 without the max), lone -inf entries,
// whole -inf rows and a NaN (both give the reference's NaN rows). Compared with the float64
// reference on fresh inputs: NaN exactly where it has NaN.
TEST(InductorMaskedSoftmax, RowsOfAnyLengthMatchTheFloat64Reference) {
  for (int64_t len : {int64_t(49), int64_t(7), int64_t(100)}) {
    for (OpId op : {OpId::Softmax, OpId::LogSoftmax}) {
      SCOPED_TRACE(std::string(op_def(op).name) + " rows of " + std::to_string(len));
      Graph g;
      g.name = "rows";
      const Shape s{3, 6, len};
      ValueId x = g.add_input("x", TensorType(DType::Float32, s));
      ValueId k = g.add_const(Tensor::scalar(0.5f), "scale");
      ValueId sm = g.add_node1(op, {g.add_node1(OpId::Mul, {x, k})}, {{"dim", int64_t(-1)}});
      g.outputs = {g.add_node1(OpId::Mul, {sm, k})};
      auto compiled = compiler::compile(g, Device::cpu(), compiler::Options{});
      Graph g64 = g;
      for (Value& v : g64.values) {
        v.type.dtype = DType::Float64;
        if (v.data.defined()) v.data = v.data.to(DType::Float64);
      }
      for (uint64_t seed : {21u, 22u}) {
        Generator gen(seed);
        Tensor xv = Tensor::rand({3, 6, len}, gen, -160.0, 160.0, DType::Float32);
        float* p = xv.data<float>();
        const float ninf = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < len; ++j) p[2 * len + j] = ninf;  // row 2: all -inf
        p[5 * len + len / 2] = std::numeric_limits<float>::quiet_NaN();  // row 5: a NaN
        for (int64_t i : {int64_t(7), len + 3, 9 * len + len - 1}) p[i] = ninf;  // lone ones
        Tensor want = run(g64, {xv.to(DType::Float64)})[0];
        Tensor got = compiled->run({xv})[0];
        EXPECT_TRUE(test::close(got, want.to(DType::Float32), test::Tolerance::rel(1e-5, 1e-5)))
            << compiled->summary();
      }
    }
  }
}

// Note [subnormal probabilities] in targets/cpu/emitter.cc: Swin's shifted windows add -100 to
// masked scores, so exp gives subnormal probabilities, which cost x86 a microcode assist per
// operand in the softmax and in the matmul that reads them. The compiled softmax stores them
// as 0: its probabilities (a graph output here) have no subnormal although the float64
// reference, rounded to float32, has many; both outputs match the reference within float32
// tolerance; a NaN score still makes its row NaN.
TEST(InductorMaskedSoftmax, ShiftedWindowMaskGivesNoSubnormalProbabilities) {
  Graph g;
  g.name = "shifted_window";
  const Shape s{4, 3, 49, 49};
  ValueId x = g.add_input("scores", TensorType(DType::Float32, s));
  ValueId mask = g.add_input("mask", TensorType(DType::Float32, Shape{4, 1, 49, 49}));
  ValueId v = g.add_input("v", TensorType(DType::Float32, Shape{4, 3, 49, 32}));
  ValueId p = g.add_node1(OpId::Softmax, {g.add_node1(OpId::Add, {x, mask})}, {{"dim", int64_t(-1)}});
  g.outputs = {p, g.add_node1(OpId::Matmul, {p, v})};
  auto compiled = compiler::compile(g, Device::cpu(), compiler::Options{});
  Graph g64 = g;
  for (Value& val : g64.values) val.type.dtype = DType::Float64;
  for (uint64_t seed : {31u, 32u}) {
    Generator gen(seed);
    Tensor xv = Tensor::randn({4, 3, 49, 49}, gen, DType::Float32);
    Tensor mv = Tensor::zeros({4, 1, 49, 49}, DType::Float32);
    float* m = mv.data<float>();
    // Windows 1..3: query i and key j in different regions (i < 24 vs j >= 24) get -100.
    for (int64_t w = 1; w < 4; ++w)
      for (int64_t i = 0; i < 49; ++i)
        for (int64_t j = 0; j < 49; ++j)
          if ((i < 24) != (j < 24)) m[(w * 49 + i) * 49 + j] = -100.0f;
    Tensor vv = Tensor::randn({4, 3, 49, 32}, gen, DType::Float32);
    xv.data<float>()[(2 * 3 * 49 + 5) * 49 + 7] = std::numeric_limits<float>::quiet_NaN();
    TensorList want = run(g64, {xv.to(DType::Float64), mv.to(DType::Float64), vv.to(DType::Float64)});
    TensorList got = compiled->run({xv, mv, vv});
    for (size_t o = 0; o < 2; ++o)
      EXPECT_TRUE(test::close(got[o], want[o].to(DType::Float32), test::Tolerance::rel(1e-5, 1e-5)))
          << "output " << o << "\n" << compiled->summary();
    Tensor ref32 = want[0].to(DType::Float32);
    int64_t ref_subnormal = 0, got_subnormal = 0, got_nan = 0;
    for (int64_t i = 0; i < ref32.numel(); ++i) {
      ref_subnormal += std::fpclassify(ref32.data<float>()[i]) == FP_SUBNORMAL;
      got_subnormal += std::fpclassify(got[0].data<float>()[i]) == FP_SUBNORMAL;
      got_nan += std::isnan(got[0].data<float>()[i]);
    }
    EXPECT_GT(ref_subnormal, 1000) << "the mask no longer makes subnormal probabilities";
    EXPECT_EQ(got_subnormal, 0);
    EXPECT_EQ(got_nan, 49) << "the NaN score's row";
  }
}
