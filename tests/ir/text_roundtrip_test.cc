// The IR text form: print -> parse -> print is the identity on random graphs, float consts
// keep their exact bits, and the parser survives truncated and garbled text.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>

#include "core/error.h"
#include "ir/graph.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"

namespace kiln {
namespace {

// A fresh seed per run (KILN_TEST_SEED=N replays one). Printed up front, so that even a crash
// leaves the seed to reproduce it with.
uint64_t fresh_seed() {
  uint64_t seed;
  if (const char* s = std::getenv("KILN_TEST_SEED")) {
    seed = std::strtoull(s, nullptr, 10);
  } else {
    std::random_device rd;
    seed = (uint64_t(rd()) << 32) | rd();
  }
  std::fprintf(stderr, "[ seed     ] KILN_TEST_SEED=%llu\n", (unsigned long long)seed);
  return seed;
}

// ---- random graphs ----------------------------------------------------------------------------

struct RandomGraphBuilder {
  std::mt19937_64 rng;
  Graph g;
  std::vector<ValueId> pool;  // float values available as operands

  explicit RandomGraphBuilder(uint64_t seed) : rng(seed) {}

  int64_t uniform(int64_t lo, int64_t hi) {  // inclusive
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  }
  bool coin() { return uniform(0, 1) == 1; }
  template <typename T>
  const T& pick(const std::vector<T>& v) {
    return v[size_t(uniform(0, int64_t(v.size()) - 1))];
  }

  SymInt random_dim() {
    switch (uniform(0, 5)) {
      case 0: return SymInt::symbol("n");
      case 1: return SymInt::symbol(pick(std::vector<std::string>{"batch", "seq", "h"}));
      case 2: return SymInt::symbol("n") * 2 + 1;
      case 3: return floordiv(SymInt::symbol("seq") + 1, SymInt(2));
      default: return SymInt(uniform(1, 6));
    }
  }
  Shape random_shape(int max_rank = 4) {
    Shape s;
    int r = int(uniform(0, max_rank));
    for (int i = 0; i < r; ++i) s.push_back(random_dim());
    return s;
  }
  // Names that need quoting, dots, digits: everything the printer must handle.
  std::string random_name(const std::string& base) {
    static const std::vector<std::string> decor = {"",   ".weight", ":0", " sp", "/x/y", "\"q\"",
                                                   "\n", "\t",      "\\", "#c",  "//c",  "é"};
    std::string n = base + pick(decor) + std::to_string(uniform(0, 999));
    return g.unique_name(n);
  }
  double random_double() {
    switch (uniform(0, 9)) {
      case 0: return INFINITY;
      case 1: return -INFINITY;
      case 2: return -0.0;
      case 3: return 1e-310;  // subnormal
      case 4: return double(uniform(-5, 5));
      default: return std::normal_distribution<double>(0, 1e3)(rng);
    }
  }
  Tensor random_const(const Dims& sizes, DType d) {
    Tensor t = Tensor::empty(sizes, d);
    char* p = static_cast<char*>(t.raw_data());
    for (int64_t i = 0; i < t.numel(); ++i) {
      void* e = p + i * t.element_size();
      if (is_floating(d)) store_f64(e, d, random_double());
      else if (d == DType::Bool) store_i64(e, d, uniform(0, 1));
      else if (d == DType::UInt8) store_i64(e, d, uniform(0, 255));
      else if (d == DType::Int8) store_i64(e, d, uniform(-128, 127));
      else if (d == DType::Int32) store_i64(e, d, uniform(INT32_MIN, INT32_MAX));
      else store_i64(e, d, int64_t(rng()));
    }
    return t;
  }

  void add_random_node() {
    ValueId x = pick(pool);
    const TensorType& t = g.type(x);
    std::string node_name = coin() ? random_name("node") : "";
    std::vector<ValueId> outs;
    switch (uniform(0, 9)) {
      case 0:
        outs = g.add_node(pick(std::vector<OpId>{OpId::Neg, OpId::Exp, OpId::Tanh, OpId::Relu,
                                                 OpId::Sigmoid, OpId::Abs}),
                          {x}, {}, node_name);
        break;
      case 1:
        outs = g.add_node(OpId::Gelu, {x}, {{"approximate", std::string(coin() ? "tanh" : "none")}},
                          node_name);
        break;
      case 2: {
        Attrs a;
        double lo = random_double();
        if (coin()) a.set("min", -std::fabs(lo));
        if (coin()) a.set("max", std::fabs(lo));
        outs = g.add_node(OpId::Clamp, {x}, a, node_name);
        break;
      }
      case 3: {  // binary with a const broadcast along the last dim (or a scalar)
        Dims cs;
        if (t.rank() > 0 && t.shape[size_t(t.rank() - 1)].is_concrete() && coin())
          cs.push_back(t.shape[size_t(t.rank() - 1)].raw());
        ValueId c = g.add_const(random_const(cs, t.dtype), random_name("const"));
        outs = g.add_node(pick(std::vector<OpId>{OpId::Add, OpId::Mul, OpId::Sub, OpId::Maximum}),
                          {x, c}, {}, node_name);
        break;
      }
      case 4:
        if (t.rank() == 0) return;
        outs =
            g.add_node(OpId::Softmax, {x}, {{"dim", uniform(-t.rank(), t.rank() - 1)}}, node_name);
        break;
      case 5: {
        Ints dims;
        for (int d = 0; d < t.rank(); ++d)
          if (coin()) dims.push_back(d);
        outs = g.add_node(OpId::Sum, {x}, {{"dims", dims}, {"keepdim", coin()}}, node_name);
        break;
      }
      case 6:
        if (t.rank() < 2) return;
        outs = g.add_node(OpId::Transpose, {x}, {{"dim0", int64_t(0)}, {"dim1", int64_t(-1)}},
                          node_name);
        break;
      case 7:
        if (t.rank() >= 6) return;
        outs = g.add_node(OpId::Unsqueeze, {x}, {{"dims", Ints{uniform(0, t.rank())}}}, node_name);
        break;
      case 8: {  // split a dim into pieces: multiple outputs
        for (int d = 0; d < t.rank(); ++d) {
          SymInt s = t.shape[size_t(d)];
          if (s.is_symbolic() || s.raw() < 2) continue;
          int64_t first = uniform(1, s.raw() - 1);
          outs =
              g.add_node(OpId::Split, {x},
                         {{"sizes", Ints{first, s.raw() - first}}, {"dim", int64_t(d)}}, node_name);
          break;
        }
        if (outs.empty()) return;
        break;
      }
      case 9: {  // a cast and back: dtypes in attributes
        DType to = pick(
            std::vector<DType>{DType::Float64, DType::Float16, DType::BFloat16, DType::Float32});
        outs = g.add_node(OpId::Cast, {x}, {{"dtype", to}}, node_name);
        break;
      }
    }
    for (ValueId v : outs) {
      if (coin()) g.rename_value(v, random_name("v"));
      pool.push_back(v);
    }
  }

  Graph build() {
    g.name = coin() ? "random" : "random graph";
    int n_inputs = int(uniform(1, 3));
    for (int i = 0; i < n_inputs; ++i) {
      DType d =
          pick(std::vector<DType>{DType::Float32, DType::Float64, DType::Float16, DType::BFloat16});
      TensorType t(d, random_shape());
      if (uniform(0, 4) == 0 && t.rank() == 2 && is_concrete(t.shape))
        t.strides = {1, t.shape[0]};  // a transposed layout
      pool.push_back(g.add_input(random_name("in"), t));
    }
    if (coin())
      pool.push_back(
          g.add_param_decl(random_name("p"), TensorType(DType::Float32, random_shape(3))));
    // Consts of every dtype, including non-float ones that only feed the outputs.
    for (DType d : {DType::Int64, DType::Int32, DType::Int8, DType::UInt8, DType::Bool}) {
      if (!coin()) continue;
      g.outputs.push_back(g.add_const(random_const({uniform(0, 5)}, d), random_name("k")));
    }
    int n_nodes = int(uniform(1, 25));
    for (int i = 0; i < n_nodes; ++i) add_random_node();
    for (int i = 0; i < 3; ++i) g.outputs.push_back(pick(pool));
    return std::move(g);
  }
};

bool same_bits_or_both_nan(const Tensor& a, const Tensor& b) {
  if (a.type() != b.type()) return false;
  Tensor ca = a.contiguous(), cb = b.contiguous();
  int64_t es = ca.element_size();
  const char* pa = static_cast<const char*>(ca.raw_data());
  const char* pb = static_cast<const char*>(cb.raw_data());
  for (int64_t i = 0; i < ca.numel(); ++i) {
    if (std::memcmp(pa + i * es, pb + i * es, size_t(es)) == 0) continue;
    if (is_floating(a.dtype()) && std::isnan(load_f64(pa + i * es, a.dtype())) &&
        std::isnan(load_f64(pb + i * es, b.dtype())))
      continue;
    return false;
  }
  return true;
}

// Structural equality of a graph and its reparsed form (value ids may differ: params and consts
// print before the nodes).
void expect_same_graph(const Graph& a, const Graph& b) {
  ASSERT_EQ(a.name, b.name);
  ASSERT_EQ(a.nodes.size(), b.nodes.size());
  ASSERT_EQ(a.inputs.size(), b.inputs.size());
  ASSERT_EQ(a.outputs.size(), b.outputs.size());
  auto same_value = [&](ValueId va, ValueId vb) {
    if (va == kNoValue || vb == kNoValue) return va == vb;
    const Value& x = a.value(va);
    const Value& y = b.value(vb);
    return x.name == y.name && x.type == y.type && x.kind == y.kind;
  };
  for (size_t i = 0; i < a.inputs.size(); ++i) EXPECT_TRUE(same_value(a.inputs[i], b.inputs[i]));
  for (size_t i = 0; i < a.outputs.size(); ++i) EXPECT_TRUE(same_value(a.outputs[i], b.outputs[i]));
  for (size_t i = 0; i < a.nodes.size(); ++i) {
    const Node& x = a.nodes[i];
    const Node& y = b.nodes[i];
    EXPECT_EQ(x.op, y.op);
    EXPECT_EQ(x.name, y.name);
    ASSERT_EQ(x.inputs.size(), y.inputs.size());
    ASSERT_EQ(x.outputs.size(), y.outputs.size());
    for (size_t k = 0; k < x.inputs.size(); ++k) EXPECT_TRUE(same_value(x.inputs[k], y.inputs[k]));
    for (size_t k = 0; k < x.outputs.size(); ++k)
      EXPECT_TRUE(same_value(x.outputs[k], y.outputs[k]));
    // Attributes compare equal except NaN floats (never produced by this generator).
    EXPECT_TRUE(x.attrs == y.attrs) << "node " << i;
  }
  for (const Value& v : a.values) {
    if (v.kind != ValueKind::Const) continue;
    ValueId w = b.find_value(v.name);
    ASSERT_NE(w, kNoValue) << v.name;
    ASSERT_TRUE(b.value(w).data.defined()) << v.name;
    EXPECT_TRUE(same_bits_or_both_nan(v.data, b.value(w).data)) << v.name;
  }
}

TEST(TextRoundTrip, RandomGraphs) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (int i = 0; i < 150; ++i) {
    RandomGraphBuilder b(seed + uint64_t(i));
    Graph g = b.build();
    SCOPED_TRACE("graph " + std::to_string(i));
    ASSERT_TRUE(verify_problems(g).empty());
    std::string text = print_graph(g);
    Graph parsed;
    try {
      parsed = parse_graph(text, "<printed>");
    } catch (const Error& e) {
      FAIL() << e.what() << "\n" << text;
    }
    EXPECT_EQ(print_graph(parsed), text);
    EXPECT_TRUE(verify_problems(parsed).empty());
    expect_same_graph(g, parsed);
  }
}

// Every f16 and bf16 bit pattern, printed and parsed back.
TEST(TextRoundTrip, AllSixteenBitFloats) {
  for (DType d : {DType::Float16, DType::BFloat16}) {
    Tensor t = Tensor::empty({65536}, d);
    uint16_t* p = static_cast<uint16_t*>(t.raw_data());
    for (uint32_t i = 0; i < 65536; ++i) p[i] = uint16_t(i);
    Graph g;
    g.outputs.push_back(g.add_const(t, "all"));
    PrintOptions all;
    all.max_inline_const_elements = -1;
    Graph back = parse_graph(print_graph(g, all));
    const Tensor& u = back.value(back.find_value("all")).data;
    ASSERT_TRUE(u.defined());
    const uint16_t* q = static_cast<const uint16_t*>(u.raw_data());
    int mismatches = 0;
    for (uint32_t i = 0; i < 65536; ++i) {
      bool nan = std::isnan(load_f64(&p[i], d));
      if (nan ? !std::isnan(load_f64(&q[i], d)) : p[i] != q[i]) ++mismatches;
    }
    EXPECT_EQ(mismatches, 0) << dtype_name(d);
  }
}

// Random f32/f64 bit patterns (all exponents, subnormals, both signs).
TEST(TextRoundTrip, RandomFloatBits) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  Tensor f = Tensor::empty({4096}, DType::Float32);
  Tensor d = Tensor::empty({4096}, DType::Float64);
  auto* fp = static_cast<uint32_t*>(f.raw_data());
  auto* dp = static_cast<uint64_t*>(d.raw_data());
  for (int i = 0; i < 4096; ++i) {
    fp[i] = uint32_t(rng());
    dp[i] = rng();
  }
  Graph g;
  g.outputs = {g.add_const(f, "f"), g.add_const(d, "d")};
  PrintOptions all;
  all.max_inline_const_elements = -1;
  std::string text = print_graph(g, all);
  Graph back = parse_graph(text);
  EXPECT_EQ(print_graph(back, all), text);
  EXPECT_TRUE(same_bits_or_both_nan(f, back.value(back.find_value("f")).data));
  EXPECT_TRUE(same_bits_or_both_nan(d, back.value(back.find_value("d")).data));
}

TEST(TextRoundTrip, LargeConstsAreElided) {
  Graph g;
  Generator gen(fresh_seed());
  g.outputs = {g.add_const(Tensor::randn({300}, gen), "big"),
               g.add_const(Tensor::randn({3}, gen), "small")};
  std::string text = print_graph(g);
  EXPECT_NE(text.find("const %big: f32[300]\n"), std::string::npos) << text;
  EXPECT_NE(text.find("const %small: f32[3] = ["), std::string::npos) << text;
  Graph back = parse_graph(text);
  EXPECT_EQ(back.value(back.find_value("big")).kind, ValueKind::Const);
  EXPECT_FALSE(back.value(back.find_value("big")).data.defined());
  EXPECT_EQ(print_graph(back), text);
  EXPECT_TRUE(verify_problems(back).empty());
}

TEST(TextRoundTrip, ParseTensorType) {
  TensorType t = parse_tensor_type("f16[2*n + 1, 3] strides [1, 2*n + 1] @cuda:1");
  EXPECT_EQ(t.str(), "f16[2*n + 1, 3] strides [1, 2*n + 1] @cuda:1");
  EXPECT_THROW(parse_tensor_type("f16[2] extra"), Error);
}

// ---- fuzzing ----------------------------------------------------------------------------------

std::vector<std::string> fuzz_corpus(uint64_t seed) {
  std::vector<std::string> corpus;
  for (int i = 0; i < 6; ++i)
    corpus.push_back(print_graph(RandomGraphBuilder(seed + uint64_t(i)).build()));
  corpus.push_back(R"(graph @g(%x: f32[n, 3, 8, 8]) {
  param %w: f32[4, 3, 3, 3]
  const %c: f32[2] = [inf, -1.5e-07]
  %y = conv2d(%x, %w, _) {stride=[2, 2], padding=[1, 1]} : f32[n, 4, 4, 4] loc("stem.conv1")
  %a, %b = split(%y) {sizes=[2, 2], dim=1}
  %r = reshape(%a) {shape=[n, -1]}
  %s = slice(%r) {dim=1, start=(n + 1)//2, end=min(n, 7)}
  %k = cast(%s) {dtype=bf16}
  return %k, %b, %c  # done
})");
  return corpus;
}

// Parses `text`: a kiln::Error is fine; anything else (another exception, a crash) is not. A
// text that parses must be a valid graph that round-trips.
void parse_must_not_crash(const std::string& text) {
  Graph g;
  try {
    g = parse_graph(text, "<fuzz>");
  } catch (const Error&) {
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "non-kiln exception " << e.what() << " on:\n" << text;
    return;
  }
  EXPECT_TRUE(verify_problems(g).empty()) << text;
  std::string p = print_graph(g);
  EXPECT_EQ(print_graph(parse_graph(p)), p) << text;
}

TEST(ParserFuzz, TruncatedText) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  for (const std::string& text : fuzz_corpus(seed)) {
    size_t step = std::max<size_t>(1, text.size() / 400);
    for (size_t n = 0; n < text.size(); n += step) parse_must_not_crash(text.substr(0, n));
  }
}

TEST(ParserFuzz, GarbledText) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::mt19937_64 rng(seed);
  static const std::string kBytes = "%@()[]{},:=_\"\\#/*+-.0123456789abcnfxe \n\t\x01\xff";
  static const std::vector<std::string> kTokens = {"%x",
                                                   "%",
                                                   "@",
                                                   "f32[",
                                                   "]",
                                                   "(",
                                                   ")",
                                                   "{",
                                                   "}",
                                                   "=",
                                                   ",",
                                                   ":",
                                                   "_",
                                                   "\"",
                                                   "//",
                                                   "#",
                                                   "relu",
                                                   "split",
                                                   "param",
                                                   "const",
                                                   "return",
                                                   "graph",
                                                   "loc(",
                                                   "strides [",
                                                   "@cuda:0",
                                                   "9223372036854775807",
                                                   "-9223372036854775808",
                                                   "1e999",
                                                   "nan",
                                                   "((((((((",
                                                   "min(",
                                                   "//2",
                                                   "%\"\\x",
                                                   "[]",
                                                   "i8[",
                                                   "none",
                                                   "true",
                                                   "f16",
                                                   "-4611686018427387904",
                                                   "*2147483647*2147483647",
                                                   "const %q: i8[2] = [1, 2]",
                                                   "param %p: f32[n]",
                                                   "max(",
                                                   ", _",
                                                   "%a, %b = "};
  for (const std::string& base : fuzz_corpus(seed)) {
    for (int i = 0; i < 300; ++i) {
      std::string t = base;
      int edits = int(rng() % 3) + 1;
      for (int e = 0; e < edits && !t.empty(); ++e) {
        size_t pos = size_t(rng() % t.size());
        switch (rng() % 4) {
          case 0: t[pos] = kBytes[rng() % kBytes.size()]; break;
          case 1: t.erase(pos, size_t(rng() % 8) + 1); break;
          case 2: t.insert(pos, kTokens[rng() % kTokens.size()]); break;
          case 3: t.insert(pos, t.substr(size_t(rng() % t.size()), size_t(rng() % 24))); break;
        }
      }
      parse_must_not_crash(t);
    }
  }
}

TEST(ParserFuzz, DeepNestingIsAnError) {
  std::string deep = "graph @g(%x: f32[" + std::string(100000, '(') + "1" +
                     std::string(100000, ')') + "]) {\n  return %x\n}\n";
  EXPECT_THROW(parse_graph(deep), Error);
  std::string minus = "graph @g(%x: f32[" + std::string(1000, '-') + "1]) {\n  return %x\n}\n";
  EXPECT_THROW(parse_graph(minus), Error);
  std::string longest = "graph @g(%x: f32[" + std::string(100000, '1') + "]) {\n  return %x\n}\n";
  EXPECT_THROW(parse_graph(longest), Error);
}


// parse_graph_on_host: a graph printed on the GPU (values and inline consts @cuda:0) read with
// host types and host data, on any machine (CI has no GPU): how replace-weights reads the source
// graph of a package compiled on the GPU. A malformed device is still an error.
TEST(ParseOnHost, DeviceAnnotationsAreReadAsTheHost) {
  const std::string text = R"(graph @g(%x: f32[2, 3] @cuda:0) {
  param %w: f32[3] @cuda:0
  const %c: f32[] @cuda:0 = [0.5]
  %y = mul(%x, %w) : f32[2, 3] @cuda:0
  %z = mul(%y, %c) : f32[2, 3] @cuda:0
  return %z
})";
  Graph g = parse_graph_on_host(text, "gpu.kir");
  int consts = 0;
  for (const Value& v : g.values) {
    EXPECT_TRUE(v.type.device.is_cpu()) << v.name << " " << v.type.str();
    if (v.kind == ValueKind::Const) {
      ++consts;
      ASSERT_TRUE(v.data.defined());
      EXPECT_TRUE(v.data.device().is_cpu());
      EXPECT_EQ(v.data.data<float>()[0], 0.5f);
    }
  }
  EXPECT_EQ(consts, 1);
  std::string bad = text;
  bad.replace(bad.find("@cuda:0"), 7, "@tpu:0");
  EXPECT_THROW(parse_graph_on_host(bad, "bad.kir"), Error);
}

}  // namespace
}  // namespace kiln
