#include "sluice/schedule/step_costs.h"

#include <algorithm>
#include <fstream>

#include <fmt/format.h>

#include "sluice/core/files.h"
#include "sluice/core/json_text.h"

namespace sluice::pipeline {

namespace {

constexpr const char* kFormat = "sluice-step-costs/1";

}  // namespace

StepCosts UnitCosts(const Schedule& schedule) {
  StepCosts c;
  c.stages = schedule.stages;
  c.chunks = schedule.chunks;
  c.split_backward = true;
  c.ranks.assign(schedule.stages, RankCosts{});
  // A chunk holds 1/V of the stage's layers: its F, B and W cost 1/V.
  const double unit = 1.0 / schedule.chunks;
  for (RankCosts& r : c.ranks) {
    r.chunks.assign(schedule.chunks, ChunkCosts{.forward_ms = unit,
                                                .backward_ms = unit,
                                                .weight_ms = unit,
                                                .forward_cpu_ms = unit,
                                                .backward_cpu_ms = unit,
                                                .weight_cpu_ms = unit});
  }
  return c;
}

void CheckCostsCover(const StepCosts& costs, const Schedule& schedule) {
  if (costs.stages != schedule.stages) {
    throw InvalidArgument(fmt::format(
        "{}: measured on {} stages, but {} has {}: profile a run with --stages {}", costs.source,
        costs.stages, schedule.Describe(), schedule.stages, schedule.stages));
  }
  if (costs.chunks != schedule.chunks) {
    throw InvalidArgument(fmt::format(
        "{}: measured with {} chunk(s) per stage, but {} runs {}: profile a run of a schedule "
        "with {} chunk(s) per stage",
        costs.source, costs.chunks, schedule.Describe(), schedule.chunks, schedule.chunks));
  }
  if (schedule.split_backward && !costs.split_backward) {
    throw InvalidArgument(fmt::format(
        "{}: measured with the backward whole, but {} splits it into B and W: profile a run of "
        "a split-backward schedule (zb-h1) to cover it",
        costs.source, schedule.Describe()));
  }
}

void CheckCostsJob(const StepCosts& costs, const nlohmann::json& job) {
  // A file that does not say what it measured would be taken for any job: what identifies this
  // job (the model, its sizes, the layout) must all be there.
  for (const auto& [key, value] : job.items()) {
    if (costs.job.is_object() && costs.job.contains(key)) continue;
    throw InvalidArgument(fmt::format(
        "{}: {} says nothing of \"{}\", so it could have been measured on any job; a costs file "
        "of sluice train --profile-out records its job (profile this one with sluice train ... "
        "--profile-out)",
        costs.source,
        costs.job.is_object() && !costs.job.empty() ? "its \"job\"" : "it has no \"job\": it",
        key));
  }
  for (const auto& [key, value] : costs.job.items()) {
    if (!job.contains(key)) continue;
    if (job[key] != value) {
      throw InvalidArgument(
          fmt::format("{}: measured on another job: {} is {} there, {} here (profile this job "
                      "with sluice train ... --profile-out)",
                      costs.source, key, value.dump(), job[key].dump()));
    }
  }
}

nlohmann::ordered_json CostsToJson(const StepCosts& c) {
  nlohmann::ordered_json j;
  j["format"] = kFormat;
  j["job"] = c.job;
  j["stages"] = c.stages;
  j["chunks"] = c.chunks;
  j["split_backward"] = c.split_backward;
  nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
  for (size_t r = 0; r < c.ranks.size(); ++r) {
    nlohmann::ordered_json chunks = nlohmann::ordered_json::array();
    for (const ChunkCosts& ch : c.ranks[r].chunks) {
      chunks.push_back({{"forward_ms", ch.forward_ms},
                        {"backward_ms", ch.backward_ms},
                        {"weight_ms", ch.weight_ms},
                        {"forward_cpu_ms", ch.forward_cpu_ms},
                        {"backward_cpu_ms", ch.backward_cpu_ms},
                        {"weight_cpu_ms", ch.weight_cpu_ms}});
    }
    ranks.push_back({{"stage", r},
                     {"chunks", chunks},
                     {"optimizer_ms", c.ranks[r].optimizer_ms},
                     {"update_ms", c.ranks[r].update_ms},
                     {"overhead_ms", c.ranks[r].overhead_ms}});
    // Only where measured (replicas under MPI): files of other runs stay as they were.
    if (c.ranks[r].data_allreduce_ms > 0)
      ranks.back()["data_allreduce_ms"] = c.ranks[r].data_allreduce_ms;
  }
  j["ranks"] = ranks;
  j["messages"] = {{"bytes", c.message_bytes},
                   {"post_ms", c.post_ms},
                   {"copy_ms", c.copy_ms},
                   {"copy_ms_per_byte",
                    c.message_bytes > 0 ? c.copy_ms / static_cast<double>(c.message_bytes) : 0.0},
                   {"wake_ms", c.wake_ms}};
  if (c.transit_latency_ms > 0 || c.transit_ms_per_byte > 0) {  // under MPI only
    j["messages"]["transit_latency_ms"] = c.transit_latency_ms;
    j["messages"]["transit_ms_per_byte"] = c.transit_ms_per_byte;
    j["messages"]["transit_ms"] = TransitMs(c);
  }
  j["allreduce_ms"] = c.allreduce_ms;
  j["step_overhead_ms"] = c.step_overhead_ms;
  j["measured"] = c.measured;
  if (!c.recorded.empty()) {
    nlohmann::ordered_json steps = nlohmann::ordered_json::array();
    for (const RecordedStep& step : c.recorded) {
      nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
      for (const RecordedStep::Rank& rank : step.ranks) {
        nlohmann::ordered_json chunks = nlohmann::ordered_json::array();
        for (const RecordedStep::Chunk& ch : rank.chunks) {
          chunks.push_back({{"forward_ms", ch.forward_ms},
                            {"backward_ms", ch.backward_ms},
                            {"weight_ms", ch.weight_ms}});
        }
        ranks.push_back({{"chunks", chunks},
                         {"optimizer_ms", rank.optimizer_ms},
                         {"update_ms", rank.update_ms}});
        if (rank.core_wait_ms >= 0) ranks.back()["core_wait_ms"] = rank.core_wait_ms;
      }
      steps.push_back({{"step_ms", step.step_ms},
                       {"span_ms", step.span_ms},
                       {"stage_bubble", step.stage_bubble},
                       {"ranks", ranks}});
    }
    j["steps"] = steps;
  }
  return j;
}

StepCosts CostsFromJson(const nlohmann::json& j, const std::string& source) {
  auto bad = [&](const std::string& where, const std::string& what) {
    return InvalidArgument(fmt::format("{}: {} {}", source, where, what));
  };
  if (!j.is_object()) throw bad("the file", "is not a JSON object (a costs file of --profile-out)");
  if (!j.contains("format") || !j["format"].is_string() ||
      j["format"].get_ref<const std::string&>() != kFormat) {
    throw bad("\"format\"", fmt::format("must be \"{}\" (a file written by sluice train "
                                        "--profile-out)",
                                        kFormat));
  }
  // A cost `v`, named `what` ("\"forward_ms\"", "\"forward_ms\"[3]") in `where`.
  auto cost = [&](const nlohmann::json& v, const std::string& what, const std::string& where) {
    if (!v.is_number()) throw bad(where, fmt::format("{} is not a number", what));
    const double d = v.get<double>();
    // Bounded so that the replay's sums of millions of them stay finite.
    if (!(d >= 0 && d <= kMaxCostMs)) {
      throw bad(where, fmt::format("{} is {}: it must be a number from 0 to {:g}", what, v.dump(),
                                   kMaxCostMs));
    }
    return d;
  };
  auto number = [&](const nlohmann::json& obj, const char* key, const std::string& where) {
    if (!obj.contains(key)) throw bad(where, fmt::format("has no \"{}\"", key));
    return cost(obj[key], fmt::format("\"{}\"", key), where);
  };
  // Entries a file written before they were measured lacks: absent, they cost nothing.
  auto optional = [&](const nlohmann::json& obj, const char* key, const std::string& where) {
    return obj.contains(key) ? number(obj, key, where) : 0.0;
  };
  auto integer = [&](const nlohmann::json& obj, const char* key, const std::string& where,
                     int64_t least, int64_t most) {
    if (!obj.contains(key)) throw bad(where, fmt::format("has no \"{}\"", key));
    const nlohmann::json& v = obj[key];
    if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(most)) ||
        v.get<int64_t>() < least || v.get<int64_t>() > most) {
      throw bad(where, fmt::format("\"{}\" is {}: it must be an integer from {} to {}", key,
                                   v.dump(), least, most));
    }
    return v.get<int64_t>();
  };
  // obj[key], which must be an array of `n` entries ("what" says of what, in the message).
  auto entries = [&](const nlohmann::json& obj, const char* key, size_t n, const std::string& where,
                     const std::string& what) -> const nlohmann::json& {
    if (!obj.contains(key) || !obj[key].is_array() || obj[key].size() != n) {
      throw bad(where, fmt::format("must have \"{}\": {}", key, what));
    }
    return obj[key];
  };
  StepCosts c;
  c.source = source;
  c.stages = static_cast<int>(integer(j, "stages", "the file", 1, kMaxStages));
  c.chunks = static_cast<int>(integer(j, "chunks", "the file", 1, kMaxChunks));
  if (!j.contains("split_backward") || !j["split_backward"].is_boolean()) {
    throw bad("the file", "has no boolean \"split_backward\"");
  }
  c.split_backward = j["split_backward"].get<bool>();
  if (j.contains("job")) {
    if (!j["job"].is_object()) throw bad("\"job\"", "is not an object");
    c.job = j["job"];
  }
  if (!j.contains("ranks") || !j["ranks"].is_array() ||
      j["ranks"].size() != static_cast<size_t>(c.stages)) {
    throw bad("\"ranks\"", fmt::format("must be an array of one entry per stage ({})", c.stages));
  }
  for (int r = 0; r < c.stages; ++r) {
    const nlohmann::json& rank = j["ranks"][r];
    const std::string where = fmt::format("stage {}", r);
    if (!rank.is_object()) throw bad(where, "is not an object");
    // The entries are in stage order; a "stage" that says otherwise was moved by hand.
    if (rank.contains("stage") && !(rank["stage"].is_number_integer() && rank["stage"] == r)) {
      throw bad(fmt::format("\"ranks\"[{}]", r),
                fmt::format("says \"stage\": {}: the entries must be in stage order, 0 to {}",
                            rank["stage"].dump(), c.stages - 1));
    }
    RankCosts rc;
    rc.optimizer_ms = number(rank, "optimizer_ms", where);
    rc.update_ms = number(rank, "update_ms", where);
    rc.overhead_ms = optional(rank, "overhead_ms", where);
    rc.data_allreduce_ms = optional(rank, "data_allreduce_ms", where);
    const nlohmann::json& chunks =
        entries(rank, "chunks", c.chunks, where, fmt::format("one entry per chunk ({})", c.chunks));
    for (int v = 0; v < c.chunks; ++v) {
      const nlohmann::json& ch = chunks[v];
      const std::string w = fmt::format("stage {} chunk {}", r, v);
      if (!ch.is_object()) throw bad(w, "is not an object");
      ChunkCosts cc;
      cc.forward_ms = number(ch, "forward_ms", w);
      cc.backward_ms = number(ch, "backward_ms", w);
      cc.weight_ms = number(ch, "weight_ms", w);
      // CPU times are optional (a hand-written file); absent, they are the wall times.
      for (auto [key, field, wall] :
           {std::tuple{"forward_cpu_ms", &cc.forward_cpu_ms, cc.forward_ms},
            {"backward_cpu_ms", &cc.backward_cpu_ms, cc.backward_ms},
            {"weight_cpu_ms", &cc.weight_cpu_ms, cc.weight_ms}}) {
        *field = ch.contains(key) ? number(ch, key, w) : wall;
      }
      rc.chunks.push_back(cc);
    }
    c.ranks.push_back(std::move(rc));
  }
  if (!j.contains("messages") || !j["messages"].is_object()) {
    throw bad("the file", "has no \"messages\" object");
  }
  c.message_bytes = integer(j["messages"], "bytes", "\"messages\"", 0, int64_t{1} << 53);
  c.post_ms = number(j["messages"], "post_ms", "\"messages\"");
  c.copy_ms = number(j["messages"], "copy_ms", "\"messages\"");
  c.wake_ms = optional(j["messages"], "wake_ms", "\"messages\"");
  c.transit_latency_ms = optional(j["messages"], "transit_latency_ms", "\"messages\"");
  c.transit_ms_per_byte = optional(j["messages"], "transit_ms_per_byte", "\"messages\"");
  c.allreduce_ms = optional(j, "allreduce_ms", "the file");
  c.step_overhead_ms = number(j, "step_overhead_ms", "the file");
  if (j.contains("measured")) {
    // The profiled run's own figures: only read to set beside a prediction, but read strictly.
    const nlohmann::json& m = j["measured"];
    const std::string where = "\"measured\"";
    if (!m.is_object()) throw bad(where, "is not an object");
    if (m.contains("step_ms")) cost(m["step_ms"], "\"step_ms\"", where);
    if (m.contains("schedule") && !m["schedule"].is_string()) {
      throw bad(where, "\"schedule\" is not a string");
    }
    const std::string per_stage = fmt::format("one number per stage ({})", c.stages);
    if (m.contains("stage_core_wait_ms")) {
      const nlohmann::json& w = entries(m, "stage_core_wait_ms", c.stages, where, per_stage);
      for (size_t r = 0; r < w.size(); ++r) {
        cost(w[r], fmt::format("\"stage_core_wait_ms\"[{}]", r), where);
      }
    }
    if (m.contains("stage_bubble")) {
      for (const nlohmann::json& x : entries(m, "stage_bubble", c.stages, where, per_stage)) {
        if (!x.is_number() || !(x.get<double>() >= 0 && x.get<double>() <= 1)) {
          throw bad(where, fmt::format("\"stage_bubble\" holds {}: a share from 0 to 1", x.dump()));
        }
      }
    }
    c.measured = m;
  }
  // The recorded steps: optional (a file written before they were recorded has none), and every
  // compute's array has the same length, M, on every rank, chunk and step.
  if (j.contains("steps")) {
    if (!j["steps"].is_array()) throw bad("\"steps\"", "is not an array");
    for (size_t k = 0; k < j["steps"].size(); ++k) {
      const nlohmann::json& step = j["steps"][k];
      const std::string where = fmt::format("steps[{}]", k);
      if (!step.is_object()) throw bad(where, "is not an object");
      RecordedStep rec;
      rec.step_ms = number(step, "step_ms", where);
      rec.span_ms = number(step, "span_ms", where);
      for (const nlohmann::json& b : entries(step, "stage_bubble", c.stages, where,
                                             fmt::format("one number per stage ({})", c.stages))) {
        if (!b.is_number()) throw bad(where, "\"stage_bubble\" holds something not a number");
        rec.stage_bubble.push_back(b.get<double>());
      }
      const nlohmann::json& ranks = entries(step, "ranks", c.stages, where,
                                            fmt::format("one entry per stage ({})", c.stages));
      for (int r = 0; r < c.stages; ++r) {
        const nlohmann::json& rank = ranks[r];
        const std::string at = fmt::format("{} stage {}", where, r);
        if (!rank.is_object()) throw bad(at, "is not an object");
        RecordedStep::Rank rr;
        rr.optimizer_ms = number(rank, "optimizer_ms", at);
        rr.update_ms = number(rank, "update_ms", at);
        if (rank.contains("core_wait_ms")) rr.core_wait_ms = number(rank, "core_wait_ms", at);
        const nlohmann::json& chunks = entries(rank, "chunks", c.chunks, at,
                                               fmt::format("one entry per chunk ({})", c.chunks));
        for (int v = 0; v < c.chunks; ++v) {
          const nlohmann::json& ch = chunks[v];
          const std::string w = fmt::format("{} chunk {}", at, v);
          if (!ch.is_object()) throw bad(w, "is not an object");
          RecordedStep::Chunk rc;
          for (auto [key, field] : {std::pair{"forward_ms", &rc.forward_ms},
                                    {"backward_ms", &rc.backward_ms},
                                    {"weight_ms", &rc.weight_ms}}) {
            if (!ch.contains(key) || !ch[key].is_array() || ch[key].empty()) {
              throw bad(w, fmt::format("has no \"{}\" array (one figure per micro-batch)", key));
            }
            if (c.micro_batches == 0) c.micro_batches = static_cast<int>(ch[key].size());
            if (ch[key].size() != static_cast<size_t>(c.micro_batches)) {
              throw bad(w, fmt::format("\"{}\" has {} entries, the first step's {}: every "
                                       "recorded step has one per micro-batch",
                                       key, ch[key].size(), c.micro_batches));
            }
            for (size_t m = 0; m < ch[key].size(); ++m) {
              field->push_back(cost(ch[key][m], fmt::format("\"{}\"[{}]", key, m), w));
            }
          }
          rr.chunks.push_back(std::move(rc));
        }
        rec.ranks.push_back(std::move(rr));
      }
      c.recorded.push_back(std::move(rec));
    }
  }
  return c;
}

double TransitMs(const StepCosts& costs) {
  return costs.transit_latency_ms +
         costs.transit_ms_per_byte * static_cast<double>(costs.message_bytes);
}

double CoreWaitShare(const StepCosts& costs) {
  const nlohmann::json& m = costs.measured;
  if (!m.is_object() || !m.contains("stage_core_wait_ms") || !m.contains("step_ms")) return -1;
  const nlohmann::json& waits = m["stage_core_wait_ms"];
  const nlohmann::json& step = m["step_ms"];
  if (!waits.is_array() || !step.is_number() || step.get<double>() <= 0) return -1;
  double share = -1;
  for (const nlohmann::json& w : waits) {
    if (!w.is_number()) return -1;
    share = std::max(share, w.get<double>() / step.get<double>());
  }
  return std::min(share, 1.0);  // a hand-edited file may claim a wait longer than the step
}

StepCosts ReadCostsFile(const std::string& path) {
  nlohmann::json j;
  try {
    j = ParseJsonText(ReadWholeFile("--costs file", path));
  } catch (const nlohmann::json::exception& e) {
    throw InvalidArgument(fmt::format("--costs {}: not valid JSON: {}", path, e.what()));
  }
  return CostsFromJson(j, path);
}

}  // namespace sluice::pipeline
