#pragma once
// A small strict JSON reader for file headers we do not control (the
// safetensors header): objects, arrays, strings (with every escape, \uXXXX
// and surrogate pairs included) and non-negative integers. Anything else
// (true, false, null, negative or fractional numbers) is rejected by name,
// as are duplicate keys and nesting deeper than a header ever needs, so a
// hostile file gets a clear error instead of a stack overflow or a guess.
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "../core/error.hpp"
#include "../core/utf8.hpp"

namespace frugal::io {

struct Json {
  enum class Kind { object, array, string, integer };
  Kind kind = Kind::object;
  std::size_t pos = 0;  // where the value starts, in bytes from the start of the text
  std::string str;
  std::uint64_t integer = 0;
  std::vector<Json> items;                            // an array's elements
  std::vector<std::pair<std::string, Json>> members;  // an object's members, in text order

  static Json at(Kind k, std::size_t pos) {
    Json v;
    v.kind = k;
    v.pos = pos;
    return v;
  }
  const Json* find(std::string_view key) const {
    for (auto& [k, v] : members)
      if (k == key) return &v;
    return nullptr;
  }
  static const char* kind_name(Kind k) {
    switch (k) {
      case Kind::object: return "an object";
      case Kind::array: return "an array";
      case Kind::string: return "a string";
      case Kind::integer: return "an integer";
    }
    return "?";
  }
};

namespace detail {

class JsonParser {
 public:
  // `where` starts every error message (e.g. "model.safetensors: header");
  // `base` is added to byte positions so they count from the file's start.
  JsonParser(std::string_view text, std::string where, std::size_t base)
      : s_(text), where_(std::move(where)), base_(base) {}

  Json parse_document() {
    skip_ws();
    Json v = value(0);
    skip_ws();
    if (i_ != s_.size()) error("unexpected ", describe_here(), " after the end of the JSON value");
    return v;
  }

 private:
  static constexpr int kMaxDepth = 32;

  template <class... P>
  [[noreturn]] void error(P&&... parts) const {
    fail<DataError>(where_, " is not valid JSON: at byte ", base_ + i_, ": ", std::forward<P>(parts)...);
  }
  std::string describe_here() const {
    if (i_ >= s_.size()) return "end of the header";
    unsigned char c = static_cast<unsigned char>(s_[i_]);
    if (c >= 0x20 && c < 0x7f) return cat("'", char(c), "'");
    return cat("byte 0x", "0123456789abcdef"[c >> 4], "0123456789abcdef"[c & 15]);
  }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  void expect(char c) {
    if (i_ >= s_.size() || s_[i_] != c) error("expected '", c, "' but found ", describe_here());
    ++i_;
  }

  Json value(int depth) {
    if (depth > kMaxDepth) error("nesting deeper than ", kMaxDepth, " levels");
    if (i_ >= s_.size()) error("expected a value but the header ended");
    char c = s_[i_];
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') {
      Json v = Json::at(Json::Kind::string, i_);
      v.str = string();
      return v;
    }
    if (c >= '0' && c <= '9') return integer();
    if (c == '-') error("negative numbers are not allowed here (shapes and offsets are non-negative integers)");
    for (std::string_view word : {"true", "false", "null"})
      if (s_.substr(i_, word.size()) == word) error("'", word, "' is not allowed here (only objects, arrays, strings and integers)");
    error("expected a value but found ", describe_here());
  }

  Json object(int depth) {
    Json v = Json::at(Json::Kind::object, i_);
    expect('{');
    skip_ws();
    if (i_ < s_.size() && s_[i_] == '}') {
      ++i_;
      return v;
    }
    for (;;) {
      skip_ws();
      if (i_ >= s_.size() || s_[i_] != '"') error("expected a key string but found ", describe_here());
      std::size_t key_pos = i_;
      std::string key = string();
      if (v.find(key)) {
        i_ = key_pos;
        error("duplicate key '", key, "'");
      }
      skip_ws();
      expect(':');
      skip_ws();
      v.members.emplace_back(std::move(key), value(depth + 1));
      skip_ws();
      if (i_ < s_.size() && s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (i_ < s_.size() && s_[i_] == '}') {
        ++i_;
        return v;
      }
      error("expected ',' or '}' in an object but found ", describe_here());
    }
  }

  Json array(int depth) {
    Json v = Json::at(Json::Kind::array, i_);
    expect('[');
    skip_ws();
    if (i_ < s_.size() && s_[i_] == ']') {
      ++i_;
      return v;
    }
    for (;;) {
      skip_ws();
      v.items.push_back(value(depth + 1));
      skip_ws();
      if (i_ < s_.size() && s_[i_] == ',') {
        ++i_;
        continue;
      }
      if (i_ < s_.size() && s_[i_] == ']') {
        ++i_;
        return v;
      }
      error("expected ',' or ']' in an array but found ", describe_here());
    }
  }

  Json integer() {
    Json v = Json::at(Json::Kind::integer, i_);
    if (s_[i_] == '0' && i_ + 1 < s_.size() && s_[i_ + 1] >= '0' && s_[i_ + 1] <= '9')
      error("a number with a leading zero");
    std::uint64_t n = 0;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
      std::uint64_t d = std::uint64_t(s_[i_] - '0');
      if (n > (UINT64_MAX - d) / 10) error("an integer too large for 64 bits");
      n = n * 10 + d;
      ++i_;
    }
    if (i_ < s_.size() && (s_[i_] == '.' || s_[i_] == 'e' || s_[i_] == 'E'))
      error("a fractional or exponent number is not allowed here (shapes and offsets are integers)");
    v.integer = n;
    return v;
  }

  unsigned hex4() {
    if (i_ + 4 > s_.size()) error("a \\u escape needs four hex digits");
    unsigned u = 0;
    for (int k = 0; k < 4; ++k) {
      char c = s_[i_++];
      u <<= 4;
      if (c >= '0' && c <= '9') u |= unsigned(c - '0');
      else if (c >= 'a' && c <= 'f') u |= unsigned(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') u |= unsigned(c - 'A' + 10);
      else {
        --i_;
        error("'", c, "' is not a hex digit in a \\u escape");
      }
    }
    return u;
  }

  std::string string() {
    expect('"');
    std::string out;
    for (;;) {
      if (i_ >= s_.size()) error("a string is not closed before the header ends");
      unsigned char c = static_cast<unsigned char>(s_[i_]);
      if (c == '"') {
        ++i_;
        return out;
      }
      if (c < 0x20) error("an unescaped control character (", describe_here(), ") in a string");
      if (c != '\\') {
        out += char(c);
        ++i_;
        continue;
      }
      ++i_;
      if (i_ >= s_.size()) error("a string ends inside an escape");
      char e = s_[i_++];
      switch (e) {
        case '"': out += '"'; break;
        case '\\': out += '\\'; break;
        case '/': out += '/'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xD800 && cp < 0xDC00) {  // a high surrogate: a low one must follow
            if (i_ + 2 > s_.size() || s_[i_] != '\\' || s_[i_ + 1] != 'u')
              error("a \\u escape of a high surrogate is not followed by a low one");
            i_ += 2;
            unsigned lo = hex4();
            if (lo < 0xDC00 || lo >= 0xE000) error("a \\u escape of a high surrogate is not followed by a low one");
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
          } else if (cp >= 0xDC00 && cp < 0xE000) {
            error("a \\u escape of a lone low surrogate");
          }
          append_utf8(out, cp);
          break;
        }
        default:
          --i_;
          error("unknown escape '\\", e, "' in a string");
      }
    }
  }

  std::string_view s_;
  std::string where_;
  std::size_t base_;
  std::size_t i_ = 0;
};

}  // namespace detail

// Parses `text` as one JSON value; errors are DataErrors starting with
// `where` and giving the byte position (plus `base`, e.g. the header's
// offset in its file).
inline Json parse_json(std::string_view text, const std::string& where, std::size_t base = 0) {
  return detail::JsonParser(text, where, base).parse_document();
}

// `s` as a JSON string literal, quotes included.
inline std::string json_quote(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"') out += "\\\"";
    else if (c == '\\') out += "\\\\";
    else if (c < 0x20) {
      const char* hex = "0123456789abcdef";
      out += "\\u00";
      out += hex[c >> 4];
      out += hex[c & 15];
    } else
      out += ch;
  }
  return out + "\"";
}

}  // namespace frugal::io
