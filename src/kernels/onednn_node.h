// oneDNN primitives built from plain data: the one piece of oneDNN code that both the CPU
// compiler (targets/cpu/onednn_lowering.cc, at compile time) and the runtime (a package's
// launches, at load time) run, so that a loaded package computes exactly what the compiler's
// Executable computed. See Note [oneDNN node descriptors] in onednn_node.cc.
//
// An OnednnNodeDesc says everything the primitive construction reads — op, dtype, dims,
// geometry, epilogue, layout decisions, options — with weights named rather than held: the
// caller supplies their data (ConstantSource) when it builds. It round-trips through JSON
// exactly (floats as bit patterns). dnnl.hpp stays inside the .cc file.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "core/tensor.h"

namespace kiln::kernels {

// The channel block of blocked convolution layouts on this CPU: 16 with AVX-512, else 8.
int native_conv_block();
// Whether oneDNN's convolutions compute in nhwc on this CPU when left to choose (format_tag::any
// for a typical 3x3 convolution; AVX-512 brgconv does, AVX2's jit kernels want nChw8c).
// Measured once per process and dtype.
bool convolutions_prefer_nhwc(bool bf16);
// OpenMP's thread count for kernels (omp_get_max_threads): oneDNN's choices and loop kernels'
// splits depend on it, so a package records it.
int cpu_threads();
// Sets the calling thread's OpenMP thread count for a scope (threads <= 0: unchanged): the
// package loader rebuilds oneDNN nodes for the count the package was written with, so that their
// scratch fits the plan the writer made.
class ScopedCpuThreads {
 public:
  explicit ScopedCpuThreads(int threads);
  ~ScopedCpuThreads();
  ScopedCpuThreads(const ScopedCpuThreads&) = delete;
  ScopedCpuThreads& operator=(const ScopedCpuThreads&) = delete;

 private:
  int saved_;
};

// What this CPU sustains, measured once per process, dtype and OpenMP thread count (Note
// [convolution roofline] in targets/cpu/onednn_lowering.cc): a oneDNN matmul's FLOP rate and a
// large copy's bandwidth. The compiler reads it to tell a kernel far from what its FLOPs and
// bytes need from a merely busy one. Costs a few milliseconds, the first time only; zeros where
// it cannot be measured (no bf16 matmul on this CPU).
struct CpuRoofline {
  double flops_per_ms = 0;  // multiply-adds count 2
  double bytes_per_ms = 0;  // read + written
};
const CpuRoofline& cpu_roofline(bool bf16);
// The same measured now, not cached (a profile measures right before its timed iterations,
// away from the compile's toolchain runs, which share the machine's cores and caches).
CpuRoofline measure_cpu_roofline(bool bf16);

// The time of a call on this thread, for measurements on a shared machine: wall-clock time, or,
// with one OpenMP thread, the thread's CPU time where that is less (time spent descheduled for
// other processes is not the kernel's). Started at construction.
class CallTimer {
 public:
  CallTimer();
  double elapsed_ms() const;

 private:
  int64_t wall_ns_, cpu_ns_;
  bool one_thread_;
};

// One tensor a node reads or writes.
struct OnednnOperand {
  int32_t value = -1;          // the value's id (the key of its layout in OnednnLayouts); -1: absent
  std::vector<int64_t> dims;   // its shape (contiguous type)
  std::string constant;        // non-empty: a parameter or constant, by name (ConstantSource)
  // A 4-D activation stored channels-last (NHWC order in memory, dims still N,C,H,W): the
  // compiler's choice for values loop kernels share with convolutions (Note [channels-last
  // values] in targets/cpu/onednn_lowering.cc). Else plain row-major, or blocked (the layouts
  // table says).
  bool channels_last = false;
};

enum class OnednnConvPolicy : uint8_t { Auto, Blocked, Winograd };   // Note [convolution policy]
enum class OnednnLinearImpl : uint8_t { Auto, InnerProduct, Matmul };  // Note [linear choice]
// The compiler's choice for a linear of M rows and K inputs (Note [linear choice]): `pref`
// unless it is Auto. Records carry the result, so a package keeps the choice it was built with;
// Auto in a record (packages made before the choice was recorded) means matmul for K >= 2048.
OnednnLinearImpl choose_linear_impl(OnednnLinearImpl pref, int64_t m, int64_t k);

// The most inputs a oneDNN concat node takes (a descriptor with more is malformed).
inline constexpr size_t kMaxConcatInputs = 1024;

struct OnednnNodeDesc {
  // conv2d | fused_conv2d | conv_transpose2d | max_pool2d | avg_pool2d | linear | fused_linear |
  // matmul | concat (the op's name in ops.def; the runtime does not know the registry).
  std::string op;
  std::string node;            // the graph node's name, for messages
  bool bf16 = false;           // bfloat16, else float32
  std::vector<OnednnOperand> inputs;  // by the node's input index
  OnednnOperand output;
  bool output_may_block = false;      // Note [layout choice]
  // Convolutions (output_padding folded into pad_end for the transposed one).
  int64_t stride[2] = {1, 1}, pad_begin[2] = {0, 0}, pad_end[2] = {0, 0}, dilation[2] = {1, 1};
  int64_t groups = 1;
  // Pooling, as the op's attributes (stride empty: the kernel size).
  std::vector<int64_t> kernel_size, pool_stride, pool_padding, pool_dilation;
  bool count_include_pad = false;
  // fused_conv2d / fused_linear epilogue.
  std::string activation = "none";  // none relu gelu gelu_tanh silu sigmoid tanh clamp
  float clamp_lo = -3.402823466e38f, clamp_hi = 3.402823466e38f, sum_scale = 1.0f;
  bool has_residual = false;
  // Options of the lowering.
  bool allow_blocked = true;
  OnednnConvPolicy conv = OnednnConvPolicy::Auto;
  OnednnLinearImpl linear = OnednnLinearImpl::Auto;
  std::vector<int64_t> matmul_strides[2];  // a strided matmul operand (empty: contiguous)
  // Convolutions: the layout the primitive computes in, pinned by the compiler's measured
  // choice (Note [measured convolution layout] in targets/cpu/onednn_lowering.cc): "nchw",
  // "nhwc" or "blocked" (the native block); "" = what `conv` says; kKilnDirectLayout: Kiln's
  // own grouped convolution kernel in NCHW instead of a oneDNN primitive (Note [Kiln grouped
  // convolution] in kernels/grouped_conv.cc).
  std::string conv_layout;
  // concat: the dim the inputs are joined along (Note [oneDNN concat] in onednn_node.cc).
  int64_t concat_dim = 1;

  std::string to_json() const;
  // Throws kiln::Error (ParseError) naming `where` for anything malformed.
  static OnednnNodeDesc from_json(std::string_view text, const std::string& where);
};

// The data of a named constant (weights, bias, constant activations); throws when absent. The
// tensor need only live while build() runs: a node copies (or prepacks) what it reads at run time.
using ConstantSource = std::function<Tensor(const std::string& name)>;

// Weights a node reordered into the layout its primitive reads (Note [prepacked weights] in
// onednn_node.cc): the constant's name, the layout as text (every field of oneDNN's memory
// descriptor that says where an element lies; two layouts are the same exactly when their texts
// are), and the bytes. A node reports the ones it holds (OnednnNode::prepacked), and a package's
// loader hands them back (PrepackedSource) so that the node copies them instead of reordering.
struct PrepackedWeights {
  std::string constant;
  std::string layout;
  const void* data = nullptr;
  size_t bytes = 0;
};
// The prepacked bytes of a constant, or null: the node reorders the constant's plain data
// (ConstantSource) as usual. The node reads given bytes in place (never writes them): they must
// outlive it. A node given bytes whose layout is not the one its primitive chose
// here throws (InvalidArgument), naming both layouts; it never reads them in another layout.
using PrepackedSource = std::function<const PrepackedWeights*(const std::string& constant)>;

// The layouts of blocked values, filled by the nodes that produce them (in graph order) and read
// by their consumers. One per graph.
class OnednnLayouts {
 public:
  OnednnLayouts();
  ~OnednnLayouts();
  void reset(size_t num_values);
  bool blocked(int32_t value) const;
  int64_t value_bytes(int32_t value) const;  // -1 for a plain value
  // One value's entry, opaque: trial builds of its producer overwrite it, and putting the kept
  // build's entry back saves building that one again.
  struct Entry;
  std::shared_ptr<const Entry> entry(int32_t value) const;
  // Whether two entries hold the same layout (and blockedness).
  static bool same(const Entry& a, const Entry& b);
  void set_entry(int32_t value, const std::shared_ptr<const Entry>& entry);
  struct Impl;
  Impl& impl() { return *impl_; }
  const Impl& impl() const { return *impl_; }

 private:
  std::unique_ptr<Impl> impl_;
};

// OnednnNodeDesc::conv_layout for Kiln's grouped convolution kernel.
inline constexpr const char* kKilnDirectLayout = "kiln-direct";
// Why Kiln's grouped convolution kernel does not take `d` ("" when it does): float32 conv2d /
// fused_conv2d, grouped or of at most 4 input channels, stride 1 or 2, undilated, constant
// weights and bias, relu / clamp / silu / no activation (Note [Kiln grouped convolution] in
// kernels/grouped_conv.cc).
std::string kiln_direct_conv_why_not(const OnednnNodeDesc& d);

// Whether oneDNN's implementation name ("ref:any", "brgconv:avx512_core") is one of its
// reference kernels: correct, but an element at a time, 100-1000x slower than its jit kernels.
bool is_reference(std::string_view implementation);

// Note [measured Winograd] (targets/cpu/onednn_lowering.cc): convolution `d` built both with
// the direct algorithm (conv policy Auto, no pinned layout) and with Winograd (conv policy
// Winograd, conv_layout "blocked"), plain in and out, run once each on the same random
// activations (uniform in [-1, 1), a fixed seed; the residual too) with the weights
// `constants` gives: max |winograd - direct| / max |direct|. Infinity where either output holds
// a NaN or an infinity; -1 where either build fails or oneDNN has no Winograd kernel for it
// here (the second build is then direct too). Deterministic: one thread, fixed inputs.
double winograd_disagreement(const OnednnNodeDesc& d, const ConstantSource& constants);
// The same, keeping the two builds (plain in and out, created for one thread) for a caller
// that times them next.
struct WinogradTrial {
  double disagreement = -1;
  std::shared_ptr<class OnednnNode> direct, winograd;
};
WinogradTrial winograd_trial(const OnednnNodeDesc& d, const ConstantSource& constants);

// One node's primitives, prepacked weights and prebuilt reorders (Note [oneDNN lowering]).
class OnednnNode {
 public:
  // Builds `desc` (oneDNN's primitive descriptors, weights prepacked from `constants`). A node
  // oneDNN has no implementation for comes back with lowered() false and why_not() saying so.
  // Primitives are created for the current OpenMP thread count.
  // `prepacked` (optional) gives weights already in their primitive's layout.
  static std::shared_ptr<OnednnNode> build(const OnednnNodeDesc& desc, OnednnLayouts& layouts,
                                           const ConstantSource& constants,
                                           const PrepackedSource& prepacked = {});
  ~OnednnNode();
  OnednnNode(const OnednnNode&) = delete;
  OnednnNode& operator=(const OnednnNode&) = delete;

  bool lowered() const;
  const std::string& why_not() const;
  // "conv2d 7x7/2 3->64 f32 brg:avx512_core src nchw -> dst nhwc, ...": includes oneDNN's
  // implementation name, so two builds that chose differently describe differently.
  const std::string& description() const;
  // oneDNN's implementation name for convolutions ("brg:avx512_core", "ref:any"), else "".
  const std::string& implementation() const;
  // The steps run() takes: the primitive (or Kiln's kernel), and each reorder or copy around it.
  size_t steps() const;
  int64_t scratch_bytes() const;
  // The weights this node holds reordered (conv / linear weights, a matmul's constant b), in
  // build order, viewing the node's own buffers (valid while the node lives). Only layouts that
  // a text describes exactly (blocked and Winograd formats) are listed.
  std::vector<PrepackedWeights> prepacked() const;
  // Whether run() accepts the residual's buffer as the output buffer.
  bool residual_may_alias_output() const;

  // Per-call state (memory objects holding the last bound pointers); see NodeInstance in
  // targets/cpu/onednn_lowering.h.
  struct Instance;
  std::shared_ptr<Instance> instance() const;
  // inputs[i]: the data of input i where it is an activation; output: output 0; scratch:
  // scratch_bytes() bytes, 64-byte aligned. Steps run on the calling thread's oneDNN stream.
  void run(Instance& inst, const void* const* inputs, void* output, void* scratch) const;
  // On the node's own instance (not reentrant).
  void run(const void* const* inputs, void* output, void* scratch) const;

  struct Plan;

 private:
  OnednnNode();
  std::unique_ptr<Plan> plan_;
};

}  // namespace kiln::kernels
