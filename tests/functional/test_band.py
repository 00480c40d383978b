"""Tests of :func:`lightning_bandlimit.functional.spectral_band` (which coefficients a rate keeps)."""

from __future__ import annotations

import doctest
import importlib
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_bandlimit.functional import SpectralBand, spectral_band
from lightning_bandlimit.utils.validation import check_compression

# Odd, even, non-square, tall, wide, tiny and one-dimensional ((1, L)) grids.
GRIDS = [
    (34, 34),
    (33, 33),
    (34, 33),
    (33, 34),
    (17, 40),
    (40, 9),
    (8, 5),
    (5, 8),
    (2, 2),
    (3, 1),
    (1, 1),
    (1, 2),
    (1, 130),
    (1, 129),
    (1, 7),
    (64, 64),
]

REQUESTS = [float(c) for c in np.linspace(0.0, 0.99, 100)] + [0.995, 0.999, 1.0 - 1e-9]


def one_sided_total(grid: tuple[int, int]) -> int:
    return grid[0] * (grid[1] // 2 + 1)


def assert_consistent(band: SpectralBand, grid: tuple[int, int]) -> None:
    """The band's fields agree with each other and with the documented definitions."""
    height, width = grid
    assert band.grid == grid
    assert 0 <= band.half_rows <= height // 2
    assert 1 <= band.cols <= width // 2 + 1
    assert band.rows == min(height, 2 * band.half_rows + 1)
    assert 1 <= band.rows <= height
    assert band.kept == band.rows * band.cols
    assert 1 <= band.kept <= one_sided_total(grid)
    assert band.compression == pytest.approx(1.0 - band.kept / one_sided_total(grid), abs=1e-12)
    assert 0.0 <= band.compression < 1.0
    assert band.is_full == (band.kept == one_sided_total(grid))


@pytest.mark.parametrize("grid", GRIDS)
def test_zero_compression_keeps_everything(grid):
    band = spectral_band(grid, 0.0)
    assert band.is_full
    assert band.compression == 0.0
    assert band.rows == grid[0]
    assert band.cols == grid[1] // 2 + 1
    assert band.kept == one_sided_total(grid)
    assert_consistent(band, grid)
    # An int 0 is a valid rate too.
    assert spectral_band(grid, 0) == band


@pytest.mark.parametrize("grid", GRIDS)
def test_fields_are_consistent_for_every_request(grid):
    for c in REQUESTS:
        assert_consistent(spectral_band(grid, c), grid)


@pytest.mark.parametrize("grid", GRIDS)
def test_achieved_compression_is_monotone_in_request(grid):
    achieved = [spectral_band(grid, c).compression for c in REQUESTS]
    kept = [spectral_band(grid, c).kept for c in REQUESTS]
    for i in range(1, len(REQUESTS)):
        assert achieved[i] >= achieved[i - 1] - 1e-15, (
            f"grid {grid}: request {REQUESTS[i - 1]} -> {achieved[i - 1]}, "
            f"but request {REQUESTS[i]} -> {achieved[i]}"
        )
        assert kept[i] <= kept[i - 1]


@pytest.mark.parametrize("grid", [(34, 34), (34, 33), (33, 34), (64, 64), (40, 41), (63, 63)])
def test_achieved_close_to_request_on_big_2d_grids(grid):
    for c in np.linspace(0.05, 0.9, 86):
        band = spectral_band(grid, float(c))
        assert abs(band.compression - c) <= 0.05, (grid, float(c), band)


def reachable_rates(grid: tuple[int, int]) -> list[float]:
    """Every rate the band produces on ``grid``, found by a dense sweep of requests."""
    sweep = np.concatenate([np.linspace(0.0, 0.999, 2000), REQUESTS])
    return sorted({spectral_band(grid, float(c)).compression for c in sweep})


@pytest.mark.parametrize("grid", [(34, 34), (33, 33), (17, 40), (8, 5), (1, 129), (2, 2)])
def test_achieved_is_the_nearest_reachable_rate(grid):
    # Quantisation picks the nearest of the rates the band can produce on this grid.
    rates = reachable_rates(grid)
    assert rates[0] == 0.0
    for c in np.linspace(0.0, 0.99, 199):
        achieved = spectral_band(grid, float(c)).compression
        best = min(abs(r - c) for r in rates)
        assert abs(achieved - c) <= best + 1e-12, (grid, float(c), achieved, best)


@pytest.mark.parametrize("grid", [(1, 130), (1, 129), (1, 258)])
def test_achieved_close_to_request_on_long_1d_grids(grid):
    # 1-D: one kept column more or less changes the rate by 1 / (L // 2 + 1) only.
    step = 1.0 / (grid[1] // 2 + 1)
    for c in np.linspace(0.0, 0.95, 96):
        band = spectral_band(grid, float(c))
        assert band.rows == 1
        assert abs(band.compression - c) <= step / 2 + 1e-12, (grid, float(c), band)


@pytest.mark.parametrize("grid", [(34, 34), (33, 33), (1, 130), (1, 129), (64, 64)])
def test_compression_actually_discards_on_big_grids(grid):
    # A moderate request on a big grid must drop coefficients (not be rounded back to full).
    for c in (0.1, 0.25, 0.5, 0.75, 0.9):
        band = spectral_band(grid, c)
        assert not band.is_full
        assert band.compression > 0.0


@pytest.mark.parametrize("grid", GRIDS)
@pytest.mark.parametrize("c", [0.99, 0.999, 1.0 - 1e-12])
def test_dc_is_always_kept(grid, c):
    band = spectral_band(grid, c)
    assert band.rows >= 1 and band.cols >= 1 and band.kept >= 1
    assert band.compression < 1.0
    assert_consistent(band, grid)


def test_near_one_keeps_only_dc_on_big_grid():
    band = spectral_band((34, 34), 0.999)
    assert (band.half_rows, band.rows, band.cols, band.kept) == (0, 1, 1, 1)
    assert band.compression == pytest.approx(1 - 1 / (34 * 18))


def test_band_is_symmetric_box_and_nested():
    # Larger requested rates give sub-boxes of smaller ones (both sides shrink or stay).
    previous = spectral_band((34, 34), 0.0)
    for c in np.linspace(0.0, 0.99, 50):
        band = spectral_band((34, 34), float(c))
        assert band.half_rows <= previous.half_rows
        assert band.cols <= previous.cols
        previous = band


def test_one_dimensional_grid_keeps_its_single_row():
    for c in (0.0, 0.3, 0.7, 0.95):
        band = spectral_band((1, 64), c)
        assert band.rows == 1
        assert band.compression == pytest.approx(1 - band.cols / 33)


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(
    height=st.integers(1, 70),
    width=st.integers(1, 70),
    c=st.floats(0.0, 1.0, exclude_max=True, allow_nan=False),
)
def test_band_properties_hold_for_any_grid(height, width, c):
    grid = (height, width)
    band = spectral_band(grid, c)
    assert_consistent(band, grid)
    if c == 0.0:
        assert band.is_full


# A bad compression: tests/test_compression_edge.py (every entry point, spectral_band included).


@pytest.mark.parametrize(
    ("grid", "error"),
    [((0, 4), ValueError), ((4, 0), ValueError), ((-1, 3), ValueError), ((3,), TypeError)]
    + [((2, 3, 4), TypeError), ((2.0, 3), TypeError), ((True, 3), TypeError), ("34x34", TypeError)],
)
def test_invalid_grid_raises(grid, error):
    with pytest.raises(error, match="grid"):
        spectral_band(grid, 0.5)


def test_check_compression_returns_float():
    assert check_compression(0) == 0.0 and isinstance(check_compression(0), float)
    assert check_compression(0.25) == 0.25
    assert math.isclose(check_compression(np.float64(0.5)), 0.5)


@pytest.mark.parametrize(
    "module",
    [
        "lightning_bandlimit.functional.band",
        "lightning_bandlimit.functional.fft_conv",
        "lightning_bandlimit.functional.spectral_kernel",
        "lightning_bandlimit.functional.spectrum_split",
        "lightning_bandlimit.functional.geometry",
        "lightning_bandlimit.functional.dft_plan",
    ],
)
def test_module_doctests_pass(module):
    mod = importlib.import_module(module)
    result = doctest.testmod(mod, verbose=False, report=True)
    assert result.attempted > 0, f"{module} has no doctest examples"
    assert result.failed == 0, f"{result.failed} doctest(s) failed in {module}"
