// The IR text printer. The grammar is documented in ir/parser.h (Note [IR text]);
// print_graph(parse_graph(print_graph(g))) is byte-identical to print_graph(g).
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "ir/graph.h"

namespace kiln {

struct PrintOptions {
  // Consts with more elements print as a declaration only (`const %table: f32[4096]`): their
  // values are elided, and parsing such text gives a const without data (the interpreter then
  // refuses to run it). -1 prints every const inline.
  int64_t max_inline_const_elements = 256;
};

std::string print_graph(const Graph& g, const PrintOptions& options = {});

// One node as printed inside a graph, without indentation or newline:
// `%y = relu(%x) : f32[2, 3] loc("act")`. Used by error messages and explain tools.
std::string print_node(const Graph& g, const Node& node);

// `%name`, or `%"odd name"` when the name is not made of letters, digits, '_' and '.'.
std::string value_ref(const Graph& g, ValueId v);
std::string value_ref_name(std::string_view name);
// True when `name` prints without quotes.
bool is_plain_ir_name(std::string_view name);
// A double-quoted string literal with \" \\ \n \t \r and \xNN escapes.
std::string quote_ir_string(std::string_view s);

}  // namespace kiln
