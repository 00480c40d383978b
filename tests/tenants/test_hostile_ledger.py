"""The ledger folder is untrusted input (issue 54, items 1 to 3): no file in it, and no failing
write, stops, hangs or misleads a training job; a job name taken twice is refused at setup."""

from __future__ import annotations

import errno
import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from _helpers import SCRIPTED_ADAPTIVE, cpu_trainer, run_python
from lightning.pytorch.callbacks import Callback

from lightning_bandlimit.callbacks import AdaptiveBandLimit, SharedDevice
from lightning_bandlimit.data import SyntheticImageDataModule
from lightning_bandlimit.memory import ScriptedProbe
from lightning_bandlimit.models import ImageClassifier
from lightning_bandlimit.tenants import Ledger
from lightning_bandlimit.tenants import entries as entries_module
from lightning_bandlimit.tenants import ledger as ledger_module
from lightning_bandlimit.tenants.entries import ENTRY_BYTES, file_name
from lightning_bandlimit.tenants.ledger import MAX_ENTRIES, host_device

M = 1_000_000
TOTAL = 100 * M
SHORT = [80 * M] * 2 + [19 * M] * 2 + [80 * M] * 2  # 1 MB under min_free (20 MB) for two checks

pytestmark = pytest.mark.usefixtures("one_thread")


def _entry(job: str, **fields: Any) -> dict[str, Any]:
    return {"job": job, "pid": 1, "heartbeat": time.time(), **fields}


def _text(job: str, **fields: Any) -> str:
    return json.dumps(_entry(job, **fields))


# each hostile content, in a file named for the job it names (so the field is what is wrong)
CONTENTS: dict[str, str] = {
    "list": "[1, 2, 3]",
    "string": '"hello"',
    "null": "null",
    "truncated": '{"job": "truncated", "pi',
    "no-heartbeat": json.dumps({"job": "no-heartbeat", "pid": 1}),
    "heartbeat-yesterday": _text("heartbeat-yesterday", heartbeat="yesterday"),
    "heartbeat-null": _text("heartbeat-null", heartbeat=None),
    "heartbeat-future": _text("heartbeat-future", heartbeat=time.time() + 3600, lossy=True, compression=0.9),
    "heartbeat-infinity": _text("heartbeat-infinity", heartbeat=float("inf")),  # JSON's Infinity
    "changed-future": _text("changed-future", changed_at=time.time() + 3600),
    "memory-string": _text("memory-string", memory="5000000"),
    "memory-nan": _text("memory-nan", memory=float("nan")),
    "memory-infinity": _text("memory-infinity", memory=float("inf")),
    "memory-1e40": _text("memory-1e40", memory=1e40),
    "memory-negative": _text("memory-negative", memory=-1),
    "memory-huge-int": _text("memory-huge-int", memory=10**400),
    "job-number": json.dumps({"job": 5, "pid": 1, "heartbeat": time.time()}),
    "pid-list": _text("pid-list", pid=[1]),
    "pid-bool": _text("pid-bool", pid=True),
    "held-string": _text("held-string", held="0"),
    "top-memory-big": _text("top-memory-big", top_memory="big"),
    "next-freed-x": _text("next-freed-x", next_freed="x"),
    "next-freed-nan": _text("next-freed-nan", next_freed=float("nan")),
    "lossy-false-string": _text("lossy-false-string", lossy="false"),
    "rung-bool": _text("rung-bool", rung=True),
    "rung-negative": _text("rung-negative", rung=-1),
    "compression-one": _text("compression-one", compression=1.0),
    "room-for-string": _text("room-for-string", room_for="b-job"),
    "rung-peaks-flat": _text("rung-peaks-flat", rung_peaks=[1, 2]),
    "stage-least-strings": _text("stage-least-strings", stage_least=["1"]),
    "deep": "[" * 30_000 + "]" * 30_000,
    "deep-inside": '{"job": "deep-inside", "pid": 1, "heartbeat": 1, "x": '
    + "[" * 30_000
    + "]" * 30_000
    + "}",
    "impostor": _text("b-job", arriving=True, held=M, coordinates=True),  # this job's own name
    "not-its-name": _text("someone-else"),
    "not-utf8": "",  # bytes written below
}


def _write_hostile(folder: Path, sparse_target: Path) -> list[str]:
    """Every hostile file in ``folder``; their names."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in CONTENTS.items():
        (folder / f"{name}.json").write_text(text)
    (folder / "not-utf8.json").write_bytes(b'{"job": "\xff\xfe"}')
    (folder / "zero.json").symlink_to("/dev/zero")
    os.mkfifo(folder / "fifo.json")
    with open(sparse_target, "wb") as big:
        big.truncate(400 * 2**20)  # 400 MiB, sparse
    (folder / "sparse-link.json").symlink_to(sparse_target)
    with open(folder / "sparse.json", "wb") as big:
        big.truncate(400 * 2**20)
    (folder / "broken.json").symlink_to(folder / "nowhere")
    return [*CONTENTS, "zero", "fifo", "sparse-link", "sparse", "broken"]


@pytest.mark.parametrize("name", sorted(CONTENTS))
def test_each_hostile_entry_is_skipped_and_named_once(tmp_path: Path, name: str) -> None:
    said: list[str] = []
    ledger = Ledger(tmp_path, "gpu-0", job="b-job", warn=said.append)
    ledger.folder.mkdir(parents=True)
    _write_hostile(ledger.folder, tmp_path / "sparse")
    for other in set(CONTENTS) - {name}:
        (ledger.folder / f"{other}.json").unlink()
    Ledger(tmp_path, "gpu-0", job="honest").publish(memory=5 * M)
    for _ in range(3):
        assert [t.job for t in ledger.peers()] == ["honest"]
    named = [m for m in said if f"/{name}.json skipped" in m]
    assert len(named) == 1, said


def test_special_files_are_not_opened_and_big_ones_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a symlink to /dev/zero, a FIFO (a read would block for ever), a symlink to a 400 MiB sparse
    # file and the sparse file itself: named once, none read past its first bytes
    said: list[str] = []
    ledger = Ledger(tmp_path, "gpu-0", job="b-job", warn=said.append)
    _write_hostile(ledger.folder, tmp_path / "sparse")
    for name in CONTENTS:
        (ledger.folder / f"{name}.json").unlink()
    read: list[int] = []
    real_read = os.read

    def counted(handle: int, size: int) -> bytes:
        data = real_read(handle, size)
        read.append(len(data))
        return data

    monkeypatch.setattr(entries_module.os, "read", counted)
    for _ in range(3):
        assert ledger.peers() == []
    assert ledger.opened == 0 and sum(read) == 0  # refused by what the folder lists
    assert sorted(m.split("/")[-1].split(" ")[0] for m in said) == [
        "broken.json",
        "fifo.json",
        "sparse-link.json",
        "sparse.json",
        "zero.json",
    ]


def test_a_check_over_a_thousand_bad_files_opens_each_at_most_once(tmp_path: Path) -> None:
    said: list[str] = []
    ledger = Ledger(tmp_path, "gpu-0", job="b-job", warn=said.append)
    ledger.folder.mkdir(parents=True)
    for i in range(1000):
        (ledger.folder / f"bad{i:04}.json").write_text("[1, 2, 3]" if i % 2 else "x" * (ENTRY_BYTES + 1))
    for i in range(200):
        os.mkfifo(ledger.folder / f"fifo{i}.json")
    Ledger(tmp_path, "gpu-0", job="honest").publish()
    opened = []
    for _ in range(6):
        before = ledger.opened
        assert "honest" in [t.job for t in ledger.peers()]
        opened.append(ledger.opened - before)
    assert max(opened) <= MAX_ENTRIES  # a check reads at most that many files
    assert ledger.opened <= 1000 + 6  # each bad file once in all (the honest entry at each check)
    assert len(said) == len(set(said)) == 1200  # each named once


def test_many_live_entries_still_work(tmp_path: Path) -> None:
    writer = Ledger(tmp_path, "gpu-0", job="w")
    writer.folder.mkdir(parents=True)
    for i in range(20_000):  # written directly: 20,000 live peers' files
        (writer.folder / f"p{i}.json").write_text(_text(f"p{i}"))
    ledger = Ledger(tmp_path, "gpu-0", job="b-job", warn=pytest.fail)
    assert len(ledger.peers()) == MAX_ENTRIES and ledger.opened == MAX_ENTRIES  # the newest


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_only_entries_of_allowed_users_count(tmp_path: Path) -> None:
    said: list[str] = []
    ledger = Ledger(tmp_path, "gpu-0", job="b-job", warn=said.append)
    other = Ledger(tmp_path, "gpu-0", job="other")
    other.publish()
    os.chown(other.path, 12345, -1)
    assert ledger.peers() == [] and "owned by user id 12345" in said[0]
    trusting = Ledger(tmp_path, "gpu-0", job="c-job", trusted_users=[12345], warn=pytest.fail)
    assert [t.job for t in trusting.peers()] == ["other"]
    with pytest.raises(ValueError, match="no user"):
        Ledger(tmp_path, "gpu-0", trusted_users=["no-such-user-here"])


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("failure", ["permission", "read-only", "no-space", "folder-is-a-file"])
def test_a_failing_write_is_said_once_the_job_goes_alone_and_writes_again_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    clock, said = Clock(), []
    ledger = Ledger(tmp_path, "gpu-0", job="b-job", timeout=40, clock=clock, warn=said.append)
    peer = Ledger(tmp_path, "gpu-0", job="a-peer", timeout=40, clock=clock)
    ledger.publish(rung=1)
    peer.publish()
    assert [t.job for t in ledger.peers()] == ["a-peer"]
    errors = {
        "permission": PermissionError(errno.EACCES, "Permission denied"),
        "read-only": OSError(errno.EROFS, "Read-only file system"),
        "no-space": OSError(errno.ENOSPC, "No space left on device"),
    }
    if failure == "folder-is-a-file":
        shutil.rmtree(ledger.folder)
        ledger.folder.write_text("not a folder")
    else:
        real = ledger_module.atomic_write_json

        def failing(*args: Any, **kwargs: Any) -> Any:
            raise errors[failure]

        monkeypatch.setattr(ledger_module, "atomic_write_json", failing)
    for _ in range(3):
        assert ledger.publish(rung=2).rung == 2  # the entry it would have written, no error
        assert ledger.peers() == []  # it decides alone
    assert len(said) == 1 and "coordinates no longer" in said[0]
    clock.now += 11  # the next heartbeat: tried again
    if failure == "folder-is-a-file":
        ledger.folder.unlink()
    else:
        monkeypatch.setattr(ledger_module, "atomic_write_json", real)
    ledger.beat()
    assert "coordinates again" in said[-1] and len(said) == 2
    assert json.loads(ledger.path.read_text())["rung"] == 2
    if failure != "folder-is-a-file":
        assert [t.job for t in ledger.peers()] == ["a-peer"]


def test_a_deleted_folder_is_made_again_sticky(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger", "gpu-0", job="b-job", warn=pytest.fail)
    ledger.publish()
    for folder in (tmp_path / "ledger", ledger.folder):
        assert folder.stat().st_mode & 0o7777 == 0o1777  # as /tmp: no user removes another's entry
    shutil.rmtree(tmp_path / "ledger")
    ledger.publish()
    assert ledger.path.exists() and ledger.folder.stat().st_mode & 0o1000


def test_names_are_not_sanitised_into_one_file(tmp_path: Path) -> None:
    a, b = Ledger(tmp_path, "gpu-0", job="exp/1"), Ledger(tmp_path, "gpu-0", job="exp:1")
    dot, long = Ledger(tmp_path, "gpu-0", job=".."), Ledger(tmp_path, "gpu-0", job="x" * 300 + "/")
    for ledger in (a, b, dot, long):
        ledger.publish()
    assert len({a.path, b.path, dot.path, long.path}) == 4 and len(long.path.name) <= 210
    assert [t.job for t in a.peers()] == ["..", "exp:1", "x" * 300 + "/"]
    b.leave()
    assert a.path.exists() and [t.job for t in a.peers()] == ["..", "x" * 300 + "/"]
    assert file_name("exp/1") != file_name("exp:1") != file_name("exp_1")


def test_a_live_job_under_the_same_name_is_refused_and_keeps_its_entry(tmp_path: Path) -> None:
    first = Ledger(tmp_path, "gpu-0", job="exp")
    first.publish()
    second = Ledger(tmp_path, "gpu-0", job="exp")
    with pytest.raises(ValueError, match=rf"'exp' is taken .* process {os.getpid()} on {first.host}"):
        second.claim()
    second.leave()  # a run leaving does not remove another run's entry under its name
    assert json.loads(first.path.read_text())["run"] == first.run
    first.claim()  # its own: fine
    # a dead process's entry (a crash), or a silent one, does not hold the name
    dead = {**json.loads(first.path.read_text()), "pid": 4_000_000}  # no process of this host
    first.path.write_text(json.dumps(dead))
    Ledger(tmp_path, "gpu-0", job="exp").claim()
    clock = Clock()
    clock.now = first.last.heartbeat + 200  # type: ignore[union-attr]
    first.publish()
    Ledger(tmp_path, "gpu-0", job="exp", clock=clock).claim()


# ---- in a real fit ---------------------------------------------------------------------------


def _fit(
    tmp_path: Path, shared: SharedDevice, frees: list[int] = SHORT, before: list[Callback] = ()
) -> AdaptiveBandLimit:
    adaptive = AdaptiveBandLimit(probe=ScriptedProbe(free=frees, total=TOTAL), **SCRIPTED_ADAPTIVE)
    trainer = cpu_trainer(
        [*before, adaptive, shared], default_root_dir=tmp_path, max_steps=len(frees), limit_val_batches=0
    )
    data = SyntheticImageDataModule(train_size=64, val_size=8, test_size=8, batch_size=16)
    trainer.fit(ImageClassifier("cifar_resnet18", width=4), data)
    return adaptive


class _At(Callback):
    """Runs ``act`` at the start of step ``step``."""

    def __init__(self, step: int, act: Any) -> None:
        self.step, self.act = step, act

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self.step:
            self.act()


def test_hostile_files_written_mid_run_never_stop_the_fit_each_named_once(tmp_path: Path) -> None:
    folder = tmp_path / "ledger"
    device = folder / file_name(host_device())
    shared = SharedDevice(folder, job="b-job")
    names: list[str] = []
    with pytest.warns(UserWarning, match="skipped") as said:
        adaptive = _fit(
            tmp_path,
            shared,
            before=[_At(1, lambda: names.extend(_write_hostile(device, tmp_path / "sparse")))],
        )
    assert len(adaptive.decisions) == len(SHORT)  # the fit ran to its end, a check a step
    assert adaptive.controller.peer_memory == 0 and shared.holds == []  # no peer counted
    skipped = [str(w.message) for w in said if "skipped" in str(w.message)]
    for name in names:
        assert sum(f"/{name}.json skipped" in m for m in skipped) == 1, name
    assert not (device / "b-job.json").exists()  # left at teardown


def test_a_forged_lossy_peer_from_the_future_does_not_keep_the_jobs_rung(tmp_path: Path) -> None:
    # beside a live lossy peer the job keeps its exact rung on release (test_shared_device); one
    # whose heartbeat is ahead (or Infinity) would never expire: it is skipped, the job gives back
    folder = tmp_path / "ledger"
    device = folder / file_name(host_device())
    device.mkdir(parents=True)
    for job, heartbeat in (("a-peer", time.time() + 3600), ("a-peer2", float("inf"))):
        text = _text(job, compression=0.4, lossy=True, coordinates=True, heartbeat=heartbeat)
        (device / f"{job}.json").write_text(text)
    frees = [80 * M] * 3 + [19 * M] * 2 + [80 * M] * 10
    with pytest.warns(UserWarning, match="heartbeat"):
        adaptive = _fit(tmp_path, SharedDevice(folder, job="b-job"), frees=frees)
    assert adaptive.decisions[-1]["rung"] == 0 and adaptive.decisions[-1]["compression"] == 0


def test_an_impostor_with_the_jobs_own_name_is_not_made_room_for(tmp_path: Path) -> None:
    folder = tmp_path / "ledger"
    device = folder / file_name(host_device())
    device.mkdir(parents=True)
    (device / "x.json").write_text(_text("b-job", arriving=True, held=M, coordinates=True, memory=None))
    shared = SharedDevice(folder, job="b-job")
    with pytest.warns(UserWarning, match="x.json skipped"):
        adaptive = _fit(tmp_path, shared, frees=[25 * M] * 4)  # an arrival would be made room for here
    assert all(d["reason"] != "raise" for d in adaptive.decisions) and shared.arrival.room_for == ()


def test_the_device_folder_replaced_by_a_file_mid_run_the_job_goes_on_alone(tmp_path: Path) -> None:
    folder = tmp_path / "ledger"
    device = folder / file_name(host_device())
    peer = Ledger(folder, host_device(), job="a-peer")
    peer.publish(exact_left=True, next_lossy=False, next_freed=50 * M)  # would hold the job's raise

    def replace() -> None:
        shutil.rmtree(device)
        device.write_text("not a folder")

    shared = SharedDevice(folder, job="b-job", patience=50)
    with pytest.warns(UserWarning, match="coordinates no longer") as said:
        adaptive = _fit(tmp_path, shared, before=[_At(1, replace)])
    assert sum("coordinates no longer" in str(w.message) for w in said) == 1
    assert any(d["reason"] == "raise" for d in adaptive.decisions)  # alone: its raise went through
    assert shared.holds == [] and shared.ledger is None


def test_a_failed_fit_removes_its_entry(tmp_path: Path) -> None:
    folder = tmp_path / "ledger"

    def fail() -> None:
        assert (folder / file_name(host_device()) / "b-job.json").exists()
        raise RuntimeError("the step failed")

    with pytest.raises(RuntimeError, match="the step failed"):
        _fit(tmp_path, SharedDevice(folder, job="b-job"), before=[_At(2, fail)])
    assert not (folder / file_name(host_device()) / "b-job.json").exists()  # on_exception left


def test_a_second_live_job_under_the_same_name_is_refused_at_setup(tmp_path: Path) -> None:
    folder = tmp_path / "ledger"
    first = Ledger(folder, host_device(), job="exp")
    first.publish()
    started: list[int] = []
    with pytest.raises(ValueError, match=rf"'exp' is taken .*process {os.getpid()}"):
        _fit(tmp_path, SharedDevice(folder, job="exp"), before=[_At(0, lambda: started.append(0))])
    assert started == [] and json.loads(first.path.read_text())["run"] == first.run  # before training
    first.leave()


@pytest.mark.slow
def test_two_processes_under_one_name_the_second_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "ledger"
    first = Ledger(folder, host_device(), job="exp")
    first.publish()  # this process: live under "exp"
    script = f"""
from _helpers import SCRIPTED_ADAPTIVE, cpu_trainer
from lightning_bandlimit.callbacks import AdaptiveBandLimit, SharedDevice
from lightning_bandlimit.data import SyntheticImageDataModule
from lightning_bandlimit.memory import ScriptedProbe
from lightning_bandlimit.models import ImageClassifier
probe = ScriptedProbe(free=[80_000_000] * 2, total=100_000_000)
adaptive = AdaptiveBandLimit(probe=probe, **SCRIPTED_ADAPTIVE)
trainer = cpu_trainer([adaptive, SharedDevice({str(folder)!r}, job="exp")], max_steps=2, limit_val_batches=0)
data = SyntheticImageDataModule(train_size=32, val_size=8, test_size=8, batch_size=16)
trainer.fit(ImageClassifier("cifar_resnet18", width=4), data)
"""
    proc = run_python("-c", script, cwd=tmp_path, expect_ok=False, timeout=120)
    assert f"'exp' is taken on this device by a live job: process {os.getpid()}" in proc.stderr
    assert json.loads(first.path.read_text())["run"] == first.run  # its entry kept
    first.leave()
