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
  CHECK_THROWS_WITH(parse_bytes("12 parsecs"), Catch::Contains("unknown unit"));
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

// ---- core/json.hpp: the one JSON reader and escaper ----------------------------

namespace {
// The message of the DataError that parsing `text` throws ("no error" when it parses).
std::string json_error(const std::string& text, bool object = false, std::size_t base = 0) {
  try {
    object ? parse_json_object(text, "t.json", base) : parse_json(text, "t.json", base);
  } catch (const DataError& e) {
    return e.what();
  }
  return "no error";
}
}  // namespace

TEST_CASE("JSON reader: nested objects and arrays, every number form, every escape and surrogate pairs", "[core][json]") {
  const std::string text =
      " {\"a\": {\"b\": [1, -2, 3.5e2, -0.25E-1, 0, 18446744073709551615, 18446744073709551616, 1e999],\n"
      "  \"c\": {}, \"d\": [[], [[\"x\"]]]},\n"
      "  \"s\": \"q\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\u20AC\\ud83d\\ude00\", \"e\": [] } ";
  Json j = parse_json(text, "t.json");
  REQUIRE(j.kind == Json::Kind::object);
  REQUIRE(j.members.size() == 3);
  CHECK(j.members[0].first == "a");
  CHECK(j.members[1].first == "s");
  CHECK(j.members[2].first == "e");
  CHECK(j.pos == 1);
  const Json& a = *j.find("a");
  CHECK(a.pos == text.find("{\"b\""));
  const Json& b = *a.find("b");
  REQUIRE(b.kind == Json::Kind::array);
  REQUIRE(b.items.size() == 8);
  for (auto& n : b.items) CHECK(n.kind == Json::Kind::number);
  CHECK(b.items[0].is_integer);
  CHECK(b.items[0].integer == 1);
  CHECK(b.items[0].number == 1.0);
  CHECK_FALSE(b.items[1].is_integer);
  CHECK(b.items[1].number == -2.0);
  CHECK(b.items[1].describe() == "the negative number -2");
  CHECK(b.items[2].number == 350.0);
  CHECK(b.items[2].str == "3.5e2");
  CHECK_FALSE(b.items[2].is_integer);
  CHECK(b.items[3].number == -0.025);
  CHECK(b.items[4].is_integer);
  CHECK(b.items[4].integer == 0);
  CHECK(b.items[5].is_integer);
  CHECK(b.items[5].integer == UINT64_MAX);
  CHECK_FALSE(b.items[6].is_integer);  // 2^64: still a number, not a 64-bit integer
  CHECK(b.items[6].number == 18446744073709551616.0);
  CHECK_THAT(b.items[6].describe(), Catch::Contains("too large for 64 bits"));
  CHECK(std::isnan(b.items[7].number));  // beyond a double's range
  CHECK(b.items[7].str == "1e999");
  CHECK(a.find("c")->kind == Json::Kind::object);
  CHECK(a.find("c")->members.empty());
  const Json& d = *a.find("d");
  REQUIRE(d.items.size() == 2);
  CHECK(d.items[0].items.empty());
  CHECK(d.items[1].items.at(0).items.at(0).str == "x");
  CHECK(j.find("s")->str == "q\"\\/\b\f\n\r\t\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80");
  CHECK(j.find("e")->kind == Json::Kind::array);
  CHECK(j.find("missing") == nullptr);
  CHECK(parse_json("-0", "t").number == 0.0);
  CHECK(parse_json("\"\"", "t").str.empty());
}

TEST_CASE("JSON reader: trailing garbage, truncation and malformed text are DataErrors naming the source and byte",
          "[core][json]") {
  using Catch::Contains;
  CHECK_THAT(json_error("{\"a\": 1} x"), Contains("t.json is not valid JSON: at byte 9") &&
                                           Contains("unexpected 'x' after the end of the JSON value"));
  CHECK_THAT(json_error("[1] ]"), Contains("after the closing ']'"));
  CHECK_THAT(json_error("12 13"), Contains("at byte 3") && Contains("after the end of the JSON value"));
  // Every proper prefix of a document is an error, never a partial value.
  const std::string doc = "{\"k\": [1, -2.5e3, \"v\\u00e9\\ud83d\\ude00\", {\"n\": []}], \"z\": \"\"}";
  REQUIRE(json_error(doc) == "no error");
  for (std::size_t len = 0; len < doc.size(); ++len) {
    INFO("truncated to " << len << " bytes: " << doc.substr(0, len));
    CHECK_THAT(json_error(doc.substr(0, len)), Contains("t.json is not valid JSON: at byte"));
  }
  CHECK_THAT(json_error("{\"a\": \"abc"), Contains("a string is not closed"));
  CHECK_THAT(json_error("{\"a\": "), Contains("at byte 6") && Contains("the text ended"));
  CHECK_THAT(json_error("[1,]"), Contains("expected a value but found ']'"));
  CHECK_THAT(json_error("{\"a\" 1}"), Contains("expected ':'"));
  CHECK_THAT(json_error("{1: 2}"), Contains("expected a key string"));
  CHECK_THAT(json_error("01"), Contains("leading zero"));
  CHECK_THAT(json_error("-"), Contains("a digit after '-'"));
  CHECK_THAT(json_error("1."), Contains("after the decimal point"));
  CHECK_THAT(json_error("1e+"), Contains("in the exponent"));
  CHECK_THAT(json_error("\"\\ud800\""), Contains("not followed by a low one"));
  CHECK_THAT(json_error("\"\\ud800\\u0041\""), Contains("not followed by a low one"));
  CHECK_THAT(json_error("\"\\udc00\""), Contains("lone low surrogate"));
  CHECK_THAT(json_error("\"\\u12g4\""), Contains("'g' is not a hex digit"));
  CHECK_THAT(json_error("\"\\q\""), Contains("unknown escape '\\q'"));
  CHECK_THAT(json_error("\"a\nb\""), Contains("control character"));
  CHECK_THAT(json_error("[true]"), Contains("'true' is not allowed"));
  CHECK_THAT(json_error("null"), Contains("'null' is not allowed"));
  CHECK_THAT(json_error("{\"a\": 1, \"a\": 2}"), Contains("duplicate key 'a'") && Contains("at byte 9"));
  CHECK_THAT(json_error(std::string(40, '[') + std::string(40, ']')), Contains("nesting deeper than 32"));
  CHECK_THAT(json_error("[1]", true), Contains("expected '{'") && Contains("found '['"));
  CHECK_THAT(json_error("", true), Contains("expected '{'") && Contains("the end of the text"));
  CHECK_THAT(json_error("x", false, 8), Contains("at byte 8"));  // positions count from the base
}

TEST_CASE("json_escape: quotes, backslashes and control characters escaped, the reader reads back every byte",
          "[core][json]") {
  CHECK(json_escape("a\"b\\c\nd\te\x01\x1f/\xc3\xa9") == "a\\\"b\\\\c\\nd\\te\\u0001\\u001f/\xc3\xa9");
  CHECK(json_quote("<&>") == "\"<&>\"");
  std::string all;
  for (int c = 1; c < 128; ++c) all += char(c);
  all += "\xc3\xa9\xf0\x9f\x98\x80";
  CHECK(parse_json(json_quote(all), "t").str == all);
}
