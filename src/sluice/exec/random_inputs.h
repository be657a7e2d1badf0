// Random bindings for a program's inputs and parameters, reproducible from a seed — what
// `sluice run` uses when no --inputs file is given, and what tests and benchmarks feed programs.
//
// Floating values are uniform in [-1, 1). Integer values (token ids, targets) must index
// something, and the op that reads them is not known here, so the rule is attribute-free:
//   an integer value v is drawn uniformly from [0, IntegerInputBound(program, v)), where the bound
//   is the smallest dimension of any floating input of any instruction reading v (following views
//   of v), so the index is in range whichever axis the op indexes; 2 when no reader has a floating
//   input. For embedding(ids, table [vocab, C]) that is min(vocab, C) ≤ vocab; for
//   cross_entropy(logits [B, T, vocab], targets) min(B, T, vocab) ≤ vocab. Pass real data
//   (--inputs) when the range matters.
//
// Values are drawn in declaration order (inputs, then parameters) from one std::mt19937_64 seeded
// with `seed`, so the same program and seed give the same tensors on every machine.
// Thread-safety: reentrant. Failure modes: OutOfMemory from the allocator; ShapeError for dtypes
// that cannot hold numbers (bf16, f16 have no arithmetic in sluice).
//
// Example:
//   Scope scope;
//   BindRandomInputs(program, /*seed=*/0, scope);   // every input and param not yet bound
#pragma once

#include <cstdint>

#include "sluice/core/allocator.h"
#include "sluice/exec/scope.h"
#include "sluice/ir/program.h"

namespace sluice {

// The exclusive upper bound for random values of integer value v (see above); at least 1.
int64_t IntegerInputBound(const Program& program, ValueId v);

// Binds a random tensor to every input and parameter of `program` that `scope` does not hold yet.
void BindRandomInputs(const Program& program, uint64_t seed, Scope& scope,
                      Allocator& allocator = DefaultAllocator());

}  // namespace sluice
