# Emulated hosts for tests of `sluice train --comm mpi` across machines (docs/mpi.md, issue 38).
# Source it, then:
#   cluster_up N        N hosts, each a network namespace $CLUSTER-h<i> with one interface eth0 at
#                       10.213.0.<i+1>/24, its veth peer plugged into a bridge in the namespace
#                       $CLUSTER-sw (the switch). Nothing is added to the root namespace.
#   cluster_mpirun NP ARGS...
#                       mpirun in host 0's namespace (hostname $CLUSTER-h0, as on a login node),
#                       one rank per host, daemons started by launch_agent.sh in place of ssh, the
#                       TCP transport and OpenMPI's own channel bound to 10.213.0.0/24.
#   cluster_host I      the name of host I (its namespace and its hostname)
#   cluster_pids I      the processes living in host I's namespace, one per line
#   cluster_down        ends every process of every host (SIGKILL) and deletes the namespaces;
#                       safe to call twice. cluster_up installs it as the EXIT trap (chained
#                       after CLUSTER_ON_EXIT, a command of the caller's), and first removes
#                       what runs killed outright left (cluster_sweep_stale).
# CLUSTER is unique per run (sl<pid>), so parallel runs do not collide. Needs root and `ip netns`;
# cluster_can_run says why not (the caller exits 77: skipped).
# The range 10.213.0.0/24 is private (RFC 1918) and exists only inside the namespaces.

CLUSTER=${CLUSTER:-sl$$}
CLUSTER_NET=10.213.0
CLUSTER_HOSTS=0
CLUSTER_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

cluster_host() { echo "$CLUSTER-h$1"; }

# Prints why emulated hosts cannot run here and returns 1, or returns 0.
cluster_can_run() {
  if [ "$(id -u)" != 0 ]; then
    echo "emulated hosts need root (network namespaces); running as $(id -un)"
    return 1
  fi
  if ! command -v ip >/dev/null || ! command -v unshare >/dev/null; then
    echo "emulated hosts need ip (iproute2) and unshare (util-linux)"
    return 1
  fi
  if ! command -v mpirun >/dev/null; then
    echo "emulated hosts need mpirun (OpenMPI)"
    return 1
  fi
  local probe="$CLUSTER-probe"
  if ! ip netns add "$probe" 2>/dev/null; then
    echo "this machine does not allow network namespaces (ip netns add failed)"
    return 1
  fi
  ip netns del "$probe"
  if ! unshare --uts true 2>/dev/null; then
    echo "this machine does not allow UTS namespaces (unshare --uts failed): hosts need their own names"
    return 1
  fi
  return 0
}

cluster_pids() { ip netns pids "$(cluster_host "$1")" 2>/dev/null; }

cluster_down() {
  local i ns
  for ((i = 0; i < CLUSTER_HOSTS; ++i)); do
    ns=$(cluster_host "$i")
    [ -e "/run/netns/$ns" ] || continue
    # shellcheck disable=SC2046
    kill -KILL $(ip netns pids "$ns") 2>/dev/null
  done
  for ((i = 0; i < CLUSTER_HOSTS; ++i)); do
    ns=$(cluster_host "$i")
    [ -e "/run/netns/$ns" ] && ip netns del "$ns"
  done
  [ -e "/run/netns/$CLUSTER-sw" ] && ip netns del "$CLUSTER-sw"
  CLUSTER_HOSTS=0
  return 0
}

# Removes the namespaces of earlier runs that were killed before their EXIT trap could (SIGKILL
# from a test driver's time limit): sl<pid>-* whose <pid> no longer lives.
cluster_sweep_stale() {
  local ns pid
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^sl[0-9]+-(h[0-9]+|sw|probe)$'); do
    pid=${ns#sl}
    pid=${pid%%-*}
    kill -0 "$pid" 2>/dev/null && continue
    # shellcheck disable=SC2046
    kill -KILL $(ip netns pids "$ns") 2>/dev/null
    ip netns del "$ns" 2>/dev/null
  done
  return 0
}

cluster_up() {
  local n=$1 i ns
  cluster_sweep_stale
  trap '{ eval "${CLUSTER_ON_EXIT:-}"; cluster_down; }' EXIT
  trap 'exit 130' INT TERM
  CLUSTER_HOSTS=$n
  ip netns add "$CLUSTER-sw" || return 1
  ip -n "$CLUSTER-sw" link add br0 type bridge || return 1
  ip -n "$CLUSTER-sw" link set br0 up || return 1
  for ((i = 0; i < n; ++i)); do
    ns=$(cluster_host "$i")
    ip netns add "$ns" || return 1
    ip link add eth0 netns "$ns" type veth peer name "h$i" netns "$CLUSTER-sw" || return 1
    ip -n "$CLUSTER-sw" link set "h$i" master br0 up || return 1
    ip -n "$ns" addr add "$CLUSTER_NET.$((i + 1))/24" dev eth0 || return 1
    ip -n "$ns" link set eth0 up || return 1
    ip -n "$ns" link set lo up || return 1
  done
}

# The environment of every cluster job: OpenMPI as root, TCP only (no shared memory: one rank per
# host), daemons launched by launch_agent.sh one by one (no tree spawn) with ssh's
# `-o ConnectTimeout` ($CLUSTER_CONNECT_TIMEOUT s, default 5: a host that does not answer fails
# the launch, as with ssh), both channels on the emulated network, and daemons that notice a lost
# link to mpirun within seconds (TCP keepalive) rather than the kernel's two hours.
cluster_env() {
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OMPI_MCA_plm_rsh_agent="$CLUSTER_DIR/launch_agent.sh"
  export OMPI_MCA_plm_rsh_args="-o ConnectTimeout=${CLUSTER_CONNECT_TIMEOUT:-5}"
  export OMPI_MCA_plm_rsh_no_tree_spawn=1
  export OMPI_MCA_btl=${OMPI_MCA_btl:-self,tcp}
  export OMPI_MCA_btl_tcp_if_include="$CLUSTER_NET.0/24"
  export OMPI_MCA_oob_tcp_if_include="$CLUSTER_NET.0/24"
  export OMPI_MCA_oob_tcp_keepalive_time=1 OMPI_MCA_oob_tcp_keepalive_intvl=1
  export OMPI_MCA_oob_tcp_keepalive_probes=3
  export OMPI_MCA_rmaps_base_oversubscribe=1
}

# cluster_mpirun NP ARGS...: NP ranks, rank r on host r mod N, the whole job limited to
# $CLUSTER_TIMEOUT seconds (default 120; exit 124 past it). ARGS may start with mpirun's options.
cluster_mpirun() {
  local np=$1 i n hosts=()
  shift
  for ((i = 0; i < CLUSTER_HOSTS; ++i)); do
    n=$(((np + CLUSTER_HOSTS - 1 - i) / CLUSTER_HOSTS))
    [ "$n" -gt 0 ] && hosts+=("$(cluster_host "$i"):$n")
  done
  cluster_launch "$np" "${hosts[*]}" "$@"
}

# cluster_mpirun_on I NP ARGS...: NP ranks, all on host I.
cluster_mpirun_on() {
  local host=$1 np=$2
  shift 2
  cluster_launch "$np" "$(cluster_host "$host"):$np" "$@"
}

# cluster_launch NP "HOST:SLOTS ..." ARGS...: mpirun in host 0's namespace.
cluster_launch() {
  local np=$1 hosts=$2
  shift 2
  (
    cluster_env
    exec timeout -k 5 "${CLUSTER_TIMEOUT:-120}" ip netns exec "$(cluster_host 0)" unshare --uts -- \
      sh -c 'hostname "$0" && exec "$@"' "$(cluster_host 0)" \
      mpirun -np "$np" --host "${hosts// /,}" --map-by node "$@"
  )
}
