"""The gated delta rule restated in PyTorch, for the op's tests: random
inputs for a dflex.gated_delta spec, the op called with them, and an
independent float64 implementation (the token recurrence, differentiable by
autograd). Semantics (docs/runtime-gated-delta.md), per value head h with key
head h // (Hv // Hk) and state S [Dk, Dv]:

    S = exp(g_t) S;  delta_t = beta_t (v_t - S^T k_t)   (v_t without the delta rule)
    S = S + k_t delta_t^T;  o_t = scale S^T q_t

q, k L2-normalised (x / sqrt(|x|^2 + 1e-6)) with qk_l2norm; with the in-kernel
gate g = -exp(A_log) softplus(a + dt_bias) and beta = sigmoid(b).
"""
import json

import torch
import torch.nn.functional as F

# The op's tensor inputs after bundle and spec, in its order.
INPUTS = ("q", "k", "v", "g", "beta", "a", "b", "A_log", "dt_bias", "initial_state", "cu_seqlens")
# Its gradients, in the order gated_delta_backward returns them.
GRADIENTS = ("q", "k", "v", "g", "beta", "a", "b", "A_log", "dt_bias", "initial_state")


def spec_attributes(bundle, name):
    """The spec's attributes from the bundle's manifest."""
    for module in json.loads((bundle / "manifest.json").read_text())["modules"]:
        if module["name"] == name:
            return module["spec"]
    raise KeyError(f"{bundle}: no module {name}")


def taken(spec):
    """The names of the tensor inputs the spec takes (initial_state optional)."""
    names = ["q", "k", "v"]
    if spec["in_kernel_gate"]:
        names += ["a", "A_log", "dt_bias"] + (["b"] if spec["delta_rule"] else [])
    else:
        names += (["g"] if spec["gate"] == "scalar_log" else []) + (["beta"] if spec["delta_rule"] else [])
    if spec["initial_state"]:
        names.append("initial_state")
    if spec["varlen"]:
        names.append("cu_seqlens")
    return names


def random_inputs(spec, generator, batch=1, length=0, lengths=(), dtype=torch.float64):
    """Inputs for `spec`: `batch` rows of `length` tokens, or with varlen one
    row holding sequences of `lengths`."""
    hk, hv = spec["num_key_heads"], spec["num_value_heads"]
    dk, dv = spec["key_dim"], spec["value_dim"]
    if spec["varlen"]:
        batch, length = 1, sum(lengths)
    sequences = len(lengths) if spec["varlen"] else batch

    def normal(*shape, scale=1.0):
        return (torch.randn(*shape, generator=generator, dtype=torch.float64) * scale).to(dtype)

    def uniform(*shape):
        return torch.rand(*shape, generator=generator, dtype=torch.float64)

    # Unit-size keys without the L2 norm, as with it: |k|^2 ~ Dk would make
    # the delta rule's I - beta k k^T expand the state without bound.
    qk_scale = 1.0 if spec["qk_l2norm"] else dk ** -0.5
    values = {
        "q": normal(batch, length, hk, dk, scale=qk_scale),
        "k": normal(batch, length, hk, dk, scale=qk_scale),
        "v": normal(batch, length, hv, dv),
        "g": F.logsigmoid(normal(batch, length, hv) + 2).to(dtype),
        "beta": (0.05 + 0.95 * uniform(batch, length, hv)).to(dtype),
        "a": normal(batch, length, hv),
        "b": normal(batch, length, hv),
        "A_log": (uniform(hv) * 2 - 1).to(dtype),
        "dt_bias": normal(hv, scale=0.5),
        "initial_state": normal(sequences, hv, dk, dv, scale=0.5),
        "cu_seqlens": torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32),
    }
    return {name: values[name] for name in taken(spec)}


def call_op(bundle, name, inputs):
    """torch.ops.dflex.gated_delta: (o, final_state or None)."""
    q, k, v = inputs["q"], inputs["k"], inputs["v"]
    optional = {key: inputs.get(key) for key in INPUTS[3:]}
    return torch.ops.dflex.gated_delta(str(bundle), name, q, k, v, **optional)


def call_backward(bundle, name, inputs, grad_out, grad_final_state=None):
    """torch.ops.dflex.gated_delta_backward: a dict of the gradients there are."""
    grads = torch.ops.dflex.gated_delta_backward(
        str(bundle), name, *(inputs.get(key) for key in INPUTS), grad_out, grad_final_state)
    return {key: grad for key, grad in zip(GRADIENTS, grads) if grad is not None}


def recurrence(spec, inputs):
    """o and the final states in float64, token by token (autograd-able)."""
    x = {name: t.double() if t.is_floating_point() else t for name, t in inputs.items()}
    q, k, v = x["q"], x["k"], x["v"]
    batch, length, hk, dk = q.shape
    hv, dv = v.shape[2], v.shape[3]
    group = hv // hk
    if spec["qk_l2norm"]:
        q = q * torch.rsqrt(q.square().sum(-1, keepdim=True) + 1e-6)
        k = k * torch.rsqrt(k.square().sum(-1, keepdim=True) + 1e-6)
    q = q.reshape(-1, hk, dk).repeat_interleave(group, 1)
    k = k.reshape(-1, hk, dk).repeat_interleave(group, 1)
    v = v.reshape(-1, hv, dv)
    tokens = batch * length
    g = torch.zeros(tokens, hv, dtype=torch.float64)
    beta = torch.ones(tokens, hv, dtype=torch.float64)
    if spec["in_kernel_gate"]:
        g = -x["A_log"].exp() * F.softplus(x["a"].reshape(tokens, hv) + x["dt_bias"])
        if spec["delta_rule"]:
            beta = torch.sigmoid(x["b"].reshape(tokens, hv))
    else:
        if "g" in x:
            g = x["g"].reshape(tokens, hv)
        if "beta" in x:
            beta = x["beta"].reshape(tokens, hv)
    if spec["varlen"]:
        offsets = x["cu_seqlens"].tolist()
    else:
        offsets = [n * length for n in range(batch + 1)]
    outputs, finals = [], []
    for n in range(len(offsets) - 1):
        state = x["initial_state"][n] if "initial_state" in x else torch.zeros(hv, dk, dv, dtype=torch.float64)
        for t in range(offsets[n], offsets[n + 1]):
            state = state * g[t].exp()[:, None, None]
            if spec["delta_rule"]:
                delta = beta[t][:, None] * (v[t] - torch.einsum("hkv,hk->hv", state, k[t]))
            else:
                delta = v[t]
            state = state + k[t][:, :, None] * delta[:, None, :]
            outputs.append(spec["scale"] * torch.einsum("hkv,hk->hv", state, q[t]))
        finals.append(state)
    out = torch.stack(outputs).reshape(batch, length, hv, dv) if outputs else v.new_zeros(batch, length, hv, dv)
    return out, torch.stack(finals)
