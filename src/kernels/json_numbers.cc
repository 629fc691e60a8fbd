#include "kernels/json_numbers.h"

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

namespace kiln::kernels {

nlohmann::json parse_untrusted_json(std::string_view text) {
  nlohmann::json j = nlohmann::json::parse(text);
  // An explicit stack: the document's nesting is the file's choice.
  std::vector<const nlohmann::json*> todo = {&j};
  while (!todo.empty()) {
    const nlohmann::json* v = todo.back();
    todo.pop_back();
    if (v->is_number_float()) {
      const double x = v->get<double>();
      if (!std::isfinite(x) || std::fabs(x) >= 9007199254740992.0)  // 2^53
        throw std::out_of_range("a number in the JSON is out of range: " + v->dump());
    } else if (v->is_structured()) {
      for (const nlohmann::json& c : *v) todo.push_back(&c);
    }
  }
  return j;
}

}  // namespace kiln::kernels
