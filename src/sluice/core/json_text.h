// JSON that users hand over — metrics lines and traces for `sluice report`, the costs file of
// `simulate --costs`, a checkpoint's index, its safetensors header and its "config" metadata —
// parsed with a bound on how deeply it nests.
//
// nlohmann::json parses any depth without recursing, but dump(), comparison, copies and the
// readers' own walks recurse once per level: 100000 '[' (a 200 KB file) overflowed the stack of
// `sluice report`, `simulate --costs`, `sample` and `train --resume` as soon as a message or the
// page printed the value, and each level costs a node of memory however it is used. Nothing
// sluice writes nests deeper than a few levels, so ParseJsonText refuses text nested deeper than
// kMaxJsonDepth before nlohmann reads it.
//
// Failure: nlohmann::json::parse_error, as nlohmann::json::parse throws for bad syntax (callers
// that turn one into their own error turn both): for nesting, at the byte of the bracket that
// opens level kMaxJsonDepth + 1. Thread-safety: a pure function.
//
// Example:
//   nlohmann::json j = ParseJsonText(ReadWholeFile("trace file", path));
#pragma once

#include <cstddef>
#include <optional>
#include <string_view>

#include <nlohmann/json.hpp>

namespace sluice {

// The deepest nesting of arrays and objects accepted: {"a": [1]} is 2 levels deep.
inline constexpr int kMaxJsonDepth = 128;

// The offset of the first '[' or '{' of `text` (outside strings) that opens a level deeper than
// `max_depth`; nullopt when there is none. Text that is not JSON is scanned all the same (the
// parser then says what is wrong with it).
std::optional<size_t> JsonTooDeepAt(std::string_view text, int max_depth = kMaxJsonDepth);

// nlohmann::json::parse(text, callback), after refusing text nested deeper than kMaxJsonDepth
// (parse_error 101: "nesting deeper than 128 levels ...").
nlohmann::json ParseJsonText(std::string_view text,
                             const nlohmann::json::parser_callback_t& callback = nullptr);

}  // namespace sluice
