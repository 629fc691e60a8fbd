// The call's inputs in a captured graph's input order. Capture (capture/compile.cc) adds graph
// inputs in the order the traced code first uses them and names each `input<k>` after its
// position k in the call, so a test that feeds a captured graph directly must reorder: BERT's
// forward reads the attention mask before the token ids, and its graph takes the mask first.
#pragma once
#include <cstdint>
#include <string>

#include "core/error.h"
#include "core/tensor.h"
#include "ir/graph.h"

namespace kiln::test {

inline TensorList inputs_in_graph_order(const Graph& g, const TensorList& call_inputs) {
  TensorList out;
  for (ValueId v : g.inputs) {
    const std::string& name = g.value(v).name;
    size_t k = 0;
    bool named = name.rfind("input", 0) == 0 && name.size() > 5;
    for (size_t i = 5; named && i < name.size(); ++i) {
      named = name[i] >= '0' && name[i] <= '9';
      k = k * 10 + size_t(name[i] - '0');
    }
    KILN_CHECK(named && k < call_inputs.size(),
               "graph input '{}' is not one of the call's {} inputs", name, call_inputs.size());
    out.push_back(call_inputs[k]);
  }
  return out;
}

// Inputs for captured graph `g`: the call's own inputs (in graph order) when `g` is the whole of
// the call, else fresh ones of the graph's input types from `seed` (normal floats, 0/1
// integers: never all zeros).
inline TensorList graph_test_inputs(const Graph& g, const TensorList& call_inputs, bool whole_call,
                                    uint64_t seed) {
  if (whole_call && g.inputs.size() == call_inputs.size())
    return inputs_in_graph_order(g, call_inputs);
  TensorList in;
  Generator gen(seed);
  for (ValueId v : g.inputs) {
    const TensorType& t = g.type(v);
    Dims d;
    for (size_t i = 0; i < t.shape.size(); ++i) d.push_back(t.shape[i].value());
    in.push_back(is_floating(t.dtype) ? Tensor::randn(d, gen, t.dtype)
                                      : Tensor::randint(d, gen, 0, 2, t.dtype));
  }
  return in;
}

// g with every float value widened to float64: the float64 oracle sees the numbers the compiled
// graph sees. A cast to a floating dtype casts to float64 instead (BERT casts its mask to
// float32), so that the cast's result agrees with its widened value.
inline Graph as_float64(const Graph& g) {
  Graph h = g;
  for (Value& v : h.values) {
    if (!is_floating(v.type.dtype)) continue;
    v.type.dtype = DType::Float64;
    if (v.data.defined()) v.data = v.data.to(DType::Float64);
  }
  for (Node& n : h.nodes)
    if (n.op == OpId::Cast && is_floating(n.attrs.get_dtype("dtype")))
      n.attrs.set("dtype", DType::Float64);
  return h;
}

}  // namespace kiln::test
