// oneDNN nodes from plain descriptors. See onednn_node.h.
//
// Note [oneDNN node descriptors]
// A package must rebuild, at load time and without the compiler, exactly the primitives the
// compiler built. So the compiler's oneDNN lowering (targets/cpu/onednn_lowering.cc) is split in
// two: the graph analysis that decides what to lower and which values may stay blocked (Note
// [layout choice] there) stays in the target; everything that talks to oneDNN (primitive
// descriptors, weight prepacking, reorders, run) lives here and reads only an OnednnNodeDesc,
// the layouts its producers chose (OnednnLayouts) and the named constants. The compiler builds
// its launches through this code and the package loader rebuilds them through the same code from
// the same descriptors, so a package runs the primitives the compile ran. oneDNN's choice of
// implementation depends on the CPU and the thread count: the description (which names the
// implementation and layouts) is recorded in the package, and the loader refuses a package whose
// rebuilt node describes itself differently (runtime/package.cc).
//
// Note [oneDNN lowering]
// The eager kernels (src/eager/onednn.cc) look a primitive up per call, wrap every tensor in a
// fresh dnnl::memory, and reorder weights on every call (eager cannot trust a cached copy of a
// tensor that may be rewritten). Here a graph is frozen, so everything is done once, when the
// node is built:
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
// Note [matched convolution layouts]
// A convolution whose src layout is given (a blocked value from the producer: Note [layout
// choice] in targets/cpu/onednn_lowering.cc) is created with dst format_tag::any. oneDNN 2.6's
// direct jit kernels (jit:avx512_core, jit_bf16, jit:avx2) then resolve dst to their own
// preferred blocked layout, which they accept only when src has it too; brgconv takes nhwc but
// not grouped convolutions with fewer than 24-32 channels per group. So a grouped conv after an
// nhwc producer got `ref:any` (regnet_x_400mf, regnet_y_400mf, resnext50_32x4d: every grouped
// 3x3 took 20-125 ms; the same shapes run as jit:avx512_core in 0.03-0.5 ms with src and dst
// both nhwc), and nChw16c src with 4 or 8 channels per group has only `ref:any` whatever dst
// is. build_conv therefore tries (src, dst) pairs in order: (given src, any), (given src, the
// src's own layout), (any + a reorder from the given src, any), and takes the first that oneDNN
// runs with a non-reference kernel, else the first it runs at all. Where `any` already gets a
// jit kernel nothing changes. Checked with every layout pair on the dev machine (oneDNN 2.6,
// avx512_core_bf16): for 1, 2, 4, 8, 16, 32 channels per group, f32 and bf16, src nhwc with dst
// nhwc always has a jit kernel; nChw16c only for depthwise or with 16 or more channels per
// group, nChw8c (f32) only for depthwise or with 8 or more.
// The same kernels take a sum post-op only with scale 1 (a residual scaled by 0.5 or -1 got
// ref:any in every layout, also plain nchw), so where the scale leaves only the reference
// kernel, the residual's copy into dst applies it (an eltwise_linear, which may run in place
// when the residual already is the output buffer; a scaling reorder where the layouts differ)
// and the post-op adds with scale 1.

#include "kernels/onednn_node.h"
#include "kernels/grouped_conv.h"
#include "kernels/parallel.h"

#include <omp.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <ctime>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>
#include <oneapi/dnnl/dnnl.hpp>

#include "core/error.h"
#include "kernels/json_numbers.h"

namespace kiln::kernels {

int cpu_threads() { return omp_get_max_threads(); }

ScopedCpuThreads::ScopedCpuThreads(int threads) : saved_(omp_get_max_threads()) {
  if (threads > 0) omp_set_num_threads(threads);
}
ScopedCpuThreads::~ScopedCpuThreads() { omp_set_num_threads(saved_); }

int native_conv_block() {
  static const int block = __builtin_cpu_supports("avx512f") ? 16 : 8;
  return block;
}

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

// The tag among the activation layouts convolutions compute in (nchw, nhwc, nChw16c, nChw8c)
// that `md` (of dims `dims`) is, if any.
std::optional<Tag> activation_tag(const memory::desc& md, const memory::dims& dims, DT dt) {
  for (Tag t : {Tag::nhwc, Tag::nChw16c, Tag::nChw8c, Tag::nchw})
    if (same_layout(md, memory::desc(dims, dt, t))) return t;
  return std::nullopt;
}

const char* dt_name(DT dt) { return dt == DT::bf16 ? "bf16" : dt == DT::f32 ? "f32" : "?"; }

// ---- attributes -----------------------------------------------------------------------------
enum class Act { None, Relu, Gelu, GeluTanh, Silu, Sigmoid, Tanh, Clamp };

struct Epilogue {
  Act act = Act::None;
  float lo = -FLT_MAX, hi = FLT_MAX;
  float sum_scale = 1.0f;
  bool has_residual = false;
};

Epilogue read_epilogue(const OnednnNodeDesc& d) {
  Epilogue e;
  bool fused = d.op == "fused_conv2d" || d.op == "fused_linear";
  if (!fused) return e;
  static constexpr std::pair<const char*, Act> kActs[] = {
      {"none", Act::None}, {"relu", Act::Relu},       {"gelu", Act::Gelu},
      {"gelu_tanh", Act::GeluTanh}, {"silu", Act::Silu}, {"sigmoid", Act::Sigmoid},
      {"tanh", Act::Tanh}, {"clamp", Act::Clamp}};
  bool found = false;
  for (const auto& [n, act] : kActs)
    if (d.activation == n) {
      e.act = act;
      found = true;
    }
  KILN_CHECK(found, "fused node '{}': unknown activation '{}'", d.node, d.activation);
  e.lo = d.clamp_lo;
  e.hi = d.clamp_hi;
  e.sum_scale = d.sum_scale;
  e.has_residual = d.has_residual;
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

const OnednnOperand kAbsent;
const OnednnOperand& input_or_none(const OnednnNodeDesc& d, size_t i) {
  return i < d.inputs.size() ? d.inputs[i] : kAbsent;
}

}  // namespace

// ---- the plan of one node -------------------------------------------------------------------
enum class Source : uint8_t { Input, Output, Scratch, Scratchpad };

// A memory object whose data pointer run() sets: an input, the output, or a place in scratch.
struct Binding {
  dnnl_memory_t mem = nullptr;  // owned by Plan::memories
  Source source = Source::Input;
  int32_t index = 0;   // Source::Input: the node's input index
  int64_t offset = 0;  // Source::Scratch / Scratchpad: byte offset in scratch
};

// Note [blocked concat copies]: one part of a concat along the channels of blocked values,
// copied as whole channel blocks: `count` chunks of `bytes` (one per image), the source's at
// k * src_stride, the destination's at dst_offset + k * dst_stride.
struct BlockCopy {
  int64_t bytes = 0, dst_offset = 0, src_stride = 0, dst_stride = 0, count = 0;
};

struct Step {
  dnnl::primitive prim;  // none for a block copy or Kiln's grouped convolution
  std::vector<dnnl_exec_arg_t> args;  // a block copy: its parts' memories, then the destination
  bool residual_copy = false;  // skipped when the residual already is the output buffer
  std::vector<BlockCopy> copies;  // Note [blocked concat copies]: one per part
  // Note [Kiln grouped convolution] (kernels/grouped_conv.cc): args are src, dst, its staging
  // scratch, then the residual where it has one.
  std::shared_ptr<const GroupedConv> kiln;
};

// Per call state: see OnednnNode::Instance in the header.
struct OnednnNode::Instance {
  std::vector<memory> memories;                    // per binding of the node's plan
  std::vector<std::vector<dnnl_exec_arg_t>> args;  // per step, over `memories` for bound ones
};

struct OnednnNode::Plan {
  bool requested = false;
  bool lowered = false;
  std::string why_not;
  std::vector<memory> memories;  // keeps every memory the steps reference alive
  std::vector<Binding> bindings;
  std::vector<Step> steps;
  std::vector<Tensor> constants;  // activation inputs that are params/consts: bound once
  int64_t scratch_bytes = 0;
  // The OpenMP thread count the primitives were created for: oneDNN sizes per-thread parts of
  // the scratchpad by it, so run() never runs them with more (Note [oneDNN thread count]).
  int threads = 1;
  int32_t residual_input = -1;  // input index of the residual (sum post-op), -1 if none
  // When run() gets the residual's buffer as the output buffer (Note [oneDNN lowering]):
  //   SkipCopy: dst is the output and has the residual's layout: the residual is already there;
  //   Safe: dst is a scratch temporary, the output is written last: the copy runs as usual;
  //   Unsafe: the output's layout differs from the residual's: an error.
  enum class Alias : uint8_t { SkipCopy, Safe, Unsafe } residual_alias = Alias::Unsafe;
  std::string description;
  std::string implementation;  // convolutions: pd->impl_info_str()
  // Note [prepacked weights]: the constants reordered into their primitive's layout, in build
  // order (those whose layout layout_text describes).
  struct Packed {
    std::string constant, layout;
    memory mem;
  };
  std::vector<Packed> prepacked;
  // The instance run(node, inputs, output, scratch) uses: the plan's own memory objects.
  std::shared_ptr<OnednnNode::Instance> own;
};

namespace {

// Builds a Plan: memories, bindings, steps and the scratch layout.
class PlanBuilder {
 public:
  explicit PlanBuilder(OnednnNode::Plan& plan) : plan_(plan) {}

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
    step(std::move(prim), scratchpad, std::vector<std::pair<int, memory>>(args), residual_copy);
  }
  void step(dnnl::primitive prim, const memory::desc& scratchpad,
            const std::vector<std::pair<int, memory>>& args, bool residual_copy = false) {
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

  // scale != 1: `to` = scale * `from` (the residual of a sum post-op scaled in its copy).
  void reorder(const memory& from, const memory& to, bool residual_copy = false,
               float scale = 1.0f) {
    dnnl::primitive_attr attr = user_scratchpad_attr();
    if (scale != 1.0f) attr.set_output_scales(0, {scale});
    dnnl::reorder::primitive_desc pd(cpu_engine(), from.get_desc(), cpu_engine(), to.get_desc(),
                                     attr);
    step(dnnl::reorder(pd), pd.scratchpad_desc(), {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}},
         residual_copy);
  }

  // Note [Kiln grouped convolution]: `conv` reads src (and the residual), writes dst and
  // stages its input in `staging`.
  void kiln_step(std::shared_ptr<const GroupedConv> conv, const memory& src, const memory& dst,
                 const memory& staging, const memory& residual) {
    Step s;
    s.kiln = std::move(conv);
    s.args = {{DNNL_ARG_SRC, src.get()}, {DNNL_ARG_DST, dst.get()}, {DNNL_ARG_SCRATCHPAD, staging.get()}};
    if (residual) s.args.push_back({DNNL_ARG_SRC_1, residual.get()});
    plan_.steps.push_back(std::move(s));
  }

  // Note [blocked concat copies]: parts[i] copied into dst as copies[i] says.
  void copy_blocks(const std::vector<memory>& parts, const memory& dst,
                   std::vector<BlockCopy> copies) {
    Step s;
    for (const memory& m : parts) s.args.push_back({DNNL_ARG_MULTIPLE_SRC, m.get()});
    s.args.push_back({DNNL_ARG_DST, dst.get()});
    s.copies = std::move(copies);
    plan_.steps.push_back(std::move(s));
  }

  // `to` = scale * `from`, elementwise (oneDNN's eltwise_linear, which may run in place); the
  // two have one layout.
  void scale(const memory& from, const memory& to, float scale) {
    dnnl::eltwise_forward::desc d(dnnl::prop_kind::forward_inference,
                                  dnnl::algorithm::eltwise_linear, to.get_desc(), scale, 0.0f);
    dnnl::eltwise_forward::primitive_desc pd(d, user_scratchpad_attr(), cpu_engine());
    step(dnnl::eltwise_forward(pd), pd.scratchpad_desc(),
         {{DNNL_ARG_SRC, from}, {DNNL_ARG_DST, to}});
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

  OnednnNode::Plan& plan_;
  int64_t temp_bytes_ = 0;
  int64_t pad_bytes_ = 0;
};

// After a primitive that wrote dst_mem: the reorder into the node's output where bind_dst gave
// the output a layout of its own (user_out), and the text describe() adds for it and for the
// node's earlier reorders `before` (" src 1 nChw16c->nhwc"; "" if none at all).
std::string reorder_into_output(PlanBuilder& b, const memory& dst_mem, const memory& user_out,
                                const std::string& before = "") {
  std::string all = before;
  if (user_out) {
    b.reorder(dst_mem, user_out);
    all += fmt::format(" dst {}->{}", format_name(dst_mem.get_desc(), "nchw"),
                       format_name(user_out.get_desc(), "nchw"));
  }
  return all.empty() ? "" : "; reorders:" + all;
}

// Note [prepacked weights]
// A node reorders its weights once, when it is built, into the layout its primitive chose
// (format_tag::any): a blocked format for direct convolutions and GEMMs, a Winograd format (the
// weights' transform, 1.8x their size) for Winograd convolutions. A package's load used to do
// the same from the plain weights the package held, which was most of a CPU package's load:
// resnet50 spent 0.16 of its 0.23 s load in these reorders (0.10 s in 13 Winograd transforms),
// with the package built on the same machine with the same oneDNN for the same thread count.
// So a CPU package now holds those weights as the node had them after the reorder (the
// manifest's launch record lists them: constant, layout text, an entry of the weights section),
// and the node reads the loader's copy of them in place where it would have reordered.
//
// The layout text is every field of oneDNN's memory descriptor that places an element (data
// type, dims, padded dims and offsets, offset0, the blocking strides and inner blocks, or the
// Winograd format's fields, and the extra flags), so equal texts mean byte-compatible
// layouts. The loader never builds a descriptor from the text: the node computes its own layout
// here and compares texts, and a package whose layout is not this machine's is refused with
// both texts named (a hash cannot catch an edited-and-rehashed manifest; this check does). The
// loader copies the entries out of the mapped file into one block (runtime/package.cc), which
// keeps the promise that nothing refers to the file once the load returns (Note [CPU package
// weights] there), and keeps the block alive as long as the nodes.
std::string layout_text(const memory::desc& md) {
  const dnnl_memory_desc_t& d = md.data;
  const int n = std::clamp(d.ndims, 0, DNNL_MAX_NDIMS);
  auto list = [n](const dnnl_dims_t& a, int count) {
    return fmt::format("{}", fmt::join(a, a + std::clamp(count, 0, n), ","));
  };
  std::string s = fmt::format("dt {} dims {} padded {} offsets {} offset0 {}", int(d.data_type),
                              list(d.dims, n), list(d.padded_dims, n), list(d.padded_offsets, n),
                              d.offset0);
  if (d.format_kind == dnnl_blocked) {
    const dnnl_blocking_desc_t& b = d.format_desc.blocking;
    s += fmt::format(" blocked {} strides {} inner", format_name(md, ""), list(b.strides, n));
    for (int i = 0; i < std::clamp(b.inner_nblks, 0, DNNL_MAX_NDIMS); ++i)
      s += fmt::format(" {}:{}", b.inner_blks[i], b.inner_idxs[i]);
  } else if (d.format_kind == dnnl_format_kind_wino) {
    const dnnl_wino_desc_t& w = d.format_desc.wino_desc;
    s += fmt::format(" wino {} r {} alpha {} ic {} oc {} blocks {},{},{},{} scale {:a} size {} "
                     "oneDNN {}.{}",
                     int(w.wino_format), w.r, w.alpha, w.ic, w.oc, w.ic_block, w.oc_block,
                     w.ic2_block, w.oc2_block, double(w.adj_scale), w.size, DNNL_VERSION_MAJOR,
                     DNNL_VERSION_MINOR);
  } else {
    s += fmt::format(" kind {}", int(d.format_kind));
  }
  s += fmt::format(" extra {} {} {:a} {}", d.extra.flags, d.extra.compensation_mask,
                   double(d.extra.scale_adjust), d.extra.asymm_compensation_mask);
  return s;
}

// Whether layout_text says everything about `md`'s element placement (see above).
bool describable(const memory::desc& md) {
  return md.data.format_kind == dnnl_blocked || md.data.format_kind == dnnl_format_kind_wino;
}

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

// ---- layouts ------------------------------------------------------------------------------
struct OnednnLayouts::Impl {
  std::vector<memory::desc> layout;  // by value: the blocked layout (blocked values only)
  std::vector<bool> is_blocked;      // by value
  void ensure(int32_t v) {
    if (v >= 0 && size_t(v) >= is_blocked.size()) {
      is_blocked.resize(size_t(v) + 1, false);
      layout.resize(size_t(v) + 1);
    }
  }
};
OnednnLayouts::OnednnLayouts() : impl_(std::make_unique<Impl>()) {}
OnednnLayouts::~OnednnLayouts() = default;
void OnednnLayouts::reset(size_t num_values) {
  impl_->layout.assign(num_values, memory::desc());
  impl_->is_blocked.assign(num_values, false);
}
bool OnednnLayouts::blocked(int32_t v) const {
  return v >= 0 && size_t(v) < impl_->is_blocked.size() && impl_->is_blocked[size_t(v)];
}
struct OnednnLayouts::Entry {
  memory::desc layout;
  bool blocked = false;
};
std::shared_ptr<const OnednnLayouts::Entry> OnednnLayouts::entry(int32_t v) const {
  auto e = std::make_shared<Entry>();
  if (v >= 0 && size_t(v) < impl_->is_blocked.size()) {
    e->layout = impl_->layout[size_t(v)];
    e->blocked = impl_->is_blocked[size_t(v)];
  }
  return e;
}
bool OnednnLayouts::same(const Entry& a, const Entry& b) {
  return a.blocked == b.blocked && a.layout == b.layout;
}
void OnednnLayouts::set_entry(int32_t v, const std::shared_ptr<const Entry>& e) {
  if (v < 0) return;
  impl_->ensure(v);
  impl_->layout[size_t(v)] = e->layout;
  impl_->is_blocked[size_t(v)] = e->blocked;
}
int64_t OnednnLayouts::value_bytes(int32_t v) const {
  return blocked(v) ? int64_t(impl_->layout[size_t(v)].get_size()) : -1;
}

// ---- building one node ------------------------------------------------------------------------
namespace {
using Plan = OnednnNode::Plan;

struct Builder {
  const OnednnNodeDesc& d;
  OnednnLayouts::Impl& layouts;
  const ConstantSource& constants;
  const PrepackedSource* prepacked_source = nullptr;  // Note [prepacked weights]; may be empty

  void build(Plan& p);
  void build_conv(Plan& p);
  void build_pool(Plan& p);
  void build_linear(Plan& p);
  void build_matmul(Plan& p);
  void build_concat(Plan& p);
  void build_kiln_conv(Plan& p);

  DT dt() const { return d.bf16 ? DT::bf16 : DT::f32; }
  bool blocked(const OnednnOperand& v) const {
    return v.value >= 0 && size_t(v.value) < layouts.is_blocked.size() &&
           layouts.is_blocked[size_t(v.value)];
  }
  // The layout a value is stored in.
  memory::desc value_md(const OnednnOperand& v, const memory::dims& dims) const {
    if (blocked(v)) return layouts.layout[size_t(v.value)];
    if (v.channels_last) return memory::desc(dims, dt(), Tag::nhwc);
    return plain_md(dims, dt());
  }
  static bool is_constant(const OnednnOperand& v) { return !v.constant.empty(); }
  Tensor constant(const OnednnOperand& v) const {
    Tensor t = constants(v.constant);
    std::vector<int64_t> want = v.dims;
    std::vector<int64_t> have(t.sizes().begin(), t.sizes().end());
    DType want_dt = d.bf16 ? DType::BFloat16 : DType::Float32;
    if (have != want || t.dtype() != want_dt)
      fail_kind(ErrorKind::InvalidArgument,
                "oneDNN node '{}': constant '{}' is {} [{}], the node expects {} [{}]", d.node,
                v.constant, dtype_name(t.dtype()), fmt::join(have, ","), dtype_name(want_dt),
                fmt::join(want, ","));
    return t;
  }
  // Constant operand v (weights) in the primitive's layout md, from its plain data (user_md):
  // reordered here, or copied from the prepacked bytes the source gives (Note [prepacked
  // weights]). Recorded in p.prepacked.
  memory weights(PlanBuilder& b, Plan& p, const OnednnOperand& v, const memory::desc& user_md,
                 const memory::desc& md) const {
    std::string layout = layout_text(md);
    const PrepackedWeights* given =
        prepacked_source && *prepacked_source ? (*prepacked_source)(v.constant) : nullptr;
    if (given) {
      if (given->layout != layout)
        fail_kind(ErrorKind::InvalidArgument,
                  "oneDNN node '{}': the prepacked weights of '{}' are laid out as [{}], but "
                  "oneDNN here computes with [{}]. They were prepacked on another CPU or by "
                  "another oneDNN: rebuild the package on this machine with `kiln compile`, or "
                  "build it with `--knobs prepack=off` (plain weights, reordered at load)",
                  d.node, v.constant, given->layout, layout);
      if (given->bytes != md.get_size() || !given->data)
        fail_kind(ErrorKind::InvalidArgument,
                  "oneDNN node '{}': the prepacked weights of '{}' are {} bytes, their layout "
                  "[{}] takes {}", d.node, v.constant, given->bytes, layout, md.get_size());
      memory m = b.fixed(md, const_cast<void*>(given->data));  // read only, never written
      p.prepacked.push_back({v.constant, std::move(layout), m});
      return m;
    }
    memory m = prepack(b, user_md, constant(v), md);
    if (describable(md)) p.prepacked.push_back({v.constant, std::move(layout), m});
    return m;
  }
  // Memory for activation input `index` (operand v) in layout md: bound to inputs[index] at run
  // time, or fixed to the data of a param/const.
  memory activation(PlanBuilder& b, Plan& p, int32_t index, const OnednnOperand& v,
                    const memory::desc& md) const {
    if (!is_constant(v)) return b.input(index, md);
    // A copy of its own: the source's tensor may live only while the node is built (a package's
    // weights are views of the file being loaded).
    p.constants.push_back(constant(v).clone());
    return b.fixed(md, p.constants.back().raw_data());
  }
  // Binds the node's output: directly when the primitive's dst layout is the value's layout,
  // else through a scratch temporary and a reorder after the primitive. Records the layout of a
  // blockable value. Returns the memory the primitive writes.
  memory bind_dst(PlanBuilder& b, const OnednnOperand& y, const memory::desc& prim_dst,
                  memory* user_out) {
    if (d.output_may_block && !is_plain(prim_dst) && y.value >= 0) {
      layouts.ensure(y.value);
      layouts.is_blocked[size_t(y.value)] = true;
      layouts.layout[size_t(y.value)] = prim_dst;
    } else if (y.value >= 0) {  // plain (a node built again with another layout)
      layouts.ensure(y.value);
      layouts.is_blocked[size_t(y.value)] = false;
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

void Builder::build(Plan& p) {
  const std::string& op = d.op;
  if (op == "conv2d" || op == "fused_conv2d" || op == "conv_transpose2d") build_conv(p);
  else if (op == "max_pool2d" || op == "avg_pool2d") build_pool(p);
  else if (op == "linear" || op == "fused_linear") build_linear(p);
  else if (op == "matmul") build_matmul(p);
  else if (op == "concat") build_concat(p);
  else fail_kind(ErrorKind::InvalidArgument, "oneDNN node '{}': unknown op '{}'", d.node, op);
}

// ---- convolution / deconvolution ------------------------------------------------------------
void Builder::build_conv(Plan& p) {
  if (d.conv_layout == kKilnDirectLayout) {
    build_kiln_conv(p);
    return;
  }
  bool transposed = d.op == "conv_transpose2d";
  Epilogue epi = read_epilogue(d);
  const OnednnOperand &x = d.inputs.at(0), &w = d.inputs.at(1), &bias = input_or_none(d, 2);
  const OnednnOperand& residual = epi.has_residual ? d.inputs.at(3) : kAbsent;
  const OnednnOperand& y = d.output;
  bool has_bias = bias.value >= 0, has_residual = residual.value >= 0;
  DT dt = this->dt();
  memory::dims xd = x.dims, yd = y.dims, wt = w.dims;
  KILN_CHECK(xd.size() == 4 && yd.size() == 4 && wt.size() == 4,
             "oneDNN node '{}': convolution operands must be 4-D", d.node);
  int64_t gr = d.groups;
  KILN_CHECK(gr >= 1 && wt[0] % gr == 0, "oneDNN node '{}': bad groups {}", d.node, gr);

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
  bool blocked_src = blocked(x);
  // An isolated pointwise conv (plain in, plain out) runs plain, unless it is f32 with an
  // activation: see Note [layout choice].
  bool pointwise = !transposed && gr == 1 && wt[2] == 1 && wt[3] == 1 &&
                   (epi.act == Act::None || dt == DT::bf16);
  // (A channels-last value is not plain NCHW: its convolution computes in nhwc, no reorder.)
  bool isolated = !blocked_src && !x.channels_last && !d.output_may_block && !y.channels_last &&
                  (!has_residual || (!blocked(residual) && !residual.channels_last));
  bool any_layout = d.allow_blocked && !(pointwise && isolated);
  memory::desc want_src = blocked_src ? x_md : any_layout ? any_md(xd, dt) : plain_md(xd, dt);
  memory::desc want_dst = any_layout ? any_md(yd, dt) : plain_md(yd, dt);
  // Note [convolution policy]: Blocked / Winograd pin the output to the native block (the src
  // of a plain input stays `any`: the first convolution of a network reads nchw directly).
  if (any_layout && d.conv != OnednnConvPolicy::Auto && yd.size() == 4)
    want_dst = memory::desc(yd, dt, native_conv_block() == 16 ? Tag::nChw16c : Tag::nChw8c);
  // A layout the compiler measured (OnednnNodeDesc::conv_layout) pins src and dst; a blocked
  // x is reordered into it.
  if (!d.conv_layout.empty()) {
    Tag t = d.conv_layout == "nchw"   ? Tag::nchw
            : d.conv_layout == "nhwc" ? Tag::nhwc
            : native_conv_block() == 16 ? Tag::nChw16c : Tag::nChw8c;
    want_src = memory::desc(xd, dt, t);
    want_dst = memory::desc(yd, dt, t);
  }
  bool try_winograd = d.conv == OnednnConvPolicy::Winograd && !transposed && gr == 1 &&
                      dt == DT::f32 && wt[2] == 3 && wt[3] == 3 && d.stride[0] == 1 &&
                      d.stride[1] == 1 && d.dilation[0] == 1 && d.dilation[1] == 1;
  memory::desc want_w = any_md(wd, dt);
  dnnl::primitive_attr attr = make_attr(epi);
  // Where the sum post-op's scale has only a reference kernel (oneDNN 2.6's direct jit
  // convolutions take sum with scale 1 only), the residual's copy into dst applies the scale
  // and the post-op adds with scale 1.
  float residual_copy_scale = 1.0f;
  memory::dims strides = {d.stride[0], d.stride[1]};
  memory::dims dil = {d.dilation[0] - 1, d.dilation[1] - 1};  // oneDNN: 0 = dense
  memory::dims pl = {d.pad_begin[0], d.pad_begin[1]}, pr = {d.pad_end[0], d.pad_end[1]};

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
  if (!has_bias)
    bias_choices = {memory::desc()};
  else
    bias_choices = {memory::desc(bd, DT::f32, Tag::x), memory::desc(bd, dt, Tag::x)};
  // Note [matched convolution layouts]: (src, dst) pairs in order of preference; the first
  // that oneDNN runs with a jit kernel wins, else the first it runs at all.
  struct LayoutChoice {
    memory::desc src, dst;
  };
  std::vector<LayoutChoice> layout_choices = {{want_src, want_dst}};
  if (blocked_src && d.conv_layout.empty()) {
    if (want_dst.data.format_kind == dnnl_format_kind_any)
      if (std::optional<Tag> t = activation_tag(x_md, xd, dt))
        layout_choices.push_back({want_src, memory::desc(yd, dt, *t)});
    layout_choices.push_back({any_md(xd, dt), want_dst});  // then reorder from x's layout
  }
  std::optional<dnnl::primitive_desc> pd;
  memory::desc bias_md, chosen_dst = want_dst;
  std::vector<dnnl::algorithm> algs = {dnnl::algorithm::convolution_direct};
  if (try_winograd) algs.insert(algs.begin(), dnnl::algorithm::convolution_winograd);
  std::vector<float> copy_scales = {1.0f};
  if (epi.has_residual && epi.sum_scale != 1.0f) copy_scales.push_back(epi.sum_scale);
  bool jit = false;
  for (size_t ai = 0; ai < algs.size() && !pd; ++ai) {
    conv_alg = algs[ai];
    for (float copy_scale : copy_scales) {
      Epilogue e = epi;
      e.sum_scale /= copy_scale;
      attr = make_attr(e);
      for (size_t ci = 0; ci < layout_choices.size() && !jit; ++ci) {
        const LayoutChoice& c = layout_choices[ci];
        want_dst = c.dst;
        for (const memory::desc& b : bias_choices) {
          std::optional<dnnl::primitive_desc> cand =
              try_pd<dnnl::primitive_desc>([&] { return make(c.src, b); });
          if (!cand) continue;
          jit = !is_reference(cand->impl_info_str());
          if (!pd || jit) {
            pd = std::move(cand);
            bias_md = b;
            chosen_dst = c.dst;
            residual_copy_scale = copy_scale;
          }
          break;  // the bias's dtype does not change which kernel runs
        }
      }
      if (jit) break;
    }
  }
  want_dst = chosen_dst;
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
  if (has_residual) {
    memory::desc r_md = value_md(residual, yd);
    memory r_mem = activation(b, p, 3, residual, r_md);
    p.residual_input = 3;
    if (is_constant(residual))
      p.residual_alias = Plan::Alias::Unsafe;
    else if (user_out)
      p.residual_alias = same_layout(r_md, user_out.get_desc()) ? Plan::Alias::Safe
                                                                : Plan::Alias::Unsafe;
    else
      p.residual_alias = same_layout(r_md, dst_md) ? Plan::Alias::SkipCopy
                                                   : Plan::Alias::Unsafe;
    if (residual_copy_scale == 1.0f) {
      b.reorder(r_mem, dst_mem, /*residual_copy=*/true);
    } else if (same_layout(r_md, dst_md)) {
      // Never skipped: where the residual already is the output buffer this scales in place.
      b.scale(r_mem, dst_mem, residual_copy_scale);
    } else {
      b.reorder(r_mem, dst_mem, /*residual_copy=*/true, residual_copy_scale);
    }
  }
  memory w_mem = weights(b, p, w, w_user, w_md);
  dnnl::primitive prim(*pd);
  memory::desc pad = pd->scratchpad_desc();
  if (has_bias) {
    memory b_mem = bias_memory(b, constant(bias), bias_md);
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
  if (d.stride[0] != 1 || d.stride[1] != 1)
    geo_str += d.stride[0] == d.stride[1] ? fmt::format("/{}", d.stride[0])
                                          : fmt::format("/{}x{}", d.stride[0], d.stride[1]);
  if (gr > 1) geo_str += fmt::format(" g{}", gr);
  if (d.dilation[0] != 1 || d.dilation[1] != 1)
    geo_str += fmt::format(" d{}x{}", d.dilation[0], d.dilation[1]);
  p.description = fmt::format(
      "{} {} {}->{} {} {} src {} -> dst {}, weights {}{}{}{}", d.op, geo_str,
      xd[1], yd[1], dt_name(dt), pd->impl_info_str(), format_name(src_md, "nchw"),
      format_name(dst_md, "nchw"), format_name(w_md, gr == 1 ? "oihw" : "goihw"),
      epilogue_str(epi),
      residual_copy_scale == 1.0f ? "" : fmt::format(" (the residual scaled in its copy)"),
      reorders.empty() ? "" : "; reorders:" + reorders);
  p.implementation = pd->impl_info_str();
  p.lowered = true;
}

// ---- Kiln's grouped convolution ----------------------------------------------------------------
namespace {
// The kernel's shape and epilogue for `d`, or why it does not take it.
std::string kiln_conv_shape(const OnednnNodeDesc& d, GroupedConvShape* s, GroupedConvEpilogue* e) {
  if (d.op != "conv2d" && d.op != "fused_conv2d") return "not a convolution";
  if (d.bf16) return "bfloat16";
  if (d.inputs.size() < 2 || d.inputs[0].dims.size() != 4 || d.inputs[1].dims.size() != 4 ||
      d.output.dims.size() != 4)
    return "not 4-D";
  if (!d.inputs[1].constant.size()) return "weights are not a constant";
  if (d.inputs.size() > 2 && d.inputs[2].value >= 0 && d.inputs[2].constant.empty())
    return "bias is not a constant";
  const std::vector<int64_t>&x = d.inputs[0].dims, &w = d.inputs[1].dims, &y = d.output.dims;
  s->n = x[0], s->c = x[1], s->h = x[2], s->w = x[3];
  s->o = y[1], s->oh = y[2], s->ow = y[3];
  s->groups = d.groups, s->kh = w[2], s->kw = w[3];
  s->pad_top = d.pad_begin[0], s->pad_left = d.pad_begin[1];
  if (y[0] != x[0] || w[0] != y[1] || w[1] * d.groups != x[1]) return "inconsistent shapes";
  const Epilogue epi = read_epilogue(d);
  if (epi.act == Act::Relu) e->act = GroupedConvEpilogue::Act::Relu;
  else if (epi.act == Act::Clamp) e->act = GroupedConvEpilogue::Act::Clamp;
  else if (epi.act == Act::Silu) e->act = GroupedConvEpilogue::Act::Silu;
  else if (epi.act != Act::None) return "its activation is not relu, clamp or silu";
  e->lo = epi.lo, e->hi = epi.hi, e->sum_scale = epi.sum_scale, e->residual = epi.has_residual;
  if (e->residual && d.inputs.size() < 4) return "no residual operand";
  s->stride_h = d.stride[0], s->stride_w = d.stride[1];
  return GroupedConv::why_not(*s, d.dilation[0], d.dilation[1]);
}
}  // namespace

// Note [Kiln grouped convolution]: x read in place where it is stored NCHW or NHWC (else
// reordered to NCHW), y written NHWC or NCHW (reordered into the value's layout after only where
// that is neither), the residual read in place when it has y's layout.
void Builder::build_kiln_conv(Plan& p) {
  GroupedConvShape s;
  GroupedConvEpilogue e;
  if (std::string why = kiln_conv_shape(d, &s, &e); !why.empty()) {
    p.why_not = "Kiln's grouped convolution kernel does not take it: " + why;
    return;
  }
  const OnednnOperand &x = d.inputs[0], &w = d.inputs[1], &bias = input_or_none(d, 2);
  const OnednnOperand& residual = e.residual ? d.inputs.at(3) : kAbsent;
  const OnednnOperand& y = d.output;
  Tensor wt = constant(w).contiguous();
  Tensor bt = bias.value >= 0 ? constant(bias).contiguous() : Tensor();
  PlanBuilder b(p);
  const memory::dims xd = x.dims, yd = y.dims;
  std::string reorders;
  const memory::desc plain_x = plain_md(xd, DT::f32), nhwc_x(xd, DT::f32, Tag::nhwc);
  // x as stored when that is NCHW or NHWC (channels-last, or a blocked value oneDNN left in
  // nhwc), else reordered to NCHW.
  const memory::desc x_md = value_md(x, xd);
  memory src = activation(b, p, 0, x, x_md);
  s.x_nhwc = same_layout(x_md, nhwc_x);
  if (!s.x_nhwc && !same_layout(x_md, plain_x)) {
    memory t = b.temp(plain_x);
    b.reorder(src, t);
    src = t;
    reorders += fmt::format(" src {}->nchw", format_name(x_md, "nchw"));
  }
  // y in its value's layout: NHWC where it is channels-last, or where it may be blocked and x
  // came in NHWC (the oneDNN convolutions around it compute in nhwc), else NCHW.
  s.y_nhwc = y.channels_last || (d.output_may_block && s.x_nhwc);
  const memory::desc y_md = s.y_nhwc ? memory::desc(yd, DT::f32, Tag::nhwc) : plain_md(yd, DT::f32);
  memory r_mem;
  if (e.residual) {
    const memory::desc r_md = value_md(residual, yd);
    r_mem = activation(b, p, 3, residual, r_md);
    if (!same_layout(r_md, y_md)) {
      memory t = b.temp(y_md);
      b.reorder(r_mem, t);
      r_mem = t;
      reorders += fmt::format(" residual {}->{}", format_name(r_md, "nchw"), format_name(y_md, "nchw"));
    }
    p.residual_input = 3;
    // Read before its element is written, by the same thread: the output may be its buffer.
    p.residual_alias = is_constant(residual) ? Plan::Alias::Unsafe : Plan::Alias::Safe;
  }
  auto conv = std::make_shared<const GroupedConv>(
      s, e, static_cast<const float*>(wt.raw_data()),
      bt.defined() ? static_cast<const float*>(bt.raw_data()) : nullptr);
  memory user_out;
  memory dst = bind_dst(b, y, y_md, &user_out);
  memory staging = b.temp(memory::desc({conv->scratch_bytes(p.threads) / 4}, DT::f32, Tag::a));
  b.kiln_step(conv, src, dst, staging, r_mem);
  if (user_out) {
    b.reorder(dst, user_out);
    reorders += fmt::format(" dst {}->{}", format_name(y_md, "nchw"), format_name(user_out.get_desc(), "nchw"));
  }
  b.finish();
  std::string geo = fmt::format("{}x{} g{}", s.kh, s.kw, s.groups);
  p.implementation = fmt::format("kiln:grouped_direct_{}", conv->isa());
  p.description = fmt::format("{} {} {}->{} f32 {} src {} -> dst {}{}{}", d.op, geo, s.c, s.o,
                              p.implementation, s.x_nhwc ? "nhwc" : "nchw", s.y_nhwc ? "nhwc" : "nchw",
                              epilogue_str(read_epilogue(d)),
                              reorders.empty() ? "" : "; reorders:" + reorders);
  p.lowered = true;
}

// ---- pooling ----------------------------------------------------------------------------------
void Builder::build_pool(Plan& p) {
  bool is_max = d.op == "max_pool2d";
  const OnednnOperand &x = d.inputs.at(0), &y = d.output;
  DT dt = this->dt();
  memory::dims xd = x.dims, yd = y.dims;
  using Ints = std::vector<int64_t>;
  const Ints& k = d.kernel_size;
  const Ints& s = d.pool_stride.empty() ? k : d.pool_stride;
  const Ints& pad = d.pool_padding;
  Ints dl = is_max ? d.pool_dilation : Ints{1, 1};
  KILN_CHECK(xd.size() == 4 && yd.size() == 4 && k.size() == 2 && s.size() == 2 &&
                 pad.size() >= 2 && dl.size() == 2,
             "oneDNN node '{}': malformed pooling geometry", d.node);
  bool include_pad = !is_max && d.count_include_pad;
  // PyTorch's ceil_mode windows hang past the declared padding; oneDNN takes an explicit
  // bottom/right padding that makes it produce the output size inference gave.
  int64_t pad_end[2];
  bool extra_end_pad = false;
  for (size_t i = 0; i < 2; ++i) {
    int64_t extent = dl[i] * (k[i] - 1) + 1, in = xd[2 + i], out = yd[2 + i];
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
  memory::desc want_dst = d.allow_blocked ? any_md(yd, dt) : plain_md(yd, dt);
  auto pd = try_pd<dnnl::pooling_v2_forward::primitive_desc>([&] {
    dnnl::pooling_v2_forward::desc desc(
        dnnl::prop_kind::forward_inference, alg, x_md, want_dst, {s[0], s[1]}, {k[0], k[1]},
        {dl[0] - 1, dl[1] - 1}, {pad[0], pad[1]}, {pad_end[0], pad_end[1]});
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
  std::string reorders = reorder_into_output(b, dst_mem, user_out);
  b.finish();
  const char* alg_name = is_max ? "max"
                         : alg == dnnl::algorithm::pooling_avg_include_padding ? "avg_include_pad"
                                                                               : "avg_exclude_pad";
  p.description = fmt::format("{} {}x{}/{}x{} {} {} {} src {} -> dst {}{}", d.op,
                              k[0], k[1], s[0], s[1], alg_name, dt_name(dt), pd->impl_info_str(),
                              format_name(x_md, "nchw"), format_name(dst_md, "nchw"), reorders);
  p.lowered = true;
}

// ---- concat --------------------------------------------------------------------------------------
// Note [oneDNN concat]
// A concat of convolution outputs along the channels (Inception blocks, SqueezeNet's fire
// modules, DenseNet) computed in Kiln's plain NCHW made every producing convolution reorder its
// nhwc result to nchw, and every consuming convolution reorder the concatenation back: three
// activation passes per block around one copy (googlenet: 44 ms of reorders against 153 ms of
// convolutions over the same calls, issue #17). As a oneDNN concat, the parts are read in the
// layouts their producers computed in and the result is written in the layout oneDNN derives
// from them (format_tag::any: the parts' own layout where they agree), which the consumers then
// read as given (Note [layout choice] in targets/cpu/onednn_lowering.cc). A plain result (a
// graph output, a loop kernel's input) gets the usual reorder after the primitive. Bitwise a
// copy either way. Parts that disagree (a Winograd convolution's nChw16c beside a 1x1's nhwc)
// are reordered into one layout first, and whole channel blocks are Kiln's own copies (Note
// [blocked concat copies]): oneDNN 2.6 has only slow kernels for both.
void Builder::build_concat(Plan& p) {
  const OnednnOperand& y = d.output;
  DT dt = this->dt();
  memory::dims yd = y.dims;
  const int r = int(yd.size());
  KILN_CHECK(r >= 1 && d.concat_dim >= 0 && d.concat_dim < r && !d.inputs.empty(),
             "oneDNN node '{}': malformed concat (dim {} of a rank-{} output, {} inputs)", d.node,
             d.concat_dim, r, d.inputs.size());
  std::vector<memory::desc> srcs;
  int64_t total = 0;
  for (const OnednnOperand& x : d.inputs) {
    KILN_CHECK(int(x.dims.size()) == r, "oneDNN node '{}': a concat input of rank {}, the output "
               "has rank {}", d.node, x.dims.size(), r);
    for (int k = 0; k < r; ++k)
      KILN_CHECK(k == d.concat_dim || x.dims[size_t(k)] == yd[size_t(k)],
                 "oneDNN node '{}': concat input dims [{}] do not match the output [{}]", d.node,
                 fmt::join(x.dims, ","), fmt::join(yd, ","));
    total += x.dims[size_t(d.concat_dim)];
    srcs.push_back(value_md(x, x.dims));
  }
  KILN_CHECK(total == yd[size_t(d.concat_dim)], "oneDNN node '{}': concat inputs sum to {} along "
             "dim {}, the output has {}", d.node, total, d.concat_dim, yd[size_t(d.concat_dim)]);
  memory::desc want_dst = d.allow_blocked && d.output_may_block ? any_md(yd, dt) : plain_md(yd, dt);
  auto pd = try_pd<dnnl::concat::primitive_desc>([&] {
    return dnnl::concat::primitive_desc(want_dst, int(d.concat_dim), srcs, cpu_engine(),
                                        user_scratchpad_attr());
  });
  if (!pd) {
    p.why_not = fmt::format("oneDNN has no concat implementation for this case ({})", dt_name(dt));
    return;
  }
  // Parts in different layouts (an nhwc part beside an nChw16c one, where a Winograd
  // convolution produced one of them: Note [measured Winograd]) get oneDNN's reference concat,
  // an element at a time (squeezenet1_1's first fire: 0.63 ms, 19x its floor). The odd parts
  // are reordered first into one layout, nhwc where a part is nhwc and the result may be
  // (oneDNN 2.6's jit concat copies nhwc parts at 2.4x the floor, nChw16c ones at 18x), else
  // the result's; taken when oneDNN then has a jit concat.
  std::vector<memory::desc> parts = srcs;
  std::vector<Tag> tags;
  for (const memory::desc& md : srcs)
    if (std::optional<Tag> t = activation_tag(md, md.dims(), dt))
      if (std::find(tags.begin(), tags.end(), *t) == tags.end()) tags.push_back(*t);
  if (tags.size() > 1 && is_reference(pd->impl_info_str())) {
    std::vector<std::pair<Tag, memory::desc>> targets;
    if (std::find(tags.begin(), tags.end(), Tag::nhwc) != tags.end() && d.allow_blocked &&
        d.output_may_block)
      targets.push_back({Tag::nhwc, memory::desc(yd, dt, Tag::nhwc)});
    if (std::optional<Tag> t = activation_tag(pd->dst_desc(), yd, dt))
      targets.push_back({*t, pd->dst_desc()});
    for (const std::pair<Tag, memory::desc>& target : targets) {
      const memory::desc& dst = target.second;  // (not a structured binding: clang 14's lambdas)
      std::vector<memory::desc> same;
      for (const memory::desc& md : srcs) same.push_back(memory::desc(md.dims(), dt, target.first));
      auto uniform = try_pd<dnnl::concat::primitive_desc>([&] {
        return dnnl::concat::primitive_desc(dst, int(d.concat_dim), same, cpu_engine(),
                                            user_scratchpad_attr());
      });
      if (uniform && !is_reference(uniform->impl_info_str())) {
        pd = std::move(uniform);
        parts = std::move(same);
        break;
      }
    }
  }
  // Note [blocked concat copies]
  // oneDNN 2.6's concat of nChw16c parts ("simple:any") takes 18x the time its bytes need at
  // the copy bandwidth (googlenet's inception concats, 8% of the model: `kiln profile`), where
  // its nhwc concat takes 2.4x. With one image, a part whose channels are whole blocks is one
  // contiguous run of the result ([C/16][H][W][16]), so the concat is a memcpy per part per
  // image; Kiln does those itself (PlanBuilder::copy_blocks, shared by the threads in 64 KiB
  // pieces) where every part and the result are in the same blocked layout, along the
  // channels, and every part's channels are a multiple of the block.
  std::optional<Tag> block_tag;
  if (d.concat_dim == 1 && r == 4)
    if (std::optional<Tag> t = activation_tag(pd->dst_desc(), yd, dt);
        t && (*t == Tag::nChw16c || *t == Tag::nChw8c)) {
      const int64_t blk = *t == Tag::nChw16c ? 16 : 8;
      bool whole = true;
      for (const memory::desc& md : parts)
        whole = whole && activation_tag(md, md.dims(), dt) == t && md.dims()[1] % blk == 0;
      if (whole) block_tag = t;
    }
  PlanBuilder b(p);
  memory::desc dst_md = pd->dst_desc();
  std::vector<memory> src_mems;
  std::string part_reorders;
  for (size_t i = 0; i < d.inputs.size(); ++i) {
    memory m = activation(b, p, int32_t(i), d.inputs[i], srcs[i]);
    if (!same_layout(srcs[i], parts[i])) {
      memory tmp = b.temp(parts[i]);
      b.reorder(m, tmp);
      part_reorders += fmt::format(" src {} {}->{}", i, format_name(srcs[i], "nchw"),
                                   format_name(parts[i], "nchw"));
      m = tmp;
    }
    src_mems.push_back(m);
  }
  memory user_out;
  memory dst_mem = bind_dst(b, y, dst_md, &user_out);
  std::string implementation = pd->impl_info_str();
  if (block_tag) {
    const int64_t elt = dt == DT::bf16 ? 2 : 4, hw = yd[2] * yd[3];
    const int64_t dst_stride = yd[1] * hw * elt;  // whole blocks: no channel padding
    std::vector<BlockCopy> copies;
    int64_t c0 = 0;
    for (const memory::desc& md : parts) {
      const int64_t c = md.dims()[1];
      copies.push_back({c * hw * elt, c0 * hw * elt, c * hw * elt, dst_stride, yd[0]});
      c0 += c;
    }
    b.copy_blocks(src_mems, dst_mem, std::move(copies));
    implementation = "kiln block copy";
  } else {
    std::vector<std::pair<int, memory>> args;
    for (size_t i = 0; i < src_mems.size(); ++i)
      args.emplace_back(DNNL_ARG_MULTIPLE_SRC + int(i), src_mems[i]);
    args.emplace_back(DNNL_ARG_DST, dst_mem);
    b.step(dnnl::concat(*pd), pd->scratchpad_desc(), args);
  }
  std::string reorders = reorder_into_output(b, dst_mem, user_out, part_reorders);
  b.finish();
  std::vector<std::string> src_names;
  for (const memory::desc& md : srcs) src_names.push_back(format_name(md, "nchw"));
  p.description = fmt::format("concat dim {} of {} {} {} src {} -> dst {}{}", d.concat_dim,
                              srcs.size(), dt_name(dt), implementation,
                              fmt::join(src_names, ","), format_name(dst_md, "nchw"), reorders);
  p.implementation = implementation;
  p.lowered = true;
}

// ---- linear -----------------------------------------------------------------------------------
namespace {
// Note [linear choice]. Auto here is a record's from before the choice was recorded.
bool use_matmul_for_linear(OnednnLinearImpl pref, int64_t k) {
  if (pref != OnednnLinearImpl::Auto) return pref == OnednnLinearImpl::Matmul;
  return k >= 2048;
}
}  // namespace


void Builder::build_linear(Plan& p) {
  Epilogue epi = read_epilogue(d);
  const OnednnOperand &x = d.inputs.at(0), &w = d.inputs.at(1), &bias = input_or_none(d, 2);
  const OnednnOperand& residual = epi.has_residual ? d.inputs.at(3) : kAbsent;
  bool has_bias = bias.value >= 0, has_residual = residual.value >= 0;
  DT dt = this->dt();
  memory::dims wt = w.dims;  // [N, K]
  KILN_CHECK(wt.size() == 2 && !x.dims.empty(), "oneDNN node '{}': malformed linear", d.node);
  int64_t nn = wt[0], kk = wt[1];
  int64_t mm = 1;
  for (size_t i = 0; i + 1 < x.dims.size(); ++i) mm *= x.dims[i];
  bool matmul = use_matmul_for_linear(d.linear, kk);
  dnnl::primitive_attr attr = make_attr(epi);
  memory::desc src = plain_md({mm, kk}, dt), dst = plain_md({mm, nn}, dt);
  memory::desc w_user = matmul ? memory::desc({kk, nn}, dt, memory::dims{1, kk})
                               : plain_md({nn, kk}, dt);
  memory::desc want_w = any_md(w_user.dims(), dt);
  std::vector<memory::desc> bias_choices;
  memory::dims bd = matmul ? memory::dims{1, nn} : memory::dims{nn};
  if (!has_bias)
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
  if (has_residual) {
    memory r_mem = activation(b, p, 3, residual, dst);
    p.residual_input = 3;
    p.residual_alias =
        is_constant(residual) ? Plan::Alias::Unsafe : Plan::Alias::SkipCopy;
    b.reorder(r_mem, y_mem, /*residual_copy=*/true);
  }
  memory w_mem = weights(b, p, w, w_user, w_md);
  dnnl::primitive prim(*pd);
  if (has_bias) {
    memory b_mem = bias_memory(b, constant(bias), bias_md);
    b.step(prim, pd->scratchpad_desc(), {{DNNL_ARG_SRC, x_mem}, {DNNL_ARG_WEIGHTS, w_mem},
                                         {DNNL_ARG_BIAS, b_mem}, {DNNL_ARG_DST, y_mem}});
  } else {
    b.step(prim, pd->scratchpad_desc(),
           {{DNNL_ARG_SRC, x_mem}, {DNNL_ARG_WEIGHTS, w_mem}, {DNNL_ARG_DST, y_mem}});
  }
  b.finish();
  p.description = fmt::format("{} {} {}x{}->{} {} {} weights {}{}", d.op,
                              matmul ? "matmul" : "inner_product", mm, kk, nn, dt_name(dt),
                              pd->impl_info_str(), format_name(w_md, ""), epilogue_str(epi));
  p.lowered = true;
}

// ---- matmul -----------------------------------------------------------------------------------
void Builder::build_matmul(Plan& p) {
  const OnednnOperand &a = d.inputs.at(0), &bv = d.inputs.at(1);
  DT dt = this->dt();
  // NumPy semantics as oneDNN dims: 1-D a -> [1, K], 1-D b -> [K, 1]; ranks padded with 1s.
  memory::dims ad = a.dims, bd = bv.dims;
  KILN_CHECK(!ad.empty() && !bd.empty(), "oneDNN node '{}': malformed matmul", d.node);
  if (ad.size() == 1) ad.insert(ad.begin(), 1);
  if (bd.size() == 1) bd.push_back(1);
  size_t r = std::max(ad.size(), bd.size());
  while (ad.size() < r) ad.insert(ad.begin(), 1);
  while (bd.size() < r) bd.insert(bd.begin(), 1);
  // Note [matmul batch folded into rows]: where b has no batch (every batch dim 1: a weight
  // [K, N] shared by every batch of a, as in x @ W over [L, B, E] or [B, S, E]) and a is read
  // plain, the batch is folded into a's rows: [B..., M, K] x [K, N] is one [B*M, K] x [K, N]
  // product over the same bytes (a and y are contiguous, so row m of batch i is row i*M + m).
  // oneDNN would otherwise run B products of M rows each, reading all of b once per batch
  // (torch's MultiheadAttention in-projection of a [50, 1, 768] sequence: 50 GEMVs over a
  // 7 MiB weight, 4 ms instead of 1), and it prepacks a constant b only for a 2-D product
  // (the 3-D one kept "weights abc").
  std::vector<int64_t> b_strides = d.matmul_strides[1];
  bool fold = r > 2 && d.matmul_strides[0].empty();
  for (size_t i = 0; fold && i + 2 < r; ++i) fold = bd[i] == 1;
  if (fold) {
    int64_t rows = 1;
    for (size_t i = 0; i + 1 < r; ++i) rows *= ad[i];
    ad = {rows, ad[r - 1]};
    bd = {bd[r - 2], bd[r - 1]};
    if (b_strides.size() > 2) b_strides.erase(b_strides.begin(), b_strides.end() - 2);
    r = 2;
  }
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
  for (int input = 0; input < 2; ++input) {
    const std::vector<int64_t>& so = input == 0 ? d.matmul_strides[0] : b_strides;
    if (so.empty() || is_constant(input == 0 ? a : bv)) continue;
    const memory::dims& dd = input == 0 ? ad : bd;
    memory::dims st(so.begin(), so.end());
    if (st.size() > dd.size()) continue;
    int64_t span = 1;
    for (size_t i = 0; i < st.size(); ++i) span = std::max(span, st[i] * dd[dd.size() - st.size() + i]);
    while (st.size() < dd.size()) st.insert(st.begin(), span);
    user_md[input] = memory::desc(dd, dt, st);
    strided[input] = true;
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
  memory b_mem = b_const ? weights(b, p, bv, b_md, pd->weights_desc())
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


}  // namespace

OnednnLinearImpl choose_linear_impl(OnednnLinearImpl pref, int64_t m, int64_t k) {
  if (pref != OnednnLinearImpl::Auto) return pref;
  return k >= 2048 || (m >= 64 && k >= 128) ? OnednnLinearImpl::Matmul
                                             : OnednnLinearImpl::InnerProduct;
}

// ---- the node ---------------------------------------------------------------------------------
OnednnNode::OnednnNode() : plan_(std::make_unique<Plan>()) {}
OnednnNode::~OnednnNode() = default;

std::shared_ptr<OnednnNode> OnednnNode::build(const OnednnNodeDesc& desc, OnednnLayouts& layouts,
                                              const ConstantSource& constants,
                                              const PrepackedSource& prepacked) {
  std::shared_ptr<OnednnNode> node(new OnednnNode());
  Plan& p = *node->plan_;
  p.requested = true;
  p.threads = cpu_threads();
  Builder b{desc, layouts.impl(), constants, &prepacked};
  b.build(p);
  if (!p.lowered) {
    p.description = fmt::format("{} not lowered: {}", desc.op, p.why_not);
    return node;
  }
  // The plan's own memory objects, as an instance (not owned twice: weak handles).
  auto own = std::make_shared<Instance>();
  for (const Binding& bd : p.bindings) own->memories.emplace_back(bd.mem, /*weak=*/true);
  for (const Step& st : p.steps) own->args.push_back(st.args);
  p.own = std::move(own);
  return node;
}

bool OnednnNode::lowered() const { return plan_->lowered; }
const std::string& OnednnNode::why_not() const { return plan_->why_not; }
const std::string& OnednnNode::description() const { return plan_->description; }
const std::string& OnednnNode::implementation() const { return plan_->implementation; }
size_t OnednnNode::steps() const { return plan_->steps.size(); }
int64_t OnednnNode::scratch_bytes() const { return plan_->scratch_bytes; }
std::vector<PrepackedWeights> OnednnNode::prepacked() const {
  std::vector<PrepackedWeights> out;
  for (const Plan::Packed& k : plan_->prepacked)
    out.push_back({k.constant, k.layout, k.mem.get_data_handle(), k.mem.get_desc().get_size()});
  return out;
}
bool OnednnNode::residual_may_alias_output() const {
  return plan_->lowered && plan_->residual_input >= 0 &&
         plan_->residual_alias != Plan::Alias::Unsafe;
}

std::shared_ptr<OnednnNode::Instance> OnednnNode::instance() const {
  const Plan& p = *plan_;
  if (!p.lowered) [[unlikely]]
    fail_kind(ErrorKind::Internal, "oneDNN node: instance() of a node that is not lowered ({})",
              p.description);
  auto inst = std::make_shared<Instance>();
  inst->memories.reserve(p.bindings.size());
  for (const Binding& b : p.bindings) {
    const dnnl_memory_desc_t* md = nullptr;
    dnnl_status_t st = dnnl_memory_get_memory_desc(b.mem, &md);
    if (st != dnnl_success || !md)
      fail_kind(ErrorKind::Runtime, "oneDNN node: reading a memory descriptor of {} failed "
                "(status {})", p.description, int(st));
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

void OnednnNode::run(const void* const* inputs, void* output, void* scratch) const {
  if (!plan_->lowered) [[unlikely]]
    fail_kind(ErrorKind::Internal, "oneDNN node: run() on a node that is not lowered ({})",
              plan_->description);
  run(*plan_->own, inputs, output, scratch);
}

namespace {
// Note [blocked concat copies]: every part's chunks, split into pieces of at most kPiece bytes
// that the threads share (a part of googlenet's is 0.8 MB).
void run_block_copies(const std::vector<BlockCopy>& copies,
                      const std::vector<dnnl_exec_arg_t>& args) {
  constexpr int64_t kPiece = 64 * 1024;
  void* dst_handle = nullptr;
  dnnl_memory_get_data_handle(args.back().memory, &dst_handle);
  char* dst = static_cast<char*>(dst_handle);
  int64_t pieces = 0;
  for (const BlockCopy& c : copies) pieces += c.count * ((c.bytes + kPiece - 1) / kPiece);
  parallel_for(pieces, pieces > 16, [&](int64_t q) {
    int64_t rest = q;
    for (size_t i = 0; i < copies.size(); ++i) {
      const BlockCopy& c = copies[i];
      const int64_t per = (c.bytes + kPiece - 1) / kPiece, here = c.count * per;
      if (rest >= here) {
        rest -= here;
        continue;
      }
      const int64_t k = rest / per, at = rest % per * kPiece;
      void* src = nullptr;
      dnnl_memory_get_data_handle(args[i].memory, &src);
      std::memcpy(dst + c.dst_offset + k * c.dst_stride + at,
                  static_cast<const char*>(src) + k * c.src_stride + at,
                  size_t(std::min(kPiece, c.bytes - at)));
      break;
    }
  });
}
}  // namespace

void OnednnNode::run(Instance& inst, const void* const* inputs, void* output,
                     void* scratch) const {
  const Plan& p = *plan_;
  if (!p.lowered) [[unlikely]]
    fail_kind(ErrorKind::Internal, "oneDNN node: run() on a node that is not lowered ({})",
              p.description);
  dnnl_stream_t strm = cpu_stream().get();
  char* scratch_base = static_cast<char*>(scratch);
  bool residual_in_output = p.residual_input >= 0 && inputs[p.residual_input] == output;
  bool skip_residual_copy = residual_in_output && p.residual_alias == Plan::Alias::SkipCopy;
  if (residual_in_output && p.residual_alias == Plan::Alias::Unsafe) [[unlikely]]
    fail_kind(ErrorKind::InvalidArgument,
              "oneDNN node: {} got its residual in the output buffer, but they differ in layout; "
              "give the output its own buffer",
              p.description);
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
      fail_kind(ErrorKind::Runtime, "oneDNN node: binding a buffer of {} failed (status {})",
                p.description, int(st));
  }
  // Note [oneDNN thread count]
  // A primitive's scratchpad has per-thread parts sized for the thread count at its creation;
  // run with more threads, the extra threads would index past it. Both happen: a graph compiled
  // (or a package written) under `threads=1` and called with the default, a package loaded into
  // a process with more threads. So a call with more threads runs the node's steps with the
  // creation count (an ICV store, no allocation). A call with fewer threads does not make the
  // primitives use fewer: brgconv forks its creation count regardless, which is why a package's
  // loader builds its nodes for the loading thread's count (Note [oneDNN threads at load] in
  // runtime/launch_library.cc).
  const int caller_threads = omp_get_max_threads();
  const bool capped = caller_threads > p.threads;
  if (capped) [[unlikely]] omp_set_num_threads(p.threads);
  struct Restore {
    int threads;
    ~Restore() {
      if (threads > 0) omp_set_num_threads(threads);
    }
  } restore{capped ? caller_threads : 0};
  for (size_t k = 0; k < p.steps.size(); ++k) {
    const Step& s = p.steps[k];
    if (s.residual_copy && skip_residual_copy) continue;
    const std::vector<dnnl_exec_arg_t>& args = inst.args[k];
    if (!s.copies.empty()) {
      run_block_copies(s.copies, args);
      continue;
    }
    if (s.kiln) {
      void* h[4] = {nullptr, nullptr, nullptr, nullptr};
      for (size_t i = 0; i < args.size() && i < 4; ++i) dnnl_memory_get_data_handle(args[i].memory, &h[i]);
      s.kiln->run(static_cast<const float*>(h[0]), static_cast<const float*>(h[3]),
                  static_cast<float*>(h[1]), h[2]);
      continue;
    }
    dnnl_status_t st = dnnl_primitive_execute(s.prim.get(), strm, int(args.size()), args.data());
    if (st != dnnl_success) [[unlikely]]
      fail_kind(ErrorKind::Runtime, "oneDNN node: executing {} failed (status {})", p.description,
                int(st));
  }
  dnnl_stream_wait(strm);
}

// ---- roofline ---------------------------------------------------------------------------------
namespace {
int64_t clock_ns(clockid_t clock) {
  timespec ts;
  clock_gettime(clock, &ts);
  return int64_t(ts.tv_sec) * 1000000000 + ts.tv_nsec;
}
}  // namespace

CallTimer::CallTimer()
    : wall_ns_(clock_ns(CLOCK_MONOTONIC)),
      cpu_ns_(clock_ns(CLOCK_THREAD_CPUTIME_ID)),
      one_thread_(omp_get_max_threads() == 1) {}

double CallTimer::elapsed_ms() const {
  int64_t ns = clock_ns(CLOCK_MONOTONIC) - wall_ns_;
  if (one_thread_) ns = std::min(ns, clock_ns(CLOCK_THREAD_CPUTIME_ID) - cpu_ns_);
  return double(ns) * 1e-6;
}

namespace {
template <typename F>
double best_ms(int runs, F&& f) {
  double best = 1e300;
  for (int i = 0; i < runs; ++i) {
    CallTimer t;
    f();
    best = std::min(best, t.elapsed_ms());
  }
  return best;
}

}  // namespace

CpuRoofline measure_cpu_roofline(bool bf16) try {
  CpuRoofline r;
  // A 384^3 matmul: brgemm at the ISA's best on one core (113 MFLOP, ~0.4 ms f32), large
  // enough that its fixed costs vanish and small enough to sit in L2.
  const memory::dim n = 384;
  DT dt = bf16 ? DT::bf16 : DT::f32;
  memory::desc md({n, n}, dt, Tag::ab);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(md, md, md), cpu_engine());
  memory a(md, cpu_engine()), b(md, cpu_engine()), c(md, cpu_engine());
  for (memory* m : {&a, &b, &c}) std::memset(m->get_data_handle(), 0, md.get_size());
  dnnl::matmul mm(pd);
  dnnl::stream& s = cpu_stream();
  auto run = [&] {
    mm.execute(s, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
    s.wait();
  };
  run();
  r.flops_per_ms = 2.0 * double(n * n * n) / best_ms(5, run);
  // A 4 MiB copy: past L2 (1-2 MiB), the size of the larger activations at batch 1, so the
  // bandwidth of the next cache level, a generous floor for activations that mostly live in L2
  // (one thread's copy). A copy past the last level took 60-100 ms of page faults to set up.
  const size_t bytes = size_t(4) << 20;
  std::vector<char> from(bytes, 1), to(bytes, 0);
  auto copy = [&] { std::memcpy(to.data(), from.data(), bytes); };
  copy();
  r.bytes_per_ms = 2.0 * double(bytes) / best_ms(10, copy);
  return r;
} catch (const dnnl::error&) {
  return CpuRoofline{};  // no such matmul here (bf16 on an older CPU): unknown
}

bool convolutions_prefer_nhwc(bool bf16) {
  // A ResNet-like 3x3 64->64 convolution at 28x28 with every layout left to oneDNN: the layout
  // it computes in is the one this CPU's fast convolutions want.
  auto probe = [](DT dt) {
    std::optional<dnnl::convolution_forward::primitive_desc> pd =
        try_pd<dnnl::convolution_forward::primitive_desc>([&] {
          dnnl::convolution_forward::desc d(
              dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
              any_md({1, 64, 28, 28}, dt), any_md({64, 64, 3, 3}, dt), memory::desc(),
              any_md({1, 64, 28, 28}, dt), {1, 1}, {0, 0}, {1, 1}, {1, 1});
          return dnnl::convolution_forward::primitive_desc(d, cpu_engine());
        });
    if (!pd || is_reference(pd->impl_info_str())) return false;
    return same_layout(pd->src_desc(), memory::desc({1, 64, 28, 28}, dt, Tag::nhwc)) &&
           same_layout(pd->dst_desc(), memory::desc({1, 64, 28, 28}, dt, Tag::nhwc));
  };
  static const bool f32 = probe(DT::f32);
  static const bool b16 = probe(DT::bf16);
  return bf16 ? b16 : f32;
}

const CpuRoofline& cpu_roofline(bool bf16) {
  static std::mutex mu;
  static std::map<std::pair<bool, int>, CpuRoofline> measured;
  std::lock_guard<std::mutex> lock(mu);
  auto key = std::make_pair(bf16, omp_get_max_threads());
  auto it = measured.find(key);
  if (it == measured.end()) it = measured.emplace(key, measure_cpu_roofline(bf16)).first;
  return it->second;
}

// ---- JSON -------------------------------------------------------------------------------------
// Floats travel as their bit patterns: exact, and infinities survive.
namespace {
using json = nlohmann::json;

json operand_json(const OnednnOperand& o) {
  json j = {{"value", o.value}, {"dims", o.dims}};
  if (!o.constant.empty()) j["constant"] = o.constant;
  if (o.channels_last) j["channels_last"] = true;
  return j;
}

OnednnOperand operand_from(const json& j) {
  OnednnOperand o;
  o.value = j.at("value").get<int32_t>();
  o.dims = j.at("dims").get<std::vector<int64_t>>();
  for (int64_t d : o.dims)
    if (d < 0 || d > (int64_t(1) << 40)) throw std::out_of_range("dimension out of range");
  if (j.contains("constant")) o.constant = j.at("constant").get<std::string>();
  if (j.contains("channels_last")) {
    o.channels_last = j.at("channels_last").get<bool>();
    if (o.channels_last && (o.dims.size() != 4 || !o.constant.empty()))
      throw std::out_of_range("channels_last on an operand that is not a 4-D activation");
  }
  return o;
}

std::array<int64_t, 2> pair_of(const json& j) {
  auto v = j.get<std::vector<int64_t>>();
  if (v.size() != 2) throw std::out_of_range("expected 2 integers");
  return {v[0], v[1]};
}
}  // namespace

std::string OnednnNodeDesc::to_json() const {
  json j;
  j["op"] = op;
  j["node"] = node;
  j["dtype"] = bf16 ? "bfloat16" : "float32";
  json ins = json::array();
  for (const OnednnOperand& o : inputs) ins.push_back(operand_json(o));
  j["inputs"] = ins;
  j["output"] = operand_json(output);
  j["output_may_block"] = output_may_block;
  j["stride"] = {stride[0], stride[1]};
  j["pad_begin"] = {pad_begin[0], pad_begin[1]};
  j["pad_end"] = {pad_end[0], pad_end[1]};
  j["dilation"] = {dilation[0], dilation[1]};
  j["groups"] = groups;
  j["kernel_size"] = kernel_size;
  j["pool_stride"] = pool_stride;
  j["pool_padding"] = pool_padding;
  j["pool_dilation"] = pool_dilation;
  j["count_include_pad"] = count_include_pad;
  j["activation"] = activation;
  j["clamp_bits"] = {std::bit_cast<uint32_t>(clamp_lo), std::bit_cast<uint32_t>(clamp_hi)};
  j["sum_scale_bits"] = std::bit_cast<uint32_t>(sum_scale);
  j["has_residual"] = has_residual;
  j["allow_blocked"] = allow_blocked;
  j["conv"] = int(conv);
  j["linear"] = int(linear);
  j["matmul_strides"] = {matmul_strides[0], matmul_strides[1]};
  if (!conv_layout.empty()) j["conv_layout"] = conv_layout;
  if (op == "concat") j["concat_dim"] = concat_dim;
  return j.dump();
}

OnednnNodeDesc OnednnNodeDesc::from_json(std::string_view text, const std::string& where) {
  try {
    json j = parse_untrusted_json(text);
    OnednnNodeDesc d;
    d.op = j.at("op").get<std::string>();
    d.node = j.at("node").get<std::string>();
    std::string dt = j.at("dtype").get<std::string>();
    if (dt != "float32" && dt != "bfloat16") throw std::out_of_range("dtype " + dt);
    d.bf16 = dt == "bfloat16";
    for (const json& o : j.at("inputs")) d.inputs.push_back(operand_from(o));
    d.output = operand_from(j.at("output"));
    d.output_may_block = j.at("output_may_block").get<bool>();
    auto st = pair_of(j.at("stride")), pb = pair_of(j.at("pad_begin")),
         pe = pair_of(j.at("pad_end")), dl = pair_of(j.at("dilation"));
    for (int i = 0; i < 2; ++i) {
      d.stride[i] = st[size_t(i)];
      d.pad_begin[i] = pb[size_t(i)];
      d.pad_end[i] = pe[size_t(i)];
      d.dilation[i] = dl[size_t(i)];
    }
    d.groups = j.at("groups").get<int64_t>();
    d.kernel_size = j.at("kernel_size").get<std::vector<int64_t>>();
    d.pool_stride = j.at("pool_stride").get<std::vector<int64_t>>();
    d.pool_padding = j.at("pool_padding").get<std::vector<int64_t>>();
    d.pool_dilation = j.at("pool_dilation").get<std::vector<int64_t>>();
    d.count_include_pad = j.at("count_include_pad").get<bool>();
    d.activation = j.at("activation").get<std::string>();
    auto cb = j.at("clamp_bits").get<std::vector<uint32_t>>();
    if (cb.size() != 2) throw std::out_of_range("clamp_bits");
    d.clamp_lo = std::bit_cast<float>(cb[0]);
    d.clamp_hi = std::bit_cast<float>(cb[1]);
    d.sum_scale = std::bit_cast<float>(j.at("sum_scale_bits").get<uint32_t>());
    d.has_residual = j.at("has_residual").get<bool>();
    d.allow_blocked = j.at("allow_blocked").get<bool>();
    int conv = j.at("conv").get<int>(), linear = j.at("linear").get<int>();
    if (conv < 0 || conv > 2 || linear < 0 || linear > 2) throw std::out_of_range("policy");
    d.conv = OnednnConvPolicy(conv);
    d.linear = OnednnLinearImpl(linear);
    auto ms = j.at("matmul_strides").get<std::vector<std::vector<int64_t>>>();
    if (ms.size() != 2) throw std::out_of_range("matmul_strides");
    d.matmul_strides[0] = ms[0];
    d.matmul_strides[1] = ms[1];
    if (j.contains("conv_layout")) {
      d.conv_layout = j.at("conv_layout").get<std::string>();
      if (d.conv_layout != "nchw" && d.conv_layout != "nhwc" && d.conv_layout != "blocked" &&
          d.conv_layout != kKilnDirectLayout)
        throw std::out_of_range("conv_layout " + d.conv_layout);
    }
    if (d.op == "concat") {
      d.concat_dim = j.at("concat_dim").get<int64_t>();
      if (d.concat_dim < 0 || d.concat_dim >= int64_t(d.output.dims.size()))
        throw std::out_of_range("concat_dim");
      if (d.inputs.empty() || d.inputs.size() > kMaxConcatInputs)
        throw std::out_of_range("operand count");
      return d;
    }
    bool two_in = d.op == "matmul" || d.op.find("conv") != std::string::npos ||
                  d.op.find("linear") != std::string::npos;
    if (d.inputs.size() < (two_in ? 2u : 1u) || d.inputs.size() > 4)
      throw std::out_of_range("operand count");
    return d;
  } catch (const kiln::Error&) {
    throw;
  } catch (const std::exception& e) {
    fail_kind(ErrorKind::ParseError, "{}: malformed oneDNN node descriptor: {}", where, e.what());
  }
}

std::string kiln_direct_conv_why_not(const OnednnNodeDesc& d) {
  GroupedConvShape s;
  GroupedConvEpilogue e;
  return kiln_conv_shape(d, &s, &e);
}

bool is_reference(std::string_view implementation) { return implementation.rfind("ref", 0) == 0; }

// Note [measured Winograd] in targets/cpu/onednn_lowering.cc.
double winograd_disagreement(const OnednnNodeDesc& d, const ConstantSource& constants) {
  return winograd_trial(d, constants).disagreement;
}

WinogradTrial winograd_trial(const OnednnNodeDesc& d, const ConstantSource& constants) {
  WinogradTrial trial;
  OnednnNodeDesc direct = d, winograd = d;
  direct.conv = OnednnConvPolicy::Auto;
  direct.conv_layout.clear();
  winograd.conv = OnednnConvPolicy::Winograd;
  winograd.conv_layout = "blocked";
  direct.output_may_block = winograd.output_may_block = false;
  int32_t values = d.output.value;
  for (const OnednnOperand& o : d.inputs) values = std::max(values, o.value);
  OnednnLayouts plain;
  plain.reset(size_t(values + 1));
  ScopedCpuThreads one_thread(1);
  std::shared_ptr<OnednnNode> a = OnednnNode::build(direct, plain, constants);
  std::shared_ptr<OnednnNode> b = OnednnNode::build(winograd, plain, constants);
  if (!a->lowered() || !b->lowered() || b->implementation().find("wino") == std::string::npos)
    return trial;
  trial.direct = a;
  trial.winograd = b;
  // Activations (and the residual) uniform in [-1, 1) from a fixed seed.
  Generator gen(0x5eed);
  auto uniform = [&gen](const std::vector<int64_t>& dims) {
    return Tensor::rand(Dims(dims.begin(), dims.end()), gen, -1.0, 1.0);
  };
  const Tensor x = uniform(d.inputs.at(0).dims);
  Tensor residual, ya = Tensor::empty(Dims(d.output.dims.begin(), d.output.dims.end()));
  Tensor yb = Tensor::empty(ya.sizes());
  const void* in[4] = {x.raw_data(), nullptr, nullptr, nullptr};
  if (d.has_residual && d.inputs.size() > 3 && d.inputs[3].value >= 0) {
    residual = uniform(d.output.dims);
    in[3] = residual.raw_data();
  }
  const int64_t scratch = std::max(a->scratch_bytes(), b->scratch_bytes());
  std::unique_ptr<char[]> pad(new char[size_t(scratch + 64)]);
  char* aligned = pad.get() + (64 - reinterpret_cast<uintptr_t>(pad.get()) % 64) % 64;
  a->run(in, ya.raw_data(), aligned);
  b->run(in, yb.raw_data(), aligned);
  const float *pa = ya.data<float>(), *pb = yb.data<float>();
  double diff = 0, ref = 0;
  for (int64_t i = 0, n = ya.numel(); i < n; ++i) {
    double e = std::fabs(double(pa[i]) - double(pb[i])), r = std::fabs(double(pa[i]));
    if (!(e <= DBL_MAX) || !(r <= DBL_MAX)) {  // NaN or infinity in either
      trial.disagreement = HUGE_VAL;
      return trial;
    }
    diff = std::max(diff, e);
    ref = std::max(ref, r);
  }
  trial.disagreement = ref > 0 ? diff / ref : diff == 0 ? 0 : HUGE_VAL;
  return trial;
}

}  // namespace kiln::kernels
