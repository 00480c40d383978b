"""StabilityGuard: the decision alone (the rollback itself is tested with real processes)."""

import math

import pytest

from lightning_bandlimit.strategies import StabilityGuard


def _guard(**kwargs: float) -> StabilityGuard:
    guard = StabilityGuard(window=8, patience=3, **kwargs)  # type: ignore[arg-type]
    for i in range(40):
        guard.record(1.0 + 0.05 * math.sin(i))  # a noisy plateau around 1
    guard.start()
    return guard


def test_noise_and_a_falling_loss_are_stable() -> None:
    guard = _guard()
    verdicts = [guard.record(loss) for loss in [1.04, 0.97, 1.05, 0.9, 0.95, 0.8, 0.85, 0.7]]
    assert verdicts == ["watching"] * 7 + ["stable"] and not guard.watching
    assert list(guard.trend)[-1] == 0.7  # the probation's losses join the trend


def test_a_rising_loss_diverges_after_patience() -> None:
    guard = _guard()
    assert [guard.record(loss) for loss in [3.0, 3.0, 3.0]] == ["watching", "watching", "diverged"]


def test_a_non_finite_loss_diverges_at_once() -> None:
    guard = _guard()
    assert guard.record(float("nan")) == "diverged"
    guard.start()
    assert guard.record(float("inf")) == "diverged"


def test_the_threshold_follows_the_spread_of_the_trend() -> None:
    noisy = StabilityGuard(window=8, patience=3, tolerance=1.1)
    for i in range(40):
        noisy.record(1.0 + (0.5 if i % 2 else -0.5))  # robust sigma about 0.74
    noisy.start()
    assert [noisy.record(1.6) for _ in range(3)][-1] == "watching"  # inside median + 4 sigma
    calm = _guard(tolerance=1.1)
    assert [calm.record(1.6) for _ in range(3)][-1] == "diverged"


def test_without_a_trend_only_non_finite_losses_count() -> None:
    guard = StabilityGuard(window=3, patience=1)
    guard.start()
    assert [guard.record(x) for x in [10.0, 100.0, 1000.0]] == ["watching", "watching", "stable"]


def test_damping_schedule_and_state_round_trip() -> None:
    guard = StabilityGuard(max_retries=2, damping_factor=0.5)
    assert [guard.damping(r) for r in range(4)] == [1.0, 0.5, 0.25, 0.0]
    for x in [1.0, 2.0, 3.0]:
        guard.record(x)
    other = StabilityGuard()
    other.load_state_dict(guard.state_dict())
    assert list(other.trend) == [1.0, 2.0, 3.0]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"window": 0},
        {"patience": 0},
        {"window": 2, "patience": 3},
        {"tolerance": 1.0},
        {"spread": -1.0},
        {"max_retries": -1},
        {"damping_factor": 1.0},
    ],
)
def test_argument_checks(kwargs: dict) -> None:
    with pytest.raises(ValueError, match="must be"):
        StabilityGuard(**kwargs)
