// RunReference: the simplest correct way to run a program — instructions in program order, every
// intermediate kept until the end, no analysis, no threads. It is the oracle the interpreter and
// the op tests compare against; it is not meant to be fast or frugal.
//
// Reads every program input and parameter from `scope` (ProgramError naming the value when one is
// missing or has the wrong dtype or shape) and leaves every program output in `scope`, plus the
// values named in `keep` (e.g. the activations a backward program reads).
// With use_reference_kernels the ops' plain reference kernels run instead of the fast ones.
#pragma once

#include <string>
#include <vector>

#include "sluice/core/allocator.h"
#include "sluice/exec/scope.h"
#include "sluice/ir/program.h"

namespace sluice {

void RunReference(const Program& program, Scope& scope, Allocator& allocator = DefaultAllocator(),
                  bool use_reference_kernels = false, const std::vector<std::string>& keep = {});

// Throws ProgramError unless `t` matches value `v` of `program` in dtype and shape.
void CheckBinding(const Program& program, ValueId v, const Tensor& t);

}  // namespace sluice
