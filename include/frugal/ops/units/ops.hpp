#pragma once
// Compiled once per program (frugal_add_kernels, or <frugal/kernels.hpp>):
// each built-in op's vtable, and with it its shape inference, backward and
// cost. The destructor each op class declares is its key function, so no
// file that makes an op (every model's forward does) compiles these again.
// An op of the program's own needs none of this.
#include "../all.hpp"
#include "../host_update.hpp"
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
MahalanobisDistanceGrad::~MahalanobisDistanceGrad() = default;
MahalanobisDistance::~MahalanobisDistance() = default;
MahalanobisLossBase::~MahalanobisLossBase() = default;
MahalanobisLossGrad::~MahalanobisLossGrad() = default;
MahalanobisLoss::~MahalanobisLoss() = default;
NonFiniteCheck::~NonFiniteCheck() = default;
UpdateLossScale::~UpdateLossScale() = default;
AdvanceStepCount::~AdvanceStepCount() = default;
ClipGradNormCoef::~ClipGradNormCoef() = default;
CountSkippedStep::~CountSkippedStep() = default;
MatMul::~MatMul() = default;
Linear::~Linear() = default;
SgdUpdate::~SgdUpdate() = default;
AdamWUpdate::~AdamWUpdate() = default;
AdamWMasterUpdate::~AdamWMasterUpdate() = default;
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
WhereGrad::~WhereGrad() = default;
Where::~Where() = default;
AlongDimReduction::~AlongDimReduction() = default;
MaxMinDimGrad::~MaxMinDimGrad() = default;
MaxMinDim::~MaxMinDim() = default;
ArgMaxMin::~ArgMaxMin() = default;
Detach::~Detach() = default;
AllReduceMean::~AllReduceMean() = default;
CollectiveStart::~CollectiveStart() = default;
CollectiveDone::~CollectiveDone() = default;
ReduceScatterMean::~ReduceScatterMean() = default;
ShardSlice::~ShardSlice() = default;
ShardedUpdate::~ShardedUpdate() = default;
HostUpdate::~HostUpdate() = default;
AllGatherShards::~AllGatherShards() = default;
AllGatherParameter::~AllGatherParameter() = default;
MicroStepSkip::~MicroStepSkip() = default;
AccumulateGradient::~AccumulateGradient() = default;
NllLossBase::~NllLossBase() = default;
NllLossGrad::~NllLossGrad() = default;
NllLoss::~NllLoss() = default;
ConvTranspose2d::~ConvTranspose2d() = default;
ConvTranspose2dBackwardData::~ConvTranspose2dBackwardData() = default;
ConvTranspose2dBackwardWeight::~ConvTranspose2dBackwardWeight() = default;
Upsample2d::~Upsample2d() = default;
Upsample2dBackward::~Upsample2dBackward() = default;
GroupNorm::~GroupNorm() = default;
GroupNormGrad::~GroupNormGrad() = default;

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
template class Unary<math::Abs>;
template class UnaryGrad<math::Abs>;
template class Unary<math::Sqrt>;
template class UnaryGrad<math::Sqrt>;
template class Unary<math::Square>;
template class UnaryGrad<math::Square>;
template class Unary<math::Sin>;
template class UnaryGrad<math::Sin>;
template class Unary<math::Cos>;
template class UnaryGrad<math::Cos>;
template class Unary<math::Pow>;
template class UnaryGrad<math::Pow>;
template class Unary<math::Clamp>;
template class UnaryGrad<math::Clamp>;
template class Unary<math::SmoothL1>;
template class UnaryGrad<math::SmoothL1>;
template class Unary<math::Huber>;
template class UnaryGrad<math::Huber>;
template class Unary<math::Log1pExp>;
template class UnaryGrad<math::Log1pExp>;
template class Binary<math::Maximum>;
template class Binary<math::Minimum>;
template class Binary<math::MaxShare>;

ScaledDotProductAttentionGrad::~ScaledDotProductAttentionGrad() = default;
ScaledDotProductAttention::~ScaledDotProductAttention() = default;
}  // namespace frugal::ops
