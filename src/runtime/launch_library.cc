// Launches from plain data. See launch_library.h.
//
// Note [Launch records]
// An Executable is a list of launches, each a function pointer over opaque state. To write one
// into a package and run it elsewhere, every launch is also data: a LaunchRecord (a kind and
// JSON parameters), produced on demand by Launch::record so that it says the state as it is at
// packaging time (a loop kernel's thread count may have been tuned after binding). The factories
// here are the only place launches of these kinds are made, at compile time and at load time
// alike:
//   loop    {"symbol": name, "threads": n}: the generated kernel `name` of the package's shared
//           object, called as fn(slots, threads);
//   onednn  {"desc": OnednnNodeDesc, "inputs": [[slot, offset]...], "output": [...],
//           "scratch": [...], "scratch_bytes": n, "expect": description}: the node rebuilt by
//           the kernels layer from its descriptor (Note [oneDNN node descriptors]); the rebuilt
//           node must describe itself exactly as at compile time (the same oneDNN
//           implementation and layouts), or the package would compute differently: the loader
//           refuses it then. scratch_bytes is what the memory plan gave the node's scratch
//           (Note [Scratch per step] in lower/memory_planner.cc: other values may lie right
//           after it), which the rebuilt node must not exceed; packages written without it
//           (before 2026-12-06, same format versions) had one scratch region at the
//           arena's end, bounded by the arena.
//   gather_rows {"table", "indices", "out": [slot, offset], "rows", "row_bytes", "count",
//           "int32_indices", "node"}: embedding lookups, as byte copies.
//   concat  {"parts": [[slot, offset, chunk_bytes, dst_offset]...], "outer", "out_chunk_bytes",
//           "out"}: concatenation of contiguous buffers, as byte copies.
//   upsample {"bilinear", "align_corners", "scales_bits", "planes", "h", "w", "ho", "wo",
//           "dtype", "x", "y"}: nearest or bilinear upsampling (scales as bit patterns).
// Eager launches (an op's eager kernel bound to tensors) have no record: `kiln compile -o`
// refuses a graph with one, naming the node.
#include "runtime/launch_library.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string_view>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/resample.h"
#include "kernels/json_numbers.h"
#include "kernels/onednn_node.h"
#include "kernels/parallel.h"
#include "runtime/launch_records.h"

namespace kiln {

namespace records {

nlohmann::json ref_json(MemRef r) { return nlohmann::json::array({r.slot, r.byte_offset}); }

MemRef ref_from(const nlohmann::json& j) {
  auto v = j.get<std::vector<int64_t>>();
  if (v.size() != 2 || v[0] < -1 || v[0] > (int64_t(1) << 30) || v[1] < 0 ||
      v[1] > (int64_t(1) << 44))
    throw std::out_of_range("a buffer reference must be [slot >= -1, offset >= 0]");
  return MemRef{int32_t(v[0]), v[1]};
}

void check_buffer(LaunchEnv& env, MemRef r, int64_t bytes, const std::string& where,
                  const char* what) {
  if (r.slot < 0) return;
  if (env.num_slots >= 0 && r.slot >= env.num_slots)
    fail_kind(ErrorKind::ParseError, "{}: {} is in slot {}, but the slot table has {} slots",
              where, what ? fmt::format("buffer '{}'", what) : "a buffer", r.slot, env.num_slots);
  if (!env.slot_bytes) return;
  int64_t have = env.slot_bytes(r.slot);
  if (bytes < 0 || r.byte_offset < 0 || r.byte_offset > have || bytes > have - r.byte_offset)
    fail_kind(ErrorKind::ParseError, "{}: {} of {} bytes at slot {} offset {} lies outside the "
              "slot's {} bytes", where, what ? fmt::format("buffer '{}'", what) : "a buffer",
              bytes, r.slot, r.byte_offset, have);
}

DType dtype_from(const nlohmann::json& j, const std::string& where) {
  std::string name = j.get<std::string>();
  DType t;
  if (!parse_dtype(name, &t)) throw std::out_of_range(where + ": unknown dtype '" + name + "'");
  return t;
}

}  // namespace records

namespace {

using json = nlohmann::json;
using records::check_buffer;
using records::ref_from;
using records::ref_json;

// ---- loop kernels -----------------------------------------------------------------------------
struct LoopState {
  void (*fn)(char* const*, int) = nullptr;
  void (*checked_fn)(char* const*, int, int64_t*) = nullptr;  // kernels with index checks
  int threads = 0;  // see Note [kernel threads] in targets/cpu/emitter.cc
  std::vector<IndexCheckText> checks;
};

void run_loop(void* s, const Executable::RunContext& c) {
  auto* l = static_cast<LoopState*>(s);
  l->fn(c.slots, l->threads);
}

void run_checked_loop(void* s, const Executable::RunContext& c) {
  auto* l = static_cast<LoopState*>(s);
  int64_t err[2] = {-1, 0};
  l->checked_fn(c.slots, l->threads, err);
  if (err[0] >= 0) [[unlikely]] {
    size_t k = size_t(err[0]) < l->checks.size() ? size_t(err[0]) : 0;
    fail_kind(ErrorKind::InvalidArgument, "{}{}{}", l->checks[k].first, err[1],
              l->checks[k].second);
  }
}

// ---- oneDNN nodes -----------------------------------------------------------------------------
// The state bound once is a template: every execution context runs a copy with an instance of
// its own (the memory objects hold the pointers last bound).
struct OnednnState {
  std::shared_ptr<const kernels::OnednnNode> node;
  std::vector<MemRef> in;  // by the node's input index (a concat has any number)
  MemRef out;
  MemRef scratch;
  std::vector<const void*> ptrs;  // per context (sized once): the inputs' addresses of a call
  std::shared_ptr<kernels::OnednnNode::Instance> instance;  // per context
};

void run_onednn(void* s, const Executable::RunContext& c) {
  auto* e = static_cast<OnednnState*>(s);
  char* const* b = c.slots;
  for (size_t i = 0; i < e->in.size(); ++i)
    e->ptrs[i] = e->in[i].slot >= 0 ? b[e->in[i].slot] + e->in[i].byte_offset : nullptr;
  e->node->run(*e->instance, e->ptrs.data(), b[e->out.slot] + e->out.byte_offset,
               b[e->scratch.slot] + e->scratch.byte_offset);
}

// ---- gather rows ------------------------------------------------------------------------------
struct GatherRowsState {
  MemRef table, indices, out;
  int64_t rows = 0, row_bytes = 0, count = 0;
  bool int32_indices = false;
  std::string node;
};

void run_gather_rows(void* s, const Executable::RunContext& c) {
  auto* g = static_cast<GatherRowsState*>(s);
  const char* table = c.slots[g->table.slot] + g->table.byte_offset;
  const char* idx = c.slots[g->indices.slot] + g->indices.byte_offset;
  char* out = c.slots[g->out.slot] + g->out.byte_offset;
  for (int64_t i = 0; i < g->count; ++i) {
    int64_t v;
    if (g->int32_indices) {
      int32_t x;
      std::memcpy(&x, idx + 4 * i, 4);
      v = x;
    } else {
      std::memcpy(&v, idx + 8 * i, 8);
    }
    if (v < -g->rows || v >= g->rows) [[unlikely]]
      fail_kind(ErrorKind::InvalidArgument, "embedding '{}': index {} at position {} is out of "
                "range for the embedding table (valid: [{}, {}])", g->node, v, i, -g->rows,
                g->rows - 1);
    if (v < 0) v += g->rows;
    std::memcpy(out + i * g->row_bytes, table + v * g->row_bytes, size_t(g->row_bytes));
  }
}

// ---- concat -----------------------------------------------------------------------------------
struct ConcatState {
  std::vector<ConcatPart> parts;
  int64_t outer = 0, out_chunk_bytes = 0;
  MemRef out;
};

// `n` elements of type E from src (stride ss elements) to dst (stride ds elements).
template <typename E>
void copy_strided_row(char* dst, const char* src, int64_t n, int64_t ss, int64_t ds) {
  for (int64_t i = 0; i < n; ++i)
    std::memcpy(dst + i * ds * int64_t(sizeof(E)), src + i * ss * int64_t(sizeof(E)), sizeof(E));
}

// A strided part, row by row along its last dim: one memcpy when both sides are contiguous
// there, else a copy in the element's own type. (Element by element with the index recomputed
// over every dim, ViT's class-token concat of the transposed patch embedding, [1, 196, 768]
// read with stride 196, took 0.94 ms, 72x its roofline: `kiln profile`.)
void copy_strided_part(const ConcatPart& p, char* dst, const char* src) {
  const size_t r = p.sizes.size();
  const int64_t inner = p.sizes[r - 1], ss = p.strides[r - 1], ds = p.dst_strides[r - 1];
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < r; ++d) rows *= p.sizes[d];
  if (inner <= 0 || rows <= 0) return;
  const int64_t eb = p.elem_bytes;
  int64_t idx[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t row = 0; row < rows; ++row) {
    int64_t so = p.elem_offset, dof = 0;
    for (size_t d = 0; d + 1 < r; ++d) {
      so += idx[d] * p.strides[d];
      dof += idx[d] * p.dst_strides[d];
    }
    char* to = dst + p.dst_offset + dof * eb;
    const char* from = src + so * eb;
    if (ss == 1 && ds == 1) {
      std::memcpy(to, from, size_t(inner * eb));
    } else {
      switch (eb) {
        case 1: copy_strided_row<uint8_t>(to, from, inner, ss, ds); break;
        case 2: copy_strided_row<uint16_t>(to, from, inner, ss, ds); break;
        case 4: copy_strided_row<uint32_t>(to, from, inner, ss, ds); break;
        case 8: copy_strided_row<uint64_t>(to, from, inner, ss, ds); break;
        default:
          for (int64_t i = 0; i < inner; ++i)
            std::memcpy(to + i * ds * eb, from + i * ss * eb, size_t(eb));
      }
    }
    for (size_t d = r - 1; d-- > 0;) {
      if (++idx[d] < p.sizes[d]) break;
      idx[d] = 0;
    }
  }
}

void run_concat(void* s, const Executable::RunContext& c) {
  auto* k = static_cast<ConcatState*>(s);
  char* out = c.slots[k->out.slot] + k->out.byte_offset;
  for (const ConcatPart& p : k->parts) {
    const char* src = c.slots[p.src.slot] + p.src.byte_offset;
    if (!p.sizes.empty()) {
      copy_strided_part(p, p.dst.slot >= 0 ? c.slots[p.dst.slot] + p.dst.byte_offset : out, src);
      continue;
    }
    for (int64_t o = 0; o < k->outer; ++o)
      std::memcpy(out + o * k->out_chunk_bytes + p.dst_offset, src + o * p.chunk_bytes,
                  size_t(p.chunk_bytes));
  }
}

struct UpsampleState {
  UpsampleSpec spec;
  MemRef x, y;
  std::vector<int64_t> nh, nw;                  // nearest
  std::vector<resample::LinearTap> lh, lw;      // bilinear
  resample::WidthTaps wt;                       // float32: lw as int32 columns and float weights
};

void run_upsample(void* s, const Executable::RunContext& c) {
  auto* k = static_cast<UpsampleState*>(s);
  const UpsampleSpec& sp = k->spec;
  const char* x = c.slots[k->x.slot] + k->x.byte_offset;
  char* y = c.slots[k->y.slot] + k->y.byte_offset;
  const int64_t es = dtype_size(sp.dtype);
  const int64_t in_plane = sp.h * sp.w * es, out_plane = sp.ho * sp.wo * es;
  const bool par = sp.planes * sp.ho * sp.wo > 65536;
  // (No OpenMP region on one thread: Note [one-thread parallel regions], kernels/parallel.h.)
  if (!sp.bilinear) {
    kernels::parallel_for(sp.planes, par, [&](int64_t p) {
      resample::nearest_plane(x + p * in_plane, sp.w, 1, y + p * out_plane, es, k->nh, k->nw);
    });
    return;
  }
  if (sp.dtype != DType::Float32) {
    kernels::parallel_for(sp.planes, par, [&](int64_t p) {
      resample::bilinear_plane_f64(x + p * in_plane, sp.w, 1, y + p * out_plane, sp.dtype, k->lh,
                                   k->lw);
    });
    return;
  }
  kernels::parallel_blocks(sp.planes, par, [&](int, int64_t first, int64_t end) {
    // Two interpolated rows per thread: allocated the first time a thread needs them, so that
    // steady-state calls allocate nothing (OpenMP keeps its threads).
    thread_local std::vector<float> cache;
    if (cache.size() < size_t(2 * sp.wo)) cache.resize(size_t(2 * sp.wo));
    for (int64_t p = first; p < end; ++p)
      resample::bilinear_plane_f32(reinterpret_cast<const float*>(x + p * in_plane), sp.w,
                                   reinterpret_cast<float*>(y + p * out_plane), k->lh, k->wt,
                                   cache.data());
  });
}

std::mutex& registry_mutex() {
  static std::mutex m;
  return m;
}
struct LaunchKind {
  Device device;  // where the launch's buffers live: a package of the other device is refused
  LaunchRebuildFn fn;
  LaunchValidateFn validate;  // may be empty
  LaunchPrebuildFn prebuild;  // may be empty
  LaunchPrebuildKeyFn prebuild_key;  // may be empty
};
std::map<std::string, LaunchKind>& registry();

Executable::Launch rebuild_loop(const LaunchRecord& r, LaunchEnv& env, const std::string& where) {
  json p = kernels::parse_untrusted_json(r.params);
  std::string symbol = p.at("symbol").get<std::string>();
  int threads = p.at("threads").get<int>();
  if (threads < 0) throw std::out_of_range("threads must be >= 0");
  if (!env.symbol) fail_kind(ErrorKind::ParseError, "{}: the package has no kernels section", where);
  void* sym = env.symbol(symbol);
  if (!sym)
    fail_kind(ErrorKind::ParseError, "{}: section 'kernels.cpu' has no kernel '{}'", where, symbol);
  if (p.contains("checks")) {
    auto checks = p.at("checks").get<std::vector<IndexCheckText>>();
    if (checks.empty()) throw std::out_of_range("checks must not be empty");
    return make_checked_loop_launch(reinterpret_cast<void (*)(char* const*, int, int64_t*)>(sym),
                                    symbol, threads, std::move(checks)).launch;
  }
  return make_loop_launch(reinterpret_cast<void (*)(char* const*, int)>(sym), symbol, threads).launch;
}

// Note [oneDNN threads at load]
// A oneDNN primitive runs its parallel regions with the thread count it was created for, not the
// caller's: brgconv forks that many OpenMP threads whatever omp_get_max_threads() says at the
// call (Note [oneDNN thread count] in kernels/onednn_node.cc caps a call with more threads, but a
// call with fewer cannot make it use fewer). Packages were rebuilt for the count they were
// written with (the manifest's target.threads), so a package built on a 2-core machine and run
// by a caller that wants one thread ran on two: resnet50's package under `kiln bench --threads 1`
// took 33.5 ms a call with two cores busy, against 54.8 ms on one core as built for one thread.
// On a target with fewer cores than the build machine that oversubscribes every core. So the
// loader builds each oneDNN node for the loading thread's count where that is lower, and keeps
// it only if it is the node as written: the same implementation and layouts (its description),
// the same prepacked weight layouts, no more scratch than planned. oneDNN picks implementations
// by thread count as well as by CPU, so a node that comes out differently is built again for the
// written count, as before, and counted (LoadedPackage::onednn_nodes_at_written_threads); the
// package then computes what it was written to compute either way. The count a load used is
// the process's for the package's life: a later call with fewer threads does not shrink it.
Executable::Launch rebuild_onednn(const LaunchRecord& r, LaunchEnv& env, const std::string& where) {
  json p = kernels::parse_untrusted_json(r.params);
  std::string desc_json = p.at("desc").dump();
  kernels::OnednnNodeDesc desc = kernels::OnednnNodeDesc::from_json(desc_json, where);
  std::vector<MemRef> inputs;
  for (const json& j : p.at("inputs")) inputs.push_back(ref_from(j));
  if (inputs.size() > kernels::kMaxConcatInputs) throw std::out_of_range("too many inputs");
  MemRef out = ref_from(p.at("output")), scratch = ref_from(p.at("scratch"));
  if (out.slot < 0 || scratch.slot < 0) throw std::out_of_range("output and scratch need a slot");
  std::string expect = p.at("expect").get<std::string>();
  int64_t planned_scratch = -1;  // -1: a package from before scratch was planned per node
  if (p.contains("scratch_bytes")) {
    planned_scratch = p.at("scratch_bytes").get<int64_t>();
    if (planned_scratch < 0) throw std::out_of_range("scratch_bytes must not be negative");
  }
  KILN_ASSERT(env.onednn_layouts);
  // Note [prepacked weights] (kernels/onednn_node.cc): weights the package holds in the layout
  // the node's primitive reads, each a 1-D uint8 entry of the weights section, listed once, for
  // a constant operand of this node; every one listed must be taken as the node's weights.
  std::vector<kernels::PrepackedWeights> given;
  if (p.contains("prepacked")) {
    for (const json& e : p.at("prepacked")) {
      std::string constant = e.at("constant").get<std::string>();
      std::string entry = e.at("entry").get<std::string>();
      bool operand = false;
      for (const kernels::OnednnOperand& in : desc.inputs)
        operand = operand || (!constant.empty() && in.constant == constant);
      if (!operand)
        throw std::out_of_range("prepacked weights for '" + constant +
                                "', which is not a constant operand of the node");
      for (const kernels::PrepackedWeights& g : given)
        if (g.constant == constant)
          throw std::out_of_range("prepacked weights for '" + constant + "' listed twice");
      Tensor t = env.constant(entry);
      if (t.dtype() != DType::UInt8 || t.sizes().size() != 1)
        throw std::out_of_range("prepacked entry '" + entry + "' is not a 1-D uint8 tensor");
      given.push_back({constant, e.at("layout").get<std::string>(), t.raw_data(),
                       size_t(t.nbytes())});
    }
  }
  kernels::PrepackedSource source;
  if (!given.empty())
    source = [&given](const std::string& c) -> const kernels::PrepackedWeights* {
      for (const kernels::PrepackedWeights& g : given)
        if (g.constant == c) return &g;
      return nullptr;
    };
  auto build = [&] { return kernels::OnednnNode::build(desc, *env.onednn_layouts, env.constant, source); };
  // Whether every listed prepacked weight is one the node reads as such.
  auto takes_given = [&](const kernels::OnednnNode& n) -> const kernels::PrepackedWeights* {
    for (const kernels::PrepackedWeights& g : given) {
      bool taken = false;
      for (const kernels::PrepackedWeights& w : n.prepacked()) taken = taken || w.constant == g.constant;
      if (!taken) return &g;
    }
    return nullptr;
  };
  std::shared_ptr<kernels::OnednnNode> node;
  ++env.onednn_nodes;
  // Note [oneDNN threads at load]: first for the loading thread's count; kept only if the node is
  // exactly the one written (the checks below would refuse anything else).
  const int current = kernels::cpu_threads();
  if (env.onednn_load_threads > 0 && env.onednn_load_threads < current) {
    try {
      kernels::ScopedCpuThreads fewer(env.onednn_load_threads);
      node = build();
    } catch (const std::exception&) {  // e.g. a prepacked layout it does not compute with:
      node = nullptr;                    // built as written, below (which reports any error)
    }
    if (node && (!node->lowered() || node->description() != expect || takes_given(*node) ||
                 (planned_scratch >= 0 && node->scratch_bytes() > planned_scratch)))
      node = nullptr;
    if (!node) ++env.onednn_nodes_at_written_threads;
  }
  if (!node) {
    try {
      node = build();
    } catch (const Error& e) {  // (a prepacked layout this machine does not compute with)
      throw_error(e.kind(), fmt::format("{}: {}", where, e.message()));
    }
  }
  if (node->lowered())
    if (const kernels::PrepackedWeights* g = takes_given(*node))
      throw std::out_of_range("prepacked weights for '" + g->constant +
                              "', which the node does not read as prepacked weights");
  if (!node->lowered())
    fail_kind(ErrorKind::Runtime, "{}: oneDNN has no implementation for node '{}' on this machine "
              "({}); rebuild the package here with `kiln compile`", where, desc.node,
              node->why_not());
  if (node->description() != expect)
    fail_kind(ErrorKind::Runtime,
              "{}: oneDNN chose differently for node '{}' on this machine than when the package "
              "was built, so it would not compute the same results (built: {}; here: {}). oneDNN "
              "picks implementations by CPU and thread count: run with the thread count the "
              "package was built with (the manifest's target.threads), or rebuild the package "
              "here with `kiln compile`",
              where, desc.node, expect, node->description());
  // Every buffer inside its slot's memory: plain or blocked sizes as the node sees them, the
  // span of a strided matmul operand.
  int elt = desc.bf16 ? 2 : 4;
  auto bytes_of = [&](const kernels::OnednnOperand& o, const std::vector<int64_t>& strides) {
    int64_t b = env.onednn_layouts->value_bytes(o.value);
    if (b >= 0) return b;
    if (!strides.empty()) {
      int64_t last = 0;
      size_t off = o.dims.size() >= strides.size() ? o.dims.size() - strides.size() : 0;
      for (size_t i = 0; i < strides.size() && off + i < o.dims.size(); ++i)
        last += (o.dims[off + i] - 1) * strides[i];
      return (last + 1) * elt;
    }
    int64_t n = elt;
    for (int64_t d : o.dims) n *= d;
    return n;
  };
  if (inputs.size() != desc.inputs.size())
    fail_kind(ErrorKind::ParseError, "{}: {} buffer references for {} inputs", where,
              inputs.size(), desc.inputs.size());
  for (size_t k = 0; k < inputs.size(); ++k)
    if (desc.inputs[k].value >= 0 && desc.inputs[k].constant.empty() && inputs[k].slot < 0)
      fail_kind(ErrorKind::ParseError, "{}: input {} of node '{}' is an activation without a "
                "buffer", where, k, desc.node);
  for (size_t k = 0; k < inputs.size(); ++k)
    if (inputs[k].slot >= 0 && desc.inputs[k].constant.empty())
      check_buffer(env, inputs[k],
                   bytes_of(desc.inputs[k], k < 2 && desc.op == "matmul" ? desc.matmul_strides[k]
                                                                          : std::vector<int64_t>{}),
                   where);
  check_buffer(env, out, bytes_of(desc.output, {}), where);
  check_buffer(env, scratch, node->scratch_bytes(), where);
  if (planned_scratch >= 0 && node->scratch_bytes() > planned_scratch)
    fail_kind(ErrorKind::Runtime, "{}: oneDNN's node '{}' needs {} bytes of scratch on this "
              "machine, the package planned {}; rebuild the package here with `kiln compile`",
              where, desc.node, node->scratch_bytes(), planned_scratch);
  // oneDNN keeps working tables (brgemm's batch address lists) in its scratchpad while other
  // threads write the output: scratch overlapping an operand is not merely wrong, it crashes.
  if (node->scratch_bytes() > 0) {
    auto overlaps = [&](MemRef r, int64_t bytes) {
      return r.slot == scratch.slot && r.byte_offset < scratch.byte_offset + node->scratch_bytes() &&
             scratch.byte_offset < r.byte_offset + bytes;
    };
    bool bad = overlaps(out, bytes_of(desc.output, {}));
    for (size_t k = 0; k < inputs.size(); ++k)
      if (desc.inputs[k].constant.empty() && desc.inputs[k].value >= 0)
        bad = bad || overlaps(inputs[k], bytes_of(desc.inputs[k],
                                                  k < 2 && desc.op == "matmul"
                                                      ? desc.matmul_strides[k]
                                                      : std::vector<int64_t>{}));
    if (bad)
      fail_kind(ErrorKind::ParseError, "{}: the scratch region of node '{}' overlaps its operands",
                where, desc.node);
  }
  return make_onednn_launch(node, desc_json, inputs, out, scratch);
}

Executable::Launch rebuild_gather_rows(const LaunchRecord& r, LaunchEnv& env,
                                       const std::string& where) {
  json p = kernels::parse_untrusted_json(r.params);
  MemRef table = ref_from(p.at("table")), indices = ref_from(p.at("indices")),
         out = ref_from(p.at("out"));
  int64_t rows = p.at("rows").get<int64_t>(), row_bytes = p.at("row_bytes").get<int64_t>(),
          count = p.at("count").get<int64_t>();
  if (table.slot < 0 || indices.slot < 0 || out.slot < 0 || rows < 1 || row_bytes < 0 || count < 0)
    throw std::out_of_range("gather_rows: bad buffers or sizes");
  bool i32 = p.at("int32_indices").get<bool>();
  if (row_bytes > (int64_t(1) << 40) / rows || count > (int64_t(1) << 40))
    throw std::out_of_range("gather_rows: sizes overflow");
  check_buffer(env, table, rows * row_bytes, where);
  check_buffer(env, indices, count * (i32 ? 4 : 8), where);
  check_buffer(env, out, count * row_bytes, where);
  return make_gather_rows_launch(table, rows, row_bytes, indices, i32, count, out,
                                 p.at("node").get<std::string>());
}

Executable::Launch rebuild_concat(const LaunchRecord& r, LaunchEnv& env, const std::string& where) {
  json p = kernels::parse_untrusted_json(r.params);
  int64_t outer = p.at("outer").get<int64_t>(), out_chunk = p.at("out_chunk_bytes").get<int64_t>();
  MemRef out = ref_from(p.at("out"));
  constexpr int64_t kMax = int64_t(1) << 40;
  if (outer < 0 || outer > kMax || out_chunk < 0 || out_chunk > kMax || out.slot < 0 ||
      (outer > 0 && out_chunk > kMax / outer))
    throw std::out_of_range("concat: bad sizes");
  std::vector<ConcatPart> parts;
  for (const json& j : p.at("parts")) {
    if (j.is_object()) {  // a strided part
      ConcatPart part;
      part.src = ref_from(j.at("src"));
      part.dst_offset = j.at("dst_offset").get<int64_t>();
      part.sizes = j.at("sizes").get<std::vector<int64_t>>();
      part.strides = j.at("strides").get<std::vector<int64_t>>();
      part.dst_strides = j.at("dst_strides").get<std::vector<int64_t>>();
      part.elem_offset = j.at("elem_offset").get<int64_t>();
      part.elem_bytes = j.at("elem_bytes").get<int64_t>();
      size_t r = part.sizes.size();
      if (r == 0 || r > 8 || part.strides.size() != r || part.dst_strides.size() != r ||
          part.elem_bytes < 1 || part.elem_bytes > 16 || part.elem_offset < 0 || part.dst_offset < 0 ||
          part.src.slot < 0)
        throw std::out_of_range("concat: malformed strided part");
      int64_t last_src = part.elem_offset, last_dst = 0;
      bool empty = false;
      for (size_t d = 0; d < r; ++d) {
        if (part.sizes[d] < 0 || part.sizes[d] > kMax || part.strides[d] < 0 ||
            part.strides[d] > kMax || part.dst_strides[d] < 0 || part.dst_strides[d] > kMax)
          throw std::out_of_range("concat: strided part sizes or strides out of range");
        empty = empty || part.sizes[d] == 0;
        if (part.sizes[d] > 0) {
          last_src += (part.sizes[d] - 1) * part.strides[d];
          last_dst += (part.sizes[d] - 1) * part.dst_strides[d];
        }
        if (last_src > kMax || last_dst > kMax) throw std::out_of_range("concat: part too large");
      }
      if (j.contains("dst")) part.dst = ref_from(j.at("dst"));
      if (!empty) {
        check_buffer(env, part.src, (last_src + 1) * part.elem_bytes, where);
        if (part.dst.slot >= 0)
          check_buffer(env, part.dst, part.dst_offset + (last_dst + 1) * part.elem_bytes, where);
        else if (part.dst_offset + (last_dst + 1) * part.elem_bytes > outer * out_chunk)
          throw std::out_of_range("concat: a strided part writes past the output");
      }
      parts.push_back(std::move(part));
      continue;
    }
    auto v = j.get<std::vector<int64_t>>();
    if (v.size() != 4 || v[0] < 0 || v[1] < 0 || v[2] < 0 || v[3] < 0 || v[2] > out_chunk ||
        v[3] > out_chunk - v[2])
      throw std::out_of_range("concat: a part must be [slot, offset, chunk_bytes, dst_offset] "
                              "inside the output block");
    const ConcatPart part = contiguous_part(MemRef{int32_t(v[0]), v[1]}, v[2], v[3]);
    check_buffer(env, part.src, outer * part.chunk_bytes, where);
    parts.push_back(part);
  }
  check_buffer(env, out, outer * out_chunk, where);
  return make_concat_launch(std::move(parts), outer, out_chunk, out);
}

Executable::Launch rebuild_upsample(const LaunchRecord& r, LaunchEnv& env, const std::string& where) {
  json p = kernels::parse_untrusted_json(r.params);
  UpsampleSpec sp;
  sp.bilinear = p.at("bilinear").get<bool>();
  sp.align_corners = p.at("align_corners").get<bool>();
  for (uint64_t b : p.at("scales_bits").get<std::vector<uint64_t>>())
    sp.scales.push_back(std::bit_cast<double>(b));
  sp.planes = p.at("planes").get<int64_t>();
  sp.h = p.at("h").get<int64_t>();
  sp.w = p.at("w").get<int64_t>();
  sp.ho = p.at("ho").get<int64_t>();
  sp.wo = p.at("wo").get<int64_t>();
  if (!parse_dtype(p.at("dtype").get<std::string>(), &sp.dtype))
    throw std::out_of_range("upsample: unknown dtype");
  MemRef x = ref_from(p.at("x")), y = ref_from(p.at("y"));
  constexpr int64_t kMaxDim = int64_t(1) << 31, kMax = int64_t(1) << 40;
  for (int64_t d : {sp.planes, sp.h, sp.w, sp.ho, sp.wo})
    if (d < 1 || d > kMaxDim) throw std::out_of_range("upsample: a size out of range");
  const int64_t eb = dtype_size(sp.dtype);
  if (sp.bilinear && !is_floating(sp.dtype))
    throw std::out_of_range("upsample: bilinear needs a floating dtype");
  if (!sp.bilinear && sp.align_corners)
    throw std::out_of_range("upsample: align_corners is bilinear's");
  if (!sp.scales.empty() && sp.scales.size() != 2)
    throw std::out_of_range("upsample: scales must be 0 or 2");
  for (double v : sp.scales)
    if (!(v > 0) || !(v < 2147483648.0)) throw std::out_of_range("upsample: a scale out of range");
  if (x.slot < 0 || y.slot < 0 || sp.h * sp.w > kMax / eb / sp.planes ||
      sp.ho * sp.wo > kMax / eb / sp.planes)
    throw std::out_of_range("upsample: bad buffers or sizes");
  check_buffer(env, x, sp.planes * sp.h * sp.w * eb, where);
  check_buffer(env, y, sp.planes * sp.ho * sp.wo * eb, where);
  return make_upsample_launch(sp, x, y);
}

std::map<std::string, LaunchKind>& registry() {
  static std::map<std::string, LaunchKind> r = {{"loop", {Device::cpu(), rebuild_loop, {}, {}, {}}},
                                                {"onednn", {Device::cpu(), rebuild_onednn, {}, {}, {}}},
                                                {"gather_rows", {Device::cpu(), rebuild_gather_rows, {}, {}, {}}},
                                                {"concat", {Device::cpu(), rebuild_concat, {}, {}, {}}},
                                                {"upsample", {Device::cpu(), rebuild_upsample, {}, {}, {}}}};
  return r;
}

}  // namespace

namespace {
// The launch of a loop kernel's state: plain (no checks) or checked (an error record).
LoopLaunch loop_launch_of(std::shared_ptr<LoopState> state, const std::string& symbol) {
  LoopLaunch out;
  out.threads = &state->threads;
  Executable::Launch& l = out.launch;
  l.fn = state->checked_fn ? run_checked_loop : run_loop;
  l.state = state.get();
  l.kind = "loop";
  l.record = [state, symbol] {
    json p{{"symbol", symbol}, {"threads", state->threads}};
    if (state->checked_fn) p["checks"] = state->checks;
    return LaunchRecord{"loop", p.dump()};
  };
  l.owner = std::move(state);
  return out;
}
}  // namespace

LoopLaunch make_loop_launch(void (*fn)(char* const*, int), const std::string& symbol,
                            int threads) {
  auto state = std::make_shared<LoopState>();
  state->fn = fn;
  state->threads = threads;
  return loop_launch_of(std::move(state), symbol);
}

LoopLaunch make_checked_loop_launch(void (*fn)(char* const*, int, int64_t*),
                                    const std::string& symbol, int threads,
                                    std::vector<IndexCheckText> checks) {
  auto state = std::make_shared<LoopState>();
  state->checked_fn = fn;
  state->threads = threads;
  state->checks = std::move(checks);
  return loop_launch_of(std::move(state), symbol);
}

Executable::Launch make_onednn_launch(std::shared_ptr<const kernels::OnednnNode> node,
                                      const std::string& desc_json,
                                      const std::vector<MemRef>& inputs, MemRef output,
                                      MemRef scratch) {
  auto state = std::make_shared<OnednnState>();
  state->node = std::move(node);
  state->in = inputs;
  state->ptrs.assign(inputs.size(), nullptr);
  state->out = output;
  state->scratch = scratch;
  Executable::Launch l;
  l.fn = run_onednn;
  l.state = state.get();
  l.make_local = [state](char* const*) -> std::shared_ptr<void> {
    auto local = std::make_shared<OnednnState>(*state);
    local->instance = state->node->instance();
    return local;
  };
  l.kind = "onednn";
  l.record = [state, desc_json] {
    json in = json::array();
    for (const MemRef& r : state->in) in.push_back(ref_json(r));
    json p = {{"desc", json::parse(desc_json)},
              {"inputs", in},
              {"output", ref_json(state->out)},
              {"scratch", ref_json(state->scratch)},
              {"scratch_bytes", state->node->scratch_bytes()},
              {"expect", state->node->description()}};
    LaunchRecord r{"onednn", p.dump()};
    for (const kernels::PrepackedWeights& w : state->node->prepacked())
      r.prepacked.push_back({w.constant, w.layout, w.data, w.bytes});
    r.owner = state;
    return r;
  };
  l.owner = std::move(state);
  return l;
}

Executable::Launch make_gather_rows_launch(MemRef table, int64_t rows, int64_t row_bytes,
                                           MemRef indices, bool int32_indices, int64_t count,
                                           MemRef out, const std::string& node) {
  auto state = std::make_shared<GatherRowsState>();
  *state = GatherRowsState{table, indices, out, rows, row_bytes, count, int32_indices, node};
  Executable::Launch l;
  l.fn = run_gather_rows;
  l.state = state.get();
  l.kind = "gather_rows";
  l.record = [state] {
    json p = {{"table", ref_json(state->table)}, {"indices", ref_json(state->indices)},
              {"out", ref_json(state->out)},     {"rows", state->rows},
              {"row_bytes", state->row_bytes},   {"count", state->count},
              {"int32_indices", state->int32_indices}, {"node", state->node}};
    return LaunchRecord{"gather_rows", p.dump()};
  };
  l.owner = std::move(state);
  return l;
}

Executable::Launch make_concat_launch(std::vector<ConcatPart> parts, int64_t outer,
                                      int64_t out_chunk_bytes, MemRef out) {
  auto state = std::make_shared<ConcatState>();
  state->parts = std::move(parts);
  state->outer = outer;
  state->out_chunk_bytes = out_chunk_bytes;
  state->out = out;
  Executable::Launch l;
  l.fn = run_concat;
  l.state = state.get();
  l.kind = "concat";
  l.record = [state] {
    json parts = json::array();
    for (const ConcatPart& p : state->parts) {
      if (p.sizes.empty())
        parts.push_back({p.src.slot, p.src.byte_offset, p.chunk_bytes, p.dst_offset});
      else
        parts.push_back({{"src", ref_json(p.src)}, {"dst_offset", p.dst_offset},
                         {"sizes", p.sizes}, {"strides", p.strides},
                         {"dst_strides", p.dst_strides}, {"elem_offset", p.elem_offset},
                         {"elem_bytes", p.elem_bytes}});
      if (p.dst.slot >= 0) parts.back()["dst"] = ref_json(p.dst);
    }
    json p = {{"parts", parts}, {"outer", state->outer},
              {"out_chunk_bytes", state->out_chunk_bytes}, {"out", ref_json(state->out)}};
    return LaunchRecord{"concat", p.dump()};
  };
  l.owner = std::move(state);
  return l;
}

Executable::Launch make_upsample_launch(const UpsampleSpec& spec, MemRef x, MemRef y) {
  auto state = std::make_shared<UpsampleState>();
  state->spec = spec;
  state->x = x;
  state->y = y;
  if (spec.bilinear) {
    state->lh = resample::linear_table(spec.h, spec.ho, spec.align_corners, spec.scales, 0);
    state->lw = resample::linear_table(spec.w, spec.wo, spec.align_corners, spec.scales, 1);
    if (spec.dtype == DType::Float32) state->wt = resample::width_taps(state->lw);
  } else {
    state->nh = resample::nearest_table(spec.h, spec.ho, spec.scales, 0);
    state->nw = resample::nearest_table(spec.w, spec.wo, spec.scales, 1);
  }
  Executable::Launch l;
  l.fn = run_upsample;
  l.state = state.get();
  l.kind = "upsample";
  l.record = [state] {
    const UpsampleSpec& s = state->spec;
    std::vector<uint64_t> bits;
    for (double v : s.scales) bits.push_back(std::bit_cast<uint64_t>(v));
    json p = {{"bilinear", s.bilinear}, {"align_corners", s.align_corners}, {"scales_bits", bits},
              {"planes", s.planes}, {"h", s.h}, {"w", s.w}, {"ho", s.ho}, {"wo", s.wo},
              {"dtype", dtype_name(s.dtype)}, {"x", ref_json(state->x)}, {"y", ref_json(state->y)}};
    return LaunchRecord{"upsample", p.dump()};
  };
  l.owner = std::move(state);
  return l;
}

namespace {
// The registered kind of `record`, or the error that lists the known ones.
LaunchKind find_launch_kind(const LaunchRecord& record, const std::string& where) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = registry().find(record.kind);
  if (it == registry().end()) {
    std::string known;
    for (const auto& [kind, entry] : registry()) known += (known.empty() ? "" : ", ") + kind;
    fail_kind(ErrorKind::ParseError, "{}: unknown launch kind '{}' (this runtime knows {}); "
              "the package was written by a newer Kiln: load it with that runtime",
              where, record.kind, known);
  }
  return it->second;
}
}  // namespace

namespace {
// Runs fn(record, env, where): a parse failure of another type (a JSON access, a range) becomes
// the ParseError that names the launch.
template <typename Fn>
auto read_record(const Fn& fn, const LaunchRecord& record, LaunchEnv& env, const std::string& where) {
  try {
    return fn(record, env, where);
  } catch (const Error&) {
    throw;
  } catch (const std::exception& e) {
    fail_kind(ErrorKind::ParseError, "{}: malformed {} launch: {}", where, record.kind, e.what());
  }
}
}  // namespace

Executable::Launch rebuild_launch(const LaunchRecord& record, LaunchEnv& env,
                                  const std::string& where) {
  return read_record(find_launch_kind(record, where).fn, record, env, where);
}

bool validate_launch_record(const LaunchRecord& record, LaunchEnv& env, const std::string& where) {
  LaunchValidateFn fn = find_launch_kind(record, where).validate;
  if (!fn) return false;
  read_record(fn, record, env, where);
  return true;
}

void register_launch_kind(const std::string& kind, Device device, LaunchRebuildFn fn,
                          LaunchValidateFn validate, LaunchPrebuildFn prebuild,
                          LaunchPrebuildKeyFn prebuild_key) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  registry()[kind] = LaunchKind{device, std::move(fn), std::move(validate), std::move(prebuild),
                                std::move(prebuild_key)};
}

bool library_plans_shared() {
  static const bool on = [] {
    const char* v = std::getenv("KILN_SHARED_PLANS");
    return !(v && std::string_view(v) == "0");
  }();
  return on;
}

std::vector<std::shared_ptr<void>> prebuild_launches(const std::vector<LaunchRecord>& records,
                                                     const LaunchEnv& env,
                                                     const std::vector<std::string>& where,
                                                     int max_threads) {
  KILN_ASSERT(where.size() == records.size());
  std::vector<std::shared_ptr<void>> out(records.size());
  std::vector<std::pair<size_t, LaunchPrebuildFn>> work;
  // Records whose key an earlier record has: (record, the earlier record) — given its result.
  std::vector<std::pair<size_t, size_t>> sharing;
  {
    std::vector<std::pair<std::string, size_t>> first_of_key;  // "kind\0key" -> record
    std::lock_guard<std::mutex> lock(registry_mutex());
    for (size_t i = 0; i < records.size(); ++i) {
      auto it = registry().find(records[i].kind);
      if (it == registry().end() || !it->second.prebuild) continue;
      std::string key;
      if (it->second.prebuild_key && library_plans_shared()) {
        try {
          key = it->second.prebuild_key(records[i]);
        } catch (...) {
          key.clear();  // a malformed record: prebuilt alone (rebuild reports it)
        }
      }
      if (!key.empty()) {
        key = records[i].kind + std::string(1, '\0') + key;
        auto seen = std::find_if(first_of_key.begin(), first_of_key.end(),
                                 [&](const auto& e) { return e.first == key; });
        if (seen != first_of_key.end()) {
          sharing.emplace_back(i, seen->second);
          continue;
        }
        first_of_key.emplace_back(std::move(key), i);
      }
      work.emplace_back(i, it->second.prebuild);
    }
  }
  if (work.empty()) return out;
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t k = next++; k < work.size(); k = next++) {
      const size_t i = work[k].first;
      try {
        out[i] = work[k].second(records[i], env, where[i]);
      } catch (...) {
        out[i] = nullptr;  // rebuild does it again and reports what went wrong
      }
    }
  };
  const size_t threads = std::min(work.size(), size_t(std::max(1, max_threads)));
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
  for (auto [i, from] : sharing) out[i] = out[from];
  return out;
}

std::optional<Device> launch_kind_device(const std::string& kind) {
  std::lock_guard<std::mutex> lock(registry_mutex());
  auto it = registry().find(kind);
  if (it == registry().end()) return std::nullopt;
  return it->second.device;
}

}  // namespace kiln
