// Bad input gets a kiln::Error that names the place (the op and the call site) and says what was
// expected and what was found (STYLE.md habit 9). Each test makes one mistake a user makes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "harness_util.h"
#include "core/cuda_runtime.h"
#include "ops/api.h"
#include "ops/dispatch.h"
#include "ops/op.h"

namespace kiln {
namespace {

using harness::error_of;

// The message of the kiln::Error thrown by f, or a description of what happened instead.
// Every substring of `all` occurs in msg, and at least one of each group in `any_of`.
void expect_message(const std::string& msg, std::vector<std::string> all,
                    std::vector<std::vector<std::string>> any_of = {}) {
  for (const auto& s : all)
    EXPECT_NE(msg.find(s), std::string::npos) << "message lacks \"" << s << "\":\n  " << msg;
  for (const auto& group : any_of) {
    bool found = false;
    std::string options;
    for (const auto& s : group) {
      found |= msg.find(s) != std::string::npos;
      options += (options.empty() ? "\"" : " or \"") + s + "\"";
    }
    EXPECT_TRUE(found) << "message lacks " << options << ":\n  " << msg;
  }
}

ErrorKind kind_of_error(auto&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.kind();
  }
  return ErrorKind::Internal;
}

// call_op with a brace list of inputs.
TensorList call(OpId op, std::vector<Tensor> inputs, const Attrs& attrs = {}) {
  return call_op(op, inputs, attrs);
}

class OpErrors : public testing::Test {
 protected:
  Generator gen{2024};
  Tensor randn(const Dims& sizes, DType d = DType::Float32) { return Tensor::randn(sizes, gen, d); }
};

// The call site of every eager error is this file (dispatch names it "file:line").
constexpr const char* kHere = "op_errors_test.cc:";

TEST_F(OpErrors, Conv2dOnA3DInput) {
  Tensor x = randn({3, 9, 9});  // forgot the batch dim
  Tensor w = randn({4, 3, 3, 3});
  std::string msg = error_of([&] { conv2d(x, w, Tensor()); });
  expect_message(msg, {"conv2d", kHere},
                 {{"3-D", "rank 3", "3 dims", "3 dimensions", "[3, 9, 9]"},
                  {"4-D", "rank 4", "4 dims", "4 dimensions", "NCHW", "[N, C, H, W]"}});
}

TEST_F(OpErrors, Conv2dChannelMismatch) {
  Tensor x = randn({1, 5, 8, 8});
  Tensor w = randn({4, 3, 3, 3});
  std::string msg = error_of([&] { conv2d(x, w, Tensor()); });
  expect_message(msg, {"conv2d", "5", "3", kHere}, {{"channel"}});
}

TEST_F(OpErrors, WhereWithAFloatCondition) {
  Tensor cond = randn({2, 3});
  std::string msg = error_of([&] { where(cond, randn({2, 3}), randn({2, 3})); });
  expect_message(msg, {"where", "cond", "bool", "float32", kHere});
}

TEST_F(OpErrors, LogOnInt64) {
  Tensor x = Tensor::randint({4}, gen, 1, 10, DType::Int64);
  std::string msg = error_of([&] { log(x); });
  expect_message(msg, {"'log'", "int64", "floating", kHere});
}

TEST_F(OpErrors, UnknownAttributeListsTheOpsAttributes) {
  Tensor x = randn({2, 3});
  std::string msg = error_of([&] { call(OpId::Gelu, {x}, {{"approx", std::string("tanh")}}); });
  expect_message(msg, {"'gelu'", "'approx'", "approximate", kHere});
  msg = error_of([&] { call(OpId::Softmax, {x}, {{"axis", int64_t(1)}}); });
  expect_message(msg, {"'softmax'", "'axis'", "dim"});
  // An op without attributes says so.
  msg = error_of([&] { call(OpId::Neg, {x}, {{"alpha", 1.0}}); });
  expect_message(msg, {"'neg'", "'alpha'", "none"});
}

TEST_F(OpErrors, MissingRequiredAttribute) {
  Tensor x = randn({2, 3});
  std::string msg = error_of([&] { call(OpId::Cast, {x}, {}); });
  expect_message(msg, {"'cast'", "'dtype'", kHere});
  EXPECT_EQ(kind_of_error([&] { call(OpId::Cast, {x}, {}); }), ErrorKind::InvalidArgument);
}

TEST_F(OpErrors, AttributeOfTheWrongType) {
  Tensor x = randn({2, 3});
  std::string msg = error_of([&] { call(OpId::Gelu, {x}, {{"approximate", int64_t(1)}}); });
  expect_message(msg, {"'gelu'", "'approximate'", "string", "1", kHere});
  msg = error_of([&] { call(OpId::Clamp, {x}, {{"min", std::string("low")}}); });
  expect_message(msg, {"'clamp'", "'min'", "float", "\"low\""});
  msg = error_of([&] { call(OpId::Cast, {x}, {{"dtype", std::string("f16")}}); });
  expect_message(msg, {"'cast'", "'dtype'", "dtype", "\"f16\""});
}

TEST_F(OpErrors, BadAttributeValue) {
  Tensor x = randn({2, 3});
  std::string msg = error_of([&] { gelu(x, "fast"); });
  expect_message(msg, {"'gelu'", "fast", "tanh", kHere});
  msg = error_of([&] { clamp(x, 2.0, 1.0); });
  expect_message(msg, {"'clamp'", "2", "1", kHere});
}

TEST_F(OpErrors, WrongInputCount) {
  Tensor x = randn({2, 3});
  std::string msg = error_of([&] { call(OpId::Neg, {x, x}); });
  expect_message(msg, {"'neg'", "takes 1", "got 2", kHere});
  msg = error_of([&] { call(OpId::Add, {x}); });
  expect_message(msg, {"'add'", "takes 2", "got 1"});
  // A variadic op needs at least one tensor.
  msg = error_of([&] { call(OpId::Concat, {}, {{"dim", int64_t(0)}}); });
  expect_message(msg, {"'concat'", "at least 1", "got 0"});
}

TEST_F(OpErrors, UnknownOpName) {
  EXPECT_EQ(find_op("conv3d"), nullptr);
  EXPECT_EQ(find_op("Conv2d"), nullptr);  // names are case-sensitive
  EXPECT_EQ(find_op("conv2d "), nullptr);
  ASSERT_NE(find_op("conv2d"), nullptr);
  EXPECT_EQ(find_op("conv2d")->id, OpId::Conv2d);
}

TEST_F(OpErrors, BroadcastMismatchNamesBothShapes) {
  std::string msg = error_of([&] { add(randn({3, 4}), randn({5})); });
  expect_message(msg, {"'add'", "[3, 4]", "[5]", kHere});
}

TEST_F(OpErrors, MatmulInnerDimMismatch) {
  std::string msg = error_of([&] { matmul(randn({2, 7}), randn({5, 3})); });
  expect_message(msg, {"'matmul'", "7", "5", kHere});
}

TEST_F(OpErrors, ReshapeToTheWrongNumberOfElements) {
  std::string msg = error_of([&] { reshape(randn({2, 3}), {4, 2}); });
  expect_message(msg, {"'reshape'", kHere}, {{"[2, 3]", "6"}, {"[4, 2]", "8"}});
}

TEST_F(OpErrors, IndexOutOfRangeIsAnErrorNotACrash) {
  Tensor weight = randn({5, 3});
  Tensor idx = Tensor::from_vector<int64_t>({1, 7, 2}, {3});
  std::string msg = error_of([&] { embedding(weight, idx); });
  expect_message(msg, {"'embedding'", "7", "5"});
  msg = error_of([&] { index_select(randn({4, 2}), 0, Tensor::from_vector<int64_t>({-9}, {1})); });
  expect_message(msg, {"'index_select'", "-9", "4"});
}

TEST_F(OpErrors, DeviceMix) {
  if (cuda_device_count() == 0) {
    // Without a GPU, making a CUDA tensor is the error, and it says why.
    std::string msg = error_of([&] { Tensor::empty({2, 3}, DType::Float32, Device::cuda()); });
    expect_message(msg, {"no CUDA device"});
    EXPECT_EQ(kind_of_error([&] { Tensor::empty({2}, DType::Float32, Device::cuda()); }),
              ErrorKind::NotSupported);
    msg = error_of([&] { randn({2, 3}).to(Device::cuda()); });
    expect_message(msg, {"no CUDA device"});
    return;
  }
  Tensor a = randn({2, 3});
  Tensor b = randn({2, 3}).to(Device::cuda());
  std::string msg = error_of([&] { add(a, b); });
  expect_message(msg, {"'add'", "input 1", "cuda:0", "cpu", kHere});
}

TEST_F(OpErrors, SymbolicShapeReachingAKernel) {
  // A kernel needs concrete sizes: an output type with an unbound symbol is rejected, naming
  // the op and the symbol, before any memory is touched.
  const OpDef& neg = op_def(OpId::Neg);
  Tensor x = randn({4, 3});
  std::vector<TensorType> out = {TensorType(DType::Float32, {SymInt::symbol("batch"), 3})};
  std::string msg = error_of([&] { run_kernel(neg, neg.reference, {&x, 1}, Attrs(), out); });
  expect_message(msg, {"neg", "batch", "[batch, 3]"});
  // A fake tensor (type only, from tracing) reaching eager dispatch.
  msg = error_of([&] { kiln::neg(Tensor::fake({2, 3}, DType::Float32)); });
  expect_message(msg, {"'neg'", "fake", kHere});
}

TEST_F(OpErrors, ErrorsAreInvalidArgument) {
  // Caller mistakes are InvalidArgument (not Internal, which would mean a Kiln bug).
  Tensor x = randn({2, 3});
  EXPECT_EQ(kind_of_error([&] { log(Tensor::randint({3}, gen, 1, 5)); }), ErrorKind::InvalidArgument);
  EXPECT_EQ(kind_of_error([&] { call(OpId::Neg, {x, x}); }), ErrorKind::InvalidArgument);
  EXPECT_EQ(kind_of_error([&] { call(OpId::Gelu, {x}, {{"approx", 1.0}}); }),
            ErrorKind::InvalidArgument);
  EXPECT_EQ(kind_of_error([&] { add(randn({3, 4}), randn({5})); }), ErrorKind::InvalidArgument);
}

}  // namespace
}  // namespace kiln
