"""A ledger entry is untrusted input: how one file is read and checked before it counts.

Anyone who can write the ledger folder can put a file in it, so a file counts as a tenant's
entry only when it holds up:

* **its file** (:func:`read_entry`): a regular file (opened without following a symbolic link,
  without blocking on a FIFO), owned by a user allowed to share the device, of at most
  :data:`ENTRY_BYTES` (a larger one is not read beyond that);
* **its fields** (:func:`check_entry`): a JSON object whose every known field has its type (a
  ``bool`` is no number, a string is no number and no ``bool``, a string is no list of names),
  is finite and in its range (no byte count of :data:`MAX_BYTES` or more), and whose clocks are
  not ahead of the reader's by more than :data:`CLOCK_SKEW_S` (an entry from the future would
  never expire). Unknown keys (a newer version's) are ignored.

Anything else raises :class:`BadEntry`, whose message says what was wrong.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pwd
import stat
from collections.abc import Callable, Collection, Iterable
from typing import Any
from urllib.parse import quote

__all__ = [
    "CLOCK_SKEW_S",
    "ENTRY_BYTES",
    "MAX_BYTES",
    "MAX_ITEMS",
    "BadEntry",
    "check_entry",
    "file_name",
    "parse_entry",
    "read_entry",
    "user_ids",
]

# the most bytes an entry file may hold: ours are below 2 KiB (a few dozen rung peaks and stage
# figures); a larger file is not an entry, and is not read beyond this
ENTRY_BYTES = 64 * 1024
# seconds a clock in an entry may be ahead of the reader's (hosts' clocks differ by a few ms
# with NTP; a choice, not a measure)
CLOCK_SKEW_S = 5.0
# bytes no device holds (1 PiB): a memory figure this large is not a measure
MAX_BYTES = 2**50
# the most items in an entry's list (rung peaks, stage figures, names made room for)
MAX_ITEMS = 1024
# the most chunks a step's batch may run in (a split is at most a batch's size; 2**32: no batch
# is this large)
MAX_SPLIT = 2**32
# the longest name (a job's, a host's, a run id) an entry may carry, in characters
MAX_NAME = 1024
# the longest file name an entry is written to (file systems allow 255 bytes)
_LONGEST = 200


class BadEntry(ValueError):
    """A file that is not a tenant's entry; its message says why."""


def file_name(name: str) -> str:
    """A job's (or device's) name as a file name, one name one file: percent-encoded (letters,
    digits and ``_.-~`` kept, a leading dot encoded), a long one cut and told apart by a hash.

    Example:
        >>> file_name("exp/1"), file_name("exp:1"), file_name("b-job")
        ('exp%2F1', 'exp%3A1', 'b-job')
    """
    encoded = quote(name, safe="")
    if encoded.startswith("."):
        encoded = "%2E" + encoded[1:]
    if len(encoded) > _LONGEST:
        encoded = f"{encoded[: _LONGEST - 65]}~{hashlib.sha256(name.encode()).hexdigest()}"
    return encoded


def user_ids(users: Iterable[str | int] | None) -> frozenset[int]:
    """The user ids of ``users`` (names or ids), with this process's own."""
    found = {os.getuid()}
    for user in users or ():
        if isinstance(user, bool) or not isinstance(user, (str, int)):
            raise ValueError(f"trusted_users holds {user!r}: expected user names or ids")
        if isinstance(user, int):
            found.add(user)
            continue
        try:
            found.add(pwd.getpwnam(user).pw_uid)
        except KeyError:
            raise ValueError(f"trusted_users names {user!r}, which is no user of this host") from None
    return frozenset(found)


def read_entry(path: str | os.PathLike[str], trusted: Collection[int], count: Callable[[], None]) -> bytes:
    """The bytes of the entry at ``path``: a regular file owned by a user id in ``trusted``,
    opened without following a symbolic link and without blocking, of at most
    :data:`ENTRY_BYTES`; ``count`` is called for each file opened.

    Raises:
        BadEntry: for a link, a FIFO or another file that is not regular, a file of another
            user, or one larger than :data:`ENTRY_BYTES`.
        OSError: if the file cannot be opened or read (gone meanwhile, a disk error).
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        handle = os.open(path, flags)
    except OSError as error:
        if os.path.islink(path):  # O_NOFOLLOW refuses the link itself (ELOOP)
            raise BadEntry("a symbolic link") from error
        raise
    count()
    try:
        info = os.fstat(handle)
        if not stat.S_ISREG(info.st_mode):
            raise BadEntry("not a regular file")
        if info.st_uid not in trusted:
            raise BadEntry(f"owned by user id {info.st_uid}, not a user allowed to share the device")
        if info.st_size > ENTRY_BYTES:
            raise BadEntry(f"{info.st_size} bytes, larger than an entry ({ENTRY_BYTES})")
        chunks, left = [], ENTRY_BYTES + 1
        while left > 0:
            chunk = os.read(handle, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        if left <= 0:
            raise BadEntry(f"larger than an entry ({ENTRY_BYTES} bytes)")
        return b"".join(chunks)
    finally:
        os.close(handle)


def parse_entry(data: bytes) -> dict[str, Any]:
    """The JSON object in ``data``.

    Raises:
        BadEntry: if it is not UTF-8 JSON, nested too deep to parse, or not an object.
    """
    try:
        value = json.loads(data.decode("utf-8"))
    except RecursionError as error:
        raise BadEntry("JSON nested too deep") from error
    except ValueError as error:  # UnicodeDecodeError and JSONDecodeError too
        raise BadEntry(f"not JSON ({error})") from error
    if not isinstance(value, dict):
        raise BadEntry(f"JSON {type(value).__name__}, not an object")
    return value


def _number(key: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise BadEntry(f"{key} is {value!r}, not a number")
    try:
        number = float(value)
    except OverflowError as error:  # an int beyond any float
        raise BadEntry(f"{key} is {value!r}, not finite") from error
    if not math.isfinite(number):
        raise BadEntry(f"{key} is {value!r}, not finite")
    return number


def _real(key: str, value: Any, low: float = -MAX_BYTES, high: float = MAX_BYTES) -> float:
    number = _number(key, value)
    if not low <= number < high:
        raise BadEntry(f"{key} is {value!r}, not in [{low:g}, {high:g})")
    return number


def _int(key: str, value: Any, low: int = 0, high: int = MAX_BYTES) -> int:
    number = _real(key, value, low, high)
    if number != int(number):
        raise BadEntry(f"{key} is {value!r}, not a whole number")
    return int(value)


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise BadEntry(f"{key} is {value!r}, not true or false")
    return value


def _name(key: str, value: Any) -> str:
    if not isinstance(value, str) or len(value) > MAX_NAME:
        raise BadEntry(f"{key} is {value!r:.80}, not a name")
    return value


def _items(key: str, value: Any) -> list[Any]:
    if not isinstance(value, (list, tuple)):
        raise BadEntry(f"{key} is {value!r:.80}, not a list")
    if len(value) > MAX_ITEMS:
        raise BadEntry(f"{key} has {len(value)} items, more than {MAX_ITEMS}")
    return list(value)


def _names(key: str, value: Any) -> tuple[str, ...]:
    return tuple(_name(key, v) for v in _items(key, value))


def _figures(key: str, value: Any) -> tuple[int, ...]:
    return tuple(_int(key, v, -MAX_BYTES) for v in _items(key, value))


def _peaks(key: str, value: Any) -> tuple[tuple[int, int], ...]:
    pairs = []
    for pair in _items(key, value):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise BadEntry(f"{key} holds {pair!r:.80}, not a (rung, bytes) pair")
        pairs.append((_int(key, pair[0], 0, MAX_ITEMS), _int(key, pair[1])))
    return tuple(pairs)


def _optional(check: Callable[[str, Any], Any]) -> Callable[[str, Any], Any]:
    return lambda key, value: None if value is None else check(key, value)


# each field of an entry (:class:`~lightning_bandlimit.tenants.ledger.Tenant`) and its check
_FIELDS: dict[str, Callable[[str, Any], Any]] = {
    "job": lambda k, v: _name(k, v if v != "" else None),
    "pid": lambda k, v: _int(k, v, 0, 2**32),
    "heartbeat": _number,
    "rung": lambda k, v: _int(k, v, 0, MAX_ITEMS),
    "split": lambda k, v: _int(k, v, 1, MAX_SPLIT),
    "compression": lambda k, v: _real(k, v, 0.0, 1.0),
    "lossy": _bool,
    "changed_at": _number,
    "exact_left": _bool,
    "next_freed": _optional(_real),
    "next_lossy": _optional(_bool),
    "next_cost": _optional(lambda k, v: _real(k, v, 0.0)),
    "memory": _optional(_int),
    "top_memory": _optional(_int),
    "rung_peaks": _peaks,
    "stage_least": _figures,
    "stage_most": _figures,
    "idle_from": _optional(lambda k, v: _int(k, v, 0, MAX_ITEMS)),
    "coordinates": _bool,
    "arriving": _bool,
    "held": _optional(_int),
    "room_for": _names,
    "making_room": _bool,
    "host": _name,
    "run": _name,
}
_REQUIRED = ("job", "pid", "heartbeat")


def check_entry(value: dict[str, Any], now: float | None = None) -> dict[str, Any]:
    """The known fields of an entry's JSON object, each checked (see the module docstring);
    with ``now``, its clocks (``heartbeat``, ``changed_at``) no later than ``now`` plus
    :data:`CLOCK_SKEW_S`.

    Raises:
        BadEntry: for a missing ``job``, ``pid`` or ``heartbeat``, or a field that does not
            hold up.

    Example:
        >>> check_entry({"job": "a", "pid": 7, "heartbeat": 10.0, "room_for": ["b"], "new": 1})
        {'job': 'a', 'pid': 7, 'heartbeat': 10.0, 'room_for': ('b',)}
        >>> check_entry({"job": "a", "pid": 7, "heartbeat": 10.0, "lossy": "false"})
        Traceback (most recent call last):
        ...
        lightning_bandlimit.tenants.entries.BadEntry: lossy is 'false', not true or false
    """
    missing = [key for key in _REQUIRED if key not in value]
    if missing:
        raise BadEntry(f"no {', '.join(missing)}")
    entry = {key: check(key, value[key]) for key, check in _FIELDS.items() if key in value}
    if now is not None:
        for key in ("heartbeat", "changed_at"):
            if entry.get(key, 0.0) > now + CLOCK_SKEW_S:
                raise BadEntry(f"{key} {entry[key]:.3f} is ahead of this host's clock ({now:.3f})")
    return entry
