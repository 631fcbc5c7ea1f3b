#!/bin/sh
# bench_phantom's bad arguments: each must give exactly one error line on
# stderr and exit code 2, before any table runs. Usage: bad_input_test.sh BENCH_PHANTOM
set -u
bin=$1
fail=0
for args in "--rows x" "--rows 0" "--from -1" "--from 3" "--table mcore --from 99" "--table nosuch" "--frobnicate 1"; do
  # shellcheck disable=SC2086 # the arguments are split on purpose
  err=$("$bin" $args 2>&1 >/dev/null)
  rc=$?
  lines=$(printf '%s\n' "$err" | wc -l)
  if [ "$rc" -ne 2 ] || [ "$lines" -ne 1 ]; then
    echo "bench_phantom $args: exit $rc, $lines stderr lines (want 2 and 1): $err"
    fail=1
  else
    echo "bench_phantom $args: $err"
  fi
done
exit $fail
