// Program: a static, SSA-form computation — the unit sluice analyses, differentiates and runs.
//
// A program has values (each with a unique name, dtype and shape, defined exactly once) and an
// ordered list of instructions (op, attributes, input values, output values). Values are defined
// by being declared as a program input, a parameter, or an instruction output. Outputs are the
// values the program hands back to its caller.
//   * inputs     data bound by the caller for each run (token ids, targets, the gradient of a
//                stage's output, values saved by another program such as forward activations).
//   * params     long-lived state bound by the caller (weights, optimizer moments); never freed.
//                A param may be a *constant* (AddConst, `const` in text): a tensor the program
//                reads but never trains or updates (a rotary table, a mask of an imported
//                module). Training gives it no gradient and no optimizer state, checkpoints keep
//                it, autodiff refuses to differentiate with respect to it and the verifier refuses
//                an in-place op that updates it. A constant may be a *buffer* (AddBuffer,
//                `buffer` in text): running statistics (batch norm's running mean and variance),
//                which the ops that keep them (OpDef::updates_buffers) update in place and no
//                other op writes; a constant in every other respect.
//   * outputs    values left in the scope after the run (loss, gradients, saved activations).
//
// Values are addressed by ValueId (an index into values()). A value's type is interned: the
// program keeps each distinct TensorType once (types()) and a value holds its index, so that
// type(v) is the TensorType of value v. Programs are built with Builder (ir/builder.h) or parsed
// from text (ir/text_format.h); both go through AddInput/AddParam/ AddInstruction, which run shape
// inference and reject duplicates immediately.
//
// Cost: a program of a million instructions is an ordinary input (a deep model's backward, an
// optimizer step over every parameter), so every operation here is O(1) amortized per value or
// instruction (AddOutput included), a value's name is stored once (the name index holds value ids,
// not copies of the names) and its type once per distinct type; an instruction keeps short operand
// lists inline (ir/value_list.h) and shares its attributes with every instruction that has the same
// ones (ir/attrs.h). A value costs about 50 bytes, an instruction about 80 (docs/benchmarks.md,
// "Setup").
//
// Example:
//   Program p("affine");
//   ValueId x = p.AddInput("x", {DType::kF32, Shape{8, 16}});
//   ValueId w = p.AddParam("w", {DType::kF32, Shape{16, 4}});
//   ValueId y = p.AddInstruction("matmul", {x, w}, {}, {"y"})[0];
//   p.AddOutput(y);
#pragma once

#include <cstdint>
#include <deque>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "sluice/ir/attrs.h"
#include "sluice/ir/op_registry.h"
#include "sluice/ir/value_list.h"

namespace sluice {

// Index of a type in Program::types().
using TypeId = uint32_t;

enum class ValueKind : uint8_t { kInput, kParam, kIntermediate };

struct Value {
  std::string name;
  TypeId type_id = 0;  // Program::type(id) is the TensorType
  ValueKind kind = ValueKind::kIntermediate;
  int32_t producer = -1;  // index of the defining instruction; -1 for inputs and params
};

struct Instruction {
  const OpDef* op = nullptr;
  Attrs attrs;
  ValueList inputs;
  ValueList outputs;
};

// A unit: a named, contiguous range of instructions [begin, end) — an embedding, a block, a head.
// Pipeline layouts, balanced partitions and recompute policies cut and keep programs by units
// (docs/program-format.md, "Units"). Units never overlap and follow program order.
struct ProgramUnit {
  std::string name;
  int32_t begin = 0;  // first instruction
  int32_t end = 0;    // one past the last

  bool operator==(const ProgramUnit&) const = default;
};

class Program {
 public:
  explicit Program(std::string name = "main") : name_(std::move(name)) {}

  const std::string& name() const { return name_; }
  const std::vector<Value>& values() const { return values_; }
  const Value& value(ValueId id) const { return values_.at(static_cast<size_t>(id)); }
  // The dtype and shape of value `id`. The reference stays valid while the program lives, also
  // across later Add* calls (types are kept in a deque and never removed).
  const TensorType& type(ValueId id) const { return types_[value(id).type_id]; }
  // Every distinct type of the program's values, each once.
  const std::deque<TensorType>& types() const { return types_; }
  // The id of `type` in types(), adding it when new.
  TypeId InternType(const TensorType& type);
  const std::vector<Instruction>& instructions() const { return instructions_; }
  const std::vector<ValueId>& inputs() const { return inputs_; }
  const std::vector<ValueId>& params() const { return params_; }
  const std::vector<ValueId>& outputs() const { return outputs_; }

  // Units in program order; empty for a program that names none.
  const std::vector<ProgramUnit>& units() const { return units_; }
  // Opens unit `name` at the next instruction; the instructions added until EndUnit belong to it.
  // Throws ProgramError when a unit is already open or the name is taken by another unit.
  void BeginUnit(std::string name);
  // Closes the open unit (throws ProgramError when none is open). A unit may be empty.
  void EndUnit();
  bool unit_open() const { return unit_open_; }

  std::optional<ValueId> Find(std::string_view name) const;
  // Throws ProgramError naming the value when absent.
  ValueId Get(std::string_view name) const;

  // Declarations. Throw ProgramError on a duplicate name.
  ValueId AddInput(std::string name, TensorType type);
  ValueId AddParam(std::string name, TensorType type);
  // A constant: a param (in params(), bound by the caller, never freed) that is never trained.
  ValueId AddConst(std::string name, TensorType type);
  // A buffer: a constant that ops keeping running statistics update in place.
  ValueId AddBuffer(std::string name, TensorType type);
  // Declares the param `v` of `source` here: its name, its type and whether it is a constant or a
  // buffer.
  ValueId AddParamLike(const Program& source, ValueId v);
  bool IsConstant(ValueId id) const {
    return static_cast<size_t>(id) < is_constant_.size() && is_constant_[static_cast<size_t>(id)];
  }
  bool IsBuffer(ValueId id) const {
    return static_cast<size_t>(id) < is_buffer_.size() && is_buffer_[static_cast<size_t>(id)];
  }
  // Appends an instruction of registered op `op`, running its shape inference; output i is named
  // output_names[i] when given, otherwise a fresh name derived from the op ("matmul_3").
  // Throws ProgramError (unknown op, wrong arity, undefined input, duplicate name) or ShapeError
  // (inference), each naming the op and the first output.
  ValueList AddInstruction(std::string_view op, ValueList inputs, Attrs attrs,
                           std::vector<std::string> output_names = {});
  // Marks a value as a program output (once; order is kept).
  void AddOutput(ValueId id);
  bool IsOutput(ValueId id) const {
    return static_cast<size_t>(id) < is_output_.size() && is_output_[static_cast<size_t>(id)];
  }

  // Renames a value (the new name must be unused).
  void Rename(ValueId id, std::string new_name);
  // A name not used yet: "hint_N" with the smallest free N counting from 0. Names reserved with
  // ReserveName are avoided too.
  std::string FreshName(std::string_view hint) const;
  // Keeps FreshName from generating `name` (used so that a backward program's temporaries never
  // collide with forward values that share a scope with them). Only names FreshName could make
  // ("hint_N") are remembered.
  void ReserveName(std::string_view name);

  // Total bytes of a value's tensor.
  size_t Bytes(ValueId id) const;

  // Whether the program passed Verify through VerifyOnce (ir/verifier.h) and nothing changed it
  // since: every Add*, AddOutput and Rename clears it; a copy or move carries it along.
  bool verified() const { return verified_; }

 private:
  friend void VerifyOnce(Program& program);

  ValueId NewValue(std::string name, TypeId type, ValueKind kind, int32_t producer);
  // The name index: open addressing (linear probing) over value ids, a power of two in size, at
  // most half full. A slot keeps the name's hash beside the id, so that a probe reads the name
  // itself only when the hashes agree.
  struct IndexSlot {
    ValueId id = kNoValue;  // kNoValue: free
    uint32_t hash = 0;
  };
  // The slot holding `name`, or the free slot ending its probe sequence.
  size_t FindSlot(std::string_view name, uint32_t hash) const;
  // Grows the index (rehashing) so that it can hold `values` names.
  void IndexReserve(size_t values);
  void IndexErase(ValueId id);
  std::string_view ReservedName(int32_t i) const;
  bool IsReserved(std::string_view name) const;

  std::string name_;
  std::vector<Value> values_;
  std::vector<Instruction> instructions_;
  std::vector<ValueId> inputs_;
  std::vector<ValueId> params_;
  std::vector<ValueId> outputs_;
  std::vector<bool> is_output_;    // value -> listed in outputs_ (sized lazily)
  std::vector<bool> is_constant_;  // value -> declared by AddConst or AddBuffer (sized lazily)
  std::vector<bool> is_buffer_;    // value -> declared by AddBuffer (sized lazily)
  std::vector<IndexSlot> index_;   // name -> value
  std::deque<TensorType> types_;
  std::unordered_map<TensorType, TypeId, TensorTypeHash> type_ids_;  // types_[i] -> i
  // One Attrs block per distinct set of attributes (ir/attrs.h); instructions share them.
  std::unordered_set<Attrs, AttrsHash, AttrsIdentical> attrs_pool_;
  mutable std::unordered_map<std::string, int> fresh_counters_;
  // Names kept by ReserveName, each once: their characters end to end, where name i ends, and an
  // index over them like index_ (IndexSlot::id is i).
  std::string reserved_chars_;
  std::vector<size_t> reserved_ends_;
  std::vector<IndexSlot> reserved_index_;
  bool verified_ = false;
  std::vector<ProgramUnit> units_;
  bool unit_open_ = false;
};

// Why value `v`, input `k` of an instruction of `op`, may not be there, or "" when it may: an
// in-place op reads or writes no constant, except that an op keeping running statistics
// (OpDef::updates_buffers) reads constants and writes buffers — and buffers are touched by no other
// in-place op. AddInstruction and the verifier both refuse what this names.
std::string InPlaceInputProblem(const Program& p, const OpDef& op, int k, ValueId v);

}  // namespace sluice
