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

Then tiny-moe (8 routed SwiGLU experts of 64, top-2 softmax with normalized
gates, 1 shared expert, block 0 dense; DeepSeek-V3's Hugging Face layout
mlp.gate, mlp.experts.{e}, mlp.shared_experts): the step-0 loss, cross-entropy
plus 0.01 x the load-balancing loss E * sum_i f_i P_i of each MoE block.

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
from llama_numpy_reference import (B, C, EPS, F, HS, KV, L, NH, T, V, batch, read_safetensors, rmsnorm,  # noqa: E402
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


def loss_and_grads(w, x, y):
    """Mean cross-entropy of tiny-llama on (x, y) and its gradient for every tensor."""
    p, cos, sin, h = embed(w, x)
    Bn, Tn = x.shape
    caches = []
    for i in range(L):
        g = lambda m: p[f"model.layers.{i}.{m}.weight"]
        n1, r1 = rms_fwd(h, g("input_layernorm"))
        att, ac = attention_fwd(n1, p, i, cos, sin)
        h1 = h + att
        n2, r2 = rms_fwd(h1, g("post_attention_layernorm"))
        mlp, mc = swiglu_fwd(n2, g("mlp.gate_proj"), g("mlp.up_proj"), g("mlp.down_proj"))
        caches.append((h, n1, r1, ac, h1, n2, r2, mc))
        h = h1 + mlp
    nf, rf = rms_fwd(h, p["model.norm.weight"])
    z = nf @ p["lm_head.weight"].T
    z = z - z.max(-1, keepdims=True)
    prob = np.exp(z)
    prob /= prob.sum(-1, keepdims=True)
    loss = -np.log(np.take_along_axis(prob, y[..., None], -1)).mean()
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
    return loss, grads


def adamw_steps(w, tokens, steps):
    """torch.optim.AdamW with clip_grad_norm_; returns the losses and the final float64 parameters."""
    p = {k: v.astype(np.float64) for k, v in w.items()}
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v2 = {k: np.zeros_like(v) for k, v in p.items()}
    losses = []
    for step in range(steps):
        rows = batch(tokens, step)
        loss, g = loss_and_grads(p, rows[:, :-1], rows[:, 1:])
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
        print(f"numpy step {step}: loss {loss:.8f}, grad norm {norm:.6f}, clip factor {clip:.6f}")
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


def moe_loss(w, x, y):
    """tiny-moe's loss: cross-entropy + AUX_COEF x the sum over MoE blocks of E * sum_i f_i P_i."""
    p, cos, sin, h = embed(w, x)
    Bn, Tn = x.shape
    aux = 0.0
    for i in range(L):
        g = lambda m: p[f"model.layers.{i}.{m}.weight"]
        h = h + attention_fwd(rms_fwd(h, g("input_layernorm"))[0], p, i, cos, sin)[0]
        n = rms_fwd(h, g("post_attention_layernorm"))[0].reshape(-1, C)
        if i == 0:
            out = swiglu_fwd(n, g("mlp.gate_proj"), g("mlp.up_proj"), g("mlp.down_proj"))[0]
        else:
            z = n @ g("mlp.gate").T
            s = np.exp(z - z.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            top = np.argsort(-s, axis=-1, kind="stable")[:, :MOE_K]  # ties to the lower index
            gates = np.take_along_axis(s, top, -1)
            gates /= gates.sum(-1, keepdims=True)  # Mixtral: softmax over the top-k
            out = swiglu_fwd(n, g("mlp.shared_experts.gate_proj"), g("mlp.shared_experts.up_proj"),
                             g("mlp.shared_experts.down_proj"))[0]
            for e in range(MOE_E):
                rows, slot = np.nonzero(top == e)
                ye = swiglu_fwd(n[rows], g(f"mlp.experts.{e}.gate_proj"), g(f"mlp.experts.{e}.up_proj"),
                                g(f"mlp.experts.{e}.down_proj"))[0]
                out[rows] += gates[rows, slot][:, None] * ye
            f = np.bincount(top.reshape(-1), minlength=MOE_E) / (n.shape[0] * MOE_K)
            aux += MOE_E * (f * s.mean(0)).sum()
        h = h + out.reshape(Bn, Tn, C)
    z = rmsnorm(h, p["model.norm.weight"]) @ p["lm_head.weight"].T
    z -= z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return -np.take_along_axis(logp, y[..., None], -1).mean() + AUX_COEF * aux


def main():
    binary, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(31)
    w = weights(rng)
    init, data, saved = (os.path.join(work, n) for n in ("init.safetensors", "tokens.bin", "final.safetensors"))
    write_safetensors(init, w)
    tokens = rng.integers(0, V, 4096).astype("<u2")
    tokens.tofile(data)
    want_losses, want = adamw_steps(w, tokens, STEPS)
    optim = ["--lr", str(LR), "--beta1", str(BETA1), "--beta2", str(BETA2), "--eps", str(ADAM_EPS),
             "--weight-decay", str(WD), "--grad-clip", str(CLIP)]
    report = run(binary, ["train", "--model", "tiny-llama", "--init", init, "--data", data, "--sampling", "sequential",
                          "--steps", str(STEPS), "--save", saved, "--json"] + optim)
    ok = True
    for s, rec in enumerate(report["steps"]):
        rel = abs(rec["loss"] - want_losses[s]) / want_losses[s]
        ok &= rel <= 1e-5
        print(f"step {s} loss: numpy float64 {want_losses[s]:.8f}, shardlab {rec['loss']:.8f}, rel diff {rel:.2e} "
              "(tolerance 1e-5)")
    ok &= len(report["steps"]) == STEPS
    got = read_safetensors(saved)
    assert sorted(got) == sorted(want), "the saved tensors are not the model's Hugging Face names"
    diff = sum(((got[k].astype(np.float64) - want[k]) ** 2).sum() for k in want)
    norm = sum((want[k] ** 2).sum() for k in want)
    moved = sum(((want[k] - w[k].astype(np.float64)) ** 2).sum() for k in want)
    max_abs = max(np.abs(got[k].astype(np.float64) - want[k]).max() for k in want)
    rel_l2 = np.sqrt(diff / norm)
    ok &= rel_l2 <= 1e-5
    print(f"parameters after {STEPS} steps: rel L2 {rel_l2:.2e} (tolerance 1e-5), max abs diff {max_abs:.2e}; "
          f"the steps moved them by rel L2 {np.sqrt(moved / norm):.2e}")
    # tiny-moe, step 0: the HF DeepSeek/Mixtral-style layout read by shardlab.
    wm = moe_weights(np.random.default_rng(37))
    moe_init = os.path.join(work, "moe.safetensors")
    write_safetensors(moe_init, wm)
    rows = batch(tokens, 0)
    want_moe = moe_loss(wm, rows[:, :-1], rows[:, 1:])
    got_moe = run(binary, ["train", "--model", "tiny-moe", "--init", moe_init, "--data", data, "--sampling",
                           "sequential", "--steps", "1", "--json"])["steps"][0]["loss"]
    rel = abs(got_moe - want_moe) / want_moe
    ok &= rel <= 1e-5
    print(f"tiny-moe step-0 loss (CE + 0.01 aux): numpy float64 {want_moe:.8f}, shardlab {got_moe:.8f}, "
          f"rel diff {rel:.2e} (tolerance 1e-5)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
