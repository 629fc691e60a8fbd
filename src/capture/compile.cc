// kiln::compile — capture, guards, the compile cache, graph breaks and fallback.
//
// Note [Capture]
// A compiled function keeps a list of entries. An entry is valid for one guard set: the
// inputs' count/dtype/device/shape/strides and the identity+version of every parameter the
// captured graphs froze. A call walks the entries (a few integer comparisons each) and replays
// the first whose guards hold; otherwise it traces the function again (a recompile, whose reason
// is recorded in words) and adds an entry, up to cache_size_limit — after that, new guard sets
// run eagerly, with one loud warning and a counter.
//
// Tracing runs the user's host code with a dispatch hook installed: every op call is recorded
// into a Graph and returns a *fake* tensor (type, no data) standing for the graph value. Host
// control flow that depends only on shapes runs normally and is specialized by the shape guards.
// When host code reads tensor data (item(), to_vector(), raw data), the materialization hook
// fires: that is a graph break. The graph recorded so far (a segment) is compiled by the backend
// and run; every fake tensor the host code still holds receives its real data; the host code
// continues with real values and a new segment begins.
//
// Entries come in two kinds:
//   - whole graph (no break): a replay runs the compiled graph directly; host code is not
//     re-run (as with Dynamo, side effects of host code happen at trace time only);
//   - segmented (one or more breaks): a replay re-runs the host code under the hook (it must,
//     to compute the host values between graphs) and looks each segment up by its structural
//     key; the host values that steered control flow therefore take effect on every call, and a
//     segment that differs (another branch) is compiled and cached rather than returning a
//     wrong answer. The reads are reported as value guards.
//
// Tensors the traced code uses that are neither inputs nor produced by recorded ops become
// graph constants when the host code made them during the trace and they are small
// (<= kMaxConstElements; baked by value, part of the segment key), and frozen parameters
// otherwise (held by identity, guarded by identity and version: mutating one recompiles).
//
// check_host_values (or KILN_CHECK_CAPTURE=1): a whole-graph entry also keeps the trace key of
// its graph (ops, attributes, constants by value, frozen tensors by identity, host-made tensors
// by content, where each output comes from). Before a replay, the host code runs under a dry
// tracer that records the same key and computes nothing; a different key (or a read of tensor
// data, which a whole-graph trace never did) means the host code would now build another
// graph, and the call retraces with the difference as the reason. The dry key is computed once
// per call and compared with every candidate entry.
//
// Failures: if the backend fails to compile a segment, or a compiled segment fails at run
// time, the call completes by interpreting that segment with the eager kernels, the failure is
// reported once and counted; with strict=true the error propagates instead.
//
// Note [Host reads of call inputs]
// The traced code gets the call's real input tensors (ops on them are recorded; their values
// are graph inputs). Host code may also read an input's data directly (`in[1].item()`,
// to_vector(), raw data): that value steers what the host code does, exactly like a read of a
// recorded value, and a whole-graph entry replays without re-running the host code. So while a
// Tracer lives it watches its inputs' storages (Storage::capture_watch; a count, as several
// traces on several threads may share an input), and the materialization hook treats a read of
// watched data as a graph break: the segment so far is run, the value becomes a value guard, the
// entry is segmented, and every later call re-runs the host code and reads the value again.
// Before, such a read was silently baked into the graph (a call with another value replayed
// the first value's branch). The tracer's own reads (a value guard's text, a segment's run) are
// made with the hook off.
//
// Note [Concurrent calls]
// One compiled function may be called from several threads at once. Two locks, neither held
// while a compiled graph runs:
//   - State::mu (a reader-writer lock) guards the entry list, the guards of published entries
//     and the report logs. A call holds it shared only to check guards and pick an entry (it
//     takes a reference to the entry, so reset() or a dropped entry cannot free it mid-run);
//     writers (a new entry, dropped entries, a log line, a guard a segmented replay adds) hold
//     it exclusively for a moment.
//   - State::trace_mu serializes what runs the host code under the hook: first traces (and the
//     compiles they trigger) and replays of segmented entries. A call that finds no entry takes
//     it and looks again (another thread may have traced the same signature meanwhile).
// A whole-graph replay therefore takes the shared lock, checks guards, drops the lock and runs
// the backend's graph, which must be reentrant (the compiler's Executable runs each call on an
// execution context of its own: Note [Execution contexts] in runtime/executable.cc). Counters
// are atomic. A function called from inside its own trace (the traced code calls it again)
// would deadlock on trace_mu, or replay with the trace's fake tensors: it is an error instead,
// detected by a thread-local list of the functions this thread is tracing.
#include "capture/compile.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "compiler/backend.h"
#include "capture/guards.h"
#include "ops/dispatch.h"
#include "ir/graph.h"
#include "ir/interpreter.h"
#include "ir/printer.h"
#include "passes/autocast.h"

namespace kiln {

namespace {
constexpr int64_t kMaxConstElements = 64;

}  // namespace

// ---- state -------------------------------------------------------------------------------------
namespace {

struct CompiledSegment {
  Graph graph;
  std::unique_ptr<CompiledGraph> compiled;  // null: compile failed, interpret instead
  std::atomic<bool> runtime_failure_reported{false};
};

struct OutputSource {
  enum Kind { GraphOutput, CallInput, Constant } kind;
  int index = 0;
  Tensor constant;
};

struct Entry {
  InputGuards input_guards;
  ParamGuards param_guards;
  std::unordered_set<const TensorImpl*> guarded_params;
  bool segmented = false;
  // Whole graph.
  std::shared_ptr<CompiledSegment> whole;
  std::vector<int> graph_input_from_call;
  std::vector<OutputSource> outputs;
  // Segmented: segments by structural key.
  std::unordered_map<std::string, std::shared_ptr<CompiledSegment>> segments;
  std::vector<std::string> value_guards;
  std::string whole_key;  // check_host_values: the trace key of the whole graph
  std::string host_state;                 // HostStateGuard::fingerprint() when traced
  // The epoch at which host_state last matched (written by concurrent guard checks).
  std::atomic<uint64_t> host_state_epoch{~uint64_t(0)};
};

// CompileStats as atomics (Note [Concurrent calls]); `entries` is the entry list's size.
struct Counters {
  std::atomic<int64_t> calls{0}, compiled_calls{0}, traces{0}, graphs_compiled{0}, recompiles{0},
      graph_breaks{0}, fallbacks_cache_limit{0}, fallbacks_compile_error{0},
      fallbacks_runtime_error{0}, host_value_checks{0};
  CompileStats snapshot() const {
    CompileStats s;
    s.calls = calls.load();
    s.compiled_calls = compiled_calls.load();
    s.traces = traces.load();
    s.graphs_compiled = graphs_compiled.load();
    s.recompiles = recompiles.load();
    s.graph_breaks = graph_breaks.load();
    s.fallbacks_cache_limit = fallbacks_cache_limit.load();
    s.fallbacks_compile_error = fallbacks_compile_error.load();
    s.fallbacks_runtime_error = fallbacks_runtime_error.load();
    s.host_value_checks = host_value_checks.load();
    return s;
  }
};

}  // namespace

struct CompiledFunction::State {
  Callable fn;
  CompileOptions options;
  std::string backend;  // options.backend, or the default backend when that is empty
  std::unordered_map<const TensorImpl*, std::string> param_names;  // module parameter names
  HostStateGuard host_state;
  bool check_host_values = false;  // options.check_host_values or KILN_CHECK_CAPTURE=1
  // Note [Concurrent calls]: `mu` guards entries (and their guards once published) and the
  // logs below; `trace_mu` serializes traces and segmented replays.
  std::shared_mutex mu;
  std::mutex trace_mu;
  std::vector<std::shared_ptr<Entry>> entries;
  Counters stats;
  // Report of the most recent trace, and the running logs.
  std::vector<ExplainGraph> last_graphs;
  std::vector<ExplainBreak> last_breaks;
  std::vector<std::string> recompiles;
  std::vector<std::string> fallbacks;
  bool warned_cache_limit = false;
  bool warned_dynamic = false;
};

namespace {

std::mutex g_states_mu;
std::vector<std::weak_ptr<CompiledFunction::State>>& all_states() {
  static auto* v = new std::vector<std::weak_ptr<CompiledFunction::State>>();
  return *v;
}

void warn(const std::string& msg) { std::fprintf(stderr, "kiln: warning: %s\n", msg.c_str()); }

// What a graph froze from the host, with the call site of the op that reads it.
std::vector<std::string> baked_values(const Graph& graph,
                                      const std::unordered_map<const TensorImpl*, std::string>& module_state) {
  std::vector<std::string> out;
  std::unordered_set<ValueId> listed;
  for (const Node& n : graph.nodes) {
    const char* op = op_def(n.op).name;
    for (ValueId v : n.inputs) {
      if (v == kNoValue || !listed.insert(v).second) continue;
      const Value& val = graph.value(v);
      if (val.kind == ValueKind::Const && val.data.defined()) {
        const Tensor& c = val.data;
        Tensor h = c.device().is_cpu() ? c : c.to(Device::cpu());
        std::string what = c.numel() == 1
                               ? fmt::format("scalar {}", h.to(DType::Float64).to_vector<double>()[0])
                               : fmt::format("constant {} {}", dtype_name(c.dtype()), h.str(8));
        out.push_back(fmt::format("{} at {}: {} is part of the graph", op, n.name, what));
      } else if (val.kind == ValueKind::Param && val.data.defined() &&
                 !module_state.count(val.data.impl())) {
        out.push_back(fmt::format("{} at {}: tensor '{}' {} reached from host code is frozen "
                                  "(guarded by identity and version, not by where it came from)",
                                  op, n.name, val.name, val.type.str()));
      }
    }
    for (auto& [name, a] : n.attrs.items())
      if (std::holds_alternative<double>(a))
        out.push_back(fmt::format("{} at {}: attribute {}={} is part of the graph", op, n.name,
                                  name, attr_value_str(a)));
  }
  return out;
}

ExplainGraph explain_graph(const CompiledSegment& seg,
                           const std::unordered_map<const TensorImpl*, std::string>& module_state) {
  ExplainGraph g;
  g.baked = baked_values(seg.graph, module_state);
  for (const Node& n : seg.graph.nodes) g.ops.push_back(op_def(n.op).name);
  g.num_inputs = int(seg.graph.inputs.size());
  g.num_params = int(seg.graph.params().size());
  g.num_outputs = int(seg.graph.outputs.size());
  g.ir = print_graph(seg.graph);
  g.backend_summary = seg.compiled ? seg.compiled->summary() : "compile failed: interpreted eagerly";
  if (seg.compiled) {
    g.arena_bytes = seg.compiled->arena_bytes();
    g.launches = seg.compiled->launches();
    g.cache_hit = seg.compiled->cache_hit();
  }
  return g;
}

// ---- the tracer --------------------------------------------------------------------------------
class Tracer;
thread_local Tracer* t_tracer = nullptr;
uint64_t next_epoch() {
  static std::atomic<uint64_t> e{1};
  return e.fetch_add(1);
}

// Thrown by a dry trace (check_host_values) when the host code reads tensor data: the entry
// being checked is a whole graph, so the code now takes another path.
struct HostCodeDiverged {
  std::string why;
};

uint64_t fnv1a(const void* data, size_t n) {
  uint64_t h = 1469598103934665603ull;
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
  return h;
}

class Tracer final : public DispatchHook {
 public:
  // dry: record the trace key only (check_host_values): no compile, no run, no guards added.
  Tracer(CompiledFunction::State& st, Entry& entry, const TensorList& call_inputs, bool dry = false)
      : st_(st), entry_(entry), call_inputs_(call_inputs), dry_(dry) {
    for (size_t i = 0; i < call_inputs.size(); ++i)
      if (call_inputs[i].defined()) {
        call_index_.emplace(call_inputs[i].impl(), int(i));
        if (Storage* s = call_inputs[i].impl()->storage.get())
          if (watched_.emplace(s, int(i)).second) s->capture_watch.fetch_add(1, std::memory_order_relaxed);
      }
  }
  ~Tracer() {
    for (auto& [s, i] : watched_) s->capture_watch.fetch_sub(1, std::memory_order_relaxed);
  }
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  // Runs fn under capture; returns its outputs (real tensors).
  TensorList run() {
    if (dry_)
      st_.stats.host_value_checks++;
    else
      st_.stats.traces++;
    begin_segment();
    TensorList outs;
    {
      HookScope scope(this);
      outs = st_.fn(call_inputs_);
    }
    end_segment(nullptr, nullptr, nullptr, &outs);
    return outs;
  }

  int num_segments() const { return segments_run_; }
  const std::vector<ExplainGraph>& graphs() const { return graphs_; }
  const std::vector<ExplainBreak>& breaks() const { return breaks_; }
  // Whole-graph plan pieces (valid when num_segments() == 1).
  std::shared_ptr<CompiledSegment> last_segment() const { return last_segment_; }
  const std::vector<int>& last_input_from_call() const { return last_input_from_call_; }
  const std::vector<OutputSource>& output_sources() const { return output_sources_; }
  // The whole trace's key (valid after run() of a whole-graph trace): the last segment's key
  // and where each returned tensor comes from.
  std::string trace_key() const {
    std::string k = key_;
    k += "\nret:";
    for (const OutputSource& o : output_sources_) {
      if (o.kind == OutputSource::Constant)
        k += fmt::format("K{},", static_cast<const void*>(o.constant.defined() ? o.constant.impl() : nullptr));
      else
        k += fmt::format("{}{},", o.kind == OutputSource::GraphOutput ? 'G' : 'I', o.index);
    }
    return k;
  }

  bool intercept(OpId op, std::span<const Tensor> inputs, const Attrs& attrs, TensorList& outputs,
                 const std::source_location& loc) override {
    std::vector<ValueId> ids;
    ids.reserve(inputs.size());
    for (const Tensor& t : inputs) ids.push_back(value_for(t));
    const std::string* node_name = current_node_name();
    std::string where = node_name ? *node_name : location_str(loc);
    std::vector<ValueId> outs = graph_.add_node(op, ids, attrs, where);
    const Node& node = graph_.nodes.back();
    key_ += op_def(op).name;
    key_ += '(';
    for (ValueId v : ids) key_ += std::to_string(v) + ',';
    key_ += "){";
    for (auto& [n, v] : node.attrs.items()) key_ += n + "=" + attr_value_str(v) + ";";
    key_ += "}\n";
    outputs.clear();
    for (ValueId v : outs) {
      const TensorType& ty = graph_.type(v);
      Tensor f = Tensor::fake(to_dims(ty.shape, "captured value shape"), ty.dtype, ty.device);
      f.impl()->capture_value = v;
      f.impl()->capture_epoch = epoch_;
      if (fakes_.size() <= size_t(v)) fakes_.resize(size_t(v) + 1);
      fakes_[size_t(v)] = f.impl_ref();
      outputs.push_back(std::move(f));
    }
    return true;
  }

  static void materialize_hook(TensorImpl* impl, const char* what, const char* where) {
    Tracer* t = t_tracer;
    if (!t) return;
    if (impl->storage) {  // Note [Host reads of call inputs]
      if (!t->watched_.count(impl->storage.get())) return;  // another trace's input
    } else if (impl->capture_epoch != t->epoch_) {
      return;
    }
    if (t->dry_)
      throw HostCodeDiverged{fmt::format("the host code now reads tensor data ({} at {}): it "
                                         "takes another path than when it was traced",
                                         what, where && *where ? where : "<unknown location>")};
    t->on_break(impl, what, where);
  }

 private:
  struct HookScope {
    explicit HookScope(Tracer* t) {
      prev_tracer = t_tracer;
      t_tracer = t;
      prev_hook = set_dispatch_hook(t);
      prev_mat = set_materialize_hook(&Tracer::materialize_hook);
    }
    ~HookScope() {
      set_materialize_hook(prev_mat);
      set_dispatch_hook(prev_hook);
      t_tracer = prev_tracer;
    }
    Tracer* prev_tracer;
    DispatchHook* prev_hook;
    MaterializeHook prev_mat;
  };

  void begin_segment() {
    graph_ = Graph();
    graph_.name = fmt::format("graph{}", segments_run_);
    known_.clear();
    fakes_.clear();
    seg_inputs_.clear();
    key_.clear();
    epoch_ = next_epoch();
  }

  ValueId value_for(const Tensor& t) {
    if (!t.defined()) return kNoValue;
    TensorImpl* impl = t.impl();
    if (!impl->storage && impl->capture_value >= 0) {
      if (impl->capture_epoch == epoch_) return ValueId(impl->capture_value);
      fail("a tensor captured by another compiled call (or an earlier trace) is used here "
           "without data; keep tensors from one compiled function inside it");
    }
    auto it = known_.find(impl);
    if (it != known_.end()) return it->second;
    ValueId v;
    auto ci = call_index_.find(impl);
    bool from_host_graph = materialized_.count(impl) > 0;
    if (ci != call_index_.end() || from_host_graph) {
      std::string name = ci != call_index_.end() ? fmt::format("input{}", ci->second)
                                                 : fmt::format("carried{}", seg_inputs_.size());
      v = graph_.add_input(graph_.unique_name(name), t.type());
      if (!t.is_contiguous()) graph_.value(v).type.strides = to_shape(t.strides());
      seg_inputs_.push_back(t);
      key_ += fmt::format("in:{}:{}\n", name, t.type().str());
    } else if (t.numel() <= kMaxConstElements && !st_.param_names.count(impl) &&
               impl->storage->serial() >= trace_start_serial_) {
      // Made by the host code during this trace (e.g. a scalar operand): a constant by value.
      // The constant keeps its device (a CUDA scalar operand stays a CUDA constant, so the
      // node's inputs share one device); the key holds its bytes, read on the host.
      // A dry trace keeps no graph: it needs the bytes for the key only.
      Tensor host = t.device().is_cpu() ? (dry_ ? t.contiguous() : t.clone()) : t.to(Device::cpu());
      Tensor c = t.device().is_cpu() || dry_ ? host : host.to(t.device());
      v = graph_.add_const(dry_ ? t : c);
      key_ += "const:" + t.type().str() + ":";
      const char* p = static_cast<const char*>(host.raw_data());
      key_.append(p, host.nbytes());
      key_ += '\n';
    } else {
      auto pn = st_.param_names.find(impl);
      if (pn == st_.param_names.end() && impl->storage) {
        // Note [Host reads of call inputs]: a tensor over an input's storage that is not the
        // input itself was made outside the op API (Tensor::as_strided). Frozen as a parameter
        // it would replay this call's data on every later call.
        auto w = watched_.find(impl->storage.get());
        if (w != watched_.end())
          fail("a view of the call's input {} made outside the op API (Tensor::as_strided, or "
               "another tensor over its storage) is used by an op: capture cannot record how it "
               "derives from the input and would freeze this call's data. Make the view with "
               "the op API (reshape, slice, permute, expand, select, ...)", w->second);
      }
      std::string name = pn != st_.param_names.end() ? pn->second : fmt::format("tensor{}", known_.size());
      v = graph_.add_param(graph_.unique_name(name), t);
      if (!dry_ && !entry_.guarded_params.count(impl)) {
        // A segmented replay adds to a published entry, whose guards other calls check.
        std::unique_lock<std::shared_mutex> lock(st_.mu);
        entry_.guarded_params.insert(impl);
        entry_.param_guards.add(t, name);
      }
      if (impl->storage && impl->storage->serial() >= trace_start_serial_) {
        // Made by the host code during this trace but too large to bake by value: a new tensor
        // on every call, so its key is its content (a cached segment froze equal bytes).
        Tensor c = t.device().is_cpu() ? t.contiguous() : t.to(Device::cpu());
        key_ += fmt::format("fresh:{}:{}:{:016x}\n", t.type().str(), name,
                            fnv1a(c.raw_data(), size_t(c.nbytes())));
      } else {
        key_ += fmt::format("param:{}:{}\n", static_cast<const void*>(impl), name);
      }
    }
    known_.emplace(impl, v);
    // Keep the tensor alive for the whole trace: known_ and materialized_ key on addresses,
    // and a freed TensorImpl's address may be reused by the next temporary (a scalar operand).
    keep_alive_.push_back(t.impl_ref());
    return v;
  }

  void on_break(TensorImpl* reading, const char* what, const char* where) {
    std::string loc = where && *where ? where : "<unknown location>";
    const Node* producer = nullptr;
    if (reading->capture_value >= 0) {
      const Value& val = graph_.value(ValueId(reading->capture_value));
      if (val.kind == ValueKind::NodeOutput) producer = &graph_.nodes[size_t(val.producer)];
    }
    std::string reason = fmt::format("{} reads tensor data on the host", what);
    if (reading->storage) {
      auto w = watched_.find(reading->storage.get());
      if (w != watched_.end()) reason += fmt::format(" (the data of the call's input {})", w->second);
    }
    if (producer)
      reason += fmt::format(" (the tensor comes from op '{}' at {})", op_def(producer->op).name,
                            producer->name);
    if (st_.options.fullgraph)
      fail("fullgraph=true, but the code breaks the graph at {}: {}. Keep the computation in "
           "tensor ops (a branch on a tensor's value as kiln::cond, ops/cond.h, or "
           "kiln::where) or compile with fullgraph=false",
           loc, reason);
    breaks_.push_back({reason, loc});
    st_.stats.graph_breaks++;
    end_segment(reading, what, where, nullptr);
    // The value read steers host control flow: report it as a value guard. (Reading it here is
    // no break: the hook is off for this scope.)
    MaterializeHook prev_mat = set_materialize_hook(nullptr);
    struct RestoreHook {
      MaterializeHook p;
      ~RestoreHook() { set_materialize_hook(p); }
    } restore_hook{prev_mat};
    Tensor t{Ref<TensorImpl>(reading)};
    std::string value;
    if (t.numel() <= 8) {
      Tensor c = t.device().is_cpu() ? t : t.to(Device::cpu());
      value = c.str(8);
    } else {
      value = t.type().str();
    }
    std::string guard = fmt::format("value read by {} at {} == {}", what, loc, value);
    {
      std::unique_lock<std::shared_mutex> lock(st_.mu);  // report() reads them
      if (std::find(entry_.value_guards.begin(), entry_.value_guards.end(), guard) ==
          entry_.value_guards.end())
        entry_.value_guards.push_back(guard);
    }
    begin_segment();
  }

  // Compiles (or finds) and runs the current segment, giving real data to every fake tensor
  // still referenced outside the tracer (and to the returned tensors).
  void end_segment(TensorImpl* reading, const char*, const char*, TensorList* returned) {
    std::vector<ValueId> outs;
    std::unordered_set<ValueId> seen;
    auto want = [&](ValueId v) {
      if (seen.insert(v).second) outs.push_back(v);
    };
    if (returned)
      for (const Tensor& t : *returned)
        if (t.defined() && !t.has_storage() && t.impl()->capture_epoch == epoch_)
          want(ValueId(t.impl()->capture_value));
    if (reading && reading->capture_value >= 0) want(ValueId(reading->capture_value));
    for (size_t v = 0; v < fakes_.size(); ++v)
      if (fakes_[v] && fakes_[v]->ref_count() > 1) want(ValueId(v));
    if (graph_.nodes.empty() && outs.empty()) {
      // Nothing recorded (e.g. the function only returns its inputs).
      finish_outputs(returned, nullptr);
      return;
    }
    graph_.outputs = outs;
    key_ += "out:";
    for (ValueId v : outs) key_ += std::to_string(v) + ",";
    if (dry_) {
      ++segments_run_;
      finish_outputs(returned, &outs);
      return;
    }

    std::shared_ptr<CompiledSegment> seg;
    auto found = entry_.segments.find(key_);
    if (found != entry_.segments.end()) {
      seg = found->second;
    } else {
      seg = std::make_shared<CompiledSegment>();
      seg->graph = graph_;
      compile_segment(*seg);
      entry_.segments.emplace(key_, seg);
    }
    TensorList results = run_segment(*seg, seg_inputs_);
    KILN_ASSERT(results.size() == outs.size());
    for (size_t i = 0; i < outs.size(); ++i) {
      TensorImpl* impl = fakes_[size_t(outs[i])].get();
      const Tensor& r = results[i];
      KILN_ASSERT(r.dtype() == impl->dtype && r.sizes() == impl->sizes);
      impl->storage = r.impl()->storage;
      impl->offset = r.offset();
      impl->strides = r.strides();
      impl->device = r.device();
      impl->capture_value = -1;
      materialized_.insert(impl);
      keep_alive_.push_back(fakes_[size_t(outs[i])]);
    }
    graphs_.push_back(explain_graph(*seg, st_.param_names));
    last_segment_ = seg;
    last_input_from_call_.clear();
    for (const Tensor& t : seg_inputs_) {
      auto ci = call_index_.find(t.impl());
      last_input_from_call_.push_back(ci == call_index_.end() ? -1 : ci->second);
    }
    ++segments_run_;
    finish_outputs(returned, &outs);
  }

  void finish_outputs(TensorList* returned, const std::vector<ValueId>* outs) {
    if (!returned) return;
    output_sources_.clear();
    for (const Tensor& t : *returned) {
      OutputSource src{OutputSource::Constant, 0, t};
      if (t.defined()) {
        auto ci = call_index_.find(t.impl());
        if (ci != call_index_.end()) {
          src = {OutputSource::CallInput, ci->second, Tensor()};
        } else if (outs) {
          for (size_t i = 0; i < fakes_.size(); ++i)
            if (fakes_[i].get() == t.impl()) {
              for (size_t k = 0; k < outs->size(); ++k)
                if ((*outs)[k] == ValueId(i)) src = {OutputSource::GraphOutput, int(k), Tensor()};
            }
        }
      }
      output_sources_.push_back(src);
    }
  }

  void compile_segment(CompiledSegment& seg) {
    try {
      BackendOptions bo;
      bo.mode = st_.options.mode;
      bo.precision = st_.options.precision;
      seg.compiled = find_backend(st_.backend)(seg.graph, bo);
      st_.stats.graphs_compiled++;
    } catch (const Error& e) {
      if (st_.options.strict) throw;
      st_.stats.fallbacks_compile_error++;
      std::string msg = fmt::format("graph '{}' ({} ops) failed to compile with backend '{}': "
                                    "{}; running it eagerly", seg.graph.name,
                                    seg.graph.nodes.size(), st_.backend, e.what());
      {
        std::unique_lock<std::shared_mutex> lock(st_.mu);
        st_.fallbacks.push_back(msg);
      }
      warn(msg);
    }
  }

 public:
  static TensorList run_segment(CompiledFunction::State& st, CompiledSegment& seg,
                                const TensorList& inputs) {
    if (seg.compiled) {
      try {
        return seg.compiled->run(inputs);
      } catch (const Error& e) {
        if (st.options.strict) throw;
        st.stats.fallbacks_runtime_error++;
        if (!seg.runtime_failure_reported.exchange(true)) {
          std::string msg = fmt::format("graph '{}' ({} ops) failed at run time: {}; this call "
                                        "completes eagerly", seg.graph.name,
                                        seg.graph.nodes.size(), e.what());
          {
            std::unique_lock<std::shared_mutex> lock(st.mu);
            st.fallbacks.push_back(msg);
          }
          warn(msg);
        }
      }
    }
    NoDispatchHook no_hook;
    return ::kiln::run(seg.graph, inputs);
  }

 private:
  TensorList run_segment(CompiledSegment& seg, const TensorList& inputs) {
    NoDispatchHook no_hook;  // the backend runs real kernels
    MaterializeHook prev = set_materialize_hook(nullptr);
    struct Restore {
      MaterializeHook p;
      ~Restore() { set_materialize_hook(p); }
    } restore{prev};
    return run_segment(st_, seg, inputs);
  }

  CompiledFunction::State& st_;
  Entry& entry_;
  const TensorList& call_inputs_;
  const bool dry_;
  std::unordered_map<const TensorImpl*, int> call_index_;
  // The call inputs' storages (each to its first input's index), watched while this tracer
  // lives: a host read of their data is a graph break (Note [Host reads of call inputs]).
  std::unordered_map<Storage*, int> watched_;
  std::unordered_set<const TensorImpl*> materialized_;
  std::vector<Ref<TensorImpl>> keep_alive_;

  Graph graph_;
  std::unordered_map<const TensorImpl*, ValueId> known_;
  std::vector<Ref<TensorImpl>> fakes_;
  TensorList seg_inputs_;
  std::string key_;
  uint64_t epoch_ = 0;
  uint64_t trace_start_serial_ = next_storage_serial();

  int segments_run_ = 0;
  std::vector<ExplainGraph> graphs_;
  std::vector<ExplainBreak> breaks_;
  std::shared_ptr<CompiledSegment> last_segment_;
  std::vector<int> last_input_from_call_;
  std::vector<OutputSource> output_sources_;
};

TensorList run_whole(CompiledFunction::State& st, Entry& e, const TensorList& inputs) {
  TensorList graph_inputs;
  graph_inputs.reserve(e.graph_input_from_call.size());
  for (int i : e.graph_input_from_call) graph_inputs.push_back(inputs[size_t(i)]);
  TensorList results = Tracer::run_segment(st, *e.whole, graph_inputs);
  TensorList outs;
  outs.reserve(e.outputs.size());
  for (const OutputSource& s : e.outputs) {
    switch (s.kind) {
      case OutputSource::GraphOutput: outs.push_back(results[size_t(s.index)]); break;
      case OutputSource::CallInput: outs.push_back(inputs[size_t(s.index)]); break;
      case OutputSource::Constant: outs.push_back(s.constant); break;
    }
  }
  return outs;
}

TensorList replay_segmented(CompiledFunction::State& st, Entry& e, const TensorList& inputs) {
  Tracer tracer(st, e, inputs);
  size_t known = e.segments.size();
  TensorList outs = tracer.run();
  if (e.segments.size() != known) {
    std::string msg = fmt::format("a host value read changed the traced code: {} new graph(s) "
                                  "compiled for this guard set", e.segments.size() - known);
    if (!tracer.breaks().empty())
      msg += fmt::format(" (after the read at {})", tracer.breaks().back().location);
    std::unique_lock<std::shared_mutex> lock(st.mu);
    st.recompiles.push_back(msg);
    st.stats.recompiles++;
    st.last_graphs = tracer.graphs();
    st.last_breaks = tracer.breaks();
  }
  return outs;
}

}  // namespace

namespace {
// Whether entry e's host state (HostStateGuard) holds: one comparison while the epoch stands
// still; after it moved, the fingerprint (computed at most once per call, into `now`).
bool host_state_holds(const CompiledFunction::State& st, Entry& e, std::string& now, bool& have_now) {
  if (!st.host_state.epoch) return true;
  const uint64_t epoch = st.host_state.epoch->load(std::memory_order_acquire);
  if (epoch == e.host_state_epoch.load(std::memory_order_relaxed)) return true;
  if (!have_now) {
    now = st.host_state.fingerprint();
    have_now = true;
  }
  if (now != e.host_state) return false;
  e.host_state_epoch.store(epoch, std::memory_order_relaxed);
  return true;
}
}  // namespace

namespace {

// ---- concurrent calls and recursion -------------------------------------------------------------
// The functions this thread is tracing (or replaying with breaks), innermost first: a call of
// one of them from inside its own trace is an error (Note [Concurrent calls]).
struct TracingScope {
  explicit TracingScope(const CompiledFunction::State& s) : st(&s), prev(current) { current = this; }
  ~TracingScope() { current = prev; }
  TracingScope(const TracingScope&) = delete;
  TracingScope& operator=(const TracingScope&) = delete;

  static void check_not_tracing(const CompiledFunction::State& s) {
    for (const TracingScope* t = current; t; t = t->prev)
      if (t->st == &s)
        fail("kiln::compile: a compiled function was called from inside its own trace (the code "
             "being compiled calls the compiled function again, directly or through other "
             "code); tracing cannot re-enter itself. Call the original, uncompiled function "
             "there, or compile the inner part as a function of its own");
  }

  const CompiledFunction::State* st;
  const TracingScope* prev;
  static thread_local const TracingScope* current;
};
thread_local const TracingScope* TracingScope::current = nullptr;

// check_host_values: the dry trace of this call, run at most once per call and compared with
// every candidate entry.
struct HostCheck {
  bool done = false;
  bool diverged = false;
  std::string key;
  std::string why;  // when diverged
};

std::string printable(std::string_view line) {
  std::string out;
  for (char c : line.substr(0, 160)) out += (c >= 32 && c < 127) ? c : '.';
  return out;
}

// The first difference between two trace keys, in words.
std::string describe_key_change(const std::string& traced, const std::string& now) {
  size_t a = 0, b = 0;
  while (true) {
    size_t ea = traced.find('\n', a), eb = now.find('\n', b);
    std::string_view la = std::string_view(traced).substr(a, ea == std::string::npos ? std::string::npos : ea - a);
    std::string_view lb = std::string_view(now).substr(b, eb == std::string::npos ? std::string::npos : eb - b);
    if (la != lb) {
      auto starts = [](std::string_view l, std::string_view p) { return l.substr(0, p.size()) == p; };
      if (starts(la, "param:") && starts(lb, "param:"))
        return fmt::format("a tensor the host code reads is a different tensor now ('{}' -> '{}')",
                           la.substr(la.find(':', 6) + 1), lb.substr(lb.find(':', 6) + 1));
      if (starts(la, "const:") && starts(lb, "const:"))
        return "a constant the host code passes to an op changed value";
      if (starts(la, "fresh:") && starts(lb, "fresh:"))
        return "a tensor the host code makes changed value";
      return fmt::format("the host code now records different ops: traced '{}', now '{}'",
                         printable(la), printable(lb));
    }
    if (ea == std::string::npos || eb == std::string::npos) break;
    a = ea + 1;
    b = eb + 1;
  }
  return "the host code now records a different graph";
}

// Whether entry e (whose tensor guards hold) still matches what the host code would record.
// The dry trace runs the host code: inside a TracingScope (a call of the function from there is
// the recursion error) and under trace_mu (it reads the names the tracer keeps), which the
// caller may hold already.
bool host_values_hold(CompiledFunction::State& st, Entry& e, const TensorList& inputs,
                      HostCheck& hc, std::string& reason, bool trace_locked) {
  if (!st.check_host_values || e.segmented) return true;  // segmented entries re-run host code
  if (!hc.done) {
    hc.done = true;
    std::unique_lock<std::mutex> trace_lock(st.trace_mu, std::defer_lock);
    if (!trace_locked) trace_lock.lock();
    TracingScope tracing(st);
    Tracer dry(st, e, inputs, /*dry=*/true);
    try {
      dry.run();
      hc.key = dry.trace_key();
    } catch (const HostCodeDiverged& d) {
      hc.diverged = true;
      hc.why = d.why;
    }
  }
  if (!hc.diverged && hc.key == e.whole_key) return true;
  if (reason.empty())
    reason = "check_host_values: " + (hc.diverged ? hc.why : describe_key_change(e.whole_key, hc.key));
  return false;
}


// The first entry whose guards hold for `inputs`, or null. Holds `mu` shared for the checks only;
// the returned reference keeps the entry alive while it runs, even if it is dropped meanwhile.
// With check_host_values, the entries whose guards hold are then checked outside the lock
// against one dry trace of the call (hc); the first difference goes to hv_reason.
std::shared_ptr<Entry> find_entry(CompiledFunction::State& st, const TensorList& inputs,
                                  std::string& host_now, bool& have_host_now, HostCheck& hc,
                                  std::string& hv_reason, bool trace_locked = false) {
  std::vector<std::shared_ptr<Entry>> to_check;  // check_host_values only (no allocation else)
  {
    std::shared_lock<std::shared_mutex> lock(st.mu);
    for (const std::shared_ptr<Entry>& e : st.entries)
      if (e->input_guards.check(inputs) && e->param_guards.check() &&
          host_state_holds(st, *e, host_now, have_host_now)) {
        if (!st.check_host_values || e->segmented) return e;
        to_check.push_back(e);
      }
  }
  for (const std::shared_ptr<Entry>& e : to_check)
    if (host_values_hold(st, *e, inputs, hc, hv_reason, trace_locked)) return e;
  return nullptr;
}

// A call that found no entry, or a segmented one: under trace_mu (one trace at a time).
TensorList trace_call(CompiledFunction::State& st, const TensorList& inputs,
                      std::shared_ptr<Entry> hit, std::string& host_now, bool& have_host_now,
                      HostCheck& hc, std::string& hv_reason) {
  std::unique_lock<std::mutex> trace_lock(st.trace_mu);
  // Another thread may have traced this signature while this one waited.
  if (!hit) hit = find_entry(st, inputs, host_now, have_host_now, hc, hv_reason, /*trace_locked=*/true);
  if (hit) {
    st.stats.compiled_calls++;
    if (!hit->segmented) {
      trace_lock.unlock();
      return run_whole(st, *hit, inputs);
    }
    TracingScope tracing(st);
    return replay_segmented(st, *hit, inputs);
  }
  // No entry applies. Drop entries whose parameters changed: they can never match again.
  std::string reason;
  bool cache_full = false;
  {
    std::unique_lock<std::shared_mutex> lock(st.mu);
    for (size_t i = st.entries.size(); i-- > 0;) {
      if (!st.entries[i]->param_guards.check()) {
        reason = st.entries[i]->param_guards.failure_reason();
        st.entries.erase(st.entries.begin() + long(i));
      }
    }
    if (reason.empty()) reason = hv_reason;
    if (reason.empty() && !st.entries.empty())
      reason = st.entries.back()->input_guards.failure_reason(inputs);
    if (st.host_state.epoch && !have_host_now) {
      host_now = st.host_state.fingerprint();
      have_host_now = true;
    }
    if (reason.empty() && !st.entries.empty() && st.host_state.epoch &&
        host_now != st.entries.back()->host_state)
      reason = st.host_state.describe
                   ? st.host_state.describe(st.entries.back()->host_state, host_now)
                   : "host state changed";
    // The host state moved (e.g. a module parameter reassigned): name graph parameters after
    // the tensors registered now (param_names is read by tracers, all under trace_mu).
    if (st.host_state.named_state &&
        (st.entries.empty() || host_now != st.entries.back()->host_state)) {
      st.param_names.clear();
      for (const auto& [name, t] : st.host_state.named_state())
        if (t.defined()) st.param_names[t.impl()] = name;
    }
    if (int(st.entries.size()) >= st.options.cache_size_limit) {
      cache_full = true;
      st.stats.fallbacks_cache_limit++;
      if (!st.warned_cache_limit) {
        st.warned_cache_limit = true;
        std::string msg = fmt::format(
            "cache_size_limit ({}) reached: {} compiled entries exist and none accepts this call "
            "({}); new input signatures now run in eager mode. Raise cache_size_limit, or keep "
            "input shapes/dtypes stable",
            st.options.cache_size_limit, st.entries.size(), reason);
        st.fallbacks.push_back(msg);
        warn(msg);
      }
    }
  }
  if (cache_full) {
    trace_lock.unlock();  // an eager call runs alongside others (and may call the function)
    return st.fn(inputs);
  }
  if (st.options.dynamic && !st.warned_dynamic) {
    st.warned_dynamic = true;  // under trace_mu
    warn("dynamic=true: symbolic shapes are not supported yet; shapes are specialized and a new "
         "shape recompiles");
  }
  auto entry = std::make_shared<Entry>();
  entry->input_guards = InputGuards(inputs);
  if (st.host_state.epoch) {
    entry->host_state_epoch = st.host_state.epoch->load(std::memory_order_acquire);
    entry->host_state = host_now;
  }
  TracingScope tracing(st);
  Tracer tracer(st, *entry, inputs);
  TensorList outs = tracer.run();
  entry->segmented = tracer.num_segments() != 1 || !tracer.breaks().empty();
  if (!entry->segmented) {
    entry->whole = tracer.last_segment();
    entry->graph_input_from_call = tracer.last_input_from_call();
    entry->outputs = tracer.output_sources();
    if (st.check_host_values) entry->whole_key = tracer.trace_key();
    entry->segments.clear();
    for (int i : entry->graph_input_from_call) KILN_ASSERT(i >= 0);
  }
  std::unique_lock<std::shared_mutex> lock(st.mu);
  st.last_graphs = tracer.graphs();
  st.last_breaks = tracer.breaks();
  if (!st.entries.empty() || !reason.empty()) {
    st.stats.recompiles++;
    st.recompiles.push_back(reason.empty() ? "guards failed" : reason);
  }
  st.entries.push_back(std::move(entry));
  return outs;
}

}  // namespace

// ---- CompiledFunction ---------------------------------------------------------------------------
void CompiledFunction::run_into(const TensorList& inputs, TensorList& outputs) const {
  KILN_CHECK(state_, "calling an empty CompiledFunction; create it with kiln::compile");
  State& st = *state_;
  TracingScope::check_not_tracing(st);
  std::string host_now, hv_reason;
  bool have_host_now = false;
  HostCheck hc;
  if (std::shared_ptr<Entry> e = find_entry(st, inputs, host_now, have_host_now, hc, hv_reason)) {
    bool direct = !e->segmented && e->whole && e->whole->compiled;
    for (size_t i = 0; direct && i < e->outputs.size(); ++i)
      direct = e->outputs[i].kind == OutputSource::GraphOutput && e->outputs[i].index == int(i);
    if (direct) {
      st.stats.calls.fetch_add(1, std::memory_order_relaxed);
      st.stats.compiled_calls.fetch_add(1, std::memory_order_relaxed);
      // The graph's inputs: the call's own list when they are the call's inputs in order, else
      // a per-thread list that keeps its capacity (concurrent calls each have their own).
      bool in_order = e->graph_input_from_call.size() == inputs.size();
      for (size_t i = 0; in_order && i < inputs.size(); ++i)
        in_order = e->graph_input_from_call[i] == int(i);
      thread_local TensorList t_graph_inputs;
      if (!in_order) {
        t_graph_inputs.clear();
        for (int i : e->graph_input_from_call) t_graph_inputs.push_back(inputs[size_t(i)]);
      }
      try {
        e->whole->compiled->run_into(in_order ? inputs : t_graph_inputs, outputs);
        t_graph_inputs.clear();
        return;
      } catch (const Error&) {
        t_graph_inputs.clear();
        st.stats.calls.fetch_sub(1, std::memory_order_relaxed);
        st.stats.compiled_calls.fetch_sub(1, std::memory_order_relaxed);
        // the general path reports and falls back
      }
    }
  }
  outputs = (*this)(inputs);
}

TensorList CompiledFunction::operator()(const TensorList& inputs) const {
  KILN_CHECK(state_, "calling an empty CompiledFunction; create it with kiln::compile");
  State& st = *state_;
  TracingScope::check_not_tracing(st);
  st.stats.calls.fetch_add(1, std::memory_order_relaxed);
  std::string host_now, hv_reason;
  bool have_host_now = false;
  HostCheck hc;
  std::shared_ptr<Entry> e = find_entry(st, inputs, host_now, have_host_now, hc, hv_reason);
  if (e && !e->segmented) {
    st.stats.compiled_calls.fetch_add(1, std::memory_order_relaxed);
    return run_whole(st, *e, inputs);
  }
  return trace_call(st, inputs, std::move(e), host_now, have_host_now, hc, hv_reason);
}

CompileStats CompiledFunction::stats() const {
  KILN_CHECK(state_, "empty CompiledFunction");
  std::shared_lock<std::shared_mutex> lock(state_->mu);
  CompileStats s = state_->stats.snapshot();
  s.entries = int64_t(state_->entries.size());
  return s;
}

ExplainReport CompiledFunction::report() const {
  KILN_CHECK(state_, "empty CompiledFunction");
  State& st = *state_;
  std::shared_lock<std::shared_mutex> lock(st.mu);
  ExplainReport r;
  r.graphs = st.last_graphs;
  r.breaks = st.last_breaks;
  for (size_t i = 0; i < st.entries.size(); ++i) {
    const Entry& e = *st.entries[i];
    for (const std::string& g : e.input_guards.describe())
      r.guards.push_back(fmt::format("entry {}: {}", i, g));
    for (const std::string& g : e.param_guards.describe())
      r.guards.push_back(fmt::format("entry {}: {}", i, g));
    for (const std::string& g : e.value_guards)
      r.guards.push_back(fmt::format("entry {}: {}", i, g));
  }
  r.recompiles = st.recompiles;
  r.fallbacks = st.fallbacks;
  r.stats = st.stats.snapshot();
  r.stats.entries = int64_t(st.entries.size());
  return r;
}

CompiledFunction compile(Callable fn, const CompileOptions& options) {
  KILN_CHECK(fn, "kiln::compile: the function is empty");
  KILN_CHECK(options.cache_size_limit >= 1, "kiln::compile: cache_size_limit must be >= 1, got {}",
             options.cache_size_limit);
  KILN_CHECK(options.mode == "default" || options.mode == "reduce-overhead" ||
                 options.mode == "max-autotune",
             "kiln::compile: unknown mode '{}' (default, reduce-overhead, max-autotune)",
             options.mode);
  check_precision(options.precision, "kiln::compile");
  std::string backend = options.backend.empty() ? default_backend() : options.backend;
  find_backend(backend);  // unknown backend: error now, listing the known ones
  CompiledFunction f;
  f.state_ = std::make_shared<CompiledFunction::State>();
  f.state_->fn = std::move(fn);
  f.state_->options = options;
  f.state_->backend = backend;
  const char* check = std::getenv("KILN_CHECK_CAPTURE");
  f.state_->check_host_values =
      options.check_host_values || (check && *check && std::string(check) != "0");
  std::lock_guard<std::mutex> lock(g_states_mu);
  auto& states = all_states();
  std::erase_if(states, [](const auto& w) { return w.expired(); });
  states.push_back(f.state_);
  return f;
}

CompiledFunction compile(Callable fn, const NamedState& state, const CompileOptions& options,
                         HostStateGuard host_state) {
  KILN_CHECK(!host_state.epoch || host_state.fingerprint,
             "kiln::compile: a host-state guard needs a fingerprint function");
  CompiledFunction f = compile(std::move(fn), options);
  for (const auto& [name, t] : state)
    if (t.defined()) f.state_->param_names[t.impl()] = name;
  f.state_->host_state = std::move(host_state);
  return f;
}

ExplainReport explain(const CompiledFunction& fn, const TensorList& inputs) {
  fn(inputs);
  return fn.report();
}

void reset() {
  std::lock_guard<std::mutex> lock(g_states_mu);
  for (auto& w : all_states()) {
    if (auto s = w.lock()) {
      std::unique_lock<std::shared_mutex> l(s->mu);
      s->entries.clear();
      s->last_graphs.clear();
      s->last_breaks.clear();
      s->warned_cache_limit = false;
    }
  }
}

}  // namespace kiln
