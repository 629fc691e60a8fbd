// kiln::Error: every user-facing failure. The message names the place (node, input, call site)
// and, where possible, what would fix it.
#pragma once
#include <exception>
#include <string>

#include <fmt/core.h>

namespace kiln {

enum class ErrorKind {
  InvalidArgument,  // bad shapes, dtypes, attributes from the caller
  NotSupported,     // valid request Kiln cannot do (unsupported op, dtype, device)
  ParseError,       // malformed IR text, model file, JSON
  Runtime,          // failure while running (device, library)
  Internal,         // a Kiln bug: an invariant did not hold
};

class Error : public std::exception {
 public:
  Error(ErrorKind kind, std::string message) : kind_(kind), message_(std::move(message)) {}
  const char* what() const noexcept override { return message_.c_str(); }
  ErrorKind kind() const { return kind_; }
  const std::string& message() const { return message_; }

 private:
  ErrorKind kind_;
  std::string message_;
};

[[noreturn]] void throw_error(ErrorKind kind, std::string message);

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw_error(ErrorKind::InvalidArgument, fmt::format(f, std::forward<Args>(args)...));
}
template <typename... Args>
[[noreturn]] void fail_kind(ErrorKind kind, fmt::format_string<Args...> f, Args&&... args) {
  throw_error(kind, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace kiln

// KILN_CHECK(cond, "fmt", args...): InvalidArgument error when cond is false.
#define KILN_CHECK(cond, ...)                  \
  do {                                         \
    if (!(cond)) [[unlikely]] ::kiln::fail(__VA_ARGS__); \
  } while (0)

// KILN_ASSERT: an internal invariant; failure is a Kiln bug, reported with file and line.
#define KILN_ASSERT(cond)                                                                       \
  do {                                                                                          \
    if (!(cond)) [[unlikely]]                                                                   \
      ::kiln::throw_error(::kiln::ErrorKind::Internal,                                          \
                          ::fmt::format("internal error: {} at {}:{}", #cond, __FILE__, __LINE__)); \
  } while (0)
