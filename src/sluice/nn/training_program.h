// Training programs: a model written as program text, so that `sluice train --program FILE` trains
// a user's own model with everything the built-in ones have (docs/program-format.md, "Training
// programs"). The text says what training needs besides the computation:
//
//   program classifier {
//     input %x: f32[B, 16]                      # B: the micro-batch, bound at training time
//     input %y: i64[B] = labels                 # binds the data's array "labels"
//     param %fc.weight: f32[16, 10] = normal(0, 0.02)
//     param %fc.bias: f32[10] = zeros
//     unit fc {
//       %logits: f32[B, 10] = linear(%x, %fc.weight, %fc.bias)
//       %loss: f32[] = cross_entropy(%logits, %y)
//     }
//     output %loss
//   }
//
// A Model made from such a text is like a built-in one: parameter i (in declaration order) draws
// from MixSeed(seed, 100, i), so --seed fixes every weight; a parameter used by several
// instructions (tied weights) gets the sum of their gradients from autodiff; each unit's inputs
// are the values a full recompute keeps, and values [..., T, T] those a selective one never keeps.
//
// Failures: ParseError at file:line:col for bad text (ir/text_format.h), InvalidArgument naming the
// file for a program training cannot use (no scalar float loss output, a parameter without an
// initializer, a parameter that is not f32).
//
// Thread-safety: reentrant.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/ir/text_format.h"
#include "sluice/nn/model.h"

namespace sluice {

struct TrainingProgram {
  Model model;  // forward program with its loss, ParamSpecs with initializers, recompute hints
  // Every input → the data array it binds: the name written after '=', else its own name.
  std::map<std::string, std::string> data;
  ProgramAnnotations annotations;  // as parsed: initializers, data arrays, positions, sizes used
  // Parameters the loss does not depend on (autodiff/autodiff.h ParamsOffLossPath), in declaration
  // order. Their ParamSpecs are marked constant: like a PyTorch parameter whose .grad stays None,
  // they get no gradient, optimizer state, update or share of the gradient norm, and are still
  // bound from --init-from and written to checkpoints.
  std::vector<std::string> unused_params;
};

// Parses `text` (labelled `file` in errors) with its sizes bound to `sizes` and describes it as a
// Model. The loss is the output named "loss", or else the program's only output; it must be a
// float scalar.
// `check_input` sees each input as it is declared (ir/text_format.h InputCheck). With
// `loaded_by_default` (a run given --init-from), a parameter written without an initializer is
// `loaded`: the file must hold it.
TrainingProgram ParseTrainingProgram(std::string_view text, std::string_view file,
                                     const SizeBindings& sizes, const InputCheck& check_input = {},
                                     bool loaded_by_default = false);

// The text of `model` as a training program: each parameter with its initializer, each input with
// the data array `data` names for it (none where that is the input's own name), units as built.
std::string PrintTrainingProgram(const Model& model,
                                 const std::map<std::string, std::string>& data);

// A model that can be built at any batch B and sequence length T, written as a training program
// whose sizes are the names B and T (`f32[B, T, 128]`, `shape = [B*T, 384]`): `build` is called at
// two pairs of sizes that no constant of a model takes, and the integers that differ become
// products of B and T (ir/text_format.h GeneraliseSizes). A model without sequences ignores T.
std::string ExportTrainingProgram(const std::function<Model(int64_t B, int64_t T)>& build,
                                  const std::map<std::string, std::string>& data);

// `model` in mixed precision (ir/autocast.h AutocastBf16 on its forward program): what `--precision
// bf16` trains a `--program` as. Parameters, loss and names are kept; the values a full recompute
// keeps are the new program's unit inputs (the bf16 copies crossing unit boundaries), and the bf16
// copies of attention values are attention values too. `ops` (when given) receives which ops run
// bf16 and which f32, the fallback. Throws InvalidArgument when the forward program already has a
// bf16 value (it sets its own precision), naming it.
struct AutocastOps {
  std::vector<std::string> bf16;  // ops that run with bf16 operands (AutocastResult::bf16_ops)
  std::vector<std::string> f32;   // ops that run f32: the fallback (AutocastResult::f32_ops)
};
Model AutocastTrainingModel(const Model& model, AutocastOps* ops = nullptr);

// The piece of a training model made of its units [range.first, range.end) (Program::units();
// instructions written between two units run with the unit before them, those before the first
// unit with the first): one pipeline stage.
// Interface, as the GPT's slices (nn/gpt.h):
//   input "x"   the one value the units before the piece pass to it (absent when first == 0);
//   the whole model's data inputs and parameters that the piece reads, under their own names, each
//   ParamSpec with init_index = its position in the whole model (so its tensors are bitwise the
//   whole model's);
//   output "y"  the one value the piece passes on (when end < units), else the whole model's loss
//               (its only output when it has no loss: a model giving logits).
// Throws InvalidArgument naming the units when the model cannot be cut there: more (or fewer)
// than one value crossing a cut (name them), the loss computed before the last piece.
Model SliceTrainingModel(const Model& whole, const UnitRange& range);

// Each unit's forward FLOPs, estimated from its instructions' shapes: 2·M·N·K for a product
// (matmul, linear), 4·B·H·T²·D for causal attention, one per output element for the rest.
std::vector<double> EstimateUnitCosts(const Program& program);

// The program's unit names with their EstimateUnitCosts.
ModelUnits UnitsOf(const Program& program);

// The values of `program` whose last two axes are both the sequence length T ([B, H, T, T]:
// attention scores and probabilities, which grow with T²): what `--recompute selective` never
// keeps (Model::attention_values). Empty when T is 1.
std::vector<std::string> SquareInSequence(const Program& program, int64_t T);

// The values a full recompute keeps for `program`: the values each unit reads that an instruction
// before the unit computed (the residual stream of a transformer, one per block).
std::vector<std::string> UnitInputs(const Program& program);

// Where each unit splits into two sub-layers for `--recompute sublayer`
// (GradientSpec::recompute_cuts): per unit, the one value crossing a point inside it — a point
// where no other value computed before it is read at or after it (as a pipeline cut between units
// passes one value) — choosing, when several points qualify, the one that divides the bytes the
// unit's instructions make most evenly. A transformer block's residual stream between its
// attention and its MLP (`attn_out`) is the only such value of a GPT block. Units without such a
// point are not split; empty without units.
std::vector<std::string> SublayerInputs(const Program& program);

// The unit instruction `instruction` of `program` runs with: the last unit that begins at or before
// it (instructions between two units run with the one before them, as SliceTrainingModel cuts),
// the first unit for those before it; -1 when the program has no units.
int64_t UnitOfInstruction(const Program& program, int32_t instruction);

// A parameter read by more than one unit (a tied weight: the token embedding that is also the
// output head, a block's weight shared by several blocks), with the units reading it in order.
struct TiedParam {
  std::string name;
  std::vector<std::string> units;
};

// The parameters (not constants) of `program` that more than one of its units reads
// (UnitOfInstruction), in the program's parameter order. Empty for a program without units.
std::vector<TiedParam> TiedParams(const Program& program);

// The name of unit `unit`'s read of tied parameter `param`: "<param>@<unit>".
std::string TiedReadName(std::string_view param, std::string_view unit);

// `program` with every read of each parameter of `tied` replaced by a read of a parameter of its
// own per unit, TiedReadName(param, unit), of the parameter's type — so that autodiff gives each
// unit's share of the gradient apart ("<param>@<unit>.grad"), which training sums in unit order
// on one stage and across pipeline stages alike (step/stage_program.h). Everything else (inputs,
// other parameters, instructions, units, outputs) is kept as it is. Throws InvalidArgument when a
// name TiedReadName makes is already taken, or a tied parameter is an output.
Program SeparateTiedReads(const Program& program, const std::vector<TiedParam>& tied);

}  // namespace sluice
