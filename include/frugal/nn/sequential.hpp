#pragma once
#include <memory>
#include <vector>

#include "module.hpp"

namespace frugal::nn {

// Layers applied in order; submodules are named "0", "1", ... as in PyTorch.
class Sequential : public Layer {
 public:
  ~Sequential() override;
  Sequential() = default;
  Sequential(std::initializer_list<std::shared_ptr<Layer>> layers) {
    for (auto& l : layers) push_back(l);
  }
  void push_back(std::shared_ptr<Layer> layer) {
    if (!layer) fail("nn::Sequential: a null layer was added");
    register_module(std::to_string(layers_.size()), layer);
    layers_.push_back(std::move(layer));
  }
  template <class L, class... Args>
  L& emplace_back(Args&&... args) {
    auto l = std::make_shared<L>(std::forward<Args>(args)...);
    push_back(l);
    return *l;
  }
  Var forward(Var x) override {
    for (auto& l : layers_) x = l->forward(x);
    return x;
  }
  std::size_t size() const { return layers_.size(); }
  Layer& operator[](std::size_t i) { return *layers_.at(i); }

 private:
  std::vector<std::shared_ptr<Layer>> layers_;
};

}  // namespace frugal::nn
