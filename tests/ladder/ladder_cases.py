"""Ladders the tests of :mod:`lightning_bandlimit.ladder` start from, and readings to feed them."""

from lightning_bandlimit.ladder import Decision, LadderController, Setting
from lightning_bandlimit.memory.protocol import MemoryReading

TOTAL = 10_000
FLOOR = Setting(0, 0.0)
SAVINGS = [300, 200, 100, 50]  # bytes each of 4 stages frees, highest resolution first
# with the job at 5000 bytes on rung 0: rungs 0..4 need 5000, 4700, 4500, 4400, 4350


def _reading(free: int, total: int = TOTAL) -> MemoryReading:
    return MemoryReading(total=total, free=free, source="scripted")


def _ladder(**kwargs: object) -> LadderController:
    defaults = {
        "rungs": 4,
        "min_free": 1000,
        "release_free": 2000,
        "raise_step": 0.2,
        "lower_step": 0.1,
        "release_checks": 2,
        "cooldown_checks": 1,
        "margin": 0.0,
        "max_compression": 0.8,
    }
    return LadderController(**{**defaults, **kwargs})


def _known(**kwargs: object) -> LadderController:
    """A 4-rung ladder that measured the job's memory on every rung (the stages' saved bytes
    :data:`SAVINGS` are given too; they judge idle rungs, they predict nothing)."""
    ladder = _ladder(**kwargs)
    ladder.on_stages_measured(SAVINGS)
    for rung in range(4, -1, -1):
        ladder.observe(Setting(rung, 0.0), 5000 - sum(SAVINGS[:rung]))
    return ladder


def _rung0(**kwargs: object) -> LadderController:
    """A 4-rung ladder that measured rung 0 only (5000 bytes) and knows the stages' saved bytes."""
    ladder = _ladder(**kwargs)
    ladder.on_stages_measured(SAVINGS)
    ladder.observe(FLOOR, 5000)
    return ladder


def _learned(**kwargs: object) -> LadderController:
    """:func:`_known` that also learned rung 0's memory versus compression: 5000 - 4000 c."""
    ladder = _known(**kwargs)
    ladder.observe(Setting(0, 0.5), 3000)
    return ladder


def _run(ladder: LadderController, frees: list[int], start: Setting = FLOOR) -> list[Decision]:
    setting, decisions = start, []
    for free in frees:
        decision = ladder.decide(_reading(free), setting)
        setting = decision.setting
        decisions.append(decision)
    return decisions
