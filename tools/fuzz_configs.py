#!/usr/bin/env python3
"""Random parallel configurations through `shardlab verify`.

Each run draws a small model (gpt or llama, dense or MoE with its router,
capacity, shared and fine-grained experts) and a random layout: tp, pp, dp,
cp, ep, ZeRO stage, pipeline schedule and chunks, recomputation, attention
kernels, fusions, precision, SP, buckets, the overlap flags, the optimizer's
clip and schedule, and the hardware profile. The
batch, vocabulary, heads and sequence are then made divisible where the
layout needs it, so that about a third of the draws are valid. Every run
must end in one of two ways:
  - exit 0: the sharded run matches the unsharded model (verify's PASS);
  - exit 2 with exactly one error line: a refused configuration.
Anything else (verify's FAIL, a crash, an internal check, several lines, a
run over the time limit) is printed as BAD with its command line. The
output ends with the exit-code counts and the most common refusals.

  tools/fuzz_configs.py [--mode verify|fold|serve|generate|collectives|...] [--wide] [--seed N] [--runs N] [--shardlab PATH] [--timeout S]

--mode serve draws `serve` runs (model, tp/pp/ep, replicas, router,
disaggregation, scheduler, KV blocks, chunked prefill, prefix caching,
speculative decoding, sampling, workload; half of them phantom, each of
those also run with --no-fold and compared).

--mode phantom draws `train` runs of dense sharded models (tp, pp or cp > 1:
one plain device runs the unsharded reference's own kernels) and runs each
again with --phantom --no-fold: the step times, the summary's clock figures
and every device's figures must be the real run's (the clip is 0 or 1e-4, so
that the clip kernel runs as a phantom run assumes, or not at all).

--mode mpi draws `train` runs as verify does and runs each valid one again
under `mpirun -np N` (N 2 to 4): the report, less host wall-clock fields,
must be the single process's.

--mode resume draws `train` runs as verify does; each valid one of 2 or 3
steps is run again stopped at half with --checkpoint-dir and resumed: the
same loss at every step and the same --save bytes (where the tp ranks' dp
groups sit differently on the nodes, losses within 1e-5: README
"Checkpoints and resume").

--mode reshard draws `train` runs as resume does and a second layout of
the same model and batch (tp, pp, dp, cp, ep, ZeRO, micro-batches,
schedule, recomputation, SP and the overlap flags drawn again): the first
layout runs half the steps with --checkpoint-dir, the second resumes from
it (README "Resume, another parallel config: resharding"); every later
step's loss must be the straight run's within 1e-5 (verify's tolerance).

--mode generate draws `generate` runs (model, tp/pp/ep, prompt, sampler,
seed); a sharded one's tokens must be those of the same model on one device.

--mode collectives draws `collectives --check` tables (op, ranks over 1 to 4
nodes, profile, algorithm, protocol, reduction, sizes from 1 byte; one in
five a `p2p` table, whose latency may not fall as the message grows): every
result must equal the serial reference (--check), each algorithm's time
must not fall as the buffer grows, and where the draw is auto (algorithm and
protocol) every size's time must be the least of the candidates auto weighs
(tuner.h: ring, tree, direct but not for an all_reduce across nodes, NVLS
where it applies), each run alone with --algo.

--mode fold draws wider data parallelism and runs `train --phantom` twice,
folded and with --no-fold: the virtual clock must not move (every step's
time, the summary, every device's figures, compared exactly).

Session 33's 1,000 runs found two bugs this way: the tied embedding's
pipeline copies drifting apart under `--pp 3 --dp 3`, and `--schedule
interleaved` on one pipeline rank aborting (README "Fuzzing").
"""
import argparse
import json
import os
import tempfile
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
    ("--fusions", ["all", "none", "no-norm", "bias-dropout-add", "no-cross-entropy,swiglu"], 0.1),
    ("--dropout", [0.1], 0.05), ("--grad-clip", [0, 0.5], 0.1), ("--weight-decay", [0, 0.1], 0.1),
    ("--lr-schedule", ["cosine"], 0.05), ("--warmup-steps", [1, 2], 0.05), ("--bucket-mb", [0.001, 0.01, 1], 0.15),
    ("--ffn", [8, 24, 40], 0.1), ("--sampling", ["sequential"], 0.05),
    ("--profile", ["a100-nvlink", "h100-nvlink", "a100-pcie-8", "a100-nvlink-4nic"], 0.15),
    ("--make-vocab-size-divisible-by", [1, 8, 64], 0.05),
]
MOE_FLAGS = [  # drawn with --experts only
    ("--moe-every", [1, 2], 0.2), ("--capacity-factor", [0, 1, 1.25], 0.2), ("--moe-ffn", [8, 16], 0.2),
    ("--shared-experts", [0, 1], 0.2), ("--moe-router", ["softmax", "sigmoid"], 0.2),
    ("--moe-first-dense", [0, 1], 0.15), ("--router-bias-rate", [0, 0.01], 0.15), ("--aux-coef", [0, 0.01], 0.1),
    ("--moe-groups", [2, 3], 0.15), ("--moe-group-top-k", [1, 2], 0.1), ("--moe-dispatcher", ["deepep"], 0.15),
]
SWITCHES = [("--sp", 0.3), ("--tp-comm-overlap", 0.1), ("--use-distributed-optimizer", 0.1),
            ("--overlap-param-gather", 0.1), ("--no-overlap", 0.1), ("--grads", 0.3),
            ("--scatter-gather", 0.05), ("--bucket-per-chunk", 0.05), ("--no-tie-embeddings", 0.1),
            ("--tie-embeddings", 0.05), ("--reshard-after-forward", 0.05), ("--grad-reduce-in-bf16", 0.05),
            ("--no-grad-accum-fusion", 0.05), ("--overlap-p2p-comm", 0.05), ("--moe-norm-topk", 0.05),
            ("--no-prefetch", 0.05)]


def draw(rng, mode="verify", wide=False):
    """A random layout for `mode`: verify's command, train --phantom (fold),
    a real train (phantom: dense and sharded; mpi and resume)."""
    fold, real, resume = mode == "fold", mode == "phantom", mode in ("resume", "reshard")
    mpi = mode in ("mpi", "resume", "reshard")
    flags = {}
    for flag, choices, p in FLAGS_WITH_VALUES:
        if rng.random() < p:
            flags[flag] = str(rng.choice(choices))
    if fold:  # wider data parallelism, so that folding has replicas to fold
        if rng.random() < 0.8:
            flags["--dp"] = str(rng.choice([2, 3, 4, 8, 12, 16]))
        if wide and rng.random() < 0.3:  # --wide: more nodes, and whole nodes per tp group
            flags["--dp"] = str(rng.choice([24, 32, 64]))
            if rng.random() < 0.3:
                flags["--tp"] = "8"
        if "--ep" in flags:
            flags["--ep"] = str(rng.choice([2, 4]))
    switches = [f for f, p in SWITCHES if rng.random() < p and (not (fold or real or mpi) or f != "--grads")]
    tp, dp = int(flags.get("--tp", 1)), int(flags.get("--dp", 1))
    cp, mb = int(flags.get("--cp", 1)), int(flags.get("--micro-batches", 1))
    family = rng.choice(["gpt", "llama"])
    heads = tp * rng.choice([1, 2])
    args = ["train", "--phantom", "--json"] if fold else ["train", "--json"] if real or mpi else ["verify"]
    if mpi and not resume and rng.random() < 0.3:
        args.append("--phantom")  # folded across the processes
    if fold:
        world = tp * int(flags.get("--pp", 1)) * dp * cp
        args += ["--nodes", str(max(1, -(-world // 8)))]  # every profile drawn has 8-GPU nodes
        if "--profile" in flags and rng.random() < 0.5:
            flags["--profile"] = "h100-roce"  # fabric tiers between the nodes
    args += ["--family", family, "--layers", str(rng.choice([1, 2, 3, 4, 5, 6, 8])),
            "--heads", str(heads), "--embd", str(heads * 8), "--seq", str(2 * cp * tp * rng.choice([2, 4])),
            "--vocab", str(tp * rng.choice([16, 25, 32])), "--steps", str(rng.choice([1, 2, 3])),
            "--batch", str(dp * mb * rng.choice([1, 2]))]
    if family == "llama" and rng.random() < 0.5:
        args += ["--kv-heads", str(rng.choice([1, heads]))]
    if rng.random() < 0.2:  # Qwen3's attention: heads of their own size, QK-norm (llama; gpt: the refusal)
        args += ["--head-dim", str(rng.choice([4, 12, 16]))] if family == "llama" or rng.random() < 0.1 else []
        args += ["--qk-norm"] if family == "llama" or rng.random() < 0.1 else []
    elif rng.random() < 0.2 and (family == "llama" or rng.random() < 0.1):
        # DeepSeek-V3's MLA (llama, no GQA; else the refusals now and then)
        args += ["--kv-lora-rank", str(rng.choice([8, 16])), "--qk-rope-head-dim", str(rng.choice([2, 4])),
                 "--q-lora-rank", str(rng.choice([0, 12, 24])), "--head-dim", str(rng.choice([4, 6, 8]))]
        if rng.random() < 0.5:
            args += ["--v-head-dim", str(rng.choice([4, 8]))]
        if "--kv-heads" in args and rng.random() < 0.9:
            i = args.index("--kv-heads")
            del args[i:i + 2]
    if rng.random() < 0.3 and not real:  # real against phantom: dense (a phantom MoE routes uniformly)
        args += ["--experts", str(rng.choice([2, 4, 6])), "--moe-top-k", str(rng.choice([1, 2]))]
        for flag, choices, p in MOE_FLAGS:
            if flag == "--moe-dispatcher" and flags.get("--ep", "1") == "1" and rng.random() < 0.9:
                continue  # it needs --ep > 1 (drawn without it now and then: the refusal)
            if rng.random() < p:
                args += [flag, str(rng.choice(choices))]
    if "--experts" in args and tp > 1 and rng.random() < 0.6:  # whole experts: the EP group over tp x dp
        experts = int(args[args.index("--experts") + 1])
        eps = [e for e in (tp, 2 * tp) if experts % e == 0 and (tp * dp) % e == 0]
        if eps:
            flags["--ep"] = str(rng.choice(eps))
            args += ["--expert-tp", "1"]
            if "--sp" not in switches and rng.random() < 0.9:
                switches.append("--sp")  # needed (drawn without it now and then: the refusal)
    if real:  # the clip kernel runs when the norm is over the clip: a phantom run assumes it does
        flags["--grad-clip"] = rng.choice(["0", "0.0001"])
        flags.pop("--ep", None)
        if all(flags.get(f, "1") == "1" for f in ("--tp", "--pp", "--cp")):
            flags["--pp"] = "2"  # the sharded model (one plain device runs the unsharded reference's own kernels)
    if "--vpp" in flags and "--schedule" not in flags:
        flags["--schedule"] = "interleaved"
    if tp == 1 and "--sp" in switches:
        switches.remove("--sp")
    for flag, value in flags.items():
        args += [flag, value]
    if rng.random() < 0.15:  # Megatron's recompute_method and recompute_num_layers (without full now and then)
        args += ["--recompute-method", rng.choice(["uniform", "block"]), "--recompute-num-layers",
                 str(rng.choice([1, 2, 3]))]
        if "--recompute" not in args and rng.random() < 0.9:
            args += ["--recompute", "full"]
    if rng.random() < 0.2:  # Megatron's recompute_modules (with --recompute full now and then: the refusal)
        names = ["core_attn", "mlp"] + (["layernorm", "moe", "moe_act", "shared_experts"]
                                        if "--experts" in args or rng.random() < 0.1 else []) + (
                                        ["mla_up_proj"] if "--kv-lora-rank" in args or rng.random() < 0.1 else [])
        args += ["--recompute-modules", ",".join(rng.sample(names, rng.choice([1, 2, 3][:len(names)])))]
    return args + switches


SERVE_FLAGS = [  # flag, choices, probability: `serve` runs
    ("--tp", [1, 2, 4], 0.4), ("--pp", [1, 2, 3], 0.3), ("--replicas", [1, 2, 3], 0.3),
    ("--router", ["round-robin", "least-loaded", "prefix"], 0.3), ("--batching", ["static", "continuous"], 0.2),
    ("--max-batch-tokens", [16, 64, 8192], 0.3), ("--max-seqs", [1, 2, 8], 0.3), ("--kv-block", [1, 4, 16], 0.3),
    ("--kv-fraction", [0.01, 0.5], 0.1), ("--chunked-prefill", [0, 4, 16], 0.3), ("--shared-prefix", [0, 4, 8], 0.2),
    ("--temperature", [0, 0.7, 1.5], 0.4), ("--top-k", [0, 1, 5], 0.3), ("--top-p", [0.5, 0.9, 1], 0.3),
    ("--arrival", ["poisson:1", "poisson:100", "burst"], 0.4), ("--precision", ["fp32", "bf16"], 0.3),
    ("--prompt-len", ["1", "5", "uniform:1:20", "lognormal:8:0.5:30"], 0.6),
    ("--output-len", ["1", "4", "uniform:1:10", "lognormal:4:0.5:12"], 0.6),
    ("--speculative", ["draft=tiny,k=2", "draft=tiny,k=3,accept=0.5"], 0.1),
    ("--disaggregate", ["prefill=1,decode=1", "prefill=2,decode=1"], 0.1),
    ("--profile", ["a100-nvlink", "h100-nvlink", "a100-pcie-8"], 0.2),
]


def draw_serve(rng):
    """A random `serve` run: a small model (dense or MoE, gpt or llama), a
    parallel layout, a scheduler, a workload and a sampler; half phantom."""
    flags = {}
    for flag, choices, p in SERVE_FLAGS:
        if rng.random() < p:
            flags[flag] = str(rng.choice(choices))
    phantom = rng.random() < 0.5
    if rng.random() < 0.8:  # mostly a consistent draw; the rest tests the refusals
        if "--replicas" not in flags and "--disaggregate" not in flags:
            flags.pop("--router", None)
        if float(flags.get("--temperature", 0)) == 0 or phantom:
            for f in ("--temperature", "--top-k", "--top-p"):
                flags.pop(f, None)
        if flags.get("--router") == "prefix" or "--prefix-caching" in flags:
            flags["--batching"] = "continuous"
        if phantom and "--speculative" in flags and "accept" not in flags["--speculative"]:
            flags["--speculative"] += ",accept=0.7"
        if not phantom and "accept" in flags.get("--speculative", ""):
            flags["--speculative"] = "draft=tiny,k=2"
        if "--disaggregate" in flags:
            flags.pop("--replicas", None)
        flags.setdefault("--prompt-len", str(rng.choice(["1", "5", "uniform:1:20"])))  # 128 + 128 fills no context here
        flags.setdefault("--output-len", str(rng.choice(["1", "4", "uniform:1:10"])))
    tp = int(flags.get("--tp", 1))
    family = rng.choice(["gpt", "llama"])
    heads = tp * rng.choice([1, 2])
    args = ["serve", "--json", "--family", family, "--layers", str(rng.choice([1, 2, 3, 4])), "--heads", str(heads),
            "--embd", str(heads * 8), "--seq", str(rng.choice([32, 64, 128])), "--vocab", str(tp * rng.choice([16, 25, 32])),
            "--requests", str(rng.choice([1, 3, 8]))]
    if family == "llama" and rng.random() < 0.5:
        args += ["--kv-heads", str(rng.choice([1, heads]))]
    if family == "llama" and rng.random() < 0.2:
        args += ["--head-dim", str(rng.choice([4, 12])), "--qk-norm"]
    if rng.random() < 0.3:
        E = rng.choice([2, 4])
        args += ["--experts", str(E), "--moe-top-k", str(rng.choice([1, 2]))]
        if rng.random() < 0.5:
            args += ["--ep", str(rng.choice([1, 2]))]
    if rng.random() < 0.2:
        args += ["--prefix-caching"]
    if phantom:
        args += ["--phantom"]
    for flag, value in flags.items():
        args += [flag, value]
    return args


def draw_generate(rng):
    """A random `generate` run: a small model, tp/pp/ep, a prompt, a sampler."""
    tp, pp = rng.choice([1, 1, 2, 4]), rng.choice([1, 1, 2, 3])
    family = rng.choice(["gpt", "llama"])
    heads = tp * rng.choice([1, 2])
    vocab = tp * rng.choice([16, 25, 32])
    prompt = ",".join(str(rng.randrange(vocab)) for _ in range(rng.choice([1, 3, 7])))
    args = ["generate", "--json", "--family", family, "--layers", str(rng.choice([1, 2, 3, 4])), "--heads", str(heads),
            "--embd", str(heads * 8), "--seq", "32", "--vocab", str(vocab), "--prompt-tokens", prompt,
            "--max-new-tokens", str(rng.choice([1, 4, 12])), "--tp", str(tp), "--pp", str(pp),
            "--seed", str(rng.randrange(1000))]
    if family == "llama" and rng.random() < 0.5:
        args += ["--kv-heads", str(rng.choice([1, heads]))]
    if family == "llama" and rng.random() < 0.2:
        args += ["--head-dim", str(rng.choice([4, 12])), "--qk-norm"]
    if rng.random() < 0.3:
        args += ["--experts", str(rng.choice([2, 4])), "--moe-top-k", str(rng.choice([1, 2])), "--ep", str(rng.choice([1, 2]))]
    if rng.random() < 0.4:
        args += ["--temperature", str(rng.choice([0.7, 1.5]))]
        if rng.random() < 0.5:
            args += ["--top-k", str(rng.choice([1, 3]))]
        if rng.random() < 0.5:
            args += ["--top-p", str(rng.choice([0.5, 0.9]))]
    if rng.random() < 0.2:
        args += ["--phantom"]
    return args


def unsharded_tokens_differ(a, args, out):
    """A sharded generate must give the tokens of the same model on one device."""
    one = []
    it = iter(args)
    for x in it:
        if x in ("--tp", "--pp", "--ep"):
            next(it)
        else:
            one.append(x)
    r = subprocess.run([a.shardlab] + one, capture_output=True, text=True, timeout=a.timeout)
    if r.returncode != 0:
        return "one device exited %d: %s" % (r.returncode, r.stderr.strip()[-200:])
    mine, theirs = json.loads(out)["tokens"], json.loads(r.stdout)["tokens"]
    return None if mine == theirs else "tokens %s, on one device %s" % (mine, theirs)


def clock_figures(report):
    """What the virtual clock says, without host times and the folding note."""
    steps = [{k: v for k, v in st.items() if k != "wall_s"} for st in report["steps"]]
    summary = {k: v for k, v in report["summary"].items() if not k.startswith("host_")}
    return steps, summary, report["devices"]


CLOCK_SUMMARY = ("bubble_fraction", "hardware_flops_per_step", "mfu", "hfu", "virtual_step_s", "virtual_total_s")


def phantom_differs(a, args, real_out):
    """A phantom run (shapes only) must put every kernel, collective and
    allocation of the real run on the clock: the same step times, summary
    clock and device figures (dense models: an MoE phantom routes uniformly)."""
    r = subprocess.run([a.shardlab] + args + ["--phantom", "--no-fold"], capture_output=True, text=True,
                       timeout=a.timeout)
    if r.returncode != 0:
        return "--phantom exited %d: %s" % (r.returncode, r.stderr.strip()[-200:])
    real, phantom = json.loads(real_out), json.loads(r.stdout)
    pairs = [("step %d" % i, x["virtual_time_s"], y["virtual_time_s"]) for i, (x, y) in
             enumerate(zip(real["steps"], phantom["steps"]))]
    pairs += [(k, real["summary"].get(k), phantom["summary"].get(k)) for k in CLOCK_SUMMARY]
    pairs += [("devices", real["devices"], phantom["devices"])]
    for name, x, y in pairs:
        if x != y:
            if name == "devices":
                for i, (dx, dy) in enumerate(zip(x, y)):
                    keys = sorted(k for k in dx if dx.get(k) != dy.get(k))
                    if keys:
                        return "device %d: %s" % (i, ", ".join("%s %s vs %s" % (k, dx[k], dy.get(k)) for k in keys)[:300])
            return "%s: real %s, phantom %s" % (name, x, y)
    return None


def without_host(value):
    """`value` less its host wall-clock fields (host_*, wall_s, loop_wall_s), at any depth."""
    if isinstance(value, dict):
        return {k: without_host(v) for k, v in value.items()
                if not (k.startswith("host_") or k in ("wall_s", "loop_wall_s"))}
    if isinstance(value, list):
        return [without_host(v) for v in value]
    return value


def mpi_differs(a, args, alone_out, rng):
    """The same run under `mpirun -np N` (N 2 to 4: the devices split over
    processes, some maybe with none) must print the single process's report,
    less host wall-clock fields."""
    np_ = rng.choice([2, 3, 4])
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    r = subprocess.run(["mpirun", "-q", "--oversubscribe", "-np", str(np_), a.shardlab] + args,
                       capture_output=True, text=True, timeout=a.timeout, env=env)
    if r.returncode != 0:
        return "mpirun -np %d exited %d: %s" % (np_, r.returncode, r.stderr.strip()[-200:])
    try:
        y = without_host(json.loads(r.stdout))
    except json.JSONDecodeError:
        return "mpirun -np %d printed no single JSON report (each process its own?)" % np_
    x = without_host(json.loads(alone_out))
    if x == y:
        return None
    for k in x:
        if x[k] != y.get(k):
            return "mpirun -np %d: %s differs: %s vs %s" % (np_, k, str(x[k])[:150], str(y.get(k))[:150])
    return "mpirun -np %d: other keys" % np_


def dp_groups_alike(args, per_node=8):
    """Whether every tp rank's gradient group (its dp and cp ranks) sits on
    the nodes as tp rank 0's does (mesh order tp-cp-ep-dp-pp, 8 GPUs a node:
    every profile drawn). Where they do not, the tuner picks other algorithms
    for them and tp-replicated tensors drift apart by rounding (README
    "Checkpoints and resume"), so a resume matches to rounding only."""
    size = {f: int(args[args.index(f) + 1]) if f in args else 1 for f in ("--tp", "--cp", "--dp", "--pp")}
    tp, cp, dp, pp = size["--tp"], size["--cp"], size["--dp"], size["--pp"]
    def pattern(t, p):
        seen = {}
        return [seen.setdefault((t + tp * (c + cp * (d + dp * p))) // per_node, len(seen))
                for d in range(dp) for c in range(cp)]
    return all(pattern(t, p) == pattern(0, p) for p in range(pp) for t in range(tp))


COMPARED = [0]  # resume and reshard: the runs that got as far as the comparison


def run_first_half(a, args, k, ck):
    """`args` for its first k steps with --checkpoint-dir `ck`: None when it
    wrote the checkpoint, "" when the layout refuses checkpoints in one line
    (--cp), else why it failed."""
    first = list(args)
    first[first.index("--steps") + 1] = str(k)
    r = subprocess.run([a.shardlab] + first + ["--checkpoint-dir", ck], capture_output=True, text=True,
                       timeout=a.timeout)
    if r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1:
        return ""
    if r.returncode != 0:
        return "the first %d steps exited %d: %s" % (k, r.returncode, r.stderr.strip()[-200:])
    return None


def resume_differs(a, args, straight_out):
    """The run stopped after k steps with a checkpoint and resumed to the same
    total (same layout) must end with the straight run's bytes: every later
    step's loss and the saved parameters."""
    steps = int(args[args.index("--steps") + 1])
    if steps < 2:
        return None
    k = steps // 2
    with tempfile.TemporaryDirectory() as tmp:
        r = subprocess.run([a.shardlab] + args + ["--save", tmp + "/straight.safetensors"], capture_output=True,
                           text=True, timeout=a.timeout)
        if r.returncode != 0:
            return "the straight run with --save exited %d: %s" % (r.returncode, r.stderr.strip()[-200:])
        straight_out = r.stdout
        why = run_first_half(a, args, k, tmp + "/ck")
        if why is not None:
            return why or None  # "": a layout checkpoints refuse (--cp), in one line
        r = subprocess.run([a.shardlab] + args + ["--resume", tmp + "/ck", "--save", tmp + "/resumed.safetensors"],
                           capture_output=True, text=True, timeout=a.timeout)
        if r.returncode != 0:
            return "the resumed run exited %d: %s" % (r.returncode, r.stderr.strip()[-200:])
        COMPARED[0] += 1
        # The resumed report holds every step, the checkpoint's first k too.
        straight = [(s["step"], s["loss"]) for s in json.loads(straight_out)["steps"]]
        resumed = [(s["step"], s["loss"]) for s in json.loads(r.stdout)["steps"]]
        if not dp_groups_alike(args):  # tp replicas drift: rounding, not bits (losses within 1e-5)
            close = len(straight) == len(resumed) and all(
                i == j and x is not None and y is not None and abs(x - y) <= 1e-5 * abs(x)
                for (i, x), (j, y) in zip(straight, resumed))
            return None if close else "losses resumed at step %d: straight %s, resumed %s" % (k, straight, resumed)
        if straight != resumed:
            return "losses resumed at step %d: straight %s, resumed %s" % (k, straight, resumed)
        with open(tmp + "/straight.safetensors", "rb") as f1, open(tmp + "/resumed.safetensors", "rb") as f2:
            if f1.read() != f2.read():
                return "the saved parameters differ after resuming at step %d" % k
    return None


# A run's layout: drawn again for the resharded resume; the rest (model,
# batch, data, optimizer, precision, kernels) stays.
LAYOUT_FLAGS = {"--tp", "--pp", "--dp", "--cp", "--ep", "--expert-tp", "--micro-batches", "--zero", "--schedule", "--vpp",
                "--recompute", "--recompute-modules", "--recompute-method", "--recompute-num-layers", "--hsdp", "--cp-comm", "--pp-layers", "--bucket-mb"}
LAYOUT_SWITCHES = {"--sp", "--tp-comm-overlap", "--use-distributed-optimizer", "--overlap-param-gather",
                   "--no-overlap", "--scatter-gather", "--bucket-per-chunk", "--reshard-after-forward",
                   "--no-grad-accum-fusion", "--overlap-p2p-comm", "--no-prefetch"}


def relayout(args, rng):
    """`args` with its layout drawn again (LAYOUT_FLAGS, LAYOUT_SWITCHES):
    tp from the divisors the model allows, dp and micro-batches dividing the batch."""
    rest, it = [], iter(args)
    for x in it:
        if x in LAYOUT_FLAGS:
            next(it)
        elif x not in LAYOUT_SWITCHES:
            rest.append(x)
    value = lambda f: int(rest[rest.index(f) + 1])
    heads, batch, layers = value("--heads"), value("--batch"), value("--layers")
    tp = rng.choice([t for t in (1, 2, 4) if heads % t == 0 and value("--vocab") % t == 0])
    # An MoE model's aux loss and capacity count each micro-batch's tokens:
    # another split is another loss (3.26983 against 3.26988 at step 0 for
    # 2 and 4 micro-batches of one llama MoE), so MoE keeps its micro-batches.
    keep = int(args[args.index("--micro-batches") + 1]) if "--micro-batches" in args else 1
    mbs = (keep,) if "--experts" in rest else (1, 2, 3)
    dp = rng.choice([d for d in (1, 2, 3, 4) if any((batch // d) % m == 0 for m in mbs) and batch % d == 0])
    mb = rng.choice([m for m in mbs if (batch // dp) % m == 0])
    pp = rng.choice([p for p in (1, 2, 3) if p <= layers])
    out = rest + ["--tp", str(tp), "--dp", str(dp), "--pp", str(pp), "--micro-batches", str(mb)]
    whole = [e for e in (tp, 2 * tp) if tp > 1 and value("--experts") % e == 0 and (tp * dp) % e == 0] \
        if "--experts" in rest else []
    if whole and rng.random() < 0.3:  # whole experts (expert TP 1): ep over tp x dp, with SP
        out += ["--ep", str(rng.choice(whole)), "--expert-tp", "1", "--sp"]
    elif "--experts" in rest and rng.random() < 0.5:
        out += ["--ep", str(rng.choice([e for e in (1, 2) if dp % e == 0 and value("--experts") % e == 0]))]
    if rng.random() < 0.4:
        out += ["--zero", str(rng.choice([0, 1, 2, 3]))]
    if pp > 1 and rng.random() < 0.4:
        out += ["--schedule", rng.choice(["gpipe", "1f1b", "zb-h1"])]
    if rng.random() < 0.2:
        out += ["--recompute", rng.choice(["selective", "full"])]
    if tp > 1 and rng.random() < 0.3 and "--sp" not in out:
        out.append("--sp")
    if rng.random() < 0.1:
        out.append("--no-overlap")
    return out


def reshard_differs(a, args, straight_out, rng):
    """The run's first half under its layout with a checkpoint, the rest
    resumed under another (resharded): every step's loss within 1e-5 of the
    straight run's (the first half's records are the checkpoint's own)."""
    steps = int(args[args.index("--steps") + 1])
    if steps < 2:
        return None
    k = steps // 2
    other = relayout(args, rng)
    with tempfile.TemporaryDirectory() as tmp:
        why = run_first_half(a, args, k, tmp + "/ck")
        if why is not None:
            return why or None  # "": a layout checkpoints refuse (--cp), in one line
        r = subprocess.run([a.shardlab] + other + ["--resume", tmp + "/ck"], capture_output=True, text=True,
                           timeout=a.timeout)
        err = r.stderr.strip().splitlines()
        if r.returncode == 2 and len(err) == 1:
            return None  # the other layout refused, in one line
        if r.returncode != 0:
            return "resumed as %s: exited %d: %s" % (" ".join(other), r.returncode, r.stderr.strip()[-200:])
        COMPARED[0] += 1
        straight = [(s["step"], s["loss"]) for s in json.loads(straight_out)["steps"]]
        resumed = [(s["step"], s["loss"]) for s in json.loads(r.stdout)["steps"]]
        close = len(straight) == len(resumed) and all(
            i == j and x is not None and y is not None and abs(x - y) <= 1e-5 * abs(x)
            for (i, x), (j, y) in zip(straight, resumed))
        return None if close else "resumed at step %d as %s: straight %s, resumed %s" % (
            k, " ".join(other), straight, resumed)


def serve_figures(report):
    """What the virtual clock says of a serve run (not the folding note)."""
    return [{k: v for k, v in report["summary"].items() if not k.startswith("host_")}]


def unfolded_differs(a, args, folded_out):
    """The same run with every device on its own thread (--no-fold) must give
    the same clock: every step, the summary and every device's figures
    (serve: the summary)."""
    r = subprocess.run([a.shardlab] + args + ["--no-fold"], capture_output=True, text=True, timeout=a.timeout)
    if r.returncode != 0:
        return "--no-fold exited %d: %s" % (r.returncode, r.stderr.strip()[-200:])
    serve = args[0] == "serve"
    figures = serve_figures if serve else clock_figures
    f, u = figures(json.loads(folded_out)), figures(json.loads(r.stdout))
    for name, x, y in zip(("summary",) if serve else ("steps", "summary", "devices"), f, u):
        if x != y:
            if name == "devices":
                for i, (dx, dy) in enumerate(zip(x, y)):
                    if dx != dy:
                        keys = sorted(k for k in dx if dx.get(k) != dy.get(k))
                        return "device %d: %s" % (i, ", ".join("%s %s vs %s" % (k, dx.get(k), dy.get(k)) for k in keys)[:300])
            return "%s: %s vs %s" % (name, str(x)[:200], str(y)[:200])
    return None


COLLECTIVE_OPS = ["all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "all_to_all"]
PROFILES = ["a100-nvlink", "a100-nvlink-4nic", "a100-pcie", "a100-pcie-8", "h100-nvlink", "h200-nvlink",
            "b200-nvlink", "h100-roce"]
EXPLICIT_ALGOS = ["ring", "tree", "direct", "dbtree", "nvls"]


def draw_collectives(rng):
    """A `collectives --check --json` table: op, ranks on 1 to 4 nodes of 8,
    profile, algorithm, protocol, reduction and a few sizes from 1 byte; one
    draw in five a `p2p --json` table between two of those GPUs instead."""
    nodes = rng.choice([1, 1, 2, 3, 4])
    if rng.random() < 0.2:
        src, dst = rng.randrange(8 * nodes), rng.randrange(8 * nodes)
        smallest = rng.choice([1, 7, 4096, 1 << 20])
        return ["p2p", "--src", str(src), "--dst", str(dst), "--nodes", str(nodes), "--profile", rng.choice(PROFILES),
                "--json", "--min-bytes", str(smallest), "--max-bytes", str(smallest << rng.randint(0, 6))] + (
                    ["--bidirectional"] if rng.random() < 0.3 else [])
    ranks = 8 * nodes if rng.random() < 0.4 else rng.randint(1, 8 * nodes)
    args = ["collectives", "--op", rng.choice(COLLECTIVE_OPS), "--ranks", str(ranks), "--nodes", str(nodes),
            "--profile", rng.choice(PROFILES), "--check", "--json"]
    if rng.random() < 0.35:
        args += ["--algo", rng.choice(EXPLICIT_ALGOS)]
    if rng.random() < 0.25:
        args += ["--proto", rng.choice(["LL", "LL128", "Simple"])]
    if rng.random() < 0.3:
        args += ["--redop", rng.choice(["sum", "avg", "max"])]
    smallest = rng.choice([1, 3, 8, 100, 1000, 4096, 65536, 1 << 20])
    args += ["--min-bytes", str(smallest), "--max-bytes", str(smallest << rng.randint(0, 5))]
    return args


def flag(args, name, default=None):
    return args[args.index(name) + 1] if name in args else default


def collective_times(a, args):
    """{bytes: time_us} of the table `args` prints; None when the tool refuses
    the algorithm here (exit 2); the failure, as text, on any other exit."""
    r = subprocess.run([a.shardlab] + args, capture_output=True, text=True, timeout=a.timeout)
    if r.returncode != 0:
        return None if r.returncode == 2 else "exit %d: %s" % (r.returncode, r.stderr.strip()[-200:])
    return {row["bytes"]: row["time_us"] for row in json.loads(r.stdout)["rows"]}


def collectives_differ(a, args, out):
    """Each algorithm's time may not fall as the buffer grows; auto's time is,
    size by size, the least of the candidates it weighs (tuner.h), each run
    alone with --algo (and the drawn --proto, or auto's choice of it)."""
    rows = json.loads(out)["rows"]
    if args[0] == "p2p":  # a message takes no less time than a smaller one
        if any(x["latency_us"] < y["latency_us"] for x, y in zip(rows[1:], rows)):
            return "p2p latency falls as the message grows: %s" % [(r["bytes"], r["latency_us"]) for r in rows]
        return None
    if any(x["bytes"] > y["bytes"] and x["time_us"] < y["time_us"] for x, y in zip(rows[1:], rows)):
        return "time falls as the buffer grows: %s" % [(row["bytes"], row["algo"], row["protocol"], row["time_us"])
                                                      for row in rows]
    if "--algo" in args:
        return None
    spans_nodes = int(flag(args, "--ranks")) > 8
    candidates = ["ring", "tree"] + ([] if spans_nodes and flag(args, "--op") == "all_reduce" else ["direct"]) + ["nvls"]
    best = {}
    for algo in candidates:
        times = collective_times(a, args + ["--algo", algo])
        if isinstance(times, str):
            return "--algo %s %s" % (algo, times)
        for size, t in (times or {}).items():
            if size not in best or t < best[size][0]:
                best[size] = (t, algo)
    for row in rows:
        t, algo = best.get(row["bytes"], (None, None))
        if t is None or abs(row["time_us"] - t) > 1e-6:
            return "at %d B auto ran %s/%s in %s us, --algo %s takes %s us" % (
                row["bytes"], row["algo"], row["protocol"], row["time_us"], algo, t)
    return None


def second_look(a, args, out, rng):
    """The mode's own property for a run that exited 0: None, or why it fails."""
    if a.mode == "resume":
        return resume_differs(a, args, out)
    if a.mode == "reshard":
        return reshard_differs(a, args, out, rng)
    if a.mode == "mpi":
        return mpi_differs(a, args, out, rng)
    if a.mode == "phantom":
        why = phantom_differs(a, args, out)
        return why and "real != phantom: " + why
    if a.mode == "generate":
        return None if "--phantom" in args else unsharded_tokens_differ(a, args, out)
    if a.mode == "collectives":
        why = collectives_differ(a, args, out)
        return why and "collectives: " + why
    if a.mode == "fold" or (a.mode == "serve" and "--phantom" in args):
        why = unfolded_differs(a, args, out)
        return why and "folded != unfolded: " + why
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--runs", type=int, default=300)
    ap.add_argument("--shardlab", default="build/bin/shardlab")
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("--mode", choices=["verify", "fold", "phantom", "mpi", "resume", "reshard", "serve", "generate",
                                       "collectives"],
                    default="verify",
                    help="verify: sharded against unsharded; fold: phantom folded against --no-fold; "
                         "serve: serving layouts (a phantom one folded against --no-fold); "
                         "generate: a sharded generate's tokens against one device's; "
                         "phantom: a real dense train run's clock against its phantom run's; "
                         "mpi: a train run alone against the same under mpirun; "
                         "resume: a straight train run against one stopped at a checkpoint and resumed; "
                         "reshard: the same, resumed under another layout; "
                         "collectives: nccl-tests tables checked against a serial reference, auto against "
                         "each algorithm alone")
    ap.add_argument("--wide", action="store_true",
                    help="fold mode: also dp 24-64 and tp 8 (more nodes, by-place folding, fabric tiers)")
    a = ap.parse_args()
    rng = random.Random(a.seed)
    codes, refusals, bad = {}, {}, 0
    for _ in range(a.runs):
        args = (draw_serve(rng) if a.mode == "serve" else draw_generate(rng) if a.mode == "generate"
                else draw_collectives(rng) if a.mode == "collectives" else draw(rng, a.mode, a.wide))
        try:
            r = subprocess.run([a.shardlab] + args, capture_output=True, text=True, timeout=a.timeout)
        except subprocess.TimeoutExpired:
            bad += 1
            print("BAD (over %gs):" % a.timeout, " ".join(args), flush=True)
            continue
        codes[r.returncode] = codes.get(r.returncode, 0) + 1
        err = [l for l in r.stderr.strip().splitlines() if not re.match(r"^\[\d{4}-", l)]  # log lines aside
        if r.returncode == 0:
            why = second_look(a, args, r.stdout, rng)
            if why:
                bad += 1
                print("BAD (%s):" % why, " ".join(args), flush=True)
            continue
        if r.returncode == 2 and len(err) == 1:
            kind = re.sub(r"\d+", "N", err[0])[:100]
            refusals[kind] = refusals.get(kind, 0) + 1
            continue
        bad += 1
        tail = r.stdout.strip().splitlines()[-6:] + err[-5:]
        print("BAD (exit %d):" % r.returncode, " ".join(args), "\n   " + "\n   ".join(tail), flush=True)
    print("runs %d, exit codes %s, bad %d" % (a.runs, dict(sorted(codes.items())), bad)
          + (", %d resumed and compared" % COMPARED[0] if a.mode in ("resume", "reshard") else ""))
    for kind, n in sorted(refusals.items(), key=lambda kv: -kv[1])[:25]:
        print("%5d  %s" % (n, kind))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
