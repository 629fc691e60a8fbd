// Graph construction (add_node and friends) and the verifier on hand-corrupted graphs.
#include "ir/graph.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"

namespace kiln {
namespace {

// Runs f, expecting a kiln::Error whose message contains every one of `parts`.
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

bool has_problem(const Graph& g, std::string_view part) {
  for (const std::string& p : verify_problems(g))
    if (p.find(part) != std::string::npos) return true;
  return false;
}

std::string all_problems(const Graph& g) {
  std::string s;
  for (const std::string& p : verify_problems(g)) s += p + "\n";
  return s;
}

// x[n, 4] -> relu -> add(x) -> split into 2 + 2; params and a const.
Graph small_graph() {
  Graph g;
  g.name = "small";
  ValueId x = g.add_input("x", TensorType(DType::Float32, {SymInt::symbol("n"), 4}));
  ValueId w = g.add_param_decl("w", TensorType(DType::Float32, {4}));
  ValueId c = g.add_const(Tensor::full({4}, 0.5), "c");
  ValueId r = g.add_node1(OpId::Relu, {x}, {}, "act");
  ValueId a = g.add_node1(OpId::Add, {r, w});
  ValueId m = g.add_node1(OpId::Mul, {a, c});
  std::vector<ValueId> parts =
      g.add_node(OpId::Split, {m}, {{"sizes", Ints{2, 2}}, {"dim", int64_t(1)}});
  g.outputs = {parts[0], parts[1]};
  return g;
}

TEST(Graph, AddNodeInfersTypesAndNamesOutputs) {
  Graph g = small_graph();
  EXPECT_TRUE(verify_problems(g).empty()) << all_problems(g);
  SymInt n = SymInt::symbol("n");
  ASSERT_EQ(g.nodes.size(), 4u);
  // Output names come from the node name, else the op name; collisions get suffixes.
  EXPECT_EQ(g.value(g.nodes[0].outputs[0]).name, "act");
  EXPECT_EQ(g.value(g.nodes[1].outputs[0]).name, "add");
  EXPECT_EQ(g.value(g.nodes[3].outputs[0]).name, "split");
  EXPECT_EQ(g.value(g.nodes[3].outputs[1]).name, "split_1");
  EXPECT_EQ(g.type(g.outputs[0]), TensorType(DType::Float32, {n, 2}));
  // Attributes are stored canonical: every schema attribute, defaults filled.
  EXPECT_EQ(g.nodes[3].attrs.size(), op_def(OpId::Split).attrs.size());
  const Value& out1 = g.value(g.outputs[1]);
  EXPECT_EQ(out1.kind, ValueKind::NodeOutput);
  EXPECT_EQ(out1.producer, 3);
  EXPECT_EQ(out1.output_index, 1);
  std::vector<int> uses = g.use_counts();
  EXPECT_EQ(uses[size_t(g.find_value("x"))], 1);
  EXPECT_EQ(uses[size_t(g.outputs[0])], 1);
  std::vector<ValueId> params = g.params();
  ASSERT_EQ(params.size(), 2u);
  EXPECT_EQ(g.value(params[0]).name, "w");
  EXPECT_EQ(g.value(params[1]).name, "c");
}

TEST(Graph, UniqueNamesAndRenames) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::Float32, {2}));
  ValueId a = g.add_node1(OpId::Neg, {x});
  ValueId b = g.add_node1(OpId::Neg, {a});
  ValueId c = g.add_node1(OpId::Neg, {b});
  EXPECT_EQ(g.value(a).name, "neg");
  EXPECT_EQ(g.value(b).name, "neg_1");
  EXPECT_EQ(g.value(c).name, "neg_2");
  g.rename_value(a, "first");
  EXPECT_EQ(g.find_value("first"), a);
  EXPECT_EQ(g.find_value("neg"), kNoValue);
  ValueId d = g.add_node1(OpId::Neg, {c});
  EXPECT_EQ(g.value(d).name, "neg");  // freed by the rename
  expect_error([&] { g.rename_value(b, "first"); }, {"cannot rename %neg_1 to %first", "taken"});
  expect_error([&] { g.add_input("x", TensorType(DType::Float32, {2})); },
               {"already has a value named 'x'"});
  // A pass that writes Value::name directly: find_value notices the stale entry.
  g.values[size_t(c)].name = "direct";
  EXPECT_EQ(g.find_value("direct"), c);
  EXPECT_EQ(g.find_value("neg_2"), kNoValue);
  // Values appended straight to `values` are found too.
  Value extra;
  extra.name = "appended";
  extra.kind = ValueKind::Param;
  g.values.push_back(extra);
  EXPECT_EQ(g.find_value("appended"), ValueId(g.values.size() - 1));
}

TEST(Graph, AddNodeErrorsNameTheNode) {
  Graph g;
  ValueId x = g.add_input("x", TensorType(DType::Float32, {1, 4, 8, 8}));
  ValueId w = g.add_param_decl("w", TensorType(DType::Float32, {8, 3, 3, 3}));
  expect_error(
      [&] {
        g.add_node1(OpId::Conv2d, {x, w}, {}, "stem.conv1");
      },
      {"op 'conv2d' (node 'stem.conv1'): "});
  expect_error(
      [&] {
        g.add_node1(OpId::Relu, {x}, {{"alpha", 0.1}}, "act");
      },
      {"node 'act'", "op 'relu' has no attribute 'alpha'"});
  expect_error(
      [&] {
        g.add_node1(OpId::Relu, {x, x}, {}, "act");
      },
      {"node 'act'", "takes 1 inputs, got 2"});
  expect_error([&] { g.add_node1(OpId::Relu, {ValueId(99)}, {}, "act"); },
               {"node 'act'", "input 0 ('x') refers to value 99, which does not exist"});
  expect_error(
      [&] {
        g.add_node1(OpId::Add, {x, kNoValue});
      },
      {"input 1 ('b') is required but absent"});
  expect_error(
      [&] {
        g.add_node1(OpId::Softmax, {x}, {{"dim", 1.5}}, "sm");
      },
      {"node 'sm'", "attribute 'dim' must be int"});
  expect_error(
      [&] {
        g.add_node1(OpId::Split, {x}, {{"sizes", Ints{2, 2}}, {"dim", int64_t(1)}});
      },
      {"op 'split'", "has 2 outputs; use add_node"});
  // A failed add_node leaves the graph untouched.
  EXPECT_TRUE(g.nodes.empty());
  EXPECT_EQ(g.values.size(), 2u);
  // An absent optional input is fine.
  ValueId y = g.add_node1(
      OpId::Conv2d, {x, g.add_param_decl("w2", TensorType(DType::Float32, {8, 4, 3, 3})), kNoValue},
      {{"padding", Ints{1, 1}}}, "stem.conv1");
  EXPECT_EQ(g.type(y), TensorType(DType::Float32, {1, 8, 8, 8}));
  EXPECT_TRUE(verify_problems(g).empty()) << all_problems(g);
}

// ---- the verifier on corrupted graphs ---------------------------------------------------------

TEST(Verifier, AcceptsValidGraphs) {
  Graph g = small_graph();
  EXPECT_NO_THROW(verify(g));
  Graph p = parse_graph(print_graph(g));
  EXPECT_NO_THROW(verify(p));
}

TEST(Verifier, WrongOutputType) {
  Graph g = small_graph();
  ValueId r = g.nodes[0].outputs[0];
  g.value(r).type.shape[1] = 5;
  EXPECT_TRUE(has_problem(g,
                          "node 0 'act' (relu -> %act): output %act has type f32[n, 5], but "
                          "inference gives f32[n, 4]"))
      << all_problems(g);
  g = small_graph();
  g.value(g.nodes[1].outputs[0]).type.dtype = DType::Float64;
  EXPECT_TRUE(has_problem(g, "output %add has type f64[n, 4], but inference gives f32[n, 4]"))
      << all_problems(g);
  expect_error([&] { verify(g); }, {"graph 'small' fails verification (", "%add"});
}

TEST(Verifier, UseBeforeDef) {
  Graph g = small_graph();
  // Swap nodes 1 and 2: mul now reads %add before add runs. Fix producers so that only the
  // order is wrong.
  std::swap(g.nodes[1], g.nodes[2]);
  for (int i : {1, 2})
    for (ValueId v : g.nodes[size_t(i)].outputs) g.value(v).producer = i;
  EXPECT_TRUE(has_problem(g,
                          "node 1 (mul -> %mul): input 0 ('a') uses %add before it is defined "
                          "(by node 2 (add -> %add))"))
      << all_problems(g);
}

TEST(Verifier, DanglingIds) {
  Graph g = small_graph();
  g.nodes[1].inputs[1] = ValueId(1000);
  EXPECT_TRUE(has_problem(g, "node 1 (add -> %add): input 1 ('b') is value id 1000 (out of range"))
      << all_problems(g);

  g = small_graph();
  g.outputs.push_back(ValueId(-7));
  EXPECT_TRUE(has_problem(g, "graph output 2 is value id -7 (out of range")) << all_problems(g);

  g = small_graph();
  g.inputs.push_back(ValueId(500));
  EXPECT_TRUE(has_problem(g, "graph input 1 is value id 500")) << all_problems(g);

  // A node output whose producer index is gone (e.g. a pass erased the node).
  g = small_graph();
  g.value(g.nodes[3].outputs[1]).producer = 9;
  EXPECT_TRUE(has_problem(g, "node output %split_1 names producer node 9, which does not exist"))
      << all_problems(g);
  EXPECT_TRUE(has_problem(g, "graph output 1 is %split_1, which no node defines"))
      << all_problems(g);
}

TEST(Verifier, ProducerConsistency) {
  Graph g = small_graph();
  g.value(g.nodes[3].outputs[1]).output_index = 0;
  EXPECT_TRUE(has_problem(g, "node output %split_1 claims to be output 0 of node 3 (split"))
      << all_problems(g);

  // One value produced by two nodes (not SSA).
  g = small_graph();
  g.nodes[2].outputs[0] = g.nodes[1].outputs[0];
  EXPECT_TRUE(has_problem(g,
                          "node 2 (mul -> %add): output 0 is %add, but that value is a node "
                          "output with producer 1"))
      << all_problems(g);

  // A param listed as a node output.
  g = small_graph();
  g.nodes[0].outputs[0] = g.find_value("w");
  EXPECT_TRUE(has_problem(g, "output 0 is %w, but that value is a param")) << all_problems(g);
}

TEST(Verifier, NamesInputsAndData) {
  Graph g = small_graph();
  g.values[size_t(g.find_value("c"))].name = "w";
  EXPECT_TRUE(has_problem(g, "share the name %w")) << all_problems(g);

  g = small_graph();
  g.value(g.find_value("c")).data = Tensor::full({5}, 1.0);
  EXPECT_TRUE(has_problem(g, "const %c is declared f32[4] but its data is f32[5]"))
      << all_problems(g);

  g = small_graph();
  g.value(g.find_value("w")).data = Tensor::full({4}, 1.0, DType::Float64);
  EXPECT_TRUE(has_problem(g, "param %w is declared f32[4] but its data is f64[4]"))
      << all_problems(g);

  g = small_graph();
  g.inputs.clear();
  EXPECT_TRUE(has_problem(g, "input value %x is not listed among the graph inputs"))
      << all_problems(g);

  g = small_graph();
  g.inputs.push_back(g.inputs[0]);
  EXPECT_TRUE(has_problem(g, "%x is listed twice among the graph inputs")) << all_problems(g);
}

TEST(Verifier, AttributesAndArity) {
  Graph g = small_graph();
  g.nodes[3].attrs.items().pop_back();  // drop split's 'dim': not canonical any more
  EXPECT_TRUE(has_problem(g, "node 3 (split -> %split, %split_1): attributes are not canonical"))
      << all_problems(g);

  g = small_graph();
  g.nodes[0].attrs.set("alpha", 0.5);
  EXPECT_TRUE(has_problem(g, "op 'relu' has no attribute 'alpha'")) << all_problems(g);

  g = small_graph();
  g.nodes[1].inputs.pop_back();
  EXPECT_TRUE(has_problem(g, "op 'add' takes 2 inputs, got 1")) << all_problems(g);

  g = small_graph();
  g.nodes[1].inputs[1] = kNoValue;
  EXPECT_TRUE(has_problem(g, "node 1 (add -> %add): input 1 ('b') is required but absent"))
      << all_problems(g);

  // Inputs of the wrong type: the node's own inference rejects them.
  g = small_graph();
  g.value(g.find_value("w")).type = TensorType(DType::Float32, {3});
  EXPECT_TRUE(has_problem(g, "node 1 (add -> %add): inference rejects the node"))
      << all_problems(g);
}

}  // namespace
}  // namespace kiln
