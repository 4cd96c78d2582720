// Issue 14's attention part: scaled-dot-product attention that is non-causal
// or masked (ops/sdpa.hpp), matmul with torch.matmul's batch broadcasting,
// MultiHeadAttention with masks and cross-attention, TransformerEncoderLayer
// and SAGEConv on bipartite (sampled) graphs. Each against a float64
// reference written here with naive loops, backward against central finite
// differences (op_harness.hpp), bad input at capture, and budgeted training
// bit for bit equal to the unconstrained step.
#include <algorithm>
#include <cstring>

#include <frugal/data/graph.hpp>
#include <frugal/data/neighbor_sampler.hpp>

#include "op_harness.hpp"
#include "bytes_of.hpp"

using namespace optest;
using frugal::DType;
using frugal::Tensor;
using frugal::Var;
using A = Arrays;
using V = Vars;
using Catch::Matchers::Contains;

namespace {

// ---- float64 references -----------------------------------------------------

// The element of `a` (shape right-aligned to, and broadcastable to, `full`)
// at the multi-index `idx` of `full`: numpy broadcasting.
double broadcast_at(const ref::Array& a, const ref::Dims& idx) {
  const std::size_t lead = idx.size() - a.shape.size();
  ref::Dims own(a.shape.size());
  for (std::size_t d = 0; d < a.shape.size(); ++d) own[d] = a.shape[d] == 1 ? 0 : idx[lead + d];
  return a.v[std::size_t(ref::ravel(own, a.shape))];
}

struct RefMask {
  ref::Array m;  // 0/1 values
  bool true_masks_out;
};

// softmax(scale q kᵀ over the allowed pairs) v, naive; a row with no allowed
// key gives 0 (PyTorch's _safe_softmax).
ref::Array sdpa_ref(const ref::Array& q, const ref::Array& k, const ref::Array& v, const std::vector<RefMask>& masks,
                    bool causal, double scale = 0) {
  const std::size_t r = q.shape.size();
  const std::int64_t tq = q.shape[r - 2], hd = q.shape[r - 1], tk = k.shape[r - 2], hdv = v.shape[r - 1];
  if (scale <= 0) scale = 1.0 / std::sqrt(double(hd));
  const ref::Dims lead(q.shape.begin(), q.shape.end() - 2);
  const std::int64_t batch = ref::numel(lead);
  ref::Dims os = q.shape;
  os.back() = hdv;
  ref::Array o = ref::zeros(os);
  for (std::int64_t b = 0; b < batch; ++b)
    for (std::int64_t i = 0; i < tq; ++i) {
      std::vector<double> s(std::size_t(tk), 0.0);
      std::vector<bool> ok(std::size_t(tk), true);
      double mx = -std::numeric_limits<double>::infinity();
      for (std::int64_t j = 0; j < tk; ++j) {
        ref::Dims idx = ref::unravel(b, lead);
        idx.push_back(i);
        idx.push_back(j);
        bool allowed = !causal || j <= i;
        for (auto& m : masks) allowed = allowed && ((broadcast_at(m.m, idx) != 0) != m.true_masks_out);
        ok[std::size_t(j)] = allowed;
        if (!allowed) continue;
        double dot = 0;
        for (std::int64_t c = 0; c < hd; ++c)
          dot += q.v[std::size_t((b * tq + i) * hd + c)] * k.v[std::size_t((b * tk + j) * hd + c)];
        s[std::size_t(j)] = scale * dot;
        mx = std::max(mx, s[std::size_t(j)]);
      }
      double z = 0;
      for (std::int64_t j = 0; j < tk; ++j)
        if (ok[std::size_t(j)]) z += (s[std::size_t(j)] = std::exp(s[std::size_t(j)] - mx));
      if (z == 0) continue;  // fully masked: o stays 0
      for (std::int64_t j = 0; j < tk; ++j)
        if (ok[std::size_t(j)])
          for (std::int64_t c = 0; c < hdv; ++c)
            o.v[std::size_t((b * tq + i) * hdv + c)] += s[std::size_t(j)] / z * v.v[std::size_t((b * tk + j) * hdv + c)];
    }
  return o;
}

// ---- masks ------------------------------------------------------------------

// A u8 mask of `shape`, element true when pick(flat index) is.
template <class F>
RefMask make_mask(ref::Dims shape, bool true_masks_out, F pick) {
  ref::Array m = ref::zeros(shape);
  for (std::size_t i = 0; i < m.v.size(); ++i) m.v[i] = pick(std::int64_t(i)) ? 1.0 : 0.0;
  return {m, true_masks_out};
}

RefMask random_mask(ref::Dims shape, bool true_masks_out, std::uint64_t seed, double p_true = 0.5) {
  frugal::Rng rng(seed);
  return make_mask(std::move(shape), true_masks_out, [&](std::int64_t) { return rng.uniform() < p_true; });
}

Tensor mask_tensor(const RefMask& m) {
  Tensor t{frugal::Shape(m.m.shape), DType::u8};
  for (std::size_t i = 0; i < m.m.v.size(); ++i) t.data<std::uint8_t>()[i] = m.m.v[i] != 0 ? 1 : 0;
  return t;
}

// An SDPA case: q, k, v drawn by the harness, the masks constants of the step.
Case sdpa_case(std::string name, ref::Dims q, ref::Dims kv, std::vector<RefMask> masks, bool causal,
               std::int64_t hdv = -1) {
  ref::Dims v = kv;
  if (hdv > 0) v.back() = hdv;
  std::vector<Tensor> ts;
  for (auto& m : masks) ts.push_back(mask_tensor(m));
  return {std::move(name),
          {wide(std::move(q)), wide(std::move(kv)), x(std::move(v))},
          [ts, masks, causal](const V& t) {
            std::vector<frugal::AttentionMask> ms;
            for (std::size_t i = 0; i < ts.size(); ++i)
              ms.push_back({frugal::constant(ts[i], "mask" + std::to_string(i)), masks[i].true_masks_out});
            return frugal::masked_attention(t[0], t[1], t[2], ms, causal);
          },
          [masks, causal](const A& a) { return sdpa_ref(a[0], a[1], a[2], masks, causal); }};
}

// The ShapeError a capture of `build` over tensors of these shapes and dtypes raises.
std::string capture_error(std::vector<ref::Dims> shapes, std::vector<DType> dtypes,
                          std::function<Var(const V&)> build) {
  std::vector<Tensor> ts;
  for (std::size_t i = 0; i < shapes.size(); ++i) ts.emplace_back(frugal::Shape(shapes[i]), dtypes[i]);
  return error_message<frugal::ShapeError>([&] {
    auto step = frugal::compile_inference(
        [&] {
          V vs;
          for (std::size_t i = 0; i < ts.size(); ++i)
            vs.push_back(ts[i].dtype() == DType::u8 ? frugal::constant(ts[i], "m" + std::to_string(i))
                                                    : frugal::persistent_var(ts[i], frugal::ValueKind::parameter,
                                                                             "t" + std::to_string(i)));
          return build(vs);
        },
        {});
  });
}

}  // namespace

// ---- scaled-dot-product attention ---------------------------------------------

TEST_CASE("sdpa without a mask, self- and cross-attention, against the reference and finite differences",
          "[attn14][sdpa]") {
  check_op(sdpa_case("sdpa [1,2,4,3]", {1, 2, 4, 3}, {1, 2, 4, 3}, {}, false));
  check_op(sdpa_case("sdpa cross q[2,1,5,3] kv[2,1,3,3]", {2, 1, 5, 3}, {2, 1, 3, 3}, {}, false));
  check_op(sdpa_case("sdpa cross q[2,3,2] kv[2,6,2] hdv 4", {2, 3, 2}, {2, 6, 2}, {}, false, 4));
  check_op(sdpa_case("sdpa [3,2] rank 2", {3, 2}, {5, 2}, {}, false));
  // Several query and key tiles (32 and 64), the last ones partial; hd = 1
  // keeps the finite differences affordable.
  check_op(sdpa_case("sdpa q[1,40,1] kv[1,70,1] tiles", {1, 40, 1}, {1, 70, 1}, {}, false));
}

TEST_CASE("sdpa with key padding, arbitrary boolean masks of broadcast shapes, and causal", "[attn14][sdpa]") {
  // Key padding as nn.MultiheadAttention takes it: [B, Tk], true = masked
  // out, seen as [B, 1, 1, Tk]; the batch's lengths 5 and 3.
  const std::int64_t lens[2] = {5, 3};
  RefMask pad = make_mask({2, 1, 1, 5}, true, [&](std::int64_t f) { return f % 5 >= lens[f / 5]; });
  check_op(sdpa_case("sdpa key padding", {2, 2, 4, 3}, {2, 2, 5, 3}, {pad}, false));
  // F.sdpa's bool attn_mask, true = takes part: [Tq, Tk], [B, 1, Tq, Tk], full.
  check_op(sdpa_case("sdpa mask [Tq,Tk]", {2, 2, 4, 3}, {2, 2, 5, 3}, {random_mask({4, 5}, false, 1, 0.7)}, false));
  check_op(sdpa_case("sdpa mask [B,1,Tq,Tk]", {2, 2, 4, 3}, {2, 2, 5, 3},
                     {random_mask({2, 1, 4, 5}, false, 2, 0.7)}, false));
  check_op(sdpa_case("sdpa mask [B,H,Tq,Tk] drop sense", {2, 2, 3, 2}, {2, 2, 4, 2},
                     {random_mask({2, 2, 3, 4}, true, 3, 0.3)}, false));
  check_op(sdpa_case("sdpa mask [Tk]", {1, 2, 3, 2}, {1, 2, 4, 2}, {random_mask({4}, false, 4, 0.6)}, false));
  // Two masks at once, and causal (top-left) with a mask.
  check_op(sdpa_case("sdpa padding + mask", {2, 2, 4, 3}, {2, 2, 5, 3}, {pad, random_mask({4, 5}, true, 5, 0.2)},
                     false));
  check_op(sdpa_case("sdpa causal", {1, 2, 5, 3}, {1, 2, 5, 3}, {}, true));
  check_op(sdpa_case("sdpa causal Tq > Tk", {1, 1, 6, 2}, {1, 1, 4, 2}, {}, true));
  check_op(sdpa_case("sdpa causal + padding", {2, 1, 5, 3}, {2, 1, 5, 3}, {pad}, true));
  // Random masks over several tiles.
  check_op(sdpa_case("sdpa tiles + mask", {1, 40, 1}, {1, 70, 1}, {random_mask({40, 70}, false, 6, 0.5)}, false));
}

TEST_CASE("sdpa: a fully masked row gives 0 and passes no gradient, as PyTorch's _safe_softmax", "[attn14][sdpa]") {
  // Row 1 of every batch entry sees no key; row 2 of batch 1 neither.
  RefMask m = make_mask({2, 1, 4, 5}, false, [](std::int64_t f) {
    const std::int64_t b = f / 20, i = f / 5 % 4;
    return !(i == 1 || (b == 1 && i == 2));
  });
  const Case c = sdpa_case("sdpa fully masked rows", {2, 2, 4, 3}, {2, 2, 5, 3}, {m}, false);
  check_op(c);  // the reference gives 0 there, and finite differences 0
  // The output itself: exactly 0 (not NaN) in those rows, in both dtypes.
  frugal::Rng rng(seed_of(c.name));
  A vals;
  for (auto& in : c.inputs) vals.push_back(draw_array(rng, in));
  for (DType dt : {DType::f32, DType::f64}) {
    const std::vector<double> y = to_doubles(run_forward(c, vals, dt));
    for (std::int64_t b = 0; b < 2; ++b)
      for (std::int64_t h = 0; h < 2; ++h)
        for (std::int64_t c2 = 0; c2 < 3; ++c2) {
          CHECK(y[std::size_t(((b * 2 + h) * 4 + 1) * 3 + c2)] == 0.0);
          if (b == 1) CHECK(y[std::size_t(((b * 2 + h) * 4 + 2) * 3 + c2)] == 0.0);
          CHECK(std::isfinite(y[std::size_t(((b * 2 + h) * 4 + 0) * 3 + c2)]));
        }
  }
}

TEST_CASE("sdpa stores nothing T x T: a training step's whole arena is below one head's score matrix",
          "[attn14][sdpa]") {
  // Issue 14: flash-style like causal_attention. With T = 1024 and head
  // dim 8, one head's Tq x Tk scores would be 4 MiB in f32; q, k, v, their
  // gradients, the output and the logsumexp are 32 KiB each or less. So a
  // step that materialised the scores (as a value, or as kernel scratch the
  // planner places) could not fit in 1 MiB. Masked (key padding) and
  // causal, forward and backward.
  const std::int64_t B = 1, H = 2, T = 1024, hd = 8;
  frugal::Rng rng(1024);
  auto filled = [&](frugal::Shape s) {
    Tensor t(std::move(s));
    for (std::int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(rng.uniform()) - 0.5f;
    return t;
  };
  Tensor q = filled({B, H, T, hd}), k = filled({B, H, T, hd}), v = filled({B, H, T, hd});
  Tensor pad{frugal::Shape{B, 1, 1, T}, DType::u8};
  for (std::int64_t j = 0; j < T; ++j) pad.data<std::uint8_t>()[j] = j >= T - 100;  // the last 100 keys are padding
  for (bool causal : {false, true}) {
    INFO((causal ? "causal" : "non-causal"));
    frugal::Step step = frugal::compile_gradients(
        [&] {
          Var qv = frugal::persistent_var(q, frugal::ValueKind::parameter, "q");
          Var kv = frugal::persistent_var(k, frugal::ValueKind::parameter, "k");
          Var vv = frugal::persistent_var(v, frugal::ValueKind::parameter, "v");
          Var o = frugal::masked_attention(qv, kv, vv, {{frugal::constant(pad, "pad"), true}}, causal);
          return frugal::sum(o * o);
        },
        {}, {q, k, v});
    const std::size_t scores = std::size_t(T * T) * sizeof(float);
    CHECK(step.plan().peak_bytes < scores / 4);
    const auto audit = step.audit();
    CHECK(audit.high_water == audit.predicted);
    CHECK(audit.canary_intact);
    CHECK(std::isfinite(step.run()));
    const std::vector<float> g = step.grad(q).to_vector<float>();
    CHECK(std::all_of(g.begin(), g.end(), [](float e) { return std::isfinite(e); }));
  }
  // The bound tells the two apart: attention from matmul and softmax plans
  // the scores, and needs more than one head's matrix.
  frugal::Step naive = frugal::compile_gradients(
      [&] {
        Var qv = frugal::persistent_var(q, frugal::ValueKind::parameter, "q");
        Var kv = frugal::persistent_var(k, frugal::ValueKind::parameter, "k");
        Var vv = frugal::persistent_var(v, frugal::ValueKind::parameter, "v");
        Var o = frugal::matmul(frugal::softmax(frugal::matmul(qv, kv, false, true) * (1 / std::sqrt(double(hd))), -1), vv);
        return frugal::sum(o * o);
      },
      {}, {q, k, v});
  CHECK(naive.plan().peak_bytes > std::size_t(T * T) * sizeof(float));
}

TEST_CASE("sdpa bad input is a ShapeError at capture naming what was wrong", "[attn14][sdpa]") {
  const DType f = DType::f32, u = DType::u8;
  auto sdpa_mask = [](const V& v) { return frugal::scaled_dot_product_attention(v[0], v[1], v[2], v[3]); };
  auto m = capture_error({{2, 4, 3}, {2, 5, 3}, {2, 5, 3}, {4, 4}}, {f, f, f, u}, sdpa_mask);
  CHECK_THAT(m, Contains("scaled_dot_product_attention") && Contains("mask [4, 4]") &&
                    Contains("[2, 4, 5]"));
  m = capture_error({{2, 4, 3}, {2, 5, 3}, {2, 5, 3}, {4, 5}}, {f, f, f, f}, sdpa_mask);
  CHECK_THAT(m, Contains("scaled_dot_product_attention") && Contains("u8") && Contains("f32"));
  m = capture_error({{2, 4, 3}, {2, 5, 2}, {2, 5, 3}}, {f, f, f},
                    [](const V& v) { return frugal::scaled_dot_product_attention(v[0], v[1], v[2]); });
  CHECK_THAT(m, Contains("head dimensions differ"));
  m = capture_error({{2, 4, 3}, {2, 5, 3}, {2, 4, 3}}, {f, f, f},
                    [](const V& v) { return frugal::scaled_dot_product_attention(v[0], v[1], v[2]); });
  CHECK_THAT(m, Contains("different numbers of keys"));
  m = capture_error({{2, 4, 3}, {2, 5, 3}, {2, 5, 3}, {5}, {5}, {5}}, {f, f, f, u, u, u}, [](const V& v) {
    return frugal::masked_attention(v[0], v[1], v[2], {{v[3], true}, {v[4], true}, {v[5], true}});
  });
  CHECK_THAT(m, Contains("at most 2 masks"));
}

// ---- matmul with torch.matmul's broadcasting ----------------------------------

namespace {

// torch.matmul, naive: 1-D operands promoted and the added axis removed,
// batch axes broadcast; ta / tb transpose the last two axes first.
ref::Array matmul_ref(ref::Array a, ref::Array b, bool ta = false, bool tb = false) {
  const bool a1 = a.shape.size() == 1, b1 = b.shape.size() == 1;
  if (a1) a.shape = {1, a.shape[0]};
  if (b1) b.shape = {b.shape[0], 1};
  auto at = [](const ref::Array& x, bool t, ref::Dims idx, std::int64_t r, std::int64_t c) {
    if (t) std::swap(r, c);
    idx.push_back(r);
    idx.push_back(c);
    return broadcast_at(x, idx);
  };
  const std::size_t ra = a.shape.size(), rb = b.shape.size();
  const std::int64_t m = ta ? a.shape[ra - 1] : a.shape[ra - 2], k = ta ? a.shape[ra - 2] : a.shape[ra - 1];
  const std::int64_t n = tb ? b.shape[rb - 2] : b.shape[rb - 1];
  const std::size_t L = std::max(ra, rb) - 2, la = ra - 2, lb = rb - 2;
  ref::Dims lead(L, 1);
  for (std::size_t d = 0; d < L; ++d) {
    const std::int64_t da = d >= L - la ? a.shape[d - (L - la)] : 1, db = d >= L - lb ? b.shape[d - (L - lb)] : 1;
    lead[d] = std::max(da, db);
  }
  ref::Dims os = lead;
  os.push_back(m);
  os.push_back(n);
  ref::Array o = ref::zeros(os);
  for (std::int64_t f = 0; f < ref::numel(lead); ++f) {
    const ref::Dims idx = ref::unravel(f, lead);
    // The operands' own leading index: the last (rank - 2) axes of idx.
    ref::Dims ia(idx.end() - std::ptrdiff_t(ra - 2), idx.end()), ib(idx.end() - std::ptrdiff_t(rb - 2), idx.end());
    for (std::size_t d = 0; d < ia.size(); ++d) ia[d] = a.shape[d] == 1 ? 0 : ia[d];
    for (std::size_t d = 0; d < ib.size(); ++d) ib[d] = b.shape[d] == 1 ? 0 : ib[d];
    for (std::int64_t i = 0; i < m; ++i)
      for (std::int64_t j = 0; j < n; ++j) {
        double s = 0;
        for (std::int64_t c = 0; c < k; ++c) s += at(a, ta, ia, i, c) * at(b, tb, ib, c, j);
        o.v[std::size_t((f * m + i) * n + j)] = s;
      }
  }
  ref::Dims final_shape = lead;
  if (!a1) final_shape.push_back(m);
  if (!b1) final_shape.push_back(n);
  o.shape = final_shape;
  return o;
}

Case batched_mm(std::string name, ref::Dims a, ref::Dims b, bool ta = false, bool tb = false) {
  return {std::move(name),
          {x(std::move(a)), x(std::move(b))},
          [ta, tb](const V& t) { return frugal::matmul(t[0], t[1], ta, tb); },
          [ta, tb](const A& v) { return matmul_ref(v[0], v[1], ta, tb); }};
}

}  // namespace

TEST_CASE("matmul broadcasts batch axes as torch.matmul, forward and backward (summed over broadcast axes)",
          "[attn14][matmul]") {
  check_op(batched_mm("mm [2,3,4,5]@[5,2]", {2, 3, 4, 5}, {5, 2}));
  check_op(batched_mm("mm [3,4]@[2,2,4,3]", {3, 4}, {2, 2, 4, 3}));
  check_op(batched_mm("mm [2,1,3,4]@[1,3,4,2]", {2, 1, 3, 4}, {1, 3, 4, 2}));
  check_op(batched_mm("mm [2,1,3,4]@[3,4,2] rank differs", {2, 1, 3, 4}, {3, 4, 2}));
  check_op(batched_mm("mm [1,3,4]@[2,4,2]", {1, 3, 4}, {2, 4, 2}));
  check_op(batched_mm("mm [2,1,4,3]^T@[1,3,2,4]^T", {2, 1, 4, 3}, {1, 3, 2, 4}, true, true));
  check_op(batched_mm("mm [2,3,1,4,3]^T@[3,3,2] 5-D", {2, 3, 1, 4, 3}, {3, 4, 2}, true, false));
}

TEST_CASE("matmul with 1-D operands follows torch.matmul", "[attn14][matmul]") {
  check_op(batched_mm("mm [4]@[4] dot", {4}, {4}));
  check_op(batched_mm("mm [4]@[4,3]", {4}, {4, 3}));
  check_op(batched_mm("mm [3,4]@[4]", {3, 4}, {4}));
  check_op(batched_mm("mm [4]@[2,4,3]", {4}, {2, 4, 3}));
  check_op(batched_mm("mm [2,2,3,4]@[4]", {2, 2, 3, 4}, {4}));
}

TEST_CASE("matmul shape errors name the shapes and what is wrong", "[attn14][matmul]") {
  const DType f = DType::f32;
  auto mmv = [](const V& v) { return frugal::matmul(v[0], v[1]); };
  auto m = capture_error({{2, 3, 4}, {3, 4, 5}}, {f, f}, mmv);
  CHECK_THAT(m, Contains("matmul") && Contains("[2, 3, 4]") && Contains("[3, 4, 5]") && Contains("broadcast"));
  m = capture_error({{3, 4}, {5, 2}}, {f, f}, mmv);
  CHECK_THAT(m, Contains("inner dimensions 4 and 5"));
  m = capture_error({{4}, {4, 3}}, {f, f}, [](const V& v) { return frugal::matmul(v[0], v[1], true, false); });
  CHECK_THAT(m, Contains("1-D operand cannot be transposed"));
  m = capture_error({{4}, {5}}, {f, f}, mmv);
  CHECK_THAT(m, Contains("inner dimensions 4 and 5"));
}

// ---- layers: MultiHeadAttention with masks, TransformerEncoderLayer ------------

namespace {

// y = x wᵀ + b over the last axis of x; rows [r0, r0 + out) of w (and b).
ref::Array linear_ref(const ref::Array& x, const Tensor& w, const Tensor* b, std::int64_t r0 = 0,
                      std::int64_t out = -1) {
  const std::int64_t in = w.shape()[1];
  if (out < 0) out = w.shape()[0];
  ref::Dims s = x.shape;
  s.back() = out;
  ref::Array y = ref::zeros(s);
  const std::int64_t rows = ref::numel(x.shape) / in;
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t o = 0; o < out; ++o) {
      double acc = b ? b->data<double>()[r0 + o] : 0.0;
      for (std::int64_t c = 0; c < in; ++c) acc += x.v[std::size_t(r * in + c)] * w.data<double>()[(r0 + o) * in + c];
      y.v[std::size_t(r * out + o)] = acc;
    }
  return y;
}

ref::Array layer_norm_ref(const ref::Array& x, const Tensor& w, const Tensor& b, double eps) {
  const std::int64_t d = x.shape.back(), rows = ref::numel(x.shape) / d;
  ref::Array y = x;
  for (std::int64_t r = 0; r < rows; ++r) {
    double mu = 0, var = 0;
    for (std::int64_t c = 0; c < d; ++c) mu += x.v[std::size_t(r * d + c)];
    mu /= double(d);
    for (std::int64_t c = 0; c < d; ++c) var += std::pow(x.v[std::size_t(r * d + c)] - mu, 2);
    var /= double(d);
    for (std::int64_t c = 0; c < d; ++c)
      y.v[std::size_t(r * d + c)] =
          (x.v[std::size_t(r * d + c)] - mu) / std::sqrt(var + eps) * w.data<double>()[c] + b.data<double>()[c];
  }
  return y;
}

ref::Array add_ref(ref::Array a, const ref::Array& b) {
  for (std::size_t i = 0; i < a.v.size(); ++i) a.v[i] += b.v[i];
  return a;
}

// [B, T, H * hd] <-> [B, H, T, hd]
ref::Array heads_ref(const ref::Array& x, std::int64_t H) {
  const std::int64_t B = x.shape[0], T = x.shape[1], hd = x.shape[2] / H;
  ref::Array y = ref::zeros({B, H, T, hd});
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t c = 0; c < hd; ++c)
          y.v[std::size_t(((b * H + h) * T + t) * hd + c)] = x.v[std::size_t((b * T + t) * H * hd + h * hd + c)];
  return y;
}
ref::Array merge_heads_ref(const ref::Array& y) {
  const std::int64_t B = y.shape[0], H = y.shape[1], T = y.shape[2], hd = y.shape[3];
  ref::Array x = ref::zeros({B, T, H * hd});
  for (std::int64_t b = 0; b < B; ++b)
    for (std::int64_t t = 0; t < T; ++t)
      for (std::int64_t h = 0; h < H; ++h)
        for (std::int64_t c = 0; c < hd; ++c)
          x.v[std::size_t((b * T + t) * H * hd + h * hd + c)] = y.v[std::size_t(((b * H + h) * T + t) * hd + c)];
  return x;
}

// nn.MultiheadAttention's math with frugal's parameter layout (qkv, proj).
ref::Array mha_ref(frugal::nn::MultiHeadAttention& m, const ref::Array& q, const ref::Array& k, const ref::Array& v,
                   const std::vector<RefMask>& masks, bool causal) {
  const std::int64_t d = q.shape[2], H = m.heads();
  const Tensor* b = m.qkv.bias.defined() ? &m.qkv.bias : nullptr;
  ref::Array o = sdpa_ref(heads_ref(linear_ref(q, m.qkv.weight, b, 0, d), H),
                          heads_ref(linear_ref(k, m.qkv.weight, b, d, d), H),
                          heads_ref(linear_ref(v, m.qkv.weight, b, 2 * d, d), H), masks, causal);
  return linear_ref(merge_heads_ref(o), m.proj.weight, m.proj.bias.defined() ? &m.proj.bias : nullptr);
}

Tensor f64_tensor(const ref::Array& a) { return to_tensor(a, DType::f64); }

ref::Array draw(ref::Dims s, std::uint64_t seed) {
  frugal::Rng rng(seed);
  return draw_array(rng, x(std::move(s)));
}

}  // namespace

TEST_CASE("MultiHeadAttention: masks (PyTorch's true = not allowed), non-causal, cross-attention, vs float64",
          "[attn14][nn]") {
  const std::int64_t B = 2, tq = 3, tk = 5, d = 8, H = 2;
  frugal::nn::manual_seed(3);
  frugal::nn::MultiHeadAttention m(d, H, {.dtype = DType::f64, .causal = false});
  const ref::Array q = draw({B, tq, d}, 1), kv = draw({B, tk, d}, 2), kv2 = draw({B, tk, d}, 3);
  RefMask pad = make_mask({B, tk}, true, [](std::int64_t f) { return f % 5 >= (f / 5 == 0 ? 5 : 2); });
  RefMask am = random_mask({tq, tk}, true, 9, 0.3);
  const Tensor qt = f64_tensor(q), kt = f64_tensor(kv), vt = f64_tensor(kv2), pt = mask_tensor(pad),
               at = mask_tensor(am);
  auto run = [&](auto build) {
    frugal::Step s = frugal::compile_inference(build, {});
    s.run();
    return to_doubles(s.output(0));
  };
  auto c = [](const Tensor& t, const char* n) { return frugal::constant(t, n); };
  // Cross-attention with key padding and attn_mask.
  std::vector<double> got = run([&] {
    return m.forward(c(qt, "q"), c(kt, "k"), c(vt, "v"), {c(pt, "pad"), c(at, "am")});
  });
  RefMask pad4{pad.m, true};
  pad4.m.shape = {B, 1, 1, tk};
  ref::Array want = mha_ref(m, q, kv, kv2, {pad4, am}, false);
  expect_close("mha cross + masks", got, want.v, want.shape, 1e-12);
  // Self-attention, non-causal, no mask; and [B * heads, Tq, Tk] attn_mask.
  got = run([&] { return m.forward(c(kt, "x")); });
  want = mha_ref(m, kv, kv, kv, {}, false);
  expect_close("mha self non-causal", got, want.v, want.shape, 1e-12);
  RefMask bh = random_mask({B * H, tk, tk}, true, 11, 0.3);
  const Tensor bht = mask_tensor(bh);
  got = run([&] { return m.forward(c(kt, "x"), {std::nullopt, c(bht, "am")}); });
  RefMask bh4 = bh;
  bh4.m.shape = {B, H, tk, tk};
  want = mha_ref(m, kv, kv, kv, {bh4}, false);
  expect_close("mha self [B*H,T,T] mask", got, want.v, want.shape, 1e-12);
  // Causal (the default) with a padding mask takes the masked path; without, the packed one.
  frugal::nn::MultiHeadAttention mc(d, H, {.dtype = DType::f64});
  got = run([&] { return mc.forward(c(kt, "x"), {c(pt, "pad"), std::nullopt}); });
  want = mha_ref(mc, kv, kv, kv, {pad4}, true);
  expect_close("mha causal + padding", got, want.v, want.shape, 1e-12);
  got = run([&] { return mc.forward(c(kt, "x")); });
  want = mha_ref(mc, kv, kv, kv, {}, true);
  expect_close("mha causal packed", got, want.v, want.shape, 1e-12);
  // Bad masks are named at capture.
  auto msg = error_message<frugal::ShapeError>([&] { run([&] { return m.forward(c(kt, "x"), {c(at, "pad"), std::nullopt}); }); });
  CHECK_THAT(msg, Contains("key_padding_mask") && Contains("[2, 5]") && Contains("[3, 5]"));
  msg = error_message<frugal::ShapeError>([&] { run([&] { return m.forward(c(qt, "q"), c(kt, "k"), c(qt, "v")); }); });
  CHECK_THAT(msg, Contains("number of keys"));
}

TEST_CASE("TransformerEncoderLayer (post- and pre-norm, relu and gelu, padding) against float64", "[attn14][nn]") {
  const std::int64_t B = 2, T = 4, d = 8, H = 2, ff = 12;
  const ref::Array xa = draw({B, T, d}, 21);
  const Tensor xt = f64_tensor(xa);
  RefMask pad = make_mask({B, T}, true, [](std::int64_t f) { return f % 4 >= (f / 4 == 0 ? 4 : 3); });
  const Tensor pt = mask_tensor(pad);
  RefMask pad4{pad.m, true};
  pad4.m.shape = {B, 1, 1, T};
  for (bool norm_first : {false, true})
    for (std::string act : {"relu", "gelu"})
      for (bool causal : {false, true}) {
        INFO("norm_first " << norm_first << " activation " << act << " causal " << causal);
        frugal::nn::manual_seed(7);
        frugal::nn::TransformerEncoderLayer layer(
            d, H, {.dim_feedforward = ff, .dropout = 0.0, .activation = act, .norm_first = norm_first, .dtype = DType::f64});
        auto names = layer.named_parameters();
        CHECK(names[0].first == "self_attn.qkv.weight");
        CHECK(names.back().first == "norm2.bias");
        frugal::Step s = frugal::compile_inference(
            [&] { return layer.forward(frugal::constant(xt, "x"), std::nullopt, frugal::constant(pt, "pad"), causal); },
            {});
        s.run();
        auto sa = [&](const ref::Array& h) { return mha_ref(layer.self_attn, h, h, h, {pad4}, causal); };
        auto ffb = [&](const ref::Array& h) {
          ref::Array u = linear_ref(h, layer.linear1.weight, &layer.linear1.bias);
          for (auto& e : u.v) e = act == "relu" ? std::max(e, 0.0) : 0.5 * e * (1 + std::erf(e / std::sqrt(2.0)));
          return linear_ref(u, layer.linear2.weight, &layer.linear2.bias);
        };
        auto n1 = [&](const ref::Array& h) { return layer_norm_ref(h, layer.norm1.weight, layer.norm1.bias, 1e-5); };
        auto n2 = [&](const ref::Array& h) { return layer_norm_ref(h, layer.norm2.weight, layer.norm2.bias, 1e-5); };
        ref::Array y = xa;
        if (norm_first) {
          y = add_ref(y, sa(n1(y)));
          y = add_ref(y, ffb(n2(y)));
        } else {
          y = n1(add_ref(y, sa(y)));
          y = n2(add_ref(y, ffb(y)));
        }
        expect_close("encoder layer", to_doubles(s.output(0)), y.v, y.shape, 1e-11);
      }
  auto msg = error_message<frugal::ShapeError>([] { frugal::nn::TransformerEncoderLayer bad(8, 2, {.activation = "tanh"}); });
  CHECK_THAT(msg, Contains("activation") && Contains("tanh"));
}

// ---- SAGEConv on sampled bipartite blocks -------------------------------------

namespace {

namespace fd = frugal::data;

fd::Csr ring_graph(std::int64_t n) {  // node i aggregates from i-1, i+1, i+3 (mod n)
  std::vector<std::int64_t> r, c;
  for (std::int64_t i = 0; i < n; ++i)
    for (std::int64_t o : {n - 1, std::int64_t(1), std::int64_t(3)}) r.push_back(i), c.push_back((i + o) % n);
  return fd::coalesce(fd::from_edges(n, n, r, c));
}

}  // namespace

TEST_CASE("the neighbour sampler makes blocks whose destinations lead their sources", "[attn14][graph]") {
  const fd::Csr g = ring_graph(30);
  const std::vector<std::int64_t> seeds{4, 17, 9}, fanouts{2, 3};
  const fd::SampledSubgraph s = fd::sample_neighbors(g, seeds, fanouts, 5);
  REQUIRE(s.blocks.size() == 2);
  CHECK(std::vector<std::int64_t>(s.nodes.begin(), s.nodes.begin() + 3) == seeds);
  CHECK(s.blocks[1].rows == 3);                      // the last layer's destinations: the seeds
  CHECK(s.blocks[0].rows == s.blocks[1].cols);       // layer 0 produces what layer 1 reads
  CHECK(s.blocks[0].cols == std::int64_t(s.nodes.size()));
  for (std::size_t l = 0; l < 2; ++l) {
    const fd::Csr& b = s.blocks[l];
    for (std::int64_t i = 0; i < b.rows; ++i) {
      const std::int64_t deg = b.row_ptr[std::size_t(i + 1)] - b.row_ptr[std::size_t(i)];
      CHECK(deg == std::min<std::int64_t>(3, fanouts[l]));  // every ring node has 3 neighbours
      for (std::int64_t p = b.row_ptr[std::size_t(i)]; p < b.row_ptr[std::size_t(i + 1)]; ++p) {
        CHECK(b.values[std::size_t(p)] == 1.0 / double(deg));  // mean aggregation
        // A sampled edge is an edge of the graph, in global ids.
        const std::int64_t gi = s.nodes[std::size_t(i)], gj = s.nodes[std::size_t(b.col[std::size_t(p)])];
        CHECK(std::find(g.col.begin() + g.row_ptr[std::size_t(gi)], g.col.begin() + g.row_ptr[std::size_t(gi + 1)],
                        gj) != g.col.begin() + g.row_ptr[std::size_t(gi + 1)]);
      }
    }
  }
  // The same seed draws the same subgraph.
  CHECK(fd::sample_neighbors(g, seeds, fanouts, 5).nodes == s.nodes);
  auto msg = error_message<frugal::DataError>([&] { fd::sample_neighbors(g, std::vector<std::int64_t>{3, 3}, fanouts, 1); });
  CHECK_THAT(msg, Contains("seed 3 appears twice"));
}

TEST_CASE("SAGEConv on a bipartite block: lin_l(A x_src) + lin_r(x_dst) against float64, and errors",
          "[attn14][graph]") {
  const fd::Csr g = ring_graph(20);
  const std::vector<std::int64_t> seeds{2, 11}, fanouts{2};
  const fd::SampledSubgraph s = fd::sample_neighbors(g, seeds, fanouts, 3);
  const fd::Csr& blk = s.blocks[0];
  const std::int64_t n_src = blk.cols, n_dst = blk.rows, in = 5, out = 3;
  frugal::SparseMatrix sm = fd::to_sparse(blk, DType::f64);
  frugal::nn::SAGEConv conv(in, out, {.dtype = DType::f64});
  const ref::Array xa = draw({n_src, in}, 31);
  const Tensor xt = f64_tensor(xa);
  // Reference: mean over sampled neighbours, then the two linears.
  const std::vector<double> a = blk.dense();
  ref::Array agg = ref::zeros({n_dst, in}), xd = ref::zeros({n_dst, in});
  for (std::int64_t i = 0; i < n_dst; ++i)
    for (std::int64_t c = 0; c < in; ++c) {
      for (std::int64_t j = 0; j < n_src; ++j)
        agg.v[std::size_t(i * in + c)] += a[std::size_t(i * n_src + j)] * xa.v[std::size_t(j * in + c)];
      xd.v[std::size_t(i * in + c)] = xa.v[std::size_t(i * in + c)];
    }
  ref::Array want = add_ref(linear_ref(agg, conv.lin_l.weight, &conv.lin_l.bias), linear_ref(xd, conv.lin_r.weight, nullptr));
  for (int form = 0; form < 2; ++form) {
    frugal::Step st = frugal::compile_inference(
        [&] {
          Var xv = frugal::constant(xt, "x");
          return form == 0 ? conv(xv, sm) : conv(xv, frugal::slice(xv, 0, 0, n_dst), sm);
        },
        {});
    st.run();
    expect_close(form == 0 ? "sage bipartite (x_dst = x[:n_dst])" : "sage bipartite (x_src, x_dst)",
                 to_doubles(st.output(0)), want.v, want.shape, 1e-12);
  }
  auto msg = error_message<frugal::ShapeError>([&] {
    frugal::compile_inference([&] { Var xv = frugal::constant(xt, "x"); return conv(xv, xv, sm); }, {});
  });
  CHECK_THAT(msg, Contains("SAGEConv") && Contains("x_dst") && Contains("[" + std::to_string(n_dst) + ", " + std::to_string(in) + "]"));
}

// ---- budgets: the new ops under a tight budget, bit for bit -------------------

namespace {

struct AttentionBudgetRun {
  std::vector<float> losses;
  std::vector<std::vector<char>> params;
  frugal::Plan plan;
};


// A tiny sequence classifier: encoder layer (dropout on, padding mask) ->
// cross-attention of a learned query over it -> broadcast matmul -> mean ->
// cross-entropy; 4 steps of AdamW.
AttentionBudgetRun train_encoder(frugal::Budget budget, int steps) {
  const std::int64_t B = 3, T = 6, d = 16, H = 2, classes = 4;
  frugal::nn::manual_seed(11);
  frugal::nn::TransformerEncoderLayer enc(d, H, {.dim_feedforward = 32, .dropout = 0.1, .activation = "gelu"});
  frugal::nn::MultiHeadAttention pool(d, H, {.causal = false});
  frugal::nn::Linear head(d, classes);
  Tensor query({1, 2, d}), mix({1, 2, d, d}), pad({B, T}, DType::u8);
  frugal::Rng r(4);
  for (std::int64_t i = 0; i < query.numel(); ++i) query.data<float>()[i] = float(r.uniform() - 0.5);
  for (std::int64_t i = 0; i < mix.numel(); ++i) mix.data<float>()[i] = float(r.uniform() - 0.5) * 0.3f;
  for (std::int64_t i = 0; i < B * T; ++i) pad.data<std::uint8_t>()[i] = i % T >= T - i / T;  // lengths 6, 5, 4
  std::vector<Tensor> params = enc.parameters();
  for (auto& t : pool.parameters()) params.push_back(t);
  for (auto& t : head.parameters()) params.push_back(t);
  params.push_back(query);
  params.push_back(mix);
  frugal::optim::AdamW opt(params, {.lr = 1e-2});
  frugal::Step step = frugal::compile(
      [&](Var x, Var y) {
        Var p = frugal::constant(pad, "pad");
        Var h = enc.forward(x, std::nullopt, p);
        Var qv = frugal::persistent_var(query, frugal::ValueKind::parameter, "query");
        Var qb = frugal::broadcast_to(qv, frugal::Shape{B, 2, d});
        Var z = pool.forward(qb, h, h, {p, std::nullopt});                       // [B, 2, d]
        Var m = frugal::matmul(frugal::reshape(z, {B, 1, 2, d}),
                               frugal::persistent_var(mix, frugal::ValueKind::parameter, "mix"));  // [B, 2, 2, d]
        return frugal::cross_entropy(head(frugal::mean(m, {1, 2})), y);
      },
      {frugal::input<float>({B, T, d}), frugal::input<std::int32_t>({B})}, opt, budget);
  AttentionBudgetRun run;
  run.plan = step.plan();
  for (int s = 0; s < steps; ++s) {
    frugal::Rng dr(100 + std::uint64_t(s));
    Tensor x({B, T, d}), y({B}, DType::i32);
    for (std::int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = float(dr.uniform() * 2 - 1);
    for (std::int64_t i = 0; i < B; ++i) y.data<std::int32_t>()[i] = std::int32_t(dr.below(classes));
    run.losses.push_back(step.run(x, y));
  }
  for (auto& t : params) run.params.push_back(bytes_of(t));
  return run;
}

// Two SAGEConv layers on one sampled minibatch of a ring graph.
AttentionBudgetRun train_sage(frugal::Budget budget, int steps) {
  const fd::Csr g = ring_graph(64);
  const std::vector<std::int64_t> seeds{1, 9, 20, 33, 47, 60}, fanouts{3, 2};
  const fd::SampledSubgraph s = fd::sample_neighbors(g, seeds, fanouts, 8);
  const frugal::SparseMatrix b0 = fd::to_sparse(s.blocks[0]), b1 = fd::to_sparse(s.blocks[1]);
  const std::int64_t n_src = s.blocks[0].cols, in = 8, classes = 3;
  frugal::nn::manual_seed(12);
  frugal::nn::SAGEConv c1(in, 16), c2(16, classes);
  std::vector<Tensor> params = c1.parameters();
  for (auto& t : c2.parameters()) params.push_back(t);
  frugal::optim::SGD opt(params, {.lr = 0.1, .momentum = 0.9});
  Tensor feats({n_src, in}), labels({std::int64_t(seeds.size())}, DType::i32);
  frugal::Rng r(6);
  for (std::int64_t i = 0; i < feats.numel(); ++i) feats.data<float>()[i] = float(r.uniform() * 2 - 1);
  for (std::size_t i = 0; i < seeds.size(); ++i) labels.data<std::int32_t>()[i] = std::int32_t(seeds[i] % classes);
  frugal::Step step = frugal::compile(
      [&](Var x, Var y) { return frugal::cross_entropy(c2(frugal::relu(c1(x, b0)), b1), y); },
      {frugal::input<float>({n_src, in}), frugal::input<std::int32_t>({std::int64_t(seeds.size())})}, opt, budget);
  AttentionBudgetRun run;
  run.plan = step.plan();
  for (int i = 0; i < steps; ++i) run.losses.push_back(step.run(feats, labels));
  for (auto& t : params) run.params.push_back(bytes_of(t));
  return run;
}

void check_budgets(const std::function<AttentionBudgetRun(frugal::Budget, int)>& train) {
  const AttentionBudgetRun free = train({}, 4);
  const std::size_t full = free.plan.total_bytes();
  const std::size_t least = train(frugal::Budget{.device = full - 1}, 0).plan.min_feasible_bytes;
  INFO("unconstrained " << full << " bytes, smallest feasible " << least);
  REQUIRE(least > 0);
  REQUIRE(least < full);
  for (std::size_t budget : {full * 7 / 10, least}) {
    if (budget < least) continue;
    INFO("budget " << budget);
    const AttentionBudgetRun tight = train(frugal::Budget{.device = budget}, 4);
    CHECK(tight.plan.total_bytes() <= budget);
    CHECK_FALSE(tight.plan.decisions.empty());
    CHECK(tight.losses == free.losses);
    CHECK(tight.params == free.params);
  }
}

}  // namespace

TEST_CASE("encoder layer, masked cross-attention and broadcast matmul train bit for bit under tight budgets",
          "[attn14][budget]") {
  check_budgets(train_encoder);
}

TEST_CASE("SAGEConv on a sampled minibatch trains, and bit for bit under tight budgets", "[attn14][budget][graph]") {
  const AttentionBudgetRun r = train_sage({}, 30);
  CHECK(r.losses.back() < r.losses.front() * 0.5f);
  check_budgets(train_sage);
}
