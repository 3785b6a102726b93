"""An independent PyTorch implementation of the DFlash drafter, written from
its definition (docs/models.md), for the C++ drafter to match:

  drafter_reference.py --checkpoint DIR --inputs FILE --out FILE [--device cuda]

DIR holds config.json and the drafter's safetensors; FILE (safetensors) the
inputs: context_features [B, T, F], context_positions [B, T], block_tokens and
block_positions [B, N, K], anchors, block_valid, context_start [B, N],
embed_tokens and lm_head [V, H], labels and weights [B, N, K].

Computes in float64 on --device (default cpu) and writes hidden [B, N, K, H],
loss (the weighted cross-entropy over positions with positive weight,
normalised by the weight sum) and grad.<parameter> for every drafter
parameter, as CPU tensors.
"""
import argparse
import json
import pathlib

import torch
from safetensors.torch import load_file, save_file


def load_parameters(directory, device):
    parameters = {}
    for path in sorted(directory.glob("*.safetensors")):
        parameters.update(load_file(str(path)))
    return {name: t.to(device, torch.float64).requires_grad_() for name, t in parameters.items()}


def rms_norm(x, weight, eps):
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rotate(x, positions, theta):
    """x [B, L, heads, D] at integer positions [B, L]."""
    dim = x.shape[-1]
    inverse = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64, device=x.device) / dim)
    angles = positions.to(torch.float64)[..., None] * inverse
    angles = torch.cat([angles, angles], -1)[:, :, None, :]
    half = dim // 2
    turned = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * angles.cos() + turned * angles.sin()


def visible(b, query, key, inputs, context_length, block_size, window):
    """Whether block query `query` of row b sees attention key `key`."""
    block, j = divmod(query, block_size)
    if not bool(inputs["block_valid"][b, block]):
        return False
    anchor = int(inputs["anchors"][b, block])
    if key < context_length:
        if not int(inputs["context_start"][b, block]) <= key < anchor:
            return False
        return window is None or (anchor + j) - key < window
    key_block, key_j = divmod(key - context_length, block_size)
    if key_block != block:
        return False
    return window is None or 0 <= j - key_j < window


def attention(q, k, v, mask, scale):
    """q [B, Q, Hq, D], k and v [B, S, Hkv, D], mask [B, Q, S]."""
    groups = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(groups, 2)
    v = v.repeat_interleave(groups, 2)
    scores = torch.einsum("bqhd,bshd->bhqs", q, k) * scale
    scores = scores.masked_fill(~mask[:, None], float("-inf"))
    weights = torch.softmax(scores, -1)
    weights = torch.where(mask[:, None], weights, torch.zeros_like(weights))  # rows with no key
    return torch.einsum("bhqs,bshd->bqhd", weights, v)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", required=True, type=pathlib.Path)
    parser.add_argument("--inputs", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    device = torch.device(args.device)

    config = json.loads((args.checkpoint / "config.json").read_text())
    assert config.get("rope_scaling") is None, "the reference implements the default RoPE only"
    eps, theta = config["rms_norm_eps"], config["rope_theta"]
    head_dim, block_size = config["head_dim"], config["dflash_config"]["block_size"]
    p = load_parameters(args.checkpoint, device)
    inputs = load_file(args.inputs)  # on the CPU, where the masks are built
    on_device = {name: t.to(device) for name, t in inputs.items()}
    features = on_device["context_features"].to(torch.float64)
    batch, context_length = features.shape[:2]
    blocks = inputs["block_tokens"].shape[1]
    queries = blocks * block_size
    keys = context_length + queries

    masks = {}
    for kind in set(config["layer_types"]):
        window = config["sliding_window"] if kind == "sliding_attention" else None
        masks[kind] = torch.tensor(
            [[[visible(b, q, s, inputs, context_length, block_size, window) for s in range(keys)]
              for q in range(queries)] for b in range(batch)], dtype=torch.bool, device=device)

    context = rms_norm(features @ p["fc.weight"].T, p["hidden_norm.weight"], eps)
    embed = on_device["embed_tokens"].to(torch.float64)
    x = embed[on_device["block_tokens"].reshape(batch, queries)]
    query_positions = on_device["block_positions"].reshape(batch, queries)
    key_positions = torch.cat([on_device["context_positions"], query_positions], 1)
    for i, kind in enumerate(config["layer_types"]):
        w = lambda name: p[f"layers.{i}.{name}"]
        h = rms_norm(x, w("input_layernorm.weight"), eps)
        both = torch.cat([context, h], 1)
        q = rms_norm((h @ w("self_attn.q_proj.weight").T).view(batch, queries, -1, head_dim),
                     w("self_attn.q_norm.weight"), eps)
        k = rms_norm((both @ w("self_attn.k_proj.weight").T).view(batch, keys, -1, head_dim),
                     w("self_attn.k_norm.weight"), eps)
        v = (both @ w("self_attn.v_proj.weight").T).view(batch, keys, -1, head_dim)
        out = attention(rotate(q, query_positions, theta), rotate(k, key_positions, theta), v,
                        masks[kind], head_dim ** -0.5)
        x = x + out.reshape(batch, queries, -1) @ w("self_attn.o_proj.weight").T
        h = rms_norm(x, w("post_attention_layernorm.weight"), eps)
        gate = h @ w("mlp.gate_proj.weight").T
        x = x + (torch.nn.functional.silu(gate) * (h @ w("mlp.up_proj.weight").T)) @ w("mlp.down_proj.weight").T
    hidden = rms_norm(x, p["norm.weight"], eps).view(batch, blocks, block_size, -1)

    weights = on_device["weights"].to(torch.float64)
    used = weights > 0
    logits = hidden[used] @ on_device["lm_head"].to(torch.float64).T
    losses = torch.nn.functional.cross_entropy(logits, on_device["labels"][used], reduction="none")
    loss = (losses * weights[used]).sum() / weights[used].sum()
    loss.backward()

    result = {"hidden": hidden.detach().cpu(), "loss": loss.detach().cpu()}
    result.update({f"grad.{name}": t.grad.cpu() for name, t in p.items()})
    save_file(result, args.out)
    print(f"drafter_reference: loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
