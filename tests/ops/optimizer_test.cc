// Op table: optimizer updates (in place, no gradients), and the PyTorch parity check: trajectories
// recorded from torch.optim.SGD and torch.optim.AdamW (tests/parity/optimizer_reference.py, checked
// in as tests/ops/data/optimizer_reference.json) replayed through sgd_update and adamw_update.
#include <cstring>
#include <map>

#include <nlohmann/json.hpp>

#include "op_harness.h"
#include "sluice/exec/reference_runner.h"
#include "sluice/ir/ops.h"
#include "torch_reference.h"

namespace sluice::testing {
std::vector<OpCase> OptimizerCases() {
  const Attrs sgd_momentum{{"momentum", 0.9}, {"weight_decay", 0.01}};
  const Attrs sgd_plain{{"momentum", 0.0}, {"weight_decay", 0.1}};
  const Attrs adamw{{"beta1", 0.9}, {"beta2", 0.999}, {"eps", 1e-8}, {"weight_decay", 0.01}};
  const Fill steps = Uniform(1, 10);  // step counts from 1; an i64 step truncates this to 1..9
  return {
      {.label = "sgd_momentum",
       .op = "sgd_update",
       .inputs = {F({3, 4}), F({3, 4}), F({3, 4}), F({})},
       .attrs = sgd_momentum,
       .grad = false},
      {.label = "sgd_plain",
       .op = "sgd_update",
       .inputs = {F({13}), F({13}), F({13}), F({})},
       .attrs = sgd_plain,
       .grad = false},
      {.label = "adamw",
       .op = "adamw_update",
       .inputs = {F({3, 7}), F({3, 7}), F({3, 7}), F({3, 7}), F({}), F({})},
       .attrs = adamw,
       .fills = {Fill{}, Fill{}, Fill{}, Positive(), Uniform(1e-3, 1e-1), steps},
       .grad = false},
      {.label = "adamw_i64_step",
       .op = "adamw_update",
       .inputs = {F({33}), F({33}), F({33}), F({33}), F({}), I64({})},
       .fills = {Fill{}, Fill{}, Fill{}, Positive(), Uniform(1e-3, 1e-1), steps},
       .grad = false},
      {.label = "sgd_into",
       .op = "sgd_update_into",
       .inputs = {F({3, 4}), F({3, 4}), F({3, 4}), F({}), F({3, 4}), F({3, 4})},
       .attrs = sgd_momentum,
       .grad = false},
      {.label = "adamw_into",
       .op = "adamw_update_into",
       .inputs = {F({37}), F({37}), F({37}), F({37}), F({}), F({}), F({37}), F({37}), F({37})},
       .attrs = adamw,
       .fills = {Fill{}, Fill{}, Fill{}, Positive(), Uniform(1e-3, 1e-1), steps},
       .grad = false},
  };
}

namespace {

std::vector<OpErrorCase> OptimizerErrors() {
  return {
      {.label = "sgd_grad_shape",
       .op = "sgd_update",
       .inputs = {F({3, 4}), F({4, 3}), F({3, 4}), F({})}},
      {.label = "sgd_lr_not_scalar",
       .op = "sgd_update",
       .inputs = {F({3}), F({3}), F({3}), F({1})}},
      {.label = "sgd_int_param",
       .op = "sgd_update",
       .inputs = {I64({3}), I64({3}), I64({3}), F({})}},
      {.label = "adamw_v_shape",
       .op = "adamw_update",
       .inputs = {F({3}), F({3}), F({3}), F({4}), F({}), F({})}},
      {.label = "adamw_step_i32",
       .op = "adamw_update",
       .inputs = {F({3}), F({3}), F({3}), F({3}), F({}), I32({})}},
      {.label = "adamw_dtype",
       .op = "adamw_update",
       .inputs = {F({3}), F({3}), {DType::kF64, Shape{3}}, F({3}), F({}), F({})}},
      {.label = "sgd_into_out_shape",
       .op = "sgd_update_into",
       .inputs = {F({3}), F({3}), F({3}), F({}), F({4}), F({3})}},
      {.label = "adamw_into_out_dtype",
       .op = "adamw_update_into",
       .inputs =
           {F({3}), F({3}), F({3}), F({3}), F({}), F({}), F({3}), F({3}), {DType::kF64, Shape{3}}}},
      {.label = "adamw_beta",
       .op = "adamw_update",
       .inputs = {F({3}), F({3}), F({3}), F({3}), F({}), F({})},
       .attrs = {{"beta2", 1.0}}},
  };
}

INSTANTIATE_TEST_SUITE_P(Optimizer, OpHarness, ::testing::ValuesIn(OptimizerCases()), CaseName());
INSTANTIATE_TEST_SUITE_P(Optimizer, OpErrors, ::testing::ValuesIn(OptimizerErrors()), CaseName());

// One optimizer step as a program: state tensors are inputs updated in place, so the scope keeps
// them from step to step.
Program StepProgram(const nlohmann::json& c, DType dtype, const Shape& shape) {
  Builder b(c.at("name").get<std::string>());
  Var p = b.Input("p", dtype, shape), g = b.Input("g", dtype, shape), lr = b.Input("lr", dtype, {});
  if (c.at("kind") == "sgd") {
    SgdUpdate(p, g, b.Input("buf", dtype, shape), lr,
              {.momentum = c.at("momentum").get<double>(),
               .weight_decay = c.at("weight_decay").get<double>()});
  } else {
    AdamWUpdate(p, g, b.Input("m", dtype, shape), b.Input("v", dtype, shape), lr,
                b.Input("step", DType::kI64, {}),
                {.beta1 = c.at("beta1").get<double>(),
                 .beta2 = c.at("beta2").get<double>(),
                 .eps = c.at("eps").get<double>(),
                 .weight_decay = c.at("weight_decay").get<double>()});
  }
  return b.Build();
}

// The *_into forms write, bitwise, what the in-place forms leave in the state — under the fast and
// the reference kernels — and leave the state they read as it was (post-validation's double
// buffer relies on both).
TEST(OptimizerInto, WritesBitwiseWhatTheInPlaceUpdateLeavesAndKeepsTheOldState) {
  const Shape shape{5, 13};
  for (const bool adamw : {false, true}) {
    for (const bool reference_kernels : {false, true}) {
      SCOPED_TRACE(fmt::format("{} {} kernels", adamw ? "adamw" : "sgd",
                               reference_kernels ? "reference" : "fast"));
      const std::vector<std::string> state =
          adamw ? std::vector<std::string>{"p", "m", "v"} : std::vector<std::string>{"p", "buf"};
      Builder in_place("in_place"), into("into");
      std::map<std::string, Var> a, b;
      for (const std::string& name : state) {
        a[name] = in_place.Param(name, DType::kF32, shape);
        b[name] = into.Param(name, DType::kF32, shape);
        b[name + "_out"] = into.Param(name + "_out", DType::kF32, shape);
      }
      for (Builder* builder : {&in_place, &into}) {
        std::map<std::string, Var>& v = builder == &in_place ? a : b;
        v["g"] = builder->Input("g", DType::kF32, shape);
        v["lr"] = builder->Input("lr", DType::kF32, {});
        v["step"] = builder->Input("step", DType::kF32, {});
      }
      if (adamw) {
        const AdamWOptions o{.weight_decay = 0.1};
        AdamWUpdate(a["p"], a["g"], a["m"], a["v"], a["lr"], a["step"], o);
        AdamWUpdateInto(b["p"], b["g"], b["m"], b["v"], b["lr"], b["step"], b["p_out"], b["m_out"],
                        b["v_out"], o);
      } else {
        const SgdOptions o{.momentum = 0.9, .weight_decay = 0.01};
        SgdUpdate(a["p"], a["g"], a["buf"], a["lr"], o);
        SgdUpdateInto(b["p"], b["g"], b["buf"], b["lr"], b["p_out"], b["buf_out"], o);
      }
      Scope sa, sb;
      uint64_t seed = 7;
      for (const std::string& name : {std::string("g"), std::string("p"), std::string("m"),
                                      std::string("v"), std::string("buf")}) {
        Tensor t = Tensor::Empty(shape, DType::kF32);
        for (int64_t i = 0; i < t.numel(); ++i) {
          seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
          t.data<float>()[i] = static_cast<float>((seed >> 40) % 1000) / 1000.0f + 0.01f;
        }
        sa.Set(name, t.Clone(DefaultAllocator()));
        sb.Set(name, t);
        sb.Set(name + "_out", Tensor::Zeros(shape, DType::kF32));
      }
      for (Scope* s : {&sa, &sb}) {
        s->Set("lr", Tensor::Full({}, 1e-2, DType::kF32));
        s->Set("step", Tensor::Full({}, 3, DType::kF32));
      }
      std::map<std::string, std::vector<float>> before;
      for (const std::string& name : state)
        before[name].assign(sb.Get(name).data<float>(), sb.Get(name).data<float>() + 65);
      RunReference(in_place.Build(), sa, DefaultAllocator(), reference_kernels);
      RunReference(into.Build(), sb, DefaultAllocator(), reference_kernels);
      for (const std::string& name : state) {
        const std::vector<float> updated(sa.Get(name).data<float>(),
                                         sa.Get(name).data<float>() + 65);
        const std::vector<float> written(sb.Get(name + "_out").data<float>(),
                                         sb.Get(name + "_out").data<float>() + 65);
        const std::vector<float> kept(sb.Get(name).data<float>(), sb.Get(name).data<float>() + 65);
        EXPECT_TRUE(std::memcmp(updated.data(), written.data(), 65 * sizeof(float)) == 0) << name;
        EXPECT_NE(updated, before[name]) << name << " was not updated";
        EXPECT_EQ(kept, before[name]) << name << " was changed by the _into form";
      }
    }
  }
}

TEST(OptimizerParity, SgdAndAdamWMatchPyTorch) {
  const nlohmann::json ref =
      LoadTorchReference("optimizer_reference.json", "tests/parity/optimizer_reference.py");
  ASSERT_FALSE(ref.at("cases").empty());
  for (const nlohmann::json& c : ref.at("cases")) {
    const std::vector<int64_t> dims = c.at("shape").get<std::vector<int64_t>>();
    const Shape shape{std::span<const int64_t>(dims)};
    for (const auto& [label, dtype] :
         {std::pair{"f64", DType::kF64}, std::pair{"f32", DType::kF32}}) {
      for (bool reference_kernels : {false, true}) {
        SCOPED_TRACE(fmt::format("{} {} {} kernels", c.at("name").get<std::string>(), label,
                                 reference_kernels ? "reference" : "fast"));
        const nlohmann::json& traj = c.at(label);
        const Program program = StepProgram(c, dtype, shape);
        Scope scope;
        scope.Set("p", TensorFromJson(traj.at("start"), shape, dtype));
        for (const char* state : {"buf", "m", "v"}) scope.Set(state, Tensor::Zeros(shape, dtype));
        for (size_t s = 0; s < traj.at("steps").size(); ++s) {
          scope.Set("g", TensorFromJson(traj.at("grads").at(s), shape, dtype));
          scope.Set("lr", Tensor::Full({}, c.at("lrs").at(s).get<double>(), dtype));
          scope.Set("step", Tensor::Full({}, static_cast<double>(s + 1), DType::kI64));
          RunReference(program, scope, DefaultAllocator(), reference_kernels);
          const nlohmann::json& want = traj.at("steps").at(s);
          EXPECT_LE(RelativeErrorToTorch(scope.Get("p"), want.at("param")), 1e-6)
              << "param after step " << s + 1;
          if (c.at("kind") == "sgd") {
            EXPECT_LE(RelativeErrorToTorch(scope.Get("buf"), want.at("momentum_buf")), 1e-6)
                << "buffer after step " << s + 1;
          } else {
            EXPECT_LE(RelativeErrorToTorch(scope.Get("m"), want.at("m")), 1e-6)
                << "m after step " << s + 1;
            EXPECT_LE(RelativeErrorToTorch(scope.Get("v"), want.at("v")), 1e-6)
                << "v after step " << s + 1;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace sluice::testing
