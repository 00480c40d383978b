"""Scaling rules for a changed world size, and the AdaScale / noise-scale estimators."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_bandlimit.strategies import (
    AdaScale,
    KeepGlobalBatch,
    LinearScaling,
    MomentumAwareScaling,
    NoScaling,
    SquareRootScaling,
    TrainingConfig,
    adascale_gain,
    apply_to_optimizer,
    default_rule,
    gradient_noise_statistics,
    read_optimizer,
)

SGD = TrainingConfig(world_size=2, per_device_batch=32, lr=0.2, momentum=0.9)
ADAM = TrainingConfig(world_size=2, per_device_batch=32, lr=1e-3, betas=(0.9, 0.999), eps=1e-8)


@pytest.mark.parametrize(("world", "k"), [(1, 0.5), (2, 1.0), (4, 2.0), (8, 4.0)])
def test_linear(world: int, k: float) -> None:
    new = LinearScaling(warmup_steps=3).adjust(SGD, world)
    assert new.lr == pytest.approx(SGD.lr * k) and new.momentum == SGD.momentum
    assert new.global_batch == SGD.global_batch * k
    assert new.warmup_samples == (3 * new.global_batch if k > 1 else 0)


def test_square_root() -> None:
    new = SquareRootScaling().adjust(ADAM, 8)  # k = 4
    assert new.lr == pytest.approx(2e-3) and new.eps == pytest.approx(5e-9)
    assert new.betas == pytest.approx((0.6, 0.996))
    huge = SquareRootScaling().adjust(ADAM, 64)  # k = 32 would make beta1 negative
    assert huge.betas[0] == 0.0 and 0 < huge.betas[1] < 1
    shrink = SquareRootScaling().adjust(ADAM, 1)  # k = 1/2
    assert shrink.betas == pytest.approx((0.95, 0.9995)) and shrink.lr == pytest.approx(1e-3 / math.sqrt(2))
    with pytest.raises(ValueError, match="betas"):
        SquareRootScaling().adjust(SGD, 4)


def test_keep_global_batch() -> None:
    ref = TrainingConfig(world_size=4, per_device_batch=32, accumulation=2, lr=0.1)
    for world, accumulation in [(1, 8), (2, 4), (8, 1)]:
        new = KeepGlobalBatch().adjust(ref, world)
        assert (new.accumulation, new.global_batch, new.lr) == (accumulation, 256, pytest.approx(0.1))
    odd = KeepGlobalBatch().adjust(ref, 3)  # 256 / 96 = 2.67 -> 3 micro-batches (288) is nearest
    assert odd.accumulation == 3 and odd.lr == pytest.approx(0.1 * 288 / 256)
    capped = KeepGlobalBatch(max_accumulation=4).adjust(ref, 1)  # would need 8
    assert capped.accumulation == 4 and capped.lr == pytest.approx(0.05)
    assert KeepGlobalBatch().adjust(ref, 16).accumulation == 1  # cannot go below one micro-batch


@settings(max_examples=60, deadline=None, derandomize=True)
@given(world=st.integers(1, 16), momentum=st.floats(0.5, 0.95))
def test_momentum_aware_keeps_the_noise_scale(world: int, momentum: float) -> None:
    ref = TrainingConfig(world_size=4, per_device_batch=16, lr=0.1, momentum=momentum)
    rule = MomentumAwareScaling(min_momentum=0.5, max_momentum=0.99)
    new = rule.adjust(ref, world)
    noise = lambda c: c.lr / (c.global_batch * (1 - c.momentum))  # noqa: E731
    assert noise(new) == pytest.approx(noise(ref), rel=1e-9)
    assert 0.5 <= new.momentum <= 0.99
    if 0.5 < 1 - (1 - momentum) * 4 / world < 0.99:  # within bounds: the LR is untouched
        assert new.lr == pytest.approx(0.1)


def test_momentum_aware_needs_momentum_and_valid_bounds() -> None:
    with pytest.raises(ValueError, match="momentum"):
        MomentumAwareScaling().adjust(ADAM, 4)
    with pytest.raises(ValueError, match="min_momentum"):
        MomentumAwareScaling(min_momentum=0.9, max_momentum=0.5)


def test_damping_shrinks_the_factor() -> None:
    full, half = LinearScaling().adjust(SGD, 8, damping=1.0), LinearScaling().adjust(SGD, 8, damping=0.5)
    assert full.lr == pytest.approx(0.8) and half.lr == pytest.approx(0.4)  # 4 ** 0.5 = 2
    assert LinearScaling().adjust(SGD, 8, damping=0.0).lr == pytest.approx(SGD.lr)  # the fallback: unscaled
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="damping"):
            LinearScaling().adjust(SGD, 8, damping=bad)
    with pytest.raises(ValueError, match="world_size"):
        LinearScaling().adjust(SGD, 0)


def test_config_validation() -> None:
    with pytest.raises(ValueError, match="world_size"):
        TrainingConfig(world_size=0, per_device_batch=1)
    with pytest.raises(ValueError, match="lr"):
        TrainingConfig(world_size=1, per_device_batch=1, lr=0.0)


def test_default_rule_and_optimizer_round_trip() -> None:
    p = torch.zeros(2, requires_grad=True)
    adam = torch.optim.Adam([p], lr=1e-3)
    sgd = torch.optim.SGD([{"params": [p]}, {"params": [], "lr": 0.02}], lr=0.2, momentum=0.9)
    assert default_rule(adam).name == "sqrt" and default_rule(sgd).name == "linear"
    old = read_optimizer(adam, world_size=2, per_device_batch=32, accumulation=1)
    new = SquareRootScaling().adjust(old, 8)
    apply_to_optimizer(adam, old, new)
    group = adam.param_groups[0]
    assert group["lr"] == pytest.approx(2e-3) and group["betas"] == pytest.approx((0.6, 0.996))
    assert read_optimizer(adam, 8, 32, 1).betas == pytest.approx(new.betas)
    old = read_optimizer(sgd, 2, 32, 1)
    apply_to_optimizer(sgd, old, MomentumAwareScaling().adjust(old, 4))
    assert [g["lr"] for g in sgd.param_groups] == pytest.approx([0.2, 0.02])
    assert sgd.param_groups[1]["momentum"] == pytest.approx(0.95)


def test_noise_statistics_are_unbiased_on_synthetic_gradients() -> None:
    g = torch.Generator().manual_seed(0)
    dim, b, ranks, trials = 50, 8, 4, 2000
    mean = torch.randn(dim, generator=g) * 0.3
    noise_std = 1.0  # per-sample gradient noise, per coordinate
    locals_ = mean + torch.randn(trials, ranks, dim, generator=g) * noise_std / math.sqrt(b)
    local_sq = (locals_**2).sum(-1).mean(1)
    global_sq = (locals_.mean(1) ** 2).sum(-1)
    sigma2, mu2 = zip(
        *(gradient_noise_statistics(float(lq), float(gq), ranks) for lq, gq in zip(local_sq, global_sq))
    )
    assert sum(mu2) / trials == pytest.approx(float((mean**2).sum()), rel=0.05)
    assert sum(sigma2) / trials == pytest.approx(dim * noise_std**2 / b, rel=0.05)
    with pytest.raises(ValueError, match="scale"):
        gradient_noise_statistics(1.0, 1.0, 1)


def test_adascale_gain_bounds_and_monotonicity() -> None:
    gains = [adascale_gain(sigma2=s, mu2=1.0, scale=8) for s in (0.0, 0.5, 2.0, 8.0, 100.0)]
    assert gains[0] == 1.0 and all(a < b for a, b in zip(gains, gains[1:])) and gains[-1] <= 8.0
    assert adascale_gain(1.0, -0.1, 8) == 8.0 and adascale_gain(-1.0, 1.0, 8) == 1.0
    assert adascale_gain(1.0, 1.0, 1) == 1.0  # no scaling, no gain


@pytest.mark.parametrize("rule", [LinearScaling(warmup_steps=0), MomentumAwareScaling()])
def test_launch_accumulation_is_part_of_the_scale(rule) -> None:  # type: ignore[no-untyped-def]
    by_devices = rule.adjust(SGD, 4)  # k = 2 from two more processes
    by_accumulation = rule.adjust(SGD, 2, accumulation=2)  # k = 2 simulated with accumulation
    assert by_accumulation.lr == pytest.approx(by_devices.lr) and by_accumulation.momentum == pytest.approx(
        by_devices.momentum
    )
    assert by_accumulation.accumulation == 2 and by_accumulation.global_batch == by_devices.global_batch


def test_keep_global_batch_ignores_the_launch_accumulation() -> None:
    assert KeepGlobalBatch().adjust(SGD, 1, accumulation=4).accumulation == 2


@pytest.mark.parametrize("rule", [NoScaling(), AdaScale()])
def test_rules_that_keep_the_hyperparameters(rule) -> None:  # type: ignore[no-untyped-def]
    new = rule.adjust(SGD, 8)
    assert (new.lr, new.momentum, new.world_size, new.global_batch) == (
        SGD.lr,
        SGD.momentum,
        8,
        4 * SGD.global_batch,
    )


def test_adascale_gain_below_scale_one() -> None:
    assert adascale_gain(1.0, 1.0, 0.5) == pytest.approx(2 / 3)
    assert 0.25 <= adascale_gain(100.0, 0.01, 0.25) <= 1.0
    with pytest.raises(ValueError, match="scale"):
        adascale_gain(1.0, 1.0, 0)
    with pytest.raises(ValueError, match="smoothing"):
        AdaScale(smoothing=0)
