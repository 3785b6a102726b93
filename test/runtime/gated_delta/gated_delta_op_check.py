"""torch.ops.dflex.gated_delta on the CPU, from Python, on compiled bundles:

  gated_delta_op_check.py --library libdflex_torch_ops.so --bundles DIR

DIR holds qwen35_gdn/ (examples/qwen35_gdn.mlir) and gated_delta_specs/
(gated_delta_specs.mlir here). For every spec: o, the final state and every
gradient (through autograd and through the backward op) against the float64
token recurrence of gated_delta_reference.py, with varlen lengths 1..70 not
all multiples of 64; torch.autograd.gradcheck on tiny inputs; bf16 inputs;
and the errors bad inputs give. Exit status 0 only when every check passes.
"""
import argparse
import pathlib
import sys

import torch

from gated_delta_reference import GRADIENTS, call_backward, call_op, random_inputs, recurrence, spec_attributes

failures = []


def expect(condition, label):
    if not condition:
        failures.append(label)
    print(f"{label:<78} {'ok' if condition else 'FAIL'}", flush=True)


def relative_error(got, want):
    got, want = got.double(), want.double()
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-300)).item()


# (bundle, spec, shape): varlen specs take lengths, the others (batch, length).
CASES = [
    ("qwen35_gdn", "qwen35_gated_deltanet", {"lengths": (1, 20, 9)}),
    ("gated_delta_specs", "gdn_grouped_varlen", {"lengths": (1, 2, 17, 63, 64, 65, 70)}),
    ("gated_delta_specs", "gdn_plain", {"batch": 2, "length": 70}),
    ("gated_delta_specs", "gdn_no_delta", {"batch": 3, "length": 33}),
    ("gated_delta_specs", "gdn_in_kernel_gate", {"batch": 1, "length": 130}),
    ("gated_delta_specs", "gdn_h16_d128", {"batch": 1, "length": 70}),
]


def check_against_recurrence(bundles, generator):
    for bundle_name, name, shape in CASES:
        bundle = bundles / bundle_name
        spec = spec_attributes(bundle, name)
        inputs = random_inputs(spec, generator, **shape)
        leaves = {key: t.clone().requires_grad_() if t.is_floating_point() else t for key, t in inputs.items()}
        out, final_state = call_op(bundle, name, leaves)
        want_out, want_final = recurrence(spec, leaves)
        grad_out = torch.randn(out.shape, generator=generator, dtype=torch.float64)
        grad_final = torch.randn(want_final.shape, generator=generator, dtype=torch.float64)
        differentiable = [key for key in GRADIENTS if key in leaves]

        def gradients(o, h):
            loss = (o * grad_out).sum() + ((h * grad_final).sum() if spec["final_state"] else 0)
            return dict(zip(differentiable, torch.autograd.grad(loss, [leaves[k] for k in differentiable])))

        got = gradients(out, final_state)
        want = gradients(want_out, want_final)
        direct = call_backward(bundle, name, inputs, grad_out, grad_final if spec["final_state"] else None)
        errors = {"o": relative_error(out, want_out)}
        if spec["final_state"]:
            errors["final_state"] = relative_error(final_state, want_final)
        errors.update({f"d{key}": relative_error(got[key], want[key]) for key in differentiable})
        worst = max(errors.values())
        cells = " ".join(f"{key} {error:.0e}" for key, error in errors.items())
        print(f"  {name}: {cells}")
        expect(worst < 1e-10, f"{name} {shape}: o, final state, gradients == float64 recurrence")
        expect((final_state is None) == (not spec["final_state"]), f"{name}: final_state exactly with the spec's")
        expect(sorted(direct) == sorted(differentiable) and
               all(torch.allclose(direct[key], got[key], rtol=1e-12, atol=1e-12) for key in differentiable),
               f"{name}: gated_delta_backward == autograd")


def check_gradcheck(bundles, generator):
    bundle = bundles / "gated_delta_specs"
    for name, shape in (("gdn_grouped_varlen", {"lengths": (3, 1, 2)}),
                        ("gdn_in_kernel_gate", {"batch": 2, "length": 3})):
        spec = spec_attributes(bundle, name)
        inputs = random_inputs(spec, generator, **shape)
        keys = [key for key in GRADIENTS if key in inputs]

        def function(*tensors):
            values = dict(inputs, **dict(zip(keys, tensors)))
            out, final_state = call_op(bundle, name, values)
            return (out, final_state) if final_state is not None else out

        leaves = [inputs[key].clone().requires_grad_() for key in keys]
        passed = torch.autograd.gradcheck(function, leaves, fast_mode=True, raise_exception=False)
        expect(passed, f"{name}: torch.autograd.gradcheck (fast mode) over {', '.join(keys)}")


def check_low_precision(bundles, generator):
    bundle = bundles / "qwen35_gdn"
    name = "qwen35_gated_deltanet"
    spec = spec_attributes(bundle, name)
    inputs = random_inputs(spec, generator, lengths=(5, 30))
    low = {key: t.to(torch.bfloat16) if key in ("q", "k", "v", "a", "b") else t.float() if t.is_floating_point() else t
           for key, t in inputs.items()}
    out, final_state = call_op(bundle, name, low)
    want_out, want_final = recurrence(spec, low)
    expect(out.dtype == torch.bfloat16 and final_state.dtype == torch.float32,
           f"{name}: bf16 q, k, v give bf16 o, a float32 final state")
    expect(relative_error(out, want_out) < 1e-2 and relative_error(final_state, want_final) < 1e-5,
           f"{name}: bf16 inputs computed in float64, o rounded once")


def check_errors(bundles, generator):
    bundle = bundles / "gated_delta_specs"
    good = random_inputs(spec_attributes(bundle, "gdn_grouped_varlen"), generator, lengths=(5, 7))
    good_in_kernel = random_inputs(spec_attributes(bundle, "gdn_in_kernel_gate"), generator, batch=1, length=4)

    def error_of(name, base=good, **changes):
        inputs = dict(base, **changes)
        inputs = {key: value for key, value in inputs.items() if value is not None}
        try:
            call_op(bundle, name, inputs)
        except RuntimeError as error:
            return str(error).splitlines()[0]
        return "no error"

    cases = [
        (error_of("gdn_grouped_varlen", q=good["q"][:, :, :1], k=good["k"][:, :, :1]),
         ["'gdn_grouped_varlen'", "2 key heads", "got 1 and 4"]),
        (error_of("gdn_grouped_varlen", cu_seqlens=None), ["cu_seqlens is required"]),
        (error_of("gdn_grouped_varlen", cu_seqlens=torch.tensor([0, 7, 5, 12], dtype=torch.int32)),
         ["increase strictly", "cu_seqlens[2] = 5 after 7"]),
        (error_of("gdn_grouped_varlen", cu_seqlens=good["cu_seqlens"].long()), ["int32"]),
        (error_of("gdn_grouped_varlen", g=None), ["g is required"]),
        (error_of("gdn_grouped_varlen", a=good["g"]), ["a is not an input", "no in_kernel_gate"]),
        (error_of("gdn_in_kernel_gate", good_in_kernel, beta=torch.sigmoid(good_in_kernel["b"])),
         ["'gdn_in_kernel_gate'", "beta is not an input", "sigmoid(b)"]),
        (error_of("gdn_in_kernel_gate", good_in_kernel, A_log=good_in_kernel["A_log"][:1]),
         ["A_log must be [Hv] [2], got [1]"]),
        (error_of("no_such_spec"), ["no gated-delta spec 'no_such_spec'", "gdn_plain"]),
    ]
    for message, fragments in cases:
        expect(all(fragment in message for fragment in fragments), f"error: {message[:70]}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--library", required=True)
    parser.add_argument("--bundles", required=True, type=pathlib.Path)
    args = parser.parse_args()
    torch.ops.load_library(args.library)
    generator = torch.Generator().manual_seed(0)
    expect(sorted(torch.ops.dflex.gated_delta_specs(str(args.bundles / "gated_delta_specs"))) ==
           ["gdn_grouped_varlen", "gdn_h16_d128", "gdn_in_kernel_gate", "gdn_no_delta", "gdn_plain"],
           "gated_delta_specs lists the bundle's specs")
    check_against_recurrence(args.bundles, generator)
    check_gradcheck(args.bundles, generator)
    check_low_precision(args.bundles, generator)
    check_errors(args.bundles, generator)
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        sys.exit(1)
    print("gated_delta_op_check: all checks pass")


if __name__ == "__main__":
    main()
