#include "lower/scalar_code.h"

#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "core/error.h"

namespace kiln::lower {

bool floating_compute(DType d) {
  return d == DType::Float32 || d == DType::BFloat16 || d == DType::Float16;
}

const char* storage_type(DType d) {
  switch (d) {
    case DType::Float32: return "float";
    case DType::Float64: return "double";
    case DType::Float16:
    case DType::BFloat16: return "u16";
    case DType::Int64: return "int64_t";
    case DType::Int32: return "int32_t";
    case DType::Int8: return "int8_t";
    case DType::UInt8: return "uint8_t";
    case DType::Bool: return "uint8_t";
  }
  return "?";
}

const char* compute_type(DType d) {
  if (floating_compute(d)) return "float";
  if (d == DType::Float64) return "double";
  if (d == DType::Bool) return "bool";
  return "i64";
}

std::string literal(double v, const ScalarDialect& d) {
  if (v != v) return d.nan;
  if (v == std::numeric_limits<double>::infinity()) return "INFINITY";
  if (v == -std::numeric_limits<double>::infinity()) return "(-INFINITY)";
  return fmt::format("{:.17g}", v);
}

std::string index_expr(const std::vector<int64_t>& st, bool skip_inner) {
  std::string s;
  const size_t n = st.size();
  for (size_t t = 0; t < n; ++t) {
    if (st[t] == 0 || (skip_inner && t + 1 == n)) continue;
    if (!s.empty()) s += " + ";
    s += st[t] == 1 ? fmt::format("i{}", t) : fmt::format("i{} * {}", t, st[t]);
  }
  return s.empty() ? "0" : s;
}

std::string convert_expr(const LoopKernel& k, int e, DType to) {
  std::string v = fmt::format("v{}", e);
  DType from = k.exprs[size_t(e)].dtype;
  if (std::string(compute_type(from)) == compute_type(to)) return v;
  if (to == DType::Bool) return "(" + v + " != 0)";
  return fmt::format("({})({})", compute_type(to), v);
}

std::string load_expr(const LoopKernel& k, int li, const ScalarDialect& d) {
  const Access& a = k.loads[size_t(li)];
  std::string p = d.load_text && !(*d.load_text)[size_t(li)].empty()
                      ? (*d.load_text)[size_t(li)]
                      : fmt::format("L{}[{}]", li, index_expr(a.strides));
  switch (a.dtype) {
    case DType::BFloat16: return "kn_bf16_f32(" + p + ")";
    case DType::Float16: return "kn_f16_f32(" + p + ")";
    case DType::Bool: return "(" + p + " != 0)";
    case DType::Int32: case DType::Int8: case DType::UInt8: return "i64(" + p + ")";
    default: return p;
  }
}

std::string scalar_expr(const LoopKernel& k, int ei, const ScalarDialect& dialect) {
  const LoopExpr& e = k.exprs[size_t(ei)];
  DType od = e.dtype;
  auto arg = [&](int i, DType to) { return convert_expr(k, e.args[size_t(i)], to); };
  auto adt = [&](int i) { return k.exprs[size_t(e.args[size_t(i)])].dtype; };
  auto num = [&](double v) { return literal(v, dialect); };
  std::string r;
  switch (e.kind) {
    case LoopExpr::Kind::Load: return load_expr(k, e.load, dialect);
    case LoopExpr::Kind::Scalar:
      if (od == DType::Bool) return e.scalar != 0 ? "true" : "false";
      if (floating_compute(od)) return fmt::format("(float){}", num(e.scalar));
      if (od == DType::Float64) return num(e.scalar);
      return fmt::format("i64({})", int64_t(e.scalar));
    case LoopExpr::Kind::Op: break;
    default:
      throw_error(ErrorKind::Internal,
                  fmt::format("codegen: kernel {}: expression {} is a reduce/norm anchor, not a "
                              "scalar expression", k.name, ei));
  }
  const Attrs& at = *e.attrs;
  auto un = [&](const char* name) { return fmt::format("{}({})", name, arg(0, od)); };
  switch (e.op) {
    case OpId::Neg: r = un("kn_neg"); break;
    case OpId::Abs: r = un("kn_abs"); break;
    case OpId::Exp: r = un("kn_exp"); break;
    case OpId::Log: r = un("kn_log"); break;
    case OpId::Sqrt: r = un("kn_sqrt"); break;
    case OpId::Rsqrt: r = un("kn_rsqrt"); break;
    case OpId::Reciprocal: r = un("kn_recip"); break;
    case OpId::Sigmoid: r = un("kn_sigmoid"); break;
    case OpId::Tanh: r = un("kn_tanh"); break;
    case OpId::Relu: r = un("kn_relu"); break;
    case OpId::Gelu: r = un(at.get_string("approximate") == "tanh" ? "kn_gelu_tanh" : "kn_gelu"); break;
    case OpId::Silu: r = un("kn_silu"); break;
    case OpId::Erf: r = un("kn_erf"); break;
    case OpId::Sin: r = un("kn_sin"); break;
    case OpId::Cos: r = un("kn_cos"); break;
    case OpId::Floor: r = un("kn_floor"); break;
    case OpId::Ceil: r = un("kn_ceil"); break;
    case OpId::Round: r = un("kn_round"); break;
    case OpId::Sign: r = un("kn_sign"); break;
    case OpId::Not: r = fmt::format("!{}", arg(0, DType::Bool)); break;
    case OpId::Copy: r = arg(0, od); break;
    case OpId::Clamp: {
      bool lo = at.has("min"), hi = at.has("max");
      double vlo = lo ? at.get_float("min") : 0, vhi = hi ? at.get_float("max") : 0;
      if (!floating_compute(od) && od != DType::Float64) {
        std::string s = arg(0, od);
        if (lo) s = fmt::format("({0} < i64({1}) ? i64({1}) : {0})", s, int64_t(std::ceil(vlo)));
        if (hi) s = fmt::format("({0} > i64({1}) ? i64({1}) : {0})", s, int64_t(std::floor(vhi)));
        r = s;
      } else {
        const char* ct = compute_type(od);
        std::string s = arg(0, od);
        if (lo) s = fmt::format("({0} < ({1}){2} ? ({1}){2} : {0})", s, ct, num(vlo));
        if (hi) s = fmt::format("({0} > ({1}){2} ? ({1}){2} : {0})", s, ct, num(vhi));
        r = s;  // NaN compares false and stays NaN
      }
      break;
    }
    case OpId::Cast: {
      DType from = adt(0);
      std::string x = fmt::format("v{}", e.args[0]);
      if (od == DType::Bool) {
        r = "(" + x + " != 0)";
      } else if ((floating_compute(from) || from == DType::Float64) &&
                 !(floating_compute(od) || od == DType::Float64)) {
        r = fmt::format("i64(kn_sat<{}>(double({})))", storage_type(od), x);
      } else if (!floating_compute(od) && od != DType::Float64) {
        // integer -> integer: wrap like a C cast of the stored type
        r = fmt::format("i64(({})({}))", storage_type(od), x);
      } else {
        r = fmt::format("({})({})", compute_type(od), x);
      }
      break;
    }
    case OpId::Add: case OpId::Sub: case OpId::Mul: case OpId::Div: case OpId::Pow:
    case OpId::Maximum: case OpId::Minimum: {
      const char* f = e.op == OpId::Add ? "kn_add" : e.op == OpId::Sub ? "kn_sub" : e.op == OpId::Mul ? "kn_mul"
                    : e.op == OpId::Div ? "kn_div" : e.op == OpId::Pow ? "kn_pow" : e.op == OpId::Maximum ? "kn_max" : "kn_min";
      std::string ct = compute_type(od);
      if (ct == "bool") ct = "i64";
      r = fmt::format("{0}(({1})v{2}, ({1})v{3})", f, ct, e.args[0], e.args[1]);
      if (od == DType::Bool) r = "(" + r + " != 0)";
      break;
    }
    case OpId::Eq: case OpId::Ne: case OpId::Lt: case OpId::Le: case OpId::Gt: case OpId::Ge: {
      DType ct = promote_types(adt(0), adt(1));
      const char* f = e.op == OpId::Eq ? "==" : e.op == OpId::Ne ? "!=" : e.op == OpId::Lt ? "<"
                    : e.op == OpId::Le ? "<=" : e.op == OpId::Gt ? ">" : ">=";
      std::string c = compute_type(ct);
      r = fmt::format("(({}){} {} ({}){})", c, fmt::format("v{}", e.args[0]), f, c, fmt::format("v{}", e.args[1]));
      break;
    }
    case OpId::And: case OpId::Or:
      r = fmt::format("({} {} {})", arg(0, DType::Bool), e.op == OpId::And ? "&&" : "||", arg(1, DType::Bool));
      break;
    case OpId::Where:
      r = fmt::format("({} ? {} : {})", arg(0, DType::Bool), arg(1, od), arg(2, od));
      break;
    default:
      throw_error(ErrorKind::Internal, fmt::format("codegen: kernel {}: op '{}' has no loop code",
                                                   k.name, op_def(e.op).name));
  }
  // Values of 16-bit float dtypes are rounded after every op, as the eager kernels store them.
  if (od == DType::BFloat16) r = "kn_rbf16(" + r + ")";
  if (od == DType::Float16) r = "kn_rf16(" + r + ")";
  return r;
}

std::vector<bool> expr_closure(const LoopKernel& k, int root) {
  std::vector<bool> want(k.exprs.size(), false);
  std::vector<int> stack = {root};
  while (!stack.empty()) {
    int e = stack.back();
    stack.pop_back();
    if (e < 0 || want[size_t(e)]) continue;
    want[size_t(e)] = true;
    for (int a : k.exprs[size_t(e)].args) stack.push_back(a);
  }
  return want;
}

std::string expr_comment(const Graph& g, const LoopKernel& k, int e) {
  const LoopExpr& x = k.exprs[size_t(e)];
  if (x.node < 0 || (x.kind != LoopExpr::Kind::Op && x.kind != LoopExpr::Kind::Indexed)) return "";
  const Node& nd = g.nodes[size_t(x.node)];
  return fmt::format("  // {} {}", op_def(nd.op).name, nd.name);
}

std::string store_value(DType d, const std::string& v) {
  switch (d) {
    case DType::BFloat16: return fmt::format("kn_f32_bf16((float){})", v);
    case DType::Float16: return fmt::format("kn_f32_f16((float){})", v);
    case DType::Bool: return fmt::format("uint8_t({} != 0)", v);
    default: return fmt::format("({}){}", storage_type(d), v);
  }
}

}  // namespace kiln::lower
