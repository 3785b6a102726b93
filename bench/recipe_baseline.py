#!/usr/bin/env python3
"""The DFlash training recipe as today's PyTorch trainers run it, for a same-GPU side-by-side with
dflex-train (bench/recipe_bench.py):

  recipe_baseline.py --target DIR --drafter DIR --batches DIR --steps N --out FILE
                     [--lr 6e-4 --warmup-ratio 0.04 --betas 0.9 0.999 --eps 1e-8
                      --weight-decay 0.01 --grad-clip 1.0 --gamma 7 --max-anchors 512]

- the target: transformers' model in bfloat16 with SDPA attention, the packed row's documents kept
  apart by a 4-D attention mask (a hybrid target's documents run one by one: its gated-delta layers
  would carry their state across them), the hidden states of the drafter's target layers from
  output_hidden_states, no gradients;
- the drafter (DFlash: fc + hidden_norm over the concatenated target states, Qwen3 decoder layers
  whose keys and values are the context's and the block's, a final norm) in PyTorch, float32
  parameters under bfloat16 autocast, its attention torch.compile'd flex_attention with a BlockMask
  built per step by create_block_mask (one for full, one for sliding-window layers), the blocks
  padded to --max-anchors as the published trainers pad them;
- the loss: cross-entropy through the target's frozen LM head in chunks of positions, each chunk
  recomputed in the backward (no [positions x vocab] logits kept), weighted per position and
  normalised by the weight sum;
- torch.optim.AdamW (fused) on all parameters, the gradient norm clipped, a linear warmup then
  cosine decay.

It starts from the drafter dflex-train wrote with --checkpoint-initial and reads the batches it wrote
with --write-batches (the same rows, anchors and labels), so the losses of the first steps must agree
with dflex-train's within bfloat16 rounding. --out gets one JSON line per step: loss, the step's
gradient norm (before clipping), seconds and its parts (target forward, drafter forward and loss,
backward, optimizer), the blocks it padded to, context tokens, peak memory. --changed-steps N
--changed-anchors A pads the last N steps to A blocks: the first of them shows what a new padded
shape costs this recipe (torch.compile's recompiles)."""
import argparse
import glob
import json
import math
import os
import time

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch.nn.attention.flex_attention import create_block_mask, create_mask, flex_attention
from transformers import AutoModelForCausalLM

parser = argparse.ArgumentParser()
parser.add_argument("--target", required=True)
parser.add_argument("--drafter", required=True, help="a dflex-train checkpoint (config.json, safetensors)")
parser.add_argument("--batches", required=True, help="dflex-train --write-batches directory")
parser.add_argument("--steps", type=int, required=True)
parser.add_argument("--out", required=True)
parser.add_argument("--lr", type=float, default=6e-4)
parser.add_argument("--warmup-ratio", type=float, default=0.04)
parser.add_argument("--betas", type=float, nargs=2, default=(0.9, 0.999))
parser.add_argument("--eps", type=float, default=1e-8)
parser.add_argument("--weight-decay", type=float, default=0.01)
parser.add_argument("--grad-clip", type=float, default=1.0)
parser.add_argument("--max-anchors", type=int, default=512)
parser.add_argument("--changed-steps", type=int, default=0,
                    help="the last N steps pad to --changed-anchors blocks instead (a new padded shape, as a "
                         "user who changes max_anchors or the length meets it: recompiles included)")
parser.add_argument("--changed-anchors", type=int, default=0)
parser.add_argument("--loss-chunk", type=int, default=2048, help="positions per LM-head chunk")
parser.add_argument("--device", default="cuda", help="cuda, or cpu for a small smoke run")
args = parser.parse_args()
if args.changed_steps and args.changed_anchors <= args.max_anchors:
    parser.error("--changed-anchors must exceed --max-anchors (the padding only grows)")
device = torch.device(args.device)
cuda = device.type == "cuda"

# --- The target ------------------------------------------------------------------------------

target = AutoModelForCausalLM.from_pretrained(args.target, dtype=torch.bfloat16,
                                              attn_implementation="sdpa").to(device).eval()
embed_tokens = target.get_input_embeddings().weight.detach()
lm_head = target.get_output_embeddings().weight.detach()


def document_causal_mask(document_ids):
    """bool [1, 1, T, T]: query t sees the earlier keys of its own document; padding sees itself."""
    same = document_ids[:, :, None] == document_ids[:, None, :]
    causal = torch.ones(same.shape[-2:], dtype=torch.bool, device=same.device).tril()
    padding = (document_ids < 0)[:, :, None] & torch.eye(same.shape[-1], dtype=torch.bool, device=same.device)
    return ((same & causal & (document_ids >= 0)[:, :, None]) | padding)[:, None]


# transformers' gated-delta layers carry their state across a packed row's documents: a hybrid
# target runs each document on its own, as a trainer without packing feeds it.
hybrid = "linear_attention" in (getattr(target.config, "layer_types", None) or [])


@torch.no_grad()
def target_features(batch, layer_ids):
    def states(tokens, positions, mask=None):
        out = target.model(input_ids=tokens, position_ids=positions, attention_mask=mask,
                           output_hidden_states=True, use_cache=False)
        return torch.cat([out.hidden_states[l + 1] for l in layer_ids], -1)

    if not hybrid:
        return states(batch["tokens"], batch["position_ids"], document_causal_mask(batch["document_ids"]))
    features = None
    bounds = batch["cu_seqlens"].tolist()
    documents = batch["document_ids"][0]
    for begin, end in zip(bounds, bounds[1:]):
        if documents[begin] < 0:  # the padding tail
            continue
        piece = states(batch["tokens"][:, begin:end], batch["position_ids"][:, begin:end])
        if features is None:
            features = piece.new_zeros(1, documents.shape[0], piece.shape[-1])
        features[:, begin:end] = piece
    return features


# --- The drafter -----------------------------------------------------------------------------

with open(os.path.join(args.drafter, "config.json")) as f:
    config = json.load(f)
hidden, heads, kv_heads = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
head_dim, eps = config.get("head_dim", hidden // heads), config["rms_norm_eps"]
block_size, window = config["block_size"], config.get("sliding_window")
layer_types = config["layer_types"]
layer_ids = config["dflash_config"]["target_layer_ids"]
parameters = {}
for path in sorted(glob.glob(os.path.join(args.drafter, "*.safetensors"))):
    parameters.update(load_file(path, device=str(device)))
parameters = {name: torch.nn.Parameter(t.float()) for name, t in parameters.items()}


def rms_norm(x, weight):
    # Qwen3RMSNorm in float32; the result in bfloat16, as a bfloat16 model's activations are.
    y = x.float()
    return (weight * (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps))).to(torch.bfloat16)


# RoPE over the first rotary_dim dims of each head (all of them unless the drafter inherited a
# partial_rotary_factor from a Qwen3.5 target), rotate-half within them.
rotary_dim = int(head_dim * config.get("partial_rotary_factor", 1.0))
inverse_frequency = 1.0 / config.get("rope_theta", 1e6) ** (
    torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=device) / rotary_dim)


def rotate(x, positions):
    """x [B, heads, L, D] at positions [B, L]."""
    angles = positions.float()[:, None, :, None] * inverse_frequency
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()
    rotated, passed = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    turned = torch.cat([-rotated[..., half:], rotated[..., :half]], -1)
    return torch.cat([rotated * cos.to(x.dtype) + turned * sin.to(x.dtype), passed], -1)


compiled_flex = torch.compile(flex_attention)
compiled_block_mask = torch.compile(create_block_mask)


def attend(q, k, v, mask):
    """flex_attention over [B, heads, L, D]; on the CPU (no flex backward there, for a smoke run)
    SDPA with the mask made dense."""
    scale = 1.0 / math.sqrt(head_dim)
    if cuda:
        return compiled_flex(q, k, v, block_mask=mask, enable_gqa=True, scale=scale)
    dense = create_mask(mask.mask_mod, 1, None, q.shape[2], k.shape[2], device=device)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=dense, enable_gqa=True, scale=scale)
    return torch.where(dense.any(-1, keepdim=True), out, 0)  # rows that see nothing: 0, as the kernels


def block_masks(anchors, context_start, block_valid, context_length):
    """The DFlash pattern for queries (block i, position j) against [context; blocks]: context keys
    [context_start_i, anchor_i) (in a sliding layer also (anchor_i + j) - c < window), the block's
    own keys (in a sliding layer only j' <= j); padding blocks see nothing."""
    queries = anchors.shape[1] * block_size

    def dflash(sliding):
        def mask_mod(b, h, q, kv):
            block, j = q // block_size, q % block_size
            anchor = anchors[b, block]
            context = (kv < context_length) & (kv >= context_start[b, block]) & (kv < anchor)
            key_block = (kv - context_length) // block_size
            own = (kv >= context_length) & (key_block == block)
            if sliding:
                context = context & (anchor + j - kv < window)
                own = own & ((kv - context_length) % block_size <= j)
            return block_valid[b, block] & (context | own)
        return compiled_block_mask(mask_mod, 1, None, queries, context_length + queries, device=device)

    kinds = set(layer_types)
    return {kind: dflash(kind == "sliding_attention") for kind in kinds}


def drafter_forward(features, batch, masks):
    p = parameters
    context = rms_norm(F.linear(features, p["fc.weight"]), p["hidden_norm.weight"])
    tokens = batch["block_tokens"].flatten(1)
    x = F.embedding(tokens, embed_tokens)
    block_positions = batch["block_position_ids"].flatten(1)
    key_positions = torch.cat([batch["position_ids"], block_positions], 1)
    length, queries = context.shape[1], tokens.shape[1]
    for i, kind in enumerate(layer_types):
        w = lambda name: p[f"layers.{i}.{name}"]  # noqa: E731
        h = rms_norm(x, w("input_layernorm.weight"))
        keys_in = torch.cat([context, h.to(context.dtype)], 1)
        q = F.linear(h, w("self_attn.q_proj.weight")).view(1, queries, heads, head_dim)
        k = F.linear(keys_in, w("self_attn.k_proj.weight")).view(1, length + queries, kv_heads, head_dim)
        v = F.linear(keys_in, w("self_attn.v_proj.weight")).view(1, length + queries, kv_heads, head_dim)
        q = rotate(rms_norm(q, w("self_attn.q_norm.weight")).transpose(1, 2), block_positions)
        k = rotate(rms_norm(k, w("self_attn.k_norm.weight")).transpose(1, 2), key_positions)
        attended = attend(q, k, v.transpose(1, 2), masks[kind])
        x = x + F.linear(attended.transpose(1, 2).reshape(1, queries, heads * head_dim),
                         w("self_attn.o_proj.weight"))
        h = rms_norm(x, w("post_attention_layernorm.weight"))
        x = x + F.linear(F.silu(F.linear(h, w("mlp.gate_proj.weight"))) * F.linear(h, w("mlp.up_proj.weight")),
                         w("mlp.down_proj.weight"))
    return rms_norm(x, p["norm.weight"])


def chunk_loss(hidden, labels, weights):
    logits = F.linear(hidden, lm_head).float()
    return (F.cross_entropy(logits, labels.clamp(min=0), reduction="none") * weights).sum()


def block_loss(hidden, batch):
    labels, weights = batch["labels"].flatten(), batch["weights"].flatten()
    hidden = hidden.reshape(-1, hidden.shape[-1])
    total = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, hidden.shape[0], args.loss_chunk):
        piece = slice(start, start + args.loss_chunk)
        total = total + torch.utils.checkpoint.checkpoint(chunk_loss, hidden[piece], labels[piece],
                                                          weights[piece], use_reentrant=False)
    return total / weights.sum().clamp(min=1e-12)


# --- The batches -----------------------------------------------------------------------------

def read_batch(update, blocks):
    tensors = load_file(os.path.join(args.batches, f"batch-{update:08d}-rank0-micro0.safetensors"))
    batch = {name: t.to(device, non_blocking=True) for name, t in tensors.items()}
    # Padded to `blocks` (max_anchors), as the recipe's trainers pad them: the shapes stay fixed.
    pad = blocks - batch["anchors"].shape[1]
    if pad > 0:
        for name, value in (("anchors", 0), ("context_start", 0), ("block_valid", False)):
            batch[name] = F.pad(batch[name], (0, pad), value=value)
        for name, value in (("block_tokens", 0), ("block_position_ids", 0), ("labels", -1), ("weights", 0.0)):
            batch[name] = F.pad(batch[name], (0, 0, 0, pad), value=value)
    return batch


# --- Training --------------------------------------------------------------------------------

optimizer = torch.optim.AdamW(parameters.values(), lr=args.lr, betas=tuple(args.betas), eps=args.eps,
                              weight_decay=args.weight_decay, fused=cuda)
warmup = math.ceil(args.warmup_ratio * args.steps)


def learning_rate(step):
    if step < warmup:
        return args.lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(args.steps - warmup, 1))
    return args.lr * 0.5 * (1 + math.cos(math.pi * progress))


class Marks:
    """The step's part boundaries: CUDA events on the GPU (no synchronisation between parts), the
    host clock on the CPU."""

    def __init__(self):
        self.marks = []

    def mark(self):
        if cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def milliseconds(self, i):
        if cuda:
            return self.marks[i].elapsed_time(self.marks[i + 1])
        return (self.marks[i + 1] - self.marks[i]) * 1e3


def synchronize():
    if cuda:
        torch.cuda.synchronize()


if cuda:
    torch.cuda.reset_peak_memory_stats()
with open(args.out, "w") as out:
    for step in range(args.steps):
        blocks = args.changed_anchors if step >= args.steps - args.changed_steps else args.max_anchors
        batch = read_batch(step + 1, blocks)
        marks = Marks()
        synchronize()
        start = time.perf_counter()
        marks.mark()
        features = target_features(batch, layer_ids)
        marks.mark()
        masks = block_masks(batch["anchors"].int(), batch["context_start"].int(), batch["block_valid"],
                            features.shape[1])
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = block_loss(drafter_forward(features, batch, masks), batch)
        marks.mark()
        loss.backward()
        marks.mark()
        grad_norm = torch.nn.utils.clip_grad_norm_(parameters.values(), args.grad_clip)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        marks.mark()
        synchronize()
        seconds = time.perf_counter() - start
        parts = ("target_forward", "drafter_forward", "backward", "optimizer")
        out.write(json.dumps({
            "step": step + 1, "time": time.time(), "loss": loss.item(), "grad_norm": grad_norm.item(),
            "seconds": seconds, "padded_blocks": blocks,
            "times_ms": {part: marks.milliseconds(i) for i, part in enumerate(parts)},
            "context_tokens": int((batch["document_ids"] >= 0).sum()),
            "peak_memory_bytes": torch.cuda.max_memory_allocated() if cuda else 0}) + "\n")
        out.flush()
