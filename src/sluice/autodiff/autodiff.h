// Reverse-mode automatic differentiation over programs.
//
// BuildBackward takes a forward program and produces a separate backward program that computes
// gradients. The two programs meet in a Scope: the backward program declares as inputs exactly the
// forward values it reads (the *saved* values, same names), declares the forward parameters it
// reads as parameters, and outputs the gradients.
//
// Gradient naming (stable, so optimizers and pipeline stages can find gradients by name):
//   * the gradient of a value %v is named %v.grad — always for the values differentiated with
//     respect to (the backward program's outputs), and for every intermediate gradient that is
//     computed by an instruction of its own;
//   * a seed gradient fed in by the caller (the gradient of a pipeline stage's output) is the
//     backward input %v.grad;
//   * partial contributions to a value used more than once keep generated names (add_3, ...) and
//     are summed, in the order the uses appear in reverse, into %v.grad.
//
// Recomputation (GradientSpec::recompute, on by default) trades a cheap op for a saved tensor:
// layer_norm(x) feeding a linear is recomputed from x, which layer_norm's own gradient reads
// anyway, so a GPT block keeps its normalized activations and its GELU output out of the saved set.
// A parameter's `cast` (its bf16 copy under mixed precision) is remade in backward under every
// policy, recompute off included: the parameter is always at hand and the pass is cheap. The
// copy's gradient (f32, the product's own result) passes through the cast and is the parameter's
// %w.grad itself, never copied.
//
// One fusion: gelu_grad(dy, x) whose dy is the result of a matmul that nothing else reads (a GPT
// MLP's c_proj input gradient) becomes one matmul_gelu_grad (ir/ops/linalg.h), so the [B, T, 4C]
// product is written once, into the gradient, and never lives beside it (bitwise the same result;
// under mixed precision too: bf16 operands and GELU input, an f32 gradient).
//
// The fusion sees through reshapes between the two (an imported linear's [B·T, 4C] product viewed
// as [B, T, 4C] before the GELU): the fused op then reads x viewed in the product's shape.
//
// bf16 where it is made: under mixed precision a bf16 product's VJP rounds its output gradient to
// bf16 (ir/ops/linalg.cc). A gradient made f32 by swiglu_grad or cross_entropy_grad whose one
// reader, as it is or through views nothing else reads, is that rounding cast is made bf16 by its
// op instead ({dtype = "bf16"}: rounded as it is stored, bitwise the cast's result) and the cast
// goes: a Llama MLP's da and db and an unfused head's logits gradient never live in f32.
//
// Work no gradient needs is never emitted: VJP rules are only asked for inputs that depend on a
// value being differentiated, and a final pass removes instructions whose results reach no output.
//
// Example:
//   GradientSpec spec{.loss = "loss", .wrt = {"w1", "w2"}};
//   Backward bwd = BuildBackward(forward, spec);
//   // run forward keeping bwd.saved, then run bwd.program; scope now holds "w1.grad", "w2.grad".
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "sluice/ir/program.h"

namespace sluice {

struct GradientSpec {
  // A scalar value whose gradient is seeded with 1 inside the backward program (may be empty).
  std::string loss;
  // Values whose gradients are given by the caller as backward inputs named "<v>.grad".
  std::vector<std::string> seeds;
  // Values to differentiate with respect to: parameters and/or inputs of the forward program.
  std::vector<std::string> wrt;
  // Recompute instead of save: a saved value produced by a recomputable op (OpDef::recomputable:
  // layer_norm, gelu, relu, ...) whose inputs the backward program reads anyway is recomputed
  // there, right before its first use, and no longer kept alive from the forward pass. Results are
  // bitwise the same (kernels are deterministic); the forward keeps fewer bytes.
  bool recompute = true;
  // Activation checkpointing, beyond the cheap ops above. Saved values in `recompute_values`, and,
  // when `checkpoints` is set, every saved value that is neither in it nor a forward input, are
  // not kept either: the backward program re-runs the forward instructions that produce them,
  // right before their first use — and, transitively, those producing any input it does not have
  // (parameters and forward inputs are always at hand). Gradients stay bitwise the same.
  std::vector<std::string> recompute_values;
  std::optional<std::vector<std::string>> checkpoints;
  // Finer recompute units (with `checkpoints`): each names the one value that crosses a cut inside
  // a unit (a transformer block's residual stream between its attention and its MLP), cutting the
  // forward into parts at each cut value's instruction (the value starts the later part). A
  // recomputation for a value of one part re-runs what it needs of an earlier part as transient
  // copies, under fresh names, which die as soon as that part's last value needed is made; the
  // earlier part's own values are recomputed again, right before its backward first reads them.
  // So the backward holds one part's recomputed forward at a time, never the whole unit's, and
  // keeps nothing more than `checkpoints` from the forward (the cut values are not kept); the
  // earlier parts' forward runs twice. Gradients stay bitwise the same.
  std::vector<std::string> recompute_cuts;
  // bf16 values whose gradient is bf16 (mixed precision's unit boundaries: what a pipeline cut
  // sends, BoundaryGradients in nn/training_program.h). Their gradient's parts are summed in f32
  // as any value's, then rounded to bf16 once: that is the gradient a seed among them comes in as
  // and a wrt among them goes out as, so a pipeline's gradient messages are bf16 and one stage
  // rounds where a cut would. The gradient handed on to the value's producer is the rounded one
  // widened back to f32 (GradientType), widened again right before each of its readers
  // (WidenAtEachReader) so that between them only the bf16 copy is alive. Throws ProgramError
  // naming a value that does not exist or is not bf16.
  std::vector<std::string> bf16_gradients;
};

struct Backward {
  Program program;
  // Forward values the backward program reads as inputs (saved activations and forward inputs).
  std::vector<std::string> saved;
  // Forward parameters the backward program reads.
  std::vector<std::string> params_read;
  // Gradient value names, in the order of GradientSpec::wrt: "<wrt>.grad".
  std::vector<std::string> grads;
};

// Throws ProgramError when a wrt or seed value does not exist, the loss is not a scalar, or a
// needed op has no VJP rule (naming the op and the value).
Backward BuildBackward(const Program& forward, const GradientSpec& spec);

// The zero-bubble split of a backward program.
//   B computes the gradients of `b_wrt` (typically a stage's inputs: the critical path);
//   W computes the remaining gradients (typically the parameters'), reading only forward saved
//   values and the values B leaves for it (`b_to_w`, outputs of B, inputs of W).
// Running B then W gives bitwise the same gradients as the unsplit backward program: the
// instructions are the same, only partitioned.
struct SplitBackward {
  Program b;
  Program w;
  std::vector<std::string> b_to_w;
  std::vector<std::string> w_saved;  // forward values W reads
};

SplitBackward SplitBW(const Backward& backward, const std::vector<std::string>& b_wrt);

// The same program adding the gradients `grads` (outputs it computes) into buffers instead of
// giving them out: each becomes an input of its own name, the buffer, which the program updates in
// place; the gradients are no longer outputs. Used for every micro-batch after the first, so that
// no micro-batch's weight gradient lives beside the accumulated one (step/stage_program.h).
//   * A gradient made by a 2-D matmul that nothing else reads, over an inner dimension k at most
//     `one_block_k`, becomes matmul_accumulate(buffer, a, b): one GEMM with beta = 1, no product
//     tensor (pass kernels::GemmOneBlockK(), the k up to which that is bitwise buffer + product).
//   * Any other (a bias's sum, a layer norm's parameters, an embedding's scatter, a longer k) is
//     computed as before, as "<grad>.part", and added in right after: accumulate(buffer, part).
// Either way each element is buffer + (the gradient as the program computes it): bitwise what
// adding the program's outputs into the buffers afterwards gives. Throws ProgramError naming a
// gradient that is not an output the program computes.
Program AccumulateGradients(const Program& program, const std::vector<std::string>& grads,
                            int64_t one_block_k);

// The parameters (not constants) of `forward` that the value `loss` does not depend on: no
// instruction on the loss's path reads them (a head forward never uses, a branch whose result
// nothing reads), so their gradient is zero by structure. In declaration order. PyTorch leaves
// such a parameter's `.grad` None and its optimizers skip it (no weight decay, no state, no step);
// training does the same with these (nn/training_program.h). Throws ProgramError when `loss` is
// no value of `forward`.
std::vector<std::string> ParamsOffLossPath(const Program& forward, const std::string& loss);

// A copy of `program` without the instructions whose outputs reach no program output (in-place ops
// always stay) and without inputs and params that nothing reads.
Program PruneDeadCode(const Program& program);

}  // namespace sluice
