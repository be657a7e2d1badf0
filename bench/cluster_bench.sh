#!/usr/bin/env bash
# Step time and bytes per step of one job, P = 2 × D = 2, four ways (docs/benchmarks.md "Across
# emulated hosts", issue 38): stages as threads in one process (P = 2 on the global batch: threads
# cannot be replicas), four MPI ranks on one host over shared memory, and four ranks on four
# emulated hosts over TCP (tests/cluster/cluster.sh). Needs root (network namespaces).
#   bench/cluster_bench.sh BUILD_DIR [STEPS]
# Prints one JSON line per way: the median step_ms of the steps after the fifth, and, across hosts,
# the bytes the four hosts' interfaces sent per step (TX counters, a run of STEPS steps minus a run
# of 5, divided by STEPS − 5: start-up traffic cancels out).
set -u
build=$1 steps=${2:-40}
sluice=$(cd "$build" && pwd)/sluice
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=../tests/cluster/cluster.sh
source "$here/../tests/cluster/cluster.sh"
why=$(cluster_can_run) || { echo "cluster_bench: $why" >&2; exit 77; }
dir=$(mktemp -d)
CLUSTER_ON_EXIT='rm -rf "$dir"'
job=(--dim 64 --heads 4 --layers 4 --batch 32 --microbatches 4 --threads 1 --eval-every 0 --quiet
     --lr-schedule constant --warmup 0)

median_step_ms() {
  python3 -c 'import json,statistics,sys
ms=[json.loads(l)["step_ms"] for l in open(sys.argv[1]) if "step_ms" in l and "summary" not in l][5:]
print(f"{statistics.median(ms):.2f}")' "$1"
}
tx_bytes() {
  local i total=0
  for ((i = 0; i < CLUSTER_HOSTS; ++i)); do
    total=$((total + $(ip netns exec "$(cluster_host "$i")" cat /sys/class/net/eth0/statistics/tx_bytes)))
  done
  echo "$total"
}

"$sluice" train "${job[@]}" --stages 2 --steps "$steps" --metrics "$dir/threads.jsonl" || exit 1
echo "{\"way\": \"threads (P=2, one process)\", \"step_ms\": $(median_step_ms "$dir/threads.jsonl")}"

cluster_up 4 || exit 1
OMPI_MCA_btl=self,vader cluster_mpirun_on 0 4 "$sluice" train --comm mpi "${job[@]}" --stages 2 \
  --data-parallel 2 --steps "$steps" --metrics "$dir/onehost.jsonl" 2>/dev/null || exit 1
echo "{\"way\": \"4 ranks, one host, shared memory\", \"step_ms\": $(median_step_ms "$dir/onehost.jsonl")}"

run_hosts() {  # STEPS OUT: the bytes the hosts sent during the run
  local before after
  before=$(tx_bytes)
  cluster_mpirun 4 "$sluice" train --comm mpi "${job[@]}" --stages 2 --data-parallel 2 \
    --steps "$1" --metrics "$2" 2>/dev/null || exit 1
  after=$(tx_bytes)
  echo $((after - before))
}
short=$(run_hosts 5 "$dir/short.jsonl")
long=$(run_hosts "$steps" "$dir/hosts.jsonl")
echo "{\"way\": \"4 ranks, four emulated hosts, tcp\", \"step_ms\": $(median_step_ms "$dir/hosts.jsonl"), \"bytes_per_step\": $(((long - short) / (steps - 5)))}"
