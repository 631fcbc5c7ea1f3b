#!/bin/bash
# One namespace case: brings up N hosts (hosts_net.sh), runs CHECKER with
# mpirun across them (MPI_LAUNCH=hosts_mpirun.sh), takes the hosts down.
#
#   hosts_case.sh N CHECKER ARGS...    e.g. hosts_case.sh 2 mpi_compare.sh 2 0 shardlab verify ...
#
# Without CAP_NET_ADMIN (namespaces not permitted) the case says so and
# skips (exit 77), unless SHARDLAB_HOSTS_REQUIRED=1 (CI runs as root: there
# a skip is a failure).
set -u
n=$1
shift
here=$(cd "$(dirname "$0")" && pwd)
source "$here/hosts_net.sh"
probe="shardlab-$$-probe"
if ! command -v ip >/dev/null || ! ip netns add "$probe" 2>/dev/null; then
  echo "hosts: network namespaces not permitted here (ip from iproute2 and CAP_NET_ADMIN needed): skipped"
  [ "${SHARDLAB_HOSTS_REQUIRED:-0}" = 1 ] && exit 1
  exit 77
fi
ip netns delete "$probe"
trap hosts_down EXIT
hosts_up "$n" || { echo "hosts: could not create $n namespace hosts"; exit 1; }
# Nothing leaves the machine: no host has a route beyond its /24, and the
# machine's own namespace holds no end of the hosts' links.
for ((i = 0; i < n; i++)); do
  routes=$(ip -n "$(hosts_ns $i)" route show | grep -v "^10.77.0.0/24 dev $HOSTS_IF")
  [ -z "$routes" ] || { echo "hosts: host $i routes beyond its network: $routes"; exit 1; }
done
ip -o link show | grep -Eq ": ($HOSTS_IF|p[0-9]+)@" && { echo "hosts: a link end in the machine's namespace"; exit 1; }
export HOSTS_ID HOSTS_N MPI_LAUNCH="$here/hosts_mpirun.sh"
"$@"
status=$?
echo "hosts: namespace case ran on $n hosts (exit $status)"
exit $status
