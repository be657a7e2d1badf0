#include "sluice/ir/op_registry.h"

#include <fmt/format.h>

#include "sluice/core/error.h"

namespace sluice {

const OpRegistry& OpRegistry::Global() {
  static const OpRegistry* const registry = [] {
    auto* r = new OpRegistry();
    RegisterElementwiseOps(*r);
    RegisterReductionOps(*r);
    RegisterShapeOps(*r);
    RegisterLinalgOps(*r);
    RegisterNnOps(*r);
    RegisterOptimizerOps(*r);
    return r;
  }();
  return *registry;
}

const OpDef* OpRegistry::Find(std::string_view name) const {
  auto it = ops_.find(name);
  return it == ops_.end() ? nullptr : it->second.get();
}

const OpDef& OpRegistry::Get(std::string_view name) const {
  const OpDef* op = Find(name);
  if (op == nullptr) throw ProgramError(fmt::format("unknown op '{}'", name));
  return *op;
}

std::vector<const OpDef*> OpRegistry::All() const {
  std::vector<const OpDef*> all;
  for (const auto& [name, op] : ops_) all.push_back(op.get());
  return all;
}

void OpRegistry::Register(OpDef def) {
  SLUICE_CHECK(!def.name.empty() && def.infer != nullptr, "op '{}' needs a name and inference", def.name);
  SLUICE_CHECK(def.kernel != nullptr || def.reference != nullptr, "op '{}' has no kernel", def.name);
  if (def.kernel == nullptr) def.kernel = def.reference;
  if (def.reference == nullptr) def.reference = def.kernel;
  SLUICE_CHECK(!ops_.count(def.name), "op '{}' registered twice", def.name);
  std::string name = def.name;
  ops_.emplace(std::move(name), std::make_unique<OpDef>(std::move(def)));
}

}  // namespace sluice
