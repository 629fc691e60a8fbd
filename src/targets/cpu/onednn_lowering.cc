// oneDNN extern kernels for the CPU compiler. See onednn_lowering.h.
//
// Note [oneDNN lowering]
// This file is the graph half of the oneDNN lowering: which nodes oneDNN takes (static checks),
// which values may stay in a blocked layout (Note [layout choice]), and each node's plain
// descriptor (kernels::OnednnNodeDesc). The primitives themselves are built from those
// descriptors by the kernels layer (kernels/onednn_node.cc, Note [oneDNN node descriptors]),
// the same code a package's loader runs, so that a package rebuilds exactly these primitives.
//
// Note [layout choice]
// Blocked layouts (nChw16c and friends) are what oneDNN's fast convolutions compute in. A value
// produced by a lowered conv/deconv/pool/concat node whose every use is as input 0 of a lowered
// conv/deconv/pool node, as the residual of a lowered fused_conv2d or as a part of a lowered
// concat whose own result may stay blocked (Note [oneDNN concat] in kernels/onednn_node.cc),
// and which is not a graph output, may stay blocked: its producer is created with dst
// format_tag::any and the layout it picks becomes the value's layout. Consumers are created
// with exactly that src layout, so the chain conv -> conv -> pool -> conv runs without a
// reorder. Every other value is plain (contiguous row-major, NCHW for 4-D). A primitive created
// with format_tag::any on a plain src or dst may still want a blocked one: the reorder between
// the plain value and a scratch temporary is prebuilt and runs inside run(). Pooling takes its src layout as given (a reorder
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
// Note [channels-last values]
// A value that loop kernels share with convolutions is plain, and plain used to mean NCHW: a
// convolution computing in nhwc (brgconv and brdgmm_dw on AVX-512) then reordered its output
// to NCHW for the loop kernels and the next convolution reordered their result back. In a
// MobileNet-v3 / EfficientNet block (depthwise conv -> squeeze-excite mean and scale -> 1x1
// conv) those two transposing copies cost 1.9 of efficientnet_b0's 14.6 ms (oneDNN's verbose
// timings, one thread), and made the depthwise convolutions 7-12x their roofline. So such a
// value is stored channels-last instead: still dims N, C, H, W, NHWC order in memory. The
// convolutions read and write it directly (OnednnOperand::channels_last), and the loop kernels
// read and write it through its strides (LibraryKernels::value_strides, the scheduler's
// ScheduleOptions::value_strides), walking it in memory order (Note [loop order] in
// lower/scheduler.cc; a mean over H and W becomes a lane reduction along C, Note [lane
// reductions] in targets/cpu/emitter.cc).
// Which values: 4-D float32/bfloat16 values with more than one channel and more than one
// pixel (otherwise both orders are the same memory) are joined into groups through the
// generated pointwise, reduction and row-norm nodes that read or write them, and through the
// concats the runtime copies (all of one such node's 4-D values share an order, so no kernel
// transposes). A group is stored channels-last
// when every value in it is produced by such a loop node or by a lowerable convolution or
// pooling and read only by such loop nodes, as the src (or residual) of such convolutions
// and poolings, or through a permutation only loop nodes read (ConvNeXt's NCHW -> NHWC before
// its layer_norm, which then reads contiguous rows; the scheduler composes the strides) — no
// other view, no eager kernel, no other library kernel, not a graph output — when
// at least one convolution or pooling touches it, and when this CPU's convolutions compute in
// nhwc (kernels::convolutions_prefer_nhwc; AVX2's want nChw8c, where NCHW loses nothing more)
// and the convolution policy is Auto with blocked layouts allowed. A convolution oneDNN then
// rejects restarts the build without it, which makes its groups NCHW again.
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
// The Winograd policy is max-autotune's whole-graph candidate, every activation blocked (Note
// [autotuning] in compiler/autotune.cc); under Auto each eligible convolution is measured
// against Winograd by itself (Note [measured Winograd]).
//
// Note [measured Winograd]
// The direct convolutions above run at this CPU's FLOP rate (1.0x their roofline in explain:
// brgconv at the rate of a 384^3 matmul, ~117 GFLOP/s a core on the dev machine), so on a
// ResNet nothing but fewer multiplications makes them faster, and oneDNN 2.6's Winograd kernels
// for AVX-512 do that: F(2x2, 3x3) (jit_fp32_wino_2x3) and F(4x4, 3x3) (jit_wino_4x3), which
// compute in nChw16c only. Measured on the dev machine (one thread, oneDNN 2.6, bias + relu,
// best of 10; Winograd time / direct brgconv time, 58 shapes with 16-512 channels in and out,
// 7x7 to 112x112, 7 MFLOP to 1.8 GFLOP): 0.29-0.41 where oneDNN picks 4x3 (28x28 and up with
// 64+ channels), 0.49-0.65 for 2x3 at 14x14 and up, 0.73-0.82 at 7x7 and with 16 channels;
// never above 0.82. So this is not a choice a timing needs to make, and a timing would make
// packages differ between two compiles (package.deterministic_across_processes; it did, see
// below): under the Auto policy, on an AVX-512 CPU, a convolution whose layout Note [measured
// convolution layout] did not pin takes Winograd when
//   - it is 3x3, stride 1, undilated, ungrouped, f32, at least kWinogradLeastFlops (8 MFLOP:
//     the smallest of the table) and kWinogradLeastChannels (16) channels in and out;
//   - oneDNN has a Winograd kernel for it;
//   - it agrees with the direct convolution (kernels::winograd_disagreement): both run once on
//     the same random activations (uniform in [-1, 1), a fixed seed; the residual too) with
//     the node's real weights, plain in and out, one thread, and max |winograd - direct| must
//     be at most winograd_tolerance (1e-5) of the largest |direct| output, a NaN or infinity
//     failing it. The transforms round the input and the weights before the products are
//     summed: ResNet-18 and ResNet-50 measure 0.7e-6..2.3e-6, where a direct f32 convolution
//     differs from float64 by ~1e-7 of its largest output, and whole models stay as close to
//     ONNX Runtime as with direct convolutions (~1e-6; Kiln's model tests allow 1e-4);
//   - under knob winograd=measured only (not the default), a timing does not veto it: the two
//     builds of the check (plain in and out, so each with its reorders), on one thread (CPU
//     time), three interleaved rounds, each side's best; more than kWinogradVetoAbove (1.2)
//     times the direct time keeps direct. A guard for a machine where the table does not
//     hold. It was the default until it flipped under load: four concurrent compiles of
//     ResNet-18 with fresh caches on the 2-core dev machine, and one of the four kept
//     layer4's 3x3 512->512 direct (its 0.77 measured above 1.2), so that package differed
//     from the other three, and package.deterministic_across_processes failed once in CI.
//     No margin makes a timing immune to another process on the same cores; the default
//     (winograd=checked) takes the agreement check's answer, a function of the shapes, the
//     weights, the ISA and oneDNN's version, and is what the table above supports.
// Its reorders (src from the neighbours' nhwc, dst to a plain consumer's) are the node's own
// and were not in the table: ResNet-50's and ResNet-18's whole-graph times are what count
// (docs/benchmarks.md). The decision is stored in the descriptor (conv policy Winograd +
// conv_layout "blocked", so a package rebuilds exactly it; no new package format version: both
// fields existed) and in the tuning store, keyed as the layout decision plus a hash of the
// weights (the check ran on them). Replacing a package's weights runs the check again on the
// new weights (compiler/replace_weights.cc). Explain says, per node, the disagreement (and
// under winograd=measured the times) and the choice. Knob winograd=off (compile --knobs) keeps
// every convolution direct. Cost, the first time only: two extra builds per eligible
// convolution (the Winograd weights' transform takes oneDNN 2.6 17-29 ms for 256-512
// channels) and one call of each (winograd=measured: eight); ResNet-18's cold compile
// (`kiln bench`'s compile_s, empty caches) 0.59 -> 1.18 s, ResNet-50's 0.65 -> 1.17 s with the
// timing. Later compiles read the store: the final build's transform remains (`explain`'s
// oneDNN phase 0.03-0.12 -> 0.14-0.18 s). A package's load pays that transform too.
//
// Note [measured convolution layout]
// format_tag::any lets oneDNN pick a layout per primitive, and for some shapes the layout it
// picks has only a reference implementation: oneDNN 2.6 on this Sapphire Rapids machine (AVX-512
// + AMX) runs a 2x2 stride-2 conv_transpose2d 64->128 at 100x88 whose src arrives in nhwc (the
// brgconv before it) as `ref:any` in nhwc: 5.7 s a call under a concurrent build, where the
// jit kernels take milliseconds (PointPillars' upsampling, issue #17: 70 ms, 94% of the model).
// Grouped convolutions were the same story (regnet, resnext: 20-125 ms a call) until the kernels
// layer tried the src's own layout for dst (Note [matched convolution layouts] in
// kernels/onednn_node.cc). And a jit kernel can be slow too: a depthwise conv reading and
// writing plain NCHW values (efficientnet_b0's, between SiLU and squeeze-excite loop kernels)
// gets brdgmm_dw in nhwc behind two transposing reorders, 0.26-0.56 ms a call at 3.1-3.9x its
// roofline, where jit_dw in nChw16c behind blocking reorders takes 0.10-0.21 ms. A fixed rule
// cannot know which shapes those are, so the lowering measures, in two steps:
//   - a convolution whose implementation is a reference kernel is never timed itself (~100-1000x
//     slower than any jit kernel: one call can take a second);
//   - any other convolution is timed (a warm-up call, then one call) and compared with its
//     roofline (Note [convolution roofline]); only when it takes more than
//     OnednnOptions::measure_above_roofline (3x) that time, and more than kTooShortToMeasureMs
//     (20 us: below that a call is mostly fixed cost that no layout removes), it is timed again
//     (best of four) and, if still far, measured against the alternatives. 3x rather than #17's
//     5x: a kernel between the two is worth a look, and measuring costs milliseconds.
// Measuring builds the convolution again with its src and dst pinned to each of blocked
// (nChw16c / nChw8c), nhwc and nchw, and times every candidate that gets a non-reference
// implementation (this node's reorders included) together with a timed default, in five
// interleaved rounds, each candidate's best: a burst of other work then slows every candidate
// of a round instead of all calls of one. After a reference default, a candidate earlier in
// that order wins unless a later one is 10% faster, so that noise does not flip the choice; a
// timed default stays unless a candidate takes less than kReplaceDefaultBelow (0.75) of its
// time, because the default's layout is the one its neighbours computed in, and a new one may
// cost reorders there that this node's time does not show; and because a candidate that
// reorders its operands into another layout and back (a blocked depthwise convolution between
// channels-last values) times its reorders warm, where in the model they meet cold caches. A
// candidate that runs in place, one step that reads the inputs as they are stored and writes
// the output in the default's layout, hides neither cost: below 0.9 of the default's time it
// replaces it, as after a reference default (EfficientNet-V2's stem: Kiln's kernel reading the
// NCHW image, 0.32-0.33 ms, against oneDNN's reorder and convolution, 0.40, both writing the
// channels-last value; with 0.75 oneDNN stayed, at 5.1x its roofline in the model).
// Every timing runs on one thread, the primitives built for one thread, and counts the
// thread's CPU time where that is less than the wall-clock time (kernels::CallTimer): on this
// shared 2-core machine, two OpenMP threads waiting at barriers for a descheduled sibling made
// single calls 10-100x slower and the candidates' ranks random (a brgconv default "3.4 ms"
// where it takes 0.27). The per-thread efficiency of a kernel is what the roofline check
// wants, and the kept build is made afterwards for the caller's thread count.
// The decision is part of the node's descriptor (OnednnNodeDesc::conv_layout), so a package
// rebuilds exactly it, and it is kept in the tuning store (support/tuning_store.h), keyed by the
// convolution without its graph's names, its default build's description, the ISA, the thread
// count and oneDNN's version: a later compile on this machine decides the same without timing
// (a measured choice could otherwise differ between two compiles of one model, and packages
// are byte-identical across compiles: package.deterministic_across_processes). explain shows
// the measurements: every timed convolution says its time and its ratio to the roofline
// ("0.262 ms, 2.3x its roofline 0.116 ms"), so the kernels that stay far from it are visible.
// Cost, the first time only: two calls of every convolution on one thread and a second build
// of it (about two single-thread inferences of the model's convolutions), plus a few
// milliseconds per measured one.
//
// Note [convolution roofline]
// The least time a convolution needs on this CPU: max(FLOPs / the CPU's FLOP rate, bytes / its
// bandwidth), where FLOPs count 2 per multiply-add (N * O * OH * OW * C/g * kh * kw for a
// convolution), bytes are src + weights + dst (+ the residual, read again) in the node's dtype,
// and the rates are measured once per process, dtype and thread count (kernels::cpu_roofline:
// a 384^3 oneDNN matmul, ~265 GFLOP/s f32 and ~520 bf16 on one core of the dev machine, and a
// 4 MiB copy; about 5 ms). The copy's bandwidth is that of the cache level past L2 while
// activations at batch 1 mostly live in L2, so the floor is generous for memory-bound kernels:
// a kernel flagged far from it really is. The per-call fixed cost (oneDNN's execute, tens of
// microseconds at most) is not in the floor, hence kTooShortToMeasureMs. Measured with oneDNN
// 2.6 on the dev machine, one thread, 3x3 stride 1, the best layout's kernel against the FLOP
// floor (f32 / bf16): channels per group 1 (depthwise) 2.1 / 3.9x, 2: 13-21x / 15-20x,
// 3: 7-10x / 11-12x, 4: 4.6-5.7x / 5.0-5.4x, 6: 3.8-4.8x / 3.6-4.1x, 8: 2.6x / 2.5x,
// 12: 5.4x / 3.7-4.0x, 16: 1.3x / 1.2x, 24 and up: 1.0-1.8x. So grouped convolutions with 2-6
// or 12 channels per group stay far from their roofline whatever the layout; no oneDNN layout
// fixes them.
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
// So Auto took matmul for K >= 2048 and inner_product below. Measured again whole-model
// (twenty-fourth session, `KILN_KNOBS=linear=matmul|auto kiln bench M.onnx --iters 10`, two
// rounds interleaved, p50 ms, 2 threads / 1 thread): matmul is faster where M is large —
// vit_b_16 (M = 197) 162 -> 129 / 284 -> 253, bert_base (128) 93 -> 86 / 179 -> 165,
// distilbert 47 -> 43 / 89.5 -> 83, convnext_tiny (3136) 39.6 -> 37.8 / 79 -> 72, swin_t
// 43.0 -> 41.6 / 81.5 -> 76.8 — and level where it is small (vit_b_32, M = 50: 45.1 -> 45.5 /
// 85.3 -> 87.2; gpt2_6l, maxvit_t, the GRU/LSTM and pillar models within 2%): oneDNN's matmul
// splits a tall [M, N] output over both threads better (vit_b_16's 197 x 768 x 3072 GEMM: 1.63x
// from the second thread as inner_product, 1.90x as matmul). A short K goes the other way:
// pointpillars' per-point linear (K = 9, M = 96,000) was 2.8% slower as matmul at one
// thread. So Auto takes matmul for K >= 2048, or M >= 64 with K >= 128 (choose_linear_impl),
// and the record carries the choice, so a package keeps the
// primitive its prepacked weights were made for (Auto in an older record keeps meaning the old
// rule). LinearImpl (knob `linear=auto|matmul|inner_product`) forces either.
#include "targets/cpu/onednn_lowering.h"
#include "targets/cpu/support.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <map>
#include <optional>

#include <fmt/format.h>

#include <oneapi/dnnl/dnnl_version.h>

#include "core/error.h"
#include "kernels/onednn_node.h"
#include "ops/onednn.h"
#include "support/hash.h"
#include "support/tuning_store.h"

namespace kiln::cpu {

int native_conv_block() { return kernels::native_conv_block(); }
const char* native_conv_layout() { return native_conv_block() == 16 ? "nChw16c" : "nChw8c"; }

namespace {

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

// The ops the CPU target runs as oneDNN primitives (its support table's library column), and
// among them the ones on N,C,H,W activations whose layout may be blocked (trait Spatial).
bool is_supported_op(OpId op) { return cpu_support()[size_t(op)].library; }
bool is_conv_like(OpId op) { return is_supported_op(op) && op_has(op, trait::Spatial); }
// Ops whose outputs may stay blocked and which read blocked inputs (Note [layout choice]): the
// spatial ones, and concat along the channels (Note [oneDNN concat] in kernels/onednn_node.cc).
bool keeps_layouts(OpId op) { return is_conv_like(op) || op == OpId::Concat; }

ValueId input_or_none(const Node& n, size_t i) {
  return i < n.inputs.size() ? n.inputs[i] : kNoValue;
}

// depth bounds the walk through concats of concats (each visit is one level).
bool concat_candidate(const Graph& g, const Node& n, int depth) {
  if (depth > 8 || n.op != OpId::Concat || n.outputs.size() != 1 || n.inputs.empty() ||
      n.inputs.size() > kernels::kMaxConcatInputs)
    return false;
  const TensorType& yt = g.type(n.outputs[0]);
  if (yt.shape.size() != 4) return false;
  int64_t dim = n.attrs.get_int("dim");
  if (dim < 0) dim += 4;
  if (dim != 1) return false;
  for (ValueId v : n.inputs) {
    if (v == kNoValue || g.value(v).kind != ValueKind::NodeOutput) return false;
    const Node& p = g.nodes[size_t(g.value(v).producer)];
    if (!is_conv_like(p.op) && !concat_candidate(g, p, depth + 1)) return false;
  }
  return true;
}
}  // namespace

bool onednn_concat_candidate(const Graph& g, const Node& n) { return concat_candidate(g, n, 0); }

struct OnednnLowering::NodeInstance {
  std::shared_ptr<kernels::OnednnNode::Instance> inst;
};

struct OnednnLowering::Impl {
  const Graph& g;  // read during construction only
  OnednnOptions options;
  kernels::OnednnLayouts layouts;
  std::vector<bool> requested;
  std::vector<std::string> why_not;                        // by node
  std::vector<std::shared_ptr<kernels::OnednnNode>> nodes;  // by node: built (maybe not lowered)
  std::vector<kernels::OnednnNodeDesc> descs;               // by node (lowered ones)
  std::vector<bool> may_block;                              // by value: Note [layout choice]
  std::vector<bool> channels_last;                          // by value: Note [channels-last values]
  std::map<std::string, Tensor> constants;                  // by value name
  std::vector<OpId> g_ops;                                  // by node, for describe()
  std::vector<std::string> layout_note;                     // by node: measured choices
  int64_t scratch_bytes = 0;

  Impl(const Graph& graph, const OnednnOptions& o) : g(graph), options(o) {}

  std::string static_check(int32_t n) const;
  void decide_blockable(const std::vector<bool>& eligible);
  void decide_channels_last(const std::vector<bool>& eligible);
  kernels::OnednnNodeDesc describe_node(int32_t n);
  // Zero-filled, 64-byte aligned memory for timing calls; grows, never shrinks.
  struct TimingArena {
    std::unique_ptr<char[]> data;
    int64_t bytes = 0;
    char* at_least(int64_t n) {
      if (n > bytes) {
        data.reset(new char[size_t(n + 64)]());
        bytes = n;
      }
      char* p = data.get();
      return p + (64 - reinterpret_cast<uintptr_t>(p) % 64) % 64;
    }
  } timing_arena;
  class NodeTimer;
  struct LayoutDecision {
    std::string conv_layout, note;
    bool built_others = false;  // the layouts table holds another build's output layout
  };
  LayoutDecision measure_conv_layout(int32_t n, const kernels::ConstantSource& constants);
  LayoutDecision stored_or_measured(const std::string& key,
                                    const std::function<LayoutDecision()>& measure);
  void choose_conv_layout(int32_t n, const kernels::ConstantSource& constants);
  // Note [measured Winograd].
  bool winograd_candidate(const kernels::OnednnNodeDesc& d) const;
  LayoutDecision measure_winograd(int32_t n, const kernels::ConstantSource& constants);
  void choose_winograd(int32_t n, const kernels::ConstantSource& constants);
  // Note [convolution roofline].
  static constexpr double kTooShortToMeasureMs = 0.02;
  // Note [measured Winograd].
  static constexpr double kWinogradLeastFlops = 8e6;
  static constexpr int64_t kWinogradLeastChannels = 16;
  bool is_constant(ValueId v) const {
    ValueKind k = g.value(v).kind;
    return k == ValueKind::Param || k == ValueKind::Const;
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
  if (node.op == OpId::Concat)
    return onednn_concat_candidate(g, node) ? "" : "not a concat along the channels of 4-D values "
                                                   "that oneDNN convolutions or pools produce";
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
    if (eligible[n] && keeps_layouts(node.op)) ok[size_t(node.outputs[0])] = true;
  }
  for (ValueId v : g.outputs) ok[size_t(v)] = false;
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const Node& node = g.nodes[n];
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      ValueId v = node.inputs[i];
      if (v == kNoValue) continue;
      used[size_t(v)] = true;
      bool blocked_use = eligible[n] && ((is_conv_like(node.op) &&
                                          (i == 0 || (node.op == OpId::FusedConv2d && i == 3))) ||
                                         node.op == OpId::Concat);
      if (!blocked_use) ok[size_t(v)] = false;
    }
  }
  // Note [oneDNN concat]: a concat keeps its parts blocked only when its result stays blocked
  // too. A plain result would make oneDNN convert every part in a slow generic concat (DenseNet's
  // 3x3 outputs, read by every later concat of their block, whose results feed loop kernels);
  // plain parts are copied as blocks. A part of a concat whose result cannot block is plain, which
  // may unblock a concat's result that it feeds: repeated until nothing changes.
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t n = 0; n < g.nodes.size(); ++n) {
      const Node& node = g.nodes[n];
      if (node.op != OpId::Concat || !eligible[n] || ok[size_t(node.outputs[0])]) continue;
      for (ValueId v : node.inputs)
        if (v != kNoValue && ok[size_t(v)]) {
          ok[size_t(v)] = false;
          changed = true;
        }
    }
  }
  for (size_t v = 0; v < nv; ++v) may_block[v] = ok[v] && used[v];
}

void OnednnLowering::Impl::decide_channels_last(const std::vector<bool>& eligible) {
  const size_t nv = g.values.size();
  channels_last.assign(nv, false);
  if (!options.allow_blocked || options.conv != ConvPolicy::Auto ||
      options.generated.size() != g.nodes.size())
    return;
  auto spatial = [&](ValueId v) {
    if (v == kNoValue) return false;
    const TensorType& t = g.type(v);
    if (t.shape.size() != 4 || !t.is_contiguous() ||
        (t.dtype != DType::Float32 && t.dtype != DType::BFloat16))
      return false;
    for (const SymInt& d : t.shape)
      if (!d.is_concrete()) return false;
    return t.shape[1].value() > 1 && t.shape[2].value() * t.shape[3].value() > 1;
  };
  // The loop nodes whose kernels walk a channels-last value correctly and without transposing:
  // pointwise ops, reductions, row norms, the global average pool (not gathers: their tap
  // tables follow the output's dims; views are not stored, see below).
  auto loop_node = [&](size_t n) {
    const Node& node = g.nodes[n];
    // A concat oneDNN does not take (its result is plain: Note [layout choice]) is the runtime's
    // copy, which follows its parts' and result's strides (Note [channels-last concat] in
    // compiler/bind.cc): DenseNet's concatenations feeding loop kernels.
    if (node.op == OpId::Concat) return node.outputs.size() == 1 && !may_block[size_t(node.outputs[0])];
    if (!options.generated[n] || op_def(node.op).is_view) return false;
    return op_has(node.op, trait::Pointwise) || op_has(node.op, trait::Reduction) ||
           op_has(node.op, trait::RowNorm) || node.op == OpId::AdaptiveAvgPool2d;
  };
  std::vector<int32_t> parent(nv);
  for (size_t v = 0; v < nv; ++v) parent[v] = int32_t(v);
  auto find = [&](int32_t v) {
    while (parent[size_t(v)] != v) v = parent[size_t(v)] = parent[size_t(parent[size_t(v)])];
    return v;
  };
  // Views are never stored: they take no order of their own, and a loop kernel reads one
  // through its base's strides whatever they are.
  auto is_view_value = [&](ValueId v) {
    const Value& val = g.value(v);
    return val.kind == ValueKind::NodeOutput && op_def(g.nodes[size_t(val.producer)].op).is_view;
  };
  std::vector<std::vector<int32_t>> users(nv);
  for (size_t n = 0; n < g.nodes.size(); ++n)
    for (ValueId v : g.nodes[n].inputs)
      if (v != kNoValue) users[size_t(v)].push_back(int32_t(n));
  std::vector<bool> is_output(nv, false);
  for (ValueId v : g.outputs) is_output[size_t(v)] = true;
  // A permutation whose result only loop kernels read (ConvNeXt's NCHW -> NHWC before its
  // layer_norm): the scheduler composes the strides (a channels-last value permuted to NHWC is
  // read contiguously), and nothing else sees the view.
  auto permute_into_loops = [&](const Node& node) {
    if (node.op != OpId::Permute && node.op != OpId::Transpose) return false;
    ValueId w = node.outputs[0];
    if (is_output[size_t(w)] || users[size_t(w)].empty()) return false;
    for (int32_t u : users[size_t(w)])
      if (!loop_node(size_t(u)) || g.nodes[size_t(u)].op == OpId::Concat) return false;
    return true;
  };
  std::vector<bool> flexible(nv, true), touches_conv(nv, false), touches_loop(nv, false);
  for (size_t v = 0; v < nv; ++v)
    if (g.values[v].kind != ValueKind::NodeOutput) flexible[v] = false;
  for (ValueId v : g.outputs) flexible[size_t(v)] = false;
  for (size_t n = 0; n < g.nodes.size(); ++n) {
    const Node& node = g.nodes[n];
    // The runtime's concat copies stored parts in any order, but not views.
    const bool loop = loop_node(n) && (node.op != OpId::Concat ||
                                       std::none_of(node.inputs.begin(), node.inputs.end(),
                                                    [&](ValueId v) {
                                                      return v != kNoValue && is_view_value(v);
                                                    }));
    const bool conv = eligible[n] && is_conv_like(node.op);
    int32_t first = -1;
    auto join = [&](ValueId v) {
      touches_loop[size_t(v)] = true;
      if (first < 0) first = find(v);
      else parent[size_t(find(v))] = first;
    };
    for (size_t i = 0; i < node.inputs.size(); ++i) {
      ValueId v = node.inputs[i];
      if (!spatial(v) || (loop && is_view_value(v))) continue;
      if (loop) join(v);
      else if (conv && (i == 0 || (node.op == OpId::FusedConv2d && i == 3)))
        touches_conv[size_t(v)] = true;
      else if (i == 0 && permute_into_loops(node))
        touches_loop[size_t(v)] = true;
      else
        flexible[size_t(v)] = false;
    }
    for (ValueId y : node.outputs) {
      if (!spatial(y) || (op_def(node.op).is_view && !is_output[size_t(y)])) continue;
      if (loop) join(y);
      else if (conv && node.outputs.size() == 1) touches_conv[size_t(y)] = true;
      else flexible[size_t(y)] = false;
    }
  }
  std::vector<bool> ok(nv, true), conv(nv, false), loop(nv, false);
  for (size_t v = 0; v < nv; ++v) {
    if (!spatial(ValueId(v))) continue;
    size_t r = size_t(find(int32_t(v)));
    ok[r] = ok[r] && flexible[v] &&
            kernels::convolutions_prefer_nhwc(g.values[v].type.dtype == DType::BFloat16);
    conv[r] = conv[r] || touches_conv[v];
    loop[r] = loop[r] || touches_loop[v];
  }
  for (size_t v = 0; v < nv; ++v) {
    if (!spatial(ValueId(v))) continue;
    size_t r = size_t(find(int32_t(v)));
    channels_last[v] = ok[r] && conv[r] && loop[r];
  }
}

// The node as plain data (Note [oneDNN node descriptors] in kernels/onednn_node.cc); its
// constants are registered by name for the build.
kernels::OnednnNodeDesc OnednnLowering::Impl::describe_node(int32_t n) {
  const Node& node = g.nodes[size_t(n)];
  kernels::OnednnNodeDesc d;
  d.op = op_def(node.op).name;
  d.node = node.name;
  ValueId y = node.outputs[0];
  d.bf16 = g.type(y).dtype == DType::BFloat16;
  auto operand = [&](ValueId v) {
    kernels::OnednnOperand o;
    if (v == kNoValue) return o;
    o.value = v;
    for (const SymInt& s : g.type(v).shape) o.dims.push_back(s.value());
    o.channels_last = channels_last[size_t(v)];
    if (is_constant(v)) {
      const Value& val = g.value(v);
      o.constant = val.name;
      auto [it, fresh] = constants.emplace(val.name, val.data);
      KILN_CHECK(fresh || it->second.raw_data() == val.data.raw_data(),
                 "oneDNN lowering: two constants are named '{}'", val.name);
    }
    return o;
  };
  for (ValueId v : node.inputs) d.inputs.push_back(operand(v));
  d.output = operand(y);
  d.output_may_block = may_block[size_t(y)];
  d.allow_blocked = options.allow_blocked;
  d.conv = options.conv == ConvPolicy::Blocked    ? kernels::OnednnConvPolicy::Blocked
           : options.conv == ConvPolicy::Winograd ? kernels::OnednnConvPolicy::Winograd
                                                  : kernels::OnednnConvPolicy::Auto;
  d.linear = options.linear == LinearImpl::Matmul         ? kernels::OnednnLinearImpl::Matmul
             : options.linear == LinearImpl::InnerProduct ? kernels::OnednnLinearImpl::InnerProduct
                                                          : kernels::OnednnLinearImpl::Auto;
  if (node.op == OpId::Linear || node.op == OpId::FusedLinear) {
    // The choice made here goes into the record (Note [linear choice]).
    const TensorType& xt = g.type(node.inputs[0]);
    int64_t m = 1;
    for (size_t i = 0; i + 1 < xt.shape.size(); ++i) m *= xt.shape[i].value();
    const int64_t k = xt.shape.empty() ? 1 : xt.shape[xt.shape.size() - 1].value();
    d.linear = kernels::choose_linear_impl(d.linear, m, k);
  }
  switch (node.op) {
    case OpId::Conv2d:
    case OpId::FusedConv2d:
    case OpId::ConvTranspose2d: {
      ConvGeometry geo = *conv_geometry(node.attrs, node.op == OpId::ConvTranspose2d);
      for (int i = 0; i < 2; ++i) {
        d.stride[i] = geo.stride[i];
        d.pad_begin[i] = geo.pad_begin[i];
        d.pad_end[i] = geo.pad_end[i];
        d.dilation[i] = geo.dilation[i];
      }
      d.groups = geo.groups;
      break;
    }
    case OpId::MaxPool2d:
    case OpId::AvgPool2d: {
      bool is_max = node.op == OpId::MaxPool2d;
      d.kernel_size = node.attrs.get_ints("kernel_size");
      d.pool_stride = node.attrs.get_ints("stride");
      d.pool_padding = node.attrs.get_ints("padding");
      if (is_max) d.pool_dilation = node.attrs.get_ints("dilation");
      else d.pool_dilation = {1, 1};
      d.count_include_pad = !is_max && node.attrs.get_bool("count_include_pad");
      break;
    }
    case OpId::Concat: d.concat_dim = 1; break;  // onednn_concat_candidate
    case OpId::Matmul:
      for (const StridedOperand& so : options.matmul_strides)
        if (so.node == n && so.input >= 0 && so.input <= 1)
          d.matmul_strides[so.input] = so.strides;
      break;
    default: break;
  }
  if (node.op == OpId::FusedConv2d || node.op == OpId::FusedLinear) {
    d.activation = node.attrs.get_string("activation");
    if (node.attrs.has("clamp_min")) d.clamp_lo = float(node.attrs.get_float("clamp_min"));
    if (node.attrs.has("clamp_max")) d.clamp_hi = float(node.attrs.get_float("clamp_max"));
    d.sum_scale = float(node.attrs.get_float("sum_scale"));
    d.has_residual = node.inputs.size() > 3 && node.inputs[3] != kNoValue;
  }
  return d;
}

// Note [measured convolution layout]: the pick among timed candidates.
size_t pick_measured_layout(std::vector<TimedLayoutCandidate>& c, bool timed_default) {
  if (c.empty()) return 0;
  // A timed default and a candidate built alike (a pinned layout that is the default's own: the
  // same description) are one kernel timed twice: the default keeps the better time. On a
  // loaded machine one of the two has measured twice the other (a bfloat16 depthwise
  // convolution: default 0.029 ms, the same build pinned nhwc 0.013), which let a third
  // candidate replace the default on the slower time.
  if (timed_default)
    for (size_t i = 1; i < c.size(); ++i)
      if (c[i].description == c[0].description) c[0].ms = std::min(c[0].ms, c[i].ms);
  // After a reference default, the first candidate in order wins unless a later one is 10%
  // faster. A timed default (the first candidate) is replaced only below kReplaceDefaultBelow
  // of its time, or 0.9 by a candidate that runs in place (one step, the output's layout kept).
  size_t best = 0;
  for (size_t i = 1; i < c.size(); ++i) {
    const double margin =
        timed_default && best == 0 && !c[i].in_place ? kReplaceDefaultBelow : 0.9;
    if (c[i].ms < margin * c[best].ms) best = i;
  }
  return best;
}

// Note [measured convolution layout]: a node's calls on zero-filled buffers sized as it reads
// and writes them (blocked values at their padded size), timed by kernels::CallTimer.
class OnednnLowering::Impl::NodeTimer {
 public:
  // Buffers come from `arena`, shared by every timer of the lowering (their contents do not
  // matter, and the timers run one after another): page faults once, not per candidate.
  NodeTimer(std::shared_ptr<kernels::OnednnNode> node, const kernels::OnednnNodeDesc& d,
            const kernels::OnednnLayouts& layouts, TimingArena& arena)
      : node_(std::move(node)), arena_(arena) {
    const int64_t elt = d.bf16 ? 2 : 4;
    auto bytes_of = [&](const kernels::OnednnOperand& o) {
      if (o.value >= 0 && layouts.blocked(o.value)) return layouts.value_bytes(o.value);
      int64_t n = elt;
      for (int64_t x : o.dims) n *= x;
      return n;
    };
    auto place = [&](int64_t bytes) {
      int64_t at = bytes_;
      bytes_ += (bytes + 63) / 64 * 64;
      return at;
    };
    for (size_t k = 0; k < d.inputs.size() && k < 4; ++k)
      if (d.inputs[k].value >= 0) in_at_[k] = place(bytes_of(d.inputs[k]));
    out_at_ = place(bytes_of(d.output));
    scratch_at_ = place(std::max<int64_t>(node_->scratch_bytes(), 64));
  }
  double call_ms() {
    char* base = arena_.at_least(bytes_);
    const void* in[4] = {nullptr, nullptr, nullptr, nullptr};
    for (int k = 0; k < 4; ++k)
      if (in_at_[k] >= 0) in[k] = base + in_at_[k];
    kernels::CallTimer t;
    node_->run(in, base + out_at_, base + scratch_at_);
    return t.elapsed_ms();
  }

 private:
  std::shared_ptr<kernels::OnednnNode> node_;
  TimingArena& arena_;
  int64_t bytes_ = 0, in_at_[4] = {-1, -1, -1, -1}, out_at_ = 0, scratch_at_ = 0;
};

namespace {
// Note [convolution roofline]: the least time a convolution's arithmetic and traffic need on
// this CPU (multiply-adds at the matmul's rate, or activations and weights read and the output
// written at the copy's bandwidth, whichever is longer); 0 when the CPU's rates are unknown.
double conv_floor_ms(const kernels::OnednnNodeDesc& d) {
  const kernels::CpuRoofline& r = kernels::cpu_roofline(d.bf16);
  if (r.flops_per_ms <= 0 || r.bytes_per_ms <= 0) return 0;
  const std::vector<int64_t>&x = d.inputs.at(0).dims, &w = d.inputs.at(1).dims, &y = d.output.dims;
  auto numel = [](const std::vector<int64_t>& v) {
    double n = 1;
    for (int64_t e : v) n *= double(e);
    return n;
  };
  // conv: every output element sums C/g * kh * kw products (w is [O, C/g, kh, kw]); the
  // transposed conv: every input element scatters into O/g * kh * kw (w is [C, O/g, kh, kw]).
  bool transposed = d.op == "conv_transpose2d";
  double flops = 2.0 * (transposed ? numel(x) : numel(y)) * double(w[1] * w[2] * w[3]);
  double bytes = (numel(x) + numel(w) + numel(y) * (d.has_residual ? 2 : 1)) * (d.bf16 ? 2 : 4);
  return std::max(flops / r.flops_per_ms, bytes / r.bytes_per_ms);
}
}  // namespace

// Note [measured convolution layout], Note [convolution roofline]: the layout to pin ("" for
// the default build) and what explain says about it. Its trial builds leave their output
// layouts in the layouts table: the caller puts the default's entry back or builds the chosen.
OnednnLowering::Impl::LayoutDecision OnednnLowering::Impl::measure_conv_layout(
    int32_t n, const kernels::ConstantSource& constants) {
  const std::string first = nodes[size_t(n)]->implementation();
  const bool reference = kernels::is_reference(first);
  // Timed on one thread, by its CPU time: on a shared machine, OpenMP threads that wait at
  // barriers for a descheduled sibling made one call 100x slower and layouts' ranks random.
  // (The caller builds the kept one for its own thread count.)
  const int caller_threads = kernels::cpu_threads();
  kernels::ScopedCpuThreads one_thread(1);
  std::string note;
  struct Candidate {
    std::optional<kernels::OnednnNodeDesc> desc;  // none: the default build
    std::string implementation;
    std::unique_ptr<NodeTimer> timer;
  };
  // By candidate: its best time, whether it runs in place, its build's description.
  std::vector<TimedLayoutCandidate> timed;
  const ValueId y_value = g.nodes[size_t(n)].outputs[0];
  const std::shared_ptr<const kernels::OnednnLayouts::Entry> default_entry = layouts.entry(y_value);
  std::vector<Candidate> candidates;
  const double floor_ms = conv_floor_ms(descs[size_t(n)]);
  if (!reference) {
    if (floor_ms <= 0) return {"", "", false};  // nothing built
    // The default built again for one thread unless it was (a primitive runs with the thread
    // count it was created for); its second call decides, only a slow-looking one is timed again.
    std::shared_ptr<kernels::OnednnNode> built =
        caller_threads == 1 ? nodes[size_t(n)]
                            : kernels::OnednnNode::build(descs[size_t(n)], layouts, constants);
    const std::string description = built->description();
    auto timer = std::make_unique<NodeTimer>(std::move(built), descs[size_t(n)], layouts,
                                             timing_arena);
    timer->call_ms();  // warm-up: the first call of a primitive initializes it
    double default_ms = timer->call_ms();
    const double far_ms = std::max(options.measure_above_roofline * floor_ms,
                                   options.measure_above_roofline > 0 ? kTooShortToMeasureMs : 0);
    for (int i = 0; i < 3 && default_ms > far_ms; ++i)
      default_ms = std::min(default_ms, timer->call_ms());
    note = fmt::format("{:.3f} ms, {:.1f}x its roofline {:.4f} ms", default_ms,
                       default_ms / floor_ms, floor_ms);
    if (default_ms <= far_ms) return {"", note, true};
    note += "; layout measured:";
    candidates.push_back({std::nullopt, first, std::move(timer)});
    timed.push_back({1e300, false, description});
  } else {
    note = fmt::format("layout measured (default {} not timed):", first);
  }
  std::string not_timed;
  // Note [Kiln grouped convolution]: Kiln's own kernel is a candidate where it takes the node.
  std::vector<const char*> layouts_tried = {"blocked", "nhwc", "nchw"};
  if (options.grouped_conv == OnednnOptions::GroupedConv::Measured &&
      kernels::kiln_direct_conv_why_not(descs[size_t(n)]).empty())
    layouts_tried.push_back(kernels::kKilnDirectLayout);
  for (const char* layout : layouts_tried) {
    kernels::OnednnNodeDesc d = descs[size_t(n)];
    d.conv_layout = layout;
    std::shared_ptr<kernels::OnednnNode> cand = kernels::OnednnNode::build(d, layouts, constants);
    if (!cand->lowered() || kernels::is_reference(cand->implementation())) {
      not_timed += fmt::format(" {} {};", layout,
                               cand->lowered() ? cand->implementation() + " not timed" : "none");
      continue;
    }
    const bool in_place =
        cand->steps() == 1 && kernels::OnednnLayouts::same(*layouts.entry(y_value), *default_entry);
    auto timer = std::make_unique<NodeTimer>(cand, d, layouts, timing_arena);
    timer->call_ms();  // warm-up
    candidates.push_back({d, cand->implementation(), std::move(timer)});
    timed.push_back({1e300, in_place, cand->description()});
  }
  // Interleaved rounds, each candidate's best: a burst of other work on the machine slows
  // every candidate of a round rather than one candidate's every call. Each timed call follows
  // an untimed one of the same candidate: the candidate before it (the GEMM's im2col buffer)
  // left the caches cold, which made the same kernel 40% slower in the first slot of a round.
  for (int round = 0; round < 5; ++round)
    for (size_t i = 0; i < candidates.size(); ++i) {
      candidates[i].timer->call_ms();
      timed[i].ms = std::min(timed[i].ms, candidates[i].timer->call_ms());
    }
  const size_t pick = pick_measured_layout(timed, !reference);
  const Candidate* best = candidates.empty() ? nullptr : &candidates[pick];
  for (size_t i = 0; i < candidates.size(); ++i)
    note += fmt::format(" {} {} {:.3f} ms;",
                        candidates[i].desc ? candidates[i].desc->conv_layout : "default",
                        candidates[i].implementation, timed[i].ms);
  note += not_timed;
  if (best && best->desc) {
    note += fmt::format(" chose {}", best->desc->conv_layout);
    if (floor_ms > 0) note += fmt::format(" ({:.1f}x its roofline)", timed[pick].ms / floor_ms);
    return {best->desc->conv_layout, note, true};
  }
  note += " kept the default";
  return {"", note, true};
}

namespace {
// A tuning-store key's convolution: its descriptor without the graph's names (value ids and
// constant names), as JSON.
std::string anonymous_json(kernels::OnednnNodeDesc d) {
  d.node.clear();
  d.output.value = -1;
  for (kernels::OnednnOperand& o : d.inputs) {
    o.value = o.value < 0 ? -1 : 0;
    if (!o.constant.empty()) o.constant = "constant";
  }
  return d.to_json();
}
}  // namespace

// A decision from the tuning store under `key`, else measured and stored there.
OnednnLowering::Impl::LayoutDecision OnednnLowering::Impl::stored_or_measured(
    const std::string& key, const std::function<LayoutDecision()>& measure) {
  LayoutDecision decision;
  std::string stored;
  if (tuning_get(key, &stored) && stored.find('\n') != std::string::npos) {
    decision.conv_layout = stored.substr(0, stored.find('\n'));
    decision.note = stored.substr(stored.find('\n') + 1) + " (from the tuning store)";
    return decision;
  }
  decision = measure();
  try {
    tuning_put(key, decision.conv_layout + "\n" + decision.note);
  } catch (const std::exception&) {
    // An unwritable cache only costs the next compile the measurement.
  }
  return decision;
}

// Note [measured convolution layout]: the decision for the node as built (descs[n], nodes[n]),
// from the tuning store when an earlier compile on this machine measured the same convolution.
void OnednnLowering::Impl::choose_conv_layout(int32_t n,
                                              const kernels::ConstantSource& constants) {
  const Node& node = g.nodes[size_t(n)];
  if (node.op != OpId::Conv2d && node.op != OpId::FusedConv2d && node.op != OpId::ConvTranspose2d)
    return;
  // Note [Kiln grouped convolution]: grouped_conv=kiln pins Kiln's kernel, nothing measured.
  if (options.grouped_conv == OnednnOptions::GroupedConv::Kiln &&
      kernels::kiln_direct_conv_why_not(descs[size_t(n)]).empty()) {
    descs[size_t(n)].conv_layout = kernels::kKilnDirectLayout;
    nodes[size_t(n)] = kernels::OnednnNode::build(descs[size_t(n)], layouts, constants);
    layout_note[size_t(n)] = "Kiln's grouped convolution kernel (knob grouped_conv=kiln)";
    return;
  }
  if (!options.allow_blocked) return;
  if (!options.measure_layouts) {  // layouts=fixed: no layout measured; Winograd still decided
    choose_winograd(n, constants);
    return;
  }
  // The key: the convolution without its graph's names (shapes, geometry, epilogue, options),
  // the layouts and kernel its default build got, the machine, the thread count.
  // Version 2: Kiln's grouped convolution kernel became a candidate (grouped_conv says whether);
  // 3: also with a silu epilogue; 4: image stems on output-channel vectors, grouped
  // convolutions on channel lanes (decisions measured with the kernel before are stale), and
  // the 0.9 margin of a candidate running in place; 5: a default timed twice keeps its better
  // time.
  const std::string key = fmt::format(
      "onednn conv layout 5\n{}\n{}\nisa {} threads {} dnnl {}.{}.{} far {} grouped_conv {}",
      anonymous_json(descs[size_t(n)]), nodes[size_t(n)]->description(), onednn::cpu_isa_name(),
      kernels::cpu_threads(), DNNL_VERSION_MAJOR, DNNL_VERSION_MINOR, DNNL_VERSION_PATCH,
      options.measure_above_roofline, int(options.grouped_conv));
  const ValueId y = node.outputs[0];
  const std::shared_ptr<const kernels::OnednnLayouts::Entry> kept = layouts.entry(y);
  LayoutDecision decision = stored_or_measured(key, [&] { return measure_conv_layout(n, constants); });
  layout_note[size_t(n)] = decision.note;
  if (decision.conv_layout.empty()) {
    if (decision.built_others) layouts.set_entry(y, kept);  // the default's build is kept
    choose_winograd(n, constants);
    return;
  }
  descs[size_t(n)].conv_layout = decision.conv_layout;
  // Built again last, so that the layouts table holds the kept build's output layout.
  nodes[size_t(n)] = kernels::OnednnNode::build(descs[size_t(n)], layouts, constants);
}

// Note [measured Winograd]: a 3x3 stride-1 undilated ungrouped f32 convolution of at least
// kWinogradLeastFlops and kWinogradLeastChannels channels in and out, under the Auto policy on
// an AVX-512 CPU (oneDNN 2.6 has Winograd kernels for AVX-512 only), whose layout was not
// pinned by a measurement.
bool OnednnLowering::Impl::winograd_candidate(const kernels::OnednnNodeDesc& d) const {
  if (!options.winograd || options.conv != ConvPolicy::Auto || !options.allow_blocked) return false;
  if (kernels::native_conv_block() != 16 || d.bf16 || !d.conv_layout.empty()) return false;
  if (d.op != "conv2d" && d.op != "fused_conv2d") return false;
  const std::vector<int64_t>& w = d.inputs.at(1).dims;
  if (d.groups != 1 || w.size() != 4 || w[2] != 3 || w[3] != 3 || d.stride[0] != 1 ||
      d.stride[1] != 1 || d.dilation[0] != 1 || d.dilation[1] != 1)
    return false;
  double flops = 2.0 * double(w[1] * w[2] * w[3]);
  for (int64_t e : d.output.dims) flops *= double(e);
  return flops >= kWinogradLeastFlops && std::min(w[0], w[1]) >= kWinogradLeastChannels;
}

// Note [measured Winograd]: "winograd" or "" (direct) and what explain says about it. Its trial
// builds are plain in and out, on a layouts table of their own (kernels::winograd_trial), so
// the lowering's table is left as the direct build made it.
OnednnLowering::Impl::LayoutDecision OnednnLowering::Impl::measure_winograd(
    int32_t n, const kernels::ConstantSource& constants) {
  const kernels::OnednnNodeDesc& direct_desc = descs[size_t(n)];
  const kernels::WinogradTrial trial = kernels::winograd_trial(direct_desc, constants);
  const double error = trial.disagreement;
  if (error < 0) return {"", "no Winograd kernel for it"};
  std::string note = fmt::format("Winograd differs by {:.1e} of the largest output", error);
  if (!(error <= options.winograd_tolerance))
    return {"", note + fmt::format(" (more than {:.0e}): kept direct", options.winograd_tolerance)};
  if (options.winograd_veto_above < HUGE_VAL) {
    // The veto: the trial's two builds (plain in and out, each with its reorders, created for
    // one thread) timed on one thread, by CPU time, in three interleaved rounds, each side's
    // best, a timed call after an untimed one of the same build (Note [measured convolution
    // layout]).
    kernels::ScopedCpuThreads one_thread(1);
    kernels::OnednnLayouts plain;
    plain.reset(g.values.size());
    kernels::OnednnNodeDesc plain_desc = direct_desc;
    plain_desc.output_may_block = false;
    NodeTimer direct(trial.direct, plain_desc, plain, timing_arena);
    NodeTimer winograd(trial.winograd, plain_desc, plain, timing_arena);
    double direct_ms = HUGE_VAL, wino_ms = HUGE_VAL;
    for (int round = 0; round < 3; ++round) {
      direct.call_ms();
      direct_ms = std::min(direct_ms, direct.call_ms());
      winograd.call_ms();
      wino_ms = std::min(wino_ms, winograd.call_ms());
    }
    note = fmt::format("Winograd {} {:.3f} ms vs direct {:.3f} ms, ",
                       trial.winograd->implementation(), wino_ms, direct_ms) +
           note.substr(std::string("Winograd ").size());
    if (!(wino_ms <= options.winograd_veto_above * direct_ms))
      return {"", note + fmt::format(" (slower than {}x direct): kept direct",
                                     options.winograd_veto_above)};
  }
  return {"winograd", note + ": chose Winograd"};
}

// Note [measured Winograd]: the decision for a node that kept its default layout, from the
// tuning store when an earlier compile on this machine measured the same convolution.
void OnednnLowering::Impl::choose_winograd(int32_t n, const kernels::ConstantSource& constants) {
  if (!winograd_candidate(descs[size_t(n)])) return;
  // The weights' values are part of the key through their SHA-256: the check ran on them.
  Sha256 weights;
  for (const kernels::OnednnOperand& o : descs[size_t(n)].inputs)
    if (!o.constant.empty()) {
      Tensor t = constants(o.constant).contiguous();
      weights.update(t.raw_data(), t.nbytes());
    }
  const std::string key = fmt::format(
      "onednn conv winograd 1\n{}\n{}\nweights {}\nisa {} threads {} dnnl {}.{}.{} tol {} "
      "veto {}",
      anonymous_json(descs[size_t(n)]), nodes[size_t(n)]->description(), weights.hex_digest(),
      onednn::cpu_isa_name(), kernels::cpu_threads(), DNNL_VERSION_MAJOR, DNNL_VERSION_MINOR,
      DNNL_VERSION_PATCH, options.winograd_tolerance, options.winograd_veto_above);
  LayoutDecision decision = stored_or_measured(key, [&] { return measure_winograd(n, constants); });
  std::string& note = layout_note[size_t(n)];
  note += (note.empty() ? "" : "; ") + decision.note;
  if (decision.conv_layout != "winograd") return;  // (its trial builds used a table of their own)
  descs[size_t(n)].conv = kernels::OnednnConvPolicy::Winograd;
  descs[size_t(n)].conv_layout = "blocked";
  nodes[size_t(n)] = kernels::OnednnNode::build(descs[size_t(n)], layouts, constants);
}

// ---- public API -------------------------------------------------------------------------------
OnednnLowering::OnednnLowering(const Graph& g, const std::vector<int32_t>& extern_nodes,
                               const OnednnOptions& options)
    : impl_(std::make_unique<Impl>(g, options)) {
  Impl& im = *impl_;
  size_t num_nodes = g.nodes.size();
  im.requested.assign(num_nodes, false);
  for (const Node& node : g.nodes) im.g_ops.push_back(node.op);
  for (int32_t n : extern_nodes) {
    KILN_CHECK(n >= 0 && size_t(n) < num_nodes,
               "oneDNN lowering: node index {} is out of range (the graph has {} nodes)", n,
               num_nodes);
    const Node& node = g.nodes[size_t(n)];
    KILN_CHECK(is_supported_op(node.op),
               "oneDNN lowering: node {} ('{}') is {}; expected conv2d, fused_conv2d, "
               "conv_transpose2d, linear, fused_linear, matmul, max_pool2d, avg_pool2d or concat",
               n, node.name, op_def(node.op).name);
    im.requested[size_t(n)] = true;
  }
  std::vector<std::string> static_reason(num_nodes);
  std::vector<bool> eligible(num_nodes, false);
  for (size_t n = 0; n < num_nodes; ++n)
    if (im.requested[n]) {
      static_reason[n] = im.static_check(int32_t(n));
      eligible[n] = static_reason[n].empty();
    }
  kernels::ConstantSource constants = [&im](const std::string& name) {
    auto it = im.constants.find(name);
    KILN_CHECK(it != im.constants.end(), "oneDNN lowering: no constant '{}'", name);
    return it->second;
  };

  // Build in graph order; restart without a node oneDNN rejects while it consumes a blocked
  // value (Note [layout choice]). Each restart excludes one more node, so this ends.
  for (;;) {
    im.decide_blockable(eligible);
    im.decide_channels_last(eligible);
    im.nodes.assign(num_nodes, nullptr);
    im.descs.assign(num_nodes, kernels::OnednnNodeDesc());
    im.why_not.assign(num_nodes, "");
    im.layout_note.assign(num_nodes, "");
    im.layouts.reset(g.values.size());
    int32_t restart_without = -1;
    for (size_t n = 0; n < num_nodes && restart_without < 0; ++n) {
      if (!im.requested[n]) continue;
      if (!eligible[n]) {
        im.why_not[n] = static_reason[n];
        continue;
      }
      if (g.nodes[n].op == OpId::Concat && !im.may_block[size_t(g.nodes[n].outputs[0])] &&
          std::none_of(g.nodes[n].inputs.begin(), g.nodes[n].inputs.end(),
                       [&](ValueId v) { return im.layouts.blocked(v); })) {
        // Note [oneDNN concat]: nothing to keep in a blocked layout; the runtime's concat
        // copies plain parts as well.
        im.why_not[n] = "its parts and its result are plain (the runtime's concat copies them)";
        continue;
      }
      im.descs[n] = im.describe_node(int32_t(n));
      im.nodes[n] = kernels::OnednnNode::build(im.descs[n], im.layouts, constants);
      if (im.nodes[n]->lowered()) {
        im.choose_conv_layout(int32_t(n), constants);
        continue;
      }
      im.why_not[n] = im.nodes[n]->why_not();
      bool blocked_in = false, channels_last = false;
      for (ValueId v : g.nodes[n].inputs)
        if (v != kNoValue) {
          blocked_in = blocked_in || im.layouts.blocked(v);
          channels_last = channels_last || im.channels_last[size_t(v)];
        }
      for (ValueId v : g.nodes[n].outputs) channels_last = channels_last || im.channels_last[size_t(v)];
      if (blocked_in || channels_last) {
        restart_without = int32_t(n);
        static_reason[n] = fmt::format("oneDNN rejected it on {} ({}); excluded and the graph rebuilt",
                                       blocked_in ? "a blocked input" : "a channels-last value",
                                       im.why_not[n]);
      }
    }
    if (restart_without < 0) break;
    eligible[size_t(restart_without)] = false;
  }
  for (size_t n = 0; n < num_nodes; ++n) {
    if (im.nodes[n] && im.nodes[n]->lowered())
      im.scratch_bytes = std::max(im.scratch_bytes, im.nodes[n]->scratch_bytes());
    else
      im.nodes[n] = nullptr;
  }
}

OnednnLowering::~OnednnLowering() = default;

bool OnednnLowering::lowered(int32_t node) const {
  return node >= 0 && size_t(node) < impl_->nodes.size() && impl_->nodes[size_t(node)];
}

std::string OnednnLowering::why_not_lowered(int32_t node) const {
  if (node < 0 || size_t(node) >= impl_->nodes.size()) return "";
  return impl_->requested[size_t(node)] && !lowered(node) ? impl_->why_not[size_t(node)] : "";
}

bool OnednnLowering::blocked(ValueId v) const { return impl_->layouts.blocked(v); }
bool OnednnLowering::channels_last(ValueId v) const {
  return v >= 0 && size_t(v) < impl_->channels_last.size() && impl_->channels_last[size_t(v)] &&
         !impl_->layouts.blocked(v);
}
int64_t OnednnLowering::value_bytes(ValueId v) const { return impl_->layouts.value_bytes(v); }
int64_t OnednnLowering::scratchpad_bytes() const { return impl_->scratch_bytes; }

int64_t OnednnLowering::scratchpad_bytes(int32_t node) const {
  return lowered(node) ? impl_->nodes[size_t(node)]->scratch_bytes() : 0;
}

bool OnednnLowering::residual_may_alias_output(int32_t node) const {
  return lowered(node) && impl_->nodes[size_t(node)]->residual_may_alias_output();
}

std::string OnednnLowering::describe(int32_t node) const {
  if (node < 0 || size_t(node) >= impl_->nodes.size()) return "";
  if (lowered(node)) {
    const std::string& note = impl_->layout_note[size_t(node)];
    return impl_->nodes[size_t(node)]->description() + (note.empty() ? "" : "; " + note);
  }
  if (!impl_->requested[size_t(node)]) return "";
  return fmt::format("{} not lowered: {}", op_def(impl_->g_ops[size_t(node)]).name,
                     impl_->why_not[size_t(node)]);
}

std::shared_ptr<const kernels::OnednnNode> OnednnLowering::node(int32_t n) const {
  if (!lowered(n)) [[unlikely]]
    fail_kind(ErrorKind::Internal, "oneDNN lowering: node {} is not lowered", n);
  return impl_->nodes[size_t(n)];
}

const kernels::OnednnNodeDesc& OnednnLowering::desc(int32_t n) const {
  if (!lowered(n)) [[unlikely]]
    fail_kind(ErrorKind::Internal, "oneDNN lowering: node {} is not lowered", n);
  return impl_->descs[size_t(n)];
}

std::shared_ptr<OnednnLowering::NodeInstance> OnednnLowering::instance(int32_t node) const {
  auto inst = std::make_shared<NodeInstance>();
  inst->inst = this->node(node)->instance();
  return inst;
}

void OnednnLowering::run(int32_t node, const void* const* inputs, void* output,
                         void* scratch) const {
  this->node(node)->run(inputs, output, scratch);
}

void OnednnLowering::run(int32_t node, NodeInstance& inst, const void* const* inputs,
                         void* output, void* scratch) const {
  this->node(node)->run(*inst.inst, inputs, output, scratch);
}

}  // namespace kiln::cpu
