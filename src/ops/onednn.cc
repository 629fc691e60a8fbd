// oneDNN eager kernels. See Note [oneDNN eager kernels] in onednn.h.
#include "ops/onednn.h"

#include <atomic>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include <fmt/format.h>
#include <oneapi/dnnl/dnnl.hpp>

#include "core/allocator.h"

namespace kiln::onednn {
namespace {

using dnnl::memory;
using Tag = memory::format_tag;
using DT = memory::data_type;

dnnl::engine& cpu_engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// CPU streams are cheap; one per thread keeps concurrent eager calls independent.
dnnl::stream& cpu_stream() {
  thread_local dnnl::stream s(cpu_engine());
  return s;
}

bool dnnl_dtype(DType d, DT* out) {
  switch (d) {
    case DType::Float32: *out = DT::f32; return true;
    case DType::BFloat16:
      if (!supports_dtype(d)) return false;
      *out = DT::bf16;
      return true;
    default: return false;
  }
}

// Memory descriptor of a tensor with its own strides. Size-1 dims get the outermost stride (any
// value is legal there, but oneDNN's plain-layout checks are happiest with a dense-looking one).
memory::desc md_of(const Dims& sizes, const Dims& strides, DT type) {
  memory::dims d(sizes.begin(), sizes.end()), s(strides.begin(), strides.end());
  int64_t outer = 1;
  for (size_t i = 0; i < sizes.size(); ++i)
    if (sizes[i] > 1) outer = std::max(outer, strides[i] * sizes[i]);
  for (size_t i = 0; i < sizes.size(); ++i)
    if (sizes[i] == 1) s[i] = outer;
  return memory::desc(d, type, s);
}
memory::desc md_of(const Tensor& t, DT type) { return md_of(t.sizes(), t.strides(), type); }

// ---- scratch --------------------------------------------------------------------------------
// One growing, 64-byte aligned buffer per thread for reorder temporaries and oneDNN scratchpads.
class Scratch {
 public:
  ~Scratch() {
    if (ptr_) cpu_allocator()->deallocate(ptr_, bytes_);
  }
  char* get(size_t bytes) {
    if (bytes > bytes_) {
      if (ptr_) cpu_allocator()->deallocate(ptr_, bytes_);
      size_t grown = std::max(bytes, bytes_ + bytes_ / 2);
      ptr_ = static_cast<char*>(cpu_allocator()->allocate(grown));
      bytes_ = grown;
    }
    return ptr_;
  }

 private:
  char* ptr_ = nullptr;
  size_t bytes_ = 0;
};
Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

size_t align64(size_t n) { return (n + 63) & ~size_t(63); }

// ---- cached primitives ----------------------------------------------------------------------
// One argument of a primitive: the user's memory (from a Tensor) and the layout the primitive
// wants. When they differ the data goes through a reorder into (inputs) or out of (outputs) a
// scratch temporary at `scratch_offset`.
struct Arg {
  int dnnl_arg = 0;
  bool is_output = false;
  memory::desc user_md;
  memory::desc prim_md;
  bool needs_reorder = false;
  dnnl::reorder reorder;
  size_t scratch_offset = 0;
};

struct Entry {
  bool supported = false;  // false: oneDNN has no implementation (cached negative answer)
  dnnl::primitive prim;
  std::vector<Arg> args;
  memory::desc scratchpad_md;
  size_t scratchpad_offset = 0;
  size_t scratch_bytes = 0;
  std::string impl;
};
using EntryPtr = std::shared_ptr<const Entry>;

constexpr size_t kCacheCapacity = 512;

class PrimitiveCache {
 public:
  EntryPtr find(const std::string& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it == map_.end()) return nullptr;
    lru_.splice(lru_.begin(), lru_, it->second);  // most recently used first
    ++hits_;
    return it->second->second;
  }
  void insert(const std::string& key, EntryPtr e) {
    std::lock_guard<std::mutex> lock(mu_);
    ++misses_;
    auto it = map_.find(key);
    if (it != map_.end()) {  // another thread created it meanwhile
      it->second->second = std::move(e);
      return;
    }
    lru_.emplace_front(key, std::move(e));
    map_[key] = lru_.begin();
    while (lru_.size() > kCacheCapacity) {
      map_.erase(lru_.back().first);
      lru_.pop_back();
      ++evictions_;
    }
  }
  PrimitiveCacheStats stats() {
    std::lock_guard<std::mutex> lock(mu_);
    return {hits_, misses_, int64_t(lru_.size()), int64_t(kCacheCapacity), evictions_};
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    lru_.clear();
    map_.clear();
    hits_ = misses_ = evictions_ = 0;
  }

 private:
  std::mutex mu_;
  std::list<std::pair<std::string, EntryPtr>> lru_;
  std::unordered_map<std::string, std::list<std::pair<std::string, EntryPtr>>::iterator> map_;
  int64_t hits_ = 0, misses_ = 0, evictions_ = 0;
};

PrimitiveCache& cache() {
  static PrimitiveCache c;
  return c;
}

thread_local std::string t_last_impl;
std::atomic<ConvLayout> g_conv_layout{ConvLayout::Auto};

// Fills in reorders and the scratch layout once the primitive descriptor is known.
// `wanted` lists (dnnl arg, user md, is_output) in the order execute() receives pointers.
struct ArgRequest {
  int dnnl_arg;
  memory::desc user_md;
  bool is_output;
};

EntryPtr finish_entry(const dnnl::primitive_desc& pd, dnnl::primitive prim,
                      const std::vector<ArgRequest>& wanted) {
  auto e = std::make_shared<Entry>();
  e->supported = true;
  e->prim = std::move(prim);
  e->impl = pd.impl_info_str();
  size_t off = 0;
  for (const ArgRequest& w : wanted) {
    Arg a;
    a.dnnl_arg = w.dnnl_arg;
    a.is_output = w.is_output;
    a.user_md = w.user_md;
    a.prim_md = pd.query_md(dnnl::query::exec_arg_md, w.dnnl_arg);
    a.needs_reorder = a.prim_md != a.user_md;
    if (a.needs_reorder) {
      auto& eng = cpu_engine();
      a.reorder = w.is_output
                      ? dnnl::reorder(dnnl::reorder::primitive_desc(eng, a.prim_md, eng, a.user_md))
                      : dnnl::reorder(dnnl::reorder::primitive_desc(eng, a.user_md, eng, a.prim_md));
      a.scratch_offset = off;
      off += align64(a.prim_md.get_size());
    }
    e->args.push_back(std::move(a));
  }
  e->scratchpad_md = pd.scratchpad_desc();
  e->scratchpad_offset = off;
  off += align64(e->scratchpad_md.get_size());
  e->scratch_bytes = off;
  return e;
}

EntryPtr unsupported_entry() {
  auto e = std::make_shared<Entry>();
  e->supported = false;
  return e;
}

// Looks up `key`; on a miss calls make() (which returns nullptr when oneDNN has no
// implementation) and caches the result, negative answers included.
template <typename Make>
EntryPtr get_entry(const std::string& key, Make&& make) {
  if (EntryPtr e = cache().find(key)) return e;
  EntryPtr e;
  try {
    e = make();
  } catch (const dnnl::error& err) {
    if (err.status != dnnl_unimplemented && err.status != dnnl_invalid_arguments)
      fail_kind(ErrorKind::Runtime, "oneDNN: {} (status {})", err.what(), int(err.status));
    e = nullptr;
  }
  if (!e) e = unsupported_entry();
  cache().insert(key, e);
  return e;
}

// Runs a cached primitive; `ptrs` follow the order of entry.args.
void execute(const Entry& e, std::initializer_list<void*> ptrs) {
  KILN_ASSERT(ptrs.size() == e.args.size());
  char* buf = e.scratch_bytes ? scratch().get(e.scratch_bytes) : nullptr;
  auto& eng = cpu_engine();
  auto& strm = cpu_stream();
  std::unordered_map<int, memory> args;
  std::vector<std::pair<const Arg*, memory>> outputs_to_reorder;
  try {
    size_t i = 0;
    for (void* p : ptrs) {
      const Arg& a = e.args[i++];
      memory user(a.user_md, eng, p);
      if (!a.needs_reorder) {
        args.emplace(a.dnnl_arg, user);
        continue;
      }
      memory tmp(a.prim_md, eng, buf + a.scratch_offset);
      if (a.is_output)
        outputs_to_reorder.emplace_back(&a, user);
      else
        a.reorder.execute(strm, user, tmp);
      args.emplace(a.dnnl_arg, tmp);
    }
    if (e.scratchpad_md.get_size() > 0)
      args.emplace(DNNL_ARG_SCRATCHPAD, memory(e.scratchpad_md, eng, buf + e.scratchpad_offset));
    e.prim.execute(strm, args);
    for (auto& [a, user] : outputs_to_reorder) {
      memory tmp = args.at(a->dnnl_arg);
      a->reorder.execute(strm, tmp, user);
    }
    strm.wait();
  } catch (const dnnl::error& err) {
    fail_kind(ErrorKind::Runtime, "oneDNN execution failed in {}: {}", e.impl, err.what());
  }
  t_last_impl = e.impl;
}

dnnl::primitive_attr default_attr() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);  // scratchpad comes from Scratch
  return attr;
}

// ---- cache keys -----------------------------------------------------------------------------
void key_dims(std::string& k, const char* tag, const Dims& sizes, const Dims& strides) {
  fmt::format_to(std::back_inserter(k), "|{}:", tag);
  for (size_t i = 0; i < sizes.size(); ++i) fmt::format_to(std::back_inserter(k), "{},", sizes[i]);
  k += '/';
  for (size_t i = 0; i < strides.size(); ++i)
    fmt::format_to(std::back_inserter(k), "{},", sizes[i] == 1 ? 0 : strides[i]);
}
void key_tensor(std::string& k, const char* tag, const Tensor& t) {
  if (!t.defined()) {
    fmt::format_to(std::back_inserter(k), "|{}:none", tag);
    return;
  }
  key_dims(k, tag, t.sizes(), t.strides());
  k += dtype_name(t.dtype());
}
void key_ints(std::string& k, const char* tag, const int64_t* v, int n) {
  fmt::format_to(std::back_inserter(k), "|{}:", tag);
  for (int i = 0; i < n; ++i) fmt::format_to(std::back_inserter(k), "{},", v[i]);
}

bool any_empty(const Tensor& a, const Tensor& b, const Tensor& c) {
  return a.numel() == 0 || b.numel() == 0 || c.numel() == 0;
}

// Weights of a (transposed) convolution as oneDNN dims/strides, a view of the PyTorch tensor:
// conv [O, C/g, kh, kw] -> {O, C/g, kh, kw} or {g, O/g, C/g, kh, kw};
// deconv [C, O/g, kh, kw] -> {O, C, kh, kw} or {g, O/g, C/g, kh, kw} (oneDNN orders O first).
void conv_weight_view(bool transposed, const Tensor& w, int64_t groups, Dims* sizes,
                      Dims* strides) {
  const Dims& s = w.strides();
  int64_t d0 = w.size(0), d1 = w.size(1), kh = w.size(2), kw = w.size(3);
  if (!transposed) {
    if (groups == 1) {
      *sizes = {d0, d1, kh, kw};
      *strides = {s[0], s[1], s[2], s[3]};
    } else {
      *sizes = {groups, d0 / groups, d1, kh, kw};
      *strides = {s[0] * (d0 / groups), s[0], s[1], s[2], s[3]};
    }
  } else {
    if (groups == 1) {
      *sizes = {d1, d0, kh, kw};
      *strides = {s[1], s[0], s[2], s[3]};
    } else {
      *sizes = {groups, d1, d0 / groups, kh, kw};
      *strides = {s[0] * (d0 / groups), s[1], s[0], s[2], s[3]};
    }
  }
}

// Note [Conv layout choice]
// Eager tensors are NCHW, so a blocked-layout convolution pays three reorders per call: src and
// dst (activation-sized) and the weights (eager cannot keep reordered weights: a tensor may be
// rewritten through its raw pointer without a version bump, and a stale copy would be a silent
// wrong answer; the compiler pre-packs weights instead). Measured on the 2-core AVX-512 dev
// machine at batch 1 (oneDNN 2.6, f32, 1 thread, best of 40; blocked = brgconv, plain =
// gemm:jit), ms:
//                        blocked  plain               blocked  plain
//   stem 7x7/2 3->64@224   2.4     3.4   3x3 256@14      2.4     2.5
//   3x3 64@56              2.2     2.9   3x3 512@7       3.6     2.5
//   3x3 128@28             2.1     2.8   1x1 64->256@56  1.5     1.0
//   depthwise 3x3 32@56    0.11    0.44  1x1/2 256->128  0.82    0.69
// Blocked wins on spatial kernels over large activations and on grouped/depthwise ones; plain
// wins on 1x1 (NCHW 1x1 is a plain GEMM, no im2col) and when the weights dwarf the activations
// (the per-call weight reorder dominates). Auto applies exactly that rule; with it every shape
// above runs at the better of the two.
ConvLayout resolve_conv_layout(ConvLayout policy, const Tensor& x, const Tensor& w,
                               int64_t groups) {
  if (policy != ConvLayout::Auto) return policy;
  bool pointwise = w.size(2) == 1 && w.size(3) == 1 && groups == 1;
  bool weight_heavy = groups == 1 && w.numel() > 2 * x.numel();
  return pointwise || weight_heavy ? ConvLayout::Plain : ConvLayout::Blocked;
}

bool conv_like(bool transposed, const Tensor& x, const Tensor& w, const Tensor& bias,
               const Conv2dParams& p, Tensor& y) {
  DT type;
  if (!dnnl_dtype(x.dtype(), &type) || w.dtype() != x.dtype() || y.dtype() != x.dtype())
    return false;
  if (bias.defined() && (bias.dtype() != x.dtype() || bias.numel() == 0)) return false;
  if (any_empty(x, w, y) || x.dim() != 4 || w.dim() != 4 || !y.is_contiguous()) return false;
  int64_t g = p.groups;
  Dims wsizes, wstrides;
  conv_weight_view(transposed, w, g, &wsizes, &wstrides);
  ConvLayout layout = resolve_conv_layout(conv_layout(), x, w, g);

  std::string key = transposed ? "deconv" : "conv";
  key += layout == ConvLayout::Blocked ? "|blocked" : "|plain";
  key_tensor(key, "x", x);
  key_dims(key, "w", wsizes, wstrides);
  key_tensor(key, "b", bias);
  key_tensor(key, "y", y);
  key_ints(key, "s", p.stride, 2);
  key_ints(key, "pb", p.pad_begin, 2);
  key_ints(key, "pe", p.pad_end, 2);
  key_ints(key, "d", p.dilation, 2);

  EntryPtr e = get_entry(key, [&]() -> EntryPtr {
    memory::desc x_md = md_of(x, type), y_md = md_of(y, type);
    memory::desc w_md = md_of(wsizes, wstrides, type);
    memory::desc b_md = bias.defined() ? md_of(bias, type) : memory::desc();
    memory::dims xd(x.sizes().begin(), x.sizes().end()), yd(y.sizes().begin(), y.sizes().end());
    memory::dims wd(wsizes.begin(), wsizes.end());
    memory::desc px, pw, py;
    if (layout == ConvLayout::Blocked) {
      px = memory::desc(xd, type, Tag::any);
      pw = memory::desc(wd, type, Tag::any);
      py = memory::desc(yd, type, Tag::any);
    } else {
      px = memory::desc(xd, type, Tag::nchw);
      Tag wt = transposed ? (g == 1 ? Tag::iohw : Tag::giohw) : (g == 1 ? Tag::oihw : Tag::goihw);
      pw = memory::desc(wd, type, wt);
      py = memory::desc(yd, type, Tag::nchw);
    }
    memory::desc pb = bias.defined() ? memory::desc({bias.size(0)}, type, Tag::x) : memory::desc();
    memory::dims strides = {p.stride[0], p.stride[1]};
    memory::dims dil = {p.dilation[0] - 1, p.dilation[1] - 1};  // oneDNN: 0 = dense
    memory::dims pl = {p.pad_begin[0], p.pad_begin[1]}, pr = {p.pad_end[0], p.pad_end[1]};
    dnnl::primitive_attr attr = default_attr();
    std::vector<ArgRequest> wanted = {{DNNL_ARG_SRC, x_md, false}, {DNNL_ARG_WEIGHTS, w_md, false}};
    if (bias.defined()) wanted.push_back({DNNL_ARG_BIAS, b_md, false});
    wanted.push_back({DNNL_ARG_DST, y_md, true});
    if (!transposed) {
      dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_inference,
                                        dnnl::algorithm::convolution_direct, px, pw, pb, py,
                                        strides, dil, pl, pr);
      dnnl::convolution_forward::primitive_desc pd(d, attr, cpu_engine());
      return finish_entry(pd, dnnl::convolution_forward(pd), wanted);
    }
    dnnl::deconvolution_forward::desc d(dnnl::prop_kind::forward_inference,
                                        dnnl::algorithm::deconvolution_direct, px, pw, pb, py,
                                        strides, dil, pl, pr);
    dnnl::deconvolution_forward::primitive_desc pd(d, attr, cpu_engine());
    return finish_entry(pd, dnnl::deconvolution_forward(pd), wanted);
  });
  if (!e->supported) return false;
  if (bias.defined())
    execute(*e, {x.raw_data(), w.raw_data(), bias.raw_data(), y.raw_data()});
  else
    execute(*e, {x.raw_data(), w.raw_data(), y.raw_data()});
  return true;
}

// Builds (or finds) a matmul primitive for these exact views; nullptr-equivalent when
// unsupported.
EntryPtr matmul_entry(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& y,
                      DT type) {
  int r = y.dim();
  std::string key = "matmul";
  key_tensor(key, "a", a);
  key_tensor(key, "b", b);
  key_tensor(key, "bias", bias);
  key_tensor(key, "y", y);
  return get_entry(key, [&]() -> EntryPtr {
    memory::desc a_md = md_of(a, type), b_md = md_of(b, type), y_md = md_of(y, type);
    std::vector<ArgRequest> wanted = {{DNNL_ARG_SRC, a_md, false}, {DNNL_ARG_WEIGHTS, b_md, false}};
    dnnl::primitive_attr attr = default_attr();
    if (bias.defined()) {
      // Bias as [1, ..., 1, N]: oneDNN broadcasts it over every row and batch.
      Dims bs(size_t(r), 1), bst(size_t(r), 1);
      bs[r - 1] = bias.size(0);
      bst[r - 1] = bias.stride(0);
      memory::desc bias_md = md_of(bs, bst, type);
      wanted.push_back({DNNL_ARG_BIAS, bias_md, false});
      wanted.push_back({DNNL_ARG_DST, y_md, true});
      dnnl::matmul::desc d(a_md, b_md, bias_md, y_md);
      dnnl::matmul::primitive_desc pd(d, attr, cpu_engine());
      return finish_entry(pd, dnnl::matmul(pd), wanted);
    }
    wanted.push_back({DNNL_ARG_DST, y_md, true});
    dnnl::matmul::desc d(a_md, b_md, y_md);
    dnnl::matmul::primitive_desc pd(d, attr, cpu_engine());
    return finish_entry(pd, dnnl::matmul(pd), wanted);
  });
}

bool is_reference_impl(const Entry& e) { return e.impl.rfind("ref", 0) == 0; }

// `t` with its batch dims (all but the last two) expanded to y's, as a contiguous copy.
Tensor materialize_batch(const Tensor& t, const Tensor& y) {
  Dims sizes = y.sizes(), strides;
  size_t r = sizes.size();
  sizes[r - 2] = t.sizes()[r - 2];
  sizes[r - 1] = t.sizes()[r - 1];
  for (int i = 0; i < t.dim(); ++i) strides.push_back(t.size(i) == 1 ? 0 : t.stride(i));
  return t.as_strided(sizes, strides, t.offset()).clone();
}

}  // namespace

// ---- public entry points --------------------------------------------------------------------
bool supports_dtype(DType d) {
  if (d == DType::Float32) return true;
  if (d != DType::BFloat16) return false;
  static const bool bf16 = [] {
    auto isa = unsigned(dnnl::get_effective_cpu_isa());
    auto need = unsigned(dnnl::cpu_isa::avx512_core);
    return (isa & need) == need;
  }();
  return bf16;
}

const char* cpu_isa_name() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41: return "sse41";
    case dnnl::cpu_isa::avx: return "avx";
    case dnnl::cpu_isa::avx2: return "avx2";
    case dnnl::cpu_isa::avx2_vnni: return "avx2_vnni";
    case dnnl::cpu_isa::avx512_mic: return "avx512_mic";
    case dnnl::cpu_isa::avx512_mic_4ops: return "avx512_mic_4ops";
    case dnnl::cpu_isa::avx512_core: return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni: return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16: return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx: return "avx512_core_amx";
    default: return "unknown";
  }
}

bool conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p,
            Tensor& y) {
  return conv_like(false, x, w, bias, p, y);
}

bool conv_transpose2d(const Tensor& x, const Tensor& w, const Tensor& bias,
                      const Conv2dParams& p, Tensor& y) {
  return conv_like(true, x, w, bias, p, y);
}

bool pool2d(const Tensor& x, const Pool2dParams& p, Tensor& y) {
  DT type;
  if (!dnnl_dtype(x.dtype(), &type) || y.dtype() != x.dtype()) return false;
  if (x.numel() == 0 || y.numel() == 0 || x.dim() != 4 || !y.is_contiguous()) return false;
  std::string key = fmt::format("pool{}", int(p.kind));
  key_tensor(key, "x", x);
  key_tensor(key, "y", y);
  key_ints(key, "k", p.kernel, 2);
  key_ints(key, "s", p.stride, 2);
  key_ints(key, "pb", p.pad_begin, 2);
  key_ints(key, "pe", p.pad_end, 2);
  key_ints(key, "d", p.dilation, 2);
  EntryPtr e = get_entry(key, [&]() -> EntryPtr {
    // Pooling runs on plain NCHW: it is memory-bound, a reorder to a blocked layout and back
    // would cost more than it saves.
    memory::desc x_md = md_of(x, type), y_md = md_of(y, type);
    memory::dims xd(x.sizes().begin(), x.sizes().end()), yd(y.sizes().begin(), y.sizes().end());
    memory::desc px(xd, type, Tag::nchw), py(yd, type, Tag::nchw);
    dnnl::algorithm alg = p.kind == PoolKind::Max ? dnnl::algorithm::pooling_max
                          : p.kind == PoolKind::AvgIncludePad
                              ? dnnl::algorithm::pooling_avg_include_padding
                              : dnnl::algorithm::pooling_avg_exclude_padding;
    dnnl::pooling_v2_forward::desc d(
        dnnl::prop_kind::forward_inference, alg, px, py, {p.stride[0], p.stride[1]},
        {p.kernel[0], p.kernel[1]}, {p.dilation[0] - 1, p.dilation[1] - 1},
        {p.pad_begin[0], p.pad_begin[1]}, {p.pad_end[0], p.pad_end[1]});
    dnnl::pooling_v2_forward::primitive_desc pd(d, default_attr(), cpu_engine());
    return finish_entry(pd, dnnl::pooling_v2_forward(pd),
                        {{DNNL_ARG_SRC, x_md, false}, {DNNL_ARG_DST, y_md, true}});
  });
  if (!e->supported) return false;
  execute(*e, {x.raw_data(), y.raw_data()});
  return true;
}

bool matmul(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& y) {
  DT type;
  if (!dnnl_dtype(a.dtype(), &type) || b.dtype() != a.dtype() || y.dtype() != a.dtype())
    return false;
  if (bias.defined() && (bias.dtype() != a.dtype() || bias.dim() != 1)) return false;
  int r = y.dim();
  if (r < 2 || a.dim() != r || b.dim() != r || !y.is_contiguous()) return false;
  if (any_empty(a, b, y)) return false;  // K == 0 and empty outputs: the reference handles them
  // A strided bias is rare and tiny: copy it rather than depend on oneDNN taking its strides.
  Tensor bias_c = bias.defined() ? bias.contiguous() : bias;

  // Views as given first; oneDNN's GEMM-based matmul takes most plain strides. When it has only
  // its reference implementation for them (odd strides or broadcasts), retry on contiguous
  // copies, then with batch broadcasts materialized.
  auto run = [&](const Tensor& aa, const Tensor& bb) {
    EntryPtr e = matmul_entry(aa, bb, bias_c, y, type);
    if (!e->supported) return false;
    if (is_reference_impl(*e) && !(aa.is_contiguous() && bb.is_contiguous())) return false;
    if (bias_c.defined())
      execute(*e, {aa.raw_data(), bb.raw_data(), bias_c.raw_data(), y.raw_data()});
    else
      execute(*e, {aa.raw_data(), bb.raw_data(), y.raw_data()});
    return true;
  };
  if (run(a, b)) return true;
  Tensor ac = a.contiguous(), bc = b.contiguous();
  if ((!same_tensor(ac, a) || !same_tensor(bc, b)) && run(ac, bc)) return true;
  return run(materialize_batch(a, y), materialize_batch(b, y));
}

void set_conv_layout(ConvLayout layout) { g_conv_layout.store(layout); }
ConvLayout conv_layout() { return g_conv_layout.load(); }

PrimitiveCacheStats primitive_cache_stats() { return cache().stats(); }
void clear_primitive_cache() { cache().clear(); }
const char* last_impl_name() { return t_last_impl.c_str(); }

}  // namespace kiln::onednn
