"""StragglerDetector: a rank slower than the others' median for slow_steps steps, reported once."""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence

import pytest

from lightning_bandlimit.health.stragglers import Straggler, StragglerDetector

STEPS = 5  # slow_steps of most tests


def _feed(
    detector: StragglerDetector, times: Sequence[float], steps: int, start: int
) -> dict[int, list[int]]:
    """Feed the same ``times`` for ``steps`` steps from ``start``: {step: ranks reported}, non-empty only."""
    reports = {}
    for step in range(start, start + steps):
        found = detector.observe(step, times)
        if found:
            reports[step] = [s.rank for s in found]
    return reports


def test_steady_equal_ranks_never_flag() -> None:
    rng = random.Random(0)
    for world in (2, 3, 4, 8):
        detector = StragglerDetector(slow_factor=1.5, slow_steps=3)
        for step in range(500):  # jitter within +-20%: never 1.5x the others' median
            assert detector.observe(step, [0.3 * rng.uniform(0.8, 1.2) for _ in range(world)]) == []
        assert detector.flagged == ()


def test_a_rank_twice_as_slow_is_flagged_exactly_at_slow_steps_with_its_figures() -> None:
    detector = StragglerDetector(slow_factor=1.5, slow_steps=STEPS)
    for step in range(1, STEPS):
        assert detector.observe(step, [0.30, 0.60, 0.31, 0.29]) == [], step
        assert detector.flagged == ()
    (straggler,) = detector.observe(STEPS, [0.30, 0.60, 0.31, 0.29])
    assert straggler == Straggler(
        rank=1, step=STEPS, seconds=0.60, median=0.30, ratio=2.0, slow_steps=STEPS, slow_factor=1.5
    )
    assert detector.flagged == (1,)
    assert straggler.message() == (
        "rank 1 is a straggler: 0.6 s a step against a median of 0.3 s (2.0x) for the last 5 steps "
        "(slow_factor=1.5)"
    )


def test_the_figures_are_window_medians_of_the_last_slow_steps() -> None:
    detector = StragglerDetector(slow_factor=1.5, slow_steps=3)
    detector.observe(1, [9.0, 0.1, 9.0])  # outside the window at step 4: its figures do not count
    detector.observe(2, [0.2, 0.8, 0.4])  # rank 1 slow (0.8 > 1.5 x 0.3)
    detector.observe(3, [0.2, 1.0, 0.2])
    (straggler,) = detector.observe(4, [0.4, 0.9, 0.2])
    # window = steps 2-4: rank 1's median 0.9; others' medians 0.2 (rank 0) and 0.2 (rank 2)
    assert (straggler.rank, straggler.step) == (1, 4)
    assert straggler.seconds == pytest.approx(0.9)
    assert straggler.median == pytest.approx(0.2)
    assert straggler.ratio == pytest.approx(4.5)


def test_a_straggler_is_reported_once_while_it_stays_slow() -> None:
    detector = StragglerDetector(slow_factor=1.5, slow_steps=STEPS)
    reports = _feed(detector, [0.3, 0.3, 0.9], 10 * STEPS, start=0)
    assert reports == {STEPS - 1: [2]}
    assert detector.flagged == (2,)


def test_one_step_not_slow_in_between_starts_the_count_again() -> None:
    detector = StragglerDetector(slow_factor=1.5, slow_steps=STEPS)
    slow, fast = [0.3, 0.9], [0.3, 0.3]
    assert _feed(detector, slow, STEPS - 1, start=0) == {}
    assert detector.observe(STEPS - 1, fast) == []  # the rank was quick once
    assert _feed(detector, slow, STEPS - 1, start=STEPS) == {}
    assert detector.observe(2 * STEPS - 1, [1.0, 1.0]) == []  # all ranks slow alike (a save): not slow
    assert _feed(detector, slow, STEPS - 1, start=2 * STEPS) == {}
    assert [s.rank for s in detector.observe(3 * STEPS - 1, slow)] == [1]


def test_a_single_slow_spike_is_not_a_straggler() -> None:
    detector = StragglerDetector(slow_factor=1.5, slow_steps=STEPS)
    for step in range(20 * STEPS):
        spike = step % STEPS == 2  # rank 1 slow one step in every slow_steps
        assert detector.observe(step, [0.3, 5.0 if spike else 0.3]) == []


def test_recovery_for_slow_steps_then_relapse_is_reported_again() -> None:
    detector = StragglerDetector(slow_factor=1.5, slow_steps=STEPS)
    slow, fast = [0.3, 0.3, 0.3, 0.8], [0.3, 0.3, 0.3, 0.3]
    assert _feed(detector, slow, STEPS, start=0) == {STEPS - 1: [3]}
    # not slow for fewer than slow_steps steps: still flagged, a relapse is not a new report
    assert _feed(detector, fast, STEPS - 1, start=100) == {}
    assert detector.flagged == (3,)
    assert _feed(detector, slow, 3 * STEPS, start=200) == {}
    assert detector.flagged == (3,)
    # not slow for slow_steps steps: the flag clears at the last of them
    assert _feed(detector, fast, STEPS - 1, start=300) == {}
    assert detector.flagged == (3,)
    assert detector.observe(300 + STEPS - 1, fast) == []
    assert detector.flagged == ()
    # slow again for slow_steps steps: reported again, at the slow_steps-th
    assert _feed(detector, slow, 2 * STEPS, start=400) == {400 + STEPS - 1: [3]}
    assert detector.flagged == (3,)


def test_two_ranks_compare_each_with_its_peer() -> None:
    # the mean of 2 ranks would be 1.33x below a rank 2x slower: the peer's time is the yardstick
    detector = StragglerDetector(slow_factor=1.5, slow_steps=STEPS)
    assert _feed(detector, [0.5, 1.0], STEPS, start=1) == {STEPS: [1]}
    (straggler,) = StragglerDetector(slow_factor=1.5, slow_steps=1).observe(0, [1.0, 0.5])
    assert (straggler.rank, straggler.seconds, straggler.median, straggler.ratio) == (0, 1.0, 0.5, 2.0)
    # not over slow_factor (1.4x, and exactly 1.5x): never
    assert _feed(StragglerDetector(1.5, STEPS), [0.5, 0.7], 5 * STEPS, start=0) == {}
    assert _feed(StragglerDetector(1.5, STEPS), [0.5, 0.75], 5 * STEPS, start=0) == {}
    assert _feed(StragglerDetector(1.5, STEPS), [0.5, 0.76], STEPS, start=0) == {STEPS - 1: [1]}


def test_four_ranks_one_or_two_stragglers() -> None:
    detector = StragglerDetector(slow_factor=1.5, slow_steps=STEPS)
    assert _feed(detector, [0.2, 0.2, 0.2, 0.5], 3 * STEPS, start=0) == {STEPS - 1: [3]}
    detector = StragglerDetector(slow_factor=1.5, slow_steps=STEPS)
    found: list[Straggler] = []
    for step in range(STEPS):
        found += detector.observe(step, [0.2, 0.7, 0.21, 0.5])
    assert [(s.rank, s.step) for s in found] == [(1, STEPS - 1), (3, STEPS - 1)]
    assert [s.median for s in found] == [pytest.approx(0.21), pytest.approx(0.21)]
    assert detector.flagged == (1, 3)


def test_half_the_ranks_slow_are_the_median_not_stragglers_for_three_ranks() -> None:
    # 2 of 3 ranks at 2x: the others' median of a slow rank is (0.3 + 0.6) / 2 = 0.45; 0.6 < 0.675
    assert _feed(StragglerDetector(1.5, STEPS), [0.3, 0.6, 0.6], 5 * STEPS, start=0) == {}


def test_a_change_of_world_size_resets_every_count_and_flag() -> None:
    detector = StragglerDetector(slow_factor=1.5, slow_steps=STEPS)
    assert _feed(detector, [0.3, 0.3, 0.3, 0.9], STEPS - 1, start=0) == {}
    assert detector.world_size == 4
    assert detector.observe(STEPS - 1, [0.3, 0.3, 0.9]) == []  # 3 ranks: a fresh count of 1
    assert detector.world_size == 3
    assert _feed(detector, [0.3, 0.3, 0.9], STEPS, start=STEPS) == {2 * STEPS - 2: [2]}
    assert detector.flagged == (2,)
    assert detector.observe(100, [0.3, 0.9]) == []
    assert detector.flagged == ()
    assert detector.state_dict()["window"] == [[0.3, 0.9]]


def test_world_size_one_never_flags() -> None:
    detector = StragglerDetector(slow_factor=1.5, slow_steps=1)
    for step, seconds in enumerate([0.1, 10.0, 0.1, 100.0, 0.0]):
        assert detector.observe(step, [seconds]) == []
    assert detector.flagged == ()


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"slow_factor": 1}, ValueError, "slow_factor must be > 1, got 1"),
        ({"slow_factor": 0.5}, ValueError, "slow_factor must be > 1, got 0.5"),
        ({"slow_factor": math.nan}, ValueError, "slow_factor must be a finite number, got nan"),
        ({"slow_factor": math.inf}, ValueError, "slow_factor must be a finite number, got inf"),
        ({"slow_factor": True}, TypeError, "slow_factor must be a real number > 1, got True (bool)"),
        ({"slow_factor": "2"}, TypeError, "slow_factor must be a real number > 1, got '2' (str)"),
        ({"slow_steps": 0}, ValueError, "slow_steps must be >= 1, got 0"),
        ({"slow_steps": 2.0}, TypeError, "slow_steps must be an int >= 1, got 2.0 (float)"),
        ({"slow_steps": True}, TypeError, "slow_steps must be an int >= 1, got True (bool)"),
    ],
)
def test_arguments_are_checked(kwargs: dict[str, object], error: type[Exception], message: str) -> None:
    with pytest.raises(error) as caught:
        StragglerDetector(**kwargs)  # type: ignore[arg-type]
    assert str(caught.value) == message


@pytest.mark.parametrize(
    ("step", "seconds", "error", "message"),
    [
        (3, [0.3, -0.1], ValueError, "seconds[1] must be >= 0, got -0.1"),
        (3, [math.nan, 0.3], ValueError, "seconds[0] must be a finite number, got nan"),
        (3, [0.3, 0.3, math.inf], ValueError, "seconds[2] must be a finite number, got inf"),
        (3, [0.3, None], TypeError, "seconds[1] must be a real number >= 0, got None (NoneType)"),
        (3, [], ValueError, "seconds must hold one step time per rank, got an empty sequence"),
        (3, 0.3, TypeError, "seconds must be a sequence of step times, one per rank, got float"),
        (-1, [0.3, 0.3], ValueError, "step must be >= 0, got -1"),
        (1.0, [0.3, 0.3], TypeError, "step must be an int >= 0, got 1.0 (float)"),
    ],
)
def test_bad_times_are_refused_and_count_nothing(
    step: object, seconds: object, error: type[Exception], message: str
) -> None:
    detector = StragglerDetector(slow_factor=1.5, slow_steps=3)
    _feed(detector, [0.3, 0.9], 2, start=0)
    before = detector.state_dict()
    with pytest.raises(error) as caught:
        detector.observe(step, seconds)  # type: ignore[arg-type]
    assert str(caught.value) == message
    assert detector.state_dict() == before
    assert [s.rank for s in detector.observe(2, [0.3, 0.9])] == [1]  # the count went on from 2


@pytest.mark.parametrize("split", [0, 1, STEPS - 1, STEPS, STEPS + 2, 3 * STEPS - 2, 3 * STEPS])
def test_state_dict_round_trip_continues_counting(split: int) -> None:
    slow = [[0.3, 0.31, 0.9 + 0.01 * i] for i in range(STEPS)]  # the figures depend on each step
    steps = slow + [[0.3, 0.3, 0.3]] * STEPS + slow + slow

    def run(detector: StragglerDetector, start: int, end: int) -> list[Straggler]:
        return [s for i in range(start, end) for s in detector.observe(i, steps[i])]

    straight = StragglerDetector(slow_factor=1.5, slow_steps=STEPS)
    expected = run(straight, 0, len(steps))
    assert [(s.step, s.rank) for s in expected] == [(STEPS - 1, 2), (3 * STEPS - 1, 2)]
    assert expected[1].seconds == pytest.approx(0.92) and expected[1].median == pytest.approx(0.305)

    first = StragglerDetector(slow_factor=1.5, slow_steps=STEPS)
    before = run(first, 0, split)
    state = json.loads(json.dumps(first.state_dict()))  # plain values only
    resumed = StragglerDetector(slow_factor=1.5, slow_steps=STEPS)
    resumed.load_state_dict(state)
    assert resumed.state_dict() == first.state_dict()
    assert resumed.flagged == first.flagged and resumed.world_size == first.world_size
    assert before + run(resumed, split, len(steps)) == expected
    assert resumed.state_dict() == straight.state_dict()


def test_load_state_dict_refuses_a_state_of_another_shape_and_resets_on_an_empty_one() -> None:
    detector = StragglerDetector(slow_steps=2)
    _feed(detector, [0.3, 0.9], 2, start=0)
    state = detector.state_dict()
    with pytest.raises(ValueError, match=r"one count, time and flag per rank of its world_size \(2\)"):
        StragglerDetector(slow_steps=2).load_state_dict({**state, "flagged": [2]})
    with pytest.raises(ValueError, match="world_size"):
        StragglerDetector(slow_steps=2).load_state_dict({**state, "slow_run": [0, 0, 0]})
    detector.load_state_dict(StragglerDetector().state_dict())
    assert (detector.flagged, detector.world_size, detector.state_dict()["window"]) == ((), None, [])


def test_others_taking_no_time_make_an_infinite_ratio() -> None:
    (straggler,) = StragglerDetector(slow_factor=1.5, slow_steps=1).observe(4, [0.0, 0.2, 0.0])
    assert (straggler.rank, straggler.median, straggler.ratio) == (1, 0.0, math.inf)
    assert "(infx)" in straggler.message()
    assert StragglerDetector(slow_steps=1).observe(4, [0.0, 0.0, 0.0]) == []
