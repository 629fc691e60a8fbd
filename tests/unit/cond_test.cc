// kiln::cond (ops/cond.h): eagerly one branch runs; under capture both are recorded into one
// graph and each output is selected by the predicate. Compiled results are checked against the
// eager call on fresh random inputs that take each branch.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "../support/compare.h"
#include "capture/compile.h"
#include "core/error.h"
#include "ops/api.h"
#include "ops/cond.h"

using namespace kiln;

namespace {

// pred = sum(x) > 0; true: relu(x @ w) * 2, false: sigmoid(x @ w) - x[..., :1].
struct Gated {
  Tensor w;
  int* true_calls = nullptr;
  int* false_calls = nullptr;
  TensorList operator()(const TensorList& in) const {
    Tensor x = in[0];
    Tensor above = gt(sum(x), scalar_like(0.0, x));
    return cond(
        above,
        [&](const TensorList& v) {
          if (true_calls) ++*true_calls;
          return TensorList{relu(matmul(v[0], w)) * 2.0};
        },
        [&](const TensorList& v) {
          if (false_calls) ++*false_calls;
          return TensorList{sigmoid(matmul(v[0], w)) - v[0]};
        },
        {x});
  }
};

// Fresh N(0,1) values shifted so that their sum has the sign asked for.
Tensor with_sum_sign(Generator& g, bool positive) {
  Tensor x = Tensor::randn({4, 6}, g);
  double s = sum(x).item();
  double shift = (positive ? 1.0 : -1.0) * (std::abs(s) / 24.0 + 0.25);
  return x + shift;
}

void expect_close(const Tensor& got, const Tensor& want) {
  ASSERT_GT(test::max_abs(want), 0.0);
  EXPECT_TRUE(test::close(got, want, test::Tolerance::of_max_ref(1e-5)));
}

}  // namespace

TEST(Cond, EagerRunsOnlyTheChosenBranch) {
  Generator g(11);
  int t = 0, f = 0;
  Gated fn{Tensor::randn({6, 6}, g), &t, &f};
  Tensor xp = with_sum_sign(g, true), xn = with_sum_sign(g, false);
  expect_close(fn({xp})[0], relu(matmul(xp, fn.w)) * 2.0);
  EXPECT_EQ(t, 1);
  EXPECT_EQ(f, 0);
  expect_close(fn({xn})[0], sigmoid(matmul(xn, fn.w)) - xn);
  EXPECT_EQ(t, 1);
  EXPECT_EQ(f, 1);
}

TEST(Cond, CaptureKeepsOneGraphAndFollowsThePredicateOnEveryCall) {
  Generator g(12);
  int t = 0, f = 0;
  Gated fn{Tensor::randn({6, 6}, g), &t, &f};
  CompileOptions opts;
  opts.fullgraph = true;  // a break would be an error
  opts.strict = true;
  CompiledFunction c = compile(fn, opts);
  for (int round = 0; round < 3; ++round)
    for (bool positive : {true, false, true}) {
      Tensor x = with_sum_sign(g, positive);
      Tensor want = positive ? relu(matmul(x, fn.w)) * 2.0 : sigmoid(matmul(x, fn.w)) - x;
      expect_close(c({x})[0], want);
    }
  // Traced once: both branches were recorded then (one call each), never again.
  EXPECT_EQ(t, 1);
  EXPECT_EQ(f, 1);
  CompileStats st = c.stats();
  EXPECT_EQ(st.traces, 1);
  EXPECT_EQ(st.graph_breaks, 0);
  EXPECT_EQ(st.recompiles, 0);
  EXPECT_EQ(st.compiled_calls, 8);
  ExplainReport r = c.report();
  ASSERT_EQ(r.graphs.size(), 1u);
  bool has_where = false;
  for (const std::string& op : r.graphs[0].ops) has_where |= op == "where";
  EXPECT_TRUE(has_where) << r.graphs[0].ir;
}

// The branch not taken is computed too, but the select copies, never combines: its NaN and Inf
// do not reach the output.
TEST(Cond, TheUntakenBranchsNanNeverReachesTheOutput) {
  auto fn = [](const TensorList& in) {
    Tensor x = in[0];
    return cond(
        gt(sum(x), scalar_like(0.0, x)),
        [](const TensorList& v) { return TensorList{log(v[0])}; },      // NaN for x < 0
        [](const TensorList& v) { return TensorList{sqrt(neg(v[0]))}; },  // NaN for x > 0
        {x});
  };
  CompileOptions opts;
  opts.strict = true;
  CompiledFunction c = compile(fn, opts);
  Generator g(13);
  for (bool positive : {true, false}) {
    Tensor x = abs(Tensor::randn({3, 5}, g)) + 0.1;
    if (!positive) x = neg(x);
    Tensor got = c({x})[0];
    Tensor want = positive ? log(x) : sqrt(neg(x));
    EXPECT_TRUE(test::close(got, want, test::Tolerance::of_max_ref(1e-6))) << positive;
    for (float v : got.to_vector<float>()) ASSERT_TRUE(std::isfinite(v)) << positive;
  }
}

// A number as the predicate: nonzero is true, NaN included (as bool() of a tensor in PyTorch),
// eagerly and compiled alike.
TEST(Cond, NumericPredicatesFollowTruthiness) {
  auto fn = [](const TensorList& in) {
    Tensor p = sum(in[1]);  // computed, so capture records it
    return cond(
        p, [](const TensorList& v) { return TensorList{v[0] * 3.0}; },
        [](const TensorList& v) { return TensorList{v[0] - 5.0}; }, {in[0]});
  };
  CompileOptions opts;
  opts.strict = true;
  CompiledFunction c = compile(fn, opts);
  Generator g(14);
  Tensor x = Tensor::randn({2, 3}, g);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (double pv : {0.0, 2.5, -1.0, nan, 0.0}) {
    Tensor p = Tensor::full({1}, pv);
    Tensor want = (pv != 0.0) ? x * 3.0 : x - 5.0;
    expect_close(fn({x, p})[0], want);
    expect_close(c({x, p})[0], want);
  }
  EXPECT_EQ(c.stats().traces, 1);
  // The predicate straight from a call input: recorded as the graph's input, not read on the
  // host (which would break the graph and re-run the host code on every call).
  auto direct = [](const TensorList& in) {
    return cond(
        in[1], [](const TensorList& v) { return TensorList{v[0] * 3.0}; },
        [](const TensorList& v) { return TensorList{v[0] - 5.0}; }, {in[0]});
  };
  CompileOptions full = opts;
  full.fullgraph = true;
  CompiledFunction d = compile(direct, full);
  for (double pv : {1.0, 0.0, nan, -2.0}) {
    Tensor p = Tensor::full({1}, pv);
    expect_close(d({x, p})[0], (pv != 0.0) ? x * 3.0 : x - 5.0);
  }
  EXPECT_EQ(d.stats().traces, 1);
  EXPECT_EQ(d.stats().graph_breaks, 0);
}

TEST(Cond, BranchesThatDisagreeAreAnErrorNamingTheCallSite) {
  auto shapes = [](const TensorList& in) {
    return cond(
        gt(sum(in[0]), scalar_like(0.0, in[0])),
        [](const TensorList& v) { return TensorList{v[0]}; },
        [](const TensorList& v) { return TensorList{sum(v[0], {1})}; }, {in[0]});
  };
  auto counts = [](const TensorList& in) {
    return cond(
        gt(sum(in[0]), scalar_like(0.0, in[0])),
        [](const TensorList& v) { return TensorList{v[0], v[0]}; },
        [](const TensorList& v) { return TensorList{v[0]}; }, {in[0]});
  };
  CompileOptions opts;
  opts.strict = true;
  Generator g(15);
  Tensor x = Tensor::randn({2, 3}, g);
  try {
    compile(shapes, opts)({x});
    FAIL() << "branches of other shapes must be refused";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("cond at cond_test.cc:"), std::string::npos) << m;
    EXPECT_NE(m.find("output 0"), std::string::npos) << m;
    EXPECT_NE(m.find("[2, 3]"), std::string::npos) << m;
  }
  try {
    compile(counts, opts)({x});
    FAIL() << "branches returning different counts must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("returns 2 tensors"), std::string::npos) << e.what();
  }
}

TEST(Cond, PredicateOfMoreThanOneElementIsRefused) {
  Generator g(16);
  Tensor x = Tensor::randn({2, 3}, g);
  try {
    cond(x, [](const TensorList& v) { return v; }, [](const TensorList& v) { return v; }, {x});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("one element"), std::string::npos) << e.what();
  }
}
