"""The dflex attention op on the CPU (its float64 reference path) against a
dense float64 PyTorch implementation, for every example spec:

  attention_op_check.py --library libdflex_torch_ops.so --bundles DIR

DIR holds one bundle per example (make_bundles.py). Checks the mask the op
evaluates against the case's restatement of it, o and lse, the gradients of
q, k and v against autograd of the dense version, fully masked queries
(o = 0, lse = -inf, zero gradients, no NaN), that bundle and capture
errors name what is wrong, and which kernels the CUDA path would run on
sm_90 and sm_120 devices under each DFLEX_ATTENTION_KERNELS value.
"""
import argparse
import json
import os
import pathlib
import shutil
import sys
import tempfile

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from attention_cases import CASES, dense_attention, dense_mask  # noqa: E402


def spec_attributes(bundle, spec_name):
    manifest = json.loads((bundle / "manifest.json").read_text())
    for module in manifest["modules"]:
        if module["name"] == spec_name:
            return module["spec"]
    raise KeyError(f"{bundle}: no module {spec_name}")


def relative_error(got, want):
    finite = torch.isfinite(want)
    if not torch.equal(torch.isfinite(got), finite) or not torch.equal(got[~finite], want[~finite]):
        return float("inf")
    scale = want[finite].abs().max().clamp_min(1e-30) if finite.any() else torch.tensor(1.0)
    return ((got - want)[finite].abs().max() / scale).item() if finite.any() else 0.0


def check_case(case, bundle, generator):
    spec = spec_attributes(bundle, case.spec)
    heads, kv_heads = spec["num_q_heads"], spec["num_kv_heads"]
    head_dim = spec["qk_head_dim"]
    scale = torch.tensor(spec["scale"], dtype=torch.float32).item()
    problem = case.make(generator, "small")
    names = torch.ops.dflex.attention_captures(str(bundle), case.spec)
    assert len(names) == len(problem.captures), (names, len(problem.captures))

    mask = dense_mask(problem, heads)
    op_mask = torch.ops.dflex.attention_mask(str(bundle), case.spec, problem.captures,
                                             problem.batch, problem.q_len, problem.kv_len)
    failures = []
    if not torch.equal(op_mask, mask):
        failures.append(f"mask differs at {int((op_mask != mask).sum())} pairs")

    def tensor(length, h):
        return torch.randn(problem.batch, length, h, head_dim, dtype=torch.float64,
                           generator=generator).requires_grad_()
    q, k, v = tensor(problem.q_len, heads), tensor(problem.kv_len, kv_heads), tensor(problem.kv_len, kv_heads)
    out, lse = torch.ops.dflex.attention(str(bundle), case.spec, q, k, v, problem.captures)
    want_out, want_lse = dense_attention(q, k, v, mask, scale, problem.score_mod)
    grad_out = torch.randn(out.shape, dtype=torch.float64, generator=generator)
    grads = torch.autograd.grad(out, (q, k, v), grad_out)
    want_grads = torch.autograd.grad(want_out, (q, k, v), grad_out)

    # Score mods run in f32 (as on the GPU); the dense restatement in float64.
    tolerance = 2e-5 if problem.score_mod else 1e-11
    errors = {"o": relative_error(out.detach(), want_out.detach()), "lse": relative_error(lse, want_lse)}
    for name, got, want in zip(("dq", "dk", "dv"), grads, want_grads):
        errors[name] = relative_error(got, want)
    failures += [f"{name} error {error:.1e}" for name, error in errors.items() if not error <= tolerance]

    blind = ~mask.any(-1)  # [B, H, Tq]: queries that see no key
    blind_rows = blind.permute(0, 2, 1)  # [B, Tq, H]
    if not torch.all(torch.isneginf(lse[blind])):
        failures.append("lse of a fully masked query is not -inf")
    if torch.any(out.detach()[blind_rows] != 0) or torch.any(grads[0][blind_rows] != 0):
        failures.append("o or dq of a fully masked query is not 0")
    if not all(torch.isfinite(g).all() for g in grads):
        failures.append("non-finite gradient")
    if problem.notes and "fully masked" in problem.notes and not blind.any():
        failures.append("the case was meant to have fully masked queries")

    # The backward op, called directly, gives what autograd gave.
    direct = torch.ops.dflex.attention_backward(str(bundle), case.spec, q.detach(), k.detach(),
                                                v.detach(), out.detach(), lse, grad_out,
                                                problem.captures)
    if not all(torch.equal(a, b) for a, b in zip(direct, grads)):
        failures.append("attention_backward differs from autograd")

    cells = " ".join(f"{name} {error:.1e}" for name, error in errors.items())
    print(f"{case.name:<24} B{problem.batch} Tq {problem.q_len:<4} Tkv {problem.kv_len:<4} "
          f"blind {int(blind.sum()):<5} {cells}  {'FAIL: ' + '; '.join(failures) if failures else 'ok'}")
    return not failures


def expect_error(body, *fragments):
    try:
        body()
    except RuntimeError as error:
        message = str(error)
        missing = [f for f in fragments if f not in message]
        if missing:
            raise AssertionError(f"error lacks {missing}: {message}")
        return
    raise AssertionError(f"no error; expected one mentioning {fragments}")


def check_errors(bundles):
    bundle = bundles / "causal"
    q = torch.randn(1, 5, 32, 128, dtype=torch.float64)
    k = torch.randn(1, 5, 8, 128, dtype=torch.float64)
    expect_error(lambda: torch.ops.dflex.attention(str(bundle), "nope", q, k, k, []),
                 "no attention spec 'nope'", "causal_attention", str(bundle))
    expect_error(lambda: torch.ops.dflex.attention(str(bundles / "missing"), "x", q, k, k, []),
                 str(bundles / "missing"))
    expect_error(lambda: torch.ops.dflex.attention(str(bundle), "causal_attention", q, k, k,
                                                   [torch.tensor(1)]),
                 "takes 0 captures", "got 1")
    expect_error(lambda: torch.ops.dflex.attention(str(bundles / "sliding_window"),
                                                   "sliding_window_attention", q, k, k,
                                                   [torch.tensor(2.0)]),
                 "capture 0 'window'", "integer tensor")
    expect_error(lambda: torch.ops.dflex.attention(str(bundle), "causal_attention", q[:, :, :16], k, k, []),
                 "32 query and 8 key/value heads", "got 16 and 8")
    with tempfile.TemporaryDirectory() as scratch:
        copy = pathlib.Path(scratch) / "causal"
        shutil.copytree(bundle, copy)
        source = copy / "causal_attention.cu"
        source.write_text(source.read_text() + "// edited\n")
        expect_error(lambda: torch.ops.dflex.attention(str(copy), "causal_attention", q, k, k, []),
                     str(source), "sha256")
        source.unlink()
        expect_error(lambda: torch.ops.dflex.attention(str(copy), "causal_attention", q, k, k, []),
                     str(source))
    print("errors: ok")


def check_kernel_choice(bundles):
    """attention_kernels: the binary and kernels per device and DFLEX_ATTENTION_KERNELS."""
    saved = os.environ.pop("DFLEX_ATTENTION_KERNELS", None)
    try:
        for case in CASES:
            bundle = str(bundles / case.name)
            head_dim = spec_attributes(bundles / case.name, case.spec)["qk_head_dim"]
            # Every head dim has a Hopper forward; head_dim 256 the portable backward.
            backward = "sm90" if head_dim in (64, 128) else "portable"
            plans = {}
            for choice in ("auto", "portable", "sm90"):
                os.environ["DFLEX_ATTENTION_KERNELS"] = choice
                for capability in (90, 120):
                    try:
                        plans[choice, capability] = torch.ops.dflex.attention_kernels(bundle, case.spec, capability)
                    except RuntimeError as error:
                        plans[choice, capability] = str(error)
            expected = {
                ("auto", 90): ["sm_90a", "bundle", "sm90", backward],
                ("portable", 90): ["sm_90a", "bundle", "portable", "portable"],
                ("auto", 120): ["sm_120", "bundle", "portable", "portable"],
                ("portable", 120): ["sm_120", "bundle", "portable", "portable"],
                ("sm90", 90): ["sm_90a", "bundle", "sm90", backward],
            }
            for key, want in expected.items():
                assert plans[key] == want, f"{case.name} {key}: {plans[key]}, expected {want}"
            refusal = plans["sm90", 120]
            assert isinstance(refusal, str) and "this one is sm_120" in refusal, f"{case.name} sm90 on 120: {refusal}"
        os.environ["DFLEX_ATTENTION_KERNELS"] = "fastest"
        expect_error(lambda: torch.ops.dflex.attention_kernels(str(bundles / "causal"), "causal_attention", 90),
                     "DFLEX_ATTENTION_KERNELS='fastest'", "auto, portable or sm90")
    finally:
        os.environ.pop("DFLEX_ATTENTION_KERNELS", None)
        if saved is not None:
            os.environ["DFLEX_ATTENTION_KERNELS"] = saved
    print("kernel choice: ok")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--library", required=True)
    parser.add_argument("--bundles", required=True, type=pathlib.Path)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.ops.load_library(args.library)
    torch.set_num_threads(2)
    generator = torch.Generator().manual_seed(args.seed)
    passed = all([check_case(case, args.bundles / case.name, generator) for case in CASES])
    check_errors(args.bundles)
    check_kernel_choice(args.bundles)
    if not passed:
        sys.exit("attention_op_check: FAILED")
    print("attention_op_check: all cases pass")


if __name__ == "__main__":
    main()
