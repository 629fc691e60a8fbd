// The interpreter against direct eager calls, and its input checking.
#include "ir/interpreter.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "core/error.h"
#include "ops/api.h"
#include "ir/graph.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"

namespace kiln {
namespace {

template <typename F>
void expect_error(F&& f, std::initializer_list<std::string_view> parts) {
  try {
    f();
    ADD_FAILURE() << "expected an error containing '" << *parts.begin() << "'";
  } catch (const Error& e) {
    for (std::string_view p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message lacks '" << p << "':\n"
          << e.what();
  }
}

uint64_t fresh_seed() {
  std::random_device rd;
  return (uint64_t(rd()) << 32) | rd();
}

// Bitwise equality: the interpreter runs the very kernels the eager calls run.
void expect_identical(const Tensor& a, const Tensor& b) {
  ASSERT_EQ(a.type().str(), b.type().str());
  Tensor ca = a.contiguous(), cb = b.contiguous();
  ASSERT_GT(ca.numel(), 0);
  EXPECT_EQ(std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()), 0)
      << "a: " << a.str() << "\nb: " << b.str();
}

struct SmallNet {
  Graph g;
  Tensor conv_w, conv_b, fc_w, fc_b;
};

// x[n, 3, 16, 16] -> conv2d(pad 1) -> relu -> max_pool2d(2) -> flatten -> linear -> [n, 10]
SmallNet small_net(Generator& gen) {
  SmallNet net;
  Graph& g = net.g;
  g.name = "small_net";
  net.conv_w = Tensor::randn({8, 3, 3, 3}, gen);
  net.conv_b = Tensor::randn({8}, gen);
  net.fc_w = Tensor::randn({10, 8 * 8 * 8}, gen);
  net.fc_b = Tensor::randn({10}, gen);
  ValueId x = g.add_input("x", TensorType(DType::Float32, {SymInt::symbol("n"), 3, 16, 16}));
  ValueId cw = g.add_param("conv.weight", net.conv_w);
  ValueId cb = g.add_param("conv.bias", net.conv_b);
  ValueId fw = g.add_param("fc.weight", net.fc_w);
  ValueId fb = g.add_param("fc.bias", net.fc_b);
  ValueId c = g.add_node1(OpId::Conv2d, {x, cw, cb}, {{"padding", Ints{1, 1}}}, "conv");
  ValueId r = g.add_node1(OpId::Relu, {c}, {}, "act");
  ValueId p = g.add_node1(OpId::MaxPool2d, {r}, {{"kernel_size", Ints{2, 2}}}, "pool");
  ValueId f = g.add_node1(OpId::Flatten, {p}, {{"start_dim", int64_t(1)}}, "flat");
  ValueId y = g.add_node1(OpId::Linear, {f, fw, fb}, {}, "fc");
  g.outputs = {y, r};
  return net;
}

TEST(Interpreter, MatchesEagerOnSmallNet) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Generator gen(seed);
  SmallNet net = small_net(gen);
  verify(net.g);
  for (int64_t n : {1, 3}) {  // one graph, two batch sizes: the symbol binds per call
    Tensor x = Tensor::randn({n, 3, 16, 16}, gen);
    TensorList out = run(net.g, {x});
    ASSERT_EQ(out.size(), 2u);
    Tensor c = conv2d(x, net.conv_w, net.conv_b, {1, 1}, {1, 1});
    Tensor r = relu(c);
    Tensor y = linear(flatten(max_pool2d(r, {2, 2}), 1), net.fc_w, net.fc_b);
    EXPECT_EQ(out[0].sizes(), (Dims{n, 10}));
    expect_identical(out[0], y);
    expect_identical(out[1], r);
  }
}

TEST(Interpreter, RunsParsedTextWithConstsAndMultipleOutputs) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Generator gen(seed);
  Graph g = parse_graph(R"(
    graph @text(%x: f32[b, 6], %y: f32[2*b, 6]) {
      const %scale: f32[6] = [0.5, -1.0, 2.0, 0.25, -3.0, 1.5]
      %s = mul(%x, %scale)
      %cat = concat(%s, %y, %x) {dim=0}
      %a, %c = split(%cat) {sizes=[b, 3*b], dim=0}
      %t = tanh(%c)
      return %a, %t
    })");
  Tensor x = Tensor::randn({2, 6}, gen), y = Tensor::randn({4, 6}, gen);
  TensorList out = run(g, {x, y});
  Tensor scale = Tensor::from_vector<float>({0.5f, -1.0f, 2.0f, 0.25f, -3.0f, 1.5f}, {6});
  Tensor s = mul(x, scale);
  TensorList parts = split(concat({s, y, x}, 0), {2, 6}, 0);
  expect_identical(out[0], parts[0]);
  expect_identical(out[1], tanh(parts[1]));
}

// Optional inputs left out at the end (as the printer writes them) run like absent ones.
TEST(Interpreter, OmittedTrailingOptionalInputs) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  Generator gen(seed);
  Graph g = parse_graph(R"(
    graph @opt(%x: f32[2, 3, 6, 6], %v: f32[5, 6]) {
      param %cw: f32[4, 3, 3, 3]
      param %lw: f32[7, 6]
      %c = conv2d(%x, %cw)
      %l = linear(%v, %lw)
      %n = layer_norm(%v, _, _) {normalized_shape=[6]}
      return %c, %l, %n
    })");
  Tensor cw = Tensor::randn({4, 3, 3, 3}, gen), lw = Tensor::randn({7, 6}, gen);
  g.value(g.find_value("cw")).data = cw;
  g.value(g.find_value("lw")).data = lw;
  Tensor x = Tensor::randn({2, 3, 6, 6}, gen), v = Tensor::randn({5, 6}, gen);
  TensorList out = run(g, {x, v});
  expect_identical(out[0], conv2d(x, cw, Tensor()));
  expect_identical(out[1], linear(v, lw, Tensor()));
  expect_identical(out[2], layer_norm(v, {6}, Tensor(), Tensor()));
}

TEST(Interpreter, ReturnsInputsAndParamsDirectly) {
  Generator gen(fresh_seed());
  Graph g;
  Tensor w = Tensor::randn({3}, gen);
  ValueId x = g.add_input("x", TensorType(DType::Float32, {3}));
  ValueId p = g.add_param("w", w);
  g.outputs = {p, x, p};
  Tensor xv = Tensor::randn({3}, gen);
  TensorList out = run(g, {xv});
  ASSERT_EQ(out.size(), 3u);
  EXPECT_TRUE(same_tensor(out[0], w));
  EXPECT_TRUE(same_tensor(out[1], xv));
}

TEST(Interpreter, InputChecks) {
  Generator gen(fresh_seed());
  Graph g;
  g.add_input("x", TensorType(DType::Float32, {1, 3, 224, 224}));
  g.add_input("ids", TensorType(DType::Int64, {8}));
  Tensor ids = Tensor::randint({8}, gen, 0, 5);
  expect_error(
      [&] {
        run(g, {Tensor::randn({1, 3, 224, 224}, gen)});
      },
      {"graph 'main' takes 2 inputs, got 1"});
  expect_error(
      [&] {
        run(g, {Tensor::randn({1, 3, 224, 225}, gen), ids});
      },
      {"input 0 ('x'): dim 3 expected 224, got 225"});
  expect_error(
      [&] {
        run(g, {Tensor::randn({1, 3, 224}, gen), ids});
      },
      {"input 0 ('x'): expected rank 4 (f32[1, 3, 224, 224]), got rank 3"});
  expect_error(
      [&] {
        run(g, {Tensor::randn({1, 3, 224, 224}, gen, DType::Float64), ids});
      },
      {"input 0 ('x'): expected dtype f32, got f64"});
  expect_error(
      [&] {
        run(g, {Tensor::randn({1, 3, 224, 224}, gen), ids.to(DType::Int32)});
      },
      {"input 1 ('ids'): expected dtype i64, got i32"});
  expect_error([&] { run(g, {Tensor(), ids}); }, {"input 0 ('x'): the tensor is undefined"});
  expect_error(
      [&] {
        run(g, {Tensor::fake({1, 3, 224, 224}, DType::Float32), ids});
      },
      {"input 0 ('x'): the tensor has no data"});
}

TEST(Interpreter, SymbolBinding) {
  Generator gen(fresh_seed());
  Graph g = parse_graph(R"(
    graph @sym(%a: f32[n, 4], %b: f32[m, n], %c: f32[2*n + 1, m]) {
      %t = add(%a, %a)
      return %t
    })");
  Tensor a = Tensor::randn({3, 4}, gen);
  Tensor b = Tensor::randn({5, 3}, gen);
  Tensor c = Tensor::randn({7, 5}, gen);
  SymbolBindings bound = bind_input_symbols(g, {a, b, c});
  ASSERT_EQ(bound.size(), 2u);
  EXPECT_EQ(bound[0], (std::pair<std::string, int64_t>{"n", 3}));
  EXPECT_EQ(bound[1], (std::pair<std::string, int64_t>{"m", 5}));
  EXPECT_NO_THROW(run(g, {a, b, c}));
  // The same symbol with two values.
  expect_error(
      [&] {
        run(g, {a, Tensor::randn({5, 4}, gen), c});
      },
      {"input 1 ('b'): dim 1 is symbol 'n' = 4, but input 0 ('a') dim 0 already bound "
       "'n' = 3"});
  // An expression dim that disagrees with the bound symbols.
  expect_error(
      [&] {
        run(g, {a, b, Tensor::randn({6, 5}, gen)});
      },
      {"input 2 ('c'): dim 0 is '2*n + 1' = 7 (with n = 3), got 6"});
  // A symbol that only ever appears inside an expression cannot be bound.
  Graph h = parse_graph("graph @h(%x: f32[k + 1]) {\n  return %x\n}");
  expect_error([&] { run(h, {Tensor::randn({4}, gen)}); },
               {"input 0 ('x'): dim 0 is 'k + 1', but no input dim is the bare symbol 'k'"});
}

TEST(Interpreter, ParamsAndConstsNeedData) {
  Generator gen(fresh_seed());
  Graph g = parse_graph(R"(
    graph @p(%x: f32[4]) {
      param %w: f32[4]
      const %big: f32[4]
      %y = mul(%x, %w)
      %z = add(%y, %big)
      return %z
    })");
  Tensor x = Tensor::randn({4}, gen);
  expect_error([&] { run(g, {x}); },
               {"param %w has no data (IR text declares params by type only)"});
  Tensor w = Tensor::randn({4}, gen);
  g.value(g.find_value("w")).data = w;
  expect_error([&] { run(g, {x}); }, {"const %big has no data (its values were elided"});
  Tensor big = Tensor::randn({4}, gen);
  g.value(g.find_value("big")).data = big;
  verify(g);
  TensorList out = run(g, {x});
  expect_identical(out[0], add(mul(x, w), big));
}

TEST(Interpreter, KernelErrorsNameTheNode) {
  Generator gen(fresh_seed());
  // gather's indices are only known at run time: out of range is a kernel error.
  Graph g = parse_graph(R"(
    graph @gather(%x: f32[3, 4], %i: i64[3, 2]) {
      %g = gather(%x, %i) {dim=1} loc("head.pick")
      return %g
    })");
  Tensor idx = Tensor::from_vector<int64_t>({0, 1, 2, 3, 9, 0}, {3, 2});
  try {
    run(g, {Tensor::randn({3, 4}, gen), idx});
    ADD_FAILURE() << "expected an index error";
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("graph 'gather', node 0 'head.pick' (gather -> %g): "), std::string::npos)
        << m;
    EXPECT_EQ(m.find("interpreter.cc"), std::string::npos) << "internal call site leaked: " << m;
  }
}

TEST(Interpreter, DetectsInferenceKernelDisagreement) {
  Generator gen(fresh_seed());
  Graph g = parse_graph("graph @g(%x: f32[2, 3]) {\n  %y = relu(%x)\n  return %y\n}");
  // Corrupt the recorded type; the interpreter notices what the kernel really produced.
  g.value(g.find_value("y")).type.shape[1] = 4;
  expect_error(
      [&] {
        run(g, {Tensor::randn({2, 3}, gen)});
      },
      {"node 0 (relu -> %y): the kernel produced f32[2, 3] for %y, but the graph's "
       "type is f32[2, 4]"});
}

TEST(Interpreter, CorruptedGraphsGiveErrorsNotCrashes) {
  Generator gen(fresh_seed());
  const char* text = "graph @g(%x: f32[2]) {\n  %y = relu(%x)\n  %z = neg(%y)\n  return %z\n}";
  Tensor x = Tensor::randn({2}, gen);
  Graph g = parse_graph(text);
  g.nodes[1].inputs[0] = ValueId(40);
  expect_error([&] { run(g, {x}); }, {"node 1 (neg -> %z): input refers to value 40"});
  g = parse_graph(text);
  g.outputs[0] = ValueId(-3);
  expect_error([&] { run(g, {x}); }, {"output refers to value -3"});
  g = parse_graph(text);
  g.inputs[0] = ValueId(12);
  expect_error([&] { run(g, {x}); }, {"input refers to value 12"});
  g = parse_graph(text);
  std::swap(g.nodes[0], g.nodes[1]);  // use before def
  expect_error([&] { run(g, {x}); }, {"input %y has no value at this point"});
}

}  // namespace
}  // namespace kiln

namespace kiln {
namespace {

// specialize_graph: every symbolic type and int attribute evaluated, and the result verified,
// so that types the symbolic graph only assumed fail naming the node instead of compiling a
// graph whose types are not its kernels'.
TEST(Interpreter, SpecializeGraphEvaluatesAndVerifies) {
  // A buffer of 8 positions cropped to the sequence length n (what kiln.export makes of
  // position_ids[:, :seq]: a pad with a symbolic negative pad), added to x [b, n].
  Graph g = parse_graph(
      "graph @g(%x: f32[b, n], %pos: f32[1, 8]) {\n"
      "  %p = pad(%pos) {pads=[0, 0, 0, n - 8]}\n"
      "  %y = add(%x, %p)\n"
      "  %z = reshape(%y) {shape=[b*n]}\n"
      "  return %z\n"
      "}");
  Generator gen(3);
  Tensor x = Tensor::randn({2, 5}, gen), pos = Tensor::randn({1, 8}, gen);
  SymbolBindings bound = bind_input_symbols(g, {x, pos});
  Graph s = specialize_graph(g, bound);
  EXPECT_EQ(s.type(s.outputs[0]).str(), "f32[10]");
  EXPECT_EQ(s.type(s.inputs[0]).str(), "f32[2, 5]");
  EXPECT_TRUE(verify_problems(s).empty());
  // The specialized graph computes what the interpreter computes on the symbolic one.
  TensorList a = run(s, {x, pos}), b = run(g, {x, pos});
  ASSERT_EQ(a[0].nbytes(), b[0].nbytes());
  EXPECT_EQ(std::memcmp(a[0].raw_data(), b[0].raw_data(), size_t(a[0].nbytes())), 0);
  // A type that disagrees with inference once the sizes are known is an error naming them.
  Graph bad = g;
  bad.values[size_t(bad.outputs[0])].type.shape[0] = SymInt::symbol("b") * SymInt(7);
  try {
    specialize_graph(bad, bound);
    ADD_FAILURE() << "a graph whose types disagree with inference was specialized";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("do not fit the graph"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("b=2"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln
