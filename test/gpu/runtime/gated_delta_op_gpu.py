"""torch.ops.dflex.gated_delta on a CUDA device against its CPU float64 path,
plus the properties only a GPU run shows, and the op's time on the baseline
shape:

  gated_delta_op_gpu.py --library libdflex_torch_ops.so --bundles DIR [--no-timing]

DIR holds qwen35_gdn/ (examples/qwen35_gdn.mlir, as scripts/prepare_gpu.sh
makes it) and gated_delta_specs/ (test/runtime/gated_delta/gated_delta_specs.mlir).
For each case: bf16 q, k, v, beta, a, b and float32 g, A_log, dt_bias,
initial state on the device; o, the final state and every gradient against
the CPU op on the same values in float64, max |x - ref| / max |ref| <= 1e-2 as
in the kernel harness (dA_log, d dt_bias: max |x - ref| / max over heads of
the sum over tokens of |term|, docs/gated-delta.md, Precision), no NaN. Then:
forward bit for bit under repetition, with cu_seqlens on the host or the
device, on a side stream and without autograd; q, k, v as slices of one fused
row equal to contiguous copies; the backward op and a loss of the final state
alone agree with autograd. Last, fwd and fwd+bwd at B=1 T=16384 H=16 d=128
through the op (CUDA events). Exit status 0 only when every check passes.
"""
import argparse
import pathlib
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "runtime" / "gated_delta"))
from gated_delta_reference import GRADIENTS, call_backward, call_op, random_inputs, spec_attributes  # noqa: E402

TOLERANCE = 1e-2
# Element types the kernels take; the rest of the floating inputs are float32.
BF16_INPUTS = ("q", "k", "v", "beta", "a", "b")
failures = []

# (bundle, spec, shape, fused q/k/v rows) as in the kernel harness: both head
# dims, Dk != Dv, grouped heads, varlen lengths 1..1000 (never all multiples
# of 64), gate none, no delta rule, no L2 norm, the in-kernel gate, states.
CASES = [
    ("qwen35_gdn", "qwen35_gated_deltanet", {"lengths": (300, 1, 65, 128, 17)}, True),
    ("gated_delta_specs", "gdn_grouped_varlen", {"lengths": (1, 17, 64, 65, 200, 1000)}, False),
    ("gated_delta_specs", "gdn_plain", {"batch": 2, "length": 200}, False),
    ("gated_delta_specs", "gdn_no_delta", {"batch": 3, "length": 150}, False),
    ("gated_delta_specs", "gdn_in_kernel_gate", {"batch": 1, "length": 333}, True),
    ("gated_delta_specs", "gdn_h16_d128", {"batch": 2, "length": 300}, False),
]


def expect(condition, label):
    if not condition:
        failures.append(label)
    print(f"{label:<84} {'ok' if condition else 'FAIL'}", flush=True)


def device_inputs(spec, inputs, fused):
    """The inputs in the kernels' element types on the device; with `fused`,
    q, k and v are column slices of one [B, T, 2 Hk Dk + Hv Dv] tensor, as a
    fused projection gives them."""
    out = {}
    for name, t in inputs.items():
        if name == "cu_seqlens":
            out[name] = t.cuda()
        else:
            out[name] = t.to(torch.bfloat16 if name in BF16_INPUTS else torch.float32).cuda()
    if fused:
        q, k, v = out["q"], out["k"], out["v"]
        batch, length = q.shape[:2]
        row = torch.cat([q.flatten(2), k.flatten(2), v.flatten(2)], 2)
        widths = (q[0, 0].numel(), k[0, 0].numel(), v[0, 0].numel())
        starts = (0, widths[0], widths[0] + widths[1])
        for name, t, start, width in zip("qkv", (q, k, v), starts, widths):
            out[name] = row.narrow(2, start, width).view(batch, length, t.shape[2], t.shape[3])
    return out


def run(bundle, name, inputs, grad_out, grad_final):
    """o, final state and the gradients of every floating input, by autograd."""
    leaves = {key: t.detach().requires_grad_() if t.is_floating_point() else t for key, t in inputs.items()}
    out, final_state = call_op(bundle, name, leaves)
    loss = (out.double() * grad_out.double()).sum()
    if final_state is not None:
        loss = loss + (final_state.double() * grad_final.double()).sum()
    keys = [key for key in GRADIENTS if key in leaves]
    grads = torch.autograd.grad(loss, [leaves[key] for key in keys])
    return out.detach(), final_state, dict(zip(keys, grads))


def relative_error(got, want):
    got, want = got.double().cpu(), want.double().cpu()
    if not torch.isfinite(got).all():
        return float("inf")
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-30)).item()


def gate_parameter_error(got, want, term_sizes):
    """For per-head sums over tokens whose terms cancel: error relative to the
    largest sum of term sizes."""
    got, want = got.double().cpu(), want.double().cpu()
    if not torch.isfinite(got).all():
        return float("inf")
    return ((got - want).abs().max() / term_sizes.max().clamp_min(1e-30)).item()


def check_case(bundles, bundle_name, name, shape, fused, generator):
    bundle = bundles / bundle_name
    spec = spec_attributes(bundle, name)
    inputs = random_inputs(spec, generator, **shape)
    cuda = device_inputs(spec, inputs, fused)
    # The oracle runs on the values the device sees.
    host = {key: t.cpu().double() if t.is_floating_point() else t.cpu() for key, t in cuda.items()}
    hv, dv = spec["num_value_heads"], spec["value_dim"]
    batch, length = host["q"].shape[:2]
    grad_out = torch.randn(batch, length, hv, dv, generator=generator).to(torch.bfloat16)
    sequences = host["cu_seqlens"].numel() - 1 if spec["varlen"] else batch
    grad_final = torch.randn(sequences, hv, spec["key_dim"], dv, generator=generator) * 0.5

    out, final_state, grads = run(bundle, name, cuda, grad_out.cuda(), grad_final.cuda())
    torch.cuda.synchronize()
    want_out, want_final, want = run(bundle, name, host, grad_out.double(), grad_final.double())

    errors = {"o": relative_error(out, want_out)}
    if spec["final_state"]:
        errors["ht"] = relative_error(final_state, want_final)
    for key in want:
        if key in ("A_log", "dt_bias"):
            # Terms per token: da_t (d dt_bias), dg_t g_t = da_t softplus(x) / sigmoid(x) (dA_log).
            x = host["a"] + host["dt_bias"]
            da = want["a"].abs()
            terms = da * F.softplus(x) / torch.sigmoid(x) if key == "A_log" else da
            errors[f"d{key}"] = gate_parameter_error(grads[key], want[key], terms.reshape(-1, hv).sum(0))
        else:
            errors[f"d{key}"] = relative_error(grads[key], want[key])
    ok = all(error <= TOLERANCE for error in errors.values())
    cells = " ".join(f"{key}={error:.1e}" for key, error in errors.items())
    label = f"{name} {shape}{' fused qkv' if fused else ''}"
    print(f"  {label}: {cells}", flush=True)
    expect(ok, f"{label}: every tensor within {TOLERANCE:g} of the CPU float64 op")


def same_forward(label, reference, bundle, name, inputs):
    out, final_state = call_op(bundle, name, inputs)
    ok = torch.equal(out, reference[0]) and (final_state is None or torch.equal(final_state, reference[1]))
    expect(ok, label)


def check_properties(bundles, generator):
    # The Qwen3.5 spec: varlen, grouped heads, in-kernel gate, states.
    bundle = bundles / "qwen35_gdn"
    name = "qwen35_gated_deltanet"
    spec = spec_attributes(bundle, name)
    cuda = device_inputs(spec, random_inputs(spec, generator, lengths=(100, 1, 300, 64)), fused=True)
    with torch.no_grad():
        reference = call_op(bundle, name, cuda)
    same_forward("forward repeats bit for bit", reference, bundle, name, cuda)
    same_forward("cu_seqlens on the host == on the device", reference, bundle, name,
                 dict(cuda, cu_seqlens=cuda["cu_seqlens"].cpu()))
    same_forward("q, k, v fused-row slices == contiguous copies", reference, bundle, name,
                 dict(cuda, q=cuda["q"].contiguous(), k=cuda["k"].contiguous(), v=cuda["v"].contiguous()))
    leaves = {key: t.detach().requires_grad_() if t.is_floating_point() else t for key, t in cuda.items()}
    out, final_state = call_op(bundle, name, leaves)
    expect(torch.equal(out, reference[0]) and torch.equal(final_state, reference[1]),
           "forward with autograd (workspace kept) == without")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.no_grad():
        on_stream = call_op(bundle, name, cuda)
    torch.cuda.current_stream().wait_stream(stream)
    expect(torch.equal(on_stream[0], reference[0]) and torch.equal(on_stream[1], reference[1]),
           "on a side stream == on the default stream")

    # Gradients: the backward op (which reruns the forward) against autograd,
    # and a loss of the final state alone (o's gradient undefined).
    grad_out = torch.randn(out.shape, device="cuda", dtype=torch.bfloat16)
    grad_final = torch.randn(final_state.shape, device="cuda")
    keys = [key for key in GRADIENTS if key in leaves]
    autograd = dict(zip(keys, torch.autograd.grad(
        [out, final_state], [leaves[key] for key in keys], [grad_out, grad_final])))
    # Compared in the inputs' dtypes (autograd rounds the float32 gate
    # gradients to bf16); fp32 atomics may sum in another order.
    direct = call_backward(bundle, name, cuda, grad_out, grad_final)
    worst = max(relative_error(direct[key].to(autograd[key].dtype), autograd[key]) for key in keys)
    expect(sorted(direct) == sorted(keys) and worst <= TOLERANCE,
           f"gated_delta_backward == autograd (worst {worst:.1e})")
    out, final_state = call_op(bundle, name, leaves)
    only_final = torch.autograd.grad(final_state, leaves["v"], grad_final)[0]
    direct = call_backward(bundle, name, cuda, torch.zeros_like(grad_out), grad_final)
    error = relative_error(only_final, direct["v"])
    expect(error <= TOLERANCE, f"loss of the final state alone: dv == backward op's ({error:.1e})")


def time_baseline(bundles):
    """B=1 T=16384 H=16 d=128, scalar gate, delta rule, q/k L2 norm, no
    states: the kernel harness's first timing shape, through the op."""
    bundle = bundles / "gated_delta_specs"
    name = "gdn_h16_d128"
    batch, length, heads, dim = 1, 16384, 16, 128

    def tensor(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, device="cuda").to(dtype)
    q, k, v = (tensor(batch, length, heads, dim).requires_grad_() for _ in range(3))
    g = F.logsigmoid(torch.rand(batch, length, heads, device="cuda") * 4 - 2).requires_grad_()
    beta = (0.5 + 0.23 * torch.rand(batch, length, heads, device="cuda")).to(torch.bfloat16).requires_grad_()
    grad_out = tensor(batch, length, heads, dim)

    def forward():
        with torch.no_grad():
            torch.ops.dflex.gated_delta(str(bundle), name, q, k, v, g=g, beta=beta)

    def forward_backward():
        out, _ = torch.ops.dflex.gated_delta(str(bundle), name, q, k, v, g=g, beta=beta)
        torch.autograd.grad(out, (q, k, v, g, beta), grad_out)

    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    results = {}
    for label, step in (("fwd", forward), ("fwd+bwd", forward_backward)):
        for _ in range(3):
            step()
        samples = []
        for _ in range(20):
            begin.record()
            step()
            end.record()
            end.synchronize()
            samples.append(begin.elapsed_time(end))
        samples.sort()
        results[label] = samples[len(samples) // 2]
    print(f"timing B{batch} T{length} H{heads} d{dim} through the op (CUDA events, median of 20): "
          f"fwd {results['fwd']:.3f} ms, fwd+bwd {results['fwd+bwd']:.3f} ms "
          f"(the kernels alone: test/gpu/gated_delta --time)", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--library", required=True)
    parser.add_argument("--bundles", required=True, type=pathlib.Path)
    parser.add_argument("--no-timing", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gated_delta_op_gpu: no CUDA device")
    torch.ops.load_library(args.library)
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    generator = torch.Generator().manual_seed(args.seed)
    for bundle_name, name, shape, fused in CASES:
        check_case(args.bundles, bundle_name, name, shape, fused, generator)
    check_properties(args.bundles, generator)
    if not args.no_timing:
        time_baseline(args.bundles)
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("gated_delta_op_gpu: all checks pass")


if __name__ == "__main__":
    main()
