// Attributes of an instruction: a small, name-sorted map from names to values.
//
// Values are integers, floats, booleans, strings or integer lists — exactly what the text format
// can write (`{axis=-1, eps=1e-05, transpose_b=true, axes=[0, 1]}`). Getters throw ProgramError
// naming the attribute when it is missing or has the wrong type; GetFloat accepts integers.
//
// Storage: the items live in one immutable block shared by copies (copy-on-write): copying an
// Attrs copies a pointer, Set gives this Attrs a block of its own. A program keeps one block per
// distinct set of attributes (Program::AddInstruction interns them), so that a million
// instructions with the same attributes hold one block, not a million (docs/benchmarks.md,
// "Setup"). Thread-safety: as for std::shared_ptr — distinct Attrs objects sharing a block may be
// read and copied from different threads.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace sluice {

using AttrValue = std::variant<int64_t, double, bool, std::string, std::vector<int64_t>>;

class Attrs {
 public:
  using Items = std::vector<std::pair<std::string, AttrValue>>;

  Attrs() = default;
  Attrs(std::initializer_list<std::pair<std::string, AttrValue>> items);

  // Inserts or replaces.
  void Set(std::string name, AttrValue value);
  bool Has(std::string_view name) const { return Find(name) != nullptr; }
  bool empty() const { return items_ == nullptr || items_->empty(); }

  int64_t GetInt(std::string_view name) const;
  int64_t GetInt(std::string_view name, int64_t fallback) const;
  double GetFloat(std::string_view name) const;
  double GetFloat(std::string_view name, double fallback) const;
  bool GetBool(std::string_view name, bool fallback) const;
  const std::string& GetString(std::string_view name) const;
  const std::vector<int64_t>& GetInts(std::string_view name) const;

  // Sorted by name.
  const Items& items() const;
  bool operator==(const Attrs& other) const { return items() == other.items(); }

  // For interning: a hash of the names and values (floats by their bits), and whether two Attrs
  // hold bitwise the same items (unlike ==, a NaN attribute is identical to itself).
  size_t Hash() const;
  bool Identical(const Attrs& other) const;
  // Whether both share one block (then they are identical).
  bool SharesItemsWith(const Attrs& other) const { return items_ == other.items_; }

 private:
  const AttrValue* Find(std::string_view name) const;
  const AttrValue& Get(std::string_view name) const;

  std::shared_ptr<const Items> items_;  // null: no attributes
};

struct AttrsHash {
  size_t operator()(const Attrs& attrs) const { return attrs.Hash(); }
};
struct AttrsIdentical {
  bool operator()(const Attrs& a, const Attrs& b) const { return a.Identical(b); }
};

}  // namespace sluice
