#pragma once
// One flat JSON object, built key by key: the samples' --json summary line.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include <frugal/frugal.hpp>

namespace samples {

class JsonLine {
 public:
  JsonLine& add(const std::string& key, const std::string& v) {
    return raw(key, frugal::json_quote(v));
  }
  JsonLine& add(const std::string& key, const char* v) { return add(key, std::string(v)); }
  JsonLine& add(const std::string& key, double v) {
    if (!std::isfinite(v)) return raw(key, "null");
    char buf[40];
    std::snprintf(buf, sizeof buf, "%.9g", v);  // enough digits to give a float back exactly
    return raw(key, buf);
  }
  JsonLine& add(const std::string& key, std::int64_t v) { return raw(key, std::to_string(v)); }
  JsonLine& add(const std::string& key, std::size_t v) { return raw(key, std::to_string(v)); }
  JsonLine& add(const std::string& key, int v) { return raw(key, std::to_string(v)); }
  JsonLine& add(const std::string& key, bool v) { return raw(key, v ? "true" : "false"); }
  // A value already in JSON (an array or object).
  JsonLine& raw(const std::string& key, const std::string& json) {
    body_ += (body_.empty() ? "" : ",") + frugal::json_quote(key) + ":" + json;
    return *this;
  }
  std::string str() const { return "{" + body_ + "}"; }

 private:
  std::string body_;
};

}  // namespace samples
