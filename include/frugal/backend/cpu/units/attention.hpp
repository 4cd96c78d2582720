#pragma once
// Kernel unit (compiled once per program; see ../register.hpp): fused causal
// attention and its backward (bf16/f16 through planned f32 images).
#include "../attention.hpp"
#include "../register.hpp"
#include "../sdpa.hpp"

namespace frugal::cpu {

void add_attention_kernels(KernelTable& t, const BackendOptions&) {
  t.add<ops::CausalAttention>(attention_kernel, half_images_workspace<ops::CausalAttention>);
  t.add<ops::CausalAttentionGrad>(attention_grad_kernel, half_images_workspace<ops::CausalAttentionGrad>);
  t.add<ops::CausalAttentionQkv>(attention_qkv_kernel, half_images_workspace<ops::CausalAttentionQkv>);
  t.add<ops::CausalAttentionQkvGrad>(attention_qkv_grad_kernel, half_images_workspace<ops::CausalAttentionQkvGrad>);
  t.add<ops::ScaledDotProductAttention>(sdpa_kernel);
  t.add<ops::ScaledDotProductAttentionGrad>(sdpa_grad_kernel);
}

}  // namespace frugal::cpu
