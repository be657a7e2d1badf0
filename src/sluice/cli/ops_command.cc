// `sluice ops [OP...]`: every op the registry knows (ir/op_registry.h) — the operations a program
// may use — with its signature, its one-line doc and its traits (kind, kernels, gradient):
//
//   split(x: any[...]) {axis: int, sizes: ints} -> ys...: any[...]
//     x cut along axis into pieces of the given sizes (copies)
//     compute; reference and fast kernels; VJP
//
// Types use the glossary's shape letters (docs/glossary.md): float = f32 or f64, int = i32 or
// i64, any = every dtype; a name ending in "..." is one or more values (docs/program-format.md).
// Ops named on the command line are shown in that order; an unknown name is an error pointing to
// `sluice ops`. --format json prints one JSON array of objects with the same facts (name, kind,
// inputs, attrs, outputs, doc, single_kernel, differentiable, recomputable).
//
// Example:
//   sluice ops
//   sluice ops matmul linear --format json
#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "sluice/cli/commands.h"
#include "sluice/core/error.h"
#include "sluice/ir/op_registry.h"

namespace sluice::cli {

namespace {

struct OpsArgs {
  std::vector<std::string> ops;
  std::string format = "text";
};

std::string FormatParams(const std::vector<OpParam>& params) {
  std::vector<std::string> parts;
  for (const OpParam& p : params) parts.push_back(fmt::format("{}: {}", p.name, p.type));
  return fmt::format("{}", fmt::join(parts, ", "));
}

// "name(inputs) {attrs} -> outputs", the attributes and the arrow only when there are any.
std::string FormatSignature(const OpDef& op) {
  std::string s = fmt::format("{}({})", op.name, FormatParams(op.signature.inputs));
  if (!op.signature.attrs.empty()) s += fmt::format(" {{{}}}", FormatParams(op.signature.attrs));
  if (!op.signature.outputs.empty()) s += " -> " + FormatParams(op.signature.outputs);
  return s;
}

// "compute; reference and fast kernels; VJP; recomputable".
std::string FormatTraits(const OpDef& op) {
  std::vector<std::string> traits = {
      op.kind == OpKind::kInPlace ? "in place: updates its inputs, no outputs"
                                  : std::string(Name(op.kind)),
      op.kernel == op.reference ? "one kernel" : "reference and fast kernels",
      op.vjp != nullptr ? "VJP" : "no VJP"};
  if (op.recomputable) traits.push_back("recomputable");
  return fmt::format("{}", fmt::join(traits, "; "));
}

nlohmann::ordered_json ParamsJson(const std::vector<OpParam>& params) {
  nlohmann::ordered_json list = nlohmann::ordered_json::array();
  for (const OpParam& p : params) list.push_back({{"name", p.name}, {"type", p.type}});
  return list;
}

nlohmann::ordered_json OpJson(const OpDef& op) {
  return {{"name", op.name},
          {"kind", Name(op.kind)},
          {"inputs", ParamsJson(op.signature.inputs)},
          {"attrs", ParamsJson(op.signature.attrs)},
          {"outputs", ParamsJson(op.signature.outputs)},
          {"doc", op.doc},
          {"single_kernel", op.kernel == op.reference},
          {"differentiable", op.vjp != nullptr},
          {"recomputable", op.recomputable}};
}

// The ops named on the command line, in that order; every op when none is named.
std::vector<const OpDef*> Selected(const std::vector<std::string>& names) {
  const OpRegistry& registry = OpRegistry::Global();
  if (names.empty()) return registry.All();
  std::vector<const OpDef*> ops;
  for (const std::string& name : names) {
    const OpDef* op = registry.Find(name);
    if (op == nullptr) {
      throw InvalidArgument(fmt::format("unknown op '{}': `sluice ops` lists the {} ops", name,
                                        registry.All().size()));
    }
    ops.push_back(op);
  }
  return ops;
}

int RunOps(const OpsArgs& args) {
  const std::vector<const OpDef*> ops = Selected(args.ops);
  if (args.format == "json") {
    nlohmann::ordered_json list = nlohmann::ordered_json::array();
    for (const OpDef* op : ops) list.push_back(OpJson(*op));
    PrintToStdout("{}\n", list.dump());
    return 0;
  }
  for (const OpDef* op : ops) {
    PrintToStdout("{}\n  {}\n  {}\n\n", FormatSignature(*op), op->doc, FormatTraits(*op));
  }
  return 0;
}

}  // namespace

CommandRunner SetupOpsCommand(CLI::App& sub) {
  auto args = std::make_shared<OpsArgs>();
  sub.add_option("ops", args->ops, "Ops to show (default: every op, by name)");
  sub.add_option("--format", args->format, "text (signature, doc, traits) or json (an array)")
      ->check(CLI::IsMember({"text", "json"}))
      ->capture_default_str();
  return [args] { return RunOps(*args); };
}

}  // namespace sluice::cli
