// The zoo registry: mlp, vfe, resnet18, resnet50, vit_b_16, bert_base, branchy, branchy_cond.
#include "nn/models/zoo.h"

#include "nn/layers.h"
#include "nn/models/bert.h"
#include "nn/models/branchy.h"
#include "nn/models/resnet.h"
#include "nn/models/vit.h"

namespace kiln::nn {

namespace {

constexpr int64_t kBertSeqLen = 128;

struct ZooRecipe {
  ZooEntry entry;
  ModulePtr (*build)(Generator& gen);
};

ModulePtr build_mlp(Generator& gen) {
  auto m = std::make_shared<Sequential>();
  m->push_back(std::make_shared<Linear>(10, 50, true, gen));
  m->push_back(std::make_shared<ReLU>());
  m->push_back(std::make_shared<Linear>(50, 1, true, gen));
  return m;
}

// The stem of a ResNet: a "visual front end" small enough to compile and inspect by hand.
ModulePtr build_vfe(Generator& gen) {
  auto m = std::make_shared<Sequential>();
  m->push_back(std::make_shared<Conv2d>(Conv2dOptions{.in_channels = 3,
                                                      .out_channels = 64,
                                                      .kernel_size = {7, 7},
                                                      .stride = {2, 2},
                                                      .padding = {3, 3},
                                                      .bias = false},
                                        gen));
  m->push_back(std::make_shared<BatchNorm2d>(64, 1e-5, true, gen));
  m->push_back(std::make_shared<ReLU>());
  m->push_back(std::make_shared<MaxPool2d>(
      Pool2dOptions{.kernel_size = {3, 3}, .stride = {2, 2}, .padding = {1, 1}}));
  return m;
}

const std::vector<ZooRecipe>& recipes() {
  const ZooInputSpec image{"x", {1, 3, 224, 224}, DType::Float32};
  static const std::vector<ZooRecipe> all = {
      {{"mlp", "two-layer perceptron: Linear 10->50, ReLU, Linear 50->1",
        {{"x", {1, 10}, DType::Float32}}, {"y"}},
       build_mlp},
      {{"vfe", "visual front end (ResNet stem): Conv2d 7x7/2 3->64, BatchNorm2d, ReLU, MaxPool 3/2",
        {image}, {"features"}},
       build_vfe},
      {{"resnet18", "torchvision ResNet-18 (BasicBlock [2,2,2,2]), 1000 classes", {image},
        {"logits"}},
       [](Generator& g) -> ModulePtr { return models::resnet18(g); }},
      {{"resnet50", "torchvision ResNet-50 (Bottleneck [3,4,6,3]), 1000 classes", {image},
        {"logits"}},
       [](Generator& g) -> ModulePtr { return models::resnet50(g); }},
      {{"vit_b_16", "torchvision ViT-B/16: 12 pre-LN layers, hidden 768, 12 heads, 1000 classes",
        {image}, {"logits"}},
       [](Generator& g) -> ModulePtr { return models::vit_b_16(g); }},
      {{"bert_base", "HuggingFace BertModel (bert-base-uncased): 12 layers, hidden 768, 12 heads",
        {{"input_ids", {1, kBertSeqLen}, DType::Int64},
         {"attention_mask", {1, kBertSeqLen}, DType::Int64}},
        {"last_hidden_state", "pooler_output"}},
       [](Generator& g) -> ModulePtr { return models::bert_base(g); }},
      {{"branchy", "Linear 16->16 + ReLU, then a host branch on mean(h) (one graph break)",
        {{"x", {1, 16}, DType::Float32}}, {"y"}},
       [](Generator& g) -> ModulePtr { return models::branchy(g); }},
      {{"branchy_cond", "branchy with its branch as kiln::cond: one graph, both branches selected",
        {{"x", {1, 16}, DType::Float32}}, {"y"}},
       [](Generator& g) -> ModulePtr { return models::branchy_cond(g); }},
  };
  return all;
}

const ZooRecipe& find_recipe(const std::string& name) {
  std::string names;
  for (const auto& r : recipes()) {
    if (r.entry.name == name) return r;
    names += (names.empty() ? "" : ", ") + r.entry.name;
  }
  fail("unknown zoo model '{}' (available: {})", name, names);
}

// Example inputs. Images: N(0, 1). BERT: random token ids after [CLS], then [PAD] (0) for a
// random tail of each row, with the attention mask 0 there.
TensorList example_inputs(const std::string& name, const std::vector<ZooInputSpec>& specs,
                          Generator& gen) {
  if (name == "bert_base") {
    const int64_t B = specs[0].shape[0], L = specs[0].shape[1];
    Tensor ids = Tensor::randint({B, L}, gen, 1000, 30522);
    Tensor mask = Tensor::ones({B, L}, DType::Int64);
    int64_t* id = ids.data<int64_t>();
    int64_t* m = mask.data<int64_t>();
    for (int64_t b = 0; b < B; ++b) {
      int64_t len = L / 2 + int64_t(gen.next_u64() % uint64_t(L / 2));  // in [L/2, L-1]
      id[b * L] = 101;  // [CLS]
      for (int64_t i = len; i < L; ++i) id[b * L + i] = 0, m[b * L + i] = 0;
    }
    return {ids, mask};
  }
  TensorList out;
  for (const auto& s : specs) out.push_back(Tensor::randn(s.shape, gen, s.dtype));
  return out;
}

}  // namespace

const std::vector<ZooEntry>& zoo_models() {
  static const std::vector<ZooEntry> entries = [] {
    std::vector<ZooEntry> e;
    for (const auto& r : recipes()) e.push_back(r.entry);
    return e;
  }();
  return entries;
}

std::vector<ZooInputSpec> zoo_input_specs(const std::string& name, int64_t batch) {
  KILN_CHECK(batch >= 1, "zoo model '{}': batch must be >= 1, found {}", name, batch);
  std::vector<ZooInputSpec> specs = find_recipe(name).entry.inputs;
  for (auto& s : specs) s.shape[0] = batch;
  return specs;
}

// A separate stream from the weights', so inputs do not depend on how many numbers the weights
// consumed.
static Generator input_generator(uint64_t seed) { return Generator(seed ^ 0x1f83d9abfb41bd6bull); }

TensorList zoo_example_inputs(const std::string& name, int64_t batch, uint64_t seed) {
  std::vector<ZooInputSpec> specs = zoo_input_specs(name, batch);
  Generator gen = input_generator(seed);
  return example_inputs(name, specs, gen);
}

ZooModel make_zoo_model(const std::string& name, int64_t batch, uint64_t seed) {
  const ZooRecipe& r = find_recipe(name);
  std::vector<ZooInputSpec> specs = zoo_input_specs(name, batch);
  ZooModel z;
  z.name = name;
  Generator weights(seed);
  z.module = r.build(weights);
  z.module->eval();
  Generator inputs = input_generator(seed);
  z.inputs = example_inputs(name, specs, inputs);
  for (const auto& s : specs) z.input_names.push_back(s.name);
  z.output_names = r.entry.outputs;
  return z;
}

}  // namespace kiln::nn
