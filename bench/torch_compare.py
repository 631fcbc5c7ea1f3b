#!/usr/bin/python3
"""Host tokens/s of shardlab's real-math training next to PyTorch's, same run.

PyTorch is a comparator only (never a dependency of shardlab). Install it from
Debian with OpenBLAS (without it Debian's torch runs on the reference BLAS,
about 10x slower: no fair comparison), then run with the system interpreter
from the repository root:

    sudo apt-get install -y python3-torch libopenblas0-pthread
    /usr/bin/python3 bench/torch_compare.py [--model tiny] [--threads 1] [--rounds 5]

The same GPT-2 model (nanoGPT: learned positions, pre-LayerNorm blocks, tanh
GELU, biases on every Linear, LM head tied to the token embedding), the same
batch and sequence, fp32, AdamW, trained for --steps steps by each side. The
two programs are interleaved --rounds times and each side's best round counts:
on a shared machine the best of N is the least disturbed one.

--threads 1: torch.set_num_threads(1) against `shardlab train` pinned to one
core (taskset -c 0: its one device thread, nothing to borrow), torch's
process pinned to the same core while it runs. --threads 2:
torch on 2 threads against the same one-device run on 2 cores, whose GEMMs,
attention and element-wise kernels then split over the idle core
(model/host_split.h).

--bound (tiny, --threads 1): each round also runs bench_train's
BM_FmaPeak, BM_TinyGemms, BM_TinyAttention and BM_TinyTrainStep on the
same core (best of the rounds each), and prints the FLOPs of a step by part,
each part's rate as a share of the measured FMA peak, torch's rate on the
same FLOPs, and the bound: the ratio over torch if the linear layers' GEMMs
(FLOPs no implementation of this model avoids) ran at the peak and nothing
else took any time.
"""
import json
import argparse
import os
import re
import subprocess
import sys
import time

PRESETS = {  # (layers, heads, embd, seq, vocab, batch): model/presets.cc
    "nano": (2, 2, 64, 32, 256, 4),
    "tiny": (4, 4, 128, 64, 512, 8),
    "small": (6, 6, 384, 256, 4096, 16),
}


def bench_cores(threads):
    """The first `threads` cores this process may use: both sides run on them."""
    return sorted(os.sched_getaffinity(0))[:threads]


def shardlab_tokens_per_s(binary, model, steps, threads):
    cores = ["taskset", "-c", ",".join(str(c) for c in bench_cores(threads))]
    out = subprocess.run(cores + [binary, "train", "--model", model, "--steps", str(steps)],
                         check=True, capture_output=True, text=True).stdout
    m = re.search(r"^host: ([0-9.]+) tokens/s", out, re.M)
    if not m:
        sys.exit("torch_compare: no 'host: N tokens/s' line in shardlab's output")
    return float(m.group(1))


BOUND_FILTER = "BM_FmaPeak|BM_TinyGemms|BM_TinyAttention|BM_TinyTrainStep/tiny/threads:1/"


def bench_train_runs(binary, threads):
    """bench_train's figures for the bound, by benchmark name (CPU s per iteration, counters)."""
    cores = ["taskset", "-c", ",".join(str(c) for c in bench_cores(threads))]
    out = subprocess.run(cores + [binary, f"--benchmark_filter={BOUND_FILTER}", "--benchmark_format=json"],
                         check=True, capture_output=True, text=True).stdout
    runs = {}
    for b in json.loads(out)["benchmarks"]:
        name = b["name"].split("/min_time")[0]
        scale = {"ms": 1e-3, "us": 1e-6, "ns": 1e-9, "s": 1.0}[b.get("time_unit", "ns")]
        runs[name] = dict(b, seconds=b["cpu_time"] * scale)
    return runs


def print_bound(runs, torch_tps):
    """The tiny step's FLOPs by part, the rates as shares of the FMA peak, and the bound over torch.

    Every time here is CPU time (bench_train's, and torch's tokens per CPU
    second): on a shared machine it moves less with the load than the wall."""
    peak = runs["BM_FmaPeak"]["GFLOP/s"]
    step = runs["BM_TinyTrainStep/tiny/threads:1"]
    tokens = PRESETS["tiny"][3] * PRESETS["tiny"][5]  # seq x batch per step
    total = step["GFLOP/step"]
    fwd, bwd = runs["BM_TinyGemms/fwd"], runs["BM_TinyGemms/bwd"]
    att = runs["BM_TinyAttention"]
    rest = step["GF_elementw"] + step["GF_optim"] + step["GF_att_gemm"] - att["GFLOP/step"]
    print(f"measured FMA peak of one core: {peak:.1f} GFLOP/s")
    print(f"{'part of a tiny step':34s} {'GFLOP':>7s} {'ms':>6s} {'GFLOP/s':>8s} {'of peak':>7s}")
    rows = [("linear GEMMs, forward (alone)", fwd["GFLOP/step"], fwd["seconds"]),
            ("linear GEMMs, backward (alone)", bwd["GFLOP/step"], bwd["seconds"]),
            ("attention, fwd + bwd (alone)", att["GFLOP/step"], att["seconds"])]
    for name, gf, sec in rows:
        print(f"{name:34s} {gf:7.3f} {sec * 1e3:6.2f} {gf / sec:8.1f} {gf / sec / peak:7.1%}")
    left = step["seconds"] - sum(sec for _, _, sec in rows)
    print(f"{'the rest (step minus the above)':34s} {rest:7.3f} {left * 1e3:6.2f}")
    print(f"{'whole step (shardlab)':34s} {total:7.3f} {step['seconds'] * 1e3:6.2f} "
          f"{total / step['seconds']:8.1f} {total / step['seconds'] / peak:7.1%}")
    torch_s = tokens / torch_tps
    print(f"{'whole step (torch, CPU time)':34s} {total:7.3f} {torch_s * 1e3:6.2f} {total / torch_s:8.1f} "
          f"{total / torch_s / peak:7.1%}")
    linear = step["GF_lin_fwd"] + step["GF_lin_bwd"]
    floor = linear / peak  # s per step: the linear GEMMs at the peak, all else free
    print(f"torch: {torch_tps:.0f} tokens per CPU second (best round)")
    print(f"bound: linear GEMMs ({linear:.3f} GFLOP) at the peak, everything else free: "
          f"{floor * 1e3:.2f} ms per step, {tokens / floor:.0f} tok/s, "
          f"{tokens / floor / torch_tps:.2f}x torch")
    need = tokens / (2.0 * torch_tps)  # s per step for 2.0x
    gemms = fwd["seconds"] + bwd["seconds"]
    print(f"2.0x torch needs {need * 1e3:.2f} ms per step: the linear GEMMs at "
          f"{linear / need / peak:.0%} of the peak with nothing else; at their measured rate "
          f"({linear / gemms / peak:.0%}) they alone take {gemms * 1e3:.2f} ms")


def torch_model(torch, layers, heads, embd, seq, vocab):
    nn = torch.nn
    F = torch.nn.functional

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1, self.ln_2 = nn.LayerNorm(embd), nn.LayerNorm(embd)
            self.c_attn, self.attn_proj = nn.Linear(embd, 3 * embd), nn.Linear(embd, embd)
            self.c_fc, self.c_proj = nn.Linear(embd, 4 * embd), nn.Linear(4 * embd, embd)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, heads, C // heads).transpose(1, 2) for t in (q, k, v))
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True) \
                if hasattr(F, "scaled_dot_product_attention") else self.attend(q, k, v, T)
            x = x + self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))
            return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))

        @staticmethod
        def attend(q, k, v, T):  # torch < 2.0: the explicit masked softmax
            att = (q @ k.transpose(-2, -1)) * (1.0 / (k.size(-1) ** 0.5))
            mask = torch.ones(T, T, dtype=torch.bool).tril()
            return att.masked_fill(~mask, float("-inf")).softmax(dim=-1) @ v

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, embd), nn.Embedding(seq, embd)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln_f = nn.LayerNorm(embd)

        def forward(self, idx, targets):
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for b in self.blocks:
                x = b(x)
            logits = self.ln_f(x) @ self.wte.weight.t()  # tied LM head
            return F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))

    return GPT()


def torch_tokens_per_s(torch, model, steps, threads):
    layers, heads, embd, seq, vocab, batch = PRESETS[model]
    # On the cores shardlab gets: on a loaded machine an unpinned torch would
    # take whichever core is idler while shardlab waits its turn on core 0.
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, bench_cores(threads))
    try:
        return torch_steps(torch, layers, heads, embd, seq, vocab, batch, steps, threads)
    finally:
        os.sched_setaffinity(0, allowed)


def torch_steps(torch, layers, heads, embd, seq, vocab, batch, steps, threads):
    torch.set_num_threads(threads)
    torch.manual_seed(1337)
    net = torch_model(torch, layers, heads, embd, seq, vocab)
    opt = torch.optim.AdamW(net.parameters(), lr=3e-4, weight_decay=0.1)
    data = torch.randint(0, vocab, (steps + 1, batch, seq + 1))
    warmup = 2
    for i in range(steps + warmup):
        if i == warmup:
            t0, c0 = time.perf_counter(), time.process_time()
        x = data[i % len(data)]
        loss = net(x[:, :-1], x[:, 1:])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    tokens = batch * seq * steps
    return tokens / (time.perf_counter() - t0), tokens / (time.process_time() - c0)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", choices=sorted(PRESETS))
    ap.add_argument("--threads", type=int, default=1, choices=(1, 2))
    ap.add_argument("--steps", type=int, default=0, help="steps per round (0: by model)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--shardlab", default="build/bin/shardlab")
    ap.add_argument("--baseline", help="another shardlab binary (e.g. main's), in the same rounds")
    ap.add_argument("--bound", action="store_true", help="also bench_train's bound (tiny, 1 thread)")
    args = ap.parse_args()
    # torch's BLAS (OpenBLAS) keeps its own thread pool: hold it to --threads too
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    try:
        import torch
    except ImportError:
        sys.exit("torch_compare: PyTorch is missing: "
                 "sudo apt-get install -y python3-torch libopenblas0-pthread")
    if not os.access(args.shardlab, os.X_OK):
        sys.exit(f"torch_compare: {args.shardlab} not built (make build)")
    steps = args.steps or {"nano": 400, "tiny": 200, "small": 10}[args.model]
    if args.baseline and not os.access(args.baseline, os.X_OK):
        sys.exit(f"torch_compare: {args.baseline} is not an executable")
    bench_train = os.path.join(os.path.dirname(args.shardlab), "bench_train")
    if args.bound and (args.model != "tiny" or args.threads != 1 or not os.access(bench_train, os.X_OK)):
        sys.exit(f"torch_compare: --bound needs --model tiny --threads 1 and {bench_train} built")
    bound = {}
    best_s = best_b = best_t = best_t_cpu = 0.0
    for r in range(args.rounds):  # interleaved: all see the same machine load
        s = shardlab_tokens_per_s(args.shardlab, args.model, steps, args.threads)
        b = shardlab_tokens_per_s(args.baseline, args.model, steps, args.threads) if args.baseline else 0.0
        t, t_cpu = torch_tokens_per_s(torch, args.model, steps, args.threads)
        best_t_cpu = max(best_t_cpu, t_cpu)
        best_s, best_b, best_t = max(best_s, s), max(best_b, b), max(best_t, t)
        if args.bound:  # each benchmark's least disturbed round
            for name, run in bench_train_runs(bench_train, args.threads).items():
                if name not in bound or run["seconds"] < bound[name]["seconds"]:
                    bound[name] = run
        base = f", baseline {b:.0f} tok/s" if args.baseline else ""
        print(f"round {r + 1}: shardlab {s:.0f} tok/s{base}, torch {t:.0f} tok/s", flush=True)
    print(f"{args.model}, {args.threads} thread(s), best of {args.rounds}, torch {torch.__version__}, "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"shardlab {best_s:.0f} tok/s, torch {best_t:.0f} tok/s, ratio {best_s / best_t:.2f}x")
    if args.bound:
        print_bound(bound, best_t_cpu)
    if args.baseline:
        print(f"baseline {best_b:.0f} tok/s, ratio {best_b / best_t:.2f}x; shardlab / baseline "
              f"{best_s / best_b:.3f}")


if __name__ == "__main__":
    main()
