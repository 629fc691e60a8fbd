// The work a compiled launch records (Note [Kernel work] in lower/cost.cc): the least arithmetic
// and traffic of a library kernel's node and of a fused loop kernel, which `kiln profile` divides
// the launch's measured time by. Each graph here compiles to launches whose work is known by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "compiler/compile.h"
#include "ir/graph.h"
#include "runtime/executable.h"

using namespace kiln;

namespace {

const Executable::Launch& only_launch(compiler::CompiledExecutable& c) {
  const Executable& exe = c.executable();
  EXPECT_EQ(exe.launches.size(), 1u) << c.summary();
  return exe.launches.at(0);
}

}  // namespace

// A convolution (a oneDNN kernel): 2 flops per multiply-add, every operand read once.
TEST(KernelWork, ConvolutionIsItsMultiplyAddsAndItsOperands) {
  Generator gen(11);
  Graph g;
  g.name = "conv";
  ValueId x = g.add_input("x", TensorType(DType::Float32, Shape{1, 8, 16, 16}));
  ValueId w = g.add_param("w", Tensor::randn({16, 8, 3, 3}, gen));
  ValueId b = g.add_param("b", Tensor::randn({16}, gen));
  g.outputs = {g.add_node1(OpId::Conv2d, {x, w, b}, {{"padding", Ints{1, 1}}}, "c")};
  auto c = compiler::compile(g, Device::cpu(), compiler::Options{});
  const Executable::Launch& l = only_launch(*c);
  EXPECT_EQ(l.flops, 2.0 * (16 * 16 * 16) * (8 * 3 * 3));
  EXPECT_EQ(l.bytes, 4.0 * (8 * 16 * 16 + 16 * 8 * 9 + 16 + 16 * 16 * 16));
  EXPECT_EQ(l.const_bytes, 4.0 * (16 * 8 * 9 + 16));  // the weight and the bias
  EXPECT_EQ(l.compute, DType::Float32);
}

// A bf16 linear runs at the bf16 rate.
TEST(KernelWork, Bf16LinearNamesItsComputeType) {
  Generator gen(12);
  Graph g;
  g.name = "linear";
  ValueId x = g.add_input("x", TensorType(DType::BFloat16, Shape{4, 64}));
  ValueId w = g.add_param("w", Tensor::randn({32, 64}, gen).to(DType::BFloat16));
  g.outputs = {g.add_node1(OpId::Linear, {x, w}, {}, "fc")};
  auto c = compiler::compile(g, Device::cpu(), compiler::Options{});
  const Executable& exe = c->executable();
  double flops = 0, bytes = 0;
  for (const Executable::Launch& l : exe.launches) {
    flops += l.flops;
    bytes += l.bytes;
    EXPECT_EQ(l.compute, DType::BFloat16) << l.name;
  }
  EXPECT_EQ(flops, 2.0 * 4 * 32 * 64) << c->summary();
  EXPECT_EQ(bytes, 2.0 * (4 * 64 + 32 * 64 + 4 * 32)) << c->summary();
}

// A pointwise loop kernel: a broadcast operand is read at its own size, not the output's.
TEST(KernelWork, BroadcastReadCountsItsOwnElements) {
  Generator gen(13);
  Graph g;
  g.name = "bias_relu";
  ValueId x = g.add_input("x", TensorType(DType::Float32, Shape{4, 32}));
  ValueId b = g.add_param("b", Tensor::randn({32}, gen));
  ValueId y = g.add_node1(OpId::Add, {x, b}, {}, "add");
  g.outputs = {g.add_node1(OpId::Relu, {y}, {}, "relu")};
  auto c = compiler::compile(g, Device::cpu(), compiler::Options{});
  const Executable::Launch& l = only_launch(*c);
  EXPECT_EQ(l.kind, "loop");
  EXPECT_EQ(l.bytes, 4.0 * (128 + 32 + 128));
  EXPECT_EQ(l.const_bytes, 4.0 * 32);
  EXPECT_EQ(l.flops, 2.0 * 128);  // the add and the relu, per element
}

// A softmax reads its input once (its second pass is not traffic a floor counts).
TEST(KernelWork, NormKernelReadsItsInputOnce) {
  Graph g;
  g.name = "softmax";
  ValueId x = g.add_input("x", TensorType(DType::Float32, Shape{6, 40}));
  g.outputs = {g.add_node1(OpId::Softmax, {x}, {{"dim", int64_t(-1)}}, "sm")};
  auto c = compiler::compile(g, Device::cpu(), compiler::Options{});
  const Executable::Launch& l = only_launch(*c);
  EXPECT_EQ(l.kind, "loop");
  EXPECT_EQ(l.bytes, 4.0 * (240 + 240));
  EXPECT_EQ(l.const_bytes, 0);
  EXPECT_EQ(l.flops, 240.0);
}

// An embedding reads the rows it gathers, not the whole table.
TEST(KernelWork, GatherCountsTheRowsItReads) {
  Generator gen(14);
  Graph g;
  g.name = "embedding";
  ValueId w = g.add_param("table", Tensor::randn({1000, 16}, gen));
  ValueId ids = g.add_input("ids", TensorType(DType::Int64, Shape{5}));
  g.outputs = {g.add_node1(OpId::Embedding, {w, ids}, {}, "emb")};
  auto c = compiler::compile(g, Device::cpu(), compiler::Options{});
  const Executable::Launch& l = only_launch(*c);
  EXPECT_EQ(l.kind, "loop");
  EXPECT_EQ(l.bytes, 4.0 * (5 * 16) + 8.0 * 5 + 4.0 * (5 * 16));
  EXPECT_EQ(l.const_bytes, 4.0 * (5 * 16));  // the gathered rows of the table
  EXPECT_EQ(l.flops, 80.0);
}
