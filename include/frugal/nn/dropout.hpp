#pragma once
// Dropout as a layer and as a function that picks its own key.
#include "../ops/dropout.hpp"
#include "init.hpp"
#include "module.hpp"

namespace frugal::nn {

// The key for the next dropout of the capture `g` is in: the global seed
// (manual_seed, read from a copy of the initialisation stream, so drawing a
// key never changes the weights initialised after it) mixed by Philox with
// how many dropouts the capture already holds. So two dropouts of one capture
// differ, and the same seed, construction order and model code give the same
// keys in every capture (a resumed run replays its masks).
inline std::uint64_t next_dropout_key(const Graph& g) {
  std::uint64_t index = 0;
  for (const Node& n : g.nodes())
    if (dynamic_cast<const ops::Dropout*>(n.op.get())) ++index;
  Rng seed_stream = init_rng();  // a copy
  const std::uint64_t seed = (std::uint64_t(seed_stream.next_u32()) << 32) | seed_stream.next_u32();
  const Philox::Block b = Philox(seed)(0x64726f706f7574ull /* "dropout" */, index);
  return (std::uint64_t(b.v[1]) << 32) | b.v[0];
}

}  // namespace frugal::nn

namespace frugal {

// torch.nn.functional.dropout: in training, zero each element with
// probability p and scale the rest by 1 / (1 - p); otherwise the identity.
inline Var dropout(Var x, double p, bool training = true) {
  ops::check_dropout_p(p);
  if (!training || p == 0) return x;
  return dropout_with_key(x, p, nn::next_dropout_key(*x.graph));
}

}  // namespace frugal

namespace frugal::nn {

// Respects train()/eval(): the identity in evaluation mode.
class Dropout : public Layer {
 public:
  ~Dropout() override;
  explicit Dropout(double p = 0.5) : p_(p) { ops::check_dropout_p(p); }
  Var forward(Var x) override { return frugal::dropout(x, p_, is_training()); }
  double p() const { return p_; }

 private:
  double p_;
};

}  // namespace frugal::nn
