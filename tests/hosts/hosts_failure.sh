#!/bin/bash
# A namespace host lost mid-run (run by hosts_case.sh: hosts up, MPI_LAUNCH
# set). The job must end within BOUND seconds with one shardlab line naming
# the loss (mpirun's own messages and exit code beside it), and the last
# complete checkpoint, on host 0's disk, must resume to the straight
# single-process run's bytes.
#
#   hosts_failure.sh kill PROGRAM   host 1's processes (its daemon too) killed mid-step
#   hosts_failure.sh link PROGRAM   host 1's link goes down mid-step: the heartbeat's verdict
#   hosts_failure.sh absent PROGRAM a hostfile host that does not answer: the launcher's line, mpirun never starts
#
# BOUND is generous (a loaded 2-core machine): it tells "ends" from "hangs",
# no speed is asserted.
set -u
mode=$1 bin=$2
here=$(cd "$(dirname "$0")" && pwd)
source "$here/hosts_net.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/alone" "$work/mpi"
status=0
fail() { echo "FAIL: $*"; status=1; }
export SHARDLAB_MPI_SILENCE_S=2
train=(train --model tiny --data synthetic:markov --steps 8 --tp 2 --pp 2 --dp 2 --micro-batches 2)

# Runs the launcher in the background from $work/mpi; `ended BOUND` waits
# for it at most BOUND seconds, sets $code and $took.
start() { (cd "$work/mpi" && exec "$MPI_LAUNCH" "$@" >../run.out 2>../run.err) & job=$!; }
ended() {
  SECONDS=0
  while kill -0 $job 2>/dev/null && [ $SECONDS -lt "$1" ]; do sleep 0.2; done
  took=$SECONDS
  if kill -0 $job 2>/dev/null; then
    fail "still running $1 s after the loss"; kill $job; hosts_delete_ns "$(hosts_ns 1)"; wait $job; code=-1; return
  fi
  wait $job
  code=$?
}
# Exactly one shardlab error line, matching $1.
one_line() {
  local lines
  lines=$(grep 'shardlab: error' "$work/run.err")
  local before=$status
  [ "$(grep -c . <<<"$lines")" = 1 ] || fail "expected one shardlab error line, got: ${lines:-none}"
  grep -Eq "$1" <<<"$lines" || fail "the line lacks /$1/: $lines"
  [ $status = "$before" ] || { echo "the launcher's stderr:"; cat "$work/run.err"; }
  echo "ended in $took s, exit $code: $lines"
}

# The launcher (tools/shardlab-mpirun) asks every host through the agent,
# 5 s at most; the agent gives up on the address after 3 s, as ssh would.
if [ "$mode" = absent ]; then
  HOSTS_HOSTFILE_EXTRA="10.77.0.9 slots=1" SHARDLAB_HOST_TIMEOUT_S=5 \
    start -np 3 "$bin" verify --model tiny --steps 1 --tp 2 --dp 2
  ended 30
  [ "$code" = 2 ] || fail "exit $code with a host that does not answer, expected 2 (bad input)"
  one_line "^shardlab: error: host 10\.77\.0\.9 \(hostfile [^ ]*/hostfile line 3\) does not answer within 5 s: ssh: connect to host 10\.77\.0\.9 port 22: Connection timed out; no process was started$"
  ! grep -q ORTE "$work/run.err" || fail "mpirun started: $(cat "$work/run.err")"
  exit $status
fi

(cd "$work/alone" && "$bin" "${train[@]}" --save out.safetensors >/dev/null 2>&1) || fail "the single-process run failed"
start -np 2 "$bin" "${train[@]}" --checkpoint-dir ck --checkpoint-every 2 --save out.safetensors
for ((i = 0; i < 600; i++)); do [ -f "$work/mpi/ck/latest" ] && break; sleep 0.1; done
[ -f "$work/mpi/ck/latest" ] || fail "no checkpoint within 60 s"
case $mode in
  kill) kill -9 $(ip netns pids "$(hosts_ns 1)") ;;
  link) hosts_link 1 down ;;
esac
echo "lost host 1 after $(cat "$work/mpi/ck/latest")"
ended 30
[ ! -f "$work/mpi/out.safetensors" ] || fail "the run ended before the loss (nothing was tested)"
[ "$code" != 0 ] || fail "mpirun exit 0 after a lost host"
case $mode in
  # Process 0's line (mpirun's SIGTERM, or a broken connection to process 1 first), or the launcher's from
  # ORTE's message when mpirun ended before that line reached it.
  kill) one_line "process 0 of 2 (stopped by mpirun|lost a connection) during a run: process 1 \(devices 4-7\) or its host failed|mpirun lost the daemon of host [0-9.]+ during the job" ;;
  link) one_line "process 1 of 2 \(devices 4-7\) lost: nothing heard from it for 2\.[0-9] s \(limit 2 s" ;;
esac
# The hosts again (a fresh host 1), and the last complete checkpoint resumes.
[ "$mode" = link ] && hosts_link 1 up
hosts_delete_ns "$(hosts_ns 1)" 2>/dev/null
ip netns pids "$(hosts_ns 0)" | xargs -r kill -9
hosts_down && hosts_up 2 || fail "hosts not back"
resumed=$(cat "$work/mpi/ck/latest")
(cd "$work/mpi" && "$MPI_LAUNCH" -np 2 "$bin" "${train[@]}" --resume ck --checkpoint-dir ck --save out.safetensors \
  >../resume.out 2>../resume.err) || { fail "the resumed run failed:"; cat "$work/resume.err"; }
cmp "$work/alone/out.safetensors" "$work/mpi/out.safetensors" || fail "resumed parameters differ from the straight run"
[ $status = 0 ] && echo "resumed from $resumed on the hosts: parameters identical to the straight single-process run"
exit $status
