// core/: dtypes, half-precision storage, shapes, byte sizes, errors, RNG.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <frugal/frugal.hpp>
#include <limits>

using namespace frugal;

TEST_CASE("dtypes have their sizes and names", "[core]") {
  CHECK(dtype_size(DType::f32) == 4);
  CHECK(dtype_size(DType::f64) == 8);
  CHECK(dtype_size(DType::bf16) == 2);
  CHECK(dtype_size(DType::f16) == 2);
  CHECK(dtype_size(DType::i32) == 4);
  CHECK(dtype_size(DType::i64) == 8);
  CHECK(std::string(dtype_name(DType::bf16)) == "bf16");
  CHECK(dtype_of<float>() == DType::f32);
  CHECK(dtype_of<std::int64_t>() == DType::i64);
  CHECK(dtype_of<Half>() == DType::f16);
  CHECK(is_floating(DType::bf16));
  CHECK_FALSE(is_floating(DType::i32));
}

TEST_CASE("BFloat16 rounds to nearest even and keeps specials", "[core]") {
  CHECK(BFloat16(1.0f).bits == 0x3f80);
  CHECK(BFloat16(0.1f).bits == 0x3dcd);   // 0x3dcccccd rounds up
  CHECK(BFloat16(-2.5f).bits == 0xc020);
  // Exactly halfway between two bf16 values: ties go to the even mantissa.
  float tie_down, tie_up;
  std::uint32_t a = 0x3f808000u, b = 0x3f818000u;
  std::memcpy(&tie_down, &a, 4);
  std::memcpy(&tie_up, &b, 4);
  CHECK(BFloat16(tie_down).bits == 0x3f80);
  CHECK(BFloat16(tie_up).bits == 0x3f82);
  CHECK(std::isinf(float(BFloat16(std::numeric_limits<float>::infinity()))));
  CHECK(std::isnan(float(BFloat16(std::numeric_limits<float>::quiet_NaN()))));
  for (float x : {0.0f, 1.0f, -3.0f, 1024.0f, 0.15625f}) CHECK(float(BFloat16(x)) == x);
}

TEST_CASE("Half matches IEEE binary16, subnormals and overflow included", "[core]") {
  CHECK(Half(1.0f).bits == 0x3c00);
  CHECK(Half(0.1f).bits == 0x2e66);
  CHECK(Half(-2.0f).bits == 0xc000);
  CHECK(Half(65504.0f).bits == 0x7bff);      // largest finite
  CHECK(Half(65520.0f).bits == 0x7c00);      // rounds to infinity
  CHECK(Half(5.9604645e-8f).bits == 0x0001);  // smallest subnormal
  CHECK(float(Half(std::uint16_t(0))) == 0.0f);
  for (std::uint32_t h = 0; h < 0x7c00; h += 7) {  // every 7th finite positive half round-trips
    Half v;
    v.bits = std::uint16_t(h);
    CHECK(Half(float(v)).bits == h);
  }
  CHECK(std::isnan(float(Half(std::numeric_limits<float>::quiet_NaN()))));
}

TEST_CASE("shapes broadcast numpy-style and name themselves", "[core]") {
  Shape s{2, 3, 4};
  CHECK(s.numel() == 24);
  CHECK(s.dim(-1) == 4);
  CHECK(s.str() == "[2, 3, 4]");
  CHECK(s.strides() == std::vector<std::int64_t>{12, 4, 1});
  CHECK(*broadcast_shapes(Shape{3, 1}, Shape{4}) == Shape{3, 4});
  CHECK(*broadcast_shapes(Shape{2, 1, 5}, Shape{3, 1}) == Shape{2, 3, 5});
  CHECK(*broadcast_shapes(Shape{}, Shape{2}) == Shape{2});
  CHECK_FALSE(broadcast_shapes(Shape{3}, Shape{4}));
  CHECK(Shape{}.numel() == 1);
  CHECK_THROWS_AS(s.normalize_axis(3), ShapeError);
  CHECK_THROWS_AS(Shape({2, -1}), ShapeError);
}

TEST_CASE("byte-size literals and parsing", "[core]") {
  CHECK(64_MiB == 64u * 1024 * 1024);
  CHECK(2_GiB == 2ull << 30);
  CHECK(parse_bytes("64MiB") == 64_MiB);
  CHECK(parse_bytes("1.5GiB") == 3 * 512_MiB);
  CHECK(parse_bytes("4096") == 4096);
  CHECK(parse_bytes("512k") == 512_KiB);
  CHECK_THROWS_WITH(parse_bytes("12 parsecs"), Catch::Contains("unknown byte unit"));
  CHECK_THROWS_WITH(parse_bytes("lots"), Catch::Contains("lots"));
  CHECK(format_bytes(1536) == "1.5 KiB");
  CHECK(align_up(1) == kAlignment);
}

TEST_CASE("Philox-4x32-10 matches the Random123 known answers", "[core]") {
  Philox zero(0);
  auto b = zero(0, 0);
  CHECK(b.v[0] == 0x6627e8d5u);
  CHECK(b.v[1] == 0xe169c58du);
  CHECK(b.v[2] == 0xbc57ac4cu);
  CHECK(b.v[3] == 0x9b00dbd8u);
  Philox ones(~0ull);
  auto c = ones(~0ull, ~0ull);
  CHECK(c.v[0] == 0x408f276du);
  CHECK(c.v[1] == 0x41c83b0eu);
  CHECK(c.v[2] == 0xa20bc7c6u);
  CHECK(c.v[3] == 0x6d5451fdu);
}

TEST_CASE("Rng streams are reproducible and roughly uniform", "[core]") {
  Rng a(42), b(42), other(43);
  double sum = 0, sq = 0;
  bool differs = false;
  for (int i = 0; i < 20000; ++i) {
    double u = a.uniform();
    CHECK(u == b.uniform());
    differs = differs || u != other.uniform();
    REQUIRE(u >= 0.0);
    REQUIRE(u < 1.0);
    sum += u;
    sq += u * u;
  }
  CHECK(differs);
  CHECK(sum / 20000 == Approx(0.5).margin(0.01));
  CHECK(sq / 20000 - (sum / 20000) * (sum / 20000) == Approx(1.0 / 12).margin(0.005));
}

TEST_CASE("errors carry their context", "[core]") {
  try {
    fail<ShapeError>("matmul: shapes ", Shape{3, 4}.str(), " and ", Shape{5, 6}.str());
  } catch (const Error& e) {
    CHECK(std::string(e.what()) == "matmul: shapes [3, 4] and [5, 6]");
  }
  Tensor t({2, 2});
  CHECK_THROWS_WITH(t.data<double>(), Catch::Contains("f32") && Catch::Contains("f64"));
  CHECK_THROWS_AS(Tensor::from(std::vector<float>{1, 2, 3}, Shape{2, 2}), ShapeError);
}

TEST_CASE("tensors are aligned, zeroed, shared on copy and deep on clone", "[core]") {
  Tensor t({3, 5});
  CHECK(reinterpret_cast<std::uintptr_t>(t.raw()) % kAlignment == 0);
  for (float v : t.to_vector<float>()) CHECK(v == 0.0f);
  Tensor shared = t, deep = t.clone();
  t.data<float>()[0] = 7;
  CHECK(shared.data<float>()[0] == 7);
  CHECK(deep.data<float>()[0] == 0);
}
