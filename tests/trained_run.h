// A few training steps through Trainer, kept whole for comparing two runs bit for bit: each step's
// loss and gradient norm, the largest allocated peak, and every parameter's and optimizer state's
// values at the end.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "sluice/nn/optimizer.h"
#include "sluice/train/trainer.h"

namespace sluice::testing_support {

struct TrainedRun {
  std::vector<double> losses, norms;                // norms: the gradient's, before clipping
  std::map<std::string, std::vector<float>> state;  // parameters and optimizer state, by name
  int64_t peak = 0;
};

// Every parameter's and its optimizer state's values, by name.
inline std::map<std::string, std::vector<float>> KeepState(const Trainer& trainer,
                                                           const OptimizerConfig& optimizer) {
  std::map<std::string, std::vector<float>> state;
  for (const std::string& p : trainer.ParamNames()) {
    std::vector<std::string> names = OptimizerStateNames(p, optimizer);
    names.insert(names.begin(), p);
    for (const std::string& n : names) {
      if (n != p && !trainer.Has(n)) continue;  // a constant has no optimizer state
      const Tensor& t = trainer.Value(n);
      std::vector<float> v(static_cast<size_t>(t.numel()));
      for (int64_t i = 0; i < t.numel(); ++i)
        v[static_cast<size_t>(i)] = static_cast<float>(t.FlatAt(i));
      state[n] = std::move(v);
    }
  }
  return state;
}

// Runs config.steps steps of a Trainer (on `engine`, the default engine when empty).
inline TrainedRun TrainAndKeep(const TrainConfig& config, const EngineFactory& engine = nullptr) {
  Trainer trainer(config, engine);
  TrainedRun out;
  for (int64_t s = 0; s < config.steps; ++s) {
    const StepRecord r = trainer.Step();
    out.losses.push_back(r.loss);
    out.norms.push_back(r.grad_norm);
    out.peak = std::max(out.peak, r.peak_allocated_bytes);
  }
  out.state = KeepState(trainer, config.optimizer);
  return out;
}

// Expects `b` to be `a` bit for bit: every step's loss and gradient norm, every final value.
// `what` labels the failures.
inline void ExpectBitwiseRun(const TrainedRun& a, const TrainedRun& b, const std::string& what) {
  EXPECT_EQ(a.losses, b.losses) << what << ": losses";
  EXPECT_EQ(a.norms, b.norms) << what << ": gradient norms";
  ASSERT_EQ(a.state.size(), b.state.size()) << what;
  for (const auto& [name, values] : a.state) {
    ASSERT_TRUE(b.state.count(name)) << what << ": " << name << " missing";
    EXPECT_TRUE(values == b.state.at(name)) << what << ": " << name << " differs";
  }
}

}  // namespace sluice::testing_support
