// Issue 14's attention part: scaled-dot-product attention that is non-causal
// or masked (ops/sdpa.hpp), matmul with torch.matmul's batch broadcasting,
// MultiHeadAttention with masks and cross-attention, TransformerEncoderLayer
// and SAGEConv on bipartite (sampled) graphs. Each against a float64
// reference written here with naive loops, backward against central finite
// differences (op_harness.hpp), bad input at capture, and budgeted training
// bit for bit equal to the unconstrained step.
#include <cstring>

#include "op_harness.hpp"

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

Case mm(std::string name, ref::Dims a, ref::Dims b, bool ta = false, bool tb = false) {
  return {std::move(name),
          {x(std::move(a)), x(std::move(b))},
          [ta, tb](const V& t) { return frugal::matmul(t[0], t[1], ta, tb); },
          [ta, tb](const A& v) { return matmul_ref(v[0], v[1], ta, tb); }};
}

}  // namespace

TEST_CASE("matmul broadcasts batch axes as torch.matmul, forward and backward (summed over broadcast axes)",
          "[attn14][matmul]") {
  check_op(mm("mm [2,3,4,5]@[5,2]", {2, 3, 4, 5}, {5, 2}));
  check_op(mm("mm [3,4]@[2,2,4,3]", {3, 4}, {2, 2, 4, 3}));
  check_op(mm("mm [2,1,3,4]@[1,3,4,2]", {2, 1, 3, 4}, {1, 3, 4, 2}));
  check_op(mm("mm [2,1,3,4]@[3,4,2] rank differs", {2, 1, 3, 4}, {3, 4, 2}));
  check_op(mm("mm [1,3,4]@[2,4,2]", {1, 3, 4}, {2, 4, 2}));
  check_op(mm("mm [2,1,4,3]^T@[1,3,2,4]^T", {2, 1, 4, 3}, {1, 3, 2, 4}, true, true));
  check_op(mm("mm [2,3,1,4,3]^T@[3,3,2] 5-D", {2, 3, 1, 4, 3}, {3, 4, 2}, true, false));
}

TEST_CASE("matmul with 1-D operands follows torch.matmul", "[attn14][matmul]") {
  check_op(mm("mm [4]@[4] dot", {4}, {4}));
  check_op(mm("mm [4]@[4,3]", {4}, {4, 3}));
  check_op(mm("mm [3,4]@[4]", {3, 4}, {4}));
  check_op(mm("mm [4]@[2,4,3]", {4}, {2, 4, 3}));
  check_op(mm("mm [2,2,3,4]@[4]", {2, 2, 3, 4}, {4}));
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
