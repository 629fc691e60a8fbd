// Fuzzes the IR text parser (ir/parser.h): any text is either a graph or a kiln::Error. An
// accepted graph must pass the verifier, and print -> parse -> print must reproduce the text
// exactly (Note [IR text]: the printed form round-trips).
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "fuzz_util.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  Graph g;
  try {
    g = parse_graph(text, "fuzz.kir");
  } catch (const Error&) {
    return 0;
  }
  std::vector<std::string> problems = verify_problems(g);
  if (!problems.empty()) fuzz::finding("parsed graph fails the verifier", problems.front());
  PrintOptions all_inline;
  all_inline.max_inline_const_elements = -1;
  std::string printed = print_graph(g, all_inline);
  std::string reprinted;
  try {
    reprinted = print_graph(parse_graph(printed, "printed.kir"), all_inline);
  } catch (const Error& e) {
    fuzz::finding("printed graph does not parse", std::string(e.what()) + "\n" + printed);
  }
  if (reprinted != printed)
    fuzz::finding("print(parse(print(g))) differs from print(g)", printed + "\n---\n" + reprinted);
  return 0;
}
