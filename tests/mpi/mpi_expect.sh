#!/bin/bash
# Runs a command under `mpirun -np NP` and fails unless it exits with CODE
# and its stderr matches PATTERN (grep -E): for failures that have no
# single-process twin, such as one process failing alone.
#
#   mpi_expect.sh NP CODE PATTERN PROGRAM ARGS...
set -u
np=$1 code=$2 pattern=$3
shift 3
command -v mpirun >/dev/null || { echo "mpi_expect: mpirun not found"; exit 77; }
err=$(mktemp)
trap 'rm -f "$err"' EXIT
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -q --oversubscribe -np "$np" "$@" >/dev/null 2>"$err"
got=$?
status=0
[ "$got" = "$code" ] || { echo "mpirun -np $np: exit $got, expected $code"; status=1; }
grep -Eq "$pattern" "$err" || { echo "stderr lacks /$pattern/"; status=1; }
echo "stderr:"; cat "$err"
exit $status
