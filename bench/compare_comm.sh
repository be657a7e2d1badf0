#!/usr/bin/env bash
# In-process (stages as threads, LocalWorld) vs MPI (stages as processes, mpirun) on the same
# pipeline job, side by side: tokens/s, and the time each stage spends inside the communicator per
# step (posting, testing and waiting for messages — waits for a message not yet sent included —
# and the all-reduces), averaged over stages. Losses are compared too: they must be identical.
# Job: GPT on the sort task, 8 layers, C = 128, 4 heads, batch 64 in 8 micro-batches, 1f1b,
# one intra-op thread per stage.
# Usage: bench/compare_comm.sh [BUILD_DIR] [STEPS]   (default build, 30)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
steps=${2:-30}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader OMPI_MCA_btl_vader_single_copy_mechanism=none
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
job=(--layers 8 --dim 128 --heads 4 --batch 64 --microbatches 8 --schedule 1f1b --threads 1 --steps "$steps"
     --eval-every 0 --quiet)
printf "%-3s %-6s %12s %16s %10s %s\n" P comm "tok/s" "comm ms/step" "bubble" "losses"
for p in 2 4; do
  "$build/sluice" train "${job[@]}" --stages "$p" --metrics "$dir/local.jsonl"
  mpiexec -n "$p" "$build/sluice" train --comm mpi "${job[@]}" --stages "$p" --metrics "$dir/mpi.jsonl"
  python3 - "$p" "$steps" "$dir/local.jsonl" "$dir/mpi.jsonl" <<'PY'
import json, sys
p, steps = int(sys.argv[1]), int(sys.argv[2])
def load(path):
    lines = [json.loads(l) for l in open(path)]
    return [l["loss"] for l in lines if "loss" in l and "summary" not in l], lines[-1]
local_losses, local = load(sys.argv[3])
mpi_losses, mpi = load(sys.argv[4])
same = "identical" if local_losses == mpi_losses else "DIFFER"
for name, s in (("local", local), ("mpi", mpi)):
    comm = sum(st["comm_ms"] for st in s["stages"]) / len(s["stages"]) / steps
    bubble = sum(st["bubble"] for st in s["stages"]) / len(s["stages"])
    print(f"{p:<3} {name:<6} {s['tokens_per_s']:12.0f} {comm:16.2f} {bubble:10.2f} {same if name == 'mpi' else ''}")
PY
done
