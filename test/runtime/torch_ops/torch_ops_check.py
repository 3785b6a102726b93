"""Loads libdflex_torch_ops.so into Python's torch and checks its operators.

  torch_ops_check.py LIBRARY
"""
import sys

import torch
import torch.nn.functional as F


def main():
    torch.ops.load_library(sys.argv[1])
    version = torch.ops.dflex.version()
    assert version.startswith("dflex-runtime"), version
    assert torch.__version__.split("+")[0] in version, version

    torch.manual_seed(0)
    hidden = torch.randn(4, 16, 48, dtype=torch.float64)
    head = torch.randn(300, 48, dtype=torch.float64) * 0.2
    labels = torch.randint(300, (4, 16))
    weights = torch.exp(-(torch.arange(16.0, dtype=torch.float64) - 1) / 7).expand(4, 16).clone()
    weights[:, 0] = 0
    labels[:, 0] = -1

    mine = hidden.clone().requires_grad_()
    loss, correct = torch.ops.dflex.block_cross_entropy(mine, head, labels, weights, 5)
    loss.backward()

    ref = hidden.clone().requires_grad_()
    logits = ref @ head.T
    ce = F.cross_entropy(logits.reshape(-1, 300), labels.clamp_min(0).reshape(-1), reduction="none")
    expected = (ce * weights.reshape(-1)).sum() / weights.sum()
    expected.backward()

    assert torch.allclose(loss, expected, rtol=1e-12), (loss.item(), expected.item())
    assert torch.allclose(mine.grad, ref.grad, rtol=1e-9, atol=1e-14), (mine.grad - ref.grad).abs().max()
    assert torch.equal(correct, (logits.argmax(-1) == labels) & (weights > 0))

    if torch.cuda.is_available():
        # The CUDA path multiplies on the device with float32 accumulation.
        cuda = hidden.float().cuda().requires_grad_()
        loss_cuda, correct_cuda = torch.ops.dflex.block_cross_entropy(
            cuda, head.float().cuda(), labels.cuda(), weights.cuda(), 5)
        loss_cuda.backward()
        assert abs(loss_cuda.item() - expected.item()) < 1e-4 * abs(expected.item())
        assert torch.allclose(cuda.grad.double().cpu(), ref.grad, rtol=1e-3, atol=1e-6)
        assert torch.equal(correct_cuda.cpu(), correct)
        print("cuda: ok")

    try:
        torch.ops.dflex.block_cross_entropy(hidden, head, labels.clamp_min(0) * 0 + 300, weights)
    except RuntimeError as error:
        assert "outside [0, 300)" in str(error), error
    else:
        raise AssertionError("an out-of-range label was accepted")
    print("ok:", version)


if __name__ == "__main__":
    main()
