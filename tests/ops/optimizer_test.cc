// Op table: optimizer updates (in place, no gradients), and the PyTorch parity check: trajectories
// recorded from torch.optim.SGD and torch.optim.AdamW (tests/parity/optimizer_reference.py, checked
// in as tests/ops/data/optimizer_reference.json) replayed through sgd_update and adamw_update.
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
