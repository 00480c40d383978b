"""An arrival's top rung, given back by what a run of the same model measured (``Coordination.refit``)."""

from __future__ import annotations

from lightning_bandlimit.ladder import Decision, LadderController, Setting
from lightning_bandlimit.memory import MemoryReading
from lightning_bandlimit.tenants import Coordination, Tenant, offer

TOP = Setting(4, 0.0)
LEAST = [48.0, 24.0, 12.0, 6.0]
# the quickstart model's shape (MiB): rung 1 frees nearly all that rung 4 does
TWIN_PEAKS = ((0, 1123), (1, 1075), (4, 1066))


def _ladder(free: int, setting: Setting = TOP, peak: float = 1067.0) -> tuple[LadderController, Decision]:
    """A newcomer measured once on ``setting``: stages from samples (upper) and their least."""
    ladder = LadderController(rungs=4, min_free=12, release_free=74, margin=0.0)
    ladder.set_stage_savings([64.0, 36.0, 18.0, 9.0], LEAST)
    ladder.observe(setting, peak)
    return ladder, ladder.decide(MemoryReading(total=5000, free=free, source="scripted"), setting)


def _twin(job: str = "a", stages: tuple[int, ...] = (48, 24, 12, 6), **kwargs: object) -> Tenant:
    """A peer measured in a plain step (the least and the most each stage frees are one figure)."""
    entry = {"memory": 1066, "rung_peaks": TWIN_PEAKS, "stage_least": stages, "stage_most": stages, **kwargs}
    return Tenant(job=job, pid=1, heartbeat=0.0, **entry)  # type: ignore[arg-type]


def test_a_top_rung_taken_on_arrival_goes_down_to_the_fastest_rung_a_twin_measured_to_fit() -> None:
    ladder, hold = _ladder(free=40)  # 28 over min_free: rung 1 (+9) fits, rung 0 (+57) does not
    assert hold.reason == "hold"
    refitted, why = Coordination().refit(hold, TOP, [_twin()], 0.0, ladder)
    assert refitted.setting == Setting(1, 0.0) and refitted.reason == "lower" and "rung 1" in why
    ladder, hold = _ladder(free=70)
    assert Coordination().refit(hold, TOP, [_twin()], 0.0, ladder)[0].setting == Setting(0, 0.0)
    # the largest difference among twins: a second twin measured rung 1 at +30
    other = _twin("c", rung_peaks=((1, 1096), (4, 1066)))
    ladder, hold = _ladder(free=40)
    assert Coordination().refit(hold, TOP, [_twin(), other], 0.0, ladder) == (hold, None)


def test_without_a_twin_that_measured_the_rungs_nothing_is_refitted() -> None:
    ladder, hold = _ladder(free=70)
    rule = Coordination()
    for peers in (
        [],
        [_twin(stages=(48, 24, 12))],  # another model: other stages
        [_twin(stages=(30, 24, 12, 6))],  # another model: stage 1 frees less
        [_twin(stage_most=(48, 24, 12))],  # an entry that does not add up
        [_twin(rung_peaks=((0, 1123), (1, 1075)))],  # not measured on rung 4 (the job's rung)
    ):
        assert rule.refit(hold, TOP, peers, 0.0, ladder) == (hold, None)
    # the same model: its figures within this job's ranges [48, 64], [24, 36], ... (10 % either side)
    for stages in ((50, 25, 12, 6), (45, 23, 11, 6), (64, 36, 18, 9)):
        assert rule.refit(hold, TOP, [_twin(stages=stages)], 0.0, ladder)[0].setting.rung == 0


def test_nothing_is_refitted_while_a_peer_arrives_or_changed_lately() -> None:
    ladder, hold = _ladder(free=40)
    rule = Coordination(dwell=5.0)
    for peers in ([_twin(), _twin("c", arriving=True)], [_twin(changed_at=98.0)]):
        assert rule.refit(hold, TOP, peers, 100.0, ladder) == (hold, None)
    assert rule.refit(hold, TOP, [_twin(changed_at=90.0)], 100.0, ladder)[0].setting == Setting(1, 0.0)


def test_only_a_hold_in_the_hold_band_on_a_measured_exact_rung_is_refitted() -> None:
    rule = Coordination()
    ladder, pressed = _ladder(free=10)  # under min_free: the ladder's own raise
    assert pressed.reason == "raise" and rule.refit(pressed, TOP, [_twin()], 0.0, ladder) == (pressed, None)
    ladder, calm = _ladder(free=500)  # above release_free: the release takes it
    assert calm.reason == "hold" and rule.refit(calm, TOP, [_twin()], 0.0, ladder) == (calm, None)
    lossy = Setting(4, 0.3)
    ladder, compressed = _ladder(free=40, setting=lossy)
    assert rule.refit(compressed, lossy, [_twin()], 0.0, ladder) == (compressed, None)
    ladder, hold = _ladder(free=40)
    ladder.observe(Setting(1, 0.0), 1100)  # its own measure of rung 1 (+33) outranks the twin's
    assert rule.refit(hold, TOP, [_twin()], 0.0, ladder) == (hold, None)  # rungs 2-3: nobody measured


def test_offer_publishes_the_measured_rungs_and_the_stages_least() -> None:
    ladder, _ = _ladder(free=40)
    ladder.observe(Setting(0, 0.0), 1123)
    entry = offer(ladder, TOP)
    assert entry["rung_peaks"] == ((0, 1123), (4, 1067)) and entry["stage_least"] == (48, 24, 12, 6)
    assert entry["stage_most"] == (64, 36, 18, 9)
    assert entry["top_memory"] == 1067
