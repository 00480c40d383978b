"""The ladder's micro-batch splits (issue 56): after the exact rungs, splits 2, 4, 8 on the top
rung, learned by what each changes, the compression last, everything given back in reverse."""

from __future__ import annotations

import pytest

from lightning_bandlimit.ladder import LadderController, Setting
from lightning_bandlimit.ladder.setting import Decision, measured_from_state, measured_state
from lightning_bandlimit.ladder.splits import SplitMemory, check_splits
from lightning_bandlimit.memory.protocol import MemoryReading

TOTAL = 100_000
BASE = 400.0


def _reading(free: int) -> MemoryReading:
    return MemoryReading(total=TOTAL, free=free, source="scripted")


def _ladder(splits: tuple[int, ...] = (2, 4, 8), lossy: bool = True, min_free: int = 100) -> LadderController:
    """Three rungs measured (1000, 850, 800 over a baseline of 400), splits offered."""
    ladder = LadderController(
        rungs=2,
        min_free=min_free,
        release_free=300 + min_free,
        max_compression=0.9 if lossy else 0.0,
        cooldown_checks=0,
    )
    ladder.on_stages_measured([300.0, 100.0])
    ladder.on_splits_chosen(splits)
    ladder.observe(Setting(0, 0.0), 1000, base=BASE)
    ladder.observe(Setting(2, 0.0), 800, base=BASE)
    ladder.observe(Setting(1, 0.0), 850, base=BASE)
    return ladder


def test_exact_points_are_the_rungs_then_the_splits_on_the_top_rung() -> None:
    ladder = _ladder()
    assert ladder.exact_points() == [
        Setting(0, 0.0),
        Setting(1, 0.0),
        Setting(2, 0.0),
        Setting(2, 0.0, split=2),
        Setting(2, 0.0, split=4),
        Setting(2, 0.0, split=8),
    ]
    assert ladder.lossy_split == 8
    assert _ladder(splits=()).exact_points() == [Setting(r, 0.0) for r in range(3)]


def test_past_the_top_rung_the_least_split_hinted_to_free_the_shortfall() -> None:
    ladder = _ladder()
    # 60 short (+10 % margin): rung 2's increment of 400 split in 2 is hinted to free 200
    decision = ladder.decide(_reading(40), Setting(2, 0.0))
    assert decision.setting == Setting(2, 0.0, split=2)
    assert decision.reason == "raise"
    # 250 short (+10 %): split 4 is hinted to free 300
    deeper = _ladder(min_free=300).decide(_reading(50), Setting(2, 0.0))
    assert deeper.setting == Setting(2, 0.0, split=4)


def test_a_shortfall_no_split_is_hinted_to_free_takes_the_largest_split_before_any_compression() -> None:
    # 500 short is more than any split is hinted to free (at most 350): the largest split, exact,
    # before the compression, since it was never measured
    assert _ladder(min_free=600).decide(_reading(100), Setting(2, 0.0)).setting == Setting(2, 0.0, split=8)


def test_the_compression_comes_after_every_split_measured_short_and_runs_at_the_largest() -> None:
    ladder = _ladder()
    for split, peak in [(2, 600), (4, 500), (8, 450)]:
        ladder.observe(Setting(2, 0.0, split=split), peak, base=BASE)
    decision = ladder.decide(_reading(0), Setting(2, 0.0, split=8))  # 100 short at the last split
    assert decision.compression > 0.0
    assert decision.split == 8  # the continuum runs at the largest split
    assert decision.rung == ladder.lossy_rung


def test_a_measured_split_is_learned_by_its_increment_and_hints_the_next() -> None:
    ladder = _ladder()
    ladder.observe(Setting(2, 0.0, split=2), 650, base=BASE)  # increment 250 = G + A/2 with 400 = G + A
    assert ladder.predict(Setting(2, 0.0, split=2)) == 650
    assert ladder.predict(Setting(2, 0.0, split=4)) == 650  # conservative: frees nothing more
    assert ladder.hinted(Setting(2, 0.0, split=4), 650) == pytest.approx(BASE + 100 + 300 / 4)
    ladder.observe(Setting(2, 0.0, split=2), 700, base=BASE + 50)  # the baseline grew by 50
    assert ladder.predict(Setting(0, 0.0)) == 1050  # every learned peak moved with it
    assert ladder.split_memory.points[2] == pytest.approx(0.5 * (650 + 50) + 0.5 * 700)


def test_release_gives_back_in_reverse_bounded_where_not_measured() -> None:
    ladder = _ladder()
    ladder.observe(Setting(2, 0.0, split=4), 500, base=BASE)  # increment 100
    # 220 above release_free: rungs 0-2 add 300 or more (measured), split 2 at most 100 (twice
    # the increment of 100): one split down
    plenty_calm = [_reading(520) for _ in range(3)]
    decisions = [ladder.decide(r, Setting(2, 0.0, split=4)) for r in plenty_calm]
    assert decisions[-1].setting == Setting(2, 0.0, split=2), decisions
    # lots of room: straight to the fastest exact point measured to fit (rung 0)
    ladder = _ladder()
    ladder.observe(Setting(2, 0.0, split=4), 500, base=BASE)
    decisions = [ladder.decide(_reading(5000), Setting(2, 0.0, split=4)) for _ in range(3)]
    assert decisions[-1].setting == Setting(0, 0.0)


def test_release_holds_a_split_when_the_one_below_was_measured_not_to_fit() -> None:
    ladder = _ladder()
    ladder.observe(Setting(2, 0.0, split=2), 600, base=BASE)
    ladder.observe(Setting(2, 0.0, split=4), 500, base=BASE)
    decisions = [ladder.decide(_reading(450), Setting(2, 0.0, split=4)) for _ in range(3)]
    assert [d.setting for d in decisions] == [Setting(2, 0.0, split=4)] * 3  # 100 more does not fit in 50


def test_an_out_of_memory_error_on_the_top_rung_retries_at_the_largest_split_then_compresses() -> None:
    ladder = _ladder()
    assert ladder.on_oom(Setting(0, 0.0)) == Setting(2, 0.0)
    assert ladder.on_oom(Setting(2, 0.0)) == Setting(2, 0.0, split=8)
    after = ladder.on_oom(Setting(2, 0.0, split=8))
    assert after.compression > 0 and after.split == 8
    exact_only = _ladder(lossy=False)
    assert exact_only.on_oom(Setting(2, 0.0, split=8)) == Setting(2, 0.0, split=8)


def test_without_a_lossy_lever_the_safe_end_is_the_largest_split() -> None:
    ladder = _ladder(lossy=False)
    for split, peak in [(2, 600), (4, 500), (8, 450)]:
        ladder.observe(Setting(2, 0.0, split=split), peak, base=BASE)
    assert ladder.decide(_reading(0), Setting(2, 0.0, split=4)).setting == Setting(2, 0.0, split=8)


def test_a_lower_top_rung_forgets_the_splits_measured_on_the_old_one() -> None:
    ladder = _ladder()
    ladder.observe(Setting(2, 0.0, split=2), 600, base=BASE)
    ladder.on_ranks_agreed(1, False, splits=1)
    assert ladder.top == 1 and ladder.splits == (2,)
    assert ladder.split_memory.points == {}
    assert ladder.exact_points()[-1] == Setting(1, 0.0, split=2)


def test_the_splits_and_what_was_learned_of_them_survive_a_checkpoint() -> None:
    ladder = _ladder()
    ladder.observe(Setting(2, 0.0, split=2), 600, base=BASE)
    ladder.observe_time(2, 0.5, split=2)
    ladder.decide(_reading(0), Setting(2, 0.0, split=2))
    restored = LadderController(rungs=2, min_free=100, release_free=300, cooldown_checks=0)
    restored.on_stages_measured([300.0, 100.0])
    restored.load_state_dict(ladder.state_dict())
    assert restored.splits == (2, 4, 8)
    assert restored.split_memory.points == ladder.split_memory.points
    assert restored.split_memory.seconds == {2: 0.5}
    assert restored.state_dict() == ladder.state_dict()
    assert measured_from_state(measured_state((Setting(2, 0.0, split=4), 7.0))) == (
        Setting(2, 0.0, split=4),
        7.0,
    )


def test_a_room_making_move_offers_the_next_split_after_the_top_rung() -> None:
    ladder = _ladder()
    assert ladder.make_room(Setting(2, 0.0), 150.0) == Setting(2, 0.0, split=2)
    assert ladder.make_room(Setting(2, 0.0), 5000.0) == Setting(2, 0.0, split=2)  # unvisited first
    assert ladder.make_room(Setting(2, 0.0, split=8), 10.0) == Setting(2, 0.0, split=8)


def test_a_decision_keeps_its_split_and_says_it() -> None:
    decision = Decision.at(Setting(1, 0.0, split=4), "hold", 5, 10)
    assert decision.setting == Setting(1, 0.0, split=4)
    assert "split=4" in repr(decision)
    assert repr(Setting(1, 0.0)) == "Setting(rung=1, compression=0.0)"


def test_split_memory_bounds_and_bad_splits() -> None:
    assert SplitMemory.bound(2, 8, peak=500.0, baseline=400.0) == 800.0
    assert SplitMemory().hint(2, top=None, baseline=None) is None
    with pytest.raises(ValueError, match="at least 2"):
        check_splits([1, 2])
    with pytest.raises(TypeError, match="ints"):
        check_splits([2.0])


def test_a_shortfall_within_the_noise_of_the_peak_takes_no_split() -> None:
    ladder = _ladder()
    for peak in (800, 803, 800):  # the top rung's peak moves by 3 between checks: its noise
        ladder.observe(Setting(2, 0.0), peak, base=BASE)
    assert ladder.peak_noise == 3
    within = ladder.decide(_reading(98), Setting(2, 0.0))  # 2 short, 98 still free
    assert within.setting == Setting(2, 0.0)
    beyond = ladder.decide(_reading(90), Setting(2, 0.0))  # 10 short: beyond the noise
    assert beyond.setting == Setting(2, 0.0, split=2)


def test_a_job_above_a_rung_judged_idle_splits_on_the_new_top_rung_before_any_compression() -> None:
    # the step trace of benchmarks/tenants/multitenant.py (seed 1): rung 3 measured to free nothing, the
    # top rung became 2 while the job ran rung 3, still short: it compressed at split 8 before
    ladder = LadderController(rungs=3, min_free=100, release_free=400, cooldown_checks=0)
    ladder.on_stages_measured([300.0, 100.0, 100.0])
    ladder.on_splits_chosen((2, 4, 8))
    for rung, peak in [(0, 1000), (1, 800), (2, 700), (3, 700)]:
        ladder.observe(Setting(rung, 0.0), peak, base=BASE)
    assert ladder.top == 2
    decision = ladder.decide(_reading(50), Setting(3, 0.0))
    assert decision.setting == Setting(2, 0.0, split=2)
