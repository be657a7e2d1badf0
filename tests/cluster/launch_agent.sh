#!/usr/bin/env bash
# OpenMPI's launch agent for emulated hosts (tests/cluster/cluster.sh): mpirun calls it as it would
# call ssh, `launch_agent.sh [ssh options] HOST COMMAND...`, and it runs COMMAND in the network
# namespace named HOST, with its own hostname HOST (a UTS namespace), through a shell as sshd would.
# Only root can enter a namespace; the harness checks that before it starts anything.
#
# Like ssh, it first connects to HOST over the network — a TCP connection from the launching
# namespace to HOST's address, port 22, where nothing listens: refused means the host answered —
# and when that fails within ConnectTimeout (`-o ConnectTimeout=N`, as mpirun passes
# `--mca plm_rsh_args`; default 10 s) it says so naming the host and exits 255, as ssh does, so
# that mpirun reports the host it could not start a daemon on instead of waiting for it.
set -u
connect_timeout=10
while [ $# -gt 0 ] && [ "${1#-}" != "$1" ]; do  # ssh options OpenMPI may pass (-x, -o ...)
  case $1 in
    -o | -p | -l | -i | -F)  # options with an argument
      [ "$1" = -o ] && [ $# -ge 2 ] && case $2 in ConnectTimeout=*) connect_timeout=${2#*=} ;; esac
      shift 2 || shift
      ;;
    -oConnectTimeout=*)
      connect_timeout=${1#*=}
      shift
      ;;
    *) shift ;;
  esac
done
if [ $# -lt 2 ]; then
  echo "launch_agent.sh: usage: launch_agent.sh [-o ConnectTimeout=N] HOST COMMAND..." >&2
  exit 255
fi
host=$1
shift
if ! [ -e "/run/netns/$host" ]; then
  echo "launch_agent.sh: no emulated host '$host' (no network namespace /run/netns/$host)" >&2
  exit 255
fi
address=$(ip -n "$host" -4 -o addr show dev eth0 2>/dev/null | awk '{split($4, a, "/"); print a[1]; exit}')
if [ -z "$address" ]; then
  echo "launch_agent.sh: connect to host $host port 22: the host has no address" >&2
  exit 255
fi
# The connection attempt, from this (the launching host's) namespace.
why=$(timeout "$connect_timeout" bash -c 'exec 3<>"/dev/tcp/$0/22"' "$address" 2>&1)
case $? in
  0) ;;
  124) why="Connection timed out" ;;
  *)
    case $why in
      *"Connection refused"*) ;;  # the host answered: it is up, nothing listens on port 22
      *"No route to host"*) why="No route to host" ;;
      *) why="Connection failed (${why##*: })" ;;
    esac
    ;;
esac
if [ -n "$why" ] && [ "${why#*Connection refused}" = "$why" ]; then
  echo "launch_agent.sh: connect to host $host ($address) port 22: $why" >&2
  exit 255
fi
exec ip netns exec "$host" unshare --uts -- sh -c 'hostname "$0" && exec sh -c "$1"' "$host" "$*"
