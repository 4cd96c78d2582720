#pragma once
// What the CUDA backend's kernel table holds, readable without nvcc: the op
// types it has kernels for and the scratch each of those kernels needs.
// The table (units/kernels.cuh) takes its workspace functions from here;
// planning a GPU's step where there is none (planning_backend.hpp,
// frugal-plan --simulate) reads the same functions and the same list; the
// cuda_kernel_ops test checks that the list is the table's.
#include <algorithm>
#include <cstddef>
#include <span>

#include "../../ops/adamw_master.hpp"
#include "../../ops/attention.hpp"
#include "../../ops/binary.hpp"
#include "../../ops/cast.hpp"
#include "../../ops/dropout.hpp"
#include "../../ops/embedding.hpp"
#include "../../ops/fill.hpp"
#include "../../ops/fused_elementwise.hpp"
#include "../../ops/gelu.hpp"
#include "../../ops/indexing.hpp"
#include "../../ops/layer_norm.hpp"
#include "../../ops/loss.hpp"
#include "../../ops/matmul.hpp"
#include "../../ops/optimizer_updates.hpp"
#include "../../ops/pointwise.hpp"
#include "../../ops/reduce.hpp"
#include "../../ops/shape_ops.hpp"
#include "../../ops/softmax.hpp"
#include "../../ops/unary.hpp"

namespace frugal::cuda {

// Scratch a GEMM of these sizes gets, from the sizes alone (so the planner
// can place it): none for small products, where cuBLASLt's workspace-free
// kernels are as fast; a few MiB for large ones. bf16/f16 products read
// their operands as they are (cuBLASLt accumulates in f32 itself), so,
// unlike the CPU's kernels, no f32 image of an operand is ever made.
inline std::size_t gemm_workspace_bytes(double flops) {
  if (flops < double(1ull << 27)) return 0;
  if (flops < double(1ull << 33)) return std::size_t(4) << 20;
  return std::size_t(32) << 20;
}

inline std::size_t matmul_workspace(const ops::MatMul& op, std::span<const TensorMeta> in, std::span<const TensorMeta>) {
  const auto d = op.dims(in[0].shape, in[1].shape);
  const bool per_item = d.a_broadcast || d.b_broadcast;
  const double items = per_item ? 1.0 : double(d.batch);
  return gemm_workspace_bytes(2.0 * items * double(d.m) * double(d.n) * double(d.k));
}
inline std::size_t linear_workspace(const ops::Linear&, std::span<const TensorMeta> in, std::span<const TensorMeta>) {
  const std::int64_t k = in[1].shape[1], n = in[1].shape[0], m = in[0].shape.numel() / std::max<std::int64_t>(k, 1);
  return gemm_workspace_bytes(2.0 * double(m) * double(n) * double(k));
}

// The per-position losses, planned as the op's scratch.
inline std::size_t cross_entropy_workspace(const ops::CrossEntropy&, std::span<const TensorMeta> in,
                                           std::span<const TensorMeta>) {
  return std::size_t(in[1].shape.numel()) * sizeof(double);
}

// The op types the CUDA table has kernels for: `each.template
// operator()<OpT>(ws)` for each, where ws is the kernel's workspace
// function, or nullptr for a kernel that needs none.
template <class Each, class... F>
void for_each_functor_op(Each& each, ops::FunctorList<F...>, bool with_grad) {
  (each.template operator()<ops::Unary<F>>(nullptr), ...);
  if (with_grad) (each.template operator()<ops::UnaryGrad<F>>(nullptr), ...);
}
template <class Each, class... F>
void for_each_binary_op(Each& each, ops::FunctorList<F...>) {
  (each.template operator()<ops::Binary<F>>(nullptr), ...);
}
template <class Each>
void for_each_kernel_op(Each&& each) {
  for_each_functor_op(each, ops::UnaryFunctors{}, true);
  for_each_functor_op(each, ops::PointwiseFunctors{}, true);
  for_each_binary_op(each, ops::BinaryFunctors{});
  for_each_binary_op(each, ops::MinMaxFunctors{});
  each.template operator()<ops::FillLike>(nullptr);
  each.template operator()<ops::Cast>(nullptr);
  each.template operator()<ops::Reshape>(nullptr);
  each.template operator()<ops::Sum>(nullptr);
  each.template operator()<ops::BroadcastTo>(nullptr);
  each.template operator()<ops::Permute>(nullptr);
  each.template operator()<ops::Softmax>(nullptr);
  each.template operator()<ops::LogSoftmax>(nullptr);
  each.template operator()<ops::SoftmaxGrad>(nullptr);
  each.template operator()<ops::LogSoftmaxGrad>(nullptr);
  each.template operator()<ops::MatMul>(matmul_workspace);
  each.template operator()<ops::Linear>(linear_workspace);
  each.template operator()<ops::CrossEntropy>(cross_entropy_workspace);
  each.template operator()<ops::CrossEntropyGrad>(nullptr);
  each.template operator()<ops::AdamWUpdate>(nullptr);
  each.template operator()<ops::AdamWMasterUpdate>(nullptr);
  each.template operator()<ops::SgdUpdate>(nullptr);
  // add_transformer_kernels (units/transformer.cuh)
  for_each_functor_op(each, ops::FunctorList<math::GeluErfPoly>{}, true);
  each.template operator()<ops::FusedElementwise>(nullptr);
  each.template operator()<ops::Embedding>(nullptr);
  each.template operator()<ops::EmbeddingGrad>(nullptr);
  each.template operator()<ops::Slice>(nullptr);
  each.template operator()<ops::SliceGrad>(nullptr);
  each.template operator()<ops::Dropout>(nullptr);
  each.template operator()<ops::DropoutGrad>(nullptr);
  each.template operator()<ops::LayerNorm>(nullptr);
  each.template operator()<ops::LayerNormGrad>(nullptr);
  each.template operator()<ops::CausalAttention>(nullptr);
  each.template operator()<ops::CausalAttentionGrad>(nullptr);
  each.template operator()<ops::CausalAttentionQkv>(nullptr);
  each.template operator()<ops::CausalAttentionQkvGrad>(nullptr);
}

}  // namespace frugal::cuda
