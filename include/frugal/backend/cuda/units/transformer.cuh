#pragma once
// Kernel unit (compiled once per program by nvcc, beside kernels.cuh, so the
// two build in parallel): the kernels a transformer's step needs beyond
// phase 1's (embedding, slices, layer norm, the erf-polynomial GELU, the
// fused elementwise op, causal attention, dropout). register_cuda_kernels
// (units/kernels.cuh) calls add_transformer_kernels.
#include "../attention.cuh"
#include "../cuda_backend.hpp"
#include "../elementwise.cuh"
#include "../fused_elementwise.cuh"
#include "../indexing.cuh"
#include "../layer_norm.cuh"

namespace frugal::cuda {

void add_transformer_kernels(KernelTable& t, const Context& ctx) {
  add_unary_kernels(t, ctx, ops::FunctorList<math::GeluErfPoly>{});
  t.add<ops::FusedElementwise>(FusedElementwiseKernel{ctx});
  t.add<ops::Embedding>(EmbeddingKernel{ctx});
  t.add<ops::EmbeddingGrad>(EmbeddingGradKernel{ctx});
  t.add<ops::Slice>(SliceKernel{ctx});
  t.add<ops::SliceGrad>(SliceGradKernel{ctx});
  t.add<ops::Dropout>([k = DropoutKernel{ctx}](const ops::Dropout& op, const KernelArgs& a) { k(op, a); });
  t.add<ops::DropoutGrad>([k = DropoutKernel{ctx}](const ops::DropoutGrad& op, const KernelArgs& a) { k(op, a); });
  t.add<ops::LayerNorm>(LayerNormKernel{ctx});
  t.add<ops::LayerNormGrad>(LayerNormGradKernel{ctx});
  t.add<ops::CausalAttention>(AttentionKernel{ctx});
  t.add<ops::CausalAttentionGrad>(AttentionGradKernel{ctx});
  t.add<ops::CausalAttentionQkv>(AttentionQkvKernel{ctx});
  t.add<ops::CausalAttentionQkvGrad>(AttentionQkvGradKernel{ctx});
}

}  // namespace frugal::cuda
