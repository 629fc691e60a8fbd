// `branchy`: a small model whose forward reads a tensor value on the host and branches on it —
// one graph break under capture. Used by the capture tests and `kiln explain branchy`.
// `branchy_cond`: the same model with the branch written as kiln::cond (ops/cond.h): one graph,
// both branches computed and selected, so it compiles whole and packages.
#pragma once
#include "nn/layers.h"

namespace kiln::nn::models {

class Branchy : public UnaryModule {
 public:
  explicit Branchy(Generator& gen);
  // h = relu(fc1(x)); if mean(h) > 0.25 (a host read): fc2(h) else -h * 0.5 + 1
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<Linear> fc1, fc2;
  static constexpr double kThreshold = 0.25;
};

std::shared_ptr<Branchy> branchy(Generator& gen);

class BranchyCond : public UnaryModule {
 public:
  explicit BranchyCond(Generator& gen);
  // h = relu(fc1(x)); cond(mean(h) > 0.25, fc2(h), -h * 0.5 + 1)
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<Linear> fc1, fc2;
};

std::shared_ptr<BranchyCond> branchy_cond(Generator& gen);

}  // namespace kiln::nn::models
