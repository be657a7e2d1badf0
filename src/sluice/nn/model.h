// Models as programs: a model is a forward program plus the description of its parameters.
//
// Model builders (gpt.h, mlp.h) write the forward program with the Builder and declare each
// parameter through ModelBuilder::Param, which records how to initialize it. The forward program
// reads `ids`/`targets` (or `x`/`labels`) and outputs the scalar `loss`; an eval variant outputs
// `logits` instead.
//
// Initialization is seeded and reproducible: parameter i draws from a generator seeded by
// MixSeed(seed, kInitStream, i), so it does not depend on the order other parameters are drawn.
// A piece of a model (a pipeline stage, nn/gpt.h BuildGptSlice) sets ParamSpec::init_index to the
// parameter's position in the whole model, so the stage's tensors are bitwise the whole model's.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "sluice/core/allocator.h"
#include "sluice/core/tensor.h"
#include "sluice/ir/builder.h"
#include "sluice/ir/program.h"

namespace sluice {

// How a parameter is initialized: normal(mean, std), zeros, ones, uniform(low, high), or loaded
// (its value comes from --init-from; InitParams leaves it zero).
enum class Init { kNormal, kZeros, kOnes, kUniform, kLoaded };

struct ParamSpec {
  std::string name;
  Shape shape;
  Init init = Init::kNormal;
  double std = 0.02;  // for kNormal
  // The index its generator is seeded with; -1: its position in the list given to InitParams.
  int64_t init_index = -1;
  double mean = 0.0;             // for kNormal
  double low = 0.0, high = 0.0;  // for kUniform
  // A program constant (Program::IsConstant, `const` in text): bound and checkpointed like a
  // parameter, but never differentiated, given optimizer state or updated.
  bool constant = false;
  // A buffer (Program::IsBuffer, `buffer` in text): a constant that the forward's running
  // statistics update in place (batch_norm_update_stats).
  bool buffer = false;
};

struct Model {
  Program forward;                // outputs "loss" (training) or "logits" (eval)
  std::vector<ParamSpec> params;  // in declaration order
  std::string loss = "loss";
  // What recompute policies (step/stage_program.h) need to know of the model's structure:
  //   block_inputs      the value each block starts from ("full" keeps only these and recomputes
  //                     the rest of the block in backward: activation checkpointing)
  //   attention_values  the attention scores and probabilities [B, H, T, T] ("selective" never
  //                     keeps these: they grow with T², everything else with T)
  // Empty for models without blocks or attention (full then keeps only the program's inputs).
  std::vector<std::string> block_inputs;
  std::vector<std::string> attention_values;
};

// A contiguous run of a model's units [first, end), counted in the model's unit order: what one
// pipeline (virtual) stage runs.
struct UnitRange {
  int64_t first = 0;
  int64_t end = 0;

  bool operator==(const UnitRange&) const = default;
};

// A model's units in order — the pieces pipeline layouts and partitions cut it at (embed, h.0 …
// h.L−1, head for the GPT; a program's `unit` blocks) — and each one's estimated forward FLOPs.
struct ModelUnits {
  std::vector<std::string> names;
  std::vector<double> costs;
  // The option that sets the number of repeated units, for messages: "--layers" for the built-in
  // GPT (whose units are embed, h.i, head); empty for a program, whose file says it.
  std::string count_option;
  // cuttable[u]: whether a pipeline stage may start at unit u (one value crosses there, nn/
  // training_program.h SliceTrainingModel); empty: at every unit.
  std::vector<bool> cuttable;

  bool CanCut(int64_t u) const { return cuttable.empty() || cuttable.at(static_cast<size_t>(u)); }
};

// Wraps a Builder and records parameter specs as they are declared.
class ModelBuilder {
 public:
  explicit ModelBuilder(std::string program_name) : b_(std::move(program_name)) {}
  Builder& b() { return b_; }
  // Declares parameter prefix+name (f32) and records its initialization.
  Var Param(std::string_view name, const Shape& shape, Init init, double std = 0.02);
  // Parameters declared from now on get ParamSpec::init_index = index, index + 1, … (a builder
  // of part of a model skips the indices of the parameters it leaves out). Until called, specs
  // keep init_index -1.
  void SetNextInitIndex(int64_t index) { next_init_index_ = index; }
  // Recompute hints (Model::block_inputs, Model::attention_values), by value name.
  void MarkBlockInput(std::string name) { block_inputs_.push_back(std::move(name)); }
  void MarkAttentionValue(std::string name) { attention_values_.push_back(std::move(name)); }
  Model Finish(std::string loss = "loss");

 private:
  Builder b_;
  std::vector<ParamSpec> params_;
  std::vector<std::string> block_inputs_, attention_values_;
  int64_t next_init_index_ = -1;  // -1: not numbering
};

// Fresh f32 tensors for every parameter, initialized as the specs say.
std::map<std::string, Tensor> InitParams(const std::vector<ParamSpec>& specs, uint64_t seed,
                                         Allocator& allocator = DefaultAllocator());

// Total number of trained parameter elements (constants not counted).
int64_t CountParams(const std::vector<ParamSpec>& specs);

}  // namespace sluice
