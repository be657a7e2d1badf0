#include "sluice/exec/scope.h"

#include <algorithm>
#include <unordered_set>

#include <fmt/format.h>

namespace sluice {

const Tensor* Scope::Find(std::string_view name) const {
  auto it = tensors_.find(std::string(name));
  return it == tensors_.end() ? nullptr : &it->second;
}

Tensor* Scope::FindMutable(std::string_view name) {
  auto it = tensors_.find(std::string(name));
  return it == tensors_.end() ? nullptr : &it->second;
}

const Tensor& Scope::Get(std::string_view name) const {
  const Tensor* t = Find(name);
  if (t == nullptr) throw ProgramError(fmt::format("scope has no value %{}", name));
  return *t;
}

Tensor Scope::Take(std::string_view name) {
  auto it = tensors_.find(std::string(name));
  if (it == tensors_.end()) return Tensor();
  Tensor t = std::move(it->second);
  tensors_.erase(it);
  return t;
}

std::vector<std::string> Scope::Names() const {
  std::vector<std::string> names;
  for (const auto& [name, t] : tensors_) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

size_t Scope::StorageBytes() const {
  std::unordered_set<const Storage*> seen;
  size_t bytes = 0;
  for (const auto& [name, t] : tensors_) {
    if (t.defined() && seen.insert(t.storage().get()).second) bytes += t.storage()->nbytes();
  }
  return bytes;
}

}  // namespace sluice
