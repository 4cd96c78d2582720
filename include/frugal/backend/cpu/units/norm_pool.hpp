#pragma once
// Kernel unit (compiled once per program; see ../register.hpp): layer norm,
// batch norm, group norm, pooling and upsampling.
#include "../batch_norm.hpp"
#include "../layer_norm.hpp"
#include "../pool.hpp"
#include "../register.hpp"
#include "../group_norm.hpp"
#include "../upsample.hpp"

namespace frugal::cpu {

void add_norm_pool_kernels(KernelTable& t, const BackendOptions&) {
  t.add<ops::LayerNorm>(layer_norm_kernel);
  t.add<ops::LayerNormGrad>(layer_norm_grad_kernel);
  t.add<ops::BatchNorm2dTrain>(batch_norm2d_train_kernel);
  t.add<ops::BatchNorm2dEval>(batch_norm2d_eval_kernel);
  t.add<ops::BatchNorm2dBackward>(batch_norm2d_backward_kernel);
  t.add<ops::BatchNormUpdateStats>(batch_norm_update_stats_kernel);
  t.add<ops::MaxPool2d>(max_pool2d_kernel);
  t.add<ops::MaxPool2dBackward>(max_pool2d_backward_kernel);
  t.add<ops::AvgPool2d>(avg_pool2d_kernel);
  t.add<ops::AvgPool2dBackward>(avg_pool2d_backward_kernel);
  t.add<ops::GlobalAvgPool2d>(global_avg_pool2d_kernel);
  t.add<ops::GlobalAvgPool2dBackward>(global_avg_pool2d_backward_kernel);
  t.add<ops::GroupNorm>(group_norm_kernel);
  t.add<ops::GroupNormGrad>(group_norm_grad_kernel);
  t.add<ops::Upsample2d>(upsample2d_kernel);
  t.add<ops::Upsample2dBackward>(upsample2d_backward_kernel);
}

}  // namespace frugal::cpu
