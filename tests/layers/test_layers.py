"""BandLimitedConv1d/2d: drop-in twins of nn.Conv1d/2d."""

import pytest
import torch
from torch import nn

from lightning_bandlimit import BandLimitedConv1d, BandLimitedConv2d, spectral_band, unbandlimit


def _relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).abs().max() / b.abs().max()).item()


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(kernel_size=3, padding=1),
        dict(kernel_size=(3, 5), stride=2, padding=(1, 2), bias=False),
        dict(kernel_size=3, padding="same", dilation=2, padding_mode="reflect"),
        dict(kernel_size=3, padding=1, groups=4, padding_mode="circular"),
    ],
)
def test_conv2d_at_zero_compression_equals_nn_conv2d(kwargs: dict) -> None:
    reference = nn.Conv2d(8, 12, dtype=torch.float64, **kwargs)
    layer = BandLimitedConv2d(8, 12, dtype=torch.float64, **kwargs)
    layer.load_state_dict(reference.state_dict())
    x = torch.randn(2, 8, 15, 12, dtype=torch.float64, requires_grad=True)
    out, ref = layer(x), reference(x)
    assert _relative_error(out, ref) < 1e-9
    grad = torch.randn_like(ref)
    got = torch.autograd.grad(out, [x, layer.weight], grad)
    want = torch.autograd.grad(ref, [x, reference.weight], grad)
    for g, w in zip(got, want):
        assert _relative_error(g, w) < 1e-9


def test_conv1d_at_zero_compression_equals_nn_conv1d() -> None:
    reference = nn.Conv1d(3, 5, 4, stride=2, padding=3, dtype=torch.float64)
    layer = BandLimitedConv1d.from_conv(reference)
    x = torch.randn(2, 3, 41, dtype=torch.float64)
    assert _relative_error(layer(x), reference(x)) < 1e-9


def test_same_parameters_and_state_dict_keys_as_plain_conv() -> None:
    plain = nn.Conv2d(3, 4, 3, padding=1)
    layer = BandLimitedConv2d(3, 4, 3, padding=1, compression=0.5)
    assert list(layer.state_dict()) == list(plain.state_dict())
    assert [n for n, _ in layer.named_parameters()] == [n for n, _ in plain.named_parameters()]
    layer.load_state_dict(plain.state_dict())
    plain.load_state_dict(layer.state_dict())
    assert torch.equal(layer.weight, plain.weight)


def test_compression_is_validated_and_shown() -> None:
    layer = BandLimitedConv2d(3, 4, 3, compression=0.25)
    assert "compression=0.25" in repr(layer)
    with pytest.raises(ValueError, match="compression"):  # every bad value: test_compression_edge.py
        layer.compression = 1.0
    assert layer.compression == 0.25


def test_compression_changes_at_run_time_and_achieved_rate_is_recorded() -> None:
    layer = BandLimitedConv2d(3, 4, 3, padding=1)
    assert layer.achieved_compression is None
    x = torch.randn(2, 3, 16, 16)
    full = layer(x)
    assert layer.achieved_compression == 0.0
    layer.compression = 0.6
    banded = layer(x)
    assert layer.achieved_compression == spectral_band((18, 18), 0.6).compression
    assert not torch.allclose(full, banded, atol=1e-3)
    layer(torch.randn(1, 3, 32, 32))  # the rate is quantised on the input's own grid
    assert layer.achieved_compression == spectral_band((34, 34), 0.6).compression


def test_from_conv_shares_parameters_and_unbandlimit_is_its_inverse() -> None:
    conv = nn.Conv2d(3, 4, 3)
    handle_calls = []
    conv.register_forward_hook(lambda *_: handle_calls.append(1))
    conv.eval()
    twin = BandLimitedConv2d.from_conv(conv, compression=0.5)
    assert twin.weight is conv.weight and twin.bias is conv.bias
    assert not twin.training
    twin(torch.randn(1, 3, 8, 8))
    assert handle_calls == [1]
    assert type(conv) is nn.Conv2d and "_compression" not in conv.__dict__  # the original is untouched
    back = unbandlimit(twin)  # the twin is converted by surgery's swap, and turned back by it
    assert back is twin and type(back) is nn.Conv2d and back.weight is conv.weight
    assert not hasattr(back, "compression") and "_compression" not in back.__dict__
    # A new Parameter on the twin does not leak into the original.
    twin = BandLimitedConv2d.from_conv(conv, compression=0.5)
    twin.weight = nn.Parameter(torch.zeros_like(conv.weight))
    assert conv.weight is not twin.weight


def test_from_conv_rejects_other_modules() -> None:
    class MyConv(nn.Conv2d):
        pass

    with pytest.raises(TypeError, match="expects an torch.nn.modules.conv.Conv2d"):
        BandLimitedConv2d.from_conv(MyConv(1, 1, 3))
    with pytest.raises(TypeError, match="got Conv1d"):
        BandLimitedConv2d.from_conv(nn.Conv1d(1, 1, 3))
    with pytest.raises(TypeError, match="got ConvTranspose1d"):
        BandLimitedConv1d.from_conv(nn.ConvTranspose1d(1, 1, 3))
