// Vision Transformer (torchvision.models.VisionTransformer architecture and state_dict names):
// conv_proj patchify, class token, learned position embedding, pre-LN encoder blocks
// (LayerNorm eps 1e-6), MHA, MLP with GELU, final LayerNorm, linear head on the class token.
#pragma once
#include <memory>

#include "nn/layers.h"

namespace kiln::nn::models {

struct ViTConfig {
  int64_t image_size = 224, patch_size = 16;
  int64_t num_layers = 12, num_heads = 12, hidden_dim = 768, mlp_dim = 3072;
  int64_t num_classes = 1000;
};

class ViTEncoderBlock : public UnaryModule {
 public:
  ViTEncoderBlock(const ViTConfig& c, Generator& gen);
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<LayerNorm> ln_1, ln_2;
  std::shared_ptr<MultiheadAttention> self_attention;
  std::shared_ptr<Dropout> dropout;
  std::shared_ptr<Sequential> mlp;  // 0 Linear, 1 GELU, 2 Dropout, 3 Linear, 4 Dropout
};

class ViTEncoder : public UnaryModule {
 public:
  ViTEncoder(const ViTConfig& c, Generator& gen);
  Tensor forward(const Tensor& x) override;  // [B, seq, hidden] -> same

  ParamRef pos_embedding;  // [1, seq, hidden]
  std::shared_ptr<Dropout> dropout;
  std::shared_ptr<Sequential> layers;  // encoder_layer_0 ...
  std::shared_ptr<LayerNorm> ln;
};

// Input [B, 3, image_size, image_size], output logits [B, num_classes].
class VisionTransformer : public UnaryModule {
 public:
  VisionTransformer(const ViTConfig& c, Generator& gen);
  Tensor forward(const Tensor& x) override;

  ViTConfig config;
  ParamRef class_token;  // [1, 1, hidden]
  std::shared_ptr<Conv2d> conv_proj;
  std::shared_ptr<ViTEncoder> encoder;
  std::shared_ptr<Sequential> heads;  // "head": Linear
};

std::shared_ptr<VisionTransformer> vit_b_16(Generator& gen, int64_t num_classes = 1000);

}  // namespace kiln::nn::models
