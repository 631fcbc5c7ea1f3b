#!/usr/bin/python3
"""Where a real-math training step spends its host time, by kind of work.

Samples `shardlab train` with perf (software cpu-clock: no hardware counters
needed, so it works in containers) and sorts the self time of every symbol
into GEMM, attention, element-wise kernels, channels (copies between
devices), synchronization and the rest. From the repository root:

    /usr/bin/python3 bench/profile_shares.py --model tiny --steps 200
    /usr/bin/python3 bench/profile_shares.py --model small --steps 6

Needs perf (Debian: linux-perf). Extra arguments after `--` go to train.
"""
import argparse
import collections
import re
import subprocess
import sys
import tempfile

# First match wins; patterns are searched in the demangled symbol.
KINDS = [
    ("GEMM", r"gebp|wide_block|gemm_pack|general_matrix_matrix|gemm_nt|gemm_nn_acc|gemm_tn_acc|"
             r"triangular|general_matrix_vector|pm::dot|axpy"),
    ("attention", r"attention_|sum_rows|row_sums|causal_softmax|causal_scores|backward_pair|::context<"),
    ("element-wise", r"layernorm|rmsnorm|gelu|swiglu|residual|crossentropy|softmax_row|exp_sum_row|embedding_|"
                     r"adamw|sum_squares|scale_inplace|linear_forward|linear_backward|"
                     r"rope|lerp|tanh_of|exp_of"),
    ("channels", r"memcpy|memmove|Channel|channel|Link|send|recv|wire::"),
    ("synchronization", r"futex|pthread_cond|pthread_mutex|condition_variable|"
                        r"__lll_lock|sched_yield|tbb.*(wait|sleep|receive)|do_wait"),
    ("memory (fill, alloc)", r"memset|malloc|free|operator new|operator delete|_int_"),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--shardlab", default="build/bin/shardlab")
    ap.add_argument("--top", type=int, default=12, help="also print the top N symbols")
    ap.add_argument("rest", nargs="*", help="more train arguments (after --)")
    args = ap.parse_args()
    with tempfile.NamedTemporaryFile(suffix=".perf") as data:
        cmd = ["perf", "record", "-q", "-e", "cpu-clock", "-F", "2000", "-o", data.name,
               args.shardlab, "train", "--model", args.model, "--steps", str(args.steps)] + args.rest
        if subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode != 0:
            sys.exit("profile_shares: perf record failed (is linux-perf installed?)")
        report = subprocess.run(["perf", "report", "-i", data.name, "--no-children", "--stdio",
                                 "--sort", "symbol", "--percent-limit", "0"],
                                capture_output=True, text=True, check=True).stdout
    shares = collections.Counter()
    top = []
    for line in report.splitlines():
        m = re.match(r"\s*([0-9.]+)%\s+\[[.k]\]\s+(.*)", line)
        if not m:
            continue
        pct, sym = float(m.group(1)), m.group(2).strip()
        kind = next((k for k, pat in KINDS if re.search(pat, sym)), "other")
        shares[kind] += pct
        top.append((pct, kind, sym))
    print(f"# {args.model}, {args.steps} steps: share of sampled host time (self)")
    for kind, _ in KINDS + [("other", "")]:
        print(f"{kind:22s} {shares[kind]:5.1f}%")
    print(f"# top {args.top} symbols")
    for pct, kind, sym in sorted(top, reverse=True)[: args.top]:
        print(f"{pct:5.1f}%  {kind:16s} {sym[:110]}")


if __name__ == "__main__":
    main()
