"""LadderController: exact rungs first, compression on the top rung, lossy part released first."""

import random

import pytest

from lightning_bandlimit.memory.controller import CompressionController
from lightning_bandlimit.memory.ladder import LadderController, LadderDecision, Setting
from lightning_bandlimit.memory.probes import MemoryReading

TOTAL = 10_000
FLOOR = Setting(0, 0.0)
SAVINGS = [300, 200, 100, 50]  # bytes each of 4 stages frees, highest resolution first


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
    """A 4-rung ladder that knows the bytes each stage frees and the job's memory at rung 0."""
    ladder = _ladder(**kwargs)
    ladder.set_stage_savings(SAVINGS)
    ladder.observe(FLOOR, 5000)
    return ladder


def _run(ladder: LadderController, frees: list[int], start: Setting = FLOOR) -> list[LadderDecision]:
    setting, decisions = start, []
    for free in frees:
        decision = ladder.decide(_reading(free), setting)
        setting = decision.setting
        decisions.append(decision)
    return decisions


# -- pressure ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("free", "rung"),
    [(900, 1), (700, 1), (699, 2), (500, 2), (499, 3), (351, 4)],  # deficit 100..649 bytes
)
def test_pressure_jumps_to_the_least_rung_predicted_to_fit(free: int, rung: int) -> None:
    decision = _known().decide(_reading(free), FLOOR)
    # rungs free 300, 500, 600, 650 bytes: the least one covering the deficit (1000 - free)
    assert decision == LadderDecision(rung, 0.0, "raise", free, 1000)


def test_pressure_from_a_middle_rung_goes_up_from_there() -> None:
    ladder = _known()
    ladder.observe(Setting(1, 0.0), 4700)  # as predicted: 5000 - 300
    decision = ladder.decide(_reading(850), Setting(1, 0.0))  # 150 short: rung 2 frees 200 more
    assert decision.setting == Setting(2, 0.0) and decision.reason == "raise"


def test_margin_and_surprise_enlarge_the_deficit() -> None:
    assert _known(margin=0.5).decide(_reading(750), FLOOR).rung == 2  # 250 * 1.5 = 375 > 300
    ladder = _known()
    assert ladder.decide(_reading(1500), FLOOR).reason == "hold"  # expects 1500 free next
    # 100 short, but free fell 600 below the expectation: 700 to free -> rung 4 (650) is not
    # enough, so the top rung and compression
    decision = ladder.decide(_reading(900), FLOOR)
    assert decision.setting == Setting(4, 0.2)


@pytest.mark.parametrize("observe", [False, True])
def test_unknown_rungs_jump_straight_to_the_top_rung(observe: bool) -> None:
    ladder = _ladder()  # no stage savings: rungs 1.. cannot be predicted
    if observe:
        ladder.observe(FLOOR, 5000)
    decision = ladder.decide(_reading(990), FLOOR)  # only 10 bytes short
    assert decision == LadderDecision(4, 0.0, "raise", 990, 1000)  # exact: no compression


def test_unknown_rung_on_the_way_up_jumps_to_the_top_rung() -> None:
    ladder = _ladder()
    ladder.observe(FLOOR, 5000)
    ladder.observe(Setting(1, 0.0), 4000)  # rung 1 measured, rungs 2.. unknown (no savings)
    assert ladder.decide(_reading(900), Setting(1, 0.0)).setting == Setting(4, 0.0)


def test_all_rungs_insufficient_goes_to_the_top_rung_and_raises_compression() -> None:
    ladder = _known()
    decision = ladder.decide(_reading(100), FLOOR)  # 900 short, the rungs free 650 at most
    assert decision.setting == Setting(4, 0.2)  # the top rung, and raise_step (no model yet)
    assert decision.reason == "raise"


def test_all_rungs_insufficient_jumps_with_the_compression_model() -> None:
    ladder = _known()
    ladder.observe(Setting(4, 0.0), 4350)
    ladder.observe(Setting(4, 0.5), 3350)  # 200 bytes per 0.1 of compression on the top rung
    decision = ladder.decide(_reading(100), FLOOR)  # 900 short: 650 from rungs, 250 from c=0.125
    assert decision.rung == 4
    assert decision.compression == pytest.approx(0.13)  # the 0.01 grid point above 0.125


def test_top_rung_raises_compression_by_raise_step_without_a_model() -> None:
    ladder = _known()
    assert ladder.decide(_reading(900), Setting(4, 0.0)).setting == Setting(4, 0.2)
    ladder = _known()
    ladder.observe(Setting(4, 0.2), 4000)  # one compression seen: still no model
    assert ladder.decide(_reading(900), Setting(4, 0.2)).setting == Setting(4, 0.4)


def test_top_rung_jumps_with_the_model_once_two_compressions_were_seen() -> None:
    ladder = _known()
    ladder.observe(Setting(4, 0.0), 4000)
    ladder.observe(Setting(4, 0.2), 3600)  # 200 bytes per 0.1
    decision = ladder.decide(_reading(500), Setting(4, 0.2))  # 500 short: 0.25 more
    assert decision.setting.rung == 4
    assert decision.compression == pytest.approx(0.45)


def test_compression_is_bounded() -> None:
    decisions = _run(_known(), [10] * 20)
    assert max(d.compression for d in decisions) == 0.8
    assert decisions[-1].setting == Setting(4, 0.8)
    assert decisions[-1].reason == "hold"  # nothing left to raise


# -- hold and release -------------------------------------------------------------------------


def test_hold_band_changes_nothing() -> None:
    rng = random.Random(0)
    for start in (FLOOR, Setting(2, 0.0), Setting(4, 0.3)):
        ladder = _known()
        decisions = _run(ladder, [rng.randint(1000, 1999) for _ in range(100)], start)
        assert {d.setting for d in decisions} == {start}
        assert {d.reason for d in decisions} == {"hold"}


def test_release_gives_back_compression_first_then_rungs() -> None:
    ladder = _ladder()  # nothing learned: one lower_step, then one rung, per release
    decisions = _run(ladder, [9000] * 40, Setting(4, 0.3))
    settings = [d.setting for d in decisions]
    # release_checks=2 and cooldown_checks=1: a change every second check
    assert settings[:8] == [
        Setting(4, 0.3),
        Setting(4, 0.2),
        Setting(4, 0.2),
        Setting(4, 0.1),
        Setting(4, 0.1),
        Setting(4, 0.0),  # compression at the floor before any rung is given back
        Setting(4, 0.0),
        Setting(3, 0.0),
    ]
    changes = [s for s, t in zip(settings, settings[1:]) if s != t]
    assert changes == [Setting(4, c) for c in (0.3, 0.2, 0.1)] + [Setting(r, 0.0) for r in (4, 3, 2, 1)]
    assert settings[-1] == FLOOR
    assert all(d.reason in ("hold", "lower") for d in decisions)


def test_release_waits_for_calm_checks_and_cooldown() -> None:
    ladder = _ladder(release_checks=3, cooldown_checks=4)
    ladder.decide(_reading(500), FLOOR)  # a raise (to the top rung): restarts the cooldown
    decisions = _run(ladder, [9000] * 8, Setting(4, 0.0))
    reasons = [d.reason for d in decisions]
    # calm from the 1st check on, but the cooldown needs 5 checks since the change
    assert reasons == ["hold"] * 4 + ["lower"] + ["hold"] * 3
    ladder = _ladder(release_checks=3, cooldown_checks=0)
    decisions = _run(ladder, [9000, 9000, 1500, 9000, 9000, 9000], Setting(4, 0.0))
    # the hold-band reading resets the calm count
    assert [d.reason for d in decisions] == ["hold"] * 5 + ["lower"]


def test_release_lowers_compression_to_the_floor_at_once_with_a_model() -> None:
    ladder = _known()
    ladder.observe(Setting(4, 0.0), 4350)
    ladder.observe(Setting(4, 0.5), 3350)
    decisions = _run(ladder, [9000] * 4, Setting(4, 0.5))
    assert [d.setting for d in decisions] == [Setting(4, 0.5), Setting(4, 0.0), Setting(4, 0.0), FLOOR]


def test_release_lowers_to_the_lowest_rung_predicted_to_keep_release_free() -> None:
    ladder = _known()
    ladder.observe(Setting(4, 0.0), 4350)
    # spare 2200 - 2000 = 200 bytes: rung 2 (+150 over rung 4) fits, rung 1 (+250) does not
    assert _run(ladder, [2200, 2200], Setting(4, 0.0))[-1].setting == Setting(2, 0.0)
    ladder = _known()
    ladder.observe(Setting(4, 0.0), 4350)
    assert _run(ladder, [9000, 9000], Setting(4, 0.0))[-1].setting == FLOOR  # plenty: at once


def test_release_never_goes_below_the_oom_floor() -> None:
    ladder = _ladder()
    retry = ladder.on_oom(Setting(4, 0.3))
    assert retry == Setting(4, 0.5) and ladder.oom_floor == 0.5
    decisions = _run(ladder, [9000] * 20, retry)
    assert {d.setting for d in decisions} == {retry}  # neither the compression nor the rung


# -- compression only (rungs=0) ---------------------------------------------------------------


def test_compression_only_raises_compression() -> None:
    ladder = _ladder(rungs=0)
    decision = ladder.decide(_reading(500), FLOOR)
    assert decision == LadderDecision(0, 0.2, "raise", 500, 1000)


def test_compression_only_matches_the_compression_controller() -> None:
    rng = random.Random(3)
    frees = [rng.choice([300, 1500, 2500, 9000]) for _ in range(300)]
    kwargs = {
        "min_free": 0.1,
        "release_free": 0.2,
        "raise_step": 0.2,
        "lower_step": 0.1,
        "release_checks": 2,
        "cooldown_checks": 1,
    }
    ladder, old = LadderController(rungs=0, **kwargs), CompressionController(**kwargs)
    setting, c = FLOOR, 0.0
    for i, free in enumerate(frees):
        if i % 3 == 0:  # the job's memory at its compression, learned by both
            ladder.observe(setting, 5000 - 3000 * setting.compression)
            old.model.observe(c, 5000 - 3000 * c)
        new = ladder.decide(_reading(free), setting)
        ref = old.decide(_reading(free), c)
        assert (new.rung, new.compression, new.reason) == (0, ref.compression, ref.reason), i
        setting, c = new.setting, ref.compression


# -- max_slowdown -----------------------------------------------------------------------------


def test_max_slowdown_takes_slow_rungs_off_the_ladder() -> None:
    ladder = _ladder(max_slowdown=1.5)
    assert ladder.observe_time(0, 1.0) is None
    assert ladder.observe_time(1, 1.2) is None
    assert ladder.slowdown(1) == pytest.approx(1.2)
    ladder.observe(Setting(4, 0.0), 4000)
    ladder.observe(Setting(4, 0.2), 3600)
    message = ladder.observe_time(2, 2.0)
    assert message is not None and "rung 2" in message and "top rung is now 1" in message
    assert ladder.top == 1
    assert ladder.compression_memory.points == {}  # learned on the old top rung
    assert ladder.observe_time(3, 5.0) is None  # above the top: off the ladder already
    # pressure with unknown rungs: the new top rung, then compression from there
    assert ladder.decide(_reading(990), FLOOR).setting == Setting(1, 0.0)
    assert ladder.decide(_reading(990), Setting(1, 0.0)).setting == Setting(1, 0.2)


def test_no_max_slowdown_keeps_every_rung() -> None:
    ladder = _ladder()
    ladder.observe_time(0, 1.0)
    assert ladder.observe_time(4, 10.0) is None
    assert ladder.top == 4 and ladder.slowdown(4) == pytest.approx(10.0)


# -- out of memory ----------------------------------------------------------------------------


def test_on_oom_moves_to_the_top_rung_first_then_raises_compression() -> None:
    ladder = _ladder()
    assert ladder.on_oom(FLOOR) == Setting(4, 0.0)
    assert ladder.oom_floor == 0.0  # exact retry: no floor on the compression
    assert ladder.on_oom(Setting(2, 0.0)) == Setting(4, 0.0)
    assert ladder.on_oom(Setting(4, 0.0)) == Setting(4, 0.2)
    assert ladder.oom_floor == 0.2
    assert ladder.on_oom(Setting(4, 0.7)) == Setting(4, 0.8)  # clamped to max_compression
    assert ladder.oom_floor == 0.8


# -- state ------------------------------------------------------------------------------------


def test_state_dict_round_trip() -> None:
    ladder = _known(max_slowdown=3.0)
    ladder.observe(Setting(2, 0.0), 4500)
    ladder.observe(Setting(4, 0.0), 4350)
    ladder.observe(Setting(4, 0.4), 3500)
    ladder.observe_time(0, 1.0)
    ladder.observe_time(2, 1.3)
    ladder.on_oom(Setting(4, 0.4))
    ladder.decide(_reading(1500), Setting(4, 0.6))
    state = ladder.state_dict()
    restored = _ladder(max_slowdown=3.0)
    restored.load_state_dict(state)
    assert restored.state_dict() == state
    assert restored.rung_memory.points == ladder.rung_memory.points
    assert restored.stage_savings == [float(s) for s in SAVINGS]
    assert restored.predict(Setting(3, 0.0)) == ladder.predict(Setting(3, 0.0)) is not None
    # the same decisions from here on
    frees = [900, 9000, 9000, 9000, 1500, 300, 9000]
    assert _run(restored, frees, Setting(4, 0.6)) == _run(ladder, frees, Setting(4, 0.6))


def test_state_saved_with_another_number_of_rungs_keeps_only_the_compression_model() -> None:
    ladder = _known()
    ladder.observe(Setting(4, 0.0), 4350)
    ladder.observe(Setting(4, 0.4), 3500)
    ladder.observe_time(0, 1.0)
    ladder.on_oom(Setting(4, 0.4))
    other = _ladder(rungs=2)
    other.load_state_dict(ladder.state_dict())
    assert other.compression_memory.points == ladder.compression_memory.points
    assert other.oom_floor == ladder.oom_floor
    assert other.rungs == other.top == 2
    assert other.rung_memory.points == {} and other.stage_savings is None and other.rung_seconds == {}


def test_new_stage_savings_of_another_length_reset_what_was_learned_per_rung() -> None:
    ladder = _known()
    ladder.observe(Setting(2, 0.0), 4500)
    ladder.observe_time(0, 1.0)
    ladder.set_stage_savings([100, 100, 100, 100])  # same number of stages: kept
    assert set(ladder.rung_memory.points) == {0, 2}
    ladder.set_stage_savings([100, 100])
    assert ladder.rungs == ladder.top == 2
    assert ladder.rung_memory.points == {} and ladder.rung_seconds == {}


# -- arguments --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"min_free": 0.3, "release_free": 0.2},
        {"min_free": 0.3, "release_free": 0.3},
        {"min_free": 100, "release_free": 0.5},  # bytes and a fraction
        {"min_free": 0},
        {"min_compression": 0.5, "max_compression": 0.4},
        {"raise_step": 0},
        {"lower_step": -0.1},
        {"release_checks": 0},
        {"cooldown_checks": -1},
        {"max_slowdown": 0.5},
        {"rungs": -1},
    ],
)
def test_bad_arguments_raise_value_error(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        LadderController(**kwargs)


@pytest.mark.parametrize("rungs", [1.5, "2", True, None])
def test_rungs_not_an_int_raise_type_error(rungs: object) -> None:
    with pytest.raises(TypeError):
        LadderController(rungs=rungs)


def test_negative_stage_savings_raise_value_error() -> None:
    ladder = _ladder()
    with pytest.raises(ValueError, match="non-negative"):
        ladder.set_stage_savings([100, -1, 50, 0])
    assert ladder.stage_savings is None


# -- a simulated run --------------------------------------------------------------------------

BUDGET = 3000
RUNG_MEMORY = [1000, 700, 550, 470]  # the job's peak per rung at compression 0
MIN_FREE, GROWTH = 200, 100  # the co-tenant grows by less than min_free per check


def _job_memory(setting: Setting) -> float:
    assert setting.compression == 0 or setting.rung == 3  # compression only on the top rung
    return RUNG_MEMORY[setting.rung] - 400 * setting.compression


def _simulate(cotenant: list[int]) -> tuple[list[Setting], list[float], list[str]]:
    """Feed a ladder one check per step: free = budget - co-tenant - job(setting it ran with)."""
    ladder = LadderController(
        rungs=3,
        min_free=MIN_FREE,
        release_free=2 * MIN_FREE,
        raise_step=0.2,
        lower_step=0.1,
        max_compression=0.9,
    )
    ladder.set_stage_savings([300, 150, 80])  # the exact differences of RUNG_MEMORY
    setting, settings, frees, reasons = FLOOR, [], [], []
    for used in cotenant:
        job = _job_memory(setting)
        free = BUDGET - used - job
        frees.append(free)
        settings.append(setting)
        ladder.observe(setting, job)
        decision = ladder.decide(_reading(max(0, int(free)), BUDGET), setting)
        reasons.append(decision.reason)
        setting = decision.setting
    return settings, frees, reasons


def _ramp(peak: int) -> list[int]:
    """A co-tenant that grows by 100 bytes a step (less than min_free) to ``peak``, stays, leaves."""
    up = list(range(1500, peak, 100)) + [peak] * 10
    return up + list(range(peak, -1, -150)) + [0] * 40


@pytest.mark.parametrize("peak", [1900, 2100, 2200, 2300])
def test_simulated_cotenant_exact_levers_suffice(peak: int) -> None:
    # the top rung (470 bytes) fits beside the co-tenant's peak with min_free to spare
    assert BUDGET - peak - RUNG_MEMORY[-1] >= MIN_FREE
    settings, frees, reasons = _simulate(_ramp(peak))
    first = reasons.index("raise")
    after = frees[first + 1 :]
    assert min(after) >= 0, frees  # never over budget after the first pressure check
    assert min(after) >= MIN_FREE - GROWTH, frees  # met one check ahead
    assert all(s.compression == 0.0 for s in settings), settings  # a rung sufficed: no compression
    assert max(s.rung for s in settings) >= 1
    assert settings[-1] == FLOOR  # back at rung 0 after the co-tenant left
    assert reasons[-1] == "hold"


@pytest.mark.parametrize("peak", [2400, 2550, 2650])
def test_simulated_cotenant_needs_compression_on_the_top_rung(peak: int) -> None:
    cotenant = _ramp(peak)
    settings, frees, reasons = _simulate(cotenant)
    first = reasons.index("raise")
    assert min(frees[first + 1 :]) >= 0, frees
    assert min(frees[first + 1 :]) >= MIN_FREE - GROWTH, frees
    lossy = [i for i, s in enumerate(settings) if s.compression > 0]
    assert lossy and all(settings[i].rung == 3 for i in lossy)  # compression only on the top rung
    # compression rises only at checks where even the top rung would leave less than min_free
    rises = [i for i in range(1, len(settings)) if settings[i].compression > settings[i - 1].compression]
    assert rises and all(cotenant[i - 1] > BUDGET - RUNG_MEMORY[-1] - MIN_FREE for i in rises)
    # the exact rungs were climbed first, at compression 0
    assert settings[rises[0] - 1] == Setting(3, 0.0)
    assert settings[-1] == FLOOR  # the co-tenant left: rung 0, compression floor
    # the lossy part is given back before the first rung
    first_lower_rung = next(i for i in range(lossy[-1], len(settings)) if settings[i].rung < 3)
    assert first_lower_rung > lossy[-1] and settings[first_lower_rung - 1] == Setting(3, 0.0)
