// Builder functions for every built-in op, grouped by family. Include this to write models.
// Shapes use the glossary (docs/glossary.md): B batch, T sequence, C channels, H heads, vocab the
// vocabulary size.
#pragma once

#include "sluice/ir/ops/attention.h"
#include "sluice/ir/ops/batch_norm.h"
#include "sluice/ir/ops/conv.h"
#include "sluice/ir/ops/dropout.h"
#include "sluice/ir/ops/elementwise.h"
#include "sluice/ir/ops/linalg.h"
#include "sluice/ir/ops/nn.h"
#include "sluice/ir/ops/optimizer.h"
#include "sluice/ir/ops/reduction.h"
#include "sluice/ir/ops/select.h"
#include "sluice/ir/ops/shape.h"
