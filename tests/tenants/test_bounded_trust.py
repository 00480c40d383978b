"""Bounded trust: a peer's claims count at most what the device measures, a wait for peers is
bounded in total per shortfall, and an arrival or a lossy hold older than its timeout expires
(issue 54, item 4)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_bandlimit.ladder import Decision, LadderController, Setting
from lightning_bandlimit.tenants import Coordination, Tenant
from lightning_bandlimit.tenants import trust as trust_module
from lightning_bandlimit.tenants.trust import FIRST_STEP_S, bound_claims

MIB = 2**20
FLOOR = Setting(0, 0.0)
EXACT_OFFER = {"exact_left": True, "next_lossy": False, "next_freed": 150.0}


def _tenant(job: str, **kwargs: object) -> Tenant:
    return Tenant(**{"job": job, "pid": 1, "heartbeat": 0.0, **kwargs})  # type: ignore[arg-type]


def _short(current: Setting, free: int = 100) -> Decision:
    """The ladder's raise under a shortfall (free below the 200 of min_free), one rung up while
    any is left (four), else a hold at the top: still short."""
    if current.rung < 4:
        return Decision(current.rung + 1, 0.0, "raise", free=free, threshold=200)
    return Decision(current.rung, 0.0, "hold", free=free, threshold=200)


@pytest.mark.parametrize("patience", [3, 100])
def test_a_peer_always_offering_a_cheaper_move_holds_the_job_patience_checks_in_all(patience: int) -> None:
    rule = Coordination(patience=patience)
    current, held, moves = FLOOR, 0, 0
    for check in range(patience + 20):
        me = _tenant("b", **EXACT_OFFER, rung=current.rung, next_cost=0.2)
        # the peer "moves" at every check (a new rung, a change) and still offers a cheaper move
        peer = _tenant("a", **EXACT_OFFER, rung=check, changed_at=float(check), next_cost=0.1)
        decision, why = rule.decide(_short(current), current, me, [peer], at=float(check))
        if why is not None:
            held += 1
            assert check < patience  # every hold is within the first `patience` checks
        moves += decision.setting != current
        current = decision.setting
    assert held == patience  # in all over the shortfall, not per move
    assert moves == 4 and current.rung == 4  # several moves, none waited for again
    # a check without a shortfall ends it: the next one is waited for afresh
    calm = Decision(current.rung, 0.0, "hold", free=300, threshold=200)
    me = _tenant("b", **EXACT_OFFER, next_cost=0.2)
    peer = _tenant("a", **EXACT_OFFER, next_cost=0.1)
    assert rule.decide(calm, current, me, [peer], at=100.0) == (calm, None)
    assert rule.decide(_short(FLOOR), FLOOR, me, [peer], at=101.0)[0].reason == "hold"


def test_honest_patience_is_unchanged_a_release_waits_in_a_row_until_its_own_move() -> None:
    rule = Coordination(patience=2)
    release = Decision(0, 0.0, "lower", free=900, threshold=400)
    me, ahead = _tenant("b", rung=1), _tenant("a", rung=2)  # a gives back first (one at a time)
    reasons = [rule.decide(release, Setting(1, 0.0), me, [ahead], at=0)[0].reason for _ in range(4)]
    assert reasons == ["hold", "hold", "lower", "hold"]  # let through, then waited for afresh


def test_an_arrival_claiming_for_ever_expires_after_the_arrival_timeout() -> None:
    ladder = LadderController(rungs=2, min_free=200, release_free=400)
    ladder.on_stages_measured([150.0, 150.0])
    ladder.observe(Setting(1, 0.0), 2850)
    rule = Coordination(arrival_timeout=10.0)
    forged = _tenant("x", heartbeat=float("inf"), arriving=True, held=2900)  # a heartbeat for ever
    release = Decision(0, 0.0, "lower", free=900, threshold=400)
    limit = 10.0 + FIRST_STEP_S  # its wait for room and its first step
    for at in (1000.0, 1005.0, 1000.0 + limit):  # seen arriving first at 1000
        peers = rule.expire([forged], at)
        assert peers[0].arriving
        held, _, why = rule.arrivals(release, Setting(1, 0.0), _tenant("a"), peers, at, ladder)
        assert held.setting == Setting(1, 0.0) and "x arrives" in why  # nothing given back
    peers = rule.expire([forged], 1000.5 + limit)
    assert not peers[0].arriving and peers[0].held is None  # taken to have arrived
    assert rule.decide(release, Setting(1, 0.0), _tenant("a"), peers, at=1000.5 + limit) == (release, None)
    # seen not arriving (or gone) and arriving again: a new arrival, counted afresh
    assert rule.expire([], 2000.0) == []
    assert rule.expire([forged], 2001.0)[0].arriving


def test_a_lossy_peers_firm_hold_expires() -> None:
    rule = Coordination(patience=2, lossy_timeout=60.0)
    release = Decision(0, 0.0, "lower", free=900, threshold=400)
    me, stuck = _tenant("a", rung=2), _tenant("b", compression=0.9, lossy=True)
    for at in (0.0, 30.0, 60.0):  # kept firmly for 60 s (patience does not end it)
        held, why = rule.decide(release, Setting(2, 0.0), me, [stuck], at=at)
        assert held.reason == "hold" and "compress" in why
    assert rule.decide(release, Setting(2, 0.0), me, [stuck], at=61.0) == (release, None)
    # checks far apart: the hold lasts more than `patience` checks too (an honest peer's release
    # takes a few of its checks), then expires
    slow = Coordination(patience=2, lossy_timeout=60.0)
    reasons = [slow.decide(release, Setting(2, 0.0), me, [stuck], at=at)[0].reason for at in (0, 1e3, 2e3)]
    assert reasons == ["hold", "hold", "lower"]
    # a shortfall in between: the peer's compression was called for, its time counted afresh
    rule = Coordination(patience=1, lossy_timeout=60.0)
    assert rule.decide(release, Setting(2, 0.0), me, [stuck], at=0.0)[0].reason == "hold"
    rule.decide(Decision(2, 0.0, "hold", free=100, threshold=200), Setting(2, 0.0), me, [stuck], at=50.0)
    assert rule.decide(release, Setting(2, 0.0), me, [stuck], at=100.0)[0].reason == "hold"


def test_a_peer_claiming_to_free_a_tebibyte_is_bounded_by_its_process_memory() -> None:
    rule = Coordination()
    short = Decision(1, 0.0, "raise", free=100 * MIB, threshold=200 * MIB)  # 100 MiB short
    me = _tenant("b", **EXACT_OFFER, next_cost=0.2)
    liar = Tenant("a", 4242, 0.0, exact_left=True, next_lossy=False, next_freed=2.0**40, next_cost=0.1)
    assert rule.decide(short, FLOOR, me, [liar], at=0)[0].reason == "hold"  # taken at its word
    bounded = bound_claims([liar], {4242: 50 * MIB, 1: 10 * MIB})
    assert bounded[0].next_freed == 50 * MIB  # its process holds 50 MiB: no move frees more
    assert Coordination().decide(short, FLOOR, me, bounded, at=0) == (short, None)  # does not cover
    # an unknown saving (taken to cover any shortfall) counts as the process too; what an arrival
    # holds as well; a process the device does not list is taken at its word
    unknown = Tenant("a", 4242, 0.0, exact_left=True, next_lossy=False, next_freed=None)
    assert bound_claims([unknown], {4242: 50 * MIB})[0].next_freed == 50 * MIB
    arriving = Tenant("c", 7, 0.0, arriving=True, held=2**40)
    assert bound_claims([arriving], {7: 5 * MIB})[0].held == 5 * MIB
    assert bound_claims([liar], {}) == [liar]
    honest = Tenant("a", 4242, 0.0, exact_left=True, next_lossy=False, next_freed=20.0 * MIB)
    assert bound_claims([honest], {4242: 50 * MIB}) == [honest]


def _forged_arrival(folder: Path, future: bool) -> None:
    """An entry claiming to arrive, as a job of this user would write it, its heartbeat renewed
    (a stuck arrival) or, edited by hand, far in the future."""
    from lightning_bandlimit.tenants import Ledger
    from lightning_bandlimit.tenants.ledger import host_device

    forged = Ledger(folder, host_device(), job="a-forged")
    forged.publish(arriving=True, held=1_000_000)
    if future:
        entry = json.loads(forged.path.read_text())
        entry["heartbeat"] = entry["heartbeat"] + 1e9
        forged.path.write_text(json.dumps(entry))


@pytest.mark.usefixtures("one_thread")
@pytest.mark.parametrize("future", [False, True])
def test_a_job_beside_a_forged_arrival_gives_its_compression_back(
    tmp_path: Path, future: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    from _helpers import SCRIPTED_ADAPTIVE, cpu_trainer

    from lightning_bandlimit.callbacks import AdaptiveBandLimit, SharedDevice
    from lightning_bandlimit.data import SyntheticImageDataModule
    from lightning_bandlimit.memory import ScriptedProbe
    from lightning_bandlimit.models import ImageClassifier

    monkeypatch.setattr(trust_module, "FIRST_STEP_S", 0.0)
    m = 1_000_000
    frees = [80 * m] * 2 + [1 * m] * 8 + [80 * m] * 16  # deep enough to compress, then calm

    def fit(root: Path, arrival_timeout: float | None) -> AdaptiveBandLimit:
        adaptive = AdaptiveBandLimit(probe=ScriptedProbe(free=frees, total=100 * m), **SCRIPTED_ADAPTIVE)
        callbacks: list = [adaptive]
        if arrival_timeout is not None:
            _forged_arrival(root / "ledger", future)
            callbacks.append(SharedDevice(root / "ledger", job="b-job", arrival_timeout=arrival_timeout))
        trainer = cpu_trainer(callbacks, default_root_dir=root, max_steps=len(frees), limit_val_batches=0)
        data = SyntheticImageDataModule(train_size=64, val_size=8, test_size=8, batch_size=16)
        trainer.fit(ImageClassifier("cifar_resnet18", width=4), data)
        return adaptive

    alone = fit(tmp_path / "alone", None)
    assert max(d["compression"] for d in alone.decisions) > 0  # it compressed
    assert alone.decisions[-1]["compression"] == 0  # and, alone, gave it back
    beside = fit(tmp_path / "beside", arrival_timeout=0.0)  # expires at the next check
    assert max(d["compression"] for d in beside.decisions) > 0
    assert beside.decisions[-1]["compression"] == 0  # the forged arrival expired: given back too
    if not future:  # a live-looking entry: without the bound it would keep the compression
        kept = fit(tmp_path / "kept", arrival_timeout=3600.0)
        assert kept.decisions[-1]["compression"] > 0
