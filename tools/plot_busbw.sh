#!/bin/sh
# busbw against size for all_reduce on 1, 2 and 8 nodes of DGX A100
# (profile a100-nvlink, fp32, --algo auto), from shardlab's own output,
# next to the public nccl-tests points the README cites. Writes
# docs/img/busbw_a100.png and .svg (gnuplot-nox). Usage:
#   tools/plot_busbw.sh [BUILD_DIR] [OUT_DIR]     (`make plot-busbw`)
set -eu
build=${1:-build}
out=${2:-docs/img}
bin="$build/bin/shardlab"
[ -x "$bin" ] || { echo "plot_busbw: $bin not found (build first)" >&2; exit 2; }
command -v gnuplot >/dev/null || { echo "plot_busbw: gnuplot not found (apt-get install gnuplot-nox)" >&2; exit 2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

for nodes in 1 2 8; do
  "$bin" collectives --op all_reduce --profile a100-nvlink --nodes "$nodes" --ranks $((8 * nodes)) \
    --min-bytes 64KiB --max-bytes 1GiB --json > "$tmp/n$nodes.json"
  python3 -c '
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["bytes"], r["busbw_GBps"], r["algo"])
' "$tmp/n$nodes.json" > "$tmp/n$nodes.dat"
done

# Public points (bytes, busbw GB/s), each with its source in README
# "Collectives across nodes": one DGX A100 node 232.54 GB/s at 4 GiB
# (nccl-tests#175) and ~230 at 256 MiB (nccl-tests#149); DGX A100 across
# nodes 192 GB/s (NVIDIA/nccl#812, large messages, no size given: drawn at
# 1 GiB; NCCL's ring busbw does not fall with nodes, so the same for 8).
cat > "$tmp/public1.dat" <<'EOF'
268435456 230
4294967296 232.54
EOF
cat > "$tmp/public2.dat" <<'EOF'
1073741824 192
EOF
cat > "$tmp/public8.dat" <<'EOF'
1073741824 192
EOF

mkdir -p "$out"
for term in png svg; do
  if [ "$term" = png ]; then t="pngcairo size 900,560 font 'sans,11'"; else t="svg size 900,560 font 'sans,11'"; fi
  gnuplot <<EOF
set terminal $t
set output '$out/busbw_a100.$term'
set title 'all\\_reduce busbw, DGX A100 (a100-nvlink, fp32, auto): shardlab against nccl-tests'
set logscale x 2
set xrange [49152:6442450944]
set xtics ('64K' 65536, '1M' 1048576, '16M' 16777216, '256M' 268435456, '1G' 1073741824, '4G' 4294967296)
set xlabel 'message size (bytes)'
set ylabel 'busbw (GB/s)'
set yrange [0:260]
set grid
set key left top
plot '$tmp/n1.dat' using 1:2 with linespoints lw 2 pt 7 ps 0.6 lc rgb '#1f77b4' title 'shardlab, 1 node (8 GPUs)', \
     '$tmp/n2.dat' using 1:2 with linespoints lw 2 pt 7 ps 0.6 lc rgb '#ff7f0e' title 'shardlab, 2 nodes (16)', \
     '$tmp/n8.dat' using 1:2 with linespoints lw 2 pt 7 ps 0.6 lc rgb '#2ca02c' title 'shardlab, 8 nodes (64)', \
     '$tmp/public1.dat' using 1:2 with points pt 9 ps 2 lc rgb '#1f77b4' title 'nccl-tests#175, #149 (1 node)', \
     '$tmp/public2.dat' using 1:2 with points pt 11 ps 2 lc rgb '#ff7f0e' title 'NVIDIA/nccl#812 (2 nodes)', \
     '$tmp/public8.dat' using 1:2 with points pt 5 ps 1.4 lc rgb '#2ca02c' title 'NVIDIA/nccl#812 (NCCL ring, any nodes)'
EOF
done
for n in 1 2 8; do
  printf 'plot_busbw: %s node(s): busbw at 1 GiB %s GB/s\n' "$n" "$(tail -n 1 "$tmp/n$n.dat" | cut -d' ' -f2)"
done
echo "plot_busbw: wrote $out/busbw_a100.png and $out/busbw_a100.svg"
