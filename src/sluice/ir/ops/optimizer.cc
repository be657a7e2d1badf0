// Optimizer update ops (in place): registration and inference. Kernels: kernels/.
#include "sluice/ir/ops/optimizer.h"

#include "sluice/ir/ops.h"
#include "sluice/ir/ops/common.h"

namespace sluice {

void RegisterOptimizerOps(OpRegistry& r) { (void)r; }

}  // namespace sluice
