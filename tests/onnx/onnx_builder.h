// Builds small ONNX models with the protobuf API for the importer tests.
#pragma once
#include <onnx/onnx_pb.h>

#include <cstdint>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <random>
#include <string>
#include <variant>
#include <vector>

#include <gtest/gtest.h>

#include "../support/compare.h"
#include "core/tensor.h"
#include "frontends/onnx/importer.h"

namespace kiln::onnx_test {

namespace pb = ::onnx;

inline int32_t onnx_type(DType d) {
  switch (d) {
    case DType::Float32: return pb::TensorProto::FLOAT;
    case DType::Float64: return pb::TensorProto::DOUBLE;
    case DType::Float16: return pb::TensorProto::FLOAT16;
    case DType::BFloat16: return pb::TensorProto::BFLOAT16;
    case DType::Int64: return pb::TensorProto::INT64;
    case DType::Int32: return pb::TensorProto::INT32;
    case DType::Int8: return pb::TensorProto::INT8;
    case DType::UInt8: return pb::TensorProto::UINT8;
    case DType::Bool: return pb::TensorProto::BOOL;
  }
  return 0;
}

// A tensor as a TensorProto with raw data.
inline pb::TensorProto tensor_proto(const std::string& name, const Tensor& t) {
  pb::TensorProto p;
  p.set_name(name);
  p.set_data_type(onnx_type(t.dtype()));
  for (int64_t d : t.sizes()) p.add_dims(d);
  Tensor c = t.contiguous();
  p.set_raw_data(std::string(static_cast<const char*>(c.raw_data()), c.nbytes()));
  return p;
}

// A dim is a size or a symbol name.
using Dim = std::variant<int64_t, std::string>;

struct Attr {
  std::string name;
  std::variant<int64_t, double, std::string, std::vector<int64_t>, std::vector<double>, Tensor> value;
};

class ModelBuilder {
 public:
  explicit ModelBuilder(int64_t opset = 17) {
    model_.set_ir_version(8);
    auto* o = model_.add_opset_import();
    o->set_domain("");
    o->set_version(opset);
    model_.mutable_graph()->set_name("test_graph");
  }
  pb::ModelProto& model() { return model_; }
  pb::GraphProto& graph() { return *model_.mutable_graph(); }

  ModelBuilder& input(const std::string& name, DType dtype, std::vector<Dim> dims) {
    value_info(graph().add_input(), name, onnx_type(dtype), dims);
    return *this;
  }
  ModelBuilder& output(const std::string& name, DType dtype, std::vector<Dim> dims) {
    value_info(graph().add_output(), name, onnx_type(dtype), dims);
    return *this;
  }
  // An output declared without a shape (the importer computes it).
  ModelBuilder& output(const std::string& name, DType dtype) {
    auto* vi = graph().add_output();
    vi->set_name(name);
    vi->mutable_type()->mutable_tensor_type()->set_elem_type(onnx_type(dtype));
    return *this;
  }
  ModelBuilder& initializer(const std::string& name, const Tensor& t) {
    *graph().add_initializer() = tensor_proto(name, t);
    return *this;
  }
  ModelBuilder& node(const std::string& op, std::vector<std::string> inputs,
                     std::vector<std::string> outputs, std::vector<Attr> attrs = {},
                     const std::string& name = "") {
    auto* n = graph().add_node();
    n->set_op_type(op);
    n->set_name(name.empty() ? op + "_" + std::to_string(graph().node_size() - 1) : name);
    for (auto& i : inputs) n->add_input(i);
    for (auto& o : outputs) n->add_output(o);
    for (const Attr& a : attrs) {
      auto* p = n->add_attribute();
      p->set_name(a.name);
      std::visit(
          [&](const auto& v) {
            using T = std::decay_t<decltype(v)>;
            if constexpr (std::is_same_v<T, int64_t>) {
              p->set_type(pb::AttributeProto::INT);
              p->set_i(v);
            } else if constexpr (std::is_same_v<T, double>) {
              p->set_type(pb::AttributeProto::FLOAT);
              p->set_f(float(v));
            } else if constexpr (std::is_same_v<T, std::string>) {
              p->set_type(pb::AttributeProto::STRING);
              p->set_s(v);
            } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
              p->set_type(pb::AttributeProto::INTS);
              for (int64_t x : v) p->add_ints(x);
            } else if constexpr (std::is_same_v<T, std::vector<double>>) {
              p->set_type(pb::AttributeProto::FLOATS);
              for (double x : v) p->add_floats(float(x));
            } else {
              p->set_type(pb::AttributeProto::TENSOR);
              *p->mutable_t() = tensor_proto("", v);
            }
          },
          a.value);
    }
    return *this;
  }
  std::string bytes() const { return model_.SerializeAsString(); }
  Graph import(const ImportOptions& o = {}) const {
    return import_onnx_bytes(bytes(), "", "test.onnx", o);
  }

 private:
  static void value_info(pb::ValueInfoProto* vi, const std::string& name, int32_t type,
                         const std::vector<Dim>& dims) {
    vi->set_name(name);
    auto* tt = vi->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(type);
    auto* shape = tt->mutable_shape();
    for (const Dim& d : dims) {
      auto* dim = shape->add_dim();
      if (auto* v = std::get_if<int64_t>(&d)) dim->set_dim_value(*v);
      else dim->set_dim_param(std::get<std::string>(d));
    }
  }
  pb::ModelProto model_;
};

// A fresh temporary directory, removed at scope exit.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = std::filesystem::temp_directory_path() /
            ("kiln_onnx_test_" + std::to_string(rd()) + std::to_string(rd()));
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::filesystem::path& path() const { return path_; }
  std::string write(const std::string& name, const std::string& bytes) const {
    std::filesystem::path p = path_ / name;
    std::filesystem::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary).write(bytes.data(), std::streamsize(bytes.size()));
    return p.string();
  }

 private:
  std::filesystem::path path_;
};

inline uint64_t fresh_seed() {
  std::random_device rd;
  return (uint64_t(rd()) << 32) | rd();
}

// Expects f() to throw a kiln::Error of `kind` whose message contains every part.
template <typename F>
void expect_error(F&& f, ErrorKind kind, std::initializer_list<std::string_view> parts) {
  try {
    f();
    ADD_FAILURE() << "expected an error containing '" << *parts.begin() << "'";
  } catch (const Error& e) {
    EXPECT_EQ(int(e.kind()), int(kind)) << e.what();
    for (std::string_view p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos)
          << "message lacks '" << p << "':\n" << e.what();
  }
}

// Values of t as doubles (any dtype, any strides).
inline std::vector<double> values(const Tensor& t) { return t.to_vector<double>(); }

// |got - want| <= tol * (1 + |want|) element by element (tests/support/compare.h).
inline void expect_close(const Tensor& got, const std::vector<double>& want, const Dims& shape,
                         double tol = 1e-5) {
  ASSERT_EQ(to_string(got.sizes()), to_string(shape));
  ASSERT_TRUE(test::close(values(got), want, test::Tolerance::rel(tol, tol), shape));
}

}  // namespace kiln::onnx_test
