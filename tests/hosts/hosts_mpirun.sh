#!/bin/bash
# mpirun across the namespace hosts (hosts_net.sh, already up), one process
# per host, the way a user runs it on real machines: a hostfile of the
# hosts' addresses, mpirun started on host 0, the daemons on the others
# through an agent in ssh's place (hosts_agent.sh), MPI's TCP restricted to
# the hosts' interface. The working directory is host 0's disk; host i's is
# "$PWD.h<i>". Every process writes under the same path, $HOSTS_OUT, where
# each host sees its own disk.
#
#   hosts_mpirun.sh -np N PROGRAM ARGS...      (N processes on HOSTS_N hosts)
#
# mpirun is started through tools/shardlab-mpirun, as a user on real
# machines would: it asks every hostfile host through the same agent first.
# HOSTS_HOSTFILE_EXTRA (environment): more hostfile lines (a host that does
# not answer). mpirun's own messages are kept (no -q): after a loss they
# name the host.
set -u
[ "$1" = -np ] || { echo "hosts_mpirun: usage: hosts_mpirun.sh -np N PROGRAM ARGS..."; exit 2; }
np=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
source "$here/hosts_net.sh"
base=$PWD
export HOSTS_SCRATCH HOSTS_OUT
HOSTS_SCRATCH=$(mktemp -d)  # h<i> -> each host's disk
HOSTS_OUT="$HOSTS_SCRATCH/out"
mkdir "$HOSTS_OUT"
ln -s "$base" "$HOSTS_SCRATCH/h0"
hostfile="$HOSTS_SCRATCH/hostfile"
for ((i = 0; i < HOSTS_N; i++)); do
  [ $i -gt 0 ] && mkdir -p "$base.h$i" && ln -s "$base.h$i" "$HOSTS_SCRATCH/h$i"
  echo "$(hosts_addr $i) slots=$(((np + HOSTS_N - 1) / HOSTS_N))"
done >"$hostfile"
[ -n "${HOSTS_HOSTFILE_EXTRA:-}" ] && echo "$HOSTS_HOSTFILE_EXTRA" >>"$hostfile"
pass=()  # the transport's settings, to every process
for v in SHARDLAB_MPI_SILENCE_S; do [ -n "${!v:-}" ] && pass+=(-x "$v"); done
# As root (CI) OpenMPI wants its consent; the rest keeps every byte on the
# hosts' interface.
ip netns exec "$(hosts_ns 0)" unshare -m --propagation private \
  sh -c 'mount --bind "$HOSTS_SCRATCH/h0/" "$HOSTS_OUT" && exec "$@"' host0 \
  env OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  "$here/../../tools/shardlab-mpirun" --hostfile "$hostfile" -np "$np" --map-by node -wdir "$HOSTS_OUT" \
  --mca plm_rsh_agent "$here/hosts_agent.sh" --mca plm_rsh_no_tree_spawn 1 \
  --mca btl tcp,self,vader --mca btl_tcp_if_include "$HOSTS_IF" --mca oob_tcp_if_include "$HOSTS_IF" \
  "${pass[@]}" "$@"
code=$?
rm -rf "$HOSTS_SCRATCH"
exit $code
