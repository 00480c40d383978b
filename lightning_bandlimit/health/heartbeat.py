"""Hangs: every rank publishes a heartbeat and its step to the run's store and watches its peers'.

Under DDP a stopped (``SIGSTOP``) rank leaves the others blocked in a collective until the process
group's timeout (30 minutes). A :class:`PeerWatchdog` on every rank makes that ``hang_timeout``:
its thread writes this rank's :class:`Beat` (a counter bumped every ``interval``, the last step)
under ``str(rank)`` in the run's store and has a :class:`HangJudge` judge the peers'. A peer not
``done`` whose beat has not changed for ``hang_timeout`` is hung: ``on_hang`` (by default
:func:`exit_hung`: rank and step on stderr, exit status :data:`HUNG_EXIT_CODE`) is called once.

The heartbeat is the watchdog thread's: a main thread deadlocked in a collective while every
process runs keeps beating (the collective's timeout covers that); a process that stops is caught.

**A store that does not answer.** A TCPStore client ignores its timeout while a stopped server
keeps its socket open: ``check``, ``get`` and ``multi_get`` block until the server runs again (torch
2.15), holding the client's lock. So the requests run on a thread of their own; the watchdog's
thread waits for each round ``interval`` at a time, and a round unanswered (or failing) for
``hang_timeout`` is a hang with ``rank=None`` (under Lightning's own launcher the store lives in
rank 0's process). While the store does not answer, the peers' silence is not counted.

No torch here: the judge is given the time; the watchdog uses ``set``, ``get``, ``check``, ``multi_get``.
"""

from __future__ import annotations

import contextlib
import operator
import os
import re
import sys
import threading
import time
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from lightning_bandlimit.utils.validation import check_int, check_real

__all__ = ["HUNG_EXIT_CODE", "Beat", "Hang", "HangJudge", "PeerWatchdog", "exit_hung"]

# Non-zero so that torchrun restarts the group (75: EX_TEMPFAIL). The main thread is blocked in a
# collective that never returns, so only os._exit ends the process (sys.exit: this thread alone).
HUNG_EXIT_CODE = 75

_BEAT = re.compile(r"([0-9]+) (-|-?[0-9]+) ([01])")


def _seconds(value: float) -> str:
    return f"{value:.1f}" if value >= 0.1 or value == 0 else f"{value:.2g}"


@dataclass(frozen=True)
class Beat:
    """One heartbeat of a rank, as stored: ``b"<beat> <step> <done>"`` (``-``: no step yet).

    Attributes:
        beat: a counter the rank's watchdog thread increments at every heartbeat (>= 0).
        step: the rank's global step as its training loop last reported it; ``None`` before that.
        done: whether the rank finished fitting (it stops beating then, and is never hung).

    Raises:
        TypeError: if ``beat`` or ``step`` is not an int, or ``done`` not a bool.
        ValueError: if ``beat`` is negative.

    Example:
        >>> Beat(beat=12, step=340).encode()
        b'12 340 0'
        >>> Beat.decode(b"13 - 1")
        Beat(beat=13, step=None, done=True)
    """

    beat: int
    step: int | None = None
    done: bool = False

    def __post_init__(self) -> None:
        check_int("beat", self.beat, minimum=0)
        if self.step is not None:
            check_int("step", self.step)
        if not isinstance(self.done, bool):
            raise TypeError(f"done must be a bool, got {self.done!r} ({type(self.done).__name__})")

    def encode(self) -> bytes:
        """The bytes stored for this beat (ASCII, a few bytes)."""
        return f"{self.beat} {'-' if self.step is None else self.step} {int(self.done)}".encode("ascii")

    @classmethod
    def decode(cls, data: bytes | str) -> Beat:
        """The beat ``data`` holds (what :meth:`encode` wrote; a str is accepted too).

        Raises:
            ValueError: if ``data`` is not a heartbeat.
        """
        try:
            text = data.decode("ascii") if isinstance(data, (bytes, bytearray)) else data
            found = _BEAT.fullmatch(text) if isinstance(text, str) else None
        except UnicodeDecodeError:
            found = None
        if found is None:
            shown = repr(data) if len(repr(data)) <= 60 else repr(data)[:57] + "..."
            raise ValueError(
                f"not a heartbeat: {shown} (expected b'<beat> <step or -> <done 0|1>', such as b'12 340 0')"
            )
        beat, step, done = found.groups()
        return cls(int(beat), None if step == "-" else int(step), done == "1")


@dataclass(frozen=True)
class Hang:
    """A hung peer (``rank``), or the run's store not answering (``rank=None``).

    Attributes:
        rank: the hung peer's rank; ``None`` for the store.
        step: the peer's last reported step (``None``: none seen, or the store).
        seconds: how long its beat had not changed (the store had not answered).
        hang_timeout: the judge's ``hang_timeout``.
        reason: what was seen, the subject of :meth:`message` (``"rank 1 has not advanced past step 12"``).
        seen_by: the rank that judged it (``None``: unknown).

    Example:
        >>> hang = Hang(1, 12, 61.0, 60.0, "rank 1 has not advanced past step 12", seen_by=0)
        >>> hang.message()  # doctest: +ELLIPSIS
        'rank 1 has not advanced past step 12 for 61.0 s (hang_timeout=60.0 s): exiting so the agent ...'
    """

    rank: int | None
    step: int | None
    seconds: float
    hang_timeout: float
    reason: str
    seen_by: int | None = None

    def message(self) -> str:
        """One line: what was seen, for how long, and what happens next."""
        return (
            f"{self.reason} for {_seconds(self.seconds)} s (hang_timeout={_seconds(self.hang_timeout)} s): "
            "exiting so the agent restarts the group from the last checkpoint"
        )


class HangJudge:
    """Judges, from the beats read at each round, whether a peer (or the store) hangs.

    Per peer it remembers the last :class:`Beat` seen and when (by ``now``) it last changed; a
    peer never seen counts from the first :meth:`observe`. A peer not ``done`` whose beat has not
    changed for ``hang_timeout`` or more is hung (the longest silent; ties: the lowest rank). Its
    own rank is ignored. A ``None`` or missing beat is no news: it neither changes nor ends a
    silence. Time the store spent not answering (from the first :meth:`unreachable` to the next
    :meth:`observe`) is not counted against the peers.

    Args:
        rank: this rank.
        world_size: the number of ranks (>= 1).
        hang_timeout: seconds without a change after which a peer is hung (> 0, finite).

    Raises:
        TypeError: if an argument has the wrong type.
        ValueError: if ``world_size < 1``, ``rank`` not in ``[0, world_size - 1]`` or ``hang_timeout <= 0``.

    Example:
        >>> judge = HangJudge(rank=0, world_size=2, hang_timeout=60.0)
        >>> judge.observe(0.0, {1: Beat(1, step=12)}), judge.observe(59.0, {1: Beat(1, step=12)})
        (None, None)
        >>> judge.observe(61.0, {1: Beat(1, step=12)}).message()  # doctest: +ELLIPSIS
        'rank 1 has not advanced past step 12 for 61.0 s (hang_timeout=60.0 s): exiting ...'
    """

    def __init__(self, rank: int, world_size: int, hang_timeout: float) -> None:
        self.world_size = check_int("world_size", world_size, minimum=1)
        self.rank = check_int("rank", rank, minimum=0, maximum=world_size - 1)
        self.hang_timeout = check_real("hang_timeout", hang_timeout, minimum=0.0, min_open=True)
        self._peers = tuple(r for r in range(world_size) if r != rank)
        self._last: dict[int, Beat | None] = {}
        self._changed: dict[int, float] = {}
        self._unreachable_since: float | None = None

    def observe(self, now: float, beats: Mapping[int, Beat | None]) -> Hang | None:
        """The peers' beats read at ``now``: the longest silent hung peer, or ``None``.

        Args:
            now: the time of the reading in seconds (the same clock at every call).
            beats: each peer's beat by rank (``None`` or absent: not published yet); others ignored.
        """
        if self._unreachable_since is not None:  # the store's silence is no peer's
            paused = max(0.0, now - self._unreachable_since)
            self._changed = {peer: min(now, t + paused) for peer, t in self._changed.items()}
            self._unreachable_since = None
        worst: tuple[float, int] | None = None
        for peer in self._peers:
            beat = beats.get(peer)
            if peer not in self._changed or (beat is not None and beat != self._last[peer]):
                self._last[peer], self._changed[peer] = beat, now
            last, silent = self._last[peer], now - self._changed[peer]
            if (last is None or not last.done) and silent >= self.hang_timeout:
                worst = (silent, peer) if worst is None or silent > worst[0] else worst
        if worst is None:
            return None
        silent, peer = worst
        last = self._last[peer]
        if last is None:
            reason = f"rank {peer} has sent no heartbeat"
        elif last.step is None:
            reason = f"rank {peer} has stopped beating before its first step"
        else:
            reason = f"rank {peer} has not advanced past step {last.step}"
        return Hang(peer, None if last is None else last.step, silent, self.hang_timeout, reason, self.rank)

    def unreachable(self, now: float, error: str, since: float | None = None) -> Hang | None:
        """The store failed (or has not answered) at ``now``: a :class:`Hang` with ``rank=None``
        once it has been so continuously for ``hang_timeout``; a successful :meth:`observe` resets it.

        Args:
            now: the time of the failure.
            error: what failed, for the message (on one line, its first 200 characters).
            since: when the failed request began (one may block before it fails); ``now`` if ``None``.
        """
        start = now if since is None else min(since, now)
        if self._unreachable_since is None or start < self._unreachable_since:
            self._unreachable_since = start
        silent = now - self._unreachable_since
        if silent < self.hang_timeout:
            return None
        error = " ".join(str(error).split())  # on one line, its first 200 characters
        error = error if len(error) <= 200 else error[:197] + "..."
        reason = (
            "the run's store (in rank 0's process under Lightning's own launcher, so rank 0 may be "
            f"stopped; in torchrun's agent under torchrun) has not answered ({error})"
        )
        return Hang(None, None, silent, self.hang_timeout, reason, self.rank)


def exit_hung(hang: Hang) -> NoReturn:
    """Write ``hang``'s message to stderr and end the process with :data:`HUNG_EXIT_CODE`.

    stdout and stderr are flushed, then ``os._exit``: no cleanup, no ``atexit``, no waiting for
    the collective the main thread is blocked in.

    Args:
        hang: what was found; its ``seen_by`` prefixes the line (``[rank 0] PeerWatchdog: ...``).
    """
    prefix = "PeerWatchdog: " if hang.seen_by is None else f"[rank {hang.seen_by}] PeerWatchdog: "
    with contextlib.suppress(Exception):  # a closed (or no) stream must not keep the process alive
        sys.stdout.flush()
    with contextlib.suppress(Exception):
        sys.stderr.write(f"{prefix}{hang.message()}\n")
        sys.stderr.flush()
    os._exit(HUNG_EXIT_CODE)


class PeerWatchdog:
    """This rank's heartbeat in ``store`` and a :class:`HangJudge` of its peers', on daemon threads.

    Every ``interval`` the thread ``lightning_bandlimit-heartbeat`` has a round run by the thread
    ``lightning_bandlimit-heartbeat-io`` (this rank's :class:`Beat` set under ``str(rank)``; the
    peers' read, ``check`` first so that a key not set yet is ``None``, never waited for;
    ``multi_get`` when all are set) and judges it. On a :class:`Hang` it calls ``on_hang`` once,
    from its thread, and stops. It never raises: an error of its own is one warning, then it stops.

    Args:
        store: a ``torch.distributed.Store`` of the run (a ``PrefixStore`` over a TCPStore client).
        rank: this rank.
        world_size: the number of ranks.
        hang_timeout: seconds a peer's beat may stay unchanged (or the store not answer).
        interval: seconds between heartbeats (> 0, at most ``hang_timeout / 2``); default
            ``min(1.0, hang_timeout / 10)``.
        on_hang: called with the :class:`Hang`; default :func:`exit_hung` (the process ends).
        clock: a monotonic clock in seconds.

    Raises:
        TypeError: if ``store`` lacks ``set``, ``get`` or ``check``, a callable is not one, or a
            number has the wrong type.
        ValueError: if a number is out of range (as :class:`HangJudge`; ``interval`` above).

    Example:
        >>> class Store(dict):  # what the watchdog needs of a torch.distributed.Store
        ...     set, get = dict.__setitem__, dict.__getitem__
        ...     def check(self, keys): return all(key in self for key in keys)
        >>> store = Store()
        >>> watchdog = PeerWatchdog(store, rank=0, world_size=2, hang_timeout=60.0)
        >>> watchdog.interval
        1.0
        >>> watchdog.start(); watchdog.progress(3); watchdog.done(); watchdog.stop()
        >>> Beat.decode(store["0"]).done, watchdog.hang
        (True, None)
    """

    def __init__(
        self,
        store: Any,
        rank: int,
        world_size: int,
        hang_timeout: float,
        interval: float | None = None,
        on_hang: Callable[[Hang], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        missing = [name for name in ("set", "get", "check") if not callable(getattr(store, name, None))]
        if missing:
            raise TypeError(
                "store must be a torch.distributed.Store (with set, get and check), got "
                f"{type(store).__name__} without {', '.join(missing)}"
            )
        self._judge = HangJudge(rank, world_size, hang_timeout)
        self.rank, self.world_size, self.hang_timeout = rank, world_size, self._judge.hang_timeout
        interval = min(1.0, self.hang_timeout / 10) if interval is None else interval
        self.interval = check_real("interval", interval, minimum=0.0, min_open=True)
        if self.interval > self.hang_timeout / 2:
            raise ValueError(
                f"interval must be <= hang_timeout / 2 = {self.hang_timeout / 2:g} (two heartbeats at least "
                f"per hang_timeout), got {interval}"
            )
        for name, value in (("on_hang", exit_hung if on_hang is None else on_hang), ("clock", clock)):
            if not callable(value):
                raise TypeError(f"{name} must be callable, got {value!r} ({type(value).__name__})")
        self._store, self._clock = store, clock
        self._on_hang: Callable[[Hang], None] = exit_hung if on_hang is None else on_hang
        self._key, self._peer_keys = str(rank), [(r, str(r)) for r in range(world_size) if r != rank]
        self._step: int | None = None
        self._hang: Hang | None = None
        self._beat, self._answer = 0, ("none", None)
        self._lock = threading.Lock()
        self._started = self._watching = self._in_flight = self._warned = False
        self._done_requested = self._done_published = self._closing = False
        self._stopping, self._wake, self._exited = threading.Event(), threading.Event(), threading.Event()
        self._request, self._answered = threading.Event(), threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def hang(self) -> Hang | None:
        """The :class:`Hang` found (``on_hang`` was called with it), or ``None``."""
        return self._hang

    @property
    def watching(self) -> bool:
        """Whether the watchdog's thread runs (started; not stopped, done or ended by a hang)."""
        return self._watching

    def start(self) -> None:
        """Start the threads (daemons: they never keep the process alive).

        Raises:
            RuntimeError: if it was started before (a watchdog runs once).
        """
        with self._lock:
            if self._started:
                raise RuntimeError("PeerWatchdog.start() was called before: a watchdog runs once")
            self._started = self._watching = True
        self._threads = [
            threading.Thread(target=self._watch, name="lightning_bandlimit-heartbeat", daemon=True),
            threading.Thread(target=self._serve, name="lightning_bandlimit-heartbeat-io", daemon=True),
        ]
        for thread in reversed(self._threads):
            thread.start()

    def progress(self, step: int) -> None:
        """This rank's global step, sent with the next heartbeat (cheap: called at every batch)."""
        self._step = operator.index(step)

    def done(self, timeout: float = 5.0) -> None:
        """This rank finished fitting: publish ``done`` (once) and stop judging the peers.

        Waits up to ``timeout`` seconds for the heartbeat thread to publish it; never longer for
        a store that does not answer (then nothing is published).
        """
        with self._lock:
            if self._done_requested:
                return
            self._done_requested, watching = True, self._watching
        if watching:
            self._wake.set()
            self._exited.wait(timeout)
        with self._lock:  # no thread watching, no request in flight: nobody else uses the store
            if self._watching or self._in_flight or self._done_published:
                return
            self._in_flight = True
        try:
            self._beat += 1
            with contextlib.suppress(Exception):
                self._store.set(self._key, Beat(self._beat, self._step, True).encode())
                self._done_published = True
        finally:
            self._in_flight = False

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop the threads, waiting up to ``timeout`` seconds (idempotent; safe if never started).

        A thread blocked in the store is left behind (a daemon). :meth:`done` is not implied.
        """
        self._stopping.set()
        self._wake.set()
        self._closing = True  # the store's thread ends when it is next idle
        self._request.set()
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))

    def _watch(self) -> None:
        """The watchdog's thread: a round every ``interval``, judged; never raises."""
        try:
            while not self._stopping.is_set():
                started = self._clock()
                with self._lock:
                    self._in_flight = True
                self._answered.clear()
                self._request.set()
                while not self._answered.wait(self.interval):  # a store may never answer
                    if self._stopping.is_set():
                        return
                    now = self._clock()  # a slow round (under hang_timeout / 2) does not pause the peers
                    if now - started >= self.hang_timeout / 2 and self._report(
                        self._judge.unreachable(now, "a request pending", started)
                    ):
                        return
                kind, payload = self._answer
                if kind == "done":
                    return
                if kind == "bug":
                    raise payload
                now = self._clock()
                if kind == "error":
                    hang = self._judge.unreachable(now, f"{type(payload).__name__}: {payload}", started)
                else:
                    hang = self._judge.observe(now, payload)
                if self._report(hang):
                    return
                self._wake.wait(self.interval)
                self._wake.clear()
        except BaseException as error:  # never into the user's job: one warning, then stop watching
            self._warn(f"PeerWatchdog (rank {self.rank}) stopped watching after its own error: {error!r}")
        finally:
            with self._lock:
                self._watching = False
            self._closing = True
            self._request.set()
            self._exited.set()

    def _report(self, hang: Hang | None) -> bool:
        if hang is not None:
            self._hang = hang
            self._on_hang(hang)  # once: the thread stops after it
        return hang is not None

    def _warn(self, message: str) -> None:
        with contextlib.suppress(Exception):  # warnings turned into errors: still never raise
            warnings.warn(message, RuntimeWarning, stacklevel=2)

    def _serve(self) -> None:
        """The store's thread: one round per request, the answer left in ``_answer``."""
        while True:
            self._request.wait()
            self._request.clear()
            if self._closing:
                with self._lock:
                    self._in_flight = False
                return
            try:
                self._answer = self._round()
            except BaseException as error:
                self._answer = ("bug", error)
            with self._lock:
                self._in_flight = False
            self._answered.set()

    def _round(self) -> tuple[str, Any]:
        self._beat += 1
        beat = Beat(self._beat, self._step, self._done_requested)
        try:
            self._store.set(self._key, beat.encode())
            if beat.done:
                self._done_published = True
                return ("done", None)
            raw = self._read()
        except Exception as error:
            return ("error", error)
        return ("beats", {rank: self._decode(rank, value) for rank, value in raw.items()})

    def _read(self) -> dict[int, bytes | None]:
        keys = [key for _, key in self._peer_keys]
        store = self._store
        if not keys or store.check(keys):
            multi_get = getattr(store, "multi_get", None)
            values = list(multi_get(keys)) if keys and callable(multi_get) else [store.get(k) for k in keys]
            return {rank: value for (rank, _), value in zip(self._peer_keys, values)}
        return {rank: store.get(key) if store.check([key]) else None for rank, key in self._peer_keys}

    def _decode(self, rank: int, value: bytes | None) -> Beat | None:
        try:
            return None if value is None else Beat.decode(value)
        except ValueError as error:  # no news from that peer; said once
            if not self._warned:
                self._warned = True
                self._warn(f"PeerWatchdog (rank {self.rank}): rank {rank}'s key holds {error}")
            return None
