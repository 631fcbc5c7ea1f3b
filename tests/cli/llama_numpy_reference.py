#!/usr/bin/python3
"""An independent Llama (numpy, float64) against shardlab on the same weights and batch.

Writes tiny-llama's weights with Hugging Face's names and [out, in] layouts into
a safetensors file by hand (json + struct + numpy: no shardlab code, no torch),
and a nanoGPT token file; computes the loss of step 0's batch (--sampling
sequential: row j is tokens[j*T : j*T+T+1]) with Hugging Face's Llama math
(RMSNorm, rotate-half RoPE, GQA by repeat_kv, SwiGLU, untied lm_head); then
runs `shardlab train --model tiny-llama --init F --data F` unsharded and under
tensor and context parallelism and compares the first step's loss; reads
back the checkpoint shardlab saves; and compares `shardlab generate`'s greedy
tokens (KV cache, RoPE per position) with numpy recomputing every prefix.
Then the same with Qwen3's attention (--head-dim 48 --qk-norm: heads of 48 on
n_embd 128, an RMSNorm over each head of q and k before RoPE). Then
DeepSeek-V3's multi-head latent attention as Hugging Face's
DeepseekV3Attention computes it (q and k/v latents, RMSNorms on them, per-head
up-projections, the rotated key shared by the heads, RoPE on interleaved
pairs): shardlab rotates halves, so it gets the same weights with the
rotated rows of q_b_proj and kv_a_proj_with_mqa de-interleaved (the fixed
permutation its README states), and must give the same loss; and greedy
tokens through its latent KV cache (absorbed attention) equal to numpy's.

Usage: llama_numpy_reference.py SHARDLAB_BIN WORKDIR
Tolerance: relative loss difference <= 1e-5 (shardlab computes in float32).
"""
import json
import os
import struct
import subprocess
import sys

import numpy as np

L, C, NH, KV, F, V, T, B = 4, 128, 4, 2, 352, 512, 64, 8  # tiny-llama, batch 8
HS, THETA, EPS = C // NH, 10000.0, 1e-5


def weights(rng, hs=HS, qk_norm=False):
    """tiny-llama's tensors; with hs != C / NH heads of their own size and with
    qk_norm Qwen3's q_norm and k_norm (hs each)."""
    w = {"model.embed_tokens.weight": rng.normal(0, 0.3, (V, C)), "lm_head.weight": rng.normal(0, 0.1, (V, C)),
         "model.norm.weight": 1 + rng.normal(0, 0.1, C)}
    shapes = {"self_attn.q_proj": (NH * hs, C), "self_attn.k_proj": (KV * hs, C), "self_attn.v_proj": (KV * hs, C),
              "self_attn.o_proj": (C, NH * hs), "mlp.gate_proj": (F, C), "mlp.up_proj": (F, C),
              "mlp.down_proj": (C, F)}
    for i in range(L):
        for m, s in shapes.items():
            w[f"model.layers.{i}.{m}.weight"] = rng.normal(0, 0.1, s)
        for m in ("input_layernorm", "post_attention_layernorm"):
            w[f"model.layers.{i}.{m}.weight"] = 1 + rng.normal(0, 0.1, C)
        for m in ("self_attn.q_norm", "self_attn.k_norm") if qk_norm else ():
            w[f"model.layers.{i}.{m}.weight"] = 1 + rng.normal(0, 0.3, hs)
    return {k: v.astype(np.float32) for k, v in w.items()}


# MLA at tiny-llama's width: q latent 48, k/v latent 32, heads of 16 + 8
# rotated features (scores) and 16 (values).
LQ, LKV, DN, DR, DV = 48, 32, 16, 8, 16
MLA_FLAGS = ["--kv-heads", "4", "--head-dim", str(DN), "--q-lora-rank", str(LQ), "--kv-lora-rank", str(LKV),
             "--qk-rope-head-dim", str(DR), "--v-head-dim", str(DV)]


def mla_weights(rng):
    """tiny-llama with DeepSeek-V3's attention tensors (Hugging Face's names and layouts)."""
    w = weights(rng)
    for i in range(L):
        for m in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
            del w[f"model.layers.{i}.{m}.weight"]
        shapes = {"self_attn.q_a_proj": (LQ, C), "self_attn.q_b_proj": (NH * (DN + DR), LQ),
                  "self_attn.kv_a_proj_with_mqa": (LKV + DR, C), "self_attn.kv_b_proj": (NH * (DN + DV), LKV),
                  "self_attn.o_proj": (C, NH * DV)}
        for m, shape in shapes.items():
            w[f"model.layers.{i}.{m}.weight"] = rng.normal(0, 0.1, shape).astype(np.float32)
        for m, n in (("self_attn.q_a_layernorm", LQ), ("self_attn.kv_a_layernorm", LKV)):
            w[f"model.layers.{i}.{m}.weight"] = (1 + rng.normal(0, 0.1, n)).astype(np.float32)
    return w


def deinterleaved(w):
    """The weights shardlab's rotate-half RoPE needs for Hugging Face's
    interleaved one: each rotated block's rows [0, 2, 4, ..., 1, 3, 5, ...]."""
    perm = np.concatenate([np.arange(0, DR, 2), np.arange(1, DR, 2)])
    out = dict(w)
    for i in range(L):
        qb = w[f"model.layers.{i}.self_attn.q_b_proj.weight"].reshape(NH, DN + DR, LQ).copy()
        qb[:, DN:] = qb[:, DN:][:, perm]
        out[f"model.layers.{i}.self_attn.q_b_proj.weight"] = qb.reshape(NH * (DN + DR), LQ)
        kva = w[f"model.layers.{i}.self_attn.kv_a_proj_with_mqa.weight"].copy()
        kva[LKV:] = kva[LKV:][perm]
        out[f"model.layers.{i}.self_attn.kv_a_proj_with_mqa.weight"] = kva
    return out


def hf_mla_rope(x):  # Hugging Face's DeepSeek-V3: de-interleave the pairs, then rotate_half
    d = x.shape[-1]
    return rope(x.reshape(*x.shape[:-1], d // 2, 2).swapaxes(-1, -2).reshape(x.shape))


def mla_attention(g, n, mask):  # DeepseekV3Attention, float64
    B, T, _ = n.shape
    q = (rmsnorm(n @ g("self_attn.q_a_proj").T, g("self_attn.q_a_layernorm")) @ g("self_attn.q_b_proj").T)
    q = q.reshape(B, T, NH, DN + DR)
    ckv = n @ g("self_attn.kv_a_proj_with_mqa").T
    kv = (rmsnorm(ckv[..., :LKV], g("self_attn.kv_a_layernorm")) @ g("self_attn.kv_b_proj").T).reshape(B, T, NH, DN + DV)
    k_pe = hf_mla_rope(ckv[..., LKV:].reshape(B, T, 1, DR))
    query = np.concatenate([q[..., :DN], hf_mla_rope(q[..., DN:])], -1)
    key = np.concatenate([kv[..., :DN], np.repeat(k_pe, NH, axis=2)], -1)
    s = np.einsum("bthd,bshd->bhts", query, key) / np.sqrt(DN + DR) + mask
    a = np.exp(s - s.max(-1, keepdims=True))
    a /= a.sum(-1, keepdims=True)
    return np.einsum("bhts,bshd->bthd", a, kv[..., DN:]).reshape(B, T, NH * DV) @ g("self_attn.o_proj").T


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        data = np.ascontiguousarray(tensors[name], dtype="<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F32", (name, t["dtype"])
        b, e = t["data_offsets"]
        out[name] = np.frombuffer(raw[8 + n + b:8 + n + e], dtype="<f4").reshape(t["shape"])
    return out


def rmsnorm(x, w):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * w


def rope(x):  # x (B, T, heads, hs), Hugging Face's rotate_half at positions 0..T-1
    hs = x.shape[-1]
    inv_freq = THETA ** (-np.arange(0, hs, 2) / hs)
    freqs = np.arange(x.shape[1])[:, None] * inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], -1)
    cos, sin = np.cos(emb)[None, :, None, :], np.sin(emb)[None, :, None, :]
    rotated = np.concatenate([-x[..., hs // 2:], x[..., :hs // 2]], -1)
    return x * cos + rotated * sin


def logits(w, x):  # x (B, T) tokens -> (B, T, V)
    p = {k: v.astype(np.float64) for k, v in w.items()}
    B, T = x.shape
    mla = "model.layers.0.self_attn.kv_b_proj.weight" in p
    hs = 0 if mla else p["model.layers.0.self_attn.k_proj.weight"].shape[0] // KV  # the heads' size (Qwen3's head_dim)
    qk_norm = "model.layers.0.self_attn.q_norm.weight" in p  # Qwen3: RMSNorm over each head of q and k
    h = p["model.embed_tokens.weight"][x]
    mask = np.triu(np.full((T, T), -np.inf), 1)
    for i in range(L):
        g = lambda m: p[f"model.layers.{i}.{m}.weight"]
        n = rmsnorm(h, g("input_layernorm"))
        if mla:
            h = h + mla_attention(g, n, mask)
            n = rmsnorm(h, g("post_attention_layernorm"))
            gate = n @ g("mlp.gate_proj").T
            h = h + (gate / (1 + np.exp(-gate)) * (n @ g("mlp.up_proj").T)) @ g("mlp.down_proj").T
            continue
        q = (n @ g("self_attn.q_proj").T).reshape(B, T, NH, hs)
        k = (n @ g("self_attn.k_proj").T).reshape(B, T, KV, hs)
        if qk_norm:
            q, k = rmsnorm(q, g("self_attn.q_norm")), rmsnorm(k, g("self_attn.k_norm"))
        q, k = rope(q), rope(k)
        v = (n @ g("self_attn.v_proj").T).reshape(B, T, KV, hs)
        k, v = np.repeat(k, NH // KV, axis=2), np.repeat(v, NH // KV, axis=2)  # repeat_kv
        s = np.einsum("bthd,bshd->bhts", q, k) / np.sqrt(hs) + mask
        a = np.exp(s - s.max(-1, keepdims=True))
        a /= a.sum(-1, keepdims=True)
        h = h + np.einsum("bhts,bshd->bthd", a, v).reshape(B, T, NH * hs) @ g("self_attn.o_proj").T
        n = rmsnorm(h, g("post_attention_layernorm"))
        gate = n @ g("mlp.gate_proj").T
        h = h + (gate / (1 + np.exp(-gate)) * (n @ g("mlp.up_proj").T)) @ g("mlp.down_proj").T
    return rmsnorm(h, p["model.norm.weight"]) @ p["lm_head.weight"].T


def loss(w, x, y):
    z = logits(w, x)
    z -= z.max(-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    return -np.take_along_axis(logp, y[..., None], -1).mean()


def shardlab_losses(binary, init, data, extra, steps=1):
    cmd = [binary, "train", "--model", "tiny-llama", "--init", init, "--data", data, "--sampling", "sequential",
           "--steps", str(steps), "--json"] + extra
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr}")
    return [s["loss"] for s in json.loads(out.stdout)["steps"]]


def greedy(w, prompt, n):  # no cache: the whole sequence again for every token
    seq = list(prompt)
    for _ in range(n):
        seq.append(int(np.argmax(logits(w, np.array([seq]))[0, -1])))
    return seq[len(prompt):]


def batch(tokens, step):  # --sampling sequential: row j of step s starts at (s*B + j) * T (no wrap here)
    return np.stack([tokens[(step * B + j) * T:(step * B + j) * T + T + 1] for j in range(B)]).astype(np.int64)


def main():
    binary, work = sys.argv[1], sys.argv[2]
    os.makedirs(work, exist_ok=True)
    rng = np.random.default_rng(29)
    w = weights(rng)
    init, data = os.path.join(work, "tiny_llama.safetensors"), os.path.join(work, "tokens.bin")
    write_safetensors(init, w)
    tokens = rng.integers(0, V, 4096).astype("<u2")
    tokens.tofile(data)
    rows = batch(tokens, 0)
    want = loss(w, rows[:, :-1], rows[:, 1:])
    worst = 0.0
    for extra in ([], ["--tp", "2"], ["--tp", "4", "--sp"], ["--cp", "2"]):
        got = shardlab_losses(binary, init, data, extra)[0]
        rel = abs(got - want) / want
        worst = max(worst, rel)
        print(f"step-0 loss: numpy float64 {want:.8f}, shardlab {' '.join(extra) or 'unsharded'} {got:.8f}, "
              f"rel diff {rel:.2e} (tolerance 1e-5)")
    # The checkpoint shardlab writes after one step under tp 2 is read here by
    # name ([out, in], Hugging Face's names); its loss on step 1's batch is
    # the one an unsharded two-step run reports for step 1.
    saved = os.path.join(work, "after_step0.safetensors")
    shardlab_losses(binary, init, data, ["--tp", "2", "--save", saved])
    w1 = read_safetensors(saved)
    assert sorted(w1) == sorted(w), "the saved tensors are not the model's Hugging Face names"
    assert all(w1[k].shape == w[k].shape for k in w), "a saved tensor's shape differs"
    rows = batch(tokens, 1)
    want = loss(w1, rows[:, :-1], rows[:, 1:])
    got = shardlab_losses(binary, init, data, [], steps=2)[1]
    rel = abs(got - want) / want
    worst = max(worst, rel)
    print(f"step-1 loss: numpy on shardlab's tp-2 checkpoint {want:.8f}, shardlab unsharded {got:.8f}, "
          f"rel diff {rel:.2e} (tolerance 1e-5)")
    # Greedy decoding through shardlab's KV cache (RoPE at each cached
    # position, K/V heads shared) against numpy recomputing every prefix.
    prompt = [int(t) for t in tokens[:5]]
    want_tokens = greedy(w, prompt, 6)
    ok = True
    for extra in ([], ["--tp", "2"], ["--tp", "4"]):
        cmd = [binary, "generate", "--model", "tiny-llama", "--init", init, "--prompt-tokens",
               ",".join(map(str, prompt)), "--max-new-tokens", "6", "--json"] + extra
        out = subprocess.run(cmd, capture_output=True, text=True)
        got_tokens = json.loads(out.stdout)["tokens"] if out.returncode == 0 else out.stderr
        ok &= got_tokens == want_tokens
        print(f"greedy {' '.join(extra) or 'unsharded'}: shardlab {got_tokens}, numpy {want_tokens}")
    # Qwen3's attention: heads of 48 on n_embd 128 (--head-dim) and QK-norm
    # (--qk-norm: q_norm and k_norm over each head before RoPE), the same
    # comparisons on weights of those shapes.
    qwen = ["--head-dim", "48", "--qk-norm"]
    wq = weights(np.random.default_rng(31), hs=48, qk_norm=True)
    init_q = os.path.join(work, "tiny_llama_qwen3_attention.safetensors")
    write_safetensors(init_q, wq)
    rows = batch(tokens, 0)
    want = loss(wq, rows[:, :-1], rows[:, 1:])
    for extra in ([], ["--tp", "2"], ["--tp", "4", "--sp"], ["--cp", "2"]):
        got = shardlab_losses(binary, init_q, data, qwen + extra)[0]
        rel = abs(got - want) / want
        worst = max(worst, rel)
        print(f"head_dim 48, qk_norm: step-0 loss numpy float64 {want:.8f}, shardlab {' '.join(extra) or 'unsharded'} "
              f"{got:.8f}, rel diff {rel:.2e} (tolerance 1e-5)")
    want_tokens = greedy(wq, prompt, 6)
    for extra in ([], ["--tp", "2"], ["--tp", "4"]):
        cmd = [binary, "generate", "--model", "tiny-llama", "--init", init_q, "--prompt-tokens",
               ",".join(map(str, prompt)), "--max-new-tokens", "6", "--json"] + qwen + extra
        out = subprocess.run(cmd, capture_output=True, text=True)
        got_tokens = json.loads(out.stdout)["tokens"] if out.returncode == 0 else out.stderr
        ok &= got_tokens == want_tokens
        print(f"head_dim 48, qk_norm: greedy {' '.join(extra) or 'unsharded'}: shardlab {got_tokens}, "
              f"numpy {want_tokens}")
    # DeepSeek-V3's MLA: numpy computes Hugging Face's model (interleaved
    # RoPE pairs) on w_hf; shardlab loads the same weights de-interleaved.
    w_hf = mla_weights(np.random.default_rng(37))
    init_m = os.path.join(work, "tiny_llama_mla.safetensors")
    write_safetensors(init_m, deinterleaved(w_hf))
    rows = batch(tokens, 0)
    want = loss(w_hf, rows[:, :-1], rows[:, 1:])
    for extra in ([], ["--tp", "2"], ["--tp", "4", "--sp"], ["--pp", "2", "--tp", "2", "--sp"], ["--cp", "2"]):
        got = shardlab_losses(binary, init_m, data, MLA_FLAGS + extra)[0]
        rel = abs(got - want) / want
        worst = max(worst, rel)
        print(f"mla (Hugging Face's DeepseekV3Attention): step-0 loss numpy float64 {want:.8f}, shardlab "
              f"{' '.join(extra) or 'unsharded'} {got:.8f}, rel diff {rel:.2e} (tolerance 1e-5)")
    # Without the permutation the rotated features meet other weights: the loss must move.
    init_hf = os.path.join(work, "tiny_llama_mla_interleaved.safetensors")
    write_safetensors(init_hf, w_hf)
    got = shardlab_losses(binary, init_hf, data, MLA_FLAGS)[0]
    moved = abs(got - want) / want
    print(f"mla, Hugging Face's rows as they are: shardlab {got:.8f}, rel diff {moved:.2e} (must exceed 1e-4)")
    ok &= moved > 1e-4
    # Greedy decoding through MLA's latent cache and absorbed attention
    # against Hugging Face's DeepseekV3Attention recomputing every prefix.
    want_tokens = greedy(w_hf, prompt, 6)
    for extra in ([], ["--tp", "2"], ["--tp", "4"], ["--pp", "2", "--tp", "2"]):
        cmd = [binary, "generate", "--model", "tiny-llama", "--init", init_m, "--prompt-tokens",
               ",".join(map(str, prompt)), "--max-new-tokens", "6", "--json"] + MLA_FLAGS + extra
        out = subprocess.run(cmd, capture_output=True, text=True)
        got_tokens = json.loads(out.stdout)["tokens"] if out.returncode == 0 else out.stderr
        ok &= got_tokens == want_tokens
        print(f"mla: greedy {' '.join(extra) or 'unsharded'}: shardlab {got_tokens}, numpy {want_tokens}")
    sys.exit(0 if worst <= 1e-5 and ok else 1)


if __name__ == "__main__":
    main()
