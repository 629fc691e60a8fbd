// The CPU target (compiler/target.h): oneDNN library kernels, C++/SIMD/OpenMP loop kernels
// compiled by the host C++ compiler, one host arena. See Note [CPU target knobs].
//
// Note [CPU target knobs]
//   conv=auto|nChw16c|nChw16c+winograd|plain  convolution layout policy, nChw8c in place of
//                                              nChw16c on CPUs without AVX-512 (Note [convolution
//        policy] in onednn_lowering.cc); plain keeps every activation NCHW. Default auto.
//   winograd=checked|measured|off  under conv=auto, 3x3 stride-1 f32 convolutions take
//        oneDNN's Winograd algorithm where it agrees with the direct one (checked: no
//        timing, so two compiles give the same package), where it agrees and a timing does
//        not veto it (measured: the decision can differ between compiles on a loaded
//        machine), or never (off: every convolution direct). Default checked (Note [measured
//        Winograd] in onednn_lowering.cc).
//   layouts=measured|fixed  whether a convolution far from its roofline gets its layout
//        measured against the others (Note [measured convolution layout]), or keeps the one
//        its policy gives (fixed: tests of a layout's own path, bisecting a measured choice;
//        on CPUs with AMX, bf16 convolutions in nChw16c run 8x slower than in nhwc, and the
//        measurement moves them). Default measured.
//   grouped_conv=measured|kiln|onednn  Kiln's grouped (and small-channel stem) convolution
//        kernel (Note [Kiln grouped convolution] in kernels/grouped_conv.cc) as one more
//        candidate where a convolution's layout is measured (measured), pinned wherever it
//        takes the convolution (kiln: tests of its path), or never (onednn). Default measured.
//   tf32=...   refused: CUDA's (Note [CUDA TF32]).
//   gemv=generated|onednn  small linears (<= 2^15 multiply-adds, or float32 of one input row up
//        to 2^30: Note [reduction rows] in emitter.cc) as generated GEMV reductions or oneDNN
//        calls. Default generated.
//   vec=256    8-lane AVX2 vectors on an AVX-512 machine (default: the widest the ISA has).
//   unroll=4   4 vector accumulators per SIMD reduction (default 1).
//   prepack=on|off  whether a package holds oneDNN nodes' weights in their primitives' layouts
//        (Note [prepacked weights] in kernels/onednn_node.cc: the load copies instead of
//        reordering; the package loads only where oneDNN lays them out alike) or plain. Read
//        by compiler::write_package only. Default on.
// max-autotune times conv and gemv as whole-graph candidates, then vec and unroll as
// code-generation variants, then every parallel loop kernel's thread count (Note [autotuning]
// in compiler/autotune.cc).
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "compiler/autotune.h"
#include "compiler/compile.h"
#include "compiler/insert_copies.h"
#include "compiler/target.h"
#include "core/error.h"
#include "lower/scheduler.h"
#include "kernels/onednn_node.h"
#include "runtime/launch_library.h"
#include "targets/cpu/emitter.h"
#include "targets/cpu/onednn_lowering.h"
#include "targets/cpu/support.h"
#include "targets/cpu/toolchain.h"

namespace kiln::cpu {

namespace {

using compiler::Knobs;
using compiler::MemRef;

constexpr int64_t kSmallLinearMacs = 1 << 15;
// Note [reduction rows] (emitter.cc): a float32 linear of one input row is a generated GEMV of
// four output rows at a time up to this size (AlexNet's 9216 -> 4096: 38 M multiply-adds, 4.2-4.4
// ms at two threads against oneDNN's 6.3-7.5), where weight bandwidth is the bound.
constexpr int64_t kRowLinearMacs = int64_t(1) << 30;

bool is_float(DType d) {
  return d == DType::Float32 || d == DType::Float64 || d == DType::Float16 || d == DType::BFloat16;
}

// ---- library kernels: oneDNN -------------------------------------------------------------------

class OnednnKernels final : public compiler::LibraryKernels {
 public:
  OnednnKernels(const Graph& g, const std::vector<int32_t>& nodes, const OnednnOptions& o)
      : lowering_(std::make_shared<OnednnLowering>(g, nodes, o)), strides_(g.values.size()) {
    for (size_t v = 0; v < g.values.size(); ++v)
      if (lowering_->channels_last(ValueId(v))) {
        const Shape& s = g.values[v].type.shape;
        int64_t c = s[1].value(), h = s[2].value(), w = s[3].value();
        strides_[v] = {h * w * c, 1, w * c, c};  // N, C, H, W over NHWC memory
      }
  }
  bool lowered(int32_t node) const override { return lowering_->lowered(node); }
  int64_t value_bytes(ValueId v) const override {
    return lowering_->blocked(v) ? lowering_->value_bytes(v) : -1;
  }
  std::vector<int64_t> value_strides(ValueId v) const override { return strides_[size_t(v)]; }
  int64_t scratch_bytes(int32_t node) const override {
    int64_t b = lowering_->scratchpad_bytes(node);
    return b > 0 ? (b + 63) / 64 * 64 : 0;
  }
  std::string describe(int32_t node) const override { return lowering_->describe(node); }
  // Through the runtime's kernel library, which rebuilds the same launch from its record
  // when a package loads (Note [Launch records] in runtime/launch_library.cc).
  Executable::Launch bind(int32_t node, const std::vector<MemRef>& inputs,
                          const std::vector<MemRef>& outputs, MemRef scratch,
                          MemRef /*status*/) const override {
    Executable::Launch l = make_onednn_launch(lowering_->node(node),
                                              lowering_->desc(node).to_json(), inputs, outputs[0],
                                              scratch);
    return l;
  }

 private:
  std::shared_ptr<OnednnLowering> lowering_;
  std::vector<std::vector<int64_t>> strides_;  // by value: channels-last ones' strides, else empty
};

// ---- the target ------------------------------------------------------------------------------

class CpuTarget final : public compiler::Target {
 public:
  const char* name() const override { return "cpu"; }
  Device device() const override { return Device::cpu(); }
  const char* library_name() const override { return "oneDNN"; }
  const compiler::OpSupportTable& support() const override { return cpu_support(); }

  std::vector<OpId> decompositions() const override {
    // Split becomes slices (Note [split as slices] in ops/shape.cc): views the loop kernels read
    // in place, where split's runtime kernel copied every piece out.
    return {OpId::BatchNorm, OpId::GroupNorm, OpId::ScaledDotProductAttention, OpId::Split};
  }

  // After autocast, where a grid_sample's dtype is final (Note [grid_sample channels-last] in
  // targets/cpu/emitter.cc: the vector form reads float32 sources).
  std::vector<std::string> precision_graph_passes() const override {
    return {"grid-sample-channels-last"};
  }

  bool library_takes(const Graph& g, const Node& n) const override {
    return n.op != OpId::Concat || onednn_concat_candidate(g, n);
  }

  bool generates(const Graph& g, const Node& n) const override {
    if (!cpu_support()[size_t(n.op)].generated || !lower::loop_expressible(g, n)) return false;
    DType od = g.type(n.outputs[0]).dtype;
    const OpDef& d = op_def(n.op);
    if (d.has(trait::Pointwise)) {
      // Integer division and power raise errors on bad values (division by zero, negative
      // exponents): the eager kernels report those.
      return !((n.op == OpId::Div || n.op == OpId::Pow) && !is_float(od));
    }
    // Norm kernels compute in float: float64 norms run their eager kernel.
    if (d.has(trait::RowNorm)) return is_float(od) && od != DType::Float64;
    // Note [Indexed loads]: gathers move elements of any dtype; scatter_add adds in the stored
    // dtype, which rounds float16/bfloat16 at every term (their eager kernel sums in float64).
    if (n.op == OpId::Gather || n.op == OpId::IndexSelect || n.op == OpId::Embedding) return true;
    if (n.op == OpId::ScatterAdd) return od != DType::Float16 && od != DType::BFloat16;
    return is_float(od);  // reductions and the global average pool
  }

  compiler::SchedulePolicy policy(const Knobs& knobs) const override {
    compiler::SchedulePolicy p;
    // tf32=on asks CUDA's tensor cores for float32 (Note [CUDA TF32]); no CPU kernel computes in
    // TF32, and silently computing exact float32 instead would hide that the knob did nothing.
    if (knobs.get("tf32", "off") != "off")
      fail("cpu target: knob tf32 selects CUDA's TF32 tensor cores; the CPU has no TF32 kernels "
           "(drop the knob, or compile in bfloat16 with --dtype bf16)");
    const bool onednn = knobs.get("gemv", "generated") == "onednn";
    p.small_linear_macs = onednn ? 0 : kSmallLinearMacs;
    p.row_linear_macs = onednn ? 0 : kRowLinearMacs;
    // Note [grid sums stored channels innermost] (lower/scheduler.cc).
    const std::string grid_sums = knobs.get("grid_sums", "inner");
    if (grid_sums != "inner" && grid_sums != "plain")
      fail("cpu target: knob grid_sums expected inner or plain, found '{}'", grid_sums);
    p.grid_sums_channels_inner = grid_sums == "inner";
    return p;
  }

  // A matmul operand view oneDNN can read in place: rank >= 2, non-negative strides, and one of
  // the two matrix dims contiguous (row- or column-major matrices, any batch strides). See Note
  // [strided matmul operands] in onednn_lowering.cc.
  bool library_reads_strided(const Graph&, const Node& n, int k,
                             const lower::ViewGeometry& geo) const override {
    if (n.op != OpId::Matmul || k >= 2) return false;
    size_t r = geo.sizes.size();
    if (r < 2 || geo.strides.size() != r) return false;
    Dims st = compiler::normalized_strides(geo);
    for (int64_t x : st)
      if (x < 0) return false;
    return st[r - 1] == 1 || st[r - 2] == 1;
  }

  std::unique_ptr<compiler::LibraryKernels> lower_library(const Graph& g,
                                                          const std::vector<int32_t>& nodes,
                                                          compiler::LibraryRequest request,
                                                          const Knobs& knobs) const override {
    OnednnOptions o;
    std::string conv = knobs.get("conv", "auto");
    if (conv == "auto" || conv == "plain") o.conv = ConvPolicy::Auto;
    else if (conv == native_conv_layout()) o.conv = ConvPolicy::Blocked;
    else if (conv == std::string(native_conv_layout()) + "+winograd") o.conv = ConvPolicy::Winograd;
    else
      fail("cpu target: knob conv expected auto | {0} | {0}+winograd | plain on this CPU, found '{1}'",
           native_conv_layout(), conv);
    o.allow_blocked = conv != "plain";
    std::string winograd = knobs.get("winograd", "checked");
    if (winograd != "checked" && winograd != "measured" && winograd != "off")
      fail("cpu target: knob winograd expected checked | measured | off, found '{}'", winograd);
    o.winograd = winograd != "off";
    const std::string layouts = knobs.get("layouts", "measured");
    if (layouts != "measured" && layouts != "fixed")
      fail("cpu target: knob layouts expected measured | fixed, found '{}'", layouts);
    o.measure_layouts = layouts == "measured";
    const std::string grouped = knobs.get("grouped_conv", "measured");
    if (grouped != "measured" && grouped != "kiln" && grouped != "onednn")
      fail("cpu target: knob grouped_conv expected measured | kiln | onednn, found '{}'", grouped);
    o.grouped_conv = grouped == "kiln"     ? OnednnOptions::GroupedConv::Kiln
                     : grouped == "onednn" ? OnednnOptions::GroupedConv::Onednn
                                           : OnednnOptions::GroupedConv::Measured;
    if (winograd == "measured") o.winograd_veto_above = OnednnOptions::kWinogradVetoAbove;
    const std::string linear = knobs.get("linear", "auto");
    if (linear == "auto") o.linear = LinearImpl::Auto;
    else if (linear == "matmul") o.linear = LinearImpl::Matmul;
    else if (linear == "inner_product") o.linear = LinearImpl::InnerProduct;
    else fail("cpu target: knob linear expected auto | matmul | inner_product, found '{}'", linear);
    o.matmul_strides = std::move(request.strided_operands);
    o.generated = std::move(request.generated);
    return std::make_unique<OnednnKernels>(g, nodes, o);
  }

  compiler::LoopBuild build_loops(const Graph& g, const lower::Schedule& s,
                                  const std::vector<MemRef>& mem, MemRef /*status*/,
                                  const compiler::Options& options,
                                  const Knobs& knobs) const override {
    CpuCodegenOptions co;
    co.vectorize = options.vectorize;
    std::string vec = knobs.get("vec", "");
    if (!vec.empty() && vec != "256" && vec != "512")
      fail("cpu target: knob vec expected 256 or 512, found '{}'", vec);
    co.vector_bits = vec == "256" ? 256 : 0;
    std::string unroll = knobs.get("unroll", "1");
    co.reduce_unroll = std::atoi(unroll.c_str());
    if (co.reduce_unroll < 1 || co.reduce_unroll > 16)
      fail("cpu target: knob unroll expected 1..16, found '{}'", unroll);
    const std::string flat = knobs.get("flat", "on");
    if (flat != "on" && flat != "off") fail("cpu target: knob flat expected on or off, found '{}'", flat);
    co.flatten_lanes = flat == "on";
    co.inject_error_into = options.inject_error_into;
    CpuUnit unit = generate_cpu(g, s, mem, g.name, co);

    compiler::LoopBuild out;
    std::shared_ptr<LoadedLibrary> lib;
    if (!s.loops.empty()) {
      lib = compile_cxx({unit.source, g.name.empty() ? "graph" : g.name, {}});
      out.keep_alive = lib;
      out.build_s = lib->compile_seconds();
      out.cache_hit = lib->cache_hit();
    } else {
      out.cache_hit = true;
    }
    if (lib) out.library_path = lib->path();
    for (size_t i = 0; i < s.loops.size(); ++i) {
      void* sym = lib->symbol(unit.symbols[i].c_str());
      int dt = unit.default_threads[i];
      const std::vector<lower::IndexCheck>& checks = s.loops[i].checks;
      LoopLaunch ll;
      if (checks.empty()) {
        ll = make_loop_launch(reinterpret_cast<void (*)(char* const*, int)>(sym), unit.symbols[i],
                              std::max(dt, 0));
      } else {
        std::vector<IndexCheckText> texts;
        for (const lower::IndexCheck& c : checks) texts.emplace_back(c.message_prefix, c.message_suffix);
        ll = make_checked_loop_launch(reinterpret_cast<void (*)(char* const*, int, int64_t*)>(sym),
                                      unit.symbols[i], std::max(dt, 0), std::move(texts));
      }
      if (dt >= 0) {
        compiler::TunableLaunch t;
        t.launch = i;  // the loop index; bind maps it to the launch index
        t.value = ll.threads;
        t.choices = {1, 0};
        t.default_value = dt;
        out.tunable.push_back(std::move(t));
      }
      Executable::Launch l = std::move(ll.launch);
      l.name = s.loops[i].name;
      out.launches.push_back(std::move(l));
      out.vectorized.push_back(unit.vectorized[i]);
    }
    return out;
  }

  std::shared_ptr<char> allocate(int64_t bytes) const override { return allocate_host_arena(bytes); }
  Tensor place_constant(const Tensor& t) const override {
    return t.is_contiguous() && t.device().is_cpu() ? t : t.to(Device::cpu()).contiguous();
  }

  std::vector<Candidate> autotune_candidates(const Graph& graph, const compiler::Options& options,
                                             std::string* note) const override;
  Variants autotune_variants(const compiler::CompileReport& chosen) const override;
  std::string tune_launches(Executable& exe, const std::vector<compiler::TunableLaunch>& tunable,
                            const TensorList& in, int rounds, std::string* log) const override;
  bool apply_launch_record(const std::vector<compiler::TunableLaunch>& tunable,
                           const std::string& record, std::string* log) const override;
  // Note [measured Winograd]: every convolution that computes with Winograd (its recorded
  // description names a Winograd kernel) is checked against the direct convolution again, on
  // the new weights.
  void check_replaced_weights(const std::string& launches,
                              const std::function<Tensor(const std::string&)>& weight,
                              const std::string& package) const override {
    const double tolerance = OnednnOptions{}.winograd_tolerance;
    for (const nlohmann::json& l : nlohmann::json::parse(launches)) {
      if (l.at("kind") != "onednn") continue;
      const nlohmann::json& p = l.at("params");
      if (p.at("expect").get<std::string>().find("wino") == std::string::npos) continue;
      const std::string name = l.at("name").get<std::string>();
      kernels::OnednnNodeDesc d = kernels::OnednnNodeDesc::from_json(
          p.at("desc").dump(), fmt::format("package '{}': launch '{}'", package, name));
      const double error = kernels::winograd_disagreement(d, weight);
      if (error < 0)
        fail("replace-weights: package '{}': convolution '{}' computes with oneDNN's Winograd "
             "algorithm, which has no kernel for it on this machine, so the new weights cannot be "
             "checked against the direct convolution here; replace them on a machine that runs "
             "the package, or compile the model with these weights (`kiln compile`)",
             package, d.node);
      if (!(error <= tolerance))
        fail("replace-weights: package '{}': convolution '{}' computes with oneDNN's Winograd "
             "algorithm, taken because it agreed with the direct convolution on the weights the "
             "package was compiled with; on the new weights it differs by {:.1e} of its largest "
             "output (more than {:.0e}). Compile the model with these weights (`kiln compile`): "
             "that convolution then stays direct",
             package, d.node, error, tolerance);
    }
  }

  std::string tuning_context() const override {
    return toolchain().isa + "\n" + std::to_string(omp_get_max_threads());
  }
};

// Whole-graph candidates: the convolution policies where convolutions are a real part of the
// work (Winograd only when some convolution is 3x3 f32), and the GEMV choice where there are
// small linears (or one-row linears of weight: below). ViT's patch embedding is <1% of its multiply-adds, and three extra whole-graph
// candidates would cost ~10 s of compile time there for nothing measurable: policies are
// skipped below 5% of the MACs of convolutions + linears + matmuls (counted from the types;
// unknown with symbolic shapes).
std::vector<compiler::Target::Candidate> CpuTarget::autotune_candidates(
    const Graph& graph, const compiler::Options& options, std::string* note) const {
  bool has_conv = false, has_wino = false, has_small_linear = false;
  double conv_macs = 0, gemm_macs = 0, row_linear_macs = 0;
  bool known = true;
  auto numel_of = [&](const TensorType& t) {
    double e = 1;
    for (const SymInt& d : t.shape) {
      if (d.is_symbolic()) known = false;
      else e *= double(d.value());
    }
    return e;
  };
  for (const Node& n : graph.nodes) {
    bool conv = n.op == OpId::Conv2d || n.op == OpId::ConvTranspose2d || n.op == OpId::FusedConv2d;
    has_conv = has_conv || conv;
    if (n.op == OpId::Conv2d || n.op == OpId::FusedConv2d) {
      const TensorType& w = graph.type(n.inputs[1]);
      has_wino = has_wino || (w.dtype == DType::Float32 && w.shape.size() == 4 &&
                              w.shape[2] == SymInt(3) && w.shape[3] == SymInt(3));
    }
    const bool tiny_linear = lower::small_linear(graph, n, kSmallLinearMacs);
    has_small_linear = has_small_linear || tiny_linear;
    if (n.outputs.empty() || n.inputs.size() < 2 || n.inputs[1] == kNoValue) continue;
    const TensorType& out = graph.type(n.outputs[0]);
    if (conv) {
      const TensorType& w = graph.type(n.inputs[1]);
      if (w.shape.size() != 4) continue;
      // conv: out numel x (C/g x kh x kw); deconv: in numel x (O/g x kh x kw), the same count.
      const TensorType& in = graph.type(n.inputs[0]);
      double per = numel_of(w) / (w.shape[0].is_symbolic() ? 1.0 : double(w.shape[0].value()));
      conv_macs += (n.op == OpId::ConvTranspose2d ? numel_of(in) : numel_of(out)) * per;
    } else if (n.op == OpId::Linear || n.op == OpId::FusedLinear || n.op == OpId::Matmul) {
      const TensorType& x = graph.type(n.inputs[0]);
      if (x.shape.empty() || x.shape.back().is_symbolic()) {
        known = false;
        continue;
      }
      const double macs = numel_of(out) * double(x.shape.back().value());
      gemm_macs += macs;
      if (!tiny_linear && lower::small_linear(graph, n, 0, 0, kRowLinearMacs))
        row_linear_macs += macs;
    }
  }
  // One-row linears (Note [reduction rows] in emitter.cc) make the GEMV choice a candidate only
  // where they are at least 5% of the multiply-adds (AlexNet's classifier, 8%): a ResNet's head
  // would double every CNN's candidates for a choice worth nothing measurable.
  if (known && row_linear_macs >= 0.05 * (conv_macs + gemm_macs) && row_linear_macs > 0)
    has_small_linear = true;
  if (has_conv && known && conv_macs < 0.05 * (conv_macs + gemm_macs)) {
    has_conv = false;
    *note = fmt::format("; convolution policies not tried (convolutions are {:.1f}% of the "
                        "multiply-adds)", 100.0 * conv_macs / (conv_macs + gemm_macs));
  }
  std::vector<Candidate> cands;
  const std::string blocked = native_conv_layout(), blocked_wino = blocked + "+winograd";
  for (const char* layout : {"auto", blocked.c_str(), blocked_wino.c_str(), "plain"}) {
    bool is_auto = std::strcmp(layout, "auto") == 0;
    bool wino = layout == blocked_wino;
    if (!is_auto && !has_conv) continue;
    if (wino && !has_wino) continue;
    for (const char* gemv : {"generated", "onednn"}) {
      if (std::strcmp(gemv, "onednn") == 0 && !has_small_linear) continue;
      Candidate c;
      c.exact = !wino;
      // Names say only what varies for this graph.
      if (has_conv) c.knobs.set("conv", layout);
      if (has_small_linear) c.knobs.set("gemv", gemv);
      cands.push_back(std::move(c));
    }
  }
  (void)options;
  return cands;
}

// 256-bit vectors on AVX-512 (Zen 4 executes 512-bit operations as two 256-bit halves, and
// memory-bound kernels may prefer the narrower loop) and, where there are SIMD reduce kernels, 4
// accumulators per reduction instead of 1.
compiler::Target::Variants CpuTarget::autotune_variants(const compiler::CompileReport& chosen) const {
  Variants v;
  v.current_label = "512-bit";
  bool wide = chosen.vectorized_kernels > 0 && toolchain().isa.find("avx512") != std::string::npos;
  bool reduces = false;
  for (const std::string& k : chosen.kernels) reduces = reduces || k.find("[reduce, SIMD]") != std::string::npos;
  for (int bits : {0, 256})
    for (int unroll : {1, 4}) {
      if (bits == 0 && unroll == 1) continue;  // the current one
      if ((bits == 256 && !wide) || (unroll > 1 && !reduces)) continue;
      Candidate c;
      c.exact = false;
      if (bits == 256) c.knobs.set("vec", "256");
      if (unroll > 1) c.knobs.set("unroll", "4");
      v.variants.push_back(std::move(c));
    }
  return v;
}

// Chooses the thread count of every tunable loop kernel (1 or all of OpenMP's threads) by timing
// each kernel alone in both settings, alternating their order, after a full run of the graph on
// `in` before each round (so buffers hold realistic data); median of `rounds`. A setting
// replaces the default only when it is at least 5% faster. Returns the counts in launch order
// ("0" = all) and appends what changed to *log.
std::string CpuTarget::tune_launches(Executable& exe,
                                     const std::vector<compiler::TunableLaunch>& tunable,
                                     const TensorList& in, int rounds, std::string* log) const {
  int maxt = omp_get_max_threads();
  size_t nk = tunable.size();
  if (maxt <= 1 || nk == 0) return "";
  TensorList out;
  for (const Executable::OutputSpec& o : exe.outputs) out.push_back(Tensor::empty(o.sizes, o.dtype));
  std::vector<std::vector<double>> t1(nk), tn(nk);
  for (int r = 0; r < rounds; ++r) {
    exe.run(in.data(), in.size(), out.data(), out.size());
    for (size_t k = 0; k < nk; ++k) {
      for (int pass = 0; pass < 2; ++pass) {
        bool one = (pass == 0) == (r % 2 == 0);
        *tunable[k].value = one ? 1 : 0;
        auto a = std::chrono::steady_clock::now();
        exe.run_launch(tunable[k].launch, in.data());
        double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count();
        (one ? t1 : tn)[k].push_back(s);
      }
    }
  }
  std::string counts, changed;
  int nchanged = 0;
  for (size_t k = 0; k < nk; ++k) {
    double m1 = compiler::median(t1[k]), mn = compiler::median(tn[k]);
    bool dflt_all = tunable[k].default_value == 0;
    double dflt = dflt_all ? mn : m1, other = dflt_all ? m1 : mn;
    bool use_all = other < 0.95 * dflt ? !dflt_all : dflt_all;
    *tunable[k].value = use_all ? 0 : 1;
    counts += (k ? "," : "") + std::to_string(*tunable[k].value);
    if (use_all != dflt_all) {
      ++nchanged;
      changed += fmt::format("{}{} {} ({:.1f} vs {:.1f} us)", changed.empty() ? "" : ", ",
                             exe.launches[tunable[k].launch].name, use_all ? "all threads" : "1 thread",
                             (use_all ? mn : m1) * 1e6, (use_all ? m1 : mn) * 1e6);
    }
  }
  *log += fmt::format("; kernel threads: {} of {} tunable loop kernels changed from the default{}{}",
                      nchanged, nk, changed.empty() ? "" : ": ", changed);
  return counts;
}

bool CpuTarget::apply_launch_record(const std::vector<compiler::TunableLaunch>& tunable,
                                    const std::string& record, std::string* log) const {
  std::vector<int> v;
  size_t at = 0;
  while (at < record.size()) {
    size_t end = record.find(',', at);
    if (end == std::string::npos) end = record.size();
    std::string item = record.substr(at, end - at);
    if (item != "0" && item != "1") return false;
    v.push_back(item == "1" ? 1 : 0);
    at = end + 1;
  }
  if (v.size() != tunable.size()) return false;
  for (size_t k = 0; k < v.size(); ++k) *tunable[k].value = v[k];
  *log += fmt::format("; cached kernel threads ({} loop kernels, {} on one thread)", tunable.size(),
                      std::count(v.begin(), v.end(), 1));
  return true;
}

const CpuTarget g_cpu_target;
const bool g_registered = [] {
  compiler::register_target(&g_cpu_target);
  return true;
}();

}  // namespace

}  // namespace kiln::cpu
