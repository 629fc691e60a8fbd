// ResNet (torchvision architecture and state_dict names): BasicBlock / Bottleneck with the
// stride on the 3x3 conv (ResNet v1.5), downsample = 1x1 conv + BN, global average pool, fc.
#pragma once
#include <memory>
#include <vector>

#include "nn/layers.h"

namespace kiln::nn::models {

class BasicBlock : public UnaryModule {
 public:
  static constexpr int64_t kExpansion = 1;
  BasicBlock(int64_t inplanes, int64_t planes, int64_t stride, ModulePtr downsample,
             Generator& gen);
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<Conv2d> conv1, conv2;
  std::shared_ptr<BatchNorm2d> bn1, bn2;
  std::shared_ptr<ReLU> relu;
  ModulePtr downsample;  // null when the identity fits
};

class Bottleneck : public UnaryModule {
 public:
  static constexpr int64_t kExpansion = 4;
  Bottleneck(int64_t inplanes, int64_t planes, int64_t stride, ModulePtr downsample,
             Generator& gen);
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<Conv2d> conv1, conv2, conv3;
  std::shared_ptr<BatchNorm2d> bn1, bn2, bn3;
  std::shared_ptr<ReLU> relu;
  ModulePtr downsample;
};

enum class ResNetBlock { Basic, Bottleneck };

// Input [B, 3, H, W] (224 x 224 for the ImageNet models), output logits [B, num_classes].
class ResNet : public UnaryModule {
 public:
  ResNet(ResNetBlock block, std::vector<int64_t> layers, int64_t num_classes, Generator& gen);
  Tensor forward(const Tensor& x) override;

  std::shared_ptr<Conv2d> conv1;
  std::shared_ptr<BatchNorm2d> bn1;
  std::shared_ptr<ReLU> relu;
  std::shared_ptr<MaxPool2d> maxpool;
  std::shared_ptr<Sequential> layer1, layer2, layer3, layer4;
  std::shared_ptr<AdaptiveAvgPool2d> avgpool;
  std::shared_ptr<Linear> fc;
};

std::shared_ptr<ResNet> resnet18(Generator& gen, int64_t num_classes = 1000);
std::shared_ptr<ResNet> resnet50(Generator& gen, int64_t num_classes = 1000);

}  // namespace kiln::nn::models
