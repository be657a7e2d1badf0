#!/usr/bin/env bash
# How an MPI job of sluice ends when one rank fails (see docs/mpi.md):
#   fault_test.sh abort MPIEXEC NP_FLAG HELPER  a rank calls Abort: the job exits non-zero, the
#                                               reason on stderr;
#   fault_test.sh kill  MPIEXEC NP_FLAG HELPER  a rank is killed with SIGKILL: mpirun ends the others
#                                               and exits non-zero.
# Never hangs: the job runs under `timeout`, and running out of time fails the test (exit 124).
set -u
mode=$1 mpiexec=$2 np_flag=$3 helper=$4
limit=30  # seconds: what issue 7 allows for the surviving ranks to exit
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

SECONDS=0
timeout -k 5 "$limit" "$mpiexec" "$np_flag" 3 "$helper" "$([ "$mode" = kill ] && echo wait || echo abort)" "$dir" \
  >"$dir/out" 2>&1 &
job=$!

if [ "$mode" = kill ]; then
  for _ in $(seq 200); do  # up to 20 s for every rank to start and write its pid
    [ -s "$dir/rank0.pid" ] && [ -s "$dir/rank1.pid" ] && [ -s "$dir/rank2.pid" ] && break
    sleep 0.1
  done
  if ! [ -s "$dir/rank1.pid" ]; then
    echo "fault_test: the ranks did not start"; cat "$dir/out"; kill -KILL "$job"; exit 1
  fi
  sleep 0.5  # let every rank reach its receive
  kill -KILL "$(cat "$dir/rank1.pid")"
fi

wait "$job"
rc=$?
cat "$dir/out"
# timeout(1) exits 124 (or 137 after its KILL), but so may mpirun, passing on a killed rank's 137.
if [ "$rc" -eq 124 ] || [ "$SECONDS" -ge "$limit" ]; then
  echo "fault_test ($mode): FAILED: the job was still running after ${limit} s"
  exit 1
fi
if [ "$rc" -eq 0 ]; then
  echo "fault_test ($mode): FAILED: the job exited 0"
  exit 1
fi
if [ "$mode" = abort ] && ! grep -q "sluice: rank 1 aborts: test abort" "$dir/out"; then
  echo "fault_test (abort): FAILED: no 'sluice: rank 1 aborts: test abort' on stderr"
  exit 1
fi
echo "fault_test ($mode): the job ended with exit status $rc"
