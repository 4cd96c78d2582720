#pragma once
// Compiled once per program (frugal_add_kernels, or <frugal/kernels.hpp>):
// the built-in layers' vtables and members, so a model's file compiles only
// its own forward. Each class's declared destructor is its key function; a
// layer of the program's own needs none of this.
#include "../activation.hpp"
#include "../attention.hpp"
#include "../batch_norm.hpp"
#include "../conv.hpp"
#include "../dropout.hpp"
#include "../embedding.hpp"
#include "../gpt.hpp"
#include "../graph_conv.hpp"
#include "../init.hpp"
#include "../layer_norm.hpp"
#include "../linear.hpp"
#include "../pool.hpp"
#include "../resnet.hpp"
#include "../sequential.hpp"
#include "../transformer.hpp"
#include "../conv_transpose.hpp"
#include "../group_norm.hpp"
#include "../upsample.hpp"
#include "../batch_norm1d.hpp"
#include "../transformer_encoder.hpp"
#include "../mahalanobis.hpp"
#include "../attention_pool.hpp"

namespace frugal::nn {

ReLU::~ReLU() = default;
MahalanobisHead::~MahalanobisHead() = default;
SpatialAttentionPool::~SpatialAttentionPool() = default;
GELU::~GELU() = default;
Tanh::~Tanh() = default;
Sigmoid::~Sigmoid() = default;
MultiHeadAttention::~MultiHeadAttention() = default;
BatchNorm2d::~BatchNorm2d() = default;
Conv2d::~Conv2d() = default;
Dropout::~Dropout() = default;
Embedding::~Embedding() = default;
Gpt::~Gpt() = default;
GCNConv::~GCNConv() = default;
SAGEConv::~SAGEConv() = default;
Gcn::~Gcn() = default;
LayerNorm::~LayerNorm() = default;
Linear::~Linear() = default;
MaxPool2d::~MaxPool2d() = default;
AvgPool2d::~AvgPool2d() = default;
GlobalAvgPool2d::~GlobalAvgPool2d() = default;
BasicBlock::~BasicBlock() = default;
Bottleneck::~Bottleneck() = default;
Sequential::~Sequential() = default;
Mlp::~Mlp() = default;
TransformerBlock::~TransformerBlock() = default;
ConvTranspose2d::~ConvTranspose2d() = default;
GroupNorm::~GroupNorm() = default;
Upsample::~Upsample() = default;
BatchNorm1d::~BatchNorm1d() = default;
TransformerEncoderLayer::~TransformerEncoderLayer() = default;

}  // namespace frugal::nn
