// Shape ops. Every program value is contiguous, so reshape is a view (no copy).
#pragma once

#include <vector>

#include "sluice/ir/builder.h"

namespace sluice {

// Same elements, new shape (one dimension may be -1). A view of x's storage.
Var Reshape(Var x, const std::vector<int64_t>& dims);
// Swaps axes dim0 and dim1 (negative counts from the end). Copies (values stay contiguous).
// Op "transpose", attributes dim0, dim1.
Var Transpose(Var x, int64_t dim0, int64_t dim1);

}  // namespace sluice
