// A small FileCheck for IR tests: CHECK lines in comments, matched against printed IR.
//
// Directives (in `//` or `#` comments): CHECK, CHECK-NEXT (on the line after the previous
// match), CHECK-SAME (on the same line, after the previous match), CHECK-NOT (absent between
// the previous match and the next one, or the end), CHECK-LABEL (splits the output into
// blocks; the checks after a label are confined to its block). Patterns match within one line;
// runs of blanks match any run of blanks; `{{regex}}` embeds an ECMAScript regex.
#pragma once
#include <string>
#include <string_view>
#include <vector>

namespace kiln::test {

struct CheckDirective {
  enum Kind { Check, Next, Same, Not, Label } kind;
  std::string pattern;
  int line;  // 1-based line of the directive in the test text
};

// Finds the directives in `text`; line numbers are offset by `first_line - 1`. A misspelled
// directive ("CHECK-NXT:") or an empty pattern is reported in `*error`.
std::vector<CheckDirective> parse_check_directives(std::string_view text, int first_line,
                                                   std::string* error);

// Matches `output` against the directives. Returns "" on success, else a message naming the
// failing directive's line, what it looked for and where.
std::string filecheck(std::string_view output, const std::vector<CheckDirective>& checks);

}  // namespace kiln::test
