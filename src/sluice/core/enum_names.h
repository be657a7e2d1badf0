// Names for enum values, written once per enum as a table: the one source for printing a value,
// parsing a name back and listing the choices in an error message or a --help line.
//
// A table is a constexpr array of {value, name} pairs, declared in the header of the enum it names
// so that callers can list the choices. It lists the values 0 … N−1 once each under distinct,
// non-empty names; IsCompleteEnumTable checks that at compile time (a static_assert under the
// table), so a value missing from the middle or a name given twice does not build; a value added
// last to the enum and forgotten in the table is the one mistake it cannot see. The enum's own
// header keeps its public functions (`Name(DType)`, `ParseDType`), defined with the templates
// below.
//
// Lookups are linear: tables hold a handful of entries.
// Thread-safety: pure functions over constant tables.
//
// Example:
//   enum class RunMode : uint8_t { kTrace, kParallel };
//   inline constexpr EnumEntry<RunMode> kRunModeNames[] = {{RunMode::kTrace, "trace"},
//                                                          {RunMode::kParallel, "parallel"}};
//   static_assert(IsCompleteEnumTable(kRunModeNames));
//   EnumName(kRunModeNames, RunMode::kTrace)   // "trace"
//   ParseEnum(kRunModeNames, "parallel")       // RunMode::kParallel; "async" gives std::nullopt
//   EnumNames(kRunModeNames)                   // "trace|parallel"
//   EnumNames(kRunModeNames, ", ")             // "trace, parallel"
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>

namespace sluice {

template <typename E>
struct EnumEntry {
  E value;
  std::string_view name;
};

// Whether `table` lists the values 0 … N−1 of E once each, under distinct, non-empty names.
template <typename E, size_t N>
constexpr bool IsCompleteEnumTable(const EnumEntry<E> (&table)[N]) {
  for (size_t i = 0; i < N; ++i) {
    if (table[i].name.empty()) return false;
    const auto v = static_cast<long long>(static_cast<std::underlying_type_t<E>>(table[i].value));
    if (v < 0 || v >= static_cast<long long>(N)) return false;
    for (size_t j = 0; j < i; ++j) {
      if (table[j].value == table[i].value || table[j].name == table[i].name) return false;
    }
  }
  return true;
}

// The name of `value`; "?" for a value outside the enum (a cast integer).
template <typename E, size_t N>
constexpr std::string_view EnumName(const EnumEntry<E> (&table)[N], E value) {
  for (const EnumEntry<E>& entry : table) {
    if (entry.value == value) return entry.name;
  }
  return "?";
}

// The value named `name` (exact, case-sensitive match); std::nullopt for any other text.
template <typename E, size_t N>
constexpr std::optional<E> ParseEnum(const EnumEntry<E> (&table)[N], std::string_view name) {
  for (const EnumEntry<E>& entry : table) {
    if (entry.name == name) return entry.value;
  }
  return std::nullopt;
}

// Every name in table order, joined by `separator`: "trace|parallel".
template <typename E, size_t N>
std::string EnumNames(const EnumEntry<E> (&table)[N], std::string_view separator = "|") {
  std::string names;
  for (size_t i = 0; i < N; ++i) {
    if (i > 0) names += separator;
    names += table[i].name;
  }
  return names;
}

}  // namespace sluice
