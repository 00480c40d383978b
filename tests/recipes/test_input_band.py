"""The band a model's input layer keeps: exact projections, derived from the loaded model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from lightning_bandlimit.layers.band_limited import BandLimitedConv2d
from lightning_bandlimit.layers.surgery import bandlimit
from lightning_bandlimit.models import ImageClassifier
from lightning_bandlimit.recipes.threats.input_band import input_band

torch.set_default_dtype(torch.float32)


def _images(n: int, c: int, h: int, w: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, c, h, w, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_kept_and_dropped_are_complementary_orthogonal_projections() -> None:
    model = bandlimit(nn.Sequential(nn.Conv2d(3, 4, 3, padding=1)), 0.5).eval()
    band = input_band(model, (3, 12, 12))
    x, y = _images(2, 3, 12, 12), _images(2, 3, 12, 12, seed=1)
    kept, dropped = band.kept.project(x), band.dropped.project(x)
    assert torch.allclose(kept + dropped, x, atol=1e-12)
    assert torch.allclose(band.kept.project(kept), kept, atol=1e-12)  # idempotent
    assert torch.allclose(band.dropped.project(dropped), dropped, atol=1e-12)
    assert abs(float((kept * dropped).sum())) < 1e-9  # orthogonal parts
    # self-adjoint: <P x, y> == <x, P y>
    assert torch.allclose((band.dropped.project(x) * y).sum(), (x * band.dropped.project(y)).sum(), atol=1e-9)
    assert band.kept.dims + band.dropped.dims == 144
    assert 0 < band.dropped.dims < 144


def test_the_dropped_band_is_exactly_the_layers_null_space() -> None:
    """Against brute force: the layer's linear map (its Jacobian) has the dropped band as null space."""
    torch.manual_seed(0)
    layer = BandLimitedConv2d(1, 3, 3, padding=1, bias=False, compression=0.6).double().eval()
    band = input_band(nn.Sequential(layer), (1, 9, 9))
    jacobian = torch.autograd.functional.jacobian(
        lambda v: layer(v.view(1, 1, 9, 9)).flatten(), torch.zeros(81, dtype=torch.float64)
    )
    rank = int(torch.linalg.matrix_rank(jacobian, atol=1e-9))
    assert rank == band.kept.dims  # nothing kept is lost, nothing dropped is seen
    basis = band.dropped.project(torch.eye(81, dtype=torch.float64).view(81, 1, 9, 9)).view(81, 81)
    assert float((jacobian @ basis.T).abs().max()) < 1e-10


@pytest.mark.parametrize(
    ("kwargs", "size"),
    [
        ({"kernel_size": 3, "padding": 1}, (16, 16)),
        ({"kernel_size": 3, "padding": 1, "padding_mode": "reflect"}, (16, 16)),
        ({"kernel_size": 3, "padding": 1, "padding_mode": "circular"}, (16, 16)),
        ({"kernel_size": 3, "padding": 1, "padding_mode": "replicate"}, (12, 20)),
        ({"kernel_size": 5, "padding": 2, "stride": 2}, (16, 16)),
        ({"kernel_size": 7, "padding": 3, "stride": 2}, (20, 20)),
        ({"kernel_size": 1, "stride": 2}, (16, 16)),
        ({"kernel_size": 3}, (10, 14)),
    ],
)
def test_a_dropped_perturbation_does_not_reach_the_model(kwargs: dict, size: tuple[int, int]) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, **kwargs), nn.ReLU(), nn.Flatten(), nn.LazyLinear(4))
    model(torch.zeros(1, 3, *size))
    bandlimit(model, 0.6, pointwise=True).eval()
    band = input_band(model, (3, *size))
    assert band.dropped.dims > 0
    x = torch.rand(4, 3, *size)
    delta = band.dropped.project(_images(4, 3, *size)).float()
    kept = band.kept.project(_images(4, 3, *size)).float()
    with torch.no_grad():
        assert torch.allclose(model(x + 0.3 * delta), model(x), atol=1e-5)
        assert not torch.allclose(model(x + 0.3 * kept), model(x), atol=1e-3)


def test_image_classifier_with_normalisation_first() -> None:
    model = bandlimit(ImageClassifier("cifar_resnet18", width=2), 0.5).eval()
    band = input_band(model, (3, 32, 32), name="bl")
    # 32x32 padded to 34; c = 0.5 keeps |f| <= 12 on each axis: 25 of 32 dimensions per axis.
    assert (band.layer, band.kept.dims, band.dropped.dims) == ("backbone.0", 625, 399)
    assert band.box == (12 / 34, 12 / 34)
    assert "model 'bl' (input layer 'backbone.0'" in band.describe()
    x = torch.rand(4, 3, 32, 32)
    delta = band.dropped.project(_images(4, 3, 32, 32)).float()
    with torch.no_grad():
        assert torch.allclose(model(x + 0.1 * delta), model(x), atol=1e-5)


@pytest.mark.parametrize("compression", [0.0, None])
def test_a_full_spectrum_model_drops_nothing(compression: float | None) -> None:
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Flatten())
    if compression is not None:
        bandlimit(model, compression)
    band = input_band(model.eval(), (3, 8, 8))
    assert band.dropped.is_empty and band.kept.is_full and band.compression == 0.0
    x = _images(1, 3, 8, 8)
    assert torch.equal(band.kept.project(x), x)
    assert torch.equal(band.dropped.project(x), torch.zeros_like(x))


def test_only_the_first_convolution_counts() -> None:
    """A plain stem before band-limited layers: the model keeps every input frequency."""
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Conv2d(4, 4, 3, padding=1))
    model[1] = BandLimitedConv2d.from_conv(model[1], compression=0.5)
    band = input_band(model.eval(), (3, 8, 8))
    assert band.layer == "0" and band.dropped.is_empty


class _Roll(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.roll(x, 3, dims=-1)


class _Resize(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.interpolate(x, scale_factor=2)


@pytest.mark.parametrize(
    ("before", "message"),
    [
        (_Roll(), r"a perturbation in the band its input layer '1' drops changed that layer's output by"),
        (_Resize(), r"expected its input layer '1' to see the image's grid \(8, 8\), got \(16, 16\)"),
    ],
)
def test_pixel_mixing_before_the_input_layer_is_refused(before: nn.Module, message: str) -> None:
    model = nn.Sequential(before, BandLimitedConv2d(3, 4, 3, padding=1, compression=0.6), nn.Flatten()).eval()
    with pytest.raises(ValueError, match=message):
        input_band(model, (3, 8, 8), name="m")


def test_bad_input() -> None:
    with pytest.raises(ValueError, match=r"reached by a \(3, 8, 8\) image"):
        input_band(nn.Sequential(nn.Flatten(), nn.Linear(192, 2)).eval(), (3, 8, 8))
    with pytest.raises(ValueError, match=r"image_shape .*\(8, 8\)"):
        input_band(nn.Conv2d(3, 4, 3), (8, 8))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"image_shape\[0\] .*0"):
        input_band(nn.Conv2d(3, 4, 3), (0, 8, 8))
    with pytest.raises(TypeError, match=r"image_shape\[1\] .*8.0"):
        input_band(nn.Conv2d(3, 4, 3), (3, 8.0, 8))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"image_shape .*'3x8x8'"):
        input_band(nn.Conv2d(3, 4, 3), "3x8x8")  # type: ignore[arg-type]
    band = input_band(bandlimit(nn.Sequential(nn.Conv2d(3, 4, 3)), 0.5).eval(), (3, 8, 8))
    with pytest.raises(ValueError, match=r"size \(\.\.\., 8, 8\), got torch.float32 \(1, 3, 9, 9\)"):
        band.dropped.project(torch.zeros(1, 3, 9, 9))
    with pytest.raises(ValueError, match=r"model band .*'high'"):
        band.part("high")


def test_replicates_share_one_band_and_other_compressions_do_not() -> None:
    def make(c: float, seed: int) -> nn.Module:
        torch.manual_seed(seed)
        return bandlimit(nn.Sequential(nn.Conv2d(3, 4, 3, padding=1)), c).eval()

    a, b, c = (input_band(make(comp, seed), (3, 16, 16)) for comp, seed in ((0.5, 0), (0.5, 1), (0.8, 0)))
    assert a.same_as(b) and not a.same_as(c)
