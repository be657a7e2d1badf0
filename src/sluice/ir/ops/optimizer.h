// Optimizer update ops: they update parameters and optimizer state in place and have no outputs.
#pragma once

#include "sluice/ir/builder.h"

namespace sluice {}  // namespace sluice
