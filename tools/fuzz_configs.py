#!/usr/bin/env python3
"""Random parallel configurations through `shardlab verify`.

Each run draws a small model (gpt or llama, MoE or dense) and a random
layout: tp, pp, dp, cp, ep, ZeRO stage, pipeline schedule and chunks,
recomputation, attention kernels, precision, SP and the overlap flags. The
batch, vocabulary, heads and sequence are then made divisible where the
layout needs it, so that about a third of the draws are valid. Every run
must end in one of two ways:
  - exit 0: the sharded run matches the unsharded model (verify's PASS);
  - exit 2 with exactly one error line: a refused configuration.
Anything else (verify's FAIL, a crash, an internal check, several lines, a
run over the time limit) is printed as BAD with its command line. The
output ends with the exit-code counts and the most common refusals.

  tools/fuzz_configs.py [--seed N] [--runs N] [--shardlab PATH] [--timeout S]

Session 33's 1,000 runs found two bugs this way: the tied embedding's
pipeline copies drifting apart under `--pp 3 --dp 3`, and `--schedule
interleaved` on one pipeline rank aborting (README "Fuzzing").
"""
import argparse
import random
import re
import subprocess
import sys

FLAGS_WITH_VALUES = [  # flag, choices, probability of drawing it
    ("--tp", [1, 2, 3, 4], 0.5), ("--pp", [1, 2, 3, 4], 0.5), ("--dp", [1, 2, 3, 4], 0.5),
    ("--cp", [1, 2], 0.25), ("--ep", [1, 2], 0.2), ("--micro-batches", [1, 2, 3, 4, 6], 0.5),
    ("--zero", [0, 1, 2, 3], 0.3),
    ("--schedule", ["gpipe", "1f1b", "interleaved", "zb-h1", "zb-h2", "zb-v", "dualpipev"], 0.4),
    ("--vpp", [2, 3], 0.2), ("--recompute", ["selective", "full"], 0.25),
    ("--attention", ["fused", "unfused"], 0.3), ("--precision", ["bf16", "fp8"], 0.15),
    ("--hsdp", [2], 0.05), ("--cp-comm", ["allgather"], 0.1), ("--pp-layers", ["1,1", "2,1", "1,2,1"], 0.05),
]
SWITCHES = [("--sp", 0.3), ("--tp-comm-overlap", 0.1), ("--use-distributed-optimizer", 0.1),
            ("--overlap-param-gather", 0.1), ("--no-overlap", 0.1), ("--grads", 0.3),
            ("--scatter-gather", 0.05), ("--bucket-per-chunk", 0.05), ("--no-tie-embeddings", 0.1)]


def draw(rng):
    flags = {}
    for flag, choices, p in FLAGS_WITH_VALUES:
        if rng.random() < p:
            flags[flag] = str(rng.choice(choices))
    switches = [f for f, p in SWITCHES if rng.random() < p]
    tp, dp = int(flags.get("--tp", 1)), int(flags.get("--dp", 1))
    cp, mb = int(flags.get("--cp", 1)), int(flags.get("--micro-batches", 1))
    family = rng.choice(["gpt", "llama"])
    heads = tp * rng.choice([1, 2])
    args = ["verify", "--family", family, "--layers", str(rng.choice([1, 2, 3, 4, 5, 6, 8])),
            "--heads", str(heads), "--embd", str(heads * 8), "--seq", str(2 * cp * tp * rng.choice([2, 4])),
            "--vocab", str(tp * rng.choice([16, 25, 32])), "--steps", str(rng.choice([1, 2, 3])),
            "--batch", str(dp * mb * rng.choice([1, 2]))]
    if family == "llama" and rng.random() < 0.5:
        args += ["--kv-heads", str(rng.choice([1, heads]))]
    if rng.random() < 0.3:
        args += ["--experts", str(rng.choice([2, 4, 6])), "--moe-top-k", str(rng.choice([1, 2]))]
    if "--vpp" in flags and "--schedule" not in flags:
        flags["--schedule"] = "interleaved"
    if tp == 1 and "--sp" in switches:
        switches.remove("--sp")
    for flag, value in flags.items():
        args += [flag, value]
    return args + switches


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--shardlab", default="build/bin/shardlab")
    ap.add_argument("--timeout", type=float, default=120)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    codes, refusals, bad = {}, {}, 0
    for _ in range(a.runs):
        args = draw(rng)
        try:
            r = subprocess.run([a.shardlab] + args, capture_output=True, text=True, timeout=a.timeout)
        except subprocess.TimeoutExpired:
            bad += 1
            print("BAD (over %gs):" % a.timeout, " ".join(args), flush=True)
            continue
        codes[r.returncode] = codes.get(r.returncode, 0) + 1
        err = [l for l in r.stderr.strip().splitlines() if not re.match(r"^\[\d{4}-", l)]  # log lines aside
        if r.returncode == 0:
            continue
        if r.returncode == 2 and len(err) == 1:
            kind = re.sub(r"\d+", "N", err[0])[:100]
            refusals[kind] = refusals.get(kind, 0) + 1
            continue
        bad += 1
        tail = r.stdout.strip().splitlines()[-6:] + err[-5:]
        print("BAD (exit %d):" % r.returncode, " ".join(args), "\n   " + "\n   ".join(tail), flush=True)
    print("runs %d, exit codes %s, bad %d" % (a.runs, dict(sorted(codes.items())), bad))
    for kind, n in sorted(refusals.items(), key=lambda kv: -kv[1])[:25]:
        print("%5d  %s" % (n, kind))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
