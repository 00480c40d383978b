"""The ladder judges a setting by what it changes, not by the job's own drift (issue 55).

A simulated job, step by step, as ``AdaptiveBandLimit`` feeds its controller (a check every
step): its peak is what it holds between steps (its baseline, which grows: a data cache filling
through the first epoch, a jump when the validation set is cached) plus its rung's increment; a
co-tenant jumps from 41 to 201 MiB within one step while the baseline still grows. The figures
are the main job's (``tests``' numbers from its timeline: increments 148.6, 100.6 and 90.6 MiB on
rungs 0-2, stages keeping 48, 24, 12 and 6 MiB, a baseline growing 3.5 MiB a step to step 32).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from lightning_bandlimit.ladder import LadderController, Setting
from lightning_bandlimit.memory.protocol import MemoryReading
from lightning_bandlimit.utils.units import MIB

INCREMENTS = [150.0, 100.0, 90.0, 84.0, 81.0]  # MiB per rung: rungs 3 and 4 free 6 and 3 more
STAGES = [48.0, 24.0, 12.0, 6.0]  # MiB each stage keeps for backward
JUMP, LEAVE, STEPS = 26, 68, 96
BUDGET = 1284.0  # MiB: rung 2 needed once the baseline has grown, rung 1 before


def _cotenant(step: int) -> float:
    return 201.0 if JUMP <= step < LEAVE else 41.0


def linear_then_flat(step: int) -> float:
    """The job's baseline, MiB: the optimizer's state after step 1, then 3.5 MiB a step to step 32."""
    return 845.0 if step == 1 else 869.0 + 3.5 * (min(step, 32) - 2)


def with_a_step(step: int) -> float:
    """As :func:`linear_then_flat`, and 8 MiB more from step 33 (the validation set cached; less
    than the 12 MiB the ladder keeps free, which a jump of the job's own must fit in)."""
    return linear_then_flat(step) + (8.0 if step >= 33 else 0.0)


def _run(baseline: Callable[[int], float], with_base: bool = True) -> tuple[list[tuple], LadderController]:
    """The job over the run: (step, rung, compression, over budget) per step, and its controller."""
    ladder = LadderController(rungs=4, min_free=12 * MIB, release_free=75 * MIB, max_compression=0.9)
    ladder.on_stages_measured([s * MIB for s in STAGES])
    current, steps = Setting(0, 0.0), []
    for step in range(1, STEPS + 1):
        base = baseline(step)
        increment = INCREMENTS[current.rung] * (1 - current.compression) + (25.0 if step == 1 else 0.0)
        peak = base + increment
        used = peak + _cotenant(step)
        steps.append((step, current.rung, current.compression, used > BUDGET))
        ladder.observe(current, peak * MIB, base * MIB if with_base else None)
        free = max(0.0, BUDGET - used) * MIB
        reading = MemoryReading(total=int(BUDGET * MIB), free=int(free), source="scripted")
        current = ladder.decide(reading, current).setting
    return steps, ladder


@pytest.mark.parametrize("baseline", [linear_then_flat, with_a_step])
def test_a_growing_baseline_takes_exact_rungs_only(baseline: Callable[[int], float]) -> None:
    steps, ladder = _run(baseline)
    assert all(c == 0.0 for _, _, c, _ in steps), "no compression: the exact rungs absorb the co-tenant"
    assert [s for s, *_, over in steps if over] == [JUMP], "over budget only on the jump's own step"
    assert ladder.idle_from() is None and ladder.top == 4, "no rung that frees memory judged idle"
    assert max(r for _, r, _, _ in steps) >= 2  # the baseline's growth needed a second rung
    assert steps[-1][1:3] == (0, 0.0)  # everything given back after the co-tenant left


def test_the_same_job_judged_by_its_whole_peak_compresses() -> None:
    # The trace is a real test: learning each rung from the whole peak (the baseline not
    # measured), rung 2, measured after the step, reads no lower than rung 1 measured before it,
    # is judged idle, and the ladder compresses.
    steps, ladder = _run(with_a_step, with_base=False)
    assert ladder.top < 2
    assert any(c > 0 for _, _, c, _ in steps)


def test_learned_peaks_move_with_the_baseline_and_predictions_with_them() -> None:
    ladder = LadderController(rungs=2, min_free=100)
    ladder.observe(Setting(0, 0.0), 1500, base=1000)
    ladder.observe(Setting(1, 0.0), 1300, base=1000)
    ladder.observe(Setting(1, 0.0), 1400, base=1100)  # the job's baseline grew 100: rung 1 the same
    assert ladder.predict(Setting(0, 0.0)) == 1600  # rung 0's increment, on today's baseline
    assert ladder.predict(Setting(1, 0.0)) == 1400
    assert ladder.peak_noise == 0  # the increment did not move: no noise either
    assert ladder.state_dict()["baseline"] == 1100


@pytest.mark.parametrize(("with_base", "surprise"), [(True, 0.0), (False, 100.0)])
def test_a_surprise_is_of_the_increment_not_of_the_baseline_growth(with_base: bool, surprise: float) -> None:
    ladder = LadderController(rungs=2, min_free=100, margin=0.0)
    ladder.on_stages_measured([300.0, 100.0])
    ladder.observe(Setting(1, 0.0), 1200, base=1000)
    ladder.observe(Setting(0, 0.0), 1500, base=1000)
    short = MemoryReading(total=2000, free=50, source="scripted")
    assert ladder.decide(short, Setting(0, 0.0)).setting == Setting(1, 0.0)  # predicted at 1200
    ladder.observe(Setting(1, 0.0), 1400, base=1200 if with_base else None)  # the baseline grew 200
    assert ladder.surprise(Setting(1, 0.0)) == surprise  # judged by the whole peak: 100 (averaged)


def test_the_baseline_survives_a_checkpoint_and_rebases_what_was_learned() -> None:
    ladder = LadderController(rungs=1, min_free=100)
    ladder.observe(Setting(0, 0.0), 1500, base=1000)
    resumed = LadderController(rungs=1, min_free=100)
    resumed.load_state_dict(ladder.state_dict())
    assert resumed.baseline == 1000
    resumed.observe(Setting(1, 0.0), 1100, base=800)  # a restarted process holds less
    assert resumed.predict(Setting(0, 0.0)) == 1300
