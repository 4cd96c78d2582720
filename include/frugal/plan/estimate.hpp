#pragma once
// Whole-process memory of a training step, predicted from its plan: the
// runtime's fixed overhead (code, libraries, thread stacks; a calibrated
// constant per machine and build), the persistent state, the arena up to its
// highest written byte, the host copies of the inputs, and the BLAS library's
// packing workspace, which grows with the largest matrix product.
#include <cmath>

#include "../ops/matmul.hpp"
#include "plan.hpp"

namespace frugal::plan {

struct ProcessEstimate {
  std::size_t overhead = 0;
  std::size_t persistent = 0;
  std::size_t arena = 0;
  std::size_t inputs = 0;
  std::size_t blas_workspace = 0;
  std::size_t total() const { return overhead + persistent + arena + inputs + blas_workspace; }
};

// The edge of the largest matrix product in the plan, as the cube root of
// m*n*k of one GEMM call: the square GEMM of the same work, against which
// BLAS's packing workspace is calibrated. (Tried: sqrt(m*k), the A panel
// OpenBLAS packs per thread; it overpredicts skinny products more than the
// cube root underpredicts them.)
inline double largest_gemm_edge(const Graph& g, const Plan& p) {
  double best = 0;
  for (NodeId n : p.schedule) {
    const Node& node = g.node(n);
    double mnk = 0;
    if (auto* mm = dynamic_cast<const ops::MatMul*>(node.op.get())) {
      auto d = mm->dims(g.value(node.inputs[0]).meta.shape, g.value(node.inputs[1]).meta.shape);
      bool folded = d.a_batched && !d.a_broadcast && !d.b_batched && !mm->trans_a();  // one tall GEMM, as the kernel runs it
      mnk = double(folded ? d.batch * d.m : d.m) * double(d.n) * double(d.k);
    } else if (dynamic_cast<const ops::Linear*>(node.op.get())) {
      const Shape& x = g.value(node.inputs[0]).meta.shape;
      const Shape& w = g.value(node.inputs[1]).meta.shape;
      mnk = double(x.numel() / std::max<std::int64_t>(w[1], 1)) * double(w[0]) * double(w[1]);
    }
    best = std::max(best, std::cbrt(mnk));
  }
  return best;
}

// A calibrated curve: BLAS workspace bytes after one square GEMM of edge n.
struct WorkspaceCurve {
  std::vector<double> edge;        // ascending
  std::vector<std::size_t> bytes;  // measured growth of resident memory
  std::size_t at(double n) const {
    if (edge.empty() || n <= 0) return 0;
    if (n <= edge.front()) return std::size_t(double(bytes.front()) * n / edge.front());
    for (std::size_t i = 1; i < edge.size(); ++i)
      if (n <= edge[i]) {
        double t = (n - edge[i - 1]) / (edge[i] - edge[i - 1]);
        return std::size_t(double(bytes[i - 1]) + t * (double(bytes[i]) - double(bytes[i - 1])));
      }
    return bytes.back();
  }
};

inline ProcessEstimate estimate_process(const Graph& g, const Plan& p, std::size_t input_bytes, std::size_t overhead,
                                        const WorkspaceCurve& blas = {}) {
  return {overhead, p.persistent_bytes, p.peak_bytes, input_bytes, blas.at(largest_gemm_edge(g, p))};
}

}  // namespace frugal::plan
