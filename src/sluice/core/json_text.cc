#include "sluice/core/json_text.h"

#include <fmt/format.h>

namespace sluice {

std::optional<size_t> JsonTooDeepAt(std::string_view text, int max_depth) {
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\') {
        ++i;  // the escaped character: \" does not end the string
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) return i;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return std::nullopt;
}

nlohmann::json ParseJsonText(std::string_view text,
                             const nlohmann::json::parser_callback_t& callback) {
  if (const std::optional<size_t> at = JsonTooDeepAt(text)) {
    // parse_error counts bytes from 1, as the parser's own do.
    throw nlohmann::json::parse_error::create(
        101, *at + 1,
        fmt::format("nesting deeper than {} levels of arrays and objects", kMaxJsonDepth), nullptr);
  }
  return nlohmann::json::parse(text, callback);
}

}  // namespace sluice
