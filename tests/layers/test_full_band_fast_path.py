"""Compression 0 at plain speed: the full band is decided when set, not per call (issue 57, part 3).

A band-limited layer whose setters found the native convolution applies runs ``nn.Conv2d``'s own
forward (the same op: equal bit for bit), without calling ``band_limited_conv``; the memory-lean
twins decide by one global test (``handoff.quiet``) that no activation is band-limited while no
band-limited layer is engaged. Every other case still takes the general path.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_bandlimit import bandlimit, set_compression, unbandlimit
from lightning_bandlimit.functional import fft_conv2d
from lightning_bandlimit.functional.lean import handoff
from lightning_bandlimit.functional.lean.sources import Saved
from lightning_bandlimit.layers import BandLimitedConv1d, BandLimitedConv2d
from lightning_bandlimit.layers import band_limited as band_limited_module
from lightning_bandlimit.layers import lean as lean_module
from lightning_bandlimit.layers.lean import LeanBatchNorm2d, LeanReLU


@pytest.fixture(autouse=True)
def _fresh_engagement(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test starts quiet: what earlier tests of the session engaged is set aside."""
    state = handoff._Engaged()
    monkeypatch.setattr(handoff, "_ENGAGED", state)
    handoff._REGISTRY.entries.clear()
    yield


@pytest.fixture
def no_general_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The general path of a band-limited layer and the per-input test of a lean module raise."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the general path ran")

    monkeypatch.setattr(band_limited_module, "band_limited_conv", refuse)
    monkeypatch.setattr(lean_module, "_band_limited", refuse)


CONFIGS_2D = [
    dict(kernel_size=3, padding=1),
    dict(kernel_size=3, padding=1, stride=2, bias=False),
    dict(kernel_size=3, padding=2, dilation=2),
    dict(kernel_size=3, padding=1, groups=2),
    dict(kernel_size=3, padding="same"),
    dict(kernel_size=5, padding="valid", stride=(1, 2)),
    dict(kernel_size=1, stride=2),
]


def _pair(cls: type[nn.Module], plain: type[nn.Module], **kwargs: object) -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    reference = plain(4, 6, **kwargs)
    layer = cls(4, 6, **kwargs)
    layer.load_state_dict(reference.state_dict())
    return reference, layer


def _forward_backward(module: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    x = x.detach().clone().requires_grad_(True)
    module.zero_grad(set_to_none=True)
    out = module(x)
    (out.square().sum() + out.sum()).backward()
    return (out.detach(), x.grad, *(p.grad for p in module.parameters()))


@pytest.mark.parametrize("kwargs", CONFIGS_2D)
@pytest.mark.parametrize("training", [True, False])
def test_full_band_equals_conv2d_bitwise_without_the_general_path(
    kwargs: dict[str, object], training: bool, no_general_path: None
) -> None:
    reference, layer = _pair(BandLimitedConv2d, nn.Conv2d, **kwargs)
    reference.train(training), layer.train(training)
    x = torch.randn(3, 4, 11, 12)
    for got, want in zip(_forward_backward(layer, x), _forward_backward(reference, x)):
        assert torch.equal(got, want)
    assert layer.achieved_compression == 0.0
    assert not handoff._ENGAGED.layers


def test_full_band_conv1d_and_unbatched_inputs(no_general_path: None) -> None:
    reference, layer = _pair(BandLimitedConv1d, nn.Conv1d, kernel_size=5, padding="same")
    x = torch.randn(2, 4, 30)
    for got, want in zip(_forward_backward(layer, x), _forward_backward(reference, x)):
        assert torch.equal(got, want)
    assert torch.equal(layer(x[0]), reference(x[0]))  # unbatched
    reference, layer = _pair(BandLimitedConv2d, nn.Conv2d, kernel_size=3, padding=1)
    assert torch.equal(layer(x[0, :, :20].reshape(4, 4, 5)), reference(x[0, :, :20].reshape(4, 4, 5)))


def test_achieved_compression_is_none_until_the_first_forward(no_general_path: None) -> None:
    layer = BandLimitedConv2d(4, 6, 3, padding=1)
    assert layer.achieved_compression is None
    layer(torch.randn(1, 4, 8, 8))
    assert layer.achieved_compression == 0.0


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(kernel_size=3, padding=1, compression=0.5),
        dict(kernel_size=3, padding=1, algorithm="spectral"),
        dict(kernel_size=3, padding=1, algorithm="spatial"),
        dict(kernel_size=3, padding=1, padding_mode="reflect"),
        dict(kernel_size=3, padding=1, padding_mode="circular"),
        dict(kernel_size=2, padding="same"),  # asymmetric: not the native convolution
    ],
)
def test_anything_but_the_native_full_band_takes_the_general_path(
    kwargs: dict[str, object], no_general_path: None
) -> None:
    kwargs = dict(kwargs)
    algorithm = kwargs.pop("algorithm", None)
    layer = BandLimitedConv2d(4, 6, **kwargs)
    if algorithm is not None:
        layer.algorithm = algorithm
    with pytest.raises(AssertionError, match="general path"):
        layer(torch.randn(2, 4, 9, 9))


def test_non_native_full_band_matches_what_it_computed_before() -> None:
    """At compression 0 a reflect-padded layer still runs the spectral algorithm, and engages."""
    torch.manual_seed(0)
    reference = nn.Conv2d(4, 6, 3, padding=1, padding_mode="reflect")
    layer = BandLimitedConv2d.from_conv(reference)
    x = torch.randn(2, 4, 9, 9, requires_grad=True)
    out = layer(x)
    assert type(out.grad_fn).__name__ != "ConvolutionBackward0"
    assert torch.allclose(out, reference(x), atol=1e-5)
    assert set(handoff._ENGAGED.layers) == {layer}


def test_switching_compression_at_run_time() -> None:
    reference, layer = _pair(BandLimitedConv2d, nn.Conv2d, kernel_size=3, padding=1)
    x = torch.randn(2, 4, 16, 16)
    assert torch.equal(layer(x), reference(x)) and layer.achieved_compression == 0.0
    assert handoff.quiet()
    layer.compression = 0.5
    band_limited = layer(x)
    assert 0.4 < layer.achieved_compression < 0.6
    assert not torch.allclose(band_limited, reference(x), atol=1e-3)
    assert set(handoff._ENGAGED.layers) == {layer} and not handoff.quiet()
    layer.compression = 0.0
    assert not handoff.quiet()  # its band-limited output lives, with its recipe
    del band_limited
    assert handoff.quiet()
    assert torch.equal(layer(x), reference(x)) and layer.achieved_compression == 0.0
    layer.algorithm = "spectral"  # the algorithm setter decides too
    assert not layer._full_band
    layer.algorithm = "auto"
    assert layer._full_band


def test_the_general_path_is_called_again_after_raising_the_compression(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = []
    general = band_limited_module.band_limited_conv

    def spy(*args: object, **kwargs: object) -> object:
        calls.append(args[8])  # the compression
        return general(*args, **kwargs)

    monkeypatch.setattr(band_limited_module, "band_limited_conv", spy)
    layer = BandLimitedConv2d(4, 6, 3, padding=1)
    x = torch.randn(2, 4, 12, 12)
    layer(x)
    layer.compression = 0.5
    layer(x)
    layer.compression = 0.0
    layer(x)
    assert calls == [0.5]


def test_lean_hand_off_at_full_band_still_goes_through_lean_conv(monkeypatch: pytest.MonkeyPatch) -> None:
    """An input published by a lean op: the full-band layer keeps its recipe, not the input."""
    from lightning_bandlimit.functional import fft_conv as fft_conv_module

    used = []
    lean_conv = fft_conv_module.lean_conv

    def spy(*args: object, **kwargs: object) -> torch.Tensor:
        used.append(True)
        return lean_conv(*args, **kwargs)

    monkeypatch.setattr(fft_conv_module, "lean_conv", spy)
    reference, layer = _pair(BandLimitedConv2d, nn.Conv2d, kernel_size=3, padding=1)
    x = torch.randn(2, 4, 10, 10, requires_grad=True)
    h = x * 2.0
    handoff.publish(h, Saved(), ())
    assert torch.allclose(layer(h), reference(h), atol=1e-6)
    assert used == [True]
    layer.memory_lean = False  # no hand-off: the plain convolution, though a recipe exists
    layer(h)
    layer.memory_lean = True
    layer.eval()
    layer(h)
    assert used == [True]


def _block(compression: float) -> nn.Module:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(4, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1)
    )
    return bandlimit(model, compression)


def test_lean_modules_skip_the_per_input_test_while_quiet(no_general_path: None) -> None:
    model = _block(0.0).train()
    assert isinstance(model[1], LeanBatchNorm2d) and isinstance(model[2], LeanReLU)
    x = torch.randn(2, 4, 10, 10, requires_grad=True)
    out = model(x)
    out.sum().backward()
    assert type(out.grad_fn).__name__ == "ConvolutionBackward0"


def test_one_engaged_model_makes_the_others_look_at_their_inputs(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = []
    band_limited = lean_module._band_limited

    def spy(input: torch.Tensor) -> bool:
        asked.append(True)
        return band_limited(input)

    monkeypatch.setattr(lean_module, "_band_limited", spy)
    engaged, full = _block(0.5).train(), _block(0.0).train()
    x = torch.randn(2, 4, 10, 10, requires_grad=True)
    full(x)
    assert asked == []
    engaged(x)  # its lean modules take the lean path
    assert asked and type(engaged[2](engaged[1](engaged[0](x))).grad_fn).__name__ == "ReluFunctionBackward"
    asked.clear()
    full(x)
    assert asked  # another model is engaged: each input is looked at (and found plain)
    set_compression(engaged, 0.0)
    asked.clear()
    full(x), engaged(x)
    assert asked == []


def test_a_copy_of_an_engaged_model_engages_itself() -> None:
    model = _block(0.5).train()
    clone = copy.deepcopy(model)
    x = torch.randn(2, 4, 10, 10, requires_grad=True)
    clone[2](clone[1](clone[0](x)))
    assert set(handoff._ENGAGED.layers) == {clone[0]}
    assert type(clone[2](clone[1](clone[0](x))).grad_fn).__name__ == "ReluFunctionBackward"


def test_swap_back_and_garbage_collection_disengage() -> None:
    model = _block(0.5).train()
    model(torch.randn(2, 4, 10, 10))
    assert len(handoff._ENGAGED.layers) == 2
    unbandlimit(model)
    assert handoff.quiet() and not hasattr(model[0], "_full_band")
    model = bandlimit(model, 0.5)
    model(torch.randn(2, 4, 10, 10))
    layers = weakref.WeakSet([model[0], model[3]])
    del model
    import gc

    gc.collect()
    assert not layers and handoff.quiet()


def test_a_functional_band_limited_conv_under_autograd_engages() -> None:
    x = torch.randn(2, 4, 10, 10, requires_grad=True)
    w = torch.randn(6, 4, 3, 3, requires_grad=True)
    fft_conv2d(x, w, padding=1)  # native
    with torch.no_grad():
        fft_conv2d(x, w, padding=1, compression=0.5)
    assert handoff.quiet()
    out = fft_conv2d(x, w, padding=1, compression=0.5)  # unpublished: memory_lean is off
    assert not handoff.quiet()
    plain = type(F.batch_norm(out, None, None, training=True).grad_fn)
    assert type(LeanBatchNorm2d(6).train()(out).grad_fn) is not plain  # the lean path
