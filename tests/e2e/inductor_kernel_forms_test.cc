// Forms of generated CPU kernels (targets/cpu/emitter.cc), each checked to be taken (the dumped
// source says so) and to match the float64 reference on fresh random inputs.
//
// Norm kernels that keep their row in a stack buffer (Note [row-buffered norms]): the prologue
// runs once per element into the buffer (SIMD or, when its loads are strided, scalar), the
// statistics run over the buffer, the normalize pass reads it back. Cases: Swin-V2's
// position-biased softmax (a bias read through a permutation), a layer_norm over the channels
// of a permuted NCHW value far from zero with a residual added after it, a layer_norm over two
// dims whose input sum is stored too, log_softmax with a row that is not a multiple of the
// vector width, bfloat16, rows with NaN and -inf, and a row too long for the buffer (the
// unbuffered kernel).
//
// Pointwise kernels that read across rows walk tiles (Note [tiled transposes]).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>

#include "../support/compare.h"
#include "../support/files.h"
#include "../support/graph_inputs.h"
#include "compiler/compile.h"
#include "ir/graph.h"
#include "ir/interpreter.h"

using namespace kiln;

namespace {

const DType f32 = DType::Float32, bf16 = DType::BFloat16;

Dims dims_of(const Graph& g, ValueId v) {
  Dims d;
  for (const SymInt& e : g.type(v).shape) d.push_back(e.value());
  return d;
}

// Compiles g and checks every output against the float64 reference on two seeds. `shift` is
// added to the first input's values; `poison` runs on the inputs before the call.
void check(const Graph& g, const test::Tolerance& tol, uint64_t seed0, float shift = 0,
           void (*poison)(TensorList&) = nullptr) {
  auto compiled = compiler::compile(g, Device::cpu(), compiler::Options{});
  EXPECT_EQ(compiled->report().eager_launches, 0) << compiled->summary();
  for (uint64_t seed : {seed0, seed0 + 1}) {
    Generator gen(seed);
    TensorList in, in64;
    for (ValueId v : g.inputs) {
      Tensor t = Tensor::randn(dims_of(g, v), gen, f32);
      float* p = t.data<float>();
      for (int64_t i = 0; in.empty() && i < t.numel(); ++i) p[i] += shift;
      in.push_back(t.to(g.type(v).dtype));
    }
    if (poison) poison(in);
    for (const Tensor& t : in) in64.push_back(t.to(DType::Float64));
    TensorList want = run(test::as_float64(g), in64), got = compiled->run(in);
    ASSERT_EQ(got.size(), want.size());
    for (size_t o = 0; o < got.size(); ++o) {
      test::Comparison cmp = test::compare(got[o], want[o], tol);
      EXPECT_TRUE(cmp.ok()) << g.name << " output " << o << " seed " << seed << ": " << cmp.str()
                            << "\n" << compiled->summary();
    }
  }
}

// softmax over the last dim of one float32 input `a`.
Graph softmax_graph(const std::string& name, Shape shape) {
  Graph g;
  g.name = name;
  ValueId a = g.add_input("a", TensorType(f32, std::move(shape)));
  g.outputs = {g.add_node1(OpId::Softmax, {a}, {{"dim", int64_t(-1)}}, "p")};
  return g;
}

using test::DumpDir;

}  // namespace

// Swin-V2: softmax(scores + 16 * sigmoid(bias)) where the bias [q, k, heads] is read as
// [heads, q, k]: a stride of `heads` along the row. The sum before the softmax is an output
// too (a value before the anchor stored by the same kernel).
TEST(InductorRowNorms, PositionBiasedSoftmaxWithAStridedPrologue) {
  DumpDir dump("kiln_row_norm_softmax");
  Graph g;
  g.name = "biased_softmax";
  ValueId scores = g.add_input("scores", TensorType(f32, Shape{2, 6, 49, 49}));
  ValueId table = g.add_input("table", TensorType(f32, Shape{49, 49, 6}));
  ValueId bias = g.add_node1(OpId::Permute, {table}, {{"dims", Ints{2, 0, 1}}}, "heads_first");
  ValueId sg = g.add_node1(OpId::Sigmoid, {bias}, {}, "squash");
  ValueId k16 = g.add_const(Tensor::scalar(16.0, f32), "sixteen");
  ValueId sc = g.add_node1(OpId::Mul, {sg, k16}, {}, "scale");
  ValueId x = g.add_node1(OpId::Add, {scores, sc}, {}, "biased");
  ValueId y = g.add_node1(OpId::Softmax, {x}, {{"dim", int64_t(-1)}}, "attn");
  g.outputs = {y, x};
  check(g, test::Tolerance::rel(2e-6, 1e-7), 301);
  EXPECT_GE(dump.count("row buffer of 49"), 1) << "dumped sources in " << dump.path;
}

// ConvNeXt's stem: layer_norm over the channels of a permuted NCHW value (a stride of H*W along
// the row), values near 1000 with a spread of 1 (the shifted statistics must not lose the
// variance), a residual added after the norm.
TEST(InductorRowNorms, StridedLayerNormFarFromZero) {
  DumpDir dump("kiln_row_norm_ln");
  Graph g;
  g.name = "strided_ln_residual";
  ValueId x = g.add_input("x", TensorType(f32, Shape{2, 40, 9, 11}));
  ValueId w = g.add_input("w", TensorType(f32, Shape{40}));
  ValueId b = g.add_input("b", TensorType(f32, Shape{40}));
  ValueId r = g.add_input("r", TensorType(f32, Shape{2, 9, 11, 40}));
  ValueId xp = g.add_node1(OpId::Permute, {x}, {{"dims", Ints{0, 2, 3, 1}}}, "to_nhwc");
  ValueId n = g.add_node1(OpId::LayerNorm, {xp, w, b},
                          {{"normalized_shape", Ints{40}}, {"eps", 1e-6}}, "norm");
  g.outputs = {g.add_node1(OpId::Add, {n, r}, {}, "residual")};
  // |x| ~ 1000: float32 holds x to 3e-5 and x - mean to ~6e-5 of the unit spread; times
  // |w| ~ 1-3.
  check(g, test::Tolerance::rel(1e-5, 3e-4), 311, 1000.0f);
  EXPECT_GE(dump.count("row buffer of 40"), 1) << "dumped sources in " << dump.path;
}

// A layer_norm over the last two dims (a two-dim row in the buffer) whose residual sum before
// the norm is stored too, and a log_softmax over 37 (not a multiple of the vector width).
TEST(InductorRowNorms, TwoDimLayerNormAndLogSoftmaxTail) {
  DumpDir dump("kiln_row_norm_two");
  {
    Graph g;
    g.name = "ln_two_dims";
    ValueId a = g.add_input("a", TensorType(f32, Shape{3, 5, 6, 7}));
    ValueId c = g.add_input("c", TensorType(f32, Shape{3, 5, 6, 7}));
    ValueId s = g.add_node1(OpId::Add, {a, c}, {}, "sum");
    ValueId y = g.add_node1(OpId::LayerNorm, {s}, {{"normalized_shape", Ints{6, 7}}, {"eps", 1e-5}}, "norm");
    g.outputs = {y, s};
    check(g, test::Tolerance::rel(1e-5, 1e-6), 321);
  }
  {
    Graph g;
    g.name = "log_softmax_37";
    ValueId a = g.add_input("a", TensorType(f32, Shape{11, 37}));
    ValueId k = g.add_const(Tensor::scalar(3.0, f32), "three");
    ValueId m = g.add_node1(OpId::Mul, {a, k}, {}, "sharpen");
    g.outputs = {g.add_node1(OpId::LogSoftmax, {m}, {{"dim", int64_t(-1)}}, "logp")};
    check(g, test::Tolerance::rel(1e-6, 1e-6), 331);
  }
  EXPECT_GE(dump.count("row buffer of 42"), 1) << "dumped sources in " << dump.path;
  EXPECT_GE(dump.count("row buffer of 37"), 1) << "dumped sources in " << dump.path;
}

// bfloat16 softmax and layer_norm: the buffer holds the bf16 values as floats, the results
// round to bfloat16 as the eager kernels do.
TEST(InductorRowNorms, BFloat16Rows) {
  DumpDir dump("kiln_row_norm_bf16");
  Graph g;
  g.name = "bf16_rows";
  ValueId a = g.add_input("a", TensorType(bf16, Shape{4, 12, 100}));
  ValueId w = g.add_input("w", TensorType(bf16, Shape{100}));
  ValueId sm = g.add_node1(OpId::Softmax, {a}, {{"dim", int64_t(-1)}}, "p");
  ValueId ln = g.add_node1(OpId::LayerNorm, {a, w}, {{"normalized_shape", Ints{100}}, {"eps", 1e-5}}, "n");
  g.outputs = {sm, ln};
  check(g, test::Tolerance::for_dtype(bf16), 341);
  EXPECT_GE(dump.count("row buffer of 100"), 2) << "dumped sources in " << dump.path;
}

// A NaN in a row makes that row NaN; -inf entries get probability 0; a whole row of -inf is NaN
// (0/0), as the reference computes. Other rows stay exact. Rows of 70 are not whole vectors: the
// buffer's last vector is padded with -inf and the sum runs on vectors only (Note [padded
// softmax rows]).
TEST(InductorRowNorms, SoftmaxRowsWithNaNAndInfinity) {
  DumpDir dump("kiln_row_norm_special");
  check(softmax_graph("softmax_special", Shape{6, 70}), test::Tolerance::rel(2e-6, 1e-7), 351, 0, [](TensorList& in) {
    float* p = in[0].data<float>();
    const float inf = std::numeric_limits<float>::infinity();
    p[1 * 70 + 33] = std::numeric_limits<float>::quiet_NaN();
    for (int i = 0; i < 70; i += 3) p[2 * 70 + i] = -inf;
    for (int i = 0; i < 70; ++i) p[4 * 70 + i] = -inf;
    p[5 * 70 + 69] = 80.0f;  // exp of the others underflows towards 0
  });
  EXPECT_GE(dump.count("xr_[p_] = -INFINITY"), 1) << "dumped sources in " << dump.path;
}

// A row longer than the buffer takes the unbuffered kernel and is as correct.
TEST(InductorRowNorms, RowLongerThanTheBuffer) {
  DumpDir dump("kiln_row_norm_long");
  check(softmax_graph("long_rows", Shape{2, 9000}), test::Tolerance::rel(2e-6, 1e-9), 361);
  EXPECT_EQ(dump.count("row buffer of"), 0) << "dumped sources in " << dump.path;
  EXPECT_GE(dump.count("norm over [2, 9000]"), 1) << "dumped sources in " << dump.path;
}

// Note [tiled transposes] (targets/cpu/emitter.cc): a pointwise kernel reading its input across
// the rows (a transposing copy, and one with arithmetic on the way) walks 16 x 16 tiles. Sizes
// that are not multiples of 16 leave partial tiles on both dims; a 3-D permutation tiles an
// outer dim that is not next to the innermost one. Exact against the float64 reference (a
// doubling, a relu and a negation are exact in float32).
TEST(InductorTiledTransposes, PermutedCopiesMatchTheReference) {
  DumpDir dump("kiln_tiled_transposes");
  Graph g;
  g.name = "transposes";
  ValueId a = g.add_input("a", TensorType(f32, Shape{37, 45}));
  ValueId c = g.add_input("c", TensorType(f32, Shape{5, 19, 33}));
  ValueId at = g.add_node1(OpId::Transpose, {a}, {{"dim0", int64_t(0)}, {"dim1", int64_t(1)}}, "at");
  ValueId two = g.add_const(Tensor::scalar(2.0, f32), "two");
  ValueId y0 = g.add_node1(OpId::Relu, {g.add_node1(OpId::Mul, {at, two}, {}, "twice")}, {}, "act");
  ValueId cp = g.add_node1(OpId::Permute, {c}, {{"dims", Ints{2, 0, 1}}}, "rotate");
  ValueId y1 = g.add_node1(OpId::Neg, {cp}, {}, "negate");
  g.outputs = {y0, y1};
  check(g, test::Tolerance::rel(0, 0), 371);
  EXPECT_GE(dump.count("tiled with dim"), 2) << "dumped sources in " << dump.path;
}

// The same for copies alone: whole 16 x 16 tiles go through registers (kn_transpose16), the
// partial ones stay scalar; [64, 48] is whole tiles only, [37, 45] and the 3-D permutation have
// both. At both vector widths (AVX2's four 8 x 8 transposes), bitwise the interpreter's copy.
TEST(InductorTiledTransposes, WholeTilesOfPlainCopiesGoThroughRegisters) {
  DumpDir dump("kiln_register_transposes");
  Graph g;
  g.name = "copy_transposes";
  ValueId a = g.add_input("a", TensorType(f32, Shape{37, 45}));
  ValueId b = g.add_input("b", TensorType(f32, Shape{64, 48}));
  ValueId c = g.add_input("c", TensorType(f32, Shape{5, 19, 33}));
  auto tr = [&](ValueId v, const char* name) {
    return g.add_node1(OpId::Transpose, {v}, {{"dim0", int64_t(0)}, {"dim1", int64_t(1)}}, name);
  };
  ValueId cp = g.add_node1(OpId::Permute, {c}, {{"dims", Ints{2, 0, 1}}}, "rotate");
  g.outputs = {g.add_node1(OpId::Copy, {tr(a, "at")}, {}, "a_copy"),
               g.add_node1(OpId::Copy, {tr(b, "bt")}, {}, "b_copy"),
               g.add_node1(OpId::Copy, {cp}, {}, "c_copy")};
  for (const char* vec : {"512", "256"}) {
    compiler::Options options;
    options.knobs.set("vec", vec);
    auto compiled = compiler::compile(g, Device::cpu(), options);
    Generator gen(383);
    TensorList in;
    for (ValueId v : g.inputs) in.push_back(Tensor::randn(dims_of(g, v), gen, f32));
    TensorList want = run(g, in), got = compiled->run(in);
    ASSERT_EQ(got.size(), 3u);
    for (size_t o = 0; o < 3; ++o) {
      EXPECT_TRUE(test::usable_reference(want[o]));
      EXPECT_EQ(test::first_byte_difference(got[o], want[o]), "") << "output " << o << " vec " << vec;
    }
  }
  EXPECT_GE(dump.count("kn_transpose16(L"), 6) << "dumped sources in " << dump.path;
}

// Pointwise kernels whose innermost dim is shorter than a vector run their lanes across several
// innermost dims taken as one (Note [flattened lanes]): msda's sampling offsets (a strided slice
// of a linear's output read through a gather, per-level normalizers of period 2 gathered, the
// reference points broadcast over the middle dims), a slice whose rows are 8 consecutive floats
// (two 8-float loads per 16 lanes), bfloat16 read and stored beside gathered float32 values
// rounded to bfloat16, a space whose every dim is
// flattened (the parallel flat loop), and one that no flattening fits ([64, 5, 3]: no carry-free
// split at 16 lanes), which keeps the scalar kernel. Each output against the float64 reference
// and bitwise against the kernels of `flat=off`, at both vector widths, with a NaN that must
// reach exactly its own output.
TEST(InductorFlattenedLanes, ShortInnermostDimsMatchTheReferenceAndTheUnflattenedKernels) {
  Graph g;
  g.name = "flat_lanes";
  ValueId lin = g.add_input("lin", TensorType(f32, Shape{40, 8, 4, 8}));
  ValueId norm = g.add_input("norm", TensorType(f32, Shape{2}));
  ValueId ref = g.add_input("ref", TensorType(f32, Shape{40, 1, 1, 2}));
  ValueId rows = g.add_input("rows", TensorType(f32, Shape{40, 8, 12}));
  ValueId xb = g.add_input("xb", TensorType(bf16, Shape{40, 8, 4, 2}));
  ValueId sb = g.add_input("sb", TensorType(bf16, Shape{40, 1, 1, 1}));
  ValueId odd = g.add_input("odd", TensorType(f32, Shape{64, 5, 3}));
  ValueId odd_b = g.add_input("odd_b", TensorType(f32, Shape{3}));
  ValueId tall = g.add_input("tall", TensorType(f32, Shape{8192, 2}));
  ValueId tall_b = g.add_input("tall_b", TensorType(f32, Shape{2}));
  auto slice = [&](ValueId v, int64_t dim, int64_t a, int64_t b, const char* name) {
    return g.add_node1(OpId::Slice, {v}, {{"dim", dim}, {"start", a}, {"end", b}, {"step", int64_t(1)}}, name);
  };
  auto k = [&](double x, DType d, const char* name) { return g.add_const(Tensor::scalar(x, d), name); };
  ValueId off = slice(lin, 3, 0, 2, "offsets");
  ValueId loc = g.add_node1(OpId::Add, {ref, g.add_node1(OpId::Div, {off, norm}, {}, "normalized")}, {}, "loc");
  ValueId grid = g.add_node1(OpId::Sub, {g.add_node1(OpId::Mul, {loc, k(2, f32, "two")}, {}, "twice"),
                                         k(1, f32, "one")}, {}, "grid");
  ValueId runs = g.add_node1(OpId::Relu, {g.add_node1(OpId::Mul, {slice(rows, 2, 0, 8, "first8"),
                                                                  k(3, f32, "three")}, {}, "x3")}, {}, "runs");
  // bfloat16 read contiguously, a broadcast bfloat16 scale, and the float32 offsets over the
  // normalizers (both gathered) rounded to bfloat16 in the kernel; stored as bfloat16.
  ValueId off16 = g.add_node1(OpId::Cast, {g.add_node1(OpId::Div, {off, norm}, {}, "normalized16")},
                              {{"dtype", bf16}}, "off16");
  ValueId scaled = g.add_node1(OpId::Add, {g.add_node1(OpId::Mul, {xb, sb}, {}, "xs"), off16}, {}, "scaled");
  ValueId odd_y = g.add_node1(OpId::Add, {odd, odd_b}, {}, "odd_y");
  ValueId tall_y = g.add_node1(OpId::Div, {tall, tall_b}, {}, "tall_y");
  g.outputs = {grid, runs, scaled, odd_y, tall_y};

  for (const char* vec : {"512", "256"}) {
    SCOPED_TRACE(std::string("vec ") + vec);
    DumpDir flat_dump(std::string("kiln_flat_lanes_") + vec);
    compiler::Options on;
    on.knobs.set("vec", vec);
    auto flat = compiler::compile(g, Device::cpu(), on);
    const int flattened = flat_dump.count("Note [flattened lanes])");
    DumpDir plain_dump(std::string("kiln_flat_lanes_off_") + vec);
    compiler::Options off_opts = on;
    off_opts.knobs.set("flat", "off");
    auto plain = compiler::compile(g, Device::cpu(), off_opts);
    // grid, runs, scaled and tall_y flattened (fused or not, at least one kernel each way);
    // odd_y never: its flat index has no carry-free split.
    EXPECT_GE(flattened, 1) << "dumped sources in " << flat_dump.path;
    EXPECT_EQ(plain_dump.count("Note [flattened lanes])"), 0);
    int simd = 0;
    for (const std::string& s : flat->report().kernels) simd += s.find(", SIMD]") != std::string::npos;
    EXPECT_GE(simd, 4) << flat->summary();
    for (uint64_t seed : {811u, 812u}) {
      Generator gen(seed);
      TensorList in;
      for (ValueId v : g.inputs) {
        Tensor t = Tensor::randn(dims_of(g, v), gen, f32);
        if (v == norm || v == tall_b) t = Tensor::rand(dims_of(g, v), gen, 0.5, 2.0, f32);  // away from 0
        in.push_back(t.to(g.type(v).dtype));
      }
      // NaN in one offset (lin[7, 3, 2, 1]) and one row element (rows[5, 6, 4]).
      in[0].data<float>()[((7 * 8 + 3) * 4 + 2) * 8 + 1] = std::numeric_limits<float>::quiet_NaN();
      in[3].data<float>()[(5 * 8 + 6) * 12 + 4] = std::numeric_limits<float>::quiet_NaN();
      TensorList in64;
      for (const Tensor& t : in) in64.push_back(t.to(DType::Float64));
      TensorList want = run(test::as_float64(g), in64), got = flat->run(in), got_plain = plain->run(in);
      ASSERT_EQ(got.size(), 5u);
      for (size_t o = 0; o < got.size(); ++o) {
        const test::Tolerance tol = o == 2 ? test::Tolerance::rel(1e-2, 1e-2) : test::Tolerance::rel(1e-5, 1e-5);
        test::Comparison cmp = test::compare(got[o], want[o], tol);
        EXPECT_TRUE(cmp.ok()) << "output " << o << " seed " << seed << ": " << cmp.str() << "\n" << flat->summary();
        EXPECT_EQ(test::first_byte_difference(got[o], got_plain[o]), "") << "output " << o << " differs from flat=off";
      }
      // Each NaN reached its own output element and no other.
      auto nans = [](const Tensor& t) {
        Tensor d = t.to(DType::Float64);
        std::vector<int64_t> at;
        for (int64_t i = 0; i < d.numel(); ++i)
          if (std::isnan(d.data<double>()[i])) at.push_back(i);
        return at;
      };
      EXPECT_EQ(nans(got[0]), (std::vector<int64_t>{((7 * 8 + 3) * 4 + 2) * 2 + 1}));
      EXPECT_EQ(nans(got[1]), (std::vector<int64_t>{(5 * 8 + 6) * 8 + 4}));
    }
  }
}

// Note [reduction rows]: a float32 linear of one input row (K = 300: 18 vectors and a scalar
// tail of 12 at 16 lanes) with 12 outputs runs four of them at a time in one kernel with its
// bias and relu, at both vector widths: it matches the float64 reference, a NaN planted in
// row 5 of W is a NaN in output 5 only, and +inf in row 2 is +inf in output 2 only; oneDNN's
// inner product (knob gemv=onednn) agrees within float32 rounding.
TEST(InductorReductionRows, RowLinearComputesFourOutputsAtATimeAndMatchesTheReference) {
  const DumpDir dump("kiln_reduce_rows");
  Graph g;
  g.name = "row_linear";
  ValueId x = g.add_input("x", TensorType(f32, Shape{1, 300}));
  ValueId w = g.add_input("w", TensorType(f32, Shape{12, 300}));
  ValueId b = g.add_input("b", TensorType(f32, Shape{12}));
  ValueId y = g.add_node1(OpId::Linear, {x, w, b}, {}, "fc");
  g.outputs = {g.add_node1(OpId::Relu, {y}, {}, "act")};
  auto poison = [](TensorList& in) {
    float* pw = in[1].data<float>();
    pw[5 * 300 + 17] = std::numeric_limits<float>::quiet_NaN();
    for (int k = 0; k < 300; ++k) pw[2 * 300 + k] = std::fabs(pw[2 * 300 + k]);
    pw[2 * 300 + 299] = std::numeric_limits<float>::infinity();  // in the scalar tail
    float* px = in[0].data<float>();
    for (int k = 0; k < 300; ++k) px[k] = std::fabs(px[k]) + 0.1f;  // row 2's sum is +inf
  };
  for (const char* vec : {"512", "256"}) {
    compiler::Options options;
    options.knobs.set("vec", vec);
    auto compiled = compiler::compile(g, Device::cpu(), options);
    compiler::Options onednn_options;
    onednn_options.knobs.set("gemv", "onednn");
    auto onednn = compiler::compile(g, Device::cpu(), onednn_options);
    EXPECT_EQ(compiled->report().eager_launches, 0) << compiled->summary();
    for (uint64_t seed : {61u, 62u}) {
      Generator gen(seed);
      TensorList in, in64;
      for (ValueId v : g.inputs) in.push_back(Tensor::randn(dims_of(g, v), gen, f32));
      poison(in);
      for (const Tensor& t : in) in64.push_back(t.to(DType::Float64));
      const Tensor want = run(test::as_float64(g), in64)[0];
      const Tensor got = compiled->run(in)[0];
      test::Comparison cmp = test::compare(got, want, test::Tolerance::rel(1e-5, 1e-5));
      EXPECT_TRUE(cmp.ok()) << "vec " << vec << " seed " << seed << ": " << cmp.str() << "\n" << compiled->summary();
      const float* pg = got.data<float>();
      for (int n = 0; n < 12; ++n) {
        EXPECT_EQ(std::isnan(pg[n]), n == 5) << "output " << n;
        EXPECT_EQ(std::isinf(pg[n]), n == 2) << "output " << n;
      }
      EXPECT_TRUE(test::compare(got, onednn->run(in)[0], test::Tolerance::rel(1e-5, 1e-5)).ok());
    }
  }
  EXPECT_EQ(dump.count("(Note [reduction rows])"), 2) << "dumped sources in " << dump.path;
}
