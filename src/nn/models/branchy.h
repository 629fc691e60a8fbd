// `branchy`: a small model whose forward reads a tensor value on the host and branches on it —
// one graph break under capture. Used by the capture tests and `kiln explain branchy`.
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

}  // namespace kiln::nn::models
