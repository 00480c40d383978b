"""An arrival's top rung, given back by what a run of the same model measured (``Coordination.refit``)."""

from __future__ import annotations

from lightning_bandlimit.ladder import Decision, LadderController, Setting
from lightning_bandlimit.memory import MemoryReading
from lightning_bandlimit.tenants import Coordination, Tenant, offer

TOP = Setting(4, 0.0)
LEAST = [48.0, 24.0, 12.0, 6.0]
# the quickstart model's shape (MiB): rung 1 frees nearly all that rung 4 does
TWIN_PEAKS = ((0, 1123), (1, 1075), (4, 1066))


def _ladder(
    free: int, setting: Setting = TOP, peak: float = 1067.0, margin: float = 0.0
) -> tuple[LadderController, Decision]:
    """A newcomer measured once on ``setting``: stages from samples (upper) and their least."""
    ladder = LadderController(rungs=4, min_free=12, release_free=74, margin=margin)
    ladder.on_stages_measured([64.0, 36.0, 18.0, 9.0], LEAST)
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
        [_twin(rung_peaks=((0, 1190), (1, 1142)))],  # not on rung 4, and its own peaks do not fit
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


def test_a_twin_that_found_its_upper_rungs_idle_vouches_for_the_rung_below_them() -> None:
    # the quickstart model as measured (MiB): rungs 3-4 free nothing over rung 2; the twin
    # climbed rung by rung to make room, judged rung 3 idle and never ran rung 4
    twin = _twin(rung_peaks=((0, 1123), (1, 1075), (2, 1066), (3, 1066)), idle_from=3)
    ladder, hold = _ladder(free=18)  # 6 over min_free: rung 2 (+0) fits, rung 1 (+9) does not
    refitted, why = Coordination().refit(hold, TOP, [twin], 0.0, ladder)
    assert refitted.setting == Setting(2, 0.0) and "rung 2" in why
    ladder, hold = _ladder(free=40)  # rung 1 (+9 over rung 2's memory) fits too
    assert Coordination().refit(hold, TOP, [twin], 0.0, ladder)[0].setting == Setting(1, 0.0)
    # the margin on the twin's measure too: with 10 %, rung 1 needs 9.9, and a tenth of the hold
    # band (6.2) as slack, of the 15.8 spare
    ladder, hold = _ladder(free=29, margin=0.1)  # 29 - 12 * 1.1
    assert Coordination().refit(hold, TOP, [twin], 0.0, ladder)[0].setting == Setting(2, 0.0)
    ladder, hold = _ladder(free=30, margin=0.1)
    assert Coordination().refit(hold, TOP, [twin], 0.0, ladder)[0].setting == Setting(1, 0.0)
    # no idle rung judged: rung 4's memory is not known from rungs 0-3, and the twin's own peak
    # on rung 2 is 9 over this job's on rung 4, for 6 spare
    unjudged = _twin(rung_peaks=((0, 1123), (1, 1085), (2, 1076), (3, 1076)))
    ladder, hold = _ladder(free=18)
    assert Coordination().refit(hold, TOP, [unjudged], 0.0, ladder) == (hold, None)
    # a rung the twin measured above its idle one is its own measure, not the rung below's
    measured = _twin(rung_peaks=((0, 1123), (1, 1075), (2, 1066), (3, 1066), (4, 1050)), idle_from=3)
    ladder, hold = _ladder(free=18)  # rung 2 is +16 over rung 4 by that measure
    assert Coordination().refit(hold, TOP, [measured], 0.0, ladder) == (hold, None)


def test_a_twin_that_did_not_measure_the_jobs_rung_vouches_by_its_own_peaks() -> None:
    # the quickstart pair: the incumbent made room by rungs 0 -> 2 and never ran rungs 3-4; the
    # newcomer measured 1067 on its top rung. The twin's peak on rung 2 (1064) against it: -3
    twin = _twin(rung_peaks=((0, 1123), (2, 1064)))
    ladder, hold = _ladder(free=18)  # 6 over min_free: rung 2 fits, rung 0 (+56) does not
    refitted, why = Coordination().refit(hold, TOP, [twin], 0.0, ladder)
    assert refitted.setting == Setting(2, 0.0) and "rung 2" in why
    ladder, hold = _ladder(free=70)  # 58 spare: rung 0 (+56) fits
    assert Coordination().refit(hold, TOP, [twin], 0.0, ladder)[0].setting == Setting(0, 0.0)
    ladder, hold = _ladder(free=18)
    more = _twin(rung_peaks=((0, 1123), (2, 1080)))  # its rung 2 is 13 over this job's rung 4
    assert Coordination().refit(hold, TOP, [more], 0.0, ladder) == (hold, None)
    # a twin that measured both rungs gives their difference, which outranks a peak against a peak
    both = _twin("c", rung_peaks=((0, 1123), (2, 1064), (4, 1050)))  # rung 2 is +14 over rung 4
    ladder, hold = _ladder(free=18)
    assert Coordination().refit(hold, TOP, [twin, both], 0.0, ladder) == (hold, None)


def test_offer_publishes_the_measured_rungs_and_the_stages_least() -> None:
    ladder, _ = _ladder(free=40)
    ladder.observe(Setting(0, 0.0), 1123)
    entry = offer(ladder, TOP)
    assert entry["rung_peaks"] == ((0, 1123), (4, 1067)) and entry["stage_least"] == (48, 24, 12, 6)
    assert entry["stage_most"] == (64, 36, 18, 9)
    assert entry["top_memory"] == 1067 and entry["idle_from"] is None
    ladder.observe(Setting(3, 0.0), 1067)  # rung 4 freed nothing over rung 3 (of stage 4's 6)
    assert offer(ladder, TOP)["idle_from"] == 4


def test_a_rung_that_needs_more_memory_keeps_the_margin_of_the_hold_band_as_slack() -> None:
    # the run of 445b387: a newcomer refitted to rung 1 with 10.9 MiB spare for 10.0 needed,
    # its peak crept a MiB and it climbed back; with the ladder's margin (0.1) a refit that adds
    # memory keeps a tenth of the hold band (74 - 12 MiB) beyond what it adds
    twin = _twin(rung_peaks=((0, 1123), (1, 1075), (2, 1067), (4, 1066)))
    ladder, hold = _ladder(free=28, margin=0.1)  # spare 28 - 13.2 = 14.8: rung 1 needs 9.9 + 6.2
    assert Coordination().refit(hold, TOP, [twin], 0.0, ladder)[0].setting == Setting(2, 0.0)
    ladder, hold = _ladder(free=40, margin=0.1)  # spare 26.8: rung 1 fits with its slack
    assert Coordination().refit(hold, TOP, [twin], 0.0, ladder)[0].setting == Setting(1, 0.0)
    same = _twin(rung_peaks=((0, 1123), (1, 1075), (2, 1066), (4, 1066)))
    ladder, hold = _ladder(free=15, margin=0.1)  # spare 1.8: only a rung that adds nothing
    assert Coordination().refit(hold, TOP, [same], 0.0, ladder)[0].setting == Setting(2, 0.0)
    assert Coordination().refit(hold, TOP, [twin], 0.0, ladder) == (hold, None)  # rung 2: +1.1 + 6.2
