// The index_select case of the status-record tests (compiled_cuda_test.cc, cuda_package_test.cc):
// relu(index_select(x [5, 3], 0, idx [4])) with nodes 'pick.rows' and 'pick.relu', fresh x,
// indices in range (negative ones included) and indices with 7 out of range, and the words the
// reference (and the CPU's compiled index check, lower::index_check) fails with.
#pragma once
#include <algorithm>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "ir/graph.h"

namespace kiln::test {

inline Tensor ints_tensor(const Dims& d, std::vector<int64_t> v, DType dt) {
  Tensor t = Tensor::empty(d, DType::Int64);
  std::copy(v.begin(), v.end(), t.data<int64_t>());
  return t.to(dt);
}

struct PickRows {
  Graph g;
  Tensor x, good, bad;
  std::string expected;  // the error of a call with `bad`
};

inline PickRows pick_rows_case() {
  PickRows c;
  ValueId x = c.g.add_input("x", TensorType{DType::Float32, to_shape(Dims{5, 3})});
  ValueId idx = c.g.add_input("idx", TensorType{DType::Int64, to_shape(Dims{4})});
  ValueId y = c.g.add_node(OpId::IndexSelect, {x, idx}, {{"dim", int64_t(0)}}, "pick.rows")[0];
  c.g.outputs = {c.g.add_node(OpId::Relu, {y}, {}, "pick.relu")[0]};
  Generator gen(3);
  c.x = Tensor::randn({5, 3}, gen);
  c.good = ints_tensor({4}, {4, -5, 0, 2}, DType::Int64);
  c.bad = ints_tensor({4}, {4, 1, 7, 2}, DType::Int64);
  c.expected =
      "index_select 'pick.rows': index 7 is out of range for dim 0 of x of size 5 (valid range "
      "[-5, 4])";
  return c;
}

}  // namespace kiln::test
