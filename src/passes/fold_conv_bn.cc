#include "passes/fold_conv_bn.h"

#include <cmath>
#include <optional>

#include "ops/kernel_util.h"
#include "passes/graph_rewrite.h"

namespace kiln {
namespace {


Tensor make_tensor(const std::vector<double>& v, const Dims& sizes, DType dtype) {
  Tensor t = Tensor::empty(sizes, dtype);
  write_f64(t, v);
  return t;
}

// w with each row o (its first dim) multiplied by scale[o], in double, rounded once to w's
// dtype. A float32 weight (every model's) takes one pass over its floats: float(double(x) * s)
// is what the general path's read_f64 / multiply / write_f64 computes, so both give the same
// bits, without a double copy of the weights (ResNet-50's 25M weights: 200 MB, 0.1 s), and
// rows go to the OpenMP threads.
Tensor scaled_rows(const Tensor& w0, const std::vector<double>& scale) {
  Tensor w = (w0.device().is_cpu() ? w0 : w0.to(Device::cpu())).contiguous();
  const size_t rows = scale.size(), per_row = rows == 0 ? 0 : size_t(w.numel()) / rows;
  if (w.dtype() == DType::Float32) {
    Tensor out = Tensor::empty(w.sizes(), DType::Float32);
    const float* x = w.data<float>();
    float* y = static_cast<float*>(out.raw_data());
#pragma omp parallel for schedule(static) if (w.numel() > (int64_t(1) << 16))
    for (size_t o = 0; o < rows; ++o)
      for (size_t k = 0; k < per_row; ++k)
        y[o * per_row + k] = float(double(x[o * per_row + k]) * scale[o]);
    return out;
  }
  std::vector<double> v = read_f64(w);
  for (size_t o = 0; o < rows; ++o)
    for (size_t k = 0; k < per_row; ++k) v[o * per_row + k] *= scale[o];
  return make_tensor(v, w.sizes(), w.dtype());
}

// Data of old-graph value v if it is a param or const with data.
std::optional<Tensor> data_of(const Graph& g, ValueId v) {
  if (v == kNoValue) return std::nullopt;
  const Value& val = g.value(v);
  if ((val.kind != ValueKind::Param && val.kind != ValueKind::Const) || !val.data.defined() ||
      !val.data.has_storage())
    return std::nullopt;
  return val.data;
}

bool is_param(const Graph& g, ValueId v) {
  return v != kNoValue && g.value(v).kind == ValueKind::Param;
}

std::string bias_name_for(const std::string& weight_name) {
  const std::string suffix = "weight";
  if (weight_name.size() >= suffix.size() &&
      weight_name.compare(weight_name.size() - suffix.size(), suffix.size(), suffix) == 0)
    return weight_name.substr(0, weight_name.size() - suffix.size()) + "bias";
  return weight_name + ".bias";
}

struct Fold {
  size_t producer;  // the conv / linear node
  size_t bn;        // the batch_norm node
  Tensor weight, bias;
  bool as_params;
};

// Computes W', b' for producer node p followed by batch norm node bn, if all data is there.
std::optional<Fold> plan_fold(const Graph& g, size_t p, size_t bn) {
  const Node &prod = g.nodes[p], &norm = g.nodes[bn];
  auto w = data_of(g, prod.inputs[1]);
  ValueId bias_id = prod.inputs.size() > 2 ? prod.inputs[2] : kNoValue;
  auto b = data_of(g, bias_id);
  auto mean = data_of(g, norm.inputs[1]), var = data_of(g, norm.inputs[2]);
  ValueId gamma_id = norm.inputs.size() > 3 ? norm.inputs[3] : kNoValue;
  ValueId beta_id = norm.inputs.size() > 4 ? norm.inputs[4] : kNoValue;
  auto gamma = data_of(g, gamma_id), beta = data_of(g, beta_id);
  if (!w || !mean || !var || (bias_id != kNoValue && !b) || (gamma_id != kNoValue && !gamma) ||
      (beta_id != kNoValue && !beta))
    return std::nullopt;
  int64_t out_ch = w->size(0);
  if (mean->numel() != out_ch || var->numel() != out_ch) return std::nullopt;

  double eps = norm.attrs.get_float("eps");
  std::vector<double> mv = read_f64(*mean), vv = read_f64(*var);
  std::vector<double> gv = gamma ? read_f64(*gamma) : std::vector<double>(size_t(out_ch), 1.0);
  std::vector<double> betav = beta ? read_f64(*beta) : std::vector<double>(size_t(out_ch), 0.0);
  std::vector<double> bv = b ? read_f64(*b) : std::vector<double>(size_t(out_ch), 0.0);
  std::vector<double> scale(static_cast<size_t>(out_ch)), new_b(static_cast<size_t>(out_ch));
  for (size_t o = 0; o < size_t(out_ch); ++o) {
    scale[o] = gv[o] / std::sqrt(vv[o] + eps);
    new_b[o] = (bv[o] - mv[o]) * scale[o] + betav[o];
  }
  DType dt = w->dtype();
  Fold f{p, bn, scaled_rows(*w, scale), make_tensor(new_b, Dims{out_ch}, dt), false};
  for (ValueId v : {prod.inputs[1], bias_id, norm.inputs[1], norm.inputs[2], gamma_id, beta_id})
    f.as_params = f.as_params || is_param(g, v);
  if (!w->device().is_cpu()) {
    f.weight = f.weight.to(w->device());
    f.bias = f.bias.to(w->device());
  }
  return f;
}

}  // namespace

FoldConvBnResult fold_conv_bn(Graph& g) {
  FoldConvBnResult result;
  std::vector<int> uses = live_use_counts(g);
  std::vector<std::optional<Fold>> fold_at(g.nodes.size());  // by producer index
  std::vector<bool> folded_bn(g.nodes.size(), false);
  // A folded batch norm that read a reshape of the linear: by the reshape's index, the batch
  // norm's output, which then reads the rewritten reshape.
  std::vector<ValueId> bn_after_reshape(g.nodes.size(), kNoValue);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& bn = g.nodes[i];
    if (bn.op != OpId::BatchNorm) continue;
    const Value& x = g.value(bn.inputs[0]);
    if (x.kind != ValueKind::NodeOutput || uses[size_t(bn.inputs[0])] != 1) continue;
    size_t p = size_t(x.producer);
    std::optional<size_t> reshape;
    // Note [batch norm over a flattened linear]: BatchNorm1d over [B*S, C] of a linear's
    // [B, S, C] output (PointPillars' pillar encoder: linear, view(-1, C), batch norm,
    // view back) folds like the rank-2 case: the reshape keeps the last dim, which is the
    // batch norm's channel dim, so every row is normalized per output feature.
    if (g.nodes[p].op == OpId::Reshape && x.type.rank() == 2) {
      const Value& lx = g.value(g.nodes[p].inputs[0]);
      if (lx.kind == ValueKind::NodeOutput && uses[size_t(g.nodes[p].inputs[0])] == 1 &&
          g.nodes[size_t(lx.producer)].op == OpId::Linear && lx.type.rank() >= 2 &&
          lx.type.shape.back() == x.type.shape.back()) {
        reshape = p;
        p = size_t(lx.producer);
      }
    }
    const Node& prod = g.nodes[p];
    bool conv = prod.op == OpId::Conv2d && !reshape;
    bool linear = prod.op == OpId::Linear && (x.type.rank() == 2);
    if (!conv && !linear) continue;
    if (!is_concrete(g.type(prod.inputs[1]).shape)) continue;
    std::optional<Fold> f = plan_fold(g, p, i);
    if (!f) continue;
    fold_at[p] = std::move(f);
    folded_bn[i] = true;
    if (reshape) bn_after_reshape[*reshape] = bn.outputs[0];
    ++(conv ? result.conv_folded : result.linear_folded);
  }
  if (result.conv_folded + result.linear_folded == 0) return result;

  std::vector<bool> live = live_nodes(g);
  GraphBuilder b(g);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (folded_bn[i]) continue;  // its output was mapped when the producer was rewritten
    if (!fold_at[i]) {
      bool reads_dropped = false;
      for (ValueId v : n.inputs) reads_dropped = reads_dropped || (v != kNoValue && !b.is_mapped(v));
      if (reads_dropped && !live[i]) continue;  // dead code reading a folded conv: drop it too
      b.copy_node(n);
      if (bn_after_reshape[i] != kNoValue) b.set_map(bn_after_reshape[i], b.map(n.outputs[0]));
      continue;
    }
    const Fold& f = *fold_at[i];
    std::string w_name = b.fresh_name(g.value(n.inputs[1]).name + ".folded");
    ValueId bias_old = n.inputs.size() > 2 ? n.inputs[2] : kNoValue;
    std::string b_base = bias_old != kNoValue ? g.value(bias_old).name
                                              : bias_name_for(g.value(n.inputs[1]).name);
    ValueId w = f.as_params ? b.add_param(f.weight, w_name) : b.add_const(f.weight, w_name);
    std::string b_name = b.fresh_name(b_base + ".folded");
    ValueId bias = f.as_params ? b.add_param(f.bias, b_name) : b.add_const(f.bias, b_name);
    ValueId y = b.add_node1(n.op, {b.map(n.inputs[0]), w, bias}, n.attrs, n.name,
                            g.value(n.outputs[0]).name);
    if (g.value(g.nodes[f.bn].inputs[0]).producer == int32_t(i))
      b.set_map(g.nodes[f.bn].outputs[0], y);
    else
      b.set_map(n.outputs[0], y);  // the reshape between them reads it, then stands for the bn
  }
  g = b.finish();
  return result;
}

namespace {

class FoldConvBnPass : public Pass {
 public:
  std::string_view name() const override { return "fold-conv-bn"; }
  std::string_view description() const override {
    return "fold inference batch_norm into the conv2d (or rank-2 linear) that feeds it";
  }
  bool run(Graph& g) override {
    FoldConvBnResult r = fold_conv_bn(g);
    return r.conv_folded + r.linear_folded > 0;
  }
};

}  // namespace

std::unique_ptr<Pass> make_fold_conv_bn_pass() { return std::make_unique<FoldConvBnPass>(); }

}  // namespace kiln
