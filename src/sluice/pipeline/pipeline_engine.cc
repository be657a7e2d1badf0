#include "sluice/pipeline/pipeline_engine.h"

#include <cblas.h>

#include <algorithm>
#include <exception>
#include <limits>
#include <thread>

#include <fmt/format.h>

#include "sluice/comm/local.h"
#include "sluice/io/chrome_trace.h"

namespace sluice::pipeline {

struct PipelineEngine::Impl {
  PipelineOptions options;
  StageSetup setup;
  GptPartition partition;
  std::unique_ptr<LocalWorld> world;
  std::vector<std::unique_ptr<StageRuntime>> ranks;
  std::vector<StageReport> reports;
  std::exception_ptr failure;  // a failed step leaves the communicator aborted

  void WriteTrace(const std::vector<StageStep>& steps) const;
};

PipelineEngine::PipelineEngine(const EngineContext& ctx, PipelineOptions options)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.options = std::move(options);
  const TrainConfig& config = ctx.config;
  if (ctx.task.gpt() == nullptr) {
    throw InvalidArgument(fmt::format("--stages splits a GPT into pipeline stages; --model {} cannot be split", config.model));
  }
  if (m.options.stages < 1) throw InvalidArgument(fmt::format("--stages must be at least 1, got {}", m.options.stages));
  m.setup.config = &config;
  m.setup.task = &ctx.task;
  m.setup.gpt = *ctx.task.gpt();
  m.setup.micro_batch = config.batch / config.microbatches;
  m.setup.seq_len = ctx.task.seq_len();
  m.setup.schedule = MakeSchedule({.kind = m.options.schedule, .stages = m.options.stages,
                                   .micro_batches = static_cast<int>(config.microbatches), .chunks = m.options.chunks});
  const int S = m.setup.schedule.virtual_stages();
  m.partition = m.options.layout.empty()
                    ? PartitionGpt(m.setup.gpt, m.setup.micro_batch, m.setup.seq_len, S, m.options.partition)
                    : ParseGptLayout(m.options.layout, m.setup.gpt, S);
  m.setup.slices = m.partition.stages;
  m.setup.all_params = ctx.model.params;
  m.setup.release_outputs = m.options.release_outputs;
  m.setup.fault = m.options.fault;
  // Stages share the cores: intra-op threads (BLAS included) are divided among them.
  m.setup.threads = std::max(1, ctx.threads / m.options.stages);
  openblas_set_num_threads(m.setup.threads);

  const int P = m.options.stages;
  for (int r = 0; r < P; ++r) m.ranks.push_back(std::make_unique<StageRuntime>(m.setup, r));
  m.world = std::make_unique<LocalWorld>(P, LocalWorldOptions{.timeout = m.options.timeout});
  const ScheduleOptions sched{.kind = m.options.schedule, .stages = P,
                              .micro_batches = static_cast<int>(config.microbatches), .chunks = m.setup.schedule.chunks};
  for (int r = 0; r < P; ++r) {
    StageReport rep;
    rep.stage = r;
    rep.output_bytes = m.ranks[r]->output_bytes(0);
    rep.theoretical_inflight = TheoreticalInFlight(sched, r);
    rep.inflight_peak_per_chunk.assign(m.setup.schedule.chunks, 0);
    m.reports.push_back(rep);
  }
}

PipelineEngine::~PipelineEngine() = default;

StepResult PipelineEngine::Step(int64_t step, double lr) {
  Impl& m = *impl_;
  if (m.failure) std::rethrow_exception(m.failure);
  const int P = m.options.stages;
  const bool trace = !m.options.trace_path.empty() && step == m.setup.config->steps - 1;
  std::vector<StageStep> steps(P);
  std::vector<std::exception_ptr> errors(P);
  {
    std::vector<std::jthread> threads;
    for (int r = 0; r < P; ++r) {
      threads.emplace_back([&, r] {
        try {
          steps[r] = m.ranks[r]->RunStep(step, lr, m.world->comm(r), trace);
        } catch (...) {
          errors[r] = std::current_exception();
        }
      });
    }
  }
  // Report the rank that failed first — its StageError; the others were woken by its abort.
  auto is_stage_error = [](const std::exception_ptr& e) {
    try {
      std::rethrow_exception(e);
    } catch (const StageError&) {
      return true;
    } catch (...) {
      return false;
    }
  };
  for (const std::exception_ptr& e : errors) {
    if (e && (!m.failure || is_stage_error(e))) m.failure = e;
    if (m.failure && is_stage_error(m.failure)) break;
  }
  if (m.failure) std::rethrow_exception(m.failure);

  StepResult result;
  const StageStep& last = steps[m.setup.schedule.RankOf(m.setup.schedule.virtual_stages() - 1)];
  double loss_sum = 0;
  for (double l : last.losses) loss_sum += l;
  result.loss = loss_sum / static_cast<double>(m.setup.schedule.micro_batches);
  result.grad_norm = steps[0].grad_norm;
  for (int r = 0; r < P; ++r) {
    const StageStep& s = steps[r];
    StageReport& rep = m.reports[r];
    rep.peak_allocated_bytes = std::max(rep.peak_allocated_bytes, s.peak_allocated_bytes);
    rep.peak_reserved_bytes = std::max(rep.peak_reserved_bytes, s.peak_reserved_bytes);
    rep.released_output_bytes = s.released_output_bytes;
    rep.inflight_peak = std::max(rep.inflight_peak, s.inflight_peak);
    for (size_t c = 0; c < s.inflight_peak_per_chunk.size(); ++c) {
      rep.inflight_peak_per_chunk[c] = std::max(rep.inflight_peak_per_chunk[c], s.inflight_peak_per_chunk[c]);
    }
    rep.busy_ms += static_cast<double>(s.busy_ns) / 1e6;
    rep.idle_ms += static_cast<double>(s.wall_ns - s.busy_ns) / 1e6;
    result.peak_allocated_bytes = std::max(result.peak_allocated_bytes, s.peak_allocated_bytes);
    result.peak_reserved_bytes = std::max(result.peak_reserved_bytes, s.peak_reserved_bytes);
  }
  if (trace) m.WriteTrace(steps);
  return result;
}

void PipelineEngine::Impl::WriteTrace(const std::vector<StageStep>& steps) const {
  int64_t t0 = std::numeric_limits<int64_t>::max();
  for (const StageStep& s : steps) {
    for (const TraceSpan& span : s.spans) t0 = std::min(t0, span.begin_ns);
    for (const MemorySample& sample : s.memory) t0 = std::min(t0, sample.time_ns);
  }
  auto us = [&](int64_t ns) { return static_cast<double>(ns - t0) / 1e3; };
  ChromeTrace trace;
  const int V = setup.schedule.chunks;
  for (size_t r = 0; r < steps.size(); ++r) {
    const int pid = static_cast<int>(r) + 1;
    trace.NameProcess(pid, fmt::format("stage {}", r));
    trace.NameThread(pid, 0, "compute");
    trace.NameThread(pid, 1, "communication");
    for (const TraceSpan& span : steps[r].spans) {
      const bool compute = span.name == "F" || span.name == "B" || span.name == "W" || span.name == "OPT";
      const std::string label = span.name == "OPT" || span.name == "ALLREDUCE"
                                    ? span.name
                                    : (V > 1 ? fmt::format("{}{}.{}", span.name, span.chunk, span.micro_batch)
                                             : fmt::format("{}{}", span.name, span.micro_batch));
      trace.AddSpan(pid, compute ? 0 : 1, label, compute ? "compute" : "comm", us(span.begin_ns),
                    static_cast<double>(span.end_ns - span.begin_ns) / 1e3,
                    {{"chunk", span.chunk}, {"micro_batch", span.micro_batch}});
    }
    for (const MemorySample& sample : steps[r].memory) {
      trace.AddCounter(pid, "allocated bytes", "bytes", us(sample.time_ns), static_cast<double>(sample.allocated_bytes));
    }
  }
  trace.Write(options.trace_path);
}

std::map<std::string, Tensor> PipelineEngine::State() const {
  std::map<std::string, Tensor> out;
  for (const auto& rank : impl_->ranks) out.merge(rank->State());
  return out;
}

nlohmann::json PipelineEngine::Summary() const {
  const Impl& m = *impl_;
  nlohmann::json stages = nlohmann::json::array();
  for (const StageReport& r : m.reports) {
    stages.push_back({{"stage", r.stage}, {"peak_allocated_bytes", r.peak_allocated_bytes},
                      {"peak_reserved_bytes", r.peak_reserved_bytes}, {"released_output_bytes", r.released_output_bytes},
                      {"output_bytes", r.output_bytes}, {"inflight_peak", r.inflight_peak},
                      {"inflight_peak_per_chunk", r.inflight_peak_per_chunk},
                      {"theoretical_inflight", r.theoretical_inflight}, {"busy_ms", r.busy_ms}, {"idle_ms", r.idle_ms},
                      {"bubble", r.bubble()}});
  }
  return {{"stages", stages},
          {"pipeline", {{"schedule", std::string(ScheduleKindName(m.options.schedule))},
                        {"stages", m.options.stages},
                        {"chunks", m.setup.schedule.chunks},
                        {"micro_batches", m.setup.schedule.micro_batches},
                        {"layout", FormatLayout(m.partition)},
                        {"release_outputs", m.options.release_outputs}}}};
}

const std::vector<StageReport>& PipelineEngine::reports() const { return impl_->reports; }
const Schedule& PipelineEngine::schedule() const { return impl_->setup.schedule; }
const GptPartition& PipelineEngine::partition() const { return impl_->partition; }

EngineFactory PipelineEngineFactory(PipelineOptions options) {
  return [options](const EngineContext& ctx) -> std::unique_ptr<StepEngine> {
    return std::make_unique<PipelineEngine>(ctx, options);
  };
}

}  // namespace sluice::pipeline
