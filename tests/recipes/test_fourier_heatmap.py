"""Tests of :mod:`lightning_bandlimit.recipes.evaluation.fourier_heatmap` (Yin et al. 2019 heat maps)."""

from __future__ import annotations

import math

import matplotlib
import numpy as np
import pytest
import torch
from tiny_task import BandFilter
from torch import nn

from lightning_bandlimit.recipes.evaluation.fourier_heatmap import (
    _canonical_bins,
    fourier_basis,
    fourier_heat_map,
    save_heat_map,
)
from lightning_bandlimit.recipes.threats.frequency_band import band_mask

SIZES = [(8, 8), (7, 5), (6, 9), (1, 4), (2, 2)]


def mirror(t: torch.Tensor) -> torch.Tensor:
    """``t[-i, -j]`` for every ``(i, j)``."""
    return torch.roll(torch.flip(t, (-2, -1)), (1, 1), (-2, -1))


def filtered_linear(band: tuple[float, float], shape: tuple[int, int, int] = (3, 8, 8)) -> nn.Module:
    torch.manual_seed(1)
    linear = nn.Linear(math.prod(shape), 10)
    with torch.no_grad():
        linear.weight.mul_(20.0)  # sensitive enough for eps ~ 4 to flip decisions
    return nn.Sequential(BandFilter(band), nn.Flatten(), linear).eval()


def grey_images(n: int = 16, shape: tuple[int, int, int] = (3, 8, 8)) -> torch.Tensor:
    """Images in [0.45, 0.55]: perturbations of L2 norm 2 on 8x8 (amplitude <= 0.36) are never clipped."""
    return 0.45 + 0.1 * torch.rand(n, *shape)


def labels_of(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(x).argmax(dim=1)


# --- fourier_basis -----------------------------------------------------------------------------


@pytest.mark.parametrize("size", SIZES)
def test_fourier_basis_is_real_unit_and_supported_on_a_hermitian_pair(size):
    height, width = size
    for i in range(height):
        for j in range(width):
            u = fourier_basis(height, width, i, j, dtype=torch.float64)
            assert u.shape == size and u.dtype == torch.float64
            assert u.norm().item() == pytest.approx(1.0, abs=1e-12)
            support = torch.zeros(size, dtype=torch.bool)
            support[i, j] = support[(-i) % height, (-j) % width] = True
            spectrum = torch.fft.fft2(u)
            if (~support).any():
                assert spectrum[~support].abs().max() < 1e-12
            assert spectrum[support].abs().min() > 0.1
            # U_ij == U_{-i,-j}
            torch.testing.assert_close(
                u, fourier_basis(height, width, (-i) % height, (-j) % width, dtype=torch.float64)
            )


def test_fourier_basis_self_mirrored_bins_are_single_cosines():
    for i, j in [(0, 0), (4, 0), (0, 4), (4, 4)]:
        u = fourier_basis(8, 8, i, j, dtype=torch.float64)
        torch.testing.assert_close(u.abs(), torch.full((8, 8), 1 / 8, dtype=torch.float64))
    assert torch.equal(fourier_basis(8, 8, 0, 0), torch.full((8, 8), 1 / 8))


def test_fourier_basis_default_dtype_and_values():
    u = fourier_basis(8, 8, 1, 0)
    assert u.dtype == torch.get_default_dtype()
    expected = torch.cos(2 * math.pi * torch.arange(8.0) / 8)[:, None].expand(8, 8) / math.sqrt(32)
    torch.testing.assert_close(u, expected)


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        ((0, 8, 0, 0), ValueError, r"height must be >= 1, got 0"),
        ((8, 8.0, 0, 0), TypeError, r"width must be an int >= 1, got 8.0"),
        ((8, 8, 8, 0), ValueError, r"i must be in \[0, 7\], got 8"),
        ((8, 6, 0, -1), ValueError, r"j must be in \[0, 5\], got -1"),
        ((8, 6, 0.0, 0), TypeError, r"i must be an int in \[0, 7\], got 0.0"),
    ],
)
def test_fourier_basis_rejects_invalid_arguments(args, error, match):
    with pytest.raises(error, match=match):
        fourier_basis(*args)


@pytest.mark.parametrize("size", SIZES)
def test_canonical_bins_cover_each_hermitian_pair_once(size):
    height, width = size
    bins = _canonical_bins(height, width)
    assert all(j <= width // 2 for _, j in bins)
    pairs = [frozenset({(i, j), ((-i) % height, (-j) % width)}) for i, j in bins]
    assert len(set(pairs)) == len(pairs)  # no pair twice
    covered = set().union(*pairs)
    assert covered == {(i, j) for i in range(height) for j in range(width)}


# --- fourier_heat_map --------------------------------------------------------------------------


def test_heat_map_shape_range_and_point_symmetry():
    model = filtered_linear((0.0, 1.0))
    x = grey_images()
    heat = fourier_heat_map(model, x, labels_of(model, x), eps=4.0, batch_size=64)
    assert heat.shape == (8, 8) and heat.dtype == torch.float64
    assert heat.min() >= 0.0 and heat.max() <= 1.0
    assert 0.0 < heat.mean() < 1.0  # not trivial: some frequencies fool the model, others do not
    uncentred = torch.fft.ifftshift(heat)
    assert torch.equal(uncentred, mirror(uncentred))
    # Error rates are fractions of the 16 images.
    assert torch.equal(heat * 16, (heat * 16).round())


def test_heat_map_is_deterministic_given_a_seed_and_independent_of_batch_size():
    model = filtered_linear((0.0, 1.0))
    x = grey_images()
    labels = labels_of(model, x)
    first = fourier_heat_map(model, x, labels, eps=4.0, batch_size=64, seed=3)
    assert torch.equal(first, fourier_heat_map(model, x, labels, eps=4.0, batch_size=64, seed=3))
    assert torch.equal(first, fourier_heat_map(model, x, labels, eps=4.0, batch_size=7, seed=3))
    assert not torch.equal(first, fourier_heat_map(model, x, labels, eps=4.0, batch_size=64, seed=4))


def test_heat_map_with_zero_eps_is_the_clean_error_everywhere():
    model = filtered_linear((0.0, 1.0))
    x = grey_images(8)
    labels = labels_of(model, x)
    labels[:2] = (labels[:2] + 1) % 10  # 2 of 8 misclassified
    heat = fourier_heat_map(model, x, labels, eps=0.0, batch_size=100)
    assert torch.equal(heat, torch.full((8, 8), 0.25, dtype=torch.float64))


def test_low_pass_model_is_immune_to_high_frequencies_of_the_map():
    model = filtered_linear((0.0, 0.5))  # discards the high band of its input
    x = grey_images(32)
    heat = fourier_heat_map(model, x, labels_of(model, x), eps=2.0, batch_size=128)
    assert heat.shape == (8, 8)
    high = torch.fft.fftshift(band_mask(8, 8, (0.5, 1.0)))  # centred, like the map
    assert high.any() and (~high).any()
    assert heat[high].max() == 0.0
    assert heat[~high].mean() > 0.1
    assert heat[~high].max() > 0.3
    # In the centred map the low frequencies sit in the middle, the high ones at the border.
    assert not high[4, 4] and high[0, 0]


def test_high_pass_model_shows_errors_only_at_high_frequencies():
    model = filtered_linear((0.5, 1.0))
    x = grey_images(32)
    heat = fourier_heat_map(model, x, labels_of(model, x), eps=2.0, batch_size=128)
    high = torch.fft.fftshift(band_mask(8, 8, (0.5, 1.0)))
    assert heat[~high].max() == 0.0
    assert heat[high].max() > 0.3


def test_heat_map_progress_bar(capsys):
    model = filtered_linear((0.0, 1.0))
    x = grey_images(4)
    fourier_heat_map(model, x, labels_of(model, x), batch_size=64, progress=True)
    assert "Fourier heat map" in capsys.readouterr().err
    fourier_heat_map(model, x, labels_of(model, x), batch_size=64)
    assert capsys.readouterr().err == ""


def test_heat_map_runs_without_gradients_and_keeps_eval_mode():
    model = filtered_linear((0.0, 1.0))
    seen = []
    model.register_forward_hook(
        lambda module, args, out: seen.append((torch.is_grad_enabled(), module.training))
    )
    x = grey_images(4)
    fourier_heat_map(model, x, labels_of(model, x), batch_size=64)
    assert seen and all(state == (False, False) for state in seen)


@pytest.mark.parametrize(
    ("change", "match"),
    [
        ({"train": True}, r"model must be in eval mode"),
        (
            {"images": torch.full((4, 3, 8, 8), 2.0)},
            r"images must lie in \[0, 1\], got values in \[2.0, 2.0\]",
        ),
        ({"images": torch.rand(3, 8, 8)}, r"images must be a floating tensor of shape \(N, C, H, W\)"),
        ({"images": torch.zeros(0, 3, 8, 8)}, r"at least one image"),
        ({"labels": torch.zeros(3, dtype=torch.long)}, r"labels must be an integer tensor of shape \(4,\)"),
        (
            {"labels": torch.zeros(4)},
            r"labels must be an integer tensor of shape \(4,\), got dtype torch.float32",
        ),
        ({"eps": -1.0}, r"eps .*-1.0"),
        ({"eps": math.nan}, r"eps .*nan"),
        ({"batch_size": 0}, r"batch_size .*0"),
        ({"seed": -1}, r"seed .*-1"),
    ],
)
def test_heat_map_rejects_invalid_inputs(change, match):
    model = filtered_linear((0.0, 1.0))
    if change.pop("train", False):
        model.train()
    kwargs = {"images": grey_images(4), "labels": torch.zeros(4, dtype=torch.long), **change}
    with pytest.raises(ValueError, match=match):
        fourier_heat_map(model, **kwargs)


@pytest.mark.parametrize(
    "change", [{"eps": True}, {"eps": "0.1"}, {"batch_size": 2.0}, {"seed": None}], ids=str
)
def test_heat_map_rejects_arguments_of_the_wrong_type(change):
    kwargs = {"images": grey_images(4), "labels": torch.zeros(4, dtype=torch.long), "eps": 0.1, **change}
    with pytest.raises(TypeError, match=next(iter(change))):
        fourier_heat_map(filtered_linear((0.0, 1.0)), **kwargs)


# --- save_heat_map -----------------------------------------------------------------------------


def test_save_heat_map_writes_png_and_round_tripping_npy(tmp_path):
    backend = matplotlib.get_backend()
    heat = torch.rand(8, 8, dtype=torch.float64)
    png, npy = tmp_path / "figs" / "deep" / "heat.png", tmp_path / "arrays" / "heat.npy"
    save_heat_map(heat, png, npy, title="Fourier heat map")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    loaded = np.load(npy)
    assert loaded.dtype == np.float64 and np.array_equal(loaded, heat.numpy())
    assert matplotlib.get_backend() == backend  # no global backend switch


def test_save_heat_map_without_npy(tmp_path):
    save_heat_map(torch.zeros(5, 7), str(tmp_path / "only.png"))
    assert (tmp_path / "only.png").stat().st_size > 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["only.png"]


@pytest.mark.parametrize("heat", [torch.rand(2, 4, 4), torch.rand(4), np.zeros((4, 4))])
def test_save_heat_map_rejects_non_2d_tensors(tmp_path, heat):
    with pytest.raises(ValueError, match=r"heat_map must be a 2-D tensor \(H, W\)"):
        save_heat_map(heat, tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()
