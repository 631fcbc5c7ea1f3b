#!/usr/bin/env bash
# Runs the pinned runs (tests/model/train/pinned_runs_test.cc) of one build
# directory and says how many executed. Every pin must run and match: none
# may be skipped, so a build whose arithmetic differs fails here.
#   tests/run_pins.sh build            (the native build of `make test`)
#   tests/run_pins.sh build-portable   (`make pins-portable`)
set -euo pipefail
dir=${1:?usage: tests/run_pins.sh BUILD_DIR}
total=$(ctest --test-dir "$dir" -N -R '^Pins/' | sed -n 's/^Total Tests: //p')
if [ -z "$total" ] || [ "$total" -eq 0 ]; then
  echo "shardlab: no pinned run is registered in $dir" >&2
  exit 1
fi
log=$(mktemp)
trap 'rm -f "$log"' EXIT
status=0
ctest --test-dir "$dir" -R '^Pins/' --output-on-failure >"$log" 2>&1 || status=$?
passed=$(grep -c 'Pins/PinnedRun.* Passed' "$log" || true)
if [ "$status" -ne 0 ] || [ "$passed" -ne "$total" ]; then
  cat "$log"
  echo "shardlab: $passed of $total pinned runs matched their pins in $dir" >&2
  exit 1
fi
echo "shardlab: $passed of $total pinned runs executed in $dir, every loss and parameter bit-identical to its pin"
