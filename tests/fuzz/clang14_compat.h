// Force-included (-include) into every file of a clang fuzz build (tests/fuzz/CMakeLists.txt).
//
// libstdc++ 12's <source_location> defines std::source_location only when the compiler has
// __builtin_source_location (GCC 11+, clang 15+). clang 14 lacks it but has the older
// __builtin_FILE/__builtin_FUNCTION/__builtin_LINE/__builtin_COLUMN, which are enough for the
// members Kiln uses. The whole fuzz build sees this one definition, so no object mixes two
// layouts; the g++ builds never include this file. current() is constexpr, not consteval:
// clang 14 rejects a consteval call in some default arguments ("cannot take address of
// consteval function"), and the builtins are evaluated at the outermost call site either way.
#pragma once
#if defined(__clang__) && !__has_builtin(__builtin_source_location)
#define _GLIBCXX_SRCLOC 1  // the include guard of libstdc++'s <source_location>: skip it
#include <cstdint>
namespace std {
struct source_location {
  static constexpr source_location current(const char* file = __builtin_FILE(),
                                           const char* function = __builtin_FUNCTION(),
                                           unsigned line = __builtin_LINE(),
                                           unsigned column = __builtin_COLUMN()) noexcept {
    source_location loc;
    loc.file_ = file;
    loc.function_ = function;
    loc.line_ = line;
    loc.column_ = column;
    return loc;
  }
  constexpr source_location() noexcept = default;
  constexpr uint_least32_t line() const noexcept { return line_; }
  constexpr uint_least32_t column() const noexcept { return column_; }
  constexpr const char* file_name() const noexcept { return file_; }
  constexpr const char* function_name() const noexcept { return function_; }

 private:
  const char* file_ = "";
  const char* function_ = "";
  uint_least32_t line_ = 0;
  uint_least32_t column_ = 0;
};
}  // namespace std
#endif
