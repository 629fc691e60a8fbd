// A small custom module, compiled with kiln::compile and checked against eager execution.
// Built against the installed tree (CMakeLists.txt here); CI runs it (tests/examples/).
#include <kiln/kiln.h>

#include <cmath>
#include <cstdio>
#include <memory>

namespace {

// y = linear2(gelu(layer_norm(linear1(x)))) + x: a residual MLP block.
class ResidualMlp : public kiln::nn::UnaryModule {
 public:
  ResidualMlp(int64_t dim, int64_t hidden) {
    fc1 = register_module("fc1", std::make_shared<kiln::nn::Linear>(dim, hidden));
    norm = register_module("norm", std::make_shared<kiln::nn::LayerNorm>(std::vector<int64_t>{hidden}));
    fc2 = register_module("fc2", std::make_shared<kiln::nn::Linear>(hidden, dim));
  }
  kiln::Tensor forward(const kiln::Tensor& x) override {
    kiln::Tensor h = kiln::gelu(norm->forward(fc1->forward(x)));
    return kiln::add(fc2->forward(h), x);
  }

 private:
  std::shared_ptr<kiln::nn::Linear> fc1, fc2;
  std::shared_ptr<kiln::nn::LayerNorm> norm;
};

}  // namespace

int main() {
  try {
    auto model = std::make_shared<ResidualMlp>(16, 64);
    model->eval();
    kiln::CompiledFunction compiled = kiln::compile(model);  // the compiler, default mode
    kiln::Generator gen(2024);
    double worst = 0;
    for (int call = 0; call < 3; ++call) {  // fresh inputs every call: the compiled entry replays
      kiln::Tensor x = kiln::Tensor::randn({8, 16}, gen);
      kiln::Tensor want = model->forward(x);
      kiln::Tensor got = compiled({x})[0];
      std::vector<float> a = got.to_vector<float>(), b = want.to_vector<float>();
      if (a.size() != b.size()) {
        std::fprintf(stderr, "kiln_example: %zu outputs, expected %zu\n", a.size(), b.size());
        return 1;
      }
      double scale = 0;
      for (size_t i = 0; i < a.size(); ++i) {
        double d = std::fabs(double(a[i]) - double(b[i]));
        if (!(d <= 1e30)) {  // NaN or infinity
          std::fprintf(stderr, "kiln_example: element %zu is %g, eager %g\n", i, a[i], b[i]);
          return 1;
        }
        worst = std::max(worst, d);
        scale = std::max(scale, std::fabs(double(b[i])));
      }
      if (worst > 1e-4 * std::max(scale, 1.0)) {
        std::fprintf(stderr, "kiln_example: compiled differs from eager by %g (scale %g)\n", worst, scale);
        return 1;
      }
    }
    kiln::ExplainReport r = compiled.report();
    if (r.graphs.empty() || !r.fallbacks.empty()) {  // interpreted eagerly: not what we asked for
      std::fprintf(stderr, "kiln_example: the module was not compiled: %s\n",
                   r.fallbacks.empty() ? "no graph was captured" : r.fallbacks[0].c_str());
      return 1;
    }
    std::printf("kiln %s: compiled ResidualMlp matches eager (max |diff| %.3g); %s\n", kiln::kVersion,
                worst, r.graphs[0].backend_summary.substr(0, 80).c_str());
    return 0;
  } catch (const kiln::Error& e) {
    std::fprintf(stderr, "kiln_example: %s\n", e.what());
    return 1;
  }
}
