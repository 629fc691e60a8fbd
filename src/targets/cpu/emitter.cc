// Note [CPU code generation]
// Each LoopKernel (src/lower/loop_ir.h) becomes `extern "C" void NAME(char* const* b)`, where
// b[slot] are the base pointers of the argument table (arena, inputs, parameters); every offset
// and stride is a compile-time constant, so a call does no index arithmetic beyond the loops.
//   Pointwise: nested loops over the space; the innermost dim runs a SIMD main loop (VF, KN_W
//     lanes) and a scalar tail; big kernels parallelize the outer loops (and, for long 1-D
//     spaces, chunks of the innermost dim) with `omp parallel for collapse`.
//   Reduce: parallel over the kept dims; per kept point, vector + scalar accumulators over the
//     reduce dims (var: a second pass for the sum of squared deviations), then the epilogue.
//     A reduction whose innermost reduce dim is strided but whose innermost kept dim is
//     contiguous (max over the points of [P, N, C], sum over H of NCHW) runs its lanes across
//     that kept dim instead (Note [lane reductions]).
//   Norm: parallel over the kept dims; pass 1 computes statistics (softmax: running max and
//     rescaled sum per lane; layer_norm: Welford per lane, lanes merged with Chan's formula),
//     pass 2 recomputes the prologue, normalizes, runs the epilogue and stores.
// Values are computed in float for f32/bf16/f16 (rounded to bf16/f16 after every op that
// produces one, as eager does), in double for f64, in int64 for integers, and in bool. The SIMD
// path is used only when every value is f32/bf16 (bool results of comparisons travel as 1.0/0.0
// lanes); other kernels are scalar. Each function is preceded by `// kiln-kernel: NAME` and the
// graph nodes it computes, so a compile error or a dumped source points back at the graph.
#include "targets/cpu/emitter.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <limits>

#include <fmt/format.h>

#include "targets/cpu/prelude.h"
#include "targets/cpu/support.h"
#include "core/error.h"
#include "lower/scalar_code.h"

namespace kiln::cpu {

using lower::Access;
using lower::Level;
using lower::LoopExpr;
using lower::LoopKernel;
using lower::LoopKind;

namespace {

using lower::compute_type;
using lower::storage_type;
std::string num(double v) { return lower::literal(v, lower::kHostDialect); }

// Ops the vector path implements (the support table's vector_body column).
bool op_vectorizable(OpId op) { return cpu_support()[size_t(op)].vector_body; }

// Note [grid_sample tap tables]: a grid_sample's four taps as offsets from its top-left one
// (top-right +x, bottom-left +y, bottom-right +y+x), in the order of the tables' weights.
std::array<int64_t, 4> grid_tap_offsets(const LoopExpr& e) {
  return {0, e.src_stride[1], e.src_stride[0], e.src_stride[0] + e.src_stride[1]};
}

bool vec_dtype(DType d) { return d == DType::Float32 || d == DType::BFloat16 || d == DType::Bool; }

// The SIMD tests every vector form shares, along the dim its lanes run: a load must be
// contiguous or broadcast there (a bool only broadcast), a store contiguous and float32 or
// bfloat16, an expression of a vector dtype with a vector body (no indexed load).
bool load_vectorizable(const Access& a, size_t dim) {
  const int64_t s = a.strides[dim];
  return vec_dtype(a.dtype) && (s == 0 || s == 1) && (a.dtype != DType::Bool || s == 0);
}
bool store_vectorizable(const Access& a, size_t dim) {
  return (a.dtype == DType::Float32 || a.dtype == DType::BFloat16) && a.strides[dim] == 1;
}
bool expr_vectorizable(const LoopExpr& e) {
  return vec_dtype(e.dtype) && (e.kind != LoopExpr::Kind::Op || op_vectorizable(e.op)) &&
         e.kind != LoopExpr::Kind::Indexed;
}

class KernelEmitter {
 public:
  KernelEmitter(const Graph& g, const LoopKernel& k, const std::vector<MemRef>& mem,
                const CpuCodegenOptions& o)
      : g_(g), k_(k), mem_(mem), opt_(o) {}
  std::string emit(bool* vectorized);

 private:
  int n() const { return int(k_.sizes.size()); }
  std::string index(const std::vector<int64_t>& st, bool skip_inner = false) const;
  std::string cvt(int e, DType to, bool vec) const;
  std::string expr_code(int e, bool vec) const;
  // Emits exprs of `level` in `want` (by index) into out.
  void emit_exprs(std::string& out, const std::vector<bool>& want, Level level, bool vec,
                  const std::string& ind) const;
  void emit_stores(std::string& out, Level level, bool vec, const std::string& ind) const;
  std::string vload(int load) const;
  void emit_pointwise(std::string& out, bool vec);
  void emit_transposed(std::string& out, int t);
  // Note [flattened lanes]: whether a pointwise kernel whose innermost dim is too short for a
  // vector runs its lanes across its innermost flat_dims_ dims instead (then sets flat_dims_
  // and flat_points_, their extents' product); how each load reads there; the form's loops.
  bool find_flat_lanes();
  enum class FlatRead { Broadcast, Contiguous, Runs8, Gather, None };
  int64_t flat_offset(const Access& a, int64_t lane) const;
  FlatRead flat_read(const Access& a) const;
  bool flat_contiguous(const std::vector<int64_t>& strides) const;
  std::vector<int64_t> flat_coords(int64_t f) const;
  void emit_flat(std::string& out);
  int flat_dims_ = 0;
  int64_t flat_points_ = 0;
  // Note [tiled transposes]: the dim a scalar pointwise kernel tiles with its innermost, or -1.
  int tiled_dim(bool vec) const;
  bool transposes_whole_tiles(int t) const;
  // Note [grid_sample tap tables]: whether the kernel takes them; then grid_ is its grid_sample
  // expression and grid_dim_ the dim of the space the tables are shared along.
  bool find_grid_tables();
  // The statement that stores row p_'s coordinates (cx_, cy_) from the grid_sample's loads.
  std::string grid_coords(const std::string& ind) const;
  // The tables' declarations for `rows` rows (offsets of type `off_type`), and the statements
  // that fill rows [0, n) from the stored coordinates (Note [grid_sample tap tables]).
  std::string grid_tables(int64_t rows, const char* off_type, const std::string& ind) const;
  std::string grid_fill(int64_t rows, const char* off_type, const std::string& n,
                        const std::string& ind) const;
  // Whether the Pointwise form gathers KN_W points at a time: a float32 source whose offsets
  // within a plane fit int32, stored contiguously along the points.
  bool grid_gathers() const;
  // Note [grid_sample channels-last]: whether the Pointwise form runs SIMD lanes along grid_dim_
  // (the source contiguous there), KN_W points at a time through a transposed tile.
  bool grid_point_lanes() const;
  void emit_grid_taps(std::string& out);
  void emit_reduce_grid(std::string& out);
  int grid_ = -1, grid_dim_ = -1;
  // While set, indexed_code reads the grid_sample's taps from the tables at row p_.
  bool read_tables_ = false;
  // Note [grid_sample tap tables]: whether the Reduce form runs SIMD lanes along grid_dim_, and
  // the grid_sample's taps for KN_W neighbours along it (read from the tables at row p_).
  bool grid_lanes() const;
  bool grid_epilogue_lanes() const;
  bool float_lanes_along(Level lv, size_t d, const std::vector<bool>* want, int skip) const;
  std::string grid_lanes_code(int e) const;
  void emit_reduce(std::string& out, bool vec);
  // Note [reduction rows]: whether a SIMD sum computes kReduceRows outputs of its innermost kept
  // dim together, and that form.
  bool reduce_rows() const;
  void emit_reduce_rows(std::string& out);
  void emit_reduce_lanes(std::string& out);
  void emit_norm(std::string& out, bool vec);
  // Note [row-buffered norms]: whether the kernel takes the row buffer; then emits it.
  bool row_buffered() const;
  void emit_norm_buffered(std::string& out);
  // The normalized value of the Norm anchor given its input `xs` (and the statistics' names).
  std::string norm_value(const std::string& xs, bool vec) const;
  void emit_scatter(std::string& out);
  std::string indexed_code(int e) const;
  std::string source_load(int li, const std::string& index) const;
  std::string pointers() const;
  bool par() const;

  const Graph& g_;
  const LoopKernel& k_;
  const std::vector<MemRef>& mem_;
  const CpuCodegenOptions& opt_;
  bool grid_hoisted_ = false;  // Note [grid taps per point]
  int vdim_ = -1;  // the dim the SIMD lanes run along: the innermost, or a lane reduction's
};

// Note [kernel threads]
// Every kernel is `extern "C" void NAME(char* const* b, int kt)`. A kernel with at least
// min_parallel elements has parallel outer loops whose team size is kt (0: all of OpenMP's
// threads at call time; 1: no parallel region at all, through the `if` clause), so the
// executable decides per kernel, without recompiling, whether a kernel forks: by default from
// parallel_threshold up (a fork/join costs microseconds, which a small kernel does not win
// back), and max-autotune times both for each such kernel. Smaller kernels ignore kt.
// parallel_threshold was 32768 elements, so kernels of 4096-32767 ran on one thread by default;
// it is min_parallel now. Such a kernel's inputs were mostly just written by a parallel
// producer (a oneDNN GEMM split across the cores), and one thread pulling them out of the other
// cores' caches took longer than a fork: lstm_trajectory's LSTM cells (64 x 128 elements, five
// sigmoids and tanhs each) took 22 us on one thread of a 1-thread run, 31-34 us on one thread of
// a 2-thread run, 15.8 us forked; the model's p50 at 2 threads 0.84x, gru_trajectory's 0.87x,
// twelve other models of the broad set unchanged (0.96-1.03, within their rounds' spread).
bool KernelEmitter::par() const {
  return k_.numel() >= opt_.min_parallel;
}

std::string KernelEmitter::pointers() const {
  std::string s;
  auto ref = [&](ValueId v) {
    const MemRef& m = mem_[size_t(v)];
    if (m.slot < 0)
      throw_error(ErrorKind::Internal,
                  fmt::format("codegen: kernel {} reads or writes '%{}', which has no memory",
                              k_.name, g_.value(v).name));
    return m;
  };
  for (size_t i = 0; i < k_.loads.size(); ++i) {
    const Access& a = k_.loads[i];
    MemRef m = ref(a.value);
    s += fmt::format("  const {0}* __restrict L{1} = (const {0}*)(b[{2}] + {3}) + {4};  // %{5}\n",
                     storage_type(a.dtype), i, m.slot, m.byte_offset, a.offset,
                     g_.value(a.value).name);
  }
  for (size_t i = 0; i < k_.stores.size(); ++i) {
    const Access& a = k_.stores[i].access;
    MemRef m = ref(a.value);
    s += fmt::format("  {0}* __restrict S{1} = ({0}*)(b[{2}] + {3}) + {4};  // %{5}\n",
                     storage_type(a.dtype), i, m.slot, m.byte_offset, a.offset,
                     g_.value(a.value).name);
  }
  return s;
}

std::string KernelEmitter::index(const std::vector<int64_t>& st, bool skip_inner) const {
  return lower::index_expr(st, skip_inner);
}


std::string KernelEmitter::vload(int li) const {
  const Access& a = k_.loads[size_t(li)];
  int64_t inner = a.strides[size_t(vdim_ >= 0 ? vdim_ : n() - 1)];
  if (flat_dims_ > 0) {  // Note [flattened lanes]
    const FlatRead how = flat_read(a);
    if (how == FlatRead::Gather) return fmt::format("vgather(L{} + {}, kfo{}_)", li, index(a.strides), li);
    if (how == FlatRead::Runs8)
      return fmt::format("vld_runs8(L{} + {}, {})", li, index(a.strides), flat_offset(a, 8));
    inner = how == FlatRead::Broadcast ? 0 : 1;
  }
  if (inner == 0) {
    std::string p = fmt::format("L{}[{}]", li, index(a.strides));
    if (a.dtype == DType::BFloat16) p = "kn_bf16_f32(" + p + ")";
    if (a.dtype == DType::Bool) p = "(" + p + " != 0 ? 1.0f : 0.0f)";
    return "vset(" + p + ")";
  }
  std::string p = fmt::format("L{} + {}", li, index(a.strides));
  return a.dtype == DType::BFloat16 ? "vld_bf16(" + p + ")" : "vld(" + p + ")";
}

// Expression e converted to the compute type of `to` (all vector values are float lanes).
std::string KernelEmitter::cvt(int e, DType to, bool vec) const {
  return vec ? fmt::format("v{}", e) : lower::convert_expr(k_, e, to);
}

// The scalar form is shared with every target (lower/scalar_code.h); the SIMD form is the CPU's.
std::string KernelEmitter::expr_code(int ei, bool vec) const {
  if (k_.exprs[size_t(ei)].kind == LoopExpr::Kind::Indexed)
    return vec ? grid_lanes_code(ei) : indexed_code(ei);
  if (!vec) return lower::scalar_expr(k_, ei, lower::kHostDialect);
  const LoopExpr& e = k_.exprs[size_t(ei)];
  DType od = e.dtype;
  auto arg = [&](int i, DType to) { return cvt(e.args[size_t(i)], to, true); };
  std::string r;
  switch (e.kind) {
    case LoopExpr::Kind::Load: return vload(e.load);
    case LoopExpr::Kind::Scalar: return fmt::format("vset((float){})", num(e.scalar));
    default: break;
  }
  const Attrs& at = *e.attrs;
  auto un = [&](const char* vname) { return fmt::format("{}({})", vname, arg(0, od)); };
  switch (e.op) {
    case OpId::Neg: r = un("vneg"); break;
    case OpId::Abs: r = un("vabs"); break;
    case OpId::Exp: r = un("vexp"); break;
    case OpId::Log: r = un("vlog"); break;
    case OpId::Sqrt: r = un("vsqrt"); break;
    case OpId::Rsqrt: r = un("vrsqrt"); break;
    case OpId::Reciprocal: r = un("vrecip"); break;
    case OpId::Sigmoid: r = un("vsigmoid"); break;
    case OpId::Tanh: r = un("vtanh"); break;
    case OpId::Relu: r = un("vrelu"); break;
    case OpId::Gelu: r = un(at.get_string("approximate") == "tanh" ? "vgelu_tanh" : "vgelu"); break;
    case OpId::Silu: r = un("vsilu"); break;
    case OpId::Erf: r = un("verf"); break;
    case OpId::Sin: r = un("vsin"); break;
    case OpId::Cos: r = un("vcos"); break;
    case OpId::Floor: r = un("vfloor"); break;
    case OpId::Ceil: r = un("vceil"); break;
    case OpId::Round: r = un("vround"); break;
    case OpId::Sign: r = un("vsign"); break;
    case OpId::Not: r = fmt::format("vnot({})", arg(0, DType::Bool)); break;
    case OpId::Copy: r = arg(0, od); break;
    case OpId::Clamp: {
      bool lo = at.has("min"), hi = at.has("max");
      double vlo = lo ? at.get_float("min") : 0, vhi = hi ? at.get_float("max") : 0;
      r = fmt::format("vclamp({}, {}, (float){}, {}, (float){})", arg(0, od), lo, num(vlo), hi, num(vhi));
      break;
    }
    case OpId::Cast: {
      std::string x = fmt::format("v{}", e.args[0]);
      r = od == DType::Bool ? fmt::format("vne({}, vset(0.0f))", x) : x;
      break;
    }
    case OpId::Add: case OpId::Sub: case OpId::Mul: case OpId::Div: case OpId::Pow:
    case OpId::Maximum: case OpId::Minimum: {
      const char* f = e.op == OpId::Add ? "+" : e.op == OpId::Sub ? "-" : e.op == OpId::Mul ? "*" : e.op == OpId::Div ? "/" : nullptr;
      if (f) r = fmt::format("({} {} {})", arg(0, od), f, arg(1, od));
      else r = fmt::format("{}({}, {})", e.op == OpId::Pow ? "vpow" : e.op == OpId::Maximum ? "vmax" : "vmin", arg(0, od), arg(1, od));
      break;
    }
    case OpId::Eq: case OpId::Ne: case OpId::Lt: case OpId::Le: case OpId::Gt: case OpId::Ge: {
      DType ct = promote_types(k_.exprs[size_t(e.args[0])].dtype, k_.exprs[size_t(e.args[1])].dtype);
      const char* f = e.op == OpId::Eq ? "veq" : e.op == OpId::Ne ? "vne" : e.op == OpId::Lt ? "vlt"
                    : e.op == OpId::Le ? "vle" : e.op == OpId::Gt ? "vgt" : "vge";
      r = fmt::format("{}({}, {})", f, arg(0, ct), arg(1, ct));
      break;
    }
    case OpId::And: case OpId::Or:
      r = fmt::format("{}({}, {})", e.op == OpId::And ? "vand" : "vor", arg(0, DType::Bool), arg(1, DType::Bool));
      break;
    case OpId::Where:
      r = fmt::format("vsel({}, {}, {})", arg(0, DType::Bool), arg(1, od), arg(2, od));
      break;
    default:
      throw_error(ErrorKind::Internal, fmt::format("codegen: kernel {}: op '{}' has no loop code",
                                                   k_.name, op_def(e.op).name));
  }
  // Values of 16-bit float dtypes are rounded after every op, as the eager kernels store them
  // (float16 never reaches the vector path).
  if (od == DType::BFloat16) r = "vrbf16(" + r + ")";
  return r;
}

// Load `li` at `L<li>[<its index> + extra]`, converted to its compute type.
std::string KernelEmitter::source_load(int li, const std::string& extra) const {
  std::vector<std::string> text(k_.loads.size());
  text[size_t(li)] = fmt::format("L{}[{} + {}]", li, index(k_.loads[size_t(li)].strides), extra);
  lower::ScalarDialect d;
  d.load_text = &text;
  return lower::load_expr(k_, li, d);
}

// Note [Indexed loads] (lower/loop_ir.h), scalar only: a GNU statement expression, so that the
// bounds test and the taps stay on the expression's line.
std::string KernelEmitter::indexed_code(int ei) const {
  const LoopExpr& e = k_.exprs[size_t(ei)];
  const char* ct = compute_type(e.dtype);
  if (e.op != OpId::GridSample) {
    // A wrapped index outside [0, size) is reported and read as 0: no access outside the source.
    return fmt::format(
        "({{ const i64 q_ = (i64)v{0}; const i64 p_ = q_ < 0 ? q_ + {1} : q_; {2} r_ = 0; "
        "if (p_ >= 0 && p_ < {1}) r_ = {3}; else kn_index_error(err, {4}, q_); r_; }})",
        e.args[0], e.src_size[0], ct, source_load(e.load, fmt::format("p_ * {}", e.src_stride[0])),
        e.check);
  }
  if (read_tables_ && ei == grid_) {
    const std::array<int64_t, 4> tap = grid_tap_offsets(e);
    std::string taps;
    for (int t = 0; t < 4; ++t)
      taps += fmt::format(" if (m_ & {}) a_ += wt_[{}][p_] * {};", 1 << t, t,
                          source_load(e.load, fmt::format("off_[p_] + {}", tap[t])));
    return fmt::format("({{ const int m_ = ok_[p_]; float a_ = 0;\n"
                       "      if (m_ & 16) a_ = (float)NAN; else {{{} }}\n      (float)a_; }})",
                       taps);
  }
  // grid_sample, as ref_grid_sample in ops/resample.cc: bilinear, zeros padding, NaN
  // coordinates give NaN; computed in double for float64, in float otherwise.
  const bool dbl = e.dtype == DType::Float64;
  const char* t = dbl ? "double" : "float";
  const bool ac = e.attrs->get_bool("align_corners");
  const int64_t H = e.src_size[0], W = e.src_size[1];
  auto unnorm = [&](int arg, int64_t size) {
    return ac ? fmt::format("((({0})v{1} + 1) / 2 * ({0}){2})", t, arg, size - 1)
              : fmt::format("(((({0})v{1} + 1) * ({0}){2} - 1) / 2)", t, arg, size);
  };
  std::string r = fmt::format(
      "({{ {0} ix_ = {1}, iy_ = {2}; {0} r_;\n"
      "      if (ix_ != ix_ || iy_ != iy_) r_ = ({0})NAN; else {{\n"
      "        ix_ = ix_ < -2 ? -2 : ix_ > {7} ? {7} : ix_; iy_ = iy_ < -2 ? -2 : iy_ > {8} ? {8} : iy_;\n"
      "        const i64 x0_ = (i64)std::floor(ix_), y0_ = (i64)std::floor(iy_);\n"
      "        const {0} wx1_ = ix_ - ({0})x0_, wy1_ = iy_ - ({0})y0_, wx0_ = 1 - wx1_, wy0_ = 1 - wy1_;\n"
      "        const bool xa_ = x0_ >= 0 && x0_ < {3}, xb_ = x0_ + 1 >= 0 && x0_ + 1 < {3};\n"
      "        const bool ya_ = y0_ >= 0 && y0_ < {4}, yb_ = y0_ + 1 >= 0 && y0_ + 1 < {4};\n"
      "        auto ld_ = [&](i64 y_, i64 x_) -> {0} {{ return ({0}){5}; }};\n"
      "        {0} a_ = 0;\n"
      "        if (ya_ && xa_) a_ += wy0_ * wx0_ * ld_(y0_, x0_);\n"
      "        if (ya_ && xb_) a_ += wy0_ * wx1_ * ld_(y0_, x0_ + 1);\n"
      "        if (yb_ && xa_) a_ += wy1_ * wx0_ * ld_(y0_ + 1, x0_);\n"
      "        if (yb_ && xb_) a_ += wy1_ * wx1_ * ld_(y0_ + 1, x0_ + 1);\n"
      "        r_ = a_; }}\n"
      "      ({6})r_; }})",
      t, unnorm(e.args[0], W), unnorm(e.args[1], H), W, H,
      source_load(e.load, fmt::format("y_ * {} + x_ * {}", e.src_stride[0], e.src_stride[1])), ct,
      W + 1, H + 1);
  if (e.dtype == DType::BFloat16) r = "kn_rbf16(" + r + ")";
  if (e.dtype == DType::Float16) r = "kn_rf16(" + r + ")";
  return r;
}

void KernelEmitter::emit_exprs(std::string& out, const std::vector<bool>& want, Level level,
                               bool vec, const std::string& ind) const {
  for (size_t i = 0; i < k_.exprs.size(); ++i) {
    const LoopExpr& e = k_.exprs[i];
    if (!want[i] || e.level != level) continue;
    if (e.kind == LoopExpr::Kind::Reduce || e.kind == LoopExpr::Kind::Norm) continue;
    const std::string comment = lower::expr_comment(g_, k_, int(i));
    out += fmt::format("{}const {} v{} = {};{}\n", ind, vec ? "VF" : compute_type(e.dtype), i,
                       expr_code(int(i), vec), comment);
  }
}

void KernelEmitter::emit_stores(std::string& out, Level level, bool vec, const std::string& ind) const {
  for (size_t i = 0; i < k_.stores.size(); ++i) {
    const lower::LoopStore& st = k_.stores[i];
    if (k_.exprs[size_t(st.expr)].level != level) continue;
    DType d = st.access.dtype;
    std::string v = fmt::format("v{}", st.expr);
    if (vec) {
      std::string p = fmt::format("S{} + {}", i, index(st.access.strides));
      out += ind + (d == DType::BFloat16 ? fmt::format("vst_bf16({}, {});\n", p, v)
                                         : fmt::format("vst({}, {});\n", p, v));
      continue;
    }
    std::string p = fmt::format("S{}[{}]", i, index(st.access.strides));
    out += fmt::format("{}{} = {};\n", ind, p, lower::store_value(d, v));
  }
}

}  // namespace

bool loop_vectorizable(const LoopKernel& k) {
  if (k.kind == LoopKind::Scatter) return false;
  const size_t inner = k.sizes.size() - 1;
  for (const Access& a : k.loads)
    if (!load_vectorizable(a, inner)) return false;
  for (const lower::LoopStore& s : k.stores)
    if (k.exprs[size_t(s.expr)].level != Level::Kept && !store_vectorizable(s.access, inner))
      return false;
  for (const LoopExpr& e : k.exprs) {
    if (e.level == Level::Kept) continue;
    if (!expr_vectorizable(e)) return false;
    if (e.kind == LoopExpr::Kind::Norm && e.dtype == DType::Bool) return false;
  }
  return true;
}

// Note [lane reductions]
// The usual SIMD reduction runs its lanes along the innermost reduced dim, which needs that dim
// contiguous. A reduction over an outer dim of the data (PointPillars' max over the points of
// each pillar, [P, N, C] -> [P, C]; a sum over H of NCHW) has its innermost reduce dim strided
// and its innermost kept dim contiguous: its lanes run across KN_W neighbouring outputs of the
// innermost kept dim instead, each lane walking the reduce dims in the scalar loop's order with
// the scalar loop's operations, so every output is bitwise what the scalar kernel computes. The
// epilogue and the stores are vectors too. A block of lanes is up to kLaneVectors vectors wide,
// each with its own accumulator: one vector per reduce step read 64 bytes of every 256-byte row
// of PointPillars' [P, 32, 64] points and left the rest of each line to the next block, 7.2 ms
// for 49 MB (`kiln profile`, 13x its floor); four vectors read whole rows. Taken when the usual
// vector path is not possible and every load is contiguous or broadcast along that kept dim,
// every store is contiguous along it (a store of the prologue, at full level, writes its lanes
// at every reduce step: MobileNet-v3's hardswish stored for the convolution while its
// channels-last mean is taken, Note [channels-last values]), and everything is SIMD-able (var keeps the scalar kernel: its second pass is not written for
// lanes).
constexpr int64_t kLaneVectors = 4;

bool lane_reducible(const LoopKernel& k) {
  if (k.kind != LoopKind::Reduce || k.anchor < 0 || k.kept_dims() < 1 || k.reduce_dims < 1)
    return false;
  const LoopExpr& red = k.exprs[size_t(k.anchor)];
  if (red.kind != LoopExpr::Kind::Reduce) return false;
  if (red.op != OpId::Sum && red.op != OpId::Mean && red.op != OpId::Max && red.op != OpId::Min &&
      red.op != OpId::Prod)
    return false;
  if (red.dtype != DType::Float32 && red.dtype != DType::BFloat16) return false;
  const size_t vd = size_t(k.kept_dims() - 1);
  for (const Access& a : k.loads)
    if (!load_vectorizable(a, vd)) return false;
  for (const lower::LoopStore& st : k.stores)
    if (!store_vectorizable(st.access, vd)) return false;
  for (const LoopExpr& e : k.exprs)
    if (!expr_vectorizable(e) || e.kind == LoopExpr::Kind::Norm) return false;
  return true;
}

namespace {

// Note [grid_sample tap tables]
// A kernel that is one grid_sample alone (DCN-style sampling: [C, H*W] with the sampling grid
// shared by every channel) computed its coordinates, clamps, floors, weights and bounds tests
// for every output element, once per channel: deform_sampling's nine grid_samples took 1.5-2 ms
// each at one thread, 70-90x their roofline (`kiln profile`). When a dim d of the space walks
// the source but not the grid (the channels), the taps (the top-left tap's offset, the four
// weights, which taps are in bounds, NaN coordinates) are computed once into small tables, then
// every point along d reads them:
//   - Pointwise (a grid_sample stored alone): the innermost dim in blocks of kGridBlock points;
//     along them, KN_W points at a time gather their taps (masked gathers: an out-of-bounds tap
//     reads nothing) where the source is float32, its offsets fit int32 and the store is
//     contiguous along them;
//   - Reduce (multi-scale deformable attention: the samples of [head, channel, query, point]
//     weighted and summed over the points, float32 sum or mean, no full-level stores): per tile
//     of up to Q points of the innermost other kept dim t (the queries), a table of their
//     reduced points (kGridTableRows per point at most); every other expression is evaluated as
//     in the scalar kernel. The sums of a tile go to a small buffer first, and its epilogue and
//     stores then run along t innermost, where the output is usually contiguous (msda's
//     [head, channel, query] sum): storing each sum as it was finished wrote a new cache line
//     per channel, 2500 floats apart.
// The tables are filled from the stored coordinates by kn_grid_taps (the prelude), SIMD over
// their rows: msda's per-query tables of 4 points were filled one scalar row at a time, with
// branches, which took a third of its kernels' time (0.5 of 1.45 ms at one thread); a tile of
// queries gives the fill whole vectors of rows.
// The arithmetic per output is the scalar kernel's, in its order (a tap's weight is formed
// before it multiplies the value, as there; an absent tap adds nothing: the SIMD forms add a
// zero product, which leaves the sum as it is, since a sum started at +0 is never -0), so the
// SIMD and scalar forms give the same bits.
constexpr int64_t kGridBlock = 256;
constexpr int64_t kGridTableRows = 1024;
constexpr int64_t kGridTileRows = 64;    // the Reduce form's tile: Q * rows up to this
constexpr int64_t kGridTilePoints = 16;  // and Q up to this
constexpr int64_t kGridSums = 4096;      // and its sums buffer, Q * size(d), up to this
constexpr int64_t kGridMaxDim = 16384;   // size(d) for the Reduce form
// Note [grid taps per point]
// The Reduce form's SIMD loop ran KN_W outputs along d, and for each the reduced points, each
// reading its tap table entries (the mask bits, four weights, the offset) again: msda's 32
// channels a head read every point's entries twice at 16 lanes. Where d is a multiple of 16 up
// to this size, the points are the outer loop and the KN_W-wide runs of d the inner one, with
// an accumulator per run: each point's entries are read and broadcast once. Each output still
// adds its terms in the scalar loop's order, so the sums are the same bits. A copy of msda's
// level-0 kernel ran 0.92 -> 0.84 ms this way (median of five).
constexpr int64_t kGridHoistDim = 64;

bool KernelEmitter::find_grid_tables() {
  const bool reduce = k_.kind == LoopKind::Reduce;
  if (reduce) {
    if (k_.anchor < 0 || k_.kept_dims() < 1) return false;
    const LoopExpr& red = k_.exprs[size_t(k_.anchor)];
    if (red.kind != LoopExpr::Kind::Reduce || (red.op != OpId::Sum && red.op != OpId::Mean) ||
        red.dtype != DType::Float32 || k_.exprs[size_t(red.args[0])].dtype != DType::Float32)
      return false;
    for (const lower::LoopStore& st : k_.stores)
      if (k_.exprs[size_t(st.expr)].level == Level::Full) return false;
    int64_t rows = 1;
    for (int t = k_.kept_dims(); t < n(); ++t) rows *= k_.sizes[size_t(t)];
    if (rows > kGridTableRows) return false;
  } else if (k_.kind != LoopKind::Pointwise || n() < 2 || k_.stores.size() != 1) {
    return false;
  }
  // One float32 grid_sample reading its coordinates from two float32 loads (a pointwise kernel:
  // nothing but those loads, the grid_sample and its store).
  int grid = -1;
  for (size_t i = 0; i < k_.exprs.size(); ++i) {
    const LoopExpr& e = k_.exprs[i];
    if (e.kind == LoopExpr::Kind::Indexed) {
      if (grid >= 0 || e.op != OpId::GridSample || e.dtype != DType::Float32) return false;
      grid = int(i);
    } else if (!reduce && e.kind != LoopExpr::Kind::Load) {
      return false;
    }
  }
  if (grid < 0 || (!reduce && k_.stores[0].expr != grid)) return false;
  const LoopExpr& e = k_.exprs[size_t(grid)];
  for (int a : e.args)
    if (a < 0 || k_.exprs[size_t(a)].kind != LoopExpr::Kind::Load ||
        k_.exprs[size_t(a)].dtype != DType::Float32 || k_.exprs[size_t(a)].level != Level::Full)
      return false;
  // d: a kept dim (reduce) or an outer dim (pointwise) the coordinates do not walk and the
  // source does.
  const int dims = reduce ? k_.kept_dims() : n() - 1;
  for (int d = 0; d < dims; ++d) {
    bool coords_fixed = true;
    for (int a : e.args)
      coords_fixed = coords_fixed && k_.loads[size_t(k_.exprs[size_t(a)].load)].strides[size_t(d)] == 0;
    if (coords_fixed && k_.loads[size_t(e.load)].strides[size_t(d)] != 0) {
      if (reduce && k_.sizes[size_t(d)] > kGridMaxDim) return false;
      grid_ = grid;
      grid_dim_ = d;
      return true;
    }
  }
  return false;
}

std::string KernelEmitter::grid_coords(const std::string& ind) const {
  const LoopExpr& e = k_.exprs[size_t(grid_)];
  return fmt::format("{0}cx_[p_] = (float){1}; cy_[p_] = (float){2};\n", ind,
                     expr_code(e.args[0], false), expr_code(e.args[1], false));
}

std::string KernelEmitter::grid_tables(int64_t rows, const char* off_type,
                                       const std::string& ind) const {
  return fmt::format("{0}alignas(64) float cx_[{1}], cy_[{1}], wt_[4][{1}];\n"
                     "{0}alignas(64) int tx_[{1}], ty_[{1}], ok_[{1}];\n"
                     "{0}alignas(64) {2} off_[{1}];\n",
                     ind, rows, off_type);
}

std::string KernelEmitter::grid_fill(int64_t rows, const char* off_type, const std::string& n,
                                     const std::string& ind) const {
  const LoopExpr& e = k_.exprs[size_t(grid_)];
  const int64_t H = e.src_size[0], W = e.src_size[1];
  return fmt::format(
      "{0}kn_grid_taps(cx_, cy_, {1}, {2}, {3}, {4}, &wt_[0][0], {5}, ok_, tx_, ty_);\n"
      "{0}for (i64 r_ = 0; r_ < {1}; ++r_) off_[r_] = ({6})ty_[r_] * {7} + ({6})tx_[r_] * {8};\n",
      ind, n, e.attrs->get_bool("align_corners") ? 1 : 0, W, H, rows, off_type, e.src_stride[0],
      e.src_stride[1]);
}

// The Reduce form: per tile of points along t (the innermost kept dim other than d), the tables
// of every reduced point of the tile; then each output along d walks the reduce dims as the
// scalar kernel does, into the tile's sums buffer; then the epilogue and the stores, t innermost.
void KernelEmitter::emit_reduce_grid(std::string& out) {
  const LoopExpr& red = k_.exprs[size_t(k_.anchor)];
  const int x = red.args[0], kept = k_.kept_dims(), r = n(), d = grid_dim_;
  int64_t rows = 1;
  for (int t = kept; t < r; ++t) rows *= k_.sizes[size_t(t)];
  const int64_t D = k_.sizes[size_t(d)];
  int tdim = -1;
  for (int t = kept - 1; t >= 0 && tdim < 0; --t)
    if (t != d) tdim = t;
  const int64_t T = tdim >= 0 ? k_.sizes[size_t(tdim)] : 1;
  const int64_t Q = std::max<int64_t>(
      1, std::min({kGridTileRows / rows, kGridTilePoints, T, kGridSums / D}));
  const int64_t QR = Q * rows;
  // The reduce loops around `body`, with p_ the row of the reduced point (rb_ + its flat index).
  auto reduce_nest = [&](std::string& o, const std::string& ind, auto&& body) {
    std::string in = ind, flat = fmt::format("i{}", kept);
    for (int t = kept; t < r; ++t) {
      o += fmt::format("{0}for (i64 i{1} = 0; i{1} < {2}; ++i{1}) {{\n", in, t, k_.sizes[size_t(t)]);
      in += "  ";
      if (t > kept) flat = fmt::format("({}) * {} + i{}", flat, k_.sizes[size_t(t)], t);
    }
    o += fmt::format("{}const i64 p_ = rb_ + {};\n", in, flat);
    body(o, in);
    for (int t = kept; t < r; ++t) {
      in.resize(in.size() - 2);
      o += in + "}\n";
    }
  };
  // The point of the tile: i<t> from tb_ and q_.
  const std::string point = tdim >= 0 ? fmt::format("const i64 i{} = tb_ + q_; ", tdim) : "";
  if (par() && kept > 1)
    out += fmt::format("  #pragma omp parallel for collapse({}) schedule(static) if(nt > 1) num_threads(nt)\n", kept - 1);
  for (int t = 0; t < kept; ++t) {
    if (t == d) continue;
    if (t == tdim)
      out += fmt::format("  for (i64 tt_ = 0; tt_ < {}; ++tt_)\n", (T + Q - 1) / Q);
    else
      out += fmt::format("  for (i64 i{0} = 0; i{0} < {1}; ++i{0})\n", t, k_.sizes[size_t(t)]);
  }
  out += "  {\n";
  out += grid_tables(QR, "i64", "    ");
  out += fmt::format("    alignas(64) float sums_[{}][{}];\n", Q, D);
  out += tdim >= 0 ? fmt::format("    const i64 tb_ = tt_ * {0}, tn_ = tb_ + {0} < {1} ? {0} : {1} - tb_;\n", Q, T)
                   : "    const i64 tb_ = 0, tn_ = 1;\n    (void)tb_;\n";
  // The tables (the coordinates do not depend on dim d: i<d> = 0).
  out += fmt::format("    for (i64 q_ = 0; q_ < tn_; ++q_) {{\n      {}const i64 i{} = 0, rb_ = q_ * {};\n",
                     point, d, rows);
  reduce_nest(out, "      ", [&](std::string& o, const std::string& in) { o += grid_coords(in); });
  out += "    }\n";
  out += grid_fill(QR, "i64", fmt::format("tn_ * {}", rows), "    ");
  const std::vector<bool> want = lower::expr_closure(k_, x);
  std::vector<bool> all(k_.exprs.size(), true);
  std::string result = red.op == OpId::Mean ? fmt::format("acc / (float){}", red.count) : "acc";
  // The sum over the reduced points of output i<d> (SIMD: of KN_W outputs from i<d> on).
  auto sum_terms = [&](bool v) {
    reduce_nest(out, "        ", [&](std::string& o, const std::string& in) {
      read_tables_ = true;
      emit_exprs(o, want, Level::Full, v, in);
      read_tables_ = false;
      o += v ? fmt::format("{}vacc = vacc + v{};\n", in, x) : fmt::format("{}acc += (float)v{};\n", in, x);
    });
  };
  out += fmt::format("    for (i64 q_ = 0; q_ < tn_; ++q_) {{\n      {}const i64 rb_ = q_ * {};\n", point, rows);
  out += fmt::format("      i64 i{} = 0;\n", d);
  if (grid_lanes() && D % 16 == 0 && D <= kGridHoistDim) {
    // Note [grid taps per point]: every KN_W-wide run of d per point, the point's tap table
    // entries read once for all of them.
    const LoopExpr& ge = k_.exprs[size_t(grid_)];
    std::vector<int64_t> at_d0 = k_.loads[size_t(ge.load)].strides;
    at_d0[size_t(d)] = 0;
    out += fmt::format("#ifdef KN_W\n      {{\n        VF vacc_[{0} / KN_W];\n"
                       "        for (int c_ = 0; c_ < {0} / KN_W; ++c_) vacc_[c_] = vset(0.0f);\n", D);
    vdim_ = d;
    reduce_nest(out, "        ", [&](std::string& o, const std::string& in) {
      o += fmt::format("{0}const int m_ = ok_[p_];\n"
                       "{0}const VF w0_ = vset(wt_[0][p_]), w1_ = vset(wt_[1][p_]), w2_ = vset(wt_[2][p_]), "
                       "w3_ = vset(wt_[3][p_]);\n"
                       "{0}const int b0_ = m_ & 1, b1_ = (m_ >> 1) & 1, b2_ = (m_ >> 2) & 1, b3_ = (m_ >> 3) & 1;\n"
                       "{0}const float* sb_ = L{1} + {2} + off_[p_];\n"
                       "{0}for (int c_ = 0; c_ < {3} / KN_W; ++c_) {{\n"
                       "{0}  const i64 i{4} = c_ * KN_W;\n",
                       in, ge.load, index(at_d0), D, d);
      read_tables_ = true;
      grid_hoisted_ = true;
      emit_exprs(o, want, Level::Full, true, in + "  ");
      grid_hoisted_ = false;
      read_tables_ = false;
      o += fmt::format("{0}  vacc_[c_] = vacc_[c_] + v{1};\n{0}}}\n", in, x);
    });
    vdim_ = -1;
    out += fmt::format("        for (int c_ = 0; c_ < {0} / KN_W; ++c_) vst(&sums_[q_][c_ * KN_W], vacc_[c_]);\n"
                       "        i{1} = {0};\n      }}\n#endif\n", D, d);
  } else if (grid_lanes()) {
    // KN_W outputs along d at a time: each lane sums its own output's terms in the scalar
    // loop's order.
    out += fmt::format("#ifdef KN_W\n      for (; i{0} + KN_W <= {1}; i{0} += KN_W) {{\n", d, D);
    out += "        VF vacc = vset(0.0f);\n";
    vdim_ = d;
    sum_terms(true);
    vdim_ = -1;
    out += fmt::format("        vst(&sums_[q_][i{}], vacc);\n      }}\n#endif\n", d);
  }
  out += fmt::format("      for (; i{0} < {1}; ++i{0}) {{\n        float acc = 0;\n", d, D);
  sum_terms(false);
  out += fmt::format("        sums_[q_][i{}] = acc;\n      }}\n    }}\n", d);
  // The epilogue and the stores of every output of the tile, from its sum: KN_W outputs along
  // d at a time where every epilogue load and store is contiguous or broadcast along d (sums
  // stored channels innermost: Note [grid sums stored channels innermost] in
  // lower/scheduler.cc), each lane doing the scalar epilogue's ops.
  if (grid_epilogue_lanes()) {
    out += fmt::format("    for (i64 q_ = 0; q_ < tn_; ++q_) {{\n      {}i64 i{} = 0;\n", point, d);
    out += fmt::format("#ifdef KN_W\n      for (; i{0} + KN_W <= {1}; i{0} += KN_W) {{\n", d, D);
    out += fmt::format("        const VF vacc = vld(&sums_[q_][i{}]);\n", d);
    out += fmt::format("        const VF v{} = {};\n", k_.anchor,
                       red.op == OpId::Mean ? fmt::format("vacc / vset((float){})", red.count) : "vacc");
    vdim_ = d;
    emit_exprs(out, all, Level::Kept, true, "        ");
    emit_stores(out, Level::Kept, true, "        ");
    vdim_ = -1;
    out += "      }\n#endif\n";
    out += fmt::format("      for (; i{0} < {1}; ++i{0}) {{\n        const float acc = sums_[q_][i{0}];\n", d, D);
    out += fmt::format("        const float v{} = (float)({});\n", k_.anchor, result);
    emit_exprs(out, all, Level::Kept, false, "        ");
    emit_stores(out, Level::Kept, false, "        ");
    out += "      }\n    }\n  }\n";
    return;
  }
  out += fmt::format("    for (i64 i{0} = 0; i{0} < {1}; ++i{0})\n", d, D);
  out += fmt::format("    for (i64 q_ = 0; q_ < tn_; ++q_) {{\n      {}const float acc = sums_[q_][i{}];\n",
                     point, d);
  out += fmt::format("      const float v{} = (float)({});\n", k_.anchor, result);
  emit_exprs(out, all, Level::Kept, false, "      ");
  emit_stores(out, Level::Kept, false, "      ");
  out += "    }\n  }\n";
}

// The Reduce form's lanes: along grid_dim_ (the channels) when the sampled source is contiguous
// there (msda's value, [.., H, W, heads * channels]), so that a tap of KN_W channels is one
// vector load, and every other term of the sum has a SIMD form along that dim (loads contiguous
// or broadcast along it: the attention weights do not depend on the channel).
bool KernelEmitter::grid_lanes() const {
  if (!opt_.vectorize || k_.kind != LoopKind::Reduce || grid_ < 0) return false;
  const size_t d = size_t(grid_dim_);
  const LoopExpr& g = k_.exprs[size_t(grid_)];
  const Access& src = k_.loads[size_t(g.load)];
  if (src.dtype != DType::Float32 || src.strides[d] != 1) return false;
  const std::vector<bool> want = lower::expr_closure(k_, k_.exprs[size_t(k_.anchor)].args[0]);
  return float_lanes_along(Level::Full, d, &want, grid_);
}

// Whether every expression at `lv` (of `want`, where given) but `skip` has a float32 SIMD form
// whose loads are float32 and contiguous or broadcast along d: the grid Reduce form's sum and
// its epilogue, each with KN_W lanes along d.
bool KernelEmitter::float_lanes_along(Level lv, size_t d, const std::vector<bool>* want,
                                      int skip) const {
  for (size_t i = 0; i < k_.exprs.size(); ++i) {
    const LoopExpr& e = k_.exprs[i];
    if ((want && !(*want)[i]) || e.level != lv || int(i) == skip) continue;
    if (e.dtype != DType::Float32 || !expr_vectorizable(e) || e.kind == LoopExpr::Kind::Reduce ||
        e.kind == LoopExpr::Kind::Norm)
      return false;
    if (e.kind == LoopExpr::Kind::Load) {
      const Access& a = k_.loads[size_t(e.load)];
      if (a.dtype != DType::Float32 || !load_vectorizable(a, d)) return false;
    }
  }
  return true;
}

// The Reduce form's epilogue along grid_dim_ (above): SIMD lanes, every op of it with a SIMD
// form, every load and store of it float32 (or a bfloat16 store) and contiguous or broadcast
// along d.
bool KernelEmitter::grid_epilogue_lanes() const {
  if (!grid_lanes()) return false;
  const size_t d = size_t(grid_dim_);
  bool any = false;
  for (const lower::LoopStore& st : k_.stores) {
    if (k_.exprs[size_t(st.expr)].level != Level::Kept) continue;
    if (!store_vectorizable(st.access, d)) return false;
    any = true;
  }
  return any && float_lanes_along(Level::Kept, d, nullptr, k_.anchor);
}

// KN_W neighbours along d: every tap is one masked vector load (nothing read where the tap is
// out of bounds), weighted and added in the scalar form's order.
std::string KernelEmitter::grid_lanes_code(int ei) const {
  const LoopExpr& e = k_.exprs[size_t(ei)];
  KILN_ASSERT(read_tables_ && ei == grid_ && vdim_ == grid_dim_);
  const std::array<int64_t, 4> tap = grid_tap_offsets(e);
  // Hoisted (Note [grid taps per point]): the point's m_, w<t>_, b<t>_ and sb_ are read above,
  // in emit_reduce_grid; else each from the tables here.
  const bool h = grid_hoisted_;
  std::string taps;
  for (int t = 0; t < 4; ++t)
    taps += fmt::format("\n        a_ = a_ + {} * vld_if({}, s_ + {});",
                        h ? fmt::format("w{}_", t) : fmt::format("vset(wt_[{}][p_])", t),
                        h ? fmt::format("b{}_", t) : fmt::format("(m_ >> {}) & 1", t), tap[t]);
  return fmt::format("({{ {}VF a_ = vset(0.0f);\n"
                     "      if (m_ & 16) a_ = vset((float)NAN); else {{\n"
                     "        const float* s_ = {};{} }}\n      a_; }})",
                     h ? "" : "const int m_ = ok_[p_]; ",
                     h ? fmt::format("sb_ + i{}", grid_dim_)
                       : fmt::format("L{} + {} + off_[p_]", e.load, index(k_.loads[size_t(e.load)].strides)),
                     taps);
}

bool KernelEmitter::grid_gathers() const {
  if (!opt_.vectorize || k_.kind != LoopKind::Pointwise || grid_ < 0) return false;
  const LoopExpr& e = k_.exprs[size_t(grid_)];
  if (k_.loads[size_t(e.load)].dtype != DType::Float32) return false;
  const int64_t H = e.src_size[0], W = e.src_size[1];
  const int64_t far = (H + 2) * std::abs(e.src_stride[0]) + (W + 2) * std::abs(e.src_stride[1]);
  if (far >= (int64_t(1) << 31)) return false;
  return store_vectorizable(k_.stores[0].access, size_t(n() - 1));
}

// Note [grid_sample channels-last]
// The Pointwise form gathers KN_W points' taps per channel (four masked gathers per KN_W
// outputs): deform_sampling's nine grid_samples of a [64, 64, 64] NCHW feature map took 0.42 ms
// each at one thread, 19x their floor, bound by Zen 4's gathers. Where the source is contiguous
// along the dim the tables are shared across (the channels: a source stored channels-last, which
// the CPU target's grid-sample-channels-last pass arranges, passes/grid_sample_layout.h), its
// size along it is a multiple of 16, and the store is float32 and contiguous along the points,
// the block's points go KN_W at a time instead, per run of KN_W channels: each point's taps are
// four masked vector loads (nothing read where a tap is out of bounds), weighted and added in
// the scalar form's order into one vector (lanes = channels), a row of a KN_W x KN_W tile that
// kn_transpose_w stores as KN_W runs of KN_W points, one per channel. The points of a block
// left over (fewer than KN_W) go through the scalar loop. Same arithmetic in the same order per
// output as the other forms. The runs of channels are the outer loop: with the points outer,
// every tile stored a line into each of the 64 output rows, 16 KiB apart (one set of L1), and
// the kernel took 0.18-0.20 ms; so 0.14-0.16 ms (`kiln profile deform_sampling.onnx --threads
// 1`), 6.5-7.5x the floor. Tried and not kept, no change measured: non-temporal stores of the
// tiles, unmasked loads for points with all four taps inside, prefetching the taps of the
// point 8 ahead.
bool KernelEmitter::grid_point_lanes() const {
  if (!opt_.vectorize || k_.kind != LoopKind::Pointwise || grid_ < 0) return false;
  const size_t d = size_t(grid_dim_);
  const Access& src = k_.loads[size_t(k_.exprs[size_t(grid_)].load)];
  const Access& st = k_.stores[0].access;
  return src.dtype == DType::Float32 && src.strides[d] == 1 && k_.sizes[d] % 16 == 0 &&
         st.dtype == DType::Float32 && st.strides[size_t(n() - 1)] == 1 && st.strides[d] != 0;
}

// The Pointwise form: blocks of kGridBlock points of the innermost dim.
void KernelEmitter::emit_grid_taps(std::string& out) {
  const int r = n(), in = r - 1, d = grid_dim_;
  const int64_t N = k_.sizes[size_t(in)];
  const int64_t blocks = (N + kGridBlock - 1) / kGridBlock;
  const bool gathers = grid_gathers();
  const char* off_type = gathers ? "int" : "i64";
  if (par())
    out += fmt::format("  #pragma omp parallel for collapse({}) schedule(static) if(nt > 1) num_threads(nt)\n", r - 1);
  for (int t = 0; t < in; ++t)
    if (t != d) out += fmt::format("  for (i64 i{0} = 0; i{0} < {1}; ++i{0})\n", t, k_.sizes[size_t(t)]);
  out += fmt::format("  for (i64 blk_ = 0; blk_ < {}; ++blk_)\n  {{\n", blocks);
  out += fmt::format("    const i64 j0_ = blk_ * {0}, j1_ = j0_ + {0} < {1} ? j0_ + {0} : {1};\n", kGridBlock, N);
  out += grid_tables(kGridBlock, off_type, "    ");
  // The taps of the block's points (the coordinates do not depend on dim d: i<d> = 0).
  out += fmt::format("    {{\n      const i64 i{} = 0;\n", d);
  out += fmt::format("      for (i64 i{0} = j0_; i{0} < j1_; ++i{0}) {{\n", in);
  out += fmt::format("        const i64 p_ = i{} - j0_;\n", in);
  out += grid_coords("        ");
  out += "      }\n    }\n";
  out += grid_fill(kGridBlock, off_type, "j1_ - j0_", "    ");
  // Points [j0_, jt_) in tiles of KN_W points x KN_W channels (Note [grid_sample channels-last]).
  out += "    i64 jt_ = j0_;\n";
  if (grid_point_lanes()) {
    const lower::LoopStore& st = k_.stores[0];
    const int64_t D = k_.sizes[size_t(d)];
    // Runs of KN_W channels outermost, so that the stores of a run fill KN_W output rows in
    // order (with the points outermost, every tile stored a line into each of size(d) rows,
    // 16 KiB apart in deform_sampling: one set of L1).
    out += "#ifdef KN_W\n    const i64 jn_ = j0_ + (j1_ - j0_) / KN_W * KN_W;\n";
    out += fmt::format("    for (i64 i{0} = 0; i{0} < {1}; i{0} += KN_W)\n", d, D);
    out += fmt::format("      for (i64 i{0} = j0_; i{0} < jn_; i{0} += KN_W) {{\n", in);
    out += "        alignas(64) float t_[KN_W * KN_W];\n";
    out += fmt::format("        for (int j_ = 0; j_ < KN_W; ++j_) {{\n          const i64 p_ = i{} - j0_ + j_;\n", in);
    read_tables_ = true;
    vdim_ = d;
    out += fmt::format("          vst(t_ + j_ * KN_W, {});\n", grid_lanes_code(grid_));
    vdim_ = -1;
    read_tables_ = false;
    out += "        }\n";
    out += fmt::format("        kn_transpose_w(t_, KN_W, S0 + {}, {});\n      }}\n", index(st.access.strides),
                       st.access.strides[size_t(d)]);
    out += "    jt_ = jn_;\n#endif\n";
  }
  // Every point along d through the tables.
  out += fmt::format("    for (i64 i{0} = 0; i{0} < {1}; ++i{0}) {{\n", d, k_.sizes[size_t(d)]);
  out += fmt::format("      i64 i{} = jt_;\n", in);
  if (gathers) {
    const LoopExpr& e = k_.exprs[size_t(grid_)];
    const std::array<int64_t, 4> tap = grid_tap_offsets(e);
    out += fmt::format("#ifdef KN_W\n      const float* g_ = L{} + {};\n", e.load,
                       index(k_.loads[size_t(e.load)].strides));
    out += fmt::format("      for (; i{0} + KN_W <= j1_; i{0} += KN_W) {{\n", in);
    out += fmt::format("        const i64 p_ = i{} - j0_;\n        VF a_ = vset(0.0f);\n", in);
    for (int t = 0; t < 4; ++t)
      out += fmt::format("        a_ = a_ + vld(&wt_[{0}][p_]) * vgather_tap(g_ + {1}, off_ + p_, ok_ + p_, {2});\n",
                         t, tap[t], 1 << t);
    out += fmt::format("        const VF v{} = vnan_where(a_, ok_ + p_);\n", grid_);
    emit_stores(out, Level::Full, true, "        ");
    out += "      }\n#endif\n";
  }
  out += fmt::format("      for (; i{0} < j1_; ++i{0}) {{\n", in);
  out += fmt::format("        const i64 p_ = i{} - j0_;\n", in);
  read_tables_ = true;
  out += fmt::format("        const float v{} = {};\n", grid_, expr_code(grid_, false));
  read_tables_ = false;
  emit_stores(out, Level::Full, false, "        ");
  out += "      }\n    }\n  }\n";
}

// Note [tiled transposes]
// A pointwise kernel that reads a value across its rows (a transposing copy: msda's matmul
// operands, [256, 256] read with a stride of 256 floats) walks its innermost dim with a stride,
// touching a new cache line per element, and the next row comes back for the lines' next
// elements after they left L1 (a 1 KiB stride maps them to 4 of its 64 sets): 0.76 ms for 65k
// floats, 35x its floor (`kiln profile`, msda_bev). When such a load is contiguous along an
// outer dim t, the kernel walks tiles of kTransposeTile x kTransposeTile points of (t, innermost)
// instead: a tile's reads touch kTransposeTile lines, each used whole. The arithmetic per point
// is unchanged (scalar; the same values in the same order per output element). A kernel that
// only copies a float32 value moves its whole tiles through registers (the prelude's
// kn_transpose16: 16 vector loads, 64 shuffles, 16 vector stores): msda's [1024, 256]
// transposing copy took 0.11 ms scalar, 0.027 ms so, timed alone.
constexpr int64_t kTransposeTile = 16;

void KernelEmitter::emit_pointwise(std::string& out, bool vec) {
  const int r = n();
  if (grid_dim_ >= 0) return emit_grid_taps(out);
  if (vec && flat_dims_ > 0) return emit_flat(out);
  const int64_t N = k_.sizes[size_t(r - 1)];
  int64_t outer = 1;
  for (int t = 0; t + 1 < r; ++t) outer *= k_.sizes[size_t(t)];
  if (const int tt = tiled_dim(vec); tt >= 0) return emit_transposed(out, tt);
  int64_t CH = N;
  if (par() && outer < 64 && N > 8192) CH = 4096;
  int64_t NC = (N + CH - 1) / CH;
  int collapse = (r - 1) + (NC > 1 ? 1 : 0);
  if (par() && collapse > 0)
    out += fmt::format("  #pragma omp parallel for collapse({}) schedule(static) if(nt > 1) num_threads(nt)\n", collapse);
  for (int t = 0; t + 1 < r; ++t)
    out += fmt::format("  for (i64 i{0} = 0; i{0} < {1}; ++i{0})\n", t, k_.sizes[size_t(t)]);
  if (NC > 1) out += fmt::format("  for (i64 c = 0; c < {}; ++c)\n", NC);
  out += "  {\n";
  const std::string in = "    ";
  if (NC > 1)
    out += fmt::format("{0}const i64 j0 = c * {1}, j1 = j0 + {1} < {2} ? j0 + {1} : {2};\n", in, CH, N);
  else
    out += fmt::format("{}const i64 j0 = 0, j1 = {};\n", in, N);
  out += fmt::format("{}i64 i{} = j0;\n", in, r - 1);
  std::vector<bool> all(k_.exprs.size(), true);
  if (vec) {
    out += fmt::format("#ifdef KN_W\n{0}for (; i{1} + KN_W <= j1; i{1} += KN_W) {{\n", in, r - 1);
    emit_exprs(out, all, Level::Full, true, in + "  ");
    emit_stores(out, Level::Full, true, in + "  ");
    out += in + "}\n#endif\n";
  }
  out += fmt::format("{0}for (; i{1} < j1; ++i{1}) {{\n", in, r - 1);
  emit_exprs(out, all, Level::Full, false, in + "  ");
  emit_stores(out, Level::Full, false, in + "  ");
  out += in + "}\n  }\n";
}

// Note [flattened lanes]
// A pointwise kernel's SIMD loop runs along its innermost dim, so a kernel whose innermost
// extent is shorter than a vector ran scalar: msda_bev's sampling offsets, [2500, 8, 4, 2] with
// x and y innermost, divided by per-level normalizers of shape [2] and added to reference points
// of shape [2500, 1, 1, 2], took 0.85 ms at one thread, 7.6x its floor (`kiln profile`), 80,000
// scalar iterations of four divisions each. Such a kernel now runs its lanes across its
// innermost g dims taken as one flat index f (g the fewest dims whose extents' product P is a
// multiple of 16): one loop over f in steps of KN_W inside the outer loops, the g coordinates
// of f decoded once per vector. A vector starting at a multiple of KN_W holds KN_W consecutive
// points of the flat index, and because every multiple of KN_W (8 or 16) decodes without a
// carry out of the lanes (checked: coords(f0 + l) = coords(f0) + coords(l) for every f0 and
// lane l), each lane's offset from the vector's first point is the same for every vector, so
// each load is one of:
//   broadcast:  no stride in the g dims (the reference points along the middle dims): vset;
//   contiguous: strides equal to the flat index's (the offsets themselves): vld;
//   runs of 8:  float32 whose lanes 0-7 are consecutive, lanes 8-15 consecutive elsewhere (the
//               offsets' [x, y] pairs of 4 points of one head, 32 floats on to the next head):
//               two 8-float loads (one under 8-lane vectors);
//   gathered:   any other float32 load (the normalizers, period 2): one gather through a table
//               of the lanes' offsets, made here, the same for every vector.
// Stores must be contiguous. Every lane computes what the scalar loop computes for its point
// with the same operations, so the results are bitwise the scalar kernel's. A kernel that
// fits no such g (an innermost extent of 3 under 16-lane vectors) stays as it was. Knob
// `flat=off` keeps the old form. msda_bev's kernel at one thread (`kiln profile`, A/B by the
// knob): 0.71-0.74 -> 0.19 ms, 1.7-1.8x its floor.
std::vector<int64_t> KernelEmitter::flat_coords(int64_t f) const {
  const int r = n();
  std::vector<int64_t> c(static_cast<size_t>(flat_dims_), 0);
  for (int d = r - 1, j = flat_dims_ - 1; j >= 0; --d, --j) {
    const int64_t e = k_.sizes[size_t(d)];
    c[size_t(j)] = f % e;
    f /= e;
  }
  return c;
}

// Element offset of lane `lane` from lane 0 (Note [flattened lanes]: the same for every vector).
int64_t KernelEmitter::flat_offset(const Access& a, int64_t lane) const {
  const std::vector<int64_t> c = flat_coords(lane);
  int64_t off = 0;
  for (int j = 0, o = n() - flat_dims_; j < flat_dims_; ++j) off += a.strides[size_t(o + j)] * c[size_t(j)];
  return off;
}

bool KernelEmitter::flat_contiguous(const std::vector<int64_t>& strides) const {
  int64_t radix = 1;
  for (int d = n() - 1, j = 0; j < flat_dims_; --d, ++j) {
    if (k_.sizes[size_t(d)] > 1 && strides[size_t(d)] != radix) return false;
    radix *= k_.sizes[size_t(d)];
  }
  return true;
}

KernelEmitter::FlatRead KernelEmitter::flat_read(const Access& a) const {
  bool broadcast = true;
  for (int d = n() - 1, j = 0; j < flat_dims_; --d, ++j)
    broadcast = broadcast && (a.strides[size_t(d)] == 0 || k_.sizes[size_t(d)] == 1);
  if (broadcast) return vec_dtype(a.dtype) ? FlatRead::Broadcast : FlatRead::None;
  if (a.dtype == DType::Bool) return FlatRead::None;
  if (flat_contiguous(a.strides)) return vec_dtype(a.dtype) ? FlatRead::Contiguous : FlatRead::None;
  if (a.dtype != DType::Float32) return FlatRead::None;
  bool runs = true;  // lanes 0-7 consecutive (then 8-15 too, 8 lanes on: no carry out of 8 lanes)
  for (int64_t l = 0; l < 8; ++l) runs = runs && flat_offset(a, l) == l;
  if (runs) return FlatRead::Runs8;
  // The lanes' offsets must fit the gather's int32 indices.
  int64_t span = 0;
  for (int d = n() - 1, j = 0; j < flat_dims_; --d, ++j)
    span += std::abs(a.strides[size_t(d)]) * (k_.sizes[size_t(d)] - 1);
  return span < (int64_t(1) << 30) ? FlatRead::Gather : FlatRead::None;
}

bool KernelEmitter::find_flat_lanes() {
  const int r = n();
  flat_dims_ = 0;
  flat_points_ = 0;
  if (!opt_.vectorize || !opt_.flatten_lanes || k_.kind != LoopKind::Pointwise || r < 2 ||
      k_.sizes.back() >= 16 || k_.numel() < 16)
    return false;
  for (const LoopExpr& e : k_.exprs)
    if (e.level != Level::Kept && !expr_vectorizable(e)) return false;
  int64_t P = k_.sizes.back();
  int g = 1;
  while (P % 16 != 0 || P < 16) {
    if (g == r || P > (int64_t(1) << 16)) return false;
    P *= k_.sizes[size_t(r - 1 - g)];
    ++g;
  }
  if (g < 2 || P > (int64_t(1) << 16)) return false;
  flat_dims_ = g;
  flat_points_ = P;
  // No carry out of the lanes at either vector width (8 or 16 floats): every coordinate of
  // f0 + l is f0's plus l's (flat_coords, per dim, without its vectors: up to 2^17 points).
  for (int64_t W : {8, 16})
    for (int64_t f0 = 0; f0 < P; f0 += W)
      for (int64_t l = 0; l < W; ++l)
        for (int64_t d = r - 1, radix = 1; d >= r - g; radix *= k_.sizes[size_t(d)], --d) {
          const int64_t e = k_.sizes[size_t(d)];
          if ((f0 + l) / radix % e != f0 / radix % e + l / radix % e) {
            flat_dims_ = 0;
            return false;
          }
        }
  bool ok = true;
  for (const Access& a : k_.loads) ok = ok && flat_read(a) != FlatRead::None;
  for (const lower::LoopStore& st : k_.stores)
    ok = ok && (st.access.dtype == DType::Float32 || st.access.dtype == DType::BFloat16) &&
         flat_contiguous(st.access.strides);
  if (!ok) flat_dims_ = 0;
  return ok;
}

void KernelEmitter::emit_flat(std::string& out) {
  const int r = n(), g = flat_dims_, o = r - g;
  out += "#ifdef KN_W\n";
  for (size_t li = 0; li < k_.loads.size(); ++li) {
    const Access& a = k_.loads[li];
    if (flat_read(a) != FlatRead::Gather) continue;
    std::vector<std::string> offs;
    for (int64_t l = 0; l < 16; ++l) offs.push_back(std::to_string(flat_offset(a, l)));
    out += fmt::format("  static const int kfo{}_[16] = {{{}}};\n", li, fmt::join(offs, ", "));
  }
  if (par() && o > 0)
    out += fmt::format("  #pragma omp parallel for collapse({}) schedule(static) if(nt > 1) num_threads(nt)\n", o);
  for (int t = 0; t < o; ++t)
    out += fmt::format("  for (i64 i{0} = 0; i{0} < {1}; ++i{0})\n", t, k_.sizes[size_t(t)]);
  out += "  {\n";
  if (par() && o == 0)
    out += "    #pragma omp parallel for schedule(static) if(nt > 1) num_threads(nt)\n";
  out += fmt::format("    for (i64 f_ = 0; f_ < {}; f_ += KN_W) {{\n", flat_points_);
  int64_t radix = 1;
  std::vector<std::string> decode;
  for (int d = r - 1; d >= o; --d) {
    decode.push_back(fmt::format("i{} = f_ / {} % {}", d, radix, k_.sizes[size_t(d)]));
    radix *= k_.sizes[size_t(d)];
  }
  out += fmt::format("      const i64 {};\n", fmt::join(decode, ", "));
  std::vector<bool> all(k_.exprs.size(), true);
  emit_exprs(out, all, Level::Full, true, "      ");
  emit_stores(out, Level::Full, true, "      ");
  out += "    }\n  }\n#else\n";
  // Without SIMD: the plain loops.
  const int keep = flat_dims_;
  flat_dims_ = 0;
  emit_pointwise(out, false);
  flat_dims_ = keep;
  out += "#endif\n";
}

int KernelEmitter::tiled_dim(bool vec) const {
  const int r = n();
  const int64_t N = k_.sizes.back();
  if (vec || grid_dim_ >= 0 || r < 2 || k_.kind != LoopKind::Pointwise || N < 2 || N > 8192)
    return -1;
  // A load strided along the innermost dim and contiguous along an outer one: its innermost.
  for (const Access& a : k_.loads) {
    const int64_t s = a.strides[size_t(r - 1)];
    if (s == 0 || s == 1 || s == -1) continue;
    for (int t = r - 2; t >= 0; --t)
      if (a.strides[size_t(t)] == 1 && k_.sizes[size_t(t)] > 1) return t;
  }
  return -1;
}

// Whether the tiled kernel is one float32 value copied as it is (a load, copies of it, one
// store contiguous along the innermost dim): its whole tiles go through registers.
bool KernelEmitter::transposes_whole_tiles(int t) const {
  if (!opt_.vectorize || kTransposeTile != 16 || k_.loads.size() != 1 || k_.stores.size() != 1)
    return false;
  const Access& ld = k_.loads[0];
  const Access& st = k_.stores[0].access;
  if (ld.dtype != DType::Float32 || st.dtype != DType::Float32 || ld.strides[size_t(t)] != 1 ||
      st.strides[size_t(n() - 1)] != 1)
    return false;
  for (const LoopExpr& e : k_.exprs) {
    if (e.dtype != DType::Float32) return false;
    if (e.kind == LoopExpr::Kind::Load) continue;
    if (e.kind != LoopExpr::Kind::Op || e.op != OpId::Copy) return false;
  }
  return true;
}

// Note [tiled transposes]: dim t in blocks of kTransposeTile (the parallel loops take the
// blocks), then per block the innermost dim in tiles, t inside a tile, the innermost in it.
void KernelEmitter::emit_transposed(std::string& out, int t) {
  const int r = n(), in = r - 1;
  const int64_t N = k_.sizes[size_t(in)], T = k_.sizes[size_t(t)], B = kTransposeTile;
  if (par())
    out += fmt::format("  #pragma omp parallel for collapse({}) schedule(static) if(nt > 1) num_threads(nt)\n", r - 1);
  for (int d = 0; d < in; ++d)
    out += d == t ? fmt::format("  for (i64 tb_ = 0; tb_ < {}; ++tb_)\n", (T + B - 1) / B)
                  : fmt::format("  for (i64 i{0} = 0; i{0} < {1}; ++i{0})\n", d, k_.sizes[size_t(d)]);
  out += "  {\n";
  out += fmt::format("    const i64 t0_ = tb_ * {0}, t1_ = t0_ + {0} < {1} ? t0_ + {0} : {1};\n", B, T);
  out += fmt::format("    for (i64 n0_ = 0; n0_ < {0}; n0_ += {1}) {{\n", N, B);
  out += fmt::format("      const i64 n1_ = n0_ + {0} < {1} ? n0_ + {0} : {1};\n", B, N);
  if (transposes_whole_tiles(t)) {
    // A float copy: whole tiles through registers (kn_transpose16), the edges as below.
    const Access& ld = k_.loads[0];
    const Access& st = k_.stores[0].access;
    out += fmt::format("#ifdef KN_W\n      if (t1_ - t0_ == {0} && n1_ - n0_ == {0}) {{\n"
                       "        const i64 i{1} = t0_, i{2} = n0_;\n"
                       "        kn_transpose16(L0 + {3}, {4}, S0 + {5}, {6});\n"
                       "        continue;\n      }}\n#endif\n",
                       B, t, in, index(ld.strides), ld.strides[size_t(in)], index(st.strides),
                       st.strides[size_t(t)]);
  }
  out += fmt::format("      for (i64 i{0} = t0_; i{0} < t1_; ++i{0})\n", t);
  out += fmt::format("      for (i64 i{0} = n0_; i{0} < n1_; ++i{0}) {{\n", in);
  std::vector<bool> all(k_.exprs.size(), true);
  emit_exprs(out, all, Level::Full, false, "        ");
  emit_stores(out, Level::Full, false, "        ");
  out += "      }\n    }\n  }\n";
}

// Opens the kept loops (parallel when big) and returns the indentation inside them.
static std::string open_kept(std::string& out, const LoopKernel& k, bool par) {
  int kept = k.kept_dims();
  if (par && kept > 0)
    out += fmt::format("  #pragma omp parallel for collapse({}) schedule(static) if(nt > 1) num_threads(nt)\n", kept);
  for (int t = 0; t < kept; ++t)
    out += fmt::format("  for (i64 i{0} = 0; i{0} < {1}; ++i{0})\n", t, k.sizes[size_t(t)]);
  out += "  {\n";
  return "    ";
}

// Emits the reduce loops around `body_vec` / `body_scalar` (which see i<inner> as the index).
// `body_unrolled` (optional): the body of a loop stepping `unroll` vectors at a time, emitted
// before the one-vector loop.
static void reduce_loops(std::string& out, const LoopKernel& k, const std::string& ind, bool vec,
                         const std::string& body_vec, const std::string& body_scalar,
                         const std::string& body_unrolled = "", int unroll = 1) {
  const int r = int(k.sizes.size());
  out += ind + "{\n";
  std::string in = ind;
  for (int t = k.kept_dims(); t + 1 < r; ++t) {
    out += fmt::format("{0}for (i64 i{1} = 0; i{1} < {2}; ++i{1}) {{\n", in, t, k.sizes[size_t(t)]);
    in += "  ";
  }
  out += fmt::format("{}i64 i{} = 0;\n", in, r - 1);
  if (vec && !body_unrolled.empty() && unroll > 1)
    out += fmt::format("#ifdef KN_W\n{0}for (; i{1} + {4} * KN_W <= {2}; i{1} += {4} * KN_W) {{\n{3}{0}}}\n#endif\n",
                       in, r - 1, k.sizes.back(), body_unrolled, unroll);
  if (vec && !body_vec.empty())
    out += fmt::format("#ifdef KN_W\n{0}for (; i{1} + KN_W <= {2}; i{1} += KN_W) {{\n{3}{0}}}\n#endif\n",
                       in, r - 1, k.sizes.back(), body_vec);
  out += fmt::format("{0}for (; i{1} < {2}; ++i{1}) {{\n{3}{0}}}\n", in, r - 1, k.sizes.back(), body_scalar);
  for (int t = k.kept_dims(); t + 1 < r; ++t) {
    in.resize(in.size() - 2);
    out += in + "}\n";
  }
  out += ind + "}\n";
}

void KernelEmitter::emit_reduce(std::string& out, bool vec) {
  const LoopExpr& red = k_.exprs[size_t(k_.anchor)];
  const int x = red.args[0];
  const bool dbl = k_.exprs[size_t(x)].dtype == DType::Float64 || red.dtype == DType::Float64;
  const char* at = dbl ? "double" : "float";
  std::string ind = open_kept(out, k_, par());
  // Full-level work: what the reduction reads, plus values stored at full level.
  std::vector<bool> want = lower::expr_closure(k_, x);
  for (const lower::LoopStore& st : k_.stores)
    if (k_.exprs[size_t(st.expr)].level == Level::Full) {
      std::vector<bool> c = lower::expr_closure(k_, st.expr);
      for (size_t i = 0; i < c.size(); ++i) want[i] = want[i] || c[i];
    }
  OpId op = red.op;
  const char* init = op == OpId::Max ? "-INFINITY" : op == OpId::Min ? "INFINITY" : op == OpId::Prod ? "1" : "0";
  auto combine = [&](const std::string& a, const std::string& v, bool vv) -> std::string {
    switch (op) {
      case OpId::Max: return vv ? fmt::format("{0} = vmax({0}, {1});", a, v) : fmt::format("{0} = kn_max({0}, ({2}){1});", a, v, at);
      case OpId::Min: return vv ? fmt::format("{0} = vmin({0}, {1});", a, v) : fmt::format("{0} = kn_min({0}, ({2}){1});", a, v, at);
      case OpId::Prod: return vv ? fmt::format("{0} = {0} * {1};", a, v) : fmt::format("{0} *= ({2}){1};", a, v, at);
      default: return vv ? fmt::format("{0} = {0} + {1};", a, v) : fmt::format("{0} += ({2}){1};", a, v, at);
    }
  };
  out += fmt::format("{}{} acc = {};\n", ind, at, init);
  if (vec) out += fmt::format("#ifdef KN_W\n{}VF vacc = vset({});\n#endif\n", ind, init);
  std::string bi = ind + "  ";
  for (int t = k_.kept_dims(); t + 1 < n(); ++t) bi += "  ";
  std::string bv, bs, bu;
  if (vec) {
    emit_exprs(bv, want, Level::Full, true, bi + "  ");
    bv += bi + "  " + combine("vacc", fmt::format("v{}", x), true) + "\n";
    emit_stores(bv, Level::Full, true, bi + "  ");
  }
  // Several accumulators (CpuCodegenOptions::reduce_unroll): copy u of the body sees the index
  // advanced by u vectors (a shadowing block) and adds into vacc<u>.
  const int unroll = vec ? std::max(1, opt_.reduce_unroll) : 1;
  const std::string iv = fmt::format("i{}", n() - 1);
  for (int u = 1; u < unroll; ++u)
    out += fmt::format("#ifdef KN_W\n{}VF vacc{} = vset({});\n#endif\n", ind, u, init);
  for (int u = 0; unroll > 1 && u < unroll; ++u) {
    std::string acc = u == 0 ? "vacc" : fmt::format("vacc{}", u);
    std::string body;
    emit_exprs(body, want, Level::Full, true, bi + "    ");
    body += bi + "    " + combine(acc, fmt::format("v{}", x), true) + "\n";
    emit_stores(body, Level::Full, true, bi + "    ");
    if (u == 0)
      bu += bi + "  {\n" + body + bi + "  }\n";
    else
      bu += fmt::format("{0}  {{ const i64 {1}_next = {1} + {2} * KN_W; {{ const i64 {1} = {1}_next;\n{3}{0}  }} }}\n",
                        bi, iv, u, body);
  }
  emit_exprs(bs, want, Level::Full, false, bi + "  ");
  bs += bi + "  " + combine("acc", fmt::format("v{}", x), false) + "\n";
  emit_stores(bs, Level::Full, false, bi + "  ");
  reduce_loops(out, k_, ind, vec, bv, bs, bu, unroll);
  for (int u = 1; u < unroll; ++u)
    out += fmt::format("#ifdef KN_W\n{}{}\n#endif\n", ind, combine("vacc", fmt::format("vacc{}", u), true));
  if (vec) {
    const char* h = op == OpId::Max ? "vmax_all" : op == OpId::Min ? "vmin_all" : op == OpId::Prod ? "vprod_all" : "vsum";
    out += fmt::format("#ifdef KN_W\n{}{}\n#endif\n", ind, combine("acc", fmt::format("{}(vacc)", h), false));
  }
  std::string result = "acc";
  if (op == OpId::Mean) result = fmt::format("acc / ({}){}", at, red.count);
  if (op == OpId::Var) {
    // Second pass: sum of squared deviations from the mean (no stores).
    out += fmt::format("{0}const double mean = double(acc) / {1};\n{0}double ss = 0;\n", ind, red.count);
    std::vector<bool> wx = lower::expr_closure(k_, x);
    std::string sv, ss;
    if (vec) {
      out += fmt::format("#ifdef KN_W\n{}VF vss = vset(0.0f);\n#endif\n", ind);
      emit_exprs(sv, wx, Level::Full, true, bi + "  ");
      sv += fmt::format("{0}  {{ const VF d = v{1} - vset((float)mean); vss = vss + d * d; }}\n", bi, x);
    }
    emit_exprs(ss, wx, Level::Full, false, bi + "  ");
    ss += fmt::format("{0}  {{ const double d = double(v{1}) - mean; ss += d * d; }}\n", bi, x);
    reduce_loops(out, k_, ind, vec, sv, ss);
    if (vec) out += fmt::format("#ifdef KN_W\n{}ss += double(vsum(vss));\n#endif\n", ind);
    int64_t corr = red.attrs->get_int("correction");
    int64_t div = std::max<int64_t>(red.count - corr, 0);
    result = fmt::format("({})(ss / {}.0)", at, div);
  }
  std::string rv = fmt::format("({})({})", compute_type(red.dtype), result);
  if (red.dtype == DType::BFloat16) rv = "kn_rbf16(" + rv + ")";
  if (red.dtype == DType::Float16) rv = "kn_rf16(" + rv + ")";
  out += fmt::format("{}const {} v{} = {};\n", ind, compute_type(red.dtype), k_.anchor, rv);
  std::vector<bool> all(k_.exprs.size(), true);
  emit_exprs(out, all, Level::Kept, false, ind);
  emit_stores(out, Level::Kept, false, ind);
  out += "  }\n";
}

// Note [reduction rows]
// A float32 linear of one input row is a sum over K per output n of x[k] * W[n, k]: the usual
// SIMD form walks one row of W at a time with one accumulator, a single stream of loads, and
// took 7.0 ms for AlexNet's 9216 -> 4096 layer at two threads (21 GB/s of weights; oneDNN's
// inner product the same, ONNX Runtime 5.5 ms). Where a SIMD sum reads some operand broadcast
// along its innermost kept dim (x, the same for every n) and another walking it, both
// contiguous along the one reduce dim of at least kReduceRowsMin elements, and that kept dim
// is a multiple of kReduceRows long, kReduceRows consecutive outputs are computed together:
// each reduce step reads the shared operand once (the copies of the body load the same
// address; the compiler keeps one) and one vector of each of kReduceRows rows into an
// accumulator each. Each output still adds its products in the usual form's order (vector
// lanes, then the scalar tail, then the lanes' sum), so the bits are the same. From K = 64 (was
// 256 until the forty-sixth session): squeeze-excite blocks' 240 -> 960 linears (their 1x1
// convolutions, passes/window_conv.h) took oneDNN's inner product 0.075-0.094 ms at one thread
// and its 1x1 convolution 0.049 ms; four rows at a time take 0.038 ms (1.1x the weights' floor).
constexpr int kReduceRows = 4;
constexpr int64_t kReduceRowsMin = lower::kRowLinearMinK;  // 64: the scheduler's one-row linears

bool KernelEmitter::reduce_rows() const {
  if (!opt_.vectorize || k_.kind != LoopKind::Reduce || k_.anchor < 0 || k_.reduce_dims != 1)
    return false;
  const LoopExpr& red = k_.exprs[size_t(k_.anchor)];
  if (red.kind != LoopExpr::Kind::Reduce || red.op != OpId::Sum || red.dtype != DType::Float32 ||
      k_.exprs[size_t(red.args[0])].dtype != DType::Float32)
    return false;
  const int kept = k_.kept_dims();
  if (kept < 1) return false;
  const size_t kd = size_t(kept - 1), rd = size_t(n() - 1);
  if (k_.sizes[kd] % kReduceRows != 0 || k_.sizes[rd] < kReduceRowsMin) return false;
  for (const lower::LoopStore& st : k_.stores)
    if (k_.exprs[size_t(st.expr)].level == Level::Full) return false;
  bool shared = false, walking = false;
  for (const Access& a : k_.loads) {
    if (a.strides[rd] != 1) continue;
    shared = shared || a.strides[kd] == 0;
    walking = walking || a.strides[kd] != 0;
  }
  return shared && walking;
}

void KernelEmitter::emit_reduce_rows(std::string& out) {
  const LoopExpr& red = k_.exprs[size_t(k_.anchor)];
  const int x = red.args[0], kept = k_.kept_dims(), kd = kept - 1;
  const int64_t S = k_.sizes[size_t(kd)];
  if (par())
    out += fmt::format("  #pragma omp parallel for collapse({}) schedule(static) if(nt > 1) num_threads(nt)\n", kept);
  for (int t = 0; t < kd; ++t)
    out += fmt::format("  for (i64 i{0} = 0; i{0} < {1}; ++i{0})\n", t, k_.sizes[size_t(t)]);
  out += fmt::format("  for (i64 rb_ = 0; rb_ < {}; ++rb_)\n  {{\n", S / kReduceRows);
  const std::string ind = "    ";
  std::vector<bool> want = lower::expr_closure(k_, x);
  std::string bv, bs;
  for (int r = 0; r < kReduceRows; ++r) {
    out += fmt::format("{0}float acc{1} = 0;\n#ifdef KN_W\n{0}VF vacc{1} = vset(0);\n#endif\n", ind, r);
    const std::string row = fmt::format("{}  {{ const i64 i{} = rb_ * {} + {};\n", ind, kd, kReduceRows, r);
    bv += row;
    emit_exprs(bv, want, Level::Full, true, ind + "    ");
    bv += fmt::format("{0}    vacc{1} = vacc{1} + v{2};\n{0}  }}\n", ind, r, x);
    bs += row;
    emit_exprs(bs, want, Level::Full, false, ind + "    ");
    bs += fmt::format("{0}    acc{1} += (float)v{2};\n{0}  }}\n", ind, r, x);
  }
  reduce_loops(out, k_, ind, true, bv, bs);
  std::vector<bool> all(k_.exprs.size(), true);
  for (int r = 0; r < kReduceRows; ++r) {
    out += fmt::format("#ifdef KN_W\n{0}acc{1} += (float)vsum(vacc{1});\n#endif\n", ind, r);
    out += fmt::format("{0}{{\n{0}  const i64 i{1} = rb_ * {2} + {3};\n", ind, kd, kReduceRows, r);
    out += fmt::format("{0}  const float v{1} = (float)(acc{2});\n", ind, k_.anchor, r);
    emit_exprs(out, all, Level::Kept, false, ind + "  ");
    emit_stores(out, Level::Kept, false, ind + "  ");
    out += ind + "}\n";
  }
  out += "  }\n";
}

// Note [lane reductions]: blocks of KN_W outputs along the innermost kept dim (vd); a full block
// is one vector accumulator walking the reduce dims, a partial one (the tail) the scalar loop.
void KernelEmitter::emit_reduce_lanes(std::string& out) {
  const LoopExpr& red = k_.exprs[size_t(k_.anchor)];
  const int x = red.args[0];
  const OpId op = red.op;
  const int kept = k_.kept_dims(), r = n(), vd = kept - 1;
  const int64_t S = k_.sizes[size_t(vd)];
  const char* init = op == OpId::Max ? "-INFINITY" : op == OpId::Min ? "INFINITY" : op == OpId::Prod ? "1" : "0";
  auto combine = [&](const std::string& a, const std::string& v, bool vv) -> std::string {
    switch (op) {
      case OpId::Max: return vv ? fmt::format("{0} = vmax({0}, {1});", a, v) : fmt::format("{0} = kn_max({0}, (float){1});", a, v);
      case OpId::Min: return vv ? fmt::format("{0} = vmin({0}, {1});", a, v) : fmt::format("{0} = kn_min({0}, (float){1});", a, v);
      case OpId::Prod: return vv ? fmt::format("{0} = {0} * {1};", a, v) : fmt::format("{0} *= (float){1};", a, v);
      default: return vv ? fmt::format("{0} = {0} + {1};", a, v) : fmt::format("{0} += (float){1};", a, v);
    }
  };
  // Note [lane reductions]: a block of lanes is up to kLaneVectors vectors wide, one accumulator
  // each, so that one step of the reduce loop reads that many contiguous vectors of each row.
  const int64_t U = std::clamp<int64_t>(S / 16, 1, kLaneVectors);
  out += fmt::format("#ifdef KN_W\n  const i64 lw_ = {} * KN_W;\n#else\n  const i64 lw_ = 1;\n#endif\n", U);
  if (par())
    out += fmt::format("  #pragma omp parallel for collapse({}) schedule(static) if(nt > 1) num_threads(nt)\n", kept);
  for (int t = 0; t < vd; ++t)
    out += fmt::format("  for (i64 i{0} = 0; i{0} < {1}; ++i{0})\n", t, k_.sizes[size_t(t)]);
  out += fmt::format("  for (i64 c_ = 0; c_ < ({0} + lw_ - 1) / lw_; ++c_)\n  {{\n", S);
  out += fmt::format("    const i64 j0_ = c_ * lw_, j1_ = j0_ + lw_ < {0} ? j0_ + lw_ : {0};\n", S);
  out += fmt::format("    i64 i{} = j0_;\n", vd);
  // Full-level work: what the reduction reads, plus values stored at full level (stored at
  // every reduce step, lanes along vd like the accumulators).
  std::vector<bool> want = lower::expr_closure(k_, x);
  for (const lower::LoopStore& st : k_.stores)
    if (k_.exprs[size_t(st.expr)].level == Level::Full) {
      std::vector<bool> c = lower::expr_closure(k_, st.expr);
      for (size_t i = 0; i < c.size(); ++i) want[i] = want[i] || c[i];
    }
  std::vector<bool> all(k_.exprs.size(), true);
  // Every reduce dim, in order, around the prologue and the accumulation; `vectors` > 0: that
  // many vectors of lanes, vector u at the lane index advanced by u vectors (a shadowing block)
  // accumulating into vacc<u>.
  const std::string iv = fmt::format("i{}", vd);
  auto loops = [&](std::string& o, const std::string& ind, int64_t vectors) {
    std::string in = ind;
    for (int t = kept; t < r; ++t) {
      o += fmt::format("{0}for (i64 i{1} = 0; i{1} < {2}; ++i{1}) {{\n", in, t, k_.sizes[size_t(t)]);
      in += "  ";
    }
    if (vectors == 0) {
      emit_exprs(o, want, Level::Full, false, in);
      o += in + combine("acc", fmt::format("v{}", x), false) + "\n";
      emit_stores(o, Level::Full, false, in);
    }
    for (int64_t u = 0; u < vectors; ++u) {
      o += fmt::format("{0}{{ const i64 {1}_u = {1} + {2} * KN_W; {{ const i64 {1} = {1}_u;\n", in, iv, u);
      emit_exprs(o, want, Level::Full, true, in + "  ");
      o += in + "  " + combine(fmt::format("vacc{}", u), fmt::format("v{}", x), true) + "\n";
      emit_stores(o, Level::Full, true, in + "  ");
      o += in + "} }\n";
    }
    for (int t = kept; t < r; ++t) {
      in.resize(in.size() - 2);
      o += in + "}\n";
    }
  };
  // `vectors` vectors of lanes from i<vd> on: accumulate, then each vector's epilogue and stores.
  auto block = [&](std::string& o, const std::string& ind, int64_t vectors) {
    for (int64_t u = 0; u < vectors; ++u) o += fmt::format("{}VF vacc{} = vset({});\n", ind, u, init);
    loops(o, ind, vectors);
    for (int64_t u = 0; u < vectors; ++u) {
      o += fmt::format("{0}{{ const i64 {1}_u = {1} + {2} * KN_W; {{ const i64 {1} = {1}_u;\n", ind, iv, u);
      std::string acc = fmt::format("vacc{}", u);
      std::string rv = op == OpId::Mean ? fmt::format("{} / vset((float){})", acc, red.count) : acc;
      if (red.dtype == DType::BFloat16) rv = "vrbf16(" + rv + ")";
      o += fmt::format("{}  const VF v{} = {};\n", ind, k_.anchor, rv);
      emit_exprs(o, all, Level::Kept, true, ind + "  ");
      emit_stores(o, Level::Kept, true, ind + "  ");
      o += ind + "} }\n";
    }
  };
  // A full block of lanes; then single vectors of a partial block.
  out += "#ifdef KN_W\n    if (j1_ - j0_ == lw_) {\n";
  block(out, "      ", U);
  out += fmt::format("      {} = j1_;\n    }}\n", iv);
  if (U > 1) {
    out += fmt::format("    for (; {0} + KN_W <= j1_; {0} += KN_W) {{\n", iv);
    block(out, "      ", 1);
    out += "    }\n";
  }
  out += "#endif\n";
  // The tail: the scalar kernel's per-output code.
  out += fmt::format("    for (; i{0} < j1_; ++i{0}) {{\n", vd);
  out += fmt::format("      float acc = {};\n", init);
  loops(out, "      ", 0);
  std::string rs = op == OpId::Mean ? fmt::format("acc / (float){}", red.count) : "acc";
  rs = fmt::format("({})({})", compute_type(red.dtype), rs);
  if (red.dtype == DType::BFloat16) rs = "kn_rbf16(" + rs + ")";
  out += fmt::format("      const {} v{} = {};\n", compute_type(red.dtype), k_.anchor, rs);
  emit_exprs(out, all, Level::Kept, false, "      ");
  emit_stores(out, Level::Kept, false, "      ");
  out += "    }\n  }\n";
}

// Note [subnormal probabilities]
// A generated softmax stores a probability below float's least normal number (1.18e-38) as 0.
// Such values arise where a row's scores are far apart: Swin's shifted windows add -100 to the
// masked scores, and exp(-100) = 3.7e-44 is subnormal. x86 cores take a microcode assist for
// each subnormal operand of a multiply or FMA, so the attention's next matmul (probabilities x
// values, oneDNN gemm:jit) took 4.0-4.7 ms a call against its 0.04 ms floor: 31-108x, and five
// such matmuls were ~20 ms of swin_t's call. Computing the subnormal exp costs the same assists
// in the softmax itself (the sum's additions, the normalizing multiply): its exps are
// vexp_ftz / kn_exp_ftz, 0 where exp would be subnormal, in softmax and log_softmax (whose sum,
// at least 1, no such term changes). The error of the flush is below 1.2e-38 absolute,
// under every float32/bfloat16 tolerance and far below the rounding of the row's other
// entries; NaN and infinity pass unchanged (the comparison is ordered). The eager reference
// kernels keep subnormals (they are the oracle).
std::string KernelEmitter::norm_value(const std::string& xs, bool v) const {
  const LoopExpr& nm = k_.exprs[size_t(k_.anchor)];
  std::string r;
  if (nm.op == OpId::LayerNorm) {
    r = v ? fmt::format("({} - vset(mean)) * vset(rstd)", xs) : fmt::format("((float){} - mean) * rstd", xs);
    if (nm.args[1] >= 0) r = v ? fmt::format("{} * v{}", r, nm.args[1]) : fmt::format("{} * (float)v{}", r, nm.args[1]);
    if (nm.args[2] >= 0) r = v ? fmt::format("{} + v{}", r, nm.args[2]) : fmt::format("{} + (float)v{}", r, nm.args[2]);
  } else if (nm.op == OpId::Softmax) {  // Note [subnormal probabilities]
    r = v ? fmt::format("vflush_tiny(vexp_ftz({} - vset(m_s)) * vset(inv_s))", xs)
          : fmt::format("kn_flush_tiny(kn_exp_ftz((float){} - m_s) * inv_s)", xs);
  } else {
    r = v ? fmt::format("{} - vset(m_s + log_s)", xs) : fmt::format("(float){} - (m_s + log_s)", xs);
  }
  if (nm.dtype == DType::BFloat16) r = v ? "vrbf16(" + r + ")" : "kn_rbf16(" + r + ")";
  if (nm.dtype == DType::Float16 && !v) r = "kn_rf16(" + r + ")";
  if (nm.dtype == DType::Float64 && !v) r = "(double)(" + r + ")";
  return r;
}

void KernelEmitter::emit_norm(std::string& out, bool vec) {
  const LoopExpr& nm = k_.exprs[size_t(k_.anchor)];
  const int x = nm.args[0];
  const bool ln = nm.op == OpId::LayerNorm;
  std::string ind = open_kept(out, k_, par());
  std::string bi = ind + "  ";
  for (int t = k_.kept_dims(); t + 1 < n(); ++t) bi += "  ";
  std::vector<bool> wx = lower::expr_closure(k_, x);
  std::string bv, bs;
  // Pass 1: statistics.
  if (ln && !vec) {
    // Note [scalar layer_norm statistics]: without SIMD lanes (a normalized dim read with a
    // stride: ConvNeXt's layer_norm over the channels of a permuted NCHW value), two passes in
    // double: the sum, then the sum of squared deviations from the mean. Welford's update
    // divides once per element, a dependency chain of ~25 cycles; these are additions (and as
    // accurate: the deviations are taken from the exact-to-double mean).
    bs.clear();
    emit_exprs(bs, wx, Level::Full, false, bi + "  ");
    bs += fmt::format("{0}  s_s += double(v{1});\n", bi, x);
    out += fmt::format("{}double s_s = 0;\n", ind);
    reduce_loops(out, k_, ind, false, "", bs);
    out += fmt::format("{}const double mean_s = s_s / {}.0;\n{}double m2_s = 0;\n", ind, nm.count, ind);
    bs.clear();
    emit_exprs(bs, wx, Level::Full, false, bi + "  ");
    bs += fmt::format("{0}  {{ const double d = double(v{1}) - mean_s; m2_s += d * d; }}\n", bi, x);
    reduce_loops(out, k_, ind, false, "", bs);
    double eps = nm.attrs->get_float("eps");
    out += fmt::format("{0}const float mean = float(mean_s);\n{0}const float rstd = float(1.0 / std::sqrt(m2_s / {1}.0 + {2}));\n",
                       ind, nm.count, num(eps));
  } else if (ln) {
    out += fmt::format("{}double mean_s = 0, m2_s = 0; i64 n_s = 0;\n", ind);
    if (vec) out += fmt::format("#ifdef KN_W\n{}VF vmean = vset(0.0f), vm2 = vset(0.0f); i64 vn = 0;\n#endif\n", ind);
    if (vec) {
      emit_exprs(bv, wx, Level::Full, true, bi + "  ");
      bv += fmt::format("{0}  {{ ++vn; const VF d = v{1} - vmean; vmean = vmean + d * vset(1.0f / float(vn)); vm2 = vm2 + d * (v{1} - vmean); }}\n", bi, x);
    }
    emit_exprs(bs, wx, Level::Full, false, bi + "  ");
    bs += fmt::format("{0}  {{ ++n_s; const double d = double(v{1}) - mean_s; mean_s += d / double(n_s); m2_s += d * (double(v{1}) - mean_s); }}\n", bi, x);
    reduce_loops(out, k_, ind, vec, bv, bs);
    if (vec)
      out += fmt::format(
          "#ifdef KN_W\n{0}if (vn > 0) {{\n{0}  float lm[KN_W], l2[KN_W];\n{0}  std::memcpy(lm, &vmean, sizeof(lm)); std::memcpy(l2, &vm2, sizeof(l2));\n"
          "{0}  for (int l = 0; l < KN_W; ++l) {{\n{0}    const double nb = double(vn), na = double(n_s), nn = na + nb, d = double(lm[l]) - mean_s;\n"
          "{0}    mean_s += d * nb / nn; m2_s += double(l2[l]) + d * d * na * nb / nn; n_s += vn;\n{0}  }}\n{0}}}\n#endif\n", ind);
    double eps = nm.attrs->get_float("eps");
    out += fmt::format("{0}const float mean = float(mean_s);\n{0}const float rstd = float(1.0 / std::sqrt(m2_s / {1}.0 + {2}));\n",
                       ind, nm.count, num(eps));
  } else if (vec) {
    // Note [softmax statistics]: with SIMD lanes, the row's max, then the sum of exp(x - max):
    // two exps per element in all (this one and pass 2's) and no per-lane merge. The online form
    // below (running max and rescaled sum per lane) takes two exps per element in pass 1 and a
    // scalar exp per lane to merge, which short rows (window attention's 49) pay for per row.
    out += fmt::format("{}float m_s = -INFINITY, s_s = 0;\n", ind);
    out += fmt::format("#ifdef KN_W\n{}VF vm = vset(-INFINITY), vs = vset(0.0f);\n#endif\n", ind);
    emit_exprs(bv, wx, Level::Full, true, bi + "  ");
    bv += fmt::format("{0}  vm = vmax(vm, v{1});\n", bi, x);
    emit_exprs(bs, wx, Level::Full, false, bi + "  ");
    bs += fmt::format("{0}  m_s = kn_max(m_s, (float)v{1});\n", bi, x);
    reduce_loops(out, k_, ind, true, bv, bs);
    out += fmt::format("#ifdef KN_W\n{}m_s = kn_max(m_s, vmax_all(vm));\n#endif\n", ind);
    bv.clear();
    bs.clear();
    emit_exprs(bv, wx, Level::Full, true, bi + "  ");
    bv += fmt::format("{0}  vs = vs + vexp_ftz(v{1} - vset(m_s));\n", bi, x);
    emit_exprs(bs, wx, Level::Full, false, bi + "  ");
    bs += fmt::format("{0}  s_s += kn_exp_ftz((float)v{1} - m_s);\n", bi, x);
    reduce_loops(out, k_, ind, true, bv, bs);
    out += fmt::format("#ifdef KN_W\n{}s_s += vsum(vs);\n#endif\n", ind);
  } else {
    // The scalar kernel: the online form (one pass: running max, rescaled sum).
    out += fmt::format("{}float m_s = -INFINITY, s_s = 0;\n", ind);
    emit_exprs(bs, wx, Level::Full, false, bi + "  ");
    bs += fmt::format("{0}  {{ const float xv = (float)v{1}; const float mn = kn_max(m_s, xv); s_s = (m_s == -INFINITY ? 0.0f : s_s * kn_exp_ftz(m_s - mn)) + kn_exp_ftz(xv - mn); m_s = mn; }}\n", bi, x);
    reduce_loops(out, k_, ind, false, "", bs);
  }
  if (!ln) {
    if (nm.op == OpId::Softmax) out += fmt::format("{}const float inv_s = 1.0f / s_s;\n", ind);
    else out += fmt::format("{}const float log_s = std::log(s_s);\n", ind);
  }
  // Pass 2: normalize, epilogue, stores.
  auto pass2 = [&](bool v) {
    std::string b;
    std::string in = bi + "  ";
    // Everything before the anchor, the anchor, everything after.
    std::vector<bool> pre(k_.exprs.size(), false), post(k_.exprs.size(), false);
    for (size_t i = 0; i < k_.exprs.size(); ++i) (int(i) < k_.anchor ? pre : post)[i] = int(i) != k_.anchor;
    emit_exprs(b, pre, Level::Full, v, in);
    b += fmt::format("{}const {} v{} = {};\n", in, v ? "VF" : compute_type(nm.dtype), k_.anchor,
                     norm_value(fmt::format("v{}", x), v));
    emit_exprs(b, post, Level::Full, v, in);
    emit_stores(b, Level::Full, v, in);
    return b;
  };
  reduce_loops(out, k_, ind, vec, vec ? pass2(true) : "", pass2(false));
  out += "  }\n";
}

// Note [row-buffered norms]
// A Norm kernel reads its row (the prologue's value x) twice or three times: once per statistics
// pass and once to normalize, recomputing the prologue each time, and softmax takes exp of every
// element twice. Swin-V2's position-biased softmax (sigmoid of a bias read with a stride of 24,
// times 16, plus the scores) ran scalar, with five exps per element (the online form's two, the
// sigmoid's twice, the store pass's): 1.7 ms for 98k elements, 136x its floor. ConvNeXt's and
// Swin's first layer_norm reads its 96 channels with a stride of 4096 floats, which puts every
// load of a row in one L1 set, three times over. When the row has at most kRowBuffer elements
// and the anchor is float32 or bfloat16, the kernel keeps the row in a stack buffer instead:
//   A. the prologue once per element (SIMD if its loads allow, else scalar) into the buffer
//      (softmax and log_softmax: and the row's max);
//   B. statistics over the buffer, always SIMD: softmax stores exp(x - max) back and sums it;
//      log_softmax sums it; layer_norm sums the row for a provisional mean m0, then the
//      deviations d = x - m0 and their squares (mean = m0 + sum(d)/n, var = sum(d^2)/n -
//      (sum(d)/n)^2, combined in double: the shifted two-pass form, as accurate as deviations
//      from the exact mean);
//   C. normalize from the buffer (softmax: one multiply), the epilogue, the stores (SIMD if the
//      epilogue's loads and the stores allow, else scalar).
// Each pass decides its own vectorization, so a strided prologue no longer makes the whole
// kernel scalar. Results differ from the unbuffered kernel's in the last bits (other summation
// orders), within the per-dtype tolerances every test holds compiled kernels to. The buffer is
// on the calling thread's stack: at most 32 KiB (8192 floats).
constexpr int64_t kRowBuffer = 8192;

// Whether the wanted expressions (and, with `stores`, the full-level stores) have SIMD forms
// along the innermost dim: loop_vectorizable's test, restricted to them.
bool exprs_vectorizable(const LoopKernel& k, const std::vector<bool>& want, bool stores) {
  const size_t inner = k.sizes.size() - 1;
  for (size_t i = 0; i < k.exprs.size(); ++i) {
    const LoopExpr& e = k.exprs[i];
    if (!want[i] || e.level == Level::Kept) continue;
    if (!expr_vectorizable(e)) return false;
    if (e.kind == LoopExpr::Kind::Load && !load_vectorizable(k.loads[size_t(e.load)], inner))
      return false;
  }
  if (stores)
    for (const lower::LoopStore& st : k.stores)
      if (k.exprs[size_t(st.expr)].level != Level::Kept && !store_vectorizable(st.access, inner))
        return false;
  return true;
}

bool KernelEmitter::row_buffered() const {
  if (k_.kind != LoopKind::Norm || !opt_.vectorize) return false;
  const LoopExpr& nm = k_.exprs[size_t(k_.anchor)];
  if (nm.op != OpId::Softmax && nm.op != OpId::LogSoftmax && nm.op != OpId::LayerNorm) return false;
  if (nm.dtype != DType::Float32 && nm.dtype != DType::BFloat16) return false;
  if (nm.count < 1 || nm.count > kRowBuffer) return false;
  for (const LoopExpr& e : k_.exprs)
    if (e.dtype == DType::Float64) return false;
  return true;
}

void KernelEmitter::emit_norm_buffered(std::string& out) {
  const LoopExpr& nm = k_.exprs[size_t(k_.anchor)];
  const int x = nm.args[0];
  const int r = n();
  const int64_t N = nm.count;
  const bool softmax = nm.op == OpId::Softmax, ln = nm.op == OpId::LayerNorm;
  // An element's place in the buffer: its row-major position over the reduce dims.
  std::string pos;
  int64_t rs = 1;
  for (int t = r - 1; t >= k_.kept_dims(); --t) {
    std::string term = rs == 1 ? fmt::format("i{}", t) : fmt::format("i{} * {}", t, rs);
    pos = pos.empty() ? term : term + " + " + pos;
    rs *= k_.sizes[size_t(t)];
  }
  std::string ind = open_kept(out, k_, par());
  std::string in = ind + "    ";
  for (int t = k_.kept_dims(); t + 1 < r; ++t) in += "  ";
  // Room for a whole last vector (Note [padded softmax rows]): KN_W is at most 16.
  out += fmt::format("{}alignas(64) float xr_[{}];\n", ind, (N + 15) / 16 * 16);
  // A: the prologue into the buffer.
  const std::vector<bool> wx = lower::expr_closure(k_, x);
  const bool va = exprs_vectorizable(k_, wx, false);
  std::string bv, bs;
  if (va) {
    emit_exprs(bv, wx, Level::Full, true, in);
    bv += fmt::format("{}vst(xr_ + {}, v{});\n", in, pos, x);
    if (!ln) bv += fmt::format("{}vm = vmax(vm, v{});\n", in, x);
  }
  emit_exprs(bs, wx, Level::Full, false, in);
  bs += fmt::format("{}xr_[{}] = (float)v{};\n", in, pos, x);
  if (!ln) {
    bs += fmt::format("{}m_s = kn_max(m_s, xr_[{}]);\n", in, pos);
    out += fmt::format("{}float m_s = -INFINITY;\n", ind);
    if (va) out += fmt::format("#ifdef KN_W\n{}VF vm = vset(-INFINITY);\n#endif\n", ind);
  }
  reduce_loops(out, k_, ind, va, bv, bs);
  if (!ln && va) out += fmt::format("#ifdef KN_W\n{}m_s = kn_max(m_s, vmax_all(vm));\n#endif\n", ind);
  // B: statistics over the buffer.
  const std::string fi = ind + "    ";
  // A loop over the buffer, SIMD then a scalar tail. `padded` (Note [padded softmax rows]): the
  // buffer's last vector is first filled past the row with -inf, and the SIMD loop covers it.
  auto flat = [&](const std::string& vec_body, const std::string& scalar_body, bool padded = false) {
    const std::string pad =
        padded ? fmt::format("{0}  for (i64 p_ = {1}; p_ < ({1} + KN_W - 1) / KN_W * KN_W; ++p_) xr_[p_] = -INFINITY;\n", ind, N)
               : "";
    out += fmt::format("{0}{{\n{0}  i64 j_ = 0;\n#ifdef KN_W\n{4}{0}  for (; {5}; j_ += KN_W) {{\n{2}{0}  }}\n#endif\n"
                       "{0}  for (; j_ < {1}; ++j_) {{\n{3}{0}  }}\n{0}}}\n",
                       ind, N, vec_body, scalar_body, pad,
                       padded ? fmt::format("j_ < {}", N) : fmt::format("j_ + KN_W <= {}", N));
  };
  // Note [padded softmax rows]: softmax's and log_softmax's sums take exp of every element, and
  // a scalar exp costs as much as a vector one: SSDlite's class scores (3234 rows of 91, five
  // vectors and 11 left over) spent two thirds of their 0.45 ms at one thread in the 11 scalar
  // exps per row. The buffer's last vector is filled past the row with -inf, whose exp is 0,
  // so every element goes through vector exps and the padding adds nothing to the sum.
  if (!ln) {
    out += fmt::format("{0}float s_s = 0;\n#ifdef KN_W\n{0}VF vs = vset(0.0f);\n#endif\n", ind);
    if (softmax)
      flat(fmt::format("{0}const VF e_ = vexp_ftz(vld(xr_ + j_) - vset(m_s));\n{0}vst(xr_ + j_, e_);\n{0}vs = vs + e_;\n", fi),
           fmt::format("{0}const float e_ = kn_exp_ftz(xr_[j_] - m_s);\n{0}xr_[j_] = e_;\n{0}s_s += e_;\n", fi), true);
    else
      flat(fmt::format("{}vs = vs + vexp_ftz(vld(xr_ + j_) - vset(m_s));\n", fi),
           fmt::format("{}s_s += kn_exp_ftz(xr_[j_] - m_s);\n", fi), true);
    out += fmt::format("#ifdef KN_W\n{}s_s += vsum(vs);\n#endif\n", ind);
    if (softmax) out += fmt::format("{}const float inv_s = 1.0f / s_s;\n", ind);
    else out += fmt::format("{}const float log_s = std::log(s_s);\n", ind);
  } else {
    out += fmt::format("{0}double s0_ = 0;\n#ifdef KN_W\n{0}VF vs0 = vset(0.0f);\n#endif\n", ind);
    flat(fmt::format("{}vs0 = vs0 + vld(xr_ + j_);\n", fi), fmt::format("{}s0_ += double(xr_[j_]);\n", fi));
    out += fmt::format("#ifdef KN_W\n{0}s0_ += double(vsum(vs0));\n#endif\n{0}const float m0_ = float(s0_ / {1}.0);\n", ind, N);
    out += fmt::format("{0}double sd_ = 0, sq_ = 0;\n#ifdef KN_W\n{0}VF vsd = vset(0.0f), vsq = vset(0.0f);\n#endif\n", ind);
    flat(fmt::format("{0}const VF d_ = vld(xr_ + j_) - vset(m0_);\n{0}vsd = vsd + d_;\n{0}vsq = vsq + d_ * d_;\n", fi),
         fmt::format("{0}const double d_ = double(xr_[j_] - m0_);\n{0}sd_ += d_;\n{0}sq_ += d_ * d_;\n", fi));
    out += fmt::format(
        "#ifdef KN_W\n{0}sd_ += double(vsum(vsd)); sq_ += double(vsum(vsq));\n#endif\n"
        "{0}const double md_ = sd_ / {1}.0;\n"
        "{0}const float mean = float(double(m0_) + md_);\n"
        "{0}const float rstd = float(1.0 / std::sqrt(std::max(sq_ / {1}.0 - md_ * md_, 0.0) + {2}));\n",
        ind, N, num(nm.attrs->get_float("eps")));
  }
  // C: normalize from the buffer, then the epilogue and the stores. Only what the anchor's users
  // and layer_norm's weight and bias need is computed: the prologue's value is the buffer's.
  // (A value before the anchor that is stored too, such as a residual sum, is recomputed.)
  std::vector<bool> wc(k_.exprs.size(), false);
  for (size_t i = size_t(k_.anchor) + 1; i < k_.exprs.size(); ++i) wc[i] = true;
  for (const lower::LoopStore& st : k_.stores) wc[size_t(st.expr)] = true;
  if (ln)
    for (int a : {nm.args[1], nm.args[2]})
      if (a >= 0) wc[size_t(a)] = true;
  for (size_t i = k_.exprs.size(); i-- > 0;) {
    if (!wc[i] || int(i) == k_.anchor) continue;
    for (int a : k_.exprs[i].args)
      if (a >= 0) wc[size_t(a)] = true;
  }
  wc[size_t(k_.anchor)] = false;
  const bool vc = exprs_vectorizable(k_, wc, true);
  auto pass_c = [&](bool v) {
    std::string b;
    std::vector<bool> pre(wc), post(wc);
    for (size_t i = 0; i < wc.size(); ++i) (int(i) < k_.anchor ? post : pre)[i] = false;
    emit_exprs(b, pre, Level::Full, v, in);
    const std::string xs = v ? fmt::format("vld(xr_ + {})", pos) : fmt::format("xr_[{}]", pos);
    // Softmax's buffer holds exp(x - max) already (Note [subnormal probabilities]).
    std::string val = !softmax ? norm_value(xs, v)
                      : v      ? fmt::format("vflush_tiny({} * vset(inv_s))", xs)
                               : fmt::format("kn_flush_tiny({} * inv_s)", xs);
    if (softmax && nm.dtype == DType::BFloat16) val = v ? "vrbf16(" + val + ")" : "kn_rbf16(" + val + ")";
    b += fmt::format("{}const {} v{} = {};\n", in, v ? "VF" : compute_type(nm.dtype), k_.anchor, val);
    emit_exprs(b, post, Level::Full, v, in);
    emit_stores(b, Level::Full, v, in);
    return b;
  };
  reduce_loops(out, k_, ind, vc, vc ? pass_c(true) : "", pass_c(false));
  out += "  }\n";
}

// LoopKind::Scatter (Note [Loop-nest IR]): copy x into out, then add src at the indexed
// positions; parallel over the kept dims only, the scattered dim in order inside each.
void KernelEmitter::emit_scatter(std::string& out) {
  const lower::LoopScatter& sc = k_.scatter;
  const Access& init = sc.init;
  MemRef m = mem_[size_t(init.value)];
  out += fmt::format("  const {0}* __restrict X = (const {0}*)(b[{1}] + {2}) + {3};  // %{4}\n",
                     storage_type(init.dtype), m.slot, m.byte_offset, init.offset,
                     g_.value(init.value).name);
  int64_t init_numel = 1;
  for (int64_t d : sc.init_sizes) init_numel *= d;
  if (init_numel == 0) {
    out += "  (void)b; (void)X; (void)err;  // no elements\n";
    return;
  }
  // 1. out = x, in out's row-major order (S0 is contiguous over init_sizes).
  const int ri = int(sc.init_sizes.size());
  if (init_numel >= opt_.min_parallel && ri > 0)
    out += "  #pragma omp parallel for schedule(static) if(nt > 1) num_threads(nt)\n";
  out += fmt::format("  for (i64 f_ = 0; f_ < {}; ++f_) {{\n    i64 r_ = f_, o_ = 0;\n", init_numel);
  for (int d = ri - 1; d >= 0; --d)
    out += fmt::format("    o_ += (r_ % {0}) * {1}; r_ /= {0};\n", sc.init_sizes[size_t(d)],
                       init.strides[size_t(d)]);
  out += "    S0[f_] = X[o_];\n  }\n";
  if (k_.numel() == 0) return;
  // 2. out[.., index, ..] += src.
  std::string ind = open_kept(out, k_, par());
  const int r = n();
  const LoopExpr& src = k_.exprs[size_t(sc.src)];
  const bool integer = !lower::floating_compute(src.dtype) && src.dtype != DType::Float64;
  out += fmt::format("{0}for (i64 i{1} = 0; i{1} < {2}; ++i{1}) {{\n", ind, r - 1, k_.sizes.back());
  std::vector<bool> all(k_.exprs.size(), true);
  emit_exprs(out, all, Level::Full, false, ind + "  ");
  const std::string at = fmt::format("S0[{} + p_ * {}]", index(sc.out.strides), sc.dim_stride);
  std::string cur = at;
  switch (sc.out.dtype) {
    case DType::BFloat16: cur = "kn_bf16_f32(" + at + ")"; break;
    case DType::Float16: cur = "kn_f16_f32(" + at + ")"; break;
    case DType::Int32: case DType::Int8: case DType::UInt8: cur = "i64(" + at + ")"; break;
    default: break;
  }
  std::string sum = integer ? fmt::format("kn_wrap_add({}, v{})", cur, sc.src)
                            : fmt::format("{} + v{}", cur, sc.src);
  out += fmt::format(
      "{0}  const i64 q_ = (i64)v{1}; const i64 p_ = q_ < 0 ? q_ + {2} : q_;\n"
      "{0}  if (p_ >= 0 && p_ < {2}) {3} = {4}; else kn_index_error(err, {5}, q_);\n{0}}}\n",
      ind, sc.index, sc.dim_size, at, lower::store_value(sc.out.dtype, "(" + sum + ")"), sc.check);
  out += "  }\n";
}

std::string KernelEmitter::emit(bool* vectorized) {
  bool vec = opt_.vectorize && loop_vectorizable(k_);
  // Note [flattened lanes]: a pointwise kernel too short along its innermost dim for a vector.
  const bool flat = find_flat_lanes();
  if (flat) vec = true;
  if (k_.kind == LoopKind::Norm && k_.exprs[size_t(k_.anchor)].dtype == DType::Float64) vec = false;
  if (k_.kind == LoopKind::Reduce) {
    const LoopExpr& a = k_.exprs[size_t(k_.anchor)];
    if (a.dtype == DType::Float64 || k_.exprs[size_t(a.args[0])].dtype == DType::Float64) vec = false;
  }
  const bool lanes = !vec && opt_.vectorize && lane_reducible(k_);
  if (lanes) vdim_ = k_.kept_dims() - 1;
  const bool buffered = row_buffered();
  // A pointwise SIMD loop along an innermost dim shorter than 8 floats never runs: scalar.
  const bool dead_simd = k_.kind == LoopKind::Pointwise && !flat && k_.sizes.back() < 8;
  *vectorized = (vec && !dead_simd) || lanes || buffered;
  std::string out = fmt::format("// kiln-kernel: {}\n// {} over [{}]", k_.name, lower::loop_kind_name(k_.kind),
                                fmt::join(k_.sizes, ", "));
  if (k_.reduce_dims) out += fmt::format(", last {} reduced", k_.reduce_dims);
  if (buffered)
    out += fmt::format(", row buffer of {} (Note [row-buffered norms])\n", k_.exprs[size_t(k_.anchor)].count);
  else if (!vec && !lanes && find_grid_tables())
    out += grid_lanes()     ? fmt::format(", tap tables across dim {0}, SIMD lanes along dim {0}\n", grid_dim_)
           : grid_point_lanes()
               ? fmt::format(", tap tables across dim {0}, SIMD lanes along dim {0} in tiles "
                             "transposed to dim {1} (Note [grid_sample channels-last])\n",
                             grid_dim_, n() - 1)
           : grid_gathers() ? fmt::format(", tap tables across dim {}, SIMD gathers along dim {}\n",
                                          grid_dim_, n() - 1)
                            : fmt::format(", scalar, tap tables across dim {}\n", grid_dim_);
  else if (k_.kind == LoopKind::Pointwise && tiled_dim(vec) >= 0)
    out += fmt::format(", scalar, tiled with dim {} (Note [tiled transposes])\n", tiled_dim(vec));
  else if (flat)
    out += fmt::format(", SIMD across the innermost {} dims as one ({} points; Note [flattened lanes])\n",
                       flat_dims_, flat_points_);
  else
    out += vec && !dead_simd ? (k_.kind == LoopKind::Reduce && !lanes && reduce_rows()
                                    ? fmt::format(", SIMD, {} outputs of dim {} at a time (Note [reduction rows])\n",
                                                  kReduceRows, k_.kept_dims() - 1)
                                    : std::string(", SIMD\n"))
           : lanes ? fmt::format(", SIMD across dim {}\n", vdim_) : ", scalar\n";
  for (int32_t ni : k_.nodes) {
    const Node& nd = g_.nodes[size_t(ni)];
    out += fmt::format("//   node '{}': {} -> %{}\n", nd.name, op_def(nd.op).name,
                       g_.value(nd.outputs[0]).name);
  }
  // Kernels with index checks take the error record too (Note [Indexed loads]).
  out += fmt::format("extern \"C\" void {}(char* const* b, int kt{}) {{\n", k_.name,
                     k_.checks.empty() ? "" : ", i64* err");
  if (par() || k_.kind == LoopKind::Scatter)
    out += "  const int nt = kt > 0 ? kt : omp_get_max_threads();\n  (void)nt;\n";
  else
    out += "  (void)kt;\n";
  if (!opt_.inject_error_into.empty() && k_.name.find(opt_.inject_error_into) != std::string::npos)
    out += "  this_is_an_injected_error;  // CpuCodegenOptions::inject_error_into (tests)\n";
  out += pointers();
  if (k_.kind == LoopKind::Scatter) {
    emit_scatter(out);
    out += "}\n\n";
    return out;
  }
  if (k_.numel() == 0 && k_.kind == LoopKind::Pointwise) {
    out += "  (void)b;  // no elements\n}\n\n";
    return out;
  }
  switch (k_.kind) {
    case LoopKind::Pointwise: emit_pointwise(out, vec); break;
    case LoopKind::Reduce:
      if (lanes) emit_reduce_lanes(out);
      else if (grid_dim_ >= 0) emit_reduce_grid(out);
      else if (vec && reduce_rows()) emit_reduce_rows(out);
      else emit_reduce(out, vec);
      break;
    case LoopKind::Norm:
      if (buffered) emit_norm_buffered(out);
      else emit_norm(out, vec);
      break;
    case LoopKind::Scatter: break;
  }
  out += "}\n\n";
  return out;
}

}  // namespace

CpuUnit generate_cpu(const Graph& g, const lower::Schedule& s, const std::vector<MemRef>& mem,
                     const std::string& unit_name, const CpuCodegenOptions& options) {
  CpuUnit u;
  u.source = fmt::format("// Kiln CPU kernels for graph '{}' ({} kernels). Generated; do not edit.\n",
                         unit_name, s.loops.size());
  if (options.vector_bits == 256) u.source += "#define KN_VEC256 1\n";
  if (options.reduce_unroll > 1)  // changes the code; a comment keeps the cache key distinct too
    u.source += fmt::format("// reduce_unroll {}\n", options.reduce_unroll);
  u.source += cpu_prelude();
  u.source += "\n";
  for (const LoopKernel& k : s.loops) {
    KernelEmitter e(g, k, mem, options);
    bool v = false;
    u.source += e.emit(&v);
    u.symbols.push_back(k.name);
    u.vectorized.push_back(v);
    u.default_threads.push_back(k.numel() < options.min_parallel        ? -1
                                : k.numel() >= options.parallel_threshold ? 0
                                                                          : 1);
  }
  return u;
}

}  // namespace kiln::cpu
