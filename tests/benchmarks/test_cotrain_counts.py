"""The scenario's lever changes count what a job's steps ran with (``benchmarks/tenants/cotrain.py``)."""

from types import SimpleNamespace

from benchmarks.tenants.cotrain import count_changes, count_reversals


def _job(*steps: tuple[int, int, float]) -> SimpleNamespace:
    """A job whose steps ran at (rung as reported, units checkpointed, compression)."""
    timeline = [{"rung": r, "checkpointed_units": u, "compression": c} for r, u, c in steps]
    return SimpleNamespace(timeline=timeline)


def test_a_first_step_profiled_checkpointed_is_not_a_change() -> None:
    # a newcomer's first step runs with every unit checkpointed while its rung still reads 0
    arrival = _job((0, 8, 0.0), (4, 8, 0.0), (4, 8, 0.0), (0, 0, 0.0))
    assert count_changes(arrival) == 1 and count_reversals(arrival) == 0


def test_climbs_releases_and_compressions_count_and_reversals_are_direction_changes() -> None:
    job = _job((0, 0, 0.0), (2, 4, 0.0), (4, 8, 0.0), (4, 8, 0.3), (4, 8, 0.0), (0, 0, 0.0), (4, 8, 0.0))
    assert count_changes(job) == 6
    assert count_reversals(job) == 2  # up, up, up, down, down, up: two turns
