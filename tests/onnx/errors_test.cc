// Malformed, truncated, hostile and unsupported ONNX models: each gets a kiln::Error naming the
// file or node, never a crash or an unbounded allocation.
#include <gtest/gtest.h>

#include <filesystem>

#include "frontends/onnx/importer.h"
#include "onnx_builder.h"

namespace kiln {
namespace {

using namespace onnx_test;

ModelBuilder relu_model() {
  ModelBuilder m;
  m.input("x", DType::Float32, {2, 3}).node("Relu", {"x"}, {"y"}).output("y", DType::Float32, {2, 3});
  return m;
}

TEST(OnnxErrors, UnsupportedOpsAreListedTogetherBeforeAnythingRuns) {
  ModelBuilder m;
  m.input("x", DType::Float32, {4})
      .node("Unique", {"x"}, {"a"}, {}, "nz1")
      .node("Relu", {"x"}, {"r"})
      .node("TopKish", {"r"}, {"b"}, {}, "custom1")
      .node("Unique", {"r"}, {"c"}, {}, "nz2")
      .output("a", DType::Int64).output("b", DType::Float32).output("c", DType::Int64);
  auto* n = m.graph().add_node();  // an op from another domain
  n->set_op_type("FusedThing");
  n->set_domain("com.example");
  n->set_name("ext1");
  n->add_input("x");
  n->add_output("d");
  expect_error([&] { m.import(); }, ErrorKind::NotSupported,
               {"3 op types are not supported", "Unique (nodes 'nz1', 'nz2')", "TopKish (node 'custom1')",
                "com.example:FusedThing (node 'ext1')"});
}

// An op inside an If branch goes through the same table: an unmapped one is listed before
// anything runs, as at the top level.
TEST(OnnxErrors, UnsupportedOpsInsideBranchesAreListedToo) {
  ModelBuilder m, branch;
  branch.node("Unique", {"x"}, {"u"}, {}, "in_branch").output("u", DType::Float32);
  m.input("x", DType::Float32, {4})
      .initializer("c", Tensor::full(Dims{}, 1, DType::Bool))
      .node("If", {"c"}, {"y"}, {}, "cond1")
      .output("y", DType::Float32);
  for (const char* name : {"then_branch", "else_branch"}) {
    auto* a = m.graph().mutable_node(0)->add_attribute();
    a->set_name(name);
    a->set_type(::onnx::AttributeProto::GRAPH);
    *a->mutable_g() = branch.graph();
  }
  expect_error([&] { m.import(); }, ErrorKind::NotSupported,
               {"1 op type is not supported", "Unique (nodes 'in_branch', 'in_branch')"});
}

TEST(OnnxErrors, NotAModel) {
  expect_error([] { import_onnx_bytes("this is not a protobuf \xff\xff\xff", "", "junk.onnx"); },
               ErrorKind::ParseError, {"junk.onnx", "not a valid ONNX model"});
  expect_error([] { import_onnx("/nonexistent/dir/model.onnx"); }, ErrorKind::InvalidArgument,
               {"/nonexistent/dir/model.onnx", "no such model file"});
  ModelBuilder empty;
  empty.model().clear_graph();
  expect_error([&] { empty.import(); }, ErrorKind::ParseError, {"has no graph"});
}

TEST(OnnxErrors, TruncatedAndMangledModelsNeverCrash) {
  uint64_t seed = fresh_seed();
  SCOPED_TRACE("seed " + std::to_string(seed));
  std::fprintf(stderr, "mangling seed %llu\n", (unsigned long long)seed);  // reproducible crashes
  Generator gen(seed);
  ModelBuilder m;
  m.input("x", DType::Float32, {1, 2, 5, 5})
      .initializer("w", Tensor::randn({3, 2, 3, 3}, gen))
      .initializer("shape", Tensor::from_vector<int64_t>({1, -1}, {2}))
      .node("Conv", {"x", "w"}, {"c"}, {{"pads", std::vector<int64_t>{1, 1, 1, 1}}})
      .node("Relu", {"c"}, {"r"})
      .node("Reshape", {"r", "shape"}, {"y"})
      .output("y", DType::Float32);
  std::string good = m.bytes();
  ImportOptions small;
  small.max_tensor_bytes = 1 << 20;  // mangled sizes must hit the limit, not the allocator
  int errors = 0, imported = 0;
  // Every truncation point.
  for (size_t cut = 0; cut < good.size(); cut += 3) {
    try {
      import_onnx_bytes(std::string_view(good).substr(0, cut), "", "cut.onnx", small);
      ++imported;
    } catch (const Error&) {
      ++errors;
    }
  }
  // Random byte flips.
  for (int trial = 0; trial < 400; ++trial) {
    std::string bad = good;
    int flips = 1 + int(gen.next_u64() % 4);
    for (int f = 0; f < flips; ++f) bad[gen.next_u64() % bad.size()] = char(gen.next_u64());
    try {
      import_onnx_bytes(bad, "", "mangled.onnx", small);
      ++imported;
    } catch (const Error&) {
      ++errors;
    }
  }
  // Reaching here means no crash and no exception other than kiln::Error; some corruptions
  // (inside raw weight bytes) still import cleanly.
  EXPECT_GT(errors, 0);
  EXPECT_GT(imported, 0);
}

TEST(OnnxErrors, DanglingDuplicateAndCyclicValues) {
  ModelBuilder dangling;
  dangling.input("x", DType::Float32, {2}).node("Add", {"x", "missing_w"}, {"y"}, {}, "add1")
      .output("y", DType::Float32);
  expect_error([&] { dangling.import(); }, ErrorKind::InvalidArgument,
               {"node 'add1' (Add) reads 'missing_w'", "no node, graph input or initializer"});

  ModelBuilder dup;
  dup.input("x", DType::Float32, {2}).node("Relu", {"x"}, {"y"}, {}, "first")
      .node("Neg", {"x"}, {"y"}, {}, "second").output("y", DType::Float32);
  expect_error([&] { dup.import(); }, ErrorKind::InvalidArgument,
               {"'y' is produced by both node 'first' and node 'second'"});

  ModelBuilder cyc;
  cyc.input("x", DType::Float32, {2})
      .node("Add", {"x", "b"}, {"a"}, {}, "n_a")
      .node("Relu", {"a"}, {"b"}, {}, "n_b")
      .output("b", DType::Float32);
  expect_error([&] { cyc.import(); }, ErrorKind::InvalidArgument, {"cycle", "'n_a'", "'n_b'"});

  ModelBuilder no_out;
  no_out.input("x", DType::Float32, {2}).node("Relu", {"x"}, {"y"}).output("z", DType::Float32);
  expect_error([&] { no_out.import(); }, ErrorKind::InvalidArgument, {"graph output 'z'"});
}

TEST(OnnxErrors, ShapeMismatchesNameTheNode) {
  ModelBuilder m;
  m.input("a", DType::Float32, {2, 3}).input("b", DType::Float32, {4, 5})
      .node("Add", {"a", "b"}, {"y"}, {}, "bad_add").output("y", DType::Float32);
  expect_error([&] { m.import(); }, ErrorKind::InvalidArgument, {"bad_add"});

  // Errors from shared helpers (broadcasting) are prefixed with the file and node.
  ModelBuilder ex;
  ex.input("x", DType::Float32, {2, 3})
      .initializer("shape", Tensor::from_vector<int64_t>({4, 5}, {2}))
      .node("Expand", {"x", "shape"}, {"y"}, {}, "bad_expand").output("y", DType::Float32);
  expect_error([&] { ex.import(); }, ErrorKind::InvalidArgument, {"test.onnx", "node 'bad_expand' (Expand)"});

  ModelBuilder mm;
  mm.input("a", DType::Float32, {2, 3}).input("b", DType::Float32, {4, 5})
      .node("MatMul", {"a", "b"}, {"y"}, {}, "bad_mm").output("y", DType::Float32);
  expect_error([&] { mm.import(); }, ErrorKind::InvalidArgument, {"bad_mm"});

  // A declared output shape that disagrees with what the node computes.
  ModelBuilder decl;
  decl.input("x", DType::Float32, {2, 3}).node("Relu", {"x"}, {"y"}).output("y", DType::Float32, {3, 2});
  expect_error([&] { decl.import(); }, ErrorKind::InvalidArgument,
               {"graph output 'y' is declared with shape [3, 2]", "[2, 3]"});
}

TEST(OnnxErrors, HugeDeclaredSizesAreRejectedBeforeAllocating) {
  // An initializer claiming 10^12 floats with no data behind it.
  ModelBuilder m = relu_model();
  pb::TensorProto* t = m.graph().add_initializer();
  t->set_name("big");
  t->set_data_type(pb::TensorProto::FLOAT);
  t->add_dims(1000000);
  t->add_dims(1000000);
  expect_error([&] { m.import(); }, ErrorKind::InvalidArgument, {"initializer 'big'", "tensor limit"});

  // Declared dims that disagree with the data actually present.
  ModelBuilder m2 = relu_model();
  pb::TensorProto* t2 = m2.graph().add_initializer();
  t2->set_name("short");
  t2->set_data_type(pb::TensorProto::FLOAT);
  t2->add_dims(4);
  t2->set_raw_data(std::string(8, '\0'));
  expect_error([&] { m2.import(); }, ErrorKind::InvalidArgument,
               {"initializer 'short'", "raw data holds 8 bytes", "need 16"});
  ModelBuilder m3 = relu_model();
  pb::TensorProto* t3 = m3.graph().add_initializer();
  t3->set_name("typed");
  t3->set_data_type(pb::TensorProto::INT64);
  t3->add_dims(3);
  t3->add_int64_data(1);
  expect_error([&] { m3.import(); }, ErrorKind::InvalidArgument, {"initializer 'typed'", "holds 1 values"});

  // ConstantOfShape asked for 10^20 elements.
  ModelBuilder m4;
  m4.initializer("shape", Tensor::from_vector<int64_t>({10000000000, 10000000000}, {2}))
      .node("ConstantOfShape", {"shape"}, {"y"}, {}, "huge_fill").output("y", DType::Float32);
  expect_error([&] { m4.import(); }, ErrorKind::InvalidArgument, {"huge_fill", "tensor limit"});

  // Node outputs beyond the limit (pads of a billion per side), refused at import.
  ModelBuilder m6;
  m6.input("x", DType::Float32, {2, 2})
      .initializer("pads", Tensor::from_vector<int64_t>({1000000000, 1000000000, 1000000000, 1000000000}, {4}))
      .node("Pad", {"x", "pads"}, {"y"}, {}, "huge_pad").output("y", DType::Float32);
  expect_error([&] { m6.import(); }, ErrorKind::InvalidArgument, {"huge_pad", "tensor limit"});

  // A negative dim.
  ModelBuilder m5 = relu_model();
  pb::TensorProto* t5 = m5.graph().add_initializer();
  t5->set_name("neg");
  t5->set_data_type(pb::TensorProto::FLOAT);
  t5->add_dims(-3);
  expect_error([&] { m5.import(); }, ErrorKind::InvalidArgument, {"initializer 'neg'", "negative dim"});
}

TEST(OnnxErrors, ExternalDataMustStayInsideTheModelDirectory) {
  TempDir dir;
  dir.write("sub/weights.bin", std::string(64, '\0'));
  dir.write("outside.bin", std::string(64, '\0'));
  auto model_with = [&](const std::string& location, const std::string& length) {
    ModelBuilder m = relu_model();
    pb::TensorProto* t = m.graph().add_initializer();
    t->set_name("w");
    t->set_data_type(pb::TensorProto::FLOAT);
    t->add_dims(4);
    t->set_data_location(pb::TensorProto::EXTERNAL);
    auto* e = t->add_external_data();
    e->set_key("location");
    e->set_value(location);
    if (!length.empty()) {
      auto* l = t->add_external_data();
      l->set_key("length");
      l->set_value(length);
    }
    return dir.write("sub/model.onnx", m.bytes());
  };
  expect_error([&] { import_onnx(model_with("../outside.bin", "16")); }, ErrorKind::InvalidArgument,
               {"'../outside.bin' leaves the model directory"});
  expect_error([&] { import_onnx(model_with((dir.path() / "outside.bin").string(), "16")); },
               ErrorKind::InvalidArgument, {"leaves the model directory"});
  std::filesystem::create_symlink(dir.path() / "outside.bin", dir.path() / "sub" / "link.bin");
  expect_error([&] { import_onnx(model_with("link.bin", "16")); }, ErrorKind::InvalidArgument,
               {"'link.bin' leaves the model directory"});
  expect_error([&] { import_onnx(model_with("absent.bin", "16")); }, ErrorKind::InvalidArgument,
               {"'absent.bin' not found"});
  expect_error([&] { import_onnx(model_with("weights.bin", "8")); }, ErrorKind::InvalidArgument,
               {"holds 8 bytes", "need 16"});
  // Inside the directory and the right size: imports.
  EXPECT_NO_THROW(import_onnx(model_with("weights.bin", "16")));
  // From memory there is no directory to read from.
  ModelBuilder m = relu_model();
  pb::TensorProto* t = m.graph().add_initializer();
  t->set_name("w");
  t->set_data_type(pb::TensorProto::FLOAT);
  t->add_dims(4);
  t->set_data_location(pb::TensorProto::EXTERNAL);
  auto* e = t->add_external_data();
  e->set_key("location");
  e->set_value("weights.bin");
  expect_error([&] { m.import(); }, ErrorKind::InvalidArgument, {"cannot be resolved"});
}

TEST(OnnxErrors, UnsupportedFormsNameNodeAndAttribute) {
  ModelBuilder attr;
  attr.input("x", DType::Float32, {2, 3})
      .node("Relu", {"x"}, {"y"}, {{"mystery", int64_t(1)}}, "relu_x").output("y", DType::Float32);
  expect_error([&] { attr.import(); }, ErrorKind::NotSupported,
               {"node 'relu_x' (Relu)", "attribute 'mystery'"});

  ModelBuilder newer(99);
  newer.input("x", DType::Float32, {2}).node("Relu", {"x"}, {"y"}).output("y", DType::Float32);
  expect_error([&] { newer.import(); }, ErrorKind::NotSupported, {"opset 99 is newer"});

  ModelBuilder dtype;
  dtype.input("x", DType::Float32, {2});
  dtype.graph().mutable_input(0)->mutable_type()->mutable_tensor_type()->set_elem_type(
      pb::TensorProto::UINT16);
  dtype.node("Relu", {"x"}, {"y"}).output("y", DType::Float32);
  expect_error([&] { dtype.import(); }, ErrorKind::NotSupported, {"graph input 'x'", "uint16"});

  ModelBuilder mode;
  mode.input("x", DType::Float32, {1, 1, 4, 4}).initializer("pads", Tensor::from_vector<int64_t>({0, 0, 1, 1, 0, 0, 1, 1}, {8}))
      .node("Pad", {"x", "pads"}, {"y"}, {{"mode", std::string("wrap")}}, "pad_wrap")
      .output("y", DType::Float32);
  expect_error([&] { mode.import(); }, ErrorKind::NotSupported, {"pad_wrap", "mode \"wrap\""});

  ModelBuilder wrong_type;
  wrong_type.input("x", DType::Float32, {2})
      .node("LeakyRelu", {"x"}, {"y"}, {{"alpha", std::string("big")}}, "lr")
      .output("y", DType::Float32);
  expect_error([&] { wrong_type.import(); }, ErrorKind::InvalidArgument,
               {"node 'lr' (LeakyRelu)", "attribute 'alpha' must be FLOAT, got STRING"});

  ModelBuilder no_shape;
  no_shape.input("x", DType::Float32, {2});
  no_shape.graph().mutable_input(0)->mutable_type()->mutable_tensor_type()->clear_shape();
  no_shape.node("Relu", {"x"}, {"y"}).output("y", DType::Float32);
  expect_error([&] { no_shape.import(); }, ErrorKind::NotSupported, {"graph input 'x'", "shape"});

  // Training-mode dropout is random: refused, naming the node.
  ModelBuilder drop;
  drop.input("x", DType::Float32, {4})
      .initializer("ratio", Tensor::scalar(0.3))
      .initializer("train", Tensor::full(Dims{}, 1, DType::Bool))
      .node("Dropout", {"x", "ratio", "train"}, {"y"}, {}, "drop1").output("y", DType::Float32);
  expect_error([&] { drop.import(); }, ErrorKind::NotSupported, {"drop1", "training-mode dropout"});
}

}  // namespace
}  // namespace kiln
