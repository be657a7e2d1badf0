// Near misses: which known name a misspelled one was probably meant to be, for the "did you mean
// 'transpose_b'?" hint of an error message (program attributes, option values).
//
// Thread-safety: pure functions.
//
// Example:
//   EditDistance("tranpose_b", "transpose_b")                       // 1
//   ClosestSpelling("tranpose_b", {"transpose_a", "transpose_b"})  // "transpose_b"
//   ClosestSpelling("axis", {"transpose_a", "transpose_b"})        // std::nullopt
#pragma once

#include <cstddef>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace sluice {

// The optimal-string-alignment distance: the fewest insertions, deletions, substitutions and swaps
// of two adjacent characters that turn `a` into `b` ("tranpose" → "transpose" is 1, "eps" → "esp"
// is 1). Quadratic in the lengths; meant for names, not documents.
size_t EditDistance(std::string_view a, std::string_view b);

// The candidate nearest to `word` when it is near enough to be a likely misspelling: at most
// max(1, |word| / 3) edits away. The first of equally near candidates wins; nullopt when none is
// near (or `word` is itself a candidate, which is no misspelling).
std::optional<std::string> ClosestSpelling(std::string_view word,
                                           std::span<const std::string_view> candidates);

}  // namespace sluice
