"""What the ladder learns of its job (LadderModel): idle and slow rungs, the stages' saved bytes,
the peak's noise."""

import pytest
from ladder_cases import FLOOR, SAVINGS, _ladder, _learned, _reading, _run, _rung0

from lightning_bandlimit.ladder import LadderController, LadderModel, Setting

# -- max_slowdown -----------------------------------------------------------------------------


def test_max_slowdown_takes_slow_rungs_off_the_ladder() -> None:
    ladder = _learned(max_slowdown=1.5)
    assert ladder.observe_time(0, 1.0) is None
    assert ladder.observe_time(1, 1.2) is None
    assert ladder.slowdown(1) == pytest.approx(1.2)
    learned = dict(ladder.compression_memory.points)
    message = ladder.observe_time(2, 2.0)
    assert message is not None and "rung 2" in message and "top rung is now 1" in message
    assert ladder.top == 1 and ladder.rungs == 4
    assert ladder.compression_memory.points == learned  # learned on rung 0: still valid
    assert ladder.observe_time(3, 5.0) is None  # above the top: off the ladder already
    assert ladder.top == 1
    # 350 short: rung 2 (frees 500) would do, but the continuum now starts above rung 1 (300)
    assert _learned().decide(_reading(650), FLOOR).setting == Setting(2, 0.0)
    assert ladder.decide(_reading(650), FLOOR).setting == Setting(0, 0.09)  # needs 4650: c = 0.0875
    # released from the continuum only to the rungs left: 4420 may be used, rung 3 would fit
    ladder = _learned(max_slowdown=1.5)
    ladder.observe_time(0, 1.0)
    ladder.observe_time(2, 2.0)
    assert ladder.top == 1
    assert _run(ladder, [3420, 3420], Setting(0, 0.5))[-1].setting == Setting(0, 0.15)


def test_max_slowdown_with_unknown_rungs_goes_to_the_new_top() -> None:
    ladder = _ladder(max_slowdown=1.5)
    ladder.observe_time(0, 1.0)
    ladder.observe_time(2, 2.0)
    assert ladder.top == 1
    assert ladder.decide(_reading(990), FLOOR).setting == Setting(1, 0.0)  # unknown: the top rung


def test_no_max_slowdown_keeps_every_rung() -> None:
    ladder = _ladder()
    ladder.observe_time(0, 1.0)
    assert ladder.observe_time(4, 10.0) is None
    assert ladder.top == 4 and ladder.slowdown(4) == pytest.approx(10.0)


def test_new_stage_savings_of_another_length_reset_what_was_learned_per_rung() -> None:
    ladder = _rung0()
    ladder.observe(Setting(2, 0.0), 4500)
    ladder.observe_time(0, 1.0)
    ladder.on_stages_measured([100, 100, 100, 100])  # same number of stages: kept
    assert set(ladder.rung_memory.points) == {0, 2}
    ladder.on_stages_measured([100, 100])
    assert ladder.rungs == ladder.top == 2
    assert ladder.rung_memory.points == {} and ladder.rung_seconds == {}
    assert ladder.stage_savings == [100.0, 100.0]


def test_stages_counted_without_savings() -> None:
    ladder = _learned()
    ladder.observe_time(0, 1.0)
    ladder.on_stages_measured(rungs=4)  # the same number: everything kept
    assert ladder.stage_savings == [float(s) for s in SAVINGS] and set(ladder.rung_memory.points) == {
        0,
        1,
        2,
        3,
        4,
    }
    ladder.on_stages_measured(rungs=3)
    assert ladder.rungs == ladder.top == 3
    assert ladder.rung_memory.points == {} and ladder.rung_seconds == {} and ladder.stage_savings is None
    assert ladder.compression_memory.points == {0.0: 5000.0, 0.5: 3000.0}  # rung 0's: kept
    # savings unknown: the rungs cannot be predicted, so pressure goes to the top rung at once
    ladder.observe(FLOOR, 5000)
    assert ladder.decide(_reading(990), FLOOR).setting == Setting(3, 0.0)
    with pytest.raises(ValueError):
        ladder.on_stages_measured(rungs=-1)
    with pytest.raises(TypeError):
        ladder.on_stages_measured(rungs=1.5)  # type: ignore[arg-type]
    assert ladder.rungs == 3


def test_negative_stage_savings_raise_value_error() -> None:
    ladder = _ladder()
    with pytest.raises(ValueError, match="non-negative"):
        ladder.on_stages_measured([100, -1, 50, 0])
    assert ladder.stage_savings is None


# -- rungs that free nothing at the step's peak ------------------------------------------------


def test_rungs_that_free_nothing_measured_leave_the_ladder_and_the_continuum_moves_down() -> None:
    ladder = _rung0()  # stages keep 300, 200, 100, 50 bytes; 5000 at rung 0
    ladder.on_continuum_chosen(True)
    # a jump over several rungs judges no stage: rung 4 freed 500 of the 650 stages 1-4 keep
    assert ladder.observe(Setting(4, 0.0), 4500) is None
    assert ladder.observe(Setting(1, 0.0), 4700) is None  # freed 300 of 300: a working rung
    assert ladder.observe(Setting(2, 0.0), 4520) is None  # freed 180 of 200
    assert ladder.top == 4
    # stage 3 keeps 100 bytes; rung 3 freed 10 of them (less than a quarter): it leaves, with 4
    message = ladder.observe(Setting(3, 0.0), 4510)
    assert message is not None and "rung 3 freed" in message and "top rung is now 2" in message
    assert ladder.top == ladder.lossy_rung == 2
    # the continuum starts from rung 2's measured memory
    assert ladder.compression_memory.points == {0.0: 4520}
    # on rung 4 without pressure: down to rung 2 (same memory, less recompute)
    assert ladder.decide(_reading(1500), Setting(4, 0.0)).setting == Setting(2, 0.0)
    # under pressure: the continuum on rung 2, never rung 4 again
    assert ladder.decide(_reading(500), Setting(2, 0.0)).setting.rung == 2
    assert ladder.state_dict()["top"] == 2


def test_the_first_steps_peak_is_replaced_by_the_next_and_is_no_sample_of_the_noise() -> None:
    # the optimizer's state is made within the first step: the second at one setting is higher
    ladder = _ladder()
    ladder.observe(FLOOR, 4860)
    ladder.observe(FLOOR, 5000)
    assert ladder.peak_noise == 0 and ladder.rung_memory.points[0] == 5000  # not their average
    ladder.observe(FLOOR, 5010)
    assert ladder.peak_noise == 10 and ladder.rung_memory.points[0] == 5005
    moved = _ladder()  # a first step at another setting: the next is its own first measure
    moved.observe(Setting(4, 0.0), 4000)
    moved.observe(FLOOR, 5000)
    moved.observe(FLOOR, 5020)
    assert moved.peak_noise == 20 and moved.rung_memory.points[0] == 5010


def test_the_idle_rung_is_kept_after_it_left_the_ladder() -> None:
    ladder = _rung0()  # stages keep 300, 200, 100, 50 bytes
    assert ladder.idle_from() is None
    for rung, peak in [(1, 4700), (2, 4520), (3, 4510)]:
        ladder.observe(Setting(rung, 0.0), peak)
    assert ladder.top == 2 and ladder.idle_from() == 3  # what a peer reads of it (the ledger)
    ladder.observe(Setting(2, 0.0), 4521)  # judged again at the top: still the same rung
    assert ladder.top == 2 and ladder.idle_from() == 3


def test_a_rung_that_frees_a_quarter_of_what_its_stages_keep_stays() -> None:
    ladder = _rung0()
    ladder.observe(Setting(1, 0.0), 4700)
    ladder.observe(Setting(2, 0.0), 4520)
    assert ladder.observe(Setting(3, 0.0), 4490) is None  # 30 of 100: noisy, but it frees
    assert ladder.top == 4
    plain = _ladder()  # stage savings unknown: no rung can be judged
    plain.observe(FLOOR, 5000)
    assert plain.observe(Setting(4, 0.0), 5000) is None and plain.top == 4


def test_a_rung_is_judged_idle_against_the_least_its_stage_may_free_not_an_upper_figure() -> None:
    # from samples (a newcomer's first step on its top rung), stage 2 keeps 36 at most and 24 at
    # least (less its inputs); rung 2 freed 7.5 over rung 1: under a quarter of 36, over one of 24
    upper, least = [64.0, 36.0, 18.0, 9.0], [48.0, 24.0, 12.0, 6.0]
    ladder = LadderController(rungs=4, min_free=10)
    ladder.on_stages_measured(upper, least)
    ladder.observe(Setting(1, 0.0), 1077)
    assert ladder.observe(Setting(2, 0.0), 1069.5) is None and ladder.top == 4  # an exact rung kept
    restored = LadderController(rungs=4, min_free=10)
    restored.load_state_dict(ladder.state_dict())
    assert restored.stage_savings == upper and restored.stage_least == least
    judged_by_upper = LadderController(rungs=4, min_free=10)
    judged_by_upper.on_stages_measured(upper)  # the least not given: the savings themselves
    judged_by_upper.observe(Setting(1, 0.0), 1077)
    assert judged_by_upper.observe(Setting(2, 0.0), 1069.5) is not None and judged_by_upper.top == 1


@pytest.mark.parametrize("least", [[10.0, 30.0], [10.0], [-1.0, 5.0]])
def test_least_stage_savings_must_be_at_most_the_savings_stage_by_stage(least: list[float]) -> None:
    with pytest.raises(ValueError, match="least"):
        LadderController(rungs=2).on_stages_measured([20.0, 20.0], least)


def test_a_hinted_rung_is_discounted_by_what_the_last_climb_freed() -> None:
    ladder = _rung0()
    ladder.observe(Setting(1, 0.0), 4850)  # stage 1 keeps 300 for backward; the peak fell by 150
    # short by 120 on rung 1: stage 2's 200 saved bytes, at the half the last climb freed, are 100
    decision = ladder.decide(_reading(880), Setting(1, 0.0))
    assert decision.setting == Setting(3, 0.0)  # stages 2-3 hinted at 150: the first that fits


# -- what a change of the ladder's shape forgets (one rule) -----------------------------------


def _measured(on_top: bool) -> LadderModel:
    """Three rungs measured, splits 2 and 4 measured on the top rung, two compressions on the
    lossy rung at split 4."""
    model = LadderModel(rungs=2)
    model.on_continuum_chosen(on_top)
    model.on_splits_chosen([2, 4])
    for rung, peak in [(0, 1000), (1, 900), (2, 850)]:
        model.observe(Setting(rung, 0.0), peak)
    for split, peak in [(2, 700), (4, 600)]:
        model.observe(Setting(2, 0.0, split=split), peak)
    for compression, peak in [(0.2, 550), (0.4, 500)]:
        model.observe(Setting(model.lossy_rung, compression, split=4), peak)
    assert set(model.split_memory.points) == {2, 4} and len(model.compression_memory.points) >= 2
    return model


@pytest.mark.parametrize("on_top", [False, True])
def test_a_change_forgets_what_was_measured_where_it_moved_and_nothing_else(on_top: bool) -> None:
    # the continuum moved: its memory is forgotten, the splits' kept (they run on the same top rung)
    model = _measured(on_top)
    model.on_continuum_chosen(not on_top)
    assert model.compression_memory.points == {} and set(model.split_memory.points) == {2, 4}
    # the same choice again: nothing forgotten
    model = _measured(on_top)
    model.on_continuum_chosen(on_top)
    model.on_splits_chosen([4, 2])
    assert set(model.split_memory.points) == {2, 4} and len(model.compression_memory.points) >= 2
    # other splits, even with the same largest: both forgotten (the continuum runs at the largest)
    for splits in ([2], [4]):
        model = _measured(on_top)
        model.on_splits_chosen(splits)
        assert model.split_memory.points == {} and model.compression_memory.points == {}
    # a lower top rung: the splits' memory forgotten; the continuum's only where it ran on the top rung
    model = _measured(on_top)
    model.on_ranks_agreed(1, on_top)
    assert model.top == 1 and model.split_memory.points == {}
    assert (model.compression_memory.points == {}) is on_top
    assert set(model.rung_memory.points) == {0, 1, 2}  # the rungs measured stay measured
