// Standard layers. See layers.h and Note [Random init].
#include "nn/layers.h"

#include <cmath>
#include <limits>

#include "ops/api.h"

namespace kiln::nn {

namespace {

std::string ints_str(const std::vector<int64_t>& v) { return to_string(Dims(v.begin(), v.end())); }

void check_pair(const std::vector<int64_t>& v, const char* module, const char* what,
                bool allow_empty = false) {
  if (allow_empty && v.empty()) return;
  KILN_CHECK(v.size() == 2, "{}: {} must have 2 values (h, w), found {}", module, what,
             ints_str(v));
}

// Normalization statistics and affine parameters. See Note [Random init].
void init_affine(const Tensor& weight, const Tensor& bias, Generator& gen) {
  if (weight.defined()) init::uniform_(weight, 0.5, 1.5, gen);
  if (bias.defined()) init::normal_(bias, 0.0, 0.1, gen);
}

[[noreturn]] void training_not_supported(const std::string& module) {
  fail_kind(ErrorKind::NotSupported,
            "{}: training mode is not supported yet (inference only until autodiff lands); "
            "call module->eval() before running the model",
            module);
}

}  // namespace

// ---- Linear -----------------------------------------------------------------------------------
Linear::Linear(int64_t in, int64_t out, bool with_bias, Generator& gen)
    : UnaryModule("Linear"), in_features(in), out_features(out) {
  KILN_CHECK(in > 0 && out > 0, "Linear: in_features ({}) and out_features ({}) must be positive",
             in, out);
  weight = register_parameter("weight", Tensor::empty({out, in}));
  init::kaiming_uniform_(weight, gen);
  if (with_bias) {
    bias = register_parameter("bias", Tensor::empty({out}));
    init::bias_uniform_(bias, in, gen);
  }
}
Tensor Linear::forward(const Tensor& x) {
  KILN_CHECK(x.dim() >= 1 && x.size(-1) == in_features,
             "Linear(in_features={}): input {} must have {} features in its last dim", in_features,
             to_string(x.sizes()), in_features);
  return linear(x, weight, bias);
}
std::string Linear::extra_repr() const {
  return fmt::format("in_features={}, out_features={}, bias={}", in_features, out_features,
                     bias.defined());
}

// ---- Conv2d -----------------------------------------------------------------------------------
Conv2d::Conv2d(const Conv2dOptions& o, Generator& gen) : UnaryModule("Conv2d"), options(o) {
  check_pair(o.kernel_size, "Conv2d", "kernel_size");
  check_pair(o.stride, "Conv2d", "stride");
  check_pair(o.padding, "Conv2d", "padding");
  check_pair(o.dilation, "Conv2d", "dilation");
  KILN_CHECK(o.in_channels > 0 && o.out_channels > 0 && o.groups > 0,
             "Conv2d: in_channels ({}), out_channels ({}) and groups ({}) must be positive",
             o.in_channels, o.out_channels, o.groups);
  KILN_CHECK(o.in_channels % o.groups == 0 && o.out_channels % o.groups == 0,
             "Conv2d: in_channels ({}) and out_channels ({}) must be divisible by groups ({})",
             o.in_channels, o.out_channels, o.groups);
  weight = register_parameter(
      "weight", Tensor::empty({o.out_channels, o.in_channels / o.groups, o.kernel_size[0],
                               o.kernel_size[1]}));
  init::kaiming_uniform_(weight, gen);
  if (o.bias) {
    bias = register_parameter("bias", Tensor::empty({o.out_channels}));
    init::bias_uniform_(bias, init::fan_in(weight), gen);
  }
}
Tensor Conv2d::forward(const Tensor& x) {
  KILN_CHECK(x.dim() == 4 && x.size(1) == options.in_channels,
             "Conv2d(in_channels={}): expected an NCHW input with {} channels, found {}",
             options.in_channels, options.in_channels, to_string(x.sizes()));
  return conv2d(x, weight, bias, options.stride, options.padding, options.dilation,
                options.groups);
}
std::string Conv2d::extra_repr() const {
  std::string s = fmt::format("{}, {}, kernel_size={}, stride={}", options.in_channels,
                              options.out_channels, ints_str(options.kernel_size),
                              ints_str(options.stride));
  if (options.padding != std::vector<int64_t>{0, 0}) s += ", padding=" + ints_str(options.padding);
  if (options.dilation != std::vector<int64_t>{1, 1})
    s += ", dilation=" + ints_str(options.dilation);
  if (options.groups != 1) s += fmt::format(", groups={}", options.groups);
  if (!options.bias) s += ", bias=false";
  return s;
}

// ---- BatchNorm2d ------------------------------------------------------------------------------
BatchNorm2d::BatchNorm2d(int64_t n, double eps_, bool affine, Generator& gen)
    : UnaryModule("BatchNorm2d"), num_features(n), eps(eps_) {
  KILN_CHECK(n > 0, "BatchNorm2d: num_features must be positive, found {}", n);
  if (affine) {
    weight = register_parameter("weight", Tensor::empty({n}));
    bias = register_parameter("bias", Tensor::empty({n}));
  }
  running_mean = register_buffer("running_mean", Tensor::empty({n}));
  running_var = register_buffer("running_var", Tensor::empty({n}));
  num_batches_tracked = register_buffer("num_batches_tracked", Tensor::zeros({}, DType::Int64));
  init_affine(weight, bias, gen);
  init::normal_(running_mean, 0.0, 0.1, gen);
  init::uniform_(running_var, 0.5, 1.5, gen);
}
Tensor BatchNorm2d::forward(const Tensor& x) {
  if (is_training()) training_not_supported(type_name());
  KILN_CHECK(x.dim() == 4 && x.size(1) == num_features,
             "BatchNorm2d(num_features={}): expected an NCHW input with {} channels, found {}",
             num_features, num_features, to_string(x.sizes()));
  return batch_norm(x, running_mean, running_var, weight, bias, eps);
}
std::string BatchNorm2d::extra_repr() const {
  return fmt::format("{}, eps={}, affine={}", num_features, eps, weight.defined());
}

// ---- LayerNorm / GroupNorm ----------------------------------------------------------------------
LayerNorm::LayerNorm(std::vector<int64_t> shape, double eps_, bool affine, Generator& gen)
    : UnaryModule("LayerNorm"), normalized_shape(std::move(shape)), eps(eps_) {
  KILN_CHECK(!normalized_shape.empty(), "LayerNorm: normalized_shape is empty");
  for (int64_t d : normalized_shape)
    KILN_CHECK(d > 0, "LayerNorm: normalized_shape {} must be positive",
               ints_str(normalized_shape));
  if (affine) {
    Dims dims(normalized_shape.begin(), normalized_shape.end());
    weight = register_parameter("weight", Tensor::empty(dims));
    bias = register_parameter("bias", Tensor::empty(dims));
    init_affine(weight, bias, gen);
  }
}
Tensor LayerNorm::forward(const Tensor& x) {
  size_t k = normalized_shape.size();
  bool ok = size_t(x.dim()) >= k;
  for (size_t i = 0; ok && i < k; ++i)
    ok = x.size(int64_t(x.dim() - k + i)) == normalized_shape[i];
  KILN_CHECK(ok, "LayerNorm(normalized_shape={}): input {} does not end with those dims",
             ints_str(normalized_shape), to_string(x.sizes()));
  return layer_norm(x, normalized_shape, weight, bias, eps);
}
std::string LayerNorm::extra_repr() const {
  return fmt::format("{}, eps={}, elementwise_affine={}", ints_str(normalized_shape), eps,
                     weight.defined());
}

GroupNorm::GroupNorm(int64_t groups, int64_t channels, double eps_, bool affine, Generator& gen)
    : UnaryModule("GroupNorm"), num_groups(groups), num_channels(channels), eps(eps_) {
  KILN_CHECK(groups > 0 && channels > 0 && channels % groups == 0,
             "GroupNorm: num_channels ({}) must be a positive multiple of num_groups ({})",
             channels, groups);
  if (affine) {
    weight = register_parameter("weight", Tensor::empty({channels}));
    bias = register_parameter("bias", Tensor::empty({channels}));
    init_affine(weight, bias, gen);
  }
}
Tensor GroupNorm::forward(const Tensor& x) {
  KILN_CHECK(x.dim() >= 2 && x.size(1) == num_channels,
             "GroupNorm(num_channels={}): input {} must have {} channels in dim 1", num_channels,
             to_string(x.sizes()), num_channels);
  return group_norm(x, num_groups, weight, bias, eps);
}
std::string GroupNorm::extra_repr() const {
  return fmt::format("{}, {}, eps={}, affine={}", num_groups, num_channels, eps, weight.defined());
}

// ---- activations ------------------------------------------------------------------------------
Tensor ReLU::forward(const Tensor& x) { return relu(x); }
GELU::GELU(std::string a) : UnaryModule("GELU"), approximate(std::move(a)) {
  KILN_CHECK(approximate == "none" || approximate == "tanh",
             "GELU: approximate must be \"none\" or \"tanh\", found \"{}\"", approximate);
}
Tensor GELU::forward(const Tensor& x) { return gelu(x, approximate); }
std::string GELU::extra_repr() const {
  return approximate == "none" ? "" : "approximate=\"" + approximate + "\"";
}
Tensor SiLU::forward(const Tensor& x) { return silu(x); }
Tensor Tanh::forward(const Tensor& x) { return tanh(x); }

// ---- pooling ----------------------------------------------------------------------------------
MaxPool2d::MaxPool2d(const Pool2dOptions& o) : UnaryModule("MaxPool2d"), options(o) {
  check_pair(o.kernel_size, "MaxPool2d", "kernel_size");
  check_pair(o.stride, "MaxPool2d", "stride", /*allow_empty=*/true);
  check_pair(o.padding, "MaxPool2d", "padding");
  check_pair(o.dilation, "MaxPool2d", "dilation");
}
Tensor MaxPool2d::forward(const Tensor& x) {
  return max_pool2d(x, options.kernel_size, options.stride, options.padding, options.dilation,
                    options.ceil_mode);
}
std::string MaxPool2d::extra_repr() const {
  return fmt::format("kernel_size={}, stride={}, padding={}", ints_str(options.kernel_size),
                     ints_str(options.stride.empty() ? options.kernel_size : options.stride),
                     ints_str(options.padding));
}

AvgPool2d::AvgPool2d(const Pool2dOptions& o) : UnaryModule("AvgPool2d"), options(o) {
  check_pair(o.kernel_size, "AvgPool2d", "kernel_size");
  check_pair(o.stride, "AvgPool2d", "stride", /*allow_empty=*/true);
  check_pair(o.padding, "AvgPool2d", "padding");
}
Tensor AvgPool2d::forward(const Tensor& x) {
  return avg_pool2d(x, options.kernel_size, options.stride, options.padding, options.ceil_mode,
                    options.count_include_pad);
}
std::string AvgPool2d::extra_repr() const {
  return fmt::format("kernel_size={}, stride={}, padding={}", ints_str(options.kernel_size),
                     ints_str(options.stride.empty() ? options.kernel_size : options.stride),
                     ints_str(options.padding));
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(std::vector<int64_t> out)
    : UnaryModule("AdaptiveAvgPool2d"), output_size(std::move(out)) {
  check_pair(output_size, "AdaptiveAvgPool2d", "output_size");
}
Tensor AdaptiveAvgPool2d::forward(const Tensor& x) { return adaptive_avg_pool2d(x, output_size); }
std::string AdaptiveAvgPool2d::extra_repr() const {
  return "output_size=" + ints_str(output_size);
}

// ---- Dropout / Flatten ------------------------------------------------------------------------
Dropout::Dropout(double p_) : UnaryModule("Dropout"), p(p_) {
  KILN_CHECK(p >= 0.0 && p <= 1.0, "Dropout: p must be in [0, 1], found {}", p);
}
Tensor Dropout::forward(const Tensor& x) {
  if (is_training() && p > 0.0) training_not_supported(type_name());
  return x;
}
std::string Dropout::extra_repr() const { return fmt::format("p={}", p); }

Flatten::Flatten(int64_t s, int64_t e) : UnaryModule("Flatten"), start_dim(s), end_dim(e) {}
Tensor Flatten::forward(const Tensor& x) { return flatten(x, start_dim, end_dim); }

// ---- Embedding --------------------------------------------------------------------------------
Embedding::Embedding(int64_t num, int64_t dim, Generator& gen, double init_std)
    : UnaryModule("Embedding"), num_embeddings(num), embedding_dim(dim) {
  KILN_CHECK(num > 0 && dim > 0,
             "Embedding: num_embeddings ({}) and embedding_dim ({}) must be positive", num, dim);
  weight = register_parameter("weight", Tensor::empty({num, dim}));
  init::normal_(weight, 0.0, init_std, gen);
}
Tensor Embedding::forward(const Tensor& indices) {
  KILN_CHECK(is_integral(indices.dtype()),
             "Embedding({}, {}): indices must be an integer tensor, found {}", num_embeddings,
             embedding_dim, dtype_name(indices.dtype()));
  return embedding(weight, indices);
}
std::string Embedding::extra_repr() const {
  return fmt::format("{}, {}", num_embeddings, embedding_dim);
}

// ---- MultiheadAttention -----------------------------------------------------------------------
MultiheadAttention::MultiheadAttention(int64_t e, int64_t h, bool with_bias, Generator& gen)
    : Module("MultiheadAttention"), embed_dim(e), num_heads(h), head_dim(h > 0 ? e / h : 0) {
  KILN_CHECK(e > 0 && h > 0 && e % h == 0,
             "MultiheadAttention: embed_dim ({}) must be a positive multiple of num_heads ({})", e,
             h);
  in_proj_weight = register_parameter("in_proj_weight", Tensor::empty({3 * e, e}));
  init::xavier_uniform_(in_proj_weight, gen);
  if (with_bias) {
    in_proj_bias = register_parameter("in_proj_bias", Tensor::empty({3 * e}));
    init::bias_uniform_(in_proj_bias, e, gen);
  }
  out_proj = register_module("out_proj", std::make_shared<Linear>(e, e, with_bias, gen));
}

Tensor MultiheadAttention::forward(const Tensor& query, const Tensor& key, const Tensor& value,
                                   const Tensor& key_padding_mask, const Tensor& attn_mask) {
  const int64_t E = embed_dim, H = num_heads, D = head_dim;
  auto check3 = [&](const Tensor& t, const char* name) {
    KILN_CHECK(t.defined() && t.dim() == 3 && t.size(2) == E,
               "MultiheadAttention(embed_dim={}): {} must be [batch, seq, {}] (batch_first), "
               "found {}",
               E, name, E, t.defined() ? to_string(t.sizes()) : "undefined");
  };
  check3(query, "query");
  check3(key, "key");
  check3(value, "value");
  const int64_t B = query.size(0), L = query.size(1), S = key.size(1);
  KILN_CHECK(key.size(0) == B && value.size(0) == B && value.size(1) == S,
             "MultiheadAttention: query {}, key {} and value {} disagree on batch or key length",
             to_string(query.sizes()), to_string(key.sizes()), to_string(value.sizes()));

  Tensor q, k, v;
  if (same_tensor(query, key) && same_tensor(key, value)) {
    // Self-attention: one projection with the packed weight, then split.
    TensorList qkv = split(linear(query, in_proj_weight, in_proj_bias), {E, E, E}, -1);
    q = qkv[0], k = qkv[1], v = qkv[2];
  } else {
    TensorList w = split(in_proj_weight, {E, E, E}, 0);
    TensorList b = in_proj_bias.defined() ? split(in_proj_bias, {E, E, E}, 0)
                                          : TensorList{Tensor(), Tensor(), Tensor()};
    q = linear(query, w[0], b[0]);
    k = linear(key, w[1], b[1]);
    v = linear(value, w[2], b[2]);
  }
  // [B, len, E] -> [B, H, len, D]
  auto heads = [&](const Tensor& t, int64_t len) {
    return transpose(reshape(t, {B, len, H, D}), 1, 2);
  };

  // Masks become one mask broadcastable to [B, H, L, S]: bool "may attend" when both are bool
  // (PyTorch's bool masks mean "masked out", sdpa's mean "attend"), additive float otherwise.
  Tensor kpm, am;
  if (key_padding_mask.defined()) {
    KILN_CHECK(key_padding_mask.dim() == 2 && key_padding_mask.size(0) == B &&
                   key_padding_mask.size(1) == S,
               "MultiheadAttention: key_padding_mask must be [{}, {}], found {}", B, S,
               to_string(key_padding_mask.sizes()));
    kpm = reshape(key_padding_mask, {B, 1, 1, S});
  }
  if (attn_mask.defined()) {
    if (attn_mask.dim() == 2 && attn_mask.size(0) == L && attn_mask.size(1) == S) {
      am = reshape(attn_mask, {1, 1, L, S});
    } else {
      KILN_CHECK(attn_mask.dim() == 3 && attn_mask.size(0) == B * H && attn_mask.size(1) == L &&
                     attn_mask.size(2) == S,
                 "MultiheadAttention: attn_mask must be [{}, {}] or [{}, {}, {}], found {}", L, S,
                 B * H, L, S, to_string(attn_mask.sizes()));
      am = reshape(attn_mask, {B, H, L, S});
    }
  }
  auto is_bool = [](const Tensor& t) { return t.defined() && t.dtype() == DType::Bool; };
  Tensor mask;
  if ((!kpm.defined() || is_bool(kpm)) && (!am.defined() || is_bool(am))) {
    if (kpm.defined()) kpm = logical_not(kpm);
    if (am.defined()) am = logical_not(am);
    mask = kpm.defined() && am.defined() ? logical_and(kpm, am) : kpm.defined() ? kpm : am;
  } else {
    auto additive = [&](const Tensor& m) {
      if (!m.defined()) return m;
      if (is_bool(m))
        return where(m, scalar_like(-std::numeric_limits<double>::infinity(), query),
                     scalar_like(0.0, query));
      return m.dtype() == query.dtype() ? m : cast(m, query.dtype());
    };
    kpm = additive(kpm);
    am = additive(am);
    mask = kpm.defined() && am.defined() ? add(kpm, am) : kpm.defined() ? kpm : am;
  }

  Tensor o = scaled_dot_product_attention(heads(q, L), heads(k, S), heads(v, S), mask);
  return out_proj->forward(reshape(transpose(o, 1, 2), {B, L, E}));
}

TensorList MultiheadAttention::call(const TensorList& in) {
  check_num_inputs(in, 3, 5);
  return {forward(in[0], in[1], in[2], in.size() > 3 ? in[3] : Tensor(),
                  in.size() > 4 ? in[4] : Tensor())};
}

std::string MultiheadAttention::extra_repr() const {
  return fmt::format("embed_dim={}, num_heads={}, batch_first=true", embed_dim, num_heads);
}

// ---- Sequential -------------------------------------------------------------------------------
Sequential::Sequential(std::initializer_list<ModulePtr> modules) : UnaryModule("Sequential") {
  for (const auto& m : modules) push_back(m);
}
Tensor Sequential::forward(const Tensor& x) {
  TensorList out = call({x});
  KILN_CHECK(out.size() == 1, "Sequential: forward(x) needs one output, the last module gave {}",
             out.size());
  return out[0];
}
TensorList Sequential::call(const TensorList& inputs) {
  TensorList cur = inputs;
  for (const auto& m : modules_) cur = m->call(cur);
  return cur;
}

}  // namespace kiln::nn
