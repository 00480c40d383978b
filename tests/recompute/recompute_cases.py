"""Models, steps and counters the tests of :mod:`lightning_bandlimit.recompute`'s switch, profile and
rungs share."""

import torch
import torch.nn.functional as F
from torch import nn

from lightning_bandlimit.recompute.saved_tensors import SavedTensorMeter
from lightning_bandlimit.recompute.switch import checkpoint
from lightning_bandlimit.recompute.unit_choice import checkpoint_units

BLOCKS = [str(i) for i in range(3, 11)]  # cifar_resnet18's 8 residual blocks: Sequential indices 3..10


def _checkpoint_all(model: nn.Module) -> nn.Module:
    for _, unit in checkpoint_units(model):
        checkpoint(unit)
    return model


def _step(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict:
    """One training forward and backward: output, loss, parameter and input gradients."""
    x = x.clone().requires_grad_()
    out = model(x)
    loss = F.cross_entropy(out, y)
    loss.backward()
    return {
        "out": out.detach(),
        "loss": loss.detach(),
        "grads": {n: p.grad.clone() for n, p in model.named_parameters()},
        "input_grad": x.grad.clone(),
    }


def _assert_same_step(a: dict, b: dict, atol: float = 1e-12) -> None:
    torch.testing.assert_close(a["out"], b["out"], rtol=0, atol=atol)
    torch.testing.assert_close(a["loss"], b["loss"], rtol=0, atol=atol)
    assert a["grads"].keys() == b["grads"].keys()
    for name in a["grads"]:
        torch.testing.assert_close(a["grads"][name], b["grads"][name], rtol=0, atol=atol, msg=name)
    torch.testing.assert_close(a["input_grad"], b["input_grad"], rtol=0, atol=atol)


def _batch(n: int = 4, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.rand(n, 3, 32, 32, dtype=dtype), torch.randint(0, 10, (n,))


def _saved_bytes(model: nn.Module, x: torch.Tensor) -> int:
    with SavedTensorMeter(exclude=model.parameters()) as meter:
        out = model(x)
    out.sum().backward()
    return meter.bytes


def _count_forwards(module: nn.Module) -> list[int]:
    calls = [0]
    module.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls
