// JSON read from untrusted files (package manifests, launch records): nlohmann::json converts a
// floating-point number to an integer with a plain cast, which is undefined behaviour when the
// value is out of the integer's range (found by tests/fuzz/launch_record_fuzz.cc under UBSan:
// 2.2e79 read as int64). parse_untrusted_json parses and then refuses any floating-point number
// that no Kiln field holds: non-finite or of magnitude 2^53 or more (every integer field is
// written as a JSON integer; the floating fields — alpha, beta, attention scales — are small).
#pragma once
#include <string_view>

#include <nlohmann/json.hpp>

namespace kiln::kernels {

// json::parse, then the check above; throws std::out_of_range ("a number in the JSON is out of
// range: ...") or nlohmann's parse_error, which callers turn into their ParseError.
nlohmann::json parse_untrusted_json(std::string_view text);

}  // namespace kiln::kernels
