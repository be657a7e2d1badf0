// `sluice run PROGRAM`: loads a program in the text format, binds its inputs and parameters
// (from --inputs, otherwise random from --seed: exec/random_inputs.h), runs it --runs times with
// the chosen run mode and GC mode, and reports wall time and memory against the liveness bound —
// as a readable summary, or with --stats-json as one JSON object on stdout. --trace writes the
// last run as a Chrome trace (open it in ui.perfetto.dev).
//
// Memory figures are those of an allocator private to the executable (caching by default,
// --allocator system for mmap per large tensor), so they count only what the program allocates:
// inputs and parameters live elsewhere. In trace mode with --gc sync, peak_allocated_bytes equals
// liveness_lower_bound_bytes.
//
// Example:
//   sluice run examples/mlp.sluice --gc async --runs 100 --stats-json
//   sluice run model.sluice --inputs batch.safetensors --trace run.json --verbose
#include <charconv>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <system_error>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "sluice/cli/commands.h"
#include "sluice/cli/file_checks.h"
#include "sluice/cli/train_options.h"
#include "sluice/core/caching_allocator.h"
#include "sluice/core/error.h"
#include "sluice/core/files.h"
#include "sluice/core/fnv1a.h"
#include "sluice/core/system_allocator.h"
#include "sluice/core/system_memory.h"
#include "sluice/exec/interpreter.h"
#include "sluice/exec/random_inputs.h"
#include "sluice/exec/reference_runner.h"
#include "sluice/io/chrome_trace.h"
#include "sluice/io/safetensors.h"
#include "sluice/ir/text_format.h"

namespace sluice::cli {

namespace {

struct RunArgs {
  std::string program;
  std::vector<std::string> sizes;  // --size NAME=VALUE: the program's size names (B, T)
  std::string gc = "auto";
  std::string mode = "trace";
  std::string order = "best";
  std::string memory_plan = "dynamic";
  bool in_place = true;
  std::string allocator = "caching";
  int runs = 1;
  uint64_t seed = 0;
  int threads = 0;
  std::string inputs;
  std::string trace;
  bool stats_json = false;
  bool verbose = false;
  bool no_memory_check = false;
  int64_t async_max_pending_mib = 1024;
  int64_t async_queue_batches = 1024;
  int64_t async_min_batch_kib = 64;
};

// FNV-1a over a tensor's bytes: equal digests mean bitwise-equal outputs across modes.
std::string Digest(const Tensor& t) {
  const Tensor c = t.Contiguous();
  Fnv1a h(1469598103934665603ull);  // the basis of the digests printed so far
  h.Add(c.raw_data(), c.nbytes());
  return fmt::format("{:016x}", h.value());
}

// Binds the tensors of a safetensors file to the program's inputs and parameters by name.
void BindFile(const Program& program, const std::string& path, Scope& scope) {
  SafetensorsFile file = ReadSafetensors(path);
  for (auto& [name, tensor] : file.tensors) {
    std::optional<ValueId> v = program.Find(name);
    if (!v || program.value(*v).kind == ValueKind::kIntermediate) {
      throw InvalidArgument(
          fmt::format("{}: tensor '{}' is not an input or parameter of program '{}'", path, name,
                      program.name()));
    }
    try {
      CheckBinding(program, *v, tensor);
    } catch (const ProgramError& e) {
      throw InvalidArgument(fmt::format("{}: {}", path, e.what()));
    }
    scope.Set(name, std::move(tensor));
  }
}

std::unique_ptr<Allocator> MakeAllocator(const std::string& kind) {
  if (kind == "system") return std::make_unique<SystemAllocator>();
  return std::make_unique<CachingAllocator>();
}

nlohmann::json OutputsJson(const Program& program, const Scope& scope) {
  nlohmann::json outputs = nlohmann::json::object();
  for (ValueId v : program.outputs()) {
    const std::string& name = program.value(v).name;
    const Tensor& t = scope.Get(name);
    nlohmann::json first = nlohmann::json::array();
    if (t.dtype() != DType::kBF16 && t.dtype() != DType::kF16) {
      for (int64_t i = 0; i < std::min<int64_t>(t.numel(), 8); ++i) first.push_back(t.FlatAt(i));
    }
    outputs[name] = {{"type", program.type(v).ToString()}, {"fnv1a", Digest(t)}, {"first", first}};
  }
  return outputs;
}

std::string Duration(int64_t ns) {
  if (ns < 10'000) return fmt::format("{} ns", ns);
  if (ns < 10'000'000) return fmt::format("{:.1f} µs", static_cast<double>(ns) / 1e3);
  return fmt::format("{:.2f} ms", static_cast<double>(ns) / 1e6);
}

// --size B=8 --size T=64 → {B: 8, T: 64}.
SizeBindings ParseSizes(const std::vector<std::string>& texts) {
  SizeBindings sizes;
  for (const std::string& text : texts) {
    const size_t eq = text.find('=');
    int64_t value = 0;
    const char* end = text.data() + text.size();
    std::from_chars_result parsed{};
    if (eq != std::string::npos) parsed = std::from_chars(text.data() + eq + 1, end, value);
    // ec: a number past int64 leaves `value` 0 (it ran the program at that size).
    const bool number = eq != std::string::npos && parsed.ptr == end && parsed.ec == std::errc() &&
                        eq + 1 < text.size();
    if (eq == 0 || !number || value < 0) {
      throw InvalidArgument(
          fmt::format("--size '{}': expected NAME=VALUE with a non-negative integer, e.g. --size "
                      "B=8{}",
                      text,
                      parsed.ec == std::errc::result_out_of_range
                          ? fmt::format(" (at most {})", std::numeric_limits<int64_t>::max())
                          : ""));
    }
    if (!sizes.emplace(text.substr(0, eq), value).second) {
      throw InvalidArgument(fmt::format("--size {} is given twice", text.substr(0, eq)));
    }
  }
  return sizes;
}

// A --size the program never names would be silently ignored (`--size Q=3` ran as without it):
// refuse it, naming the sizes the program has.
void CheckSizesNamed(const SizeBindings& sizes, const std::set<std::string>& named,
                     const std::string& program_file) {
  for (const auto& [name, value] : sizes) {
    if (named.contains(name)) continue;
    throw InvalidArgument(fmt::format(
        "--size {}={}: {} names no size {} ({}); drop the option or give one the program names",
        name, value, program_file, name,
        named.empty() ? std::string("it names no sizes")
                      : fmt::format("its sizes: {}", fmt::join(named, ", "))));
  }
}

// Before any input is made: a program whose inputs and parameters with the liveness bound of its
// order (the peak of what it allocates) exceed the memory left is refused — it was attempted, and
// failed in the allocator or ran the machine out of memory filling its inputs.
void CheckRunFits(const Program& program, const std::string& path, const ExecutionPlan& plan) {
  int64_t bound = 0;  // the caller's values, then the bound (both below 2^40 elements each)
  for (const std::vector<ValueId>* values : {&program.inputs(), &program.params()}) {
    for (ValueId v : *values) {
      const TensorType& t = program.type(program.value(v).type_id);
      bound += t.shape.numel() * static_cast<int64_t>(SizeOf(t.dtype));
    }
  }
  const int64_t inputs = bound;
  bound += plan.liveness_bound;
  if (const std::string room = MemoryShortfall(ReadSystemMemory(), bound); !room.empty()) {
    throw ResourceError(fmt::format(
        "{} needs at least {} of tensor memory ({} of inputs and parameters, {} at the peak of "
        "its order), and {}: bind smaller sizes (--size) or pass --no-memory-check to try anyway",
        path, FormatBytes(bound), FormatBytes(inputs), FormatBytes(plan.liveness_bound), room));
  }
}

int Run(const RunArgs& args) {
  CheckRunFiles(args.program, args.inputs, args.trace);
  const SizeBindings sizes = ParseSizes(args.sizes);
  ProgramAnnotations annotations;
  const Program program =
      ParseProgram(ReadWholeFile("program file", args.program), args.program, sizes, &annotations);
  CheckSizesNamed(sizes, annotations.sizes, args.program);

  // The allocator outlives the scope, which ends up holding outputs allocated from it.
  std::unique_ptr<Allocator> allocator = MakeAllocator(args.allocator);
  ExecutableOptions options{
      .allocator = allocator.get(),
      .mode = *ParseRunMode(args.mode),
      .gc = *ParseGcMode(args.gc),
      .threads = args.threads,
      .order = *ParseOrderPolicy(args.order),
      .memory_plan = *ParseMemoryPlanMode(args.memory_plan),
      .in_place = args.in_place,
      .async = {.queue_batches = static_cast<size_t>(args.async_queue_batches),
                .max_pending_bytes = args.async_max_pending_mib << 20,
                .min_batch_bytes = args.async_min_batch_kib << 10},
      .verbose = args.verbose};
  Executable exe(program, options);
  if (!args.no_memory_check) CheckRunFits(program, args.program, exe.plan());
  Scope scope;  // inputs and parameters come from the default allocator, not the measured one
  if (!args.inputs.empty()) BindFile(program, args.inputs, scope);
  BindRandomInputs(program, args.seed, scope);

  std::vector<RunStats> stats;
  RunTrace trace;
  for (int r = 0; r < args.runs; ++r) {
    const bool last = r + 1 == args.runs;
    stats.push_back(exe.Run(scope, last && !args.trace.empty() ? &trace : nullptr));
  }
  const RunSummary s = Summarize(stats);
  const ExecutionPlan& plan = exe.plan();
  const std::string gc = DescribeGcMode(options.gc, exe.gc_mode());  // "auto (sync)"

  if (!args.trace.empty()) {
    ChromeTrace chrome;
    AddRunTrace(chrome, trace, program);
    chrome.Write(args.trace);
  }

  if (args.stats_json) {
    nlohmann::json j = {
        {"program", program.name()},
        {"instructions", s.instructions},
        {"runs", s.runs},
        {"gc_mode", gc},
        {"run_mode", args.mode},
        {"threads", exe.num_executors()},
        {"order", Name(plan.chosen)},
        {"memory_plan", args.memory_plan},
        {"arena_bytes", exe.arena().arena_bytes},
        {"in_place_outputs", plan.num_in_place},
        {"in_place_bytes", plan.in_place_bytes},
        {"allocator", args.allocator},
        {"wall_ns_median", s.wall_ns_median},
        {"wall_ns_min", s.wall_ns_min},
        {"ns_per_instruction_median", s.instructions > 0 ? static_cast<double>(s.wall_ns_median) /
                                                               static_cast<double>(s.instructions)
                                                         : 0.0},
        {"peak_allocated_bytes", s.peak_allocated_bytes},
        {"peak_reserved_bytes", s.peak_reserved_bytes},
        {"liveness_lower_bound_bytes", s.liveness_lower_bound_bytes},
        {"program_order_bound_bytes", plan.program_order_bound},
        {"gc_thread_ns_per_run", s.gc_thread_ns_per_run},
        {"frees_per_run", s.frees_per_run},
        {"sync_fallbacks_per_run", s.sync_fallbacks_per_run},
        {"drain_wait_ns_per_run", s.drain_wait_ns_per_run},
        {"async_pending_peak_bytes", s.async_pending_peak_bytes},
        {"outputs", OutputsJson(program, scope)},
    };
    PrintToStdout("{}\n", j.dump());
    return 0;
  }

  PrintToStdout(
      "program '{}' ({}): {} instructions; run mode {}, gc {}, order {}, {} executor thread(s)\n",
      program.name(), args.program, s.instructions, args.mode, gc, Name(plan.chosen),
      exe.num_executors());
  PrintToStdout("time:   {} runs, wall median {} (min {}), {:.1f} ns per instruction\n", s.runs,
                Duration(s.wall_ns_median), Duration(s.wall_ns_min),
                s.instructions > 0
                    ? static_cast<double>(s.wall_ns_median) / static_cast<double>(s.instructions)
                    : 0.0);
  PrintToStdout(
      "memory: peak allocated {}, peak reserved {} ({} allocator); liveness lower bound {}",
      FormatBytes(s.peak_allocated_bytes), FormatBytes(s.peak_reserved_bytes), args.allocator,
      FormatBytes(s.liveness_lower_bound_bytes));
  if (s.liveness_lower_bound_bytes > 0) {
    PrintToStdout(" (peak / bound = {:.3f})",
                  static_cast<double>(s.peak_allocated_bytes) /
                      static_cast<double>(s.liveness_lower_bound_bytes));
  }
  if (options.memory_plan == MemoryPlanMode::kStatic) {
    PrintToStdout("\nplan:   static, {}", exe.arena().Describe());
  }
  PrintToStdout("\ngc:     {} frees per run, {} on executing threads per run", s.frees_per_run,
                Duration(s.gc_thread_ns_per_run));
  if (exe.gc_mode() == GcMode::kAsync) {
    PrintToStdout(", {} sync fallbacks, async pending peak {}, drain wait {}",
                  s.sync_fallbacks_per_run, FormatBytes(s.async_pending_peak_bytes),
                  Duration(s.drain_wait_ns_per_run));
  }
  PrintToStdout("\n");
  for (ValueId v : program.outputs()) {
    PrintToStdout("output %{} = {}\n", program.value(v).name,
                  scope.Get(program.value(v).name).ToString(8));
  }
  if (!args.trace.empty()) PrintToStdout("trace:  {} (open in ui.perfetto.dev)\n", args.trace);
  return 0;
}

}  // namespace

CommandRunner SetupRunCommand(CLI::App& sub) {
  auto args = std::make_shared<RunArgs>();
  sub.add_option("program", args->program, "Program file in the text format (.sluice)")->required();
  sub.add_option("--size", args->sizes,
                 "A size the program names, NAME=VALUE (a training program's B and T: --size B=8 "
                 "--size T=64)");
  sub.add_option("--gc", args->gc,
                 "When dead buffers are freed: auto (sync, async where a free is expensive: the "
                 "system allocator), none (at the end), sync, async (worker)")
      ->check(OneOf(kGcModeNames))
      ->capture_default_str();
  sub.add_option("--mode", args->mode,
                 "trace (one thread, planned order) or parallel (thread pool)")
      ->check(OneOf(kRunModeNames))
      ->capture_default_str();
  sub.add_option("--order", args->order,
                 "Trace order: program, greedy (memory-aware) or best of both")
      ->check(OneOf(kOrderPolicyNames))
      ->capture_default_str();
  sub.add_option("--memory-plan", args->memory_plan,
                 "Intermediates: dynamic (allocated and freed one by one) or static (one arena "
                 "per run at planned offsets; trace mode)")
      ->check(OneOf(kMemoryPlanModeNames))
      ->capture_default_str();
  sub.add_flag("--in-place,!--no-in-place", args->in_place,
               "Write elementwise outputs into the storage of inputs dying at their instruction")
      ->capture_default_str();
  sub.add_option("--allocator", args->allocator,
                 "Allocator for the program's buffers: caching or system")
      ->check(CLI::IsMember({"caching", "system"}))
      ->capture_default_str();
  sub.add_option("--runs", args->runs, "Number of runs (statistics are medians / maxima)")
      ->check(CLI::Range(1, 1'000'000))
      ->capture_default_str();
  sub.add_option("--seed", args->seed, "Seed for inputs not given by --inputs")
      ->check(Seed())
      ->capture_default_str();
  sub.add_option("--threads", args->threads,
                 "Threads of a parallel run, the caller included (0: one per core)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  sub.add_option("--inputs", args->inputs,
                 "Safetensors file with values for inputs and parameters (by name)")
      ->check(CLI::ExistingFile);
  sub.add_option("--trace", args->trace, "Write the last run as a Chrome trace (JSON) to this file")
      ->check(NonEmptyPath());
  sub.add_option(
         "--async-max-pending-mib", args->async_max_pending_mib,
         "Async GC: MiB handed to the worker and not yet freed before the executor frees itself")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30))
      ->capture_default_str();
  sub.add_option("--async-queue-batches", args->async_queue_batches,
                 "Async GC: queue capacity in batches")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 24))
      ->capture_default_str();
  sub.add_option(
         "--async-min-batch-kib", args->async_min_batch_kib,
         "Async GC: free batches smaller than this on the executing thread (0: hand over all)")
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 30))
      ->capture_default_str();
  sub.add_flag("--stats-json", args->stats_json,
               "Print one JSON object with the statistics on stdout");
  sub.add_flag("--verbose,-v", args->verbose,
               "Print the plan (order, free lists, live bytes) to stderr");
  sub.add_flag("--no-memory-check", args->no_memory_check,
               "run even when the program's inputs, parameters and liveness bound exceed the "
               "memory available");
  return [args] { return Run(*args); };
}

}  // namespace sluice::cli
