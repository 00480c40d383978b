"""A device's tenants, found without a server: one small JSON file per job in a shared folder.

Each job writes its own entry (:class:`Tenant`) atomically (a temporary file, then
``os.replace``), so a reader sees a whole entry or the previous one, never half of one. An entry
carries a heartbeat (the time of its last write); an entry older than ``timeout`` seconds is a
job that died without leaving, and is ignored; a live job renews its entry
:data:`HEARTBEATS_PER_TIMEOUT` times a ``timeout`` (:meth:`Ledger.beat_due`). Unreadable
entries (another version's, a disk error) are ignored too: the ledger carries intent, and a job
it cannot read is a co-tenant as any other. Entries are grouped by device (a GPU's UUID; on
CPU, the host's name), one folder each.

The ledger's clock is ``time.time`` (wall time, comparable across processes on one host).
"""

from __future__ import annotations

import json
import os
import re
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

from lightning_bandlimit.utils.files import atomic_write_json
from lightning_bandlimit.utils.validation import check_real

__all__ = ["HEARTBEATS_PER_TIMEOUT", "Ledger", "Tenant", "host_device"]

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")

# renewals of a live entry per ``timeout`` (a count; a choice, not a measure): an entry renewed
# every ``timeout / 4`` seconds stays live through three late renewals (a long step, a slow disk)
HEARTBEATS_PER_TIMEOUT = 4


@dataclass(frozen=True)
class Tenant:
    """One job's entry: where it stands on its ladder and what its next move would cost.

    Attributes:
        job: the job's name, unique on the device.
        pid: its process id (on CPU, what its resident memory is measured by).
        heartbeat: ``time.time()`` of the entry's last write.
        rung: its exact rung now.
        compression: its compression now.
        lossy: whether it runs above its floor compression (it holds a lossy lever).
        changed_at: ``time.time()`` of its last change of setting (``0``: none yet).
        exact_left: whether an exact rung is left above its setting.
        next_freed: bytes its next move up is predicted to free (``None``: unknown).
        next_lossy: whether that move is lossy (a compression; ``None``: no move left).
        next_cost: its measured slowdown per GiB freed (``None``: unknown).
        memory: its own measured memory, bytes (``None``: unknown).
        top_memory: its measured memory on its top rung, bytes (``None``: not measured there),
            what an arrival beside it may need for the first step it runs there.
        rung_peaks: its measured peak per exact rung, ``(rung, bytes)`` pairs.
        stage_least: the least bytes each of its stages frees when checkpointed, and
        stage_most: the most (measured in a plain step both are one figure; on samples they
            differ by the stages' inputs): its model's fingerprint, a peer whose ranges meet
            this job's is taken for a run of the same model.
        idle_from: the lowest rung its ladder measured to free next to nothing over the rung
            below (``None``: none): it and the rungs above need that rung's memory.
        coordinates: whether it applies the shared rule (a job that only publishes does not).
        arriving: whether it is about to run its first step (its memory not measured yet).
        held: bytes it holds while arriving, before its first step (``None``: not arriving).
        room_for: the arriving jobs its last check made room for (or found room for).
        making_room: whether its last check moved to make room for an arrival (the move not
            measured yet: others leave the room to it until its next check).

    ``arriving``, ``held``, ``room_for`` and ``making_room`` carry the job's state in the
    arrival protocol (:class:`~lightning_bandlimit.tenants.arrival.Arrival`).
    """

    job: str
    pid: int
    heartbeat: float
    rung: int = 0
    compression: float = 0.0
    lossy: bool = False
    changed_at: float = 0.0
    exact_left: bool = False
    next_freed: float | None = None
    next_lossy: bool | None = None
    next_cost: float | None = None
    memory: int | None = None
    top_memory: int | None = None
    rung_peaks: tuple[tuple[int, int], ...] = ()
    stage_least: tuple[int, ...] = ()
    stage_most: tuple[int, ...] = ()
    idle_from: int | None = None
    coordinates: bool = False
    arriving: bool = False
    held: int | None = None
    room_for: tuple[str, ...] = ()
    making_room: bool = False

    def setting_differs(self, setting: Any) -> bool:
        """Whether ``setting`` (a ladder :class:`~lightning_bandlimit.ladder.Setting`) is not this entry's."""
        return (self.rung, self.compression) != (setting.rung, setting.compression)

    @classmethod
    def from_dict(cls, value: dict[str, Any]) -> Tenant:
        """An entry from its JSON form; unknown keys (a newer version's) are ignored.

        Raises:
            TypeError: if a required field is missing.
        """
        names = {f.name for f in fields(cls)}
        entry = {k: v for k, v in value.items() if k in names}
        if "room_for" in entry:
            entry["room_for"] = tuple(entry["room_for"] or ())
        if "rung_peaks" in entry:
            entry["rung_peaks"] = tuple((int(r), int(b)) for r, b in entry["rung_peaks"] or ())
        for key in ("stage_least", "stage_most"):
            if key in entry:
                entry[key] = tuple(int(s) for s in entry[key] or ())
        return cls(**entry)


def host_device() -> str:
    """The device key of a CPU job: the host's budget is shared by the jobs of one host."""
    return f"host-{socket.gethostname()}"


class Ledger:
    """The entries of one device's tenants in ``folder``: this job's, and its live peers'.

    Args:
        folder: a folder every tenant of the device can write (created if missing).
        device: the device's key (a GPU's UUID; :func:`host_device` on CPU).
        job: this job's name (default: a fresh unique one); letters, digits, ``_.-`` are kept.
        timeout: seconds after which a silent peer is taken for dead and ignored.
        clock: the time source (``time.time``; a test may pass another).

    Raises:
        ValueError: for a non-positive ``timeout`` or an empty ``device``.

    Example:
        >>> import tempfile
        >>> folder = tempfile.mkdtemp()
        >>> a, b = Ledger(folder, "gpu-0", job="a"), Ledger(folder, "gpu-0", job="b")
        >>> _ = a.publish(rung=1), b.publish(rung=0)
        >>> [(t.job, t.rung) for t in a.peers()]
        [('b', 0)]
        >>> b.leave(); a.peers()
        []
    """

    def __init__(
        self,
        folder: str | Path,
        device: str,
        job: str | None = None,
        timeout: float = 120.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not device:
            raise ValueError("device must name the device the tenants share, got an empty string")
        self.timeout = check_real("timeout", timeout, minimum=0, min_open=True)
        self.folder = Path(folder) / _SAFE.sub("_", device)
        self.job = _SAFE.sub("_", job) if job else f"job-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.clock = clock
        self.path = self.folder / f"{self.job}.json"
        self.last: Tenant | None = None

    def publish(self, **entry: Any) -> Tenant:
        """Write this job's entry (its fields as :class:`Tenant`'s, but ``job``, ``pid`` and
        ``heartbeat``, which the ledger fills in); returns it.

        Raises:
            OSError: if the folder cannot be written.
        """
        tenant = Tenant(job=self.job, pid=os.getpid(), heartbeat=self.clock(), **entry)
        self.folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.path, asdict(tenant))
        self.last = tenant
        return tenant

    def beat_due(self) -> bool:
        """Whether the entry last published is older than ``timeout / HEARTBEATS_PER_TIMEOUT``
        seconds (``False`` before the first)."""
        if self.last is None:
            return False
        return self.clock() - self.last.heartbeat > self.timeout / HEARTBEATS_PER_TIMEOUT

    def beat(self) -> None:
        """Renew the heartbeat of the last entry published (nothing before the first)."""
        if self.last is not None:
            entry = {k: v for k, v in asdict(self.last).items() if k not in ("job", "pid", "heartbeat")}
            self.publish(**entry)

    def peers(self) -> list[Tenant]:
        """The live peers' entries, by job name: every entry but this job's, heard from within
        ``timeout`` seconds and readable."""
        at = self.clock()
        found = []
        for path in sorted(self.folder.glob("*.json")) if self.folder.is_dir() else []:
            if path == self.path:
                continue
            try:
                tenant = Tenant.from_dict(json.loads(path.read_text()))
            except (OSError, ValueError, TypeError):
                continue  # gone, half of another version's, or not ours: not a tenant we can read
            if at - tenant.heartbeat <= self.timeout:
                found.append(tenant)
        return found

    def leave(self) -> None:
        """Remove this job's entry (its peers stop counting it at once)."""
        self.path.unlink(missing_ok=True)
        self.last = None

    def __repr__(self) -> str:
        return f"Ledger({str(self.folder)!r}, job={self.job!r})"
