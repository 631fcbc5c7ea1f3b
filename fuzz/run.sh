#!/usr/bin/env bash
# Runs every fuzz harness of a libFuzzer build (preset "fuzz") for SECONDS
# each, one after the other, on a working corpus in BUILD/corpus/<name>
# seeded from fuzz/corpus/<name> (read only: new inputs go to the build's
# copy). Crashes land in BUILD/fuzz-artifacts/, logs in BUILD/fuzz-logs/.
# Usage: fuzz/run.sh BUILD SECONDS [NAME...]   (default: every harness)
set -euo pipefail
cd "$(dirname "$0")/.."
build=$1 seconds=$2
shift 2
names=("$@")
if [ ${#names[@]} -eq 0 ]; then
  for f in fuzz/*_fuzz.cc; do names+=("$(basename "$f" _fuzz.cc)"); done
fi
mkdir -p "$build/fuzz-artifacts" "$build/fuzz-logs"
status=0
for name in "${names[@]}"; do
  mkdir -p "$build/corpus/$name"
  log="$build/fuzz-logs/$name.log"
  # -rss_limit_mb: a reader must not allocate beyond its input; -timeout: nor hang.
  if "$build/bin/${name}_fuzz" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=1024 \
       -print_final_stats=1 -artifact_prefix="$build/fuzz-artifacts/$name-" \
       "$build/corpus/$name" "fuzz/corpus/$name" >"$log" 2>&1; then
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
    echo "fuzz $name: ${seconds}s, $execs runs, $cov, corpus $(ls "$build/corpus/$name" | wc -l) files: no finding"
  else
    echo "fuzz $name: FINDING (see $log and $build/fuzz-artifacts/$name-*)"
    grep -m3 -E 'ERROR|finding|runtime error|terminate' "$log" || true
    status=1
  fi
done
exit $status
