#include "nn/models/branchy.h"

#include "ops/api.h"
#include "ops/cond.h"

namespace kiln::nn::models {

Branchy::Branchy(Generator& gen) : UnaryModule("Branchy") {
  fc1 = register_module("fc1", std::make_shared<Linear>(16, 16, true, gen));
  fc2 = register_module("fc2", std::make_shared<Linear>(16, 16, true, gen));
}

Tensor Branchy::forward(const Tensor& x) {
  Tensor h = relu(fc1->forward(x));
  if (mean(h).item() > kThreshold) return fc2->forward(h);  // the graph break
  return h * -0.5 + 1.0;
}

std::shared_ptr<Branchy> branchy(Generator& gen) { return std::make_shared<Branchy>(gen); }

BranchyCond::BranchyCond(Generator& gen) : UnaryModule("BranchyCond") {
  fc1 = register_module("fc1", std::make_shared<Linear>(16, 16, true, gen));
  fc2 = register_module("fc2", std::make_shared<Linear>(16, 16, true, gen));
}

Tensor BranchyCond::forward(const Tensor& x) {
  Tensor h = relu(fc1->forward(x));
  Tensor above = gt(mean(h), scalar_like(Branchy::kThreshold, h));
  return cond(
      above, [this](const TensorList& v) { return TensorList{fc2->forward(v[0])}; },
      [](const TensorList& v) { return TensorList{v[0] * -0.5 + 1.0}; }, {h})[0];
}

std::shared_ptr<BranchyCond> branchy_cond(Generator& gen) {
  return std::make_shared<BranchyCond>(gen);
}

}  // namespace kiln::nn::models
