#!/bin/bash
# Runs one command alone and under `mpirun -np NP` and fails unless both exit
# with CODE, give the same stdout (less host wall-clock fields), the same
# "error:" lines on stderr and byte-identical files: the virtual cluster
# across processes must be the single-process run, bit for bit. CODE is
# required: two runs that fail the same way agree with each other, and only
# the expected exit code tells that from a pass.
#
#   mpi_compare.sh NP CODE PROGRAM ARGS...
#
# Each run has its own working directory, so relative output paths in ARGS
# (--save out.safetensors, --trace t.json, --checkpoint-dir ck) are compared
# file by file.
# EXPECT (environment), if set: a pattern the single-process stderr must hold.
# MPI_LAUNCH (environment): the launcher in mpirun's place (tests/hosts:
# across namespace hosts); it gives host i > 0 the directory "mpi.h<i>",
# where nothing may be written (process 0 writes every file).
set -u
np=$1 code=$2
shift 2
command -v mpirun >/dev/null || { echo "mpi_compare: mpirun not found"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/alone" "$work/mpi"
(cd "$work/alone" && "$@" >../alone.out 2>../alone.err)
alone=$?
# As root (CI containers) OpenMPI wants its consent; -q drops its banners.
(cd "$work/mpi" && OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  ${MPI_LAUNCH:-mpirun -q --oversubscribe} -np "$np" "$@" >../mpi.out 2>../mpi.err)
mpi=$?
# A CSV less its host wall-clock columns (wall_s, host_*), found by the header.
drop_host_columns() {
  awk -F, 'NR == 1 { for (i = 1; i <= NF; i++) keep[i] = $i !~ /^(wall_s|host_.*)$/ }
           { out = ""; for (i = 1; i <= NF; i++) if (keep[i]) out = out $i ","; print out }' "$1"
}
status=0
host='"(host_[A-Za-z_]*|wall_s|loop_wall_s)":'
if [ "$alone" != "$code" ] || [ "$mpi" != "$code" ]; then
  echo "exit codes: alone $alone, mpirun -np $np $mpi; expected $code for both"; status=1
fi
if ! diff <(grep -Ev "$host" "$work/alone.out") <(grep -Ev "$host" "$work/mpi.out"); then
  echo "stdout differs (< alone, > mpirun -np $np)"; status=1
fi
if ! diff <(grep 'error:' "$work/alone.err") <(grep 'error:' "$work/mpi.err"); then
  echo "error lines differ (< alone, > mpirun -np $np)"; status=1
fi
# Every file byte for byte; JSON files (reports, checkpoint indexes) and CSV tables less host wall-clock fields.
if ! diff -rq "$work/alone" "$work/mpi" >/dev/null; then
  (cd "$work/alone" && find . -type f) | sort >"$work/alone.files"
  (cd "$work/mpi" && find . -type f) | sort >"$work/mpi.files"
  diff "$work/alone.files" "$work/mpi.files" || { echo "output file names differ"; status=1; }
  while read -r f; do
    [ -f "$work/mpi/$f" ] || continue
    case "$f" in
      *.json) diff <(grep -Ev "$host" "$work/alone/$f") <(grep -Ev "$host" "$work/mpi/$f") >/dev/null ;;
      *.csv) diff <(drop_host_columns "$work/alone/$f") <(drop_host_columns "$work/mpi/$f") >/dev/null ;;
      *) cmp -s "$work/alone/$f" "$work/mpi/$f" ;;
    esac || { echo "output file $f differs"; status=1; }
  done <"$work/alone.files"
fi
for d in "$work"/mpi.h*; do
  [ -d "$d" ] || continue
  written=$(cd "$d" && find . -type f)
  [ -z "$written" ] || { echo "host ${d##*.h} wrote files (process 0 writes every file):" $written; status=1; }
done
if [ -n "${EXPECT:-}" ] && ! grep -Eq "$EXPECT" "$work/alone.err"; then
  echo "the single-process run's stderr lacks /$EXPECT/:"; cat "$work/alone.err"; status=1
fi
echo "alone: exit $alone, $(wc -l <"$work/alone.out") stdout lines; mpirun -np $np: exit $mpi"
grep 'error:' "$work/mpi.err"
exit $status
