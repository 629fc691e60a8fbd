// GraphBuilder: the one way passes rewrite a graph. See Note [Graph rewriting].
//
// Note [Graph rewriting]
// Values are referred to by index, so a pass cannot delete or replace a node in place without
// invalidating every later index. Instead a pass copies the graph node by node into a new one
// through a GraphBuilder, which keeps the map old value -> new value:
//   - the new graph starts with the old graph's name and inputs (same names, types, order) and
//     its params and consts in declaration order, except those the pass asks to drop;
//   - for each old node, in order, the pass either copies it (copy_node: inputs remapped, same
//     op, attributes, provenance and output names), or emits replacement nodes and maps the old
//     outputs to new values (set_map), or drops it (its outputs must then be unused or mapped);
//   - finish() remaps the graph outputs and returns the new graph.
// Every node is re-added through Graph::add_node, so types are re-inferred and a rewrite that
// breaks typing fails at the node that broke it. Names are kept: copied values keep theirs; a
// replacement may take the exact name of the old value it stands for (e.g. a folded const takes
// the name of the node output it replaces); other new values get fresh names that collide with
// no value of either graph. Printing the result therefore reads like the input with the
// rewritten lines changed, which is what the pass tests' CHECK lines rely on.
//
// Rewrite rules inspect the *new* graph (producer_of on new ids): by the time a node is visited,
// its inputs have been rewritten, so chains simplify in one sweep (neg(neg(neg(neg(x))))).
#pragma once
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"

namespace kiln {

class GraphBuilder {
 public:
  // Starts the copy. `keep_param(old_id)` decides which params and consts are copied (all when
  // empty); a dropped one must not be used unless the pass maps it with set_map.
  explicit GraphBuilder(const Graph& src, std::function<bool(ValueId)> keep_param = {});

  const Graph& src() const { return src_; }
  Graph& dst() { return dst_; }
  const Graph& dst() const { return dst_; }

  // The new id of an old value; kNoValue stays kNoValue. An old value that was neither copied
  // nor mapped is an Internal error (a pass dropped a node whose output is still used).
  ValueId map(ValueId old) const;
  std::vector<ValueId> map(const std::vector<ValueId>& olds) const;
  bool is_mapped(ValueId old) const;
  // From now on, uses of `old` refer to `now` (a new-graph value).
  void set_map(ValueId old, ValueId now);

  // Copies an old node unchanged (inputs remapped); its outputs keep their names.
  void copy_node(const Node& old);
  // Adds a node over new-graph inputs. Output names: `output_names[i]` exactly when given and
  // non-empty (the name must be free in the new graph: typically the name of the old value the
  // output replaces), otherwise fresh names derived from `name_hint` (or the op name).
  std::vector<ValueId> add_node(OpId op, std::vector<ValueId> inputs, const Attrs& attrs,
                                std::string node_name, std::vector<std::string> output_names = {},
                                std::string_view name_hint = "");
  ValueId add_node1(OpId op, std::vector<ValueId> inputs, const Attrs& attrs,
                    std::string node_name, std::string output_name = "",
                    std::string_view name_hint = "");
  // New params and consts. `exact_name` as for add_node; empty: a fresh name from `hint`.
  ValueId add_const(Tensor data, std::string exact_name, std::string_view hint = "const");
  ValueId add_param(Tensor data, std::string exact_name, std::string_view hint = "param");
  // A weight derived from old-graph value `from` (a param or const with data: has_data), as a
  // param when `from` is one (so that replace-weights derives it again from new weights),
  // else a const; named `<from's name><suffix>` (fresh).
  ValueId add_derived(const Value& from, Tensor data, std::string_view suffix);

  // A name used by no value of the old graph and none of the new one: "base", "base_1", ...
  std::string fresh_name(std::string_view base);

  // The node of the new graph that produces `v`, or nullptr for inputs, params and consts.
  const Node* producer_of(ValueId v) const;
  // Data of a new-graph const or param (undefined for other values and data-less params).
  Tensor data_of(ValueId v) const;

  // Remaps the graph outputs and returns the new graph. The builder is spent afterwards.
  Graph finish();

 private:
  void name_outputs(const std::vector<ValueId>& outs, const std::vector<std::string>& names,
                    std::string_view hint, OpId op);
  std::string fresh_name_for(std::string_view base, ValueId self);

  const Graph& src_;
  Graph dst_;
  std::vector<ValueId> map_;  // old id -> new id (kNoValue: not copied / not mapped yet)
};

// Uses of every value by nodes that are live (transitively reach a graph output) plus graph
// outputs. Passes that require "the only use" count with this, so that dead code left behind
// by an earlier pass (before dce runs) does not block a rewrite.
std::vector<int> live_use_counts(const Graph& g);
// Which nodes are live (some output transitively reaches a graph output).
std::vector<bool> live_nodes(const Graph& g);

// Whether the int attributes of `attrs` are all concrete (no symbolic SymInt raw values).
bool attrs_concrete(const Attrs& attrs);

// Whether every element of `v` is x (a convolution's stride, padding or dilation).
bool all_equal(const Ints& v, int64_t x);

// Whether node n is a conv2d that a pass may rewrite as a GEMM: x and w of rank 4 with concrete
// shapes, x floating and w of its dtype, one output, groups 1, no padding, dilation 1
// (patch-conv-to-linear, one-window-conv-to-linear).
bool plain_conv2d(const Graph& g, const Node& n);

// Whether `v` is a param or const whose data a pass can transform at compile time.
bool has_data(const Value& v);

// The node of g that produces `v`, or nullptr for inputs, params, consts and invalid ids.
const Node* producer_of(const Graph& g, ValueId v);

// The data of const `v` of g as a contiguous float64 host tensor; undefined when v is not a
// const with data (params are left out: replace-weights may change them).
Tensor const_data_f64(const Graph& g, ValueId v);

}  // namespace kiln
