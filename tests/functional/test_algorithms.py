"""The three algorithms of a band-limited convolution agree, and ``"auto"`` picks as documented."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lightning_bandlimit.functional import fft_conv1d, fft_conv2d, spectral_band
from lightning_bandlimit.functional.algorithm import choose_algorithm
from lightning_bandlimit.functional.geometry import resolve_geometry
from lightning_bandlimit.functional.spectrum_split import input_plan, outgrows_input
from lightning_bandlimit.layers.band_limited import BandLimitedConv2d
from lightning_bandlimit.layers.surgery import unbandlimit
from lightning_bandlimit.recompute.saved_tensors import SavedTensorMeter

CASES_2D = [
    # (H, W, kernel, stride, padding, dilation, groups, padding_mode, compression)
    (8, 8, 3, 1, 1, 1, 1, "zeros", 0.5),
    (9, 7, 3, 2, 1, 1, 1, "zeros", 0.75),
    (10, 10, 5, 2, 2, 1, 2, "reflect", 0.3),
    (12, 6, 3, 1, 1, 2, 1, "circular", 0.6),
    (6, 6, 1, 2, 0, 1, 1, "zeros", 0.5),  # strided 1x1: only the read positions are synthesised
    (11, 11, 3, 1, 1, 1, 4, "replicate", 0.9),
    (16, 16, 7, 2, 3, 1, 1, "zeros", 0.5),  # a stem; separable (not dense) projection
    (4, 4, 3, 1, 1, 1, 1, "zeros", 0.5),  # a small map: dense projection
]


@pytest.mark.parametrize("case", CASES_2D)
@pytest.mark.parametrize("memory_lean", [False, True])
def test_spatial_equals_spectral_2d(case, memory_lean):
    h, w, k, s, p, d, g, mode, c = case
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, h, w, dtype=torch.float64, generator=gen, requires_grad=True)
    weight = torch.randn(8, 4 // g, k, k, dtype=torch.float64, generator=gen, requires_grad=True)
    bias = torch.randn(8, dtype=torch.float64, generator=gen, requires_grad=True)
    outs = {}
    for algorithm, compression in (("spectral", c), ("spatial", c), ("auto", c), ("full", 0.0)):
        y = fft_conv2d(
            x * 1.0,
            weight,
            bias,
            s,
            p,
            d,
            g,
            padding_mode=mode,
            compression=compression,
            memory_lean=memory_lean,
            algorithm="spectral" if algorithm == "full" else algorithm,
        )
        grads = torch.autograd.grad(y, (x, weight, bias), torch.ones_like(y) + y.detach())
        outs[algorithm] = (y, *grads)
    for a, b in zip(outs["spatial"], outs["spectral"]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    # "auto" computes the band, or the full band where the band would outgrow the input
    outgrows = outgrows_input(input_plan(x, weight, bias, s, p, d, g, mode, c, 2), x)
    # the 10 x 10 map (a 14 x 14 grid, 66 coefficients kept at 0.3) and the 4 x 4 one (6 x 6, 15)
    assert outgrows == (case in (CASES_2D[2], CASES_2D[-1]))
    for a, b in zip(outs["auto"], outs["full" if outgrows else "spectral"]):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


@pytest.mark.parametrize("memory_lean", [False, True])
def test_spatial_equals_spectral_1d(memory_lean):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 40, dtype=torch.float64, generator=gen, requires_grad=True)
    weight = torch.randn(5, 3, 5, dtype=torch.float64, generator=gen, requires_grad=True)
    results = []
    for algorithm in ("spectral", "spatial"):
        # relu(...) publishes a recipe of its input under memory_lean: the spatial path rebuilds
        # it in the caller's (N, C, L) shape.
        y = fft_conv1d(
            (x * 1.0).relu(),
            weight,
            None,
            2,
            2,
            compression=0.6,
            memory_lean=memory_lean,
            algorithm=algorithm,
        )
        results.append((y, *torch.autograd.grad(y.square().sum(), (x, weight))))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_unbatched_and_eval_paths_agree():
    x = torch.randn(4, 12, 12, dtype=torch.float64)
    weight = torch.randn(6, 4, 3, 3, dtype=torch.float64)
    with torch.no_grad():
        a = fft_conv2d(x, weight, padding=1, compression=0.5, algorithm="spatial")
        b = fft_conv2d(x, weight, padding=1, compression=0.5, algorithm="spectral")
    assert a.shape == (6, 12, 12)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


def test_full_band_runs_the_native_convolution_and_keeps_only_the_input():
    x = torch.randn(2, 4, 10, 10, requires_grad=True)
    weight = torch.nn.Parameter(torch.randn(6, 4, 3, 3))
    with SavedTensorMeter(exclude=[weight]) as meter:
        y = fft_conv2d(x, weight, padding=1, compression=0.0)
    assert meter.bytes == x.nbytes  # F.conv2d keeps its input; the spectral path keeps a spectrum
    torch.testing.assert_close(y, F.conv2d(x, weight, padding=1))


def test_unknown_algorithm_is_rejected_with_the_choices():
    with pytest.raises(
        ValueError, match=r"algorithm must be one of \('auto', 'spectral', 'spatial'\), got 'fft'"
    ):
        fft_conv2d(torch.zeros(1, 1, 4, 4), torch.zeros(1, 1, 3, 3), compression=0.5, algorithm="fft")
    layer = BandLimitedConv2d(1, 1, 3, compression=0.5)
    with pytest.raises(ValueError, match="got 'fast'"):
        layer.algorithm = "fast"  # refused when set: the forward pass trusts it
    assert layer.algorithm == "auto"


def _geometry(size, c_in, c_out, kernel, stride):
    x, w = torch.zeros(1, c_in, size, size), torch.zeros(c_out, c_in, kernel, kernel)
    return resolve_geometry(x, w, None, stride, kernel // 2, 1, 1, "zeros", 2)


def test_auto_choice_follows_the_cost_model():
    # Wide stride-1 layers mix fewer coefficients than the kernel has taps times pixels:
    # spectral. A strided 1x1 shortcut reads a quarter of the pixels: spatial, at any band.
    wide = _geometry(32, 64, 64, 3, 1)
    assert choose_algorithm(wide, spectral_band(wide.grid, 0.5), 32, 64, 64, True) == "spectral"
    shortcut = _geometry(32, 64, 128, 1, 2)
    for c in (0.5, 0.75):
        assert choose_algorithm(shortcut, spectral_band(shortcut.grid, c), 32, 64, 128, True) == "spatial"


def test_layer_repr_names_a_forced_algorithm():
    layer = BandLimitedConv2d(2, 2, 3, compression=0.5)
    assert "algorithm" not in repr(layer)
    layer.algorithm = "spectral"
    assert "algorithm='spectral'" in repr(layer)
    plain = unbandlimit(layer)
    assert type(plain) is nn.Conv2d and "_algorithm" not in plain.__dict__  # it carries nothing of ours


@pytest.mark.parametrize("memory_lean", [False, True])
@pytest.mark.parametrize("need_x", [True, False])
def test_spatial_backward_in_batch_slices_equals_one_piece(
    monkeypatch: pytest.MonkeyPatch, memory_lean: bool, need_x: bool
) -> None:
    """The spatial algorithm's backward builds the padded band-limited input and its gradient a
    batch slice at a time (its working set stays near the plain convolution's): the gradients
    equal those of one piece."""
    from lightning_bandlimit.functional import spatial_conv as module

    g = torch.Generator().manual_seed(5)
    x = torch.randn(7, 3, 12, 12, generator=g, dtype=torch.float64)
    w, b = torch.randn(4, 3, 3, 3, generator=g, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    grads = []
    for budget in (1 << 30, 1):  # one piece; one sample a slice
        monkeypatch.setattr(module, "_BACKWARD_BYTES", budget)
        xi, wi, bi = (t.clone().requires_grad_(True) for t in (x, w, b))
        xi.requires_grad_(need_x)
        out = fft_conv2d(xi, wi, bi, padding=1, compression=0.3, algorithm="spatial", memory_lean=memory_lean)
        out.square().sum().backward()
        grads.append([t.grad for t in (xi, wi, bi) if t.requires_grad])
    for one, sliced in zip(*grads):
        torch.testing.assert_close(sliced, one, rtol=1e-12, atol=1e-12)
