// Fused ops: fused_conv2d and fused_linear, a convolution or linear layer with its epilogue.
//
// Note [Fused epilogues]
//   y = act(base(x, weight, bias) + sum_scale * residual)
// base is conv2d (same inputs and attributes as conv2d) or linear; `residual` is optional and has
// exactly the output's type; `activation` is one of none | relu | gelu | gelu_tanh | silu |
// sigmoid | tanh | clamp (clamp takes clamp_min and/or clamp_max; the bounds are rejected for
// other activations). The residual is added before the activation: the ResNet block
// (conv -> +bias -> +identity -> relu), and the order of oneDNN's post-ops (a sum post-op with
// scale sum_scale, then an eltwise post-op), to which the CPU compiler maps these ops.
// fuse-epilogues (src/passes/fuse_epilogues.h) produces them from conv/linear + add + activation
// chains.
//
// The reference computes the base op in float64 on float64 copies of the inputs, then the
// epilogue in float64, and rounds once. The eager kernel runs the base op's eager kernel (oneDNN
// for f32/bf16) into the output and applies the epilogue in place. The decomposition writes the
// chain back as conv2d/linear, mul, add and the activation op.
#include <cmath>

#include "ops/api.h"
#include "ops/dispatch.h"
#include "ops/kernel_util.h"

namespace kiln {
namespace {

enum class Act { None, Relu, Gelu, GeluTanh, Silu, Sigmoid, Tanh, Clamp };

struct ActName {
  Act act;
  const char* name;
};
constexpr ActName kActs[] = {
    {Act::None, "none"},       {Act::Relu, "relu"},       {Act::Gelu, "gelu"},
    {Act::GeluTanh, "gelu_tanh"}, {Act::Silu, "silu"},    {Act::Sigmoid, "sigmoid"},
    {Act::Tanh, "tanh"},       {Act::Clamp, "clamp"},
};

bool parse_act(const std::string& s, Act* out) {
  for (const ActName& a : kActs)
    if (s == a.name) {
      *out = a.act;
      return true;
    }
  return false;
}

std::string act_names() {
  std::string s;
  for (const ActName& a : kActs) s += (s.empty() ? "" : " | ") + std::string(a.name);
  return s;
}

struct Epilogue {
  Act act = Act::None;
  bool has_lo = false, has_hi = false;
  double lo = 0, hi = 0;
  double sum_scale = 1.0;
};

// Attributes are validated by inference; kernels re-read them.
Epilogue read_epilogue(const Attrs& attrs) {
  Epilogue e;
  if (!parse_act(attrs.get_string("activation"), &e.act))
    fail("unknown activation '{}' (expected {})", attrs.get_string("activation"), act_names());
  e.has_lo = attrs.has("clamp_min");
  e.has_hi = attrs.has("clamp_max");
  if (e.has_lo) e.lo = attrs.get_float("clamp_min");
  if (e.has_hi) e.hi = attrs.get_float("clamp_max");
  e.sum_scale = attrs.get_float("sum_scale");
  return e;
}

double act_f64(const Epilogue& e, double x) {
  switch (e.act) {
    case Act::None: return x;
    case Act::Relu: return x > 0 ? x : (std::isnan(x) ? x : 0.0);
    case Act::Gelu: return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
    case Act::GeluTanh: {
      const double c = std::sqrt(2.0 / M_PI);
      return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
    }
    case Act::Silu: return x / (1.0 + std::exp(-x));
    case Act::Sigmoid: return 1.0 / (1.0 + std::exp(-x));
    case Act::Tanh: return std::tanh(x);
    case Act::Clamp:
      if (std::isnan(x)) return x;
      if (e.has_lo && x < e.lo) x = e.lo;
      if (e.has_hi && x > e.hi) x = e.hi;
      return x;
  }
  return x;
}

// The same in float arithmetic (the eager float32 path; matches unary.cc's fast paths).
float act_f32(const Epilogue& e, float x) {
  switch (e.act) {
    case Act::None: return x;
    case Act::Relu: return x > 0.0f ? x : (x != x ? x : 0.0f);
    case Act::Gelu: return 0.5f * x * (1.0f + std::erf(x * 0.7071067811865476f));
    case Act::GeluTanh: {
      const float c = 0.7978845608028654f;
      return 0.5f * x * (1.0f + std::tanh(c * (x + 0.044715f * x * x * x)));
    }
    case Act::Silu: return x / (1.0f + std::exp(-x));
    case Act::Sigmoid: return 1.0f / (1.0f + std::exp(-x));
    case Act::Tanh: return std::tanh(x);
    case Act::Clamp: return float(act_f64(e, double(x)));
  }
  return x;
}

// ---- inference ----------------------------------------------------------------------------------
std::vector<TensorType> infer_fused(const InferContext& ctx, OpId base) {
  Act act;
  const std::string& name = ctx.attrs.get_string("activation");
  if (!parse_act(name, &act))
    ctx.fail("attribute 'activation' is \"{}\"; expected one of {}", name, act_names());
  bool lo = ctx.attrs.has("clamp_min"), hi = ctx.attrs.has("clamp_max");
  if (act != Act::Clamp && (lo || hi))
    ctx.fail("attributes 'clamp_min'/'clamp_max' apply only to activation \"clamp\", not \"{}\"",
             name);
  if (act == Act::Clamp && !lo && !hi)
    ctx.fail("activation \"clamp\" needs 'clamp_min', 'clamp_max' or both");
  if (lo && hi && ctx.attrs.get_float("clamp_min") > ctx.attrs.get_float("clamp_max"))
    ctx.fail("clamp_min {} is greater than clamp_max {}", ctx.attrs.get_float("clamp_min"),
             ctx.attrs.get_float("clamp_max"));
  if (!ctx.op.supports_dtype(ctx.in(0).dtype))
    ctx.fail("input 'x' has dtype {}; expected a floating dtype", dtype_name(ctx.in(0).dtype));

  // The base op's inference validates x, weight and bias; errors still name this op.
  InferContext base_ctx{ctx.op, ctx.node_name,
                        ctx.inputs.first(std::min<size_t>(3, ctx.inputs.size())), ctx.attrs};
  std::vector<TensorType> out = op_def(base).infer(base_ctx);
  if (ctx.has_input(3)) {
    const TensorType& r = ctx.in(3);
    if (r.dtype != out[0].dtype || r.device != out[0].device || r.shape != out[0].shape)
      ctx.fail("input 'residual' is {}; expected the output's type {}", r.str(), out[0].str());
  }
  return out;
}

std::vector<TensorType> infer_fused_conv2d(const InferContext& ctx) {
  return infer_fused(ctx, OpId::Conv2d);
}
std::vector<TensorType> infer_fused_linear(const InferContext& ctx) {
  return infer_fused(ctx, OpId::Linear);
}

OpId base_of(OpId fused) { return fused == OpId::FusedConv2d ? OpId::Conv2d : OpId::Linear; }

// The base op's attributes out of the fused op's (conv2d: stride, padding, dilation, groups).
Attrs base_attrs(OpId base, const Attrs& attrs) {
  Attrs out;
  for (const AttrSpec& spec : op_def(base).attrs)
    if (const AttrValue* v = attrs.find(spec.name)) out.set(spec.name, *v);
  return out;
}

// ---- kernels ------------------------------------------------------------------------------------
void ref_fused(const KernelContext& ctx) {
  const OpDef& base = op_def(base_of(ctx.op.id));
  Epilogue e = read_epilogue(ctx.attrs);
  // Float64 copies: every float dtype converts exactly, and the base reference then computes
  // and stores in float64 (no intermediate rounding).
  TensorList in64;
  for (size_t i = 0; i < 3; ++i) {
    const Tensor& t = i < ctx.inputs.size() ? ctx.inputs[i] : Tensor();
    in64.push_back(t.defined() ? t.to(DType::Float64) : Tensor());
  }
  TensorType acc_type = ctx.out_types[0];
  acc_type.dtype = DType::Float64;
  Tensor acc = run_kernel(base, base.reference, in64, base_attrs(base.id, ctx.attrs),
                          std::span<const TensorType>(&acc_type, 1))[0];
  const double* ap = acc.data<double>();
  Tensor& y = ctx.outputs[0];
  char* yp = static_cast<char*>(y.raw_data());
  int64_t ys = y.element_size();
  const Tensor residual = ctx.inputs.size() > 3 ? ctx.inputs[3] : Tensor();
  if (!residual.defined()) {
    for (int64_t i = 0; i < y.numel(); ++i) store_f64(yp + i * ys, y.dtype(), act_f64(e, ap[i]));
    return;
  }
  Dims strides[1] = {residual.strides()};
  const char* rp = static_cast<const char*>(residual.raw_data());
  int64_t rs = residual.element_size();
  for_each_broadcast(y.sizes(), strides, [&](int64_t i, const int64_t* off) {
    double r = load_f64(rp + off[0] * rs, residual.dtype());
    store_f64(yp + i * ys, y.dtype(), act_f64(e, ap[i] + e.sum_scale * r));
  });
}

void eager_fused(const KernelContext& ctx) {
  const OpDef& base = op_def(base_of(ctx.op.id));
  KernelFn kernel = base.eager_cpu ? base.eager_cpu : base.reference;
  Attrs attrs = base_attrs(base.id, ctx.attrs);
  // Always three inputs (x, weight, bias or undefined): the base kernels read the bias slot.
  const Tensor base_inputs[3] = {ctx.inputs[0], ctx.inputs[1],
                                 ctx.inputs.size() > 2 ? ctx.inputs[2] : Tensor()};
  kernel(KernelContext{base, base_inputs, ctx.outputs, attrs, ctx.out_types});

  Epilogue e = read_epilogue(ctx.attrs);
  Tensor& y = ctx.outputs[0];  // preallocated contiguous by dispatch
  const Tensor residual = ctx.inputs.size() > 3 ? ctx.inputs[3] : Tensor();
  if (!residual.defined() && e.act == Act::None) return;
  int64_t n = y.numel();
  if (y.dtype() == DType::Float32 &&
      (!residual.defined() || (residual.dtype() == DType::Float32 && residual.is_contiguous()))) {
    float* yp = y.data<float>();
    const float* rp = residual.defined() ? residual.data<float>() : nullptr;
    const float scale = float(e.sum_scale);
#pragma omp parallel for if (n > 65536)
    for (int64_t i = 0; i < n; ++i) yp[i] = act_f32(e, rp ? yp[i] + scale * rp[i] : yp[i]);
    return;
  }
  // Other dtypes and strided residuals: per element through float64, one rounding per element.
  char* yp = static_cast<char*>(y.raw_data());
  int64_t ys = y.element_size();
  if (!residual.defined()) {
    for (int64_t i = 0; i < n; ++i)
      store_f64(yp + i * ys, y.dtype(), act_f64(e, load_f64(yp + i * ys, y.dtype())));
    return;
  }
  Dims strides[1] = {residual.strides()};
  const char* rp = static_cast<const char*>(residual.raw_data());
  int64_t rs = residual.element_size();
  for_each_broadcast(y.sizes(), strides, [&](int64_t i, const int64_t* off) {
    double v = load_f64(yp + i * ys, y.dtype()) + e.sum_scale * load_f64(rp + off[0] * rs, residual.dtype());
    store_f64(yp + i * ys, y.dtype(), act_f64(e, v));
  });
}

// ---- decomposition ------------------------------------------------------------------------------
Tensor apply_activation(const Tensor& y, const Epilogue& e) {
  switch (e.act) {
    case Act::None: return y;
    case Act::Relu: return call_op1(OpId::Relu, {y});
    case Act::Gelu: return call_op1(OpId::Gelu, {y}, {{"approximate", std::string("none")}});
    case Act::GeluTanh: return call_op1(OpId::Gelu, {y}, {{"approximate", std::string("tanh")}});
    case Act::Silu: return call_op1(OpId::Silu, {y});
    case Act::Sigmoid: return call_op1(OpId::Sigmoid, {y});
    case Act::Tanh: return call_op1(OpId::Tanh, {y});
    case Act::Clamp: {
      Attrs a;
      if (e.has_lo) a.set("min", e.lo);
      if (e.has_hi) a.set("max", e.hi);
      return call_op1(OpId::Clamp, {y}, a);
    }
  }
  return y;
}

TensorList decompose_fused(std::span<const Tensor> in, const Attrs& attrs, OpId base) {
  Epilogue e = read_epilogue(attrs);
  Tensor bias = in.size() > 2 ? in[2] : Tensor();
  Tensor y = call_op1(base, {in[0], in[1], bias}, base_attrs(base, attrs));
  if (in.size() > 3 && in[3].defined()) {
    Tensor r = in[3];
    if (e.sum_scale != 1.0) r = call_op1(OpId::Mul, {r, scalar_like(e.sum_scale, r)});
    y = call_op1(OpId::Add, {y, r});
  }
  return {apply_activation(y, e)};
}

TensorList decompose_fused_conv2d(std::span<const Tensor> in, const Attrs& attrs) {
  return decompose_fused(in, attrs, OpId::Conv2d);
}
TensorList decompose_fused_linear(std::span<const Tensor> in, const Attrs& attrs) {
  return decompose_fused(in, attrs, OpId::Linear);
}

// ---- samples ------------------------------------------------------------------------------------
Attrs epilogue(const char* act, double sum_scale = 1.0) {
  return {{"activation", std::string(act)}, {"sum_scale", sum_scale}};
}
Attrs with(Attrs a, std::initializer_list<std::pair<std::string, AttrValue>> more) {
  for (auto& [k, v] : more) a.set(k, v);
  return a;
}

std::vector<OpSample> samples_fused_conv2d(Generator& g) {
  auto r = [&](Dims d) { return sample_randn(g, d); };
  return {
      {{r({2, 3, 5, 5}), r({4, 3, 3, 3}), r({4})}, with(epilogue("relu"), {{"padding", Ints{1, 1}}}),
       "3x3 pad 1, bias, relu"},
      {{r({2, 4, 6, 6}), r({6, 4, 1, 1}), r({6}), r({2, 6, 6, 6})}, epilogue("relu"),
       "1x1 + residual + relu (ResNet block end)"},
      {{r({2, 3, 7, 7}), r({4, 3, 3, 3}), Tensor(), r({2, 4, 3, 3})},
       with(epilogue("silu", 0.5), {{"stride", Ints{2, 2}}}), "stride 2, no bias, 0.5*residual, silu"},
      {{r({2, 4, 5, 5}), r({4, 2, 3, 3}), r({4}), r({2, 4, 5, 5})},
       with(epilogue("none", -1.0), {{"padding", Ints{1, 1}}, {"groups", int64_t(2)}}),
       "groups 2, minus residual, no activation"},
      {{r({1, 32, 6, 7}), r({32, 4, 3, 3}), r({32}), r({1, 32, 6, 7})},
       with(epilogue("relu"), {{"padding", Ints{1, 1}}, {"groups", int64_t(8)}}),
       "grouped, 4 per group, residual, relu (resnext)"},
      {{r({1, 32, 9, 8}), r({32, 8, 3, 3}), r({32}), r({1, 32, 5, 4})},
       with(epilogue("silu", 0.5),
            {{"padding", Ints{1, 1}}, {"stride", Ints{2, 2}}, {"groups", int64_t(4)}}),
       "grouped, 8 per group, stride 2, 0.5*residual, silu"},
      {{r({1, 32, 7, 5}), r({32, 16, 3, 3}), Tensor()},
       with(epilogue("clamp"), {{"padding", Ints{2, 2}}, {"dilation", Ints{2, 2}},
                                {"groups", int64_t(2)}, {"clamp_min", 0.0}, {"clamp_max", 1.5}}),
       "grouped, 16 per group, dilation 2, no bias, clamp"},
      {{r({2, 3, 4, 4}), r({5, 3, 3, 3}), r({5})}, with(epilogue("gelu"), {{"padding", Ints{1, 1}}}), "gelu"},
      {{r({2, 3, 4, 4}), r({5, 3, 3, 3}), r({5})}, with(epilogue("gelu_tanh"), {{"padding", Ints{1, 1}}}), "gelu_tanh"},
      {{r({2, 3, 4, 4}), r({5, 3, 1, 1}), r({5}), r({2, 5, 4, 4})}, epilogue("sigmoid"),
       "sigmoid with residual"},
      {{r({2, 3, 4, 4}), r({5, 3, 1, 1}), Tensor()}, epilogue("tanh"), "tanh"},
      {{r({2, 3, 4, 4}), r({5, 3, 1, 1})}, epilogue("relu"), "two inputs (no bias slot)"},
      {{r({2, 3, 4, 4}), r({5, 3, 3, 3}), r({5})},
       with(epilogue("clamp"), {{"padding", Ints{1, 1}}, {"clamp_min", 0.0}, {"clamp_max", 1.5}}),
       "clamp [0, 1.5] (relu6-like)"},
      {{r({2, 3, 4, 4}), r({5, 3, 1, 1}), r({5}), sample_noncontiguous(g, {2, 5, 4, 4})},
       with(epilogue("clamp"), {{"clamp_min", -0.25}}), "clamp min only, strided residual"},
  };
}

std::vector<OpSample> samples_fused_linear(Generator& g) {
  auto r = [&](Dims d) { return sample_randn(g, d); };
  return {
      {{r({3, 8}), r({5, 8}), r({5})}, epilogue("relu"), "[3,8] -> 5, bias, relu"},
      {{r({2, 3, 8}), r({6, 8}), Tensor(), r({2, 3, 6})}, epilogue("gelu"),
       "3-D x, no bias, residual, gelu"},
      {{r({4, 8}), r({5, 8}), r({5}), r({4, 5})}, epilogue("tanh", -1.0), "minus residual, tanh"},
      {{r({4, 6}), r({3, 6}), r({3}), r({4, 3})}, epilogue("none"), "residual only (BERT output)"},
      {{r({4, 6}), r({3, 6}), r({3})}, epilogue("gelu_tanh"), "gelu_tanh"},
      {{r({4, 6}), r({3, 6}), r({3})}, epilogue("silu"), "silu"},
      {{r({4, 6}), r({3, 6})}, epilogue("relu"), "two inputs (no bias slot)"},
      {{r({4, 6}), r({3, 6}), Tensor(), r({4, 3})}, epilogue("sigmoid", 2.0), "2*residual, sigmoid"},
      {{r({4, 6}), r({3, 6}), r({3})},
       with(epilogue("clamp"), {{"clamp_min", -0.5}, {"clamp_max", 0.5}}), "clamp"},
      {{sample_noncontiguous(g, {4, 6}), r({3, 6}), r({3}), sample_noncontiguous(g, {4, 3})},
       epilogue("relu"), "non-contiguous x and residual"},
  };
}

std::vector<AttrSpec> epilogue_attrs() {
  return {{"activation", AttrType::String, std::string("none")},
          {"clamp_min", AttrType::Float, {}, true},
          {"clamp_max", AttrType::Float, {}, true},
          {"sum_scale", AttrType::Float, 1.0}};
}

}  // namespace

void register_fused_ops() {
  OpDef& conv = define_op(OpId::FusedConv2d);
  conv.doc = "act(conv2d(x, weight, bias) + sum_scale * residual); activation none | relu | "
             "gelu | gelu_tanh | silu | sigmoid | tanh | clamp (clamp_min, clamp_max)";
  conv.inputs = {{"x"}, {"weight"}, {"bias", true}, {"residual", true}};
  // conv2d's attributes, spelled out: the registry is being built, so op_def cannot be asked.
  conv.attrs = {{"stride", AttrType::Ints, Ints{1, 1}},
                {"padding", AttrType::Ints, Ints{0, 0}},
                {"dilation", AttrType::Ints, Ints{1, 1}},
                {"groups", AttrType::Int, int64_t(1)}};
  for (AttrSpec& a : epilogue_attrs()) conv.attrs.push_back(std::move(a));
  conv.infer = infer_fused_conv2d;
  conv.reference = ref_fused;
  conv.decompose = decompose_fused_conv2d;
  conv.eager_cpu = eager_fused;
  conv.dtypes = float_dtypes();
  conv.samples = samples_fused_conv2d;
  conv.tolerance_scale = 2.0;  // two roundings (base output, epilogue) in low precision

  OpDef& lin = define_op(OpId::FusedLinear);
  lin.doc = "act(linear(x, weight, bias) + sum_scale * residual); activations as fused_conv2d";
  lin.inputs = {{"x"}, {"weight"}, {"bias", true}, {"residual", true}};
  lin.attrs = epilogue_attrs();
  lin.infer = infer_fused_linear;
  lin.reference = ref_fused;
  lin.decompose = decompose_fused_linear;
  lin.eager_cpu = eager_fused;
  lin.dtypes = float_dtypes();
  lin.samples = samples_fused_linear;
  lin.tolerance_scale = 2.0;
}

}  // namespace kiln
