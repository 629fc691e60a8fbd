#include "compiler/bind.h"

#include <algorithm>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>

#include "compiler/insert_copies.h"
#include "lower/cost.h"
#include "core/error.h"
#include "ops/op.h"
#include "runtime/launch_library.h"

namespace kiln::compiler {

namespace {

// Where an eager kernel's tensor that is not a graph input lives: a parameter or constant
// (shared by every execution context), or a view of a value in the arena, rebuilt over each
// context's arena (Note [Execution contexts] in runtime/executable.cc).
struct BoundTensor {
  Tensor fixed;               // defined: a parameter or constant (or a view of one)
  int64_t arena_offset = -1;  // else: bytes from the arena's start to the base value
  Dims base_sizes;
  DType dtype = DType::Float32;
  lower::ViewGeometry view;   // the tensor as a view of the base value
};

// An eager kernel bound at compile time (Note [The compiler]): what every context shares.
struct EagerKernel {
  const OpDef* def = nullptr;
  KernelFn fn = nullptr;
  Device device;
  Attrs attrs;
  std::vector<BoundTensor> inputs;  // per input not taken from the call (absent: undefined)
  std::vector<BoundTensor> outputs;
  std::vector<TensorType> out_types;
  std::vector<int> from_input;  // per input: graph input index, or -1
  // Per input taken from a graph input through a view: its geometry (sizes empty: direct).
  std::vector<lower::ViewGeometry> input_view;
};

// One context's launch of it: the tensors over that context's arena.
struct EagerLaunch {
  const EagerKernel* k = nullptr;
  TensorList inputs;
  TensorList outputs;
};

Tensor materialize(const BoundTensor& b, char* arena, Device device) {
  if (b.fixed.defined()) return b.fixed;
  if (b.arena_offset < 0) return Tensor();
  Tensor t = Tensor::from_blob(arena + b.arena_offset, b.base_sizes, b.dtype, device);
  return t.as_strided(b.view.sizes, b.view.strides, b.view.offset);
}

std::shared_ptr<void> make_eager_launch(const std::shared_ptr<EagerKernel>& k, char* const* slots) {
  auto l = std::make_shared<EagerLaunch>();
  l->k = k.get();
  for (const BoundTensor& b : k->inputs) l->inputs.push_back(materialize(b, slots[0], k->device));
  for (const BoundTensor& b : k->outputs) l->outputs.push_back(materialize(b, slots[0], k->device));
  return l;
}

void run_eager(void* s, const Executable::RunContext& c) {
  auto* l = static_cast<EagerLaunch*>(s);
  const EagerKernel& f = *l->k;
  const Tensor* call_inputs = c.inputs;
  for (size_t k = 0; k < f.from_input.size(); ++k) {
    if (f.from_input[k] < 0) continue;
    const lower::ViewGeometry& v = f.input_view[k];
    const Tensor& t = call_inputs[f.from_input[k]];
    // A view of a graph input is rebuilt per call (one small allocation; rare: copies are
    // inserted for the common cases).
    l->inputs[k] = v.sizes.empty() ? t : t.as_strided(v.sizes, v.strides, t.offset() + v.offset);
  }
  KernelContext ctx{*f.def, l->inputs, l->outputs, f.attrs, f.out_types};
  f.fn(ctx);
}

std::string node_list(const Graph& g, const std::vector<int32_t>& nodes) {
  std::string s;
  for (int32_t n : nodes)
    s += (s.empty() ? "" : ", ") + std::string(op_def(g.nodes[size_t(n)].op).name) + " '" +
         g.nodes[size_t(n)].name + "'";
  return s;
}

// Note [concat part geometry]: the runtime copies a strided part element by element (a memcpy
// of elem_bytes per element), which made swin_t's torch.roll (slices concatenated) ~4 ns an
// element. Two rewrites of the same bytes: a view that is a contiguous block of its base (a slice
// of leading dims: strides are its sizes' row-major strides) is a contiguous part, copied with
// one memcpy per outer block; otherwise, while the innermost dim is contiguous on both sides
// (stride 1), pairs of elements become one element of twice the bytes, up to 16 bytes (the
// largest element the runtime takes), when every other stride and the source offset stay whole
// (the destination offset is in bytes already).
bool contiguous_block(const lower::ViewGeometry& geo) {
  Dims want = contiguous_strides(Dims(geo.sizes.begin(), geo.sizes.end()));
  for (size_t d = 0; d < geo.sizes.size(); ++d)
    if (geo.sizes[d] != 1 && geo.strides[d] != want[d]) return false;  // a size-1 dim's stride is moot
  return true;
}

// Where virtual view v's elements start when they are one row-major run of its stored base (a
// slice along the outermost dims, an unsqueeze): read in place by the runtime's concat and
// upsample. nullopt for any other value.
std::optional<MemRef> view_run(const Graph& g, const lower::Schedule& s, const MemoryAssignment& m,
                               ValueId v) {
  if (v == kNoValue || !s.virtual_view[size_t(v)]) return std::nullopt;
  const lower::ViewGeometry& geo = s.views[size_t(v)];
  if (m.mem[size_t(geo.base)].slot < 0 || geo.sizes.size() != size_t(g.type(v).rank()) ||
      !contiguous_block(geo) || geo.offset < 0 || g.type(geo.base).dtype != g.type(v).dtype)
    return std::nullopt;
  MemRef src = m.mem[size_t(geo.base)];
  src.byte_offset += geo.offset * dtype_size(g.type(v).dtype);
  return src;
}

void widen_elements(ConcatPart& p) {
  const size_t r = p.sizes.size();
  while (r > 0 && p.elem_bytes * 2 <= 16 && p.sizes[r - 1] % 2 == 0 && p.strides[r - 1] == 1 &&
         p.dst_strides[r - 1] == 1 && p.elem_offset % 2 == 0) {
    bool even = true;
    for (size_t d = 0; d + 1 < r; ++d)
      even = even && p.strides[d] % 2 == 0 && p.dst_strides[d] % 2 == 0;
    if (!even) break;
    for (size_t d = 0; d + 1 < r; ++d) {
      p.strides[d] /= 2;
      p.dst_strides[d] /= 2;
    }
    p.sizes[r - 1] /= 2;
    p.elem_offset /= 2;
    p.elem_bytes *= 2;
  }
}

// Note [channels-last concat]: a concat whose parts or result a library stores in another
// order than row-major (Schedule::value_strides: the CPU's channels-last values, Note
// [channels-last values] in targets/cpu/onednn_lowering.cc) copies every part as a strided part
// walked in the result's memory order, adjacent dims merged: along the channels of NHWC values,
// one memcpy of a part's C_i channels per pixel (DenseNet's concatenations of 32-channel
// convolution outputs). Every part must be a stored value (no view) of the result's dtype.
// A stored buffer of concrete shape (not a view), in row-major or in a library's order
// (Schedule::value_strides).
bool stored_buffer(const Graph& g, const lower::Schedule& s, const MemoryAssignment& m,
                   ValueId v) {
  if (v == kNoValue || s.virtual_view[size_t(v)] || m.mem[size_t(v)].slot < 0 ||
      !g.type(v).is_contiguous())
    return false;
  for (const SymInt& d : g.type(v).shape)
    if (!d.is_concrete()) return false;
  return true;
}

std::optional<Executable::Launch> reordered_concat(const Graph& g, const lower::Schedule& s,
                                                   const MemoryAssignment& m, const Node& n,
                                                   int64_t dim) {
  ValueId y = n.outputs[0];
  const TensorType& yt = g.type(y);
  const size_t r = yt.shape.size();
  const int64_t elt = dtype_size(yt.dtype);
  auto storage = [&](ValueId v) {
    Dims d = to_dims(g.type(v).shape);
    const std::vector<int64_t>& st = s.value_strides[size_t(v)];
    return st.empty() ? contiguous_strides(d) : Dims(st.begin(), st.end());
  };
  const Dims ys = storage(y);
  std::vector<size_t> order(r);
  for (size_t d = 0; d < r; ++d) order[d] = d;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return ys[a] > ys[b]; });
  std::vector<ConcatPart> parts;
  int64_t at = 0;
  for (ValueId v : n.inputs) {
    if (!stored_buffer(g, s, m, v) || g.type(v).dtype != yt.dtype || g.type(v).shape.size() != r)
      return {};
    const Dims vd = to_dims(g.type(v).shape), vs = storage(v);
    ConcatPart part;
    part.src = m.mem[size_t(v)];
    part.dst_offset = at * ys[size_t(dim)] * elt;
    part.elem_bytes = elt;
    for (size_t d : order) {
      if (vd[d] == 1) continue;
      if (!part.sizes.empty() && part.strides.back() == vs[d] * vd[d] &&
          part.dst_strides.back() == ys[d] * vd[d]) {
        part.sizes.back() *= vd[d];
        part.strides.back() = vs[d];
        part.dst_strides.back() = ys[d];
        continue;
      }
      part.sizes.push_back(vd[d]);
      part.strides.push_back(vs[d]);
      part.dst_strides.push_back(ys[d]);
    }
    if (part.sizes.empty()) {  // one element
      part.sizes = {1};
      part.strides = {1};
      part.dst_strides = {1};
    }
    widen_elements(part);
    parts.push_back(std::move(part));
    at += vd[size_t(dim)];
  }
  // One outer block of the whole result: what a package's loader checks the parts against.
  int64_t bytes = elt;
  for (const SymInt& d : yt.shape) bytes *= d.value();
  return make_concat_launch(std::move(parts), 1, bytes, m.mem[size_t(y)]);
}

// A node the runtime's kernel library runs without its eager kernel (runtime/launch_library.h),
// so that the Executable stays packageable: embedding, concat and split on the CPU, over buffers
// or views of concrete shapes (byte copies: bitwise what the eager kernels compute).
std::optional<Executable::Launch> runtime_kernel(const Graph& g, const lower::Schedule& s,
                                                 const MemoryAssignment& m, int32_t node,
                                                 const Target& target) {
  const Node& n = g.nodes[size_t(node)];
  if (!target.device().is_cpu()) return {};
  // A stored, row-major buffer (not in a library's order).
  auto plain = [&](ValueId v) {
    return stored_buffer(g, s, m, v) && s.value_strides[size_t(v)].empty();
  };
  if (n.op == OpId::Concat) {
    ValueId y = n.outputs[0];
    if (!stored_buffer(g, s, m, y)) return {};
    const TensorType& yt = g.type(y);
    int r = int(yt.shape.size());
    int64_t dim = n.attrs.get_int("dim");
    if (dim < 0) dim += r;
    if (dim < 0 || dim >= r) return {};
    bool reordered = !s.value_strides[size_t(y)].empty();
    for (ValueId v : n.inputs)
      reordered = reordered || (v != kNoValue && !s.value_strides[size_t(v)].empty());
    if (reordered) return reordered_concat(g, s, m, n, dim);
    int64_t outer = 1, inner = dtype_size(yt.dtype);
    for (int d = 0; d < dim; ++d) outer *= yt.shape[size_t(d)].value();
    for (int d = int(dim) + 1; d < r; ++d) inner *= yt.shape[size_t(d)].value();
    std::vector<ConcatPart> parts;
    Dims out_strides = contiguous_strides(to_dims(yt.shape));
    const int64_t elt = dtype_size(yt.dtype);
    int64_t at = 0;
    for (ValueId v : n.inputs) {
      if (v == kNoValue || g.type(v).dtype != yt.dtype) return {};
      int64_t chunk = g.type(v).shape[size_t(dim)].value() * inner;
      if (plain(v)) {
        parts.push_back(contiguous_part(m.mem[size_t(v)], chunk, at));
      } else if (s.virtual_view[size_t(v)]) {
        // A view (a permuted activation, an expanded parameter): copied element by element from
        // its base buffer, or as a contiguous part (Note [concat part geometry]).
        const lower::ViewGeometry& geo = s.views[size_t(v)];
        if (m.mem[size_t(geo.base)].slot < 0 || geo.sizes.size() != size_t(r)) return {};
        if (std::optional<MemRef> src = view_run(g, s, m, v)) {
          parts.push_back(contiguous_part(*src, chunk, at));
          at += chunk;
          continue;
        }
        ConcatPart part;
        part.src = m.mem[size_t(geo.base)];
        part.dst_offset = at;
        part.sizes.assign(geo.sizes.begin(), geo.sizes.end());
        part.strides.assign(geo.strides.begin(), geo.strides.end());
        part.dst_strides.assign(out_strides.begin(), out_strides.end());
        part.elem_offset = geo.offset;
        part.elem_bytes = elt;
        for (int64_t st : part.strides)
          if (st < 0) return {};
        widen_elements(part);
        parts.push_back(std::move(part));
      } else {
        return {};
      }
      at += chunk;
    }
    return make_concat_launch(std::move(parts), outer, at, m.mem[size_t(y)]);
  }
  if (n.op == OpId::Upsample && n.inputs.size() == 1) {
    // The runtime's upsample (runtime/launch_library.h): contiguous planes; nearest of any
    // dtype, bilinear of floating ones.
    ValueId x = n.inputs[0], y = n.outputs[0];
    if (!plain(y)) return {};
    const TensorType &xt = g.type(x), &yt = g.type(y);
    if (xt.shape.size() != 4 || yt.shape.size() != 4 || xt.dtype != yt.dtype) return {};
    // x stored, or a view whose elements are one row-major run of its base (SSDlite's transform
    // resizes its unsqueezed, normalized image: that ran the eager kernel).
    std::optional<MemRef> src = plain(x) ? m.mem[size_t(x)] : view_run(g, s, m, x);
    if (!src) return {};
    UpsampleSpec sp;
    const std::string& mode = n.attrs.get_string("mode");
    if (mode != "nearest" && mode != "bilinear") return {};
    sp.bilinear = mode == "bilinear";
    if (sp.bilinear && !is_floating(xt.dtype)) return {};
    sp.align_corners = n.attrs.get_bool("align_corners");
    sp.scales = n.attrs.get_floats("scales");
    sp.planes = xt.shape[0].value() * xt.shape[1].value();
    sp.h = xt.shape[2].value();
    sp.w = xt.shape[3].value();
    sp.ho = yt.shape[2].value();
    sp.wo = yt.shape[3].value();
    sp.dtype = xt.dtype;
    if (sp.planes < 1 || sp.h < 1 || sp.w < 1 || sp.ho < 1 || sp.wo < 1) return {};
    return make_upsample_launch(sp, *src, m.mem[size_t(y)]);
  }
  if (n.op == OpId::Split && n.inputs.size() == 1) {
    ValueId x = n.inputs[0];
    const TensorType& xt = g.type(x);
    int r = int(xt.shape.size());
    int64_t dim = n.attrs.get_int("dim");
    if (dim < 0) dim += r;
    if (dim < 0 || dim >= r) return {};
    for (const SymInt& d : xt.shape)
      if (!d.is_concrete()) return {};
    lower::ViewGeometry geo;
    if (s.virtual_view[size_t(x)]) {
      geo = s.views[size_t(x)];
    } else {
      geo.base = x;
      geo.sizes = to_dims(xt.shape);
      geo.strides = contiguous_strides(geo.sizes);
      geo.offset = 0;
    }
    if (m.mem[size_t(geo.base)].slot < 0 || geo.sizes.size() != size_t(r)) return {};
    for (int64_t st : geo.strides)
      if (st < 0) return {};
    std::vector<ConcatPart> parts;
    int64_t start = 0;
    for (ValueId o : n.outputs) {
      if (!plain(o) || g.type(o).dtype != xt.dtype) return {};
      ConcatPart part;
      part.src = m.mem[size_t(geo.base)];
      part.dst = m.mem[size_t(o)];
      part.sizes.assign(geo.sizes.begin(), geo.sizes.end());
      int64_t len = g.type(o).shape[size_t(dim)].value();
      part.sizes[size_t(dim)] = len;
      part.strides.assign(geo.strides.begin(), geo.strides.end());
      Dims ds = contiguous_strides(to_dims(g.type(o).shape));
      part.dst_strides.assign(ds.begin(), ds.end());
      part.elem_offset = geo.offset + start * geo.strides[size_t(dim)];
      part.elem_bytes = dtype_size(xt.dtype);
      start += len;
      widen_elements(part);
      parts.push_back(std::move(part));
    }
    return make_concat_launch(std::move(parts), 0, 0, m.mem[size_t(n.outputs[0])]);
  }
  if (n.op != OpId::Embedding || n.inputs.size() != 2) return {};
  ValueId w = n.inputs[0], idx = n.inputs[1], y = n.outputs[0];
  for (ValueId v : {w, idx, y})
    if (s.virtual_view[size_t(v)] || m.mem[size_t(v)].slot < 0 || !g.type(v).is_contiguous())
      return {};
  const TensorType &wt = g.type(w), &it = g.type(idx);
  if (wt.shape.size() != 2 || !wt.shape[0].is_concrete() || !wt.shape[1].is_concrete()) return {};
  int64_t count = 1;
  for (const SymInt& d : it.shape) {
    if (!d.is_concrete()) return {};
    count *= d.value();
  }
  if (it.dtype != DType::Int64 && it.dtype != DType::Int32) return {};
  return make_gather_rows_launch(m.mem[size_t(w)], wt.shape[0].value(),
                                 wt.shape[1].value() * dtype_size(wt.dtype), m.mem[size_t(idx)],
                                 it.dtype == DType::Int32, count, m.mem[size_t(y)], n.name);
}

}  // namespace

BoundExecutable bind_executable(const Graph& g, const lower::Schedule& s,
                                const MemoryAssignment& m, std::shared_ptr<LibraryKernels> lib,
                                LoopBuild loops, const Target& target,
                                const std::string& cross_arch) {
  BoundExecutable out;
  auto exe = std::make_shared<Executable>();
  out.exe = exe;
  // Every execution context's arena: the planned values and each library launch's scratch
  // (Note [Scratch per step] in lower/memory_planner.cc).
  exe->init(m.plan.arena_bytes, m.num_slots, target.device());
  for (const MemoryAssignment::Constant& c : m.constants) {
    exe->keep_alive.push_back(std::make_shared<Tensor>(c.data));
    exe->set_slot(c.slot, static_cast<char*>(c.data.raw_data()));
  }
  exe->keep_alive.push_back(lib);
  if (loops.keep_alive) exe->keep_alive.push_back(loops.keep_alive);
  exe->kernel_library_path = loops.library_path;
  exe->device_modules = std::move(loops.device_modules);
  for (Executable::DeviceModule& dm : lib->device_modules()) exe->device_modules.push_back(std::move(dm));
  // Every constant by name (what a package's weights section holds): those with a slot, then
  // those only the library kernels read (their records name them).
  std::vector<ValueId> slot_constant_values;  // the value of exe->constants[i], for those with a slot
  {
    std::map<int, const MemoryAssignment::Constant*> by_slot;
    for (const MemoryAssignment::Constant& c : m.constants) by_slot[c.slot] = &c;
    std::set<std::string> named;
    for (size_t v = 0; v < g.values.size(); ++v) {
      const Value& val = g.values[v];
      if (val.kind != ValueKind::Param && val.kind != ValueKind::Const) continue;
      auto it = by_slot.find(m.mem[v].slot);
      if (it == by_slot.end()) continue;
      exe->constants.push_back({val.name, it->first, it->second->data, it->second->layout});
      slot_constant_values.push_back(ValueId(v));
      named.insert(val.name);
      by_slot.erase(it);
    }
    for (const lower::Step& st : s.steps) {
      if (st.kind != lower::StepKind::Extern) continue;
      for (ValueId v : g.nodes[size_t(st.node)].inputs) {
        if (v == kNoValue) continue;
        const Value& val = g.value(v);
        if ((val.kind == ValueKind::Param || val.kind == ValueKind::Const) &&
            named.insert(val.name).second)
          exe->constants.push_back({val.name, -1, val.data, ""});
      }
    }
  }

  // Where the memory of value v is (arena values and views of them, parameters).
  auto bound_tensor = [&](ValueId v) -> BoundTensor {
    BoundTensor b;
    const Value& val = g.value(v);
    if (val.kind == ValueKind::Param || val.kind == ValueKind::Const) {
      b.fixed = val.data;
      return b;
    }
    lower::ViewGeometry geo;
    if (s.virtual_view[size_t(v)]) {
      geo = s.views[size_t(v)];
    } else {
      geo.base = v;
      geo.sizes = Dims();
      for (size_t i = 0; i < val.type.shape.size(); ++i) geo.sizes.push_back(val.type.shape[i].value());
      geo.strides = contiguous_strides(geo.sizes);
    }
    const Value& base = g.value(geo.base);
    if (base.kind == ValueKind::Param || base.kind == ValueKind::Const) {
      b.fixed = base.data.as_strided(geo.sizes, geo.strides, geo.offset);
      return b;
    }
    const MemRef& r = m.mem[size_t(geo.base)];
    KILN_ASSERT(r.slot == 0);
    b.arena_offset = r.byte_offset;
    for (size_t i = 0; i < base.type.shape.size(); ++i) b.base_sizes.push_back(base.type.shape[i].value());
    b.dtype = base.type.dtype;
    b.view = geo;
    return b;
  };

  // Note [Constants read at run time]: which parameters and constants a launch reads through
  // the slot table when it runs. A oneDNN node reads none: it prepacks (or copies) its constant
  // operands when it is built. A constant only such nodes read keeps its slot here (harmless)
  // but is recorded with slot -1, so that a package's loader neither copies it nor binds it
  // (Note [CPU package weights] in runtime/package.cc).
  std::vector<bool> read_at_run(g.values.size(), false);
  auto mark_read = [&](ValueId v) {
    if (v == kNoValue) return;
    read_at_run[size_t(v)] = true;
    if (s.virtual_view[size_t(v)]) read_at_run[size_t(s.views[size_t(v)].base)] = true;
  };
  for (ValueId o : g.outputs) mark_read(o);
  for (size_t si = 0; si < s.steps.size(); ++si) {
    const lower::Step& st = s.steps[si];
    Executable::Launch l;
    if (st.kind == lower::StepKind::Loop) {
      const lower::LoopKernel& k = s.loops[size_t(st.loop)];
      l = std::move(loops.launches[size_t(st.loop)]);
      l.nodes = node_list(g, k.nodes);
      bool vec = loops.vectorized[size_t(st.loop)];
      out.loop_kernels++;
      if (vec) out.vectorized_kernels++;
      out.kernels.push_back(fmt::format("{} [{}{}]: {}", k.name, lower::loop_kind_name(k.kind),
                                        vec ? ", SIMD" : "", l.nodes));
      for (TunableLaunch& t : loops.tunable)
        if (t.launch == size_t(st.loop)) {
          out.tunable.push_back(t);
          out.tunable.back().launch = exe->launches.size();
        }
    } else if (st.kind == lower::StepKind::Extern) {
      const Node& n = g.nodes[size_t(st.node)];
      std::vector<MemRef> in(n.inputs.size());
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        ValueId v = n.inputs[k];
        if (v == kNoValue) continue;
        const Value& val = g.value(v);
        MemRef r = m.mem[size_t(v)];  // activations, parameters and constants alike
        if (s.virtual_view[size_t(v)]) r.byte_offset += s.views[size_t(v)].offset * dtype_size(val.type.dtype);
        in[k] = r;
      }
      std::vector<MemRef> outs;
      for (ValueId o : n.outputs) outs.push_back(m.mem[size_t(o)]);
      // A launch without scratch gets the arena's start and 0 bytes (a valid pointer).
      const int64_t scratch_at = m.plan.scratch_offset[size_t(st.node)];
      l = lib->bind(st.node, in, outs, MemRef{0, std::max<int64_t>(scratch_at, 0)}, m.status);
      l.name = fmt::format("{}:{}", op_def(n.op).name, n.name);
      l.nodes = std::string(op_def(n.op).name) + " '" + n.name + "'";
      out.library_launches++;
      out.kernels.push_back(fmt::format("{} [{}]: {}", l.name, target.library_name(), lib->describe(st.node)));
    } else if (std::optional<Executable::Launch> rk = runtime_kernel(g, s, m, st.node, target)) {
      const Node& n = g.nodes[size_t(st.node)];
      l = std::move(*rk);
      l.name = fmt::format("{}:{}", op_def(n.op).name, n.name);
      l.nodes = std::string(op_def(n.op).name) + " '" + n.name + "'";
      out.library_launches++;
      out.kernels.push_back(fmt::format("{} [runtime kernel {}]", l.name, l.kind));
    } else {
      const Node& n = g.nodes[size_t(st.node)];
      const OpDef& d = op_def(n.op);
      // Eager kernels read and write row-major tensors: a value a library stores in another
      // order must never reach one (LibraryKernels::value_strides promises it).
      for (const std::vector<ValueId>* vs : {&n.inputs, &n.outputs})
        for (ValueId v : *vs)
          if (v != kNoValue && !s.value_strides[size_t(v)].empty())
            fail_kind(ErrorKind::Internal,
                      "compiler: eager kernel of {} '{}' would read or write '%{}', which the "
                      "library stores in another order than row-major",
                      d.name, n.name, g.value(v).name);
      auto state = std::make_shared<EagerKernel>();
      state->def = &d;
      state->fn = target.device().is_cpu() ? (d.eager_cpu ? d.eager_cpu : d.reference) : d.eager_cuda;
      // A CUDA eager kernel covers the dtypes it lists (OpDef::eager_cuda_dtypes), judged by the
      // node's first input (its output for ops without inputs).
      if (state->fn && target.device().is_cuda()) {
        ValueId probe = !n.inputs.empty() && n.inputs[0] != kNoValue ? n.inputs[0] : n.outputs[0];
        DType dt = g.type(probe).dtype;
        if (std::find(d.eager_cuda_dtypes.begin(), d.eager_cuda_dtypes.end(), dt) ==
            d.eager_cuda_dtypes.end())
          state->fn = nullptr;
      }
      if (!state->fn) {
        std::string why = target.unsupported_reason(g, n);
        if (why.empty() && lib) why = lib->why_not(st.node);
        DType dt = g.type(n.outputs[0]).dtype;
        throw_error(ErrorKind::NotSupported,
                    fmt::format("compiler: op '{}' (node '{}', {}) has no {} kernel{}{}", d.name,
                                n.name, dtype_name(dt), target.name(), why.empty() ? "" : ": ",
                                why));
      }
      state->device = target.device();
      state->attrs = n.attrs;
      size_t ni = std::max(n.inputs.size(), d.inputs.size());
      state->inputs.resize(ni);
      state->from_input.assign(ni, -1);
      state->input_view.resize(ni);
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        ValueId v = n.inputs[k];
        if (v == kNoValue) continue;
        ValueId root = s.virtual_view[size_t(v)] ? s.views[size_t(v)].base : v;
        if (g.value(root).kind == ValueKind::Input) {
          state->from_input[k] = int(std::find(g.inputs.begin(), g.inputs.end(), root) - g.inputs.begin());
          if (root != v) state->input_view[k] = s.views[size_t(v)];
          continue;
        }
        state->inputs[k] = bound_tensor(v);
      }
      for (ValueId o : n.outputs) {
        state->out_types.push_back(g.type(o));
        state->outputs.push_back(bound_tensor(o));
      }
      l.fn = run_eager;
      l.state = state.get();
      l.owner = state;
      // Its tensors over the arena and the argument list it rewrites per call: per context.
      l.make_local = [state](char* const* slots) { return make_eager_launch(state, slots); };
      l.name = fmt::format("{}:{}", d.name, n.name);
      l.kind = "eager";
      l.nodes = std::string(d.name) + " '" + n.name + "'";
      out.eager_launches++;
      out.kernels.push_back(fmt::format("{} [eager kernel]", l.name));
    }
    lower::Work work = st.kind == lower::StepKind::Loop
                           ? lower::loop_work(g, s.loops[size_t(st.loop)])
                           : lower::node_work(g, g.nodes[size_t(st.node)]);
    l.flops = work.flops;
    l.bytes = work.bytes;
    l.const_bytes = work.const_bytes;
    l.compute = work.compute;
    if (l.kind != "onednn") {
      if (st.kind == lower::StepKind::Loop) {
        for (int32_t n : s.loops[size_t(st.loop)].nodes)
          for (ValueId v : g.nodes[size_t(n)].inputs) mark_read(v);
      } else {
        for (ValueId v : g.nodes[size_t(st.node)].inputs) mark_read(v);
      }
    }
    exe->launches.push_back(std::move(l));
  }
  for (size_t i = 0; i < slot_constant_values.size(); ++i)
    if (!read_at_run[size_t(slot_constant_values[i])]) exe->constants[i].slot = -1;

  for (size_t i = 0; i < g.inputs.size(); ++i) {
    Executable::InputSpec in;
    const Value& v = g.value(g.inputs[i]);
    in.name = v.name;
    in.dtype = v.type.dtype;
    for (size_t d = 0; d < v.type.shape.size(); ++d) in.sizes.push_back(v.type.shape[d].value());
    in.slot = m.mem[size_t(g.inputs[i])].slot;
    if (!m.plan.staging_offset.empty()) in.staging_offset = m.plan.staging_offset[i];
    exe->inputs.push_back(std::move(in));
  }
  for (ValueId o : g.outputs) {
    Executable::OutputSpec os;
    const Value& v = g.value(o);
    os.name = v.name;
    os.dtype = v.type.dtype;
    for (size_t d = 0; d < v.type.shape.size(); ++d) os.sizes.push_back(v.type.shape[d].value());
    MemRef r = m.mem[size_t(o)];
    if (s.virtual_view[size_t(o)]) {
      const lower::ViewGeometry& geo = s.views[size_t(o)];
      if (contiguous_geometry(geo)) {
        r.byte_offset += geo.offset * dtype_size(v.type.dtype);
      } else {  // a strided view of a buffer: copied out element by element
        os.strides = geo.strides;
        os.view_offset = geo.offset;
        const TensorType& bt = g.type(geo.base);
        for (size_t d = 0; d < bt.shape.size(); ++d) os.base_sizes.push_back(bt.shape[d].value());
      }
    }
    if (r.slot < 0)
      throw_error(ErrorKind::Internal, fmt::format("compiler: graph output '%{}' has no memory", v.name));
    os.slot = r.slot;
    os.byte_offset = r.byte_offset;
    exe->outputs.push_back(std::move(os));
  }
  // Note [Device status]: what the library's and the loop kernels' checks report.
  std::vector<Executable::DeviceCheck> checks = lib->device_checks();
  for (Executable::DeviceCheck& c : loops.device_checks) checks.push_back(std::move(c));
  if (!checks.empty()) {
    if (m.status.slot < 0)
      throw_error(ErrorKind::Internal, fmt::format("compiler: kernels for {} report bad values, but "
                                                   "the target has no status record",
                                                   target.name()));
    exe->set_device_status(m.status.slot, std::move(checks));
  }
  if (!cross_arch.empty()) {  // nothing runs here: no arena, no context (Options::arch)
    exe->set_not_runnable(fmt::format(
        "this executable was cross-built for {} without a GPU (compiler::Options::arch): write it "
        "as a package and load that on a {} GPU", cross_arch, cross_arch));
    return out;
  }
  exe->prepare();
  return out;
}

}  // namespace kiln::compiler
