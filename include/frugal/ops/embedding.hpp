#pragma once
// Embedding lookup, as torch.nn.functional.embedding: out[..., :] =
// table[ids[...], :]. Its backward scatter-adds the output gradient into the
// rows of a zero table gradient; ids get no gradient. Any floating table:
// the lookup only moves rows, and a bf16/f16 backward sums each row in f32
// and rounds it once (a 16-bit running sum would stall on a frequent id).
#include "checks.hpp"

namespace frugal::ops {

inline void expect_ids(const std::string& op, const TensorMeta& ids) {
  if (!is_integer(ids.dtype)) fail<ShapeError>(op, ": ids must be i32 or i64, got ", ids.str());
}

// The multi-index of flat position `flat` in `shape`, for error messages.
inline std::string index_str(std::int64_t flat, const Shape& shape) {
  std::vector<std::int64_t> idx(std::size_t(shape.rank()));
  for (int d = shape.rank() - 1; d >= 0; --d) {
    idx[std::size_t(d)] = shape[d] ? flat % shape[d] : 0;
    flat = shape[d] ? flat / shape[d] : 0;
  }
  return Shape(idx).str();
}

// Inputs (ids, dy [..., D]) -> dtable [rows, D].
class EmbeddingGrad final : public Op {
 public:
  ~EmbeddingGrad() override;
  explicit EmbeddingGrad(std::int64_t rows) : rows_(rows) {}
  std::int64_t rows() const { return rows_; }
  std::string name() const override { return "embedding_grad"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 2);
    expect_ids(name(), in[0]);
    expect_any_floating(name(), in[1]);
    std::vector<std::int64_t> want = in[0].shape.dims();
    if (in[1].shape.rank() != in[0].shape.rank() + 1 ||
        !std::equal(want.begin(), want.end(), in[1].shape.dims().begin()))
      fail<ShapeError>(name(), ": gradient ", in[1].str(), " does not match ids ", in[0].str());
    return {{in[1].dtype, Shape{rows_, in[1].shape.dim(-1)}}};
  }

 private:
  std::int64_t rows_;
};

// Inputs (ids [...], table [V, D]) -> [..., D].
class Embedding final : public Op {
 public:
  ~Embedding() override;
  std::string name() const override { return "embedding"; }
  std::vector<TensorMeta> infer(std::span<const TensorMeta> in) const override {
    expect_arity(name(), in, 2);
    expect_ids(name(), in[0]);
    expect_any_floating(name(), in[1]);
    if (in[1].shape.rank() != 2)
      fail<ShapeError>(name(), ": the table must be [rows, dim], got ", in[1].str(), " (ids ", in[0].str(), ")");
    std::vector<std::int64_t> out = in[0].shape.dims();
    out.push_back(in[1].shape[1]);
    return {{in[1].dtype, Shape(out)}};
  }
  std::vector<std::optional<Var>> backward(const BackwardArgs& a) const override {
    Var table = a.inputs[1];
    return {std::nullopt, apply1<EmbeddingGrad>({a.inputs[0], *a.grad_outputs[0]}, table.dim(0))};
  }
  Cost cost(std::span<const TensorMeta> in, std::span<const TensorMeta> out) const override {
    return {0, double(in[0].nbytes() + 2 * out[0].nbytes())};
  }
};

}  // namespace frugal::ops

namespace frugal {
// table[ids]: ids (i32 or i64) of any shape, table [V, D] -> [..., D]. An id
// outside [0, V) stops the step with a DataError naming it and its position.
inline Var embedding(Var ids, Var table) { return apply1<ops::Embedding>({ids, table}); }
}  // namespace frugal
