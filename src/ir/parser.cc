#include "ir/parser.h"

#include <algorithm>
#include <charconv>
#include <cstring>
#include <unordered_map>

#include <fmt/format.h>

#include "ir/printer.h"

namespace kiln {
namespace {

bool is_ident_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_ident_char(char c) { return is_ident_start(c) || (c >= '0' && c <= '9'); }
bool is_name_char(char c) { return is_ident_char(c) || c == '.'; }

// Edit distance with transpositions (optimal string alignment) for "did you mean".
size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev2(b.size() + 1), prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])  // transposition
        cur[j] = std::min(cur[j], prev2[j - 2] + 1);
    }
    prev2 = prev;
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string near_op_names(std::string_view name) {
  std::vector<std::pair<size_t, std::string>> cands;
  for (const OpDef& d : all_ops()) {
    std::string_view n = d.name;
    size_t dist = edit_distance(name, n);
    bool related = dist <= std::max<size_t>(2, name.size() / 3) ||
                   (name.size() >= 3 && n.find(name) != std::string_view::npos) ||
                   (n.size() >= 3 && name.find(n) != std::string_view::npos);
    if (related) cands.emplace_back(dist, std::string(n));
  }
  std::sort(cands.begin(), cands.end());
  if (cands.size() > 5) cands.resize(5);
  std::string out;
  for (size_t i = 0; i < cands.size(); ++i) out += (i ? ", '" : "'") + cands[i].second + "'";
  return out;
}

const char* attr_value_kind(const AttrValue& v) {
  switch (v.index()) {
    case 0: return "none";
    case 1: return "int";
    case 2: return "float";
    case 3: return "bool";
    case 4: return "string";
    case 5: return "int list";
    case 6: return "float list";
    default: return "dtype";
  }
}

// Mirrors OpDef::canonicalize's acceptance (ints widen to floats).
bool attr_value_fits(AttrType t, const AttrValue& v) {
  switch (t) {
    case AttrType::Int: return std::holds_alternative<int64_t>(v);
    case AttrType::Float:
      return std::holds_alternative<double>(v) ||
             (std::holds_alternative<int64_t>(v) &&
              SymInt::from_raw(std::get<int64_t>(v)).is_concrete());
    case AttrType::Bool: return std::holds_alternative<bool>(v);
    case AttrType::String: return std::holds_alternative<std::string>(v);
    case AttrType::Ints: return std::holds_alternative<Ints>(v);
    case AttrType::Floats:
      return std::holds_alternative<Floats>(v) || std::holds_alternative<Ints>(v);
    case AttrType::DType: return std::holds_alternative<DType>(v);
  }
  return false;
}

bool all_float_text(std::string_view t) {
  // A float literal: parses fully as a double and is not a plain integer.
  if (t.empty()) return false;
  double d;
  auto r = std::from_chars(t.data(), t.data() + t.size(), d);
  if (r.ec != std::errc() || r.ptr != t.data() + t.size()) return false;
  int64_t i;
  auto ri = std::from_chars(t.data(), t.data() + t.size(), i);
  return !(ri.ec == std::errc() && ri.ptr == t.data() + t.size());
}

// A bound on the magnitude of every constant and coefficient a SymInt expression can produce,
// counting each symbol as 1. SymInt arithmetic is plain int64 arithmetic, and a result below
// SymInt::kMinConcrete would read as a (nonexistent) symbolic handle, so the parser refuses
// expressions whose bound leaves the concrete range. Returns a negative number for text that
// is not an expression (parse_symint then reports the syntax error) or nests too deeply.
class SymIntBound {
 public:
  explicit SymIntBound(std::string_view s) : s_(s) {}
  bool too_deep = false;  // then the text must not reach parse_symint's recursion either
  // The largest bound met anywhere, also in text that turns out malformed: parse_symint
  // computes as it goes, so a syntax error after an overflow does not save it.
  double max_seen = 0;
  double run() {
    double b = expr();
    skip();
    return pos_ == s_.size() ? b : -1;
  }

 private:
  std::string_view s_;
  size_t pos_ = 0;
  int depth_ = 0;

  void skip() {
    while (pos_ < s_.size() && s_[pos_] == ' ') ++pos_;
  }
  bool eat(std::string_view t) {
    skip();
    if (s_.substr(pos_, t.size()) != t) return false;
    pos_ += t.size();
    return true;
  }
  double expr() {
    double b = term();
    while (b >= 0 && (eat("+") || eat("-"))) b = add(b, term());
    return b;
  }
  double term() {
    double b = unary();
    for (;;) {
      if (b < 0) return b;
      if (eat("//") || eat("%")) b = std::max(b, unary());
      else if (eat("*")) b = mul(b, unary());
      else return b;
    }
  }
  double unary() {
    if (++depth_ > 256) return too_deep = true, -1;
    double b = eat("-") ? unary() : primary();
    --depth_;
    return b;
  }
  double primary() {
    skip();
    if (pos_ >= s_.size()) return -1;
    char c = s_[pos_];
    if (c == '(') {
      ++pos_;
      if (++depth_ > 256) return too_deep = true, -1;
      double b = expr();
      --depth_;
      return eat(")") ? b : -1;
    }
    if (c >= '0' && c <= '9') {
      double v = 0;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9')
        v = v * 10 + (s_[pos_++] - '0');
      return seen(v);
    }
    if (!is_ident_start(c)) return -1;
    size_t start = pos_;
    while (pos_ < s_.size() && is_ident_char(s_[pos_])) ++pos_;
    std::string_view id = s_.substr(start, pos_ - start);
    if (id != "min" && id != "max") return 1;
    if (!eat("(")) return -1;
    double a = expr();
    if (a < 0 || !eat(",")) return -1;
    double b = expr();
    return b >= 0 && eat(")") ? std::max(a, b) : -1;
  }
  double seen(double b) {
    max_seen = std::max(max_seen, b);
    return b;
  }
  double add(double a, double b) { return a < 0 || b < 0 ? -1 : seen(a + b); }
  double mul(double a, double b) { return a < 0 || b < 0 ? -1 : seen(a * b); }
};

class Parser {
 public:
  Parser(std::string_view text, std::string_view source) : s_(text), source_(source) {}
  bool on_host_ = false;  // every device annotation read as cpu (parse_graph_on_host)

  Graph parse_graph_text() {
    expect_keyword("graph");
    expect_char('@', "'@' and the graph name");
    g_.name = parse_name("a graph name");
    expect_char('(', "'(' to open the input list");
    if (!eat(')')) {
      for (;;) {
        size_t p = here();
        std::string name = parse_value_name();
        check_new_name(name, p);
        expect_char(':', "':' and the input's type");
        TensorType t = parse_type();
        ValueId v = located(p, [&] { return g_.add_input(name, t); });
        def_pos_[g_.value(v).name] = p;
        if (eat(')')) break;
        expect_char(',', "',' or ')' in the input list");
      }
    }
    expect_char('{', "'{' to open the graph body");
    for (;;) {
      skip_ws();
      size_t p = pos_;
      if (eat_keyword("return")) {
        parse_return();
        break;
      }
      if (eat_keyword("param")) {
        parse_param();
      } else if (eat_keyword("const")) {
        parse_const();
      } else if (peek() == '%') {
        parse_node(p);
      } else {
        expected("a statement ('param', 'const', '%name = op(...)' or 'return')");
      }
    }
    expect_char('}', "'}' to close the graph");
    skip_ws();
    if (pos_ < s_.size()) expected("end of input after the graph's closing '}'");
    return std::move(g_);
  }

  TensorType parse_type_only() {
    TensorType t = parse_type();
    skip_ws();
    if (pos_ < s_.size()) expected("end of the type");
    return t;
  }

 private:
  std::string_view s_;
  std::string_view source_;
  size_t pos_ = 0;
  Graph g_;
  std::unordered_map<std::string, size_t> def_pos_;  // value name -> where it was defined

  // ---- positions and errors -------------------------------------------------------------------
  std::string location(size_t pos) const {
    pos = std::min(pos, s_.size());
    int line = 1;
    size_t line_start = 0;
    for (size_t i = 0; i < pos; ++i)
      if (s_[i] == '\n') {
        ++line;
        line_start = i + 1;
      }
    return fmt::format("{}:{}:{}", source_, line, pos - line_start + 1);
  }
  int line_of(size_t pos) const {
    return 1 + int(std::count(s_.begin(), s_.begin() + std::min(pos, s_.size()), '\n'));
  }

  [[noreturn]] void error_at(size_t pos, const std::string& msg,
                             ErrorKind kind = ErrorKind::ParseError) const {
    throw_error(kind, location(pos) + ": " + msg);
  }

  // A short description of the text at `pos` for "found ..." messages.
  std::string found_at(size_t pos) const {
    if (pos >= s_.size()) return "end of input";
    char c = s_[pos];
    if (c == '"') return "a string";
    size_t e = pos;
    if (c == '%' || c == '@') ++e;
    while (e < s_.size() && e - pos < 24 && is_name_char(s_[e])) ++e;
    if (e == pos || (e == pos + 1 && (c == '%' || c == '@'))) {
      if ((unsigned char)c < 0x20 || (unsigned char)c >= 0x7f)
        return fmt::format("byte 0x{:02x}", (unsigned char)c);
      return fmt::format("'{}'", c);
    }
    return fmt::format("'{}'", s_.substr(pos, e - pos));
  }

  [[noreturn]] void expected(const std::string& what) {
    skip_ws();
    expected_here(what);
  }
  // Without skipping blanks first: for places where a blank is itself the problem ("% x").
  [[noreturn]] void expected_here(const std::string& what) {
    error_at(pos_, fmt::format("expected {}, found {}", what, found_at(pos_)));
  }

  // Runs f; a kiln::Error from library code is re-thrown with this position prepended.
  template <typename F>
  auto located(size_t pos, F&& f, const std::string& context = "") -> decltype(f()) {
    try {
      return f();
    } catch (const Error& e) {
      throw_error(e.kind(), location(pos) + ": " + context + e.message());
    }
  }

  // ---- lexing ---------------------------------------------------------------------------------
  void skip_ws() {
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
        ++pos_;
      } else if (c == '#' || (c == '/' && pos_ + 1 < s_.size() && s_[pos_ + 1] == '/')) {
        while (pos_ < s_.size() && s_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }
  size_t here() {
    skip_ws();
    return pos_;
  }
  char peek() {
    skip_ws();
    return pos_ < s_.size() ? s_[pos_] : '\0';
  }
  bool eat(char c) {
    if (peek() != c) return false;
    ++pos_;
    return true;
  }
  void expect_char(char c, const char* what) {
    if (!eat(c)) expected(what);
  }
  std::string_view peek_ident() {
    skip_ws();
    size_t e = pos_;
    if (e < s_.size() && is_ident_start(s_[e]))
      while (e < s_.size() && is_ident_char(s_[e])) ++e;
    return s_.substr(pos_, e - pos_);
  }
  bool eat_keyword(std::string_view kw) {
    if (peek_ident() != kw) return false;
    pos_ += kw.size();
    return true;
  }
  void expect_keyword(std::string_view kw) {
    if (!eat_keyword(kw)) expected(fmt::format("'{}'", kw));
  }
  std::string parse_ident(const char* what) {
    std::string_view id = peek_ident();
    if (id.empty()) expected(what);
    pos_ += id.size();
    return std::string(id);
  }

  std::string parse_string() {
    size_t start = here();
    if (!eat('"')) expected("a string");
    std::string out;
    for (;;) {
      if (pos_ >= s_.size()) error_at(start, "unterminated string (no closing '\"')");
      char c = s_[pos_++];
      if (c == '"') return out;
      if (c != '\\') {
        out += c;
        continue;
      }
      if (pos_ >= s_.size()) error_at(start, "unterminated string (no closing '\"')");
      char e = s_[pos_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case 'n': out += '\n'; break;
        case 't': out += '\t'; break;
        case 'r': out += '\r'; break;
        case 'x': {
          unsigned v = 0;
          auto r =
              std::from_chars(s_.data() + pos_, s_.data() + std::min(pos_ + 2, s_.size()), v, 16);
          if (r.ec != std::errc() || r.ptr != s_.data() + pos_ + 2)
            error_at(pos_ - 2, "expected two hex digits after '\\x' in a string");
          pos_ += 2;
          out += char(v);
          break;
        }
        default: error_at(pos_ - 2, fmt::format("unknown escape '\\{}' in a string", e));
      }
    }
  }

  // The name after '%' or '@': [A-Za-z0-9_.]+ or a string.
  std::string parse_name(const char* what) {
    if (pos_ < s_.size() && s_[pos_] == '"') {
      std::string n = parse_string();
      if (n.empty()) error_at(pos_ - 2, fmt::format("{} must not be empty", what));
      return n;
    }
    size_t e = pos_;
    while (e < s_.size() && is_name_char(s_[e])) ++e;
    if (e == pos_) expected_here(what);
    std::string n(s_.substr(pos_, e - pos_));
    pos_ = e;
    return n;
  }
  std::string parse_value_name() {
    if (!eat('%')) expected("a value ('%name')");
    return parse_name("a value name after '%'");
  }

  // Raw text of one scalar expression: up to a ',' ']' '}' or unbalanced ')' at depth 0, the end
  // of the line, or a comment. `//` followed by a non-blank is SymInt floor division.
  std::string_view scan_expr() {
    skip_ws();
    size_t start = pos_;
    int depth = 0;
    while (pos_ < s_.size()) {
      char c = s_[pos_];
      if (c == '\n' || c == '\r' || c == '#') break;
      if (c == '/' && pos_ + 1 < s_.size() && s_[pos_ + 1] == '/') {
        char after = pos_ + 2 < s_.size() ? s_[pos_ + 2] : ' ';
        if (after == ' ' || after == '\t' || after == '\n' || after == '\r' || after == '/') break;
        pos_ += 2;
        continue;
      }
      if (depth == 0 && (c == ',' || c == ']' || c == '}' || c == ')')) break;
      if (c == '(') {
        if (++depth > 64) error_at(pos_, "expression nested too deeply (more than 64 levels)");
      }
      if (c == ')') --depth;
      ++pos_;
    }
    size_t end = pos_;
    while (end > start && (s_[end - 1] == ' ' || s_[end - 1] == '\t')) --end;
    return s_.substr(start, end - start);
  }

  // An integer: a literal (full int64 range down to SymInt's concrete minimum) or a SymInt
  // expression.
  SymInt parse_int_text(std::string_view t, size_t pos, const char* what) {
    if (t.empty()) error_at(pos, fmt::format("expected {}, found {}", what, found_at(pos)));
    int64_t v;
    auto r = std::from_chars(t.data(), t.data() + t.size(), v);
    if (r.ec == std::errc() && r.ptr == t.data() + t.size()) {
      if (v < SymInt::kMinConcrete)
        error_at(pos, fmt::format("integer {} is out of range (the minimum is {})", t,
                                  SymInt::kMinConcrete));
      return SymInt(v);
    }
    if (t.size() > 4096) error_at(pos, fmt::format("{} is longer than 4096 characters", what));
    SymIntBound bounder(t);
    bounder.run();
    if (bounder.too_deep) error_at(pos, fmt::format("{} is nested too deeply", what));
    if (bounder.max_seen > 4e18)
      error_at(pos, fmt::format("the integer expression '{}' can leave the int64 range", t));
    try {
      return parse_symint(t);
    } catch (const Error& e) {
      error_at(pos, fmt::format("expected {}, found '{}' ({})", what, t, e.message()));
    }
  }

  // ---- types ----------------------------------------------------------------------------------
  Shape parse_dim_list(bool is_strides) {
    Shape out;
    expect_char('[', is_strides ? "'[' to open the strides" : "'[' to open the shape");
    if (eat(']')) return out;
    for (;;) {
      size_t p = here();
      std::string_view t = scan_expr();
      SymInt d = parse_int_text(t, p,
                                is_strides ? "a stride"
                                           : "a dimension (an integer or a "
                                             "symbolic expression)");
      if (!is_strides && d.is_concrete() && d.raw() < 0)
        error_at(p, fmt::format("dimension {} is negative", d.raw()));
      if (out.size() >= size_t(kMaxRank))
        error_at(p, fmt::format("rank exceeds Kiln's maximum rank of {}", kMaxRank),
                 ErrorKind::NotSupported);
      out.push_back(d);
      if (eat(']')) return out;
      expect_char(',', "',' or ']' in the dimension list");
    }
  }

  TensorType parse_type() {
    size_t p = here();
    std::string_view dt = peek_ident();
    DType dtype;
    if (dt.empty() || !parse_dtype(dt, &dtype)) {
      if (dt.empty()) expected("a type (e.g. 'f32[1, 3]')");
      std::string names;
      for (int i = 0; i < kNumDTypes; ++i)
        names += (i ? ", " : "") + std::string(kDTypeInfo[i].short_name);
      error_at(p, fmt::format("unknown dtype '{}' (expected one of {})", dt, names));
    }
    pos_ += dt.size();
    TensorType t;
    t.dtype = dtype;
    // The shape must follow the dtype directly: "f32[2]".
    if (pos_ >= s_.size() || s_[pos_] != '[') {
      if (peek() == '[')
        error_at(pos_, fmt::format("no blank is allowed between the dtype and '[' (write "
                                   "'{}[...]')",
                                   dt));
      expected("'[' and the shape after the dtype");
    }
    t.shape = parse_dim_list(false);
    if (eat_keyword("strides")) {
      size_t sp = here();
      t.strides = parse_dim_list(true);
      if (t.strides.size() != t.shape.size())
        error_at(sp, fmt::format("strides {} have {} entries but the shape {} has rank {}",
                                 to_string(t.strides), t.strides.size(), to_string(t.shape),
                                 t.shape.size()));
    }
    if (eat('@')) {
      size_t dp = pos_;
      size_t e = pos_;
      while (e < s_.size() && (is_ident_char(s_[e]) || s_[e] == ':')) ++e;
      std::string_view dev = s_.substr(pos_, e - pos_);
      if (dev.empty()) expected("a device after '@' ('cpu', 'cuda:0')");
      t.device = located(dp, [&] { return parse_device(dev); });
      if (on_host_) t.device = Device::cpu();
      pos_ = e;
    }
    return t;
  }

  // ---- attributes -----------------------------------------------------------------------------
  // One scalar of an attribute: float, int/SymInt expression.
  AttrValue parse_number(AttrType hint, const char* what) {
    size_t p = here();
    std::string_view t = scan_expr();
    if (t.empty()) error_at(p, fmt::format("expected {}, found {}", what, found_at(p)));
    if (all_float_text(t)) {
      double d;
      std::from_chars(t.data(), t.data() + t.size(), d);
      return d;
    }
    if (hint == AttrType::Float || hint == AttrType::Floats) {
      // Out-of-range floats (1e999) land here: say so rather than "not an int".
      double d;
      auto r = std::from_chars(t.data(), t.data() + t.size(), d);
      if (r.ec == std::errc::result_out_of_range)
        error_at(p, fmt::format("float {} is out of range for a float64", t));
    }
    return parse_int_text(t, p, what).raw();
  }

  AttrValue parse_attr_value(AttrType hint) {
    char c = peek();
    if (c == '"') return parse_string();
    std::string_view id = peek_ident();
    if (id == "none") {
      pos_ += id.size();
      return std::monostate{};
    }
    if (id == "true" || id == "false") {
      pos_ += id.size();
      return id == "true";
    }
    DType dt;
    if (!id.empty() && hint != AttrType::Int && hint != AttrType::Ints && parse_dtype(id, &dt)) {
      pos_ += id.size();
      return dt;
    }
    if (c == '[') {
      ++pos_;
      std::vector<AttrValue> elems;
      bool any_float = false;
      if (!eat(']')) {
        for (;;) {
          AttrValue v = parse_number(hint == AttrType::Floats ? AttrType::Float : AttrType::Int,
                                     "a list element (an int or a float)");
          any_float |= std::holds_alternative<double>(v);
          elems.push_back(v);
          if (eat(']')) break;
          expect_char(',', "',' or ']' in the list");
        }
      }
      if (any_float || hint == AttrType::Floats) {
        Floats f;
        for (const AttrValue& v : elems) {
          if (auto* d = std::get_if<double>(&v)) {
            f.push_back(*d);
          } else {
            SymInt s = SymInt::from_raw(std::get<int64_t>(v));
            if (s.is_symbolic())
              expected(fmt::format("a number in a float list (not the symbolic '{}')", s.str()));
            f.push_back(double(s.raw()));
          }
        }
        return f;
      }
      Ints out;
      for (const AttrValue& v : elems) out.push_back(std::get<int64_t>(v));
      return out;
    }
    return parse_number(hint, "an attribute value (int, float, bool, string, dtype, list or none)");
  }

  Attrs parse_attrs(const OpDef& def) {
    Attrs attrs;
    if (eat('}')) return attrs;
    for (;;) {
      size_t np = here();
      std::string name = parse_ident("an attribute name");
      int idx = def.attr_index(name);
      if (idx < 0) {
        std::string known;
        for (auto& a : def.attrs) known += (known.empty() ? "" : ", ") + a.name;
        error_at(np, fmt::format("op '{}' has no attribute '{}' (its attributes: {})", def.name,
                                 name, known.empty() ? "none" : known));
      }
      if (attrs.find(name)) error_at(np, fmt::format("attribute '{}' is given twice", name));
      expect_char('=', "'=' after the attribute name");
      const AttrSpec& spec = def.attrs[size_t(idx)];
      size_t vp = here();
      AttrValue v = parse_attr_value(spec.type);
      if (std::holds_alternative<std::monostate>(v)) {
        if (!spec.optional)
          error_at(vp, fmt::format("attribute '{}' of op '{}' cannot be none: it is a required {}",
                                   name, def.name, attr_type_name(spec.type)));
      } else if (!attr_value_fits(spec.type, v)) {
        error_at(vp,
                 fmt::format("attribute '{}' of op '{}' must be {}, found {} ({})", name, def.name,
                             attr_type_name(spec.type), attr_value_str(v), attr_value_kind(v)));
      }
      attrs.set(name, std::move(v));
      if (eat('}')) return attrs;
      expect_char(',', "',' or '}' in the attribute list");
    }
  }

  // ---- statements -----------------------------------------------------------------------------
  void check_new_name(const std::string& name, size_t pos) {
    auto it = def_pos_.find(name);
    if (it != def_pos_.end())
      error_at(pos, fmt::format("redefinition of {} (first defined at line {})",
                                value_ref_name(name), line_of(it->second)));
  }

  ValueId use_value() {
    size_t p = here();
    std::string name = parse_value_name();
    ValueId v = g_.find_value(name);
    if (v == kNoValue) error_at(p, fmt::format("use of undefined value {}", value_ref_name(name)));
    return v;
  }

  void parse_param() {
    size_t p = here();
    std::string name = parse_value_name();
    check_new_name(name, p);
    expect_char(':', "':' and the param's type");
    TensorType t = parse_type();
    located(p, [&] { return g_.add_param_decl(name, t); });
    def_pos_[name] = p;
  }

  void parse_const() {
    size_t p = here();
    std::string name = parse_value_name();
    check_new_name(name, p);
    expect_char(':', "':' and the const's type");
    size_t tp = here();
    TensorType t = parse_type();
    if (!eat('=')) {  // values elided (see PrintOptions::max_inline_const_elements)
      ValueId v = located(p, [&] { return g_.add_param_decl(name, t); });
      g_.value(v).kind = ValueKind::Const;
      def_pos_[name] = p;
      return;
    }
    if (!t.strides.empty())
      error_at(tp, "const values are stored contiguous; a const type cannot have strides");
    if (!is_concrete(t.shape))
      error_at(tp, fmt::format("const {} has the symbolic shape {}; consts need concrete shapes",
                               value_ref_name(name), to_string(t.shape)));
    size_t lp = here();
    expect_char('[', "'[' to open the const's values");
    std::vector<std::pair<std::string_view, size_t>> elems;
    if (!eat(']')) {
      for (;;) {
        size_t ep = here();
        std::string_view e = scan_expr();
        if (e.empty()) expected("a const element");
        elems.emplace_back(e, ep);
        if (eat(']')) break;
        expect_char(',', "',' or ']' in the const's values");
      }
    }
    Dims dims = to_dims(t.shape);
    int64_t n = 1;
    for (int64_t d : dims)
      if (__builtin_mul_overflow(n, d, &n)) error_at(tp, "const shape has too many elements");
    if (int64_t(elems.size()) != n)
      error_at(lp, fmt::format("const {} of type {} needs {} values, found {}",
                               value_ref_name(name), t.str(), n, elems.size()));
    Tensor data = Tensor::empty(dims, t.dtype);
    char* base = static_cast<char*>(data.raw_data());
    int64_t esize = data.element_size();
    for (size_t i = 0; i < elems.size(); ++i)
      parse_element(elems[i].first, elems[i].second, t.dtype, base + int64_t(i) * esize);
    if (!t.device.is_cpu()) data = located(p, [&] { return data.to(t.device); });
    located(p, [&] { return g_.add_const(data, name); });
    def_pos_[name] = p;
  }

  void parse_element(std::string_view e, size_t pos, DType d, void* out) {
    auto bad = [&](const char* what) {
      error_at(pos,
               fmt::format("expected {} for a {} const, found '{}'", what, info(d).short_name, e));
    };
    const char* b = e.data();
    const char* end = e.data() + e.size();
    if (is_floating(d)) {
      if (d == DType::Float64) {
        double v;
        auto r = std::from_chars(b, end, v);
        if (r.ec == std::errc::result_out_of_range) bad("a float in range");
        if (r.ec != std::errc() || r.ptr != end) bad("a float");
        std::memcpy(out, &v, sizeof v);
        return;
      }
      float v;
      auto r = std::from_chars(b, end, v);
      if (r.ec == std::errc::result_out_of_range) bad("a float in range");
      if (r.ec != std::errc() || r.ptr != end) bad("a float");
      if (d == DType::Float32) std::memcpy(out, &v, sizeof v);
      else store_f64(out, d, double(v));
      return;
    }
    if (d == DType::Bool) {
      if (e != "true" && e != "false") bad("true or false");
      *static_cast<uint8_t*>(out) = e == "true";
      return;
    }
    int64_t v;
    auto r = std::from_chars(b, end, v);
    if (r.ec != std::errc() || r.ptr != end) bad("an integer");
    int64_t lo = INT64_MIN, hi = INT64_MAX;
    switch (d) {
      case DType::Int8: lo = -128, hi = 127; break;
      case DType::UInt8: lo = 0, hi = 255; break;
      case DType::Int32: lo = INT32_MIN, hi = INT32_MAX; break;
      default: break;
    }
    if (v < lo || v > hi) bad("an integer in range");
    store_i64(out, d, v);
  }

  void parse_node(size_t stmt) {
    std::vector<std::pair<std::string, size_t>> lhs;
    for (;;) {
      size_t p = here();
      std::string name = parse_value_name();
      check_new_name(name, p);
      for (auto& [n, q] : lhs)
        if (n == name)
          error_at(p, fmt::format("{} is defined twice on the left of '='", value_ref_name(name)));
      lhs.emplace_back(std::move(name), p);
      if (eat('=')) break;
      expect_char(',', "',' or '=' after the defined values");
    }
    size_t op_pos = here();
    std::string op_name = parse_ident("an op name");
    const OpDef* def = find_op(op_name);
    if (!def) {
      std::string near = near_op_names(op_name);
      error_at(op_pos, near.empty()
                           ? fmt::format("unknown op '{}' (`kiln ops` lists every op)", op_name)
                           : fmt::format("unknown op '{}'; did you mean {}?", op_name, near));
    }
    size_t args_pos = here();
    expect_char('(', "'(' and the op's operands");
    std::vector<ValueId> operands;
    if (!eat(')')) {
      for (;;) {
        skip_ws();
        if (pos_ < s_.size() && s_[pos_] == '_' &&
            (pos_ + 1 >= s_.size() || !is_name_char(s_[pos_ + 1]))) {
          ++pos_;
          operands.push_back(kNoValue);
        } else if (peek() == '%') {
          operands.push_back(use_value());
        } else {
          expected("an operand ('%name' or '_' for an absent optional input)");
        }
        if (eat(')')) break;
        expect_char(',', "',' or ')' in the operand list");
      }
    }
    Attrs attrs;
    if (eat('{')) attrs = parse_attrs(*def);
    std::vector<std::pair<TensorType, size_t>> annotated;
    bool has_annotation = false;
    if (eat(':')) {
      has_annotation = true;
      for (;;) {
        size_t tp = here();
        annotated.emplace_back(parse_type(), tp);
        if (!eat(',')) break;
      }
    }
    std::string node_name;
    if (eat_keyword("loc")) {
      expect_char('(', "'(' after 'loc'");
      node_name = parse_string();
      expect_char(')', "')' to close loc(...)");
    }

    std::string context = fmt::format("in the definition of {}: ", value_ref_name(lhs[0].first));
    // Arity first, pointing at the operand list; then everything add_node checks.
    located(args_pos, [&] {
      def->check_arity(operands.size(),
                       fmt::format("in the definition of {}", value_ref_name(lhs[0].first)));
    });
    for (size_t i = 0; i < operands.size(); ++i) {
      if (operands[i] != kNoValue) continue;
      size_t spec = std::min(i, def->inputs.size() - 1);
      if (!def->inputs[spec].optional)
        error_at(args_pos, fmt::format("{}op '{}' input {} ('{}') is required; '_' marks only an "
                                       "absent optional input",
                                       context, def->name, i, def->inputs[spec].name));
    }
    std::vector<ValueId> outs = located(
        stmt, [&] { return g_.add_node(def->id, operands, attrs, node_name); }, context);
    if (outs.size() != lhs.size())
      error_at(lhs[0].second, fmt::format("op '{}' produces {} output{} but {} value{} defined on "
                                          "the left of '='",
                                          def->name, outs.size(), outs.size() == 1 ? "" : "s",
                                          lhs.size(), lhs.size() == 1 ? " is" : "s are"));
    if (has_annotation) {
      if (annotated.size() != outs.size())
        error_at(annotated[0].second,
                 fmt::format("{}op '{}' produces {} output{} but {} type{} annotated", context,
                             def->name, outs.size(), outs.size() == 1 ? "" : "s", annotated.size(),
                             annotated.size() == 1 ? " is" : "s are"));
      for (size_t i = 0; i < outs.size(); ++i) {
        const TensorType& inferred = g_.type(outs[i]);
        if (inferred != annotated[i].first)
          error_at(annotated[i].second,
                   fmt::format("type annotation of {} (op '{}'{}) does not match inference: "
                               "expected {}, found {}",
                               value_ref_name(lhs[i].first), def->name,
                               node_name.empty() ? "" : fmt::format(", node '{}'", node_name),
                               inferred.str(), annotated[i].first.str()));
      }
    }
    // Give the outputs their textual names. Two phases, so that a generated name equal to
    // another output's textual name cannot collide.
    for (ValueId v : outs) {
      auto is_target = [&](const std::string& n) {
        return std::any_of(lhs.begin(), lhs.end(), [&](auto& l) { return l.first == n; });
      };
      std::string tmp = g_.unique_name("\x01tmp");
      while (is_target(tmp)) {  // park on it so that unique_name moves past it
        g_.rename_value(v, tmp);
        tmp = g_.unique_name("\x01tmp");
      }
      g_.rename_value(v, tmp);
    }
    for (size_t i = 0; i < outs.size(); ++i) {
      g_.rename_value(outs[i], lhs[i].first);
      def_pos_[lhs[i].first] = lhs[i].second;
    }
  }

  void parse_return() {
    skip_ws();
    if (peek() == '%') {
      for (;;) {
        g_.outputs.push_back(use_value());
        if (!eat(',')) break;
      }
    }
  }
};

}  // namespace

Graph parse_graph(std::string_view text, std::string_view source_name) {
  Parser p(text, source_name);
  return p.parse_graph_text();
}

Graph parse_graph_on_host(std::string_view text, std::string_view source_name) {
  Parser p(text, source_name);
  p.on_host_ = true;
  return p.parse_graph_text();
}

TensorType parse_tensor_type(std::string_view text) {
  Parser p(text, "<type>");
  return p.parse_type_only();
}

}  // namespace kiln
