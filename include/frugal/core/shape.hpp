#pragma once
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <ostream>
#include <sstream>
#include <string>
#include <vector>

#include "error.hpp"

namespace frugal {

// The dimensions of a tensor, outermost first. A rank-0 shape is a scalar.
class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<std::int64_t> d) : dims_(d) { check(); }
  explicit Shape(std::vector<std::int64_t> d) : dims_(std::move(d)) { check(); }

  int rank() const { return int(dims_.size()); }
  std::int64_t operator[](int i) const { return dims_[std::size_t(i)]; }
  std::int64_t& operator[](int i) { return dims_[std::size_t(i)]; }
  // Negative axes count from the back, as in numpy.
  std::int64_t dim(int axis) const { return dims_[std::size_t(normalize_axis(axis))]; }
  const std::vector<std::int64_t>& dims() const { return dims_; }
  std::int64_t numel() const {
    std::int64_t n = 1;
    for (auto d : dims_) n *= d;
    return n;
  }
  bool operator==(const Shape&) const = default;

  int normalize_axis(int axis) const {
    int a = axis < 0 ? axis + rank() : axis;
    if (a < 0 || a >= rank()) fail<ShapeError>("axis ", axis, " is out of range for shape ", str());
    return a;
  }

  // Row-major strides in elements.
  std::vector<std::int64_t> strides() const {
    std::vector<std::int64_t> s(dims_.size(), 1);
    for (int i = rank() - 2; i >= 0; --i) s[std::size_t(i)] = s[std::size_t(i) + 1] * dims_[std::size_t(i) + 1];
    return s;
  }

  std::string str() const {
    std::ostringstream os;
    os << '[';
    for (std::size_t i = 0; i < dims_.size(); ++i) os << (i ? ", " : "") << dims_[i];
    os << ']';
    return os.str();
  }

 private:
  void check() const {
    for (auto d : dims_)
      if (d < 0) fail<ShapeError>("shape has a negative dimension: ", str());
  }
  std::vector<std::int64_t> dims_;
};

inline std::ostream& operator<<(std::ostream& os, const Shape& s) { return os << s.str(); }

// numpy broadcasting: align from the right; a dimension of 1 stretches.
inline std::optional<Shape> broadcast_shapes(const Shape& a, const Shape& b) {
  int r = std::max(a.rank(), b.rank());
  std::vector<std::int64_t> out(static_cast<std::size_t>(r));
  for (int i = 0; i < r; ++i) {
    int ia = a.rank() - r + i, ib = b.rank() - r + i;
    std::int64_t da = ia >= 0 ? a[ia] : 1, db = ib >= 0 ? b[ib] : 1;
    if (da != db && da != 1 && db != 1) return std::nullopt;
    out[std::size_t(i)] = da == 1 ? db : da;
  }
  return Shape(out);
}

// A shape seen along one axis as [outer, n, inner]: what the kernels of
// reductions, softmax and arg-extremes over one dimension walk, on every
// backend.
struct AxisView {
  std::int64_t outer = 1, n = 1, inner = 1;
};
inline AxisView axis_view(const Shape& s, int axis) {
  AxisView v;
  for (int d = 0; d < s.rank(); ++d) (d < axis ? v.outer : d == axis ? v.n : v.inner) *= s[d];
  return v;
}

}  // namespace frugal
