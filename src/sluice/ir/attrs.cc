#include "sluice/ir/attrs.h"

#include <algorithm>

#include <fmt/format.h>

#include "sluice/core/error.h"

namespace sluice {

Attrs::Attrs(std::initializer_list<std::pair<std::string, AttrValue>> items) {
  for (const auto& [name, value] : items) Set(name, value);
}

void Attrs::Set(std::string name, AttrValue value) {
  auto it = std::lower_bound(items_.begin(), items_.end(), name,
                             [](const auto& item, const std::string& n) { return item.first < n; });
  if (it != items_.end() && it->first == name) {
    it->second = std::move(value);
  } else {
    items_.insert(it, {std::move(name), std::move(value)});
  }
}

const AttrValue* Attrs::Find(std::string_view name) const {
  auto it = std::lower_bound(items_.begin(), items_.end(), name,
                             [](const auto& item, std::string_view n) { return item.first < n; });
  return it != items_.end() && it->first == name ? &it->second : nullptr;
}

const AttrValue& Attrs::Get(std::string_view name) const {
  const AttrValue* v = Find(name);
  if (v == nullptr) throw ProgramError(fmt::format("missing attribute '{}'", name));
  return *v;
}

namespace {
template <typename T>
const T& As(const AttrValue& v, std::string_view name, std::string_view type) {
  if (const T* p = std::get_if<T>(&v)) return *p;
  throw ProgramError(fmt::format("attribute '{}' must be {}", name, type));
}
}  // namespace

int64_t Attrs::GetInt(std::string_view name) const {
  return As<int64_t>(Get(name), name, "an integer");
}

int64_t Attrs::GetInt(std::string_view name, int64_t fallback) const {
  return Has(name) ? GetInt(name) : fallback;
}

double Attrs::GetFloat(std::string_view name) const {
  const AttrValue& v = Get(name);
  if (const int64_t* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
  return As<double>(v, name, "a number");
}

double Attrs::GetFloat(std::string_view name, double fallback) const {
  return Has(name) ? GetFloat(name) : fallback;
}

bool Attrs::GetBool(std::string_view name, bool fallback) const {
  return Has(name) ? As<bool>(Get(name), name, "true or false") : fallback;
}

const std::string& Attrs::GetString(std::string_view name) const {
  return As<std::string>(Get(name), name, "a string");
}

const std::vector<int64_t>& Attrs::GetInts(std::string_view name) const {
  return As<std::vector<int64_t>>(Get(name), name, "a list of integers");
}

}  // namespace sluice
