from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from lightning_bandlimit.tenants import Ledger, Tenant


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_tenants_of_one_device_see_each_other_and_not_themselves(tmp_path: Path) -> None:
    a, b = Ledger(tmp_path, "gpu-0", job="a"), Ledger(tmp_path, "gpu-0", job="b")
    a.publish(rung=1, exact_left=True)
    b.publish(compression=0.3, lossy=True)
    assert [(t.job, t.rung) for t in b.peers()] == [("a", 1)]
    assert [(t.job, t.compression, t.lossy) for t in a.peers()] == [("b", 0.3, True)]


def test_another_device_is_not_a_peer(tmp_path: Path) -> None:
    Ledger(tmp_path, "gpu-0", job="a").publish()
    assert Ledger(tmp_path, "gpu-1", job="b").peers() == []


def test_a_silent_peer_is_taken_for_dead_after_the_timeout(tmp_path: Path) -> None:
    clock = Clock()
    a = Ledger(tmp_path, "gpu-0", job="a", timeout=30, clock=clock)
    b = Ledger(tmp_path, "gpu-0", job="b", timeout=30, clock=clock)
    b.publish()
    clock.now += 29
    assert [t.job for t in a.peers()] == ["b"]
    clock.now += 2
    assert a.peers() == []
    b.beat()  # the heartbeat brings it back
    assert [t.job for t in a.peers()] == ["b"]


def test_leaving_removes_the_entry_at_once(tmp_path: Path) -> None:
    a, b = Ledger(tmp_path, "gpu-0", job="a"), Ledger(tmp_path, "gpu-0", job="b")
    b.publish()
    b.leave()
    assert a.peers() == [] and not b.path.exists()


def test_unreadable_and_foreign_entries_are_ignored(tmp_path: Path) -> None:
    a = Ledger(tmp_path, "gpu-0", job="a")
    b = Ledger(tmp_path, "gpu-0", job="b")
    b.publish(rung=2)
    (a.folder / "half.json").write_text('{"job": "half", "pi')  # torn (not ours: we write atomically)
    (a.folder / "alien.json").write_text(json.dumps({"name": "not a tenant"}))
    newer = {"job": "c", "pid": 3, "heartbeat": b.last.heartbeat, "from_a_newer_version": 1}
    (a.folder / "c.json").write_text(json.dumps(newer))
    (a.folder / "a-directory.json").mkdir()
    (a.folder / "broken.json").symlink_to(a.folder / "nowhere")
    with pytest.warns(UserWarning, match="skipped") as said:
        assert [t.job for t in a.peers()] == ["b", "c"]
        assert [t.job for t in a.peers()] == ["b", "c"]  # named once
    assert sorted(str(w.message).split("/")[-1].split(" ")[0] for w in said) == [
        "alien.json",
        "broken.json",
        "half.json",
    ]


def test_an_entry_is_written_whole_and_round_trips(tmp_path: Path) -> None:
    a = Ledger(tmp_path, "GPU-1234/x", job="my job")
    written = a.publish(
        rung=1,
        compression=0.2,
        lossy=True,
        next_freed=5.0,
        next_lossy=True,
        arriving=True,
        held=7,
        room_for=("b",),
    )
    assert written.job == "my job" and a.path.parent.name == "GPU-1234%2Fx"  # names kept, files told apart
    assert written.run == a.run and len(a.run) == 32 and written.host and written.pid == os.getpid()
    assert Tenant.from_dict(json.loads(a.path.read_text())) == written
    assert [p.name for p in a.folder.iterdir()] == ["my%20job.json"]  # no temporary file left


@pytest.mark.parametrize(("kwargs", "error"), [({"device": ""}, ValueError), ({"timeout": 0}, ValueError)])
def test_bad_arguments_say_what_was_expected(tmp_path: Path, kwargs: dict, error: type) -> None:
    with pytest.raises(error):
        Ledger(tmp_path, **{"device": "gpu-0", **kwargs})
