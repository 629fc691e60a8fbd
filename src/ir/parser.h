// The IR text parser. See Note [IR text]; docs/ir.md has more examples.
//
// Note [IR text]
// One graph per text:
//
//   graph @main(%x: f32[batch, 3, 32, 32], %bias: f32[8] @cuda:0) {
//     param %conv.weight: f32[8, 3, 3, 3]              // weights are never printed
//     const %scale: f32[2] = [0.5, -inf]                // small consts inline
//     const %table: f32[4096]                           // large const: values elided
//     %c = conv2d(%x, %conv.weight, _) {padding=[1, 1]} : f32[batch, 8, 32, 32] loc("stem.conv1")
//     %a, %b = split(%c) {dim=1, sizes=[4, 4]} : f32[batch, 4, 32, 32], f32[batch, 4, 32, 32]
//     return %a, %b
//   }
//
// Grammar (whitespace and comments — `//` or `#` to end of line — between any two tokens):
//   graph     := 'graph' '@' name '(' [input (',' input)*] ')' '{' stmt* return '}'
//   input     := value ':' type
//   stmt      := 'param' value ':' type
//              | 'const' value ':' type ['=' '[' [element (',' element)*] ']']
//              | value (',' value)* '=' opname '(' [operand (',' operand)*] ')'
//                  ['{' [attr (',' attr)*] '}'] [':' type (',' type)*] ['loc' '(' string ')']
//   return    := 'return' [value (',' value)*]
//   operand   := value | '_'                        (`_`: an absent optional input)
//   value     := '%' name        name := [A-Za-z0-9_.]+ | string
//   type      := dtype '[' [dim (',' dim)*] ']' ['strides' '[' dim (',' dim)* ']'] ['@' device]
//   dim       := a SymInt expression as SymInt::str prints it: 3, batch, 2*n + 1, (s + 1)//2,
//                min(a, b). Inside an expression `//` followed by a non-blank is floor division;
//                `//` followed by a blank starts a comment.
//   attr      := ident '=' attrvalue
//   attrvalue := int (a SymInt expression) | float (1.5, 1e-05, inf, -inf, nan) | true | false
//              | string | dtype (f32, i64, ...) | none | '[' [scalar (',' scalar)*] ']'
//   element   := a number of the const's dtype (floats as above; true/false for bool),
//                all elements flat in row-major order; a 0-d const has one.
//   string    := '"' chars '"' with escapes \" \\ \n \t \r \xNN
//
// The printer emits inputs, then params and consts, then nodes in order, only attributes that
// differ from their defaults, and no trailing `_` operands (they mean the same as none). The
// node's `: type` annotation is optional when parsing (inferred) but checked against inference
// when present. Types, attributes and arity are checked exactly as add_node checks them. Floats
// print as the shortest text that parses back to the same bits (NaN payloads and signs are not
// preserved: every NaN prints as `nan`). Attribute `inf`/`nan` are floats, so symbols cannot be
// named inf or nan.
//
// Errors are kiln::Error (ParseError for syntax, the registry's kind for semantic errors),
// prefixed with `source:line:column:` and saying what was expected and what was found.
#pragma once
#include <string_view>

#include "ir/graph.h"

namespace kiln {

// Parses one graph. `source_name` names the text in errors ("model.kir", "<stdin>").
Graph parse_graph(std::string_view text, std::string_view source_name = "<input>");
// The same with every device annotation read as the host's (`@cuda:0` is checked, then taken as
// cpu): the graph of a package built on a GPU, remade on any machine (compiler/replace_weights).
Graph parse_graph_on_host(std::string_view text, std::string_view source_name = "<input>");

// Parses a TensorType as printed by TensorType::str ("f32[1, n] @cuda:0").
TensorType parse_tensor_type(std::string_view text);

}  // namespace kiln
