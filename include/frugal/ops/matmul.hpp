#pragma once
// Batched matrix products. The transposes ride along as flags, so a
// backward never materialises a transposed copy.
//
// bf16/f16 operands: the CPU kernel converts them to f32 into its planned
// workspace (backend/cpu/matmul.hpp sizes it), multiplies in f32 (f32 accumulation) and rounds the product on
// store; the output has the inputs' dtype. (OpenBLAS's sbgemm would skip the
// conversion, but Debian's 0.3.21 build does not export it.)
#include "binary.hpp"

namespace frugal::ops {

// C = op(A) · op(B), op(X) = X or Xᵀ over the last two axes. The leading
// (batch) axes broadcast as torch.matmul's do (numpy rules, aligned to the
// right): [B, H, M, K] · [K, N], [B, 1, M, K] · [1, H, K, N] -> [B, H, M, N].
// Neither operand is copied to the broadcast shape: the kernel reads each
// batch item of an operand where it lies (broadcast_item), and the backward
// sums the gradients over the broadcast axes (sum_to).
class MatMul final : public Op {
 public:
  ~MatMul() override;
  MatMul(bool trans_a, bool trans_b) : ta_(trans_a), tb_(trans_b) {}
  bool trans_a() const { return ta_; }
  bool trans_b() const { return tb_; }
  std::string name() const override { return "matmul"; }

  // batch: the output's batch items. An operand is "batched" when it has
  // more than one matrix; "broadcast" when it has more than one but fewer
  // than the output (its items repeat along some axis): then the kernel
  // looks its item up with broadcast_item.
  struct Dims {
    std::int64_t batch, m, k, n;
    bool a_batched, b_batched;
    bool a_broadcast = false, b_broadcast = false;
  };
  Dims dims(const Shape& a, const Shape& b) const {
    auto bad = [&](const std::string& why) {
      fail<ShapeError>("matmul", ta_ ? " (A transposed)" : "", tb_ ? " (B transposed)" : "", ": shapes ", a.str(),
                       " and ", b.str(), " are incompatible: ", why);
    };
    if (a.rank() < 2 || b.rank() < 2) bad("both operands need at least 2 dimensions");
    std::int64_t m = ta_ ? a.dim(-1) : a.dim(-2), ka = ta_ ? a.dim(-2) : a.dim(-1);
    std::int64_t kb = tb_ ? b.dim(-1) : b.dim(-2), n = tb_ ? b.dim(-2) : b.dim(-1);
    if (ka != kb) bad(cat("inner dimensions ", ka, " and ", kb, " differ"));
    const Shape ba(std::vector<std::int64_t>(a.dims().begin(), a.dims().end() - 2)),
        bb(std::vector<std::int64_t>(b.dims().begin(), b.dims().end() - 2));
    auto out = broadcast_shapes(ba, bb);
    if (!out) bad(cat("batch dimensions ", ba.str(), " and ", bb.str(), " do not broadcast"));
    const std::int64_t batch = out->numel(), ia = ba.numel(), ib = bb.numel();
    return {batch, m, ka, n, ia > 1, ib > 1, ia > 1 && ia != batch, ib > 1 && ib != batch};
  }
  // Output batch item i of `out` [..., M, N] reads batch item
  // broadcast_item(x, out, i) of operand x [..., R, C] (its matrices counted
  // row-major over its own leading axes). Allocates nothing (for kernels).
  static std::int64_t broadcast_item(const Shape& x, const Shape& out, std::int64_t i) {
    const int xl = x.rank() - 2, ol = out.rank() - 2;
    std::int64_t item = 0, stride = 1, rest = i;
    for (int d = ol - 1; d >= 0 && d - (ol - xl) >= 0; --d) {
      const std::int64_t od = out[d], idx = rest % od, xd = x[d - (ol - xl)];
      rest /= od;
      if (xd != 1) item += idx * stride;
      stride *= xd;
    }
    return item;
  }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 2);
    expect_float_storage(name(), in[0]);
    expect_same_dtype(name(), in[0], in[1]);
    const Shape &a = in[0].shape, &b = in[1].shape;
    Dims d = dims(a, b);
    std::vector<std::int64_t> out =
        broadcast_shapes(Shape(std::vector<std::int64_t>(a.dims().begin(), a.dims().end() - 2)),
                         Shape(std::vector<std::int64_t>(b.dims().begin(), b.dims().end() - 2)))
            ->dims();
    out.push_back(d.m);
    out.push_back(d.n);
    return {{in[0].dtype, Shape(out)}};
  }
  inline std::vector<std::optional<Var>> backward(const BackwardArgs& args) const override;
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    Dims d = dims(in[0].shape, in[1].shape);
    return {2.0 * double(d.batch * d.m * d.n * d.k), double(in[0].nbytes() + in[1].nbytes() + out[0].nbytes())};
  }

 private:
  bool ta_, tb_;
};

// y = x · wᵀ + b with x [..., in], w [out, in], b [out] (PyTorch's layout).
class Linear final : public Op {
 public:
  ~Linear() override;
  explicit Linear(bool has_bias) : has_bias_(has_bias) {}
  bool has_bias() const { return has_bias_; }
  std::string name() const override { return "linear"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, has_bias_ ? 3 : 2);
    expect_float_storage(name(), in[0]);
    const Shape &x = in[0].shape, &w = in[1].shape;
    expect_same_dtype(name(), in[0], in[1]);
    if (x.rank() < 1 || w.rank() != 2 || x.dim(-1) != w[1])
      fail<ShapeError>("linear: input ", x.str(), " and weight ", w.str(),
                       " are incompatible: the weight must be [out, in] with in = the input's last dimension");
    if (has_bias_) {
      expect_same_dtype(name(), in[0], in[2]);
      if (in[2].shape != Shape{w[0]})
        fail<ShapeError>("linear: bias ", in[2].shape.str(), " does not match weight ", w.str(), " (expected [",
                         w[0], "])");
    }
    std::vector<std::int64_t> out = x.dims();
    out.back() = w[0];
    return {{in[0].dtype, Shape(out)}};
  }
  inline std::vector<std::optional<Var>> backward(const BackwardArgs& args) const override;
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    double rows = double(in[0].shape.numel() / in[0].shape.dim(-1));
    return {2.0 * rows * double(in[1].shape.numel()), double(in[0].nbytes() + in[1].nbytes() + out[0].nbytes())};
  }

 private:
  bool has_bias_;
};

}  // namespace frugal::ops

namespace frugal {

// torch.matmul(a, b), with optional transposes of the last two axes. A 1-D
// operand follows torch.matmul: a [K] is read as [1, K] and b [K] as [K, 1],
// and that dimension is removed from the result (1-D · 1-D is the dot
// product, a scalar). The transpose flags need operands of rank >= 2.
inline Var matmul(Var a, Var b, bool trans_a = false, bool trans_b = false) {
  if (a.rank() == 0 || b.rank() == 0)
    fail<ShapeError>("matmul: both operands need at least 1 dimension, got ", a.meta().str(), " and ",
                     b.meta().str());
  if (a.rank() >= 2 && b.rank() >= 2) return apply1<ops::MatMul>({a, b}, trans_a, trans_b);
  if ((a.rank() == 1 && trans_a) || (b.rank() == 1 && trans_b))
    fail<ShapeError>("matmul: a 1-D operand cannot be transposed (", a.meta().str(), ", ", b.meta().str(), ")");
  const bool a1 = a.rank() == 1, b1 = b.rank() == 1;
  Var a2 = a1 ? ops::reshape(a, {1, a.dim(0)}) : a;
  Var b2 = b1 ? ops::reshape(b, {b.dim(0), 1}) : b;
  Var y = apply1<ops::MatMul>({a2, b2}, trans_a, trans_b);
  const Shape ys = y.shape();
  std::vector<std::int64_t> out(ys.dims().begin(), ys.dims().end() - 2);
  if (!a1) out.push_back(y.dim(-2));
  if (!b1) out.push_back(y.dim(-1));
  return ops::reshape(y, out);
}

// y = x · wᵀ + b. Mixed precision: when x is bf16/f16 and w (and b) f32 --
// f32 master weights -- w and b are cast to x's dtype first, so the
// gradients that reach them are f32 again (the cast's backward).
inline Var linear(Var x, Var w, std::optional<Var> b = std::nullopt) {
  if (is_half(x.dtype()) && w.dtype() == DType::f32) {
    w = cast(w, x.dtype());
    if (b && b->dtype() == DType::f32) b = cast(*b, x.dtype());
  }
  if (b) return apply1<ops::Linear>({x, w, *b}, true);
  return apply1<ops::Linear>({x, w}, false);
}

inline std::vector<std::optional<Var>> ops::MatMul::backward(const BackwardArgs& args) const {
  Var a = args.inputs[0], b = args.inputs[1], g = *args.grad_outputs[0];
  Var ga = ta_ ? matmul(b, g, tb_, true) : matmul(g, b, false, !tb_);
  Var gb = tb_ ? matmul(g, a, true, ta_) : matmul(a, g, !ta_, false);
  // A shared (unbatched) operand's gradient sums over the batch.
  return {sum_to(ga, a.shape()), sum_to(gb, b.shape())};
}

inline std::vector<std::optional<Var>> ops::Linear::backward(const BackwardArgs& args) const {
  Var x = args.inputs[0], w = args.inputs[1], g = *args.grad_outputs[0];
  std::int64_t out = w.dim(0), in = w.dim(1);
  Var g2 = reshape(g, {-1, out}), x2 = reshape(x, {-1, in});
  // Work on 2-D views, so a 1-D input (one sample) needs no special case.
  std::vector<std::optional<Var>> grads{reshape(matmul(g2, w), x.shape().dims()), matmul(g2, x2, true, false)};
  if (has_bias_) grads.push_back(sum(g2, {0}));
  return grads;
}

}  // namespace frugal
