// Numerical checks of the graph passes: the interpreter runs the graph before and after a pass
// on fresh random inputs (and random weights), and the results must agree within a per-dtype
// tolerance. The IR text tests (tests/ir/<pass>.kir) pin what each pass prints; these pin that
// what it prints computes the same thing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

#include <fmt/format.h>

#include "../support/compare.h"
#include "core/error.h"
#include "ir/interpreter.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "passes/algebraic_simplify.h"
#include "passes/attention_mask_guard.h"
#include "passes/constant_fold.h"
#include "passes/cse.h"
#include "passes/dce.h"
#include "passes/deconv_to_conv.h"
#include "passes/window_conv.h"
#include "passes/decompose.h"
#include "passes/fold_conv_bn.h"
#include "passes/fuse_attention.h"
#include "passes/fuse_epilogues.h"
#include "passes/pass.h"

namespace kiln {
namespace {

// Seeds differ per test and per run of the same binary only through KILN_PASSES_SEED, so that a
// failure reproduces; CI may set it to get fresh values.
uint64_t base_seed() {
  const char* s = std::getenv("KILN_PASSES_SEED");
  return s ? std::strtoull(s, nullptr, 10) : 20240611ull;
}

struct Tol {
  double atol, rtol;
};
Tol tolerance(DType d) {
  switch (d) {
    case DType::Float64: return {1e-9, 1e-9};
    case DType::Float32: return {2e-5, 2e-5};
    case DType::Float16: return {1e-2, 1e-2};
    case DType::BFloat16: return {4e-2, 4e-2};
    default: return {0, 0};
  }
}

// "" when `actual` matches `expected` (tests/support/compare.h at the dtype's tolerance times
// `scale`; integers exact); otherwise the report of the worst element.
std::string compare(const Tensor& expected, const Tensor& actual, double scale = 1.0) {
  if (expected.dtype() != actual.dtype())
    return fmt::format("dtype {} vs {}", dtype_name(expected.dtype()), dtype_name(actual.dtype()));
  Tol tol = tolerance(expected.dtype());
  test::Comparison c =
      test::compare(actual, expected, test::Tolerance::rel(tol.rtol, tol.atol).scaled(scale));
  return c.ok() ? "" : c.str();
}

Tensor random_tensor(const TensorType& t, Generator& gen, const std::string& name) {
  Dims d = to_dims(t.shape);
  if (is_floating(t.dtype)) {
    // Batch-norm variances must be positive.
    if (name.find("var") != std::string::npos) return Tensor::rand(d, gen, 0.5, 2.0, t.dtype);
    return Tensor::randn(d, gen, t.dtype);
  }
  if (t.dtype == DType::Bool) return Tensor::randint(d, gen, 0, 2, DType::Int64).to(DType::Bool);
  return Tensor::randint(d, gen, 0, 5, t.dtype);
}

// Gives every param without data random data.
void fill_params(Graph& g, Generator& gen) {
  for (Value& v : g.values)
    if (v.kind == ValueKind::Param && !v.data.defined()) v.data = random_tensor(v.type, gen, v.name);
}

TensorList random_inputs(const Graph& g, Generator& gen) {
  TensorList in;
  for (ValueId v : g.inputs) in.push_back(random_tensor(g.type(v), gen, g.value(v).name));
  return in;
}

// Every output of `after` against the float64 run of `before` (its params and inputs widened) on
// two sets of fresh inputs, within a relative `tol`.
void expect_matches_float64(const Graph& before, const Graph& after, Generator& gen, double tol) {
  Graph before64 = before;
  for (Value& v : before64.values) {
    v.type.dtype = DType::Float64;
    if (v.data.defined()) v.data = v.data.to(DType::Float64);
  }
  for (int round = 0; round < 2; ++round) {
    TensorList in = random_inputs(before, gen);
    TensorList in64;
    for (const Tensor& t : in) in64.push_back(t.to(DType::Float64));
    TensorList want = run(before64, in64);
    TensorList got = run(after, in);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(got[i].sizes(), want[i].sizes()) << i;
      test::Comparison c = test::compare(got[i], want[i], test::Tolerance::rel(tol, tol));
      EXPECT_TRUE(c.ok()) << "output " << i << ": " << c.str() << "\n" << print_graph(after);
    }
  }
}

std::string with_dtype(std::string text, const char* dt) {
  for (size_t p = text.find("DT"); p != std::string::npos; p = text.find("DT", p))
    text.replace(p, 2, dt);
  return text;
}

// The graph of `text` in dtype `dt` with random params from `gen`, and every param named "var"
// (a batch norm's variance) drawn from [0.5, 2].
Graph with_random_params(const char* text, const char* dt, Generator& gen) {
  Graph g = parse_graph(with_dtype(text, dt), "test");
  fill_params(g, gen);
  for (Value& v : g.values)
    if (v.name == "var") v.data = Tensor::rand(v.data.sizes(), gen, 0.5, 2.0, v.data.dtype());
  return g;
}

// Runs `passes` on the graph and compares the interpreter's results before and after on two
// sets of fresh inputs. Returns the graph after the passes.
Graph check_preserves(const std::string& text, const std::vector<std::string>& passes,
                      bool expect_change = true, double tol_scale = 1.0) {
  Graph before = parse_graph(text, "test");
  Generator gen(base_seed() ^ std::hash<std::string>()(text));
  fill_params(before, gen);
  Graph after = before;
  bool changed = run_passes(after, passes);
  EXPECT_EQ(changed, expect_change) << print_graph(after);
  for (int round = 0; round < 2; ++round) {
    TensorList in = random_inputs(before, gen);
    TensorList want = run(before, in), got = run(after, in);
    EXPECT_EQ(want.size(), got.size());
    for (size_t i = 0; i < want.size() && i < got.size(); ++i) {
      std::string diff = compare(want[i], got[i], tol_scale);
      EXPECT_EQ(diff, "") << "output " << i << " after " << fmt::format("{}", fmt::join(passes, ","))
                          << ":\n" << print_graph(after);
    }
  }
  return after;
}

const char* const kFloatDTypes[] = {"f32", "f64", "f16", "bf16"};

int count_op(const Graph& g, OpId op) {
  int n = 0;
  for (const Node& node : g.nodes) n += node.op == op;
  return n;
}

// ---- algebraic-simplify ------------------------------------------------------------------------
const char* kSimplifyGraph = R"(
graph @g(%x: DT[2, 3, 4], %y: DT[2, 3, 4]) {
  const %one: DT[] = [1.0]
  const %zero: DT[4] = [0.0, 0.0, 0.0, 0.0]
  %a = mul(%x, %one)
  %b = add(%zero, %a)
  %n1 = neg(%b)
  %n2 = neg(%n1)
  %r1 = reshape(%n2) {shape=[6, 4]}
  %r2 = reshape(%r1) {shape=[2, 12]}
  %r3 = reshape(%r2) {shape=[2, 3, 4]}
  %t1 = transpose(%r3) {dim0=0, dim1=2}
  %t2 = transpose(%t1) {dim0=1, dim1=2}
  %p = permute(%t2) {dims=[1, 2, 0]}
  %c1 = cast(%p) {dtype=f64}
  %c2 = cast(%c1) {dtype=DT}
  %s = sub(%c2, %y)
  %e = expand(%s) {shape=[2, 3, 4]}
  %d = div(%e, %one)
  return %d, %p
}
)";

TEST(PassesNumeric, AlgebraicSimplifyPreservesResults) {
  for (const char* dt : kFloatDTypes) {
    SCOPED_TRACE(dt);
    Graph g = check_preserves(with_dtype(kSimplifyGraph, dt), {"algebraic-simplify", "dce"});
    EXPECT_EQ(count_op(g, OpId::Neg), 0);
    EXPECT_EQ(count_op(g, OpId::Mul), 0);
    EXPECT_EQ(count_op(g, OpId::Cast), 0);
  }
}

TEST(PassesNumeric, AlgebraicSimplifyReportsRules) {
  Graph g = parse_graph(with_dtype(kSimplifyGraph, "f32"));
  SimplifyResult r = simplify_algebra(g);
  EXPECT_GE(r.rewrites, 10);
  int total = 0;
  for (auto& [rule, n] : r.by_rule) total += n;
  EXPECT_EQ(total, r.rewrites);
  EXPECT_EQ(simplify_algebra(g).rewrites, 0) << "a second sweep found more:\n" << print_graph(g);
}

TEST(PassesNumeric, CastIsExactTable) {
  // Exhaustive for the small dtypes: every value survives the round trip exactly.
  for (DType from : {DType::Int8, DType::UInt8, DType::Bool, DType::Float16, DType::BFloat16}) {
    for (DType to : all_dtypes()) {
      if (!cast_is_exact(from, to)) continue;
      int64_t n = (from == DType::Bool) ? 2 : (is_floating(from) ? 65536 : 256);
      Tensor src = Tensor::empty(Dims{n}, from);
      for (int64_t i = 0; i < n; ++i) {
        char* p = static_cast<char*>(src.raw_data()) + i * src.element_size();
        if (is_floating(from)) {
          uint16_t bits = uint16_t(i);
          std::memcpy(p, &bits, 2);
        } else {
          store_i64(p, from, from == DType::Int8 ? i - 128 : i);
        }
      }
      Tensor back = src.to(to).to(from);
      for (int64_t i = 0; i < n; ++i) {
        double a = load_f64(static_cast<char*>(src.raw_data()) + i * src.element_size(), from);
        double b = load_f64(static_cast<char*>(back.raw_data()) + i * back.element_size(), from);
        if (std::isnan(a)) {
          ASSERT_TRUE(std::isnan(b)) << dtype_name(from) << " -> " << dtype_name(to);
        } else {
          ASSERT_EQ(a, b) << dtype_name(from) << " -> " << dtype_name(to) << " value " << a;
        }
      }
    }
  }
  EXPECT_FALSE(cast_is_exact(DType::Float32, DType::Float16));
  EXPECT_FALSE(cast_is_exact(DType::Int64, DType::Float64));
  EXPECT_FALSE(cast_is_exact(DType::Int32, DType::Float32));
  EXPECT_FALSE(cast_is_exact(DType::Float32, DType::Int64));
}

// ---- constant-fold -----------------------------------------------------------------------------
// Param-only subgraphs: a weight transpose, scaled weights, an embedding of constant positions.
const char* kFoldGraph = R"(
graph @g(%x: DT[3, 8], %ids: i64[3]) {
  param %w: DT[8, 5]
  param %scale: DT[5]
  param %pos_emb: DT[16, 5]
  param %tok_emb: DT[10, 5]
  const %positions: i64[3] = [0, 1, 2]
  %wt = transpose(%w) {dim0=0, dim1=1}
  %ws = mul(%scale, %scale)
  %y = linear(%x, %wt, %ws)
  %p = embedding(%pos_emb, %positions)
  %t = embedding(%tok_emb, %ids)
  %e = add(%t, %p)
  %o = add(%y, %e)
  return %o
}
)";

TEST(PassesNumeric, ConstantFoldPreservesResults) {
  for (const char* dt : kFloatDTypes) {
    SCOPED_TRACE(dt);
    Graph g = check_preserves(with_dtype(kFoldGraph, dt), {"constant-fold", "dce"});
    EXPECT_EQ(count_op(g, OpId::Transpose), 0);
    EXPECT_EQ(count_op(g, OpId::Embedding), 1);  // the token lookup reads an input
    EXPECT_EQ(count_op(g, OpId::Mul), 0);
  }
}

TEST(PassesNumeric, ConstantFoldRespectsOptions) {
  Graph g = parse_graph(with_dtype(kFoldGraph, "f32"));
  Generator gen(base_seed());
  fill_params(g, gen);
  Graph no_params = g;
  ConstantFoldOptions opt;
  opt.fold_params = false;
  EXPECT_EQ(fold_constants(no_params, opt).nodes_folded, 0);
  ConstantFoldResult r = fold_constants(g);
  EXPECT_EQ(r.nodes_folded, 3);  // transpose, mul, positional embedding
  EXPECT_EQ(r.folded_elements, 40 + 5 + 15);
  // The size cap: an expand of a scalar folds only when its result is "small".
  Graph capped = parse_graph(R"(
graph @g(%x: f32[4, 4]) {
  const %k: f32[] = [2.0]
  %big = expand(%k) {shape=[4, 4]}
  %y = add(%x, %big)
  return %y
}
)");
  ConstantFoldOptions tight;
  tight.small_elements = 8;
  EXPECT_EQ(fold_constants(capped, tight).nodes_folded, 0);
  tight.small_elements = 16;
  EXPECT_EQ(fold_constants(capped, tight).nodes_folded, 1);
}

// A gather of constant rows folds up to gather_elements although it grows the data (Swin V2's
// relative position bias: a small table read through a large constant index), and the
// elementwise chain after it (16 * sigmoid(bias)) folds with it; results are preserved.
TEST(PassesNumeric, ConstantFoldTakesGrowingGathersUpToTheirCap) {
  const char* text = R"(
graph @g(%x: DT[4, 3, 6]) {
  param %table: DT[5, 3]
  const %idx: i64[24] = [0, 1, 2, 3, 4, 4, 3, 2, 1, 0, 0, 2, 4, 1, 3, 3, 1, 4, 2, 0, 1, 1, 2, 2]
  const %k: DT[] = [16.0]
  %rows = index_select(%table, %idx) {dim=0}
  %s = sigmoid(%rows)
  %b = mul(%s, %k)
  %bt = reshape(%b) {shape=[4, 6, 3]}
  %bp = permute(%bt) {dims=[0, 2, 1]}
  %y = add(%x, %bp)
  return %y
}
)";
  for (const char* dt : kFloatDTypes) {
    SCOPED_TRACE(dt);
    Graph g = check_preserves(with_dtype(text, dt), {"constant-fold", "dce"});
    EXPECT_EQ(count_op(g, OpId::IndexSelect), 0);
    EXPECT_EQ(count_op(g, OpId::Sigmoid), 0);
    EXPECT_EQ(count_op(g, OpId::Mul), 0);
  }
  // The gather's 72 elements are more than its inputs' 15 + 24 and than small_elements: only
  // the gather cap lets it fold.
  Graph g = parse_graph(with_dtype(text, "f32"));
  Generator gen(base_seed());
  fill_params(g, gen);
  Graph capped = g;
  ConstantFoldOptions tight;
  tight.small_elements = 8;
  tight.gather_elements = 71;
  EXPECT_EQ(fold_constants(capped, tight).nodes_folded, 0);
  tight.gather_elements = 72;
  EXPECT_GE(fold_constants(g, tight).nodes_folded, 3);  // index_select, sigmoid, mul
}

// ---- cse and dce -------------------------------------------------------------------------------
TEST(PassesNumeric, CseAndDcePreserveResults) {
  const char* text = R"(
graph @g(%x: DT[4, 6], %y: DT[4, 6]) {
  param %w: DT[3, 6]
  const %k1: DT[] = [0.5]
  const %k2: DT[] = [0.5]
  %a = linear(%x, %w)
  %b = linear(%x, %w)
  %c = add(%a, %b)
  %d = mul(%x, %k1)
  %e = mul(%k2, %x)
  %f = add(%d, %e)
  %s1, %s2 = split(%y) {sizes=[2, 4], dim=1}
  %t1, %t2 = split(%y) {sizes=[2, 4], dim=1}
  %u = concat(%s2, %t1, %f) {dim=1}
  %dead = exp(%u)
  return %c, %u
}
)";
  for (const char* dt : kFloatDTypes) {
    SCOPED_TRACE(dt);
    Graph g = check_preserves(with_dtype(text, dt), {"cse", "dce"});
    EXPECT_EQ(count_op(g, OpId::Linear), 1);
    EXPECT_EQ(count_op(g, OpId::Split), 1);
    EXPECT_EQ(count_op(g, OpId::Mul), 1);
    EXPECT_EQ(count_op(g, OpId::Exp), 0);
  }
}

TEST(PassesNumeric, CseAndDceCounts) {
  Graph g = parse_graph(R"(
graph @g(%x: f32[4]) {
  const %k1: f32[] = [2.0]
  const %k2: f32[] = [2.0]
  param %unused: f32[4]
  %a = mul(%x, %k1)
  %b = mul(%x, %k2)
  %c = add(%a, %b)
  %d1 = exp(%c)
  %d2 = exp(%d1)
  return %c
}
)");
  CseResult c = eliminate_common_subexpressions(g);
  EXPECT_EQ(c.consts_merged, 1);
  EXPECT_EQ(c.nodes_merged, 1);
  DceResult d = eliminate_dead_code(g);
  EXPECT_EQ(d.nodes_removed, 2);
  EXPECT_EQ(d.params_removed, 1);  // %unused (the merged const went with cse)
  EXPECT_EQ(eliminate_dead_code(g).nodes_removed, 0);
  EXPECT_EQ(eliminate_common_subexpressions(g).nodes_merged, 0);
}

// ---- decompose ---------------------------------------------------------------------------------
// Every op with a decomposition, in every dtype it supports, on each of its harness samples
// drawn from a fresh generator: the one-node graph and its decomposition agree.
TEST(PassesNumeric, DecomposeEveryDecomposableOp) {
  int checked = 0;
  for (const OpDef& op : all_ops()) {
    if (!op.decompose || !op.samples) continue;
    Generator gen(base_seed() ^ std::hash<std::string>()(op.name));
    std::vector<OpSample> samples = op.samples(gen);
    for (DType dt : op.dtypes) {
      if (!is_floating(dt)) continue;
      for (size_t s = 0; s < samples.size(); ++s) {
        SCOPED_TRACE(fmt::format("{} {} sample {} ({})", op.name, dtype_name(dt), s,
                                 samples[s].note));
        Graph g;
        std::vector<ValueId> ins;
        TensorList args;
        for (size_t i = 0; i < samples[s].inputs.size(); ++i) {
          const Tensor& t = samples[s].inputs[i];
          if (!t.defined()) {
            ins.push_back(kNoValue);
            continue;
          }
          Tensor v = is_floating(t.dtype()) ? t.to(dt) : t;
          ins.push_back(g.add_input(fmt::format("in{}", i), TensorType(v.dtype(), to_shape(v.sizes()))));
          args.push_back(v);
        }
        try {
          g.outputs = g.add_node(op.id, ins, samples[s].attrs, "node");
        } catch (const Error& e) {
          FAIL() << "building the graph: " << e.what();
        }
        Graph d = g;
        DecomposeOptions only;
        only.ops = {op.id};
        DecomposeResult r = decompose_ops(d, only);
        ASSERT_EQ(r.nodes_decomposed, 1) << print_graph(d);
        EXPECT_EQ(count_op(d, op.id), 0) << print_graph(d);
        TensorList want = run(g, args), got = run(d, args);
        ASSERT_EQ(want.size(), got.size());
        for (size_t k = 0; k < want.size(); ++k)
          EXPECT_EQ(compare(want[k], got[k], 2 * op.tolerance_scale), "") << print_graph(d);
        ++checked;
      }
    }
  }
  EXPECT_GE(checked, 40);
}

TEST(PassesNumeric, DecomposeSelection) {
  const char* text = R"(
graph @g(%x: f32[2, 3, 4, 4], %r: f32[2, 5, 4, 4], %t: f32[2, 6]) {
  param %w: f32[5, 3, 1, 1]
  %y = fused_conv2d(%x, %w, _, %r) {activation="relu"}
  %s = softmax(%t) {dim=1}
  %l = layer_norm(%t) {normalized_shape=[6]}
  return %y, %s, %l
}
)";
  Graph base = parse_graph(text);
  {
    Graph g = base;  // default: everything decomposable but the fused ops
    EXPECT_EQ(decompose_ops(g).nodes_decomposed, 2);
    EXPECT_EQ(count_op(g, OpId::FusedConv2d), 1);
    EXPECT_EQ(count_op(g, OpId::Softmax) + count_op(g, OpId::LayerNorm), 0);
  }
  {
    Graph g = base;  // an explicit list
    DecomposeOptions o;
    o.ops = {OpId::Softmax, OpId::FusedConv2d};
    EXPECT_EQ(decompose_ops(g, o).nodes_decomposed, 2);
    EXPECT_EQ(count_op(g, OpId::FusedConv2d), 0);
    EXPECT_EQ(count_op(g, OpId::Conv2d), 1);
    EXPECT_EQ(count_op(g, OpId::LayerNorm), 1);
  }
  {
    Graph g = base;  // keep list
    DecomposeOptions o;
    o.keep = {OpId::LayerNorm};
    EXPECT_EQ(decompose_ops(g, o).nodes_decomposed, 2);
    EXPECT_EQ(count_op(g, OpId::LayerNorm), 1);
    EXPECT_EQ(count_op(g, OpId::FusedConv2d), 0);
  }
  {
    // Through the pass object and run_passes (verification after the pass).
    Graph g = base;
    DecomposeOptions o;
    o.ops = {OpId::LayerNorm};
    std::unique_ptr<Pass> p = make_decompose_pass(o);
    std::vector<Pass*> passes = {p.get()};
    EXPECT_TRUE(run_passes(g, std::span<Pass* const>(passes)));
    EXPECT_EQ(count_op(g, OpId::LayerNorm), 0);
    EXPECT_FALSE(run_passes(g, std::span<Pass* const>(passes)));
  }
}

// ---- fold-conv-bn ------------------------------------------------------------------------------
const char* kConvBnGraph = R"(
graph @g(%x: DT[2, 3, 6, 6], %t: DT[4, 5]) {
  param %c1.weight: DT[4, 3, 3, 3]
  param %c1.bias: DT[4]
  param %bn1.mean: DT[4]
  param %bn1.var: DT[4]
  param %bn1.weight: DT[4]
  param %bn1.bias: DT[4]
  param %c2.weight: DT[6, 2, 1, 1]
  param %bn2.mean: DT[6]
  param %bn2.var: DT[6]
  param %fc.weight: DT[3, 5]
  param %bn3.mean: DT[3]
  param %bn3.var: DT[3]
  param %bn3.bias: DT[3]
  %c1 = conv2d(%x, %c1.weight, %c1.bias) {padding=[1, 1]}
  %b1 = batch_norm(%c1, %bn1.mean, %bn1.var, %bn1.weight, %bn1.bias) {eps=0.001}
  %r1 = relu(%b1)
  %c2 = conv2d(%r1, %c2.weight) {stride=[2, 2], groups=2}
  %b2 = batch_norm(%c2, %bn2.mean, %bn2.var)
  %l = linear(%t, %fc.weight)
  %b3 = batch_norm(%l, %bn3.mean, %bn3.var, _, %bn3.bias)
  return %b2, %b3
}
)";

TEST(PassesNumeric, FoldConvBnPreservesResults) {
  for (const char* dt : kFloatDTypes) {
    SCOPED_TRACE(dt);
    // Low precision: W' = W*s is rounded once more than W, so allow twice the tolerance.
    Graph g = check_preserves(with_dtype(kConvBnGraph, dt), {"fold-conv-bn", "dce"}, true, 2.0);
    EXPECT_EQ(count_op(g, OpId::BatchNorm), 0);
    int folded_params = 0;
    for (const Value& v : g.values) folded_params += v.kind == ValueKind::Param &&
                                                     v.name.find(".folded") != std::string::npos;
    EXPECT_EQ(folded_params, 6);
  }
  Graph g = parse_graph(with_dtype(kConvBnGraph, "f32"));
  Generator gen(base_seed());
  fill_params(g, gen);
  FoldConvBnResult r = fold_conv_bn(g);
  EXPECT_EQ(r.conv_folded, 2);
  EXPECT_EQ(r.linear_folded, 1);
  EXPECT_EQ(fold_conv_bn(g).conv_folded, 0);
}

// ---- fuse-epilogues ----------------------------------------------------------------------------
const char* kEpilogueGraph = R"(
graph @g(%x: DT[2, 4, 5, 5], %t: DT[3, 7], %rt: DT[3, 6]) {
  param %w1: DT[4, 4, 3, 3]
  param %b1: DT[4]
  param %w2: DT[4, 4, 1, 1]
  param %cb: DT[1, 4, 1, 1]
  param %wd: DT[4, 4, 1, 1]
  param %fw: DT[6, 7]
  param %fb: DT[6]
  %c1 = conv2d(%x, %w1, %b1) {padding=[1, 1]}
  %a1 = relu(%c1)
  %c2 = conv2d(%a1, %w2)
  %c2b = add(%c2, %cb)
  %d = conv2d(%x, %wd)
  %s = add(%c2b, %d)
  %a2 = clamp(%s) {min=0.0, max=6.0}
  %l = linear(%t, %fw)
  %lb = add(%l, %fb)
  %lr = sub(%lb, %rt)
  %g = gelu(%lr) {approximate="tanh"}
  %l2 = linear(%t, %fw, %fb)
  %sg = silu(%l2)
  return %a2, %g, %sg
}
)";

TEST(PassesNumeric, FuseEpiloguesPreservesResults) {
  for (const char* dt : kFloatDTypes) {
    SCOPED_TRACE(dt);
    Graph g = check_preserves(with_dtype(kEpilogueGraph, dt), {"fuse-epilogues"}, true, 2.0);
    EXPECT_EQ(count_op(g, OpId::FusedConv2d), 2);
    EXPECT_EQ(count_op(g, OpId::FusedLinear), 2);
    EXPECT_EQ(count_op(g, OpId::Conv2d), 1);  // the downsample, now a residual
    EXPECT_EQ(count_op(g, OpId::Add), 0);
  }
  Graph g = parse_graph(with_dtype(kEpilogueGraph, "f32"));
  FuseEpiloguesResult r = fuse_epilogues(g);
  EXPECT_EQ(r.conv_fused, 2);
  EXPECT_EQ(r.linear_fused, 2);
  EXPECT_EQ(r.bias_adds, 2);
  EXPECT_EQ(r.residual_adds, 2);
  EXPECT_EQ(r.activations, 4);
  EXPECT_EQ(fuse_epilogues(g).conv_fused, 0);
}

// ---- the default pipeline ----------------------------------------------------------------------
TEST(PassesNumeric, DefaultPipelinePreservesResultsAndIsIdempotent) {
  const std::string text = std::string(R"(
graph @g(%x: DT[2, 4, 5, 5]) {
  param %w: DT[4, 4, 3, 3]
  param %m: DT[4]
  param %var: DT[4]
  param %gamma: DT[4]
  param %beta: DT[4]
  param %fw: DT[8, 4]
  const %one: DT[] = [1.0]
  %c = conv2d(%x, %w) {padding=[1, 1]}
  %bn = batch_norm(%c, %m, %var, %gamma, %beta)
  %s = add(%bn, %x)
  %r = relu(%s)
  %p = adaptive_avg_pool2d(%r) {output_size=[1, 1]}
  %f = flatten(%p) {start_dim=1}
  %f2 = reshape(%f) {shape=[2, 4]}
  %fwt = transpose(%fw) {dim0=0, dim1=1}
  %fwtt = transpose(%fwt) {dim0=0, dim1=1}
  %l = linear(%f2, %fwtt)
  %l1 = mul(%l, %one)
  %y = sigmoid(%l1)
  %y2 = sigmoid(%l1)
  %o = add(%y, %y2)
  return %o
}
)");
  for (const char* dt : kFloatDTypes) {
    SCOPED_TRACE(dt);
    Graph g = check_preserves(with_dtype(text, dt), {"default"}, true, 2.0);
    EXPECT_EQ(count_op(g, OpId::FusedConv2d), 1) << print_graph(g);
    EXPECT_EQ(count_op(g, OpId::FusedLinear), 1) << print_graph(g);
    EXPECT_EQ(count_op(g, OpId::BatchNorm) + count_op(g, OpId::Transpose) +
                  count_op(g, OpId::Mul) + count_op(g, OpId::Reshape),
              0)
        << print_graph(g);
    std::string once = print_graph(g);
    std::vector<std::string> again = {"default"};
    EXPECT_FALSE(run_passes(g, again)) << "the pipeline is not at a fixed point";
    EXPECT_EQ(print_graph(g), once);
  }
}

// An exported transformer MLP: MatMul by a weight param, the bias add, GELU as its erf formula
// with the scalars as params (ONNX initializers), then the second MatMul. The default pipeline
// makes it a fused_linear with the bias and GELU and a plain linear (Note [erf GELU],
// passes/matmul_to_linear.h): no matmul, erf or pointwise node left, and the results agree with
// the original graph run in float64.
TEST(PassesNumeric, ExportedMlpBecomesFusedLinears) {
  const char* text = R"(
graph @mlp(%x: f32[2, 5, 8]) {
  param %w1: f32[8, 12]
  param %b1: f32[12]
  param %w2: f32[12, 8]
  param %s2: f32[]
  param %one: f32[]
  param %half: f32[]
  %m = matmul(%x, %w1)
  %y = add(%b1, %m)
  %d = div(%y, %s2)
  %e = erf(%d)
  %t = add(%e, %one)
  %u = mul(%y, %t)
  %g = mul(%u, %half)
  %z = matmul(%g, %w2)
  return %z
}
)";
  Graph before = parse_graph(text, "test");
  Generator gen(base_seed() ^ 17);
  fill_params(before, gen);
  for (Value& v : before.values) {
    if (v.name == "s2") v.data = Tensor::scalar(std::sqrt(2.0), DType::Float32);
    if (v.name == "one") v.data = Tensor::scalar(1.0, DType::Float32);
    if (v.name == "half") v.data = Tensor::scalar(0.5, DType::Float32);
  }
  Graph after = before;
  std::vector<std::string> passes = {"default"};
  ASSERT_TRUE(run_passes(after, passes));
  EXPECT_EQ(count_op(after, OpId::FusedLinear), 1) << print_graph(after);
  EXPECT_EQ(count_op(after, OpId::Linear), 1) << print_graph(after);
  for (OpId op : {OpId::Matmul, OpId::Erf, OpId::Mul, OpId::Add, OpId::Div, OpId::Gelu})
    EXPECT_EQ(count_op(after, op), 0) << op_def(op).name << "\n" << print_graph(after);
  expect_matches_float64(before, after, gen, 1e-4);
}

// GPT-2's MLP as exported (Note [tanh GELU]): a 2-D addmm reshaped to [batch, rows, N], the
// tanh GELU formula, the second linear; the scalars are params. The default pipeline makes it
// one fused_linear with gelu_tanh (through the reshape: Note [activation through a view]) and a
// linear: no pow, tanh or pointwise node left, and the results agree with the graph run in
// float64.
TEST(PassesNumeric, ExportedGpt2MlpBecomesFusedLinears) {
  const char* text = R"(
graph @gpt2_mlp(%x: f32[2, 4, 8]) {
  param %w1: f32[8, 32]
  param %b1: f32[32]
  param %w2: f32[32, 8]
  param %half: f32[]
  param %three: f32[]
  param %c: f32[]
  param %k: f32[]
  param %one: f32[]
  %x2 = reshape(%x) {shape=[8, 8]}
  %m = matmul(%x2, %w1)
  %y2 = add(%b1, %m)
  %y = reshape(%y2) {shape=[2, 4, 32]}
  %h = mul(%y, %half)
  %p = pow(%y, %three)
  %q = mul(%p, %c)
  %v = add(%y, %q)
  %u = mul(%v, %k)
  %t = tanh(%u)
  %s = add(%t, %one)
  %g = mul(%h, %s)
  %z = matmul(%g, %w2)
  return %z
}
)";
  Graph before = parse_graph(text, "test");
  Generator gen(base_seed() ^ 23);
  fill_params(before, gen);
  const std::pair<const char*, double> scalars[] = {
      {"half", 0.5}, {"three", 3.0}, {"c", 0.044715}, {"k", std::sqrt(2.0 / M_PI)}, {"one", 1.0}};
  for (Value& v : before.values)
    for (auto [name, x] : scalars)
      if (v.name == name) v.data = Tensor::scalar(x, DType::Float32);
  Graph after = before;
  std::vector<std::string> passes = {"default"};
  ASSERT_TRUE(run_passes(after, passes));
  EXPECT_EQ(count_op(after, OpId::FusedLinear), 1) << print_graph(after);
  EXPECT_EQ(count_op(after, OpId::Linear), 1) << print_graph(after);
  for (OpId op : {OpId::Matmul, OpId::Pow, OpId::Tanh, OpId::Mul, OpId::Add, OpId::Gelu})
    EXPECT_EQ(count_op(after, op), 0) << op_def(op).name << "\n" << print_graph(after);
  expect_matches_float64(before, after, gen, 1e-4);
}

// patch-conv-to-linear (passes/patch_conv.h): a patch embedding (windows that tile the input)
// becomes patch rows + one linear, with the weight as a [O, C*kh*kw] param of its own; the
// result is the convolution's against float64, with and without a bias and for a batch of 2
// with non-square windows. Convolutions whose windows overlap, pad or skip are left alone.
TEST(PassesNumeric, PatchConvBecomesOneLinear) {
  const char* text = R"(
graph @patches(%x: f32[2, 3, 12, 10], %y: f32[1, 4, 8, 8]) {
  param %w: f32[6, 3, 4, 5]
  param %b: f32[6]
  param %w2: f32[5, 4, 2, 2]
  param %w3: f32[5, 4, 3, 3]
  %a = conv2d(%x, %w, %b) {stride = [4, 5], padding = [0, 0], dilation = [1, 1], groups = 1} loc("patch_embed")
  %c = conv2d(%y, %w2) {stride = [2, 2], padding = [0, 0], dilation = [1, 1], groups = 1}
  %d = conv2d(%y, %w3) {stride = [3, 3], padding = [1, 1], dilation = [1, 1], groups = 1}
  %e = conv2d(%y, %w2) {stride = [1, 1], padding = [0, 0], dilation = [1, 1], groups = 1}
  return %a, %c, %d, %e
}
)";
  Graph before = parse_graph(text, "test");
  Generator gen(base_seed() ^ 29);
  fill_params(before, gen);
  Graph after = before;
  std::vector<std::string> passes = {"patch-conv-to-linear", "dce"};
  ASSERT_TRUE(run_passes(after, passes));
  EXPECT_EQ(count_op(after, OpId::Linear), 2) << print_graph(after);
  EXPECT_EQ(count_op(after, OpId::Conv2d), 2) << print_graph(after);  // %d pads, %e overlaps
  bool rows = false;
  for (const Value& v : after.values) rows = rows || (v.kind == ValueKind::Param && v.name == "w.rows");
  EXPECT_TRUE(rows) << print_graph(after);
  expect_matches_float64(before, after, gen, 1e-5);
}

// attention-heads-last (passes/attention_heads_last.h, Note [attention writes heads last]):
// attention whose one use is a transpose of dims -3 and -2 (as transpose(1, 2), transpose(-3,
// -2) or ONNX's permute [0, 2, 1, 3]; rank 3 too) writes heads-last and the transpose goes, so
// the reshape after it reads a contiguous value; attention used twice, transposed over other
// dims, or returned as it is stays. Results against the interpreter before the pass in every
// float dtype, and against float64.
TEST(PassesNumeric, AttentionWritesHeadsLastWhereOnlyTransposed) {
  const std::string text = R"(
graph @attn(%q: DT[2, 3, 5, 8], %k: DT[2, 3, 7, 8], %v: DT[2, 3, 7, 4], %m: DT[2, 1, 1, 7], %x: DT[3, 6, 8]) {
  %o = scaled_dot_product_attention(%q, %k, %v, %m) {is_causal=false}
  %t = transpose(%o) {dim0=1, dim1=2}
  %y = reshape(%t) {shape=[2, 5, 12]}
  %o2 = scaled_dot_product_attention(%q, %k, %v) {is_causal=true}
  %p = permute(%o2) {dims=[0, 2, 1, 3]}
  %o3 = scaled_dot_product_attention(%q, %k, %v) {is_causal=false, scale=0.5}
  %t3 = transpose(%o3) {dim0=-3, dim1=-2}
  %s3 = add(%o3, %o3)
  %o4 = scaled_dot_product_attention(%q, %k, %v) {is_causal=false}
  %t4 = transpose(%o4) {dim0=2, dim1=3}
  %o5 = scaled_dot_product_attention(%x, %x, %x) {is_causal=true}
  %t5 = transpose(%o5) {dim0=-2, dim1=-3}
  %o6 = scaled_dot_product_attention(%q, %k, %v) {is_causal=false}
  return %y, %p, %t3, %s3, %t4, %t5, %o6
}
)";
  for (const char* dt : kFloatDTypes) {
    SCOPED_TRACE(dt);
    Graph after = check_preserves(with_dtype(text, dt), {"attention-heads-last"});
    int heads_last = 0;
    for (const Node& n : after.nodes)
      if (n.op == OpId::ScaledDotProductAttention) heads_last += n.attrs.get_bool("heads_last");
    EXPECT_EQ(heads_last, 3) << print_graph(after);
    EXPECT_EQ(count_op(after, OpId::Transpose), 2) << print_graph(after);  // %t3, %t4
    EXPECT_EQ(count_op(after, OpId::Permute), 0) << print_graph(after);
    EXPECT_EQ(to_dims(after.type(after.outputs[1]).shape), (Dims{2, 5, 3, 4}));
    // The rewritten graph's values keep the transposes' names.
    EXPECT_EQ(after.value(after.outputs[1]).name, "p");
    EXPECT_EQ(after.value(after.outputs[5]).name, "t5");
    // A second run finds nothing left to rewrite.
    Graph again = after;
    EXPECT_FALSE(run_passes(again, std::vector<std::string>{"attention-heads-last"}));
    if (std::string(dt) == "f32") {
      Graph before = parse_graph(with_dtype(text, dt), "test");
      Generator gen(base_seed() ^ 31);
      expect_matches_float64(before, after, gen, 1e-5);
    }
  }
}

// fuse-attention (passes/fuse_attention.h, Note [attention fused from its parts]): matmul(q, kT)
// scaled by a constant after the product (div) or before it (q * c), or by a one-element weight
// after it (which then divides q), an added mask (either operand order) or none,
// softmax over the keys, matmul with v -> one attention node with the product of the scales; kT
// given as ONNX gives it (a permute of [B, S, H, D], here divided by a one-element weight, which
// stays an op after k's transpose) or as a value. Chains whose scores are used
// twice, whose softmax runs over another dim, whose scale is not a constant or is negative, or
// whose mask would widen the scores stay as they are. Results against the float64 run of the
// graph before, every float dtype, and masked rows NaN in both.
TEST(PassesNumeric, AttentionChainsFuseIntoOneNode) {
  const std::string text = R"(
graph @chains(%q: DT[2, 3, 5, 8], %kt: DT[2, 3, 8, 7], %v: DT[2, 3, 7, 4], %m: DT[2, 1, 1, 7], %kb: DT[2, 7, 3, 8], %w: DT[2, 3, 5, 7], %big: DT[4, 2, 3, 5, 7]) {
  const %c: DT[] = [2.5]
  const %neg: DT[] = [-0.5]
  param %pw: DT[1]
  %s1 = matmul(%q, %kt)
  %d1 = div(%s1, %c)
  %a1 = add(%d1, %m)
  %p1 = softmax(%a1) {dim=-1}
  %o1 = matmul(%p1, %v)
  %qs = mul(%q, %c)
  %kt2 = permute(%kb) {dims=[0, 2, 3, 1]}
  %kt2s = div(%kt2, %pw)
  %s2 = matmul(%qs, %kt2s)
  %p2 = softmax(%s2) {dim=3}
  %o2 = matmul(%p2, %v)
  %s3 = matmul(%q, %kt)
  %p3 = softmax(%s3) {dim=-1}
  %o3 = matmul(%p3, %v)
  %x3 = add(%s3, %s3)
  %s4 = matmul(%q, %kt)
  %p4 = softmax(%s4) {dim=2}
  %o4 = matmul(%p4, %v)
  %s5 = matmul(%q, %kt)
  %d5 = mul(%s5, %w)
  %p5 = softmax(%d5) {dim=-1}
  %o5 = matmul(%p5, %v)
  %s6 = matmul(%q, %kt)
  %d6 = mul(%s6, %neg)
  %p6 = softmax(%d6) {dim=-1}
  %o6 = matmul(%p6, %v)
  %s7 = matmul(%q, %kt)
  %a7 = add(%s7, %big)
  %p7 = softmax(%a7) {dim=-1}
  %o7 = matmul(%p7, %v)
  %s8 = matmul(%q, %kt)
  %d8 = div(%s8, %pw)
  %a8 = add(%m, %d8)
  %p8 = softmax(%a8) {dim=-1}
  %o8 = matmul(%p8, %v)
  return %o1, %o2, %o3, %x3, %o4, %o5, %o6, %o7, %o8
}
)";
  for (const char* dt : kFloatDTypes) {
    SCOPED_TRACE(dt);
    Graph before = parse_graph(with_dtype(text, dt), "test");
    for (Value& v : before.values)
      if (v.name == "pw") v.data = Tensor::full(Dims{1}, 1.75, v.type.dtype);
    Graph after = before;
    EXPECT_EQ(fuse_attention(after), 3) << print_graph(after);
    Graph clean = after;
    ASSERT_TRUE(run_passes(clean, std::vector<std::string>{"dce"}));
    EXPECT_EQ(fuse_attention(clean), 0) << print_graph(clean);
    EXPECT_EQ(count_op(clean, OpId::ScaledDotProductAttention), 3) << print_graph(clean);
    EXPECT_EQ(count_op(clean, OpId::Softmax), 5) << print_graph(clean);  // %p3 .. %p7 stay
    std::vector<double> scales;
    for (const Node& n : clean.nodes)
      if (n.op == OpId::ScaledDotProductAttention) scales.push_back(n.attrs.get_float("scale"));
    ASSERT_EQ(scales.size(), 3u);
    EXPECT_DOUBLE_EQ(scales[0], 1.0 / 2.5);
    EXPECT_DOUBLE_EQ(scales[1], 2.5);
    EXPECT_DOUBLE_EQ(scales[2], 1.0);  // %o8's weight divides q instead
    EXPECT_EQ(clean.value(clean.outputs[0]).name, "o1");  // the fused node keeps the name
    // The weight's divisions now read k (transposed kT) and q, not kT and the scores.
    int on_k = 0, on_q = 0;
    for (const Node& n : clean.nodes)
      if (n.op == OpId::Div && clean.value(n.inputs[1]).name == "pw") {
        const Value& x = clean.value(n.inputs[0]);
        if (x.kind == ValueKind::Input) {
          EXPECT_EQ(x.name, "q");
          ++on_q;
          continue;
        }
        EXPECT_EQ(clean.nodes[size_t(x.producer)].op, OpId::Transpose) << print_graph(clean);
        EXPECT_EQ(to_dims(clean.type(n.outputs[0]).shape), (Dims{2, 3, 7, 8})) << print_graph(clean);
        ++on_k;
      }
    EXPECT_EQ(on_k, 1) << print_graph(clean);
    EXPECT_EQ(on_q, 1) << print_graph(clean);
    Generator gen(base_seed() ^ 41);
    const bool half = std::string(dt) == "f16" || std::string(dt) == "bf16";
    expect_matches_float64(before, clean, gen, half ? 3e-2 : 1e-5);
    // A row of the mask all -inf: NaN before and after.
    TensorList in = random_inputs(before, gen);
    Tensor m = in[3].to(DType::Float64).contiguous();
    for (int j = 0; j < 7; ++j) m.data<double>()[7 + j] = -INFINITY;  // batch 1
    in[3] = m.to(before.type(before.inputs[3]).dtype);
    TensorList want = run(before, in), got = run(clean, in);
    Tensor w = want[0].to(DType::Float64).contiguous(), g = got[0].to(DType::Float64).contiguous();
    const int64_t half_n = w.numel() / 2;  // batch 1's outputs
    for (int64_t x = 0; x < w.numel(); ++x) {
      EXPECT_EQ(std::isnan(w.data<double>()[x]), x >= half_n) << x;
      EXPECT_EQ(std::isnan(g.data<double>()[x]), x >= half_n) << x;
    }
  }
}

// attention-mask-guard (passes/attention_mask_guard.h, Note [guarded attention masks]): a mask
// computed at run time for float16/bfloat16 attention becomes where(row masked whole, NaN, mask),
// materialized to the scores' rows ([2, 1, 5, 7] from [2, 1, 1, 7]; [1, 1, 5, 7] from a
// batch-less [1, 7]; a bool mask made additive first); the two attentions reading one mask share
// one guard. Attention in float32, whose q, k and v broadcast their batch dims, or with a scalar
// mask stays as it was; a second run changes nothing. The interpreter gives the same bits before and after on masks whose rows
// are masked whole (NaN before and after), that hold a NaN, or hold neither.
TEST(PassesNumeric, AttentionMaskGuardKeepsTheResultsAndNaNsMaskedRows) {
  const std::string text = R"(
graph @attn(%q: DT[2, 3, 5, 8], %k: DT[2, 3, 7, 8], %v: DT[2, 3, 7, 4], %m: DT[2, 1, 1, 7], %m2: DT[1, 7], %b: bool[2, 1, 1, 7], %q32: f32[2, 3, 5, 8], %m32: f32[2, 1, 1, 5], %k1: DT[1, 3, 7, 8], %v1: DT[1, 3, 7, 4], %s: DT[]) {
  %mm = add(%m, %m)
  %o1 = scaled_dot_product_attention(%q, %k, %v, %mm) {is_causal=false}
  %o2 = scaled_dot_product_attention(%q, %k, %v, %mm) {is_causal=false, scale=0.25}
  %o3 = scaled_dot_product_attention(%q, %k, %v, %m2) {is_causal=false}
  %o4 = scaled_dot_product_attention(%q, %k, %v, %b) {is_causal=false}
  %o5 = scaled_dot_product_attention(%q32, %q32, %q32, %m32) {is_causal=false}
  %o6 = scaled_dot_product_attention(%q, %k1, %v1, %m) {is_causal=false}
  %o7 = scaled_dot_product_attention(%q, %k, %v, %s) {is_causal=false}
  return %o1, %o2, %o3, %o4, %o5, %o6, %o7
}
)";
  for (const char* dt : {"f16", "bf16"}) {
    SCOPED_TRACE(dt);
    Graph before = parse_graph(with_dtype(text, dt), "test");
    Graph after = before;
    EXPECT_EQ(attention_mask_guard(after), 4) << print_graph(after);
    EXPECT_EQ(attention_mask_guard(after), 0) << print_graph(after);
    // %mm's, %m2's and %b's guards, and %b made additive.
    EXPECT_EQ(count_op(after, OpId::Where), 4) << print_graph(after);
    int guarded = 0;
    for (const Node& n : after.nodes) {
      if (n.op != OpId::ScaledDotProductAttention || n.inputs.size() < 4) continue;
      const bool g = guarded_attention_mask(after, n.inputs[3]);
      guarded += g;
      if (g) {
        const Dims md = to_dims(after.type(n.inputs[3]).shape);
        EXPECT_EQ(md[2], 5) << print_graph(after);  // the scores' rows
        EXPECT_EQ(md[3], 7) << print_graph(after);
      }
    }
    EXPECT_EQ(guarded, 4) << print_graph(after);
    EXPECT_FALSE(guarded_attention_mask(after, after.inputs[3]));  // a graph input is no guard
    Generator gen(base_seed() ^ 37);
    const DType d = std::string(dt) == "f16" ? DType::Float16 : DType::BFloat16;
    for (int round = 0; round < 3; ++round) {
      TensorList in = random_inputs(before, gen);
      // Masks: round 0 as drawn; round 1 batch 1's row and m2 masked whole; round 2 a NaN too.
      {  // %b: each row attends a key in round 0; batch 0's row attends nothing after it
        Tensor bm = in[5].contiguous();
        bm.data<bool>()[0] = bm.data<bool>()[7] = true;
        if (round >= 1)
          for (int j = 0; j < 7; ++j) bm.data<bool>()[j] = false;
        in[5] = bm;
      }
      for (int which : {3, 4}) {
        Tensor m = in[size_t(which)].to(DType::Float64).contiguous();
        double* p = m.data<double>();
        if (round >= 1)
          for (int j = 0; j < 7; ++j) p[which == 3 ? 7 + j : j] = -INFINITY;
        if (round == 2 && which == 3) p[2] = NAN;
        in[size_t(which)] = m.to(d);
      }
      TensorList want = run(before, in), got = run(after, in);
      ASSERT_EQ(want.size(), got.size());
      int64_t nans = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        test::Comparison c = test::compare(got[i], want[i], test::Tolerance::exact());
        EXPECT_TRUE(c.ok()) << "round " << round << " output " << i << ": " << c.str();
        Tensor w = want[i].to(DType::Float64).contiguous();
        for (int64_t e = 0; e < w.numel(); ++e) nans += std::isnan(w.data<double>()[e]);
      }
      // Rows masked whole (and a NaN's row) are NaN in the reference: the case the guard keeps.
      if (round >= 1) EXPECT_GT(nans, 0) << "round " << round;
      if (round == 0) EXPECT_EQ(nans, 0);
    }
  }
}

// pointwise-deconv-to-conv (passes/deconv_to_conv.h): 1x1 stride-1 transposed convolutions,
// grouped (3 groups of 2 -> 4 channels) and not, with and without a bias, one followed by a
// batch_norm that the default pipeline then folds into the new conv2d; a strided one, a 2x2 one
// and a padded one stay. Results against float64 on fresh inputs, every float dtype.
TEST(PassesNumeric, PointwiseDeconvBecomesAConv) {
  const char* text = R"(
graph @deconv(%x: DT[2, 6, 5, 7]) {
  param %w1: DT[6, 4, 1, 1]
  param %b1: DT[12]
  param %w2: DT[6, 3, 1, 1]
  param %w3: DT[6, 3, 1, 1]
  param %w4: DT[6, 3, 2, 2]
  param %mean: DT[3]
  param %var: DT[3]
  %a = conv_transpose2d(%x, %w1, %b1) {groups = 3} loc("grouped")
  %c = conv_transpose2d(%x, %w2) loc("plain")
  %n = batch_norm(%c, %mean, %var) {eps = 0.5}
  %r = relu(%n)
  %s = conv_transpose2d(%x, %w3) {stride = [2, 2]}
  %k = conv_transpose2d(%x, %w4) {stride = [2, 2]}
  %p = conv_transpose2d(%x, %w3) {padding = [0, 0], output_padding = [0, 0], dilation = [2, 2]}
  return %a, %r, %s, %k, %p
}
)";
  for (const char* dt : kFloatDTypes) {
    SCOPED_TRACE(dt);
    Generator gen(base_seed() ^ 31);
    Graph before = with_random_params(text, dt, gen);
    Graph once = before;
    EXPECT_EQ(pointwise_deconv_to_conv(once), 3);  // %a, %c and the dilated 1x1 %p
    EXPECT_EQ(pointwise_deconv_to_conv(once), 0);
    EXPECT_EQ(count_op(once, OpId::ConvTranspose2d), 2) << print_graph(once);
    Graph after = before;
    ASSERT_TRUE(run_passes(after, default_pipeline()));
    EXPECT_EQ(count_op(after, OpId::BatchNorm), 0) << print_graph(after);  // folded into the conv
    EXPECT_EQ(count_op(after, OpId::ConvTranspose2d), 2) << print_graph(after);
    bool grouped = false;
    for (const Node& n : after.nodes)
      grouped = grouped || ((n.op == OpId::Conv2d || n.op == OpId::FusedConv2d) &&
                            n.attrs.get_int("groups") == 3);
    EXPECT_TRUE(grouped) << print_graph(after);
    expect_matches_float64(before, after, gen, std::string(dt) == "f32" || std::string(dt) == "f64"
                                                   ? 1e-5 : 3e-2);
  }
}

// Note [subsampling pools] (algebraic-simplify): 1x1 max and average pools at strides (2, 2),
// (2, 1) with ceil_mode and (1, 3) become strided slices and compute the pools' values on fresh
// inputs, every float dtype.
TEST(PassesNumeric, SubsamplingPoolsBecomeStridedSlices) {
  const char* text = R"(
graph @subsample(%x: DT[2, 3, 5, 7]) {
  %a = max_pool2d(%x) {kernel_size = [1, 1], stride = [2, 2]}
  %r = max_pool2d(%x) {kernel_size = [1, 1], stride = [2, 1], ceil_mode = true}
  %c = avg_pool2d(%x) {kernel_size = [1, 1], stride = [1, 3]}
  %s = relu(%a)
  return %s, %r, %c
}
)";
  for (const char* dt : kFloatDTypes) {
    SCOPED_TRACE(dt);
    Graph before = parse_graph(with_dtype(text, dt), "test");
    Generator gen(base_seed() ^ 41);
    Graph after = before;
    std::vector<std::string> passes = {"algebraic-simplify", "dce"};
    ASSERT_TRUE(run_passes(after, passes));
    EXPECT_EQ(count_op(after, OpId::MaxPool2d) + count_op(after, OpId::AvgPool2d), 0) << print_graph(after);
    EXPECT_EQ(count_op(after, OpId::Slice), 4) << print_graph(after);
    expect_matches_float64(before, after, gen, 0.0);
  }
}

// one-window-conv-to-linear (passes/window_conv.h): convolutions whose one window covers the
// input become linears of the flattened input: a squeeze-excite block (pooled [N, C, 1, 1] ->
// 1x1 conv + relu -> 1x1 conv + sigmoid -> scale), a 3x4 window over a 3x4 map at stride 2
// with a bias, and one followed by a batch_norm that folds into it first; a grouped one, a
// padded one and one whose window is smaller than its input stay. An activation that is the
// convolution's one use moves before the reshape back to [N, O, 1, 1], so the default pipeline
// fuses it into the linear (fused_linear) as it did into the convolution; a dead use of the
// convolution (left by an earlier pass) does not count, and still finds its value. Results
// against float64 on fresh inputs, every float dtype; a second run rewrites nothing.
TEST(PassesNumeric, OneWindowConvBecomesALinear) {
  const char* text = R"(
graph @se(%x: DT[2, 8, 5, 5], %z: DT[3, 4, 3, 4]) {
  param %w1: DT[4, 8, 1, 1]
  param %b1: DT[4]
  param %w2: DT[8, 4, 1, 1]
  param %b2: DT[8]
  param %w3: DT[6, 4, 3, 4]
  param %b3: DT[6]
  param %w4: DT[6, 4, 3, 4]
  param %mean: DT[6]
  param %var: DT[6]
  param %wg: DT[8, 2, 1, 1]
  param %wp: DT[4, 8, 1, 1]
  param %ws: DT[5, 4, 2, 2]
  %p = adaptive_avg_pool2d(%x) {output_size = [1, 1]}
  %f1 = conv2d(%p, %w1, %b1) loc("fc1")
  %r = relu(%f1)
  %dead = neg(%f1)
  %f2 = conv2d(%r, %w2, %b2) loc("fc2")
  %h = sigmoid(%f2)
  %y = mul(%x, %h)
  %a = conv2d(%z, %w3, %b3) {stride = [2, 2]} loc("window")
  %c = conv2d(%z, %w4) loc("bn")
  %n = batch_norm(%c, %mean, %var) {eps = 0.5}
  %g = conv2d(%p, %wg) {groups = 4}
  %q = conv2d(%p, %wp) {padding = [1, 1]}
  %s = conv2d(%z, %ws)
  return %y, %a, %n, %g, %q, %s
}
)";
  for (const char* dt : kFloatDTypes) {
    SCOPED_TRACE(dt);
    Generator gen(base_seed() ^ 37);
    Graph before = with_random_params(text, dt, gen);
    Graph once = before;
    EXPECT_EQ(one_window_conv_to_linear(once), 4) << print_graph(once);  // fc1, fc2, window, bn
    EXPECT_EQ(one_window_conv_to_linear(once), 0);
    EXPECT_EQ(count_op(once, OpId::Conv2d), 3) << print_graph(once);
    Graph after = before;
    ASSERT_TRUE(run_passes(after, default_pipeline()));
    EXPECT_EQ(count_op(after, OpId::BatchNorm), 0) << print_graph(after);
    EXPECT_EQ(count_op(after, OpId::Conv2d) + count_op(after, OpId::FusedConv2d), 3) << print_graph(after);
    EXPECT_EQ(count_op(after, OpId::Linear) + count_op(after, OpId::FusedLinear), 4) << print_graph(after);
    EXPECT_EQ(count_op(after, OpId::FusedLinear), 2) << "fc1's relu, fc2's sigmoid\n" << print_graph(after);
    bool rows = false;
    for (const Value& v : after.values) rows = rows || (v.kind == ValueKind::Param && v.name == "w1.rows");
    EXPECT_TRUE(rows) << print_graph(after);
    expect_matches_float64(before, after, gen, std::string(dt) == "f32" || std::string(dt) == "f64"
                                                   ? 1e-5 : 3e-2);
  }
}

// merge-sibling-linears (passes/merge_linears.h): BERT's q, k, v (three linears of one input
// with biases) become one linear and a split; a linear of another input, one whose output size
// is not a multiple of 8, and one without a bias beside biased siblings stay. Results against
// float64, on a [2, 5, 16] input.
TEST(PassesNumeric, SiblingLinearsBecomeOneLinearAndASplit) {
  const char* text = R"(
graph @qkv(%x: f32[2, 5, 16], %y: f32[2, 5, 16]) {
  param %wq: f32[8, 16]
  param %bq: f32[8]
  param %wk: f32[8, 16]
  param %bk: f32[8]
  param %wv: f32[16, 16]
  param %bv: f32[16]
  param %wo: f32[8, 16]
  param %wn: f32[8, 16]
  param %wodd: f32[6, 16]
  param %bodd: f32[6]
  %q = linear(%x, %wq, %bq) loc("query")
  %k = linear(%x, %wk, %bk) loc("key")
  %v = linear(%x, %wv, %bv) loc("value")
  %o = linear(%y, %wo)
  %n = linear(%x, %wn)
  %odd = linear(%x, %wodd, %bodd)
  return %q, %k, %v, %o, %n, %odd
}
)";
  Graph before = parse_graph(text, "test");
  Generator gen(base_seed() ^ 31);
  fill_params(before, gen);
  Graph after = before;
  std::vector<std::string> passes = {"merge-sibling-linears", "dce"};
  ASSERT_TRUE(run_passes(after, passes));
  EXPECT_EQ(count_op(after, OpId::Linear), 4) << print_graph(after);  // qkv, o, n, odd
  EXPECT_EQ(count_op(after, OpId::Split), 1) << print_graph(after);
  bool merged = false;
  for (const Value& v : after.values)
    merged = merged || (v.kind == ValueKind::Param && v.name == "wq.merged" && v.type.shape[0].value() == 32);
  EXPECT_TRUE(merged) << print_graph(after);
  EXPECT_NE(after.find_value("q"), kNoValue);
  EXPECT_NE(after.find_value("v"), kNoValue);
  expect_matches_float64(before, after, gen, 1e-5);
}

TEST(PassesNumeric, DefaultPipelineIsTheTableOrder) {
  EXPECT_EQ(default_pipeline(),
            (std::vector<std::string>{"algebraic-simplify", "constant-fold", "matmul-to-linear",
                                      "pointwise-deconv-to-conv", "fold-conv-bn",
                                      "one-window-conv-to-linear", "cse",
                                      "fuse-epilogues", "dce"}));
  for (const PassEntry& e : registered_passes()) {
    std::unique_ptr<Pass> p = e.make();
    EXPECT_EQ(p->name(), e.name);
    EXPECT_FALSE(p->description().empty());
  }
}

}  // namespace
}  // namespace kiln
