#!/usr/bin/env python3
"""dflex attention against torch.compile'd flex_attention, in one process.

usage: attention_bench.py LIBDFLEX_TORCH_OPS BUNDLES_DIR[,BUNDLES_DIR...]
                          [--quick | --dflash-only | --causal-only | --masks[=T,...] [--mask-names=B,...]]
                          [--kernels LIST] [--kernel-times] [--flex-mma-sync] [--flex-autotune]
                          [--flex-sm120-smem] [--flex-sm120-occupancy]

BUNDLES_DIR holds one bundle per example (dflex-compile output). For each
shape: forward and forward+backward time (CUDA events; calls back to back,
and the median of calls that each start on an idle GPU, see timing.py),
peak memory above the inputs, and the flex/dflex ratios; then (with the
default flex) the cost of a new anchor layout (dflex: the op call builds tile lists; flex:
create_block_mask, and a recompile per new anchor count). Both sides get
their mask inputs ready before timing: flex its block mask, dflex its
captures on the host (where a data loader hands them over). dflex works
its tile lists out inside the timed calls; since the calls repeat the
captures, all but the first take them from the spec's tile-list cache,
as every attention layer after the first of a training step does (the new
anchor layout rows time a mask seen for the first time). Prints JSON rows
and tables last.

--quick leaves out the causal shapes; --dflash-only measures the DFlash
shape alone, --causal-only the causal shapes alone. --masks measures the
other examples instead, masks of the kinds users write (a run-time chunk size, documents, windows, prefixes, score
mods), at a small and a training length (default 1300 and 8192 tokens, or
the comma-separated lengths given), each at its spec's heads and head dim;
--mask-names=B,... measures only the masks of those bundles (e.g.
dilated_sliding_window,prefix_lm).

--kernels LIST: comma-separated DFLEX_ATTENTION_KERNELS values (auto,
portable, sm90); dflex is measured once per value, against the same flex
run (default: the environment's DFLEX_ATTENTION_KERNELS, else auto). Each
row names the binary and kernels that ran.

Several comma-separated bundle folders (the same specs compiled by two
builds of dflex-compile) are measured one after the other against the same
flex run, each row naming its folder: an A/B of a kernel change in one
process. --kernel-times adds, per row, the GPU time of each kernel of a
forward+backward call (torch.profiler, summed per kernel name) and their
sum, which host work and launch gaps do not move.

--flex-mma-sync gives flex the instructions sm_120 has: Triton without wgmma
(DISABLE_MMA_V3=1), its kernels cached in a fresh folder whose PTX is then
scanned; the run fails if any wgmma is there. --flex-autotune compiles flex
with mode="max-autotune-no-cudagraphs": Inductor times each of its candidate
tile, warp and stage configs (forward and backward) and keeps the fastest,
flex's best chance against kernels whose tiles were chosen by measurement.
--flex-sm120-smem caps the shared memory Triton lets a kernel load with at
sm_120's 101,376 B per block, so that a config an sm_120 block cannot hold
fails to load (OutOfResources, as on that GPU) and autotuning drops it: with
the two options above, flex as it could run on an sm_120 card, each config
it runs counted (and printed) with its shared memory.
--flex-sm120-occupancy (implies --flex-sm120-smem) also pads each Triton
kernel's shared memory at load, so that a multiprocessor of this GPU holds as
many of its blocks as an sm_120 one (100 KB per SM there, 1 KB reserved per
block): the same occupancy that dflex-compile --portable-configs-of sm_120
gives dflex's portable kernels, so both sides run as an RTX PRO 6000 would
run them, autotuning included.
"""

import glob
import json
import math
import os
import sys
import tempfile
import time

MMA_SYNC_ONLY = "--flex-mma-sync" in sys.argv
if MMA_SYNC_ONLY:  # before Triton is loaded: it reads both when it compiles
    os.environ["DISABLE_MMA_V3"] = "1"
    os.environ["TRITON_CACHE_DIR"] = tempfile.mkdtemp(prefix="dflex-bench-triton-")
COMPILE_OPTIONS = {"mode": "max-autotune-no-cudagraphs"} if "--flex-autotune" in sys.argv else {}
SM120_SHARED_BYTES = 101376  # the most shared memory an sm_120 block may have
SM120_SHARED_PER_SM, RESERVED_PER_BLOCK = 102400, 1024  # an sm_120 multiprocessor's, and per block
SM120_OCCUPANCY = "--flex-sm120-occupancy" in sys.argv
SM120_SHARED_CAP = "--flex-sm120-smem" in sys.argv or SM120_OCCUPANCY
if SM120_SHARED_CAP:  # Inductor's own cubin launcher would load kernels past Triton's check
    os.environ["TORCHINDUCTOR_USE_STATIC_CUDA_LAUNCHER"] = "0"

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from timing import kernel_ms, median_ms, steady_ms

flex_kernels_loaded = {}  # Triton kernel name -> (shared bytes, bytes it launches with), under --flex-sm120-smem


def sm120_occupancy_shared_bytes(shared_bytes):
    """The shared memory with which this GPU's multiprocessor holds as many blocks
    needing `shared_bytes` as an sm_120 one (kernels/common/device.cuh has the same rule)."""
    per_sm = torch.cuda.get_device_properties(torch.cuda.current_device()).shared_memory_per_multiprocessor
    if shared_bytes == 0 or per_sm == SM120_SHARED_PER_SM:
        return shared_bytes
    blocks = max(1, SM120_SHARED_PER_SM // (shared_bytes + RESERVED_PER_BLOCK))
    least = -(-(per_sm // (blocks + 1) - RESERVED_PER_BLOCK + 1) // 128) * 128  # blocks + 1 no longer fit
    return max(shared_bytes, least)


if SM120_SHARED_CAP:
    import ctypes

    import triton.compiler.compiler as triton_compiler

    device_shared_bytes = triton_compiler.max_shared_mem
    triton_compiler.max_shared_mem = lambda device: min(device_shared_bytes(device), SM120_SHARED_BYTES)
    loaded_kernel = triton_compiler.CompiledKernel._init_handles
    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8

    def init_handles_within_sm120(kernel):
        if kernel.module is not None:
            return
        loaded_kernel(kernel)  # raises OutOfResources past the cap
        shared = kernel.metadata.shared
        launched = sm120_occupancy_shared_bytes(shared) if SM120_OCCUPANCY else shared
        if launched != shared:
            # Triton launches with the shared bytes of its packed metadata
            # (num_warps, num_ctas, shared), read by Inductor's launchers after this load.
            if tuple(kernel.packed_metadata)[2:] != (shared,):
                sys.exit(f"attention_bench: --flex-sm120-occupancy: unexpected Triton launch metadata "
                         f"{kernel.packed_metadata} for {kernel.name}")
            status = ctypes.CDLL("libcuda.so.1").cuFuncSetAttribute(
                ctypes.c_void_p(kernel.function), CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, launched)
            if status != 0:
                sys.exit(f"attention_bench: cuFuncSetAttribute({kernel.name}, {launched} B) failed: {status}")
            kernel.packed_metadata = tuple(kernel.packed_metadata)[:2] + (launched,)
        flex_kernels_loaded[kernel.name] = (shared, launched)

    triton_compiler.CompiledKernel._init_handles = init_handles_within_sm120

LIB, BUNDLE_DIRS = sys.argv[1], sys.argv[2].split(",")
KERNEL_TIMES = "--kernel-times" in sys.argv
QUICK = "--quick" in sys.argv
DFLASH_ONLY = "--dflash-only" in sys.argv
CAUSAL_ONLY = "--causal-only" in sys.argv
MASK_LENGTHS = next(([int(t) for t in arg.split("=", 1)[1].split(",")] if "=" in arg else [1300, 8192]
                     for arg in sys.argv if arg.startswith("--masks")), None)
MASK_NAMES = next((arg.split("=", 1)[1].split(",") for arg in sys.argv if arg.startswith("--mask-names=")), None)
DFLASH = MASK_LENGTHS is None  # the DFlash shapes, the causal ones and the anchor layouts
if CAUSAL_ONLY and (QUICK or DFLASH_ONLY or MASK_LENGTHS):
    sys.exit("attention_bench.py: --causal-only leaves nothing to measure with --quick, --dflash-only or --masks")
RUN_DFLASH = DFLASH and not CAUSAL_ONLY
RUN_DFLASH_EXTRAS = RUN_DFLASH and not DFLASH_ONLY  # the sliding window and the new anchor layouts
RUN_CAUSAL = DFLASH and not QUICK and not DFLASH_ONLY
KERNELS = [os.environ.get("DFLEX_ATTENTION_KERNELS") or "auto"]
for i, arg in enumerate(sys.argv):
    if arg.startswith("--kernels="):
        KERNELS = arg.split("=", 1)[1].split(",")
    elif arg == "--kernels":
        KERNELS = sys.argv[i + 1].split(",")
torch.ops.load_library(LIB)
dev, dt = "cuda", torch.bfloat16
BLOCK = 16
rows = []
flex_failures = []  # cases compiled flex could not run
# Tiles for a case whose default flex configs do not fit, tried in turn
# (FlexKernelOptions: forward BLOCK_M x BLOCK_N, backward BLOCK_M1/N1 for dK
# and dV, M2/N2 for dQ); the smaller ones for head_dim 256 within sm_120's
# 101,376 B.
FLEX_FALLBACK_OPTIONS = [
    {"BLOCK_M": 64, "BLOCK_N": 64, "num_stages": 2, "num_warps": 4,
     "BLOCK_M1": 32, "BLOCK_N1": 64, "BLOCK_M2": 64, "BLOCK_N2": 32},
    {"BLOCK_M": 32, "BLOCK_N": 32, "num_stages": 1, "num_warps": 4,
     "BLOCK_M1": 16, "BLOCK_N1": 32, "BLOCK_M2": 32, "BLOCK_N2": 16},
]


def measure(name, forward, make_inputs):
    """Forward and fwd+bwd ms of forward(q, k, v) -> o (back to back, and
    from an idle GPU) and the peak extra GiB."""
    torch.cuda.empty_cache()
    q, k, v, do = make_inputs()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()

    def fwd_bwd():
        o = forward(q, k, v)
        o.backward(do)
        q.grad = k.grad = v.grad = None

    row = dict(impl=name,
               fwd_ms=round(steady_ms(lambda: forward(q, k, v)), 3),
               fwdbwd_ms=round(steady_ms(fwd_bwd), 3),
               idle_fwd_ms=round(median_ms(lambda: forward(q, k, v)), 3),
               idle_fwdbwd_ms=round(median_ms(fwd_bwd), 3))
    row["peak_GiB"] = round((torch.cuda.max_memory_allocated() - base) / 2**30, 3)
    if KERNEL_TIMES:
        fwd, fwdbwd = kernel_ms(lambda: forward(q, k, v)), kernel_ms(fwd_bwd)
        row.update(kernel_fwd_ms=round(sum(fwd.values()), 3), kernel_fwdbwd_ms=round(sum(fwdbwd.values()), 3),
                   fwdbwd_kernels={name[:48]: round(ms, 3) for name, ms in fwdbwd.items() if ms >= 0.001})
    return row


def inputs(batch, hq, hkv, tq, tkv, d):
    def make():
        torch.manual_seed(0)
        # [B, H, T, D] storage; dflex reads the [B, T, H, D] view of the same memory.
        q = torch.randn(batch, hq, tq, d, device=dev, dtype=dt, requires_grad=True)
        k = torch.randn(batch, hkv, tkv, d, device=dev, dtype=dt, requires_grad=True)
        v = torch.randn(batch, hkv, tkv, d, device=dev, dtype=dt, requires_grad=True)
        do = torch.randn(batch, hq, tq, d, device=dev, dtype=dt)
        return q, k, v, do
    return make


def dflex_forward(bundle, spec, captures, folder=None):
    """The op on `bundle` of `folder` (the first bundle folder by default)."""
    path = os.path.join(folder or BUNDLE_DIRS[0], bundle)

    def forward(q, k, v):
        o, _ = torch.ops.dflex.attention(path, spec, q.transpose(1, 2), k.transpose(1, 2),
                                         v.transpose(1, 2), captures)
        return o.transpose(1, 2)
    forward.bundle, forward.spec = path, spec
    forward.in_folder = lambda other: dflex_forward(bundle, spec, captures, other)
    return forward


def use_kernels(choice, dflex_fwd):
    """Sets DFLEX_ATTENTION_KERNELS; returns what the op then runs on this device."""
    os.environ["DFLEX_ATTENTION_KERNELS"] = choice
    major, minor = torch.cuda.get_device_capability()
    arch, source, forward, backward = torch.ops.dflex.attention_kernels(
        dflex_fwd.bundle, dflex_fwd.spec, major * 10 + minor)
    return f"{choice}: {arch} {source}, fwd {forward}, bwd {backward}"


def random_anchors(count, context):
    return torch.sort(torch.randperm(context - 1, device=dev)[:count] + 1).values.to(torch.int32)


def compare(case, batch, hq, hkv, tq, tkv, d, dflex_fwd, mask_mod, extra=None, score_mod=None):
    make = inputs(batch, hq, hkv, tq, tkv, d)
    block_mask = create_block_mask(mask_mod, batch, None, tq, tkv, device=dev)
    # Flex's own configs first; where none fits the GPU's shared memory (its
    # default for a score_mod reading a tensor at head_dim 64 on the Hopper
    # asks for 240 KB), the smaller tiles a user would pass instead.
    flex = None
    for options in [None] + FLEX_FALLBACK_OPTIONS:
        compiled = torch.compile(flex_attention, dynamic=False, **COMPILE_OPTIONS)
        try:
            flex = measure("flex_compiled", lambda q, k, v: compiled(q, k, v, block_mask=block_mask,
                                                                     score_mod=score_mod, enable_gqa=True,
                                                                     kernel_options=options), make)
            if options:  # the tables say which tiles flex ran with
                flex["kernel_options"] = options
                case = f"{case} (flex {options['BLOCK_M']}x{options['BLOCK_N']} tiles)"
            break
        except Exception as error:  # e.g. Inductor finds no config within the GPU's shared memory
            failure = f"{type(error).__name__}: {str(error)[:300]}"
            torch._dynamo.reset()
    if flex is None:
        flex_failures.append(dict(case=case, flex_failed=failure))
        print(json.dumps(flex_failures[-1]), flush=True)
        return
    for folder, choice in ((folder, choice) for folder in BUNDLE_DIRS for choice in KERNELS):
        ours_fwd = dflex_fwd.in_folder(folder)
        if not os.path.exists(ours_fwd.bundle):  # a folder of an A/B made for some specs only
            print(json.dumps(dict(case=case, kernels=choice, skipped=f"no bundle {ours_fwd.bundle}")), flush=True)
            continue
        try:
            kernels = use_kernels(choice, ours_fwd)
        except RuntimeError as error:  # e.g. sm90 for a head dim without Hopper kernels
            print(json.dumps(dict(case=case, kernels=choice, skipped=str(error))), flush=True)
            continue
        if len(BUNDLE_DIRS) > 1:
            kernels = f"{os.path.basename(os.path.normpath(folder))} {kernels}"
        ours = measure("dflex", ours_fwd, make)
        row = dict(case=case, kernels=kernels, flex=flex, dflex=ours,
                   fwd_speedup=round(flex["fwd_ms"] / ours["fwd_ms"], 3),
                   fwdbwd_speedup=round(flex["fwdbwd_ms"] / ours["fwdbwd_ms"], 3),
                   idle_fwd_speedup=round(flex["idle_fwd_ms"] / ours["idle_fwd_ms"], 3),
                   idle_fwdbwd_speedup=round(flex["idle_fwdbwd_ms"] / ours["idle_fwdbwd_ms"], 3))
        if KERNEL_TIMES:
            row.update(kernel_fwd_speedup=round(flex["kernel_fwd_ms"] / ours["kernel_fwd_ms"], 3),
                       kernel_fwdbwd_speedup=round(flex["kernel_fwdbwd_ms"] / ours["kernel_fwdbwd_ms"], 3))
        if extra:
            row.update(extra)
        print(json.dumps(row), flush=True)
        rows.append(row)


# The DFlash training mask: 512 anchors x 16 queries, 8192 context keys + 8192 block keys.
ANCHORS, CONTEXT = 512, 8192
anchors = random_anchors(ANCHORS, CONTEXT)


def dflash_mask(b, h, q, kv):
    blk = q // BLOCK
    a = anchors[blk]
    return torch.where(kv < CONTEXT, kv < a, (kv - CONTEXT) // BLOCK == blk)


# One document per row: every block's context starts at 0.
context_start = torch.zeros(1, ANCHORS, dtype=torch.int32)
if RUN_DFLASH:
    compare("dflash 8192x16384 32/8 d128", 1, 32, 8, ANCHORS * BLOCK, CONTEXT + ANCHORS * BLOCK, 128,
            dflex_forward("dflash", "drafter_attention",
                          [anchors[None].cpu(), context_start, torch.tensor(CONTEXT, dtype=torch.int64)]),
            dflash_mask)

WINDOW = 2048


def dflash_window_mask(b, h, q, kv):
    # Query j of block i sits at position anchor_i + j and sees the WINDOW
    # positions up to itself (examples/dflash_sliding_window.mlir).
    blk = q // BLOCK
    a = anchors[blk]
    ctx = (kv < a) & (a + q % BLOCK - kv < WINDOW)
    own = ((kv - CONTEXT) // BLOCK == blk) & (kv - CONTEXT <= q)
    return torch.where(kv < CONTEXT, ctx, own)


if RUN_DFLASH_EXTRAS:
    compare("dflash sliding window 2048", 1, 32, 8, ANCHORS * BLOCK, CONTEXT + ANCHORS * BLOCK, 128,
            dflex_forward("dflash_sliding_window", "drafter_sliding_window_attention",
                          [anchors[None].cpu(), context_start, torch.tensor(CONTEXT, dtype=torch.int64),
                           torch.tensor(WINDOW, dtype=torch.int64)]),
            dflash_window_mask)

if RUN_CAUSAL:
    causal = lambda b, h, q, kv: q >= kv
    compare("causal T=8192 32/8 d128", 1, 32, 8, 8192, 8192, 128,
            dflex_forward("causal", "causal_attention", []), causal)
    compare("causal T=8192 16/2 d256", 1, 16, 2, 8192, 8192, 256,
            dflex_forward("causal_d256", "causal_d256", []), causal)

def user_masks(t):
    """The other examples at length t: (case, bundle, spec, heads, kv heads, head dim, captures,
    mask_mod, score_mod), with sizes that are not tile multiples."""
    causal = lambda b, h, q, kv: q >= kv
    chunk = 300
    generator = torch.Generator().manual_seed(t)
    # Documents of 40 to 800 tokens: most visited tiles straddle a document border.
    lengths = torch.randint(40, 800, (t,), generator=generator)
    ids = torch.repeat_interleave(torch.arange(t, dtype=torch.int32), lengths)[:t][None]
    ids_gpu = ids.to(dev)
    window, dilation, span = 1000, 4, 64
    prefix = torch.tensor([t // 3], dtype=torch.int32)
    slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / 16) for h in range(16)])
    slopes_gpu = slopes.to(dev)
    distance = 128
    table = torch.randn(16, 2 * distance + 1, generator=generator)
    table_gpu = table.to(dev)
    t5_table = torch.randn(16, 32, generator=generator)
    t5_table_gpu, t5_max_distance = t5_table.to(dev), 128.0

    def t5_bias(s, b, h, q, kv):  # bench/specs/t5_log_bucket.mlir
        distance = (q - kv).clamp(min=0)
        log_ratio = torch.log(distance.float() / 16.0) / math.log(t5_max_distance / 16.0)
        far = (16 + (log_ratio * (t5_table.shape[1] - 16)).to(torch.int64)).clamp(max=t5_table.shape[1] - 1)
        return s + t5_table_gpu[h, torch.where(distance < 16, distance, far)]

    temperature = torch.rand(1, t, generator=generator) + 0.5
    key_bias = torch.randn(1, t, generator=generator)
    temperature_gpu, key_bias_gpu = temperature.to(dev), key_bias.to(dev)
    index = lambda value: torch.tensor(value, dtype=torch.int64)
    return [
        ("chunked_causal 300", "chunked_causal", "chunked_causal_attention", 8, 2, 128, [index(chunk)],
         lambda b, h, q, kv: (q >= kv) & (q // chunk == kv // chunk), None),
        ("document_mask", "document_mask", "document_attention", 32, 8, 128, [ids],
         lambda b, h, q, kv: (ids_gpu[b, q] == ids_gpu[b, kv]) & (q >= kv), None),
        ("sliding_window 1000", "sliding_window", "sliding_window_attention", 32, 8, 128, [index(window)],
         lambda b, h, q, kv: (q >= kv) & (q - kv < window), None),
        ("dilated 64x4", "dilated_sliding_window", "dilated_attention", 32, 8, 128, [index(span), index(dilation)],
         lambda b, h, q, kv: (q >= kv) & (q - kv < span * dilation) & ((q - kv) % dilation == 0), None),
        ("prefix_lm t/3", "prefix_lm", "prefix_lm_attention", 16, 16, 64, [prefix],
         lambda b, h, q, kv: (kv < t // 3) | (q >= kv), None),
        ("softcap 50", "softcap", "softcap_attention", 16, 8, 256, [], causal,
         lambda s, b, h, q, kv: 50.0 * torch.tanh(s / 50.0)),
        ("alibi", "alibi", "alibi_attention", 16, 16, 128, [slopes], causal,
         lambda s, b, h, q, kv: s - slopes_gpu[h] * (q - kv)),
        ("relative_bias 128", "relative_bias", "relative_bias_attention", 16, 4, 64, [table], causal,
         lambda s, b, h, q, kv: s + table_gpu[h, (q - kv + distance).clamp(0, 2 * distance)]),
        ("position_scale", "position_scale", "position_scale_attention", 16, 4, 128, [temperature, key_bias],
         causal, lambda s, b, h, q, kv: s * temperature_gpu[b, q] + key_bias_gpu[b, kv]),
        ("t5_log_bucket", "t5_log_bucket", "t5_log_bucket_attention", 16, 4, 128,
         [t5_table, torch.tensor(t5_max_distance, dtype=torch.float32)], causal, t5_bias),
    ]


if MASK_NAMES:
    known = [case[1] for case in user_masks(16)]
    unknown = sorted(set(MASK_NAMES) - set(known))
    if unknown or not MASK_LENGTHS:
        sys.exit(f"attention_bench.py: --mask-names needs --masks and names among {', '.join(known)}"
                 + (f"; unknown: {', '.join(unknown)}" if unknown else ""))
for t in MASK_LENGTHS or ():
    for case, bundle, spec, hq, hkv, d, captures, mask_mod, score_mod in user_masks(t):
        if MASK_NAMES and bundle not in MASK_NAMES:
            continue
        compare(f"{case} T={t} {hq}/{hkv} d{d}", 1, hq, hkv, t, t, d, dflex_forward(bundle, spec, captures),
                mask_mod, score_mod=score_mod)

# A new anchor layout each step: dflex builds its tile lists inside the call;
# flex needs create_block_mask, and compiled flex recompiles for each new
# anchor count (new query length). dflex runs the first --kernels choice.
# Flex compiles with its default configs here, so this is measured in a run
# with the default flex only (under --flex-sm120-smem those configs do not fit).
new_layout = []
os.environ["DFLEX_ATTENTION_KERNELS"] = KERNELS[0]
DEFAULT_FLEX = not (MMA_SYNC_ONLY or COMPILE_OPTIONS or SM120_SHARED_CAP)
for count in (480, 500, 512) if RUN_DFLASH_EXTRAS and DEFAULT_FLEX else ():
    fresh = random_anchors(count, CONTEXT)
    tq, tkv = count * BLOCK, CONTEXT + count * BLOCK
    make = inputs(1, 32, 8, tq, tkv, 128)
    q, k, v, do = make()
    torch.cuda.synchronize()
    start = time.perf_counter()
    fwd = dflex_forward("dflash", "drafter_attention",
                        [fresh[None].cpu(), torch.zeros(1, count, dtype=torch.int32),
                         torch.tensor(CONTEXT, dtype=torch.int64)])
    o = fwd(q, k, v)
    o.backward(do)
    torch.cuda.synchronize()
    dflex_first = time.perf_counter() - start

    def fresh_mask(b, h, qi, kv):
        blk = qi // BLOCK
        return torch.where(kv < CONTEXT, kv < fresh[blk], (kv - CONTEXT) // BLOCK == blk)

    start = time.perf_counter()
    block_mask = create_block_mask(fresh_mask, 1, None, tq, tkv, device=dev)
    torch.cuda.synchronize()
    mask_s = time.perf_counter() - start
    compiled = torch.compile(flex_attention, dynamic=False)
    start = time.perf_counter()
    o = compiled(q, k, v, block_mask=block_mask, enable_gqa=True)
    o.backward(do)
    torch.cuda.synchronize()
    flex_first = time.perf_counter() - start
    row = dict(case=f"new anchor count {count}", dflex_first_step_s=round(dflex_first, 3),
               flex_create_block_mask_s=round(mask_s, 4), flex_first_step_s=round(flex_first, 2))
    print(json.dumps(row), flush=True)
    new_layout.append(row)

def print_table(title, prefix, with_peak):
    """One markdown table of `rows`: the timings whose keys start with `prefix`."""
    print(f"\n{title}\n")
    print("| case | dflex kernels | flex fwd ms | dflex fwd ms | fwd x | flex fwd+bwd ms | dflex fwd+bwd ms | fwd+bwd x |"
          + (" flex peak GiB | dflex peak GiB |" if with_peak else ""))
    print("|---" * (10 if with_peak else 8) + "|")
    for r in rows:
        f, d = r["flex"], r["dflex"]
        line = (f"| {r['case']} | {r['kernels']} | {f[prefix + 'fwd_ms']} | {d[prefix + 'fwd_ms']} | "
                f"{r[prefix + 'fwd_speedup']} | {f[prefix + 'fwdbwd_ms']} | {d[prefix + 'fwdbwd_ms']} | "
                f"{r[prefix + 'fwdbwd_speedup']} |")
        print(line + (f" {f['peak_GiB']} | {d['peak_GiB']} |" if with_peak else ""))


print_table("Back to back (steady state):", "", True)
print_table("Each call from an idle GPU (median; host work before the first kernel exposed):", "idle_", False)
if KERNEL_TIMES:
    print_table("GPU kernel time per call (torch.profiler, summed over the call's kernels):", "kernel_", False)
if new_layout:
    print("\n| new anchor layout | dflex first fwd+bwd s | flex create_block_mask s | flex first fwd+bwd s |")
    print("|---|---|---|---|")
    for r in new_layout:
        print(f"| {r['case']} | {r['dflex_first_step_s']} | {r['flex_create_block_mask_s']} | {r['flex_first_step_s']} |")
if MMA_SYNC_ONLY:
    counts = {"wgmma": 0, "mma.sync": 0}
    for path in glob.glob(os.path.join(os.environ["TRITON_CACHE_DIR"], "**", "*.ptx"), recursive=True):
        text = open(path).read()
        for instruction in counts:
            counts[instruction] += text.count(instruction)
    print(f"\nflex's PTX (Triton cache {os.environ['TRITON_CACHE_DIR']}): {counts['mma.sync']} mma.sync, "
          f"{counts['wgmma']} wgmma")
    if counts["wgmma"] or not counts["mma.sync"]:
        sys.exit("attention_bench: --flex-mma-sync, but flex's kernels are not mma.sync only")
if SM120_SHARED_CAP:
    # Every Triton kernel the process loaded went through the capped check;
    # none loaded would mean flex ran through a launcher the cap misses.
    largest = max((shared for shared, _ in flex_kernels_loaded.values()), default=None)
    print(f"\nTriton kernels loaded under sm_120's {SM120_SHARED_BYTES} B per block: {len(flex_kernels_loaded)}, "
          f"the largest with {largest} B of shared memory")
    if SM120_OCCUPANCY:
        print("Launched at sm_120's occupancy (shared bytes -> bytes launched with): " +
              ", ".join(sorted({f"{shared} -> {launched}" for shared, launched in flex_kernels_loaded.values()})))
    if largest is None or largest > SM120_SHARED_BYTES:
        sys.exit("attention_bench: --flex-sm120-smem, but flex's kernels did not load through the capped check")
if flex_failures:
    print("\n| case | compiled flex failed |\n|---|---|")
    for failure in flex_failures:
        print(f"| {failure['case']} | {failure['flex_failed'][:160]} |")
