"""Test cases for the dflex attention op on the example specs (examples/*.mlir).

Each case makes random captures for a problem size and restates its mask and
score_mod in PyTorch, written from the example's documented meaning rather
than from its program, so the dense implementation here is an independent
oracle. Shared by the CPU test (attention_op_check.py) and the GPU test
(test/gpu/runtime/attention_op_gpu.py).
"""
import math
from dataclasses import dataclass, field
from typing import Callable, List, Optional

import torch

BLOCK = 16  # DFlash block size


@dataclass
class Problem:
    batch: int
    q_len: int
    kv_len: int
    captures: List[torch.Tensor]
    # mask(b, h, q, kv) and score_mod(s, b, h, q, kv) on broadcast index grids.
    mask: Callable
    score_mod: Optional[Callable] = None
    notes: str = ""


@dataclass
class Case:
    name: str          # the example file, without .mlir
    spec: str          # the dflex.attention symbol in it
    make: Callable     # make(generator, size) -> Problem; size is "small" or "large"
    tags: List[str] = field(default_factory=list)


def _lengths(gen, size, low_small, high_small, low_large, high_large):
    low, high = (low_small, high_small) if size == "small" else (low_large, high_large)
    return int(torch.randint(low, high + 1, (), generator=gen))


def _causal(b, h, q, kv):
    return q >= kv


def make_causal(gen, size):
    t = _lengths(gen, size, 40, 90, 300, 700)
    return Problem(2, t, t, [], _causal)


def make_sliding_window(gen, size):
    t = _lengths(gen, size, 40, 90, 300, 700)
    window = 13 if size == "small" else 100
    return Problem(2, t, t, [torch.tensor(window)],
                   lambda b, h, q, kv: (q >= kv) & (q - kv < window))


def make_chunked_causal(gen, size):
    # A chunk size that does not divide the length (and 1: every query alone).
    t = _lengths(gen, size, 40, 90, 300, 700)
    chunk = int(torch.randint(1, 12, (), generator=gen)) if size == "small" else 96
    return Problem(2, t, t, [torch.tensor(chunk)],
                   lambda b, h, q, kv: (q >= kv) & (q // chunk == kv // chunk))


def make_dilated(gen, size):
    t = _lengths(gen, size, 40, 90, 300, 700)
    window, dilation = (5, 3) if size == "small" else (40, 4)
    return Problem(2, t, t, [torch.tensor(window), torch.tensor(dilation)],
                   lambda b, h, q, kv: (q >= kv) & (q - kv < window * dilation)
                   & ((q - kv) % dilation == 0))


def make_document(gen, size):
    t = _lengths(gen, size, 40, 90, 300, 700)
    batch = 2
    # Ids stop 7 positions short of the sequence: reads past them give the
    # paddings (-1 for the query, -2 for the key), so those queries see nothing.
    known = t - 7
    ids = torch.cumsum((torch.rand(batch, known, generator=gen) < 0.06).int(), 1).int()

    def mask(b, h, q, kv):
        def doc(index, padding):
            inside = index < known
            return torch.where(inside, ids[b, index.clamp(max=known - 1)], torch.tensor(padding))
        return (doc(q, -1) == doc(kv, -2)) & (q >= kv)
    return Problem(batch, t, t, [ids], mask, notes="last 7 queries fully masked")


def make_prefix_lm(gen, size):
    t = _lengths(gen, size, 40, 90, 300, 700)
    prefix = torch.randint(0, t, (3,), generator=gen).int()
    return Problem(3, t, t, [prefix], lambda b, h, q, kv: (kv < prefix[b]) | (q >= kv))


def _anchors(gen, batch, blocks, context):
    anchors = torch.empty(batch, blocks, dtype=torch.int32)
    for b in range(batch):
        anchors[b] = torch.randperm(context, generator=gen)[:blocks].sort().values.int()
    anchors[0, 0] = 0              # a block that sees only its own block
    anchors[-1, -2:] = -1          # padded blocks see nothing
    return anchors


def _dflash_geometry(gen, size):
    blocks = 4 if size == "small" else 24
    context = _lengths(gen, size, 30, 60, 300, 600)
    # Queries run 5 past the anchors' blocks: reads past the end give -1.
    return blocks, context, blocks * BLOCK + 5, context + blocks * BLOCK + 3


def _dflash_block(anchors, context_start, b, q):
    """The query's block, its anchor (-1 past the anchors) and its document start."""
    blocks = anchors.shape[1]
    block = q // BLOCK
    inside = block < blocks
    clamped = block.clamp(max=blocks - 1)
    anchor = torch.where(inside, anchors[b, clamped], torch.tensor(-1))
    start = torch.where(inside, context_start[b, clamped], torch.tensor(0))
    return block, anchor, start


def _context_start(gen, anchors):
    """Per block, where its anchor's document begins: 0, or a random point up to the anchor."""
    upper = anchors.clamp(min=0).to(torch.float64)
    starts = (torch.rand(anchors.shape, generator=gen, dtype=torch.float64) * upper).floor()
    keep_zero = torch.rand(anchors.shape, generator=gen) < 0.5
    return torch.where(keep_zero, torch.zeros_like(starts), starts).to(torch.int32)


def make_dflash(gen, size):
    blocks, context, q_len, kv_len = _dflash_geometry(gen, size)
    anchors = _anchors(gen, 2, blocks, context)
    context_start = _context_start(gen, anchors)

    def mask(b, h, q, kv):
        block, anchor, start = _dflash_block(anchors, context_start, b, q)
        sees_context = (kv < context) & (kv < anchor) & (kv >= start)
        sees_block = (kv >= context) & (torch.div(kv - context, BLOCK, rounding_mode="floor") == block)
        return (sees_context | sees_block) & (anchor >= 0)
    return Problem(2, q_len, kv_len, [anchors, context_start, torch.tensor(context)], mask,
                   notes="padded blocks and queries past the anchors fully masked")


def make_dflash_sliding_window(gen, size):
    blocks, context, q_len, kv_len = _dflash_geometry(gen, size)
    anchors = _anchors(gen, 2, blocks, context)
    context_start = _context_start(gen, anchors)
    window = 11 if size == "small" else 128

    def mask(b, h, q, kv):
        block, anchor, start = _dflash_block(anchors, context_start, b, q)
        offset = q % BLOCK
        position = anchor + offset  # the query's position at inference
        sees_context = (kv < context) & (kv < anchor) & (kv >= start) & (position - kv < window)
        key = kv - context
        key_offset = key % BLOCK
        sees_block = ((kv >= context) & (torch.div(key, BLOCK, rounding_mode="floor") == block)
                      & (key_offset <= offset) & (offset - key_offset < window))
        return (sees_context | sees_block) & (anchor >= 0)
    return Problem(2, q_len, kv_len,
                   [anchors, context_start, torch.tensor(context), torch.tensor(window)], mask)


def make_softcap(gen, size):
    t = _lengths(gen, size, 30, 70, 300, 600)
    return Problem(1, t, t, [], _causal,
                   score_mod=lambda s, b, h, q, kv: 50.0 * torch.tanh(s / 50.0))


def make_alibi(gen, size):
    t = _lengths(gen, size, 30, 70, 300, 600)
    heads = 16
    slopes = torch.tensor([2.0 ** (-8.0 * (i + 1) / heads) for i in range(heads)])
    return Problem(2, t, t, [slopes], _causal,
                   score_mod=lambda s, b, h, q, kv: s - slopes.double()[h] * (q - kv))


def make_relative_bias(gen, size):
    t = _lengths(gen, size, 40, 90, 300, 700)
    buckets = 33
    table = torch.randn(16, buckets, generator=gen)
    span = buckets - 1

    def score_mod(s, b, h, q, kv):
        bucket = (q - kv + span // 2).clamp(0, span)
        return s + table.double()[h, bucket]
    return Problem(2, t, t, [table], _causal, score_mod=score_mod)


def make_position_scale(gen, size):
    t = _lengths(gen, size, 30, 80, 300, 650)
    temperature = torch.rand(2, t, generator=gen) + 0.5
    key_bias = torch.randn(2, t, generator=gen)
    return Problem(2, t, t, [temperature, key_bias], _causal,
                   score_mod=lambda s, b, h, q, kv: s * temperature.double()[b, q] + key_bias.double()[b, kv])


CASES = [
    Case("causal", "causal_attention", make_causal),
    Case("sliding_window", "sliding_window_attention", make_sliding_window),
    Case("chunked_causal", "chunked_causal_attention", make_chunked_causal),
    Case("dilated_sliding_window", "dilated_attention", make_dilated),
    Case("document_mask", "document_attention", make_document),
    Case("prefix_lm", "prefix_lm_attention", make_prefix_lm),
    Case("dflash", "drafter_attention", make_dflash),
    Case("dflash_sliding_window", "drafter_sliding_window_attention", make_dflash_sliding_window),
    Case("softcap", "softcap_attention", make_softcap),
    Case("alibi", "alibi_attention", make_alibi),
    Case("relative_bias", "relative_bias_attention", make_relative_bias),
    Case("position_scale", "position_scale_attention", make_position_scale),
]


def index_grids(batch, heads, q_len, kv_len):
    b = torch.arange(batch).view(-1, 1, 1, 1)
    h = torch.arange(heads).view(1, -1, 1, 1)
    q = torch.arange(q_len).view(1, 1, -1, 1)
    kv = torch.arange(kv_len).view(1, 1, 1, -1)
    return b, h, q, kv


def dense_mask(problem, heads):
    grids = index_grids(problem.batch, heads, problem.q_len, problem.kv_len)
    return problem.mask(*grids).expand(problem.batch, heads, problem.q_len, problem.kv_len)


def dense_attention(q, k, v, mask, scale, score_mod=None):
    """Float64 attention from the definition, differentiable, with o = 0 and
    lse = -inf (and no NaN in gradients) for queries that see no key."""
    batch, q_len, heads, _ = q.shape
    group = heads // k.shape[2]
    keys = k.repeat_interleave(group, 2)
    values = v.repeat_interleave(group, 2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, keys) * scale
    if score_mod is not None:
        s = score_mod(s, *index_grids(batch, heads, q_len, k.shape[1]))
    sees_any = mask.any(-1, keepdim=True)
    # Rows that see nothing get finite scores, then zero weight.
    s = torch.where(sees_any, s.masked_fill(~mask, -math.inf), torch.zeros_like(s))
    p = torch.softmax(s, -1) * sees_any
    lse = torch.where(sees_any.squeeze(-1), torch.logsumexp(s, -1), torch.tensor(-math.inf, dtype=s.dtype))
    return torch.einsum("bhqk,bkhd->bqhd", p, values), lse
