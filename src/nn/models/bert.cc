// BERT-base, following transformers.models.bert.modeling_bert (inference path).
#include "nn/models/bert.h"

#include <limits>

#include "ops/api.h"

namespace kiln::nn::models {

namespace {
std::shared_ptr<kiln::nn::LayerNorm> make_ln(const BertConfig& c, Generator& gen) {
  return std::make_shared<kiln::nn::LayerNorm>(std::vector<int64_t>{c.hidden_size},
                                               c.layer_norm_eps, true, gen);
}
}  // namespace

BertEmbeddings::BertEmbeddings(const BertConfig& c, Generator& gen) : Module("BertEmbeddings") {
  // HF initializes embeddings with N(0, 0.02); N(0, 1) rows would swamp the sum.
  auto emb = [&](int64_t n) { return std::make_shared<Embedding>(n, c.hidden_size, gen, 0.02); };
  word_embeddings = register_module("word_embeddings", emb(c.vocab_size));
  position_embeddings = register_module("position_embeddings", emb(c.max_position_embeddings));
  token_type_embeddings = register_module("token_type_embeddings", emb(c.type_vocab_size));
  LayerNorm = register_module("LayerNorm", make_ln(c, gen));
  dropout = register_module("dropout", std::make_shared<Dropout>(0.1));
  Tensor pos = Tensor::empty({1, c.max_position_embeddings}, DType::Int64);
  for (int64_t i = 0; i < c.max_position_embeddings; ++i) pos.data<int64_t>()[i] = i;
  position_ids = register_buffer("position_ids", pos, /*persistent=*/false);
  token_type_ids = register_buffer("token_type_ids",
                                   Tensor::zeros({1, c.max_position_embeddings}, DType::Int64),
                                   /*persistent=*/false);
}

Tensor BertEmbeddings::forward(const Tensor& ids) {
  const int64_t L = ids.size(1);
  Tensor pos = slice(position_ids, 1, 0, L);
  Tensor types = slice(token_type_ids, 1, 0, L);
  // [B, L, H] + [1, L, H] + [1, L, H]
  Tensor x = add(add(word_embeddings->forward(ids), token_type_embeddings->forward(types)),
                 position_embeddings->forward(pos));
  return dropout->forward(LayerNorm->forward(x));
}

BertSelfAttention::BertSelfAttention(const BertConfig& c, Generator& gen)
    : Module("BertSelfAttention"),
      num_heads(c.num_attention_heads),
      head_dim(c.hidden_size / c.num_attention_heads) {
  KILN_CHECK(c.hidden_size % c.num_attention_heads == 0,
             "BertSelfAttention: hidden_size {} is not a multiple of num_attention_heads {}",
             c.hidden_size, c.num_attention_heads);
  query = register_module("query", std::make_shared<Linear>(c.hidden_size, c.hidden_size, true, gen));
  key = register_module("key", std::make_shared<Linear>(c.hidden_size, c.hidden_size, true, gen));
  value = register_module("value", std::make_shared<Linear>(c.hidden_size, c.hidden_size, true, gen));
  dropout = register_module("dropout", std::make_shared<Dropout>(0.1));
}

Tensor BertSelfAttention::forward(const Tensor& x, const Tensor& mask) {
  const int64_t B = x.size(0), L = x.size(1);
  auto heads = [&](const Tensor& t) {
    return transpose(reshape(t, {B, L, num_heads, head_dim}), 1, 2);  // [B, heads, L, d]
  };
  Tensor o = scaled_dot_product_attention(heads(query->forward(x)), heads(key->forward(x)),
                                          heads(value->forward(x)), mask);
  return reshape(transpose(o, 1, 2), {B, L, num_heads * head_dim});
}

BertResidualOutput::BertResidualOutput(const char* type_name, int64_t in, const BertConfig& c,
                                       Generator& gen)
    : Module(type_name) {
  dense = register_module("dense", std::make_shared<Linear>(in, c.hidden_size, true, gen));
  LayerNorm = register_module("LayerNorm", make_ln(c, gen));
  dropout = register_module("dropout", std::make_shared<Dropout>(0.1));
}
Tensor BertResidualOutput::forward(const Tensor& x, const Tensor& residual) {
  return LayerNorm->forward(add(dropout->forward(dense->forward(x)), residual));
}

BertAttention::BertAttention(const BertConfig& c, Generator& gen) : Module("BertAttention") {
  self = register_module("self", std::make_shared<BertSelfAttention>(c, gen));
  output = register_module(
      "output", std::make_shared<BertResidualOutput>("BertSelfOutput", c.hidden_size, c, gen));
}
Tensor BertAttention::forward(const Tensor& x, const Tensor& mask) {
  return output->forward(self->forward(x, mask), x);
}

BertIntermediate::BertIntermediate(const BertConfig& c, Generator& gen)
    : UnaryModule("BertIntermediate") {
  dense = register_module("dense",
                          std::make_shared<Linear>(c.hidden_size, c.intermediate_size, true, gen));
}
Tensor BertIntermediate::forward(const Tensor& x) { return gelu(dense->forward(x)); }

BertLayer::BertLayer(const BertConfig& c, Generator& gen) : Module("BertLayer") {
  attention = register_module("attention", std::make_shared<BertAttention>(c, gen));
  intermediate = register_module("intermediate", std::make_shared<BertIntermediate>(c, gen));
  output = register_module(
      "output", std::make_shared<BertResidualOutput>("BertOutput", c.intermediate_size, c, gen));
}
Tensor BertLayer::forward(const Tensor& x, const Tensor& mask) {
  Tensor a = attention->forward(x, mask);
  return output->forward(intermediate->forward(a), a);
}

BertPooler::BertPooler(const BertConfig& c, Generator& gen) : UnaryModule("BertPooler") {
  dense = register_module("dense", std::make_shared<Linear>(c.hidden_size, c.hidden_size, true, gen));
}
Tensor BertPooler::forward(const Tensor& hidden) {
  Tensor first = reshape(slice(hidden, 1, 0, 1), {hidden.size(0), hidden.size(2)});
  return tanh(dense->forward(first));
}

BertModel::BertModel(const BertConfig& c, Generator& gen) : Module("BertModel"), config(c) {
  embeddings = register_module("embeddings", std::make_shared<BertEmbeddings>(c, gen));
  encoder = register_module("encoder", std::make_shared<Module>("BertEncoder"));
  auto layer = encoder->register_module("layer", std::make_shared<Module>("ModuleList"));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i)
    layers.push_back(
        layer->register_module(std::to_string(i), std::make_shared<BertLayer>(c, gen)));
  pooler = register_module("pooler", std::make_shared<BertPooler>(c, gen));
}

BertModel::Output BertModel::forward(const Tensor& ids, const Tensor& attention_mask) {
  KILN_CHECK(ids.defined() && ids.dim() == 2 && is_integral(ids.dtype()),
             "BertModel: input_ids must be an integer tensor [batch, seq], found {}",
             ids.defined() ? ids.type().str() : "undefined");
  const int64_t B = ids.size(0), L = ids.size(1);
  KILN_CHECK(L <= config.max_position_embeddings,
             "BertModel: sequence length {} exceeds max_position_embeddings {}", L,
             config.max_position_embeddings);
  Tensor mask;
  if (attention_mask.defined()) {
    KILN_CHECK(attention_mask.dim() == 2 && attention_mask.size(0) == B &&
                   attention_mask.size(1) == L,
               "BertModel: attention_mask must be [{}, {}] like input_ids, found {}", B, L,
               to_string(attention_mask.sizes()));
    // HF's extended mask: (1 - mask) * finfo(float32).min, as [B, 1, 1, L] over the keys.
    Tensor m = reshape(cast(attention_mask, DType::Float32), {B, 1, 1, L});
    mask = mul(sub(scalar_like(1.0, m), m), double(std::numeric_limits<float>::lowest()));
  }
  Tensor h = embeddings->forward(ids);
  for (const auto& layer : layers) h = layer->forward(h, mask);
  return {h, pooler->forward(h)};
}

TensorList BertModel::call(const TensorList& inputs) {
  check_num_inputs(inputs, 1, 2);
  Output o = forward(inputs[0], inputs.size() > 1 ? inputs[1] : Tensor());
  return {o.last_hidden_state, o.pooler_output};
}

std::shared_ptr<BertModel> bert_base(Generator& gen) {
  return std::make_shared<BertModel>(BertConfig{}, gen);
}

}  // namespace kiln::nn::models
