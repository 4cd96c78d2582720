#pragma once
// Running an f32 kernel on bf16/f16 tensors through f32 images of them in
// the op's planned workspace: every 16-bit input is converted into its
// image, the f32 kernel runs on the images (and on the tensors that are not
// 16-bit, as they are), and every 16-bit output is rounded from its image
// once. So the kernel computes exactly what it computes in f32, and the only
// roundings are the inputs' (already 16-bit) and one per output element.
//
// For kernels whose inner loops are f32 GEMMs over tiles (fused attention),
// where converting element by element inside them would mean a second copy
// of every tile loop. The cost is memory: one f32 image per 16-bit tensor,
// planned like any value (half_images_bytes is the kernel table's workspace
// function), so it counts against the budget and nothing is allocated while
// a step runs.
#include <span>
#include <vector>

#include "../../core/bytes.hpp"
#include "../../runtime/backend.hpp"
#include "convert.hpp"

#include "abi.hpp"

namespace frugal::cpu::inline FRUGAL_KERNEL_ABI {

// The workspace: one aligned f32 region per bf16/f16 tensor, inputs first,
// then outputs, in order; 0 when no tensor is 16-bit.
inline std::size_t half_images_bytes(std::span<const TensorMeta> in, std::span<const TensorMeta> out) {
  std::size_t bytes = 0;
  for (auto list : {in, out})
    for (const TensorMeta& m : list)
      if (is_half(m.dtype)) bytes += align_up(std::size_t(m.shape.numel()) * sizeof(float));
  return bytes;
}

// The kernel table's form of it, for any op.
template <class OpT>
std::size_t half_images_workspace(const OpT&, std::span<const TensorMeta> in, std::span<const TensorMeta> out) {
  return half_images_bytes(in, out);
}

// Calls run(f32 arguments) as described above. `op` names the kernel in the
// error a too-small workspace (a planner bug) raises.
template <class Run>
void on_f32_images(const char* op, const KernelArgs& a, Run&& run) {
  std::vector<TensorRef> in(a.in.begin(), a.in.end()), out(a.out.begin(), a.out.end());
  auto* next = static_cast<unsigned char*>(a.workspace);
  std::size_t used = 0;
  for (auto* list : {&in, &out})
    for (TensorRef& t : *list) {
      if (!is_half(t.dtype)) continue;
      const std::size_t bytes = std::size_t(t.numel()) * sizeof(float);
      if (used + bytes > a.workspace_bytes)
        fail("cpu: ", op, ": the f32 images of its bf16/f16 tensors need more than its ", a.workspace_bytes,
             "-byte workspace (the kernel table plans it with half_images_workspace)");
      t.data = next + used;
      t.dtype = DType::f32;
      used += align_up(bytes);
    }
  for (std::size_t i = 0; i < in.size(); ++i)
    if (is_half(a.in[i].dtype))
      dispatch_storage(a.in[i].dtype, op, [&](auto s) {
        using S = decltype(s);
        convert_into(a.in[i].as<const S>(), in[i].as<float>(), a.in[i].numel());
      });
  KernelArgs f32 = a;
  f32.in = in;
  f32.out = out;
  f32.workspace = nullptr;  // the images fill it
  f32.workspace_bytes = 0;
  run(static_cast<const KernelArgs&>(f32));
  for (std::size_t i = 0; i < out.size(); ++i)
    if (is_half(a.out[i].dtype))
      dispatch_storage(a.out[i].dtype, op, [&](auto s) {
        using S = decltype(s);
        convert_into(out[i].as<const float>(), a.out[i].as<S>(), a.out[i].numel());
      });
}

}  // namespace frugal::cpu
