// Attributes of an instruction: a small, name-sorted map from names to values.
//
// Values are integers, floats, booleans, strings or integer lists — exactly what the text format
// can write (`{axis=-1, eps=1e-05, transpose_b=true, axes=[0, 1]}`). Getters throw ProgramError
// naming the attribute when it is missing or has the wrong type; GetFloat accepts integers.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace sluice {

using AttrValue = std::variant<int64_t, double, bool, std::string, std::vector<int64_t>>;

class Attrs {
 public:
  Attrs() = default;
  Attrs(std::initializer_list<std::pair<std::string, AttrValue>> items);

  // Inserts or replaces.
  void Set(std::string name, AttrValue value);
  bool Has(std::string_view name) const { return Find(name) != nullptr; }
  bool empty() const { return items_.empty(); }

  int64_t GetInt(std::string_view name) const;
  int64_t GetInt(std::string_view name, int64_t fallback) const;
  double GetFloat(std::string_view name) const;
  double GetFloat(std::string_view name, double fallback) const;
  bool GetBool(std::string_view name, bool fallback) const;
  const std::string& GetString(std::string_view name) const;
  const std::vector<int64_t>& GetInts(std::string_view name) const;

  // Sorted by name.
  const std::vector<std::pair<std::string, AttrValue>>& items() const { return items_; }
  bool operator==(const Attrs& other) const { return items_ == other.items_; }

 private:
  const AttrValue* Find(std::string_view name) const;
  const AttrValue& Get(std::string_view name) const;

  std::vector<std::pair<std::string, AttrValue>> items_;
};

}  // namespace sluice
