#!/usr/bin/env bash
# Step time and bytes per step of one job, P = 2 × D = 2, four ways (docs/benchmarks.md "Across
# emulated hosts", issue 38): stages as threads in one process (P = 2 on the global batch: threads
# cannot be replicas), four MPI ranks on one host over shared memory, and four ranks on four
# emulated hosts over TCP (tests/cluster/cluster.sh). Needs root (network namespaces).
#   bench/cluster_bench.sh BUILD_DIR [STEPS]
# Prints one JSON line per way: the median step_ms of the steps after the fifth, and, across hosts,
# the bytes the four hosts' interfaces sent per step (TX counters, a run of STEPS steps minus a run
# of 5, divided by STEPS − 5: start-up traffic cancels out). Then the simulator's fit: a run of
# STEPS steps across the hosts with --profile-out, and `sluice simulate` of one replica's pipeline
# (--batch 16: P = 2 on its rows) with those costs beside the step that run measured — with the
# message transit and the replicas' all-reduce of the profile (docs/simulator.md), and without
# them (the profile's other costs alone: what the simulator predicted before it modelled them) —
# and the largest share of the step a rank waited for a core (other ranks, other work).
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

# The simulator's fit: a profiled run, its costs with and without the transit and the replicas'
# all-reduce, and `sluice simulate` of each beside the step the run measured.
[ "${job[6]}" = --batch ] || { echo "cluster_bench: the job's --batch moved" >&2; exit 1; }
one=("${job[@]}")
one[7]=$((job[7] / 2))  # one replica's rows, the same micro-batch
fit() {  # WAY LAUNCH...: the profiled run launched by LAUNCH (cluster_mpirun 4, or one host's)
  local way=$1 costs
  shift
  "$@" "$sluice" train --comm mpi "${job[@]}" --stages 2 --data-parallel 2 --steps "$steps" \
    --profile-out "$dir/costs.json" 2>/dev/null || exit 1
  python3 - "$dir/costs.json" "$dir/plain.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
for k in ("transit_latency_ms", "transit_ms_per_byte", "transit_ms"):
    c["messages"].pop(k, None)
for r in c["ranks"]:
    r.pop("data_allreduce_ms", None)
json.dump(c, open(sys.argv[2], "w"))
PY
  for costs in costs plain; do
    "$sluice" simulate "${one[@]}" --stages 2 --costs "$dir/$costs.json" --format json \
      >"$dir/$costs.out" || exit 1
  done
  python3 - "$way" "$dir/costs.json" "$dir/costs.out" "$dir/plain.out" <<'PY'
import json, sys
c = json.load(open(sys.argv[2]))
fit, plain = json.load(open(sys.argv[3])), json.load(open(sys.argv[4]))
m, measured = c["measured"]["step_ms"], c["measured"]
waits = measured.get("stage_core_wait_ms")
r3 = lambda x: None if x is None else round(x, 3)
print(json.dumps({"way": f"simulate, profile of {sys.argv[1]}",
                  "measured_step_ms": round(m, 2),
                  "predicted_step_ms": round(fit["step_ms"], 2),
                  "error": round(fit["step_ms"] / m - 1, 3),
                  "predicted_without_transit_ms": round(plain["step_ms"], 2),
                  "error_without_transit": round(plain["step_ms"] / m - 1, 3),
                  "transit_ms": r3(c["messages"].get("transit_ms")),
                  "transit_in_step_ms": r3(measured.get("transit_in_step_ms")),
                  "transit_ping_pong_ms": r3(measured.get("transit_ping_pong_ms")),
                  "transit_ms_per_byte": c["messages"].get("transit_ms_per_byte"),
                  "message_bytes": c["messages"]["bytes"],
                  "data_allreduce_ms": [r3(r.get("data_allreduce_ms", 0)) for r in c["ranks"]],
                  "allreduce_ms": r3(c["allreduce_ms"]),
                  "step_overhead_ms": r3(c["step_overhead_ms"]),
                  "core_wait_share": round(max(waits) / m, 3) if waits else None}))
PY
}
fit "4 ranks on four emulated hosts, tcp" cluster_mpirun 4
OMPI_MCA_btl=self,vader fit "4 ranks on one host, shared memory" cluster_mpirun_on 0 4
