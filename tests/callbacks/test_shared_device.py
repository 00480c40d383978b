"""SharedDevice in a Trainer: the job's ladder decisions go through the rule its device's
tenants share (peers are entries other jobs wrote in the ledger folder)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _helpers import SCRIPTED_ADAPTIVE, cpu_trainer

from lightning_bandlimit.callbacks import AdaptiveBandLimit, SharedDevice
from lightning_bandlimit.data import SyntheticImageDataModule
from lightning_bandlimit.memory import ScriptedProbe
from lightning_bandlimit.models import ImageClassifier
from lightning_bandlimit.tenants import Ledger
from lightning_bandlimit.tenants.ledger import host_device

pytestmark = pytest.mark.usefixtures("one_thread")

M = 1_000_000
TOTAL = 100 * M
SHORT = [80 * M] * 3 + [19 * M] * 8 + [80 * M] * 6  # 1 MB under min_free (20 MB) for eight checks


def _fit(tmp_path: Path, shared: SharedDevice | None, frees: list[int] = SHORT) -> AdaptiveBandLimit:
    adaptive = AdaptiveBandLimit(probe=ScriptedProbe(free=frees, total=TOTAL), **SCRIPTED_ADAPTIVE)
    callbacks = [adaptive] if shared is None else [adaptive, shared]
    trainer = cpu_trainer(callbacks, default_root_dir=tmp_path, max_steps=len(frees), limit_val_batches=0)
    data = SyntheticImageDataModule(train_size=64, val_size=8, test_size=8, batch_size=16)
    trainer.fit(ImageClassifier("cifar_resnet18", width=4), data)
    return adaptive


def _peer(folder: Path, **offer: object) -> Ledger:
    peer = Ledger(folder, host_device(), job="a-peer")  # sorts before "b-job": first at equal cost
    peer.publish(**offer)
    return peer


def _first_raise(adaptive: AdaptiveBandLimit) -> int:
    return next(d["step"] for d in adaptive.decisions if d["reason"] == "raise")


def test_alone_the_job_climbs_as_without_it(tmp_path: Path) -> None:
    alone = _fit(tmp_path / "a", None)
    shared = SharedDevice(tmp_path / "ledger", job="b-job", patience=3)
    with_it = _fit(tmp_path / "b", shared)
    assert [(d["step"], d["rung"]) for d in with_it.decisions] == [
        (d["step"], d["rung"]) for d in alone.decisions
    ]
    assert shared.holds == []
    assert not list((tmp_path / "ledger").glob("*/*.json"))  # left at teardown


def test_a_peers_cheaper_exact_move_is_waited_for_then_patience_ends_the_wait(tmp_path: Path) -> None:
    alone = _fit(tmp_path / "a", None)
    folder = tmp_path / "ledger"
    _peer(folder, exact_left=True, next_lossy=False, next_freed=50 * M)  # covers the 1 MB short
    shared = SharedDevice(folder, job="b-job", patience=3)
    adaptive = _fit(tmp_path / "b", shared)
    assert {h["held"] for h in shared.holds} == {"raise"} and all("a-peer" in h["why"] for h in shared.holds)
    assert _first_raise(adaptive) == _first_raise(alone) + 3  # it moved after three checks held
    raises = [sum(d["reason"] == "raise" for d in cb.decisions) for cb in (adaptive, alone)]
    assert 0 < raises[0] < raises[1]  # a peer that never moves delays the job, never stops it
    assert not list(folder.glob("*/b-job.json"))  # it left the ledger at teardown


def test_a_lossy_peer_keeps_the_jobs_exact_rung_on_release(tmp_path: Path) -> None:
    folder = tmp_path / "ledger"
    peer = _peer(folder, rung=0, compression=0.4, lossy=True)
    shared = SharedDevice(folder, job="b-job")
    frees = [80 * M] * 3 + [19 * M] * 2 + [80 * M] * 10
    assert _fit(tmp_path / "a", None, frees=frees).decisions[-1]["rung"] == 0  # alone: given back
    adaptive = _fit(tmp_path / "b", shared, frees=frees)
    assert adaptive.decisions[-1]["rung"] > 0  # kept: the peer still compresses
    assert any(h["held"] == "lower" and "compress" in h["why"] for h in shared.holds)
    peer.leave()


def test_without_an_adaptive_callback_it_says_what_is_missing(tmp_path: Path) -> None:
    trainer = cpu_trainer([SharedDevice(tmp_path)], max_steps=1, limit_val_batches=0)
    data = SyntheticImageDataModule(train_size=16, val_size=8, test_size=8, batch_size=16)
    with pytest.raises(ValueError, match="AdaptiveBandLimit"):
        trainer.fit(ImageClassifier("cifar_resnet18", width=4), data)


def test_the_peers_published_memory_reaches_the_ladder_before_it_decides(tmp_path: Path) -> None:
    # a peer's own change (giving back a rung) is not others' growth to the ladder: the memory
    # the peers published is handed to the controller at every check, before it decides
    folder = tmp_path / "ledger"
    _peer(folder, memory=7 * M)
    Ledger(folder, host_device(), job="another").publish(memory=5 * M)
    shared = SharedDevice(folder, job="b-job")
    adaptive = _fit(tmp_path / "a", shared)
    assert adaptive.controller.peer_memory == 12 * M
    assert adaptive.controller.state_dict()["last_peers"] == 12 * M
    unknown = tmp_path / "unknown"
    _peer(unknown, memory=None)
    adaptive = _fit(tmp_path / "b", SharedDevice(unknown, job="b-job"))
    assert adaptive.controller.peer_memory is None  # one peer's is unknown: none subtracted
    assert _fit(tmp_path / "c", None).controller.peer_memory is None  # alone, no ledger
