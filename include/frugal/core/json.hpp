#pragma once
// The one JSON reader and the one JSON string escaper, for every layer:
// io/ reads safetensors headers with it (files we do not control), plan/
// reads the device profile cache, the samples and plan reports write with
// json_escape.
//
// The reader is strict: objects, arrays, strings (with every escape, \uXXXX
// and surrogate pairs included) and numbers (RFC 8259's grammar: negative,
// fractional and exponent forms). true, false and null are rejected by name
// (no format frugal reads has them), as are duplicate keys, leading zeros,
// trailing text and nesting deeper than a file ever needs, so a hostile file
// gets a clear error naming where it broke instead of a stack overflow or a
// guess. Callers check kinds and ranges and name the field that is wrong.
#include <charconv>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "error.hpp"

namespace frugal {

// Appends a Unicode code point as UTF-8 (what \uXXXX escapes turn into).
inline void append_utf8(std::string& out, unsigned cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

struct Json {
  enum class Kind { object, array, string, number };
  Kind kind = Kind::object;
  std::size_t pos = 0;  // where the value starts, in bytes from the start of the text (plus the base)
  std::string str;      // a string's value; a number's text as written
  double number = 0;    // a number's value (NaN where its text is beyond a double's range: 1e999, 1e-999)
  bool is_integer = false;  // a number written as a non-negative integer that fits in 64 bits...
  std::uint64_t integer = 0;                          // ...and that integer
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
      case Kind::number: return "a number";
    }
    return "?";
  }
  // What this value is, for an error message: "an array", "the negative
  // number -3", "the integer 12".
  std::string describe() const {
    if (kind != Kind::number) return kind_name(kind);
    if (is_integer) return cat("the integer ", str);
    if (str.front() == '-') return cat("the negative number ", str);
    if (str.find_first_of(".eE") != std::string::npos)
      return cat("the number ", str, " (fractional or with an exponent)");
    return cat("the integer ", str, " (too large for 64 bits)");
  }
};

namespace detail {

class JsonParser {
 public:
  // `where` starts every error message (e.g. "model.safetensors: the
  // header"); `base` is added to byte positions so they count from the
  // start of the file the text sits in.
  JsonParser(std::string_view text, std::string where, std::size_t base)
      : s_(text), where_(std::move(where)), base_(base) {}

  Json parse_document(bool require_object) {
    skip_ws();
    if (require_object && (i_ >= s_.size() || s_[i_] != '{'))
      error("expected '{' (the text must be one JSON object) but found ", describe_here());
    Json v = value(0);
    skip_ws();
    if (i_ != s_.size()) {
      if (v.kind == Json::Kind::object || v.kind == Json::Kind::array)
        error("unexpected ", describe_here(),
              " after the end of the JSON value (only whitespace may come after the closing '",
              v.kind == Json::Kind::object ? '}' : ']', "')");
      error("unexpected ", describe_here(), " after the end of the JSON value");
    }
    return v;
  }

 private:
  static constexpr int kMaxDepth = 32;

  template <class... P>
  [[noreturn]] void error(P&&... parts) const {
    fail<DataError>(where_, " is not valid JSON: at byte ", base_ + i_, ": ", std::forward<P>(parts)...);
  }
  std::string describe_here() const {
    if (i_ >= s_.size()) return "the end of the text";
    unsigned char c = static_cast<unsigned char>(s_[i_]);
    if (c >= 0x20 && c < 0x7f) return cat("'", char(c), "'");
    return cat("byte 0x", "0123456789abcdef"[c >> 4], "0123456789abcdef"[c & 15]);
  }
  bool at_digit() const { return i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9'; }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  void expect(char c) {
    if (i_ >= s_.size() || s_[i_] != c) error("expected '", c, "' but found ", describe_here());
    ++i_;
  }

  Json value(int depth) {
    if (depth > kMaxDepth) error("nesting deeper than ", kMaxDepth, " levels");
    if (i_ >= s_.size()) error("expected a value but the text ended");
    char c = s_[i_];
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') {
      Json v = Json::at(Json::Kind::string, i_);
      v.str = string();
      return v;
    }
    if (c == '-' || (c >= '0' && c <= '9')) return number();
    for (std::string_view word : {"true", "false", "null"})
      if (s_.substr(i_, word.size()) == word)
        error("'", word, "' is not allowed here (only objects, arrays, strings and numbers)");
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
        error("duplicate key '", key, "': '", key, "' appears twice in one object");
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

  // -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?
  Json number() {
    Json v = Json::at(Json::Kind::number, i_);
    const std::size_t start = i_;
    bool negative = s_[i_] == '-', plain = !negative;
    if (negative) ++i_;
    if (!at_digit()) error("expected a digit after '-' but found ", describe_here());
    if (s_[i_] == '0' && i_ + 1 < s_.size() && s_[i_ + 1] >= '0' && s_[i_ + 1] <= '9')
      error("a number with a leading zero");
    std::uint64_t n = 0;
    bool fits = true;
    while (at_digit()) {
      std::uint64_t d = std::uint64_t(s_[i_] - '0');
      if (n > (UINT64_MAX - d) / 10) fits = false;
      else n = n * 10 + d;
      ++i_;
    }
    if (i_ < s_.size() && s_[i_] == '.') {
      plain = false;
      ++i_;
      if (!at_digit()) error("expected a digit after the decimal point but found ", describe_here());
      while (at_digit()) ++i_;
    }
    if (i_ < s_.size() && (s_[i_] == 'e' || s_[i_] == 'E')) {
      plain = false;
      ++i_;
      if (i_ < s_.size() && (s_[i_] == '+' || s_[i_] == '-')) ++i_;
      if (!at_digit()) error("expected a digit in the exponent but found ", describe_here());
      while (at_digit()) ++i_;
    }
    v.str = std::string(s_.substr(start, i_ - start));
    v.is_integer = plain && fits;
    v.integer = v.is_integer ? n : 0;
    auto r = std::from_chars(v.str.data(), v.str.data() + v.str.size(), v.number);
    if (r.ec != std::errc() || r.ptr != v.str.data() + v.str.size())
      v.number = std::numeric_limits<double>::quiet_NaN();
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
      if (i_ >= s_.size()) error("a string is not closed before the text ends");
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

// Parses `text` as one JSON value. Errors are DataErrors that start with
// `where`, say "is not valid JSON" and give the byte position (plus `base`,
// e.g. the header's offset in its file) and what was wrong there.
inline Json parse_json(std::string_view text, const std::string& where, std::size_t base = 0) {
  return detail::JsonParser(text, where, base).parse_document(false);
}
// The same, for a text that must be one JSON object.
inline Json parse_json_object(std::string_view text, const std::string& where, std::size_t base = 0) {
  return detail::JsonParser(text, where, base).parse_document(true);
}

// `s` escaped for the inside of a JSON string literal: quotes and
// backslashes escaped, newlines and tabs as \n and \t, other control
// characters as \u00XX; everything else (UTF-8 included) as it is.
inline std::string json_escape(std::string_view s) {
  std::string o;
  o.reserve(s.size());
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    if (c == '"' || c == '\\') {
      o += '\\';
      o += ch;
    } else if (c == '\n') {
      o += "\\n";
    } else if (c == '\t') {
      o += "\\t";
    } else if (c < 0x20) {
      o += "\\u00";
      o += "0123456789abcdef"[c >> 4];
      o += "0123456789abcdef"[c & 15];
    } else {
      o += ch;
    }
  }
  return o;
}
// `s` as a JSON string literal, quotes included.
inline std::string json_quote(std::string_view s) { return "\"" + json_escape(s) + "\""; }

}  // namespace frugal
