// Verifier: checks that a program is well formed before anything analyses or runs it.
//
// Checks: every value is defined exactly once (as input, param or the output of one instruction)
// and before its first use; each instruction's op is registered, has the right number of inputs,
// and the types of its outputs equal what the op's inference gives; program outputs are defined.
// In-place updates (OpKind::kInPlace, OpDef::updates): an input the op writes shares its storage
// with no other input of the instruction (`sgd_update(%w, %w, %w, %lr)`, or a view of %w), and a
// view (kView: it shares its input's storage) taken before an update of its storage is not read
// after it, nor output — it would show the updated values. The value updated, and views taken after
// the update, read the new values (docs/program-format.md, "In-place updates"). Throws VerifyError
// naming the program, the instruction (index, op, first output) and the value.
#pragma once

#include <cstdint>
#include <string>

#include "sluice/core/error.h"
#include "sluice/ir/program.h"

namespace sluice {

// What Verify throws: a ProgramError that also says, for whoever knows where the program came
// from (the text parser points at file:line:col), which instruction it concerns — its index in
// Program::instructions(), -1 when none — and, for an output statement, which value (kNoValue
// when none).
class VerifyError : public ProgramError {
 public:
  VerifyError(int64_t instruction, const std::string& message, ValueId output = kNoValue)
      : ProgramError(message), instruction_(instruction), output_(output) {}
  int64_t instruction() const { return instruction_; }
  ValueId output() const { return output_; }

 private:
  int64_t instruction_;
  ValueId output_;
};

void Verify(const Program& program);

// Verify, skipped when `program` has passed it here before and nothing changed it since
// (Program::verified()); marks it verified when it passes. For the stages that each verify the
// program they are given (the parser, Builder::Build, Executable): a program checks once.
void VerifyOnce(Program& program);

}  // namespace sluice
