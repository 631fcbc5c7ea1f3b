# Sourced by hosts_test.sh: "hosts" on one machine. Each host is a network
# namespace with one veth end (address 10.77.0.<i+1>/24) whose peer sits on a
# bridge in a switch namespace, so the hosts reach each other and nothing
# else: no veth end lives in the machine's own namespace, no route leads
# out, and no traffic leaves the machine. Names carry the run's id
# (shardlab-<pid>-h<i>), and namespaces left by a killed run (their pid gone)
# are removed first.
#
#   hosts_up N      creates hosts h0..h(N-1) (and the switch); sets HOSTS_ID
#                   (this shell's pid unless set) and HOSTS_N
#   hosts_ns I      host I's namespace name
#   hosts_addr I    host I's address
#   hosts_down      kills every process in the namespaces, deletes them
HOSTS_IF=eth-sl  # every host's interface (MPI's TCP traffic is restricted to it)

hosts_ns() { echo "shardlab-$HOSTS_ID-h$1"; }
hosts_addr() { echo "10.77.0.$(($1 + 1))"; }

# Kills the processes in namespace $1 and deletes it.
hosts_delete_ns() {
  local pids
  pids=$(ip netns pids "$1" 2>/dev/null)
  [ -n "$pids" ] && kill -9 $pids 2>/dev/null
  ip netns delete "$1" 2>/dev/null
}

hosts_clean_stale() {
  local ns pid
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E '^shardlab-[0-9]+-'); do
    pid=${ns#shardlab-}
    pid=${pid%%-*}
    kill -0 "$pid" 2>/dev/null && continue  # a live run's
    echo "hosts: removing stale namespace $ns"
    hosts_delete_ns "$ns"
  done
}

hosts_up() {
  local n=$1 i sw
  HOSTS_ID=${HOSTS_ID:-$$} HOSTS_N=$n
  hosts_clean_stale
  sw="shardlab-$HOSTS_ID-sw"
  ip netns add "$sw" || return 1
  ip -n "$sw" link add br0 type bridge && ip -n "$sw" link set br0 up || return 1
  for ((i = 0; i < n; i++)); do
    local ns
    ns=$(hosts_ns $i)
    ip netns add "$ns" || return 1
    # Both ends are created inside the run's namespaces, never in the machine's.
    ip -n "$sw" link add "p$i" type veth peer name "$HOSTS_IF" netns "$ns" || return 1
    ip -n "$sw" link set "p$i" master br0 up &&
      ip -n "$ns" addr add "$(hosts_addr $i)/24" dev "$HOSTS_IF" &&
      ip -n "$ns" link set "$HOSTS_IF" up && ip -n "$ns" link set lo up || return 1
    # A connection with data unacknowledged gives up after ~3 s of
    # retransmissions, not ~15 min: mpirun's own end after a lost host is
    # then bounded too (the namespace's own setting; the machine's is untouched).
    ip netns exec "$ns" sysctl -qw net.ipv4.tcp_retries2=3 || return 1
  done
}

# Host I's link to the switch goes down (or up again): `hosts_link I down`.
hosts_link() { ip -n "shardlab-$HOSTS_ID-sw" link set "p$1" "$2"; }

hosts_down() {
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^shardlab-$HOSTS_ID-"); do
    hosts_delete_ns "$ns"
  done
}
