#!/bin/sh
# Issue 34's `small` goal, re-measured: `train --model small --steps S` of a
# baseline binary and of this build, in turns (A B A B ...), R rounds. Prints
# each run's host tokens/s of the last step (what `train` reports), wall and
# CPU seconds and maximum RSS, the load average before each run, then each
# binary's best and the ratio of the bests. From the repository root:
#
#   bench/small_vs_base.sh [BASELINE] [ROUNDS] [STEPS]
#
# BASELINE defaults to /work/wt-base34/build/bin/shardlab (the issue's
# d7e8554); ROUNDS 3, STEPS 3. Needs GNU time (/usr/bin/time, Debian: time).
set -eu
base=${1:-/work/wt-base34/build/bin/shardlab}
rounds=${2:-3}
steps=${3:-3}
cur=build/bin/shardlab
for b in "$base" "$cur"; do
  [ -x "$b" ] || { echo "small_vs_base: no binary $b" >&2; exit 2; }
done
[ -x /usr/bin/time ] || { echo "small_vs_base: needs /usr/bin/time (apt-get install time)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '%-8s %5s %9s %7s %7s %9s %s\n' binary round "tok/s" "wall s" "cpu s" "RSS kB" "load (1 min)"
best_base=0
best_cur=0
r=1
while [ "$r" -le "$rounds" ]; do
  for which in base cur; do
    if [ "$which" = base ]; then bin=$base; else bin=$cur; fi
    load=$(cut -d' ' -f1 /proc/loadavg)
    /usr/bin/time -f '%e %U %S %M' -o "$tmp/time" "$bin" train --model small --steps "$steps" \
      >"$tmp/out" 2>"$tmp/err" || { echo "small_vs_base: $bin failed" >&2; cat "$tmp/err" >&2; exit 1; }
    # the last "... | N tok/s host" line of the progress output
    toks=$(tr '\r' '\n' <"$tmp/err" | grep -o '[0-9]* tok/s host' | tail -1 | cut -d' ' -f1)
    set -- $(cat "$tmp/time")
    cpu=$(echo "$2 + $3" | bc)
    printf '%-8s %5d %9s %7s %7s %9s %s\n' "$which" "$r" "$toks" "$1" "$cpu" "$4" "$load"
    if [ "$which" = base ]; then
      [ "$toks" -gt "$best_base" ] && best_base=$toks
    else
      [ "$toks" -gt "$best_cur" ] && best_cur=$toks
    fi
  done
  r=$((r + 1))
done
echo "best tok/s: base $best_base, current $best_cur, ratio $(echo "scale=3; $best_cur / $best_base" | bc)"
