"""The pointwise checkpointing mode: exact, frees what lies between the convolutions, BatchNorm
statistics updated once, switched like the full mode."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torchvision.models.resnet import BasicBlock, Bottleneck

from lightning_bandlimit.recompute.saved_tensors import SavedTensorMeter
from lightning_bandlimit.recompute.switch import checkpoint, checkpoint_mode, uncheckpoint
from lightning_bandlimit.recompute.trial import trial


def _run(block: nn.Module, x: torch.Tensor) -> tuple[int, torch.Tensor, list[torch.Tensor]]:
    x = x.detach().clone().requires_grad_()
    with SavedTensorMeter(exclude=block.parameters()) as meter:
        out = block(x)
    out.pow(2).sum().backward()
    grads = [x.grad, *(p.grad.clone() for p in block.parameters())]
    block.zero_grad()
    return meter.bytes, out.detach(), grads


@pytest.mark.parametrize(
    "make",
    [
        lambda: BasicBlock(8, 8),
        lambda: Bottleneck(16, 4),
        lambda: Bottleneck(
            8, 4, stride=2, downsample=nn.Sequential(nn.Conv2d(8, 16, 1, 2), nn.BatchNorm2d(16))
        ),
    ],
    ids=["basic", "bottleneck", "bottleneck-downsample"],
)
def test_exact_and_between_plain_and_full_in_bytes(make) -> None:
    torch.manual_seed(0)
    block = make().double().train()
    x = torch.randn(4, block.conv1.in_channels, 8, 8, dtype=torch.float64)
    plain = _run(block, x)
    checkpoint(block, "block", mode="pointwise")
    pointwise = _run(block, x)
    checkpoint(block, "block", mode="full")
    full = _run(block, x)
    uncheckpoint(block)
    torch.testing.assert_close(pointwise[1], plain[1], rtol=1e-12, atol=1e-12)
    for a, b in zip(pointwise[2], plain[2], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    assert full[0] < pointwise[0] < plain[0]
    # a basic block keeps its input and its two convolutions' outputs (the ReLUs' are recomputed)
    if isinstance(block, BasicBlock):
        assert pointwise[0] == 3 * x[:, :8].nelement() * 8


def test_batchnorm_statistics_are_updated_once() -> None:
    torch.manual_seed(0)
    plain, other = BasicBlock(4, 4), BasicBlock(4, 4)
    other.load_state_dict(plain.state_dict())
    checkpoint(other, mode="pointwise")
    x = torch.randn(4, 4, 6, 6)
    plain(x).sum().backward()
    other(x).sum().backward()
    for a, b in zip(plain.buffers(), other.buffers(), strict=True):
        torch.testing.assert_close(a, b)
    assert int(other.bn1.num_batches_tracked) == 1


def test_modes_switch_and_back() -> None:
    block = BasicBlock(4, 4)
    keys = list(block.state_dict())
    assert checkpoint_mode(block) is None
    assert checkpoint_mode(checkpoint(block, mode="pointwise")) == "pointwise"
    assert checkpoint_mode(checkpoint(block, mode="full")) == "full"
    assert type(uncheckpoint(block)) is BasicBlock and checkpoint_mode(block) is None
    assert list(block.state_dict()) == keys
    with pytest.raises(ValueError, match="mode"):
        checkpoint(block, mode="bogus")


class _Mutating(nn.Module):
    """Changes a convolution's output in place after the pointwise mode kept it."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(2, 2, 3, padding=1), nn.Conv2d(2, 2, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.conv1(x)
        out = self.conv2(torch.sigmoid(y))
        y.mul_(2)  # the kept output changes
        return out + y


def test_the_trial_refuses_a_pointwise_unit_whose_kept_output_changes() -> None:
    sample = (torch.randn(2, 2, 5, 5, requires_grad=True),)
    assert (
        trial("block", BasicBlock(2, 2), (torch.randn(2, 2, 5, 5, requires_grad=True),), mode="pointwise")
        is None
    )
    reason = trial("mutating", _Mutating(), sample, mode="pointwise")
    assert reason is not None and reason.startswith("mutating")
    assert trial("mutating", _Mutating(), sample, mode="full") is None
