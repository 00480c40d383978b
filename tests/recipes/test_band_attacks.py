"""Tests of :mod:`lightning_bandlimit.recipes.threats.band_attacks` (band-restricted PGD and noise)."""

from __future__ import annotations

import math

import pytest
import torch
import torchattacks
from tiny_task import BandFilter
from torch import nn

from lightning_bandlimit.recipes.threats.band_attacks import BandNoise, BandPGD
from lightning_bandlimit.recipes.threats.frequency_band import band_mask

SHAPE = (3, 16, 16)
BUDGETS = {"Linf": 8 / 255, "L2": 0.5}


def filtered_linear(band: tuple[float, float], dtype: torch.dtype = torch.float32) -> nn.Module:
    """A linear classifier on the ``band`` of its input: it sees nothing outside the band."""
    return nn.Sequential(BandFilter(band), nn.Flatten(), nn.Linear(math.prod(SHAPE), 10)).to(dtype).eval()


def images(n: int = 16, dtype: torch.dtype = torch.float32, saturated: bool = False) -> torch.Tensor:
    x = 0.1 + 0.8 * torch.rand(n, *SHAPE, dtype=dtype)
    if saturated:  # a few pixels exactly at 0 and 1
        x = torch.where(torch.rand_like(x) < 0.01, torch.zeros_like(x), x)
        x = torch.where(torch.rand_like(x) < 0.01, torch.ones_like(x), x)
    return x


def predictions(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(x).argmax(dim=1)


def accuracy(model: nn.Module, x: torch.Tensor, labels: torch.Tensor) -> float:
    return (predictions(model, x) == labels).double().mean().item()


def out_of_band_energy(delta: torch.Tensor, band: tuple[float, float]) -> float:
    """Fraction of the perturbation's spectral energy outside ``band`` (0 for a zero perturbation)."""
    spectrum = torch.fft.fft2(delta.double()).abs() ** 2
    total = spectrum.sum().item()
    outside = spectrum[..., ~band_mask(*delta.shape[-2:], band)].sum().item()
    return outside / total if total > 0 else 0.0


def per_sample_norm(delta: torch.Tensor, norm: str) -> torch.Tensor:
    flat = delta.flatten(1)
    return flat.abs().amax(dim=1) if norm == "Linf" else flat.norm(dim=1)


# --- BandPGD -----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("norm", ["Linf", "L2"])
@pytest.mark.parametrize("band", [(0.5, 1.0), (0.0, 0.25), (0.25, 0.5)])
@pytest.mark.parametrize("saturated", [False, True])
def test_band_pgd_perturbation_is_in_band_ball_and_box(dtype, norm, band, saturated):
    model = filtered_linear((0.0, 1.0), dtype)
    x = images(8, dtype, saturated)
    labels = predictions(model, x)
    eps = BUDGETS[norm]
    adv = BandPGD(model, eps=eps, alpha=eps / 4, steps=5, band=band, norm=norm)(x, labels)
    assert adv.shape == x.shape and adv.dtype == dtype
    delta = adv - x
    assert out_of_band_energy(delta, band) < (1e-10 if dtype == torch.float64 else 1e-6)
    assert (per_sample_norm(delta, norm) <= eps * (1 + 1e-6)).all()
    assert adv.min() >= 0.0 and adv.max() <= 1.0
    if not saturated:  # without saturated pixels the attack uses the budget
        assert (per_sample_norm(delta, norm) > 0.5 * eps).all()


@pytest.mark.parametrize("norm", ["Linf", "L2"])
def test_band_pgd_uses_most_of_the_budget_on_unclipped_images(norm):
    # Guards the alternating projections: a plain scalar shrink into the box uses ~20% of it.
    model = filtered_linear((0.0, 1.0))
    x = torch.rand(16, *SHAPE)  # pixels near 0 and 1 make the box bind
    eps = BUDGETS[norm]
    delta = (
        BandPGD(model, eps=eps, alpha=eps / 4, steps=5, band="high", norm=norm)(x, predictions(model, x)) - x
    )
    assert per_sample_norm(delta, norm).mean() > 0.9 * eps


@pytest.mark.parametrize("norm", ["Linf", "L2"])
@pytest.mark.parametrize("random_start", [True, False])
def test_band_pgd_with_zero_eps_returns_the_inputs(norm, random_start):
    model = filtered_linear((0.0, 1.0))
    x = images(4)
    adv = BandPGD(model, eps=0.0, steps=3, norm=norm, random_start=random_start)(x, predictions(model, x))
    assert torch.equal(adv, x)


@pytest.mark.parametrize("norm", ["Linf", "L2"])
def test_band_pgd_fools_a_model_that_reads_the_band(norm):
    model = filtered_linear((0.5, 1.0))  # decisions depend only on high frequencies
    x = images(32)
    labels = predictions(model, x)
    assert accuracy(model, x, labels) == 1.0
    eps = BUDGETS[norm]
    adv = BandPGD(model, eps=eps, alpha=eps / 4, steps=10, band="high", norm=norm)(x, labels)
    assert accuracy(model, adv, labels) < 0.5
    # random band-limited noise at the same budget does far less
    noisy = BandNoise(model, eps=eps, band="high", norm=norm, seed=0)(x)
    assert accuracy(model, noisy, labels) > accuracy(model, adv, labels) + 0.3


@pytest.mark.parametrize("norm", ["Linf", "L2"])
def test_high_band_pgd_cannot_touch_a_low_pass_model_but_full_pgd_can(norm):
    model = filtered_linear((0.0, 0.5))  # zeros out the high band before classifying
    x = images(32)
    labels = predictions(model, x)
    eps = BUDGETS[norm]
    adv = BandPGD(model, eps=eps, alpha=eps / 4, steps=10, band=(0.5, 1.0), norm=norm)(x, labels)
    assert (per_sample_norm(adv - x, norm) > 0).all()  # the random start did perturb the images
    with torch.no_grad():
        assert (model(adv) - model(x)).abs().max() < 1e-4
    assert torch.equal(predictions(model, adv), labels)
    # Without a random start no step is taken at all: the band gradient is below rounding noise.
    still = BandPGD(model, eps=eps, alpha=eps / 4, steps=10, band="high", norm=norm, random_start=False)
    assert torch.equal(still(x, labels), x)
    # The same budget over the full spectrum does hurt: the band attack's "robustness" is an artefact.
    full = torchattacks.PGD(model, eps=eps, alpha=eps / 4, steps=10)
    if norm == "L2":
        full = torchattacks.PGDL2(model, eps=eps, alpha=eps / 4, steps=10)
    assert accuracy(model, full(x, labels), labels) < 0.5


def test_full_band_linf_pgd_matches_torchattacks_pgd():
    model = filtered_linear((0.0, 1.0), torch.float64)
    x = images(8, torch.float64, saturated=True)
    labels = predictions(model, x)
    ours = BandPGD(model, eps=8 / 255, alpha=2 / 255, steps=5, band="full", random_start=False)(x, labels)
    theirs = torchattacks.PGD(model, eps=8 / 255, alpha=2 / 255, steps=5, random_start=False)(x, labels)
    torch.testing.assert_close(ours, theirs, atol=1e-12, rtol=0)


def test_band_pgd_targeted_mode_moves_towards_the_targets():
    model = filtered_linear((0.5, 1.0))
    x = images(32)
    labels = predictions(model, x)
    targets = (labels + 1) % 10
    attack = BandPGD(model, eps=16 / 255, alpha=4 / 255, steps=10, band="high")
    attack.set_mode_targeted_by_label(quiet=True)
    adv = attack(x, targets)
    assert (predictions(model, adv) == targets).double().mean() > 0.5
    assert out_of_band_energy(adv - x, (0.5, 1.0)) < 1e-6


def test_band_pgd_records_its_threat_model_and_restores_train_mode():
    model = filtered_linear((0.0, 1.0)).train()
    attack = BandPGD(model, band="mid", norm="L2", eps=0.25, steps=2)
    assert attack.band == (0.25, 0.5)
    assert (attack.norm, attack.eps, attack.attack) == ("L2", 0.25, "BandPGD")
    assert attack.supported_mode == ["default", "targeted"]
    assert "band=(0.25, 0.5)" in repr(attack)
    x = images(2)
    attack(x, torch.zeros(2, dtype=torch.long))
    assert model.training


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"eps": -0.1}, ValueError, r"eps .*-0.1"),
        ({"eps": math.inf}, ValueError, r"eps .*inf"),
        ({"eps": "8/255"}, TypeError, r"eps .*'8/255'"),
        ({"alpha": 0.0}, ValueError, r"alpha .*0.0"),
        ({"alpha": True}, TypeError, r"alpha .*True"),
        ({"steps": -1}, ValueError, r"steps .*-1"),
        ({"steps": 2.0}, TypeError, r"steps .*2.0"),
        ({"norm": "L1"}, ValueError, r"norm .*'L1'"),
        ({"band": (0.7, 0.2)}, ValueError, r"low < high .*\(0.7, 0.2\)"),
        ({"band": "ultra"}, ValueError, r"'ultra'"),
        ({"random_start": 1}, TypeError, r"random_start .*1"),
        ({"projection_rounds": -2}, ValueError, r"projection_rounds .*-2"),
    ],
)
def test_band_pgd_rejects_invalid_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        BandPGD(filtered_linear((0.0, 1.0)), **kwargs)


@pytest.mark.parametrize("attack_class", [BandPGD, BandNoise])
@pytest.mark.parametrize(
    ("x", "match"),
    [
        (torch.full((2, *SHAPE), 1.5), r"images must lie in \[0, 1\], got values in \[1.5, 1.5\]"),
        (torch.full((2, *SHAPE), math.nan), r"images must lie in \[0, 1\]"),
        (torch.zeros(2, *SHAPE, dtype=torch.uint8), r"floating tensor of shape \(N, ..., H, W\), got dtype"),
        (torch.rand(16, 16), r"floating tensor of shape \(N, ..., H, W\), got dtype torch.float32 and shape"),
    ],
)
def test_attacks_reject_invalid_images(attack_class, x, match):
    attack = attack_class(filtered_linear((0.0, 1.0)))
    with pytest.raises(ValueError, match=match):
        attack(x, torch.zeros(len(x), dtype=torch.long))


# --- BandNoise ---------------------------------------------------------------------------------


@pytest.mark.parametrize("norm", ["Linf", "L2"])
@pytest.mark.parametrize("distribution", ["gaussian", "uniform"])
@pytest.mark.parametrize("band", [(0.5, 1.0), (0.0, 0.25), (0.1, 0.3)])
def test_band_noise_has_the_exact_budget_and_band(norm, distribution, band):
    x = torch.full((8, *SHAPE), 0.5, dtype=torch.float64)  # nothing can leave [0, 1]
    eps = BUDGETS[norm]
    attack = BandNoise(filtered_linear((0.0, 1.0)), eps=eps, band=band, norm=norm, distribution=distribution)
    delta = attack(x) - x
    torch.testing.assert_close(per_sample_norm(delta, norm), torch.full((8,), eps, dtype=torch.float64))
    assert out_of_band_energy(delta, band) < 1e-10


@pytest.mark.parametrize("norm", ["Linf", "L2"])
@pytest.mark.parametrize("band", ["low", "mid", "high"])
def test_band_noise_stays_in_the_box_and_band_when_clipping_would_happen(norm, band):
    x = images(16, saturated=True)
    eps = BUDGETS[norm]
    adv = BandNoise(filtered_linear((0.0, 1.0)), eps=eps, band=band, norm=norm, seed=1)(x)
    delta = adv - x
    assert adv.min() >= 0.0 and adv.max() <= 1.0
    assert (per_sample_norm(delta, norm) <= eps * (1 + 1e-6)).all()
    assert out_of_band_energy(delta, band) < 1e-6


@pytest.mark.parametrize("norm", ["Linf", "L2"])
def test_band_noise_keeps_most_of_the_budget_on_unclipped_images(norm):
    # Nearly every uniform random image has a pixel within eps of 0 or 1, so the raw noise
    # rarely fits; the reshaped noise must still use (nearly) all of the budget.
    x = torch.rand(16, *SHAPE)
    eps = BUDGETS[norm]
    delta = BandNoise(filtered_linear((0.0, 1.0)), eps=eps, band="mid", norm=norm, seed=0)(x) - x
    assert per_sample_norm(delta, norm).mean() > 0.9 * eps


def test_band_noise_is_deterministic_given_a_seed():
    model = filtered_linear((0.0, 1.0))
    x = images(4)
    first, second = BandNoise(model, seed=7), BandNoise(model, seed=7)
    a1, a2 = first(x), first(x)
    assert torch.equal(a1, second(x)) and torch.equal(a2, second(x))  # the same sequence
    assert not torch.equal(a1, a2)  # fresh noise on every call
    assert not torch.equal(a1, BandNoise(model, seed=8)(x))
    torch.manual_seed(3)
    global_rng = BandNoise(model)(x)
    torch.manual_seed(3)
    assert torch.equal(global_rng, BandNoise(model)(x))


def test_band_noise_distributions_differ():
    model = filtered_linear((0.0, 1.0))
    x = images(4)
    gaussian = BandNoise(model, seed=0, distribution="gaussian")(x)
    uniform = BandNoise(model, seed=0, distribution="uniform")(x)
    assert not torch.equal(gaussian, uniform)


def test_band_noise_with_zero_eps_returns_the_inputs():
    x = images(4)
    assert torch.equal(BandNoise(filtered_linear((0.0, 1.0)), eps=0.0, seed=0)(x), x)


def test_band_noise_records_its_threat_model():
    attack = BandNoise(filtered_linear((0.0, 1.0)), band="low", norm="L2", eps=1.0, seed=3)
    assert (attack.band, attack.norm, attack.eps, attack.seed) == ((0.0, 0.25), "L2", 1.0, 3)
    assert attack.supported_mode == ["default"]
    with pytest.raises(ValueError, match="Targeted mode is not supported"):
        attack.set_mode_targeted_by_label(quiet=True)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"distribution": "laplace"},
            ValueError,
            r"distribution .*'laplace'",
        ),
        ({"norm": "linf"}, ValueError, r"norm .*'linf'"),
        ({"eps": -1}, ValueError, r"eps .*-1"),
        ({"seed": -1}, ValueError, r"seed .*-1"),
        ({"seed": 1.5}, TypeError, r"seed .*1.5"),
        ({"band": (0.0, 2.0)}, ValueError, r"low < high .*2.0"),
        ({"projection_rounds": 0.5}, TypeError, r"projection_rounds .*0.5"),
    ],
)
def test_band_noise_rejects_invalid_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        BandNoise(filtered_linear((0.0, 1.0)), **kwargs)


# --- composition -------------------------------------------------------------------------------


def test_attacks_compose_with_multiattack():
    model = filtered_linear((0.5, 1.0))
    x = images(32)
    labels = predictions(model, x)
    pgd = BandPGD(model, eps=8 / 255, alpha=2 / 255, steps=10, band="high")
    noise = BandNoise(model, eps=8 / 255, band="high", seed=0)
    multi = torchattacks.MultiAttack([noise, pgd])
    adv = multi(x, labels)
    assert adv.shape == x.shape and adv.min() >= 0.0 and adv.max() <= 1.0
    delta = adv - x
    assert out_of_band_energy(delta, (0.5, 1.0)) < 1e-6
    assert (per_sample_norm(delta, "Linf") <= 8 / 255 + 1e-6).all()
    assert accuracy(model, adv, labels) < 0.5
    assert [a.band for a in multi.attacks] == [(0.5, 1.0), (0.5, 1.0)]
