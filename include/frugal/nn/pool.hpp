#pragma once
#include "../ops/pool.hpp"
#include "module.hpp"

namespace frugal::nn {

// torch.nn.MaxPool2d (floor mode, no dilation); stride defaults to the kernel.
class MaxPool2d : public Layer {
 public:
  ~MaxPool2d() override;
  explicit MaxPool2d(Size2 kernel_size, std::optional<Size2> stride = std::nullopt, Size2 padding = 0)
      : k_(kernel_size), s_(stride), p_(padding) {}
  Var forward(Var x) override { return max_pool2d(x, k_, s_, p_); }

 private:
  Size2 k_;
  std::optional<Size2> s_;
  Size2 p_;
};

// torch.nn.AvgPool2d (floor mode); stride defaults to the kernel.
class AvgPool2d : public Layer {
 public:
  ~AvgPool2d() override;
  explicit AvgPool2d(Size2 kernel_size, std::optional<Size2> stride = std::nullopt, Size2 padding = 0,
                     bool count_include_pad = true)
      : k_(kernel_size), s_(stride), p_(padding), include_pad_(count_include_pad) {}
  Var forward(Var x) override { return avg_pool2d(x, k_, s_, p_, include_pad_); }

 private:
  Size2 k_;
  std::optional<Size2> s_;
  Size2 p_;
  bool include_pad_;
};

// nn.AdaptiveAvgPool2d(1) followed by flatten(1): [N, C, H, W] -> [N, C].
class GlobalAvgPool2d : public Layer {
 public:
  ~GlobalAvgPool2d() override;
  Var forward(Var x) override { return global_avg_pool2d(x); }
};

}  // namespace frugal::nn
