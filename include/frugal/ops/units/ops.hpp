#pragma once
// Compiled once per program (frugal_add_kernels, or <frugal/kernels.hpp>):
// each built-in op's vtable, and with it its shape inference, backward and
// cost. The destructor each op class declares is its key function, so no
// file that makes an op (every model's forward does) compiles these again.
// An op of the program's own needs none of this.
#include "../all.hpp"
#include "../transfer.hpp"

namespace frugal::ops {

CausalAttentionGrad::~CausalAttentionGrad() = default;
CausalAttention::~CausalAttention() = default;
CausalAttentionQkvGrad::~CausalAttentionQkvGrad() = default;
CausalAttentionQkv::~CausalAttentionQkv() = default;
BatchNorm2dBackward::~BatchNorm2dBackward() = default;
BatchNorm2dTrain::~BatchNorm2dTrain() = default;
BatchNorm2dEval::~BatchNorm2dEval() = default;
BatchNormUpdateStats::~BatchNormUpdateStats() = default;
Cast::~Cast() = default;
Conv2d::~Conv2d() = default;
Conv2dBackwardData::~Conv2dBackwardData() = default;
Conv2dBackwardWeight::~Conv2dBackwardWeight() = default;
DropoutOp::~DropoutOp() = default;
DropoutGrad::~DropoutGrad() = default;
Dropout::~Dropout() = default;
EmbeddingGrad::~EmbeddingGrad() = default;
Embedding::~Embedding() = default;
FillLike::~FillLike() = default;
Concat::~Concat() = default;
Split::~Split() = default;
SliceBase::~SliceBase() = default;
SliceGrad::~SliceGrad() = default;
Slice::~Slice() = default;
IndexAdd::~IndexAdd() = default;
IndexSelect::~IndexSelect() = default;
ScatterAdd::~ScatterAdd() = default;
Gather::~Gather() = default;
LayerNormGrad::~LayerNormGrad() = default;
LayerNorm::~LayerNorm() = default;
CrossEntropyGrad::~CrossEntropyGrad() = default;
CrossEntropy::~CrossEntropy() = default;
NonFiniteCheck::~NonFiniteCheck() = default;
UpdateLossScale::~UpdateLossScale() = default;
AdvanceStepCount::~AdvanceStepCount() = default;
MatMul::~MatMul() = default;
Linear::~Linear() = default;
SgdUpdate::~SgdUpdate() = default;
AdamWUpdate::~AdamWUpdate() = default;
PoolOp::~PoolOp() = default;
MaxPool2dBackward::~MaxPool2dBackward() = default;
MaxPool2d::~MaxPool2d() = default;
AvgPool2dBackward::~AvgPool2dBackward() = default;
AvgPool2d::~AvgPool2d() = default;
GlobalAvgPool2dBackward::~GlobalAvgPool2dBackward() = default;
GlobalAvgPool2d::~GlobalAvgPool2d() = default;
Sum::~Sum() = default;
BroadcastTo::~BroadcastTo() = default;
Reshape::~Reshape() = default;
Permute::~Permute() = default;
AlongAxis::~AlongAxis() = default;
SoftmaxGrad::~SoftmaxGrad() = default;
LogSoftmaxGrad::~LogSoftmaxGrad() = default;
Softmax::~Softmax() = default;
LogSoftmax::~LogSoftmax() = default;
Spmm::~Spmm() = default;
SpmmPermuted::~SpmmPermuted() = default;
SpmmValuesGrad::~SpmmValuesGrad() = default;
Transfer::~Transfer() = default;

// The element-wise templates, for the functors the backends implement.
template class Unary<math::Relu>;
template class UnaryGrad<math::Relu>;
template class Unary<math::GeluTanh>;
template class UnaryGrad<math::GeluTanh>;
template class Unary<math::GeluErf>;
template class UnaryGrad<math::GeluErf>;
template class Unary<math::Tanh>;
template class UnaryGrad<math::Tanh>;
template class Unary<math::Sigmoid>;
template class UnaryGrad<math::Sigmoid>;
template class Unary<math::Exp>;
template class UnaryGrad<math::Exp>;
template class Unary<math::Log>;
template class UnaryGrad<math::Log>;
template class Unary<math::Rsqrt>;
template class UnaryGrad<math::Rsqrt>;
template class Unary<math::Affine>;
template class UnaryGrad<math::Affine>;
template class Binary<math::Add>;
template class Binary<math::Sub>;
template class Binary<math::Mul>;
template class Binary<math::Div>;

ScaledDotProductAttentionGrad::~ScaledDotProductAttentionGrad() = default;
ScaledDotProductAttention::~ScaledDotProductAttention() = default;
}  // namespace frugal::ops
