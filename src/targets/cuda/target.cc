// The CUDA target (compiler/target.h): loop kernels emitted as CUDA C and compiled by NVRTC for
// the device's architecture (cached as cubins), cuBLASLt GEMMs, cuDNN convolutions, direct
// kernels for what neither covers (targets/cuda/direct_kernels.h), a device arena and a stream
// per execution context (CUDA-graph replay in reduce-overhead). See Note [CUDA target].
//
// Note [CUDA target]
// Library kernels:
//   matmul (batched, B or A broadcast over the whole batch), linear (bias as the cuBLASLt BIAS
//   epilogue): cuBLASLt, f32 without TF32, f16/bf16 with f32 accumulation. What cuBLASLt does
//   not take goes to the direct GEMM kernel (gemm_needs_direct_kernel): float64 and integer
//   dtypes, batch dims that broadcast only partially ([2,1,M,K] x [3,K,N]: one strided batch
//   cannot express it; attention's decomposition makes such products), K = 0 (the output is the
//   bias or zeros) and empty outputs.
//   conv2d / conv_transpose2d (NCHW, groups, dilation, asymmetric padding; bias fused in the
//   cuDNN graph where an engine takes it, else a bias kernel after the convolution): cuDNN in
//   f32/f16/bf16; float64 runs the direct convolution kernels.
//   max_pool2d / avg_pool2d, adaptive_avg_pool2d (not global), concat, split, embedding /
//   index_select, gather, scatter_add, pad, upsample, grid_sample, argmax / argmin: direct
//   kernels with every size a literal (Note [CUDA direct kernels] in direct_kernels.cc; an
//   out-of-range index is reported through the status record and fails the call as the
//   reference does), generated per graph into one NVRTC program of their own (--fmad=false).
//   scaled_dot_product_attention: one flash-style direct kernel per node (Note [CUDA flash
//   attention] in direct_kernels.cc): the score matrix is never stored, every mask form and
//   dtype of the reference, a fully masked row NaN as the reference.
// fused_conv2d and fused_linear are decomposed by the compiler pipeline on this target: the
// convolution or GEMM runs in the library and the residual add and activation become generated
// pointwise code (the GPU-speed issue fuses them back into epilogues). Everything pointwise,
// reductions, softmax / log_softmax / layer_norm and global average pooling are generated
// (targets/cuda/emitter.cc); integer div / pow report a zero divisor or a negative exponent
// through the status record (Note [Device status] in runtime/executable.h). An op that is
// neither fails to compile on CUDA naming the node (capture then runs the graph eagerly).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <mutex>

#include <fmt/format.h>

#include "compiler/compile.h"
#include "compiler/target.h"
#include "core/cuda_runtime.h"
#include "core/error.h"
#include "lower/scheduler.h"
#include "runtime/launch_library.h"
#include "kernels/cuda/cublaslt_gemm.h"
#include "kernels/cuda/cuda_driver.h"
#include "kernels/cuda/cudnn_conv.h"
#include "kernels/cuda/cudnn_sdpa.h"
#include "targets/cuda/direct_kernels.h"
#include "targets/cuda/emitter.h"
#include "targets/cuda/nvrtc.h"
#include "targets/cuda/support.h"

namespace kiln::cuda {

namespace {

using compiler::Knobs;
using compiler::MemRef;

constexpr int kDevice = 0;

bool concrete(const TensorType& t) {
  for (size_t i = 0; i < t.shape.size(); ++i)
    if (!t.shape[i].is_concrete()) return false;
  return true;
}

int multiprocessors() {
  static int n = [] {
    CudaDeviceInfo i = cuda_device_info(kDevice);
    return i.error.empty() ? i.multiprocessors : 0;
  }();
  return n;
}

// Note [CUDA cross-builds]
// compiler::Options::arch = "sm_90" (the `arch` knob) compiles for a GPU that is not here:
//   - NVRTC builds the cubins for that architecture (it needs no GPU); nothing is loaded;
//   - grids are sized for the architecture's usual multiprocessor count (kSmCount: the
//     datacenter part of each generation; the `sms` knob overrides it), which changes only how
//     work is split, never what is computed per element;
//   - cuBLASLt and cuDNN cannot be asked without a device: GEMMs and convolutions are recorded as
//     descriptors with kCrossWorkspaceBytes of scratch each, and the loader picks the
//     heuristic's first algorithm / engine within it (Note [CUDA launch records]); a
//     convolution's bias always runs as its own kernel (whether an engine fuses it is the
//     device's to say);
//   - constants stay on the host and the Executable is marked not runnable: it is written as a
//     package (runtime/package.h), which the loader checks against the GPU it finds.
// A package built on the GPU itself pins its choices instead and is bitwise the compiled run; a
// cross-built one computes the same ops with possibly other library kernels (tests compare it
// within float32 rounding).
constexpr int64_t kCrossWorkspaceBytes = int64_t(32) << 20;

struct SmCount {
  const char* arch;
  int sms;
};
constexpr SmCount kSmCount[] = {{"sm_70", 80},  {"sm_75", 40},  {"sm_80", 108}, {"sm_86", 84},
                                {"sm_87", 16},  {"sm_89", 128}, {"sm_90", 132}, {"sm_100", 148},
                                {"sm_120", 84}};

// What the build is for: the device here, or (the `arch` knob) a cross-build.
struct BuildFor {
  std::string arch;
  int sms = 0;
  bool cross = false;
};

BuildFor build_for(const Knobs& knobs) {
  BuildFor b;
  const std::string* arch = knobs.find("arch");
  if (!arch) {
    b.arch = device_arch(kDevice);
    b.sms = std::max(multiprocessors(), 1);
    return b;
  }
  b.cross = true;
  b.arch = *arch;
  if (b.arch.size() < 5 || b.arch.size() > 7 || b.arch.compare(0, 3, "sm_") != 0 ||
      b.arch.find_first_not_of("0123456789", 3) != std::string::npos)
    fail("cuda: arch '{}' is not a CUDA architecture (e.g. sm_90)", b.arch);
  b.sms = 0;
  for (const SmCount& s : kSmCount)
    if (b.arch == s.arch) b.sms = s.sms;
  if (const std::string* sms = knobs.find("sms")) {
    try {
      b.sms = std::stoi(*sms);
    } catch (const std::exception&) {
      b.sms = -1;
    }
    if (b.sms < 1 || b.sms > 1024) fail("cuda: knob sms={} is not a multiprocessor count", *sms);
  }
  if (b.sms == 0)
    fail("cuda: no multiprocessor count is known for {}: give it as the knob sms=N", b.arch);
  return b;
}


// ---- library kernels --------------------------------------------------------------------------

struct LibNode {
  enum class Kind { None, Gemm, Conv, Sdpa, Direct } kind = Kind::None;
  std::string why_not;
  std::string describe;
  // Gemm
  std::shared_ptr<GemmPlan> gemm;
  GemmDesc gemm_desc;  // a cross-build's GEMM: no plan, the descriptor only
  int gemm_a = 0, gemm_b = 1, gemm_bias = -1;  // input indices
  // Conv
  std::shared_ptr<ConvPlan> conv;
  ConvDesc conv_desc;  // a cross-build's convolution: no plan, the descriptor only
  bool conv_bias_kernel = false;  // the bias is added by a direct kernel after the convolution
  // Sdpa: cuDNN's fused attention
  std::shared_ptr<SdpaPlan> sdpa;
  // Direct kernels (and the conv bias kernel): a kernel of the library program, with its
  // arguments as (input index | output index) lists.
  std::string kernel_name;
  int64_t blocks = 0;
  int threads = 256;
  std::vector<int> arg_inputs;   // node input indices, first
  std::vector<int> arg_outputs;  // then node output indices
  bool reports = false;          // then the status record (Note [Device status])
  Executable::DeviceCheck check;
  CudaKernel kernel;
};

class CudaLibraryKernels final : public compiler::LibraryKernels {
 public:
  CudaLibraryKernels(const Graph& g, const std::vector<int32_t>& nodes, BuildFor build)
      : build_(std::move(build)) {
    nodes_.resize(g.nodes.size());
    std::string source;
    for (int32_t i : nodes) {
      LibNode& ln = nodes_[size_t(i)];
      const Node& n = g.nodes[size_t(i)];
      try {
        plan(g, n, i, ln, source);
      } catch (const Error& e) {
        if (e.kind() != ErrorKind::NotSupported && e.kind() != ErrorKind::InvalidArgument) throw;
        ln = LibNode{};  // nothing of a half-made plan (a kernel name without its source) stays
        ln.kind = LibNode::Kind::None;
        ln.why_not = e.message();
      }
      if (ln.gemm) scratch_ = std::max(scratch_, ln.gemm->workspace_bytes());
      if (ln.conv) scratch_ = std::max(scratch_, ln.conv->workspace_bytes());
      if (ln.sdpa) scratch_ = std::max(scratch_, ln.sdpa->workspace_bytes());
      if (build_.cross && (ln.kind == LibNode::Kind::Gemm || ln.kind == LibNode::Kind::Conv))
        scratch_ = std::max(scratch_, size_t(kCrossWorkspaceBytes));
    }
    if (!source.empty()) {
      CudaCompileRequest req = direct_program(
          source, (g.name.empty() ? std::string("graph") : g.name) + "_lib", build_.arch);
      program_ = compile_cuda(req);
      program_name_ = req.program_name;
      arch_ = req.arch;
      if (!build_.cross) {  // a cross-build loads nothing (Note [CUDA cross-builds])
        module_ = CudaModule::load(program_->cubin, kDevice, req.program_name);
        for (LibNode& ln : nodes_)
          if (!ln.kernel_name.empty()) ln.kernel = module_->kernel(ln.kernel_name);
      }
    }
  }

  bool lowered(int32_t node) const override {
    return size_t(node) < nodes_.size() && nodes_[size_t(node)].kind != LibNode::Kind::None;
  }
  int64_t value_bytes(ValueId) const override { return -1; }
  int64_t scratch_bytes() const override { return int64_t((scratch_ + 255) / 256 * 256); }
  std::string describe(int32_t node) const override { return nodes_[size_t(node)].describe; }
  std::string why_not(int32_t node) const override {
    return size_t(node) < nodes_.size() ? nodes_[size_t(node)].why_not : "";
  }
  std::vector<Executable::DeviceCheck> device_checks() const override {
    std::vector<Executable::DeviceCheck> out;
    for (const LibNode& ln : nodes_)
      if (ln.reports) out.push_back(ln.check);
    return out;
  }
  Executable::Launch bind(int32_t node, const std::vector<MemRef>& inputs,
                          const std::vector<MemRef>& outputs, MemRef scratch,
                          MemRef status) const override {
    const LibNode& ln = nodes_[size_t(node)];
    if (ln.reports && status.slot < 0)
      fail_kind(ErrorKind::Internal, "cuda: node {} reports bad indices but has no status record", node);
    auto at = [](const std::vector<MemRef>& v, int i) { return i >= 0 && size_t(i) < v.size() ? v[size_t(i)] : MemRef{}; };
    // The direct kernel's (or the bias kernel's) arguments: inputs, outputs, then the status.
    CudaKernelSpec spec;
    if (!ln.kernel_name.empty()) {
      spec.module = program_name_;
      spec.kernel = ln.kernel_name;
      spec.grid = unsigned(ln.blocks);
      spec.block = unsigned(ln.threads);
      for (int i : ln.arg_inputs) spec.args.push_back(at(inputs, i));
      for (int o : ln.arg_outputs) spec.args.push_back(at(outputs, o));
      if (ln.reports) spec.args.push_back(status);
    }
    const int64_t ws = scratch_bytes();
    switch (ln.kind) {
      case LibNode::Kind::Gemm: {
        CublasltBuffers b{at(inputs, ln.gemm_a), at(inputs, ln.gemm_b), at(inputs, ln.gemm_bias),
                          at(outputs, 0), scratch, ws};
        return make_cublaslt_launch(ln.gemm ? ln.gemm->desc() : ln.gemm_desc, ln.gemm, b);
      }
      case LibNode::Kind::Conv: {
        const ConvDesc& d = ln.conv ? ln.conv->desc() : ln.conv_desc;
        CudnnConvBuffers b{at(inputs, 0), at(inputs, 1),
                           d.bias || ln.conv_bias_kernel ? at(inputs, 2) : MemRef{},
                           at(outputs, 0), scratch, ws};
        return make_cudnn_conv_launch(d, ln.conv, b,
                                      ln.conv_bias_kernel ? &ln.kernel : nullptr,
                                      ln.conv_bias_kernel ? std::move(spec) : CudaKernelSpec{});
      }
      case LibNode::Kind::Sdpa: {
        CudnnSdpaBuffers b{at(inputs, 0), at(inputs, 1), at(inputs, 2), at(outputs, 0), scratch, ws};
        return make_cudnn_sdpa_launch(ln.sdpa, b);
      }
      case LibNode::Kind::Direct: return make_cuda_kernel_launch(ln.kernel, std::move(spec));
      case LibNode::Kind::None: break;
    }
    fail_kind(ErrorKind::Internal, "cuda: node {} was not lowered to a library kernel", node);
  }
  std::vector<Executable::DeviceModule> device_modules() const override {
    if (!program_) return {};
    // The cubin as the kernel cache's entry holds it (an aliasing pointer: no copy).
    return {{program_name_, arch_, std::shared_ptr<const std::string>(program_, &program_->cubin)}};
  }

 private:
  void plan(const Graph& g, const Node& n, int32_t index, LibNode& ln, std::string& source);
  void plan_gemm(const Graph& g, const Node& n, LibNode& ln);
  void plan_conv(const Graph& g, const Node& n, int32_t index, LibNode& ln, std::string& source);
  void plan_direct(const Graph& g, const Node& n, int32_t index, LibNode& ln, std::string& source);
  std::string plan_sdpa(const Graph& g, const Node& n, LibNode& ln);

  std::vector<LibNode> nodes_;
  size_t scratch_ = 0;
  std::shared_ptr<const CompiledCubin> program_;
  BuildFor build_;
  std::string program_name_, arch_;
  std::shared_ptr<CudaModule> module_;
};

void CudaLibraryKernels::plan(const Graph& g, const Node& n, int32_t index, LibNode& ln,
                              std::string& source) {
  for (ValueId o : n.outputs)
    if (!concrete(g.type(o))) fail_kind(ErrorKind::NotSupported, "symbolic shapes");
  switch (n.op) {
    case OpId::Matmul: case OpId::Linear:
      // cuBLASLt where it takes the dtype and shape, else the direct GEMM kernel (float64,
      // integers, partially broadcast batch dims, K = 0, empty outputs).
      if (gemm_needs_direct_kernel(g, n).empty()) plan_gemm(g, n, ln);
      else plan_direct(g, n, index, ln, source);
      break;
    case OpId::Conv2d: case OpId::ConvTranspose2d:
      if (library_dtype(g.type(n.inputs[0]).dtype)) plan_conv(g, n, index, ln, source);
      else plan_direct(g, n, index, ln, source);  // float64: the direct convolution kernel
      break;
    case OpId::AdaptiveAvgPool2d:
      // Global pooling is a generated reduction (it fuses with its neighbours).
      if (const Ints& os = n.attrs.get_ints("output_size"); os.size() == 2 && os[0] == 1 && os[1] == 1)
        fail_kind(ErrorKind::NotSupported, "global average pooling is generated code");
      plan_direct(g, n, index, ln, source);
      break;
    case OpId::ScaledDotProductAttention: {
      // cuDNN's fused attention where it takes the node, else the flash-style direct kernel.
      std::string why = plan_sdpa(g, n, ln);
      if (!why.empty()) {
        plan_direct(g, n, index, ln, source);
        ln.describe += " [not cuDNN: " + why + "]";
      }
      break;
    }
    default: plan_direct(g, n, index, ln, source); break;
  }
}

// Note [CUDA attention]
// scaled_dot_product_attention runs as cuDNN's fused flash attention where all of these hold,
// else as the direct flash-style kernel (Note [CUDA flash attention] in direct_kernels.cc):
//   - float16 or bfloat16 (cuDNN has no fused float32 engine);
//   - no mask input (none, or is_causal): a fully masked row is NaN in Kiln's semantics, and
//     cuDNN's kernels guard the row maximum (sdpa_fully_masked_row_is_nan), so a mask that may
//     mask a whole row goes to the direct kernel, which follows the reference; a causal row
//     always attends its first key;
//   - q, k and v with the same batch dims (no broadcasting), read as [B, H, S, D] (the last
//     batch dim is H, the others multiply into B);
//   - compiled on the GPU (a cross-build has no cuDNN to ask: the direct kernel, which computes
//     the same function on every GPU);
//   - cuDNN offers an engine (head dims multiples of 8 and at most 256, sm_80 and later).
// Returns "" when ln is planned as cuDNN attention, else why not.
std::string CudaLibraryKernels::plan_sdpa(const Graph& g, const Node& n, LibNode& ln) {
  if (build_.cross) return "a cross-build (no cuDNN to ask)";
  DType dt = g.type(n.outputs[0]).dtype;
  if (dt != DType::Float16 && dt != DType::BFloat16)
    return fmt::format("{} (cuDNN fuses float16 and bfloat16)", dtype_name(dt));
  if (n.inputs.size() > 3 && n.inputs[3] != kNoValue)
    return "an explicit mask (a fully masked row must be NaN)";
  Dims q = dims_of(g.type(n.inputs[0])), k = dims_of(g.type(n.inputs[1]));
  Dims v = dims_of(g.type(n.inputs[2]));
  if (q.size() != k.size() || q.size() != v.size() ||
      !std::equal(q.begin(), q.end() - 2, k.begin()) || !std::equal(q.begin(), q.end() - 2, v.begin()))
    return "batch dims that broadcast";
  SdpaDesc d;
  d.dtype = dt;
  d.device = kDevice;
  const size_t r = q.size();
  d.heads = r >= 3 ? q[r - 3] : 1;
  d.batch = 1;
  for (size_t i = 0; i + 3 < r; ++i) d.batch *= q[i];
  d.seq_q = q[r - 2];
  d.head_dim = q[r - 1];
  d.seq_kv = k[r - 2];
  d.head_dim_v = v[r - 1];
  if (d.batch * d.heads * d.seq_q * d.seq_kv * d.head_dim * d.head_dim_v == 0) return "an empty tensor";
  d.scale = n.attrs.has("scale") ? n.attrs.get_float("scale") : 1.0 / std::sqrt(double(d.head_dim));
  if (!(d.scale > 0)) return "a scale that is not positive";
  d.causal = n.attrs.get_bool("is_causal");
  std::string why;
  std::unique_ptr<SdpaPlan> plan;
  try {
    plan = SdpaPlan::try_create(d, &why);
  } catch (const Error& e) {
    if (e.kind() != ErrorKind::NotSupported && e.kind() != ErrorKind::InvalidArgument) throw;
    return e.message();
  }
  if (!plan) return why;
  ln.sdpa = std::move(plan);
  ln.kind = LibNode::Kind::Sdpa;
  ln.describe = ::kiln::cuda::describe(d) + " cuDNN fused flash attention, engine " +
                ln.sdpa->engine().tag;
  return "";
}

void CudaLibraryKernels::plan_gemm(const Graph& g, const Node& n, LibNode& ln) {
  const TensorType& at = g.type(n.inputs[0]);
  const TensorType& bt = g.type(n.inputs[1]);
  DType dt = at.dtype;
  if (!library_dtype(dt) || bt.dtype != dt)
    fail_kind(ErrorKind::NotSupported, "cuBLASLt takes float32, float16 or bfloat16, not {}", dtype_name(dt));
  GemmDesc d;
  d.dtype = dt;
  d.device = kDevice;
  Dims a = dims_of(at), b = dims_of(bt), out = dims_of(g.type(n.outputs[0]));
  if (n.op == OpId::Linear) {
    int64_t k = a.back();
    d.k = k;
    d.n = b[0];
    d.m = numel(a) / std::max<int64_t>(k, 1);
    d.trans_b = true;  // weight [N, K]
    if (n.inputs.size() > 2 && n.inputs[2] != kNoValue) {
      d.epilogue = GemmEpilogue::Bias;
      ln.gemm_bias = 2;
      if (g.type(n.inputs[2]).dtype != dt) fail_kind(ErrorKind::NotSupported, "bias dtype");
    }
  } else {
    // 1-D operands are promoted: a [K] -> [1, K], b [K] -> [K, 1].
    if (a.size() == 1) a = Dims{1, a[0]};
    if (b.size() == 1) b = Dims{b[0], 1};
    d.m = a[a.size() - 2];
    d.k = a[a.size() - 1];
    d.n = b[b.size() - 1];
    int64_t ab = numel(a) / std::max<int64_t>(d.m * d.k, 1);
    int64_t bb = numel(b) / std::max<int64_t>(d.k * d.n, 1);
    int64_t ob = std::max(ab, bb);
    if (d.m * d.k == 0 || d.k * d.n == 0) ob = numel(out) / std::max<int64_t>(d.m * d.n, 1);
    // Only uniform batches: an operand either has the output's whole batch (then its batch dims
    // equal the output's) or is one matrix broadcast over it (stride 0).
    if ((ab != ob && ab != 1) || (bb != ob && bb != 1))
      fail_kind(ErrorKind::NotSupported, "batch dims that broadcast partially");
    d.batch = ob;
    d.stride_a = ab == 1 ? 0 : d.m * d.k;
    d.stride_b = bb == 1 ? 0 : d.k * d.n;
    d.stride_d = d.m * d.n;
  }
  if (d.m == 0 || d.n == 0) fail_kind(ErrorKind::NotSupported, "an empty output");
  if (d.k == 0) fail_kind(ErrorKind::NotSupported, "K = 0 (the output is the bias or zeros)");
  ln.kind = LibNode::Kind::Gemm;
  if (build_.cross) {  // Note [CUDA cross-builds]: the loader asks cuBLASLt
    ln.gemm_desc = d;
    ln.describe = fmt::format("gemm {} {}x{}x{} batch {}{} (cuBLASLt algorithm chosen at load)",
                              dtype_name(dt), d.m, d.n, d.k, d.batch,
                              d.epilogue == GemmEpilogue::Bias ? " epilogue bias" : "");
    return;
  }
  ln.gemm = GemmPlan::create(d);
  ln.describe = ln.gemm->describe();
}

void CudaLibraryKernels::plan_conv(const Graph& g, const Node& n, int32_t index, LibNode& ln,
                                   std::string& source) {
  const TensorType& xt = g.type(n.inputs[0]);
  const TensorType& wt = g.type(n.inputs[1]);
  DType dt = xt.dtype;
  if (!library_dtype(dt) || wt.dtype != dt)
    fail_kind(ErrorKind::NotSupported, "cuDNN convolutions here take float32, float16 or bfloat16");
  bool transposed = n.op == OpId::ConvTranspose2d;
  Dims x = dims_of(xt), w = dims_of(wt), y = dims_of(g.type(n.outputs[0]));
  ConvDesc d;
  d.kind = transposed ? ConvKind::Transpose : ConvKind::Forward;
  d.dtype = dt;
  d.layout = ConvLayout::NCHW;
  d.device = kDevice;
  d.n = x[0];
  d.c_in = x[1];
  d.h = x[2];
  d.w = x[3];
  d.groups = n.attrs.get_int("groups");
  d.c_out = transposed ? w[1] * d.groups : w[0];
  d.kh = w[2];
  d.kw = w[3];
  const Ints& s = n.attrs.get_ints("stride");
  const Ints& p = n.attrs.get_ints("padding");
  const Ints& dl = n.attrs.get_ints("dilation");
  for (int i = 0; i < 2; ++i) {
    d.stride[size_t(i)] = s[size_t(i)];
    d.dilation[size_t(i)] = dl[size_t(i)];
    d.pad_pre[size_t(i)] = p[size_t(i)];
    d.pad_post[size_t(i)] = p.size() == 4 ? p[size_t(i + 2)] : p[size_t(i)];
  }
  if (transposed) {
    const Ints& op = n.attrs.get_ints("output_padding");
    d.output_padding = {op[0], op[1]};
  }
  bool bias = n.inputs.size() > 2 && n.inputs[2] != kNoValue;
  std::string why;
  if (build_.cross) {  // Note [CUDA cross-builds]: the loader asks cuDNN; the bias as a kernel
    std::array<int64_t, 4> od = conv_output_dims(d);
    if (od != std::array<int64_t, 4>{y[0], y[1], y[2], y[3]})
      fail_kind(ErrorKind::Internal, "cuDNN's output shape disagrees with Kiln's inference");
    ln.conv_desc = d;
    ln.conv_bias_kernel = bias;
  } else if (bias) {
    d.bias = true;
    ln.conv = ConvPlan::try_create(d, &why);
    if (!ln.conv) {  // no engine fuses the bias: the convolution, then a bias kernel
      d.bias = false;
      ln.conv_bias_kernel = true;
    }
  }
  if (!build_.cross) {
    if (!ln.conv) ln.conv = ConvPlan::create(d);
    if (ln.conv->output_dims() != std::array<int64_t, 4>{y[0], y[1], y[2], y[3]})
      fail_kind(ErrorKind::Internal, "cuDNN's output shape disagrees with Kiln's inference");
  }
  ln.kind = LibNode::Kind::Conv;
  ln.describe = ::kiln::cuda::describe(d) + " engine " +
                (ln.conv ? ln.conv->engine().tag : std::string("chosen at load")) +
                (ln.conv_bias_kernel ? " + bias kernel" : "");
  if (ln.conv_bias_kernel) {
    ln.kernel_name = fmt::format("kn_bias_{}", index);
    int64_t total = numel(y), plane = y[2] * y[3], c = y[1];
    ln.threads = 256;
    ln.blocks = std::min<int64_t>((total + 255) / 256, int64_t(build_.sms) * 16);
    ln.arg_inputs = {2};
    ln.arg_outputs = {0};
    source += fmt::format(
        "// kiln-kernel: {0}\n// the bias of {1} '{2}'\nextern \"C\" __global__ void {0}(char* bias_, char* y_) {{\n"
        "  const {3}* bias = (const {3}*)bias_; {3}* y = ({3}*)y_;\n"
        "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < {4}LL; i += (long long)gridDim.x * blockDim.x) {{\n"
        "    const long long ch = (i / {5}LL) % {6}LL;\n"
        "    y[i] = {7};\n  }}\n}}\n\n",
        ln.kernel_name, op_def(n.op).name, n.name, cuda_storage(dt), total, plane, c,
        from_float(dt, to_float(dt, "y[i]") + " + " + to_float(dt, "bias[ch]")));
  }
}

void CudaLibraryKernels::plan_direct(const Graph& g, const Node& n, int32_t index, LibNode& ln,
                                     std::string& source) {
  DirectKernel k = plan_direct_kernel(g, n, index, int64_t(build_.sms) * 16);
  ln.kernel_name = k.name;
  ln.blocks = k.blocks;
  ln.threads = k.threads;
  ln.arg_inputs = k.arg_inputs;
  ln.arg_outputs = k.arg_outputs;
  ln.reports = k.reports;
  ln.check = {int64_t(index) + 1, k.check_prefix, k.check_suffix};
  ln.describe = k.describe;
  ln.kind = LibNode::Kind::Direct;
  source += k.source;
}

// ---- the target ---------------------------------------------------------------------------------

class CudaTarget final : public compiler::Target {
 public:
  const char* name() const override { return "cuda"; }
  Device device() const override { return Device::cuda(kDevice); }
  const char* library_name() const override { return "cuBLASLt/cuDNN"; }
  const compiler::OpSupportTable& support() const override { return cuda_support(); }

  std::vector<OpId> decompositions() const override {
    return {OpId::BatchNorm, OpId::GroupNorm, OpId::FusedConv2d, OpId::FusedLinear};
  }

  bool generates(const Graph& g, const Node& n) const override {
    if (!cuda_support()[size_t(n.op)].generated || !lower::loop_expressible(g, n)) return false;
    DType od = g.type(n.outputs[0]).dtype;
    const OpDef& d = op_def(n.op);
    // Integer div / pow report a zero divisor or a negative exponent (Note [Device status]).
    if (d.has(trait::Pointwise)) return true;
    if (d.has(trait::RowNorm)) return is_floating(od);
    if (n.op == OpId::Sum || n.op == OpId::Prod || n.op == OpId::Max || n.op == OpId::Min)
      return true;  // integer and bool inputs accumulate in int64
    return is_floating(od);
  }


  compiler::SchedulePolicy policy(const Knobs&) const override { return {}; }

  bool library_reads_strided(const Graph&, const Node&, int, const lower::ViewGeometry&) const override {
    return false;
  }

  std::unique_ptr<compiler::LibraryKernels> lower_library(const Graph& g,
                                                          const std::vector<int32_t>& nodes,
                                                          compiler::LibraryRequest,
                                                          const Knobs& knobs) const override {
    BuildFor build = build_for(knobs);
    if (!build.cross) require_cuda_device(kDevice, "compiling for CUDA");
    return std::make_unique<CudaLibraryKernels>(g, nodes, std::move(build));
  }

  compiler::LoopBuild build_loops(const Graph& g, const lower::Schedule& s,
                                  const std::vector<MemRef>& mem, MemRef status,
                                  const compiler::Options& options, const Knobs& knobs) const override {
    CudaCodegenOptions co;
    co.inject_error_into = options.inject_error_into;
    co.status_slot = status.slot;
    co.vectorize = options.vectorize;
    BuildFor build = build_for(knobs);
    int64_t max_blocks = int64_t(build.sms) * 32;
    std::string name = g.name.empty() ? "graph" : g.name;
    CudaProgram prog = generate_cuda(g, s, mem, name, max_blocks, co);
    compiler::LoopBuild out;
    out.device_checks = std::move(prog.checks);
    if (s.loops.empty()) {
      out.cache_hit = true;
      return out;
    }
    CudaCompileRequest req;
    req.source = prog.source;
    req.program_name = name;
    req.arch = build.arch;
    std::shared_ptr<const CompiledCubin> cubin = compile_cuda(req);
    out.cache_hit = cubin->cache_hit;
    out.build_s = cubin->compile_seconds;
    std::shared_ptr<CudaModule> module;
    if (!build.cross) {  // a cross-build loads nothing (Note [CUDA cross-builds])
      module = CudaModule::load(cubin->cubin, kDevice, name);
      out.keep_alive = module;
    }
    out.device_modules.push_back(
        {name, req.arch, std::shared_ptr<const std::string>(cubin, &cubin->cubin)});
    for (const CudaKernelInfo& k : prog.kernels) {
      CudaKernelSpec spec;
      spec.module = name;
      spec.kernel = k.name;
      spec.grid = unsigned(k.blocks);
      spec.block = unsigned(std::max(k.threads, 1));
      for (int32_t slot : k.slots) spec.args.push_back(MemRef{slot, 0});
      Executable::Launch l =
          make_cuda_kernel_launch(module ? module->kernel(k.name) : CudaKernel{}, std::move(spec));
      l.kind = "loop";
      out.launches.push_back(std::move(l));
      out.vectorized.push_back(false);
    }
    return out;
  }

  std::shared_ptr<char> allocate(int64_t bytes) const override {
    return allocate_device_arena(bytes, kDevice);
  }
  Tensor place_constant(const Tensor& t) const override {
    Tensor c = t.contiguous();
    return c.device() == device() ? c : c.to(device());
  }

  std::vector<Candidate> autotune_candidates(const Graph&, const compiler::Options&,
                                             std::string* note) const override {
    *note = "; the CUDA search space (cuBLASLt algorithms, cuDNN engines, block sizes) is not "
            "timed yet: the default configuration";
    return {Candidate{}};
  }
  Variants autotune_variants(const compiler::CompileReport&) const override { return {}; }
  std::string tune_launches(Executable&, const std::vector<compiler::TunableLaunch>&,
                            const TensorList&, int, std::string*) const override {
    return "";
  }
  bool apply_launch_record(const std::vector<compiler::TunableLaunch>&, const std::string&,
                           std::string*) const override {
    return false;
  }
  std::string tuning_context() const override {
    CudaDeviceInfo i = cuda_device_info(kDevice);
    return fmt::format("{} sm_{}{}\n{}", i.name, i.sm_major, i.sm_minor, cuda_driver_version());
  }
};

const CudaTarget g_cuda_target;
const bool g_registered = [] {
  compiler::register_target(&g_cuda_target);
  return true;
}();

}  // namespace

}  // namespace kiln::cuda
