// Note [Autocast]
// A float32 model run in bfloat16 or float16, as torch.autocast does on CUDA: the ops whose cost
// is multiply-adds (matmul, linear, convolutions, attention) read and write the low dtype, and
// the pointwise ops between them follow (they are memory-bound: half the bytes is the gain).
// Ops whose result depends on range or on many roundings adding up run in float32, modelled on
// torch's autocast float32 list (torch/csrc/autograd/autocast_mode.cpp, CUDA):
//   - softmax, log_softmax (torch: fp32 list): exp of differences and a row sum; a low-precision
//     row sum of up to thousands of terms loses the small ones;
//   - layer_norm, group_norm (fp32 list) and batch_norm (torch runs it in the input dtype with
//     float32 statistics through cuDNN; here it is float32 whole, after fold-conv-bn has folded
//     the inference ones into their convolution): mean and variance are reductions, and
//     (x - mean) * rsqrt(var + eps) cancels;
//   - sum, mean, var, prod (torch: sum, prod, cumsum, norm...; mean and var run in the input dtype
//     in torch with float32 accumulation): a float16 sum of many values overflows at 65504, and a
//     rounded mean feeds a subtraction that cancels; scatter_add accumulates like a sum;
//   - exp, log, pow, reciprocal, rsqrt (fp32 list): their results leave float16's range
//     (exp(11.1) > 65504, 1/x for |x| < 1.5e-5, rsqrt of a small variance) and they usually feed a
//     reduction or a normalization. Their consumers then see float32 values: a sum of exp stays
//     in float32, and a division of two float32 values stays float32 (follow).
// max, min, argmax, argmin, max_pool2d and the views only select or move values: exact in any
// dtype, so they follow their input. avg_pool2d and adaptive_avg_pool2d follow too (torch runs
// them in the input dtype); the kernels accumulate in float and round once.
//
// Differences from torch, on purpose:
//   - torch promotes a binary op with one float32 input to float32 (a residual add after a
//     float32 layer_norm then runs in float32, and so does everything after it up to the next
//     linear); here a pointwise op with any low non-constant input runs low, so activations stay
//     low between the compute-heavy ops (the issue's "pointwise ops between them in the low
//     dtype"), and a float32 island's result is cast to low once, where a low node reads it;
//   - torch leaves weights in float32 and casts them per call; here they are converted once at
//     compile time (a folded weight is the same rounding of the same value);
//   - float32 graph inputs are cast lazily: a graph input read only by float32 nodes is never
//     rounded.
#include "passes/autocast.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <iterator>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "passes/algebraic_simplify.h"
#include "passes/graph_rewrite.h"

namespace kiln {

namespace {

using Row = std::pair<OpId, AutocastPolicy>;
using PolicyTable = std::array<AutocastPolicy, size_t(kNumOps)>;

template <size_t N>
consteval PolicyTable make_policy_table(const Row (&rows)[N]) {
  static_assert(N == size_t(kNumOps), "the autocast policy needs one row per op of ops.def");
  PolicyTable t{};
  std::array<bool, size_t(kNumOps)> seen{};
  for (const Row& r : rows) {
    if (seen[size_t(r.first)]) throw "an op has two rows in the autocast policy";
    seen[size_t(r.first)] = true;
    t[size_t(r.first)] = r.second;
  }
  return t;
}

constexpr AutocastPolicy L = AutocastPolicy::Low, F = AutocastPolicy::Float32,
                         W = AutocastPolicy::Follow, K = AutocastPolicy::AsIs;

// The policy: one row per op (Note [Autocast] says why).
constexpr PolicyTable kPolicy = make_policy_table({
    // compute-heavy: low
    {OpId::Matmul, L}, {OpId::Linear, L}, {OpId::Conv2d, L}, {OpId::ConvTranspose2d, L},
    {OpId::ScaledDotProductAttention, L}, {OpId::FusedConv2d, L}, {OpId::FusedLinear, L},
    // range and accumulated rounding: float32
    {OpId::Softmax, F}, {OpId::LogSoftmax, F}, {OpId::LayerNorm, F}, {OpId::GroupNorm, F},
    {OpId::BatchNorm, F}, {OpId::Sum, F}, {OpId::Mean, F}, {OpId::Var, F}, {OpId::Prod, F},
    {OpId::ScatterAdd, F}, {OpId::Exp, F}, {OpId::Log, F}, {OpId::Pow, F},
    {OpId::Reciprocal, F}, {OpId::Rsqrt, F},
    // explicit casts are the model's own choice
    {OpId::Cast, K},
    // the rest follow their inputs
    {OpId::Neg, W}, {OpId::Abs, W}, {OpId::Sqrt, W}, {OpId::Sigmoid, W}, {OpId::Tanh, W},
    {OpId::Relu, W}, {OpId::Gelu, W}, {OpId::Silu, W}, {OpId::Erf, W}, {OpId::Sin, W},
    {OpId::Cos, W}, {OpId::Floor, W}, {OpId::Ceil, W}, {OpId::Round, W}, {OpId::Sign, W},
    {OpId::Not, W}, {OpId::Clamp, W}, {OpId::Add, W}, {OpId::Sub, W}, {OpId::Mul, W},
    {OpId::Div, W}, {OpId::Maximum, W}, {OpId::Minimum, W}, {OpId::Eq, W}, {OpId::Ne, W},
    {OpId::Lt, W}, {OpId::Le, W}, {OpId::Gt, W}, {OpId::Ge, W}, {OpId::And, W}, {OpId::Or, W},
    {OpId::Where, W}, {OpId::Max, W}, {OpId::Min, W}, {OpId::Argmax, W}, {OpId::Argmin, W},
    {OpId::MaxPool2d, W}, {OpId::AvgPool2d, W}, {OpId::AdaptiveAvgPool2d, W},
    {OpId::Reshape, W}, {OpId::Permute, W}, {OpId::Transpose, W}, {OpId::Expand, W},
    {OpId::Squeeze, W}, {OpId::Unsqueeze, W}, {OpId::Flatten, W}, {OpId::Slice, W},
    {OpId::Concat, W}, {OpId::Split, W}, {OpId::Pad, W}, {OpId::Copy, W}, {OpId::Gather, W},
    {OpId::IndexSelect, W}, {OpId::Embedding, W}, {OpId::Upsample, W}, {OpId::GridSample, W},
});

bool is_constant(const Value& v) { return v.kind == ValueKind::Param || v.kind == ValueKind::Const; }

// A float32 weight converted to a low dtype, and what the conversion lost beyond rounding:
// whether a nonzero finite value became 0 (underflow) or an infinity (overflow), and the first
// value that overflowed (the error names it).
struct Conversion {
  Tensor data;
  bool overflow = false, underflow = false;
  double value = 0;
};

// Converts with the scalar conversions every cast uses (Half, BFloat16: round to nearest even);
// weights are large, so no per-element dispatch. Done on the host, in chunks over the OpenMP
// threads (ResNet-50's 25M weights took 0.09 s on one core); each chunk converts, then checks
// its results in branch-free loops, and only a chunk that overflowed looks for its first
// overflow. Overflow and underflow are found independently: a weight whose small values
// underflow is still refused when a later value overflows.
template <typename Low>
void convert_into(const float* x, uint16_t* out, int64_t n, uint16_t inf_bits, Conversion& c) {
  constexpr int64_t kChunk = int64_t(1) << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<int64_t> first_over(size_t(chunks), n);
  std::vector<uint8_t> under(size_t(chunks), 0);
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (int64_t ch = 0; ch < chunks; ++ch) {
    const int64_t lo = ch * kChunk, hi = std::min(n, lo + kChunk);
    for (int64_t i = lo; i < hi; ++i) out[i] = Low(x[i]).bits;
    // A finite float32 that became an infinity, or a nonzero one that became a (signed) zero.
    auto over = [&](int64_t i) { return (out[i] & 0x7FFF) == inf_bits && std::isfinite(x[i]); };
    bool any_over = false, any_under = false;
    for (int64_t i = lo; i < hi; ++i) {
      any_over |= over(i);
      any_under |= (out[i] & 0x7FFF) == 0 && x[i] != 0;
    }
    under[size_t(ch)] = any_under;
    if (any_over)
      for (int64_t i = lo; i < hi; ++i)
        if (over(i)) {
          first_over[size_t(ch)] = i;
          break;
        }
  }
  for (uint8_t u : under) c.underflow = c.underflow || u;
  for (int64_t i : first_over)
    if (i != n) {
      c.overflow = true;
      c.value = x[i];
      break;
    }
}

Conversion convert(const Tensor& data, DType low) {
  Tensor host = (data.device().is_cpu() ? data : data.to(Device::cpu())).contiguous();
  Conversion c;
  c.data = Tensor::empty(host.sizes(), low);
  auto* out = static_cast<uint16_t*>(c.data.raw_data());
  if (low == DType::Float16)
    convert_into<Half>(host.data<float>(), out, host.numel(), 0x7C00, c);
  else
    convert_into<BFloat16>(host.data<float>(), out, host.numel(), 0x7F80, c);
  if (!data.device().is_cpu()) c.data = c.data.to(data.device());
  return c;
}

const char* suffix_of(DType d) { return info(d).short_name; }

class Autocaster {
 public:
  Autocaster(const Graph& g, DType low) : g_(g), low_(low), b_(g) {
    versions_.assign(g.values.size(), {kNoValue, kNoValue});
    is_output_.assign(g.values.size(), false);
    for (ValueId v : g.outputs) is_output_[size_t(v)] = true;
  }

  Graph run(AutocastResult& result) {
    for (const Node& n : g_.nodes) rewrite(n, result);
    // Outputs that were float32 are float32 again, under their own names.
    for (ValueId v : g_.outputs) {
      if (!was_f32(v) || b_.dst().type(b_.map(v)).dtype == DType::Float32) continue;
      ValueId back = as(v, DType::Float32, g_.value(v).name);
      b_.set_map(v, back);
    }
    result.casts = casts_;
    result.weights_converted = weights_;
    return b_.finish();
  }

 private:
  const Node* old_producer(ValueId v) const {
    const Value& val = g_.value(v);
    return val.kind == ValueKind::NodeOutput ? &g_.nodes[size_t(val.producer)] : nullptr;
  }
  bool was_f32(ValueId v) const { return v != kNoValue && g_.type(v).dtype == DType::Float32; }
  int slot(DType d) const { return d == DType::Float32 ? 0 : 1; }

  // Old value `v` (float32 in the old graph) as a new value of dtype `want` (float32 or low).
  // `exact_name`: the name of the value made here, when one is made (graph outputs).
  ValueId as(ValueId v, DType want, const std::string& exact_name = "",
             const Node* reader = nullptr) {
    ValueId now = b_.map(v);
    if (!was_f32(v)) return now;
    DType have = b_.dst().type(now).dtype;
    if (have == want) return now;
    ValueId& cached = versions_[size_t(v)][size_t(slot(want))];
    if (cached != kNoValue) return cached;
    // The value is an exact cast from `want`: read the cast's input (no low -> f32 -> low).
    if (const Node* p = b_.producer_of(now); p && p->op == OpId::Cast &&
                                             b_.dst().type(p->inputs[0]).dtype == want &&
                                             cast_is_exact(want, have))
      return cached = p->inputs[0];
    const Value& nv = b_.dst().value(now);
    std::string hint = nv.name + "." + suffix_of(want);
    if (has_data(nv)) {
      KILN_ASSERT(want == low_);  // a float32 weight, read low
      const Conversion& loss = conversion(v);
      if (loss.overflow && reader)
        fail_kind(ErrorKind::NotSupported,
                  "autocast to {}: {} '{}' reads '%{}', whose value {} overflows {} (max {}); "
                  "compile this model with --dtype float32 or bfloat16",
                  dtype_name(want), op_def(reader->op).name, reader->name, nv.name, loss.value,
                  dtype_name(want), want == DType::Float16 ? "65504" : "3.39e38");
      ++weights_;
      return cached = nv.kind == ValueKind::Param ? b_.add_param(loss.data, exact_name, hint)
                                                  : b_.add_const(loss.data, exact_name, hint);
    }
    ++casts_;
    // Provenance: the node the cast feeds, else (a cast back for a graph output) the producer.
    std::string where = reader ? reader->name
                        : old_producer(v) ? old_producer(v)->name
                                          : std::string();
    return cached = b_.add_node1(OpId::Cast, {now}, {{"dtype", want}}, where, exact_name, hint);
  }

  // Old param or const `v` (float32, with data) in the low dtype, converted once.
  const Conversion& conversion(ValueId v) {
    auto it = conversions_.find(v);
    if (it == conversions_.end()) it = conversions_.emplace(v, convert(g_.value(v).data, low_)).first;
    return it->second;
  }

  // Whether a follow node with these inputs computes in float32 (Note [Autocast]).
  bool follow_in_f32(const Node& n) {
    bool dynamic = false, dynamic_low = false;
    for (ValueId v : n.inputs) {
      if (!was_f32(v)) continue;
      const Value& old = g_.value(v);
      if (is_constant(old)) {
        if (has_data(old) && (conversion(v).overflow || conversion(v).underflow)) return true;
        continue;
      }
      dynamic = true;
      dynamic_low = dynamic_low || b_.dst().type(b_.map(v)).dtype == low_;
    }
    return dynamic && !dynamic_low;
  }

  // Adds `n` over `inputs`. Its outputs keep their names, except float32 graph outputs that
  // are now low: their names go to the casts back to float32 (run() makes them).
  void add(const Node& n, std::vector<ValueId> inputs) {
    std::vector<std::string> names;
    for (ValueId o : n.outputs)
      names.push_back(is_output_[size_t(o)] && was_f32(o) ? "" : g_.value(o).name);
    std::vector<ValueId> outs =
        b_.add_node(n.op, std::move(inputs), n.attrs, n.name, names,
                    g_.value(n.outputs[0]).name + "." + suffix_of(low_));
    for (size_t i = 0; i < outs.size(); ++i) {
      ValueId o = n.outputs[i];
      if (names[i].empty() && b_.dst().type(outs[i]).dtype == g_.type(o).dtype)
        b_.dst().rename_value(outs[i], g_.value(o).name);  // still float32: no cast, same name
      b_.set_map(o, outs[i]);
    }
  }

  void rewrite(const Node& n, AutocastResult& result) {
    bool reads_f32 = false;
    for (ValueId v : n.inputs) reads_f32 = reads_f32 || was_f32(v);
    if (!reads_f32) {
      b_.copy_node(n);
      return;
    }
    AutocastPolicy p = kPolicy[size_t(n.op)];
    if (p == AutocastPolicy::AsIs) {
      // An explicit cast reads its input as it now is; a cast to that dtype is the input.
      ValueId in = b_.map(n.inputs[0]);
      if (b_.dst().type(in).dtype == g_.type(n.outputs[0]).dtype)
        b_.set_map(n.outputs[0], in);
      else
        add(n, {in});
      return;
    }
    DType d = low_;
    if (p == AutocastPolicy::Float32 || (p == AutocastPolicy::Follow && follow_in_f32(n)))
      d = DType::Float32;
    std::vector<ValueId> in;
    for (ValueId v : n.inputs) in.push_back(v == kNoValue ? kNoValue : as(v, d, "", &n));
    add(n, std::move(in));
    (d == DType::Float32 ? result.float32_nodes : result.low_nodes)++;
  }

  const Graph& g_;
  DType low_;
  GraphBuilder b_;
  std::vector<std::array<ValueId, 2>> versions_;  // old value -> its float32 / low version
  std::vector<bool> is_output_;
  std::unordered_map<ValueId, Conversion> conversions_;
  int casts_ = 0, weights_ = 0;
};

class AutocastPass : public Pass {
 public:
  explicit AutocastPass(DType low)
      : low_(low), name_(std::string("autocast-") + suffix_of(low)) {}
  std::string_view name() const override { return name_; }
  std::string_view description() const override {
    return low_ == DType::BFloat16
               ? "run a float32 graph in bfloat16: matmul/conv/attention and the pointwise ops "
                 "between them low, norms/softmax/reductions float32, weights converted once"
               : "run a float32 graph in float16: matmul/conv/attention and the pointwise ops "
                 "between them low, norms/softmax/reductions float32, weights converted once";
  }
  bool run(Graph& g) override { return autocast(g, low_).changed(); }

 private:
  DType low_;
  std::string name_;
};

}  // namespace

AutocastPolicy autocast_policy(OpId op) { return kPolicy[size_t(op)]; }

const char* autocast_policy_name(AutocastPolicy p) {
  switch (p) {
    case AutocastPolicy::Low: return "low";
    case AutocastPolicy::Float32: return "float32";
    case AutocastPolicy::Follow: return "follow";
    case AutocastPolicy::AsIs: return "as-is";
  }
  return "?";
}

AutocastResult autocast(Graph& g, DType low) {
  if (low != DType::BFloat16 && low != DType::Float16)
    fail("autocast: the low dtype must be bfloat16 or float16, found {}", dtype_name(low));
  AutocastResult result;
  bool any_f32 = false;
  for (const Value& v : g.values) any_f32 = any_f32 || v.type.dtype == DType::Float32;
  if (!any_f32) return result;
  Graph out = Autocaster(g, low).run(result);
  if (result.changed()) g = std::move(out);
  return result;
}

std::unique_ptr<Pass> make_autocast_pass(DType low) {
  return std::make_unique<AutocastPass>(low);
}

void check_precision(DType d, std::string_view where) {
  if (d != DType::Float32 && d != DType::BFloat16 && d != DType::Float16)
    fail("{}: precision expected float32, bfloat16 or float16, found {}", where, dtype_name(d));
}

DType parse_precision(std::string_view text, std::string_view where) {
  DType d;
  if (!parse_dtype(text, &d) ||
      (d != DType::Float32 && d != DType::BFloat16 && d != DType::Float16))
    fail("{}: expected float32, bfloat16 or float16 (or f32, bf16, f16), found '{}'", where,
         text);
  return d;
}

}  // namespace kiln
