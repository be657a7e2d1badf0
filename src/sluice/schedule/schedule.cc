#include "sluice/schedule/schedule.h"

#include <fmt/format.h>

namespace sluice::pipeline {

std::string_view ActionKindName(ActionKind kind) { return EnumName(kActionKindNames, kind); }

std::string ActionName(const Action& action, int chunks) {
  if (action.kind == ActionKind::kOptimizer) return "OPT";
  std::string name(ActionKindName(action.kind));
  if (chunks > 1 || action.chunk != 0) name += fmt::format("{}.", action.chunk);
  name += fmt::format("{}", action.micro_batch);
  if (action.peer >= 0 && IsSend(action.kind)) name += fmt::format(">{}", action.peer);
  if (action.peer >= 0 && IsRecv(action.kind)) name += fmt::format("<{}", action.peer);
  return name;
}

std::string Schedule::Describe() const {
  if (chunks > 1) return fmt::format("{} (P={}, M={}, V={})", name, stages, micro_batches, chunks);
  return fmt::format("{} (P={}, M={})", name, stages, micro_batches);
}

}  // namespace sluice::pipeline
