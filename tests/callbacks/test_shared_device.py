"""SharedDevice in a Trainer: the job's ladder decisions go through the rule its device's
tenants share (peers are entries other jobs wrote in the ledger folder)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from _helpers import SCRIPTED_ADAPTIVE, cpu_trainer
from lightning.pytorch.callbacks import Callback

from lightning_bandlimit.callbacks import AdaptiveBandLimit, SharedDevice
from lightning_bandlimit.callbacks.ladder_reading import held_bytes
from lightning_bandlimit.data import SyntheticImageDataModule
from lightning_bandlimit.ladder import Decision, Setting
from lightning_bandlimit.memory import MemoryProbe, MemoryReading, ProbeUnavailable, ScriptedProbe
from lightning_bandlimit.models import ImageClassifier
from lightning_bandlimit.recompute.switch import is_checkpointed
from lightning_bandlimit.tenants import Ledger, Tenant
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
    raises = sum(d["reason"] == "raise" for d in adaptive.decisions)
    # a peer that never moves delays the job, never stops it: patience counts over the whole
    # shortfall, so after its three checks held the job is never held again while it is short
    late = [h for h in shared.holds if h["step"] > _first_raise(adaptive)]
    assert raises > 0 and not late
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


class _Steps(Callback):
    """Records the checkpointed units at each step's start (after the callbacks before it)."""

    def __init__(self) -> None:
        self.checkpointed: list[int] = []

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.checkpointed.append(sum(is_checkpointed(m) for m in pl_module.modules()))


def _arrive(tmp_path: Path, shared: SharedDevice) -> tuple[AdaptiveBandLimit, _Steps]:
    adaptive = AdaptiveBandLimit(probe=ScriptedProbe(free=[80 * M] * 4, total=TOTAL), **SCRIPTED_ADAPTIVE)
    steps = _Steps()
    trainer = cpu_trainer(
        [adaptive, shared, steps], default_root_dir=tmp_path, max_steps=4, limit_val_batches=0
    )
    data = SyntheticImageDataModule(train_size=64, val_size=8, test_size=8, batch_size=16)
    trainer.fit(ImageClassifier("cifar_resnet18", width=4), data)
    return adaptive, steps


def test_an_arriving_job_announces_itself_waits_for_room_and_measures_on_its_top_rung(tmp_path: Path) -> None:
    folder = tmp_path / "ledger"
    incumbent = Ledger(folder, host_device(), job="a-peer")
    incumbent.publish(memory=50 * M, coordinates=True)
    seen: list[Tenant] = []

    def make_room() -> None:  # the incumbent's check, a moment later: it sees the arrival, confirms room
        while not any(p.arriving for p in incumbent.peers()):
            time.sleep(0.01)
        seen.extend(incumbent.peers())
        time.sleep(0.3)
        incumbent.publish(memory=50 * M, coordinates=True, room_for=("b-job",))

    helper = threading.Thread(target=make_room)
    helper.start()
    began = time.monotonic()
    adaptive, steps = _arrive(tmp_path / "a", SharedDevice(folder, job="b-job"))
    helper.join()
    assert seen[0].held is not None and seen[0].memory is None  # announced with what it holds
    assert time.monotonic() - began > 0.3  # it waited for the room
    assert steps.checkpointed[0] == 8 and adaptive.decisions[0]["rung"] == 4  # measured on its top rung
    alone, plain = _arrive(tmp_path / "b", SharedDevice(tmp_path / "alone", job="b-job"))
    assert plain.checkpointed[0] == 0 and alone.decisions[0]["rung"] == 0  # alone: on rung 0
    # what each stage frees, unseen on the top rung, comes from the first step's samples: at least
    # what the plain first step measured alone (and at most that plus the stages' inputs)
    sampled, seen_plain = adaptive.controller.stage_savings, alone.controller.stage_savings
    assert sampled is not None and seen_plain is not None and len(sampled) == len(seen_plain) == 4
    for top, zero in zip(sampled, seen_plain, strict=True):
        assert 0.98 * zero <= top <= 1.6 * zero
    # rungs are judged idle against the least a stage may free: the samples' figure less its
    # inputs, at most the plain profile's (which is its own least)
    least = adaptive.controller.stage_least
    assert least is not None and alone.controller.stage_least == seen_plain
    for low, top, zero in zip(least, sampled, seen_plain, strict=True):
        assert low < top and low <= 1.02 * zero


def test_an_arrival_no_peer_makes_room_for_starts_after_the_timeout_with_one_warning(tmp_path: Path) -> None:
    folder = tmp_path / "ledger"
    _peer(folder, memory=50 * M, coordinates=True)  # never confirms
    began = time.monotonic()
    with pytest.warns(UserWarning, match="a-peer made no room within 0.5 s") as record:
        _, steps = _arrive(tmp_path, SharedDevice(folder, job="b-job", arrival_timeout=0.5))
    assert time.monotonic() - began > 0.5 and steps.checkpointed[0] == 8
    assert sum("made no room" in str(w.message) for w in record) == 1
    _peer(tmp_path / "other", memory=50 * M)  # a peer that only publishes: not waited for
    _, steps = _arrive(tmp_path / "b", SharedDevice(tmp_path / "other", job="b-job", arrival_timeout=60))
    assert steps.checkpointed[0] == 0


def test_a_job_makes_room_for_an_arriving_peer_and_gives_nothing_back_meanwhile(tmp_path: Path) -> None:
    folder = tmp_path / "ledger"
    shared = SharedDevice(folder, job="b-job")
    frees = [80 * M] * 3 + [21 * M] * 2 + [80 * M] * 6  # a peer holding 1 MB arrives at step 3
    adaptive = AdaptiveBandLimit(probe=ScriptedProbe(free=frees, total=TOTAL), **SCRIPTED_ADAPTIVE)
    seen: list[tuple[str, ...]] = []  # the job's published room_for at each step's start

    class Arrive(Callback):
        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            if trainer.global_step == 3:
                _peer(folder, arriving=True, held=1 * M, coordinates=True)
            seen.extend(
                p.room_for for p in Ledger(folder, host_device(), job="x").peers() if p.job == "b-job"
            )

    trainer = cpu_trainer([Arrive(), adaptive, shared], default_root_dir=tmp_path, max_steps=len(frees))
    data = SyntheticImageDataModule(train_size=64, val_size=8, test_size=8, batch_size=16)
    trainer.fit(ImageClassifier("cifar_resnet18", width=4), data)
    after = [d for d in adaptive.decisions if d["step"] > 3]
    assert after[0]["rung"] > 0 and all(d["compression"] == 0 for d in after)  # room by exact rungs
    assert all(d["rung"] >= after[0]["rung"] for d in after)  # nothing given back while it arrives
    confirmed = [step for step, room in enumerate(seen) if room == ("a-peer",)]
    assert confirmed == list(range(confirmed[0], len(seen)))  # then at every check
    assert confirmed[0] > after[0]["step"]  # room made is confirmed after a step measured it


def test_what_an_arriving_job_holds_is_its_probes_measure_and_a_failed_probe_counts_nothing() -> None:
    class Own(ScriptedProbe):
        measures_own = True

        def read(self) -> MemoryReading:
            if self.fail:
                raise ProbeUnavailable("gone")
            return MemoryReading(total=TOTAL, free=TOTAL // 2, source="scripted", own=7 * M)

    probe = Own(free=[TOTAL], total=TOTAL)
    probe.fail = False
    assert held_bytes(probe, torch.device("cpu")) == 7 * M
    probe.fail = True
    assert held_bytes(probe, torch.device("cpu")) == 0  # the ladder's next check says the probe stopped
    assert (
        held_bytes(ScriptedProbe(free=[TOTAL], total=TOTAL), torch.device("cpu")) == 0
    )  # steps metered alone


@pytest.mark.parametrize("twin", [True, False])
def test_an_arrival_gives_back_its_top_rung_once_by_a_twins_measure(tmp_path: Path, twin: bool) -> None:
    # 30 MB free of 100: between min_free (20) and release_free (40), where the ladder only holds.
    # A peer that made room publishes, each step, rung 0 measured 1 MB above the top rung, and the
    # newcomer's own stages (a twin: a run of the same model) or others
    folder = tmp_path / "ledger"
    peer = _peer(folder, memory=50 * M, coordinates=True, room_for=("b-job",))
    adaptive = AdaptiveBandLimit(probe=ScriptedProbe(free=[30 * M] * 6, total=TOTAL), **SCRIPTED_ADAPTIVE)

    class Twin(Callback):
        def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
            ladder = adaptive.controller
            top = ladder.rung_memory.points.get(ladder.top)
            if top is None or ladder.stage_least is None:
                return
            least = [int(s) if twin else int(s) // 3 for s in ladder.stage_least]
            peaks = [(0, int(top) + M), (ladder.top, int(top))]
            entry = {"memory": 50 * M, "coordinates": True, "room_for": ("b-job",)}
            peer.publish(**entry, rung_peaks=peaks, stage_least=least, stage_most=least)

    shared, steps = SharedDevice(folder, job="b-job"), _Steps()
    trainer = cpu_trainer(
        [Twin(), adaptive, shared, steps], default_root_dir=tmp_path, max_steps=6, limit_val_batches=0
    )
    data = SyntheticImageDataModule(train_size=64, val_size=8, test_size=8, batch_size=16)
    trainer.fit(ImageClassifier("cifar_resnet18", width=4), data)
    assert steps.checkpointed[0] == 8  # arrived on its top rung
    lowered = [d for d in adaptive.decisions if d["reason"] == "lower"]
    if not twin:  # another model's measure says nothing of this one: the rung is kept
        assert lowered == [] and set(steps.checkpointed) == {8}
        return
    assert len(lowered) == 1 and lowered[0]["rung"] == 0  # rung 0 at once, and only once
    assert steps.checkpointed[-1] == 0 and shared.state_dict()["refit"] is False


class _ProcessProbe(ScriptedProbe):
    """A scripted device that also lists its processes' memory (as NVML does on a GPU)."""

    def __init__(self, processes: dict[int, int] | Exception, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.processes, self.listed = processes, 0

    def process_memory(self) -> dict[int, int]:
        self.listed += 1
        if isinstance(self.processes, Exception):
            raise self.processes
        return dict(self.processes)


def _fit_measured(
    tmp_path: Path, processes: dict[int, int] | Exception
) -> tuple[AdaptiveBandLimit, _ProcessProbe]:
    probe = _ProcessProbe(processes, free=SHORT, total=TOTAL)
    adaptive = AdaptiveBandLimit(probe=probe, **SCRIPTED_ADAPTIVE)
    shared = SharedDevice(tmp_path / "ledger", job="b-job")
    trainer = cpu_trainer([adaptive, shared], default_root_dir=tmp_path, max_steps=4, limit_val_batches=0)
    data = SyntheticImageDataModule(train_size=64, val_size=8, test_size=8, batch_size=16)
    trainer.fit(ImageClassifier("cifar_resnet18", width=4), data)
    return adaptive, probe


PEER_PID = 4_000_000  # no process of this host has it


def _peer_process(folder: Path, monkeypatch: pytest.MonkeyPatch, memory: int | None) -> None:
    with monkeypatch.context() as patch:
        patch.setattr(os, "getpid", lambda: PEER_PID)
        _peer(folder, memory=memory)


def test_peers_count_at_what_the_device_measures_for_their_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # on a GPU a job's process holds its CUDA context and its allocator's cache beside its
    # tensors (an H100: 2246 MiB where torch's peak was 1019): NVML's per-process memory is
    # what the peer costs the device, its published peak what it measured itself
    _peer_process(tmp_path / "a" / "ledger", monkeypatch, memory=7 * M)
    adaptive, probe = _fit_measured(tmp_path / "a", {os.getpid(): 40 * M, PEER_PID: 30 * M, 17: 5 * M})
    assert adaptive.controller.peer_memory == 30 * M and probe.listed > 0
    # a peer the device does not list (no CUDA context yet) counts at what it published ...
    _peer_process(tmp_path / "b" / "ledger", monkeypatch, memory=7 * M)
    adaptive, _ = _fit_measured(tmp_path / "b", {os.getpid(): 40 * M})
    assert adaptive.controller.peer_memory == 7 * M
    # ... and an arriving peer not measured yet is known by its process
    _peer_process(tmp_path / "c" / "ledger", monkeypatch, memory=None)
    adaptive, _ = _fit_measured(tmp_path / "c", {os.getpid(): 40 * M, PEER_PID: 9 * M})
    assert adaptive.controller.peer_memory == 9 * M


def test_process_ids_of_another_namespace_or_a_failing_listing_fall_back_to_what_peers_published(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # in a container NVML lists the host's process ids: this job's own is missing, and a peer's
    # id may name another process; the published peaks are taken, said once
    _peer_process(tmp_path / "a" / "ledger", monkeypatch, memory=7 * M)
    with caplog.at_level("INFO"):
        adaptive, probe = _fit_measured(tmp_path / "a", {PEER_PID: 30 * M, 12345: 40 * M})
    assert adaptive.controller.peer_memory == 7 * M
    assert probe.listed == 1 and caplog.text.count("no process with this job's id") == 1
    _peer_process(tmp_path / "b" / "ledger", monkeypatch, memory=7 * M)
    with pytest.warns(UserWarning, match="cannot list") as warned:
        adaptive, probe = _fit_measured(tmp_path / "b", ProbeUnavailable("NVML cannot list the processes"))
    assert adaptive.controller.peer_memory == 7 * M
    assert probe.listed == 1 and len([w for w in warned if "cannot list" in str(w.message)]) == 1


def test_a_ddp_job_makes_no_room_for_an_arrival_and_so_confirms_it_at_once(tmp_path: Path) -> None:
    # its ranks move together on a raise or a release: an arrival (and a peer that would leave
    # the room to it) must not wait for room it never makes
    from types import SimpleNamespace

    folder = tmp_path / "ledger"
    adaptive = AdaptiveBandLimit(probe=ScriptedProbe(free=[50 * M], total=TOTAL), **SCRIPTED_ADAPTIVE)
    shared = SharedDevice(folder, job="b-job")
    shared._adaptive, shared.ledger = adaptive, Ledger(folder, host_device(), job="b-job-rank0")
    _peer(folder, arriving=True, held=1 * M, coordinates=True)
    hold = Decision(0, 0.0, "hold", free=25 * M, threshold=20 * M)  # 4 MB short of the arrival's 9
    strategy = SimpleNamespace(reduce_boolean_decision=lambda held, all: held)
    adaptive.controller.on_stages_measured([5.0 * M, 5.0 * M])  # two exact rungs
    adaptive.controller.observe(Setting(0, 0.0), 10 * M)
    alone = SimpleNamespace(world_size=1, global_step=5, strategy=strategy)  # one process: makes room
    made = shared(adaptive, alone, hold).decision  # type: ignore[arg-type]
    assert made.rung > 0 and shared.ledger.last.room_for == ()  # type: ignore[union-attr]
    ddp = SimpleNamespace(world_size=2, global_step=6, strategy=strategy)
    assert shared(adaptive, ddp, hold).decision == hold  # type: ignore[arg-type]
    assert shared.ledger.last.room_for == ("a-peer",)  # type: ignore[union-attr]


@pytest.mark.slow
def test_a_real_ddp_job_confirms_an_arrival_while_it_trains(tmp_path: Path) -> None:
    # two DDP processes beside a newcomer this test announces: both rank entries confirm its room
    # while the job still trains (without the DDP rule they never would, and the newcomer would
    # wait its arrival_timeout), and the job changes nothing for it
    from _helpers import run_ddp_script

    folder = tmp_path / "ledger"
    ranks: list[dict[str, Any]] = []
    script = Path(__file__).with_name("ddp_shared_device_script.py")
    job = threading.Thread(
        target=lambda: ranks.extend(run_ddp_script(script, tmp_path, BANDLIMIT_LEDGER=str(folder)))
    )
    job.start()
    newcomer = Ledger(folder, host_device(), job="newcomer")
    entries: list[Tenant] = []
    while job.is_alive() and len(entries) < 2:  # both ranks publish at setup
        entries = [p for p in newcomer.peers() if p.job.startswith("ddp-rank")]
        time.sleep(0.05)
    newcomer.publish(arriving=True, held=1 * M, coordinates=True)
    confirmed: set[str] = set()
    while job.is_alive() and len(confirmed) < 2:
        confirmed = {p.job for p in newcomer.peers() if "newcomer" in p.room_for}
        time.sleep(0.05)
    newcomer.leave()
    job.join(timeout=300)
    assert confirmed == {"ddp-rank0", "ddp-rank1"}  # before the job ended
    assert len(ranks) == 2 and ranks[0]["steps"] == ranks[1]["steps"] == 48
    assert ranks[0]["timeline"] == ranks[1]["timeline"]
    assert {tuple(t[1:]) for t in ranks[0]["timeline"]} == {(0, 0.0)}  # no room made, nothing changed


class _SplitSqueeze(MemoryProbe):
    """A co-tenant of 12 MB that grows to 17.2 MB from the 8th check to the 14th: more than the
    top rung frees, so the job runs its batch in chunks (the deep squeeze of
    ``test_adaptive_splits.py``: per rung its step's increment, per split 1 MB that does not shrink
    with the chunk and 2 MB that do)."""

    source = "scripted"
    measures_own = True
    rungs = (5.0 * M, 3.9 * M, 3.4 * M, 3.15 * M, 3.0 * M)

    def __init__(self) -> None:
        self.callback: AdaptiveBandLimit | None = None
        self.checks = 0

    def read(self) -> MemoryReading:
        assert self.callback is not None
        self.checks += 1
        setting = self.callback.setting
        own = int(
            80 * M + (self.rungs[setting.rung] if setting.split == 1 else 1 * M + 2 * M / setting.split)
        )
        cotenant = 17.2 * M if 8 <= self.checks < 14 else 12 * M
        return MemoryReading(
            TOTAL, max(0, int(TOTAL - own - cotenant)), self.source, own=own, own_base=80 * M
        )


class _Watcher(Callback):
    """A peer reading the ledger at each step's end: the job's entry, and the setting it runs at."""

    def __init__(self, folder: Path, adaptive: AdaptiveBandLimit) -> None:
        self.ledger, self.adaptive = Ledger(folder, host_device(), job="watcher"), adaptive
        self.seen: list[tuple[tuple[int, int, float] | None, tuple[int, int, float]]] = []

    def on_train_batch_end(self, *args: Any) -> None:
        entry = next((p for p in self.ledger.peers() if p.job == "b-job"), None)
        published = None if entry is None else (entry.rung, entry.split, entry.compression)
        applied = self.adaptive.setting
        self.seen.append((published, (applied.rung, applied.split, applied.compression)))


def test_peers_see_the_split_the_job_applied_through_the_ledger(tmp_path: Path) -> None:
    probe = _SplitSqueeze()
    adaptive = AdaptiveBandLimit(
        probe=probe,
        min_free=0.6 * M,
        release_free=3 * M,
        check_every_n_steps=1,
        continuum_rung="zero",
        rung_order="stages",
        ghost_batch=2,  # BatchNorm: ghost-batch splits, allowed down to chunks of 2 here
    )
    probe.callback = adaptive
    folder = tmp_path / "ledger"
    watcher = _Watcher(folder, adaptive)
    trainer = cpu_trainer(
        [adaptive, SharedDevice(folder, job="b-job"), watcher],
        default_root_dir=tmp_path,
        max_steps=20,
        limit_val_batches=0,
    )
    trainer.fit(
        ImageClassifier("cifar_resnet18", width=4),
        SyntheticImageDataModule(train_size=64, val_size=8, test_size=8, batch_size=16),
    )
    assert all(published == applied for published, applied in watcher.seen)  # at every step's end
    assert max(split for _, (_, split, _) in watcher.seen) > 1  # a split the peer saw
