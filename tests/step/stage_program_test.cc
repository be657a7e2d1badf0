// StageProgram: the one builder of a training step. Recompute policies keep fewer bytes from the
// forward and leave every gradient bitwise the same; a step through the builder matches the
// trainer's figures.
#include "sluice/step/stage_program.h"

#include <gtest/gtest.h>

#include "sluice/core/caching_allocator.h"
#include "sluice/core/error.h"
#include "sluice/nn/gpt.h"
#include "sluice/step/task.h"
#include "sluice/train/trainer.h"
#include "trained_run.h"

namespace sluice {
namespace {

TrainConfig SmallGpt() {
  TrainConfig c;
  c.gpt = {.vocab = 0, .seq = 0, .layers = 3, .heads = 2, .dim = 32};
  c.steps = 3;
  c.batch = 8;
  c.microbatches = 2;
  c.optimizer.lr = 1e-2;
  c.optimizer.clip_norm = 0.5;
  c.threads = 1;
  c.eval_every = 0;
  return c;
}

int64_t Bytes(const Program& p, const std::vector<std::string>& names) {
  int64_t bytes = 0;
  for (const std::string& n : names) {
    const TensorType& t = p.type(p.Get(n));
    bytes += t.shape.numel() * static_cast<int64_t>(SizeOf(t.dtype));
  }
  return bytes;
}

struct Built {
  std::vector<std::string> saved;
  int64_t saved_bytes = 0;
  Model model;
};

Built Build(RecomputePolicy policy, GptAttention attention = GptAttention::kNaive) {
  TrainConfig c = SmallGpt();
  c.gpt.attention = attention;
  std::unique_ptr<Task> task = MakeTask(c);
  CachingAllocator allocator;
  StageProgram program({{.model = task->BuildTrain(4)}}, c,
                       {.allocator = &allocator, .recompute = policy});
  const Chunk& ch = program.chunk(0);
  return {ch.backward.saved, Bytes(ch.model.forward, ch.backward.saved), ch.model};
}

// Under naive attention, whose [B, H, T, T] scores and probabilities selective recompute drops.
TEST(StageProgram, RecomputePoliciesKeepFewerBytes) {
  const Built none = Build(RecomputePolicy::kNone), cheap = Build(RecomputePolicy::kCheap);
  const Built full = Build(RecomputePolicy::kFull), selective = Build(RecomputePolicy::kSelective);
  EXPECT_LT(cheap.saved_bytes, none.saved_bytes);
  EXPECT_LT(selective.saved_bytes, cheap.saved_bytes);
  EXPECT_LT(full.saved_bytes, selective.saved_bytes);
  // full keeps the unit inputs (each block's and the head's) and the program's inputs, nothing
  // else.
  ASSERT_EQ(full.model.block_inputs.size(), 4u);
  for (const std::string& name : full.saved) {
    const bool block_input =
        std::find(full.model.block_inputs.begin(), full.model.block_inputs.end(), name) !=
        full.model.block_inputs.end();
    EXPECT_TRUE(block_input || name == "ids" || name == "targets")
        << name << " is kept under full recompute";
  }
  // selective keeps no attention scores or probabilities; cheap keeps some (softmax's backward
  // reads its output).
  ASSERT_EQ(selective.model.attention_values.size(), 4u * 3u);
  int kept_by_cheap = 0;
  for (const std::string& name : selective.model.attention_values) {
    EXPECT_EQ(std::count(selective.saved.begin(), selective.saved.end(), name), 0) << name;
    kept_by_cheap += static_cast<int>(std::count(cheap.saved.begin(), cheap.saved.end(), name));
  }
  EXPECT_GT(kept_by_cheap, 0);
}

// sublayer keeps exactly what full keeps; its backward recomputes each block's attention twice —
// a transient copy to rebuild the MLP's input, then again for the attention's own backward — and
// its MLP once, so it never holds the attention's recomputed values during the MLP's backward.
TEST(StageProgram, SublayerKeepsWhatFullKeepsAndRecomputesTheAttentionTwice) {
  for (GptAttention attention : {GptAttention::kFused, GptAttention::kNaive}) {
    SCOPED_TRACE(std::string(Name(attention)) + " attention");
    const Built full = Build(RecomputePolicy::kFull, attention);
    const Built sublayer = Build(RecomputePolicy::kSublayer, attention);
    EXPECT_EQ(sublayer.saved, full.saved);
    // Each block is cut at its residual stream between attention and MLP.
    const std::vector<std::string> cuts = SublayerInputs(full.model.forward);
    std::vector<std::string> attn_outs;
    for (const std::string& name : cuts) {
      if (name.ends_with(".attn_out")) attn_outs.push_back(name);
    }
    EXPECT_EQ(attn_outs,
              (std::vector<std::string>{"h.0.attn_out", "h.1.attn_out", "h.2.attn_out"}));
    TrainConfig c = SmallGpt();
    c.gpt.attention = attention;
    std::unique_ptr<Task> task = MakeTask(c);
    auto count = [&](RecomputePolicy policy, std::string_view param) {
      CachingAllocator allocator;
      StageProgram program({{.model = task->BuildTrain(4)}}, c,
                           {.allocator = &allocator, .recompute = policy});
      const Program& b = program.chunk(0).backward.program;
      int n = 0;
      for (const Instruction& ins : b.instructions()) {
        if (ins.op->name == "linear" && b.value(ins.inputs.at(1)).name == param) ++n;
      }
      return n;
    };
    EXPECT_EQ(count(RecomputePolicy::kFull, "h.1.attn.c_attn.weight"), 1);
    EXPECT_EQ(count(RecomputePolicy::kSublayer, "h.1.attn.c_attn.weight"), 2);
    EXPECT_EQ(count(RecomputePolicy::kSublayer, "h.1.mlp.c_fc.weight"), 1);
  }
}

// Fused attention keeps no [T, T] value under any policy: selective has nothing beyond cheap to
// drop and keeps what cheap keeps. (What it keeps instead, the attention output and a log-sum-exp
// per query, grows with T, not T²; at this model's tiny T it is not fewer bytes.)
TEST(StageProgram, FusedAttentionKeepsNoScoresUnderAnyPolicy) {
  const Built cheap = Build(RecomputePolicy::kCheap, GptAttention::kFused);
  const Built selective = Build(RecomputePolicy::kSelective, GptAttention::kFused);
  EXPECT_TRUE(selective.model.attention_values.empty());
  EXPECT_EQ(selective.saved, cheap.saved);
  const Program& p = cheap.model.forward;
  for (const std::string& name : cheap.saved) {
    const Shape& s = p.type(p.Get(name)).shape;
    EXPECT_FALSE(s.rank() == 4 && s[2] == s[3]) << name << " " << s.ToString() << " is kept";
  }
}

// Under bf16 a chunk's gradient messages are bf16, as its forward ones: the backward reads "y.grad"
// and gives "x.grad" as bf16, half fp32's bytes (ChunkMessageType/Bytes agree), and one stage
// rounds each block boundary's gradient where a cut would ("h.0.out.bf16.grad").
TEST(StageProgram, Bf16GradientMessagesAreBf16) {
  GptConfig cfg{.vocab = 16, .seq = 8, .layers = 3, .heads = 2, .dim = 32};
  cfg.precision = Precision::kBf16;
  const TrainConfig c = SmallGpt();
  const GptSlice mid{.embed = false, .first_layer = 1, .end_layer = 2, .head = false};
  CachingAllocator allocator;
  for (const RecomputePolicy policy : {RecomputePolicy::kNone, RecomputePolicy::kFull}) {
    StageProgram program(
        {{.model = BuildGptSlice(cfg, 4, GptOutput::kLoss, 8, mid), .first = false, .last = false}},
        c, {.allocator = &allocator, .recompute = policy, .plan_only = true});
    const Chunk& ch = program.chunk(0);
    const Program& b = ch.backward.program;
    const TensorType message{DType::kBF16, Shape({4, 8, 32})};
    EXPECT_EQ(b.type(b.Get(kChunkOutputGrad)), message);
    EXPECT_EQ(b.type(b.Get(kChunkInputGrad)), message);
    EXPECT_TRUE(b.IsOutput(b.Get(kChunkInputGrad)));
    EXPECT_EQ(ChunkMessageType(ch.model.forward, kChunkOutput), message);
    EXPECT_EQ(ChunkMessageBytes(ch.model.forward, kChunkInput), 4 * 8 * 32 * 2);
  }
  GptConfig whole_cfg = cfg;
  StageProgram whole({{.model = BuildGpt(whole_cfg, 4, GptOutput::kLoss, 8)}}, c,
                     {.allocator = &allocator, .plan_only = true});
  const Program& b = whole.chunk(0).backward.program;
  for (const char* name : {"h_in.bf16.grad", "h.0.out.bf16.grad", "h.2.out.bf16.grad"}) {
    ASSERT_TRUE(b.Find(name)) << name;
    EXPECT_EQ(b.type(b.Get(name)).dtype, DType::kBF16) << name;
  }
}

using Trained = testing_support::TrainedRun;

Trained Train(const TrainConfig& c) { return testing_support::TrainAndKeep(c); }

TEST(StageProgram, EveryRecomputePolicyTrainsBitwiseLikeNone) {
  for (GptAttention attention : {GptAttention::kFused, GptAttention::kNaive}) {
    SCOPED_TRACE(std::string(Name(attention)) + " attention");
    TrainConfig c = SmallGpt();
    c.gpt.attention = attention;
    c.recompute = {RecomputePolicy::kNone};
    const Trained none = Train(c);
    for (RecomputePolicy p : {RecomputePolicy::kCheap, RecomputePolicy::kFull,
                              RecomputePolicy::kSelective, RecomputePolicy::kSublayer}) {
      c.recompute = {p};
      const Trained t = Train(c);
      EXPECT_EQ(t.losses, none.losses) << Name(p);
      EXPECT_EQ(t.norms, none.norms) << Name(p);
      for (const auto& [name, values] : none.state)
        EXPECT_TRUE(t.state.at(name) == values) << Name(p) << ": " << name;
      EXPECT_LT(t.peak, none.peak) << Name(p) << " should lower the step's peak";
    }
  }
}

TEST(StageProgram, RecomputeListMustHaveOnePolicyOrOnePerStage) {
  TrainConfig c = SmallGpt();
  c.recompute = {RecomputePolicy::kFull, RecomputePolicy::kCheap};
  EXPECT_EQ(RecomputeForStage(c, 1, 2), RecomputePolicy::kCheap);
  EXPECT_THROW(RecomputeForStage(c, 0, 1), InvalidArgument);
  EXPECT_THROW(RecomputeForStage(c, 0, 4), InvalidArgument);
  c.recompute = {RecomputePolicy::kSelective};
  EXPECT_EQ(RecomputeForStage(c, 3, 4), RecomputePolicy::kSelective);
  try {
    Trainer trainer([] {
      TrainConfig bad = SmallGpt();
      bad.recompute = {RecomputePolicy::kFull, RecomputePolicy::kCheap};
      return bad;
    }());
    FAIL() << "two policies for one stage were accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("--recompute lists 2 policies"), std::string::npos)
        << e.what();
  }
}

TEST(StageProgram, PolicyNamesRoundTrip) {
  for (RecomputePolicy p : {RecomputePolicy::kNone, RecomputePolicy::kCheap, RecomputePolicy::kFull,
                            RecomputePolicy::kSelective, RecomputePolicy::kSublayer}) {
    EXPECT_EQ(ParseRecomputePolicy(Name(p)), p);
  }
  EXPECT_EQ(ParseRecomputePolicy("all"), std::nullopt);
  EXPECT_EQ(RecomputePolicyNames(), "none|cheap|full|selective|sublayer");
}

// Post-validation: an eager update validated afterwards leaves the parameters and optimizer state
// bitwise where Update (or UpdateIfFinite's refusal) leaves them, whether clipping fires or not
// and when the step is not finite; only a fired clip or a non-finite step rolls back.
class EagerUpdate : public testing::Test {
 protected:
  // Two programs from the same initial state; `grads` holds one micro-batch's gradients.
  struct Rank {
    CachingAllocator allocator;
    std::unique_ptr<StageProgram> program;
    GradientAccumulator grads;
    double norm = 0;
  };
  void SetUp() override { task_ = MakeTask(config_); }
  std::unique_ptr<Rank> Make() {
    auto r = std::make_unique<Rank>();
    r->program =
        std::make_unique<StageProgram>(std::vector<ChunkModel>{{.model = task_->BuildTrain(4)}},
                                       config_, StageProgramOptions{.allocator = &r->allocator});
    Scope scope;
    task_->BindBatch(scope, DataSplit::kTrain, 0, 4, config_.seed);
    r->program->Forward(0, scope);
    r->program->Backward(0, scope, r->grads);
    r->norm = GlobalNorm(r->program->FinishGradients(r->grads, 1));
    return r;
  }
  static std::map<std::string, std::vector<float>> Values(const StageProgram& p) {
    std::map<std::string, std::vector<float>> out;
    for (const auto& [name, t] : p.State())
      out[name].assign(t.data<float>(), t.data<float>() + t.numel());
    return out;
  }
  // The synchronous update against the eager one validated with `norm` and `loss`.
  StageProgram::Validation Compare(double clip, double norm_scale, double loss) {
    config_.optimizer.clip_norm = clip;
    std::unique_ptr<Rank> sync = Make(), eager = Make();
    const double norm = sync->norm * norm_scale;
    sync->program->UpdateIfFinite(sync->grads, norm, loss, 1e-2, 0);
    eager->program->UpdateEagerly(eager->grads, 1e-2, 0);
    EXPECT_TRUE(eager->grads.grads().empty());
    const StageProgram::Validation v = eager->program->ValidateEagerUpdate(norm, loss, 1e-2, 0);
    EXPECT_TRUE(Values(*sync->program) == Values(*eager->program));
    EXPECT_EQ(eager->program->RollbackBytes(), ParamAndStateBytes(*eager->program));
    return v;
  }
  static int64_t ParamAndStateBytes(const StageProgram& p) {
    int64_t bytes = 0;
    for (const auto& [name, t] : p.State()) bytes += t.numel() * 4;
    return bytes;
  }
  TrainConfig config_ = SmallGpt();
  std::unique_ptr<Task> task_;
};

TEST_F(EagerUpdate, StandsWhenClippingDoesNotFire) {
  EXPECT_EQ(Compare(/*clip=*/0, 1, 2.0), StageProgram::Validation::kAccepted);
  EXPECT_EQ(Compare(/*clip=*/1e9, 1, 2.0), StageProgram::Validation::kAccepted);
}

TEST_F(EagerUpdate, RollsBackAndRedoesWhenClippingFires) {
  EXPECT_EQ(Compare(/*clip=*/1e-3, 1, 2.0), StageProgram::Validation::kRedone);
}

TEST_F(EagerUpdate, RollsBackWithoutUpdateWhenTheStepIsNotFinite) {
  EXPECT_EQ(Compare(0, 1, std::numeric_limits<double>::quiet_NaN()),
            StageProgram::Validation::kSkipped);
  EXPECT_EQ(Compare(0.5, std::numeric_limits<double>::infinity(), 2.0),
            StageProgram::Validation::kSkipped);
}

// The double buffer switches the memory under the state's tensors instead of copying it, so a
// holder of State()'s tensors taken before the first step (as the trainer's evaluation scope is)
// reads, after every eager update and its validation, what the synchronous update leaves —
// through accepted, redone, skipped and discarded steps — and the spares are allocated once.
TEST_F(EagerUpdate, AHolderOfTheStateSeesEveryUpdateAndRollback) {
  config_.optimizer.clip_norm = 1.0;
  std::unique_ptr<Rank> sync = Make(), eager = Make();
  const std::map<std::string, Tensor> held = eager->program->State();
  const auto held_values = [&] {
    std::map<std::string, std::vector<float>> out;
    for (const auto& [name, t] : held)
      out[name].assign(t.data<float>(), t.data<float>() + t.numel());
    return out;
  };
  const auto gradients = [&](Rank& r, int64_t step) {
    r.grads.Clear();
    Scope scope;
    task_->BindBatch(scope, DataSplit::kTrain, step, 4, config_.seed);
    r.program->Forward(0, scope);
    r.program->Backward(0, scope, r.grads);
    r.program->FinishGradients(r.grads, 1);
  };
  const double nan = std::numeric_limits<double>::quiet_NaN();
  struct Step {
    double norm, loss;
    bool discard;
    StageProgram::Validation verdict;
  };
  const Step steps[] = {{0.5, 2.0, false, StageProgram::Validation::kAccepted},
                        {4.0, 2.0, false, StageProgram::Validation::kRedone},
                        {0.5, nan, false, StageProgram::Validation::kSkipped},
                        {0.5, 2.0, false, StageProgram::Validation::kAccepted},
                        {0.5, 2.0, true, StageProgram::Validation::kAccepted}};
  int64_t allocated_after_first = 0;
  for (int64_t k = 0; k < std::ssize(steps); ++k) {
    const Step& s = steps[k];
    if (k > 0) {
      gradients(*sync, k);
      gradients(*eager, k);
    }
    if (!s.discard) sync->program->UpdateIfFinite(sync->grads, s.norm, s.loss, 1e-2, k);
    sync->grads.Clear();
    eager->program->UpdateEagerly(eager->grads, 1e-2, k);
    // The spares (and the step's kept gradients): allocated at the first step, the same after.
    if (k == 0) allocated_after_first = eager->allocator.Stats().allocated_bytes;
    EXPECT_EQ(eager->allocator.Stats().allocated_bytes, allocated_after_first) << "step " << k;
    if (s.discard) {
      eager->program->DiscardEagerUpdate(k);
    } else {
      EXPECT_EQ(eager->program->ValidateEagerUpdate(s.norm, s.loss, 1e-2, k), s.verdict)
          << "step " << k;
    }
    EXPECT_TRUE(held_values() == Values(*sync->program)) << "after step " << k;
    EXPECT_TRUE(Values(*eager->program) == Values(*sync->program)) << "after step " << k;
  }
}

// A rollback that cannot find its saved state is an internal error naming the step, never an
// update made silently.
TEST_F(EagerUpdate, AValidationWithoutItsEagerUpdateNamesTheStep) {
  std::unique_ptr<Rank> r = Make();
  try {
    r->program->ValidateEagerUpdate(r->norm, 2.0, 1e-2, 6);
    ADD_FAILURE() << "a validation without an eager update passed";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("post-validation of step 7 found no saved state"),
              std::string::npos)
        << e.what();
  }
  r->program->UpdateEagerly(r->grads, 1e-2, 6);
  try {
    r->program->ValidateEagerUpdate(r->norm, 2.0, 1e-2, 7);
    ADD_FAILURE() << "step 8 validated step 7's eager update";
  } catch (const InternalError& e) {
    EXPECT_NE(std::string(e.what()).find("the pending one is step 7's"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace sluice
