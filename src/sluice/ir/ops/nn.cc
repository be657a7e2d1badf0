// Neural-network ops: registration, inference and VJP rules. Kernels: kernels/.
#include "sluice/ir/ops/nn.h"

#include "sluice/ir/ops.h"
#include "sluice/ir/ops/common.h"

namespace sluice {

void RegisterNnOps(OpRegistry& r) { (void)r; }

}  // namespace sluice
