#include "sluice/step/step_engine.h"

#include "sluice/core/error.h"
#include "sluice/io/checkpoint.h"

namespace sluice {

std::map<std::string, Tensor> StepEngine::GatherParams(Allocator&) { return State(); }

std::optional<std::string> StepEngine::TrySaveCheckpoint(
    const std::string& path, const std::map<std::string, std::string>& metadata) {
  try {
    SaveCheckpointAtomic(path, State(), metadata);
  } catch (const IoError& e) {
    return e.what();
  }
  return std::nullopt;
}

void StepEngine::SaveCheckpoint(const std::string& path,
                                const std::map<std::string, std::string>& metadata) {
  if (std::optional<std::string> failure = TrySaveCheckpoint(path, metadata))
    throw IoError(*failure);
}

}  // namespace sluice
