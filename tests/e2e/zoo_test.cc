// Every zoo model: builds with torchvision / HuggingFace parameter names and counts, runs on its
// example inputs with the right output shapes and finite values, and is deterministic (the same
// seed gives bitwise-identical weights, inputs and outputs).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>

#include "../support/compare.h"
#include "ops/api.h"
#include "nn/models/bert.h"
#include "nn/models/zoo.h"

namespace kiln::nn {
namespace {

bool bitwise_equal(const Tensor& a, const Tensor& b) {
  if (a.sizes() != b.sizes() || a.dtype() != b.dtype()) return false;
  Tensor ca = a.contiguous(), cb = b.contiguous();
  return std::memcmp(ca.raw_data(), cb.raw_data(), ca.nbytes()) == 0;
}

struct Expected {
  int64_t batch;
  int64_t params;                // torchvision / HuggingFace parameter counts
  std::vector<Dims> outputs;
  std::map<std::string, Dims> some_keys;  // state_dict entries that must exist, with shapes
};

const std::map<std::string, Expected>& expectations() {
  static const std::map<std::string, Expected> e = {
      {"mlp", {3, 601, {{3, 1}}, {{"0.weight", {50, 10}}, {"2.bias", {1}}}}},
      {"vfe",
       {2, 9536, {{2, 64, 56, 56}},
        {{"0.weight", {64, 3, 7, 7}}, {"1.running_var", {64}}, {"1.num_batches_tracked", {}}}}},
      {"resnet18",
       {2, 11689512, {{2, 1000}},
        {{"conv1.weight", {64, 3, 7, 7}},
         {"layer1.0.bn1.running_mean", {64}},
         {"layer2.0.downsample.0.weight", {128, 64, 1, 1}},
         {"layer4.1.conv2.weight", {512, 512, 3, 3}},
         {"fc.weight", {1000, 512}}}}},
      {"resnet50",
       {1, 25557032, {{1, 1000}},
        {{"layer1.0.downsample.1.running_var", {256}},
         {"layer3.5.conv3.weight", {1024, 256, 1, 1}},
         {"layer4.2.bn3.bias", {2048}},
         {"fc.weight", {1000, 2048}}}}},
      {"vit_b_16",
       {1, 86567656, {{1, 1000}},
        {{"class_token", {1, 1, 768}},
         {"conv_proj.weight", {768, 3, 16, 16}},
         {"encoder.pos_embedding", {1, 197, 768}},
         {"encoder.layers.encoder_layer_0.self_attention.in_proj_weight", {2304, 768}},
         {"encoder.layers.encoder_layer_11.self_attention.out_proj.bias", {768}},
         {"encoder.layers.encoder_layer_3.mlp.0.weight", {3072, 768}},
         {"encoder.layers.encoder_layer_3.mlp.3.weight", {768, 3072}},
         {"encoder.ln.weight", {768}},
         {"heads.head.weight", {1000, 768}}}}},
      {"bert_base",
       {2, 109482240, {{2, 128, 768}, {2, 768}},
        {{"embeddings.word_embeddings.weight", {30522, 768}},
         {"embeddings.position_embeddings.weight", {512, 768}},
         {"embeddings.token_type_embeddings.weight", {2, 768}},
         {"embeddings.LayerNorm.weight", {768}},
         {"encoder.layer.0.attention.self.query.weight", {768, 768}},
         {"encoder.layer.11.attention.output.LayerNorm.bias", {768}},
         {"encoder.layer.5.intermediate.dense.weight", {3072, 768}},
         {"encoder.layer.5.output.dense.weight", {768, 3072}},
         {"pooler.dense.bias", {768}}}}},
      // Linear 16->16 twice: 2 * (256 + 16)
      {"branchy", {2, 544, {{2, 16}}, {{"fc1.weight", {16, 16}}, {"fc2.bias", {16}}}}},
      {"branchy_cond", {2, 544, {{2, 16}}, {{"fc1.weight", {16, 16}}, {"fc2.bias", {16}}}}},
  };
  return e;
}

class Zoo : public ::testing::TestWithParam<std::string> {};

TEST_P(Zoo, BuildsRunsAndIsDeterministic) {
  const std::string name = GetParam();
  ASSERT_TRUE(expectations().count(name)) << "no expectations for zoo model " << name;
  const Expected& ex = expectations().at(name);

  ZooModel a = make_zoo_model(name, ex.batch, /*seed=*/5);
  EXPECT_EQ(a.name, name);
  EXPECT_FALSE(a.module->is_training());
  EXPECT_EQ(a.module->num_parameters(), ex.params);
  NamedTensors sd = a.module->state_dict();
  std::map<std::string, Tensor> by_name(sd.begin(), sd.end());
  for (const auto& [key, dims] : ex.some_keys) {
    ASSERT_TRUE(by_name.count(key)) << name << ": state_dict lacks " << key;
    EXPECT_EQ(by_name[key].sizes(), dims) << name << ": " << key;
  }

  // Example inputs follow the zoo's specs.
  std::vector<ZooInputSpec> specs = zoo_input_specs(name, ex.batch);
  ASSERT_EQ(a.inputs.size(), specs.size());
  ASSERT_EQ(a.input_names.size(), specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    EXPECT_EQ(a.inputs[i].sizes(), specs[i].shape) << specs[i].name;
    EXPECT_EQ(a.inputs[i].dtype(), specs[i].dtype) << specs[i].name;
    EXPECT_EQ(a.input_names[i], specs[i].name);
  }

  TensorList out = a.module->call(a.inputs);
  ASSERT_EQ(out.size(), ex.outputs.size());
  ASSERT_EQ(a.output_names.size(), ex.outputs.size());
  for (size_t i = 0; i < out.size(); ++i) {
    EXPECT_EQ(out[i].sizes(), ex.outputs[i]) << name << " output " << a.output_names[i];
    std::vector<double> v = out[i].to_vector<double>();
    double sum_abs = 0;
    for (double x : v) {
      ASSERT_TRUE(std::isfinite(x)) << name << " output " << a.output_names[i];
      sum_abs += std::fabs(x);
    }
    EXPECT_GT(sum_abs / double(v.size()), 1e-6) << name << ": output is all zeros";
  }

  // Same seed: the same weights, inputs and outputs, bit for bit.
  ZooModel b = make_zoo_model(name, ex.batch, /*seed=*/5);
  NamedTensors sd_b = b.module->state_dict();
  for (size_t i = 0; i < sd.size(); ++i)
    ASSERT_TRUE(bitwise_equal(sd[i].second, sd_b[i].second)) << name << ": " << sd[i].first;
  TensorList inputs_only = zoo_example_inputs(name, ex.batch, /*seed=*/5);
  for (size_t i = 0; i < a.inputs.size(); ++i) {
    ASSERT_TRUE(bitwise_equal(a.inputs[i], b.inputs[i])) << name << ": input " << i;
    ASSERT_TRUE(bitwise_equal(a.inputs[i], inputs_only[i])) << name << ": input " << i;
  }
  TensorList out_b = b.module->call(b.inputs);
  for (size_t i = 0; i < out.size(); ++i)
    EXPECT_TRUE(bitwise_equal(out[i], out_b[i])) << name << ": output " << i << " differs";

  // A different seed gives different weights and inputs.
  ZooModel c = make_zoo_model(name, ex.batch, /*seed=*/6);
  EXPECT_FALSE(bitwise_equal(sd[0].second, c.module->state_dict()[0].second)) << name;
  EXPECT_FALSE(bitwise_equal(a.inputs[0], c.inputs[0])) << name;
}

std::vector<std::string> zoo_names() {
  std::vector<std::string> names;
  for (const auto& e : zoo_models()) names.push_back(e.name);
  return names;
}

INSTANTIATE_TEST_SUITE_P(AllModels, Zoo, ::testing::ValuesIn(zoo_names()),
                         [](const auto& info) { return info.param; });

TEST(ZooRegistry, ListsEveryModelOnceWithInputs) {
  std::vector<std::string> names = zoo_names();
  EXPECT_EQ(names, (std::vector<std::string>{"mlp", "vfe", "resnet18", "resnet50", "vit_b_16",
                                             "bert_base", "branchy", "branchy_cond"}));
  for (const auto& e : zoo_models()) {
    EXPECT_FALSE(e.description.empty()) << e.name;
    EXPECT_FALSE(e.inputs.empty()) << e.name;
    EXPECT_FALSE(e.outputs.empty()) << e.name;
    EXPECT_EQ(expectations().count(e.name), 1u) << e.name;
  }
  EXPECT_EQ(zoo_input_specs("bert_base", 4)[1].shape, (Dims{4, 128}));
  try {
    make_zoo_model("resnet101");
    ADD_FAILURE() << "unknown model built";
  } catch (const Error& e) {
    std::string m = e.message();
    EXPECT_NE(m.find("'resnet101'"), std::string::npos) << m;
    for (const auto& n : names) EXPECT_NE(m.find(n), std::string::npos) << m;
  }
  EXPECT_THROW(make_zoo_model("mlp", 0), Error);
}

TEST(ZooRegistry, BertMaskHasTrailingPadding) {
  TensorList inputs = zoo_example_inputs("bert_base", 3, 9);
  std::vector<int64_t> ids = inputs[0].to_vector<int64_t>(), mask = inputs[1].to_vector<int64_t>();
  for (int64_t b = 0; b < 3; ++b) {
    int64_t len = 0;
    while (len < 128 && mask[size_t(b * 128 + len)] == 1) ++len;
    EXPECT_GE(len, 64);
    EXPECT_LT(len, 128) << "no padding in row " << b;
    for (int64_t i = len; i < 128; ++i) {
      EXPECT_EQ(mask[size_t(b * 128 + i)], 0) << "mask not a prefix in row " << b;
      EXPECT_EQ(ids[size_t(b * 128 + i)], 0);
    }
    for (int64_t i = 1; i < len; ++i) EXPECT_GE(ids[size_t(b * 128 + i)], 1000);
  }
}

TEST(Bert, PaddedTokensDoNotLeakIntoRealOnes) {
  // A small BERT: changing the ids at masked positions leaves the outputs at real positions
  // unchanged; without the mask they would change.
  models::BertConfig c;
  c.vocab_size = 500, c.hidden_size = 32, c.num_hidden_layers = 2, c.num_attention_heads = 4,
  c.intermediate_size = 64, c.max_position_embeddings = 40;
  Generator gen(3);
  auto bert = std::make_shared<models::BertModel>(c, gen);
  bert->eval();
  const int64_t B = 2, L = 12, len = 8;
  Tensor ids = Tensor::randint({B, L}, gen, 1, 500);
  Tensor mask = Tensor::ones({B, L}, DType::Int64);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = len; i < L; ++i) mask.data<int64_t>()[b * L + i] = 0;
  Tensor ids2 = ids.clone();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = len; i < L; ++i) ids2.data<int64_t>()[b * L + i] = (ids2.data<int64_t>()[b * L + i] + 7) % 500;

  auto real = [&](const Tensor& h) { return slice(h, 1, 0, len).to_vector<double>(); };
  auto o1 = bert->forward(ids, mask), o2 = bert->forward(ids2, mask);
  std::vector<double> r1 = real(o1.last_hidden_state), r2 = real(o2.last_hidden_state);
  ASSERT_TRUE(test::close(r2, r1, test::Tolerance::rel(0, 1e-6)));
  std::vector<double> p1 = o1.pooler_output.to_vector<double>(), p2 = o2.pooler_output.to_vector<double>();
  ASSERT_TRUE(test::close(p2, p1, test::Tolerance::rel(0, 1e-6)));
  // Unmasked, the same change is visible at the real positions.
  std::vector<double> u1 = real(bert->forward(ids).last_hidden_state),
                      u2 = real(bert->forward(ids2).last_hidden_state);
  test::Comparison d = test::compare(u2, u1, test::Tolerance::exact());
  EXPECT_EQ(d.nan_got_only + d.nan_ref_only + d.inf_mismatches, 0) << d.str();
  EXPECT_GT(d.worst_diff, 1e-3) << d.str();

  EXPECT_THROW(bert->forward(Tensor::randint({1, 41}, gen, 1, 500)), Error);  // > max positions
  EXPECT_THROW(bert->forward(ids, Tensor::ones({B, L + 1}, DType::Int64)), Error);
}

}  // namespace
}  // namespace kiln::nn
