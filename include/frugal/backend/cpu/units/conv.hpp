#pragma once
// Kernel unit (compiled once per program; see ../register.hpp): conv2d and
// its backward ops, on the engine and algorithm the backend was made with.
#include "../conv.hpp"
#include "../conv_transpose.hpp"
#include "../register.hpp"

namespace frugal::cpu {

void add_conv_kernels(KernelTable& t, const BackendOptions& o) {
  const ConvEngine e = conv_engine_from(o.conv_engine);
  const ConvAlgorithm al = conv_algorithm_from(o.conv_algorithm);
  t.add<ops::Conv2d>([e, al](const ops::Conv2d& op, const KernelArgs& a) { conv2d_kernel(e, al, op, a); },
                     [al](const ops::Conv2d& op, auto in, auto) { return conv2d_workspace(op, in, al); });
  t.add<ops::Conv2dBackwardData>(
      [e, al](const ops::Conv2dBackwardData& op, const KernelArgs& a) { conv2d_backward_data_kernel(e, al, op, a); },
      [al](const ops::Conv2dBackwardData& op, auto in, auto) { return conv2d_backward_data_workspace(op, in, al); });
  t.add<ops::Conv2dBackwardWeight>(
      [e, al](const ops::Conv2dBackwardWeight& op, const KernelArgs& a) { conv2d_backward_weight_kernel(e, al, op, a); },
      [al](const ops::Conv2dBackwardWeight& op, auto in, auto) { return conv2d_backward_weight_workspace(op, in, al); });
  // conv_transpose2d runs the same kernels on the engine chosen above.
  t.add<ops::ConvTranspose2d>(
      [e, al](const ops::ConvTranspose2d& op, const KernelArgs& a) { conv_transpose2d_kernel(e, al, op, a); },
      [al](const ops::ConvTranspose2d& op, auto in, auto) { return conv_transpose2d_workspace(op, in, al); });
  t.add<ops::ConvTranspose2dBackwardData>(
      [e, al](const ops::ConvTranspose2dBackwardData& op, const KernelArgs& a) {
        conv_transpose2d_backward_data_kernel(e, al, op, a);
      },
      [al](const ops::ConvTranspose2dBackwardData& op, auto in, auto) {
        return conv_transpose2d_backward_data_workspace(op, in, al);
      });
  t.add<ops::ConvTranspose2dBackwardWeight>(
      [e, al](const ops::ConvTranspose2dBackwardWeight& op, const KernelArgs& a) {
        conv_transpose2d_backward_weight_kernel(e, al, op, a);
      },
      [al](const ops::ConvTranspose2dBackwardWeight& op, auto in, auto) {
        return conv_transpose2d_backward_weight_workspace(op, in, al);
      });
}

}  // namespace frugal::cpu
