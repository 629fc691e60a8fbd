// Note [CUDA code generation]
// Each LoopKernel (lower/loop_ir.h) becomes `extern "C" __global__ void NAME(char* p0, ...)`,
// whose parameters are the base pointers of the slots it reads or writes (the arena, graph
// inputs, constants); every offset and stride is a literal. Expressions are the shared scalar
// forms (lower/scalar_code.h over ops/scalar_math.h), so a fused kernel computes exactly what
// the CPU's scalar path computes, element by element.
//   Pointwise: one thread per element in a grid-stride loop over the linear index, the index of
//     each dim recovered by division by literal sizes. Where some accesses are linear (the
//     access's index is the linear index: contiguous over the iteration space) each thread
//     takes V consecutive elements instead (Note [CUDA vector accesses]).
//   Reduce: one block per kept point (a grid-stride loop over rows); the block's threads stride
//     over the reduced elements with one accumulator each (the Full-level prologue evaluated on
//     the way, Full-level stores made there), then a block reduction: warp shuffles in a fixed
//     xor-tree order and one shared-memory round across warps — no atomics, so a result depends
//     only on the shape and the block size: bitwise reproducible. mean divides by the count; var
//     makes a second pass for the squared deviations from the mean. Every thread evaluates the
//     Kept-level epilogue, thread 0 stores it.
//   Norm: one block per row. softmax / log_softmax: a pass for the row maximum, a pass for the
//     sum of exp(x - max), a pass that writes; layer_norm: a pass for the mean, one for the
//     variance (two-pass, in float), one that normalizes, applies weight and bias, runs the
//     epilogue and stores. Rows of up to 8 elements per thread keep the prologue's values in
//     registers from the first pass on (Note [CUDA rows held in registers]); longer ones
//     recompute the prologue in each pass (the row is in cache).
// Statistics are computed in float (double for float64 inputs, int64 for integer reductions), as
// on the CPU.
// Each kernel is preceded by `// kiln-kernel: NAME` and the graph nodes it computes, so an NVRTC
// error or a dumped program (KILN_DUMP_CODE) points back at the graph.
#include "targets/cuda/emitter.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>

#include "core/error.h"
#include "lower/scalar_code.h"
#include "ops/scalar_math_text.h"

namespace kiln::cuda {

using lower::Access;
using lower::Level;
using lower::LoopExpr;
using lower::LoopKernel;
using lower::LoopKind;
using lower::compute_type;
using lower::storage_type;

namespace {

const char* const kPreludeHead = R"KILN(// ---- Kiln generated CUDA code: prelude ----
// NVRTC programs have no standard headers: the fixed-width types and INFINITY come from here.
typedef long long int64_t;
typedef int int32_t;
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
)KILN";

const char* const kPreludeTail = R"KILN(
// ---- block reductions (Note [CUDA code generation]) ----
struct KnSum { template <typename T> __device__ T operator()(T a, T b) const { return a + b; } };
struct KnProd { template <typename T> __device__ T operator()(T a, T b) const { return a * b; } };
struct KnMax { template <typename T> __device__ T operator()(T a, T b) const { return kn_max(a, b); } };
struct KnMin { template <typename T> __device__ T operator()(T a, T b) const { return kn_min(a, b); } };
// Combines every thread's v with op in a fixed order (xor-tree within warps, then across the
// block's warps); every thread gets the result. All threads of the block must call it.
template <typename T, typename Op>
static __device__ __forceinline__ T kn_block_reduce(T v, Op op, T init) {
  __shared__ T kn_shared[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  __syncthreads();  // kn_shared may still be read by a previous call
  if (lane == 0) kn_shared[warp] = v;
  __syncthreads();
  v = lane < warps ? kn_shared[lane] : init;
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
)KILN";

const char* const kPreludeStatus = R"KILN(
// ---- grid dependency (Note [CUDA programmatic launch] in target.cc) ----
// Every generated kernel's first statement. On sm_90 and later
// it waits until the kernel launched before it in the stream has finished and its writes are
// visible, then lets the next kernel's blocks be scheduled; both are no-ops for a kernel
// launched without the programmatic attribute, and absent before sm_90 and on the host.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define KN_GRID_WAIT() do { asm volatile("griddepcontrol.wait;" ::: "memory"); \
                            asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); } while (0)
#else
#define KN_GRID_WAIT() do { } while (0)
#endif
// ---- bad values (Note [Device status] in runtime/executable.h) ----
// The first report of a call wins: st[0] = the check's code (> 0), st[1] = the value.
static __device__ __noinline__ void kn_report(long long* st, long long code, long long value) {
  if (atomicCAS((unsigned long long*)st, 0ULL, (unsigned long long)code) == 0ULL) st[1] = value;
}
// Integer div / pow as the reference (ops/binary.cc): truncating division, INT64_MIN / -1
// wraps; a zero divisor or a negative exponent is reported and gives 0.
static __device__ __forceinline__ i64 kn_idiv(i64 a, i64 b, long long* st, long long code) {
  if (b == 0) { kn_report(st, code, 0); return 0; }
  if (b == -1) return kn_wrap_sub(0, a);
  return a / b;
}
static __device__ __forceinline__ i64 kn_ipow(i64 base, i64 e, long long* st, long long code) {
  if (e < 0) { kn_report(st, code, e); return 0; }
  unsigned long long r = 1, b = (unsigned long long)base;
  for (unsigned long long k = (unsigned long long)e; k; k >>= 1) {
    if (k & 1) r *= b;
    b *= b;
  }
  return (i64)r;
}
)KILN";

// Whether expression e is an integer div / pow, which reports bad values (Note [Device status]).
bool reports_bad_values(const LoopExpr& e) {
  return e.kind == LoopExpr::Kind::Op && (e.op == OpId::Div || e.op == OpId::Pow) &&
         std::string(compute_type(e.dtype)) != "float" && e.dtype != DType::Float64;
}

int pow2_at_least(int64_t n, int lo, int hi) {
  int t = lo;
  while (t < hi && t < n) t *= 2;
  return t;
}

class KernelEmitter {
 public:
  KernelEmitter(const Graph& g, const LoopKernel& k, const std::vector<MemRef>& mem,
                const CudaCodegenOptions& o, int64_t max_blocks)
      : g_(g), k_(k), mem_(mem), opt_(o), max_blocks_(max_blocks) {}
  std::string emit(CudaKernelInfo* info);

 private:
  int n() const { return int(k_.sizes.size()); }
  int64_t kept_numel() const {
    int64_t p = 1;
    for (int t = 0; t < k_.kept_dims(); ++t) p *= k_.sizes[size_t(t)];
    return p;
  }
  int64_t reduce_numel() const {
    int64_t p = 1;
    for (int t = k_.kept_dims(); t < n(); ++t) p *= k_.sizes[size_t(t)];
    return p;
  }
  std::string expr(int e) const;
  void emit_exprs(std::string& out, const std::vector<bool>& want, Level level,
                  const std::string& ind) const;
  void emit_stores(std::string& out, Level level, const std::string& ind,
                   const char* guard = nullptr) const;
  std::string pointers(CudaKernelInfo* info) const;
  // `i<first>..i<last-1>` from the linear index `lin` over those dims.
  std::string unflatten(int first, int last, const std::string& lin, const std::string& ind) const;
  void emit_pointwise(std::string& out, CudaKernelInfo* info);
  // The vector form of a pointwise kernel (Note [CUDA vector accesses]); false when no access
  // is linear or the elements are too wide for more than one per 16 bytes.
  bool emit_pointwise_vector(std::string& out, CudaKernelInfo* info);
  void emit_reduce(std::string& out, CudaKernelInfo* info);
  void emit_norm(std::string& out, CudaKernelInfo* info);
  // Note [CUDA rows held in registers]: the plan of what the writing pass takes from registers.
  bool norm_cache_plan(const std::vector<bool>& wx, int64_t threads, std::vector<bool>* cached,
                       std::vector<bool>* rest, int64_t* per_thread) const;
  // Opens `for (row ...) { i<kept> from row; ` and returns the indentation inside.
  std::string open_rows(std::string& out) const;
  // A loop over the row's reduced elements around `body` (i<kept..> set from r).
  std::string row_loop(const std::string& ind, const std::string& body) const;

  const Graph& g_;
  const LoopKernel& k_;
  const std::vector<MemRef>& mem_;
  const CudaCodegenOptions& opt_;
  int64_t max_blocks_;
  lower::ScalarDialect dialect_ = lower::kCudaDialect;
};

std::string KernelEmitter::expr(int ei) const {
  const LoopExpr& e = k_.exprs[size_t(ei)];
  if (!reports_bad_values(e)) return lower::scalar_expr(k_, ei, dialect_);
  std::string r = fmt::format("{}((i64)v{}, (i64)v{}, kn_status, {}LL)",
                              e.op == OpId::Div ? "kn_idiv" : "kn_ipow", e.args[0], e.args[1],
                              int64_t(e.node) + 1);
  return e.dtype == DType::Bool ? "(" + r + " != 0)" : r;
}

// Whether access `a` over iteration space `sizes` reads or writes element `lin` at the linear
// index itself (row-major contiguous; dims of size 1 are free).
bool linear_access(const Access& a, const std::vector<int64_t>& sizes) {
  int64_t expect = 1;
  for (size_t t = sizes.size(); t-- > 0;) {
    if (sizes[t] == 1) continue;
    if (a.strides[t] != expect) return false;
    expect *= sizes[t];
  }
  return true;
}

// An unsigned type of exactly `bytes` bytes (1, 2, 4, 8, 16) for moving a chunk of elements.
const char* chunk_type(int64_t bytes) {
  switch (bytes) {
    case 16: return "uint4";
    case 8: return "uint2";
    case 4: return "unsigned int";
    case 2: return "unsigned short";
    default: return "unsigned char";
  }
}

void KernelEmitter::emit_exprs(std::string& out, const std::vector<bool>& want, Level level,
                               const std::string& ind) const {
  for (size_t i = 0; i < k_.exprs.size(); ++i) {
    const LoopExpr& e = k_.exprs[i];
    if (!want[i] || e.level != level) continue;
    if (e.kind == LoopExpr::Kind::Reduce || e.kind == LoopExpr::Kind::Norm) continue;
    const std::string comment = lower::expr_comment(g_, k_, int(i));
    out += fmt::format("{}const {} v{} = {};{}\n", ind, compute_type(e.dtype), i, expr(int(i)), comment);
  }
}

void KernelEmitter::emit_stores(std::string& out, Level level, const std::string& ind,
                                const char* guard) const {
  for (size_t i = 0; i < k_.stores.size(); ++i) {
    const lower::LoopStore& st = k_.stores[i];
    if (k_.exprs[size_t(st.expr)].level != level) continue;
    out += fmt::format("{}{}S{}[{}] = {};\n", ind, guard ? guard : "", i,
                       lower::index_expr(st.access.strides),
                       lower::store_value(st.access.dtype, fmt::format("v{}", st.expr)));
  }
}

std::string KernelEmitter::pointers(CudaKernelInfo* info) const {
  std::string s;
  std::map<int32_t, int> param;  // slot -> parameter index
  auto ref = [&](ValueId v) {
    const MemRef& m = mem_[size_t(v)];
    if (m.slot < 0)
      throw_error(ErrorKind::Internal,
                  fmt::format("cuda codegen: kernel {} reads or writes '%{}', which has no memory",
                              k_.name, g_.value(v).name));
    auto [it, added] = param.emplace(m.slot, int(info->slots.size()));
    if (added) info->slots.push_back(m.slot);
    return std::make_pair(it->second, m.byte_offset);
  };
  for (size_t i = 0; i < k_.loads.size(); ++i) {
    const Access& a = k_.loads[i];
    auto [p, off] = ref(a.value);
    s += fmt::format("  const {0}* __restrict__ L{1} = (const {0}*)(p{2} + {3}) + {4};  // %{5}\n",
                     storage_type(a.dtype), i, p, off, a.offset, g_.value(a.value).name);
  }
  for (size_t i = 0; i < k_.stores.size(); ++i) {
    const Access& a = k_.stores[i].access;
    auto [p, off] = ref(a.value);
    s += fmt::format("  {0}* __restrict__ S{1} = ({0}*)(p{2} + {3}) + {4};  // %{5}\n",
                     storage_type(a.dtype), i, p, off, a.offset, g_.value(a.value).name);
  }
  if (std::any_of(k_.exprs.begin(), k_.exprs.end(), reports_bad_values)) {
    if (opt_.status_slot < 0)
      throw_error(ErrorKind::Internal,
                  fmt::format("cuda codegen: kernel {} reports bad values but has no status record",
                              k_.name));
    info->slots.push_back(opt_.status_slot);
    s += fmt::format("  long long* kn_status = (long long*)p{};  // the status record\n",
                     info->slots.size() - 1);
  }
  return s;
}

std::string KernelEmitter::unflatten(int first, int last, const std::string& lin,
                                     const std::string& ind) const {
  std::string s;
  if (first >= last) return s;
  s += fmt::format("{}i64 rest_ = {};\n", ind, lin);
  for (int t = last - 1; t >= first; --t) {
    int64_t size = k_.sizes[size_t(t)];
    if (t == first) {
      s += fmt::format("{}const i64 i{} = rest_;\n", ind, t);
    } else {
      s += fmt::format("{}const i64 i{} = rest_ % {};\n", ind, t, size);
      s += fmt::format("{}rest_ /= {};\n", ind, size);
    }
  }
  s += fmt::format("{}(void)rest_;\n", ind);
  return s;
}

// Note [CUDA vector accesses]
// A pointwise kernel is memory-bound; one 4-byte load per thread leaves most of a DRAM
// transaction's width unused. Where accesses are linear (linear_access), each thread takes V
// consecutive elements: a linear load moves V elements as one 16-byte (or narrower) chunk into
// a register array `kL<i>` that the expressions read as kL<i>[j_]; a linear store collects V
// results in `kS<i>` and writes them as one chunk; any other access (a broadcast bias, a
// transposed operand) reads or writes its element by index as in the scalar form, from the
// i<t> recovered for lin = base + j_. V = 16 bytes / the widest linear element (at most 8).
// Chunks must be aligned to their size: the kernel checks every linear pointer at run time
// (inputs bound in place may be any view) and otherwise runs the scalar loop, as it does for
// the last N % V elements. Each element computes the same expressions in the same order as in
// the scalar form, so results are bitwise those of the scalar loop.
bool KernelEmitter::emit_pointwise_vector(std::string& out, CudaKernelInfo* info) {
  std::vector<bool> lin_load(k_.loads.size()), lin_store(k_.stores.size());
  int64_t widest = 0;
  for (size_t i = 0; i < k_.loads.size(); ++i)
    if ((lin_load[i] = linear_access(k_.loads[i], k_.sizes)))
      widest = std::max<int64_t>(widest, dtype_size(k_.loads[i].dtype));
  for (size_t i = 0; i < k_.stores.size(); ++i)
    if ((lin_store[i] = linear_access(k_.stores[i].access, k_.sizes)))
      widest = std::max<int64_t>(widest, dtype_size(k_.stores[i].access.dtype));
  if (widest == 0) return false;
  const int64_t V = std::min<int64_t>(16 / widest, 8);
  const int64_t N = k_.numel();
  if (V < 2 || N < V) return false;
  const int64_t Nv = N - N % V;
  info->threads = opt_.threads_per_block;
  info->blocks = std::min<int64_t>((Nv / V + info->threads - 1) / info->threads, max_blocks_);

  std::vector<std::string> load_text(k_.loads.size());
  std::string aligned;
  auto add_aligned = [&](const std::string& ptr, DType d) {
    aligned += fmt::format("{}((unsigned long long)({}) % {}ULL == 0)", aligned.empty() ? "" : " && ",
                           ptr, V * dtype_size(d));
  };
  for (size_t i = 0; i < k_.loads.size(); ++i)
    if (lin_load[i]) {
      load_text[i] = fmt::format("kL{}[j_]", i);
      add_aligned(fmt::format("L{}", i), k_.loads[i].dtype);
    }
  for (size_t i = 0; i < k_.stores.size(); ++i)
    if (lin_store[i]) add_aligned(fmt::format("S{}", i), k_.stores[i].access.dtype);

  out += fmt::format("  // vector form: {} elements per thread where every linear pointer is aligned\n", V);
  out += fmt::format("  const bool kn_vec = {};\n", aligned);
  out += "  if (kn_vec) {\n";
  out += fmt::format("  for (i64 base = (i64(blockIdx.x) * blockDim.x + threadIdx.x) * {0}; base < {1}; "
                     "base += i64(gridDim.x) * blockDim.x * {0}) {{\n", V, Nv);
  for (size_t i = 0; i < k_.loads.size(); ++i)
    if (lin_load[i]) {
      const char* T = lower::storage_type(k_.loads[i].dtype);
      const char* C = chunk_type(V * dtype_size(k_.loads[i].dtype));
      out += fmt::format("    __align__(16) {0} kL{1}[{2}];\n    *({3}*)kL{1} = *(const {3}*)(L{1} + base);\n",
                         T, i, V, C);
    }
  for (size_t i = 0; i < k_.stores.size(); ++i)
    if (lin_store[i])
      out += fmt::format("    __align__(16) {} kS{}[{}];\n", lower::storage_type(k_.stores[i].access.dtype), i, V);
  out += fmt::format("    #pragma unroll\n    for (int j_ = 0; j_ < {}; ++j_) {{\n", V);
  out += "      const i64 lin = base + j_;\n" + unflatten(0, n(), "lin", "      ");
  dialect_.load_text = &load_text;
  std::vector<bool> all(k_.exprs.size(), true);
  emit_exprs(out, all, Level::Full, "      ");
  dialect_.load_text = nullptr;
  for (size_t i = 0; i < k_.stores.size(); ++i) {
    const lower::LoopStore& st = k_.stores[i];
    std::string value = lower::store_value(st.access.dtype, fmt::format("v{}", st.expr));
    if (lin_store[i]) out += fmt::format("      kS{}[j_] = {};\n", i, value);
    else out += fmt::format("      S{}[{}] = {};\n", i, lower::index_expr(st.access.strides), value);
  }
  out += "    }\n";
  for (size_t i = 0; i < k_.stores.size(); ++i)
    if (lin_store[i]) {
      const char* C = chunk_type(V * dtype_size(k_.stores[i].access.dtype));
      out += fmt::format("    *({0}*)(S{1} + base) = *(const {0}*)kS{1};\n", C, i);
    }
  out += "  }\n  }\n";
  // The scalar loop: the last N % V elements, or everything when a pointer is misaligned.
  out += fmt::format("  for (i64 lin = (kn_vec ? {}LL : 0LL) + i64(blockIdx.x) * blockDim.x + threadIdx.x; "
                     "lin < {}; lin += i64(gridDim.x) * blockDim.x) {{\n", Nv, N);
  out += "  {\n" + unflatten(0, n(), "lin", "    ");
  emit_exprs(out, all, Level::Full, "    ");
  emit_stores(out, Level::Full, "    ");
  out += "  }\n  }\n";
  return true;
}

void KernelEmitter::emit_pointwise(std::string& out, CudaKernelInfo* info) {
  if (opt_.vectorize && emit_pointwise_vector(out, info)) return;
  const int64_t N = k_.numel();
  info->threads = opt_.threads_per_block;
  info->blocks = std::min<int64_t>((N + info->threads - 1) / info->threads, max_blocks_);
  out += fmt::format("  for (i64 lin = i64(blockIdx.x) * blockDim.x + threadIdx.x; lin < {}; "
                     "lin += i64(gridDim.x) * blockDim.x) {{\n", N);
  out += "  {\n" + unflatten(0, n(), "lin", "    ");
  std::vector<bool> all(k_.exprs.size(), true);
  emit_exprs(out, all, Level::Full, "    ");
  emit_stores(out, Level::Full, "    ");
  out += "  }\n  }\n";
}

std::string KernelEmitter::open_rows(std::string& out) const {
  out += fmt::format("  for (i64 row = blockIdx.x; row < {}; row += gridDim.x) {{\n", kept_numel());
  out += unflatten(0, k_.kept_dims(), "row", "    ");
  return "    ";
}

std::string KernelEmitter::row_loop(const std::string& ind, const std::string& body) const {
  std::string s = fmt::format("{}for (i64 r = threadIdx.x; r < {}; r += blockDim.x) {{\n", ind, reduce_numel());
  s += "{\n";  // a scope for rest_
  s += unflatten(k_.kept_dims(), n(), "r", ind + "  ");
  s += body;
  s += "}\n";
  s += ind + "}\n";
  return s;
}

void KernelEmitter::emit_reduce(std::string& out, CudaKernelInfo* info) {
  const LoopExpr& red = k_.exprs[size_t(k_.anchor)];
  const int x = red.args[0];
  // Accumulators: float (double for float64, and for every floating prod: a product of float32
  // values underflows or overflows in float where the float64 reference does not, and the
  // block's tree order then turns inf * (a product that underflowed to 0) into NaN), int64 for
  // integer and bool inputs (sum and prod give int64; max and min of the input dtype, exact in
  // int64).
  const bool integral = !is_floating(k_.exprs[size_t(x)].dtype) && !is_floating(red.dtype);
  const bool dbl = k_.exprs[size_t(x)].dtype == DType::Float64 || red.dtype == DType::Float64 ||
                   (red.op == OpId::Prod && !integral);
  const char* at = dbl ? "double" : integral ? "i64" : "float";
  info->threads = pow2_at_least(reduce_numel(), 32, opt_.threads_per_block);
  info->blocks = std::min<int64_t>(kept_numel(), max_blocks_);
  std::string ind = open_rows(out);
  std::vector<bool> want = lower::expr_closure(k_, x);
  for (const lower::LoopStore& st : k_.stores)
    if (k_.exprs[size_t(st.expr)].level == Level::Full) {
      std::vector<bool> c = lower::expr_closure(k_, st.expr);
      for (size_t i = 0; i < c.size(); ++i) want[i] = want[i] || c[i];
    }
  OpId op = red.op;
  const char* init = op == OpId::Max   ? (integral ? "(-9223372036854775807LL - 1)" : "-INFINITY")
                     : op == OpId::Min   ? (integral ? "9223372036854775807LL" : "INFINITY")
                     : op == OpId::Prod ? "1"
                                        : "0";
  const char* functor = op == OpId::Max ? "KnMax()" : op == OpId::Min ? "KnMin()" : op == OpId::Prod ? "KnProd()" : "KnSum()";
  auto combine = [&](const std::string& a, const std::string& v) -> std::string {
    switch (op) {
      case OpId::Max: return fmt::format("{0} = kn_max({0}, ({2}){1});", a, v, at);
      case OpId::Min: return fmt::format("{0} = kn_min({0}, ({2}){1});", a, v, at);
      case OpId::Prod: return fmt::format("{0} *= ({2}){1};", a, v, at);
      default: return fmt::format("{0} += ({2}){1};", a, v, at);
    }
  };
  out += fmt::format("{}{} acc = {};\n", ind, at, init);
  std::string body;
  emit_exprs(body, want, Level::Full, ind + "  ");
  body += ind + "  " + combine("acc", fmt::format("v{}", x)) + "\n";
  emit_stores(body, Level::Full, ind + "  ");
  out += row_loop(ind, body);
  out += fmt::format("{0}acc = kn_block_reduce(acc, {1}, ({2}){3});\n", ind, functor, at, init);
  std::string result = "acc";
  if (op == OpId::Mean) result = fmt::format("acc / ({}){}", at, red.count);
  if (op == OpId::Var) {
    out += fmt::format("{0}const {1} mean_ = acc / ({1}){2};\n{0}{1} ss = 0;\n", ind, at, red.count);
    std::string b2;
    emit_exprs(b2, lower::expr_closure(k_, x), Level::Full, ind + "  ");
    b2 += fmt::format("{0}  {{ const {2} d = ({2})v{1} - mean_; ss += d * d; }}\n", ind, x, at);
    out += row_loop(ind, b2);
    out += fmt::format("{0}ss = kn_block_reduce(ss, KnSum(), ({1})0);\n", ind, at);
    int64_t corr = red.attrs->get_int("correction");
    int64_t div = std::max<int64_t>(red.count - corr, 0);
    result = fmt::format("ss / ({}){}", at, div);
  }
  std::string rv = fmt::format("({})({})", compute_type(red.dtype), result);
  if (red.dtype == DType::BFloat16) rv = "kn_rbf16(" + rv + ")";
  if (red.dtype == DType::Float16) rv = "kn_rf16(" + rv + ")";
  out += fmt::format("{}const {} v{} = {};\n", ind, compute_type(red.dtype), k_.anchor, rv);
  std::vector<bool> all(k_.exprs.size(), true);
  emit_exprs(out, all, Level::Kept, ind);
  emit_stores(out, Level::Kept, ind, "if (threadIdx.x == 0) ");
  out += "  }\n";
}

// Note [CUDA rows held in registers]
// A norm kernel's row passes (layer_norm: mean, variance, write; softmax: max, sum, write) each
// used to evaluate the row's prologue again: the loads of every input and what the fused ops
// compute from them, three times over (from L1 after the first pass, but each pass a dependent
// round of loads behind a block reduction, in kernels that take a few microseconds). Where the
// row fits the block R <= 8 times over (BERT's and ViT's 768 columns: R = 3 at 256 threads),
// the first pass keeps, in R registers per thread, x and every other value of the prologue
// that the writing pass needs (what it stores, what the epilogue reads); the later passes read
// those registers and evaluate only what is not in x's prologue (weight and bias loads, the
// epilogue). Each thread visits the same elements in the same order as the strided loops
// (r = threadIdx.x + j * blockDim.x), so the statistics, and every result, are bitwise the same.
// Longer rows, or prologues that would need more than 24 registers of cache, keep the
// recomputing passes.

// Which of the norm kernel's expressions the writing pass takes from registers (Note [CUDA rows
// held in registers]): `cached` gets them (x and what the rest reads of x's prologue), `rest`
// what the writing pass evaluates; *per_thread the row's elements per thread. False when the
// row or the cache is too large, or the kernel has per-row expressions.
bool KernelEmitter::norm_cache_plan(const std::vector<bool>& wx, int64_t threads,
                                    std::vector<bool>* cached, std::vector<bool>* rest,
                                    int64_t* per_thread) const {
  const LoopExpr& nm = k_.exprs[size_t(k_.anchor)];
  const int64_t N = reduce_numel(), R = (N + threads - 1) / threads;
  if (R < 1 || R > 8) return false;
  const size_t E = k_.exprs.size();
  std::vector<bool> in_c(E, false), w(E, false), need(E, false);
  for (size_t i = 0; i < E; ++i) {
    const LoopExpr& e = k_.exprs[i];
    if (int(i) == k_.anchor) continue;
    if (e.level != Level::Full) {
      if (e.kind != LoopExpr::Kind::Reduce && e.kind != LoopExpr::Kind::Norm) return false;
      continue;
    }
    if (wx[i] && int(i) < k_.anchor) in_c[i] = true;
    else w[i] = true;
  }
  need[size_t(nm.args[0])] = true;
  for (size_t i = 0; i < E; ++i) {
    if (!w[i] && int(i) != k_.anchor) continue;
    for (int a : k_.exprs[i].args)
      if (a >= 0 && in_c[size_t(a)]) need[size_t(a)] = true;
  }
  for (const lower::LoopStore& st : k_.stores)
    if (in_c[size_t(st.expr)]) need[size_t(st.expr)] = true;
  int64_t n_cached = 0;
  for (size_t i = 0; i < E; ++i) n_cached += need[i] ? 1 : 0;
  if (n_cached * R > 24) return false;
  *cached = std::move(need);
  *rest = std::move(w);
  *per_thread = R;
  return true;
}

void KernelEmitter::emit_norm(std::string& out, CudaKernelInfo* info) {
  const LoopExpr& nm = k_.exprs[size_t(k_.anchor)];
  const int x = nm.args[0];
  const bool ln = nm.op == OpId::LayerNorm;
  // Statistics in float, in double for float64 rows (as the CPU's eager kernels).
  const bool dbl = nm.dtype == DType::Float64;
  const std::string at = dbl ? "double" : "float";
  info->threads = pow2_at_least(reduce_numel(), 32, opt_.threads_per_block);
  info->blocks = std::min<int64_t>(kept_numel(), max_blocks_);
  const size_t E = k_.exprs.size();
  const std::vector<bool> wx = lower::expr_closure(k_, x);
  std::vector<bool> cached, rest;
  int64_t R = 0;
  const bool held = norm_cache_plan(wx, info->threads, &cached, &rest, &R);
  const std::string ind = open_rows(out);
  // A loop over the row's elements around `body`: strided (i<kept..> set from r), or, with the
  // row held in registers, unrolled over the thread's R elements (j_ its slot; i<..> set only
  // where `index`).
  const std::string in = held ? ind + "    " : ind + "  ";
  auto loop = [&](const std::string& body, bool index) {
    if (!held) return row_loop(ind, body);
    std::string s = fmt::format("{0}#pragma unroll\n{0}for (int j_ = 0; j_ < {1}; ++j_) {{\n"
                                "{0}  const i64 r = i64(threadIdx.x) + i64(j_) * {2};\n"
                                "{0}  if (r < {3}) {{\n",
                                ind, R, info->threads, reduce_numel());
    if (index) s += "{\n" + unflatten(k_.kept_dims(), n(), "r", in);
    s += body;
    if (index) s += "}\n";
    return s + ind + "  }\n" + ind + "}\n";
  };
  // The first pass evaluates x's prologue (and fills the registers); later statistics passes
  // read x from the registers, or evaluate the prologue again.
  std::string first, restore;
  emit_exprs(first, wx, Level::Full, in);
  if (held)
    for (size_t i = 0; i < E; ++i) {
      if (!cached[i]) continue;
      const char* t = compute_type(k_.exprs[i].dtype);
      out += fmt::format("{}{} c{}_[{}];\n", ind, t, i, R);
      first += fmt::format("{}c{}_[j_] = v{};\n", in, i, i);
      restore += fmt::format("{}const {} v{} = c{}_[j_];\n", in, t, i, i);
    }
  auto again = [&](const std::string& stat) {
    std::string b;
    if (held)
      b = fmt::format("{}const {} v{} = c{}_[j_];\n", in, compute_type(k_.exprs[size_t(x)].dtype), x, x);
    else
      emit_exprs(b, wx, Level::Full, in);
    return loop(b + in + stat + "\n", !held);
  };
  if (ln) {
    out += fmt::format("{}{} sum_ = 0;\n", ind, at);
    out += loop(first + fmt::format("{}sum_ += ({})v{};\n", in, at, x), true);
    out += fmt::format("{0}const {1} mean = kn_block_reduce(sum_, KnSum(), ({1})0) / ({1}){2};\n{0}{1} ss_ = 0;\n",
                       ind, at, nm.count);
    out += again(fmt::format("{{ const {0} d = ({0})v{1} - mean; ss_ += d * d; }}", at, x));
    double eps = nm.attrs->get_float("eps");
    out += fmt::format("{0}const {1} rstd = ({1})1 / {4}(kn_block_reduce(ss_, KnSum(), ({1})0) / ({1}){2} + ({1}){3});\n",
                       ind, at, nm.count, lower::literal(eps, lower::kCudaDialect), dbl ? "sqrt" : "sqrtf");
  } else {
    out += fmt::format("{}{} m_ = -INFINITY;\n", ind, at);
    out += loop(first + fmt::format("{}m_ = kn_max(m_, ({})v{});\n", in, at, x), true);
    out += fmt::format("{0}const {1} m_s = kn_block_reduce(m_, KnMax(), ({1})-INFINITY);\n{0}{1} s_ = 0;\n", ind, at);
    out += again(fmt::format("s_ += kn_exp(({})v{} - m_s);", at, x));
    out += fmt::format("{0}const {1} s_s = kn_block_reduce(s_, KnSum(), ({1})0);\n", ind, at);
    if (nm.op == OpId::Softmax) out += fmt::format("{0}const {1} inv_s = ({1})1 / s_s;\n", ind, at);
    else out += fmt::format("{}const {} log_s = kn_log(s_s);\n", ind, at);
  }
  // The writing pass: everything before the anchor (with the row held: the registers, then what
  // is outside x's prologue), the anchor, everything after, the stores.
  std::string xs = fmt::format("v{}", x);
  std::string r;
  if (ln) {
    r = fmt::format("(({}){} - mean) * rstd", at, xs);
    if (nm.args[1] >= 0) r = fmt::format("{} * ({})v{}", r, at, nm.args[1]);
    if (nm.args[2] >= 0) r = fmt::format("{} + ({})v{}", r, at, nm.args[2]);
  } else if (nm.op == OpId::Softmax) {
    r = fmt::format("kn_exp(({}){} - m_s) * inv_s", at, xs);
  } else {
    r = fmt::format("({}){} - (m_s + log_s)", at, xs);
  }
  if (nm.dtype == DType::BFloat16) r = "kn_rbf16(" + r + ")";
  if (nm.dtype == DType::Float16) r = "kn_rf16(" + r + ")";
  std::vector<bool> pre(E, false), post(E, false);
  for (size_t i = 0; i < E; ++i)
    (int(i) < k_.anchor ? pre : post)[i] = held ? bool(rest[i]) : int(i) != k_.anchor;
  std::string b = restore;
  emit_exprs(b, pre, Level::Full, in);
  b += fmt::format("{}const {} v{} = {};\n", in, compute_type(nm.dtype), k_.anchor, r);
  emit_exprs(b, post, Level::Full, in);
  emit_stores(b, Level::Full, in);
  out += loop(b, true);
  out += "  }\n";
}

std::string KernelEmitter::emit(CudaKernelInfo* info) {
  info->name = k_.name;
  std::string out = fmt::format("// kiln-kernel: {}\n// {} over [{}]", k_.name,
                                lower::loop_kind_name(k_.kind), fmt::join(k_.sizes, ", "));
  if (k_.reduce_dims) out += fmt::format(", last {} reduced", k_.reduce_dims);
  out += "\n";
  for (int32_t ni : k_.nodes) {
    const Node& nd = g_.nodes[size_t(ni)];
    out += fmt::format("//   node '{}': {} -> %{}\n", nd.name, op_def(nd.op).name,
                       g_.value(nd.outputs[0]).name);
  }
  std::string body = pointers(info);
  if (!opt_.inject_error_into.empty() && k_.name.find(opt_.inject_error_into) != std::string::npos)
    body += "  this_is_an_injected_error;  // CudaCodegenOptions::inject_error_into (tests)\n";
  bool empty = k_.numel() == 0 && k_.kind == LoopKind::Pointwise;
  if (k_.kind != LoopKind::Pointwise && kept_numel() == 0) empty = true;
  if (empty) {
    info->blocks = 0;
    info->threads = 1;
  } else {
    switch (k_.kind) {
      case LoopKind::Pointwise: emit_pointwise(body, info); break;
      case LoopKind::Reduce: emit_reduce(body, info); break;
      case LoopKind::Norm: emit_norm(body, info); break;
      case LoopKind::Scatter:
        throw_error(ErrorKind::Internal, "codegen: the CUDA emitter has no scatter kernels");
    }
  }
  std::string params;
  for (size_t i = 0; i < info->slots.size(); ++i)
    params += fmt::format("{}char* p{}", i ? ", " : "", i);
  out += fmt::format("extern \"C\" __global__ void __launch_bounds__({}) {}({}) {{\n",
                     std::max(info->threads, 1), k_.name, params);
  out += kGridWait;
  out += body;
  out += "}\n\n";
  return out;
}

}  // namespace

const std::string& cuda_prelude() {
  static const std::string text = std::string(kPreludeHead) +
                                  "// ---- scalar math (src/ops/scalar_math.h) ----\n" +
                                  scalar_math_text() + kPreludeTail + kPreludeStatus;
  return text;
}

const char* cuda_status_prelude() { return kPreludeStatus; }

CudaProgram generate_cuda(const Graph& g, const lower::Schedule& s, const std::vector<MemRef>& mem,
                          const std::string& program_name, int64_t max_blocks,
                          const CudaCodegenOptions& options) {
  CudaProgram p;
  p.source = fmt::format("// Kiln CUDA kernels for graph '{}' ({} kernels). Generated; do not edit.\n",
                         program_name, s.loops.size());
  p.source += cuda_prelude();
  p.source += "\n";
  for (const LoopKernel& k : s.loops) {
    KernelEmitter e(g, k, mem, options, std::max<int64_t>(max_blocks, 1));
    CudaKernelInfo info;
    p.source += e.emit(&info);
    p.kernels.push_back(std::move(info));
    for (const LoopExpr& x : k.exprs) {
      if (!reports_bad_values(x)) continue;
      const int64_t code = int64_t(x.node) + 1;
      bool seen = false;  // a node recomputed in several kernels reports under one code
      for (const Executable::DeviceCheck& c : p.checks) seen = seen || c.code == code;
      if (seen) continue;
      const Node& n = g.nodes[size_t(x.node)];
      Executable::DeviceCheck c;
      c.code = code;
      if (x.op == OpId::Div) {
        c.prefix = fmt::format("op 'div' at node '{}': integer division by ", n.name);
        c.suffix = " (divide floating tensors to get inf/nan, or mask the zeros first)";
      } else {
        c.prefix = fmt::format("op 'pow' at node '{}': integer base raised to the negative "
                               "exponent ", n.name);
        c.suffix = "; the result is not an integer (cast to a floating dtype first)";
      }
      p.checks.push_back(std::move(c));
    }
  }
  return p;
}

}  // namespace kiln::cuda
