// FNV-1a, 64 bits: a cheap running hash of bytes, for digests that say "the same or not" (a
// program's text, a tensor's bytes, which sequences a dataset holds out). Not for security.
//
// Thread-safety: a value type; one hash per thread.
//
// Example:
//   Fnv1a h;
//   for (unsigned char c : text) h.Add(c);
//   fmt::format("{:016x}", h.value());
#pragma once

#include <cstddef>
#include <cstdint>

namespace sluice {

class Fnv1a {
 public:
  static constexpr uint64_t kOffsetBasis = 14695981039346656037ull;
  static constexpr uint64_t kPrime = 1099511628211ull;

  // `basis` other than FNV's own only where a stored or pinned digest was made with it.
  explicit constexpr Fnv1a(uint64_t basis = kOffsetBasis) : h_(basis) {}

  constexpr void Add(uint64_t byte) { h_ = (h_ ^ byte) * kPrime; }
  void Add(const void* data, size_t size) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < size; ++i) Add(p[i]);
  }
  constexpr uint64_t value() const { return h_; }

 private:
  uint64_t h_;
};

}  // namespace sluice
