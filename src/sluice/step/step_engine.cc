#include "sluice/step/step_engine.h"

#include "sluice/io/checkpoint.h"

namespace sluice {

std::map<std::string, Tensor> StepEngine::GatherParams(Allocator&) { return State(); }

void StepEngine::SaveCheckpoint(const std::string& path,
                                const std::map<std::string, std::string>& metadata) {
  SaveCheckpointAtomic(path, State(), metadata);
}

}  // namespace sluice
