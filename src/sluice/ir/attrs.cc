#include "sluice/ir/attrs.h"

#include <algorithm>
#include <bit>
#include <functional>
#include <type_traits>

#include <fmt/format.h>

#include "sluice/core/error.h"

namespace sluice {

namespace {

// Inserts or replaces, keeping `items` sorted by name.
void SetItem(Attrs::Items& items, std::string name, AttrValue value) {
  auto it = std::lower_bound(items.begin(), items.end(), name,
                             [](const auto& item, const std::string& n) { return item.first < n; });
  if (it != items.end() && it->first == name) {
    it->second = std::move(value);
  } else {
    items.insert(it, {std::move(name), std::move(value)});
  }
}

}  // namespace

Attrs::Attrs(std::initializer_list<std::pair<std::string, AttrValue>> items) {
  if (items.size() == 0) return;
  auto block = std::make_shared<Items>();
  for (const auto& [name, value] : items) SetItem(*block, name, value);
  items_ = std::move(block);
}

const Attrs::Items& Attrs::items() const {
  static const Items kNone;
  return items_ != nullptr ? *items_ : kNone;
}

void Attrs::Set(std::string name, AttrValue value) {
  if (items_ != nullptr && items_.use_count() == 1) {  // ours alone (made by make_shared<Items>)
    SetItem(const_cast<Items&>(*items_), std::move(name), std::move(value));
    return;
  }
  // Copy on write: the block is shared with other Attrs.
  auto block = items_ != nullptr ? std::make_shared<Items>(*items_) : std::make_shared<Items>();
  SetItem(*block, std::move(name), std::move(value));
  items_ = std::move(block);
}

const AttrValue* Attrs::Find(std::string_view name) const {
  const Items& items = this->items();
  auto it = std::lower_bound(items.begin(), items.end(), name,
                             [](const auto& item, std::string_view n) { return item.first < n; });
  return it != items.end() && it->first == name ? &it->second : nullptr;
}

namespace {

size_t Mix(size_t h, size_t v) { return (h ^ v) * 0x100000001B3ull; }

// Floats compare by their bits: NaN is identical to itself, 0.0 differs from -0.0.
bool IdenticalValues(const AttrValue& a, const AttrValue& b) {
  if (a.index() != b.index()) return false;
  if (const double* x = std::get_if<double>(&a)) {
    return std::bit_cast<uint64_t>(*x) == std::bit_cast<uint64_t>(std::get<double>(b));
  }
  return a == b;
}

}  // namespace

size_t Attrs::Hash() const {
  size_t h = 0xcbf29ce484222325ull;
  for (const auto& [name, value] : items()) {
    h = Mix(h, std::hash<std::string>{}(name));
    h = Mix(h, value.index());
    std::visit(
        [&](const auto& v) {
          using T = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<T, double>) {
            h = Mix(h, std::bit_cast<uint64_t>(v));
          } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
            for (int64_t x : v) h = Mix(h, static_cast<size_t>(x));
          } else {
            h = Mix(h, std::hash<T>{}(v));
          }
        },
        value);
  }
  return h;
}

bool Attrs::Identical(const Attrs& other) const {
  if (items_ == other.items_) return true;
  const Items& a = items();
  const Items& b = other.items();
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].first != b[i].first || !IdenticalValues(a[i].second, b[i].second)) return false;
  }
  return true;
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
