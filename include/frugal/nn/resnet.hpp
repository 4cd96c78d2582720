#pragma once
// ResNets for CIFAR-sized input (3x3 stem, no max-pool), named like the
// PyTorch peer (/work/shared/peer/torch_bench.py): conv1, bn1,
// blocks.N.{conv1,bn1,conv2,bn2,...}, blocks.N.shortcut.{0,1}, fc.
//
// Every layer takes the model's dtype (f32 by default; bf16 or f16 for a
// model wholly in 16 bits, as nn::GptConfig::dtype): the input, the
// activations, the weights and their gradients are of that dtype, and
// BatchNorm keeps its running statistics in f32 (nn/batch_norm.hpp).
#include <memory>
#include <vector>

#include "../ops/binary.hpp"
#include "../ops/unary.hpp"
#include "batch_norm.hpp"
#include "conv.hpp"
#include "linear.hpp"
#include "pool.hpp"
#include "sequential.hpp"

namespace frugal::nn {

namespace detail {
// A 1x1 convolution and BatchNorm: the projection shortcut, used where the
// block changes the stride or the channel count.
inline std::shared_ptr<Sequential> projection(std::int64_t in, std::int64_t out, std::int64_t stride, DType dtype) {
  auto s = std::make_shared<Sequential>();
  s->push_back(std::make_shared<Conv2d>(in, out, 1, Conv2dLayerOptions{.stride = stride, .bias = false, .dtype = dtype}));
  s->push_back(std::make_shared<BatchNorm2d>(out, BatchNormOptions{.dtype = dtype}));
  return s;
}
}  // namespace detail

// Two 3x3 convolutions with BatchNorm; out = relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)).
class BasicBlock : public Layer {
 public:
  ~BasicBlock() override;
  static constexpr std::int64_t expansion = 1;
  BasicBlock(std::int64_t in, std::int64_t planes, std::int64_t stride = 1, DType dtype = DType::f32)
      : conv1(in, planes, 3, {.stride = stride, .padding = 1, .bias = false, .dtype = dtype}),
        bn1(planes, {.dtype = dtype}),
        conv2(planes, planes, 3, {.stride = 1, .padding = 1, .bias = false, .dtype = dtype}),
        bn2(planes, {.dtype = dtype}) {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    register_module("conv2", conv2);
    register_module("bn2", bn2);
    if (stride != 1 || in != planes)
      shortcut = register_module("shortcut", detail::projection(in, planes, stride, dtype));
  }
  Var forward(Var x) override {
    Var out = relu(bn1(conv1(x)));
    out = bn2(conv2(out));
    return relu(out + (shortcut ? (*shortcut)(x) : x));
  }

  Conv2d conv1;
  BatchNorm2d bn1;
  Conv2d conv2;
  BatchNorm2d bn2;
  std::shared_ptr<Sequential> shortcut;  // null: identity
};

// 1x1 reduce, 3x3 (carrying the stride), 1x1 expand by 4, with BatchNorm;
// out = relu(bn3(conv3(...)) + shortcut(x)).
class Bottleneck : public Layer {
 public:
  ~Bottleneck() override;
  static constexpr std::int64_t expansion = 4;
  Bottleneck(std::int64_t in, std::int64_t planes, std::int64_t stride = 1, DType dtype = DType::f32)
      : conv1(in, planes, 1, {.bias = false, .dtype = dtype}),
        bn1(planes, {.dtype = dtype}),
        conv2(planes, planes, 3, {.stride = stride, .padding = 1, .bias = false, .dtype = dtype}),
        bn2(planes, {.dtype = dtype}),
        conv3(planes, planes * expansion, 1, {.bias = false, .dtype = dtype}),
        bn3(planes * expansion, {.dtype = dtype}) {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    register_module("conv2", conv2);
    register_module("bn2", bn2);
    register_module("conv3", conv3);
    register_module("bn3", bn3);
    if (stride != 1 || in != planes * expansion)
      shortcut = register_module("shortcut", detail::projection(in, planes * expansion, stride, dtype));
  }
  Var forward(Var x) override {
    Var out = relu(bn1(conv1(x)));
    out = relu(bn2(conv2(out)));
    out = bn3(conv3(out));
    return relu(out + (shortcut ? (*shortcut)(x) : x));
  }

  Conv2d conv1;
  BatchNorm2d bn1;
  Conv2d conv2;
  BatchNorm2d bn2;
  Conv2d conv3;
  BatchNorm2d bn3;
  std::shared_ptr<Sequential> shortcut;
};

// One stage of a ResNet: `blocks` blocks of `planes` width, the first with `stride`.
struct ResNetStage {
  std::int64_t planes, blocks, stride;
};

// stem (3x3 conv, BatchNorm, ReLU) -> stages -> global average pool -> fc,
// every layer in `dtype` (the input too).
template <class Block>
class ResNet : public Layer {
 public:
  ResNet(std::int64_t stem_channels, const std::vector<ResNetStage>& stages, std::int64_t num_classes,
         std::int64_t in_channels = 3, DType dtype = DType::f32)
      : conv1(in_channels, stem_channels, 3, {.stride = 1, .padding = 1, .bias = false, .dtype = dtype}),
        bn1(stem_channels, {.dtype = dtype}),
        fc(last_width(stem_channels, stages), num_classes, {.dtype = dtype}),
        dtype_(dtype) {
    register_module("conv1", conv1);
    register_module("bn1", bn1);
    register_module("blocks", blocks);
    std::int64_t in = stem_channels;
    for (const ResNetStage& s : stages)
      for (std::int64_t b = 0; b < s.blocks; ++b) {
        blocks.push_back(std::make_shared<Block>(in, s.planes, b == 0 ? s.stride : 1, dtype));
        in = s.planes * Block::expansion;
      }
    register_module("fc", fc);
  }
  Var forward(Var x) override {
    if (x.dtype() != dtype_)
      fail<ShapeError>("nn::ResNet '", qualified_name(), "': input ", x.meta().str(), " is not of the model's dtype ",
                       dtype_name(dtype_), " (cast it first)");
    x = relu(bn1(conv1(x)));
    x = blocks(x);
    return fc(global_avg_pool2d(x));
  }

  Conv2d conv1;
  BatchNorm2d bn1;
  Sequential blocks;
  Linear fc;
  DType dtype() const { return dtype_; }

 private:
  DType dtype_;
  static std::int64_t last_width(std::int64_t stem, const std::vector<ResNetStage>& stages) {
    return stages.empty() ? stem : stages.back().planes * Block::expansion;
  }
};

// ResNet-18 for CIFAR, exactly the peer's model: 3x3 stem of 64, no max-pool,
// [2, 2, 2, 2] BasicBlocks of widths 64, 128, 256, 512, global average pool, fc.
inline std::unique_ptr<ResNet<BasicBlock>> resnet18_cifar(std::int64_t num_classes = 10, std::int64_t in_channels = 3,
                                                          DType dtype = DType::f32) {
  return std::make_unique<ResNet<BasicBlock>>(
      64, std::vector<ResNetStage>{{64, 2, 1}, {128, 2, 2}, {256, 2, 2}, {512, 2, 2}}, num_classes, in_channels, dtype);
}

// ResNet-20 of He et al. (2016) for CIFAR: 3x3 stem of 16, three stages of
// three BasicBlocks of widths 16, 32, 64 (projection shortcuts, "option B").
inline std::unique_ptr<ResNet<BasicBlock>> resnet20_cifar(std::int64_t num_classes = 10, std::int64_t in_channels = 3,
                                                          DType dtype = DType::f32) {
  return std::make_unique<ResNet<BasicBlock>>(16, std::vector<ResNetStage>{{16, 3, 1}, {32, 3, 2}, {64, 3, 2}},
                                              num_classes, in_channels, dtype);
}

// ResNet-50 with a CIFAR stem: 3x3 conv of 64, no max-pool, Bottleneck
// blocks [3, 4, 6, 3] of widths 64..512 (outputs 256..2048), fc.
inline std::unique_ptr<ResNet<Bottleneck>> resnet50_cifar(std::int64_t num_classes = 10, std::int64_t in_channels = 3,
                                                          DType dtype = DType::f32) {
  return std::make_unique<ResNet<Bottleneck>>(
      64, std::vector<ResNetStage>{{64, 3, 1}, {128, 4, 2}, {256, 6, 2}, {512, 3, 2}}, num_classes, in_channels, dtype);
}

}  // namespace frugal::nn
