#pragma once
// Kernel unit (compiled once per program; see ../register.hpp): sums and
// broadcasts, softmax, cross-entropy, the Mahalanobis distance and loss, and
// the loss-scaling checks.
#include "../grad_clipping.hpp"
#include "../loss.hpp"
#include "../loss_scaling.hpp"
#include "../mahalanobis.hpp"
#include "../max_min.hpp"
#include "../nll_loss.hpp"
#include "../reduce.hpp"
#include "../register.hpp"
#include "../softmax.hpp"

namespace frugal::cpu {

void add_reduction_kernels(KernelTable& t, const BackendOptions&) {
  t.add<ops::Sum>(sum_kernel);
  t.add<ops::BroadcastTo>(broadcast_kernel);
  t.add<ops::Softmax>(softmax_kernel<ops::Softmax, false>);
  t.add<ops::LogSoftmax>(softmax_kernel<ops::LogSoftmax, true>);
  t.add<ops::SoftmaxGrad>(softmax_grad_kernel<ops::SoftmaxGrad, false>);
  t.add<ops::LogSoftmaxGrad>(softmax_grad_kernel<ops::LogSoftmaxGrad, true>);
  t.add<ops::CrossEntropy>(cross_entropy_kernel);
  t.add<ops::CrossEntropyGrad>(cross_entropy_grad_kernel);
  t.add<ops::NonFiniteCheck>(non_finite_check_kernel);
  t.add<ops::UpdateLossScale>(update_loss_scale_kernel);
  t.add<ops::AdvanceStepCount>(advance_step_count_kernel);
  t.add<ops::MaxMinDim>(max_min_dim_kernel);
  t.add<ops::MaxMinDimGrad>(max_min_dim_grad_kernel);
  t.add<ops::ArgMaxMin>(argmax_min_kernel);
  t.add<ops::NllLoss>(nll_loss_kernel);
  t.add<ops::NllLossGrad>(nll_loss_grad_kernel);
  t.add<ops::ClipGradNormCoef>(clip_grad_norm_coef_kernel);
  t.add<ops::CountSkippedStep>(count_skipped_step_kernel);
  t.add<ops::MahalanobisDistance>(mahalanobis_distance_kernel, mahalanobis_workspace<ops::MahalanobisDistance>);
  t.add<ops::MahalanobisDistanceGrad>(mahalanobis_distance_grad_kernel,
                                      mahalanobis_workspace<ops::MahalanobisDistanceGrad>);
  t.add<ops::MahalanobisLoss>(mahalanobis_loss_kernel, mahalanobis_workspace<ops::MahalanobisLoss>);
  t.add<ops::MahalanobisLossGrad>(mahalanobis_loss_grad_kernel, mahalanobis_workspace<ops::MahalanobisLossGrad>);
}

}  // namespace frugal::cpu
