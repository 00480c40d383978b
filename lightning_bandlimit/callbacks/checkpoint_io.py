"""Checkpoint files that a kill at any instant cannot tear, and a resume that skips a torn one.

Lightning's ``TorchCheckpointIO`` writes through an fsspec transaction: the bytes go to a
temporary file in the *system* temporary folder and are moved into place on commit. A worker
killed mid-write leaves that file behind in ``$TMPDIR`` (one per kill, never removed), the move
is a copy (not atomic) when ``$TMPDIR`` is on another filesystem than the checkpoint, and
nothing is synced, so a power cut can leave a short target.

:class:`DurableCheckpointIO` writes a local checkpoint into a temporary file *beside* it, syncs
it, renames the version it replaces to ``<name>.prev<suffix>`` and renames the new one into
place. :func:`recover_temporaries` settles what a killed writer left: a complete temporary
(killed between the renames) is renamed into place, any other is removed.
:func:`newest_readable` picks, among candidate checkpoints, the newest that loads whole.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins import TorchCheckpointIO
from typing_extensions import override

__all__ = [
    "DurableCheckpointIO",
    "newest_readable",
    "previous_path",
    "recover_temporaries",
    "temporary_writer",
]

_TMP = ".tmp-"


def previous_path(path: str | Path) -> Path:
    """Where :class:`DurableCheckpointIO` keeps the version ``path`` replaced.

    Example:
        >>> previous_path("ckpt/last.ckpt").as_posix()
        'ckpt/last.prev.ckpt'
    """
    path = Path(path)
    return path.with_name(f"{path.stem}.prev{path.suffix}")


def _temporary(path: Path) -> Path:
    return path.with_name(f".{path.name}{_TMP}{socket.gethostname()}-{os.getpid()}")


def temporary_writer(path: str | Path) -> tuple[Path, str, int] | None:
    """``(target, host, pid)`` of a :class:`DurableCheckpointIO` temporary file, else ``None``.

    Example:
        >>> target, host, pid = temporary_writer("ckpt/.last.ckpt.tmp-node3-4242")
        >>> target.as_posix(), host, pid
        ('ckpt/last.ckpt', 'node3', 4242)
        >>> temporary_writer("ckpt/last.ckpt") is None
        True
    """
    path = Path(path)
    name, tmp, writer = path.name.rpartition(_TMP)
    host, _, pid = writer.rpartition("-")
    if not tmp or not name.startswith(".") or not host or not pid.isdigit():
        return None
    return path.with_name(name.removeprefix(".")), host, int(pid)


def _is_local(path: str | Path) -> bool:
    text = str(path)
    return "://" not in text or text.startswith("file://")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _load(path: Path) -> tuple[Any, str | None]:
    """``(checkpoint, None)`` if ``path`` loads whole (on the CPU), else ``(None, why not)``."""
    try:
        return torch.load(path, map_location="cpu", weights_only=False), None
    except Exception as error:  # any failure to load means: not a usable checkpoint
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        return None, f"{type(error).__name__}: {first.split('. ')[0]}"


def _step(path: Path) -> int | None:
    """The checkpoint's ``global_step`` if it loads whole, else ``None``."""
    loaded, failure = _load(path)
    if failure is not None:
        return None
    return int(loaded.get("global_step", 0)) if isinstance(loaded, dict) else 0


def recover_temporaries(folder: str | Path) -> tuple[list[Path], list[Path]]:
    """Settle the temporary files that writers on this host left in ``folder`` when killed.

    A writer killed between its two renames leaves a complete, synced temporary whose target
    holds an older step (or is gone): that temporary is the newest checkpoint and is renamed into
    place as the save would have done (the target it replaces becomes the previous version). Any
    other temporary (cut short, or older than its target) is removed. Only files of processes
    that no longer run on this host are touched (another host's writer may still be writing on
    a shared filesystem).

    Returns:
        ``(promoted targets, removed temporaries)``.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     dead = f"{folder}/.last.ckpt{_TMP}{socket.gethostname()}-999999999"
        ...     torch.save({"global_step": 8}, dead)  # complete, never renamed
        ...     promoted, removed = recover_temporaries(folder)
        ...     [p.name for p in promoted], torch.load(f"{folder}/last.ckpt")["global_step"]
        (['last.ckpt'], 8)
    """
    promoted: list[Path] = []
    removed: list[Path] = []
    host = socket.gethostname()
    folder = Path(folder)
    if not folder.is_dir():
        return promoted, removed
    for path in sorted(folder.glob(f".*{_TMP}*")):
        writer = temporary_writer(path)
        if writer is None or writer[1] != host or _alive(writer[2]):
            continue
        target = writer[0]
        step = _step(path)
        current = _step(target) if target.exists() else None
        if step is not None and (current is None or current < step):
            if current is not None:
                os.replace(target, previous_path(target))
            os.replace(path, target)
            promoted.append(target)
        else:
            path.unlink(missing_ok=True)
            removed.append(path)
    if promoted or removed:
        _sync_folder(folder)
    return promoted, removed


def _sync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class DurableCheckpointIO(TorchCheckpointIO):
    """``TorchCheckpointIO`` whose local writes are atomic, synced and keep the previous version.

    Remote paths (``s3://`` and the like) are written by ``TorchCheckpointIO`` unchanged.

    Example:
        >>> import tempfile
        >>> io = DurableCheckpointIO()
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     io.save_checkpoint({"global_step": 1}, f"{folder}/last.ckpt")
        ...     io.save_checkpoint({"global_step": 2}, f"{folder}/last.ckpt")
        ...     sorted(p.name for p in Path(folder).iterdir())
        ['last.ckpt', 'last.prev.ckpt']
    """

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        if storage_options is not None or not _is_local(path):
            super().save_checkpoint(checkpoint, path, storage_options)
            return
        path = Path(str(path).removeprefix("file://"))
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _temporary(path)
        try:
            with open(tmp, "wb") as stream:
                torch.save(checkpoint, stream)
                stream.flush()
                os.fsync(stream.fileno())
            if path.exists():
                self._keep_previous(path)
            os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)
        _sync_folder(path.parent)

    @staticmethod
    def _keep_previous(path: Path) -> None:
        # A rename, not a hard link: two names on one inode would share any later damage (the
        # soak tore last.ckpt in place after a kill between the two renames, and lost both).
        # Until the new file is renamed in, only the previous one exists, and a resume takes it.
        os.replace(path, previous_path(path))

    @override
    def remove_checkpoint(self, path: Any) -> None:
        super().remove_checkpoint(path)
        if _is_local(path):
            previous_path(str(path).removeprefix("file://")).unlink(missing_ok=True)


def newest_readable(candidates: Iterable[str | Path]) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The newest candidate that loads whole, and the newer ones that did not.

    Candidates are loaded (on the CPU) newest first by modification time until one succeeds, so
    a torn or unreadable newest file is skipped for the one before it.

    Returns:
        ``(path or None, [(unreadable path, reason: the error's first sentence), ...])``.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     io = DurableCheckpointIO()
        ...     io.save_checkpoint({"global_step": 1}, f"{folder}/last.ckpt")
        ...     io.save_checkpoint({"global_step": 2}, f"{folder}/last.ckpt")
        ...     _ = open(f"{folder}/last.ckpt", "r+b").truncate(10)  # torn
        ...     found, skipped = newest_readable(Path(folder).iterdir())
        ...     found.name, [p.name for p, _ in skipped]
        ('last.prev.ckpt', ['last.ckpt'])
    """
    paths = sorted(
        (Path(p) for p in candidates if Path(p).is_file()), key=lambda p: p.stat().st_mtime, reverse=True
    )
    skipped: list[tuple[Path, str]] = []
    for path in paths:
        _, failure = _load(path)
        if failure is None:
            return path, skipped
        skipped.append((path, failure))
    return None, skipped
