// Scope: binds value names to tensors across program runs.
//
// A scope is how programs hand values to each other: the caller puts inputs and parameters in,
// a run leaves the program's outputs in, and a later program (a backward pass reading saved
// forward activations, an optimizer reading gradients) reads them by name.
//
// Thread-safety: none. A scope is used by one run at a time.
#pragma once

#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "sluice/core/tensor.h"

namespace sluice {

class Scope {
 public:
  void Set(const std::string& name, Tensor tensor) { tensors_[name] = std::move(tensor); }
  bool Has(std::string_view name) const { return Find(name) != nullptr; }
  // nullptr when absent. The pointer stays valid until the name is erased or the scope cleared
  // (setting other names does not move it).
  const Tensor* Find(std::string_view name) const;
  Tensor* FindMutable(std::string_view name);
  // Throws ProgramError("scope has no value %name") when absent.
  const Tensor& Get(std::string_view name) const;
  // Removes the binding and returns its tensor (undefined when absent).
  Tensor Take(std::string_view name);
  void Erase(std::string_view name) { Take(name); }
  void Clear() { tensors_.clear(); }

  size_t size() const { return tensors_.size(); }
  // Names in sorted order.
  std::vector<std::string> Names() const;
  // Bytes of distinct storages held by the scope's tensors.
  size_t StorageBytes() const;

 private:
  std::unordered_map<std::string, Tensor> tensors_;
};

}  // namespace sluice
