// Comparisons and selection: registration, inference and VJP rules. Kernels: kernels/select.h.
#include "sluice/ir/ops/select.h"

#include <functional>

#include "sluice/ir/ops.h"
#include "sluice/ir/ops/common.h"
#include "sluice/kernels/binary.h"
#include "sluice/kernels/select.h"

namespace sluice {

namespace {

constexpr const char* kRelations = "eq, ne, lt, le, gt or ge";

// Calls f.template operator()<Relation>() with the std:: functor of the attribute's relation.
template <typename F>
void DispatchRelation(const std::string& relation, F&& f) {
  if (relation == "eq") return f.template operator()<std::equal_to<>>();
  if (relation == "ne") return f.template operator()<std::not_equal_to<>>();
  if (relation == "lt") return f.template operator()<std::less<>>();
  if (relation == "le") return f.template operator()<std::less_equal<>>();
  if (relation == "gt") return f.template operator()<std::greater<>>();
  if (relation == "ge") return f.template operator()<std::greater_equal<>>();
  throw ShapeError(fmt::format("relation must be {}, got '{}'", kRelations, relation));
}

std::vector<TensorType> InferCompare(std::span<const TensorType> in, const Attrs& attrs) {
  DispatchRelation(attrs.GetString("relation"), []<typename>() {});
  return {{ops::SameFloatDType(in), Broadcast(in[0].shape, in[1].shape)}};
}

template <bool kFast>
void CompareKernel(KernelContext& ctx) {
  DispatchRelation(ctx.attrs.GetString("relation"), [&]<typename Relation>() {
    DispatchFloat(ctx.outputs[0].dtype(), "compare", [&]<typename T>() {
      const kernels::CompareAs<Relation> f;
      if constexpr (kFast) {
        kernels::BinaryFast<T>(ctx.inputs[0], ctx.inputs[1], ctx.outputs[0], f);
      } else {
        kernels::BinaryReference<T>(ctx.inputs[0], ctx.inputs[1], ctx.outputs[0], f);
      }
    });
  });
}

// No gradient: the result is piecewise constant in a and b.
std::vector<Var> CompareVjp(VjpContext&) { return {Var(), Var()}; }

std::vector<TensorType> InferWhere(std::span<const TensorType> in, const Attrs&) {
  return {{ops::SameFloatDType(in), Broadcast(in[0].shape, Broadcast(in[1].shape, in[2].shape))}};
}

void WhereKernel(KernelContext& ctx) {
  DispatchFloat(ctx.outputs[0].dtype(), "where", [&]<typename T>() {
    kernels::Where<T>(ctx.inputs[0], ctx.inputs[1], ctx.inputs[2], ctx.outputs[0]);
  });
}

// da = dy where cond, db = dy elsewhere, each summed back to its operand's shape; cond none.
std::vector<Var> WhereVjp(VjpContext& ctx) {
  Var dy = ctx.dy(0);
  std::vector<Var> grads(3);
  if (!ctx.needs(1) && !ctx.needs(2)) return grads;
  Var cond = ctx.x(0);
  Var zero = Zeros(ctx.builder(), Shape{}, dy.dtype());
  if (ctx.needs(1)) grads[1] = SumTo(Where(cond, dy, zero), ctx.x_type(1).shape);
  if (ctx.needs(2)) grads[2] = SumTo(Where(cond, zero, dy), ctx.x_type(2).shape);
  return grads;
}

}  // namespace

Var Compare(Var a, Var b, const std::string& relation) {
  return a.builder()->Emit1("compare", {a, b}, {{"relation", relation}});
}

Var Where(Var cond, Var a, Var b) { return cond.builder()->Emit1("where", {cond, a, b}); }

void RegisterSelectOps(OpRegistry& r) {
  r.Register({.name = "compare",
              .num_inputs = 2,
              .infer = InferCompare,
              .kernel = CompareKernel<true>,
              .reference = CompareKernel<false>,
              .vjp = CompareVjp,
              .recomputable = true,
              .doc = "1 where a relation b holds, 0 elsewhere (relation eq, ne, lt, le, gt, ge), "
                     "broadcast; no gradient",
              .signature = {.inputs = {{"a", "float[...]"}, {"b", "float[...]"}},
                            .attrs = {{"relation", "string"}},
                            .outputs = {{"y", "float[broadcast of a and b]"}}}});
  r.Register(
      {.name = "where",
       .num_inputs = 3,
       .infer = InferWhere,
       .kernel = WhereKernel,
       .vjp = WhereVjp,
       .recomputable = true,
       .doc = "a where cond is nonzero, b elsewhere, broadcast (torch.where, masked_fill); "
              "dy goes to a where cond, to b elsewhere",
       .signature = {.inputs = {{"cond", "float[...]"}, {"a", "float[...]"}, {"b", "float[...]"}},
                     .outputs = {{"y", "float[broadcast of cond, a and b]"}}}});
}

}  // namespace sluice
