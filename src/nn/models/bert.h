// BERT (HuggingFace transformers BertModel architecture and state_dict names): word + position
// + token-type embeddings with LayerNorm, post-LN encoder layers (self-attention, intermediate
// GELU (erf), output), tanh pooler on the first token.
#pragma once
#include <memory>

#include "nn/layers.h"

namespace kiln::nn::models {

struct BertConfig {
  int64_t vocab_size = 30522, hidden_size = 768, num_hidden_layers = 12,
          num_attention_heads = 12, intermediate_size = 3072, max_position_embeddings = 512,
          type_vocab_size = 2;
  double layer_norm_eps = 1e-12;
};

class BertEmbeddings : public Module {
 public:
  BertEmbeddings(const BertConfig& c, Generator& gen);
  // input_ids [B, L] (int64/int32) -> [B, L, hidden]; token types are all 0 (segment A).
  Tensor forward(const Tensor& input_ids);

  std::shared_ptr<Embedding> word_embeddings, position_embeddings, token_type_embeddings;
  std::shared_ptr<kiln::nn::LayerNorm> LayerNorm;  // named as in HF
  std::shared_ptr<Dropout> dropout;
  ParamRef position_ids, token_type_ids;  // non-persistent buffers [1, max_position_embeddings]
};

class BertSelfAttention : public Module {
 public:
  BertSelfAttention(const BertConfig& c, Generator& gen);
  // x [B, L, H]; mask: additive, broadcastable to [B, heads, L, L], or undefined.
  Tensor forward(const Tensor& x, const Tensor& mask);

  int64_t num_heads, head_dim;
  std::shared_ptr<Linear> query, key, value;
  std::shared_ptr<Dropout> dropout;
};

// dense -> dropout -> LayerNorm(x + residual); used after attention and after intermediate.
class BertResidualOutput : public Module {
 public:
  BertResidualOutput(const char* type_name, int64_t in, const BertConfig& c, Generator& gen);
  Tensor forward(const Tensor& x, const Tensor& residual);

  std::shared_ptr<Linear> dense;
  std::shared_ptr<kiln::nn::LayerNorm> LayerNorm;
  std::shared_ptr<Dropout> dropout;
};

class BertAttention : public Module {
 public:
  BertAttention(const BertConfig& c, Generator& gen);
  Tensor forward(const Tensor& x, const Tensor& mask);

  std::shared_ptr<BertSelfAttention> self;
  std::shared_ptr<BertResidualOutput> output;
};

class BertIntermediate : public UnaryModule {
 public:
  BertIntermediate(const BertConfig& c, Generator& gen);
  Tensor forward(const Tensor& x) override;  // dense -> GELU (erf)

  std::shared_ptr<Linear> dense;
};

class BertLayer : public Module {
 public:
  BertLayer(const BertConfig& c, Generator& gen);
  Tensor forward(const Tensor& x, const Tensor& mask);

  std::shared_ptr<BertAttention> attention;
  std::shared_ptr<BertIntermediate> intermediate;
  std::shared_ptr<BertResidualOutput> output;
};

class BertPooler : public UnaryModule {
 public:
  BertPooler(const BertConfig& c, Generator& gen);
  Tensor forward(const Tensor& hidden) override;  // tanh(dense(hidden[:, 0]))

  std::shared_ptr<Linear> dense;
};

// call({input_ids [B, L] int64[, attention_mask [B, L] (1 = token, 0 = padding)]}) ->
// {last_hidden_state [B, L, hidden], pooler_output [B, hidden]}.
class BertModel : public Module {
 public:
  struct Output {
    Tensor last_hidden_state, pooler_output;
  };
  BertModel(const BertConfig& c, Generator& gen);
  Output forward(const Tensor& input_ids, const Tensor& attention_mask = Tensor());
  TensorList call(const TensorList& inputs) override;

  BertConfig config;
  std::shared_ptr<BertEmbeddings> embeddings;
  std::shared_ptr<Module> encoder;  // holds "layer" (a Sequential of BertLayer)
  std::vector<std::shared_ptr<BertLayer>> layers;
  std::shared_ptr<BertPooler> pooler;
};

std::shared_ptr<BertModel> bert_base(Generator& gen);

}  // namespace kiln::nn::models
