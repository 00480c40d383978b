"""A device's tenants, found without a server: one small JSON file per job in a shared folder.

Each job writes its own entry (:class:`Tenant`) atomically (a temporary file, then
``os.replace``), so a reader sees a whole entry or the previous one, never half of one. An entry
carries a heartbeat (the time of its last write); an entry older than ``timeout`` seconds is a
job that died without leaving, and is ignored; a live job renews its entry
:data:`HEARTBEATS_PER_TIMEOUT` times a ``timeout`` (:meth:`Ledger.beat_due`). Entries are
grouped by device (a GPU's UUID; on CPU, the host's name), one folder each; a job's file is its
name, percent-encoded (``exp/1`` and ``exp:1`` are two files), and a job's entry carries its
process id, host and a random run id, so a second process under a taken name is told
(:meth:`Ledger.claim`).

The folder is shared, so what is in it is untrusted input: a file counts only when it holds up
(:mod:`lightning_bandlimit.tenants.entries`: a regular file of an allowed user, small, each field
checked); anything else is skipped and named once. A write that fails (a read-only folder, a full
disk) never reaches the caller: the job says once that it coordinates no longer, sees no peers
(it decides alone) and retries at its next heartbeat. Folders the ledger creates are sticky (as
``/tmp``): no user removes another's entry.

The ledger's clock is ``time.time`` (wall time, comparable across processes on one host).
"""

from __future__ import annotations

import json
import os
import socket
import stat
import time
import uuid
import warnings
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lightning_bandlimit.tenants.entries import (
    ENTRY_BYTES,
    BadEntry,
    check_entry,
    file_name,
    parse_entry,
    read_entry,
    user_ids,
)
from lightning_bandlimit.utils.files import atomic_write_json
from lightning_bandlimit.utils.validation import check_int, check_real

__all__ = ["HEARTBEATS_PER_TIMEOUT", "MAX_ENTRIES", "Ledger", "Tenant", "host_device"]

# renewals of a live entry per ``timeout`` (a count; a choice, not a measure): an entry renewed
# every ``timeout / 4`` seconds stays live through three late renewals (a long step, a slow disk)
HEARTBEATS_PER_TIMEOUT = 4
# entries read per check, the newest first (a device has a few tenants, a rank each under DDP;
# a choice, not a measure: a check reads at most this many small files)
MAX_ENTRIES = 256
# files named once as skipped that the ledger remembers (then it names no more)
_NAMED = 10_000


@dataclass(frozen=True)
class Tenant:
    """One job's entry: where it stands on its ladder and what its next move would cost.

    Attributes:
        job: the job's name, unique on the device.
        pid: its process id (on CPU, what its resident memory is measured by).
        heartbeat: ``time.time()`` of the entry's last write.
        rung: its exact rung now.
        split: the chunks its step's batch runs in now (``1``: whole; an entry of an older
            version, without it, reads as ``1``).
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
        host: the host its process runs on.
        run: a random id of the process's ledger (a job name taken twice is told by it).

    ``arriving``, ``held``, ``room_for`` and ``making_room`` carry the job's state in the
    arrival protocol (:class:`~lightning_bandlimit.tenants.arrival.Arrival`).
    """

    job: str
    pid: int
    heartbeat: float
    rung: int = 0
    split: int = 1
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
    host: str = ""
    run: str = ""

    def setting_differs(self, setting: Any) -> bool:
        """Whether ``setting`` (a ladder :class:`~lightning_bandlimit.ladder.Setting`: rung,
        split and compression) is not this entry's."""
        return (self.rung, self.split, self.compression) != (setting.rung, setting.split, setting.compression)

    @classmethod
    def from_dict(cls, value: Any, now: float | None = None) -> Tenant:
        """An entry from its JSON form, every field checked; unknown keys (a newer version's)
        are ignored; with ``now``, clocks ahead of it by more than
        :data:`~lightning_bandlimit.tenants.entries.CLOCK_SKEW_S` are refused.

        Raises:
            ValueError: (:class:`~lightning_bandlimit.tenants.entries.BadEntry`) if ``value`` is
                not an object, a required field is missing or a field does not hold up.
        """
        if not isinstance(value, dict):
            raise BadEntry(f"JSON {type(value).__name__}, not an object")
        return cls(**check_entry(value, now))


def host_device() -> str:
    """The device key of a CPU job: the host's budget is shared by the jobs of one host."""
    return f"host-{socket.gethostname()}"


def _alive(tenant: Tenant, host: str) -> bool:
    """Whether ``tenant``'s process may be live (another host's cannot be looked at)."""
    if tenant.host != host or tenant.pid == os.getpid():
        return True
    try:
        os.kill(tenant.pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's (EPERM): live
        return True
    return True


class Ledger:
    """The entries of one device's tenants in ``folder``: this job's, and its live peers'.

    Args:
        folder: a folder every tenant of the device can write (created if missing, sticky).
        device: the device's key (a GPU's UUID; :func:`host_device` on CPU).
        job: this job's name (default: a fresh unique one); any name, one file per name.
        timeout: seconds after which a silent peer is taken for dead and ignored.
        clock: the time source (``time.time``; a test may pass another).
        trusted_users: users (names or ids) besides this process's own whose entries count
            (default: none: the entries of the job's own user only).
        max_entries: the most entries a check reads, the newest first.
        warn: what says a skipped file (once per file) or a failing write (once per failure);
            default :func:`warnings.warn`.

    Raises:
        ValueError: for a non-positive ``timeout`` or ``max_entries``, an empty ``device``, or
            a ``trusted_users`` entry that is no user.

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
        trusted_users: Iterable[str | int] | None = None,
        max_entries: int = MAX_ENTRIES,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        if not device:
            raise ValueError("device must name the device the tenants share, got an empty string")
        self.timeout = check_real("timeout", timeout, minimum=0, min_open=True)
        self.max_entries = check_int("max_entries", max_entries, minimum=1)
        self.trusted = user_ids(trusted_users)
        self.root = Path(folder)
        self.folder = self.root / file_name(device)
        self.job = job if job else f"job-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.clock = clock
        self.path = self.folder / f"{file_name(self.job)}.json"
        self.host, self.run = socket.gethostname(), uuid.uuid4().hex
        self.last: Tenant | None = None
        self.failed: OSError | None = None  # the last write's error (None: written)
        self.opened = 0  # files opened to read, in all (what checks cost)
        self._warn = warn if warn is not None else (lambda message: warnings.warn(message, stacklevel=3))
        self._retry_at = 0.0
        self._named: set[str] = set()
        self._bad: dict[str, tuple[int, int, int]] = {}  # skipped files, by what they were

    def publish(self, **entry: Any) -> Tenant:
        """Write this job's entry (its fields as :class:`Tenant`'s, but ``job``, ``pid``,
        ``heartbeat``, ``host`` and ``run``, which the ledger fills in); returns it.

        A write that fails is said once; until one succeeds, no peer is read (:meth:`peers` is
        empty: the job decides alone) and a write is tried again once per heartbeat interval.
        """
        mine = {"job": self.job, "pid": os.getpid(), "host": self.host, "run": self.run}
        tenant = Tenant(**mine, heartbeat=self.clock(), **entry)
        self.last = tenant
        if self.failed is not None and tenant.heartbeat < self._retry_at:
            return tenant
        try:
            self._write(tenant)
        except OSError as error:
            if self.failed is None:
                self._warn(
                    f"ledger: cannot write {self.path} ({error}): the job coordinates no longer, it "
                    "decides alone and tries again at its next heartbeat"
                )
            self.failed, self._retry_at = error, tenant.heartbeat + self.timeout / HEARTBEATS_PER_TIMEOUT
            return tenant
        if self.failed is not None:
            self._warn(f"ledger: {self.path} written again: the job coordinates again")
            self.failed = None
        return tenant

    def _write(self, tenant: Tenant) -> None:
        try:
            atomic_write_json(self.path, asdict(tenant))
        except FileNotFoundError:  # the folder is gone (or never was): made again, sticky
            self.root.parent.mkdir(parents=True, exist_ok=True)
            for folder in (self.root, self.folder):
                try:
                    folder.mkdir()
                except FileExistsError:
                    continue
                try:
                    os.chmod(folder, 0o1777)  # as /tmp: anyone writes, only an entry's owner removes it
                except OSError:
                    pass  # a file system without modes: the folder is still there
            atomic_write_json(self.path, asdict(tenant))

    def beat_due(self) -> bool:
        """Whether the entry last published is older than ``timeout / HEARTBEATS_PER_TIMEOUT``
        seconds (``False`` before the first)."""
        if self.last is None:
            return False
        return self.clock() - self.last.heartbeat > self.timeout / HEARTBEATS_PER_TIMEOUT

    def beat(self) -> None:
        """Renew the heartbeat of the last entry published (nothing before the first)."""
        if self.last is not None:
            filled = ("job", "pid", "heartbeat", "host", "run")
            self.publish(**{k: v for k, v in asdict(self.last).items() if k not in filled})

    def peers(self) -> list[Tenant]:
        """The live peers' entries, by job name: of the newest :attr:`max_entries` files but this
        job's, each that holds up (a file named once otherwise), heard from within ``timeout``
        seconds and naming a job other than this one. None while this job's write fails."""
        if self.failed is not None:
            return []
        at = self.clock()
        found = []
        for name in self._candidates():
            try:
                data = read_entry(self.folder / name, self.trusted, self._count)
                tenant = Tenant.from_dict(parse_entry(data), now=at)
                if tenant.job == self.job or f"{file_name(tenant.job)}.json" != name:
                    raise BadEntry(f"names job {tenant.job!r:.80}, not the job its file is named for")
            except BadEntry as error:
                self._skip(name, str(error))
                continue
            except OSError:
                continue  # gone meanwhile, or a disk error: not a tenant we can read now
            if at - tenant.heartbeat <= self.timeout:
                found.append(tenant)
        return sorted(found, key=lambda t: t.job)

    def _count(self) -> None:
        self.opened += 1

    def _candidates(self) -> list[str]:
        """The names of the newest :attr:`max_entries` files that may be entries: regular files
        of an allowed user (others named once), not skipped before unchanged since."""
        listed = []
        try:
            with os.scandir(self.folder) as found:
                for item in found:
                    name = item.name
                    if not name.endswith(".json") or name.startswith(".") or name == self.path.name:
                        continue
                    try:
                        info = item.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if stat.S_ISDIR(info.st_mode):
                        continue
                    if self._bad.get(name) == (info.st_ino, info.st_mtime_ns, info.st_size):
                        continue  # skipped before, unchanged since: not read again
                    self._bad.pop(name, None)
                    if stat.S_ISLNK(info.st_mode):
                        self._skip(name, "a symbolic link", info)
                    elif not stat.S_ISREG(info.st_mode):
                        self._skip(name, "not a regular file", info)
                    elif info.st_size > ENTRY_BYTES:
                        self._skip(name, f"{info.st_size} bytes, larger than an entry ({ENTRY_BYTES})", info)
                    elif info.st_uid not in self.trusted:
                        self._skip(
                            name, f"owned by user id {info.st_uid}, not allowed to share the device", info
                        )
                    else:
                        listed.append((info.st_mtime_ns, name))
        except OSError:
            return []  # no folder (none written yet), or not a folder
        listed.sort(reverse=True)
        return [name for _, name in listed[: self.max_entries]]

    def _skip(self, name: str, why: str, info: os.stat_result | None = None) -> None:
        """Name a skipped file once; remember it as it is (not read again while unchanged)."""
        if info is None:
            try:
                info = os.lstat(self.folder / name)
            except OSError:
                return
        if len(self._bad) < _NAMED:
            self._bad[name] = (info.st_ino, info.st_mtime_ns, info.st_size)
        if name not in self._named and len(self._named) < _NAMED:
            self._named.add(name)
            self._warn(f"ledger: {self.folder / name} skipped: {why}")

    def claim(self) -> None:
        """Make sure this job's name is not a live process's of another run (call it before the
        first :meth:`publish`).

        Raises:
            ValueError: if this job's file holds a live entry of another run (its heartbeat
                within ``timeout``, its process not known to be gone), naming both processes.
        """
        try:
            held = Tenant.from_dict(parse_entry(read_entry(self.path, self.trusted, self._count)))
        except (OSError, ValueError):
            return  # none, or none that counts: the name is free
        if (
            held.run == self.run
            or self.clock() - held.heartbeat > self.timeout
            or not _alive(held, self.host)
        ):
            return
        raise ValueError(
            f"job name {self.job!r} is taken on this device by a live job: process {held.pid} on "
            f"{held.host or 'an unknown host'} (heartbeat {self.clock() - held.heartbeat:.0f} s ago); this "
            f"is process {os.getpid()} on {self.host}: give each job its own name ({self.path})"
        )

    def leave(self) -> None:
        """Remove this job's entry (its peers stop counting it at once); an entry another run
        wrote under this name is left, and a failure to remove is ignored."""
        self.last = None
        try:
            data = read_entry(self.path, self.trusted, self._count)
            held = json.loads(data)
            if isinstance(held, dict) and held.get("run", self.run) != self.run:
                return  # another process's under this name
            self.path.unlink(missing_ok=True)
        except (OSError, ValueError, RecursionError):
            pass

    def __repr__(self) -> str:
        return f"Ledger({str(self.folder)!r}, job={self.job!r})"
