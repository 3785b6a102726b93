#!/usr/bin/env python3
"""Where a dflex attention call's time goes, on the DFlash training shape.

usage: attention_profile.py LIBDFLEX_TORCH_OPS BUNDLES_DIR [--kernels CHOICE] [--mask document|chunked]

Runs forward+backward of the op under torch.profiler and prints, per step,
the GPU time of each kernel (and copy/memset), their sum, and the step's
wall time: the gap between the two is time the GPU waits on the host
(tile lists, capture uploads, synchronisations). Times the step with
captures already on the host (as a data loader hands them over) and with
captures on the device (the op copies them to the host for its tile lists).
--mask document profiles the document mask instead (8192 tokens, 32/8
heads, documents of 40 to 799 tokens, as attention_bench.py --masks draws
them), the mask whose op time was furthest from its kernels' time;
--mask chunked the chunked causal mask at 8 query and 2 key/value heads
(8192 tokens, a captured chunk of 300, as attention_bench.py --masks),
whose kernels are short enough for the host's work per call to show. Each
also times the forward alone, with and without autograd (which adds the
backward's tile list to the forward call).
"""

import os
import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from timing import median_ms, steady_ms

LIB, BUNDLES = sys.argv[1], sys.argv[2]
if "--kernels" in sys.argv:
    os.environ["DFLEX_ATTENTION_KERNELS"] = sys.argv[sys.argv.index("--kernels") + 1]
torch.ops.load_library(LIB)
dev, dt = "cuda", torch.bfloat16
BLOCK, ANCHORS, CONTEXT = 16, 512, 8192
STEPS = 5

torch.manual_seed(0)
MASK = sys.argv[sys.argv.index("--mask") + 1] if "--mask" in sys.argv else "dflash"
heads, kv_heads = 32, 8
if MASK == "document":
    tq = tkv = 8192
    lengths = torch.randint(40, 800, (tq,), generator=torch.Generator().manual_seed(tq))
    ids = torch.repeat_interleave(torch.arange(tq, dtype=torch.int32), lengths)[:tq][None]
    bundle, spec = os.path.join(BUNDLES, "document_mask"), "document_attention"
    host_captures, device_captures = [ids], [ids.to(dev)]
elif MASK == "chunked":
    tq = tkv = 8192
    heads, kv_heads = 8, 2
    bundle, spec = os.path.join(BUNDLES, "chunked_causal"), "chunked_causal_attention"
    chunk = torch.tensor(300, dtype=torch.int64)
    host_captures, device_captures = [chunk], [chunk.to(dev)]
elif MASK != "dflash":
    sys.exit("--mask takes 'document' or 'chunked'")
else:
    anchors = torch.sort(torch.randperm(CONTEXT - 1, device=dev)[:ANCHORS] + 1).values.to(torch.int32)
    tq, tkv = ANCHORS * BLOCK, CONTEXT + ANCHORS * BLOCK
    bundle, spec = os.path.join(BUNDLES, "dflash"), "drafter_attention"
    context_start = torch.zeros(1, ANCHORS, dtype=torch.int32)
    context = torch.tensor(CONTEXT, dtype=torch.int64)
    host_captures = [anchors[None].cpu(), context_start, context]
    device_captures = [anchors[None], context_start.to(dev), context]
q = torch.randn(1, tq, heads, 128, device=dev, dtype=dt, requires_grad=True)
k = torch.randn(1, tkv, kv_heads, 128, device=dev, dtype=dt, requires_grad=True)
v = torch.randn(1, tkv, kv_heads, 128, device=dev, dtype=dt, requires_grad=True)
do = torch.randn(1, tq, heads, 128, device=dev, dtype=dt)


# The same values in [B, H, T, D] storage, read through [B, T, H, D] views
# (how attention_bench.py shares its inputs with flex_attention).
strided = [t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (q, k, v)]


def step(captures, leaves=(q, k, v), views=lambda t: t):
    o, _ = torch.ops.dflex.attention(bundle, spec, *map(views, leaves), captures)
    o.backward(do)
    for t in leaves:
        t.grad = None


def bhtd(t):
    return t.transpose(1, 2)


for name, args in (("host captures", (host_captures,)),
                   ("device captures", (device_captures,)),
                   ("host captures, [B,H,T,D] storage", (host_captures, strided, bhtd))):
    print(f"{name}: fwd+bwd median {median_ms(lambda: step(*args)):.3f} ms, "
          f"back to back {steady_ms(lambda: step(*args)):.3f} ms", flush=True)


def forward(captures):
    torch.ops.dflex.attention(bundle, spec, q, k, v, captures)


print(f"host captures: fwd median {median_ms(lambda: forward(host_captures)):.3f} ms with autograd, "
      f"back to back {steady_ms(lambda: forward(host_captures)):.3f} ms", flush=True)
with torch.no_grad():
    print(f"host captures: fwd median {median_ms(lambda: forward(host_captures)):.3f} ms without, "
          f"back to back {steady_ms(lambda: forward(host_captures)):.3f} ms", flush=True)

step(host_captures)
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(STEPS):
        step(host_captures)
    torch.cuda.synchronize()

gpu_us = defaultdict(float)
calls = defaultdict(int)
for event in prof.events():
    if event.device_type == torch.autograd.DeviceType.CUDA:
        gpu_us[event.name] += event.device_time
        calls[event.name] += 1
total = sum(gpu_us.values()) / STEPS
print(f"\nGPU time per step (host captures, {STEPS} steps under the profiler)")
print("| kernel | calls/step | ms/step |")
print("|---|---|---|")
for name, us in sorted(gpu_us.items(), key=lambda item: -item[1]):
    print(f"| {name[:90]} | {calls[name] / STEPS:g} | {us / STEPS / 1000:.3f} |")
print(f"| total | | {total / 1000:.3f} |")
cpu = prof.key_averages()
print("\nhost time per step of the op's own ranges (top 12 by CPU total)")
for row in sorted(cpu, key=lambda r: -r.cpu_time_total)[:12]:
    print(f"  {row.key[:70]:70s} {row.cpu_time_total / STEPS / 1000:8.3f} ms  x{row.count / STEPS:g}")

# One step's timeline: the host ranges directly under the op and its
# backward node, and the GPU's activities, in microseconds from the step's start.
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    torch.cuda.synchronize()
    step(host_captures)
    torch.cuda.synchronize()
events = [e for e in prof.events() if e.name != "cudaDeviceSynchronize"]
origin = min(e.time_range.start for e in events if e.device_type == torch.autograd.DeviceType.CPU)
print("\none step's timeline (us from the step's start; GPU rows marked *)")
for e in sorted(events, key=lambda e: e.time_range.start):
    on_gpu = e.device_type == torch.autograd.DeviceType.CUDA
    depth = 0
    parent = e.cpu_parent
    while parent is not None:
        depth += 1
        parent = parent.cpu_parent
    if on_gpu or depth <= 2:
        print(f"{'*' if on_gpu else ' '} {e.time_range.start - origin:8.1f} {e.time_range.end - origin:8.1f}  "
              f"{'  ' * depth}{e.name[:80]}")
