#pragma once
// Kernel unit (compiled once per program by nvcc, through frugal_add_kernels
// when the program's project has CUDA enabled): every CUDA kernel of frugal,
// in one translation unit to keep nvcc's time small, the CUDA backend's
// kernel table and make_cuda_backend, which make_backend("cuda") calls.
#include "../cuda_backend.hpp"
#include "../elementwise.cuh"
#include "../loss.cuh"
#include "../matmul.cuh"
#include "../optimizer.cuh"
#include "../rank_order_sum.cuh"
#include "../reduce.cuh"
#include "../softmax.cuh"

namespace frugal::cuda {

void register_cuda_kernels(KernelTable& t, const Context& ctx, const BackendOptions& o) {
  add_unary_kernels(t, ctx, ops::UnaryFunctors{});
  add_unary_kernels(t, ctx, ops::PointwiseFunctors{});
  add_binary_kernels(t, ctx, ops::BinaryFunctors{});
  add_binary_kernels(t, ctx, ops::MinMaxFunctors{});
  t.add<ops::FillLike>(FillKernel{ctx});
  t.add<ops::Cast>(CastKernel{ctx});
  t.add<ops::Reshape>(ReshapeKernel{ctx});
  t.add<ops::Sum>(SumKernel{ctx});
  t.add<ops::BroadcastTo>(BroadcastKernel{ctx});
  t.add<ops::Permute>(PermuteKernel{ctx});
  t.add<ops::Softmax>(SoftmaxKernel<ops::Softmax, false>{ctx});
  t.add<ops::LogSoftmax>(SoftmaxKernel<ops::LogSoftmax, true>{ctx});
  t.add<ops::SoftmaxGrad>(SoftmaxGradKernel<ops::SoftmaxGrad, false>{ctx});
  t.add<ops::LogSoftmaxGrad>(SoftmaxGradKernel<ops::LogSoftmaxGrad, true>{ctx});
  auto gemms = std::make_shared<GemmCache>();
  t.add<ops::MatMul>(MatMulKernel{ctx, gemms}, matmul_workspace);
  t.add<ops::Linear>(LinearKernel{ctx, gemms}, linear_workspace);
  t.add<ops::CrossEntropy>(CrossEntropyKernel{ctx}, cross_entropy_workspace);
  t.add<ops::CrossEntropyGrad>(CrossEntropyGradKernel{ctx});
  t.add<ops::AdamWUpdate>(AdamWKernel{ctx});
  t.add<ops::AdamWMasterUpdate>(AdamWMasterKernel{ctx});
  t.add<ops::SgdUpdate>(SgdKernel{ctx});
  add_transformer_kernels(t, ctx);
  for (auto& extra : o.extra_kernels) extra(t);
}

// FRUGAL_CUBLASLT_LIBRARY: the file CMake found, written into this unit's
// generated source by frugal_add_kernels (empty where it found none).
#ifndef FRUGAL_CUBLASLT_LIBRARY
#define FRUGAL_CUBLASLT_LIBRARY ""
#endif
const CublasLt& cublaslt() {
  static const CublasLt api = load_cublaslt(FRUGAL_CUBLASLT_LIBRARY);
  return api;
}

}  // namespace frugal::cuda

namespace frugal {

std::unique_ptr<Backend> make_cuda_backend(const BackendOptions& options) {
  return std::make_unique<cuda::CudaBackend>(options);
}

}  // namespace frugal
