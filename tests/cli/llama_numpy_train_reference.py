#!/usr/bin/python3
"""Several AdamW steps of tiny-llama in float64 numpy with a hand-written backward, against shardlab.

An independent trainer: the forward of llama_numpy_reference.py (Hugging Face's
Llama math: RMSNorm, rotate-half RoPE, GQA by repeat_kv, SwiGLU, untied
lm_head, mean cross-entropy) and its backward written out by hand, then
torch's clip_grad_norm_ and torch.optim.AdamW (decoupled decay on 2-D
tensors only, nanoGPT's groups). It starts from the same weights (written by
hand as Hugging Face safetensors) and the same batches (a nanoGPT token file,
--sampling sequential) as `shardlab train --model tiny-llama --init F --data F
--save F`, and compares every step's loss and the saved parameters.

Then the same for tiny-moe (8 routed SwiGLU experts of 64, top-2 softmax with
normalized gates, 1 shared expert, block 0 dense; DeepSeek-V3's Hugging Face
layout mlp.gate, mlp.experts.{e}, mlp.shared_experts; no capacity limit, no
selection bias): the loss is cross-entropy plus 0.01 x the load-balancing loss
E * sum_i f_i P_i of each MoE block (f_i the share of the top-2 assignments, a
constant; P_i the mean router probability), and the backward goes through the
gates' normalization, the softmax and the aux loss into the router. Each
step prints the smallest gap between a token's 2nd and 3rd router score: a
float32 run picks other experts only when it is ~1e-7.

Usage: llama_numpy_train_reference.py SHARDLAB_BIN WORKDIR
Tolerances (shardlab computes in float32): relative loss difference <= 1e-5
per step; the parameters after the run: relative L2 of the whole vector
<= 1e-5 (the max absolute difference is printed too).
"""
import json
import os
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from llama_numpy_reference import (C, EPS, HS, KV, L, NH, V, batch, read_safetensors,  # noqa: E402
                                   weights, write_safetensors)

STEPS, LR, BETA1, BETA2, ADAM_EPS, WD, CLIP = 4, 1e-3, 0.9, 0.95, 1e-8, 0.1, 1.0
G = NH // KV
MOE_E, MOE_K, MOE_F, AUX_COEF = 8, 2, 64, 0.01


# ---- forward and backward of each layer (x: (..., C) rows) -------------------

def rms_fwd(x, w):
    r = 1 / np.sqrt((x * x).mean(-1, keepdims=True) + EPS)
    return x * r * w, r


def rms_bwd(dy, x, r, w):
    g = dy * w
    dw = (dy * x * r).reshape(-1, x.shape[-1]).sum(0)
    dx = r * g - x * r ** 3 * (g * x).mean(-1, keepdims=True)
    return dx, dw


def rope_tables(Tn):
    inv_freq = 10000.0 ** (-np.arange(0, HS, 2) / HS)
    freqs = np.arange(Tn)[:, None] * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], -1)
    return np.cos(emb)[None, :, None, :], np.sin(emb)[None, :, None, :]


def rope_rot(x):
    return np.concatenate([-x[..., HS // 2:], x[..., :HS // 2]], -1)


def rope_rot_t(y):
    return np.concatenate([y[..., HS // 2:], -y[..., :HS // 2]], -1)


def silu(x):
    return x / (1 + np.exp(-x))


def swiglu_fwd(n, wg, wu, wd):
    gate, up = n @ wg.T, n @ wu.T
    act = silu(gate) * up
    return act @ wd.T, (gate, up, act)


def swiglu_bwd(dout, n, wg, wu, wd, cache):
    gate, up, act = cache
    dwd = dout.reshape(-1, dout.shape[-1]).T @ act.reshape(-1, act.shape[-1])
    dact = dout @ wd
    sig = 1 / (1 + np.exp(-gate))
    dgate = dact * up * sig * (1 + gate * (1 - sig))
    dup = dact * silu(gate)
    n2 = n.reshape(-1, n.shape[-1])
    dwg = dgate.reshape(-1, dgate.shape[-1]).T @ n2
    dwu = dup.reshape(-1, dup.shape[-1]).T @ n2
    return dgate @ wg + dup @ wu, dwg, dwu, dwd


def attention_fwd(n, p, i, cos, sin):
    Bn, Tn = n.shape[:2]
    g = lambda m: p[f"model.layers.{i}.{m}.weight"]
    q0 = (n @ g("self_attn.q_proj").T).reshape(Bn, Tn, NH, HS)
    k0 = (n @ g("self_attn.k_proj").T).reshape(Bn, Tn, KV, HS)
    v = (n @ g("self_attn.v_proj").T).reshape(Bn, Tn, KV, HS)
    q, k = q0 * cos + rope_rot(q0) * sin, k0 * cos + rope_rot(k0) * sin
    kr, vr = np.repeat(k, G, axis=2), np.repeat(v, G, axis=2)
    s = np.einsum("bthd,bshd->bhts", q, kr) / np.sqrt(HS) + np.triu(np.full((Tn, Tn), -np.inf), 1)
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    o = np.einsum("bhts,bshd->bthd", a, vr).reshape(Bn, Tn, C)
    return o @ g("self_attn.o_proj").T, (q, kr, vr, a, o)


def attention_bwd(dout, n, p, i, cos, sin, cache, grads):
    Bn, Tn = n.shape[:2]
    q, kr, vr, a, o = cache
    g = lambda m: p[f"model.layers.{i}.{m}.weight"]
    name = lambda m: f"model.layers.{i}.{m}.weight"
    grads[name("self_attn.o_proj")] = dout.reshape(-1, C).T @ o.reshape(-1, C)
    do = (dout @ g("self_attn.o_proj")).reshape(Bn, Tn, NH, HS)
    dvr = np.einsum("bhts,bthd->bshd", a, do)
    da = np.einsum("bthd,bshd->bhts", do, vr)
    ds = a * (da - (da * a).sum(-1, keepdims=True)) / np.sqrt(HS)
    dq = np.einsum("bhts,bshd->bthd", ds, kr)
    dkr = np.einsum("bhts,bthd->bshd", ds, q)
    dk = dkr.reshape(Bn, Tn, KV, G, HS).sum(3)  # repeat_kv's backward: a K/V head sums its G query heads
    dv = dvr.reshape(Bn, Tn, KV, G, HS).sum(3)
    dq0, dk0 = dq * cos + rope_rot_t(dq * sin), dk * cos + rope_rot_t(dk * sin)
    n2 = n.reshape(-1, C)
    dn = 0
    for m, d in (("self_attn.q_proj", dq0), ("self_attn.k_proj", dk0), ("self_attn.v_proj", dv)):
        d2 = d.reshape(Bn * Tn, -1)
        grads[name(m)] = d2.T @ n2
        dn = dn + (d2 @ g(m)).reshape(Bn, Tn, C)
    return dn


def embed(w, x):
    """The float64 parameters, RoPE's tables for x's length and the embedded tokens x (B, T)."""
    p = {k: v.astype(np.float64) for k, v in w.items()}
    cos, sin = rope_tables(x.shape[1])
    return p, cos, sin, p["model.embed_tokens.weight"][x]


def moe_fwd(n, p, i):
    """Block i's MoE on rows n (N, C): the shared expert plus the top-K routed experts with normalized gates.

    Returns the output, what the backward needs, and the block's load-balancing loss E * sum_e f_e P_e
    (f_e: the share of the N*K assignments to expert e, a constant; P_e: the mean router probability)."""
    g = lambda m: p[f"model.layers.{i}.mlp.{m}.weight"]
    z = n @ g("gate").T
    s = np.exp(z - z.max(-1, keepdims=True))
    s /= s.sum(-1, keepdims=True)
    top = np.argsort(-s, axis=-1, kind="stable")[:, :MOE_K]  # ties to the lower index
    srt = np.sort(s, -1)
    margin = (srt[:, -MOE_K] - srt[:, -MOE_K - 1]).min()  # how close a float32 run is to another choice
    gates = np.take_along_axis(s, top, -1)
    gates /= gates.sum(-1, keepdims=True)  # Mixtral: softmax over the top-k
    out, shared = swiglu_fwd(n, g("shared_experts.gate_proj"), g("shared_experts.up_proj"),
                             g("shared_experts.down_proj"))
    routed = []
    for e in range(MOE_E):
        rows, slot = np.nonzero(top == e)
        ye, cache = swiglu_fwd(n[rows], g(f"experts.{e}.gate_proj"), g(f"experts.{e}.up_proj"),
                               g(f"experts.{e}.down_proj"))
        out[rows] += gates[rows, slot][:, None] * ye
        routed.append((rows, slot, ye, cache))
    f = np.bincount(top.reshape(-1), minlength=MOE_E) / (n.shape[0] * MOE_K)
    aux = MOE_E * (f * s.mean(0)).sum()
    return out, (s, top, gates, f, shared, routed, margin), aux


def moe_bwd(dout, n, p, i, cache, grads):
    """The backward of moe_fwd with d(loss)/d(aux) = AUX_COEF; fills block i's grads, returns dn."""
    s, top, gates, f, shared, routed, _ = cache
    g = lambda m: p[f"model.layers.{i}.mlp.{m}.weight"]
    name = lambda m: f"model.layers.{i}.mlp.{m}.weight"
    N = n.shape[0]
    dn, *dw = swiglu_bwd(dout, n, g("shared_experts.gate_proj"), g("shared_experts.up_proj"),
                         g("shared_experts.down_proj"), shared)
    for m, d in zip(("gate_proj", "up_proj", "down_proj"), dw):
        grads[name(f"shared_experts.{m}")] = d
    dgates = np.zeros_like(gates)
    for e, (rows, slot, ye, ec) in enumerate(routed):
        dgates[rows, slot] = (dout[rows] * ye).sum(-1)
        dxe, *dw = swiglu_bwd(gates[rows, slot][:, None] * dout[rows], n[rows], g(f"experts.{e}.gate_proj"),
                              g(f"experts.{e}.up_proj"), g(f"experts.{e}.down_proj"), ec)
        for m, d in zip(("gate_proj", "up_proj", "down_proj"), dw):
            grads[name(f"experts.{e}.{m}")] = d
        dn[rows] += dxe  # a token meets an expert at most once
    # d/ds: the aux loss (E/N) f_e on every row, and the normalized gates g_k = s_k / S on the chosen ones:
    # ds_k += (dg_k - sum_j dg_j g_j) / S.
    ds = np.broadcast_to(AUX_COEF * MOE_E / N * f, s.shape).copy()
    S = np.take_along_axis(s, top, -1).sum(-1, keepdims=True)
    dot = (dgates * gates).sum(-1, keepdims=True)
    np.put_along_axis(ds, top, np.take_along_axis(ds, top, -1) + (dgates - dot) / S, -1)
    dz = s * (ds - (s * ds).sum(-1, keepdims=True))  # softmax's backward
    grads[name("gate")] = dz.T @ n
    return dn + dz @ g("gate")


def loss_and_grads(w, x, y, moe=False):
    """Mean cross-entropy of tiny-llama (moe: tiny-moe, + AUX_COEF x the MoE blocks' aux losses) on (x, y),
    its gradient for every tensor, and the smallest top-K margin of the routers (None without MoE)."""
    p, cos, sin, h = embed(w, x)
    Bn, Tn = x.shape
    caches = []
    aux, margin = 0.0, None
    for i in range(L):
        g = lambda m: p[f"model.layers.{i}.{m}.weight"]
        n1, r1 = rms_fwd(h, g("input_layernorm"))
        att, ac = attention_fwd(n1, p, i, cos, sin)
        h1 = h + att
        n2, r2 = rms_fwd(h1, g("post_attention_layernorm"))
        if moe and i > 0:  # tiny-moe: block 0 dense
            mlp, mc, a = moe_fwd(n2.reshape(-1, C), p, i)
            mlp = mlp.reshape(Bn, Tn, C)
            aux += a
            margin = mc[-1] if margin is None else min(margin, mc[-1])
        else:
            mlp, mc = swiglu_fwd(n2, g("mlp.gate_proj"), g("mlp.up_proj"), g("mlp.down_proj"))
        caches.append((h, n1, r1, ac, h1, n2, r2, mc))
        h = h1 + mlp
    nf, rf = rms_fwd(h, p["model.norm.weight"])
    z = nf @ p["lm_head.weight"].T
    z = z - z.max(-1, keepdims=True)
    prob = np.exp(z)
    prob /= prob.sum(-1, keepdims=True)
    loss = -np.log(np.take_along_axis(prob, y[..., None], -1)).mean() + AUX_COEF * aux
    grads = {}
    dz = prob
    np.put_along_axis(dz, y[..., None], np.take_along_axis(dz, y[..., None], -1) - 1, -1)
    dz /= Bn * Tn
    grads["lm_head.weight"] = dz.reshape(-1, V).T @ nf.reshape(-1, C)
    dh, grads["model.norm.weight"] = rms_bwd(dz @ p["lm_head.weight"], h, rf, p["model.norm.weight"])
    for i in reversed(range(L)):
        h0, n1, r1, ac, h1, n2, r2, mc = caches[i]
        g = lambda m: p[f"model.layers.{i}.{m}.weight"]
        name = lambda m: f"model.layers.{i}.{m}.weight"
        if moe and i > 0:
            dn2 = moe_bwd(dh.reshape(-1, C), n2.reshape(-1, C), p, i, mc, grads).reshape(Bn, Tn, C)
        else:
            dn2, grads[name("mlp.gate_proj")], grads[name("mlp.up_proj")], grads[name("mlp.down_proj")] = swiglu_bwd(
                dh, n2, g("mlp.gate_proj"), g("mlp.up_proj"), g("mlp.down_proj"), mc)
        dx, grads[name("post_attention_layernorm")] = rms_bwd(dn2, h1, r2, g("post_attention_layernorm"))
        dh1 = dh + dx
        dn1 = attention_bwd(dh1, n1, p, i, cos, sin, ac, grads)
        dx, grads[name("input_layernorm")] = rms_bwd(dn1, h0, r1, g("input_layernorm"))
        dh = dh1 + dx
    demb = np.zeros_like(p["model.embed_tokens.weight"])
    np.add.at(demb, x.reshape(-1), dh.reshape(-1, C))
    grads["model.embed_tokens.weight"] = demb
    return loss, grads, margin


def adamw_steps(w, tokens, steps, moe=False):
    """torch.optim.AdamW with clip_grad_norm_; returns the losses and the final float64 parameters."""
    p = {k: v.astype(np.float64) for k, v in w.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v2 = {k: np.zeros_like(v) for k, v in p.items()}
    losses = []
    for step in range(steps):
        rows = batch(tokens, step)
        loss, g, margin = loss_and_grads(p, rows[:, :-1], rows[:, 1:], moe)
        assert sorted(g) == sorted(p), "a tensor without a gradient"
        losses.append(loss)
        norm = np.sqrt(sum((x * x).sum() for x in g.values()))
        clip = CLIP / (norm + 1e-6) if CLIP / (norm + 1e-6) < 1 else 1.0
        t = step + 1
        for k in p:
            gk = g[k] * clip
            if p[k].ndim >= 2:
                p[k] *= 1 - LR * WD
            m[k] += (1 - BETA1) * (gk - m[k])
            v2[k] = BETA2 * v2[k] + (1 - BETA2) * gk * gk
            p[k] -= (LR / (1 - BETA1 ** t)) * m[k] / (np.sqrt(v2[k]) / np.sqrt(1 - BETA2 ** t) + ADAM_EPS)
        routing = "" if margin is None else f", smallest top-{MOE_K} router margin {margin:.2e}"
        print(f"numpy step {step}: loss {loss:.8f}, grad norm {norm:.6f}, clip factor {clip:.6f}{routing}")
    return losses, p


def run(binary, args):
    out = subprocess.run([binary] + args, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(args)} failed ({out.returncode}):\n{out.stderr}")
    return json.loads(out.stdout)


def moe_weights(rng):
    w = weights(rng)  # tiny-llama's; blocks 1..3 swap the dense MLP for experts
    for i in range(1, L):
        for m in ("gate_proj", "up_proj", "down_proj"):
            del w[f"model.layers.{i}.mlp.{m}.weight"]
        w[f"model.layers.{i}.mlp.gate.weight"] = rng.normal(0, 0.3, (MOE_E, C)).astype(np.float32)
        for prefix in [f"experts.{e}." for e in range(MOE_E)] + ["shared_experts."]:
            for m, s in (("gate_proj", (MOE_F, C)), ("up_proj", (MOE_F, C)), ("down_proj", (C, MOE_F))):
                w[f"model.layers.{i}.mlp.{prefix}{m}.weight"] = rng.normal(0, 0.1, s).astype(np.float32)
    return w


def compare(binary, work, preset, w, tokens, steps, moe=False):
    """`shardlab train --model PRESET --init --data --save` against adamw_steps; True when within tolerance."""
    init, saved = (os.path.join(work, f"{preset}-{n}.safetensors") for n in ("init", "final"))
    write_safetensors(init, w)
    want_losses, want = adamw_steps(w, tokens, steps, moe)
    optim = ["--lr", str(LR), "--beta1", str(BETA1), "--beta2", str(BETA2), "--eps", str(ADAM_EPS),
             "--weight-decay", str(WD), "--grad-clip", str(CLIP)]
    report = run(binary, ["train", "--model", preset, "--init", init, "--data", os.path.join(work, "tokens.bin"),
                          "--sampling", "sequential", "--steps", str(steps), "--save", saved, "--json"] + optim)
    ok = len(report["steps"]) == steps
    what = "CE + 0.01 aux" if moe else "CE"
    for s, rec in enumerate(report["steps"]):
        rel = abs(rec["loss"] - want_losses[s]) / want_losses[s]
        ok &= rel <= 1e-5
        print(f"{preset} step {s} loss ({what}): numpy float64 {want_losses[s]:.8f}, shardlab {rec['loss']:.8f}, "
              f"rel diff {rel:.2e} (tolerance 1e-5)")
    got = read_safetensors(saved)
    assert sorted(got) == sorted(want), "the saved tensors are not the model's Hugging Face names"
    diff = sum(((got[k].astype(np.float64) - want[k]) ** 2).sum() for k in want)
    norm = sum((want[k] ** 2).sum() for k in want)
    moved = sum(((want[k] - w[k].astype(np.float64)) ** 2).sum() for k in want)
    max_abs = max(np.abs(got[k].astype(np.float64) - want[k]).max() for k in want)
    worst = max(want, key=lambda k: np.abs(got[k].astype(np.float64) - want[k]).max())
    rel_l2 = np.sqrt(diff / norm)
    ok &= rel_l2 <= 1e-5
    print(f"{preset} parameters after {steps} steps: rel L2 {rel_l2:.2e} (tolerance 1e-5), max abs diff {max_abs:.2e} "
          f"({worst}); the steps moved them by rel L2 {np.sqrt(moved / norm):.2e}")
    return ok


def main():
    binary, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(31)
    w = weights(rng)
    tokens = rng.integers(0, V, 4096).astype("<u2")
    tokens.tofile(os.path.join(work, "tokens.bin"))
    ok = compare(binary, work, "tiny-llama", w, tokens, STEPS)
    # tiny-moe in the HF DeepSeek/Mixtral-style layout: routing, both experts' kinds and the aux loss trained.
    ok &= compare(binary, work, "tiny-moe", moe_weights(np.random.default_rng(37)), tokens, STEPS, moe=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
