// Every op, forward (f32 and f64 against the float64 reference) and backward
// (analytic gradients against central finite differences), plus the errors
// ops raise on bad shapes and bad labels. See op_harness.hpp for the method
// and the tolerances.
#include "cpu_isa_scope.hpp"
#include "op_harness.hpp"
#include <omp.h>
#include <frugal/backend/cpu/blas.hpp>  // the GEMM wrapper itself
#include <frugal/backend/cpu/isa.hpp>   // the instruction set the updates run with

using namespace optest;
using frugal::Var;
using frugal::DType;
using A = Arrays;
using V = Vars;

// ---- elementwise unary -----------------------------------------------------

TEST_CASE("relu forward and backward", "[ops]") {
  check_op(unary("relu [3,5]", x({3, 5}), [](Var v) { return frugal::relu(v); }, ref::relu));
  check_op(unary("relu [1,7]", x({1, 7}), [](Var v) { return frugal::relu(v); }, ref::relu));
  check_op(unary("relu [2,3,4] wide", wide({2, 3, 4}), [](Var v) { return frugal::relu(v); }, ref::relu));
}

TEST_CASE("gelu, tanh form, forward and backward", "[ops]") {
  auto f = [](Var v) { return frugal::gelu(v, true); };
  check_op(unary("gelu_tanh [4,6]", x({4, 6}), f, ref::gelu_tanh));
  check_op(unary("gelu_tanh [1,1]", x({1, 1}), f, ref::gelu_tanh));
  check_op(unary("gelu_tanh [3,7] wide", wide({3, 7}), f, ref::gelu_tanh));
  // The default is the tanh form.
  check_op(unary("gelu default [5]", x({5}), [](Var v) { return frugal::gelu(v); }, ref::gelu_tanh));
}

TEST_CASE("gelu, erf form, forward and backward", "[ops]") {
  auto f = [](Var v) { return frugal::gelu(v, false); };
  check_op(unary("gelu_erf [4,6]", x({4, 6}), f, ref::gelu_erf));
  check_op(unary("gelu_erf [1,5]", x({1, 5}), f, ref::gelu_erf));
  check_op(unary("gelu_erf [3,7] wide", wide({3, 7}), f, ref::gelu_erf));
}

TEST_CASE("tanh forward and backward", "[ops]") {
  auto f = [](Var v) { return frugal::tanh(v); };
  check_op(unary("tanh [3,7]", x({3, 7}), f, ref::tanh));
  check_op(unary("tanh [1,4] wide", wide({1, 4}), f, ref::tanh));
}

TEST_CASE("sigmoid forward and backward", "[ops]") {
  auto f = [](Var v) { return frugal::sigmoid(v); };
  check_op(unary("sigmoid [5,3]", x({5, 3}), f, ref::sigmoid));
  // Both signs well away from 0, so both branches of the split form run.
  check_op(unary("sigmoid [2,3,5] wide", wide({2, 3, 5}), f, ref::sigmoid));
  check_op(unary("sigmoid [1,1]", x({1, 1}), f, ref::sigmoid));
}

TEST_CASE("exp forward and backward", "[ops]") {
  auto f = [](Var v) { return frugal::exp(v); };
  check_op(unary("exp [2,3,4]", x({2, 3, 4}), f, ref::exp));
  check_op(unary("exp [1,3]", x({1, 3}), f, ref::exp));
}

TEST_CASE("log forward and backward", "[ops]") {
  auto f = [](Var v) { return frugal::log(v); };
  check_op(unary("log [3,5]", pos({3, 5}), f, ref::log));
  check_op(unary("log [1,7]", pos({1, 7}), f, ref::log));
}

TEST_CASE("rsqrt forward and backward", "[ops]") {
  auto f = [](Var v) { return frugal::rsqrt(v); };
  check_op(unary("rsqrt [3,5]", pos({3, 5}), f, ref::rsqrt));
  check_op(unary("rsqrt [1,1]", pos({1, 1}), f, ref::rsqrt));
}

TEST_CASE("affine and scalar arithmetic forward and backward", "[ops]") {
  check_op(unary("x*2.5", x({3, 4}), [](Var v) { return v * 2.5; },
                 [](const ref::Array& a) { return ref::affine(a, 2.5, 0); }));
  check_op(unary("2.5*x", x({1, 5}), [](Var v) { return 2.5 * v; },
                 [](const ref::Array& a) { return ref::affine(a, 2.5, 0); }));
  check_op(unary("x+1", x({3, 4}), [](Var v) { return v + 1.0; },
                 [](const ref::Array& a) { return ref::affine(a, 1, 1); }));
  check_op(unary("1+x", x({2, 3}), [](Var v) { return 1.0 + v; },
                 [](const ref::Array& a) { return ref::affine(a, 1, 1); }));
  check_op(unary("x-0.75", x({7}), [](Var v) { return v - 0.75; },
                 [](const ref::Array& a) { return ref::affine(a, 1, -0.75); }));
  check_op(unary("1-x", x({3, 4}), [](Var v) { return 1.0 - v; },
                 [](const ref::Array& a) { return ref::affine(a, -1, 1); }));
  check_op(unary("-x", x({2, 3, 2}), [](Var v) { return -v; },
                 [](const ref::Array& a) { return ref::affine(a, -1, 0); }));
  check_op(unary("x/3", x({3, 4}), [](Var v) { return v / 3.0; },
                 [](const ref::Array& a) { return ref::map(a, [](double t) { return t / 3.0; }); }));
  check_op(unary("affine(x,-1.5,0.25)", x({5, 3}), [](Var v) { return frugal::affine(v, -1.5, 0.25); },
                 [](const ref::Array& a) { return ref::affine(a, -1.5, 0.25); }));
}

// ---- elementwise binary ------------------------------------------------------

namespace {
Var add_v(Var a, Var b) { return a + b; }
Var sub_v(Var a, Var b) { return a - b; }
Var mul_v(Var a, Var b) { return a * b; }
Var div_v(Var a, Var b) { return a / b; }
}  // namespace

TEST_CASE("add, sub, mul, div with equal shapes", "[ops]") {
  for (ref::Dims s : {ref::Dims{3, 4}, ref::Dims{1, 1}, ref::Dims{5, 7}, ref::Dims{2, 3, 2}}) {
    const std::string sh = ref::str(s);
    check_op(binary("add " + sh, x(s), x(s), add_v, ref::add));
    check_op(binary("sub " + sh, x(s), x(s), sub_v, ref::sub));
    check_op(binary("mul " + sh, x(s), x(s), mul_v, ref::mul));
    check_op(binary("div " + sh, x(s), den(s), div_v, ref::div));
  }
  // The named free functions are the operators.
  check_op(binary("frugal::add [2,3]", x({2, 3}), x({2, 3}), [](Var a, Var b) { return frugal::add(a, b); }, ref::add));
  check_op(binary("frugal::div [2,3]", x({2, 3}), den({2, 3}), [](Var a, Var b) { return frugal::div(a, b); }, ref::div));
}

TEST_CASE("add, sub, mul, div with broadcasting", "[ops]") {
  check_op(binary("[3,4] + [4]", x({3, 4}), x({4}), add_v, ref::add));
  check_op(binary("[4] + [3,4]", x({4}), x({3, 4}), add_v, ref::add));
  check_op(binary("[2,1,5] * [3,1]", x({2, 1, 5}), x({3, 1}), mul_v, ref::mul));
  check_op(binary("[1] / [2,3]", x({1}), den({2, 3}), div_v, ref::div));
  check_op(binary("[2,3] / [1]", x({2, 3}), den({1}), div_v, ref::div));
  check_op(binary("[3,4] / [4]", x({3, 4}), den({4}), div_v, ref::div));
  check_op(binary("[4,1] - [1,5]", x({4, 1}), x({1, 5}), sub_v, ref::sub));
  check_op(binary("[2,3,4] * [2,1,4]", x({2, 3, 4}), x({2, 1, 4}), mul_v, ref::mul));
  check_op(binary("[2,3,4] - [3,1]", x({2, 3, 4}), x({3, 1}), sub_v, ref::sub));
  // Scalar-shaped (rank 0) operands.
  check_op(binary("[3,4] * []", x({3, 4}), x({}), mul_v, ref::mul));
  check_op(binary("[] - [2,3]", x({}), x({2, 3}), sub_v, ref::sub));
  check_op(binary("[] + []", x({}), x({}), add_v, ref::add));
  check_op(binary("[] / [3]", x({}), den({3}), div_v, ref::div));
  check_op(binary("[3] / []", x({3}), den({}), div_v, ref::div));
}

TEST_CASE("a Var used more than once accumulates its gradient", "[ops]") {
  check_op(unary("x*x", x({3, 4}), [](Var v) { return v * v; },
                 [](const ref::Array& a) { return ref::mul(a, a); }));
  check_op(unary("x*x + x", x({2, 5}), [](Var v) { return v * v + v; },
                 [](const ref::Array& a) { return ref::add(ref::mul(a, a), a); }));
  check_op(unary("x / (x*x + 1)", x({7}), [](Var v) { return v / (v * v + 1.0); },
                 [](const ref::Array& a) { return ref::div(a, ref::affine(ref::mul(a, a), 1, 1)); }));
  check_op(binary("(a+b)*a - b", x({3, 4}), x({4}), [](Var a, Var b) { return (a + b) * a - b; },
                  [](const ref::Array& a, const ref::Array& b) { return ref::sub(ref::mul(ref::add(a, b), a), b); }));
  // The same tensor bound twice is one value: two Vars, one gradient.
  check_op({"same tensor bound twice: sigmoid(x) * x",
            {x({3, 3})},
            [](const V& v) {
              Var again = frugal::persistent_var(frugal::current_graph()->value(v[0].id).external,
                                                 frugal::ValueKind::parameter, "again");
              return frugal::sigmoid(v[0]) * again;
            },
            [](const A& a) { return ref::mul(ref::sigmoid(a[0]), a[0]); }});
}

// ---- matrix products -----------------------------------------------------------

namespace {
Case mm(std::string name, ref::Dims a, ref::Dims b, bool ta = false, bool tb = false) {
  return binary(std::move(name), x(std::move(a)), x(std::move(b)),
                [ta, tb](Var p, Var q) { return frugal::matmul(p, q, ta, tb); },
                [ta, tb](const ref::Array& p, const ref::Array& q) { return ref::matmul(p, q, ta, tb); });
}
}  // namespace

TEST_CASE("matmul of plain matrices", "[ops]") {
  check_op(mm("matmul [3,4]x[4,5]", {3, 4}, {4, 5}));
  check_op(mm("matmul [1,1]x[1,1]", {1, 1}, {1, 1}));
  check_op(mm("matmul [7,5]x[5,3]", {7, 5}, {5, 3}));
  check_op(mm("matmul [1,6]x[6,1]", {1, 6}, {6, 1}));
  check_op(mm("matmul [5,1]x[1,3]", {5, 1}, {1, 3}));
}

TEST_CASE("matmul with every transpose flag combination", "[ops]") {
  // op(A) is [3,4] and op(B) is [4,5] in every case.
  check_op(mm("matmul NN [3,4]x[4,5]", {3, 4}, {4, 5}, false, false));
  check_op(mm("matmul TN [4,3]^T x[4,5]", {4, 3}, {4, 5}, true, false));
  check_op(mm("matmul NT [3,4]x[5,4]^T", {3, 4}, {5, 4}, false, true));
  check_op(mm("matmul TT [4,3]^T x[5,4]^T", {4, 3}, {5, 4}, true, true));
  // Odd sizes: op(A) [7,5], op(B) [5,3].
  check_op(mm("matmul TN [5,7]^T x[5,3]", {5, 7}, {5, 3}, true, false));
  check_op(mm("matmul NT [7,5]x[3,5]^T", {7, 5}, {3, 5}, false, true));
  check_op(mm("matmul TT [5,7]^T x[3,5]^T", {5, 7}, {3, 5}, true, true));
}

TEST_CASE("batched matmul", "[ops]") {
  check_op(mm("matmul [2,3,4]x[2,4,5]", {2, 3, 4}, {2, 4, 5}));
  check_op(mm("matmul [1,3,4]x[1,4,2]", {1, 3, 4}, {1, 4, 2}));
  check_op(mm("matmul [3,7,5]x[3,5,3]", {3, 7, 5}, {3, 5, 3}));
  check_op(mm("matmul [2,2,3,4]x[2,2,4,3]", {2, 2, 3, 4}, {2, 2, 4, 3}));
  check_op(mm("matmul batched TN [2,4,3]^T x[2,4,5]", {2, 4, 3}, {2, 4, 5}, true, false));
  check_op(mm("matmul batched NT [2,3,4]x[2,5,4]^T", {2, 3, 4}, {2, 5, 4}, false, true));
  check_op(mm("matmul batched TT [2,4,3]^T x[2,5,4]^T", {2, 4, 3}, {2, 5, 4}, true, true));
}

TEST_CASE("batched matmul with a shared 2-D operand", "[ops]") {
  // Batched A, shared B: B's gradient sums over the batch.
  check_op(mm("matmul [2,3,4]x[4,5] shared B", {2, 3, 4}, {4, 5}));
  check_op(mm("matmul [3,7,5]x[5,3] shared B", {3, 7, 5}, {5, 3}));
  check_op(mm("matmul [2,2,3,4]x[4,2] shared B", {2, 2, 3, 4}, {4, 2}));
  check_op(mm("matmul [1,3,4]x[4,5] shared B", {1, 3, 4}, {4, 5}));
  check_op(mm("matmul [2,3,4]x[5,4]^T shared B", {2, 3, 4}, {5, 4}, false, true));
  check_op(mm("matmul [2,4,3]^T x[4,5] shared B", {2, 4, 3}, {4, 5}, true, false));
  check_op(mm("matmul [2,4,3]^T x[5,4]^T shared B", {2, 4, 3}, {5, 4}, true, true));
  // Shared A, batched B: A's gradient sums over the batch.
  check_op(mm("matmul [3,4]x[2,4,5] shared A", {3, 4}, {2, 4, 5}));
  check_op(mm("matmul [4,3]^T x[2,4,5] shared A", {4, 3}, {2, 4, 5}, true, false));
  check_op(mm("matmul [3,4]x[2,5,4]^T shared A", {3, 4}, {2, 5, 4}, false, true));
  check_op(mm("matmul [4,3]^T x[2,5,4]^T shared A", {4, 3}, {2, 5, 4}, true, true));
}

TEST_CASE("linear with and without bias", "[ops]") {
  auto with_bias = [](std::string name, ref::Dims xs, std::int64_t out) {
    std::int64_t in = xs.back();
    return Case{std::move(name),
                {x(xs), x({out, in}), x({out})},
                [](const V& v) { return frugal::linear(v[0], v[1], v[2]); },
                [](const A& a) { return ref::linear(a[0], a[1], &a[2]); }};
  };
  auto no_bias = [](std::string name, ref::Dims xs, std::int64_t out) {
    std::int64_t in = xs.back();
    return Case{std::move(name),
                {x(xs), x({out, in})},
                [](const V& v) { return frugal::linear(v[0], v[1]); },
                [](const A& a) { return ref::linear(a[0], a[1]); }};
  };
  check_op(with_bias("linear [3,4] w[5,4] b[5]", {3, 4}, 5));
  check_op(no_bias("linear [3,4] w[5,4]", {3, 4}, 5));
  check_op(with_bias("linear [2,3,4] w[5,4] b[5]", {2, 3, 4}, 5));
  check_op(no_bias("linear [2,3,4] w[5,4]", {2, 3, 4}, 5));
  check_op(with_bias("linear [1,7] w[3,7] b[3]", {1, 7}, 3));
  check_op(with_bias("linear [4,1] w[1,1] b[1]", {4, 1}, 1));
}

// linear's shape inference accepts a 1-D input x [in] (y = W x + b, as in
// PyTorch), so its backward must handle one too.
TEST_CASE("linear with a 1-D input and a bias", "[ops]") {
  check_op({"linear [5] w[2,5] b[2]",
            {x({5}), x({2, 5}), x({2})},
            [](const V& v) { return frugal::linear(v[0], v[1], v[2]); },
            [](const A& a) { return ref::linear(a[0], a[1], &a[2]); }});
}

TEST_CASE("linear with a 1-D input and no bias", "[ops]") {
  check_op({"linear [5] w[2,5]",
            {x({5}), x({2, 5})},
            [](const V& v) { return frugal::linear(v[0], v[1]); },
            [](const A& a) { return ref::linear(a[0], a[1]); }});
}

// ---- reductions ----------------------------------------------------------------

namespace {
Case sum_case(std::string name, ref::Dims s, std::vector<int> axes, bool keepdim) {
  return unary(std::move(name), x(std::move(s)), [axes, keepdim](Var v) { return frugal::sum(v, axes, keepdim); },
               [axes, keepdim](const ref::Array& a) { return ref::sum(a, axes, keepdim); });
}
Case mean_case(std::string name, ref::Dims s, std::vector<int> axes, bool keepdim) {
  return unary(std::move(name), x(std::move(s)), [axes, keepdim](Var v) { return frugal::mean(v, axes, keepdim); },
               [axes, keepdim](const ref::Array& a) { return ref::mean(a, axes, keepdim); });
}
}  // namespace

TEST_CASE("sum over axes", "[ops]") {
  check_op(sum_case("sum all [3,4]", {3, 4}, {}, false));
  check_op(sum_case("sum all [2,3,4] keepdim", {2, 3, 4}, {}, true));
  check_op(sum_case("sum all [7]", {7}, {}, false));
  check_op(sum_case("sum axis 0 [3,4]", {3, 4}, {0}, false));
  check_op(sum_case("sum axis 1 [3,4]", {3, 4}, {1}, false));
  check_op(sum_case("sum axis -1 keepdim [2,3,4]", {2, 3, 4}, {-1}, true));
  check_op(sum_case("sum axis 1 [2,3,4]", {2, 3, 4}, {1}, false));
  check_op(sum_case("sum axes {0,1} [2,3,4]", {2, 3, 4}, {0, 1}, false));
  check_op(sum_case("sum axes {0,2} [2,3,4]", {2, 3, 4}, {0, 2}, false));
  check_op(sum_case("sum axes {2,0} keepdim [2,3,4]", {2, 3, 4}, {2, 0}, true));
  check_op(sum_case("sum axes {0,2} [2,3,4,3]", {2, 3, 4, 3}, {0, 2}, false));
  check_op(sum_case("sum axes {1,3} keepdim [2,3,2,3]", {2, 3, 2, 3}, {1, 3}, true));
  check_op(sum_case("sum axis 0 [1,5]", {1, 5}, {0}, false));
}

TEST_CASE("mean over axes", "[ops]") {
  check_op(mean_case("mean all [3,4]", {3, 4}, {}, false));
  check_op(mean_case("mean axis 1 [2,3,4]", {2, 3, 4}, {1}, false));
  check_op(mean_case("mean axis -1 keepdim [3,5]", {3, 5}, {-1}, true));
  check_op(mean_case("mean axes {0,2} keepdim [2,3,4]", {2, 3, 4}, {0, 2}, true));
  check_op(mean_case("mean all [1,1]", {1, 1}, {}, false));
}

// ---- data movement ---------------------------------------------------------------

TEST_CASE("reshape", "[ops]") {
  auto rs = [](std::string name, ref::Dims from, ref::Dims to) {
    return unary(std::move(name), x(std::move(from)), [to](Var v) { return frugal::reshape(v, to); },
                 [to](const ref::Array& a) { return ref::reshape(a, to); });
  };
  check_op(rs("reshape [2,3,4] -> [6,-1]", {2, 3, 4}, {6, -1}));
  check_op(rs("reshape [12] -> [3,-1,2]", {12}, {3, -1, 2}));
  check_op(rs("reshape [2,6] -> [3,4]", {2, 6}, {3, 4}));
  check_op(rs("reshape [1,5] -> [5]", {1, 5}, {5}));
  check_op(rs("reshape [3,4] -> [-1]", {3, 4}, {-1}));
  // A reshape in the middle of a chain, so its backward feeds another op.
  check_op(unary("exp(reshape [2,6] -> [4,3]) * 2", x({2, 6}),
                 [](Var v) { return frugal::exp(frugal::reshape(v, {4, 3})) * 2.0; },
                 [](const ref::Array& a) { return ref::affine(ref::exp(ref::reshape(a, {4, 3})), 2, 0); }));
}

TEST_CASE("transpose and permute", "[ops]") {
  auto tr = [](std::string name, ref::Dims s, int a, int b) {
    return unary(std::move(name), x(std::move(s)), [a, b](Var v) { return frugal::transpose(v, a, b); },
                 [a, b](const ref::Array& t) { return ref::transpose(t, a, b); });
  };
  auto pm = [](std::string name, ref::Dims s, std::vector<int> perm) {
    return unary(std::move(name), x(std::move(s)), [perm](Var v) { return frugal::permute(v, perm); },
                 [perm](const ref::Array& t) { return ref::permute(t, perm); });
  };
  check_op(tr("transpose [3,5] (0,1)", {3, 5}, 0, 1));
  check_op(tr("transpose [1,4] (0,1)", {1, 4}, 0, 1));
  check_op(tr("transpose [2,3,4] (0,2)", {2, 3, 4}, 0, 2));
  check_op(tr("transpose [2,3,4] (-1,-2)", {2, 3, 4}, -1, -2));
  check_op(pm("permute [2,3,4] (2,0,1)", {2, 3, 4}, {2, 0, 1}));
  check_op(pm("permute [2,3,4] (1,2,0)", {2, 3, 4}, {1, 2, 0}));
  check_op(pm("permute [2,3,4] (0,1,2)", {2, 3, 4}, {0, 1, 2}));
  check_op(pm("permute [2,1,3,2] (3,1,0,2)", {2, 1, 3, 2}, {3, 1, 0, 2}));
}

TEST_CASE("broadcast_to", "[ops]") {
  auto bt = [](std::string name, ref::Dims s, ref::Dims to) {
    return unary(std::move(name), x(std::move(s)), [to](Var v) { return frugal::broadcast_to(v, frugal::Shape(to)); },
                 [to](const ref::Array& a) { return ref::broadcast_to(a, to); });
  };
  check_op(bt("broadcast_to [4] -> [3,4]", {4}, {3, 4}));
  check_op(bt("broadcast_to [3,1] -> [2,3,5]", {3, 1}, {2, 3, 5}));
  check_op(bt("broadcast_to [1,1] -> [2,3]", {1, 1}, {2, 3}));
  check_op(bt("broadcast_to [2,1,4] -> [2,3,4]", {2, 1, 4}, {2, 3, 4}));
  check_op(bt("broadcast_to [] -> [2,2]", {}, {2, 2}));
  check_op(bt("broadcast_to [1] -> [5]", {1}, {5}));
}

// ---- softmax family --------------------------------------------------------------

TEST_CASE("softmax and log_softmax along any axis", "[ops]") {
  struct Along {
    ref::Dims shape;
    int axis;
  };
  for (const Along& c : {Along{{4, 6}, -1}, Along{{2, 5, 3}, -1}, Along{{2, 5, 3}, 1}, Along{{2, 5, 3}, 0},
                         Along{{2, 5, 3}, -2}, Along{{1, 7}, -1}, Along{{1, 7}, 0}, Along{{5}, 0}}) {
    const int axis = c.axis;
    const std::string where = ref::str(c.shape) + " axis " + std::to_string(axis);
    check_op(unary("softmax " + where, wide(c.shape), [axis](Var v) { return frugal::softmax(v, axis); },
                   [axis](const ref::Array& a) { return ref::softmax(a, axis); }));
    check_op(unary("log_softmax " + where, wide(c.shape), [axis](Var v) { return frugal::log_softmax(v, axis); },
                   [axis](const ref::Array& a) { return ref::log_softmax(a, axis); }));
  }
  // The default axis is the last.
  check_op(unary("softmax default axis [3,4]", x({3, 4}), [](Var v) { return frugal::softmax(v); },
                 [](const ref::Array& a) { return ref::softmax(a, -1); }));
  check_op(unary("log_softmax default axis [3,4]", x({3, 4}), [](Var v) { return frugal::log_softmax(v); },
                 [](const ref::Array& a) { return ref::log_softmax(a, -1); }));
}

TEST_CASE("cross_entropy with integer labels", "[ops]") {
  auto ce = [](std::string name, ref::Dims logits, DType label_dtype) {
    ref::Dims lab(logits.begin(), logits.end() - 1);
    std::int64_t classes = logits.back();
    return Case{std::move(name),
                {wide(std::move(logits)), labels(std::move(lab), classes, label_dtype)},
                [](const V& v) { return frugal::cross_entropy(v[0], v[1]); },
                [](const A& a) { return ref::cross_entropy(a[0], a[1]); }};
  };
  check_op(ce("cross_entropy [6,5] i32 labels", {6, 5}, DType::i32));
  check_op(ce("cross_entropy [6,5] i64 labels", {6, 5}, DType::i64));
  check_op(ce("cross_entropy [2,3,4] i64 labels [2,3]", {2, 3, 4}, DType::i64));
  check_op(ce("cross_entropy [1,7] batch 1", {1, 7}, DType::i32));
  check_op(ce("cross_entropy [5] one position", {5}, DType::i64));
}

// ---- a chain of ops ----------------------------------------------------------------

TEST_CASE("a small network: linear, gelu, linear, log_softmax, cross_entropy", "[ops]") {
  check_op({"mlp chain",
            {x({4, 6}), x({5, 6}), x({5}), x({3, 5}), labels({4}, 3, DType::i64)},
            [](const V& v) {
              Var h = frugal::gelu(frugal::linear(v[0], v[1], v[2]), false);
              Var z = frugal::matmul(h, v[3], false, true);
              return frugal::cross_entropy(frugal::log_softmax(z, -1) * 0.5 + frugal::mean(h, {1}, true), v[4]);
            },
            [](const A& a) {
              ref::Array h = ref::gelu_erf(ref::linear(a[0], a[1], &a[2]));
              ref::Array z = ref::matmul(h, a[3], false, true);
              return ref::cross_entropy(ref::add(ref::affine(ref::log_softmax(z, -1), 0.5, 0), ref::mean(h, {1}, true)),
                                        a[4]);
            }});
}

// ---- large cases: the multi-threaded kernel paths ---------------------------------

TEST_CASE("large inputs take the multi-threaded paths and still match the reference", "[ops][threads]") {
  omp_set_num_threads(2);  // this thread's count: the multi-threaded paths
  check_forward_large(unary("relu [300,200]", x({300, 200}), [](Var v) { return frugal::relu(v); }, ref::relu));
  check_forward_large(binary("add [300,200]+[200]", x({300, 200}), x({200}), [](Var a, Var b) { return a + b; },
                             ref::add));
  check_forward_large(binary("mul [2,150,200]*[150,1]", x({2, 150, 200}), x({150, 1}),
                             [](Var a, Var b) { return a * b; }, ref::mul));
  check_forward_large(unary("sum axis 0 [400,300]", x({400, 300}), [](Var v) { return frugal::sum(v, {0}); },
                            [](const ref::Array& a) { return ref::sum(a, {0}, false); }));
  check_forward_large(unary("sum axis 1 [400,300]", x({400, 300}), [](Var v) { return frugal::sum(v, {1}); },
                            [](const ref::Array& a) { return ref::sum(a, {1}, false); }));
  check_forward_large(unary("sum axes {0,2} [40,30,50]", x({40, 30, 50}),
                            [](Var v) { return frugal::sum(v, {0, 2}); },
                            [](const ref::Array& a) { return ref::sum(a, {0, 2}, false); }));
  check_forward_large(unary("softmax [300,200] last axis", x({300, 200}), [](Var v) { return frugal::softmax(v); },
                            [](const ref::Array& a) { return ref::softmax(a, -1); }));
  check_forward_large(unary("log_softmax [300,200] axis 0", x({300, 200}),
                            [](Var v) { return frugal::log_softmax(v, 0); },
                            [](const ref::Array& a) { return ref::log_softmax(a, 0); }));
  check_forward_large(unary("permute [60,70,20]", x({60, 70, 20}), [](Var v) { return frugal::permute(v, {2, 0, 1}); },
                            [](const ref::Array& a) { return ref::permute(a, {2, 0, 1}); }));
  check_forward_large(unary("broadcast_to [300] -> [200,300]", x({300}),
                            [](Var v) { return frugal::broadcast_to(v, frugal::Shape{200, 300}); },
                            [](const ref::Array& a) { return ref::broadcast_to(a, {200, 300}); }));
  Case mm = binary("matmul [64,128]x[128,96]", x({64, 128}), x({128, 96}),
                   [](Var a, Var b) { return frugal::matmul(a, b); },
                   [](const ref::Array& a, const ref::Array& b) { return ref::matmul(a, b, false, false); });
  mm.f32_scale = 10;  // 128-term dot products in f32
  check_forward_large(mm);
  Case ce{"cross_entropy [3000,16]",
          {wide({3000, 16}), labels({3000}, 16)},
          [](const V& v) { return frugal::cross_entropy(v[0], v[1]); },
          [](const A& a) { return ref::cross_entropy(a[0], a[1]); }};
  check_forward_large(ce);
}

// ---- errors ----------------------------------------------------------------------


TEST_CASE("wrong shapes raise a ShapeError naming the op and both shapes", "[ops]") {
  using Catch::Matchers::Contains;
  std::string m = capture_error({{3, 4}, {5, 6}}, [](const V& v) { return frugal::matmul(v[0], v[1]); });
  CHECK_THAT(m, Contains("matmul") && Contains("[3, 4]") && Contains("[5, 6]"));

  m = capture_error({{2, 3, 4}, {3, 4, 5}}, [](const V& v) { return frugal::matmul(v[0], v[1]); });
  CHECK_THAT(m, Contains("matmul") && Contains("[2, 3, 4]") && Contains("[3, 4, 5]"));

  m = capture_error({{3, 4}, {5}}, [](const V& v) { return v[0] + v[1]; });
  CHECK_THAT(m, Contains("add") && Contains("[3, 4]") && Contains("[5]"));

  m = capture_error({{2, 3}, {3, 2}}, [](const V& v) { return v[0] / v[1]; });
  CHECK_THAT(m, Contains("div") && Contains("[2, 3]") && Contains("[3, 2]"));

  m = capture_error({{2, 5}, {3, 4}}, [](const V& v) { return frugal::linear(v[0], v[1]); });
  CHECK_THAT(m, Contains("linear") && Contains("[2, 5]") && Contains("[3, 4]"));

  m = capture_error({{4, 3}, {5}}, [](const V& v) { return frugal::cross_entropy(v[0], v[1]); },
                    {DType::f32, DType::i32});
  CHECK_THAT(m, Contains("cross_entropy") && Contains("[4, 3]") && Contains("[5]"));

  m = capture_error({{2, 3}}, [](const V& v) { return frugal::reshape(v[0], {4, 2}); });
  CHECK_THAT(m, Contains("reshape") && Contains("[2, 3]") && Contains("[4, 2]"));

  m = capture_error({{2, 3}}, [](const V& v) { return frugal::broadcast_to(v[0], frugal::Shape{3, 3}); });
  CHECK_THAT(m, Contains("broadcast_to") && Contains("[2, 3]") && Contains("[3, 3]"));
}

namespace {
// An op whose backward returns `entries` gradient entries however many inputs
// it has: the mistake autograd must catch.
class MiscountedBackward final : public frugal::Op {
 public:
  explicit MiscountedBackward(std::size_t entries) : entries_(entries) {}
  std::string name() const override { return "miscounted_backward"; }
  std::vector<frugal::TensorMeta> infer(std::span<const frugal::TensorMeta> in) const override { return {in[0]}; }
  std::vector<std::optional<Var>> backward(const frugal::BackwardArgs& a) const override {
    std::vector<std::optional<Var>> g(entries_);
    if (entries_ > 0) g[0] = a.grad_outputs[0];
    return g;
  }

 private:
  std::size_t entries_;
};
}  // namespace

TEST_CASE("autograd rejects a backward that returns other than one entry per input, naming the op and both counts",
          "[ops][autograd]") {
  using Catch::Matchers::Contains;
  auto differentiate = [](std::size_t entries) {
    frugal::Graph g;
    frugal::CaptureScope scope(g);
    Var x{&g, g.add_input({DType::f32, {2, 3}}, "x")}, y{&g, g.add_input({DType::f32, {2, 3}}, "y")};
    Var loss = frugal::sum(frugal::apply1<MiscountedBackward>({x, y}, entries));
    std::vector<Var> wrt{x, y};
    return frugal::grad(loss, wrt);
  };
  for (std::size_t entries : {0, 1, 3}) {
    std::string m = error_message<frugal::Error>([&] { differentiate(entries); });
    CHECK_THAT(m, Contains("miscounted_backward") && Contains("returned " + std::to_string(entries) + " gradient") &&
                      Contains("its 2 inputs"));
  }
  auto grads = differentiate(2);  // the right count passes
  REQUIRE(grads.size() == 2);
  CHECK(grads[0].has_value());
  CHECK_FALSE(grads[1].has_value());
}

TEST_CASE("an out-of-range cross_entropy label stops the step with a DataError", "[ops]") {
  using Catch::Matchers::Contains;
  frugal::Tensor logits({5, 5}, DType::f32);
  frugal::Tensor lab32 = frugal::Tensor::from(std::vector<std::int32_t>{1, 0, 4, 7, 2}, {5});
  frugal::Tensor lab64 = frugal::Tensor::from(std::vector<std::int64_t>{1, 0, 4, 2, -1}, {5});
  auto loss_of = [&](const frugal::Tensor& lab) {
    return [&] {
      return frugal::cross_entropy(frugal::persistent_var(logits, frugal::ValueKind::parameter, "logits"),
                                   frugal::persistent_var(lab, frugal::ValueKind::state, "labels"));
    };
  };
  {
    frugal::Step step = frugal::compile_inference(loss_of(lab32), {});
    std::string m = error_message<frugal::DataError>([&] { step.run(); });
    CHECK_THAT(m, Contains("cross_entropy") && Contains("label 7") && Contains("position 3"));
  }
  {
    frugal::Step step = frugal::compile_inference(loss_of(lab64), {});
    std::string m = error_message<frugal::DataError>([&] { step.run(); });
    CHECK_THAT(m, Contains("label -1") && Contains("position 4"));
  }
  {
    // The first label past the end (== the number of classes) is out of range too.
    frugal::Tensor lab = frugal::Tensor::from(std::vector<std::int32_t>{5, 0, 1, 2, 3}, {5});
    frugal::Step step = frugal::compile_inference(loss_of(lab), {});
    std::string m = error_message<frugal::DataError>([&] { step.run(); });
    CHECK_THAT(m, Contains("label 5") && Contains("position 0"));
  }
  {
    // The training step checks too, before anything reads past the row.
    frugal::Step step = frugal::compile_gradients(loss_of(lab32), {}, {logits});
    std::string m = error_message<frugal::DataError>([&] { step.run(); });
    CHECK_THAT(m, Contains("label 7") && Contains("position 3"));
  }
}

TEST_CASE("gemm refuses sizes and strides BLAS's integer cannot hold, naming the dims, before calling BLAS",
          "[ops][blas]") {
  using Catch::Matchers::Contains;
  const std::int64_t big = std::int64_t(std::numeric_limits<std::int32_t>::max()) + 1;
  // Null operands: were BLAS called with the narrowed (wrapped) sizes, it
  // would read through them; the check must throw first.
  std::string m = error_message<frugal::Error>([&] {
    frugal::cpu::gemm(false, false, big, 4, 3, 1.0f, static_cast<const float*>(nullptr), 3, nullptr, 4, 0.0f,
                      static_cast<float*>(nullptr), 4);
  });
  CHECK_THAT(m, Contains("m=2147483648") && Contains("n=4") && Contains("k=3") && Contains("does not fit"));
  m = error_message<frugal::Error>([&] {
    frugal::cpu::gemm(true, false, 2, 2, 2, 1.0, static_cast<const double*>(nullptr), big, nullptr, 2, 0.0,
                      static_cast<double*>(nullptr), 2);
  });
  CHECK_THAT(m, Contains("lda = 2147483648"));
  m = error_message<frugal::Error>(
      [&] {
        frugal::cpu::gemm(false, false, 2, -big - 1, 2, 1.0f, static_cast<const float*>(nullptr), 2, nullptr, 2, 0.0f,
                          static_cast<float*>(nullptr), 2);
      });
  CHECK_THAT(m, Contains("n = -2147483649"));
}

// The fused optimizer updates run a loop compiled for plain x86-64, AVX2 or
// AVX-512, whichever is the widest this CPU has (backend/cpu/isa.hpp). Each
// path must give the bits of the others and of the scalar rule, or ranks on
// different CPUs would hold different parameters. Every path this CPU can
// run is forced in turn; lengths leave vector tails, dtypes f32 and f64, the
// loss scaler's guarded form too.
TEST_CASE("optimizer updates: every instruction set this CPU has gives the scalar rule's bits", "[optim][isa]") {
  using namespace frugal;
  test_support::KeepCpuIsa keep;
  auto backend = std::shared_ptr<Backend>(make_backend("cpu"));
  auto adam_h = std::make_shared<ops::AdamWHyper>(ops::AdamWHyper{3e-3, 0.9, 0.99, 1e-8, 0.05, 4});
  auto sgd_h = std::make_shared<ops::SgdHyper>(ops::SgdHyper{0.05, 0.9, 0.1, 1e-3, true, 4});
  const int widest = int(cpu::widest_cpu_isa());
  INFO("widest instruction set here: " << cpu::isa_name(cpu::widest_cpu_isa()));
  for (DType dt : {DType::f32, DType::f64})
    for (bool guarded : {false, true})
      for (std::int64_t n : {std::int64_t(1), std::int64_t(37), std::int64_t(100003)}) {
        INFO(dtype_name(dt) << ", " << (guarded ? "guarded" : "plain") << ", " << n << " elements");
        Rng r(std::uint64_t(n) + (guarded ? 7 : 0));
        auto filled = [&](double scale) {
          Tensor t(Shape{n}, dt);
          for (std::int64_t i = 0; i < n; ++i) {
            const double x = r.normal() * scale * (i % 5 == 0 ? 1e-4 : 1);  // small moments: eps matters
            if (dt == DType::f32) t.data<float>()[i] = float(x);
            else t.data<double>()[i] = x;
          }
          return t;
        };
        const Tensor p0 = filled(1), g = filled(0.1), m0 = filled(0.01), v0 = filled(0.001);
        for (std::int64_t i = 0; i < n; ++i)  // a second moment is never negative
          if (dt == DType::f32) v0.data<float>()[i] = std::abs(v0.data<float>()[i]);
          else v0.data<double>()[i] = std::abs(v0.data<double>()[i]);
        Tensor found(Shape{}, DType::f32), scale(Shape{}, DType::f32), taken(Shape{}, DType::i64);
        scale.data<float>()[0] = 1024.0f;
        taken.data<std::int64_t>()[0] = 3;
        const Shape sh{n}, scalar{};
        // Runs one update on copies of the start; returns p, then the state.
        auto run = [&](const Op& op, int slots, int isa) {
          cpu::forced_cpu_isa = isa;
          std::vector<Tensor> t{p0.clone(), g, m0.clone(), v0.clone()};
          std::vector<TensorRef> in;
          for (int k = 0; k < 2 + slots; ++k) in.push_back({t[std::size_t(k)].raw(), dt, &sh});
          if (guarded)
            for (Tensor* s : {&found, &scale, &taken}) in.push_back({s->raw(), s->dtype(), &scalar});
          KernelArgs args;
          args.in = in;
          backend->kernel_for(op)(op, args);
          t.erase(t.begin() + 1);  // the gradient is read only
          t.resize(std::size_t(1 + slots));
          return t;
        };
        auto same = [&](const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
          for (std::size_t k = 0; k < a.size(); ++k)
            if (std::memcmp(a[k].raw(), b[k].raw(), a[k].nbytes()) != 0) return false;
          return true;
        };
        // The scalar rule, written out here from ops::AdamWMath / SgdMomentumMath.
        ops::AdamWUpdate adam(adam_h, guarded);
        ops::SgdUpdate sgd(sgd_h, guarded);
        auto reference = [&](bool is_adam) {
          std::vector<Tensor> t{p0.clone(), m0.clone(), v0.clone()};
          const double inv = guarded ? 1.0 / 1024.0 : 1.0;
          const std::int64_t step = 4;  // the hyperparameters' step, and steps_taken + 1 when guarded
          for (std::int64_t i = 0; i < n; ++i) {
            if (dt == DType::f32) {
              float* p = t[0].data<float>() + i;
              const float gi = guarded ? g.data<float>()[i] * float(inv) : g.data<float>()[i];
              if (is_adam) adam.math<float>(step)(*p, gi, t[1].data<float>()[i], t[2].data<float>()[i]);
              else sgd.math<float>(step)(*p, gi, t[1].data<float>()[i]);
            } else {
              double* p = t[0].data<double>() + i;
              const double gi = guarded ? g.data<double>()[i] * inv : g.data<double>()[i];
              if (is_adam) adam.math<double>(step)(*p, gi, t[1].data<double>()[i], t[2].data<double>()[i]);
              else sgd.math<double>(step)(*p, gi, t[1].data<double>()[i]);
            }
          }
          t.resize(is_adam ? 3 : 2);
          return t;
        };
        const auto adam_ref = reference(true), sgd_ref = reference(false);
        for (int isa = 0; isa <= widest; ++isa) {
          INFO("forced " << cpu::isa_name(cpu::CpuIsa(isa)));
          CHECK(same(run(adam, 2, isa), adam_ref));
          CHECK(same(run(sgd, 1, isa), sgd_ref));
        }
      }
}

// The elementwise kernels (unary, their gradients, binary with and without
// broadcasting, fused chains) and the column sums of a bias gradient run
// their loops compiled for the widest instruction set (run_widest); the
// kernel units build with -ffp-contract=off, so every path must give the
// plain x86-64 build's bits. Lengths leave vector tails; the inputs span
// GELU's polynomial ranges and its clamps.
TEST_CASE("elementwise kernels and column sums: every instruction set this CPU has gives the same bits",
          "[ops][isa]") {
  using namespace frugal;
  test_support::KeepCpuIsa keep;
  auto backend = std::shared_ptr<Backend>(make_backend("cpu"));
  const int widest = int(cpu::widest_cpu_isa());
  INFO("widest instruction set here: " << cpu::isa_name(cpu::widest_cpu_isa()));
  Rng r(91);
  DType dt = DType::f32;
  auto filled = [&](const Shape& s) {
    Tensor t(s, dt);
    for (std::int64_t i = 0; i < t.numel(); ++i) {
      const float x = float(r.normal() * 3.0);
      if (dt == DType::f32) t.data<float>()[i] = x;
      else t.data<BFloat16>()[i] = BFloat16(x);
    }
    return t;
  };
  // Runs op on the inputs at every instruction set; the outputs' bits must agree.
  auto check = [&](const Op& op, std::vector<Tensor> in, const Shape& out_shape) {
    INFO(op.name() << " in " << dtype_name(dt) << " on " << in.size() << " inputs, output " << out_shape.numel()
                   << " elements");
    std::vector<Tensor> outs;
    for (int isa = 0; isa <= widest; ++isa) {
      cpu::forced_cpu_isa = isa;
      Tensor y(out_shape, dt);
      std::vector<TensorRef> ins;
      for (Tensor& t : in) ins.push_back({t.raw(), t.dtype(), &t.shape()});
      std::vector<TensorRef> outs_ref{TensorRef{y.raw(), y.dtype(), &y.shape()}};
      KernelArgs args;
      args.in = ins;
      args.out = outs_ref;
      backend->kernel_for(op)(op, args);
      outs.push_back(std::move(y));
    }
    for (std::size_t k = 1; k < outs.size(); ++k) {
      INFO("instruction set " << cpu::isa_name(cpu::CpuIsa(k)) << " against x86-64");
      CHECK(std::memcmp(outs[k].raw(), outs[0].raw(), outs[0].nbytes()) == 0);
    }
  };
  for (DType d : {DType::f32, DType::bf16}) {
    dt = d;
    for (std::int64_t n : {std::int64_t(5), std::int64_t(1000), std::int64_t(100003)}) {
      const Shape s{n};
      check(ops::Unary<math::GeluErfPoly>{}, {filled(s)}, s);
      check(ops::UnaryGrad<math::GeluErfPoly>{}, {filled(s), filled(s), filled(s)}, s);
      check(ops::Unary<math::GeluTanh>{}, {filled(s)}, s);
      check(ops::UnaryGrad<math::Sigmoid>{}, {filled(s), filled(s), filled(s)}, s);
      check(ops::Binary<math::Mul>{}, {filled(s), filled(s)}, s);
    }
    // Broadcast rows (a bias add) and the bias gradient's column sums, with
    // column counts off the vector width.
    for (std::int64_t cols : {std::int64_t(7), std::int64_t(256), std::int64_t(1000)}) {
      const Shape m{33, cols}, row{cols};
      check(ops::Binary<math::Add>{}, {filled(m), filled(row)}, m);
      check(ops::Sum({0}, false), {filled(m)}, row);
    }
  }
}
