#!/usr/bin/env python3
"""The first dflex call of a fresh process: how long a training job waits
before its first attention or gated-delta step, from a warm cache.

usage: first_call.py LIBDFLEX_TORCH_OPS BUNDLES_DIR

Each measurement runs in a new Python process. After torch has imported,
initialised CUDA and run one autograd step of its own with a given gradient
(costs any PyTorch program pays), the child times load_library, then the first forward+backward
(module load from the bundle, tile lists, kernels) on the DFlash training
shape, then a second shape with a new anchor count; and the same for the
gated-delta op on shapes the process has not seen (T = 12345, then 3001).
Then an attention bundle without its device binaries: the first process
compiles them through NVRTC into a fresh kernel cache (DFLEX_CACHE_DIR), the
next process finds them there (the warm-cache first call). Prints JSON rows
and a table.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time


def child(lib, bundles, op):
    import torch
    import torch.nn.functional as F

    def attention_inputs(anchor_count):
        block, context = 16, 8192
        torch.manual_seed(anchor_count)
        tq, tkv = anchor_count * block, context + anchor_count * block
        q = torch.randn(1, tq, 32, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        k = torch.randn(1, tkv, 8, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        v = torch.randn(1, tkv, 8, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        anchors = torch.sort(torch.randperm(context - 1)[:anchor_count] + 1).values.to(torch.int32)
        captures = [anchors[None], torch.zeros(1, anchor_count, dtype=torch.int32),
                    torch.tensor(context, dtype=torch.int64)]
        return (q, k, v, captures), torch.randn(1, tq, 32, 128, device="cuda", dtype=torch.bfloat16)

    def attention_open():
        return torch.ops.dflex.attention_specs(str(pathlib.Path(bundles) / "dflash"))

    def attention_forward(inputs):
        q, k, v, captures = inputs
        o, _ = torch.ops.dflex.attention(str(pathlib.Path(bundles) / "dflash"), "drafter_attention",
                                         q, k, v, captures)
        return o

    def gated_delta_inputs(length):
        torch.manual_seed(length)
        shape = (1, length, 16, 128)
        q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                   for _ in range(3))
        g = F.logsigmoid(torch.randn(1, length, 16, device="cuda")).requires_grad_()
        beta = torch.rand(1, length, 16, device="cuda").to(torch.bfloat16).requires_grad_()
        return (q, k, v, g, beta), torch.randn(*shape, device="cuda", dtype=torch.bfloat16)

    def gated_delta_open():
        return torch.ops.dflex.gated_delta_specs(str(pathlib.Path(bundles) / "gated_delta_specs"))

    def gated_delta_forward(inputs):
        q, k, v, g, beta = inputs
        out, _ = torch.ops.dflex.gated_delta(str(pathlib.Path(bundles) / "gated_delta_specs"),
                                             "gdn_h16_d128", q, k, v, g=g, beta=beta)
        return out

    make, open_bundle, forward, shapes = (
        (attention_inputs, attention_open, attention_forward, (512, 500)) if op == "attention"
        else (gated_delta_inputs, gated_delta_open, gated_delta_forward, (12345, 3001)))

    def timed(label, fn):
        start = time.perf_counter()
        result = fn()
        torch.cuda.synchronize()
        timings[label] = time.perf_counter() - start
        return result
    # Inputs first, and one autograd step of plain torch in the same form
    # (backward with a given gradient: its first call imports sympy, seconds
    # on a fresh machine): the lazy initialisation every PyTorch program pays
    # is not dflex's.
    first, second = make(shapes[0]), make(shapes[1])
    warm = torch.randn(8, device="cuda", requires_grad=True)
    (warm * 2).backward(torch.ones_like(warm))
    torch.cuda.synchronize()

    timings = {}
    timed("load_library_s", lambda: torch.ops.load_library(lib))
    timed("open_bundle_s", open_bundle)
    out = timed("first_forward_s", lambda: forward(first[0]))
    timed("first_backward_s", lambda: out.backward(first[1]))
    assert torch.isfinite(first[0][0].grad).all()
    timings["first_s"] = timings["first_forward_s"] + timings["first_backward_s"]
    timed("new_shape_s", lambda: forward(second[0]).backward(second[1]))
    print(json.dumps(timings))


def measure(lib, bundles, op, label, env=None):
    result = subprocess.run([sys.executable, __file__, "--child", lib, str(bundles), op],
                            capture_output=True, text=True, env={**os.environ, **(env or {})})
    if result.returncode != 0:
        sys.exit(f"first_call: the {label} process failed:\n{result.stdout}{result.stderr}")
    row = dict(case=label, op=op, **{k: round(v, 3) for k, v in json.loads(result.stdout.splitlines()[-1]).items()})
    print(json.dumps(row), flush=True)
    return row


def without_binaries(bundles, scratch):
    """A copy of the bundles whose manifests list no binaries (source only)."""
    copy = pathlib.Path(scratch) / "bundles"
    for name in ("dflash",):
        shutil.copytree(pathlib.Path(bundles) / name, copy / name)
        manifest_path = copy / name / "manifest.json"
        manifest = json.loads(manifest_path.read_text())
        for module in manifest["modules"]:
            module["binaries"] = {}
        manifest_path.write_text(json.dumps(manifest))
    return copy


def main():
    if sys.argv[1] == "--child":
        child(*sys.argv[2:5])
        return
    lib, bundles = sys.argv[1], sys.argv[2]
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        env = {"DFLEX_CACHE_DIR": str(pathlib.Path(scratch) / "cache")}
        source_only = without_binaries(bundles, scratch)
        for op in ("attention", "gated_delta"):
            rows.append(measure(lib, bundles, op, "bundle binaries", env))
        # The gated-delta op loads bundle binaries only; attention compiles
        # what a bundle lacks.
        rows.append(measure(lib, source_only, "attention", "source only, cold cache (NVRTC)", env))
        rows.append(measure(lib, source_only, "attention", "source only, warm cache", env))
    print("\n| op | binaries | load_library s | open bundle s | first fwd s | first bwd s | first fwd+bwd s "
          "| next shape fwd+bwd s |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['op']} | {r['case']} | {r['load_library_s']} | {r['open_bundle_s']} | {r['first_forward_s']} "
              f"| {r['first_backward_s']} | {r['first_s']} | {r['new_shape_s']} |")


if __name__ == "__main__":
    main()
