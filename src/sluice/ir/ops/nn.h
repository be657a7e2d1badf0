// Neural-network ops: softmax, masking, normalization, embeddings, losses.
#pragma once

#include "sluice/ir/builder.h"

namespace sluice {}  // namespace sluice
