#include "sluice/ir/op_registry.h"

#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "sluice/core/error.h"
#include "sluice/core/spelling.h"
#include "sluice/ir/ops/attention.h"
#include "sluice/ir/ops/batch_norm.h"
#include "sluice/ir/ops/conv.h"
#include "sluice/ir/ops/dropout.h"
#include "sluice/ir/ops/select.h"

namespace sluice {

const OpRegistry& OpRegistry::Global() {
  static const OpRegistry* const registry = [] {
    auto* r = new OpRegistry();
    RegisterElementwiseOps(*r);
    RegisterReductionOps(*r);
    RegisterShapeOps(*r);
    RegisterLinalgOps(*r);
    RegisterNnOps(*r);
    RegisterBatchNormOps(*r);
    RegisterAttentionOps(*r);
    RegisterConvOps(*r);
    RegisterDropoutOps(*r);
    RegisterSelectOps(*r);
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

namespace {

bool IsVariadic(const OpParam& p) { return p.name.ends_with("..."); }

// The signature fits the op: one entry per input (a single "xs..." when variadic), no outputs
// exactly when the op updates in place, and a name and a type everywhere.
void CheckSignature(const OpDef& def) {
  const OpSignature& s = def.signature;
  const int listed = static_cast<int>(s.inputs.size());
  if (def.num_inputs < 0) {
    SLUICE_CHECK(listed == 1 && IsVariadic(s.inputs[0]),
                 "op '{}' is variadic: its signature lists one input named 'xs...'", def.name);
  } else {
    SLUICE_CHECK(listed == def.num_inputs, "op '{}' takes {} inputs but its signature lists {}",
                 def.name, def.num_inputs, listed);
  }
  SLUICE_CHECK(s.outputs.empty() == (def.kind == OpKind::kInPlace),
               "op '{}': an op has outputs unless it updates its inputs in place", def.name);
  SLUICE_CHECK(def.updates.empty() != (def.kind == OpKind::kInPlace),
               "op '{}': an in-place op names the inputs it writes (OpDef::updates), and only it",
               def.name);
  for (int u : def.updates) {
    SLUICE_CHECK(u >= 0 && u < listed, "op '{}': updates input {}, which it does not have",
                 def.name, u);
  }
  for (int j : def.in_place_inputs) {
    SLUICE_CHECK(def.kind == OpKind::kCompute && j >= 0 && j < listed,
                 "op '{}': output 0 may be written over input {}, which a kCompute op of it must "
                 "have",
                 def.name, j);
  }
  for (const std::vector<OpParam>* params : {&s.inputs, &s.attrs, &s.outputs}) {
    for (const OpParam& p : *params) {
      SLUICE_CHECK(!p.name.empty() && !p.type.empty(),
                   "op '{}': a signature entry lacks a name or type", def.name);
    }
  }
}

}  // namespace

std::string UndeclaredAttrMessage(const OpDef& op, std::string_view name) {
  for (const OpParam& a : op.signature.attrs) {
    if (a.name == name) return "";  // the common case, once per attribute of every instruction
  }
  std::vector<std::string_view> declared;
  for (const OpParam& a : op.signature.attrs) declared.push_back(a.name);
  if (declared.empty()) return fmt::format("{} takes no attributes, got '{}'", op.name, name);
  std::optional<std::string> meant = ClosestSpelling(name, declared);
  return fmt::format("{} has no attribute '{}'{}; its attributes are {}", op.name, name,
                     meant ? fmt::format(" (did you mean '{}'?)", *meant) : "",
                     fmt::join(declared, ", "));
}

std::string UndeclaredAttrsMessage(const OpDef& op, const Attrs& attrs) {
  for (const auto& [name, value] : attrs.items()) {
    std::string message = UndeclaredAttrMessage(op, name);
    if (!message.empty()) return message;
  }
  return "";
}

std::string_view Name(OpKind kind) { return EnumName(kOpKindNames, kind); }

void OpRegistry::Register(OpDef def) {
  SLUICE_CHECK(!def.name.empty() && def.infer != nullptr, "op '{}' needs a name and inference",
               def.name);
  SLUICE_CHECK(def.kernel != nullptr || def.reference != nullptr, "op '{}' has no kernel",
               def.name);
  SLUICE_CHECK(!def.doc.empty(), "op '{}' has no doc (one line for `sluice ops`)", def.name);
  CheckSignature(def);
  if (def.kernel == nullptr) def.kernel = def.reference;
  if (def.reference == nullptr) def.reference = def.kernel;
  SLUICE_CHECK(!ops_.count(def.name), "op '{}' registered twice", def.name);
  std::string name = def.name;
  ops_.emplace(std::move(name), std::make_unique<OpDef>(std::move(def)));
}

}  // namespace sluice
