// ResNet-18 / ResNet-50, following torchvision.models.resnet.
#include "nn/models/resnet.h"

#include "ops/api.h"

namespace kiln::nn::models {

namespace {

std::shared_ptr<Conv2d> conv(int64_t in, int64_t out, int64_t k, int64_t stride, Generator& gen) {
  return std::make_shared<Conv2d>(Conv2dOptions{.in_channels = in,
                                                .out_channels = out,
                                                .kernel_size = {k, k},
                                                .stride = {stride, stride},
                                                .padding = {k / 2, k / 2},
                                                .bias = false},
                                  gen);
}

}  // namespace

BasicBlock::BasicBlock(int64_t inplanes, int64_t planes, int64_t stride, ModulePtr ds,
                       Generator& gen)
    : UnaryModule("BasicBlock") {
  conv1 = register_module("conv1", conv(inplanes, planes, 3, stride, gen));
  bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(planes, 1e-5, true, gen));
  relu = register_module("relu", std::make_shared<ReLU>());
  conv2 = register_module("conv2", conv(planes, planes, 3, 1, gen));
  bn2 = register_module("bn2", std::make_shared<BatchNorm2d>(planes, 1e-5, true, gen));
  if (ds) downsample = register_module("downsample", ds);
}
Tensor BasicBlock::forward(const Tensor& x) {
  Tensor out = relu->forward(bn1->forward(conv1->forward(x)));
  out = bn2->forward(conv2->forward(out));
  Tensor identity = downsample ? downsample->call({x})[0] : x;
  return relu->forward(add(out, identity));
}

Bottleneck::Bottleneck(int64_t inplanes, int64_t planes, int64_t stride, ModulePtr ds,
                       Generator& gen)
    : UnaryModule("Bottleneck") {
  conv1 = register_module("conv1", conv(inplanes, planes, 1, 1, gen));
  bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(planes, 1e-5, true, gen));
  conv2 = register_module("conv2", conv(planes, planes, 3, stride, gen));
  bn2 = register_module("bn2", std::make_shared<BatchNorm2d>(planes, 1e-5, true, gen));
  conv3 = register_module("conv3", conv(planes, planes * kExpansion, 1, 1, gen));
  bn3 = register_module("bn3",
                        std::make_shared<BatchNorm2d>(planes * kExpansion, 1e-5, true, gen));
  relu = register_module("relu", std::make_shared<ReLU>());
  if (ds) downsample = register_module("downsample", ds);
}
Tensor Bottleneck::forward(const Tensor& x) {
  Tensor out = relu->forward(bn1->forward(conv1->forward(x)));
  out = relu->forward(bn2->forward(conv2->forward(out)));
  out = bn3->forward(conv3->forward(out));
  Tensor identity = downsample ? downsample->call({x})[0] : x;
  return relu->forward(add(out, identity));
}

ResNet::ResNet(ResNetBlock block, std::vector<int64_t> layers, int64_t num_classes,
               Generator& gen)
    : UnaryModule("ResNet") {
  KILN_CHECK(layers.size() == 4, "ResNet: expected 4 stage depths, found {}", layers.size());
  const int64_t expansion =
      block == ResNetBlock::Basic ? BasicBlock::kExpansion : Bottleneck::kExpansion;
  conv1 = register_module("conv1", conv(3, 64, 7, 2, gen));
  bn1 = register_module("bn1", std::make_shared<BatchNorm2d>(64, 1e-5, true, gen));
  relu = register_module("relu", std::make_shared<ReLU>());
  maxpool = register_module(
      "maxpool", std::make_shared<MaxPool2d>(Pool2dOptions{
                     .kernel_size = {3, 3}, .stride = {2, 2}, .padding = {1, 1}}));

  int64_t inplanes = 64;
  auto make_layer = [&](int64_t planes, int64_t blocks, int64_t stride) {
    auto seq = std::make_shared<Sequential>();
    for (int64_t i = 0; i < blocks; ++i) {
      int64_t s = i == 0 ? stride : 1;
      ModulePtr ds;
      if (i == 0 && (stride != 1 || inplanes != planes * expansion)) {
        auto d = std::make_shared<Sequential>();
        d->push_back(conv(inplanes, planes * expansion, 1, stride, gen));
        d->push_back(std::make_shared<BatchNorm2d>(planes * expansion, 1e-5, true, gen));
        ds = d;
      }
      if (block == ResNetBlock::Basic)
        seq->push_back(std::make_shared<BasicBlock>(inplanes, planes, s, ds, gen));
      else
        seq->push_back(std::make_shared<Bottleneck>(inplanes, planes, s, ds, gen));
      inplanes = planes * expansion;
    }
    return seq;
  };
  layer1 = register_module("layer1", make_layer(64, layers[0], 1));
  layer2 = register_module("layer2", make_layer(128, layers[1], 2));
  layer3 = register_module("layer3", make_layer(256, layers[2], 2));
  layer4 = register_module("layer4", make_layer(512, layers[3], 2));
  avgpool = register_module("avgpool", std::make_shared<AdaptiveAvgPool2d>(std::vector<int64_t>{1, 1}));
  fc = register_module("fc", std::make_shared<Linear>(512 * expansion, num_classes, true, gen));
}

Tensor ResNet::forward(const Tensor& x) {
  KILN_CHECK(x.dim() == 4 && x.size(1) == 3, "ResNet: expected an image batch [B, 3, H, W], found {}",
             to_string(x.sizes()));
  Tensor y = maxpool->forward(relu->forward(bn1->forward(conv1->forward(x))));
  y = layer4->forward(layer3->forward(layer2->forward(layer1->forward(y))));
  y = flatten(avgpool->forward(y), 1);
  return fc->forward(y);
}

std::shared_ptr<ResNet> resnet18(Generator& gen, int64_t num_classes) {
  return std::make_shared<ResNet>(ResNetBlock::Basic, std::vector<int64_t>{2, 2, 2, 2},
                                  num_classes, gen);
}
std::shared_ptr<ResNet> resnet50(Generator& gen, int64_t num_classes) {
  return std::make_shared<ResNet>(ResNetBlock::Bottleneck, std::vector<int64_t>{3, 4, 6, 3},
                                  num_classes, gen);
}

}  // namespace kiln::nn::models
