#!/bin/bash
# tools/shardlab-mpirun without namespaces or MPI: a fake mpirun records the
# arguments it was exec'd with, fake agents answer, fail or hang. Checks
# that a good hostfile passes mpirun's arguments through unchanged after
# asking each remote host once, and that a malformed hostfile, a bad timeout
# or a host that does not answer give exactly one shardlab line and exit 2
# with mpirun never started.
#
#   hosts_launcher.sh LAUNCHER
set -u
launcher=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work" || exit 1
status=0
fail() { echo "FAIL: $*"; status=1; }
mkdir bin
# mpirun: its arguments, one a line. ssh and the agents: their arguments on one line.
printf '#!/bin/sh\nprintf "%%s\\n" "$@" >"%s/mpirun.args"\n' "$work" >bin/mpirun
printf '#!/bin/sh\necho "$@" >>"%s/asked"\n' "$work" >bin/ssh
printf '#!/bin/sh\necho "$@" >>"%s/asked"\n' "$work" >bin/answers
printf '#!/bin/sh\n[ "$1" = ghost ] || exit 0\necho "warning: on the way"\necho "ssh: connect to host ghost port 22: No route to host" >&2\nexit 255\n' >bin/refuses
printf '#!/bin/sh\ncase $1 in ghost*) exec sleep 300 ;; esac\n' >bin/hangs
chmod +x bin/*
export PATH="$work/bin:$PATH"

# Runs the launcher (at most 30 s: "ends" from "hangs", no speed asserted);
# sets $code, $err (its stderr) and $ran (what mpirun received, or "none").
run() {
  rm -f mpirun.args asked
  timeout 30 "$launcher" "$@" >out 2>err
  code=$?
  err=$(cat err)
  ran=$(cat mpirun.args 2>/dev/null || echo none)
}
# The run gave exit 2, exactly one line matching /$1/, and mpirun never ran.
refused() {
  [ "$code" = 2 ] || fail "exit $code, expected 2 ($err)"
  [ "$(grep -c . err)" = 1 ] || fail "expected one line, got: $err"
  grep -Eq "^shardlab: error: $1" err || fail "the line lacks /$1/: $err"
  [ "$ran" = none ] || fail "mpirun ran after: $err"
  echo "refused: $err"
}

# A good hostfile: comments, blanks, this machine (asked nothing), spaces
# around `=`, a user; every argument reaches mpirun as given.
printf '# the cluster\n\nlocalhost slots=2\nws2 slots = 1 max_slots=4  # second\nws3 user=ann\n' >good
args=(--hostfile good -np 3 --mca plm_rsh_agent "answers -p 22" -x A prog "" --flag "two  words")
run "${args[@]}"
[ "$code" = 0 ] || fail "a good hostfile: exit $code ($err)"
[ "$ran" = "$(printf '%s\n' "${args[@]}")" ] || fail "mpirun got other arguments: $ran"
[ "$(sort asked)" = "$(printf '%s\n' "-p 22 ann@ws3 true" "-p 22 ws2 true")" ] ||
  fail "the remote hosts were not each asked once through the agent: $(cat asked)"
# ssh by default, and OMPI_MCA_plm_rsh_agent's "ssh : rsh" means ssh: it gets the bound.
run -np 1 --hostfile good prog
grep -q -- "-o BatchMode=yes -o ConnectTimeout=10 ws2 true" asked || fail "ssh not bounded: $(cat asked)"
OMPI_MCA_plm_rsh_agent="answers : rsh" run --machinefile good -np 1 prog
[ "$code" = 0 ] && grep -q "^ws2 true" asked || fail "OMPI_MCA_plm_rsh_agent not used: $(cat asked 2>&1)"
# No hostfile: straight to mpirun, nobody asked.
run -np 2 prog a
[ "$ran" = "$(printf '%s\n' -np 2 prog a)" ] && [ ! -f asked ] || fail "no hostfile: mpirun got $ran"

# Hosts that do not answer: the agent's last stderr line, or the bound.
printf 'ws2\nghost slots=1\n' >lost
run --hostfile lost --mca plm_rsh_agent refuses -np 2 prog
refused "host ghost \(hostfile lost line 2\) does not answer within 10 s: ssh: connect to host ghost port 22: No route to host; no process was started$"
SHARDLAB_HOST_TIMEOUT_S=1 run --hostfile lost --mca plm_rsh_agent hangs -np 2 prog
refused "host ghost \(hostfile lost line 2\) does not answer within 1 s: no answer through hangs;"
printf 'ghost\nghost slots=2\nws2\r\nghost2\n' >several
SHARDLAB_HOST_TIMEOUT_S=1 run --hostfile several --mca plm_rsh_agent hangs -np 2 prog
refused "host ghost \(hostfile several line 1\) does not answer within 1 s: .* \(2 hosts do not answer: ghost ghost2\);"

# Bad input.
for bad in 'ws2 slots=0' 'ws2 slots=two' 'ws2 cores=2' 'ws2 user=' 'ws(2) slots=1'; do
  printf 'localhost\n%s\n' "$bad" >bad
  run --hostfile bad -np 1 prog
  refused "hostfile bad line 2: '"
done
printf '# nobody\n\n' >empty
run --hostfile empty -np 1 prog
refused "hostfile empty names no host$"
run --hostfile missing -np 1 prog
refused "hostfile missing cannot be read$"
run -np 1 prog --hostfile
refused "--hostfile needs a file$"
SHARDLAB_HOST_TIMEOUT_S=0.5 run --hostfile good -np 1 prog
refused "SHARDLAB_HOST_TIMEOUT_S must be whole seconds from 1 to 3600, not '0.5'$"
[ $status = 0 ] && echo "shardlab-mpirun: passes a good hostfile through, refuses 12 bad cases with one line each"
exit $status
