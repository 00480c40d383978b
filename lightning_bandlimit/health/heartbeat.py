"""The peer watchdog: every rank publishes a heartbeat and its step to the run's store, and judges its peers'.

Under DDP a stopped (``SIGSTOP``) rank leaves the others blocked in a collective until the process
group's timeout (30 minutes). A :class:`PeerWatchdog` on every rank makes that ``hang_timeout``:
its thread writes this rank's :class:`~lightning_bandlimit.health.beat.Beat` (a counter bumped
every ``interval``, the last step) under ``str(rank)`` in the run's store and has a
:class:`~lightning_bandlimit.health.hangs.HangJudge` judge the peers' (the rule, and what a hang
says, are in :mod:`~lightning_bandlimit.health.hangs`). On the first
:class:`~lightning_bandlimit.health.hangs.Hang`, ``on_hang`` (by default :func:`exit_hung`: rank
and step on stderr, exit status :data:`HUNG_EXIT_CODE`) is called once.

The heartbeat is the watchdog thread's: a main thread deadlocked in a collective while every
process runs keeps beating (the collective's timeout covers that); a process that stops is caught.

**A store that does not answer.** A TCPStore client ignores its timeout while a stopped server
keeps its socket open: ``check``, ``get`` and ``multi_get`` block until the server runs again (torch
2.15), holding the client's lock. So the requests run on a thread of their own; the watchdog's
thread waits for each round ``interval`` at a time, and a round unanswered (or failing) for
``hang_timeout`` is a hang with ``rank=None`` (under Lightning's own launcher the store lives in
rank 0's process). While the store does not answer, the peers' silence is not counted.

**What the threads share.** The flags the caller's thread, the watchdog's thread and the store's
thread read and write are one :class:`_WatchState`, each change that others decide on made under
its lock; the threads signal each other by five events (see :meth:`PeerWatchdog.__init__`).

No torch here: the watchdog uses the store's ``set``, ``get``, ``check`` and ``multi_get``.
"""

from __future__ import annotations

import contextlib
import operator
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from lightning_bandlimit.health.beat import Beat
from lightning_bandlimit.health.hangs import Hang, HangJudge
from lightning_bandlimit.utils.validation import check_real

__all__ = ["HUNG_EXIT_CODE", "PeerWatchdog", "exit_hung"]

# Non-zero so that torchrun restarts the group (75: EX_TEMPFAIL). The main thread is blocked in a
# collective that never returns, so only os._exit ends the process (sys.exit: this thread alone).
HUNG_EXIT_CODE = 75


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


@dataclass(eq=False)
class _WatchState:
    """The watchdog's flags, shared by the caller's thread and the watchdog's two threads.

    The changes another thread decides on are its methods, each under ``lock``; ``closing``,
    ``done_published`` and ``warned`` only ever turn ``True``, and are set directly.

    Attributes:
        started: :meth:`PeerWatchdog.start` was called (a watchdog runs once).
        watching: the watchdog's thread runs (from ``start`` until it stops, for whatever reason).
        in_flight: the store is in use: a round on the store's thread, or :meth:`PeerWatchdog.done`
            publishing ``done`` itself (one user of the store at a time).
        done_requested: :meth:`PeerWatchdog.done` was called: the next beat says ``done``.
        done_published: a beat saying ``done`` was stored.
        closing: the store's thread ends when it is next idle.
        warned: a peer's key that is not a heartbeat was said (once).
    """

    started: bool = False
    watching: bool = False
    in_flight: bool = False
    done_requested: bool = False
    done_published: bool = False
    closing: bool = False
    warned: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def begin(self) -> bool:
        """Started and watching now; ``False`` (nothing changed) if it was started before."""
        with self.lock:
            if self.started:
                return False
            self.started = self.watching = True
            return True

    def request_done(self) -> bool | None:
        """``done`` asked for: whether the watchdog's thread is watching (it publishes it then);
        ``None`` (nothing changed) if it was asked for before."""
        with self.lock:
            if self.done_requested:
                return None
            self.done_requested = True
            return self.watching

    def take_store(self) -> bool:
        """Whether the caller may publish ``done`` itself (no thread watching, no request in
        flight, not published yet); if so the store is in flight for it until :meth:`idle`."""
        with self.lock:
            if self.watching or self.in_flight or self.done_published:
                return False
            self.in_flight = True
            return True

    def send(self) -> None:
        """A round is asked of the store's thread."""
        with self.lock:
            self.in_flight = True

    def idle(self) -> None:
        """The store is no longer in use (a round answered, or the store's thread ending)."""
        with self.lock:
            self.in_flight = False

    def end_watch(self) -> None:
        """The watchdog's thread stops: no longer watching, and the store's thread is to end."""
        with self.lock:
            self.watching = False
        self.closing = True


class PeerWatchdog:
    """This rank's heartbeat in ``store`` and a :class:`~lightning_bandlimit.health.hangs.HangJudge`
    of its peers', on daemon threads.

    Every ``interval`` the thread ``lightning_bandlimit-heartbeat`` has a round run by the thread
    ``lightning_bandlimit-heartbeat-io`` (this rank's :class:`~lightning_bandlimit.health.beat.Beat`
    set under ``str(rank)``; the peers' read, ``check`` first so that a key not set yet is
    ``None``, never waited for; ``multi_get`` when all are set) and judges it. On a
    :class:`~lightning_bandlimit.health.hangs.Hang` it calls ``on_hang`` once, from its thread,
    and stops. It never raises: an error of its own is one warning, then it stops.

    Args:
        store: a ``torch.distributed.Store`` of the run (a ``PrefixStore`` over a TCPStore client).
        rank: this rank.
        world_size: the number of ranks.
        hang_timeout: seconds a peer's beat may stay unchanged (or the store not answer).
        interval: seconds between heartbeats (> 0, at most ``hang_timeout / 2``); default
            ``min(1.0, hang_timeout / 10)``.
        on_hang: called with the :class:`~lightning_bandlimit.health.hangs.Hang`; default
            :func:`exit_hung` (the process ends).
        clock: a monotonic clock in seconds.

    Raises:
        TypeError: if ``store`` lacks ``set``, ``get`` or ``check``, a callable is not one, or a
            number has the wrong type.
        ValueError: if a number is out of range (as
            :class:`~lightning_bandlimit.health.hangs.HangJudge`; ``interval`` above).

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
        self._state = _WatchState()
        # _stopping: stop() was called; _wake: cuts the wait between rounds short (done, stop);
        # _exited: the watchdog's thread ended; _request / _answered: a round asked of the store's
        # thread, and its answer left in _answer.
        self._stopping, self._wake, self._exited = threading.Event(), threading.Event(), threading.Event()
        self._request, self._answered = threading.Event(), threading.Event()
        self._threads: list[threading.Thread] = []

    @property
    def hang(self) -> Hang | None:
        """The :class:`~lightning_bandlimit.health.hangs.Hang` found (``on_hang`` was called with
        it), or ``None``."""
        return self._hang

    @property
    def watching(self) -> bool:
        """Whether the watchdog's thread runs (started; not stopped, done or ended by a hang)."""
        return self._state.watching

    def start(self) -> None:
        """Start the threads (daemons: they never keep the process alive).

        Raises:
            RuntimeError: if it was started before (a watchdog runs once).
        """
        if not self._state.begin():
            raise RuntimeError("PeerWatchdog.start() was called before: a watchdog runs once")
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
        watching = self._state.request_done()
        if watching is None:
            return
        if watching:
            self._wake.set()
            self._exited.wait(timeout)
        # the store is the caller's only with no thread watching and no request in flight
        if not self._state.take_store():
            return
        try:
            self._beat += 1
            with contextlib.suppress(Exception):
                self._store.set(self._key, Beat(self._beat, self._step, True).encode())
                self._state.done_published = True
        finally:
            self._state.idle()

    def stop(self, timeout: float | None = 5.0) -> None:
        """Stop the threads, waiting up to ``timeout`` seconds (idempotent; safe if never started).

        A thread blocked in the store is left behind (a daemon). :meth:`done` is not implied.
        """
        self._stopping.set()
        self._wake.set()
        self._state.closing = True  # the store's thread ends when it is next idle
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
                self._state.send()
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
            self._state.end_watch()
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
            if self._state.closing:
                self._state.idle()
                return
            try:
                self._answer = self._round()
            except BaseException as error:
                self._answer = ("bug", error)
            self._state.idle()
            self._answered.set()

    def _round(self) -> tuple[str, Any]:
        self._beat += 1
        beat = Beat(self._beat, self._step, self._state.done_requested)
        try:
            self._store.set(self._key, beat.encode())
            if beat.done:
                self._state.done_published = True
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
            if not self._state.warned:
                self._state.warned = True
                self._warn(f"PeerWatchdog (rank {self.rank}): rank {rank}'s key holds {error}")
            return None
