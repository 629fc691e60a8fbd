// Direct CUDA kernels (direct_kernels.h).
//
// Note [CUDA direct kernels]
// One kernel per node, every size, stride and attribute a literal, a grid-stride loop over the
// output (one thread per output element unless said otherwise), inputs contiguous (the compiler
// inserts copies for views). The semantics are those of the op's float64 reference kernel in
// src/ops/; what differs is said here.
//   - arithmetic: float64 in double, float32/float16/bfloat16 in float, unless said otherwise;
//     the program is compiled with --fmad=false (direct_program), so float64 results round like
//     the reference's (same operations, same order, no contraction);
//   - bad indices (gather, scatter_add, embedding, index_select): the reference raises an error;
//     the kernel reports the index through the status record (Note [Device status] in
//     runtime/executable.h) and the call fails with the reference's message naming the node.
//     The bad index never reads or writes out of bounds: gather / embedding / index_select write
//     NaN for that element (integers and bool: 0), scatter_add skips it (outputs of a failed call
//     are not results);
//   - pad: constant / reflect / replicate (Kiln's modes; no circular), negative pads crop; pure
//     data movement on the elements' bits, the fill value converted on the host by store_f64;
//   - gather: pure data movement on the elements' bits (every dtype);
//   - scatter_add: deterministic without atomics: each output element scans its index column
//     (index[..., k, ...] for k = 0, 1, ... along dim) and adds the src elements that target it,
//     in index order — the order in which the reference adds them — in double (floating dtypes;
//     one rounding at the end, as the reference) or wrapping int64 (integers). Bitwise equal to
//     the reference; cost O(numel(out) x index.size(dim));
//   - upsample: the reference's coordinate tables (nearest: float32 scale as PyTorch; bilinear:
//     float64 taps) computed on the host by the same formulas and embedded as __device__ arrays;
//     bilinear weights are rounded to float for the 16/32-bit dtypes (as the CPU eager float32
//     path), kept double for float64;
//   - grid_sample: bilinear, zeros padding, align_corners as the reference (coordinates clamped
//     to [-2, size + 1] before floor, NaN coordinates give NaN);
//   - adaptive_avg_pool2d: PyTorch's windows [floor(i*in/out), ceil((i+1)*in/out)), summed in
//     window order and divided by the window size;
//   - GEMM (matmul, linear): 16x16 output tiles, 256 threads, K in steps of 16 through shared
//     memory; each output sums k = 0..K-1 in order, starting from the bias (linear) or zero.
//     Integers accumulate in unsigned 64-bit (int64 wraparound, as the reference) and wrap on
//     store. Batch dims broadcast in any pattern (a stride-0 dim per broadcast operand dim).
//     K = 0 gives the bias or zeros;
//   - conv2d and fused_conv2d with at most 4 input channels (image stems; the target routes
//     them here unless the knob stem_conv=cudnn): Note [CUDA small-channel convolutions], a
//     tiled kernel with the epilogue fused, in float with FMA;
//   - conv2d: one thread per output, bias then (channel, kh, kw) in the reference's order;
//     conv_transpose2d as a gather (the adjoint of conv2d): each output adds the contributions
//     the reference scatters to it, in the reference's order (input channel, then input row and
//     column ascending), so float64 matches the reference bit for bit.
#include "targets/cuda/direct_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>

#include <fmt/format.h>

#include "core/error.h"
#include "core/resample.h"
#include "lower/loop_ir.h"
#include "kernels/cuda/cuda_driver.h"
#include "targets/cuda/emitter.h"

namespace kiln::cuda {

const char* cuda_storage(DType d) {
  switch (d) {
    case DType::Float32: return "float";
    case DType::Float64: return "double";
    case DType::Float16: case DType::BFloat16: return "unsigned short";
    case DType::Int64: return "long long";
    case DType::Int32: return "int";
    case DType::Int8: return "signed char";
    case DType::UInt8: case DType::Bool: return "unsigned char";
  }
  return "?";
}
std::string to_float(DType d, const std::string& v) {
  if (d == DType::BFloat16) return "kn_bf16_f32(" + v + ")";
  if (d == DType::Float16) return "kn_f16_f32(" + v + ")";
  return "(float)(" + v + ")";
}
std::string from_float(DType d, const std::string& v) {
  if (d == DType::BFloat16) return "kn_f32_bf16(" + v + ")";
  if (d == DType::Float16) return "kn_f32_f16(" + v + ")";
  return "(" + std::string(cuda_storage(d)) + ")(" + v + ")";
}

CudaCompileRequest direct_program(const std::string& kernels, const std::string& program_name,
                                  const std::string& arch) {
  CudaCompileRequest req;
  req.source = cuda_prelude() + kernels;
  req.program_name = program_name;
  req.arch = arch;
  req.extra_flags = {"--fmad=false"};
  return req;
}

namespace {

bool has_input(const Node& n, size_t i) { return n.inputs.size() > i && n.inputs[i] != kNoValue; }

// The unsigned type of an element's bits (pure data movement).
const char* raw_storage(DType d) {
  switch (dtype_size(d)) {
    case 1: return "unsigned char";
    case 2: return "unsigned short";
    case 4: return "unsigned int";
    default: return "unsigned long long";
  }
}
// A value of dtype d converted on the host (store_f64: Kiln's conversion), as its bit pattern.
std::string bits_literal(DType d, double v) {
  alignas(8) unsigned char b[8] = {};
  store_f64(b, d, v);
  uint64_t u = 0;
  std::memcpy(&u, b, size_t(dtype_size(d)));
  return fmt::format("({})0x{:x}ULL", raw_storage(d), u);
}
// Bits of a quiet NaN in d (0 for integers and bool): what a bad index reads.
std::string bad_read_bits(DType d) {
  switch (d) {
    case DType::Float32: return "(unsigned int)0x7fc00000u";
    case DType::Float64: return "(unsigned long long)0x7ff8000000000000ULL";
    case DType::Float16: return "(unsigned short)0x7e00u";
    case DType::BFloat16: return "(unsigned short)0x7fc0u";
    default: return fmt::format("({})0", raw_storage(d));
  }
}

// The arithmetic type of a kernel over dtype d: double for float64, float for the other floats,
// unsigned 64-bit (wrapping) for integers.
const char* acc_type(DType d) {
  if (d == DType::Float64) return "double";
  if (is_floating(d)) return "float";
  return "unsigned long long";
}
std::string load_acc(DType d, const std::string& v) {
  if (d == DType::Float64) return "(" + v + ")";
  if (is_floating(d)) return to_float(d, v);
  return "(unsigned long long)(long long)(" + v + ")";
}
std::string store_acc(DType d, const std::string& v) {
  if (d == DType::Float64) return "(" + v + ")";
  if (is_floating(d)) return from_float(d, v);
  if (d == DType::Int64) return "(long long)(" + v + ")";
  return fmt::format("({})(unsigned {})({})", cuda_storage(d),
                     d == DType::Int32 ? "int" : "char", v);
}

std::string grid_loop(int64_t total) {
  return fmt::format(
      "  for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < {}LL; "
      "i += (long long)gridDim.x * blockDim.x) {{\n", total);
}
// Declares c<prefix>0 .. c<prefix>{r-1}: the row-major coordinates of `index` in `dims`.
std::string coords(const Dims& dims, const std::string& index, const std::string& prefix) {
  std::string s;
  if (dims.empty()) return s;
  s += fmt::format("    long long r{} = {};\n", prefix, index);
  for (size_t k = dims.size(); k-- > 0;) {
    s += fmt::format("    const long long {}{} = r{} % {}LL;", prefix, k, prefix, dims[k]);
    if (k > 0) s += fmt::format(" r{} /= {}LL;", prefix, dims[k]);
    s += "\n";
  }
  s += fmt::format("    (void)r{};\n", prefix);
  return s;
}
Dims row_major_strides(const Dims& d) {
  Dims s(d.size(), 1);
  for (size_t k = d.size(); k-- > 1;) s[k - 1] = s[k] * d[k];
  return s;
}
// A double literal that reads back exactly; a float one with `f` suffix.
std::string dlit(double v) { return fmt::format("{:#.17g}", v); }
std::string flit(float v) { return fmt::format("{:#.9g}f", v); }

template <typename T, typename F>
std::string table(const std::string& type, const std::string& name, const std::vector<T>& v, F fmt1) {
  std::string s = fmt::format("__device__ const {} {}[{}] = {{", type, name, std::max<size_t>(v.size(), 1));
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + fmt1(v[i]);
  if (v.empty()) s += "0";
  return s + "};\n";
}

// ---- the reference's upsample tables (core/resample.h, Note [Resample coordinates]) ---------
using resample::LinearTap;
using resample::linear_table;
using resample::nearest_table;

// ---- GEMM -------------------------------------------------------------------------------------
// C[b] = A[b] x B[b] (+ bias) over contiguous operands; the batch coordinate maps to each
// operand's offset through per-dim strides (0 on a broadcast dim).
struct GemmShape {
  int64_t m = 0, n = 0, k = 0;
  Dims batch;               // the output's batch dims
  Dims a_stride, b_stride;  // per batch dim, in elements
  bool b_is_weight = false; // linear: B[k][n] = W[n * K + k]
  bool bias = false;
};

GemmShape gemm_shape(const Graph& g, const Node& n) {
  GemmShape s;
  Dims a = dims_of(g.type(n.inputs[0])), b = dims_of(g.type(n.inputs[1]));
  if (n.op == OpId::Linear) {
    s.k = a.back();
    s.n = b[0];
    Dims out = dims_of(g.type(n.outputs[0]));
    s.m = s.n > 0 ? numel(out) / s.n : 0;
    if (s.k > 0) s.m = numel(a) / s.k;
    s.b_is_weight = true;
    s.bias = has_input(n, 2);
    return s;
  }
  if (a.size() == 1) a = Dims{1, a[0]};
  if (b.size() == 1) b = Dims{b[0], 1};
  size_t r = std::max(a.size(), b.size());
  while (a.size() < r) a.insert(0, 1);
  while (b.size() < r) b.insert(0, 1);
  s.m = a[r - 2];
  s.k = a[r - 1];
  s.n = b[r - 1];
  Dims as = row_major_strides(a), bs = row_major_strides(b);
  for (size_t i = 0; i + 2 < r; ++i) {
    s.batch.push_back(std::max(a[i], b[i]));
    s.a_stride.push_back(a[i] == 1 ? 0 : as[i]);
    s.b_stride.push_back(b[i] == 1 ? 0 : bs[i]);
  }
  return s;
}

// The kernel's pointer parameters: inputs 0 .. n-1 named `inputs`, the last of them only where
// `with_last` (an optional input: a bias, a mask), then output 0 named `output`.
void pointer_params(DirectKernel& k, std::string& params, std::initializer_list<const char*> inputs,
                    bool with_last, const char* output) {
  k.arg_inputs.clear();
  params.clear();
  int i = 0;
  for (const char* name : inputs) {
    if (i + 1 == int(inputs.size()) && !with_last) break;
    k.arg_inputs.push_back(i++);
    params += fmt::format("char* {}_, ", name);
  }
  params += fmt::format("char* {}_", output);
  k.arg_outputs = {0};
}

void plan_gemm_kernel(const Graph& g, const Node& n, const std::string& name, int64_t max_blocks,
                      DirectKernel& k, std::string& params, std::string& body) {
  DType dt = g.type(n.outputs[0]).dtype;
  if (dt == DType::Bool) fail_kind(ErrorKind::NotSupported, "GEMM of bool");
  GemmShape s = gemm_shape(g, n);
  const char* T = cuda_storage(dt);
  const char* A = acc_type(dt);
  int64_t batch = numel(s.batch);
  int64_t tm = (s.m + 15) / 16, tn = (s.n + 15) / 16, tiles = batch * tm * tn;
  k.blocks = std::min(tiles, max_blocks);
  pointer_params(k, params, {"a", "b", "bias"}, s.bias, "y");
  body += fmt::format("  const {0}* a = (const {0}*)a_; const {0}* b = (const {0}*)b_; {0}* y = ({0}*)y_;\n", T);
  if (s.bias) body += fmt::format("  const {0}* bias = (const {0}*)bias_;\n", T);
  body += fmt::format("  __shared__ {0} As[16][17];\n  __shared__ {0} Bs[16][17];\n", A);
  body += "  const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;\n";
  body += fmt::format("  for (long long t = blockIdx.x; t < {}LL; t += gridDim.x) {{\n", tiles);
  body += fmt::format("    const long long bt = t / {0}LL, tm = (t / {1}LL) % {2}LL, tn = t % {1}LL;\n",
                      tm * tn, tn, tm);
  body += "    long long aoff = 0, boff = 0;\n";
  if (!s.batch.empty()) {
    body += coords(s.batch, "bt", "cb");
    for (size_t i = 0; i < s.batch.size(); ++i) {
      if (s.a_stride[i]) body += fmt::format("    aoff += cb{} * {}LL;\n", i, s.a_stride[i]);
      if (s.b_stride[i]) body += fmt::format("    boff += cb{} * {}LL;\n", i, s.b_stride[i]);
    }
  }
  body += "    const long long m = tm * 16 + ty, n = tn * 16 + tx;\n";
  body += fmt::format("    {} acc = 0;\n", A);
  if (s.bias)
    body += fmt::format("    if (n < {}LL) acc = {};\n", s.n, load_acc(dt, "bias[n]"));
  body += fmt::format("    for (long long k0 = 0; k0 < {}LL; k0 += 16) {{\n", s.k);
  body += fmt::format("      {{ const long long c = k0 + tx; As[ty][tx] = (m < {0}LL && c < {1}LL) ? {2} : ({3})0; }}\n",
                      s.m, s.k, load_acc(dt, fmt::format("a[aoff + m * {}LL + c]", s.k)), A);
  std::string bload = s.b_is_weight ? fmt::format("b[nn * {}LL + r]", s.k)
                                    : fmt::format("b[boff + r * {}LL + nn]", s.n);
  body += fmt::format("      {{ const long long r = k0 + ty, nn = tn * 16 + tx; Bs[ty][tx] = (r < {0}LL && nn < {1}LL) ? {2} : ({3})0; }}\n",
                      s.k, s.n, load_acc(dt, bload), A);
  body += "      __syncthreads();\n";
  body += fmt::format("      const int kn = {}LL - k0 < 16 ? (int)({}LL - k0) : 16;\n", s.k, s.k);
  body += "      for (int kk = 0; kk < kn; ++kk) acc += As[ty][kk] * Bs[kk][tx];\n";
  body += "      __syncthreads();\n    }\n";
  body += fmt::format("    if (m < {0}LL && n < {1}LL) y[bt * {2}LL + m * {1}LL + n] = {3};\n  }}\n",
                      s.m, s.n, s.m * s.n, store_acc(dt, "acc"));
  k.describe = fmt::format("{} direct GEMM kernel ({}, batch {} x [{}x{}] x [{}x{}]{}, 16x16 tiles)",
                           op_def(n.op).name, dtype_name(dt), batch, s.m, s.k, s.k, s.n,
                           s.bias ? " + bias" : "");
  (void)name;
}

// ---- convolutions -----------------------------------------------------------------------------
void plan_conv_kernel(const Graph& g, const Node& n, int64_t max_blocks, DirectKernel& k,
                      std::string& params, std::string& body) {
  DType dt = g.type(n.outputs[0]).dtype;
  if (!is_floating(dt)) fail_kind(ErrorKind::NotSupported, "convolution of {}", dtype_name(dt));
  const bool transposed = n.op == OpId::ConvTranspose2d;
  Dims x = dims_of(g.type(n.inputs[0])), w = dims_of(g.type(n.inputs[1]));
  Dims y = dims_of(g.type(n.outputs[0]));
  const char* T = cuda_storage(dt);
  const char* A = acc_type(dt);
  int64_t groups = n.attrs.get_int("groups");
  const Ints& st = n.attrs.get_ints("stride");
  const Ints& pd = n.attrs.get_ints("padding");
  const Ints& dl = n.attrs.get_ints("dilation");
  const bool bias = has_input(n, 2);
  int64_t total = numel(y);
  k.blocks = std::min((total + 255) / 256, max_blocks);
  pointer_params(k, params, {"x", "w", "bias"}, bias, "y");
  body += fmt::format("  const {0}* x = (const {0}*)x_; const {0}* w = (const {0}*)w_; {0}* y = ({0}*)y_;\n", T);
  if (bias) body += fmt::format("  const {0}* bias = (const {0}*)bias_;\n", T);
  body += grid_loop(total);
  body += fmt::format("    const long long ow = i % {0}LL, oh = (i / {0}LL) % {1}LL, o = (i / ({0}LL * {1}LL)) % {2}LL, nb = i / ({0}LL * {1}LL * {2}LL);\n",
                      y[3], y[2], y[1]);
  body += fmt::format("    {} acc = {};\n", A, bias ? load_acc(dt, "bias[o]") : fmt::format("({})0", A));
  auto xs = [&](const char* ic) {
    return load_acc(dt, fmt::format("x[((nb * {}LL + {}) * {}LL + ih) * {}LL + iw]", x[1], ic, x[2], x[3]));
  };
  if (!transposed) {
    int64_t cg = w[1], og = w[0] / groups;
    body += fmt::format("    const long long grp = o / {}LL;\n", og);
    body += fmt::format("    for (long long ci = 0; ci < {}LL; ++ci) {{\n      const long long ic = grp * {}LL + ci;\n", cg, cg);
    body += fmt::format("      for (long long a = 0; a < {}LL; ++a) {{\n        const long long ih = oh * {}LL - {}LL + a * {}LL;\n        if (ih < 0 || ih >= {}LL) continue;\n",
                        w[2], st[0], pd[0], dl[0], x[2]);
    body += fmt::format("        for (long long b = 0; b < {}LL; ++b) {{\n          const long long iw = ow * {}LL - {}LL + b * {}LL;\n          if (iw < 0 || iw >= {}LL) continue;\n",
                        w[3], st[1], pd[1], dl[1], x[3]);
    body += fmt::format("          acc += {} * {};\n        }}\n      }}\n    }}\n", xs("ic"),
                        load_acc(dt, fmt::format("w[((o * {}LL + ci) * {}LL + a) * {}LL + b]", cg, w[2], w[3])));
    k.describe = fmt::format("conv2d direct kernel ({}, groups {})", dtype_name(dt), groups);
  } else {
    // oh = ih * stride - pad + a * dilation: for each kernel tap the one input row that maps
    // here; taps in decreasing order visit input rows (and columns) in increasing order, the
    // order in which the reference's scatter adds them.
    int64_t og = w[1], cg = x[1] / groups;
    body += fmt::format("    const long long grp = o / {}LL, oc = o % {}LL;\n", og, og);
    body += fmt::format("    for (long long ci = 0; ci < {}LL; ++ci) {{\n      const long long ic = grp * {}LL + ci;\n", cg, cg);
    body += fmt::format("      for (long long a = {}LL; a >= 0; --a) {{\n        const long long th = oh + {}LL - a * {}LL;\n"
                        "        if (th < 0 || th % {}LL != 0) continue;\n        const long long ih = th / {}LL;\n        if (ih >= {}LL) continue;\n",
                        w[2] - 1, pd[0], dl[0], st[0], st[0], x[2]);
    body += fmt::format("        for (long long b = {}LL; b >= 0; --b) {{\n          const long long tw = ow + {}LL - b * {}LL;\n"
                        "          if (tw < 0 || tw % {}LL != 0) continue;\n          const long long iw = tw / {}LL;\n          if (iw >= {}LL) continue;\n",
                        w[3] - 1, pd[1], dl[1], st[1], st[1], x[3]);
    body += fmt::format("          acc += {} * {};\n        }}\n      }}\n    }}\n", xs("ic"),
                        load_acc(dt, fmt::format("w[((ic * {}LL + oc) * {}LL + a) * {}LL + b]", og, w[2], w[3])));
    k.describe = fmt::format("conv_transpose2d direct kernel ({}, groups {})", dtype_name(dt), groups);
  }
  body += fmt::format("    y[i] = {};\n  }}\n", store_acc(dt, "acc"));
}


// Note [CUDA small-channel convolutions]
// An image stem (3 input channels: ResNet's 7x7 stride-2 convolution, the zoo's vfe) looked
// like a poor fit for cuDNN's engines, which tile over input channels: vfe's float32 7x7
// convolution takes 15-18 us a call on an H100/H200 (about 4x its FLOP floor), 80% of the
// model's call. Where small_channel_conv() holds, the convolution and its fused epilogue (bias,
// sum_scale * residual, relu) are one direct kernel instead (the knob stem_conv=cudnn keeps
// cuDNN).
//
// The kernel: a block owns a 16x32 tile of output pixels and a chunk of up to 16 output
// channels. It stages the tile's input window (every input channel, zero-filled outside the
// image) and the chunk's weights (as [tap][channel], float4 rows, zero-padded) in shared
// memory, each thread issuing 8 loads before it stores them (so the staging waits for a few
// round trips to memory, not one per element); each of its 256 threads then computes two
// pixels, (row, col) and (row, col + 16), of every channel of the chunk: per tap, two input
// values from shared memory and the chunk's weights as broadcast 16-byte reads, one fused
// multiply-add per pixel and channel (explicit fmaf: the program is compiled without
// contraction). The sum runs over (channel, kh, kw) in the reference's order, in float; bias,
// residual and relu follow in the epilogue's order (Note [Fused epilogues]), and the result is
// rounded to the output dtype once. NaN propagates (relu keeps NaN, as Kiln's relu). Only
// convolutions of at most 2^28 multiply-adds (ResNet-50's stem at batch 1: 118M): beyond that
// cuDNN's tensor-core engines have the throughput, and the call is no longer bound by its
// latency. A cross-build needs no cuDNN for such a convolution.
//
// A first version (one pixel of 16 channels per thread, the weights read one float at a time)
// lost to cuDNN: vfe f32 reduce-overhead went from 29.2-29.6 to 38.1-38.5 us a call on an H100
// (thirtieth session). Its profile put the kernel at 28.8 us against cuDNN's 19.6, bound by its
// staging (each thread loaded its 16 window elements one after another, a load then its store to
// shared memory, about 16 round trips to memory before the first product, and its weights the
// same way) and by its shared-memory reads (16 per tap per thread for 16 multiply-adds). This
// version batches the staging loads and does 6 shared-memory reads per 32 multiply-adds (74
// registers, no spills, for vfe under ptxas). Measured on an H100 (thirty-first session, `kiln
// bench M --device cuda --mode reduce-overhead` with stem_conv=cudnn and =direct alternately,
// two rounds, host p50): vfe f32 29.5, 29.8 -> 27.9, 27.8 us; resnet50 bf16 0.382, 0.384 ->
// 0.381, 0.381 ms; resnet50 f32 1.955, 1.953 -> 1.951, 1.950 ms. `kiln profile vfe`: the
// convolution's launch 16.4 us against cuDNN's 19.9. So it is the default.
constexpr int64_t kSmallConvRows = 16;      // output rows per block (one per thread row)
constexpr int64_t kSmallConvCols = 32;      // output columns per block: 16 threads x 2 pixels
constexpr int64_t kSmallConvChannels = 16;  // output channels per block
constexpr int64_t kSmallConvSharedBytes = 44 * 1024;
constexpr int64_t kSmallConvBatch = 8;      // staging loads a thread issues before it stores them
// Larger convolutions keep cuDNN: the kernel computes on the CUDA cores, where a tensor-core
// engine's throughput wins once there is enough work (ResNet-50's stem at batch 32: 3.8G
// multiply-adds); below this the call is bound by its latency, which is what the kernel cuts.
constexpr int64_t kSmallConvMaxMacs = int64_t(1) << 28;

struct SmallConv {
  Dims x, w, y;
  int64_t sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
  int64_t iht = 0, iwt = 0;  // the staged window's rows and columns
  int64_t oct = 0, ocp = 0;  // channels per block; the same rounded up to 4 (a float4 row)
};
// The geometry, or false where the kernel does not apply (small_channel_conv's rules).
bool small_conv_geometry(const Graph& g, const Node& n, SmallConv* out) {
  if (n.op != OpId::Conv2d && n.op != OpId::FusedConv2d) return false;
  if (n.inputs.size() < 2 || n.outputs.size() != 1) return false;
  const TensorType& xt = g.type(n.inputs[0]);
  const TensorType& wt = g.type(n.inputs[1]);
  const TensorType& yt = g.type(n.outputs[0]);
  const DType dt = xt.dtype;
  if (!library_dtype(dt) || wt.dtype != dt || yt.dtype != dt) return false;
  if (xt.shape.size() != 4 || wt.shape.size() != 4 || yt.shape.size() != 4) return false;
  for (const TensorType* t : {&xt, &wt, &yt})
    for (size_t i = 0; i < 4; ++i)
      if (!t->shape[i].is_concrete()) return false;
  if (n.attrs.get_int("groups") != 1) return false;
  if (n.op == OpId::FusedConv2d) {
    const std::string& act = n.attrs.get_string("activation");
    if (act != "none" && act != "relu") return false;
  }
  SmallConv c;
  c.x = dims_of(xt);
  c.w = dims_of(wt);
  c.y = dims_of(yt);
  if (c.x[1] < 1 || c.x[1] > 4 || c.w[1] != c.x[1] || numel(c.y) == 0) return false;
  const Ints& st = n.attrs.get_ints("stride");
  const Ints& pd = n.attrs.get_ints("padding");
  const Ints& dl = n.attrs.get_ints("dilation");
  c.sh = st[0], c.sw = st[1], c.ph = pd[0], c.pw = pd[1], c.dh = dl[0], c.dw = dl[1];
  c.iht = (kSmallConvRows - 1) * c.sh + (c.w[2] - 1) * c.dh + 1;
  c.iwt = (kSmallConvCols - 1) * c.sw + (c.w[3] - 1) * c.dw + 1;
  c.oct = std::min(c.y[1], kSmallConvChannels);
  c.ocp = (c.oct + 3) / 4 * 4;
  const int64_t taps = c.x[1] * c.w[2] * c.w[3];
  if ((c.x[1] * c.iht * c.iwt + taps * c.ocp) * 4 > kSmallConvSharedBytes) return false;
  if (numel(c.y) * taps > kSmallConvMaxMacs) return false;
  *out = c;
  return true;
}

void plan_small_conv_kernel(const Graph& g, const Node& n, int64_t max_blocks, DirectKernel& k,
                            std::string& params, std::string& body) {
  SmallConv c;
  if (!small_conv_geometry(g, n, &c))
    fail_kind(ErrorKind::Internal, "small-channel convolution kernel planned for '{}', which it does not take", n.name);
  const DType dt = g.type(n.outputs[0]).dtype;
  const char* T = cuda_storage(dt);
  const bool fused = n.op == OpId::FusedConv2d;
  const bool bias = has_input(n, 2), residual = fused && has_input(n, 3);
  const bool relu = fused && n.attrs.get_string("activation") == "relu";
  const double sum_scale = residual ? n.attrs.get_float("sum_scale") : 1.0;
  const int64_t C = c.x[1], H = c.x[2], W = c.x[3], OC = c.y[1], OH = c.y[2], OW = c.y[3];
  const int64_t KH = c.w[2], KW = c.w[3], TR = kSmallConvRows, TC = kSmallConvCols;
  const int64_t OCT = c.oct, OCP = c.ocp, HALF = TC / 2;
  const int64_t taps = C * KH * KW, window = C * c.iht * c.iwt, threads = TR * HALF;
  const int64_t th = (OH + TR - 1) / TR, tw = (OW + TC - 1) / TC, chunks = (OC + OCT - 1) / OCT;
  const int64_t tiles = c.y[0] * th * tw * chunks;
  k.threads = int(threads);
  k.blocks = std::min(tiles, max_blocks);
  // Inputs in the node's order, the absent ones left out.
  k.arg_inputs = {0, 1};
  params = "char* x_, char* w_, ";
  if (bias) k.arg_inputs.push_back(2), params += "char* b_, ";
  if (residual) k.arg_inputs.push_back(3), params += "char* r_, ";
  params += "char* y_";
  k.arg_outputs = {0};
  body += fmt::format("  const {0}* x = (const {0}*)x_; const {0}* w = (const {0}*)w_; {0}* y = ({0}*)y_;\n", T);
  if (bias) body += fmt::format("  const {0}* bias = (const {0}*)b_;\n", T);
  if (residual) body += fmt::format("  const {0}* res = (const {0}*)r_;\n", T);
  body += fmt::format("  __shared__ float xs[{}];\n", window);
  body += fmt::format("  __shared__ float4 ws4[{}];  // [tap][channel of the chunk], rows of {} (zero-padded)\n",
                      taps * OCP / 4, OCP);
  body += "  float* ws = (float*)ws4;\n";
  // Thread (tx, ty) computes pixels (ty, tx) and (ty, tx + HALF) of the tile: stores stay
  // coalesced over tx.
  body += fmt::format("  const int tx = threadIdx.x % {0}, ty = threadIdx.x / {0};\n", HALF);
  body += fmt::format("  for (long long t = blockIdx.x; t < {}LL; t += gridDim.x) {{\n", tiles);
  body += fmt::format("    const long long och = t % {0}LL, r0 = t / {0}LL, tc = r0 % {1}LL, r1 = r0 / {1}LL;\n", chunks, tw);
  body += fmt::format("    const long long tr = r1 % {0}LL, nb = r1 / {0}LL;\n", th);
  body += fmt::format("    const long long oh0 = tr * {}LL, ow0 = tc * {}LL, oc0 = och * {}LL;\n", TR, TC, OCT);
  body += fmt::format("    const long long ih0 = oh0 * {}LL - {}LL, iw0 = ow0 * {}LL - {}LL;\n", c.sh, c.ph, c.sw, c.pw);
  body += "    __syncthreads();  // the previous tile's reads are done\n";
  // Staging: a thread issues its loads in batches of kSmallConvBatch before storing them
  // (through registers), so the tile waits for a few round trips to memory rather than one per
  // element.
  auto stage = [&](int64_t total, const std::string& value, const std::string& dst) {
    std::string t;
    t += fmt::format("    for (int u0 = 0; u0 < {}; u0 += {}) {{\n      float v[{}];\n", (total + threads - 1) / threads,
                     kSmallConvBatch, kSmallConvBatch);
    t += fmt::format("      #pragma unroll\n      for (int u = 0; u < {}; ++u) {{\n", kSmallConvBatch);
    t += fmt::format("        const int i = threadIdx.x + (u0 + u) * {};\n", threads);
    t += value;
    t += "      }\n";
    t += fmt::format("      #pragma unroll\n      for (int u = 0; u < {}; ++u) {{\n", kSmallConvBatch);
    t += fmt::format("        const int i = threadIdx.x + (u0 + u) * {};\n        if (i < {}) {}[i] = v[u];\n      }}\n    }}\n",
                     threads, total, dst);
    return t;
  };
  body += stage(window,
                fmt::format("        const int ci = i / {0}, rr = (i / {1}) % {2}, cc = i % {1};\n", c.iht * c.iwt, c.iwt, c.iht) +
                    "        const long long ih = ih0 + rr, iw = iw0 + cc;\n" +
                    fmt::format("        v[u] = i < {} && ih >= 0 && ih < {}LL && iw >= 0 && iw < {}LL ? {} : 0.f;\n", window, H, W,
                                to_float(dt, fmt::format("x[((nb * {}LL + ci) * {}LL + ih) * {}LL + iw]", C, H, W))),
                "xs");
  body += stage(taps * OCP,
                fmt::format("        const int tap = i / {0}, o = i % {0};\n", OCP) +
                    fmt::format("        v[u] = i < {} && o < {} && oc0 + o < {}LL ? {} : 0.f;\n", taps * OCP, OCT, OC,
                                to_float(dt, fmt::format("w[(oc0 + o) * {}LL + tap]", taps))),
                "ws");
  body += "    __syncthreads();\n";
  body += fmt::format("    float acc0[{0}], acc1[{0}];\n", OCP);
  body += fmt::format("    #pragma unroll\n    for (int o = 0; o < {}; ++o) acc0[o] = acc1[o] = 0.f;\n", OCP);
  body += fmt::format("    for (int ci = 0; ci < {}; ++ci)\n", C);
  body += fmt::format("      for (int a = 0; a < {}; ++a) {{\n", KH);
  body += fmt::format("        const float* xr = xs + (ci * {} + ty * {} + a * {}) * {} + tx * {};\n", c.iht, c.sh, c.dh, c.iwt, c.sw);
  body += fmt::format("        const float4* wr = ws4 + (ci * {} + a) * {};\n", KH, KW * OCP / 4);
  body += fmt::format("        #pragma unroll\n        for (int b = 0; b < {}; ++b) {{\n", KW);
  body += fmt::format("          const float x0 = xr[b * {}], x1 = xr[b * {} + {}];\n", c.dw, c.dw, HALF * c.sw);
  body += fmt::format("          #pragma unroll\n          for (int q = 0; q < {}; ++q) {{\n", OCP / 4);
  body += fmt::format("            const float4 wv = wr[b * {} + q];\n", OCP / 4);
  for (int e = 0; e < 4; ++e)  // channel 4 q + e takes component e of the weights' float4
    body += fmt::format("            acc0[4 * q + {0}] = __fmaf_rn(x0, wv.{1}, acc0[4 * q + {0}]); "
                        "acc1[4 * q + {0}] = __fmaf_rn(x1, wv.{1}, acc1[4 * q + {0}]);\n", e, "xyzw"[e]);
  body += "          }\n        }\n      }\n";
  body += "    const long long oh = oh0 + ty;\n";
  body += fmt::format("    #pragma unroll\n    for (int p = 0; p < 2; ++p) {{\n");
  body += fmt::format("      const long long ow = ow0 + tx + p * {}LL;\n", HALF);
  body += fmt::format("      if (oh >= {}LL || ow >= {}LL) continue;\n", OH, OW);
  body += fmt::format("      #pragma unroll\n      for (int o = 0; o < {}; ++o) {{\n", OCT);
  body += "        const long long oc = oc0 + o;\n";
  body += fmt::format("        if (oc >= {}LL) break;\n", OC);
  body += fmt::format("        const long long yi = ((nb * {}LL + oc) * {}LL + oh) * {}LL + ow;\n", OC, OH, OW);
  body += "        float v = p == 0 ? acc0[o] : acc1[o];\n";
  if (bias) body += fmt::format("        v += {};\n", to_float(dt, "bias[oc]"));
  if (residual) {
    body += sum_scale == 1.0 ? fmt::format("        v += {};\n", to_float(dt, "res[yi]"))
                             : fmt::format("        v += {} * {};\n", flit(float(sum_scale)), to_float(dt, "res[yi]"));
  }
  if (relu) body += "        v = v < 0.f ? 0.f : v;  // NaN stays NaN\n";
  body += fmt::format("        y[yi] = {};\n      }}\n    }}\n  }}\n", from_float(dt, "v"));
  k.describe = fmt::format(
      "{} small-channel direct kernel ({}, {} input channels, {}x{} stride {}x{}{}{}{}; {}x{} pixels x {} "
      "channels per block, window and weights in shared memory)",
      op_def(n.op).name, dtype_name(dt), C, KH, KW, c.sh, c.sw, bias ? ", bias" : "",
      residual ? ", residual" : "", relu ? ", relu" : "", TR, TC, OCT);
}


// ---- attention --------------------------------------------------------------------------------
// Note [CUDA flash attention]
// scaled_dot_product_attention as one kernel that never writes the score matrix: a block of
// 8 warps takes kAttnWarps * rows query rows of one batch item, walks the keys in tiles of
// `bc` (K and V tiles staged in shared memory as float, or double for float64, when they fit),
// and keeps per row the running maximum m, the running sum l and the output accumulator, each
// lane holding the output features d = lane + 32 v. Per key tile and row: every lane scores
// bc / 32 keys (dot product over E, times the scale, then the mask: a bool mask or causal
// pattern gives -inf, a float mask is added), the warp reduces the tile maximum and the sum of
// p = exp(s - m') with xor-shuffle trees (a fixed order: bitwise reproducible), and rescales.
// Semantics are the reference's (Note [SDPA semantics]): a row whose every score is -inf is
// NaN (m stays -inf; while it does, the tile's p are exp(s - 0), i.e. 0, so nothing is
// accumulated early), S = 0 gives 0, NaN scores propagate through p and l. Causal tiles that lie
// wholly right of the block's last row are skipped (they add exactly 0).
constexpr int kAttnWarps = 8;

struct AttnOperand {
  Dims dims;           // the operand's own dims
  Dims batch_stride;   // per output batch dim, 0 where broadcast
  int64_t row_stride = 0;  // between sequence rows (the features are contiguous)
};

// `strides`: the operand's element strides when it is a view read in place (its last stride is
// 1: Target::library_reads_strided), else empty (row-major).
AttnOperand attn_operand(const Dims& d, const Dims& out_batch, size_t tail, const Dims& strides = {}) {
  AttnOperand a;
  a.dims = d;
  Dims s = strides.empty() ? row_major_strides(d) : strides;
  if (!strides.empty() && (strides.size() != d.size() || strides.back() != 1))
    fail_kind(ErrorKind::Internal, "attention operand strides {} for dims {}", to_string(strides),
              to_string(d));
  a.row_stride = d.size() >= 2 ? s[d.size() - 2] : 0;
  size_t rb = d.size() - tail;  // the operand's batch rank
  for (size_t i = 0; i < out_batch.size(); ++i) {
    size_t off = out_batch.size() - i;  // distance from the right end of the batch dims
    if (off > rb) {
      a.batch_stride.push_back(0);
      continue;
    }
    size_t k = rb - off;
    a.batch_stride.push_back(d[k] == 1 ? 0 : s[k]);
  }
  return a;
}

// What both attention kernels read off the node: sizes, operands (views with their strides),
// the mask's strides along L and S (0 where broadcast), causal, the scale, and where the output
// rows go: per batch dim and between rows (heads_last: Note [attention writes heads last]).
struct AttnShape {
  int64_t L = 0, E = 0, S = 0, EV = 0, nbatch = 0;
  Dims batch;  // [..., H] also when the output is stored heads-last
  Dims out_batch_stride;
  int64_t out_row_stride = 0;
  bool heads_last = false;
  AttnOperand qa, ka, va, ma;
  bool has_mask = false, causal = false;
  DType mdt = DType::Bool;
  int64_t msi = 0, msj = 0;
  double scale = 1;
};

AttnShape attn_shape(const Graph& g, const Node& n, const std::vector<Dims>& input_strides) {
  auto strides_of = [&](size_t i) { return i < input_strides.size() ? input_strides[i] : Dims{}; };
  AttnShape a;
  Dims qd = dims_of(g.type(n.inputs[0])), kd = dims_of(g.type(n.inputs[1]));
  Dims vd = dims_of(g.type(n.inputs[2])), od = dims_of(g.type(n.outputs[0]));
  a.L = qd[qd.size() - 2];
  a.E = qd.back();
  a.S = kd[kd.size() - 2];
  a.EV = vd.back();
  // The output's dims and strides as [..., H, L, EV].
  Dims ost = row_major_strides(od);
  const size_t r = od.size();
  a.heads_last = n.attrs.get_bool("heads_last");
  if (a.heads_last) {
    std::swap(od[r - 3], od[r - 2]);
    std::swap(ost[r - 3], ost[r - 2]);
  }
  a.batch = Dims(od.begin(), od.end() - 2);
  a.out_batch_stride = Dims(ost.begin(), ost.end() - 2);
  a.out_row_stride = ost[r - 2];
  a.nbatch = numel(a.batch);
  a.qa = attn_operand(qd, a.batch, 2, strides_of(0));
  a.ka = attn_operand(kd, a.batch, 2, strides_of(1));
  a.va = attn_operand(vd, a.batch, 2, strides_of(2));
  a.has_mask = has_input(n, 3);
  a.causal = n.attrs.get_bool("is_causal");
  if (a.has_mask) {
    const TensorType& mt = g.type(n.inputs[3]);
    a.mdt = mt.dtype;
    Dims md = dims_of(mt);
    while (md.size() < a.batch.size() + 2) md.insert(0, 1);
    a.ma = attn_operand(md, a.batch, 2);
    Dims ms = row_major_strides(md);
    a.msi = md[md.size() - 2] == 1 ? 0 : ms[md.size() - 2];
    a.msj = md.back() == 1 ? 0 : ms.back();
  }
  a.scale = n.attrs.has("scale") ? n.attrs.get_float("scale") : 1.0 / std::sqrt(double(a.E));
  return a;
}

// The element offsets of batch item `bt` in q, k, v, the mask and the output: qoff, koff, voff,
// moff, ooff.
std::string attn_batch_offsets(const AttnShape& a) {
  std::string body = "    long long qoff = 0, koff = 0, voff = 0, moff = 0, ooff = 0;\n";
  if (!a.batch.empty()) {
    body += coords(a.batch, "bt", "cb");
    for (size_t i = 0; i < a.batch.size(); ++i) {
      if (a.qa.batch_stride[i]) body += fmt::format("    qoff += cb{} * {}LL;\n", i, a.qa.batch_stride[i]);
      if (a.ka.batch_stride[i]) body += fmt::format("    koff += cb{} * {}LL;\n", i, a.ka.batch_stride[i]);
      if (a.va.batch_stride[i]) body += fmt::format("    voff += cb{} * {}LL;\n", i, a.va.batch_stride[i]);
      if (a.has_mask && a.ma.batch_stride[i]) body += fmt::format("    moff += cb{} * {}LL;\n", i, a.ma.batch_stride[i]);
      if (a.out_batch_stride[i]) body += fmt::format("    ooff += cb{} * {}LL;\n", i, a.out_batch_stride[i]);
    }
  }
  return body + "    (void)moff;\n";
}

void plan_attention_kernel(const Graph& g, const Node& n, int64_t max_blocks,
                           const std::vector<Dims>& input_strides, DirectKernel& k,
                           std::string& params, std::string& body) {
  DType dt = g.type(n.outputs[0]).dtype;
  if (!is_floating(dt))
    fail_kind(ErrorKind::NotSupported, "attention takes floating dtypes, not {}", dtype_name(dt));
  const bool f64 = dt == DType::Float64;
  const char* T = cuda_storage(dt);
  const char* A = f64 ? "double" : "float";
  auto load = [&](DType d, const std::string& v) { return f64 && d == dt ? "(" + v + ")" : to_float(d, v); };
  const AttnShape a = attn_shape(g, n, input_strides);
  const int64_t L = a.L, E = a.E, S = a.S, EV = a.EV, nbatch = a.nbatch, msi = a.msi, msj = a.msj;
  const AttnOperand &qa = a.qa, &ka = a.ka, &va = a.va;
  const bool has_mask = a.has_mask, causal = a.causal;
  const DType mdt = a.mdt;
  const double scale = a.scale;
  const std::string scale_lit = f64 ? dlit(scale) : flit(float(scale));
  const std::string neg_inf = f64 ? "(-__longlong_as_double(0x7ff0000000000000LL))" : "(-INFINITY)";
  const std::string nan = f64 ? "__longlong_as_double(0x7ff8000000000000LL)" : "__int_as_float(0x7fc00000)";
  // Rows per warp, key tile and staging: the most rows and the largest tile that keep the static
  // shared memory under 44 KiB and the per-lane scores and accumulators small, as long as the
  // grid still has a block per multiprocessor (max_blocks is 16 per multiprocessor): BERT's
  // 12 heads x 128 rows at 4 rows per warp were 48 blocks on the H200's 132 multiprocessors,
  // each walking every key for 32 rows; at 1 row per warp they are 192 blocks of a quarter of
  // the serial work.
  const int64_t nv = std::max<int64_t>((EV + 31) / 32, 1);
  const int64_t min_blocks = std::max<int64_t>(max_blocks / 16, 1);
  auto too_few_blocks = [&](int64_t r) {
    return r > 1 && nbatch * ((L + kAttnWarps * r - 1) / (kAttnWarps * r)) < min_blocks;
  };
  const int64_t esz = f64 ? 8 : 4, E1 = std::max<int64_t>(E, 1), EV1 = std::max<int64_t>(EV, 1);
  int64_t rows = 1, bc = 32;
  bool staged = false;
  auto smem = [&](int64_t r, int64_t c) {
    return esz * (c * (E1 + 1) + c * EV1 + kAttnWarps * r * E1 + kAttnWarps * r * c);
  };
  for (int64_t r : {4, 2, 1}) {
    if (r > 1 && (r * nv > 32 || kAttnWarps * r > 2 * std::max<int64_t>(L, 1) || too_few_blocks(r)))
      continue;
    for (int64_t c : {64, 32})
      if (!staged && smem(r, c) <= 44 * 1024) {
        rows = r;
        bc = c;
        staged = true;
      }
    if (staged) break;
  }
  if (!staged) {  // K and V from global memory: rows as the accumulators allow
    rows = nv <= 8 ? 4 : nv <= 16 ? 2 : 1;
    while (rows > 1 && (kAttnWarps * rows > 2 * std::max<int64_t>(L, 1) || too_few_blocks(rows))) rows /= 2;
  }
  const int64_t kc = bc / 32;            // keys per lane and tile
  const int64_t qt = kAttnWarps * rows;  // query rows per block
  const int64_t qtiles = (L + qt - 1) / qt;
  const int64_t tiles = nbatch * qtiles;
  k.blocks = EV > 0 ? std::min(tiles, max_blocks) : 0;  // 0: an empty output
  k.threads = 256;
  pointer_params(k, params, {"q", "k", "v", "m"}, a.has_mask, "o");
  const char* fma = f64 ? "__fma_rn" : "__fmaf_rn";  // explicit: the program has --fmad=false
  const char* fmx = f64 ? "fmax" : "fmaxf";
  const char* ex = f64 ? "exp" : "expf";
  body += fmt::format("  const {0}* q = (const {0}*)q_; const {0}* kk = (const {0}*)k_; "
                      "const {0}* v = (const {0}*)v_; {0}* o = ({0}*)o_;\n", T);
  if (has_mask) body += fmt::format("  const {0}* mk = (const {0}*)m_;\n", cuda_storage(mdt));
  body += "  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;\n";
  if (staged)
    body += fmt::format("  __shared__ {0} ks[{1}][{2}];\n  __shared__ {0} vs[{1}][{3}];\n"
                        "  __shared__ {0} qs[{4}][{5}];\n",
                        A, bc, E1 + 1, EV1, qt, E1);
  body += fmt::format("  __shared__ {0} ps[{1}][{2}][{3}];\n", A, kAttnWarps, rows, bc);
  body += fmt::format("  for (long long t = blockIdx.x; t < {}LL; t += gridDim.x) {{\n", tiles);
  body += fmt::format("    const long long bt = t / {0}LL, i0 = (t % {0}LL) * {1}LL + warp * {2};\n",
                      qtiles, qt, rows);
  body += attn_batch_offsets(a);
  // i0: this warp's first row; its rows are i0 .. i0 + rows - 1.
  std::string qload = load(dt, fmt::format("q[qoff + (i0 + r) * {}LL + e]", qa.row_stride));
  std::string kload = load(dt, fmt::format("kk[koff + (j0 + jj) * {}LL + e]", ka.row_stride));
  std::string vload = load(dt, fmt::format("v[voff + (j0 + jj) * {}LL + d]", va.row_stride));
  if (staged) {
    body += "    __syncthreads();\n";
    body += fmt::format("    for (int x = lane; x < {} * {}; x += 32) {{\n", rows, E);
    body += fmt::format("      const int r = x / {0}, e = x % {0};\n", E1);
    body += fmt::format("      qs[warp * {} + r][e] = i0 + r < {}LL ? {} : ({})0;\n    }}\n", rows, L, qload, A);
  }
  body += fmt::format("    {0} m[{1}], l[{1}], acc[{1}][{2}];\n", A, rows, nv);
  body += fmt::format("    for (int r = 0; r < {}; ++r) {{ m[r] = {}; l[r] = 0; for (int c = 0; c < {}; ++c) acc[r][c] = 0; }}\n",
                      rows, neg_inf, nv);
  std::string send = causal ? fmt::format("(i0 - warp * {0} + {1}LL < {2}LL ? i0 - warp * {0} + {1}LL : {2}LL)", rows, qt, S)
                            : fmt::format("{}LL", S);
  body += fmt::format("    const long long send = {};\n", send);
  body += fmt::format("    for (long long j0 = 0; j0 < send; j0 += {}) {{\n", bc);
  body += fmt::format("      const int bcn = send - j0 < {0} ? (int)(send - j0) : {0};\n", bc);
  if (staged) {
    body += "      __syncthreads();\n";
    body += fmt::format("      for (int x = threadIdx.x; x < {} * bcn; x += 256) {{\n", E);
    body += fmt::format("        const int jj = x / {0}, e = x % {0};\n", E1);
    body += fmt::format("        ks[jj][e] = {};\n      }}\n", kload);
    body += fmt::format("      for (int x = threadIdx.x; x < {} * bcn; x += 256) {{\n", EV);
    body += fmt::format("        const int jj = x / {0}, d = x % {0};\n", EV1);
    body += fmt::format("        vs[jj][d] = {};\n      }}\n", vload);
    body += "      __syncthreads();\n";
  }
  // Scores of this warp's rows x the lane's keys lane + 32 c: register tiles, one K value per
  // key and one (broadcast) Q value per row per feature.
  body += fmt::format("      {} s[{}][{}];\n", A, rows, kc);
  body += fmt::format("      for (int r = 0; r < {}; ++r) for (int c = 0; c < {}; ++c) s[r][c] = 0;\n", rows, kc);
  body += fmt::format("      for (int e = 0; e < {}; ++e) {{\n", E);
  body += fmt::format("        {} kv[{}];\n", A, kc);
  if (staged) {
    body += fmt::format("        for (int c = 0; c < {}; ++c) kv[c] = ks[lane + 32 * c][e];\n", kc);
  } else {
    body += fmt::format("        for (int c = 0; c < {}; ++c) {{ const int jj = lane + 32 * c; kv[c] = jj < bcn ? {} : ({})0; }}\n",
                        kc, kload, A);
  }
  body += fmt::format("        for (int r = 0; r < {}; ++r) {{\n", rows);
  body += fmt::format("          const {} qv = {};\n", A,
                      staged ? fmt::format("qs[warp * {} + r][e]", rows)
                             : fmt::format("i0 + r < {}LL ? {} : ({})0", L, qload, A));
  body += fmt::format("          for (int c = 0; c < {}; ++c) s[r][c] = {}(qv, kv[c], s[r][c]);\n        }}\n      }}\n", kc, fma);
  // Scale, mask, then the online softmax per row.
  body += fmt::format("      for (int r = 0; r < {}; ++r) {{\n", rows);
  body += "        const long long i = i0 + r;\n";
  body += fmt::format("        {} tmax = {};\n", A, neg_inf);
  body += fmt::format("        for (int c = 0; c < {}; ++c) {{\n", kc);
  body += "          const int jj = lane + 32 * c; const long long j = j0 + jj;\n";
  std::string valid = fmt::format("jj < bcn && i < {}LL", L);
  if (causal) valid += " && j <= i";
  if (has_mask && mdt == DType::Bool)
    valid += fmt::format(" && mk[moff + i * {}LL + j * {}LL] != 0", msi, msj);
  body += fmt::format("          {} x = {};\n", A, neg_inf);
  body += fmt::format("          if ({}) {{\n", valid);
  body += fmt::format("            x = s[r][c] * {};\n", scale_lit);
  if (has_mask && mdt != DType::Bool)
    body += fmt::format("            x += {};\n", load(mdt, fmt::format("mk[moff + i * {}LL + j * {}LL]", msi, msj)));
  body += "          }\n";
  body += fmt::format("          s[r][c] = x;\n          tmax = {}(tmax, x);\n        }}\n", fmx);
  body += fmt::format("        for (int w = 16; w > 0; w >>= 1) tmax = {}(tmax, __shfl_xor_sync(0xffffffffu, tmax, w));\n", fmx);
  body += fmt::format("        const {0} mn = {1}(m[r], tmax);\n", A, fmx);
  body += fmt::format("        const {0} mu = mn == {1} ? ({0})0 : mn;\n", A, neg_inf);
  body += fmt::format("        const {0} alpha = {1}(m[r] - mu);\n", A, ex);
  body += fmt::format("        {} psum = 0;\n", A);
  body += fmt::format("        for (int c = 0; c < {}; ++c) {{ const {} p = {}(s[r][c] - mu); ps[warp][r][lane + 32 * c] = p; psum += p; }}\n",
                      kc, A, ex);
  body += "        for (int w = 16; w > 0; w >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, w);\n";
  body += "        l[r] = l[r] * alpha + psum;\n        m[r] = mn;\n";
  body += fmt::format("        for (int c = 0; c < {}; ++c) acc[r][c] *= alpha;\n      }}\n", nv);
  body += "      __syncwarp();\n";
  // acc += P V: one (broadcast) P value per row and one V value per feature per key.
  body += "      for (int jj = 0; jj < bcn; ++jj) {\n";
  body += fmt::format("        {} pv[{}];\n", A, rows);
  body += fmt::format("        for (int r = 0; r < {}; ++r) pv[r] = ps[warp][r][jj];\n", rows);
  body += fmt::format("        for (int c = 0; c < {}; ++c) {{\n", nv);
  body += "          const int d = lane + 32 * c;\n";
  body += fmt::format("          if (d < {}) {{\n", EV);
  body += fmt::format("            const {} vv = {};\n", A, staged ? "vs[jj][d]" : vload);
  body += fmt::format("            for (int r = 0; r < {}; ++r) acc[r][c] = {}(pv[r], vv, acc[r][c]);\n", rows, fma);
  body += "          }\n        }\n      }\n";
  body += "      __syncwarp();\n";
  body += "    }\n";
  // Store: S = 0 is an empty sum (0); a row with every score -inf is NaN.
  body += fmt::format("    for (int r = 0; r < {}; ++r) {{\n", rows);
  body += "      const long long i = i0 + r;\n";
  body += fmt::format("      if (i >= {}LL) continue;\n", L);
  body += fmt::format("      for (int c = 0; c < {}; ++c) {{\n", nv);
  body += "        const int d = lane + 32 * c;\n";
  body += fmt::format("        if (d >= {}) continue;\n", EV);
  std::string value = S == 0 ? fmt::format("({})0", A)
                             : fmt::format("(m[r] == {} ? {} : acc[r][c] / l[r])", neg_inf, nan);
  body += fmt::format("        o[ooff + i * {}LL + d] = {};\n", a.out_row_stride, store_acc(dt, value));
  body += "      }\n    }\n";
  body += "  }\n";
  k.describe = fmt::format(
      "scaled_dot_product_attention flash kernel ({}, batch {} x [{}x{}] keys {} values {}{}{}; "
      "{} query rows per block, key tiles of {}{}, score matrix never stored{})",
      dtype_name(dt), nbatch, L, E, S, EV, causal ? ", causal" : "",
      has_mask ? fmt::format(", {} mask", dtype_name(mdt)) : "", qt, bc,
      staged ? " in shared memory" : " read from global memory",
      a.heads_last ? ", output written heads-last" : "");
}


// Note [CUDA tensor-core attention]
// In float16 and bfloat16 on sm_80 and later, with head dims E a multiple of 16 and EV a
// multiple of 8 (both at most 128), attention runs on the tensor cores: the same online
// softmax as Note [CUDA flash attention], with both products as mma.sync m16n8k16 (float32
// accumulators). A warp owns 16 query rows; its Q fragments stay in registers for the whole
// walk. The block (2 or 4 warps: 4 unless that gives fewer blocks than multiprocessors) stages
// each tile of 64 keys in shared memory: K as rows (a B fragment of Q K^T is two consecutive
// features of one key) and V transposed (a B fragment of P V is two consecutive keys of one
// feature), both with rows padded by 8 elements so that a fragment load touches 32 banks.
// The score fragment of two 8-key tiles is, element for element, the A fragment of the next
// product, so P never leaves registers: it is rounded to the I/O dtype there (cuDNN's graph
// does the same; cvt.rn.bf16x2 / f16x2, two per instruction), while the row sums l add the
// unrounded float probabilities; the exponentials are ex2.approx-based (__expf, about 2 ulp of
// float32, far below that rounding). Semantics are
// the SIMT kernel's: mask (bool: -inf where false; float: added after the scale) and causal
// pattern per score, a row whose every score is -inf is NaN, NaN scores propagate through p
// and l, rows past L and keys past S read zeros and score -inf. Operands are read through
// their strides (views in place); two consecutive elements are read as one 32-bit word where
// the address allows, else as two. With 16-byte aligned rows a tile passes through registers
// on its way to shared memory, and the next tile's loads are issued before this tile's
// products, so their latency hides behind them (the first tile's loads go out with the Q
// fragments'): BERT-base 0.590 -> 0.570 ms a call on an H100 (twenty-ninth session). The row maximum and sum reduce over the quad of lanes that
// share a row (xor 1, 2), in a fixed order: bitwise reproducible. BERT-base (12 heads x 128
// rows, a [B,1,1,S] float padding mask, which keeps cuDNN away: Note [CUDA attention]) ran
// the SIMT kernel at 18.5 us a layer on an H100, this one at 13.9 us (the call 0.672 -> 0.605
// ms); ViT-B/16's unmasked attention stays with cuDNN (10.2 us against this kernel's 15.3).
// Splitting a row block's keys over 2 or 4 warps (partial softmaxes merged through shared
// memory; twenty-ninth session, not kept) gave BERT-base no gain on an H100: 0.578 ms a call
// with the keys on one warp, 0.579 over two, 0.585 over four (ViT under attention=direct 0.684,
// 0.699, 0.687), though the profiled launch (run alone between events) fell from 13.6 to
// 11.9 us a layer over four: inside the CUDA graph the serial softmax latency was not what
// the call waited on.
constexpr int64_t kMmaKeyTile = 64;

bool attention_on_tensor_cores(DType dt, int64_t E, int64_t EV, int compute_capability) {
  return (dt == DType::BFloat16 || dt == DType::Float16) && compute_capability >= 80 &&
         E >= 16 && E <= 128 && E % 16 == 0 && EV >= 8 && EV <= 128 && EV % 8 == 0;
}

const char* const kMmaHelpers = R"MMA(#ifndef KN_MMA_HELPERS
#define KN_MMA_HELPERS
#ifndef KN_HOST_EMULATION
// d += a b: one m16n8k16 tile, float32 accumulators (PTX ISA, "Matrix Fragments for mma.m16n8k16").
__device__ __forceinline__ void kn_mma_bf16(float* d, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ void kn_mma_f16(float* d, const unsigned* a, unsigned b0, unsigned b1) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// exp through ex2.approx (about 2 ulp of float32): the probabilities it makes are rounded to
// bf16 / f16 before the second product.
__device__ __forceinline__ float kn_fast_exp(float x) { return __expf(x); }
// Two floats rounded to nearest even as one bf16x2 / f16x2 word, lo in the low half.
__device__ __forceinline__ unsigned kn_pack_bf16x2(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
__device__ __forceinline__ unsigned kn_pack_f16x2(float lo, float hi) {
  unsigned r;
  asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
}
#endif
// Elements p[0] and p[1] as one word, p[0] in the low half, from any 2-byte aligned address.
__device__ __forceinline__ unsigned kn_ld2(const unsigned short* p) {
  return (unsigned)p[0] | ((unsigned)p[1] << 16);
}
#endif
)MMA";

void plan_attention_mma(const Graph& g, const Node& n, int64_t max_blocks,
                        const std::vector<Dims>& input_strides, DirectKernel& k,
                        std::string& params, std::string& body, std::string& tables) {
  const DType dt = g.type(n.outputs[0]).dtype;
  const char* cvt = dt == DType::BFloat16 ? "kn_f32_bf16" : "kn_f32_f16";
  const char* mma = dt == DType::BFloat16 ? "kn_mma_bf16" : "kn_mma_f16";
  const char* pack = dt == DType::BFloat16 ? "kn_pack_bf16x2" : "kn_pack_f16x2";
  const AttnShape a = attn_shape(g, n, input_strides);
  const int64_t L = a.L, E = a.E, S = a.S, EV = a.EV, nbatch = a.nbatch, msi = a.msi, msj = a.msj;
  const AttnOperand &qa = a.qa, &ka = a.ka, &va = a.va;
  const bool has_mask = a.has_mask, causal = a.causal;
  const DType mdt = a.mdt;
  const double scale = a.scale;
  // A mask broadcast over the query rows (BERT's [B,1,1,S]) is staged per key tile as float.
  const bool row_mask = has_mask && msi == 0;
  const int64_t min_blocks = std::max<int64_t>(max_blocks / 16, 1);
  int64_t warps = 4;
  if (nbatch * ((L + 63) / 64) < min_blocks) warps = 2;
  const int64_t qt = 16 * warps, qtiles = (L + qt - 1) / qt, tiles = nbatch * qtiles;
  const int64_t bc = kMmaKeyTile, kp = E + 8, vp = bc + 8;  // shared rows, padded
  k.threads = int(32 * warps);
  k.blocks = std::min(tiles, max_blocks);
  pointer_params(k, params, {"q", "k", "v", "m"}, a.has_mask, "o");
  tables += kMmaHelpers;
  body += "  const unsigned short* q = (const unsigned short*)q_; const unsigned short* kk = (const unsigned short*)k_;\n";
  body += "  const unsigned short* v = (const unsigned short*)v_; unsigned short* o = (unsigned short*)o_;\n";
  if (has_mask) body += fmt::format("  const {0}* mk = (const {0}*)m_;\n", cuda_storage(mdt));
  body += "  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c2 = (lane & 3) * 2;\n";
  // uint4 storage: 16-byte aligned rows for the staging stores (kp * 2 bytes is a multiple of 16).
  body += fmt::format("  __shared__ uint4 ks4[{}];\n  __shared__ uint4 vt4[{}];\n", bc * kp / 8, (EV * vp + 7) / 8);
  body += "  unsigned* ksw = (unsigned*)ks4; unsigned* vtw = (unsigned*)vt4;\n";
  body += "  unsigned short* ks = (unsigned short*)ks4; unsigned short* vt = (unsigned short*)vt4;\n";
  if (row_mask) body += fmt::format("  __shared__ float mrow[{}];\n", bc);
  body += fmt::format("  for (long long t = blockIdx.x; t < {}LL; t += gridDim.x) {{\n", tiles);
  body += fmt::format("    const long long bt = t / {0}LL, b0 = (t % {0}LL) * {1}LL, i0 = b0 + warp * 16;\n", qtiles, qt);
  body += attn_batch_offsets(a);
  // Q fragments: rows r[0] = i0 + g and r[1] = i0 + g + 8, features kc * 16 + c2 (+1, +8, +9).
  // With 16-byte aligned rows (`al`: the strides at plan time, the pointers here; uniform) the
  // tile is staged with 16-byte loads, all of a thread's issued before any is stored; else two
  // 2-byte loads per word.
  body += "    const long long r[2] = {i0 + g, i0 + g + 8};\n";
  body += fmt::format("    unsigned qf[{}][4];\n", E / 16);
  auto q_loads = [&](bool vec) {
    std::string b;
    b += fmt::format("      for (int kc = 0; kc < {}; ++kc) for (int h = 0; h < 2; ++h) {{\n", E / 16);
    b += fmt::format("        const unsigned short* row = q + qoff + (r[h] < {}LL ? r[h] : 0LL) * {}LL + kc * 16 + c2;\n", L, qa.row_stride);
    if (vec)
      b += fmt::format("        const unsigned lo = *(const unsigned*)row, hi = *(const unsigned*)(row + 8);\n");
    else
      b += "        const unsigned lo = kn_ld2(row), hi = kn_ld2(row + 8);\n";
    b += fmt::format("        qf[kc][h] = r[h] < {0}LL ? lo : 0u;\n        qf[kc][h + 2] = r[h] < {0}LL ? hi : 0u;\n      }}\n", L);
    return b;
  };
  const int64_t nt_threads = 32 * warps;
  // The 16-byte path holds a tile in registers (kr4, vr4) between its loads and its stores to
  // shared memory, so the next tile's loads are issued before this tile's products and wait
  // behind them (the first tile's beside the Q fragments').
  const int64_t kchunks = bc * E / 8, vchunks = bc * EV / 8;
  const int64_t ku = (kchunks + nt_threads - 1) / nt_threads, vu = (vchunks + nt_threads - 1) / nt_threads;
  auto load_tile = [&](const std::string& j0, const std::string& bcn) {
    // K: rows of E / 8 chunks; V: chunk d8 of key jj at x = d8 * bc + jj (a warp: 32 keys of
    // one chunk), to be scattered transposed into vt.
    std::string b;
    b += fmt::format("        #pragma unroll\n        for (int u = 0; u < {}; ++u) {{\n", ku);
    b += fmt::format("          const int x = threadIdx.x + u * {}, jj = x / {}, e8 = (x % {}) * 8;\n", nt_threads, E / 8, E / 8);
    b += fmt::format("          kr4[u] = x < {} && jj < {} ? *(const uint4*)(kk + koff + ({} + jj) * {}LL + e8) : make_uint4(0u, 0u, 0u, 0u);\n        }}\n",
                     kchunks, bcn, j0, ka.row_stride);
    b += fmt::format("        #pragma unroll\n        for (int u = 0; u < {}; ++u) {{\n", vu);
    b += fmt::format("          const int x = threadIdx.x + u * {}, jj = x % {}, d8 = (x / {}) * 8;\n", nt_threads, bc, bc);
    b += fmt::format("          vr4[u] = x < {} && jj < {} ? *(const uint4*)(v + voff + ({} + jj) * {}LL + d8) : make_uint4(0u, 0u, 0u, 0u);\n        }}\n",
                     vchunks, bcn, j0, va.row_stride);
    return b;
  };
  auto stage = [&](bool vec) {
    std::string b;
    if (vec) {  // the tile's registers (load_tile) to shared memory
      b += fmt::format("        #pragma unroll\n        for (int u = 0; u < {}; ++u) {{\n", ku);
      b += fmt::format("          const int x = threadIdx.x + u * {}, jj = x / {}, e8 = (x % {}) * 8;\n", nt_threads, E / 8, E / 8);
      b += fmt::format("          if (x < {}) *(uint4*)(ks + jj * {} + e8) = kr4[u];\n        }}\n", kchunks, kp);
      b += fmt::format("        #pragma unroll\n        for (int u = 0; u < {}; ++u) {{\n", vu);
      b += fmt::format("          const int x = threadIdx.x + u * {}, jj = x % {}, d8 = (x / {}) * 8;\n", nt_threads, bc, bc);
      b += fmt::format("          if (x >= {}) continue;\n", vchunks);
      b += "          const unsigned w[4] = {vr4[u].x, vr4[u].y, vr4[u].z, vr4[u].w};\n";
      b += "          for (int e = 0; e < 8; ++e) vt[(d8 + e) * " + std::to_string(vp) +
           " + jj] = (unsigned short)(w[e >> 1] >> ((e & 1) * 16));\n        }\n";
    } else {
      b += fmt::format("        for (int x = threadIdx.x; x < {}; x += {}) {{\n", bc * (E / 2), nt_threads);
      b += fmt::format("          const int jj = x / {0}, e = (x % {0}) * 2;\n", E / 2);
      b += fmt::format("          ksw[(jj * {} + e) / 2] = jj < bcn ? kn_ld2(kk + koff + (j0 + jj) * {}LL + e) : 0u;\n        }}\n",
                       kp, ka.row_stride);
      b += fmt::format("        for (int x = threadIdx.x; x < {}; x += {}) {{\n", bc * EV, nt_threads);
      b += fmt::format("          const int jj = x % {0}, d = x / {0};\n", bc);
      b += fmt::format("          vt[d * {} + jj] = jj < bcn ? v[voff + (j0 + jj) * {}LL + d] : (unsigned short)0;\n        }}\n",
                       vp, va.row_stride);
    }
    return b;
  };
  // 16-byte rows: every stride a multiple of 8 elements (the pointers are checked per call).
  bool vec_ok = qa.row_stride % 8 == 0 && ka.row_stride % 8 == 0 && va.row_stride % 8 == 0;
  for (const AttnOperand* a : {&qa, &ka, &va})
    for (int64_t st : a->batch_stride) vec_ok = vec_ok && st % 8 == 0;
  if (vec_ok)
    body += "    const bool al = (((unsigned long long)q | (unsigned long long)kk | (unsigned long long)v) & 15ULL) == 0;\n";
  else
    body += "    const bool al = false;\n";
  body += "    if (al) {\n" + (vec_ok ? q_loads(true) : std::string()) + "    } else {\n" + q_loads(false) + "    }\n";
  body += fmt::format("    float m[2] = {{-INFINITY, -INFINITY}}, l[2] = {{0.f, 0.f}}, acc[{}][4];\n", EV / 8);
  body += fmt::format("    for (int nt = 0; nt < {}; ++nt) acc[nt][0] = acc[nt][1] = acc[nt][2] = acc[nt][3] = 0.f;\n", EV / 8);
  body += fmt::format("    const long long send = {};\n",
                      causal ? fmt::format("(b0 + {0}LL < {1}LL ? b0 + {0}LL : {1}LL)", qt, S) : fmt::format("{}LL", S));
  if (vec_ok) {
    body += fmt::format("    uint4 kr4[{}], vr4[{}];\n", ku, vu);
    body += fmt::format("    if (al) {{\n      const int bcn0 = send < {0} ? (int)send : {0};\n", bc) +
            load_tile("0LL", "bcn0") + "    }\n";
  }
  body += fmt::format("    for (long long j0 = 0; j0 < send; j0 += {}) {{\n", bc);
  body += fmt::format("      const int bcn = send - j0 < {0} ? (int)(send - j0) : {0};\n", bc);
  body += "      __syncthreads();\n";
  body += "      if (al) {\n" + (vec_ok ? stage(true) : std::string()) + "      } else {\n" + stage(false) + "      }\n";
  if (row_mask)  // the mask's values for this tile (one row serves every query row)
    body += fmt::format("      for (int x = threadIdx.x; x < {}; x += {}) mrow[x] = x < bcn ? {} : 0.f;\n", bc, nt_threads,
                        mdt == DType::Bool ? fmt::format("(mk[moff + (j0 + x) * {}LL] != 0 ? 1.f : 0.f)", msj)
                                           : to_float(mdt, fmt::format("mk[moff + (j0 + x) * {}LL]", msj)));
  body += "      __syncthreads();\n";
  if (vec_ok)  // the next tile's loads, in flight during this tile's products
    body += fmt::format("      if (al && j0 + {0} < send) {{\n        const long long j1 = j0 + {0};\n"
                        "        const int bcn1 = send - j1 < {0} ? (int)(send - j1) : {0};\n", bc) +
            load_tile("j1", "bcn1") + "      }\n";
  // S = Q K^T over the tile: score (row r[h], key j0 + nt * 8 + c2 + w) is s[nt][2 h + w].
  body += fmt::format("      float s[{}][4];\n", bc / 8);
  body += fmt::format("      for (int nt = 0; nt < {}; ++nt) {{\n", bc / 8);
  body += "        s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;\n";
  body += fmt::format("        const unsigned* kr = ksw + ((nt * 8 + g) * {} + c2) / 2;\n", kp);
  body += fmt::format("        for (int kc = 0; kc < {}; ++kc) {}(s[nt], qf[kc], kr[kc * 8], kr[kc * 8 + 4]);\n      }}\n", E / 16, mma);
  // Scale, mask, online softmax per row.
  body += "      for (int h = 0; h < 2; ++h) {\n";
  body += "        const long long i = r[h];\n";
  body += "        float tmax = -INFINITY;\n";
  body += fmt::format("        for (int nt = 0; nt < {}; ++nt) for (int w = 0; w < 2; ++w) {{\n", bc / 8);
  body += "          const int jj = nt * 8 + c2 + w; const long long j = j0 + jj;\n          (void)j;\n";
  std::string valid = fmt::format("jj < bcn && i < {}LL", L);
  if (causal) valid += " && j <= i";
  if (has_mask && mdt == DType::Bool)
    valid += row_mask ? " && mrow[jj] != 0.f" : fmt::format(" && mk[moff + i * {}LL + j * {}LL] != 0", msi, msj);
  body += "          float x = -INFINITY;\n";
  body += fmt::format("          if ({}) {{\n", valid);
  body += fmt::format("            x = s[nt][2 * h + w] * {};\n", flit(float(scale)));
  if (has_mask && mdt != DType::Bool)
    body += fmt::format("            x += {};\n", row_mask ? std::string("mrow[jj]")
                                                         : to_float(mdt, fmt::format("mk[moff + i * {}LL + j * {}LL]", msi, msj)));
  body += "          }\n";
  body += "          s[nt][2 * h + w] = x;\n          tmax = fmaxf(tmax, x);\n        }\n";
  body += "        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 1));\n";
  body += "        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 2));\n";
  body += "        const float mn = fmaxf(m[h], tmax);\n";
  body += "        const float mu = mn == -INFINITY ? 0.f : mn;\n";
  body += "        const float alpha = kn_fast_exp(m[h] - mu);\n";
  body += "        float psum = 0.f;\n";
  body += fmt::format("        for (int nt = 0; nt < {}; ++nt) for (int w = 0; w < 2; ++w) {{\n", bc / 8);
  body += "          const float p = kn_fast_exp(s[nt][2 * h + w] - mu);\n          s[nt][2 * h + w] = p;\n          psum += p;\n        }\n";
  body += "        psum += __shfl_xor_sync(0xffffffffu, psum, 1);\n";
  body += "        psum += __shfl_xor_sync(0xffffffffu, psum, 2);\n";
  body += "        l[h] = l[h] * alpha + psum;\n        m[h] = mn;\n";
  body += fmt::format("        for (int nt = 0; nt < {}; ++nt) {{ acc[nt][2 * h] *= alpha; acc[nt][2 * h + 1] *= alpha; }}\n      }}\n", EV / 8);
  // acc += P V: the scores of 8-key tiles 2 kc and 2 kc + 1 are the A fragment of keys 16 kc ...
  body += fmt::format("      for (int kc = 0; kc < {}; ++kc) {{\n", bc / 16);
  body += "        unsigned pa[4];\n";
  body += "        for (int x = 0; x < 4; ++x) {\n";
  body += "          const float* f = s[2 * kc + (x >> 1)] + 2 * (x & 1);\n";
  body += fmt::format("          pa[x] = {0}(f[0], f[1]);\n        }}\n", pack);
  body += fmt::format("        for (int nt = 0; nt < {}; ++nt) {{\n", EV / 8);
  body += fmt::format("          const unsigned* vr = vtw + ((nt * 8 + g) * {} + kc * 16 + c2) / 2;\n", vp);
  body += fmt::format("          {}(acc[nt], pa, vr[0], vr[4]);\n        }}\n      }}\n", mma);
  body += "    }\n";
  // Store: a row with every score -inf is NaN.
  body += "    for (int h = 0; h < 2; ++h) {\n";
  body += fmt::format("      if (r[h] >= {}LL) continue;\n", L);
  body += fmt::format("      unsigned short* orow = o + ooff + r[h] * {}LL + c2;\n", a.out_row_stride);
  body += fmt::format("      for (int nt = 0; nt < {}; ++nt) for (int w = 0; w < 2; ++w)\n", EV / 8);
  body += fmt::format("        orow[nt * 8 + w] = {}(m[h] == -INFINITY ? __int_as_float(0x7fc00000) : acc[nt][2 * h + w] / l[h]);\n    }}\n", cvt);
  body += "  }\n";
  k.describe = fmt::format(
      "scaled_dot_product_attention flash kernel on tensor cores ({}, batch {} x [{}x{}] keys {} "
      "values {}{}{}; mma.sync m16n8k16, {} query rows per block, key tiles of {} in shared memory, "
      "score matrix never stored{})",
      dtype_name(dt), nbatch, L, E, S, EV, causal ? ", causal" : "",
      has_mask ? fmt::format(", {} mask", dtype_name(mdt)) : "", qt, bc,
      a.heads_last ? ", output written heads-last" : "");
}

}  // namespace

bool small_channel_conv(const Graph& g, const Node& n) {
  SmallConv c;
  return small_conv_geometry(g, n, &c);
}

std::string gemm_needs_direct_kernel(const Graph& g, const Node& n) {
  DType dt = g.type(n.inputs[0]).dtype;
  if (!library_dtype(dt)) return fmt::format("cuBLASLt takes float32, float16 or bfloat16, not {}", dtype_name(dt));
  GemmShape s = gemm_shape(g, n);
  if (s.m == 0 || s.n == 0) return "an empty output";
  if (s.k == 0) return "K = 0 (the output is the bias or zeros)";
  // cuBLASLt's strided batch: each operand has the output's whole batch or is one matrix.
  bool a_all = true, a_none = true, b_all = true, b_none = true;
  for (size_t i = 0; i < s.batch.size(); ++i) {
    if (s.batch[i] == 1) continue;
    (s.a_stride[i] ? a_none : a_all) = false;
    (s.b_stride[i] ? b_none : b_all) = false;
  }
  if (!(a_all || a_none) || !(b_all || b_none)) return "batch dims that broadcast partially";
  return "";
}

DirectKernel plan_direct_kernel(const Graph& g, const Node& n, int32_t index, int64_t max_blocks,
                                const std::vector<Dims>& input_strides, int compute_capability) {
  max_blocks = std::max<int64_t>(max_blocks, 1);
  for (ValueId o : n.outputs)
    for (size_t i = 0; i < g.type(o).shape.size(); ++i)
      if (!g.type(o).shape[i].is_concrete()) fail_kind(ErrorKind::NotSupported, "symbolic shapes");
  for (ValueId v : n.inputs)
    if (v != kNoValue)
      for (size_t i = 0; i < g.type(v).shape.size(); ++i)
        if (!g.type(v).shape[i].is_concrete()) fail_kind(ErrorKind::NotSupported, "symbolic shapes");
  DirectKernel k;
  k.name = fmt::format("kn_{}_{}", op_def(n.op).name, index);
  const TensorType& xt = g.type(n.inputs[0]);
  DType dt = g.type(n.outputs[0]).dtype;
  const char* T = cuda_storage(dt);
  auto grid_for = [&](int64_t total) { return std::min<int64_t>((total + 255) / 256, max_blocks); };
  std::string body, params, tables;
  k.threads = 256;
  // The node checks its indices (Note [Device status]): the kernel takes the status record.
  auto checked = [&](const std::string& what, int64_t size) {
    lower::IndexCheck c = lower::index_check(index, n, what, size);
    k.reports = true;
    k.check_prefix = std::move(c.message_prefix);
    k.check_suffix = std::move(c.message_suffix);
  };
  switch (n.op) {
    case OpId::MaxPool2d: case OpId::AvgPool2d: {
      if (!is_floating(dt)) fail_kind(ErrorKind::NotSupported, "pooling takes floating dtypes, not {}", dtype_name(dt));
      // float32 arithmetic for the 16/32-bit dtypes, double for float64
      const bool f64 = dt == DType::Float64;
      const char* A = f64 ? "double" : "float";
      auto load = [&](const std::string& v) { return f64 ? "(" + v + ")" : to_float(dt, v); };
      Dims x = dims_of(xt), y = dims_of(g.type(n.outputs[0]));
      const Ints& kz = n.attrs.get_ints("kernel_size");
      Ints s = n.attrs.get_ints("stride");
      if (s.empty()) s = kz;
      const Ints& p = n.attrs.get_ints("padding");
      bool is_max = n.op == OpId::MaxPool2d;
      Ints dl = is_max ? n.attrs.get_ints("dilation") : Ints{1, 1};
      bool include_pad = !is_max && n.attrs.get_bool("count_include_pad");
      int64_t total = numel(y);
      k.blocks = grid_for(total);
      k.arg_inputs = {0};
      k.arg_outputs = {0};
      params = "char* x_, char* y_";
      body += fmt::format("  const {0}* x = (const {0}*)x_; {0}* y = ({0}*)y_;\n", T);
      body += grid_loop(total);
      body += fmt::format("    const long long ow = i % {0}LL, oh = (i / {0}LL) % {1}LL, plane = i / ({0}LL * {1}LL);\n", y[3], y[2]);
      body += fmt::format("    const {0}* xp = x + plane * {1}LL;\n", T, x[2] * x[3]);
      if (is_max) {
        body += fmt::format("    {} m = -INFINITY;\n", A);
        body += fmt::format("    for (int a = 0; a < {}; ++a) {{\n      const long long ih = oh * {} - {} + a * {};\n      if (ih < 0 || ih >= {}) continue;\n",
                            kz[0], s[0], p[0], dl[0], x[2]);
        body += fmt::format("      for (int b = 0; b < {}; ++b) {{\n        const long long iw = ow * {} - {} + b * {};\n        if (iw < 0 || iw >= {}) continue;\n",
                            kz[1], s[1], p[1], dl[1], x[3]);
        body += fmt::format("        const {} v = {};\n        if (v > m || v != v) m = v;  // NaN propagates\n      }}\n    }}\n",
                            A, load(fmt::format("xp[ih * {}LL + iw]", x[3])));
        body += fmt::format("    y[i] = {};\n", from_float(dt, "m"));
      } else {
        body += fmt::format("    long long h0 = oh * {0} - {1}, w0 = ow * {2} - {3};\n", s[0], p[0], s[1], p[1]);
        body += fmt::format("    long long h1 = min(h0 + {0}LL, {1}LL), w1 = min(w0 + {2}LL, {3}LL);\n",
                            kz[0], x[2] + p[0], kz[1], x[3] + p[1]);
        body += "    const long long padded = (h1 - h0) * (w1 - w0);\n";
        body += fmt::format("    h0 = max(h0, 0LL); w0 = max(w0, 0LL); h1 = min(h1, {}LL); w1 = min(w1, {}LL);\n", x[2], x[3]);
        body += fmt::format("    {} acc = 0;\n    for (long long ih = h0; ih < h1; ++ih)\n      for (long long iw = w0; iw < w1; ++iw) acc += ", A);
        body += load(fmt::format("xp[ih * {}LL + iw]", x[3])) + ";\n";
        body += fmt::format("    y[i] = {};\n", from_float(dt, fmt::format("acc / ({})({})", A, include_pad ? "padded" : "((h1 - h0) * (w1 - w0))")));
      }
      body += "  }\n";
      k.describe = fmt::format("{} direct kernel", op_def(n.op).name);
      break;
    }
    case OpId::AdaptiveAvgPool2d: {
      if (!is_floating(dt)) fail_kind(ErrorKind::NotSupported, "pooling takes floating dtypes, not {}", dtype_name(dt));
      const char* A = acc_type(dt);
      Dims x = dims_of(xt), y = dims_of(g.type(n.outputs[0]));
      int64_t total = numel(y);
      k.blocks = grid_for(total);
      k.arg_inputs = {0};
      k.arg_outputs = {0};
      params = "char* x_, char* y_";
      body += fmt::format("  const {0}* x = (const {0}*)x_; {0}* y = ({0}*)y_;\n", T);
      body += grid_loop(total);
      body += fmt::format("    const long long ow = i % {0}LL, oh = (i / {0}LL) % {1}LL, plane = i / ({0}LL * {1}LL);\n", y[3], y[2]);
      body += fmt::format("    const {0}* xp = x + plane * {1}LL;\n", T, x[2] * x[3]);
      body += fmt::format("    const long long h0 = (oh * {0}LL) / {1}LL, h1 = ((oh + 1) * {0}LL + {1}LL - 1) / {1}LL;\n", x[2], y[2]);
      body += fmt::format("    const long long w0 = (ow * {0}LL) / {1}LL, w1 = ((ow + 1) * {0}LL + {1}LL - 1) / {1}LL;\n", x[3], y[3]);
      body += fmt::format("    {} acc = 0;\n    for (long long ih = h0; ih < h1; ++ih)\n      for (long long iw = w0; iw < w1; ++iw) acc += {};\n",
                          A, load_acc(dt, fmt::format("xp[ih * {}LL + iw]", x[3])));
      body += fmt::format("    y[i] = {};\n  }}\n", store_acc(dt, fmt::format("acc / ({})((h1 - h0) * (w1 - w0))", A)));
      k.describe = fmt::format("adaptive_avg_pool2d direct kernel ({}x{} -> {}x{})", x[2], x[3], y[2], y[3]);
      break;
    }
    case OpId::Concat: case OpId::Split: {
      // Both are copies along one dim: outer x [piece extent] x inner, for each piece.
      bool concat = n.op == OpId::Concat;
      const TensorType& whole = concat ? g.type(n.outputs[0]) : xt;
      int64_t rank = int64_t(whole.rank());
      int64_t dim = n.attrs.get_int("dim");
      if (dim < 0) dim += rank;
      Dims wd = dims_of(whole);
      int64_t inner = 1;
      for (int64_t i = dim + 1; i < rank; ++i) inner *= wd[size_t(i)];
      size_t pieces = concat ? n.inputs.size() : n.outputs.size();
      if (pieces + 1 > size_t(kMaxKernelPointerArgs))
        fail_kind(ErrorKind::NotSupported, "{} pieces (a kernel takes at most {} pointers)", pieces,
                  kMaxKernelPointerArgs);
      int64_t total = numel(wd);
      k.blocks = grid_for(total);
      std::vector<std::string> ps;
      if (concat) {
        for (size_t i = 0; i < pieces; ++i) {
          k.arg_inputs.push_back(int(i));
          ps.push_back(fmt::format("char* in{}", i));
          if (g.type(n.inputs[i]).dtype != dt) fail_kind(ErrorKind::NotSupported, "mixed dtypes");
        }
        k.arg_outputs = {0};
        ps.push_back("char* out_");
      } else {
        k.arg_inputs = {0};
        ps.push_back("char* in_");
        for (size_t i = 0; i < pieces; ++i) {
          k.arg_outputs.push_back(int(i));
          ps.push_back(fmt::format("char* out{}", i));
        }
      }
      params = fmt::format("{}", fmt::join(ps, ", "));
      body += grid_loop(total);
      body += fmt::format("    const long long o = i / ({}LL * {}LL), j = (i / {}LL) % {}LL, r = i % {}LL;\n",
                          wd[size_t(dim)], inner, inner, wd[size_t(dim)], inner);
      // The piece that holds position j along `dim`: a chain of comparisons for a few pieces;
      // beyond kLinearPieces a binary search over a table of the pieces' starts, then a switch
      // (one comparison chain per element would grow with the number of pieces).
      constexpr size_t kLinearPieces = 12;
      const bool search = pieces > kLinearPieces;
      std::vector<int64_t> starts;
      int64_t start = 0;
      for (size_t i = 0; i < pieces; ++i) {
        starts.push_back(start);
        start += g.type(concat ? n.inputs[i] : n.outputs[i]).shape[size_t(dim)].value();
      }
      if (search) {
        tables += table("long long", k.name + "_start", starts, [](int64_t v) { return fmt::format("{}LL", v); });
        body += fmt::format("    int lo = 0, hi = {};\n"
                            "    while (hi - lo > 1) {{ const int mid = (lo + hi) / 2; if (j >= {}_start[mid]) lo = mid; else hi = mid; }}\n"
                            "    switch (lo) {{\n", pieces, k.name);
      }
      for (size_t i = 0; i < pieces; ++i) {
        int64_t ext = (i + 1 < pieces ? starts[i + 1] : wd[size_t(dim)]) - starts[i];
        std::string piece = concat ? fmt::format("in{}", i) : fmt::format("out{}", i);
        std::string piece_idx = fmt::format("(o * {}LL + (j - {}LL)) * {}LL + r", ext, starts[i], inner);
        std::string copy = concat ? fmt::format("(({0}*)out_)[i] = ((const {0}*){1})[{2}];", T, piece, piece_idx)
                                  : fmt::format("(({0}*){1})[{2}] = ((const {0}*)in_)[i];", T, piece, piece_idx);
        if (search) body += fmt::format("      case {}: {{ {} }} break;\n", i, copy);
        else body += fmt::format("    {}if (j < {}LL) {{ {} }}\n", i ? "else " : "", starts[i] + ext, copy);
      }
      if (search) body += "    }\n";
      body += "  }\n";
      k.describe = fmt::format("{} direct kernel ({} pieces)", op_def(n.op).name, pieces);
      break;
    }
    case OpId::Embedding: case OpId::IndexSelect: {
      // Rows of a table selected by int64/int32 indices (embedding: table [V, D], ids any shape).
      bool emb = n.op == OpId::Embedding;
      const TensorType& tt = g.type(n.inputs[0]);
      const TensorType& it = g.type(n.inputs[1]);
      if (it.dtype != DType::Int64 && it.dtype != DType::Int32) fail_kind(ErrorKind::NotSupported, "index dtype");
      Dims td = dims_of(tt);
      int64_t dim = emb ? 0 : n.attrs.get_int("dim");
      if (dim < 0) dim += int64_t(td.size());
      int64_t outer = 1, inner = 1;
      for (int64_t i = 0; i < dim; ++i) outer *= td[size_t(i)];
      for (int64_t i = dim + 1; i < int64_t(td.size()); ++i) inner *= td[size_t(i)];
      int64_t rows = td[size_t(dim)], count = numel(dims_of(it));
      int64_t total = outer * count * inner;
      k.blocks = grid_for(total);
      k.arg_inputs = {0, 1};
      k.arg_outputs = {0};
      params = "char* table_, char* ids_, char* out_";
      const char* I = it.dtype == DType::Int64 ? "long long" : "int";
      body += fmt::format("  const {0}* table = (const {0}*)table_; const {1}* ids = (const {1}*)ids_; {0}* out = ({0}*)out_;\n", T, I);
      body += grid_loop(total);
      body += fmt::format("    const long long o = i / ({0}LL * {1}LL), c = (i / {1}LL) % {0}LL, r = i % {1}LL;\n", count, inner);
      // An out-of-range id is reported and reads nothing (Note [CUDA direct kernels]).
      body += fmt::format("    const long long q = (long long)ids[c]; long long id = q < 0 ? q + {0}LL : q;\n"
                          "    if (id < 0 || id >= {0}LL) {{ kn_report(kn_status, {2}LL, q); out[i] = {1}; continue; }}\n", rows,
                          is_floating(dt) ? from_float(dt, "__int_as_float(0x7fc00000)") : std::string("0"),
                          int64_t(index) + 1);
      checked(emb ? std::string("the embedding table (dim 0 of weight)") : fmt::format("dim {} of x", dim), rows);
      body += fmt::format("    out[i] = table[(o * {}LL + id) * {}LL + r];\n  }}\n", rows, inner);
      k.describe = fmt::format("{} direct kernel ({} rows of {})", op_def(n.op).name, count, rows);
      break;
    }
    case OpId::Gather: {
      // out[p] = x[p with p[dim] replaced by index[p]]: the elements' bits.
      const TensorType& it = g.type(n.inputs[1]);
      if (it.dtype != DType::Int64 && it.dtype != DType::Int32) fail_kind(ErrorKind::NotSupported, "index dtype");
      Dims x = dims_of(xt), id = dims_of(it);
      int64_t r = int64_t(x.size());
      int64_t dim = n.attrs.get_int("dim");
      if (dim < 0) dim += r;
      Dims xs = row_major_strides(x);
      const char* R = raw_storage(dt);
      const char* I = it.dtype == DType::Int64 ? "long long" : "int";
      int64_t total = numel(id);
      k.blocks = grid_for(total);
      k.arg_inputs = {0, 1};
      k.arg_outputs = {0};
      params = "char* x_, char* index_, char* out_";
      body += fmt::format("  const {0}* x = (const {0}*)x_; const {1}* index = (const {1}*)index_; {0}* out = ({0}*)out_;\n", R, I);
      body += grid_loop(total);
      body += coords(id, "i", "c");
      body += fmt::format("    const long long q = (long long)index[i]; const long long v = q < 0 ? q + {0}LL : q;\n"
                          "    if (v < 0 || v >= {0}LL) {{ kn_report(kn_status, {2}LL, q); out[i] = {1}; continue; }}  // reported\n",
                          x[size_t(dim)], bad_read_bits(dt), int64_t(index) + 1);
      checked(fmt::format("dim {} of x", dim), x[size_t(dim)]);
      std::string off = fmt::format("v * {}LL", xs[size_t(dim)]);
      for (int64_t d = 0; d < r; ++d)
        if (d != dim) off += fmt::format(" + c{} * {}LL", d, xs[size_t(d)]);
      body += fmt::format("    out[i] = x[{}];\n  }}\n", off);
      k.describe = fmt::format("gather direct kernel (dim {}, {} of {} along it)", dim, id[size_t(dim)], x[size_t(dim)]);
      break;
    }
    case OpId::ScatterAdd: {
      // Each output element gathers its contributions, in index order (Note [CUDA direct kernels]).
      const TensorType& it = g.type(n.inputs[1]);
      const TensorType& st = g.type(n.inputs[2]);
      if (it.dtype != DType::Int64 && it.dtype != DType::Int32) fail_kind(ErrorKind::NotSupported, "index dtype");
      if (dt == DType::Bool) fail_kind(ErrorKind::NotSupported, "scatter_add of bool");
      Dims x = dims_of(xt), id = dims_of(it), sd = dims_of(st);
      int64_t r = int64_t(x.size());
      int64_t dim = n.attrs.get_int("dim");
      if (dim < 0) dim += r;
      Dims is = row_major_strides(id), ss = row_major_strides(sd);
      const bool fl = is_floating(dt);
      const char* A = fl ? "double" : "unsigned long long";
      auto load = [&](const std::string& v) {
        if (!fl) return "(unsigned long long)(long long)(" + v + ")";
        if (dt == DType::Float16 || dt == DType::BFloat16) return "(double)" + to_float(dt, v);
        return "(double)(" + v + ")";
      };
      std::string store;
      if (fl) store = dt == DType::Float64 ? "acc" : from_float(dt, "(float)acc");
      else store = store_acc(dt, "acc");
      const char* I = it.dtype == DType::Int64 ? "long long" : "int";
      int64_t total = numel(x);
      k.blocks = grid_for(total);
      k.arg_inputs = {0, 1, 2};
      k.arg_outputs = {0};
      params = "char* x_, char* index_, char* src_, char* out_";
      body += fmt::format("  const {0}* x = (const {0}*)x_; const {1}* index = (const {1}*)index_; const {0}* src = (const {0}*)src_; {0}* out = ({0}*)out_;\n", T, I);
      body += grid_loop(total);
      body += coords(x, "i", "c");
      body += fmt::format("    {} acc = {};\n", A, load("x[i]"));
      std::string inside = "true";
      std::string ibase = "0LL", sbase = "0LL";
      for (int64_t d = 0; d < r; ++d) {
        if (d == dim) continue;
        inside += fmt::format(" && c{} < {}LL", d, id[size_t(d)]);
        ibase += fmt::format(" + c{} * {}LL", d, is[size_t(d)]);
        sbase += fmt::format(" + c{} * {}LL", d, ss[size_t(d)]);
      }
      body += fmt::format("    if ({}) {{\n", inside);
      body += fmt::format("      const long long ib = {}, sb = {};\n", ibase, sbase);
      body += fmt::format("      for (long long k = 0; k < {}LL; ++k) {{\n", id[size_t(dim)]);
      body += fmt::format("        const long long q = (long long)index[ib + k * {0}LL]; const long long v = q < 0 ? q + {1}LL : q;\n"
                          "        if (v < 0 || v >= {1}LL) {{ kn_report(kn_status, {4}LL, q); continue; }}\n"
                          "        if (v == c{2}) acc += {3};\n      }}\n    }}\n",
                          is[size_t(dim)], x[size_t(dim)], dim, load(fmt::format("src[sb + k * {}LL]", ss[size_t(dim)])),
                          int64_t(index) + 1);
      checked(fmt::format("dim {} of x", dim), x[size_t(dim)]);
      body += fmt::format("    out[i] = {};\n  }}\n", store);
      k.describe = fmt::format("scatter_add direct kernel (dim {}, {} candidates per output, no atomics)", dim, id[size_t(dim)]);
      break;
    }
    case OpId::Pad: {
      Dims x = dims_of(xt), y = dims_of(g.type(n.outputs[0]));
      const std::string& mode = n.attrs.get_string("mode");
      if (mode != "constant" && mode != "reflect" && mode != "replicate")
        fail_kind(ErrorKind::NotSupported, "pad mode '{}'", mode);
      Shape pads = n.attrs.get_shape("pads");
      int64_t r = int64_t(x.size()), np = int64_t(pads.size()) / 2;
      Dims xs = row_major_strides(x);
      const char* R = raw_storage(dt);
      int64_t total = numel(y);
      k.blocks = grid_for(total);
      k.arg_inputs = {0};
      k.arg_outputs = {0};
      params = "char* x_, char* y_";
      body += fmt::format("  const {0}* x = (const {0}*)x_; {0}* y = ({0}*)y_;\n", R);
      body += grid_loop(total);
      body += coords(y, "i", "c");
      body += "    long long off = 0; bool fill = false;\n";
      for (int64_t d = 0; d < r; ++d) {
        int64_t kk = d - (r - np);
        int64_t before = kk >= 0 ? pads[size_t(kk)].value() : 0;
        body += fmt::format("    {{ long long s = c{} - {}LL;\n", d, before);
        if (before != 0 || y[size_t(d)] != x[size_t(d)]) {
          std::string fix = mode == "constant" ? "fill = true;"
                          : mode == "reflect" ? fmt::format("s = s < 0 ? -s : {}LL - s;", 2 * (x[size_t(d)] - 1))
                                              : fmt::format("s = s < 0 ? 0 : {}LL;", x[size_t(d)] - 1);
          body += fmt::format("      if (s < 0 || s >= {}LL) {{ {} }}\n", x[size_t(d)], fix);
        }
        body += fmt::format("      off += s * {}LL; }}\n", xs[size_t(d)]);
      }
      body += fmt::format("    y[i] = fill ? {} : x[off];\n  }}\n", bits_literal(dt, n.attrs.get_float("value")));
      k.describe = fmt::format("pad direct kernel ({})", mode);
      break;
    }
    case OpId::Upsample: {
      if (!is_floating(dt)) fail_kind(ErrorKind::NotSupported, "upsample of {}", dtype_name(dt));
      Dims x = dims_of(xt), y = dims_of(g.type(n.outputs[0]));
      const std::string& mode = n.attrs.get_string("mode");
      Floats scales = n.attrs.get_floats("scales");
      int64_t total = numel(y);
      k.blocks = grid_for(total);
      k.arg_inputs = {0};
      k.arg_outputs = {0};
      params = "char* x_, char* y_";
      body += fmt::format("  const {0}* x = (const {0}*)x_; {0}* y = ({0}*)y_;\n", T);
      body += grid_loop(total);
      body += fmt::format("    const long long ow = i % {0}LL, oh = (i / {0}LL) % {1}LL, plane = i / ({0}LL * {1}LL);\n", y[3], y[2]);
      body += fmt::format("    const {0}* xp = x + plane * {1}LL;\n", T, x[2] * x[3]);
      auto ifmt = [](int64_t v) { return fmt::format("{}", v); };
      if (mode == "nearest") {
        tables += table("int", k.name + "_h", nearest_table(x[2], y[2], scales, 0), ifmt);
        tables += table("int", k.name + "_w", nearest_table(x[3], y[3], scales, 1), ifmt);
        body += fmt::format("    y[i] = xp[(long long){0}_h[oh] * {1}LL + {0}_w[ow]];\n  }}\n", k.name, x[3]);
      } else if (mode == "bilinear") {
        bool ac = n.attrs.get_bool("align_corners");
        const bool f64 = dt == DType::Float64;
        const char* A = f64 ? "double" : "float";
        for (int a = 0; a < 2; ++a) {
          std::vector<LinearTap> t = linear_table(x[size_t(2 + a)], y[size_t(2 + a)], ac, scales, a);
          std::string nm = k.name + (a == 0 ? "_h" : "_w");
          std::vector<int64_t> i0, i1;
          std::vector<double> w1;
          for (const LinearTap& tp : t) {
            i0.push_back(tp.i0);
            i1.push_back(tp.i1);
            w1.push_back(tp.w1);
          }
          tables += table("int", nm + "0", i0, ifmt) + table("int", nm + "1", i1, ifmt);
          if (f64) tables += table("double", nm + "w", w1, [](double v) { return dlit(v); });
          else tables += table("float", nm + "w", w1, [](double v) { return flit(float(v)); });
        }
        auto at = [&](const char* h, const char* w) {
          std::string e = fmt::format("xp[(long long){}_h{}[oh] * {}LL + {}_w{}[ow]]", k.name, h, x[3], k.name, w);
          return f64 ? "(" + e + ")" : to_float(dt, e);
        };
        body += fmt::format("    const {0} hw = {1}_hw[oh], ww = {1}_ww[ow];\n", A, k.name);
        body += fmt::format("    const {} top = (1 - ww) * {} + ww * {};\n", A, at("0", "0"), at("0", "1"));
        body += fmt::format("    const {} bottom = (1 - ww) * {} + ww * {};\n", A, at("1", "0"), at("1", "1"));
        body += fmt::format("    y[i] = {};\n  }}\n", f64 ? std::string("(1 - hw) * top + hw * bottom")
                                                         : from_float(dt, "(1 - hw) * top + hw * bottom"));
      } else {
        fail_kind(ErrorKind::NotSupported, "upsample mode '{}'", mode);
      }
      k.describe = fmt::format("upsample direct kernel ({}, {}x{} -> {}x{})", mode, x[2], x[3], y[2], y[3]);
      break;
    }
    case OpId::GridSample: {
      if (!is_floating(dt)) fail_kind(ErrorKind::NotSupported, "grid_sample of {}", dtype_name(dt));
      Dims x = dims_of(xt), y = dims_of(g.type(n.outputs[0]));
      bool ac = n.attrs.get_bool("align_corners");
      const bool f64 = dt == DType::Float64;
      const char* A = f64 ? "double" : "float";
      auto load = [&](const std::string& v) { return f64 ? "(" + v + ")" : to_float(dt, v); };
      int64_t H = x[2], W = x[3];
      int64_t total = numel(y);
      k.blocks = grid_for(total);
      k.arg_inputs = {0, 1};
      k.arg_outputs = {0};
      params = "char* x_, char* grid_, char* y_";
      body += fmt::format("  const {0}* x = (const {0}*)x_; const {0}* grid = (const {0}*)grid_; {0}* y = ({0}*)y_;\n", T);
      body += grid_loop(total);
      body += fmt::format("    const long long w = i % {0}LL, h = (i / {0}LL) % {1}LL, c = (i / ({0}LL * {1}LL)) % {2}LL, nb = i / ({0}LL * {1}LL * {2}LL);\n",
                          y[3], y[2], y[1]);
      body += fmt::format("    const long long gp = ((nb * {}LL + h) * {}LL + w) * 2;\n", y[2], y[3]);
      auto unnorm = [&](const std::string& gv, int64_t size) {
        return ac ? fmt::format("({} + 1) / 2 * ({})({}LL)", gv, A, size - 1)
                  : fmt::format("(({} + 1) * ({})({}LL) - 1) / 2", gv, A, size);
      };
      body += fmt::format("    const {0} gx = {1}, gy = {2};\n", A, load("grid[gp]"), load("grid[gp + 1]"));
      body += fmt::format("    {0} ix = {1}, iy = {2};\n", A, unnorm("gx", W), unnorm("gy", H));
      body += "    const bool is_nan = ix != ix || iy != iy;\n";
      body += fmt::format("    ix = ix < ({0})-2 ? ({0})-2 : ix; ix = ix > ({0}){1}LL ? ({0}){1}LL : ix;\n", A, W + 1);
      body += fmt::format("    iy = iy < ({0})-2 ? ({0})-2 : iy; iy = iy > ({0}){1}LL ? ({0}){1}LL : iy;\n", A, H + 1);
      body += fmt::format("    const long long x0 = is_nan ? 0 : (long long){0}(ix), y0 = is_nan ? 0 : (long long){0}(iy);\n",
                          f64 ? "floor" : "floorf");
      body += fmt::format("    const {0} wx1 = ix - ({0})x0, wy1 = iy - ({0})y0;\n", A);
      body += fmt::format("    const {0}* xp = x + (nb * {1}LL + c) * {2}LL;\n", T, x[1], H * W);
      body += fmt::format("    {} acc = 0;\n", A);
      const char* taps[4][3] = {{"y0", "x0", "(1 - wy1) * (1 - wx1)"},
                                {"y0", "x0 + 1", "(1 - wy1) * wx1"},
                                {"y0 + 1", "x0", "wy1 * (1 - wx1)"},
                                {"y0 + 1", "x0 + 1", "wy1 * wx1"}};
      for (auto& t : taps)
        body += fmt::format("    {{ const long long ty = {0}, tx = {1}; if (ty >= 0 && ty < {3}LL && tx >= 0 && tx < {4}LL) acc += ({2}) * {5}; }}\n",
                            t[0], t[1], t[2], H, W, load(fmt::format("xp[ty * {}LL + tx]", W)));
      body += fmt::format("    if (is_nan) acc = {};\n", f64 ? "__longlong_as_double(0x7ff8000000000000LL)" : "__int_as_float(0x7fc00000)");
      body += fmt::format("    y[i] = {};\n  }}\n", f64 ? std::string("acc") : from_float(dt, "acc"));
      k.describe = fmt::format("grid_sample direct kernel (bilinear, zeros, align_corners {})", ac);
      break;
    }
    case OpId::Argmax: case OpId::Argmin: {
      // One thread per output point scans its candidates in increasing index order: the first
      // of equal values wins, NaN beats everything and nothing beats NaN (the reference's rule).
      Dims x = dims_of(xt);
      int64_t outer = 1, extent = numel(x), inner = 1;
      if (n.attrs.has("dim") && !x.empty()) {
        int64_t dim = n.attrs.get_int("dim");
        if (dim < 0) dim += int64_t(x.size());
        extent = x[size_t(dim)];
        outer = 1;
        for (int64_t i = 0; i < dim; ++i) outer *= x[size_t(i)];
        for (size_t i = size_t(dim) + 1; i < x.size(); ++i) inner *= x[i];
      }
      if (extent == 0) fail_kind(ErrorKind::InvalidArgument, "{} over an empty set", op_def(n.op).name);
      const bool is_max = n.op == OpId::Argmax;
      DType xd = xt.dtype;
      const char* C = xd == DType::Float64 ? "double" : is_floating(xd) ? "float" : "long long";
      auto load = [&](const char* kk) {
        std::string e = fmt::format("x[base + {} * {}LL]", kk, inner);
        return xd == DType::Float16 || xd == DType::BFloat16 ? to_float(xd, e)
                                                             : fmt::format("({}){}", C, e);
      };
      int64_t total = outer * inner;
      k.blocks = grid_for(total);
      k.arg_inputs = {0};
      k.arg_outputs = {0};
      params = "char* x_, char* y_";
      body += fmt::format("  const {0}* x = (const {0}*)x_; long long* y = (long long*)y_;\n", cuda_storage(xd));
      body += grid_loop(total);
      body += fmt::format("    const long long base = (i / {0}LL) * {1}LL * {0}LL + i % {0}LL;\n", inner, extent);
      body += fmt::format("    {0} best = {1}; long long at = 0;\n", C, load("0"));
      body += fmt::format("    for (long long k = 1; k < {}LL; ++k) {{\n      const {} v = {};\n", extent, C, load("k"));
      body += fmt::format("      if (!(best != best) && ((v != v) || v {} best)) {{ best = v; at = k; }}\n    }}\n", is_max ? ">" : "<");
      body += "    y[i] = at;\n  }\n";
      k.describe = fmt::format("{} direct kernel ({} candidates per output)", op_def(n.op).name, extent);
      break;
    }
    case OpId::Matmul: case OpId::Linear:
      plan_gemm_kernel(g, n, k.name, max_blocks, k, params, body);
      break;
    case OpId::Conv2d: case OpId::ConvTranspose2d: case OpId::FusedConv2d:
      if (small_channel_conv(g, n)) plan_small_conv_kernel(g, n, max_blocks, k, params, body);
      else if (n.op == OpId::FusedConv2d)
        fail_kind(ErrorKind::NotSupported, "fused_conv2d has a direct kernel only as a small-channel convolution");
      else plan_conv_kernel(g, n, max_blocks, k, params, body);
      break;
    case OpId::ScaledDotProductAttention: {
      const int64_t E = g.type(n.inputs[0]).shape.back().value();
      const int64_t EV = g.type(n.inputs[2]).shape.back().value();
      const TensorType& kt = g.type(n.inputs[1]);
      const int64_t S = kt.shape.size() >= 2 ? kt.shape[kt.shape.size() - 2].value() : 0;
      if (S > 0 && attention_on_tensor_cores(dt, E, EV, compute_capability))
        plan_attention_mma(g, n, max_blocks, input_strides, k, params, body, tables);
      else
        plan_attention_kernel(g, n, max_blocks, input_strides, k, params, body);
      break;
    }
    default:
      fail_kind(ErrorKind::NotSupported, "op '{}' has no CUDA direct kernel", op_def(n.op).name);
  }
  if (k.reports) {
    params += ", char* kn_status_";
    body = "  long long* kn_status = (long long*)kn_status_;  // the status record\n" + body;
  }
  k.source = fmt::format("// kiln-kernel: {}\n// {} '{}'\n{}extern \"C\" __global__ void __launch_bounds__({}) {}({}) {{\n{}{}}}\n\n",
                         k.name, op_def(n.op).name, n.name, tables, k.threads, k.name, params,
                         kGridWait, body);
  return k;
}

bool library_dtype(DType d) {
  return d == DType::Float32 || d == DType::Float16 || d == DType::BFloat16;
}
Dims dims_of(const TensorType& t) {
  Dims d;
  for (size_t i = 0; i < t.shape.size(); ++i) d.push_back(t.shape[i].value());
  return d;
}

}  // namespace kiln::cuda
