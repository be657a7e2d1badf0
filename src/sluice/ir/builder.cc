#include "sluice/ir/builder.h"

#include "sluice/core/error.h"
#include "sluice/ir/verifier.h"

namespace sluice {

const Value& Var::value() const {
  SLUICE_CHECK(valid(), "use of an invalid Var");
  return builder_->program().value(id_);
}

const TensorType& Var::type() const {
  SLUICE_CHECK(valid(), "use of an invalid Var");
  return builder_->program().type(id_);
}

Var Builder::Input(std::string name, DType dtype, const Shape& shape) {
  return Var(this, program_.AddInput(std::move(name), {dtype, shape}));
}

Var Builder::Param(std::string name, DType dtype, const Shape& shape) {
  return Var(this, program_.AddParam(std::move(name), {dtype, shape}));
}

std::vector<Var> Builder::Emit(std::string_view op, const std::vector<Var>& inputs, Attrs attrs) {
  std::vector<ValueId> ids;
  ids.reserve(inputs.size());
  for (const Var& v : inputs) {
    SLUICE_CHECK(v.valid() && v.builder() == this, "op {} given a Var of another builder", op);
    ids.push_back(v.id());
  }
  std::vector<Var> out;
  for (ValueId id : program_.AddInstruction(op, std::move(ids), std::move(attrs))) {
    out.emplace_back(this, id);
  }
  return out;
}

Var Builder::Emit1(std::string_view op, const std::vector<Var>& inputs, Attrs attrs) {
  std::vector<Var> out = Emit(op, inputs, std::move(attrs));
  SLUICE_CHECK(out.size() == 1, "op {} has {} outputs, expected one", op, out.size());
  return out[0];
}

void Builder::Output(Var v) {
  SLUICE_CHECK(v.valid() && v.builder() == this);
  program_.AddOutput(v.id());
}

Var Builder::Name(Var v, std::string_view name) {
  SLUICE_CHECK(v.valid() && v.builder() == this);
  program_.Rename(v.id(), Prefixed(name));
  return v;
}

Var Builder::Lookup(std::string_view name) { return Var(this, program_.Get(name)); }

Builder::NameScope::NameScope(Builder& b, std::string_view scope)
    : b_(b), previous_size_(b.prefix_.size()) {
  b_.prefix_ += std::string(scope) + ".";
}

Builder::NameScope::~NameScope() { b_.prefix_.resize(previous_size_); }

Program Builder::Build() {
  VerifyOnce(program_);
  Program out = std::move(program_);
  program_ = Program(out.name());
  return out;
}

}  // namespace sluice
