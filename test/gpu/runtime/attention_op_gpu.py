"""The dflex attention op on a CUDA device against its CPU float64 reference
path, for every example spec, plus the properties only a GPU run shows:

  attention_op_gpu.py --library libdflex_torch_ops.so --bundles DIR [--no-timing]
                      [--kernels portable,sm90]

DIR holds one bundle per example, named after the example file
(scripts/prepare_gpu.sh). Everything below runs once per kernel family
(DFLEX_ATTENTION_KERNELS=portable, then sm90; default: both on an sm_90
device, portable elsewhere), on the same inputs and against the same CPU
results. With sm90 every spec runs the Hopper forward, head dim 256 with the
portable backward (a head dim without a Hopper forward would have to be
refused with that reason). Every row names the binary and the kernels that ran
(torch.ops.dflex.attention_kernels). For each case: bf16 q, k, v, dO on the
device;
o, lse, dq, dk, dv against the CPU op on the same values in float64
(max |x - ref| / max |ref| <= 1e-2, as the kernel harness); fully masked
queries must give o = 0 and dq = 0 exactly and lse = -inf; nothing may be
NaN. Then: captures on the device equal captures on the host, [B, H, T, D]
views equal contiguous inputs, a side stream gives the same result, repeated
runs repeat o, lse, dk, dv bit for bit, the backward op equals autograd, and
a copy of the causal bundle without the device's binaries (so the op must
compile its source through NVRTC) matches the original. Last, the time of
the DFlash training shape per family, side by side. Exit status 0 only when
every check passes.
"""
import argparse
import json
import os
import pathlib
import shutil
import sys
import tempfile
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "runtime" / "attention"))
from attention_cases import CASES, dense_mask  # noqa: E402

TOLERANCE = 1e-2
failures = []


def spec_attributes(bundle, spec_name):
    for module in json.loads((bundle / "manifest.json").read_text())["modules"]:
        if module["name"] == spec_name:
            return module["spec"]
    raise KeyError(f"{bundle}: no module {spec_name}")


def relative_error(got, want):
    got, want = got.double().cpu(), want.double().cpu()
    finite = torch.isfinite(want)
    if not torch.equal(torch.isfinite(got), finite) or not torch.equal(got[~finite], want[~finite]):
        return float("inf")
    if not finite.any():
        return 0.0
    return ((got - want)[finite].abs().max() / want[finite].abs().max().clamp_min(1e-30)).item()


def run_op(bundle, spec, q, k, v, grad_out, captures):
    """o, lse and the gradients of q, k, v through autograd."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    out, lse = torch.ops.dflex.attention(str(bundle), spec, q, k, v, captures)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    return (out.detach(), lse) + tuple(grads)


def inputs(problem, spec, generator):
    def tensor(length, heads):
        return torch.randn(problem.batch, length, heads, spec["qk_head_dim"], generator=generator,
                           dtype=torch.float32).to(torch.bfloat16)
    q = tensor(problem.q_len, spec["num_q_heads"])
    k = tensor(problem.kv_len, spec["num_kv_heads"])
    v = tensor(problem.kv_len, spec["num_kv_heads"])
    grad_out = tensor(problem.q_len, spec["num_q_heads"])
    return q, k, v, grad_out


def device_capability():
    major, minor = torch.cuda.get_device_capability()
    return major * 10 + minor


def kernels_of(bundle, spec_name):
    """'sm_90a bundle: forward sm90, backward sm90': what the op runs here, or None
    when DFLEX_ATTENTION_KERNELS asks for kernels the spec does not have here (the
    reason is returned as the second value)."""
    try:
        arch, source, forward, backward = torch.ops.dflex.attention_kernels(
            str(bundle), spec_name, device_capability())
    except RuntimeError as error:
        return None, str(error)
    return f"{arch} {source}: fwd {forward}, bwd {backward}", None


def check_case(case, bundle, generator, families):
    """One example against the CPU float64 op, computed once, for each kernel family."""
    spec = spec_attributes(bundle, case.spec)
    problem = case.make(generator, "large")
    q, k, v, grad_out = inputs(problem, spec, generator)
    device = [t.cuda() for t in (q, k, v, grad_out)]
    want = run_op(bundle, case.spec, *(t.double() for t in (q, k, v, grad_out)), problem.captures)
    blind = ~dense_mask(problem, spec["num_q_heads"]).any(-1)  # [B, Hq, Tq]
    blind_rows = blind.permute(0, 2, 1)
    for family in families:
        os.environ["DFLEX_ATTENTION_KERNELS"] = family
        kernels, refusal = kernels_of(bundle, case.spec)
        if kernels is None:
            # Only head dims without Hopper kernels may be refused, and only by the sm90 choice.
            expected = family == "sm90" and f"head_dim {spec['qk_head_dim']} has none" in refusal
            print(f"{case.name:<24} [{family}] refused: {refusal} {'ok' if expected else 'FAIL'}",
                  flush=True)
            if not expected:
                failures.append(f"{case.name} [{family}]: refused: {refusal}")
            continue
        problems = []
        if family == "sm90" and "fwd sm90" not in kernels:
            problems.append(f"runs {kernels}")
        start = time.perf_counter()
        got = run_op(bundle, case.spec, *device, problem.captures)
        torch.cuda.synchronize()
        gpu_seconds = time.perf_counter() - start

        names = ("o", "lse", "dq", "dk", "dv")
        errors = {name: relative_error(g, w) for name, g, w in zip(names, got, want)}
        problems += [f"{name} error {error:.1e}" for name, error in errors.items() if not error <= TOLERANCE]
        out, lse, dq = got[0].cpu(), got[1].cpu(), got[2].cpu()
        if not torch.all(torch.isneginf(lse[blind])) or torch.isneginf(lse[~blind]).any():
            problems.append("lse is -inf exactly where the query sees no key: not so")
        if torch.any(out[blind_rows] != 0) or torch.any(dq[blind_rows] != 0):
            problems.append("o or dq of a fully masked query is not 0")
        if any(torch.isnan(t).any() for t in got):
            problems.append("NaN in the outputs")
        if problems:
            failures.append(f"{case.name} [{family}]: {'; '.join(problems)}")
        cells = " ".join(f"{name} {error:.1e}" for name, error in errors.items())
        print(f"{case.name:<24} [{kernels}] B{problem.batch} Tq {problem.q_len:<5} Tkv {problem.kv_len:<5} "
              f"blind {int(blind.sum()):<6} {cells}  first call {gpu_seconds * 1e3:7.1f} ms  "
              f"{'FAIL' if problems else 'ok'}", flush=True)


def same(label, a, b):
    label = f"[{os.environ['DFLEX_ATTENTION_KERNELS']}] {label}"
    ok = all(torch.equal(x, y) for x, y in zip(a, b))
    print(f"{label:<70} {'ok' if ok else 'FAIL'}", flush=True)
    if not ok:
        failures.append(label)


def check_properties(bundles, generator):
    case = next(c for c in CASES if c.name == "dflash")
    bundle = bundles / case.name
    spec = spec_attributes(bundle, case.spec)
    problem = case.make(generator, "large")
    q, k, v, grad_out = (t.cuda() for t in inputs(problem, spec, generator))
    host = problem.captures
    reference = run_op(bundle, case.spec, q, k, v, grad_out, host)
    deterministic = (0, 1, 3, 4)  # dq sums fp32 atomics in any order

    again = run_op(bundle, case.spec, q, k, v, grad_out, host)
    same("repeated run: o, lse, dk, dv bitwise equal",
         [reference[i] for i in deterministic], [again[i] for i in deterministic])
    on_device = run_op(bundle, case.spec, q, k, v, grad_out, [t.cuda() for t in host])
    same("captures on the device == captures on the host",
         [reference[i] for i in deterministic], [on_device[i] for i in deterministic])
    strided = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v, grad_out)]
    viewed = run_op(bundle, case.spec, *strided, host)
    same("[B, H, T, D] storage viewed as [B, T, H, D] == contiguous",
         [reference[i] for i in deterministic], [viewed[i] for i in deterministic])
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        on_stream = run_op(bundle, case.spec, q, k, v, grad_out, host)
    torch.cuda.current_stream().wait_stream(stream)
    same("on a side stream == on the default stream",
         [reference[i] for i in deterministic], [on_stream[i] for i in deterministic])
    backward = torch.ops.dflex.attention_backward(str(bundle), case.spec, q, k, v, reference[0],
                                                  reference[1], grad_out, host)
    same("attention_backward op: dk, dv == autograd's",
         [reference[3], reference[4]], [backward[1], backward[2]])

    check_jit(bundles / "causal", generator, deterministic)


def without_device_binaries(bundle, scratch):
    """A copy of `bundle` whose manifest lists no binary for this device."""
    major, minor = torch.cuda.get_device_capability()
    arch = f"sm_{major}{minor}"
    copy = pathlib.Path(scratch) / bundle.name
    shutil.copytree(bundle, copy)
    manifest = json.loads((copy / "manifest.json").read_text())
    removed = []
    for module in manifest["modules"]:
        for name in (arch, arch + "a"):
            if module["binaries"].pop(name, None) is not None:
                removed.append(name)
    (copy / "manifest.json").write_text(json.dumps(manifest))
    return copy, arch, removed


def check_jit(bundle, generator, deterministic):
    case = next(c for c in CASES if c.name == "causal")
    spec = spec_attributes(bundle, case.spec)
    problem = case.make(generator, "large")
    tensors = [t.cuda() for t in inputs(problem, spec, generator)]
    with tempfile.TemporaryDirectory() as scratch:
        jit, arch, removed = without_device_binaries(bundle, scratch)
        saved_cache = os.environ.get("DFLEX_CACHE_DIR")
        os.environ["DFLEX_CACHE_DIR"] = str(pathlib.Path(scratch) / "cache")  # a real compile
        start = time.perf_counter()
        jitted = run_op(jit, case.spec, *tensors, problem.captures)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        if saved_cache is None:
            del os.environ["DFLEX_CACHE_DIR"]
        else:
            os.environ["DFLEX_CACHE_DIR"] = saved_cache
        expected = run_op(bundle, case.spec, *tensors, problem.captures)
        kernels, _ = kernels_of(jit, case.spec)
    print(f"JIT: removed {removed or 'nothing'} from a copy of {bundle.name} ({arch} device); the first "
          f"call took {seconds:.2f} s [{kernels}]", flush=True)
    same("JIT-compiled kernels == the bundle's (o, lse, dk, dv)",
         [expected[i] for i in deterministic], [jitted[i] for i in deterministic])


def time_dflash(bundles, generator, families):
    """The DFlash training shape: 512 blocks of 16 queries, 8192 context keys, each
    family on the same inputs."""
    case = next(c for c in CASES if c.name == "dflash")
    bundle = bundles / case.name
    spec = spec_attributes(bundle, case.spec)
    blocks, context = 512, 8192
    anchors = torch.randperm(context - 1, generator=generator)[:blocks].sort().values.int().view(1, -1) + 1
    captures = [anchors, torch.zeros_like(anchors), torch.tensor(context)]  # one document per row
    q_len, kv_len = blocks * 16, context + blocks * 16

    def tensor(length, heads):
        return torch.randn(1, length, heads, spec["qk_head_dim"], device="cuda", dtype=torch.bfloat16)
    q = tensor(q_len, spec["num_q_heads"]).requires_grad_()
    k = tensor(kv_len, spec["num_kv_heads"]).requires_grad_()
    v = tensor(kv_len, spec["num_kv_heads"]).requires_grad_()
    grad_out = torch.randn(1, q_len, spec["num_q_heads"], spec["v_head_dim"], device="cuda",
                           dtype=torch.bfloat16)

    def forward():
        with torch.no_grad():
            torch.ops.dflex.attention(str(bundle), case.spec, q, k, v, captures)

    def forward_backward():
        out, _ = torch.ops.dflex.attention(str(bundle), case.spec, q, k, v, captures)
        torch.autograd.grad(out, (q, k, v), grad_out)

    medians = {}
    for family in families:
        os.environ["DFLEX_ATTENTION_KERNELS"] = family
        kernels, _ = kernels_of(bundle, case.spec)
        for label, step in (("forward", forward), ("forward + backward", forward_backward)):
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            samples = []
            for _ in range(10):
                start = time.perf_counter()
                step()
                torch.cuda.synchronize()
                samples.append(time.perf_counter() - start)
            samples.sort()
            medians[family, label] = samples[len(samples) // 2] * 1e3
            print(f"DFlash shape B1 Hq {spec['num_q_heads']} Tq {q_len} Tkv {kv_len} D {spec['qk_head_dim']} "
                  f"[{kernels}]: {label} median {medians[family, label]:.2f} ms (op call to synchronize, "
                  f"host tile lists included)", flush=True)
    if "portable" in families and "sm90" in families:
        for label in ("forward", "forward + backward"):
            print(f"DFlash shape {label}: sm90 {medians['sm90', label]:.2f} ms vs portable "
                  f"{medians['portable', label]:.2f} ms = "
                  f"{medians['portable', label] / medians['sm90', label]:.2f}x", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--library", required=True)
    parser.add_argument("--bundles", required=True, type=pathlib.Path)
    parser.add_argument("--no-timing", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--kernels", help="comma-separated DFLEX_ATTENTION_KERNELS values to run "
                        "(default: portable,sm90 on an sm_90 device, else portable)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("attention_op_gpu: no CUDA device")
    torch.ops.load_library(args.library)
    families = (args.kernels.split(",") if args.kernels
                else ["portable", "sm90"] if device_capability() == 90 else ["portable"])
    print(f"device: {torch.cuda.get_device_name()} (sm_{device_capability()}), torch {torch.__version__}; "
          f"kernels {', '.join(families)}", flush=True)
    generator = torch.Generator().manual_seed(args.seed)
    for case in CASES:
        check_case(case, args.bundles / case.name, generator, families)
    for family in families:
        os.environ["DFLEX_ATTENTION_KERNELS"] = family
        check_properties(args.bundles, torch.Generator().manual_seed(args.seed))
    if not args.no_timing:
        time_dflash(args.bundles, torch.Generator().manual_seed(args.seed), families)
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("attention_op_gpu: all checks pass")


if __name__ == "__main__":
    main()
