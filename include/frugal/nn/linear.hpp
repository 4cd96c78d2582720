#pragma once
#include <cstring>
#include <string>
#include <vector>

#include "../ops/binary.hpp"
#include "../ops/cast.hpp"
#include "../ops/indexing.hpp"
#include "../ops/matmul.hpp"
#include "init.hpp"
#include "module.hpp"

namespace frugal::nn {

// Memory-centric tiling (ZeRO-Infinity, Rajbhandari et al. 2021; DeepSpeed's
// TiledLinear): the weight is held as out_splits x in_splits separate
// parameters, so that each tile, not the whole weight, is what a ZeRO-3 step
// gathers, what backward writes as one gradient and what one reduce-scatter
// sums. A layer whose single weight (or its gradient) is larger than a
// device then still trains, one tile at a time.
struct LinearTiling {
  std::int64_t in_splits = 1;   // pieces of the input features (summed)
  std::int64_t out_splits = 1;  // pieces of the output features (joined)
  bool tiled() const { return in_splits > 1 || out_splits > 1; }
};

struct LinearOptions {
  bool bias = true;
  DType dtype = DType::f32;
  LinearTiling tiling = {};
};

// y = x Wᵀ + b, W of shape [out, in], initialised as PyTorch does.
//
// Tiled (LinearOptions::tiling), W is the parameters "weight_{o}_{i}", the
// block of rows o and columns i of the whole weight, split as evenly as
// torch.tensor_split does (the first pieces one longer); the bias stays one
// parameter "bias". The tiles start as the blocks of the weight an untiled
// Linear draws from the same seed, so the two compute the same function; a
// tiled forward sums the in-splits' products, which rounds differently from
// one product.
class Linear : public Layer {
 public:
  ~Linear() override;
  Linear(std::int64_t in_features, std::int64_t out_features, LinearOptions o = {})
      : in_(in_features), out_(out_features), tiling_(o.tiling) {
    if (in_features <= 0 || out_features <= 0)
      fail<ShapeError>("nn::Linear: features must be positive, got in=", in_features, " out=", out_features);
    if (o.tiling.in_splits < 1 || o.tiling.in_splits > in_features || o.tiling.out_splits < 1 ||
        o.tiling.out_splits > out_features)
      fail<ShapeError>("nn::Linear(", in_features, " -> ", out_features, "): tiling in_splits=", o.tiling.in_splits,
                       " out_splits=", o.tiling.out_splits,
                       " must each be at least 1 and at most its number of features");
    if (!tiling_.tiled()) {
      weight = register_parameter("weight", Tensor({out_features, in_features}, o.dtype));
      if (o.bias) bias = register_parameter("bias", Tensor({out_features}, o.dtype));
      linear_default_init(weight, o.bias ? &bias : nullptr, in_features);
      return;
    }
    // The whole weight is drawn first (the same draws, in the same order, as
    // an untiled Linear's), then cut into its tiles.
    Tensor whole({out_features, in_features}, o.dtype);
    Tensor b = o.bias ? Tensor({out_features}, o.dtype) : Tensor();
    linear_default_init(whole, o.bias ? &b : nullptr, in_features);
    in_sizes_ = even_pieces(in_features, tiling_.in_splits);
    out_sizes_ = even_pieces(out_features, tiling_.out_splits);
    for (std::size_t ro = 0; ro < out_sizes_.size(); ++ro)
      for (std::size_t ci = 0; ci < in_sizes_.size(); ++ci)
        tiles_.push_back(register_parameter("weight_" + std::to_string(ro) + "_" + std::to_string(ci),
                                            Tensor({out_sizes_[ro], in_sizes_[ci]}, o.dtype)));
    if (!whole.is_meta()) cut_into_tiles(whole);
    if (o.bias) bias = register_parameter("bias", b);
  }

  Var forward(Var x) override {
    if (!tiling_.tiled()) {
      if (bias.defined()) return linear(x, var(weight), var(bias));
      return linear(x, var(weight));
    }
    if (x.rank() == 0 || x.dim(-1) != in_)
      fail<ShapeError>("nn::Linear(", in_, " -> ", out_, ", tiled): the input's last axis must be ", in_, ", got ",
                       x.meta().str());
    const int last = int(x.rank()) - 1;
    std::vector<Var> xs = in_sizes_.size() > 1 ? split(x, in_sizes_, last) : std::vector<Var>{x};
    std::vector<Var> ys;
    for (std::size_t ro = 0; ro < out_sizes_.size(); ++ro) {
      Var y = linear(xs[0], var(tile(ro, 0)));
      for (std::size_t ci = 1; ci < xs.size(); ++ci) y = y + linear(xs[ci], var(tile(ro, ci)));
      ys.push_back(y);
    }
    Var y = concat(ys, last);
    if (!bias.defined()) return y;
    Var b = var(bias);
    if (b.dtype() != y.dtype()) b = cast(b, y.dtype());  // f32 master bias under a 16-bit input, as linear() does
    return y + b;
  }

  // The whole weight [out, in] as a value of the current capture: the
  // parameter itself, or its tiles joined (a copy, for the paths that need
  // the weight's rows, as cross-attention does).
  Var weight_value() const {
    if (!tiling_.tiled()) return var(weight);
    std::vector<Var> rows;
    for (std::size_t ro = 0; ro < out_sizes_.size(); ++ro) {
      std::vector<Var> cols;
      for (std::size_t ci = 0; ci < in_sizes_.size(); ++ci) cols.push_back(var(tile(ro, ci)));
      rows.push_back(concat(cols, 1));
    }
    return concat(rows, 0);
  }
  std::optional<Var> bias_value() const {
    if (!bias.defined()) return std::nullopt;
    return var(bias);
  }

  std::int64_t in_features() const { return in_; }
  std::int64_t out_features() const { return out_; }
  const LinearTiling& tiling() const { return tiling_; }
  // Tile (o, i) of a tiled Linear: rows o, columns i of the whole weight.
  const Tensor& tile(std::size_t o, std::size_t i) const {
    if (!tiling_.tiled() || o >= out_sizes_.size() || i >= in_sizes_.size())
      fail("nn::Linear: no tile (", o, ", ", i, ") in a Linear tiled ", tiling_.out_splits, " x ",
           tiling_.in_splits);
    return tiles_[o * in_sizes_.size() + i];
  }

  // Writes a whole weight [out, in] (a PyTorch or untiled checkpoint's) into
  // the tiles, or into the weight of an untiled Linear.
  void copy_weight_from(const Tensor& whole) {
    if (whole.shape() != Shape{out_, in_} || whole.dtype() != (tiling_.tiled() ? tiles_[0] : weight).dtype())
      fail<ShapeError>("nn::Linear(", in_, " -> ", out_, ")::copy_weight_from: a weight must be ",
                       Shape{out_, in_}.str(), " ", dtype_name((tiling_.tiled() ? tiles_[0] : weight).dtype()),
                       ", got ", whole.shape().str(), " ", dtype_name(whole.dtype()));
    if (!tiling_.tiled()) {
      weight.copy_from(whole);
      return;
    }
    if (whole.is_meta() || tiles_[0].is_meta())
      fail("nn::Linear::copy_weight_from: a meta tensor (MetaScope) has no bytes to copy");
    cut_into_tiles(whole);
  }

  // Untiled: the weight. Tiled: undefined (the tiles hold it).
  Tensor weight, bias;

 private:
  // n split into k pieces as torch.tensor_split does.
  static std::vector<std::int64_t> even_pieces(std::int64_t n, std::int64_t k) {
    std::vector<std::int64_t> out(std::size_t(k), n / k);
    for (std::int64_t j = 0; j < n % k; ++j) ++out[std::size_t(j)];
    return out;
  }
  // Each tile's bytes from its block of a whole weight [out, in].
  void cut_into_tiles(const Tensor& whole) {
    const std::size_t es = dtype_size(whole.dtype());
    const auto* src = static_cast<const unsigned char*>(whole.raw());
    std::int64_t r0 = 0;
    for (std::size_t ro = 0; ro < out_sizes_.size(); ++ro) {
      std::int64_t c0 = 0;
      for (std::size_t ci = 0; ci < in_sizes_.size(); ++ci) {
        const std::int64_t rows = out_sizes_[ro], n = in_sizes_[ci];
        auto* dst = static_cast<unsigned char*>(tiles_[ro * in_sizes_.size() + ci].raw());
        for (std::int64_t r = 0; r < rows; ++r)
          std::memcpy(dst + std::size_t(r * n) * es, src + std::size_t((r0 + r) * in_ + c0) * es, std::size_t(n) * es);
        c0 += n;
      }
      r0 += out_sizes_[ro];
    }
  }

  std::int64_t in_, out_;
  LinearTiling tiling_;
  std::vector<std::int64_t> in_sizes_, out_sizes_;
  std::vector<Tensor> tiles_;  // row-major over (o, i), sharing the registered parameters' storage
};

}  // namespace frugal::nn
