"""The split a full part of a tenant's setting (issue 68): peers see a job's split through the
ledger, an entry of an older version (without it) still loads, the release order gives a split
back after a compression and before any rung, and the refit carries the split it lands on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lightning_bandlimit.ladder import Decision, LadderController, Setting
from lightning_bandlimit.memory import MemoryReading
from lightning_bandlimit.tenants import BadEntry, Coordination, Ledger, Tenant, offer


def _tenant(job: str, **kwargs: object) -> Tenant:
    return Tenant(job=job, pid=1, heartbeat=0.0, **kwargs)  # type: ignore[arg-type]


def test_peers_see_a_jobs_split_through_the_ledger(tmp_path: Path) -> None:
    ladder = LadderController(rungs=2, min_free=200)
    ladder.on_stages_measured([150.0, 150.0])
    ladder.on_splits_chosen((2, 4))
    a, b = Ledger(tmp_path, "gpu-0", job="a"), Ledger(tmp_path, "gpu-0", job="b")
    a.publish(**offer(ladder, Setting(2, 0.0, split=4)))
    b.publish(**offer(ladder, Setting(1, 0.0)))
    [peer] = b.peers()
    assert (peer.job, peer.rung, peer.split, peer.compression) == ("a", 2, 4, 0.0)
    assert [(p.job, p.split) for p in a.peers()] == [("b", 1)]
    assert not peer.setting_differs(Setting(2, 0.0, split=4))
    assert peer.setting_differs(Setting(2, 0.0, split=2)) and peer.setting_differs(Setting(2, 0.0))
    a.beat()  # the heartbeat renews the entry, its split with it
    assert b.peers()[0].split == 4


def test_an_entry_an_older_version_wrote_without_a_split_loads_as_the_whole_batch(tmp_path: Path) -> None:
    a, b = Ledger(tmp_path, "gpu-0", job="a"), Ledger(tmp_path, "gpu-0", job="b")
    written = a.publish(rung=2, compression=0.1, lossy=True, exact_left=False)
    old = {key: value for key, value in json.loads(a.path.read_text()).items() if key != "split"}
    a.path.write_text(json.dumps(old))
    [peer] = b.peers()
    assert peer == written and peer.split == 1
    assert Tenant.from_dict({"job": "c", "pid": 3, "heartbeat": 1.0}).split == 1


@pytest.mark.parametrize("split", [0, -2, 1.5, True, "2", None, float("inf"), 2**32])
def test_a_split_that_is_no_count_of_chunks_is_refused(split: object) -> None:
    with pytest.raises(BadEntry, match="split"):
        Tenant.from_dict({"job": "a", "pid": 1, "heartbeat": 0.0, "split": split})


def test_on_release_a_split_is_given_back_after_a_compression_and_before_any_rung() -> None:
    rule = Coordination()
    release = Decision(1, 0.0, "lower", free=900, threshold=400)
    high = _tenant("a", rung=3)  # the whole batch on its rung 3
    split = _tenant("b", rung=2, split=2)  # two chunks on its top rung 2: further up its ladder
    held, why = rule.decide(release, Setting(3, 0.0), high, [split], at=0)
    assert held.setting == Setting(3, 0.0) and "b give back first" in why
    whole = Decision(2, 0.0, "lower", free=900, threshold=400)  # b's release: its batch whole
    assert rule.decide(whole, Setting(2, 0.0, split=2), split, [high], at=0) == (whole, None)
    # the most chunks first; a split on rung 0 (a ladder of splits only) has something to give
    four = _tenant("c", rung=2, split=4)
    assert "c give back first" in rule.decide(whole, Setting(2, 0.0, split=2), split, [four], at=0)[1]
    only_split = _tenant("b", rung=0, split=2)
    assert "b give back first" in rule.decide(release, Setting(3, 0.0), high, [only_split], at=0)[1]
    # a compression before any split, firmly (as before any rung)
    compressing = _tenant("c", compression=0.3, lossy=True)
    held, why = rule.decide(whole, Setting(2, 0.0, split=2), split, [compressing], at=0)
    assert held.setting == Setting(2, 0.0, split=2) and "compress" in why


def test_from_a_split_down_below_an_idle_rung_is_a_release_as_any_other() -> None:
    # rung 3 measured idle: rung 2 whole needs what rung 3 whole does, more than rung 3 in chunks
    rule = Coordination()
    down = Decision(2, 0.0, "lower", free=300, threshold=200)
    lossy_peer = _tenant("a", compression=0.4, lossy=True)
    whole = _tenant("b", rung=3, idle_from=3)
    assert rule.decide(down, Setting(3, 0.0), whole, [lossy_peer], 0.0) == (down, None)
    chunks = _tenant("b", rung=3, split=2, idle_from=3)
    assert rule.decide(down, Setting(3, 0.0, split=2), chunks, [lossy_peer], 0.0)[0].reason == "hold"


TWIN_PEAKS = ((0, 1123), (1, 1075), (4, 1066))  # a run of the same model, whole batch (MiB)


def _split_ladder(free: int, measured: dict[int, float]) -> tuple[LadderController, Decision]:
    """A newcomer on its top rung 4 in chunks, measured there in ``measured`` chunks (split: peak)."""
    ladder = LadderController(rungs=4, min_free=12, release_free=74, margin=0.0)
    ladder.on_stages_measured([64.0, 36.0, 18.0, 9.0], [48.0, 24.0, 12.0, 6.0])
    ladder.on_splits_chosen((2, 4))
    for split, peak in measured.items():
        ladder.observe(Setting(4, 0.0, split=split), peak)
    current = Setting(4, 0.0, split=max(measured))
    return ladder, ladder.decide(MemoryReading(total=5000, free=free, source="scripted"), current)


def test_refit_from_a_split_lands_on_the_fastest_point_that_fits_with_its_split() -> None:
    twin = _tenant(
        "a", memory=1066, rung_peaks=TWIN_PEAKS, stage_least=(48, 24, 12, 6), stage_most=(48, 24, 12, 6)
    )
    rule = Coordination()
    # in 2 chunks at 1040: rung 0 (+83) and rung 1 (+35) do not fit 28 spare; the top rung's
    # whole batch (the twin's 1066 against this job's 1040: +26) does
    ladder, hold = _split_ladder(free=40, measured={2: 1040.0})
    assert hold.reason == "hold"
    current = Setting(4, 0.0, split=2)
    refitted, why = rule.refit(hold, current, [twin], 0.0, ladder)
    assert refitted.setting == Setting(4, 0.0) and refitted.reason == "lower" and "rung 4 fits" in why
    ladder, hold = _split_ladder(free=50, measured={2: 1040.0})  # 38 spare: rung 1 (+35) fits
    assert rule.refit(hold, current, [twin], 0.0, ladder)[0].setting == Setting(1, 0.0)
    # in 4 chunks at 1000: a smaller split counts by the job's own measure (+40), and the
    # decision carries it
    current = Setting(4, 0.0, split=4)
    ladder, hold = _split_ladder(free=55, measured={2: 1040.0, 4: 1000.0})  # 43 spare
    refitted, why = rule.refit(hold, current, [twin], 0.0, ladder)
    assert refitted.setting == Setting(4, 0.0, split=2) and "rung 4 in 2 chunks fits" in why
    ladder, hold = _split_ladder(free=45, measured={2: 1040.0, 4: 1000.0})  # 33 spare: none fits
    assert rule.refit(hold, current, [twin], 0.0, ladder) == (hold, None)
    ladder, hold = _split_ladder(free=55, measured={2: 1040.0, 4: 1000.0})
    assert rule.refit(hold, current, [], 0.0, ladder)[0].setting == Setting(4, 0.0, split=2)  # its own
