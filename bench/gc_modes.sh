#!/usr/bin/env bash
# GC modes side by side (issue 12): --gc sync, --gc async and the default (no --gc: auto) on the
# pipeline job of the issue — GPT L=4 H=4 C=128 T=64, batch 16 in 8 micro-batches, AdamW, 1f1b,
# --threads 1, tinyshakespeare — at P = 4 and P = 2 stages, and on the default single-stage job
# (sort task, 200 steps; "1" with the default threads, one per core, and "1t1" with --threads 1).
# Per mode: each stage's peak allocated and reserved bytes (the largest over the repetitions);
# tokens/s (each run's tokens / wall: the median and the best over repetitions —
# on a shared machine the best run is the one least disturbed by other processes; the JSON adds
# the median step's); and CPU seconds, which load disturbs less than wall time: the process's
# (user + system, GC worker included; median) and, on a pipeline, the stages' computes' own
# (busy_cpu_ms summed over stages; median). Modes alternate within each repetition, so that they
# share the machine's load; the load average is printed before and after.
# Prints a table, then one JSON object per job and mode (a line starting with '{').
# Usage: bench/gc_modes.sh [BUILD_DIR] [STEPS] [REPS]   (default build, 40, 5)
#        DATA=path overrides the text (default ../shared/data/tinyshakespeare.txt; absent: the sort
#        task with the same GPT).
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${2:-40}
reps=${3:-5}
data=${DATA:-../shared/data/tinyshakespeare.txt}
[[ -f "$data" ]] || data=sort
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
modes=(sync async auto)
declare -A gc_flags=([sync]="--gc sync" [async]="--gc async" [auto]="")  # auto: the default
pipe=(--data "$data" --layers 4 --heads 4 --dim 128 --seq 64 --batch 16 --microbatches 8 --threads 1
      --schedule 1f1b --steps "$steps" --eval-every 0 --quiet)
single=(--steps 200 --eval-every 0 --quiet)
# run NAME ARGS...: one training run; metrics in NAME.jsonl, process CPU seconds in NAME.cpu.
run() {
  local name=$1
  shift
  /usr/bin/time -f "%U %S" -o "$dir/$name.cpu" "$build/sluice" train "$@" --metrics "$dir/$name.jsonl"
}

echo "machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "binary: $build/sluice; pipeline data: $data, $steps steps; $reps repetitions"
for ((r = 0; r < reps; r++)); do
  for p in 4 2; do
    for gc in "${modes[@]}"; do
      run "p$p-$gc-$r" "${pipe[@]}" --stages "$p" ${gc_flags[$gc]}
    done
  done
  for gc in "${modes[@]}"; do
    run "p1-$gc-$r" "${single[@]}" ${gc_flags[$gc]}
    run "p1t1-$gc-$r" "${single[@]}" --threads 1 ${gc_flags[$gc]}
  done
done
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"

python3 - "$dir" "$reps" "${modes[@]}" <<'PY'
import json, statistics, sys
dir, reps, modes = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def lines(path): return [json.loads(line) for line in open(path)]
def summary(path): return next(j for j in lines(path) if j.get("summary"))
def cpu_s(path): return sum(float(x) for x in open(path).read().split())
def step_rates(path): return [j["tokens_per_s"] for j in lines(path) if "step" in j and "loss" in j][1:]
rows = []
for p in ("4", "2", "1", "1t1"):
    for gc in modes:
        runs = [summary(f"{dir}/p{p}-{gc}-{r}.jsonl") for r in range(reps)]
        stages = [s.get("stages", [s]) for s in runs]  # one stage: the summary's own peaks
        n = len(stages[0])
        rows.append({"job": p, "gc": gc, "resolved": runs[0]["gc"],
                     "tokens_per_s": statistics.median(s["tokens_per_s"] for s in runs),
                     "tokens_per_s_best": max(s["tokens_per_s"] for s in runs),
                     "tokens_per_s_runs": [round(s["tokens_per_s"]) for s in runs],
                     "cpu_s": statistics.median(cpu_s(f"{dir}/p{p}-{gc}-{r}.cpu") for r in range(reps)),
                     "compute_cpu_ms": statistics.median(sum(st.get("busy_cpu_ms", 0) for st in s) for s in stages),
                     "step_tokens_per_s_median": statistics.median(
                         t for r in range(reps) for t in step_rates(f"{dir}/p{p}-{gc}-{r}.jsonl")),
                     "peak_allocated_bytes": [max(st[k]["peak_allocated_bytes"] for st in stages) for k in range(n)],
                     "peak_reserved_bytes": [max(st[k]["peak_reserved_bytes"] for st in stages) for k in range(n)]})
mb = lambda b: f"{b / 1e6:.2f}"
print(f"{'job':<4} {'--gc':<6} {'resolved':<12} {'tok/s median':>12} {'vs sync':>7} {'best':>7} {'vs sync':>7} "
      f"{'CPU s':>6} {'computes':>8}  peak allocated MB per stage (vs sync)   peak reserved MB")
for row in rows:
    sync = next(r for r in rows if r["job"] == row["job"] and r["gc"] == "sync")
    alloc = " ".join(f"{mb(a)} ({a / s:.2f})" for a, s in zip(row["peak_allocated_bytes"], sync["peak_allocated_bytes"]))
    res = " ".join(mb(b) for b in row["peak_reserved_bytes"])
    best, sync_best = row["tokens_per_s_best"], sync["tokens_per_s_best"]
    print(f"{row['job']:<4} {row['gc']:<6} {row['resolved']:<12} {row['tokens_per_s']:12.0f} "
          f"{row['tokens_per_s'] / sync['tokens_per_s']:7.2f} {best:7.0f} {best / sync_best:7.2f} "
          f"{row['cpu_s']:6.2f} {row['compute_cpu_ms'] / 1e3:8.2f}  {alloc}   {res}")
for row in rows: print(json.dumps(row))
PY
