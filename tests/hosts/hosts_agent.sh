#!/bin/bash
# mpirun's remote agent for the namespace hosts (--mca plm_rsh_agent), in
# ssh's place: `hosts_agent.sh ADDRESS COMMAND...` runs COMMAND (mpirun's
# daemon, orted) on the host of ADDRESS: in its network namespace and in a
# mount namespace of its own where the host's scratch directory
# ($HOSTS_SCRATCH/h<i>) is mounted on $HOSTS_OUT, the path every process
# writes under: each host has its own disk there. An address no host has
# gets what ssh gives a machine that does not answer: a connect timeout
# (HOSTS_CONNECT_TIMEOUT seconds) and exit 255.
set -u
addr=$1
shift
i=${addr##*.}
i=$((i - 1))
ns="shardlab-$HOSTS_ID-h$i"
if ! ip netns list | grep -q "^$ns\b" || [ "${addr%.*}" != 10.77.0 ]; then
  timeout "${HOSTS_CONNECT_TIMEOUT:-3}" bash -c "exec 3<>/dev/tcp/$addr/22" 2>/dev/null && exit 255
  echo "ssh: connect to host $addr port 22: Connection timed out" >&2
  exit 255
fi
exec ip netns exec "$ns" unshare -m --propagation private \
  sh -c 'mount --bind "$1/h$2" "$3" && shift 3 && exec sh -c "$*"' agent "$HOSTS_SCRATCH" "$i" "$HOSTS_OUT" "$@"
