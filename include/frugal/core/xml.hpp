#pragma once
// Escaping text for XML (the SVG plots): what goes between tags and inside
// attribute values, whichever quote the attribute uses.
#include <string>
#include <string_view>

namespace frugal {

// `s` with & < > " ' as entities. Control characters XML 1.0 cannot hold at
// all (all below 0x20 but tab, newline and carriage return) become U+FFFD,
// so the document stays well-formed whatever the text was.
inline std::string xml_escape(std::string_view s) {
  std::string o;
  o.reserve(s.size());
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    switch (ch) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      case '\'': o += "&apos;"; break;
      default:
        if (c < 0x20 && c != '\t' && c != '\n' && c != '\r') o += "\xef\xbf\xbd";
        else o += ch;
    }
  }
  return o;
}

}  // namespace frugal
