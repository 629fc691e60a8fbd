// ViT-B/16, following torchvision.models.vision_transformer.
#include "nn/models/vit.h"

#include "ops/api.h"

namespace kiln::nn::models {

ViTEncoderBlock::ViTEncoderBlock(const ViTConfig& c, Generator& gen)
    : UnaryModule("EncoderBlock") {
  ln_1 = register_module("ln_1", std::make_shared<LayerNorm>(std::vector<int64_t>{c.hidden_dim},
                                                             1e-6, true, gen));
  self_attention = register_module(
      "self_attention", std::make_shared<MultiheadAttention>(c.hidden_dim, c.num_heads, true, gen));
  dropout = register_module("dropout", std::make_shared<Dropout>(0.0));
  ln_2 = register_module("ln_2", std::make_shared<LayerNorm>(std::vector<int64_t>{c.hidden_dim},
                                                             1e-6, true, gen));
  mlp = register_module("mlp", std::make_shared<Sequential>());
  mlp->push_back(std::make_shared<Linear>(c.hidden_dim, c.mlp_dim, true, gen));
  mlp->push_back(std::make_shared<GELU>());
  mlp->push_back(std::make_shared<Dropout>(0.0));
  mlp->push_back(std::make_shared<Linear>(c.mlp_dim, c.hidden_dim, true, gen));
  mlp->push_back(std::make_shared<Dropout>(0.0));
}
Tensor ViTEncoderBlock::forward(const Tensor& input) {
  Tensor x = ln_1->forward(input);
  x = dropout->forward(self_attention->forward(x, x, x));
  x = add(x, input);
  return add(x, mlp->forward(ln_2->forward(x)));
}

ViTEncoder::ViTEncoder(const ViTConfig& c, Generator& gen) : UnaryModule("Encoder") {
  int64_t grid = c.image_size / c.patch_size;
  pos_embedding = register_parameter("pos_embedding",
                                     Tensor::empty({1, grid * grid + 1, c.hidden_dim}));
  init::normal_(pos_embedding, 0.0, 0.02, gen);
  dropout = register_module("dropout", std::make_shared<Dropout>(0.0));
  layers = register_module("layers", std::make_shared<Sequential>());
  for (int64_t i = 0; i < c.num_layers; ++i)
    layers->push_back("encoder_layer_" + std::to_string(i),
                      std::make_shared<ViTEncoderBlock>(c, gen));
  ln = register_module("ln", std::make_shared<LayerNorm>(std::vector<int64_t>{c.hidden_dim}, 1e-6,
                                                         true, gen));
}
Tensor ViTEncoder::forward(const Tensor& x) {
  KILN_CHECK(x.dim() == 3 && x.size(1) == pos_embedding.size(1) &&
                 x.size(2) == pos_embedding.size(2),
             "ViT Encoder: expected [B, {}, {}], found {}", pos_embedding.size(1),
             pos_embedding.size(2), to_string(x.sizes()));
  return ln->forward(layers->forward(dropout->forward(add(x, pos_embedding))));
}

VisionTransformer::VisionTransformer(const ViTConfig& c, Generator& gen)
    : UnaryModule("VisionTransformer"), config(c) {
  KILN_CHECK(c.patch_size > 0 && c.image_size % c.patch_size == 0,
             "VisionTransformer: image_size {} is not a multiple of patch_size {}", c.image_size,
             c.patch_size);
  conv_proj = register_module(
      "conv_proj", std::make_shared<Conv2d>(
                       Conv2dOptions{.in_channels = 3,
                                     .out_channels = c.hidden_dim,
                                     .kernel_size = {c.patch_size, c.patch_size},
                                     .stride = {c.patch_size, c.patch_size}},
                       gen));
  // torchvision starts the class token at zeros; Kiln's is random (Note [Random init]).
  class_token = register_parameter("class_token", Tensor::empty({1, 1, c.hidden_dim}));
  init::normal_(class_token, 0.0, 0.02, gen);
  encoder = register_module("encoder", std::make_shared<ViTEncoder>(c, gen));
  heads = register_module("heads", std::make_shared<Sequential>());
  heads->push_back("head", std::make_shared<Linear>(c.hidden_dim, c.num_classes, true, gen));
}

Tensor VisionTransformer::forward(const Tensor& x) {
  const int64_t S = config.image_size, D = config.hidden_dim;
  KILN_CHECK(x.dim() == 4 && x.size(1) == 3 && x.size(2) == S && x.size(3) == S,
             "VisionTransformer: expected [B, 3, {}, {}], found {}", S, S, to_string(x.sizes()));
  const int64_t B = x.size(0);
  // [B, D, g, g] -> [B, g*g, D]
  Tensor patches = permute(flatten(conv_proj->forward(x), 2), {0, 2, 1});
  Tensor cls = expand(class_token, {B, -1, -1});
  Tensor y = encoder->forward(concat({cls, patches}, 1));
  Tensor first = reshape(slice(y, 1, 0, 1), {B, D});  // the class token
  return heads->forward(first);
}

std::shared_ptr<VisionTransformer> vit_b_16(Generator& gen, int64_t num_classes) {
  ViTConfig c;
  c.num_classes = num_classes;
  return std::make_shared<VisionTransformer>(c, gen);
}

}  // namespace kiln::nn::models
