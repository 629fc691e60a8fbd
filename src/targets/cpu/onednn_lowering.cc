// oneDNN extern kernels for the CPU compiler. See onednn_lowering.h.
//
// Note [oneDNN lowering]
// The eager kernels (src/eager/onednn.cc) look a primitive up per call, wrap every tensor in a
// fresh dnnl::memory, and reorder weights on every call (eager cannot trust a cached copy of a
// tensor that may be rewritten). Here a graph is frozen, so everything is done once, when the
// OnednnLowering is constructed:
//   - one primitive per node, with the epilogue of fused_conv2d / fused_linear as post-ops:
//     bias as the primitive's bias argument (kept in f32), the residual as a sum post-op with
//     scale sum_scale, the activation as an eltwise post-op (relu, gelu_erf, gelu_tanh,
//     swish with alpha 1 for silu, logistic, tanh, clip for clamp);
//   - weights reordered into the format the primitive chose (format_tag::any), owned here;
//   - the reorders a node needs around its primitive (Note [layout choice]), prebuilt;
//   - every dnnl::memory a node touches, created with no buffer, and the execute-argument
//     arrays (dnnl_exec_arg_t) pointing at them.
// run() then only binds pointers (dnnl_memory_set_data_handle_v2, skipped when the memory
// already holds that pointer, which is the steady state of an executable with a fixed arena)
// and executes the node's steps through the C API, so Kiln's code allocates nothing. oneDNN's
// execute() itself builds a small argument map inside the library: a handful of small heap
// allocations per primitive execution, which the report on this module measures.
//
// Concurrency: the prebuilt memory objects hold the pointers last bound, so they are per call
// state: a NodeInstance has its own for every bound buffer (and the argument arrays over them),
// one per execution context (Note [Execution contexts] in runtime/executable.cc); primitives,
// prepacked weights and constants are shared, and oneDNN executes one primitive from several
// threads at once on distinct memory. Streams are per thread.
//
// Scratch: each node lays out [reorder temporaries | one scratchpad area] in the caller's
// scratch region; all primitives use scratchpad_mode::user and the scratchpad area is sized
// for the largest of the node's steps (they run one after another on one in-order stream).
// scratchpad_bytes() is the maximum over nodes.
//
// The residual of a sum post-op must already sit in dst when the primitive runs, so a node
// with a residual first copies (reorders) it into dst. The caller may pass the residual's
// buffer as the output buffer (residual_may_alias_output): where the primitive writes the
// output directly and the residual has its layout, the copy is then skipped, so a memory
// planner that puts the output in place of a dying residual saves one activation pass; where
// the primitive computes into a scratch temporary (reordered into the output last), the copy
// runs as usual and aliasing is still safe.
//
// The OnednnLowering keeps no reference to the Graph: constants that a node reads as
// activations are copied, and descriptions are built at construction.
//
// Note [layout choice]
// Blocked layouts (nChw16c and friends) are what oneDNN's fast convolutions compute in. A value
// produced by a lowered conv/deconv/pool node whose every use is as input 0 of a lowered
// conv/deconv/pool node or as the residual of a lowered fused_conv2d, and which is not a graph
// output, may stay blocked: its producer is created with dst format_tag::any and the layout it
// picks becomes the value's layout. Consumers are created with exactly that src layout, so the
// chain conv -> conv -> pool -> conv runs without a reorder. Every other value is plain
// (contiguous row-major, NCHW for 4-D). A primitive created with format_tag::any on a plain
// src or dst may still want a blocked one: the reorder between the plain value and a scratch
// temporary is prebuilt and runs inside run(). Pooling takes its src layout as given (a reorder
// would cost more than the memory-bound pooling saves). With allow_blocked = false everything
// is plain NCHW (weights still prepacked), so an autotuner can time both.
// One exception: a 1x1 convolution (groups 1) whose src and dst are both plain ("isolated")
// runs plain too. NCHW 1x1 is a plain GEMM with no im2col, and going through a blocked layout
// costs two activation reorders. Not in f32 with an activation, though: oneDNN 2.6's f32 gemm
// convolution applies eltwise post-ops slowly (1x1 64->256 @56: 1.0 ms bare, 3.9 ms with relu,
// 11.4 ms with sum+relu, where brgconv on nhwc takes 1.1 ms); its bf16 gemm path does not
// have that problem. Measured on the 2-core AVX-512 (Zen 4, avx512_core_bf16) dev machine,
// oneDNN 2.6, one thread, batch 1, run() medians, blocked (brgconv on nhwc, reorders
// included) / plain (gemm:jit on nchw), interleaved:
//                                             f32         bf16
//   isolated 1x1 64->256 @56                  1.81        1.00
//   isolated 1x1 64->256 @56 + relu           0.44        1.39
//   isolated 1x1 64->256 @56 + residual, relu 0.23        1.80
//   isolated 1x1 512->2048 @7 + residual, relu 0.44       0.75
//   isolated 3x3 64->64 @56                   0.76-0.91   0.52
//   isolated 3x3 128->128 @28                 0.74
//   isolated 3x3 512->512 @7                  0.75-0.86
//   isolated stem 7x7/2 3->64 @224            0.72-0.78
//   1x1 64->256 @56 + relu inside a chain (blocked in and out): 0.35-0.37
//   ResNet-50 bottleneck (1x1, 3x3, 1x1 + residual, relu; x plain in and out): 0.39-0.44, bf16 0.83
// (oneDNN picks nhwc, not nChw16c, for format_tag::any on this CPU.) The machine was shared
// with other jobs during these runs: ratios held across repeats, absolute times varied ~2x.
// Nodes are created in graph order, so a producer's layout is known to its consumers; whether a
// value may be blocked is decided up front from static checks of its consumers. If oneDNN then
// rejects a consumer of a blocked value, the build restarts with that node excluded.
//
// Note [convolution policy]
// OnednnOptions::conv picks, for the whole graph, how convolutions choose layout and algorithm.
// Auto leaves the layout to oneDNN (format_tag::any: brgconv on nhwc on this CPU) with the
// direct algorithm; Blocked pins every convolution output that may be blocked to the ISA's
// native block, nChw16c on AVX-512 and nChw8c on AVX2 (the older jit direct kernels; oneDNN
// 2.6 runs nChw16c on AVX2 only through reference kernels, ~100x slower); Winograd additionally asks for oneDNN's Winograd algorithm on 3x3
// stride-1 f32 convolutions (jit_wino_4x3 / jit_fp32_wino_2x3, which compute only in nChw16c)
// and falls back to direct where it has no implementation. Measured on the dev machine (2
// threads, oneDNN 2.6, primitive medians, bias, no post-ops), direct brgconv vs Winograd:
//   3x3 64->64 @56   1.01 vs 0.55 ms     3x3 128->128 @28  1.00 vs 0.33 ms
//   3x3 256->256 @14 0.95 vs 0.49 ms     3x3 512->512 @7   0.92 vs 0.71 ms
// Winograd rounds differently from the direct sum (transforms of input and weights), so the
// compiler offers it only as a max-autotune candidate that must agree with the direct
// candidate's outputs (see Note [autotuning] in codegen/cpu/inductor.cc). The choice is
// per graph rather than per convolution because the layouts of neighbours interact: a per-layer
// pick would pay reorders between nhwc and nChw16c that isolated timings do not see.
//
// Note [linear choice]
// linear / fused_linear flatten x to [M, K] and run either inner_product (weights [N, K]) or
// matmul (weights K x N); both get prepacked weights (format_tag::any) and both are brgemm
// kernels on AVX-512 (inner_product "brgemm:avx512_core", matmul "brg:avx512_core"), so they
// differ little. Measured (dev machine as above, f32, one thread, run() medians, matmul time /
// inner_product time, interleaved):
//   M=1: 2048->1000 0.89..0.98, 2048->1024 0.90, 2048->2048 0.98, 4096->1000 0.99,
//        512->1000 1.01, 768->768 1.03, 1024->1024 1.03, 1000->2048 1.04, 64->64 1.07
//   M=4 2048->1000 0.97, M=8 256->128 1.00, M=64 2048->1000 0.93..1.0, M=128 768->3072 1.00
// So Auto takes matmul for K >= 2048 and inner_product below; LinearImpl forces either (for
// an autotuner).
#include "targets/cpu/onednn_lowering.h"
#include "targets/cpu/support.h"

#include <algorithm>
#include <cfloat>
#include <cstring>
#include <numeric>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <oneapi/dnnl/dnnl.hpp>

#include "core/error.h"
#include "ops/onednn.h"

namespace kiln::cpu {

int native_conv_block() {
  static const int block = __builtin_cpu_supports("avx512f") ? 16 : 8;
  return block;
}

const char* native_conv_layout() { return native_conv_block() == 16 ? "nChw16c" : "nChw8c"; }

using dnnl::memory;
using DT = memory::data_type;
using Tag = memory::format_tag;

namespace {

dnnl::engine& cpu_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}
// One stream per thread (as the eager kernels have): runs of a graph on several threads at once
// share no stream.
dnnl::stream& cpu_stream() {
  thread_local dnnl::stream s(cpu_engine());
  return s;
}

int64_t align64(int64_t n) { return (n + 63) & ~int64_t(63); }

// ---- memory descriptors ---------------------------------------------------------------------
memory::desc plain_md(const memory::dims& dims, DT dt) {
  memory::dims strides(dims.size(), 1);
  for (size_t i = dims.size(); i-- > 1;) strides[i - 1] = strides[i] * dims[i];
  return memory::desc(dims, dt, strides);
}
memory::desc any_md(const memory::dims& dims, DT dt) { return memory::desc(dims, dt, Tag::any); }

// Plain = contiguous row-major over the dims (strides of size-1 dims do not matter).
bool is_plain(const memory::desc& md) {
  const dnnl_memory_desc_t& d = md.data;
  if (d.format_kind != dnnl_blocked || d.format_desc.blocking.inner_nblks != 0 || d.offset0 != 0)
    return false;
  int64_t expected = 1;
  for (int i = d.ndims - 1; i >= 0; --i) {
    if (d.padded_dims[i] != d.dims[i]) return false;
    if (d.dims[i] != 1 && d.format_desc.blocking.strides[i] != expected) return false;
    expected *= d.dims[i];
  }
  return true;
}

bool same_layout(const memory::desc& a, const memory::desc& b) {
  if (a == b) return true;
  return is_plain(a) && is_plain(b) && a.data.data_type == b.data.data_type &&
         a.dims() == b.dims();
}

// oneDNN-style format name: outer dims by decreasing stride, blocked dims upper-case, then the
// inner blocks ("nChw16c", "OIhw16i16o", "ab"). `letters` names the dims ("nchw", "oihw").
std::string format_name(const memory::desc& md, std::string_view letters) {
  const dnnl_memory_desc_t& d = md.data;
  if (d.format_kind == dnnl_format_kind_any) return "any";
  if (d.format_kind != dnnl_blocked) return "opaque";
  int n = d.ndims;
  std::string names = int(letters.size()) == n ? std::string(letters)
                                                 : std::string("abcdefghijkl").substr(0, size_t(n));
  const auto& blk = d.format_desc.blocking;
  std::vector<int> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return blk.strides[a] > blk.strides[b]; });
  bool inner[DNNL_MAX_NDIMS] = {};
  for (int i = 0; i < blk.inner_nblks; ++i) inner[blk.inner_idxs[i]] = true;
  std::string s;
  for (int i : order) s += inner[i] ? char(names[size_t(i)] - 'a' + 'A') : names[size_t(i)];
  for (int i = 0; i < blk.inner_nblks; ++i)
    s += fmt::format("{}{}", blk.inner_blks[i], names[size_t(blk.inner_idxs[i])]);
  return s;
}

const char* dt_name(DT dt) { return dt == DT::bf16 ? "bf16" : dt == DT::f32 ? "f32" : "?"; }

// ---- attributes -----------------------------------------------------------------------------
bool concrete_ints(const Ints& v) {
  for (int64_t raw : v)
    if (SymInt::from_raw(raw).is_symbolic()) return false;
  return true;
}

struct ConvGeometry {
  int64_t stride[2], pad_begin[2], pad_end[2], dilation[2], groups;
};

// conv2d / fused_conv2d / conv_transpose2d attributes (validated by inference). For the
// transposed conv, output_padding is folded into pad_end (pad_end - output_padding, possibly
// negative), which is how oneDNN's deconvolution extends the bottom/right edge.
std::optional<ConvGeometry> conv_geometry(const Attrs& a, bool transposed) {
  const Ints &s = a.get_ints("stride"), &p = a.get_ints("padding"), &d = a.get_ints("dilation");
  if (!concrete_ints(s) || !concrete_ints(p) || !concrete_ints(d)) return std::nullopt;
  ConvGeometry g;
  g.groups = a.get_int("groups");
  for (size_t i = 0; i < 2; ++i) {
    g.stride[i] = s[i];
    g.dilation[i] = d[i];
    g.pad_begin[i] = p[i];
    g.pad_end[i] = p.size() == 4 ? p[i + 2] : p[i];
  }
  if (transposed) {
    const Ints& op = a.get_ints("output_padding");
    if (!concrete_ints(op)) return std::nullopt;
    for (size_t i = 0; i < 2; ++i) g.pad_end[i] -= op[i];
  }
  return g;
}

enum class Act { None, Relu, Gelu, GeluTanh, Silu, Sigmoid, Tanh, Clamp };

struct Epilogue {
  Act act = Act::None;
  float lo = -FLT_MAX, hi = FLT_MAX;
  float sum_scale = 1.0f;
  bool has_residual = false;
};

Epilogue read_epilogue(const Node& node) {
  Epilogue e;
  bool fused = node.op == OpId::FusedConv2d || node.op == OpId::FusedLinear;
  if (!fused) return e;
  static constexpr std::pair<const char*, Act> kActs[] = {
      {"none", Act::None}, {"relu", Act::Relu},       {"gelu", Act::Gelu},
      {"gelu_tanh", Act::GeluTanh}, {"silu", Act::Silu}, {"sigmoid", Act::Sigmoid},
      {"tanh", Act::Tanh}, {"clamp", Act::Clamp}};
  const std::string& name = node.attrs.get_string("activation");
  bool found = false;
  for (const auto& [n, act] : kActs)
    if (name == n) {
      e.act = act;
      found = true;
    }
  KILN_CHECK(found, "fused node '{}': unknown activation '{}'", node.name, name);
  if (node.attrs.has("clamp_min")) e.lo = float(node.attrs.get_float("clamp_min"));
  if (node.attrs.has("clamp_max")) e.hi = float(node.attrs.get_float("clamp_max"));
  e.sum_scale = float(node.attrs.get_float("sum_scale"));
  e.has_residual = node.inputs.size() > 3 && node.inputs[3] != kNoValue;
  return e;
}

std::string epilogue_str(const Epilogue& e) {
  std::vector<std::string> parts;
  if (e.has_residual) parts.push_back(fmt::format("sum({})", e.sum_scale));
  switch (e.act) {
    case Act::None: break;
    case Act::Relu: parts.push_back("relu"); break;
    case Act::Gelu: parts.push_back("gelu_erf"); break;
    case Act::GeluTanh: parts.push_back("gelu_tanh"); break;
    case Act::Silu: parts.push_back("swish(1)"); break;
    case Act::Sigmoid: parts.push_back("logistic"); break;
    case Act::Tanh: parts.push_back("tanh"); break;
    case Act::Clamp: parts.push_back(fmt::format("clip({},{})", e.lo, e.hi)); break;
  }
  if (parts.empty()) return "";
  std::string s = ", post-ops: ";
  for (size_t i = 0; i < parts.size(); ++i) s += (i ? "," : "") + parts[i];
  return s;
}

dnnl::primitive_attr make_attr(const Epilogue& e) {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  dnnl::post_ops ops;
  if (e.has_residual) ops.append_sum(e.sum_scale);
  using A = dnnl::algorithm;
  switch (e.act) {
    case Act::None: break;
    case Act::Relu: ops.append_eltwise(1.0f, A::eltwise_relu, 0.0f, 0.0f); break;
    case Act::Gelu: ops.append_eltwise(1.0f, A::eltwise_gelu_erf, 0.0f, 0.0f); break;
    case Act::GeluTanh: ops.append_eltwise(1.0f, A::eltwise_gelu_tanh, 0.0f, 0.0f); break;
    case Act::Silu: ops.append_eltwise(1.0f, A::eltwise_swish, 1.0f, 0.0f); break;
    case Act::Sigmoid: ops.append_eltwise(1.0f, A::eltwise_logistic, 0.0f, 0.0f); break;
    case Act::Tanh: ops.append_eltwise(1.0f, A::eltwise_tanh, 0.0f, 0.0f); break;
    case Act::Clamp: ops.append_eltwise(1.0f, A::eltwise_clip, e.lo, e.hi); break;
  }
  attr.set_post_ops(ops);
  return attr;
}

dnnl::primitive_attr user_scratchpad_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// Runs `make` and returns its primitive descriptor, or nullopt when oneDNN has no
// implementation for it (unimplemented / invalid arguments); other failures are errors.
template <typename PD, typename Make>
std::optional<PD> try_pd(Make&& make) {
  try {
    return make();
  } catch (const dnnl::error& err) {
    if (err.status == dnnl_unimplemented || err.status == dnnl_invalid_arguments)
      return std::nullopt;
    fail_kind(ErrorKind::Runtime, "oneDNN: {} (status {})", err.what(), int(err.status));
  }
}

// The ops the CPU target runs as oneDNN primitives (its support table's library column), and
// among them the ones on N,C,H,W activations whose layout may be blocked (trait Spatial).
bool is_supported_op(OpId op) { return cpu_support()[size_t(op)].library; }
bool is_conv_like(OpId op) { return is_supported_op(op) && op_has(op, trait::Spatial); }

ValueId input_or_none(const Node& n, size_t i) {
  return i < n.inputs.size() ? n.inputs[i] : kNoValue;
}

memory::dims dims_of(const TensorType& t) {
  memory::dims d;
  for (const SymInt& s : t.shape) d.push_back(s.value());
  return d;
}

}  // namespace

// ---- the plan of one node -------------------------------------------------------------------
enum class Source : uint8_t { Input, Output, Scratch, Scratchpad };

// A memory object whose data pointer run() sets: an input, the output, or a place in scratch.
struct Binding {
  dnnl_memory_t mem = nullptr;  // owned by NodePlan::memories
  Source source = Source::Input;
  int32_t index = 0;   // Source::Input: the node's input index
  int64_t offset = 0;  // Source::Scratch / Scratchpad: byte offset in scratch
};

struct Step {
  dnnl::primitive prim;
  std::vector<dnnl_exec_arg_t> args;
  bool residual_copy = false;  // skipped when the residual already is the output buffer
};

// Per call state: see OnednnLowering::NodeInstance in the header.
struct OnednnLowering::NodeInstance {
  std::vector<memory> memories;                    // per binding of the node's plan
  std::vector<std::vector<dnnl_exec_arg_t>> args;  // per step, over `memories` for bound ones
};

struct NodePlan {
  bool requested = false;
  bool lowered = false;
  std::string why_not;
  std::vector<memory> memories;  // keeps every memory the steps reference alive
  std::vector<Binding> bindings;
  std::vector<Step> steps;
  std::vector<Tensor> constants;  // activation inputs that are params/consts: bound once
  int64_t scratch_bytes = 0;
  int32_t residual_input = -1;  // input index of the residual (sum post-op), -1 if none
  // When run() gets the residual's buffer as the output buffer (Note [oneDNN lowering]):
  //   SkipCopy: dst is the output and has the residual's layout: the residual is already there;
  //   Safe: dst is a scratch temporary, the output is written last: the copy runs as usual;
  //   Unsafe: the output's layout differs from the residual's: an error.
  enum class Alias : uint8_t { SkipCopy, Safe, Unsafe } residual_alias = Alias::Unsafe;
  std::string description;
  // The instance run(node, inputs, output, scratch) uses: the plan's own memory objects.
  std::shared_ptr<OnednnLowering::NodeInstance> own;
};

namespace {

// Builds a NodePlan: memories, bindings, steps and the scratch layout.
class PlanBuilder {
 public:
  explicit PlanBuilder(NodePlan& plan) : plan_(plan) {}

  memory input(int32_t index, const memory::desc& md) { return bind(md, Source::Input, index, 0); }
  memory output(const memory::desc& md) { return bind(md, Source::Output, 0, 0); }
  memory temp(const memory::desc& md) {
    int64_t off = temp_bytes_;
    temp_bytes_ += align64(int64_t(md.get_size()));
    return bind(md, Source::Scratch, 0, off);
  }
  // A memory over data that outlives the plan (a constant input kept in plan.constants).
  memory fixed(const memory::desc& md, void* data) {
    memory m(md, cpu_engine(), data);
    plan_.memories.push_back(m);
    return m;
  }
  // A memory with its own buffer (prepacked weights, bias).
  memory owned(const memory::desc& md) {
    memory m(md, cpu_engine());
    plan_.memories.push_back(m);
    return m;
  }

  void step(dnnl::primitive prim, const memory::desc& scratchpad,
            std::initializer_list<std::pair<int, memory>> args, bool residual_copy = false) {
    Step s;
    s.prim = std::move(prim);
    s.residual_copy = residual_copy;
    for (const auto& [arg, m] : args) s.args.push_back({arg, m.get()});
    if (scratchpad.get_size() > 0) {
      memory m = bind(scratchpad, Source::Scratchpad, 0, 0);
      s.args.push_back({DNNL_ARG_SCRATCHPAD, m.get()});
      pad_bytes_ = std::max(pad_bytes_, int64_t(scratchpad.get_size()));
    }
    plan_.steps.push_back(std::move(s));
  }

  void reorder(const memory& from, const memory& to, bool residual_copy = false) {
    dnnl::reorder::primitive_desc pd(cpu_engine(), from.get_desc(), cpu_engine(), to.get_desc(),
                                     user_scratchpad_attr());
    step(dnnl::reorder(pd), pd.scratchpad_desc(), {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}},
         residual_copy);
  }

  void finish() {
    for (Binding& b : plan_.bindings)
      if (b.source == Source::Scratchpad) {
        b.source = Source::Scratch;
        b.offset = temp_bytes_;
      }
    plan_.scratch_bytes = temp_bytes_ + align64(pad_bytes_);
  }

 private:
  memory bind(const memory::desc& md, Source source, int32_t index, int64_t offset) {
    memory m(md, cpu_engine(), DNNL_MEMORY_NONE);
    plan_.memories.push_back(m);
    plan_.bindings.push_back({m.get(), source, index, offset});
    return m;
  }

  NodePlan& plan_;
  int64_t temp_bytes_ = 0;
  int64_t pad_bytes_ = 0;
};

// Reorders `data` (described by user_md) into a new owned memory of layout `md`, once.
memory prepack(PlanBuilder& b, const memory::desc& user_md, const Tensor& data,
               const memory::desc& md) {
  Tensor c = data.contiguous();
  memory user(user_md, cpu_engine(), c.raw_data());
  memory packed = b.owned(md);
  dnnl::reorder(user, packed).execute(cpu_stream(), user, packed);
  cpu_stream().wait();
  return packed;
}

// The bias data converted into an owned memory of `md` (f32, or the node's dtype).
memory bias_memory(PlanBuilder& b, const Tensor& data, const memory::desc& md) {
  DType want = md.data.data_type == dnnl_f32 ? DType::Float32 : DType::BFloat16;
  Tensor c = data.to(want).contiguous();
  memory m = b.owned(md);
  std::memcpy(m.get_data_handle(), c.raw_data(), size_t(c.nbytes()));
  return m;
}

}  // namespace

// ---- the lowering -----------------------------------------------------------------------------
struct OnednnLowering::Impl {
  const Graph& g;  // read during construction only
  OnednnOptions options;
  std::vector<NodePlan> plans;            // by node index
  std::vector<memory::desc> layout;       // by value: the blocked layout (blocked values only)
  std::vector<bool> is_blocked;           // by value
  std::vector<bool> may_block;            // by value: Note [layout choice]
  int64_t scratch_bytes = 0;

  Impl(const Graph& graph, const OnednnOptions& o) : g(graph), options(o) {}

  std::string static_check(int32_t n) const;
  void decide_blockable(const std::vector<bool>& eligible);
  void build(int32_t n, NodePlan& p);
  void build_conv(int32_t n, NodePlan& p);
  void build_pool(int32_t n, NodePlan& p);
  void build_linear(int32_t n, NodePlan& p);
  void build_matmul(int32_t n, NodePlan& p);

  DT dt_of(ValueId v) const { return g.type(v).dtype == DType::BFloat16 ? DT::bf16 : DT::f32; }
  // The layout a value is stored in.
  memory::desc value_md(ValueId v, const memory::dims& dims) const {
    return is_blocked[size_t(v)] ? layout[size_t(v)] : plain_md(dims, dt_of(v));
  }
  bool is_constant(ValueId v) const {
    ValueKind k = g.value(v).kind;
    return k == ValueKind::Param || k == ValueKind::Const;
  }
  // Memory for activation input `index` (value v) in layout md: bound to inputs[index] at run
  // time, or fixed to the data of a param/const.
  memory activation(PlanBuilder& b, NodePlan& p, int32_t index, ValueId v,
                    const memory::desc& md) const {
    if (!is_constant(v)) return b.input(index, md);
    p.constants.push_back(g.value(v).data.contiguous());
    return b.fixed(md, p.constants.back().raw_data());
  }
  // Binds the node's output: directly when the primitive's dst layout is the value's layout,
  // else through a scratch temporary and a reorder after the primitive. Records the layout of a
  // blockable value. Returns the memory the primitive writes.
  memory bind_dst(PlanBuilder& b, ValueId y, const memory::desc& prim_dst, memory* user_out) {
    if (may_block[size_t(y)] && !is_plain(prim_dst)) {
      is_blocked[size_t(y)] = true;
      layout[size_t(y)] = prim_dst;
    }
    memory::dims dims = prim_dst.dims();
    memory::desc want = value_md(y, dims);
    if (same_layout(want, prim_dst)) {
      *user_out = memory();
      return b.output(prim_dst);
    }
    *user_out = b.output(want);
    return b.temp(prim_dst);
  }
};

// Static eligibility: everything oneDNN needs that can be checked without it. "" = eligible.
std::string OnednnLowering::Impl::static_check(int32_t n) const {
  const Node& node = g.nodes[size_t(n)];
  ValueId y = node.outputs[0];
  DType dt = g.type(y).dtype;
  if (dt != DType::Float32 && dt != DType::BFloat16)
    return fmt::format("dtype {} (oneDNN lowering takes float32 and bfloat16)", dtype_name(dt));
  if (!onednn::supports_dtype(dt))
    return fmt::format("this CPU ({}) has no oneDNN {} support", onednn::cpu_isa_name(),
                       dtype_name(dt));
  std::vector<ValueId> values = node.inputs;
  values.push_back(y);
  for (size_t i = 0; i < values.size(); ++i) {
    ValueId v = values[i];
    if (v == kNoValue) continue;
    const TensorType& t = g.type(v);
    const char* what = i + 1 == values.size() ? "output" : "input";
    if (t.dtype != dt)
      return fmt::format("{} '{}' has dtype {}, the output {}", what, g.value(v).name,
                         dtype_name(t.dtype), dtype_name(dt));
    for (const SymInt& s : t.shape)
      if (s.is_symbolic())
        return fmt::format("{} '{}' has a symbolic shape {}", what, g.value(v).name,
                           to_string(t.shape));
    for (const SymInt& s : t.shape)
      if (s.value() == 0) return fmt::format("{} '{}' is empty", what, g.value(v).name);
    if (!t.is_contiguous())
      return fmt::format("{} '{}' has a strided type", what, g.value(v).name);
    if (is_constant(v) && !g.value(v).data.defined())
      return fmt::format("{} '{}' is a param without data", what, g.value(v).name);
  }
  // Weights and bias must be constant: they are prepacked here.
  if (node.op != OpId::Matmul) {
    for (size_t i : {size_t(1), size_t(2)}) {
      ValueId v = input_or_none(node, i);
      if (v != kNoValue && !is_constant(v))
        return fmt::format("input {} ('{}', the {}) is not a param or const", i,
                           g.value(v).name, i == 1 ? "weight" : "bias");
    }
  }
  switch (node.op) {
    case OpId::Conv2d:
    case OpId::FusedConv2d:
    case OpId::ConvTranspose2d:
      if (!conv_geometry(node.attrs, node.op == OpId::ConvTranspose2d))
        return "symbolic convolution attributes";
      return "";
    case OpId::MaxPool2d:
    case OpId::AvgPool2d: {
      for (const char* a : {"kernel_size", "stride", "padding"})
        if (!concrete_ints(node.attrs.get_ints(a))) return "symbolic pooling attributes";
      return "";
    }
    default: return "";
  }
}

void OnednnLowering::Impl::decide_blockable(const std::vector<bool>& eligible) {
  size_t nv = g.values.size();
  may_block.assign(nv, false);
  if (!options.allow_blocked) return;
  std::vector<bool> ok(nv, false), used(nv, false);
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const Node& node = g.nodes[n];
    if (eligible[n] && is_conv_like(node.op)) ok[size_t(node.outputs[0])] = true;
  }
  for (ValueId v : g.outputs) ok[size_t(v)] = false;
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const Node& node = g.nodes[n];
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      ValueId v = node.inputs[i];
      if (v == kNoValue) continue;
      used[size_t(v)] = true;
      bool blocked_use = eligible[n] && is_conv_like(node.op) &&
                         (i == 0 || (node.op == OpId::FusedConv2d && i == 3));
      if (!blocked_use) ok[size_t(v)] = false;
    }
  }
  for (size_t v = 0; v < nv; ++v) may_block[v] = ok[v] && used[v];
}

void OnednnLowering::Impl::build(int32_t n, NodePlan& p) {
  switch (g.nodes[size_t(n)].op) {
    case OpId::Conv2d:
    case OpId::FusedConv2d:
    case OpId::ConvTranspose2d: build_conv(n, p); break;
    case OpId::MaxPool2d:
    case OpId::AvgPool2d: build_pool(n, p); break;
    case OpId::Linear:
    case OpId::FusedLinear: build_linear(n, p); break;
    case OpId::Matmul: build_matmul(n, p); break;
    default: KILN_ASSERT(false);
  }
}

// ---- convolution / deconvolution ------------------------------------------------------------
void OnednnLowering::Impl::build_conv(int32_t n, NodePlan& p) {
  const Node& node = g.nodes[size_t(n)];
  bool transposed = node.op == OpId::ConvTranspose2d;
  ConvGeometry geo = *conv_geometry(node.attrs, transposed);
  Epilogue epi = read_epilogue(node);
  ValueId x = node.inputs[0], w = node.inputs[1], bias = input_or_none(node, 2);
  ValueId residual = epi.has_residual ? node.inputs[3] : kNoValue;
  ValueId y = node.outputs[0];
  DT dt = dt_of(y);
  memory::dims xd = dims_of(g.type(x)), yd = dims_of(g.type(y)), wt = dims_of(g.type(w));
  int64_t gr = geo.groups;

  // Weights in oneDNN's order (O first), as a view of the PyTorch tensor:
  // conv [O, C/g, kh, kw]; deconv [C, O/g, kh, kw] -> {O, C, ...} or {g, O/g, C/g, ...}.
  memory::dims wd, ws;
  int64_t s0 = wt[1] * wt[2] * wt[3], s1 = wt[2] * wt[3], s2 = wt[3];
  if (!transposed) {
    if (gr == 1) {
      wd = {wt[0], wt[1], wt[2], wt[3]};
      ws = {s0, s1, s2, 1};
    } else {
      wd = {gr, wt[0] / gr, wt[1], wt[2], wt[3]};
      ws = {s0 * (wt[0] / gr), s0, s1, s2, 1};
    }
  } else {
    if (gr == 1) {
      wd = {wt[1], wt[0], wt[2], wt[3]};
      ws = {s1, s0, s2, 1};
    } else {
      wd = {gr, wt[1], wt[0] / gr, wt[2], wt[3]};
      ws = {s0 * (wt[0] / gr), s1, s0, s2, 1};
    }
  }
  memory::desc w_user(wd, dt, ws);

  memory::desc x_md = value_md(x, xd);
  bool blocked_src = is_blocked[size_t(x)];
  // An isolated pointwise conv (plain in, plain out) runs plain, unless it is f32 with an
  // activation: see Note [layout choice].
  bool pointwise = !transposed && gr == 1 && wt[2] == 1 && wt[3] == 1 &&
                   (epi.act == Act::None || dt == DT::bf16);
  bool isolated = !blocked_src && !may_block[size_t(y)] &&
                  (residual == kNoValue || !is_blocked[size_t(residual)]);
  bool any_layout = options.allow_blocked && !(pointwise && isolated);
  memory::desc want_src = blocked_src ? x_md : any_layout ? any_md(xd, dt) : plain_md(xd, dt);
  memory::desc want_dst = any_layout ? any_md(yd, dt) : plain_md(yd, dt);
  // Note [convolution policy]: Blocked / Winograd pin the output to the native block (the src
  // of a plain input stays `any`: the first convolution of a network reads nchw directly).
  if (any_layout && options.conv != ConvPolicy::Auto && yd.size() == 4)
    want_dst = memory::desc(yd, dt, native_conv_block() == 16 ? Tag::nChw16c : Tag::nChw8c);
  bool try_winograd = options.conv == ConvPolicy::Winograd && !transposed && gr == 1 &&
                      dt == DT::f32 && wt[2] == 3 && wt[3] == 3 && geo.stride[0] == 1 &&
                      geo.stride[1] == 1 && geo.dilation[0] == 1 && geo.dilation[1] == 1;
  memory::desc want_w = any_md(wd, dt);
  dnnl::primitive_attr attr = make_attr(epi);
  memory::dims strides = {geo.stride[0], geo.stride[1]};
  memory::dims dil = {geo.dilation[0] - 1, geo.dilation[1] - 1};  // oneDNN: 0 = dense
  memory::dims pl = {geo.pad_begin[0], geo.pad_begin[1]}, pr = {geo.pad_end[0], geo.pad_end[1]};

  dnnl::algorithm conv_alg = dnnl::algorithm::convolution_direct;
  auto make = [&](const memory::desc& src, const memory::desc& b) -> dnnl::primitive_desc {
    if (!transposed) {
      dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference, conv_alg, src,
                                        want_w, b, want_dst, strides, dil, pl, pr);
      return dnnl::convolution_forward::primitive_desc(d, attr, cpu_engine());
    }
    dnnl::deconvolution_forward::desc d(dnnl::prop_kind::forward_inference,
                                        dnnl::algorithm::deconvolution_direct, src, want_w, b,
                                        want_dst, strides, dil, pl, pr);
    return dnnl::deconvolution_forward::primitive_desc(d, attr, cpu_engine());
  };
  // Bias in f32 where oneDNN takes it (exact for bf16 weights), else in the conv's dtype.
  memory::dims bd = {yd[1]};
  std::vector<memory::desc> bias_choices;
  if (bias == kNoValue)
    bias_choices = {memory::desc()};
  else
    bias_choices = {memory::desc(bd, DT::f32, Tag::x), memory::desc(bd, dt, Tag::x)};
  std::vector<memory::desc> src_choices = {want_src};
  if (blocked_src) src_choices.push_back(any_md(xd, dt));  // then reorder from x's layout
  std::optional<dnnl::primitive_desc> pd;
  memory::desc bias_md;
  std::vector<dnnl::algorithm> algs = {dnnl::algorithm::convolution_direct};
  if (try_winograd) algs.insert(algs.begin(), dnnl::algorithm::convolution_winograd);
  for (dnnl::algorithm a : algs) {
    conv_alg = a;
    for (const memory::desc& src : src_choices) {
      for (const memory::desc& b : bias_choices) {
        pd = try_pd<dnnl::primitive_desc>([&] { return make(src, b); });
        if (pd) {
          bias_md = b;
          break;
        }
      }
      if (pd) break;
    }
    if (pd) break;
  }
  if (!pd) {
    p.why_not = fmt::format("oneDNN has no {} implementation for this case ({})",
                            transposed ? "deconvolution" : "convolution", dt_name(dt));
    return;
  }

  PlanBuilder b(p);
  memory::desc src_md = pd->query_md(dnnl::query::exec_arg_md, DNNL_ARG_SRC);
  memory::desc dst_md = pd->query_md(dnnl::query::exec_arg_md, DNNL_ARG_DST);
  memory::desc w_md = pd->query_md(dnnl::query::exec_arg_md, DNNL_ARG_WEIGHTS);
  std::string reorders;

  // src: x as stored, reordered into a temporary when the primitive wants another layout.
  memory x_mem = activation(b, p, 0, x, x_md);
  memory src_mem = x_mem;
  if (!same_layout(x_md, src_md)) {
    src_mem = b.temp(src_md);
    b.reorder(x_mem, src_mem);
    reorders += fmt::format(" src {}->{}", format_name(x_md, "nchw"), format_name(src_md, "nchw"));
  }
  memory user_out;
  memory dst_mem = bind_dst(b, y, dst_md, &user_out);
  if (residual != kNoValue) {
    memory::desc r_md = value_md(residual, yd);
    memory r_mem = activation(b, p, 3, residual, r_md);
    p.residual_input = 3;
    if (is_constant(residual))
      p.residual_alias = NodePlan::Alias::Unsafe;
    else if (user_out)
      p.residual_alias = same_layout(r_md, user_out.get_desc()) ? NodePlan::Alias::Safe
                                                                : NodePlan::Alias::Unsafe;
    else
      p.residual_alias = same_layout(r_md, dst_md) ? NodePlan::Alias::SkipCopy
                                                   : NodePlan::Alias::Unsafe;
    b.reorder(r_mem, dst_mem, /*residual_copy=*/true);
  }
  memory w_mem = prepack(b, w_user, g.value(w).data, w_md);
  dnnl::primitive prim(*pd);
  memory::desc pad = pd->scratchpad_desc();
  if (bias != kNoValue) {
    memory b_mem = bias_memory(b, g.value(bias).data, bias_md);
    b.step(prim, pad, {{DNNL_ARG_SRC, src_mem}, {DNNL_ARG_WEIGHTS, w_mem},
                       {DNNL_ARG_BIAS, b_mem}, {DNNL_ARG_DST, dst_mem}});
  } else {
    b.step(prim, pad, {{DNNL_ARG_SRC, src_mem}, {DNNL_ARG_WEIGHTS, w_mem},
                       {DNNL_ARG_DST, dst_mem}});
  }
  if (user_out) {
    b.reorder(dst_mem, user_out);
    reorders += fmt::format(" dst {}->{}", format_name(dst_md, "nchw"),
                            format_name(user_out.get_desc(), "nchw"));
  }
  b.finish();

  std::string geo_str = fmt::format("{}x{}", wt[2], wt[3]);
  if (geo.stride[0] != 1 || geo.stride[1] != 1)
    geo_str += geo.stride[0] == geo.stride[1] ? fmt::format("/{}", geo.stride[0])
                                              : fmt::format("/{}x{}", geo.stride[0], geo.stride[1]);
  if (gr > 1) geo_str += fmt::format(" g{}", gr);
  if (geo.dilation[0] != 1 || geo.dilation[1] != 1)
    geo_str += fmt::format(" d{}x{}", geo.dilation[0], geo.dilation[1]);
  p.description = fmt::format(
      "{} {} {}->{} {} {} src {} -> dst {}, weights {}{}{}", op_def(node.op).name, geo_str,
      xd[1], yd[1], dt_name(dt), pd->impl_info_str(), format_name(src_md, "nchw"),
      format_name(dst_md, "nchw"), format_name(w_md, gr == 1 ? "oihw" : "goihw"),
      epilogue_str(epi), reorders.empty() ? "" : "; reorders:" + reorders);
  p.lowered = true;
}

// ---- pooling ----------------------------------------------------------------------------------
void OnednnLowering::Impl::build_pool(int32_t n, NodePlan& p) {
  const Node& node = g.nodes[size_t(n)];
  bool is_max = node.op == OpId::MaxPool2d;
  ValueId x = node.inputs[0], y = node.outputs[0];
  DT dt = dt_of(y);
  memory::dims xd = dims_of(g.type(x)), yd = dims_of(g.type(y));
  const Ints& k = node.attrs.get_ints("kernel_size");
  const Ints& s_raw = node.attrs.get_ints("stride");
  const Ints& s = s_raw.empty() ? k : s_raw;
  const Ints& pad = node.attrs.get_ints("padding");
  Ints d = is_max ? node.attrs.get_ints("dilation") : Ints{1, 1};
  bool include_pad = !is_max && node.attrs.get_bool("count_include_pad");
  // PyTorch's ceil_mode windows hang past the declared padding; oneDNN takes an explicit
  // bottom/right padding that makes it produce the output size inference gave.
  int64_t pad_end[2];
  bool extra_end_pad = false;
  for (size_t i = 0; i < 2; ++i) {
    int64_t extent = d[i] * (k[i] - 1) + 1, in = xd[2 + i], out = yd[2 + i];
    pad_end[i] = (out - 1) * s[i] + extent - in - pad[i];
    if (pad_end[i] < pad[i]) pad_end[i] = pad[i];
    extra_end_pad |= pad_end[i] > pad[i];
  }
  dnnl::algorithm alg = dnnl::algorithm::pooling_max;
  if (!is_max) {
    if (!include_pad || (pad[0] == 0 && pad[1] == 0)) {
      // Without declared padding, PyTorch's include-pad divisor counts only input elements.
      alg = include_pad && !extra_end_pad ? dnnl::algorithm::pooling_avg_include_padding
                                          : dnnl::algorithm::pooling_avg_exclude_padding;
    } else if (!extra_end_pad) {
      alg = dnnl::algorithm::pooling_avg_include_padding;
    } else {
      // oneDNN divides by the whole kernel; PyTorch clips ceil_mode windows at the padding.
      p.why_not = "avg_pool2d with count_include_pad, padding and a ceil_mode window past the "
                  "padding: oneDNN's divisor differs from PyTorch's";
      return;
    }
  }
  memory::desc x_md = value_md(x, xd);
  memory::desc want_dst = options.allow_blocked ? any_md(yd, dt) : plain_md(yd, dt);
  auto pd = try_pd<dnnl::pooling_v2_forward::primitive_desc>([&] {
    dnnl::pooling_v2_forward::desc desc(
        dnnl::prop_kind::forward_inference, alg, x_md, want_dst, {s[0], s[1]}, {k[0], k[1]},
        {d[0] - 1, d[1] - 1}, {pad[0], pad[1]}, {pad_end[0], pad_end[1]});
    return dnnl::pooling_v2_forward::primitive_desc(desc, user_scratchpad_attr(), cpu_engine());
  });
  if (!pd) {
    p.why_not = fmt::format("oneDNN has no pooling implementation for this case ({})", dt_name(dt));
    return;
  }
  PlanBuilder b(p);
  memory::desc dst_md = pd->dst_desc();
  memory x_mem = activation(b, p, 0, x, x_md);
  memory user_out;
  memory dst_mem = bind_dst(b, y, dst_md, &user_out);
  b.step(dnnl::pooling_v2_forward(*pd), pd->scratchpad_desc(),
         {{DNNL_ARG_SRC, x_mem}, {DNNL_ARG_DST, dst_mem}});
  std::string reorders;
  if (user_out) {
    b.reorder(dst_mem, user_out);
    reorders = fmt::format("; reorders: dst {}->{}", format_name(dst_md, "nchw"),
                           format_name(user_out.get_desc(), "nchw"));
  }
  b.finish();
  const char* alg_name = is_max ? "max"
                         : alg == dnnl::algorithm::pooling_avg_include_padding ? "avg_include_pad"
                                                                               : "avg_exclude_pad";
  p.description = fmt::format("{} {}x{}/{}x{} {} {} {} src {} -> dst {}{}", op_def(node.op).name,
                              k[0], k[1], s[0], s[1], alg_name, dt_name(dt), pd->impl_info_str(),
                              format_name(x_md, "nchw"), format_name(dst_md, "nchw"), reorders);
  p.lowered = true;
}

// ---- linear -----------------------------------------------------------------------------------
namespace {
// Note [linear choice].
bool use_matmul_for_linear(LinearImpl pref, int64_t k) {
  if (pref != LinearImpl::Auto) return pref == LinearImpl::Matmul;
  return k >= 2048;
}
}  // namespace

void OnednnLowering::Impl::build_linear(int32_t n, NodePlan& p) {
  const Node& node = g.nodes[size_t(n)];
  Epilogue epi = read_epilogue(node);
  ValueId x = node.inputs[0], w = node.inputs[1], bias = input_or_none(node, 2);
  ValueId residual = epi.has_residual ? node.inputs[3] : kNoValue;
  ValueId y = node.outputs[0];
  DT dt = dt_of(y);
  memory::dims wt = dims_of(g.type(w));  // [N, K]
  int64_t nn = wt[0], kk = wt[1];
  int64_t mm = 1;
  const Shape& xs = g.type(x).shape;
  for (size_t i = 0; i + 1 < xs.size(); ++i) mm *= xs[i].value();
  bool matmul = use_matmul_for_linear(options.linear, kk);
  dnnl::primitive_attr attr = make_attr(epi);
  memory::desc src = plain_md({mm, kk}, dt), dst = plain_md({mm, nn}, dt);
  memory::desc w_user = matmul ? memory::desc({kk, nn}, dt, memory::dims{1, kk})
                               : plain_md({nn, kk}, dt);
  memory::desc want_w = any_md(w_user.dims(), dt);
  std::vector<memory::desc> bias_choices;
  memory::dims bd = matmul ? memory::dims{1, nn} : memory::dims{nn};
  if (bias == kNoValue)
    bias_choices = {memory::desc()};
  else
    bias_choices = {plain_md(bd, DT::f32), plain_md(bd, dt)};
  std::optional<dnnl::primitive_desc> pd;
  memory::desc bias_md;
  for (const memory::desc& bmd : bias_choices) {
    pd = try_pd<dnnl::primitive_desc>([&]() -> dnnl::primitive_desc {
      if (matmul) {
        dnnl::matmul::desc d(src, want_w, bmd, dst);
        return dnnl::matmul::primitive_desc(d, attr, cpu_engine());
      }
      dnnl::inner_product_forward::desc d(dnnl::prop_kind::forward_inference, src, want_w, bmd,
                                          dst);
      return dnnl::inner_product_forward::primitive_desc(d, attr, cpu_engine());
    });
    if (pd) {
      bias_md = bmd;
      break;
    }
  }
  if (!pd) {
    p.why_not = fmt::format("oneDNN has no {} implementation for this case ({})",
                            matmul ? "matmul" : "inner_product", dt_name(dt));
    return;
  }
  PlanBuilder b(p);
  memory::desc w_md = pd->query_md(dnnl::query::exec_arg_md, DNNL_ARG_WEIGHTS);
  // Plain src/dst were given, so the primitive uses them as they are.
  memory x_mem = activation(b, p, 0, x, src);
  memory y_mem = b.output(dst);
  if (residual != kNoValue) {
    memory r_mem = activation(b, p, 3, residual, dst);
    p.residual_input = 3;
    p.residual_alias =
        is_constant(residual) ? NodePlan::Alias::Unsafe : NodePlan::Alias::SkipCopy;
    b.reorder(r_mem, y_mem, /*residual_copy=*/true);
  }
  memory w_mem = prepack(b, w_user, g.value(w).data, w_md);
  dnnl::primitive prim(*pd);
  if (bias != kNoValue) {
    memory b_mem = bias_memory(b, g.value(bias).data, bias_md);
    b.step(prim, pd->scratchpad_desc(), {{DNNL_ARG_SRC, x_mem}, {DNNL_ARG_WEIGHTS, w_mem},
                                         {DNNL_ARG_BIAS, b_mem}, {DNNL_ARG_DST, y_mem}});
  } else {
    b.step(prim, pd->scratchpad_desc(),
           {{DNNL_ARG_SRC, x_mem}, {DNNL_ARG_WEIGHTS, w_mem}, {DNNL_ARG_DST, y_mem}});
  }
  b.finish();
  p.description = fmt::format("{} {} {}x{}->{} {} {} weights {}{}", op_def(node.op).name,
                              matmul ? "matmul" : "inner_product", mm, kk, nn, dt_name(dt),
                              pd->impl_info_str(), format_name(w_md, ""), epilogue_str(epi));
  p.lowered = true;
}

// ---- matmul -----------------------------------------------------------------------------------
void OnednnLowering::Impl::build_matmul(int32_t n, NodePlan& p) {
  const Node& node = g.nodes[size_t(n)];
  ValueId a = node.inputs[0], bv = node.inputs[1], y = node.outputs[0];
  DT dt = dt_of(y);
  // NumPy semantics as oneDNN dims: 1-D a -> [1, K], 1-D b -> [K, 1]; ranks padded with 1s.
  memory::dims ad = dims_of(g.type(a)), bd = dims_of(g.type(bv));
  if (ad.size() == 1) ad.insert(ad.begin(), 1);
  if (bd.size() == 1) bd.push_back(1);
  size_t r = std::max(ad.size(), bd.size());
  while (ad.size() < r) ad.insert(ad.begin(), 1);
  while (bd.size() < r) bd.insert(bd.begin(), 1);
  memory::dims yd(r);
  for (size_t i = 0; i + 2 < r; ++i) yd[i] = std::max(ad[i], bd[i]);
  yd[r - 2] = ad[r - 2];
  yd[r - 1] = bd[r - 1];
  if (r > size_t(DNNL_MAX_NDIMS)) {
    p.why_not = fmt::format("rank {} exceeds oneDNN's {}", r, DNNL_MAX_NDIMS);
    return;
  }
  memory::desc a_md = plain_md(ad, dt), b_md = plain_md(bd, dt), y_md = plain_md(yd, dt);
  // Note [strided matmul operands]: a view operand (K^T in attention, heads permuted out of
  // [B, S, H, D]) is described to oneDNN with its own strides instead of being copied first.
  // Ranks padded with leading 1s get a stride that spans the whole view. Where oneDNN has no
  // fast kernel for those strides (none, or only its reference kernel), the operand is
  // reordered into a plain temporary inside run() instead: the copy still happens, in oneDNN.
  // The strides must be the schedule's geometry of the view (codegen/cpu/inductor.cc resolves
  // them against the views the memory planner materializes): run() gets the schedule's pointer.
  memory::desc user_md[2] = {a_md, b_md};
  bool strided[2] = {false, false};
  for (const StridedOperand& so : options.matmul_strides) {
    if (so.node != n || so.input < 0 || so.input > 1 || is_constant(so.input == 0 ? a : bv)) continue;
    const memory::dims& d = so.input == 0 ? ad : bd;
    memory::dims st(so.strides.begin(), so.strides.end());
    int64_t span = 1;
    for (size_t i = 0; i < st.size(); ++i) span = std::max(span, st[i] * d[d.size() - st.size() + i]);
    while (st.size() < d.size()) st.insert(st.begin(), span);
    if (st.size() != d.size()) continue;
    user_md[so.input] = memory::desc(d, dt, st);
    strided[so.input] = true;
  }
  bool b_const = is_constant(bv);
  if (strided[0] || strided[1]) {
    auto spd = try_pd<dnnl::matmul::primitive_desc>([&] {
      dnnl::matmul::desc d(user_md[0], user_md[1], y_md);
      return dnnl::matmul::primitive_desc(d, user_scratchpad_attr(), cpu_engine());
    });
    if (spd && std::string(spd->impl_info_str()).find("ref") == std::string::npos) {  // not slow
      a_md = user_md[0];
      b_md = user_md[1];
    }
  }
  // A constant b is prepacked like linear's weights; an activation b stays plain.
  memory::desc want_b = b_const ? any_md(bd, dt) : b_md;
  auto pd = try_pd<dnnl::matmul::primitive_desc>([&] {
    dnnl::matmul::desc d(a_md, want_b, y_md);
    return dnnl::matmul::primitive_desc(d, user_scratchpad_attr(), cpu_engine());
  });
  if (!pd && b_const) {
    want_b = b_md;
    pd = try_pd<dnnl::matmul::primitive_desc>([&] {
      dnnl::matmul::desc d(a_md, want_b, y_md);
      return dnnl::matmul::primitive_desc(d, user_scratchpad_attr(), cpu_engine());
    });
  }
  if (!pd) {
    p.why_not = fmt::format("oneDNN has no matmul implementation for this case ({})", dt_name(dt));
    return;
  }
  PlanBuilder b(p);
  std::string strides_note;
  // Operand i as stored (user_md[i]); a strided one the primitive does not read in place goes
  // through a reorder into a plain temporary (`want`).
  auto operand = [&](int i, memory stored, const memory::desc& want) {
    if (!strided[i]) return stored;
    bool in_place = same_layout(user_md[i], want);
    strides_note += fmt::format(", {} {}", i == 0 ? "a" : "b", in_place ? "strided" : "reordered");
    if (in_place) return stored;
    memory t = b.temp(want);
    b.reorder(stored, t);
    return t;
  };
  memory a_mem = operand(0, activation(b, p, 0, a, user_md[0]), a_md);
  memory b_mem = b_const ? prepack(b, b_md, g.value(bv).data, pd->weights_desc())
                         : operand(1, b.input(1, user_md[1]), b_md);
  memory y_mem = b.output(y_md);
  b.step(dnnl::matmul(*pd), pd->scratchpad_desc(),
         {{DNNL_ARG_SRC, a_mem}, {DNNL_ARG_WEIGHTS, b_mem}, {DNNL_ARG_DST, y_mem}});
  b.finish();
  auto dims_str = [](const memory::dims& d) { return fmt::format("[{}]", fmt::join(d, ",")); };
  p.description = fmt::format("matmul {}x{}->{} {} {}{}{}", dims_str(ad), dims_str(bd),
                              dims_str(yd), dt_name(dt), pd->impl_info_str(),
                              b_const ? " weights " + format_name(pd->weights_desc(), "") : "",
                              strides_note);
  p.lowered = true;
}

// ---- public API -------------------------------------------------------------------------------
OnednnLowering::OnednnLowering(const Graph& g, const std::vector<int32_t>& extern_nodes,
                               const OnednnOptions& options)
    : impl_(std::make_unique<Impl>(g, options)) {
  Impl& im = *impl_;
  size_t num_nodes = g.nodes.size();
  std::vector<bool> requested(num_nodes, false);
  for (int32_t n : extern_nodes) {
    KILN_CHECK(n >= 0 && size_t(n) < num_nodes,
               "oneDNN lowering: node index {} is out of range (the graph has {} nodes)", n,
               num_nodes);
    const Node& node = g.nodes[size_t(n)];
    KILN_CHECK(is_supported_op(node.op),
               "oneDNN lowering: node {} ('{}') is {}; expected conv2d, fused_conv2d, "
               "conv_transpose2d, linear, fused_linear, matmul, max_pool2d or avg_pool2d",
               n, node.name, op_def(node.op).name);
    requested[size_t(n)] = true;
  }
  std::vector<std::string> static_reason(num_nodes);
  std::vector<bool> eligible(num_nodes, false);
  for (size_t n = 0; n < num_nodes; ++n)
    if (requested[n]) {
      static_reason[n] = im.static_check(int32_t(n));
      eligible[n] = static_reason[n].empty();
    }

  // Build in graph order; restart without a node oneDNN rejects while it consumes a blocked
  // value (Note [layout choice]). Each restart excludes one more node, so this ends.
  for (;;) {
    im.decide_blockable(eligible);
    im.plans.assign(num_nodes, NodePlan());
    im.layout.assign(g.values.size(), memory::desc());
    im.is_blocked.assign(g.values.size(), false);
    int32_t restart_without = -1;
    for (size_t n = 0; n < num_nodes && restart_without < 0; ++n) {
      NodePlan& p = im.plans[n];
      p.requested = requested[n];
      if (!requested[n]) continue;
      if (!eligible[n]) {
        p.why_not = static_reason[n];
        continue;
      }
      im.build(int32_t(n), p);
      if (p.lowered) continue;
      for (ValueId v : g.nodes[n].inputs)
        if (v != kNoValue && im.is_blocked[size_t(v)]) restart_without = int32_t(n);
    }
    if (restart_without < 0) break;
    eligible[size_t(restart_without)] = false;
    static_reason[size_t(restart_without)] =
        "oneDNN rejected it on a blocked input; excluded and the graph rebuilt";
  }
  for (size_t n = 0; n < num_nodes; ++n) {
    NodePlan& p = im.plans[n];
    if (p.requested && !p.lowered)
      p.description = fmt::format("{} not lowered: {}", op_def(g.nodes[n].op).name, p.why_not);
    im.scratch_bytes = std::max(im.scratch_bytes, p.scratch_bytes);
    if (p.lowered) {
      // The plan's own memory objects, as an instance (not owned twice: weak handles).
      auto own = std::make_shared<NodeInstance>();
      for (const Binding& b : p.bindings) own->memories.emplace_back(b.mem, /*weak=*/true);
      for (const Step& st : p.steps) own->args.push_back(st.args);
      p.own = std::move(own);
    }
  }
}

OnednnLowering::~OnednnLowering() = default;

bool OnednnLowering::lowered(int32_t node) const {
  return node >= 0 && size_t(node) < impl_->plans.size() && impl_->plans[size_t(node)].lowered;
}

std::string OnednnLowering::why_not_lowered(int32_t node) const {
  if (node < 0 || size_t(node) >= impl_->plans.size()) return "";
  const NodePlan& p = impl_->plans[size_t(node)];
  return p.requested && !p.lowered ? p.why_not : "";
}

bool OnednnLowering::blocked(ValueId v) const {
  return v >= 0 && size_t(v) < impl_->is_blocked.size() && impl_->is_blocked[size_t(v)];
}

int64_t OnednnLowering::value_bytes(ValueId v) const {
  return blocked(v) ? int64_t(impl_->layout[size_t(v)].get_size()) : -1;
}

int64_t OnednnLowering::scratchpad_bytes() const { return impl_->scratch_bytes; }

bool OnednnLowering::residual_may_alias_output(int32_t node) const {
  return lowered(node) && impl_->plans[size_t(node)].residual_input >= 0 &&
         impl_->plans[size_t(node)].residual_alias != NodePlan::Alias::Unsafe;
}

std::string OnednnLowering::describe(int32_t node) const {
  if (node < 0 || size_t(node) >= impl_->plans.size()) return "";
  return impl_->plans[size_t(node)].description;
}

std::shared_ptr<OnednnLowering::NodeInstance> OnednnLowering::instance(int32_t node) const {
  if (!lowered(node)) [[unlikely]]
    fail_kind(ErrorKind::Internal, "oneDNN lowering: instance() of node {}, which is not lowered",
              node);
  const NodePlan& p = impl_->plans[size_t(node)];
  auto inst = std::make_shared<NodeInstance>();
  inst->memories.reserve(p.bindings.size());
  for (const Binding& b : p.bindings) {
    const dnnl_memory_desc_t* md = nullptr;
    dnnl_status_t st = dnnl_memory_get_memory_desc(b.mem, &md);
    if (st != dnnl_success || !md)
      fail_kind(ErrorKind::Runtime, "oneDNN lowering: reading a memory descriptor of node {} "
                "failed (status {})", node, int(st));
    inst->memories.push_back(memory(memory::desc(*md), cpu_engine(), DNNL_MEMORY_NONE));
  }
  for (const Step& step : p.steps) {
    std::vector<dnnl_exec_arg_t> args = step.args;
    for (dnnl_exec_arg_t& a : args)
      for (size_t i = 0; i < p.bindings.size(); ++i)
        if (a.memory == p.bindings[i].mem) a.memory = inst->memories[i].get();
    inst->args.push_back(std::move(args));
  }
  return inst;
}

void OnednnLowering::run(int32_t node, const void* const* inputs, void* output,
                         void* scratch) const {
  if (!lowered(node)) [[unlikely]]
    fail_kind(ErrorKind::Internal, "oneDNN lowering: run() on node {}, which is not lowered",
              node);
  run(node, *impl_->plans[size_t(node)].own, inputs, output, scratch);
}

void OnednnLowering::run(int32_t node, NodeInstance& inst, const void* const* inputs,
                         void* output, void* scratch) const {
  if (!lowered(node)) [[unlikely]]
    fail_kind(ErrorKind::Internal, "oneDNN lowering: run() on node {}, which is not lowered",
              node);
  const NodePlan& p = impl_->plans[size_t(node)];
  dnnl_stream_t strm = cpu_stream().get();
  char* scratch_base = static_cast<char*>(scratch);
  bool residual_in_output = p.residual_input >= 0 && inputs[p.residual_input] == output;
  bool skip_residual_copy = residual_in_output && p.residual_alias == NodePlan::Alias::SkipCopy;
  if (residual_in_output && p.residual_alias == NodePlan::Alias::Unsafe) [[unlikely]]
    fail_kind(ErrorKind::InvalidArgument,
              "oneDNN lowering: node {} got its residual in the output buffer, but they differ "
              "in layout ({}); give the output its own buffer",
              node, p.description);
  for (size_t i = 0; i < p.bindings.size(); ++i) {
    const Binding& b = p.bindings[i];
    dnnl_memory_t mem = inst.memories[i].get();
    void* want = b.source == Source::Input  ? const_cast<void*>(inputs[b.index])
                 : b.source == Source::Output ? output
                                              : scratch_base + b.offset;
    void* have = nullptr;
    dnnl_memory_get_data_handle(mem, &have);
    if (have == want) continue;
    dnnl_status_t st = dnnl_memory_set_data_handle_v2(mem, want, strm);
    if (st != dnnl_success) [[unlikely]]
      fail_kind(ErrorKind::Runtime, "oneDNN lowering: binding a buffer of node {} failed "
                "(status {})", node, int(st));
  }
  for (size_t k = 0; k < p.steps.size(); ++k) {
    const Step& s = p.steps[k];
    if (s.residual_copy && skip_residual_copy) continue;
    const std::vector<dnnl_exec_arg_t>& args = inst.args[k];
    dnnl_status_t st = dnnl_primitive_execute(s.prim.get(), strm, int(args.size()), args.data());
    if (st != dnnl_success) [[unlikely]]
      fail_kind(ErrorKind::Runtime, "oneDNN lowering: executing node {} ({}) failed (status {})",
                node, p.description, int(st));
  }
  dnnl_stream_wait(strm);
}

}  // namespace kiln::cpu
