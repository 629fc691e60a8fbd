#include "lower/cost.h"

#include <algorithm>

namespace kiln::lower {

// Note [Kernel work]
// A kernel's floor on a machine is the longer of its arithmetic at the machine's FLOP rate and
// its traffic at the machine's copy bandwidth (a roofline). The work counted here is the least
// any implementation does, so the floor is a lower bound and a kernel's time over it says how
// far the kernel is from the hardware:
//   - bytes: every tensor the kernel reads once and every tensor it writes once, each element
//     counted once however often the kernel touches it (a broadcast read is its own size, a Norm
//     kernel's second pass is free, a weight is read once). An indexed read counts the elements
//     it gathers, at most its source's size. Of these, the weights' bytes (parameters and
//     constants) are apart: a model's activations at small batches live in the caches, its
//     weights (tens of MB) come from memory on every call, so weight bytes move at the memory's
//     bandwidth and the rest at the caches' (unless they exceed the last-level cache: a
//     pillar encoder's 49 MB of point features come from memory too). A profile measures both;
//     a classifier's GEMV reading 4 MB of weights runs at 1.2x its floor when the weights are
//     hot (a graph of that linear alone, profiled 200 times) and at 5-7x of a cache-bandwidth
//     floor inside a model.
//   - flops: a contraction's multiply-adds count 2 each (matmul, linear, convolution, attention,
//     a loop kernel's small linear); any other op counts 1 per element it computes. Elementwise
//     arithmetic is never what bounds such kernels on the machines we measure: their traffic is.
// The contraction's element type picks the FLOP rate (bf16 matmuls run at another rate).
namespace {

double numel_of(const TensorType& t) {
  double n = 1;
  for (size_t i = 0; i < t.shape.size(); ++i) n *= double(t.shape[i].value());
  return n;
}
double bytes_of(const TensorType& t) { return numel_of(t) * double(dtype_size(t.dtype)); }
int64_t dim(const TensorType& t, int i) { return t.shape[size_t(i < 0 ? t.rank() + i : i)].value(); }

bool is_constant(const Graph& g, ValueId v) {
  ValueKind k = g.value(v).kind;
  return k == ValueKind::Param || k == ValueKind::Const;
}

bool is_low_precision(DType d) { return d == DType::BFloat16 || d == DType::Float16; }

}  // namespace

Work node_work(const Graph& g, const Node& n) {
  Work w;
  std::vector<ValueId> seen;
  for (ValueId v : n.inputs) {
    if (v == kNoValue || std::find(seen.begin(), seen.end(), v) != seen.end()) continue;
    seen.push_back(v);
    w.bytes += bytes_of(g.type(v));
    if (is_constant(g, v)) w.const_bytes += bytes_of(g.type(v));
  }
  double out_numel = 0;
  for (ValueId o : n.outputs) {
    w.bytes += bytes_of(g.type(o));
    out_numel += numel_of(g.type(o));
  }
  auto in = [&](size_t i) -> const TensorType& { return g.type(n.inputs[i]); };
  const TensorType& y = g.type(n.outputs[0]);
  switch (n.op) {
    case OpId::Matmul:  // y[..., m, n] = a[..., m, k] b[..., k, n] (or a vector)
      w.flops = 2.0 * numel_of(y) * double(dim(in(0), -1));
      w.compute = in(0).dtype;
      break;
    case OpId::Linear:
    case OpId::FusedLinear:  // w is [out, in]
      w.flops = 2.0 * numel_of(y) * double(dim(in(1), 1));
      w.compute = in(0).dtype;
      break;
    case OpId::Conv2d:
    case OpId::FusedConv2d: {  // w is [O, C/g, kh, kw]
      const TensorType& wt = in(1);
      w.flops = 2.0 * numel_of(y) * double(dim(wt, 1) * dim(wt, 2) * dim(wt, 3));
      w.compute = in(0).dtype;
      break;
    }
    case OpId::ConvTranspose2d: {  // every input element scatters into O/g * kh * kw outputs
      const TensorType& wt = in(1);
      w.flops = 2.0 * numel_of(in(0)) * double(dim(wt, 1) * dim(wt, 2) * dim(wt, 3));
      w.compute = in(0).dtype;
      break;
    }
    case OpId::ScaledDotProductAttention: {  // q [..., L, E], k [..., S, E], v [..., S, Ev]
      double batch_l = numel_of(in(0)) / double(dim(in(0), -1));
      double s = double(dim(in(1), -2));
      w.flops = 2.0 * batch_l * s * double(dim(in(0), -1) + dim(in(2), -1));
      w.compute = in(0).dtype;
      break;
    }
    default:
      w.flops = out_numel;
      break;
  }
  if (!is_low_precision(w.compute)) w.compute = DType::Float32;
  return w;
}

Work loop_work(const Graph& g, const LoopKernel& k) {
  Work w;
  double full = double(k.numel());
  double kept = 1;
  for (int d = 0; d < k.kept_dims(); ++d) kept *= double(k.sizes[size_t(d)]);
  // The elements an access touches: the product of the walked dims' sizes, at most its value's.
  auto touched = [&](const Access& a) {
    double n = 1;
    for (size_t d = 0; d < a.strides.size() && d < k.sizes.size(); ++d)
      if (a.strides[d] != 0) n *= double(k.sizes[d]);
    if (a.value != kNoValue) n = std::min(n, numel_of(g.type(a.value)));
    return n;
  };
  std::vector<bool> indexed(k.loads.size(), false);
  double taps = 1;
  for (const LoopExpr& e : k.exprs) {
    if (e.kind == LoopExpr::Kind::Indexed && e.load >= 0) {
      indexed[size_t(e.load)] = true;
      if (e.op == OpId::GridSample) taps = 4;
    }
  }
  // Several loads of one value (a value read at two offsets, a Norm kernel's two passes) read
  // its memory once: count each value at its largest access.
  std::vector<std::pair<ValueId, double>> read;
  auto note_read = [&](ValueId v, double bytes) {
    for (auto& [rv, rb] : read)
      if (rv == v) {
        rb = std::max(rb, bytes);
        return;
      }
    read.push_back({v, bytes});
  };
  for (size_t i = 0; i < k.loads.size(); ++i) {
    const Access& a = k.loads[i];
    double n = touched(a);
    if (indexed[i]) {
      n = full * taps;
      if (a.value != kNoValue) n = std::min(n, numel_of(g.type(a.value)));
    }
    note_read(a.value, n * double(dtype_size(a.dtype)));
  }
  if (k.kind == LoopKind::Scatter) {
    double init = 1;
    for (int64_t s : k.scatter.init_sizes) init *= double(s);
    note_read(k.scatter.init.value, init * double(dtype_size(k.scatter.init.dtype)));
    w.bytes += init * double(dtype_size(k.scatter.out.dtype));  // the output, written once
  }
  for (const auto& [v, b] : read) {
    w.bytes += b;
    if (v != kNoValue && is_constant(g, v)) w.const_bytes += b;
  }
  for (const LoopStore& s : k.stores) w.bytes += touched(s.access) * double(dtype_size(s.access.dtype));
  for (const LoopExpr& e : k.exprs) {
    switch (e.kind) {
      case LoopExpr::Kind::Op:
      case LoopExpr::Kind::Indexed:
        w.flops += e.level == Level::Full ? full : kept;
        break;
      case LoopExpr::Kind::Reduce:
      case LoopExpr::Kind::Norm:
        w.flops += full;
        break;
      default:
        break;
    }
  }
  return w;
}

}  // namespace kiln::lower
