// Layers: small program builders that declare their parameters and emit their ops.
// Parameter names are prefixed by the enclosing Builder::NameScope ("h.0.attn." + "c_attn.weight").
#pragma once

#include "sluice/nn/model.h"

namespace sluice {

// y = x·W + b with W [in, out] (std `std`, default 0.02) and b [out] (zeros). x [..., in] → [...,
// out].
Var LinearLayer(ModelBuilder& m, std::string_view name, Var x, int64_t in, int64_t out,
                double std = 0.02);

// Layer norm over the last axis with weight (ones) and bias (zeros) of size C, eps 1e-5.
Var LayerNormLayer(ModelBuilder& m, std::string_view name, Var x, int64_t C);

}  // namespace sluice
