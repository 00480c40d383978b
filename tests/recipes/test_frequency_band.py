"""Tests of :mod:`lightning_bandlimit.recipes.threats.frequency_band` (radial bands, masks, projections)."""

from __future__ import annotations

import math

import pytest
import torch

from lightning_bandlimit.recipes.threats.frequency_band import (
    BANDS,
    band_mask,
    band_project,
    radial_frequency,
    resolve_band,
)

# Even, odd, non-square and tiny grids.
SIZES = [(8, 8), (7, 7), (8, 5), (5, 12), (16, 16), (1, 6), (2, 2), (1, 1)]


def mirror(t: torch.Tensor) -> torch.Tensor:
    """``t[-i, -j]`` for every ``(i, j)`` (the Hermitian mirror in the fft2 layout)."""
    return torch.roll(torch.flip(t, (-2, -1)), (1, 1), (-2, -1))


@pytest.mark.parametrize("size", SIZES)
def test_radial_frequency_values(size):
    height, width = size
    r = radial_frequency(height, width)
    assert r.shape == size and r.dtype == torch.float64
    assert r[0, 0] == 0.0
    assert r.max() <= 1.0
    fy, fx = torch.fft.fftfreq(height, dtype=torch.float64), torch.fft.fftfreq(width, dtype=torch.float64)
    expected = torch.sqrt(fy[:, None] ** 2 + fx[None, :] ** 2) / math.sqrt(0.5)
    torch.testing.assert_close(r, expected, rtol=0, atol=1e-12)
    assert torch.equal(r, mirror(r))


def test_radial_frequency_corner_and_edges_are_exact():
    r = radial_frequency(8, 8)
    assert r[4, 4] == 1.0  # |fy| = |fx| = 0.5
    assert r[2, 2] == 0.5  # a dyadic band edge is hit exactly, not 0.4999...
    assert r[4, 0] == r[0, 4]
    assert r[4, 0].item() == pytest.approx(math.sqrt(0.5), abs=1e-15)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("band", [*BANDS.values(), (0.1, 0.7), (0.3, 1.0)])
def test_band_mask_is_hermitian_symmetric(size, band):
    mask = band_mask(*size, band)
    assert mask.dtype == torch.bool and mask.shape == size
    assert torch.equal(mask, mirror(mask))


@pytest.mark.parametrize("size", SIZES)
def test_named_bands_partition_the_spectrum(size):
    low, mid, high = (band_mask(*size, name) for name in ("low", "mid", "high"))
    assert torch.equal(low | mid | high, band_mask(*size, "full"))
    assert band_mask(*size, "full").all()
    assert not (low & mid).any() and not (mid & high).any() and not (low & high).any()
    assert low[0, 0] and not high[0, 0]


def test_band_mask_edges():
    r = radial_frequency(8, 8)
    mask = band_mask(8, 8, (0.25, 0.5))
    assert torch.equal(mask, (r >= 0.25) & (r < 0.5))
    assert not mask[2, 2]  # r == 0.5: excluded by the half-open upper end
    assert band_mask(8, 8, (0.5, 1.0))[4, 4]  # r == 1 included when high == 1
    assert not band_mask(8, 8, (0.5, 0.99))[4, 4]


def test_band_mask_accepts_names_and_device():
    assert torch.equal(band_mask(6, 6, "mid", device="cpu"), band_mask(6, 6, (0.25, 0.5)))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("band", [*BANDS.values(), (0.1, 0.6)])
def test_band_project_is_a_real_orthogonal_projection(dtype, band):
    x = torch.rand(3, 2, 16, 12, dtype=dtype)
    y = torch.rand(3, 2, 16, 12, dtype=dtype)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {"atol": 1e-12, "rtol": 1e-12}
    px = band_project(x, band)
    assert px.dtype == dtype and px.shape == x.shape and not px.is_complex()
    torch.testing.assert_close(band_project(px, band), px, **tol)  # idempotent
    torch.testing.assert_close(band_project(2 * x - 3 * y, band), 2 * px - 3 * band_project(y, band), **tol)
    # self-adjoint: <P x, y> == <x, P y>
    torch.testing.assert_close((px * y).sum(), (x * band_project(y, band)).sum(), **tol)
    # the spectrum outside the band is zero
    outside = ~band_mask(16, 12, band)
    spectrum = torch.fft.fft2(px.double())
    leak = spectrum[..., outside].abs() if outside.any() else torch.zeros(1)
    assert leak.max() < (1e-4 if dtype == torch.float32 else 1e-10)


def test_band_project_complementary_bands_sum_to_identity():
    x = torch.rand(4, 3, 8, 8, dtype=torch.float64)
    parts = sum(band_project(x, name) for name in ("low", "mid", "high"))
    torch.testing.assert_close(parts, x, atol=1e-12, rtol=0)


def test_band_project_full_band_is_an_exact_copy():
    x = torch.rand(2, 8, 8)
    out = band_project(x, "full")
    assert torch.equal(out, x) and out.data_ptr() != x.data_ptr()


def test_band_project_low_band_removes_a_checkerboard():
    checker = (torch.arange(8)[:, None] + torch.arange(8)[None, :]) % 2 * 1.0
    assert band_project(checker, "low").allclose(torch.full((8, 8), 0.5), atol=1e-6)
    assert band_project(checker, "high").allclose(checker - 0.5, atol=1e-6)


def test_band_project_is_differentiable():
    x = torch.rand(1, 8, 8, dtype=torch.float64, requires_grad=True)
    weights = torch.rand(1, 8, 8, dtype=torch.float64)
    (band_project(x, "high") * weights).sum().backward()
    torch.testing.assert_close(x.grad, band_project(weights, "high"))


def test_resolve_band():
    assert resolve_band("low") == (0.0, 0.25)
    assert resolve_band([0, 1]) == (0.0, 1.0)
    assert resolve_band((0.2, 0.4)) == (0.2, 0.4)
    assert set(BANDS) == {"low", "mid", "high", "full"}
    with pytest.raises(TypeError):
        BANDS["new"] = (0.0, 0.1)  # read-only


@pytest.mark.parametrize(
    ("band", "error", "match"),
    [
        ("highest", ValueError, r"'highest'; expected one of \['full', 'high', 'low', 'mid'\]"),
        ((0.5, 0.5), ValueError, r"low < high .*\(0.5, 0.5\)"),
        ((0.6, 0.2), ValueError, r"low < high .*\(0.6, 0.2\)"),
        ((-0.1, 0.5), ValueError, r"0 <= low .*-0.1"),
        ((0.0, 1.5), ValueError, r"high <= 1.*1.5"),
        ((0.0, math.nan), ValueError, r"band high .*nan"),
        ((0.1,), ValueError, r"pair .*\(0.1,\)"),
        ((0.1, 0.2, 0.3), ValueError, r"pair .*0.3"),
        (("a", "b"), TypeError, r"band low .*'a'"),
        ((False, True), TypeError, r"band low .*False"),
        (0.5, TypeError, r"pair .*0.5"),
        (None, TypeError, r"pair .*None"),
    ],
)
def test_invalid_bands_raise(band, error, match):
    with pytest.raises(error, match=match):
        resolve_band(band)
    with pytest.raises(error, match=match):
        band_mask(8, 8, band)
    with pytest.raises(error, match=match):
        band_project(torch.rand(8, 8), band)


@pytest.mark.parametrize(("height", "width"), [(0, 4), (4, -1), (2.0, 4), (True, 4)])
def test_invalid_sizes_raise(height, width):
    match = r"(height|width) must be (an int )?>= 1, got"
    with pytest.raises((ValueError, TypeError), match=match):
        radial_frequency(height, width)
    with pytest.raises((ValueError, TypeError), match=match):
        band_mask(height, width, "low")


@pytest.mark.parametrize(
    "x", [torch.arange(16).reshape(4, 4), torch.rand(4), torch.rand(4, 4, dtype=torch.complex64), [[0.0]]]
)
def test_band_project_rejects_non_real_floating_inputs(x):
    with pytest.raises(ValueError, match="x must be a real floating tensor with at least 2 dimensions"):
        band_project(x, "low")
