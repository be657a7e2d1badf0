#!/usr/bin/env bash
# `sluice train --comm mpi` across emulated hosts (tests/cluster/cluster.sh; docs/mpi.md "Many
# machines", issue 38). One check per mode:
#   bitwise   P = 2 × D = 2 on four hosts over TCP: bitwise the losses of the same job on one host
#             (shared memory), within 1e-6 of one process on the global batch; P = 2 on two hosts:
#             bitwise the one-process run. Every rank prints its host, stage, replica and transport.
#   linkdown  host 3's link goes down in the middle of training (`ip link set eth0 down`): every
#             process of the job ends within --comm-timeout plus a margin, the error names the step,
#             the action and the peer, no process is left on any host, the last checkpoint loads;
#             with the link back, resuming from it gives bitwise the losses of an uninterrupted run.
#   hostkill  the same with host 3's processes killed outright (SIGKILL).
#   reshape   a checkpoint of P = 2 × D = 2 with --shard-optimizer on four hosts (the replicas'
#             state slices gathered) resumes sharded as P = 1 × D = 2 on two hosts (bitwise: only P
#             changes) and unsharded as P = 4 × D = 1 on four hosts (the same global batch: within
#             1e-6); a checkpoint missing a shard, or holding a shard of another step, is refused on
#             every rank naming the shard, with nothing written.
#   badinput  --data-parallel not dividing the world, ranks started with different options, a host
#             that does not exist, a host that does not answer (its link down before the launch:
#             the launch agent fails like ssh after ConnectTimeout, naming it): each a clear
#             error, non-zero exit, nothing written, no process left behind.
# Usage: cluster_test.sh MODE SLUICE. Exits 77 (skipped, with the reason) where the machine allows no
# network namespaces (not root, no iproute2). Never hangs: every job runs under a time limit.
set -u
mode=$1 sluice=$2
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=cluster.sh
source "$here/cluster.sh"
if ! why=$(cluster_can_run); then
  echo "cluster_test ($mode): SKIPPED: $why"
  exit 77
fi
dir=$(mktemp -d)
CLUSTER_ON_EXIT='rm -rf "$dir"'
fail() {
  echo "cluster_test ($mode): FAILED: $*"
  exit 1
}

common=(--dim 32 --heads 2 --layers 4 --eval-every 0 --threads 1 --quiet --lr-schedule constant
        --warmup 0 --batch 8 --microbatches 4)
dp=("${common[@]}" --stages 2 --data-parallel 2)

# compare A B TOLERANCE [FIRST]: B's losses are A's from step FIRST+1 on (default 0), as many as B
# has, within the relative tolerance (0: bit for bit).
compare() {
  python3 - "$@" <<'PY' || fail "losses of $1 and $2 differ"
import json, sys
def losses(p):
    return [json.loads(l)["loss"] for l in open(p) if '"summary"' not in l and '"loss"' in l]
first = int(sys.argv[4]) if len(sys.argv) > 4 else 0
a, b, tol = losses(sys.argv[1])[first:], losses(sys.argv[2]), float(sys.argv[3])
assert b and len(a) == len(b), f"{len(a)} vs {len(b)} steps"
worst = max(abs(x - y) / abs(x) for x, y in zip(a, b))
print(f"{sys.argv[1]} (from step {first + 1}) vs {sys.argv[2]}: {len(b)} steps, max relative difference {worst:.3g}")
sys.exit(0 if (worst == 0 if tol == 0 else worst <= tol) else 1)
PY
}

# The step a checkpoint holds (its index's metadata).
checkpoint_step() {
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["metadata"]["step"])' "$1.index.json"
}

# Fails unless every host's namespace is empty within $1 seconds from now.
no_process_left() {
  local limit=$1 i left
  SECONDS=0
  while :; do
    left=
    for ((i = 0; i < CLUSTER_HOSTS; ++i)); do
      [ -n "$(cluster_pids "$i")" ] && left+=" host $i:$(cluster_pids "$i" | tr '\n' ' ')"
    done
    [ -z "$left" ] && return 0
    if [ "$SECONDS" -ge "$limit" ]; then
      for pid in $left; do [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' <"/proc/$pid/cmdline" && echo; done
      fail "processes left behind:$left"
    fi
    sleep 0.2
  done
}

# fault KIND: a P = 2 × D = 2 job on four hosts checkpointing every 5 steps; once its first
# checkpoint exists, host 3 (stage 1 of replica 1) fails (KIND: linkdown or hostkill). Then the
# checks of the header.
fault() {
  local kind=$1 timeout=5 margin=25 ck="$dir/ck.safetensors"
  cluster_up 4 || fail "cannot set up the emulated hosts"
  CLUSTER_TIMEOUT=120 cluster_mpirun 4 --output-filename "$dir/ranks" "$sluice" train --comm mpi \
    "${dp[@]}" --steps 1000000 --save "$ck" --save-every 5 --comm-timeout "$timeout" \
    --metrics "$dir/fault.jsonl" >"$dir/out" 2>&1 &
  local job=$!
  # The fault comes as soon as the first checkpoint (step 5) is complete, in step 6 or 7: far from
  # the next save (step 10), so that the checkpoint resumed below is step 5's. (A fault during a
  # save leaves the previous checkpoint whole: tests/io/checkpoint_test.cc.)
  for _ in $(seq 6000); do  # up to 60 s for the job to start and save a first time
    [ -s "$ck.index.json" ] && break
    kill -0 "$job" 2>/dev/null || break
    sleep 0.01
  done
  [ -s "$ck.index.json" ] || { cat "$dir/out"; fail "the job wrote no checkpoint"; }
  local t0=$EPOCHREALTIME
  if [ "$kind" = linkdown ]; then
    ip -n "$(cluster_host 3)" link set eth0 down || fail "cannot take host 3's link down"
  else
    # shellcheck disable=SC2046
    kill -KILL $(cluster_pids 3) || fail "no process on host 3"
  fi
  wait "$job"
  local rc=$?
  local took
  took=$(python3 -c "import sys; print(f'{float(sys.argv[1]) - float(sys.argv[2]):.1f}')" "$EPOCHREALTIME" "$t0")
  echo "--- mpirun's output"
  cat "$dir/out"
  echo "--- each rank's stderr (--output-filename)"
  grep -r . "$dir/ranks" --include=stderr | sed "s|$dir/ranks/||"
  echo "---"
  [ "$rc" -ne 0 ] || fail "the job exited 0"
  [ "$rc" -ne 124 ] || fail "the job was still running after 120 s"
  python3 -c "import sys; sys.exit(float(sys.argv[1]) > float(sys.argv[2]))" "$took" $((timeout + margin)) \
    || fail "mpirun ended ${took} s after the fault, more than --comm-timeout $timeout s + $margin s"
  echo "mpirun ended ${took} s after the fault (exit status $rc)"
  # What mpirun could not end (a host it lost) ends by itself: its daemon sees the link to mpirun
  # gone (TCP keepalive) and the rank its --comm-timeout.
  no_process_left $((timeout + margin))
  echo "no process left on any host ${took}+ s after the fault"
  if [ "$kind" = linkdown ]; then
    # Read once mpirun has ended (above): a rank of hosts 0-2 that waited for host 3 names the
    # step and the peer, by its host — when its --comm-timeout fires before OpenMPI's own
    # keepalive notices the lost daemon (about 4 s) and ends the job; under load the two race,
    # and then mpirun's message names the host it lost. Either names host 3. (Host 3's own rank
    # writes its line, if any, on its side of the cut; it is not the one checked.)
    if grep -rhE "^sluice: rank [012] aborts: .*step [0-9]+.*host $(cluster_host 3)\b" \
      "$dir/out" "$dir/ranks" >/dev/null; then
      echo "a rank's --comm-timeout ended the job: it names the step and host 3"
    elif grep -q "on node $(cluster_host 3)\$" "$dir/out"; then
      echo "mpirun ended the job before the ranks' --comm-timeout: it names host 3"
    else
      fail "neither a rank of hosts 0-2 (naming the step) nor mpirun names host 3 as the peer lost"
    fi
    ip -n "$(cluster_host 3)" link set eth0 up || fail "cannot bring host 3's link back"
  else
    # Its ranks died with their host: mpirun names the host it lost.
    grep -q "Remote daemon: .* on node $(cluster_host 3)\$" "$dir/out" || fail "mpirun does not name host 3"
  fi
  local step
  step=$(checkpoint_step "$ck") || fail "the last checkpoint has no readable index"
  echo "the last checkpoint holds step $step"
  local to=$((step + 3))
  # The checkpoint is intact: it resumes, across the same hosts, to the losses of an uninterrupted
  # run, bit for bit.
  cluster_mpirun 4 "$sluice" train --comm mpi "${dp[@]}" --steps "$to" --metrics "$dir/whole.jsonl" \
    || fail "the uninterrupted run"
  cluster_mpirun 4 "$sluice" train --comm mpi "${dp[@]}" --steps "$to" --resume "$ck" \
    --metrics "$dir/resumed.jsonl" || fail "resuming from the checkpoint of step $step"
  compare "$dir/whole.jsonl" "$dir/resumed.jsonl" 0 "$step"
}

case "$mode" in
  bitwise)
    cluster_up 4 || fail "cannot set up the emulated hosts"
    cluster_mpirun 4 "$sluice" train --comm mpi "${dp[@]}" --steps 5 --metrics "$dir/hosts.jsonl" \
      >"$dir/out" 2>&1 || { cat "$dir/out"; fail "P=2 x D=2 on four hosts"; }
    cat "$dir/out"
    for r in 0 1 2 3; do
      grep -qE "^sluice: rank $r of 4 on host $(cluster_host $r): stage $((r % 2)), replica $((r / 2)), .*tcp" \
        "$dir/out" || fail "no line for rank $r naming its host, stage, replica and transport"
    done
    # The same job on one host (host 0: four ranks over shared memory).
    OMPI_MCA_btl=self,vader cluster_mpirun_on 0 4 "$sluice" train --comm mpi "${dp[@]}" --steps 5 \
      --metrics "$dir/onehost.jsonl" || fail "P=2 x D=2 on one host"
    compare "$dir/onehost.jsonl" "$dir/hosts.jsonl" 0
    "$sluice" train "${common[@]}" --steps 5 --metrics "$dir/one.jsonl" || fail "one process"
    compare "$dir/one.jsonl" "$dir/hosts.jsonl" 1e-6
    cluster_mpirun 2 "$sluice" train --comm mpi "${common[@]}" --stages 2 --steps 5 \
      --metrics "$dir/p2.jsonl" || fail "P=2 on two hosts"
    compare "$dir/one.jsonl" "$dir/p2.jsonl" 0
    ;;
  linkdown | hostkill) fault "$mode" ;;
  reshape)
    cluster_up 4 || fail "cannot set up the emulated hosts"
    ck="$dir/ck.safetensors"
    cluster_mpirun 4 "$sluice" train --comm mpi "${dp[@]}" --steps 4 --metrics "$dir/whole.jsonl" \
      || fail "the uninterrupted run"
    # Sharded optimizer state (bitwise the unsharded run's losses): the replicas' slices are
    # gathered into each stage's shard.
    cluster_mpirun 4 "$sluice" train --comm mpi "${dp[@]}" --shard-optimizer --steps 2 --save "$ck" \
      --metrics "$dir/part.jsonl" || fail "the first half"
    # Only P changes (2 -> 1, D = 2 on two hosts, the state re-split): bit for bit.
    cluster_mpirun 2 "$sluice" train --comm mpi "${common[@]}" --stages 1 --data-parallel 2 \
      --shard-optimizer --steps 4 --resume "$ck" --metrics "$dir/p1.jsonl" || fail "resuming as P=1 x D=2"
    compare "$dir/whole.jsonl" "$dir/p1.jsonl" 0 2
    # D changes too (P = 4 × D = 1 on four hosts, unsharded), the same global batch: within 1e-6.
    cluster_mpirun 4 "$sluice" train --comm mpi "${common[@]}" --stages 4 --data-parallel 1 \
      --steps 4 --resume "$ck" --metrics "$dir/p4.jsonl" || fail "resuming as P=4 x D=1"
    compare "$dir/whole.jsonl" "$dir/p4.jsonl" 1e-6 2
    # A checkpoint missing a shard, and one holding a shard of another step: refused, naming it.
    mkdir "$dir/later"
    cluster_mpirun 4 "$sluice" train --comm mpi "${dp[@]}" --steps 3 --save "$dir/later/ck.safetensors" \
      --metrics "$dir/later.jsonl" || fail "the run saving step 3"
    mkdir "$dir/missing" "$dir/mixed"
    cp "$dir"/ck* "$dir/missing/" && cp "$dir"/ck* "$dir/mixed/"
    rm "$dir/missing/ck-step2-stage1-of-2.safetensors"
    # Step 3's shard where the index expects step 2's (a copy by hand, or a file system restored
    # from two backups): the header's step says it is another save's.
    cp "$dir/later/ck-step3-stage1-of-2.safetensors" "$dir/mixed/ck-step2-stage1-of-2.safetensors"
    for bad in missing mixed; do
      before=$(ls "$dir/$bad")
      cluster_mpirun 4 "$sluice" train --comm mpi "${dp[@]}" --steps 4 --resume "$dir/$bad/ck.safetensors" \
        --save "$dir/$bad/new.safetensors" --metrics "$dir/$bad/m.jsonl" >"$dir/out" 2>&1 \
        && { cat "$dir/out"; fail "resuming from the $bad checkpoint exited 0"; }
      cat "$dir/out"
      grep -q "ck-step2-stage1-of-2.safetensors" "$dir/out" || fail "the $bad shard is not named"
      [ "$bad" = missing ] || grep -q "has step .3. but its index .* has .2.: the shard is from another save" "$dir/out" \
        || fail "the shard of step 3 is not named as another save's"
      [ "$bad" = mixed ] || grep -q "is incomplete: its index .* names the shard .*ck-step2-stage1-of-2.safetensors., which does not exist" "$dir/out" \
        || fail "the missing shard is not named as missing"
      [ "$(ls "$dir/$bad")" = "$before" ] || fail "files written beside the $bad checkpoint: $(ls "$dir/$bad")"
      no_process_left 10
    done
    ;;
  badinput)
    cluster_up 3 || fail "cannot set up the emulated hosts"
    # expect_error NAME TEXT NP|host ARGS...: the job exits non-zero, its output holds TEXT, nothing
    # is written in $dir/w and no process is left on any host.
    expect_error() {
      local name=$1 text=$2
      shift 2
      mkdir -p "$dir/w"
      CLUSTER_TIMEOUT=60 "$@" >"$dir/out" 2>&1
      local rc=$?
      cat "$dir/out"
      [ "$rc" -ne 0 ] || fail "$name: the job exited 0"
      [ "$rc" -ne 124 ] || fail "$name: the job was still running after 60 s"
      grep -qF -- "$text" "$dir/out" || fail "$name: no '$text' in the output"
      [ -z "$(ls "$dir/w")" ] || fail "$name: files written: $(ls "$dir/w")"
      no_process_left 10
      echo "cluster_test (badinput): $name: refused"
    }
    out=(--metrics "$dir/w/m.jsonl" --save "$dir/w/ck.safetensors")
    expect_error "--data-parallel 2 of 3 ranks" "the job has 3 processes but --stages 1 × --data-parallel 2 needs 2" \
      cluster_mpirun 3 "$sluice" train --comm mpi "${common[@]}" --stages 1 --data-parallel 2 "${out[@]}"
    expect_error "ranks started with different options" "rank 2 was started with --steps 7 but rank 0 with --steps 5" \
      cluster_mpirun 2 "$sluice" train --comm mpi "${common[@]}" --stages 3 --steps 5 "${out[@]}" \
      : -np 1 "$sluice" train --comm mpi "${common[@]}" --stages 3 --steps 7 "${out[@]}"
    expect_error "a host that does not exist" "no emulated host '$CLUSTER-h9'" \
      cluster_launch 2 "$(cluster_host 0):1,$CLUSTER-h9:1" "$sluice" train --comm mpi "${common[@]}" --stages 2 "${out[@]}"
    # A host that exists but does not answer: mpirun cannot start its daemon and ends the job
    # (within the 60 s limit of expect_error; the agent gives up after ConnectTimeout, 5 s).
    ip -n "$(cluster_host 2)" link set eth0 down || fail "cannot take host 2's link down"
    expect_error "a host that does not answer" "connect to host $(cluster_host 2) (10.213.0.3) port 22" \
      cluster_mpirun 3 "$sluice" train --comm mpi "${common[@]}" --stages 3 "${out[@]}"
    grep -q "ORTE was unable to reliably start one or more daemons" "$dir/out" \
      || fail "a host that does not answer: mpirun does not say it could not start its daemon"
    ;;
  *) fail "unknown mode '$mode'" ;;
esac
echo "cluster_test ($mode): passed"
