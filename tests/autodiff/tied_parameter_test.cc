// Tied parameters: a parameter read by several instructions gets the sum of the gradients each
// reading contributes. Checked on a program parsed from text (as `sluice train --program` reads
// one), in f64, against central finite differences of the loss and against the same program with
// every reading given a parameter of its own (the untied twin), whose gradients must add up to the
// tied one's.
#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "sluice/autodiff/autodiff.h"
#include "sluice/exec/reference_runner.h"
#include "sluice/ir/text_format.h"

namespace sluice {
namespace {

// A tiny language model with both usual kinds of tying: the embedding table is also the output
// head (read by embedding and by a transposed matmul), and one weight is shared by two blocks
// (read by two matmuls). `table_in`, `table_out`, `shared_0`, `shared_1` name the parameter each
// reading uses; passing the same name twice ties them.
std::string TiedText(const std::string& table_in, const std::string& table_out,
                     const std::string& shared_0, const std::string& shared_1) {
  std::string params =
      fmt::format("  param %{}: f64[5, 4]\n  param %{}: f64[4, 4]\n", table_in, shared_0);
  if (table_out != table_in) params += fmt::format("  param %{}: f64[5, 4]\n", table_out);
  if (shared_1 != shared_0) params += fmt::format("  param %{}: f64[4, 4]\n", shared_1);
  return fmt::format(R"(program tied {{
  input %ids: i64[2, 3]
  input %targets: i64[2, 3]
{}  %e: f64[2, 3, 4] = embedding(%ids, %{})
  %a: f64[2, 3, 4] = matmul(%e, %{})
  %b: f64[2, 3, 4] = tanh(%a)
  %c: f64[2, 3, 4] = matmul(%b, %{})
  %d: f64[2, 3, 4] = tanh(%c)
  %logits: f64[2, 3, 5] = matmul(%d, %{}) {{transpose_b = true}}
  %loss: f64[] = cross_entropy(%logits, %targets)
  output %loss
}}
)",
                     params, table_in, shared_0, shared_1, table_out);
}

Tensor Random(const Shape& shape, std::mt19937_64& rng) {
  Tensor t = Tensor::Empty(shape, DType::kF64);
  std::uniform_real_distribution<double> u(-1, 1);
  for (int64_t i = 0; i < t.numel(); ++i) t.FlatSet(i, u(rng));
  return t;
}

// Inputs (id 4 is never embedded: its row's gradient comes from the head alone; ids 0 and 2 are
// embedded twice) and random parameter values, by name.
std::map<std::string, Tensor> TiedValues() {
  std::mt19937_64 rng(11);
  return {{"ids", Tensor::FromVector<int64_t>({2, 3}, {0, 1, 2, 2, 3, 0})},
          {"targets", Tensor::FromVector<int64_t>({2, 3}, {1, 2, 3, 3, 0, 4})},
          {"table", Random({5, 4}, rng)},
          {"shared", Random({4, 4}, rng)}};
}

Scope ScopeOf(const std::map<std::string, Tensor>& values) {
  Scope s;
  for (const auto& [name, t] : values) s.Set(name, t.Clone());
  return s;
}

double Loss(const Program& forward, const std::map<std::string, Tensor>& values) {
  Scope s = ScopeOf(values);
  RunReference(forward, s);
  return s.Get("loss").FlatAt(0);
}

// The gradients of `wrt`, by name, from the backward program autodiff builds.
std::map<std::string, Tensor> Gradients(const Program& forward,
                                        const std::map<std::string, Tensor>& values,
                                        const std::vector<std::string>& wrt) {
  const Backward bwd = BuildBackward(forward, {.loss = "loss", .wrt = wrt});
  Scope s = ScopeOf(values);
  RunReference(forward, s, DefaultAllocator(), false, bwd.saved);
  RunReference(bwd.program, s);
  std::map<std::string, Tensor> grads;
  for (size_t i = 0; i < wrt.size(); ++i) grads[wrt[i]] = s.Get(bwd.grads[i]).Clone();
  return grads;
}

double RelativeError(double a, double b) {
  return std::abs(a - b) / std::max({std::abs(a), std::abs(b), 1e-2});
}

TEST(TiedParameters, GradientMatchesCentralFiniteDifferences) {
  const Program tied = ParseProgram(TiedText("table", "table", "shared", "shared"), "tied");
  const std::map<std::string, Tensor> values = TiedValues();
  const std::map<std::string, Tensor> grads = Gradients(tied, values, {"table", "shared"});
  const double h = 1e-6;
  for (const auto& [name, analytic] : grads) {
    for (int64_t i = 0; i < analytic.numel(); ++i) {
      std::map<std::string, Tensor> plus = values, minus = values;
      plus[name] = values.at(name).Clone();
      minus[name] = values.at(name).Clone();
      const double x = values.at(name).FlatAt(i);
      plus[name].FlatSet(i, x + h);
      minus[name].FlatSet(i, x - h);
      const double numeric = (Loss(tied, plus) - Loss(tied, minus)) / (2 * h);
      EXPECT_LE(RelativeError(analytic.FlatAt(i), numeric), 1e-6)
          << name << "[" << i << "]: autodiff " << analytic.FlatAt(i) << ", finite difference "
          << numeric;
    }
  }
}

TEST(TiedParameters, GradientIsTheSumOfEachReadingsGradient) {
  const Program tied = ParseProgram(TiedText("table", "table", "shared", "shared"), "tied");
  const Program untied =
      ParseProgram(TiedText("table_in", "table_out", "shared_0", "shared_1"), "untied");
  const std::map<std::string, Tensor> values = TiedValues();
  std::map<std::string, Tensor> twin = {{"ids", values.at("ids")},
                                        {"targets", values.at("targets")}};
  twin["table_in"] = twin["table_out"] = values.at("table");
  twin["shared_0"] = twin["shared_1"] = values.at("shared");
  // The same function: untying changes the parameters, not the loss.
  ASSERT_EQ(Loss(tied, values), Loss(untied, twin));

  const std::map<std::string, Tensor> g = Gradients(tied, values, {"table", "shared"});
  const std::map<std::string, Tensor> parts =
      Gradients(untied, twin, {"table_in", "table_out", "shared_0", "shared_1"});
  using Reading = std::tuple<std::string, std::string, std::string>;  // tied, first, second
  for (const auto& [name, first, second] :
       {Reading{"table", "table_in", "table_out"}, Reading{"shared", "shared_0", "shared_1"}}) {
    const Tensor& a = parts.at(first);
    const Tensor& b = parts.at(second);
    double a_norm = 0, b_norm = 0;
    for (int64_t i = 0; i < a.numel(); ++i) {
      EXPECT_LE(RelativeError(g.at(name).FlatAt(i), a.FlatAt(i) + b.FlatAt(i)), 1e-12)
          << name << "[" << i << "]: tied " << g.at(name).FlatAt(i) << ", " << first << " "
          << a.FlatAt(i) << " + " << second << " " << b.FlatAt(i);
      a_norm += a.FlatAt(i) * a.FlatAt(i);
      b_norm += b.FlatAt(i) * b.FlatAt(i);
    }
    // Both readings contribute: a gradient that kept only one of them would fail above.
    EXPECT_GT(a_norm, 1e-6) << first;
    EXPECT_GT(b_norm, 1e-6) << second;
  }
}

}  // namespace
}  // namespace sluice
