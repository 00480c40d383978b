"""The rule the tenants of one device share, driven on a simulated device: free = total -
co-tenant - every job's memory at the setting it runs on."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from lightning_bandlimit.ladder import Decision, LadderController, Setting
from lightning_bandlimit.memory import MemoryReading
from lightning_bandlimit.tenants import Coordination, Ledger, Tenant, offer

FLOOR = Setting(0, 0.0)


def _memory(setting: Setting) -> float:
    """A job's memory: 3000 at rung 0, each of two rungs frees 150, compression frees 100 per 0.1."""
    return 3000 - 150 * setting.rung - 1000 * setting.compression


def _ladder() -> LadderController:
    ladder = LadderController(rungs=2, min_free=200, release_free=400, release_checks=2, cooldown_checks=1)
    ladder.on_stages_measured([150.0, 150.0])
    return ladder


def _run(
    tmp_path: Path, jobs: int, cotenant: list[int], coordinate: bool, memory: Callable = _memory
) -> tuple[list[list[Setting]], list[float]]:
    """Each step every job checks in turn (one second apart) and reads the device as it was at
    the step's start: a change shows in memory only after the next step, while the ledger shows
    it at once. The device holds the jobs' memory at rung 0 and 600 bytes more. Returns each
    job's settings per step and the free memory per step."""
    total = jobs * int(memory(FLOOR)) + 600
    ladders = [_ladder() for _ in range(jobs)]
    rules = [Coordination(dwell=jobs - 0.5) for _ in range(jobs)]  # a peer changed within the round
    clock = [0.0]
    ledgers = [Ledger(tmp_path, "gpu-0", job=f"job{i}", clock=lambda: clock[0]) for i in range(jobs)]
    settings = [FLOOR] * jobs
    changed = [0.0] * jobs
    history: list[list[Setting]] = [[] for _ in range(jobs)]
    frees = []
    for used in cotenant:
        free = total - used - sum(memory(s) for s in settings)
        for i in range(jobs):
            clock[0] += 1.0
            ladders[i].observe(settings[i], memory(settings[i]))
            decision = ladders[i].decide(MemoryReading(total, max(0, int(free)), "scripted"), settings[i])
            me = ledgers[i].publish(**offer(ladders[i], settings[i]), changed_at=changed[i])
            if coordinate:
                decision, _ = rules[i].decide(decision, settings[i], me, ledgers[i].peers(), clock[0])
            if decision.setting != settings[i]:
                changed[i] = clock[0]
                settings[i] = decision.setting
                ledgers[i].publish(**offer(ladders[i], settings[i]), changed_at=changed[i])
        for i in range(jobs):
            history[i].append(settings[i])
        frees.append(total - used - sum(memory(s) for s in settings))
    return history, frees


def _changes(history: list[Setting]) -> int:
    return sum(a != b for a, b in zip(history, history[1:]))


SQUEEZE = [0] * 3 + [500] * 12 + [0] * 12  # 100 free, 100 short: one job's rung 1 covers it


def test_independent_jobs_both_climb_for_a_squeeze_one_could_absorb(tmp_path: Path) -> None:
    history, frees = _run(tmp_path, 2, SQUEEZE, coordinate=False)
    assert all(max(s.rung for s in h) > 0 for h in history)  # the over-reaction: both paid


def test_coordinated_jobs_meet_the_squeeze_with_one_job_exact_rungs(tmp_path: Path) -> None:
    history, frees = _run(tmp_path, 2, SQUEEZE, coordinate=True)
    climbed = [max(s.rung for s in h) > 0 for h in history]
    assert climbed.count(True) == 1  # one job paid
    assert all(s.compression == 0 for h in history for s in h)  # exact only
    assert min(frees) >= 0  # never over the device
    assert all(h[-1] == FLOOR for h in history)  # and all given back


def test_coordination_changes_levers_less_often_than_independent_jobs(tmp_path: Path) -> None:
    alone, _ = _run(tmp_path / "a", 3, SQUEEZE, coordinate=False)
    shared, _ = _run(tmp_path / "b", 3, SQUEEZE, coordinate=True)
    assert sum(map(_changes, shared)) < sum(map(_changes, alone))


def test_a_deep_squeeze_uses_every_exact_rung_of_every_job_before_any_compression(tmp_path: Path) -> None:
    deep = [0] * 3 + [300] * 4 + [1300] * 12 + [0] * 30  # then more than all four exact rungs free
    history, frees = _run(tmp_path / "a", 2, deep, coordinate=True)
    _, alone = _run(tmp_path / "b", 2, deep, coordinate=False)
    assert any(s.compression > 0 for h in history for s in h)
    for step in range(len(deep)):
        settings = [h[step] for h in history]
        if any(s.compression > 0 for s in settings):
            assert all(s.rung == 2 or s.compression > 0 for s in settings), (step, settings)
    # the jump is larger than what the levers free within one check: over once; alone, both
    # jobs also give back their compression at once afterwards, and overdraw again
    assert sum(f < 0 for f in frees) == 1 < sum(f < 0 for f in alone)
    assert all(h[-1] == FLOOR for h in history)


def test_alone_the_rule_changes_nothing(tmp_path: Path) -> None:
    single, _ = _run(tmp_path / "a", 1, SQUEEZE, coordinate=True)
    plain, _ = _run(tmp_path / "b", 1, SQUEEZE, coordinate=False)
    assert single == plain


def _tenant(job: str, **kwargs: object) -> Tenant:
    return Tenant(job=job, pid=1, heartbeat=0.0, **kwargs)  # type: ignore[arg-type]


RAISE = Decision(1, 0.0, "raise", free=100, threshold=200)  # 100 short
EXACT_OFFER = {"exact_left": True, "next_lossy": False, "next_freed": 150.0}


def test_the_cheapest_move_first_then_the_job_name() -> None:
    rule = Coordination()
    me = _tenant("b", **EXACT_OFFER, next_cost=0.1)
    cheaper = _tenant("c", **EXACT_OFFER, next_cost=0.05)
    dearer = _tenant("a", **EXACT_OFFER, next_cost=0.2)
    assert rule.decide(RAISE, FLOOR, me, [dearer], at=0)[0] == RAISE
    held, why = rule.decide(RAISE, FLOOR, me, [cheaper], at=0)
    assert held.reason == "hold" and "c" in why
    small = _tenant("c", **{**EXACT_OFFER, "next_freed": 50.0}, next_cost=0.05)  # does not cover 100
    assert rule.decide(RAISE, FLOOR, me, [small], at=0)[0] == RAISE


def test_among_moves_not_measured_yet_the_one_freeing_most_goes_first() -> None:
    # a's next rung frees 12 (a stage far from the peak), b's 48: both costs unknown
    rule = Coordination()
    a = _tenant("a", **{**EXACT_OFFER, "next_freed": 12.0})
    b = _tenant("b", **{**EXACT_OFFER, "next_freed": 48.0})
    short = Decision(1, 0.0, "raise", free=190, threshold=200)  # 10 short: either covers it
    held, why = rule.decide(short, FLOOR, a, [b], at=0)
    assert held.reason == "hold" and "b" in why  # not the name's order
    assert rule.decide(short, FLOOR, b, [a], at=0)[0] == short
    measured = _tenant("b", **{**EXACT_OFFER, "next_freed": 48.0}, next_cost=0.5)
    assert rule.decide(short, FLOOR, a, [measured], at=0)[0] == short  # a measured cost comes after


def test_a_lossy_move_waits_for_any_exact_rung_left_but_not_when_nothing_is_free() -> None:
    rule = Coordination(patience=5)
    me = _tenant("a", rung=2, next_lossy=True, next_freed=400.0)
    compress = Decision(2, 0.2, "raise", free=100, threshold=200)
    peer = _tenant("b", exact_left=True, next_lossy=False, next_freed=None)
    held, why = rule.decide(compress, Setting(2, 0.0), me, [peer], at=0)
    assert held.setting == Setting(2, 0.0) and "exact" in why
    overdrawn = Decision(2, 0.2, "raise", free=0, threshold=200)
    assert rule.decide(overdrawn, Setting(2, 0.0), me, [peer], at=0)[0] == overdrawn


def test_patience_ends_a_hold_under_pressure() -> None:
    rule = Coordination(patience=2)
    me, peer = _tenant("b", **EXACT_OFFER), _tenant("a", **EXACT_OFFER)
    reasons = [rule.decide(RAISE, FLOOR, me, [peer], at=0)[0].reason for _ in range(3)]
    assert reasons == ["hold", "hold", "raise"]


def test_a_peers_recent_change_is_waited_for() -> None:
    rule = Coordination(dwell=10.0)
    me, peer = _tenant("a", **EXACT_OFFER), _tenant("b", changed_at=95.0)
    assert rule.decide(RAISE, FLOOR, me, [peer], at=100.0)[0].reason == "hold"
    assert rule.decide(RAISE, FLOOR, me, [peer], at=106.0)[0] == RAISE


def test_release_gives_back_lossy_levers_first_across_jobs_and_firmly() -> None:
    rule = Coordination(patience=1)
    release = Decision(0, 0.0, "lower", free=900, threshold=400)
    me = _tenant("a", rung=2)
    compressing = _tenant("b", rung=0, compression=0.3, lossy=True)
    for _ in range(3):  # patience does not end it: an exact rung is kept while a peer compresses
        held, why = rule.decide(release, Setting(2, 0.0), me, [compressing], at=0)
        assert held.reason == "hold" and "compress" in why
    assert rule.decide(release, Setting(2, 0.0), me, [_tenant("b", rung=1)], at=0)[0] == release


def test_holds_and_out_of_memory_pass_through() -> None:
    rule = Coordination()
    hold = Decision(0, 0.0, "hold", free=500, threshold=200)
    assert rule.decide(hold, FLOOR, _tenant("b"), [_tenant("a", **EXACT_OFFER)], at=0) == (hold, None)


def test_offer_names_the_next_move_and_what_it_frees() -> None:
    ladder = _ladder()
    ladder.observe(FLOOR, 3000)
    hinted = offer(ladder, FLOOR)
    assert (hinted["exact_left"], hinted["next_lossy"], hinted["next_freed"]) == (True, False, 150.0)
    assert hinted["memory"] == 3000  # its measured peak at the setting
    ladder.observe(Setting(1, 0.0), 2900)  # measured: rung 1 frees 100
    ladder.observe_time(0, 1.0)
    ladder.observe_time(1, 1.2)
    measured = offer(ladder, FLOOR)
    assert measured["next_freed"] == 100.0
    assert measured["next_cost"] == pytest.approx(0.2 / (100 / 2**30))
    top = offer(ladder, Setting(2, 0.0))
    assert (top["exact_left"], top["next_lossy"]) == (False, True)
    end = offer(ladder, Setting(ladder.lossy_rung, ladder.max_compression))
    assert end["next_lossy"] is None and end["lossy"] is True


def test_offer_past_the_top_rung_is_the_next_split_with_its_cost() -> None:
    ladder = _ladder()
    ladder.on_splits_chosen((2, 4))
    ladder.observe(FLOOR, 3000, base=1000)
    ladder.observe(Setting(2, 0.0), 2600, base=1000)
    top = offer(ladder, Setting(2, 0.0))
    assert (top["exact_left"], top["next_lossy"]) == (True, False)
    assert top["next_freed"] == 800.0  # split 2 hinted: half the top rung's increment of 1600
    ladder.observe(Setting(2, 0.0, split=2), 2000, base=1000)  # measured: it frees 600
    ladder.observe_time(0, 1.0)
    ladder.observe_time(2, 1.3)
    ladder.observe_time(2, 1.5, split=2)
    measured = offer(ladder, Setting(2, 0.0))
    assert measured["next_freed"] == 600.0
    assert measured["next_cost"] == pytest.approx(0.2 / (600 / 2**30))  # 1.5x against 1.3x
    last = offer(ladder, Setting(2, 0.0, split=4))
    assert (last["exact_left"], last["next_lossy"]) == (False, True)


@pytest.mark.parametrize(("kwargs", "error"), [({"dwell": -1.0}, ValueError), ({"patience": 0}, ValueError)])
def test_bad_rule_arguments(kwargs: dict, error: type) -> None:
    with pytest.raises(error):
        Coordination(**kwargs)


def _arrival(tmp_path: Path, coordinate: bool) -> tuple[Setting, tuple[str, ...], int]:
    """A job at rung 0 alone on a device of 5650 bytes; a newcomer holding 1000 (its memory at
    rung 0 is 3000, as the job's) announces itself. Returns the job's setting after its check,
    the arrivals it confirmed room for, and the free memory during the newcomer's first step
    (on its top rung when coordinated, else on rung 0). No rung is hinted to make the room: the
    job climbs one rung a check, each measured before the next."""
    total = 5650
    ladder = _ladder()
    ladder.observe(FLOOR, _memory(FLOOR))
    job, newcomer = Ledger(tmp_path, "gpu-0", job="a"), Ledger(tmp_path, "gpu-0", job="b")
    newcomer.publish(arriving=True, held=1000, coordinates=True)
    setting, room, rule = FLOOR, (), Coordination()
    for _ in range(3):  # the job's checks: a rung at a time, measured; the newcomer waits for its room
        free = int(total - _memory(setting) - 1000)
        ladder.observe(setting, _memory(setting))
        decision = ladder.decide(MemoryReading(total, free, "scripted"), setting)
        if coordinate:
            me = job.publish(**offer(ladder, setting), coordinates=True)
            decision, room, _ = rule.arrivals(decision, setting, me, job.peers(), 1.0, ladder)
            assert room or decision.setting != setting  # room made is confirmed by the next check
        setting = decision.setting
    first = Setting(2, 0.0) if coordinate else FLOOR
    return setting, room, int(total - _memory(setting) - _memory(first))


def test_an_arrival_finds_room_made_by_exact_rungs_before_its_first_step(tmp_path: Path) -> None:
    setting, room, free = _arrival(tmp_path / "a", coordinate=True)
    assert setting.compression == 0 and setting.rung > 0 and room == ("b",)
    assert free >= 0
    setting, room, free = _arrival(tmp_path / "b", coordinate=False)
    assert setting == FLOOR and free < 0  # unannounced, the newcomer's first step overdraws


def test_two_incumbents_on_one_snapshot_make_the_room_once(tmp_path: Path) -> None:
    # a and b at rung 0 (3000 each), a newcomer holding 1000 that needs 2000 more: 250 short of
    # min_free (200) on a device of 8950; one job's rung 2 (hinted 300) makes the room, its rung 1
    # (150, what it publishes as its next move) does not. Each round both check in turn on the
    # device as it was at the round's start (a move shows in memory after the next step).
    total, held = 8950, 1000
    ladders = {job: _ladder() for job in "ab"}
    ledgers = {job: Ledger(tmp_path, "gpu-0", job=job) for job in "ab"}
    settings = dict.fromkeys("ab", FLOOR)
    rules = {job: Coordination() for job in "ab"}
    for job in "ab":
        ladders[job].observe(FLOOR, _memory(FLOOR))
        ledgers[job].publish(**offer(ladders[job], FLOOR), coordinates=True)
    Ledger(tmp_path, "gpu-0", job="c").publish(arriving=True, held=held, coordinates=True)
    confirmed: dict[str, tuple[str, ...]] = {}
    making = dict.fromkeys("ab", False)  # what SharedDevice publishes: the last check moved for room
    for _ in range(3):
        free = int(total - held - sum(_memory(s) for s in settings.values()))
        for job in "ab":
            ladder, setting = ladders[job], settings[job]
            ladder.observe(setting, _memory(setting))
            decision = ladder.decide(MemoryReading(total, free, "scripted"), setting)
            mine = {"coordinates": True, "room_for": confirmed.get(job, ()), "making_room": making[job]}
            me = ledgers[job].publish(**offer(ladder, setting), **mine)
            decision, room, _ = rules[job].arrivals(decision, setting, me, ledgers[job].peers(), 1.0, ladder)
            making[job] = decision.reason == "raise" and decision.setting != setting
            settings[job], confirmed[job] = decision.setting, room
            mine = {"coordinates": True, "room_for": room, "making_room": making[job]}
            ledgers[job].publish(**offer(ladder, settings[job]), **mine)
    assert settings == {"a": Setting(2, 0.0), "b": FLOOR}  # a made the room; b, left it to a, kept rung 0
    assert confirmed == {"a": ("c",), "b": ("c",)}
    assert total - held - sum(_memory(s) for s in settings.values()) - 2000 >= 200  # the room is there


def test_while_a_peer_arrives_nothing_is_given_back_nor_compressed() -> None:
    rule, ladder = Coordination(), _ladder()
    ladder.observe(FLOOR, 3000)
    newcomer = _tenant("b", arriving=True, held=2900)  # 100 more than it holds: room enough
    release = Decision(0, 0.0, "lower", free=900, threshold=400)
    held, room, why = rule.arrivals(release, Setting(1, 0.0), _tenant("a"), [newcomer], 0.0, ladder)
    assert held.setting == Setting(1, 0.0) and room == ("b",) and "b arrives" in why
    # on its top rung with nothing exact left: room is not made by compressing
    ladder.observe(Setting(2, 0.0), 2700)
    calm = Decision(2, 0.0, "hold", free=300, threshold=200)
    stays, room, _ = rule.arrivals(
        calm, Setting(2, 0.0), _tenant("a"), [_tenant("b", arriving=True)], 0.0, ladder
    )
    assert stays == calm and room == ("b",)
    # its own raise goes through Coordination.decide instead: returned unchanged, no room confirmed
    assert rule.arrivals(RAISE, FLOOR, _tenant("a"), [newcomer], 0.0, ladder) == (RAISE, (), None)
    assert rule.arrivals(release, FLOOR, _tenant("a"), [_tenant("b")], 0.0, ladder) == (release, (), None)


def test_room_for_an_arrival_is_left_to_a_cheaper_peer_and_waits_for_a_recent_change() -> None:
    rule, ladder = Coordination(dwell=5.0), _ladder()
    ladder.observe(FLOOR, 3000)
    newcomer = _tenant("c", arriving=True, held=2900)
    calm = Decision(0, 0.0, "hold", free=250, threshold=200)  # 50 short of the newcomer's 100
    me = _tenant("b", **EXACT_OFFER, next_cost=0.2)
    cheaper = _tenant("a", **EXACT_OFFER, next_cost=0.1)
    held, room, why = rule.arrivals(calm, FLOOR, me, [cheaper, newcomer], 100.0, ladder)
    assert held == calm and room == ("c",) and "a" in why  # a's move covers it: b confirms
    moved, room, _ = rule.arrivals(calm, FLOOR, me, [newcomer], 100.0, ladder)
    assert moved.setting.rung > 0 and moved.setting.compression == 0 and room == ()  # confirmed next check
    recent = _tenant("a", changed_at=98.0)
    waits, room, why = rule.arrivals(calm, FLOOR, me, [recent, newcomer], 100.0, ladder)
    assert waits == calm and room == () and "within" in why  # not in the readings yet: no room confirmed


def test_room_for_an_arrival_is_made_by_one_job_at_a_time() -> None:
    # 200 short of the newcomer's 100 and min_free: a's next rung (cheaper) frees 50, not enough
    rule, ladder = Coordination(), _ladder()
    ladder.observe(FLOOR, 3000)
    newcomer = _tenant("c", arriving=True, held=2900)
    calm = Decision(0, 0.0, "hold", free=100, threshold=200)
    me = _tenant("b", **EXACT_OFFER, next_cost=0.2, coordinates=True)
    small = {**EXACT_OFFER, "next_freed": 50.0, "coordinates": True}
    making = _tenant("a", **small, next_cost=0.1)
    held, room, why = rule.arrivals(calm, FLOOR, me, [making, newcomer], 0.0, ladder)
    assert held == calm and room == () and "a make room first" in why  # nothing confirmed
    # a on the same snapshot: nobody cheaper, it climbs (both climbing would make room twice)
    first = _tenant("a", **small, next_cost=0.1)
    moved, room, _ = rule.arrivals(calm, FLOOR, first, [me, newcomer], 0.0, ladder)
    assert moved.setting.rung > 0 and room == ()
    # once a confirmed its room (found it, or nothing exact left), b judges its own reading
    done = _tenant("a", **small, next_cost=0.1, room_for=("c",))
    alone = _tenant("a", **{**small, "coordinates": False}, next_cost=0.1)  # or a does not coordinate
    for peer in (done, alone):
        moved, room, _ = rule.arrivals(calm, FLOOR, me, [peer, newcomer], 0.0, ladder)
        assert moved.setting.rung > 0 and room == ()


def test_room_for_an_arrival_is_sized_by_a_top_rung_measured_and_noise_is_not_acted_on() -> None:
    # the newcomer (holding 1000) runs its first step on its top rung: 2700 where a job measured
    # it, 300 less than the 3000 measured on rung 0
    newcomer = _tenant("b", arriving=True, held=1000)
    calm = Decision(0, 0.0, "hold", free=2000, threshold=200)  # room for 1800 more and min_free
    rule = Coordination()
    unmeasured = _ladder()
    unmeasured.observe(FLOOR, 3000)
    moved, room, why = rule.arrivals(calm, FLOOR, _tenant("a"), [newcomer], 0.0, unmeasured)
    assert moved.setting.rung > 0 and room == () and "as much as a job here measured" in why
    measured = _ladder()
    measured.observe(Setting(2, 0.0), 2700)
    measured.observe(FLOOR, 3000)
    assert offer(measured, FLOOR)["top_memory"] == 2700 and offer(unmeasured, FLOOR)["top_memory"] is None
    stays, room, _ = rule.arrivals(calm, FLOOR, _tenant("a"), [newcomer], 0.0, measured)
    assert stays == calm and room == ("b",)
    # a peer's top rung serves too (runs of one sweep)
    peer = _tenant("c", memory=3000, top_memory=2700)
    stays, room, _ = rule.arrivals(calm, FLOOR, _tenant("a"), [peer, newcomer], 0.0, unmeasured)
    assert stays == calm and room == ("b",)
    # short by no more than the noise of the job's own peak (50 here): room, without a move
    noisy = _ladder()
    for peak in (2900, 3000, 3050):  # the first step's is short of a step's: not noise
        noisy.observe(FLOOR, peak)
    assert noisy.peak_noise == 50
    for free, confirmed in ((1880, True), (1820, False)):  # 1900 wanted: 20 and 80 short
        short = Decision(0, 0.0, "hold", free=free, threshold=200)
        decision, room, _ = rule.arrivals(short, FLOOR, _tenant("a"), [peer, newcomer], 0.0, noisy)
        assert (decision == short and room == ("b",)) if confirmed else decision.setting.rung > 0


def _four_rungs(*rungs: int) -> LadderController:
    """A job of four rungs (each hinted and measured to free 150) measured on ``rungs``."""
    ladder = LadderController(rungs=4, min_free=200, release_free=400)
    ladder.on_stages_measured([150.0] * 4)
    for rung in rungs:
        ladder.observe(Setting(rung, 0.0), _memory(Setting(rung, 0.0)))
    return ladder


def test_room_for_an_arrival_is_sized_by_the_least_peak_a_job_measured_where_no_top_rung_was() -> None:
    # a rung more never needs more memory: the newcomer's first step (on its top rung) needs at
    # most the 2850 this job measured on rung 1, not the 3000 of its rung 0
    newcomer = _tenant("b", arriving=True, held=1000)
    calm = Decision(1, 0.0, "hold", free=2100, threshold=200)  # room for 1900 more and min_free
    rule = Coordination()
    stays, room, _ = rule.arrivals(calm, Setting(1, 0.0), _tenant("a"), [newcomer], 0.0, _four_rungs(0, 1))
    assert stays == calm and room == ("b",)
    # a peer whose least is 2950 (a job that measured no rung counts at its memory)
    for peer in (_tenant("c", rung_peaks=((0, 3100), (1, 2950))), _tenant("c", memory=2950)):
        ladder = _four_rungs(0, 1)
        moved, room, why = rule.arrivals(calm, Setting(1, 0.0), _tenant("a"), [peer, newcomer], 0.0, ladder)
        assert moved.setting.rung > 1 and room == () and "on its highest rung" in why


def test_room_sized_by_the_job_own_peak_is_made_by_the_rung_that_lowers_both() -> None:
    # 500 short of the newcomer's 2000 (as the job's 3000 on rung 0) and min_free: each rung frees
    # 150 and lowers the estimate by as much, so rung 2 (300 freed, 300 less needed) makes the room
    newcomer = _tenant("b", arriving=True, held=1000)
    calm = Decision(0, 0.0, "hold", free=1700, threshold=200)
    rule = Coordination()
    moved, room, _ = rule.arrivals(calm, FLOOR, _tenant("a"), [newcomer], 0.0, _four_rungs(0))
    assert moved.setting == Setting(2, 0.0) and room == ()
    ladder = _four_rungs(0, 2)  # the next check: measured there, 2000 free
    after = Decision(2, 0.0, "hold", free=2000, threshold=200)
    stays, room, _ = rule.arrivals(after, Setting(2, 0.0), _tenant("a"), [newcomer], 0.0, ladder)
    assert stays == after and room == ("b",)
    assert 2000 - (_memory(Setting(4, 0.0)) - 1000) >= 200  # its first step on rung 4 fits
    # a peer's least (2900) bounds how far the estimate falls: rung 3 (450 freed, 100 less needed)
    peer = _tenant("c", rung_peaks=((0, 2900),))
    moved, room, _ = rule.arrivals(calm, FLOOR, _tenant("a"), [peer, newcomer], 0.0, _four_rungs(0))
    assert moved.setting == Setting(3, 0.0) and room == ()


def test_room_once_confirmed_is_not_made_again_while_the_newcomer_runs_its_first_step() -> None:
    ladder = _ladder()
    ladder.observe(FLOOR, 3000)
    newcomer = _tenant("b", arriving=True, held=1000)  # 2000 more, as the job measured
    # the newcomer's first step is under way: 1500 of its 2000 already in the reading
    running = Decision(0, 0.0, "hold", free=700, threshold=200)
    rule = Coordination()
    kept, room, _ = rule.arrivals(running, FLOOR, _tenant("a", room_for=("b",)), [newcomer], 0.0, ladder)
    assert kept == running and room == ("b",)  # confirmed before: nothing made twice
    moved, room, _ = rule.arrivals(running, FLOOR, _tenant("a"), [newcomer], 0.0, ladder)
    assert moved.setting.rung > 0 and room == ()  # not confirmed yet: room for all 2000


def test_going_down_from_an_idle_rung_is_nobodys_business() -> None:
    # rung 3 measured to free nothing over rung 2: down to 2 is the same memory, faster
    rule, ladder = Coordination(), _ladder()
    ladder.observe(FLOOR, 3000)
    me = _tenant("b", rung=3, idle_from=3)
    down = Decision(2, 0.0, "lower", free=300, threshold=200)
    lossy_peer = _tenant("a", rung=0, compression=0.4, lossy=True)  # would hold any other release
    assert rule.decide(down, Setting(3, 0.0), me, [lossy_peer], 0.0) == (down, None)
    arriving = _tenant("c", arriving=True, held=2900)
    assert rule.arrivals(down, Setting(3, 0.0), me, [arriving], 0.0, ladder)[0] == down
    # a release below the idle rung's neighbour is a release as any other
    further = Decision(1, 0.0, "lower", free=300, threshold=200)
    assert rule.decide(further, Setting(3, 0.0), me, [lossy_peer], 0.0)[0].reason == "hold"
    assert rule.arrivals(further, Setting(3, 0.0), me, [arriving], 0.0, ladder)[0].reason == "hold"
    not_idle = _tenant("b", rung=3)
    assert rule.decide(down, Setting(3, 0.0), not_idle, [lossy_peer], 0.0)[0].reason == "hold"
