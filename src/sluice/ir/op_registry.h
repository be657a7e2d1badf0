// The op registry: every op registers, in one place, its shape/dtype inference, its kernels
// (a plain reference kernel and a fast one, or a single kernel serving as both), its VJP (gradient)
// rule, its signature and a one-line doc. Autodiff, the verifier, the interpreter and the op test
// harness all read ops from here; none of them switches on op names. `sluice ops` lists every op
// with its signature and doc (`--format json` for tools).
//
// Adding an op: write the kernels in kernels/, register an OpDef in the family file under
// ir/ops/ (e.g. ir/ops/elementwise.cc) with its signature and doc, add a builder function to the
// family header, and add one entry to the op table in tests/ops/ (a test fails, naming the op,
// until there is one).
//
// Kinds of ops:
//   kCompute  outputs are fresh contiguous tensors that the executor allocates before calling the
//             kernel (KernelContext::outputs are defined and sized by inference).
//   kView     outputs alias the storage of input 0 (reshape, split along the leading axis); the
//             kernel assigns KernelContext::outputs itself and allocates nothing.
//   kInPlace  no outputs; the kernel updates inputs in place (optimizer updates). Never pruned.
//
// Contiguity invariant: every tensor bound to a value of a program is contiguous. Kernels may rely
// on it; view ops only produce contiguous views (ops like transpose copy).
//
// Thread-safety: the registry is filled once on first use (thread-safe static) and read-only after.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "sluice/core/allocator.h"
#include "sluice/core/enum_names.h"
#include "sluice/core/tensor.h"
#include "sluice/ir/attrs.h"

namespace sluice {

class Builder;
class Var;
struct Instruction;

// Dtype and shape of one value, as inference sees it.
struct TensorType {
  DType dtype = DType::kF32;
  Shape shape;
  bool operator==(const TensorType& o) const { return dtype == o.dtype && shape == o.shape; }
  std::string ToString() const;  // "f32[2, 3]"
};

struct TensorTypeHash {
  size_t operator()(const TensorType& t) const;
};

enum class OpKind : uint8_t { kCompute, kView, kInPlace };

inline constexpr EnumEntry<OpKind> kOpKindNames[] = {
    {OpKind::kCompute, "compute"},
    {OpKind::kView, "view"},
    {OpKind::kInPlace, "in_place"},
};
static_assert(IsCompleteEnumTable(kOpKindNames));

// "compute", "view", "in_place" (kOpKindNames).
std::string_view Name(OpKind kind);

// One input, attribute or output of an op's signature, as `sluice ops` prints it.
struct OpParam {
  // "x". A name ending in "..." stands for one or more values: concat's inputs, split's outputs.
  std::string name;
  // Inputs and outputs: the dtype and the shape in the glossary's letters (docs/glossary.md), e.g.
  // "float[..., C]" — float is f32 or f64 (one dtype for all the op's float operands), int is i32
  // or i64, any is every dtype; a shape or dtype an attribute gives is named by it
  // ("dtype[shape]"). Attributes: the value's type (int, float, bool, string, ints) and its default
  // when it has one, "float = 1e-05".
  std::string type;
};

// What an op takes and gives. Registration checks it against the OpDef (input count, no outputs
// for kInPlace ops) and the op tests check every case's attributes and output count against it.
struct OpSignature {
  std::vector<OpParam> inputs;
  std::vector<OpParam> attrs;
  std::vector<OpParam> outputs;
};

// A kernel's inputs: read-only access to n tensors that lie either side by side (an array of
// Tensor) or wherever their owner keeps them (an array of pointers, which is how the interpreter
// passes the tensors in its slots: no handle is copied or moved, no reference count touched).
// Reads like a span: inputs[i], size(), range-for. Holds no tensor; what it points at must outlive
// it.
class KernelInputs {
 public:
  KernelInputs(std::span<const Tensor> tensors)  // NOLINT(google-explicit-constructor)
      : tensors_(tensors.data()), size_(tensors.size()) {}
  KernelInputs(const std::vector<Tensor>& tensors)  // NOLINT(google-explicit-constructor)
      : tensors_(tensors.data()), size_(tensors.size()) {}
  explicit KernelInputs(std::span<const Tensor* const> pointers)
      : pointers_(pointers.data()), size_(pointers.size()) {}

  const Tensor& operator[](size_t i) const {
    return pointers_ != nullptr ? *pointers_[i] : tensors_[i];
  }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }

  class Iterator {
   public:
    Iterator(const KernelInputs* inputs, size_t i) : inputs_(inputs), i_(i) {}
    const Tensor& operator*() const { return (*inputs_)[i_]; }
    Iterator& operator++() {
      ++i_;
      return *this;
    }
    bool operator==(const Iterator& other) const { return i_ == other.i_; }

   private:
    const KernelInputs* inputs_;
    size_t i_;
  };
  Iterator begin() const { return {this, 0}; }
  Iterator end() const { return {this, size_}; }

 private:
  const Tensor* tensors_ = nullptr;          // side by side, or
  const Tensor* const* pointers_ = nullptr;  // one pointer each
  size_t size_;
};

// What a kernel sees. Inputs are contiguous. For kCompute ops, outputs are allocated (contiguous,
// uninitialized); for kView ops the kernel assigns them; kInPlace ops have none.
struct KernelContext {
  KernelInputs inputs;
  std::span<Tensor> outputs;
  const Attrs& attrs;
  Allocator& allocator;  // for scratch memory the kernel needs
};

using KernelFn = void (*)(KernelContext& ctx);

// Infers the output types from input types and attributes. Throws ShapeError (without the
// instruction's name: the caller adds it) when the inputs do not fit.
using InferFn = std::vector<TensorType> (*)(std::span<const TensorType> inputs, const Attrs& attrs);

// What a VJP rule sees while autodiff builds the backward program. Forward values are imported
// into the backward program lazily: calling x(i) or y(i) makes that forward value a *saved value*
// the backward program reads, so rules should only ask for what they need.
class VjpContext {
 public:
  virtual ~VjpContext() = default;
  virtual Builder& builder() = 0;
  virtual const Attrs& attrs() const = 0;
  virtual int num_inputs() const = 0;
  virtual int num_outputs() const = 0;
  // Forward input i / output i as a value of the backward program (marks it saved).
  virtual Var x(int i) = 0;
  virtual Var y(int i) = 0;
  // Type of forward input i / output i (no import).
  virtual const TensorType& x_type(int i) const = 0;
  virtual const TensorType& y_type(int i) const = 0;
  // Gradient of output i; an invalid Var when nothing downstream depends on that output.
  virtual Var dy(int i) = 0;
  // Whether the gradient of input i is wanted.
  virtual bool needs(int i) const = 0;
};

// Returns one entry per forward input: its gradient contribution, or an invalid Var when the input
// has no gradient (not needed, or not differentiable such as integer indices).
using VjpFn = std::vector<Var> (*)(VjpContext& ctx);

struct OpDef {
  std::string name;
  OpKind kind = OpKind::kCompute;
  int num_inputs = 0;  // -1: variadic (at least one)
  InferFn infer = nullptr;
  // The fast kernel and the plain, commented reference kernel. An op with a single kernel gives
  // one of the two; Register sets the other to the same function (kernel == reference then).
  KernelFn kernel = nullptr;
  KernelFn reference = nullptr;
  VjpFn vjp = nullptr;  // null: not differentiable (autodiff reports it by name)
  // Cheap enough (one or a few passes over its input, no product: elementwise ops, norms,
  // copies) that a backward program may recompute the output from the op's inputs instead of
  // keeping it alive from the forward pass (GradientSpec::recompute).
  bool recomputable = false;
  std::string doc;  // one line, required: what the op computes (`sluice ops` prints it)
  OpSignature signature;
  // Scratch memory the kernel takes from KernelContext::allocator while it runs and frees before
  // it returns, in bytes, from the input types and attributes; null: none. The memory forecast
  // (step/memory_replay.h) holds it at the instruction, beside its outputs, so it stays exact.
  int64_t (*scratch_bytes)(std::span<const TensorType> inputs, const Attrs& attrs) = nullptr;
  // kInPlace ops: the inputs the kernel writes (indices; the others it only reads). The verifier
  // refuses an instruction whose written input shares its storage with another input, and a view
  // read after an update of the storage it was taken of (ir/verifier.h).
  std::vector<int> updates;
  // kInPlace ops that keep running statistics (batch_norm_update_stats): the inputs they write
  // must be buffers (Program::AddBuffer), which no other op may write, and they belong to
  // training alone — the inference form of a program drops them (ir/inference_form.h).
  bool updates_buffers = false;
  // kCompute ops: the inputs whose storage output 0 may be written into when the input dies at
  // this instruction (exec/analysis.h decides, before the first run: same shape and element width,
  // no view and no later reader). A kernel listing input j reads element k of it only before it
  // writes element k of output 0, and reads no other element of it after that — a loop over
  // positions, each read then written, gives the same bits in place as apart.
  std::vector<int> in_place_inputs;
};

// Attributes: an instruction may carry only the attributes its op's signature declares, so that a
// misspelled one (`{tranpose_b = true}`) is an error rather than a silently ignored default.
// Empty when `op` declares `name`; otherwise what is wrong, naming the op and the attribute,
// listing the declared ones and suggesting the nearest ("matmul has no attribute 'tranpose_b'
// (did you mean 'transpose_b'?); its attributes are transpose_a, transpose_b").
std::string UndeclaredAttrMessage(const OpDef& op, std::string_view name);
// The message for the first attribute of `attrs` that `op` does not declare; empty when all are.
std::string UndeclaredAttrsMessage(const OpDef& op, const Attrs& attrs);

class OpRegistry {
 public:
  // The registry with every built-in op.
  static const OpRegistry& Global();

  // Throws ProgramError("unknown op 'foo'") when absent.
  const OpDef& Get(std::string_view name) const;
  const OpDef* Find(std::string_view name) const;
  std::vector<const OpDef*> All() const;

  // Registration (ir/ops/*.cc). Throws InternalError on a duplicate name, a missing name,
  // inference, kernel or doc, or a signature that does not fit the op (input count, outputs of a
  // kInPlace op).
  void Register(OpDef def);

 private:
  std::map<std::string, std::unique_ptr<OpDef>, std::less<>> ops_;
};

// Family registration functions, called once by OpRegistry::Global() (ir/ops/*.cc): elementwise
// (add, sub, mul, div, scale, unary functions and their gradients, full, cast, copy), reduction
// (sum, mean, sum_to, broadcast_to), shape (reshape, transpose, permute, slice, concat, split and
// their view forms), linalg (matmul, linear), nn (softmax, causal masks, layer_norm, rms_norm,
// embedding, cross_entropy and their gradients), optimizer (sgd_update, adamw_update); select
// (compare, where) and conv register from their own headers.
void RegisterElementwiseOps(OpRegistry& registry);
void RegisterReductionOps(OpRegistry& registry);
void RegisterShapeOps(OpRegistry& registry);
void RegisterLinalgOps(OpRegistry& registry);
void RegisterNnOps(OpRegistry& registry);
void RegisterOptimizerOps(OpRegistry& registry);

// Dispatches on a floating dtype: DispatchFloat(t, [&]<typename T>() { ... }). Throws ShapeError
// naming `what` for non-float dtypes.
template <typename F>
decltype(auto) DispatchFloat(DType t, std::string_view what, F&& f) {
  switch (t) {
    case DType::kF32:
      return f.template operator()<float>();
    case DType::kF64:
      return f.template operator()<double>();
    default:
      break;
  }
  throw ShapeError(std::string(what) + ": kernels compute f32 and f64 only, not " +
                   std::string(Name(t)));
}

}  // namespace sluice
