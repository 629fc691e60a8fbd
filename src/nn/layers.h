// Standard layers: the PyTorch modules of the same names, with the same parameter names and
// (inference) semantics. Initialization is deterministic from a Generator (default:
// default_generator()); see each constructor for the distribution.
//
// Note [Random init]
// Weights follow PyTorch's defaults (Kaiming-uniform, uniform bias). Normalization layers do
// not start at the identity (ones / zeros) as in PyTorch: their statistics and affine
// parameters are random but sensible (mean ~ N(0, 0.1), var ~ U(0.5, 1.5), weight ~ U(0.5, 1.5),
// bias ~ N(0, 0.1)), so that conv+BN folding and the numerics of every term are exercised by
// tests on freshly built models. Nothing starts at all zeros.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "nn/init.h"
#include "nn/module.h"

namespace kiln::nn {

// y = x W^T + b. weight [out, in] ~ Kaiming-uniform; bias [out] ~ U(+-1/sqrt(in)).
class Linear : public UnaryModule {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true,
         Generator& gen = default_generator());
  Tensor forward(const Tensor& x) override;

  int64_t in_features, out_features;
  ParamRef weight, bias;  // bias undefined when disabled

 protected:
  std::string extra_repr() const override;
};

struct Conv2dOptions {
  int64_t in_channels = 0, out_channels = 0;
  std::vector<int64_t> kernel_size = {1, 1};
  std::vector<int64_t> stride = {1, 1};
  std::vector<int64_t> padding = {0, 0};
  std::vector<int64_t> dilation = {1, 1};
  int64_t groups = 1;
  bool bias = true;
};

// NCHW convolution. weight [out, in/groups, kh, kw] ~ Kaiming-uniform; bias ~ U(+-1/sqrt(fan_in)).
class Conv2d : public UnaryModule {
 public:
  explicit Conv2d(const Conv2dOptions& options, Generator& gen = default_generator());
  Tensor forward(const Tensor& x) override;

  Conv2dOptions options;
  ParamRef weight, bias;

 protected:
  std::string extra_repr() const override;
};

// Batch norm over dim 1 with running statistics (inference). Buffers running_mean,
// running_var, num_batches_tracked (int64, as in PyTorch's state_dict). Training mode is not
// supported yet: forward() throws NotSupported and says to call eval().
class BatchNorm2d : public UnaryModule {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, bool affine = true,
                       Generator& gen = default_generator());
  Tensor forward(const Tensor& x) override;

  int64_t num_features;
  double eps;
  ParamRef weight, bias, running_mean, running_var, num_batches_tracked;

 protected:
  std::string extra_repr() const override;
};

// Normalizes over the trailing normalized_shape dims.
class LayerNorm : public UnaryModule {
 public:
  explicit LayerNorm(std::vector<int64_t> normalized_shape, double eps = 1e-5,
                     bool elementwise_affine = true, Generator& gen = default_generator());
  Tensor forward(const Tensor& x) override;

  std::vector<int64_t> normalized_shape;
  double eps;
  ParamRef weight, bias;

 protected:
  std::string extra_repr() const override;
};

class GroupNorm : public UnaryModule {
 public:
  GroupNorm(int64_t num_groups, int64_t num_channels, double eps = 1e-5, bool affine = true,
            Generator& gen = default_generator());
  Tensor forward(const Tensor& x) override;

  int64_t num_groups, num_channels;
  double eps;
  ParamRef weight, bias;

 protected:
  std::string extra_repr() const override;
};

class ReLU : public UnaryModule {
 public:
  ReLU() : UnaryModule("ReLU") {}
  Tensor forward(const Tensor& x) override;
};

// approximate: "none" (erf) or "tanh".
class GELU : public UnaryModule {
 public:
  explicit GELU(std::string approximate = "none");
  Tensor forward(const Tensor& x) override;
  std::string approximate;

 protected:
  std::string extra_repr() const override;
};

class SiLU : public UnaryModule {
 public:
  SiLU() : UnaryModule("SiLU") {}
  Tensor forward(const Tensor& x) override;
};

class Tanh : public UnaryModule {
 public:
  Tanh() : UnaryModule("Tanh") {}
  Tensor forward(const Tensor& x) override;
};

class Identity : public UnaryModule {
 public:
  Identity() : UnaryModule("Identity") {}
  Tensor forward(const Tensor& x) override { return x; }
};

struct Pool2dOptions {
  std::vector<int64_t> kernel_size = {1, 1};
  std::vector<int64_t> stride = {};  // empty = kernel_size
  std::vector<int64_t> padding = {0, 0};
  std::vector<int64_t> dilation = {1, 1};  // max pooling only
  bool ceil_mode = false;
  bool count_include_pad = true;  // average pooling only
};

class MaxPool2d : public UnaryModule {
 public:
  explicit MaxPool2d(const Pool2dOptions& options);
  Tensor forward(const Tensor& x) override;
  Pool2dOptions options;

 protected:
  std::string extra_repr() const override;
};

class AvgPool2d : public UnaryModule {
 public:
  explicit AvgPool2d(const Pool2dOptions& options);
  Tensor forward(const Tensor& x) override;
  Pool2dOptions options;

 protected:
  std::string extra_repr() const override;
};

class AdaptiveAvgPool2d : public UnaryModule {
 public:
  explicit AdaptiveAvgPool2d(std::vector<int64_t> output_size);
  Tensor forward(const Tensor& x) override;
  std::vector<int64_t> output_size;

 protected:
  std::string extra_repr() const override;
};

// Identity at inference. Training-mode dropout (p > 0) needs random masks in the graph, which
// arrive with training support: forward() in training mode throws NotSupported.
class Dropout : public UnaryModule {
 public:
  explicit Dropout(double p = 0.5);
  Tensor forward(const Tensor& x) override;
  double p;

 protected:
  std::string extra_repr() const override;
};

class Flatten : public UnaryModule {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1);
  Tensor forward(const Tensor& x) override;
  int64_t start_dim, end_dim;
};

// weight [num_embeddings, embedding_dim] ~ N(0, init_std) (PyTorch's default: 1); forward(ids)
// gathers rows: ids.shape + [embedding_dim].
class Embedding : public UnaryModule {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, Generator& gen = default_generator(),
            double init_std = 1.0);
  Tensor forward(const Tensor& indices) override;
  int64_t num_embeddings, embedding_dim;
  ParamRef weight;

 protected:
  std::string extra_repr() const override;
};

// torch.nn.MultiheadAttention with batch_first=True: query [B, L, E], key/value [B, S, E].
// Parameters as in PyTorch: in_proj_weight [3E, E] (q, k, v stacked; Xavier-uniform),
// in_proj_bias [3E], out_proj (Linear E -> E). Masks (both optional):
//   key_padding_mask [B, S]: bool (true = ignore that key) or float (added to the scores);
//   attn_mask [L, S] or [B * num_heads, L, S]: bool (true = not allowed) or float (added).
// Returns the attention output [B, L, E] (no attention weights: it runs
// kiln::scaled_dot_product_attention). call(): {query, key, value[, key_padding_mask
// [, attn_mask]]} with undefined tensors for absent masks.
class MultiheadAttention : public Module {
 public:
  MultiheadAttention(int64_t embed_dim, int64_t num_heads, bool bias = true,
                     Generator& gen = default_generator());
  Tensor forward(const Tensor& query, const Tensor& key, const Tensor& value,
                 const Tensor& key_padding_mask = Tensor(), const Tensor& attn_mask = Tensor());
  TensorList call(const TensorList& inputs) override;

  int64_t embed_dim, num_heads, head_dim;
  ParamRef in_proj_weight, in_proj_bias;
  std::shared_ptr<Linear> out_proj;

 protected:
  std::string extra_repr() const override;
};

// Runs its children in order; children are named "0", "1", ... (as torch.nn.Sequential) or
// given names, so state_dict names match. call() passes the whole input list through each child in turn.
class Sequential : public UnaryModule {
 public:
  Sequential() : UnaryModule("Sequential") {}
  Sequential(std::initializer_list<ModulePtr> modules);
  // Appends under the next index; returns the module.
  template <typename M>
  std::shared_ptr<M> push_back(std::shared_ptr<M> m) {
    register_module(std::to_string(modules_.size()), m);
    modules_.push_back(m);
    return m;
  }
  // Appends under an explicit name (torch's Sequential(OrderedDict(...))).
  template <typename M>
  std::shared_ptr<M> push_back(const std::string& name, std::shared_ptr<M> m) {
    register_module(name, m);
    modules_.push_back(m);
    return m;
  }
  Tensor forward(const Tensor& x) override;
  TensorList call(const TensorList& inputs) override;
  size_t size() const { return modules_.size(); }
  const ModulePtr& operator[](size_t i) const { return modules_.at(i); }

 private:
  std::vector<ModulePtr> modules_;
};

}  // namespace kiln::nn
