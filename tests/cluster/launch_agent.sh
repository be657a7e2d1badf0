#!/usr/bin/env bash
# OpenMPI's launch agent for emulated hosts (tests/cluster/cluster.sh): mpirun calls it as it would
# call ssh, `launch_agent.sh [ssh options] HOST COMMAND...`, and it runs COMMAND in the network
# namespace named HOST, with its own hostname HOST (a UTS namespace), through a shell as sshd would.
# Only root can enter a namespace; the harness checks that before it starts anything.
set -u
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do shift; done  # ssh options OpenMPI may pass (-x)
if [ $# -lt 2 ]; then
  echo "launch_agent.sh: usage: launch_agent.sh HOST COMMAND..." >&2
  exit 255
fi
host=$1
shift
if ! [ -e "/run/netns/$host" ]; then
  echo "launch_agent.sh: no emulated host '$host' (no network namespace /run/netns/$host)" >&2
  exit 255
fi
exec ip netns exec "$host" unshare --uts -- sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$*"
