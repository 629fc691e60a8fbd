#include "core/symint.h"

#include <algorithm>
#include <cctype>
#include <deque>
#include <map>
#include <mutex>
#include <unordered_map>

#include "core/error.h"

namespace kiln {
namespace {

enum class Kind { Symbol, Poly, FloorDiv, Mod, Min, Max };

// A monomial is a sorted list of atom handles (raw SymInt values of non-polynomial expressions).
using Monomial = std::vector<int64_t>;
struct Term {
  Monomial mono;
  int64_t coef;
};

struct Expr {
  Kind kind;
  std::string name;          // Symbol
  std::vector<Term> terms;   // Poly
  int64_t constant = 0;      // Poly
  int64_t a = 0, b = 0;      // binary atoms (raw SymInts)
  std::string repr;          // canonical printed form
};

struct Table {
  std::mutex mu;
  std::deque<Expr> exprs;
  std::unordered_map<std::string, int64_t> index;  // key -> raw handle
};

Table& table() {
  static Table* t = new Table();  // never destroyed: handles live as long as the process
  return *t;
}

constexpr int64_t kBase = INT64_MIN;

const Expr& expr_locked(Table& t, int64_t raw) { return t.exprs[size_t(raw - kBase)]; }

std::string repr_locked(Table& t, int64_t raw) {
  if (raw >= SymInt::kMinConcrete) return std::to_string(raw);
  return expr_locked(t, raw).repr;
}

int64_t intern_locked(Table& t, const std::string& key, Expr e) {
  auto it = t.index.find(key);
  if (it != t.index.end()) return it->second;
  int64_t raw = kBase + int64_t(t.exprs.size());
  KILN_ASSERT(raw < SymInt::kMinConcrete);
  t.exprs.push_back(std::move(e));
  t.index.emplace(key, raw);
  return raw;
}


// Wraps a sub-expression in parentheses when printing it as an operand of //, %, *.
std::string operand_locked(Table& t, int64_t raw) {
  std::string r = repr_locked(t, raw);
  if (raw >= SymInt::kMinConcrete) return raw < 0 ? "(" + r + ")" : r;
  Kind k = expr_locked(t, raw).kind;
  if (k == Kind::Symbol || k == Kind::Min || k == Kind::Max) return r;
  return "(" + r + ")";
}

std::string mono_repr_locked(Table& t, const Monomial& m) {
  std::string s;
  for (size_t i = 0; i < m.size(); ++i) {
    if (i) s += "*";
    const Expr& e = expr_locked(t, m[i]);
    bool paren = (e.kind == Kind::FloorDiv || e.kind == Kind::Mod) && m.size() > 1;
    s += paren ? "(" + e.repr + ")" : e.repr;
  }
  return s;
}

struct Poly {
  int64_t constant = 0;
  std::map<Monomial, int64_t> terms;  // ordering fixed by canonicalize
};

Poly to_poly_locked(Table& t, int64_t raw) {
  Poly p;
  if (raw >= SymInt::kMinConcrete) {
    p.constant = raw;
    return p;
  }
  const Expr& e = expr_locked(t, raw);
  if (e.kind == Kind::Poly) {
    p.constant = e.constant;
    for (const Term& term : e.terms) {
      Monomial m = term.mono;  // map keys use raw order; display order is fixed later
      std::sort(m.begin(), m.end());
      p.terms[m] += term.coef;
    }
  } else {
    p.terms[Monomial{raw}] = 1;
  }
  return p;
}

// Canonicalizes and interns a polynomial; returns a raw handle (or a concrete value).
int64_t make_poly_locked(Table& t, const Poly& p) {
  std::vector<std::pair<std::string, Term>> terms;
  for (auto& [mono, coef] : p.terms) {
    if (coef == 0) continue;
    Monomial m = mono;
    std::sort(m.begin(), m.end(), [&](int64_t x, int64_t y) {
      return expr_locked(t, x).repr < expr_locked(t, y).repr;
    });
    terms.push_back({mono_repr_locked(t, m), Term{m, coef}});
  }
  if (terms.empty()) return p.constant;
  if (terms.size() == 1 && p.constant == 0 && terms[0].second.coef == 1 &&
      terms[0].second.mono.size() == 1)
    return terms[0].second.mono[0];
  std::sort(terms.begin(), terms.end(), [](const auto& x, const auto& y) {
    if (x.second.mono.size() != y.second.mono.size())
      return x.second.mono.size() > y.second.mono.size();
    return x.first < y.first;
  });
  Expr e;
  e.kind = Kind::Poly;
  e.constant = p.constant;
  std::string r;
  for (size_t i = 0; i < terms.size(); ++i) {
    int64_t c = terms[i].second.coef;
    std::string m = terms[i].first;
    // k*(a//b) must not print as k*a//b, which parses as (k*a)//b; same for -(a//b).
    const Monomial& mono = terms[i].second.mono;
    if (c != 1 && mono.size() == 1) {
      Kind k = expr_locked(t, mono[0]).kind;
      if (k == Kind::FloorDiv || k == Kind::Mod) m = "(" + m + ")";
    }
    if (i == 0) {
      if (c == 1) r += m;
      else if (c == -1) r += "-" + m;
      else r += std::to_string(c) + "*" + m;
    } else {
      r += c < 0 ? " - " : " + ";
      int64_t ac = c < 0 ? -c : c;
      if (ac != 1) r += std::to_string(ac) + "*";
      r += m;
    }
    e.terms.push_back(terms[i].second);
  }
  if (p.constant > 0) r += " + " + std::to_string(p.constant);
  if (p.constant < 0) r += " - " + std::to_string(-p.constant);
  e.repr = r;
  std::string key = "P:" + r;
  return intern_locked(t, key, std::move(e));
}

int64_t py_floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}
int64_t py_mod(int64_t a, int64_t b) {
  int64_t m = a % b;
  if (m != 0 && ((m < 0) != (b < 0))) m += b;
  return m;
}

bool all_divisible(const Poly& p, int64_t d) {
  if (p.constant % d != 0) return false;
  for (auto& [m, c] : p.terms)
    if (c % d != 0) return false;
  return true;
}

int64_t make_binary_locked(Table& t, Kind k, int64_t a, int64_t b) {
  Expr e;
  e.kind = k;
  e.a = a;
  e.b = b;
  const char* op = k == Kind::FloorDiv ? "//" : k == Kind::Mod ? "%" : nullptr;
  if (op) {
    e.repr = operand_locked(t, a) + op + operand_locked(t, b);
  } else {
    e.repr = std::string(k == Kind::Min ? "min(" : "max(") + repr_locked(t, a) + ", " +
             repr_locked(t, b) + ")";
  }
  std::string key = "B:" + e.repr;  // before e is moved into the by-value parameter
  return intern_locked(t, key, std::move(e));
}

int64_t eval_locked(Table& t, int64_t raw,
                    const std::vector<std::pair<std::string, int64_t>>& bindings) {
  if (raw >= SymInt::kMinConcrete) return raw;
  const Expr& e = expr_locked(t, raw);
  switch (e.kind) {
    case Kind::Symbol:
      for (auto& [n, v] : bindings)
        if (n == e.name) return v;
      fail("symbol '{}' has no value bound", e.name);
    case Kind::Poly: {
      int64_t s = e.constant;
      for (const Term& term : e.terms) {
        int64_t p = term.coef;
        for (int64_t atom : term.mono) p *= eval_locked(t, atom, bindings);
        s += p;
      }
      return s;
    }
    case Kind::FloorDiv: {
      int64_t b = eval_locked(t, e.b, bindings);
      KILN_CHECK(b != 0, "division by zero evaluating '{}'", e.repr);
      return py_floordiv(eval_locked(t, e.a, bindings), b);
    }
    case Kind::Mod: {
      int64_t b = eval_locked(t, e.b, bindings);
      KILN_CHECK(b != 0, "modulo by zero evaluating '{}'", e.repr);
      return py_mod(eval_locked(t, e.a, bindings), b);
    }
    case Kind::Min: return std::min(eval_locked(t, e.a, bindings), eval_locked(t, e.b, bindings));
    case Kind::Max: return std::max(eval_locked(t, e.a, bindings), eval_locked(t, e.b, bindings));
  }
  return 0;
}

void collect_symbols_locked(Table& t, int64_t raw, std::vector<std::string>& out) {
  if (raw >= SymInt::kMinConcrete) return;
  const Expr& e = expr_locked(t, raw);
  switch (e.kind) {
    case Kind::Symbol: out.push_back(e.name); return;
    case Kind::Poly:
      for (const Term& term : e.terms)
        for (int64_t atom : term.mono) collect_symbols_locked(t, atom, out);
      return;
    default:
      collect_symbols_locked(t, e.a, out);
      collect_symbols_locked(t, e.b, out);
  }
}

}  // namespace

void SymInt::throw_symbolic() const {
  fail("expected a concrete size but got the symbolic expression '{}'; specialize the shape "
       "(bind its symbols) before running",
       str());
}

void SymInt::throw_overflow() {
  fail("integer overflow in size arithmetic (sizes must stay within +-2^62)");
}

SymInt SymInt::symbol(std::string_view name) {
  KILN_CHECK(!name.empty() && (std::isalpha((unsigned char)name[0]) || name[0] == '_'),
             "invalid symbol name '{}': must start with a letter or '_'", name);
  for (char c : name)
    KILN_CHECK(std::isalnum((unsigned char)c) || c == '_',
               "invalid symbol name '{}': only letters, digits and '_' are allowed", name);
  KILN_CHECK(name != "min" && name != "max", "'{}' is reserved and cannot name a symbol", name);
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  Expr e;
  e.kind = Kind::Symbol;
  e.name = std::string(name);
  e.repr = e.name;
  std::string key = "S:" + e.name;  // before e is moved into the by-value parameter
  return from_raw(intern_locked(t, key, std::move(e)));
}

SymInt SymInt::add_slow(SymInt a, SymInt b) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  Poly p = to_poly_locked(t, a.v_);
  Poly q = to_poly_locked(t, b.v_);
  p.constant += q.constant;
  for (auto& [m, c] : q.terms) p.terms[m] += c;
  return from_raw(make_poly_locked(t, p));
}

SymInt SymInt::mul_slow(SymInt a, SymInt b) {
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  Poly p = to_poly_locked(t, a.v_);
  Poly q = to_poly_locked(t, b.v_);
  Poly r;
  r.constant = p.constant * q.constant;
  for (auto& [m, c] : p.terms) r.terms[m] += c * q.constant;
  for (auto& [m, c] : q.terms) r.terms[m] += c * p.constant;
  for (auto& [m1, c1] : p.terms)
    for (auto& [m2, c2] : q.terms) {
      Monomial m = m1;
      m.insert(m.end(), m2.begin(), m2.end());
      std::sort(m.begin(), m.end());
      r.terms[m] += c1 * c2;
    }
  // Canonical order of atoms inside each monomial is fixed in make_poly_locked; the map key
  // uses raw-sorted atoms so that equal monomials merge.
  Poly merged;
  merged.constant = r.constant;
  for (auto& [m, c] : r.terms) {
    Monomial k = m;
    std::sort(k.begin(), k.end());
    merged.terms[k] += c;
  }
  return from_raw(make_poly_locked(t, merged));
}

SymInt floordiv(SymInt a, SymInt b) {
  if (a.is_concrete() && b.is_concrete()) {
    KILN_CHECK(b.v_ != 0, "floordiv by zero");
    return SymInt(py_floordiv(a.v_, b.v_));
  }
  if (b == SymInt(1)) return a;
  if (a == SymInt(0)) return a;
  if (a == b) return SymInt(1);
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  if (b.is_concrete() && b.v_ > 0) {
    Poly p = to_poly_locked(t, a.v_);
    if (all_divisible(p, b.v_)) {
      p.constant /= b.v_;
      for (auto& [m, c] : p.terms) c /= b.v_;
      return SymInt::from_raw(make_poly_locked(t, p));
    }
  }
  return SymInt::from_raw(make_binary_locked(t, Kind::FloorDiv, a.v_, b.v_));
}

SymInt mod(SymInt a, SymInt b) {
  if (a.is_concrete() && b.is_concrete()) {
    KILN_CHECK(b.v_ != 0, "modulo by zero");
    return SymInt(py_mod(a.v_, b.v_));
  }
  if (b == SymInt(1) || a == b || a == SymInt(0)) return SymInt(0);
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  if (b.is_concrete() && b.v_ > 0 && all_divisible(to_poly_locked(t, a.v_), b.v_)) return SymInt(0);
  return SymInt::from_raw(make_binary_locked(t, Kind::Mod, a.v_, b.v_));
}

static SymInt minmax(SymInt a, SymInt b, bool is_min) {
  if (a.is_concrete() && b.is_concrete())
    return SymInt(is_min ? std::min(a.raw(), b.raw()) : std::max(a.raw(), b.raw()));
  if (a == b) return a;
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  int64_t x = a.raw(), y = b.raw();
  if (repr_locked(t, y) < repr_locked(t, x)) std::swap(x, y);  // commutative: canonical order
  return SymInt::from_raw(make_binary_locked(t, is_min ? Kind::Min : Kind::Max, x, y));
}
SymInt sym_min(SymInt a, SymInt b) { return minmax(a, b, true); }
SymInt sym_max(SymInt a, SymInt b) { return minmax(a, b, false); }

std::string SymInt::str() const {
  if (is_concrete()) return std::to_string(v_);
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  return expr_locked(t, v_).repr;
}

std::vector<std::string> SymInt::free_symbols() const {
  std::vector<std::string> out;
  if (is_concrete()) return out;
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  collect_symbols_locked(t, v_, out);
  std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

int64_t SymInt::evaluate(const std::vector<std::pair<std::string, int64_t>>& bindings) const {
  if (is_concrete()) return v_;
  Table& t = table();
  std::lock_guard<std::mutex> lock(t.mu);
  return eval_locked(t, v_, bindings);
}

// ---- parser -----------------------------------------------------------------------------------
namespace {
struct SymParser {
  std::string_view s;
  size_t pos = 0;

  [[noreturn]] void error(const std::string& what) {
    fail_kind(ErrorKind::ParseError, "cannot parse symbolic size '{}' at column {}: {}", s,
              pos + 1, what);
  }
  void skip() {
    while (pos < s.size() && s[pos] == ' ') ++pos;
  }
  bool eat(std::string_view tok) {
    skip();
    if (s.substr(pos, tok.size()) == tok) {
      pos += tok.size();
      return true;
    }
    return false;
  }
  SymInt expr() {
    SymInt v = term();
    for (;;) {
      if (eat("+")) v = v + term();
      else if (eat("-")) v = v - term();
      else return v;
    }
  }
  SymInt term() {
    SymInt v = unary();
    for (;;) {
      if (eat("//")) v = floordiv(v, unary());
      else if (eat("*")) v = v * unary();
      else if (eat("%")) v = mod(v, unary());
      else return v;
    }
  }
  SymInt unary() {
    if (eat("-")) return SymInt(0) - unary();
    return primary();
  }
  SymInt primary() {
    skip();
    if (pos >= s.size()) error("unexpected end");
    char c = s[pos];
    if (c == '(') {
      ++pos;
      SymInt v = expr();
      if (!eat(")")) error("expected ')'");
      return v;
    }
    if (std::isdigit((unsigned char)c)) {
      int64_t v = 0;
      while (pos < s.size() && std::isdigit((unsigned char)s[pos])) {
        if (v > (INT64_MAX - 9) / 10) error("integer too large");
        v = v * 10 + (s[pos++] - '0');
      }
      return SymInt(v);
    }
    if (std::isalpha((unsigned char)c) || c == '_') {
      size_t start = pos;
      while (pos < s.size() && (std::isalnum((unsigned char)s[pos]) || s[pos] == '_')) ++pos;
      std::string_view name = s.substr(start, pos - start);
      if (name == "min" || name == "max") {
        if (!eat("(")) error("expected '(' after " + std::string(name));
        SymInt a = expr();
        if (!eat(",")) error("expected ','");
        SymInt b = expr();
        if (!eat(")")) error("expected ')'");
        return name == "min" ? sym_min(a, b) : sym_max(a, b);
      }
      return SymInt::symbol(name);
    }
    error(std::string("unexpected character '") + c + "'");
  }
};
}  // namespace

SymInt parse_symint(std::string_view text) {
  SymParser p{text};
  SymInt v = p.expr();
  p.skip();
  if (p.pos != text.size()) p.error("unexpected trailing text");
  return v;
}

}  // namespace kiln
