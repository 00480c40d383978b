"""The scenario's lever changes count what a job's steps ran with (``benchmarks/cotrain.py``)."""

import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from cotrain import _changes, _reversals  # noqa: E402


def _job(*steps: tuple[int, int, float]) -> SimpleNamespace:
    """A job whose steps ran at (rung as reported, units checkpointed, compression)."""
    timeline = [{"rung": r, "checkpointed_units": u, "compression": c} for r, u, c in steps]
    return SimpleNamespace(timeline=timeline)


def test_a_first_step_profiled_checkpointed_is_not_a_change() -> None:
    # a newcomer's first step runs with every unit checkpointed while its rung still reads 0
    arrival = _job((0, 8, 0.0), (4, 8, 0.0), (4, 8, 0.0), (0, 0, 0.0))
    assert _changes(arrival) == 1 and _reversals(arrival) == 0


def test_climbs_releases_and_compressions_count_and_reversals_are_direction_changes() -> None:
    job = _job((0, 0, 0.0), (2, 4, 0.0), (4, 8, 0.0), (4, 8, 0.3), (4, 8, 0.0), (0, 0, 0.0), (4, 8, 0.0))
    assert _changes(job) == 6
    assert _reversals(job) == 2  # up, up, up, down, down, up: two turns
