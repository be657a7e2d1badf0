// Builder: writes programs in C++ so that model code reads like the math.
//
// A Var is a handle to a value of the program being built (builder pointer + ValueId); it is cheap
// to copy. Op functions (ir/ops.h) take Vars and return Vars, running shape inference as they go,
// so a mismatch is reported where the model code makes it.
//
// Names: every value has a name. Op outputs get fresh names ("matmul_3") unless named; inside a
// NameScope, names given with Name() are prefixed ("h.0." + "attn_out").
//
// Example:
//   Builder b("mlp");
//   Var x = b.Input("x", DType::kF32, {B, C});
//   Var w = b.Param("fc.weight", DType::kF32, {C, H});
//   Var h = b.Name(Relu(MatMul(x, w)), "h");
//   b.Output(h);
//   Program p = b.Build();  // verified
//
// Thread-safety: none; one builder per thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "sluice/ir/program.h"

namespace sluice {

class Builder;

class Var {
 public:
  Var() = default;
  Var(Builder* builder, ValueId id) : builder_(builder), id_(id) {}

  bool valid() const { return builder_ != nullptr && id_ != kNoValue; }
  Builder* builder() const { return builder_; }
  ValueId id() const { return id_; }
  const Value& value() const;
  const TensorType& type() const;
  const Shape& shape() const { return type().shape; }
  DType dtype() const { return type().dtype; }
  int rank() const { return shape().rank(); }
  const std::string& name() const { return value().name; }

 private:
  Builder* builder_ = nullptr;
  ValueId id_ = kNoValue;
};

class Builder {
 public:
  explicit Builder(std::string program_name) : program_(std::move(program_name)) {}
  Builder(const Builder&) = delete;
  Builder& operator=(const Builder&) = delete;

  Var Input(std::string name, DType dtype, const Shape& shape);
  Var Param(std::string name, DType dtype, const Shape& shape);
  // Emits one instruction and returns its outputs. Throws as Program::AddInstruction.
  std::vector<Var> Emit(std::string_view op, const std::vector<Var>& inputs, Attrs attrs = {});
  // Emits an op with exactly one output.
  Var Emit1(std::string_view op, const std::vector<Var>& inputs, Attrs attrs = {});
  void Output(Var v);

  // Gives `v` the name prefix + name (prefix from the enclosing NameScopes); returns v.
  Var Name(Var v, std::string_view name);
  // The value named `name` (full name, no prefix).
  Var Lookup(std::string_view name);

  // Prefixes names given through Name() with "<scope>." while alive. Nests.
  class NameScope {
   public:
    NameScope(Builder& b, std::string_view scope);
    ~NameScope();
    NameScope(const NameScope&) = delete;
    NameScope& operator=(const NameScope&) = delete;

   private:
    Builder& b_;
    size_t previous_size_;
  };
  std::string Prefixed(std::string_view name) const { return prefix_ + std::string(name); }

  // Instructions emitted while a Unit lives belong to the program's unit `name`
  // (Program::BeginUnit): a layer, a block, the head. Units do not nest.
  class Unit {
   public:
    Unit(Builder& b, std::string name) : b_(b) { b_.program_.BeginUnit(std::move(name)); }
    ~Unit() {
      if (b_.program_.unit_open()) b_.program_.EndUnit();  // Build() may have taken the program
    }
    Unit(const Unit&) = delete;
    Unit& operator=(const Unit&) = delete;

   private:
    Builder& b_;
  };

  const Program& program() const { return program_; }
  Program& mutable_program() { return program_; }
  // Verifies and returns the program; the builder is left empty.
  Program Build();

 private:
  Program program_;
  std::string prefix_;
};

}  // namespace sluice
