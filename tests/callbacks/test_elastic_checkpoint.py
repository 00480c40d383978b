"""ElasticCheckpoint's files: durable writes, a torn newest checkpoint skipped, saves only between steps."""

import os
import socket
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from _helpers import QUIET
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_bandlimit.callbacks import ElasticCheckpoint
from lightning_bandlimit.callbacks.checkpoint_io import (
    DurableCheckpointIO,
    newest_readable,
    previous_path,
    recover_temporaries,
)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_a_save_keeps_the_version_it_replaces_and_no_temporary(tmp_path: Path) -> None:
    io, path = DurableCheckpointIO(), tmp_path / "last.ckpt"
    io.save_checkpoint({"global_step": 1}, path)
    io.save_checkpoint({"global_step": 2}, path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "last.prev.ckpt"]
    assert torch.load(path)["global_step"] == 2
    assert torch.load(previous_path(path))["global_step"] == 1
    io.remove_checkpoint(path)
    assert list(tmp_path.iterdir()) == []


def test_a_kill_between_the_two_renames_leaves_the_previous_version_on_its_own_inode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    io, path = DurableCheckpointIO(), tmp_path / "last.ckpt"
    io.save_checkpoint({"global_step": 1}, path)
    io.save_checkpoint({"global_step": 2}, path)
    assert path.stat().st_ino != previous_path(path).stat().st_ino  # damage to one spares the other
    real, calls = os.replace, []

    def killed_after_the_first(src: str | Path, dst: str | Path) -> None:
        calls.append(dst)
        if len(calls) == 2:
            raise KeyboardInterrupt  # stands in for SIGKILL between the renames
        real(src, dst)

    monkeypatch.setattr(os, "replace", killed_after_the_first)
    with pytest.raises(KeyboardInterrupt):
        io.save_checkpoint({"global_step": 3}, path)
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["last.prev.ckpt"]
    found, skipped = newest_readable(tmp_path.iterdir())
    assert found == previous_path(path) and torch.load(found)["global_step"] == 2 and not skipped


def test_a_failed_save_leaves_the_old_checkpoint_whole_and_no_temporary(tmp_path: Path) -> None:
    io, path = DurableCheckpointIO(), tmp_path / "last.ckpt"
    io.save_checkpoint({"global_step": 1}, path)
    with pytest.raises(Exception):  # noqa: B017 (whatever pickle raises for a lambda)
        io.save_checkpoint({"global_step": 2, "bad": lambda: None}, path)
    assert [p.name for p in tmp_path.iterdir()] == ["last.ckpt"]
    assert torch.load(path)["global_step"] == 1


def test_only_temporaries_of_dead_writers_on_this_host_are_removed(tmp_path: Path) -> None:
    host = socket.gethostname()
    dead = tmp_path / f".last.ckpt.tmp-{host}-{_dead_pid()}"
    alive = tmp_path / f".last.ckpt.tmp-{host}-{os.getpid()}"
    elsewhere = tmp_path / f".last.ckpt.tmp-another-host-{_dead_pid()}"
    for path in (dead, alive, elsewhere):
        path.write_bytes(b"partial")
    assert recover_temporaries(tmp_path) == ([], [dead])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, elsewhere.name])


def test_a_complete_temporary_newer_than_its_target_is_renamed_into_place(tmp_path: Path) -> None:
    # the soak killed a writer between its renames and then tore the previous version: the
    # newest checkpoint existed only as the (complete, synced) temporary
    io, path = DurableCheckpointIO(), tmp_path / "last.ckpt"
    io.save_checkpoint({"global_step": 4}, path)
    stale = tmp_path / f".last.ckpt.tmp-{socket.gethostname()}-{_dead_pid()}"
    torch.save({"global_step": 2}, stale)  # older than the target: removed
    assert recover_temporaries(tmp_path) == ([], [stale])
    newer = tmp_path / f".last.ckpt.tmp-{socket.gethostname()}-{_dead_pid()}"
    torch.save({"global_step": 8}, newer)
    assert recover_temporaries(tmp_path) == ([path], [])
    assert torch.load(path)["global_step"] == 8 and torch.load(previous_path(path))["global_step"] == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.ckpt", "last.prev.ckpt"]


def test_newest_readable_skips_a_torn_file_and_says_why(tmp_path: Path) -> None:
    io, path = DurableCheckpointIO(), tmp_path / "last.ckpt"
    io.save_checkpoint({"global_step": 1}, path)
    io.save_checkpoint({"global_step": 2}, path)
    assert newest_readable(tmp_path.iterdir()) == (path, [])
    with open(path, "r+b") as f:
        f.truncate(path.stat().st_size // 2)
    found, skipped = newest_readable(tmp_path.iterdir())
    assert found == previous_path(path)
    assert [p for p, _ in skipped] == [path] and "zip" in skipped[0][1]


class _Starts(pl.Callback):
    """Records the global step each fit starts from, and the micro-batches done at each save."""

    def __init__(self) -> None:
        self.start: int | None = None
        self.batches = 0
        self.saves: list[tuple[int, int]] = []

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.start = trainer.global_step

    def on_train_batch_end(self, trainer: pl.Trainer, *args: object) -> None:
        self.batches += 1

    def on_save_checkpoint(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict
    ) -> None:
        self.saves.append((trainer.global_step, self.batches))


def _fit(folder: Path, max_steps: int, resume: str | None = None, accumulation: int = 1) -> _Starts:
    starts = _Starts()
    trainer = pl.Trainer(
        accelerator="cpu",
        max_steps=max_steps,
        accumulate_grad_batches=accumulation,
        plugins=[DurableCheckpointIO()],
        callbacks=[ElasticCheckpoint(dirpath=folder, every_n_train_steps=2), starts],
        **{**QUIET, "enable_checkpointing": True},
    )
    trainer.fit(BoringModel(), ckpt_path=resume)
    return starts


def test_a_torn_newest_checkpoint_is_skipped_for_the_one_before(tmp_path: Path) -> None:
    _fit(tmp_path, max_steps=6)
    last = tmp_path / "last.ckpt"
    assert torch.load(last, weights_only=False)["global_step"] == 6
    with open(last, "r+b") as f:  # a full disk or a power cut after an unsynced write
        f.truncate(last.stat().st_size // 2)
    with pytest.warns(
        UserWarning, match=r"skipped .*last\.ckpt, which cannot be read .*resuming from .*last\.prev"
    ):
        starts = _fit(tmp_path, max_steps=8, resume="last")
    assert starts.start == 4


def test_no_readable_checkpoint_is_a_one_line_error_naming_the_files(tmp_path: Path) -> None:
    _fit(tmp_path, max_steps=4)
    for path in tmp_path.glob("last*.ckpt"):
        path.write_bytes(b"torn")
    with pytest.raises(
        RuntimeError,
        match=r"no last checkpoint can be read: .*last\.ckpt.*last\.prev\.ckpt|"
        r"no last checkpoint can be read: .*last\.prev\.ckpt.*last\.ckpt",
    ):
        _fit(tmp_path, max_steps=6, resume="last")


def test_saves_happen_only_between_optimizer_steps_also_after_a_resume(tmp_path: Path) -> None:
    _fit(tmp_path, max_steps=4, accumulation=2)
    starts = _fit(tmp_path, max_steps=8, resume="last", accumulation=2)
    assert starts.start == 4
    # Lightning alone saves once more at step 4 after the resumed run's first micro-batch
    assert starts.saves == [(6, 4), (8, 8)]
