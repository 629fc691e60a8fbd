// SymInt: a dimension that is either a concrete int64 or a handle to a symbolic expression.
//
// Note [SymInt encoding]
// A SymInt is one int64. Values >= kMinConcrete are plain integers, so concrete shapes cost
// exactly what int64 shapes cost: arithmetic on two concrete SymInts is one branch plus the op.
// Values below kMinConcrete encode the index of an interned expression in a process-wide table.
// Expressions are canonicalized before interning (sums of products with integer coefficients,
// terms sorted structurally; floordiv/mod/min/max simplified where provable), so two equal
// expressions get the same handle and equality is an integer comparison.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln {

class SymInt {
 public:
  static constexpr int64_t kMinConcrete = -(int64_t(1) << 62);

  constexpr SymInt() : v_(0) {}
  constexpr SymInt(int64_t v) : v_(v) {}  // NOLINT: implicit from concrete ints by design
  constexpr SymInt(int v) : v_(v) {}      // NOLINT

  static SymInt symbol(std::string_view name);  // a free symbol, e.g. "batch"
  static SymInt from_raw(int64_t raw) { SymInt s; s.v_ = raw; return s; }

  constexpr bool is_symbolic() const { return v_ < kMinConcrete; }
  constexpr bool is_concrete() const { return v_ >= kMinConcrete; }
  // The concrete value; throws kiln::Error if symbolic.
  int64_t value() const {
    if (is_symbolic()) [[unlikely]] throw_symbolic();
    return v_;
  }
  // Concrete value or `fallback` when symbolic.
  constexpr int64_t value_or(int64_t fallback) const { return is_concrete() ? v_ : fallback; }
  constexpr int64_t raw() const { return v_; }

  friend constexpr bool operator==(SymInt a, SymInt b) { return a.v_ == b.v_; }
  friend constexpr bool operator!=(SymInt a, SymInt b) { return a.v_ != b.v_; }

  // Concrete results must stay concrete: a result below kMinConcrete (overflow) would read as
  // a symbolic handle, so it is an error instead.
  friend SymInt operator+(SymInt a, SymInt b) {
    int64_t r;
    if (a.is_concrete() && b.is_concrete()) [[likely]] {
      if (__builtin_add_overflow(a.v_, b.v_, &r) || r < kMinConcrete) [[unlikely]] throw_overflow();
      return SymInt(r);
    }
    return add_slow(a, b);
  }
  friend SymInt operator-(SymInt a, SymInt b) {
    int64_t r;
    if (a.is_concrete() && b.is_concrete()) [[likely]] {
      if (__builtin_sub_overflow(a.v_, b.v_, &r) || r < kMinConcrete) [[unlikely]] throw_overflow();
      return SymInt(r);
    }
    return add_slow(a, mul_slow(b, SymInt(-1)));
  }
  friend SymInt operator*(SymInt a, SymInt b) {
    int64_t r;
    if (a.is_concrete() && b.is_concrete()) [[likely]] {
      if (__builtin_mul_overflow(a.v_, b.v_, &r) || r < kMinConcrete) [[unlikely]] throw_overflow();
      return SymInt(r);
    }
    return mul_slow(a, b);
  }
  SymInt operator-() const { return SymInt(0) - *this; }
  SymInt& operator+=(SymInt o) { return *this = *this + o; }
  SymInt& operator*=(SymInt o) { return *this = *this * o; }

  // Floor division and modulo (Python semantics; divisor must be positive when concrete).
  friend SymInt floordiv(SymInt a, SymInt b);
  friend SymInt mod(SymInt a, SymInt b);
  friend SymInt sym_min(SymInt a, SymInt b);
  friend SymInt sym_max(SymInt a, SymInt b);

  std::string str() const;  // "3", "batch", "2*batch + 1", "(seq + 1)//2"

  // Free symbol names, sorted.
  std::vector<std::string> free_symbols() const;
  // Evaluates with the given symbol values; throws if a symbol is unbound.
  int64_t evaluate(const std::vector<std::pair<std::string, int64_t>>& bindings) const;

 private:
  [[noreturn]] void throw_symbolic() const;
  [[noreturn]] static void throw_overflow();
  static SymInt add_slow(SymInt a, SymInt b);
  static SymInt mul_slow(SymInt a, SymInt b);
  int64_t v_;
};

// Parses a symbolic expression as printed by SymInt::str(): integers, identifiers, + - *, //, %,
// min(a, b), max(a, b), parentheses. Throws kiln::Error (ParseError) with position on failure.
SymInt parse_symint(std::string_view text);

}  // namespace kiln
