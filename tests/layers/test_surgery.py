"""bandlimit / unbandlimit / set_compression / bandlimited_layers."""

import pytest
import torch
from torch import nn

from lightning_bandlimit import (
    BandLimitedConv1d,
    BandLimitedConv2d,
    bandlimit,
    bandlimited_layers,
    set_compression,
    unbandlimit,
)
from lightning_bandlimit.layers.lean import LeanConv2d


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.body = nn.Sequential(nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())
        self.shortcut = nn.Conv2d(3, 8, 1)
        self.up = nn.ConvTranspose2d(8, 8, 2, stride=2)
        self.head = nn.Linear(8, 2)
        self.signal = nn.Conv1d(8, 8, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(self.stem(x)) + self.shortcut(x)
        y = self.up(y)
        s = self.signal(y.mean(2))
        return self.head(s.mean(-1))


def test_converts_exactly_the_plain_spatial_convolutions() -> None:
    model = bandlimit(Net(), 0.5)
    assert type(model.stem) is BandLimitedConv2d and model.stem.compression == 0.5
    assert type(model.body[1]) is BandLimitedConv2d
    assert type(model.signal) is BandLimitedConv1d
    assert type(model.shortcut) is LeanConv2d  # 1x1 not band-limited by default, only memory-lean
    assert type(model.up) is nn.ConvTranspose2d
    assert [n for n, _ in bandlimited_layers(model)] == ["stem", "body.1", "signal"]


def test_pointwise_option_and_patterns() -> None:
    model = bandlimit(Net(), 0.5, pointwise=True, exclude="signal")
    assert [n for n, _ in bandlimited_layers(model)] == ["stem", "body.1", "shortcut"]
    model = bandlimit(Net(), include=["body.*", "stem"])
    assert [n for n, _ in bandlimited_layers(model)] == ["stem", "body.1"]
    assert [n for n, _ in bandlimited_layers(model, include="body.*")] == ["body.1"]
    with pytest.raises(TypeError, match="include must be a glob pattern"):
        bandlimit(Net(), include=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="pointwise must be a bool"):
        bandlimit(Net(), pointwise="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="compression"):
        bandlimit(Net(), 1.2)


def test_subclasses_of_conv_are_left_alone() -> None:
    class Custom(nn.Conv2d):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return super().forward(x) * 2

    model = bandlimit(nn.Sequential(Custom(3, 3, 3)))
    assert type(model[0]) is Custom


def test_swap_keeps_objects_parameters_hooks_mode_and_dtype() -> None:
    model = Net().double().eval()
    stem = model.stem
    params_before = {n: p for n, p in model.named_parameters()}
    calls = []
    handle = model.stem.register_forward_hook(lambda *_: calls.append("hook"))
    bandlimit(model, 0.3)
    assert model.stem is stem
    assert {n: p for n, p in model.named_parameters()} == params_before
    assert not model.stem.training and model.stem.weight.dtype == torch.float64
    model(torch.randn(1, 3, 8, 8, dtype=torch.float64))
    assert calls == ["hook"]
    handle.remove()
    model(torch.randn(1, 3, 8, 8, dtype=torch.float64))
    assert calls == ["hook"]


def test_state_dicts_are_interchangeable() -> None:
    plain = Net()
    banded = bandlimit(Net(), 0.5)
    assert list(plain.state_dict()) == list(banded.state_dict())
    banded.load_state_dict(plain.state_dict())
    assert torch.equal(banded.stem.weight, plain.stem.weight)
    plain2 = Net()
    plain2.load_state_dict(banded.state_dict())
    assert torch.equal(plain2.body[1].weight, plain.body[1].weight)


def test_optimizer_built_before_the_swap_stays_valid() -> None:
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    bandlimit(model, 0.5)
    before = model.stem.weight.detach().clone()
    model(torch.randn(4, 3, 8, 8)).sum().backward()
    optimizer.step()
    assert not torch.equal(before, model.stem.weight)
    assert optimizer.param_groups[0]["params"][0] is model.stem.weight


def test_unbandlimit_is_the_exact_inverse() -> None:
    model = Net().double()
    x = torch.randn(2, 3, 8, 8, dtype=torch.float64)
    expected = model(x)
    stem = model.stem
    unbandlimit(bandlimit(model, 0.0))
    assert model.stem is stem and type(model.stem) is nn.Conv2d and type(model.signal) is nn.Conv1d
    assert "_compression" not in model.stem.__dict__ and "achieved_compression" not in model.stem.__dict__
    assert torch.equal(model(x), expected)


def test_set_compression_counts_and_selects() -> None:
    model = bandlimit(Net(), 0.1)
    assert set_compression(model, 0.7, include="body.*") == 1
    assert model.body[1].compression == 0.7 and model.stem.compression == 0.1
    assert set_compression(model, 0.2) == 3
    assert {layer.compression for _, layer in bandlimited_layers(model)} == {0.2}
    assert set_compression(Net(), 0.5) == 0
    with pytest.raises(ValueError, match="compression"):
        set_compression(model, -1.0)


def test_already_bandlimited_layers_keep_their_compression() -> None:
    model = nn.Sequential(BandLimitedConv2d(3, 3, 3, compression=0.4), nn.Conv2d(3, 3, 3))
    bandlimit(model, 0.8)
    assert model[0].compression == 0.4 and model[1].compression == 0.8


def test_bandlimited_torchvision_resnet18_matches_at_zero_compression() -> None:
    torchvision = pytest.importorskip("torchvision")
    model = torchvision.models.resnet18(num_classes=10).double().eval()
    x = torch.rand(2, 3, 64, 64, dtype=torch.float64)
    with torch.no_grad():
        expected = model(x)
        bandlimit(model, 0.0)
        got = model(x)
    assert len(list(bandlimited_layers(model))) == 17  # every 3x3 and the 7x7 stem; 1x1 stay
    assert ((got - expected).abs().max() / expected.abs().max()).item() < 1e-9
