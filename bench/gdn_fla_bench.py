#!/usr/bin/env python3
"""FLA's chunk_gated_delta_rule on the gated-delta benchmark shapes.

usage: gdn_fla_bench.py FLA_SRC [--all | --shape BxTxH ...]

FLA_SRC holds FLA's `fla` package (public source, kept out of the project).
Timed as the dflex kernels are in test/gpu/gated_delta: bf16, d=128, q/k L2
normalised in the kernel, delta rule, no states; median of 20 after warm-up.
The first call (autotuning) is timed too. With Triton < 3.7.1 on Hopper FLA
refuses its gated backward; its guard is lifted for timing only (the
backward's values are not used). Without --all or --shape only 1 x 16384 x
16 runs (each new shape autotunes for about two minutes).
"""

import json
import os
import sys
import time

sys.path.insert(0, sys.argv[1])
import torch
import torch.nn.functional as F

import fla.ops.common.chunk_o as chunk_o
chunk_o.IS_NVIDIA_HOPPER = False  # timing only, see above
from fla.ops.gated_delta_rule import chunk_gated_delta_rule

from timing import median_ms

SHAPES = [(1, 16384, 16), (1, 32768, 32), (8, 2048, 16)]
CHOSEN = [tuple(int(n) for n in sys.argv[i + 1].split("x")) for i, arg in enumerate(sys.argv)
          if arg == "--shape"]
if CHOSEN:
    SHAPES = CHOSEN
elif "--all" not in sys.argv:
    SHAPES = SHAPES[:1]
dev, d = "cuda", 128


for batch, length, heads in SHAPES:
    torch.manual_seed(0)
    q = torch.randn(batch, length, heads, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(batch, length, heads, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(batch, length, heads, d, device=dev, dtype=torch.bfloat16, requires_grad=True)
    g = F.logsigmoid(torch.randn(batch, length, heads, device=dev)).requires_grad_(True)
    beta = torch.rand(batch, length, heads, device=dev, dtype=torch.bfloat16).sigmoid().requires_grad_(True)
    do = torch.randn_like(v)
    forward = lambda: chunk_gated_delta_rule(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)

    def forward_backward():
        o, _ = forward()
        o.backward(do)
        for x in (q, k, v, g, beta):
            x.grad = None

    start = time.time()
    forward_backward()
    torch.cuda.synchronize()
    first = time.time() - start
    row = dict(impl="fla", B=batch, T=length, H=heads, first_call_s=round(first, 1),
               fwd_ms=round(median_ms(forward, iters=20), 3), fwdbwd_ms=round(median_ms(forward_backward, iters=20), 3))
    print(json.dumps(row), flush=True)
