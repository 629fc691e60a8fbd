// Fuzzes the ONNX importer (frontends/onnx/importer.h) from the bytes of a ModelProto: any bytes
// are either a graph or a kiln::Error. An imported graph must pass the verifier and its text
// must parse back. External data is not allowed (model_dir ""), and the tensor limit is lowered
// so that a file cannot make the importer allocate more than a fuzzing process may.
#include <cstddef>
#include <cstdint>
#include <string>

#include "core/error.h"
#include "frontends/onnx/importer.h"
#include "fuzz_util.h"
#include "ir/parser.h"
#include "ir/printer.h"
#include "ir/verifier.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kiln;
  ImportOptions options;
  options.max_tensor_bytes = int64_t(64) << 20;
  Graph g;
  try {
    g = import_onnx_bytes(std::string_view(reinterpret_cast<const char*>(data), size), "",
                          "fuzz.onnx", options);
  } catch (const Error&) {
    return 0;
  }
  std::vector<std::string> problems = verify_problems(g);
  if (!problems.empty()) fuzz::finding("imported graph fails the verifier", problems.front());
  std::string printed = print_graph(g);
  try {
    parse_graph(printed, "imported.kir");
  } catch (const Error& e) {
    fuzz::finding("imported graph's text does not parse", std::string(e.what()) + "\n" + printed);
  }
  return 0;
}
