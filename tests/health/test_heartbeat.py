"""PeerWatchdog: heartbeats through the run's store, a hang judged per peer (and for the store)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

import lightning_bandlimit
from lightning_bandlimit.health.beat import Beat
from lightning_bandlimit.health.hangs import Hang, HangJudge
from lightning_bandlimit.health.heartbeat import HUNG_EXIT_CODE, PeerWatchdog

HANG_TIMEOUT = 1.0
INTERVAL = 0.05


# -- Beat ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "beat", [Beat(0), Beat(1, 0), Beat(12, 340), Beat(7, None, True), Beat(3, -1), Beat(10**12, 10**9, True)]
)
def test_a_beat_survives_encode_and_decode(beat: Beat) -> None:
    data = beat.encode()
    assert isinstance(data, bytes) and len(data) < 32
    assert Beat.decode(data) == beat
    assert Beat.decode(data.decode()) == beat  # a str too


def test_the_encoding_is_the_documented_one() -> None:
    assert Beat(12, 340).encode() == b"12 340 0"
    assert Beat(13, None, True).encode() == b"13 - 1"


@pytest.mark.parametrize(
    "garbage",
    [
        b"",
        b"12",
        b"12 340",
        b"12 340 2",
        b"-1 3 0",
        b"1 3 0 ",
        b"a b c",
        b"\xff\xfe",
        "\u0661\u0662 3 0",
        42,
        None,
    ],
)
def test_garbage_is_not_a_heartbeat(garbage: Any) -> None:
    with pytest.raises(ValueError, match=r"not a heartbeat: .* \(expected b'<beat> <step or -> <done 0\|1>'"):
        Beat.decode(garbage)


def test_long_garbage_is_shown_shortened() -> None:
    with pytest.raises(ValueError) as error:
        Beat.decode(b"x" * 1000)
    assert len(str(error.value)) < 160 and "..." in str(error.value)


def test_a_beat_checks_its_fields() -> None:
    with pytest.raises(ValueError, match=r"beat must be >= 0, got -1"):
        Beat(-1)
    with pytest.raises(TypeError, match=r"beat must be an int >= 0, got 1.5 \(float\)"):
        Beat(1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"step must be an int, got '3' \(str\)"):
        Beat(1, "3")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"done must be a bool, got 1 \(int\)"):
        Beat(1, 3, 1)  # type: ignore[arg-type]


# -- HangJudge (a fake clock: the times given) --------------------------------------------------------


def test_a_live_peer_is_never_hung() -> None:
    judge = HangJudge(rank=0, world_size=3, hang_timeout=10.0)
    for i in range(2000):  # 1000 s; each peer's beat changes every 9.5 s at the slowest
        now = i * 0.5
        beats = {1: Beat(i + 1, i // 10), 2: Beat(int(now // 9.5), 5)}
        assert judge.observe(now, beats) is None, now


def test_a_silent_peer_is_hung_after_hang_timeout_with_its_rank_step_and_seconds() -> None:
    judge = HangJudge(rank=0, world_size=3, hang_timeout=10.0)
    for i in range(6):  # rank 1 beats up to t=5 (step 12 then), rank 2 all along
        assert judge.observe(float(i), {1: Beat(i + 1, 7 + i), 2: Beat(i + 1, 7 + i)}) is None
    frozen = Beat(6, 12)
    t = 6.0
    while t < 15.0:  # rank 1's beat last changed at t=5: silent for 10 s at t=15, not before
        assert judge.observe(t, {1: frozen, 2: Beat(int(t * 10), 99)}) is None, t
        t += 0.25
    hang = judge.observe(15.0, {1: frozen, 2: Beat(999, 99)})
    assert hang == Hang(
        rank=1,
        step=12,
        seconds=10.0,
        hang_timeout=10.0,
        reason="rank 1 has not advanced past step 12",
        seen_by=0,
    )
    assert hang.message() == (
        "rank 1 has not advanced past step 12 for 10.0 s (hang_timeout=10.0 s): exiting so the agent "
        "restarts the group from the last checkpoint"
    )
    assert judge.observe(21.5, {1: frozen, 2: Beat(1000, 99)}).seconds == 16.5  # still, and longer


def test_a_done_peer_is_not_hung_and_one_that_beats_again_is_judged_again() -> None:
    judge = HangJudge(rank=0, world_size=2, hang_timeout=10.0)
    assert judge.observe(0.0, {1: Beat(5, 40, done=True)}) is None
    for t in range(1, 100):
        assert judge.observe(float(t), {1: Beat(5, 40, done=True)}) is None
    assert judge.observe(100.0, {1: Beat(1, 0)}) is None  # a new fit: beating anew, not done
    assert judge.observe(109.0, {1: Beat(1, 0)}) is None
    assert judge.observe(110.0, {1: Beat(1, 0)}).rank == 1


def test_its_own_rank_is_ignored() -> None:
    judge = HangJudge(rank=1, world_size=2, hang_timeout=10.0)
    for t in range(0, 100, 3):  # its own beat never changes, rank 0's does
        assert judge.observe(float(t), {0: Beat(t + 1, t), 1: Beat(1, 0)}) is None
    hang = HangJudge(rank=1, world_size=2, hang_timeout=10.0)
    hang.observe(0.0, {0: Beat(1, 0), 1: Beat(1, 0)})
    assert hang.observe(10.0, {0: Beat(1, 0), 1: Beat(2, 1)}).rank == 0  # its own advancing saves no one


def test_a_peer_never_seen_counts_from_the_first_observe() -> None:
    judge = HangJudge(rank=0, world_size=2, hang_timeout=10.0)
    assert judge.observe(100.0, {1: None}) is None
    assert judge.observe(109.9, {}) is None  # absent is None
    hang = judge.observe(110.0, {1: None})
    assert (hang.rank, hang.step, hang.seconds) == (1, None, 10.0)
    assert hang.reason == "rank 1 has sent no heartbeat"


def test_a_peer_silent_before_its_first_step_and_the_longest_silent_first() -> None:
    judge = HangJudge(rank=2, world_size=4, hang_timeout=10.0)
    judge.observe(0.0, {0: Beat(1), 1: Beat(1, 3), 3: Beat(1, 3)})
    judge.observe(2.0, {0: Beat(1), 1: Beat(2, 3), 3: Beat(1, 3)})
    hang = judge.observe(12.0, {0: Beat(1), 1: Beat(2, 3), 3: Beat(1, 3)})  # 0 and 3: 12 s, 1: 10 s
    assert (hang.rank, hang.step, hang.seconds) == (0, None, 12.0)  # ties: the lowest rank
    assert hang.reason == "rank 0 has stopped beating before its first step"


def test_an_unreachable_store_for_hang_timeout_is_a_hang_of_no_rank() -> None:
    judge = HangJudge(rank=1, world_size=2, hang_timeout=10.0)
    assert judge.observe(0.0, {0: Beat(1, 1)}) is None
    for t in range(1, 11):  # first failure at t=1
        assert judge.unreachable(float(t), "DistNetworkError: Broken pipe") is None, t
    hang = judge.unreachable(11.0, "DistNetworkError: Broken\npipe")
    assert (hang.rank, hang.step, hang.seconds, hang.seen_by) == (None, None, 10.0, 1)
    assert "store" in hang.reason and "rank 0" in hang.reason
    assert "(DistNetworkError: Broken pipe)" in hang.reason  # on one line
    assert "\n" not in hang.message() and hang.message().endswith("from the last checkpoint")


def test_a_success_resets_the_unreachable_store() -> None:
    judge = HangJudge(rank=0, world_size=2, hang_timeout=10.0)
    judge.observe(0.0, {1: Beat(1, 1)})
    for t in range(1, 10):
        assert judge.unreachable(float(t), "timeout") is None
    assert judge.observe(10.0, {1: Beat(2, 1)}) is None
    for t in range(11, 21):  # counts again from t=11
        assert judge.unreachable(float(t), "timeout") is None, t
    assert judge.unreachable(21.0, "timeout").seconds == 10.0


def test_a_request_that_blocked_counts_from_when_it_began() -> None:
    judge = HangJudge(rank=0, world_size=2, hang_timeout=10.0)
    judge.observe(0.0, {1: Beat(1, 1)})
    assert judge.unreachable(9.0, "pending", since=1.0) is None
    assert judge.unreachable(11.0, "pending", since=5.0).seconds == 10.0  # the earliest start holds


def test_the_time_the_store_did_not_answer_is_not_counted_against_the_peers() -> None:
    judge = HangJudge(rank=0, world_size=2, hang_timeout=10.0)
    assert judge.observe(0.0, {1: Beat(1, 1)}) is None
    assert judge.observe(2.0, {1: Beat(1, 1)}) is None
    for t in range(3, 11):  # the store silent from t=3 to t=11 (8 s, not a hang)
        assert judge.unreachable(float(t), "pending") is None
    assert judge.observe(11.0, {1: Beat(1, 1)}) is None  # 11 s since rank 1 changed, 3 of them counted
    assert judge.observe(17.9, {1: Beat(1, 1)}) is None
    assert judge.observe(18.0, {1: Beat(1, 1)}).seconds == 10.0


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"world_size": 0}, ValueError, r"world_size must be >= 1, got 0"),
        ({"world_size": 2.0}, TypeError, r"world_size must be an int >= 1, got 2.0 \(float\)"),
        ({"rank": 2}, ValueError, r"rank must be in \[0, 1\], got 2"),
        ({"rank": -1}, ValueError, r"rank must be in \[0, 1\], got -1"),
        ({"rank": True}, TypeError, r"rank must be an int in \[0, 1\], got True \(bool\)"),
        ({"hang_timeout": 0}, ValueError, r"hang_timeout must be > 0.0, got 0"),
        ({"hang_timeout": -5.0}, ValueError, r"hang_timeout must be > 0.0, got -5.0"),
        ({"hang_timeout": float("inf")}, ValueError, r"hang_timeout must be a finite number, got inf"),
        ({"hang_timeout": float("nan")}, ValueError, r"hang_timeout must be a finite number, got nan"),
        ({"hang_timeout": "60"}, TypeError, r"hang_timeout must be a real number > 0.0, got '60' \(str\)"),
    ],
)
def test_the_judge_and_the_watchdog_check_their_arguments(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    arguments = {"rank": 0, "world_size": 2, "hang_timeout": 60.0, **kwargs}
    with pytest.raises(error, match=message):
        HangJudge(**arguments)
    with pytest.raises(error, match=message):
        PeerWatchdog(_MemoryStore(), **arguments)


def test_the_watchdog_checks_its_own_arguments() -> None:
    store = _MemoryStore()
    assert PeerWatchdog(store, 0, 2, 60.0).interval == 1.0
    assert PeerWatchdog(store, 0, 2, 2.0).interval == pytest.approx(0.2)
    with pytest.raises(TypeError, match=r"must be a torch.distributed.Store .* got dict without set, check"):
        PeerWatchdog({}, 0, 2, 60.0)
    with pytest.raises(ValueError, match=r"interval must be > 0.0, got 0"):
        PeerWatchdog(store, 0, 2, 60.0, interval=0)
    with pytest.raises(ValueError, match=r"interval must be <= hang_timeout / 2 = 30 .* got 31"):
        PeerWatchdog(store, 0, 2, 60.0, interval=31)
    with pytest.raises(TypeError, match=r"on_hang must be callable, got 5 \(int\)"):
        PeerWatchdog(store, 0, 2, 60.0, on_hang=5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"clock must be callable, got None \(NoneType\)"):
        PeerWatchdog(store, 0, 2, 60.0, clock=None)  # type: ignore[arg-type]
    watchdog = PeerWatchdog(store, 0, 2, 60.0)
    with pytest.raises(TypeError):
        watchdog.progress(1.5)  # type: ignore[arg-type]
    watchdog.stop()  # never started: nothing to stop, twice
    watchdog.stop()


# -- PeerWatchdog on threads -------------------------------------------------------------------------


class _MemoryStore(dict):
    """What the watchdog needs of a Store, in memory; ``fail``: every method raises; ``block``: waits
    for that event; ``delay``: seconds each request takes."""

    def __init__(self, fail: bool = False, block: threading.Event | None = None, delay: float = 0.0) -> None:
        super().__init__()
        self.fail, self.block, self.delay = fail, block, delay

    def _use(self) -> None:
        if self.block is not None:
            self.block.wait()
        time.sleep(self.delay)
        if self.fail:
            raise RuntimeError("Connection reset by peer")

    def set(self, key: str, value: bytes) -> None:
        self._use()
        self[key] = value

    def get(self, key: str) -> bytes:
        self._use()
        return self[key]

    def check(self, keys: list[str]) -> bool:
        self._use()
        return all(key in self for key in keys)


class _Hangs:
    """An ``on_hang`` that records."""

    def __init__(self) -> None:
        self.seen: list[Hang] = []
        self.event = threading.Event()

    def __call__(self, hang: Hang) -> None:
        self.seen.append(hang)
        self.event.set()


@pytest.fixture
def watchdogs() -> Iterator[Callable[..., tuple[PeerWatchdog, _Hangs]]]:
    """Makes started watchdogs (``hang_timeout`` 1 s, ``interval`` 0.05 s), stopped after the test."""
    made: list[PeerWatchdog] = []

    def make(store: Any, rank: int, world_size: int = 2, **kwargs: Any) -> tuple[PeerWatchdog, _Hangs]:
        hangs = _Hangs()
        arguments = {"hang_timeout": HANG_TIMEOUT, "interval": INTERVAL, "on_hang": hangs, **kwargs}
        watchdog = PeerWatchdog(store, rank, world_size, **arguments)
        made.append(watchdog)
        watchdog.start()
        return watchdog, hangs

    yield make
    for watchdog in made:
        watchdog.stop(timeout=2.0)


@pytest.fixture(scope="module")
def tcp_store() -> Iterator[dist.TCPStore]:
    """The run's store, as rank 0 (or torchrun's agent) hosts it: a free port on this machine."""
    yield dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))


def _client(master: dist.TCPStore, prefix: str) -> dist.PrefixStore:
    """A rank's own client of the store, as the strategy makes it."""
    client = dist.TCPStore(
        "127.0.0.1", master.port, is_master=False, timeout=timedelta(seconds=30), wait_for_workers=False
    )
    return dist.PrefixStore(prefix, client)


def test_two_ranks_beating_never_hang_and_a_stopped_one_is_named_within_hang_timeout(
    tcp_store: dist.TCPStore, watchdogs: Callable[..., tuple[PeerWatchdog, _Hangs]]
) -> None:
    zero, zero_hangs = watchdogs(_client(tcp_store, "stopped"), 0)
    one, one_hangs = watchdogs(_client(tcp_store, "stopped"), 1)
    for step in range(8):
        zero.progress(step)
        one.progress(step)
        time.sleep(1.5 / 8)
    assert zero_hangs.seen == [] and one_hangs.seen == []
    assert zero.watching and one.watching
    assert Beat.decode(_client(tcp_store, "stopped").get("1")).step == 7  # what rank 1 published
    one.stop()  # as SIGSTOP would: its beat stays where it was, not done
    stopped = time.monotonic()
    assert zero_hangs.event.wait(HANG_TIMEOUT + 1.0), "rank 0 did not notice that rank 1 stopped"
    elapsed = time.monotonic() - stopped
    assert HANG_TIMEOUT / 2 <= elapsed <= HANG_TIMEOUT + 1.0  # not at once: its last beat counts
    (hang,) = zero_hangs.seen
    assert (hang.rank, hang.step, hang.seen_by) == (1, 7, 0)
    assert HANG_TIMEOUT <= hang.seconds <= HANG_TIMEOUT + 1.0
    pattern = r"rank 1 has not advanced past step 7 for ([\d.]+) s \(hang_timeout=1.0 s\): .*"
    found = re.fullmatch(pattern, hang.message())
    assert found and float(found.group(1)) >= HANG_TIMEOUT
    time.sleep(5 * INTERVAL)
    assert zero_hangs.seen == [hang] and zero.hang == hang and not zero.watching  # once, then it stopped
    assert one_hangs.seen == [] and one.hang is None


def test_a_rank_that_is_done_is_not_hung(
    tcp_store: dist.TCPStore, watchdogs: Callable[..., tuple[PeerWatchdog, _Hangs]]
) -> None:
    zero, zero_hangs = watchdogs(_client(tcp_store, "done"), 0)
    one, one_hangs = watchdogs(_client(tcp_store, "done"), 1)
    one.progress(3)
    time.sleep(0.3)
    one.done()
    assert not one.watching  # it stopped judging
    one.stop()
    published = Beat.decode(_client(tcp_store, "done").get("1"))
    assert published.done and published.step == 3
    assert not zero_hangs.event.wait(HANG_TIMEOUT + 0.5)
    assert zero.watching and zero.hang is None and one_hangs.seen == []
    one.done()  # once: a second call does nothing


def test_done_before_start_or_after_stop_is_published_by_the_caller() -> None:
    store = _MemoryStore()
    PeerWatchdog(store, 1, 3, 60.0).done()
    assert Beat.decode(store["1"]) == Beat(1, None, done=True)
    watchdog = PeerWatchdog(store, 2, 3, 60.0, interval=0.01)
    watchdog.start()
    watchdog.progress(9)
    watchdog.stop()
    watchdog.done()
    assert Beat.decode(store["2"]).done and Beat.decode(store["2"]).step == 9
    with pytest.raises(RuntimeError, match=r"start\(\) was called before"):
        watchdog.start()


def test_a_store_that_raises_is_a_hang_of_no_rank_after_hang_timeout(
    watchdogs: Callable[..., tuple[PeerWatchdog, _Hangs]],
) -> None:
    started = time.monotonic()
    watchdog, hangs = watchdogs(_MemoryStore(fail=True), 0)
    assert hangs.event.wait(HANG_TIMEOUT + 1.0)
    assert time.monotonic() - started >= HANG_TIMEOUT
    (hang,) = hangs.seen
    assert hang.rank is None and hang.step is None and hang.seconds >= HANG_TIMEOUT
    assert "store" in hang.reason and "RuntimeError: Connection reset by peer" in hang.reason


def test_a_store_that_never_answers_is_a_hang_of_no_rank_after_hang_timeout(
    watchdogs: Callable[..., tuple[PeerWatchdog, _Hangs]],
) -> None:
    # as a TCPStore client's requests do while the server's process is stopped, whatever its timeout
    blocked = threading.Event()
    try:
        started = time.monotonic()
        watchdog, hangs = watchdogs(_MemoryStore(block=blocked), 0)
        assert hangs.event.wait(HANG_TIMEOUT + 1.0), "a request that never returns was waited for"
        assert time.monotonic() - started >= HANG_TIMEOUT
        (hang,) = hangs.seen
        assert hang.rank is None and "a request pending" in hang.reason
        asked = time.monotonic()
        watchdog.done(timeout=0.1)  # never waits for the store, never blocks on it
        assert time.monotonic() - asked < 0.5
    finally:
        blocked.set()


def test_a_slow_store_does_not_delay_the_verdict_on_a_silent_peer(
    watchdogs: Callable[..., tuple[PeerWatchdog, _Hangs]],
) -> None:
    # a round of 3 requests takes 0.3 s, longer than interval but under hang_timeout / 2: rank 1's
    # silence counts all along (were the slow rounds paused as an outage, 1 s would take about 7)
    started = time.monotonic()
    watchdog, hangs = watchdogs(_MemoryStore(delay=0.1), 0)
    assert hangs.event.wait(HANG_TIMEOUT + 1.5), "a slow store delayed the verdict"
    assert time.monotonic() - started >= HANG_TIMEOUT
    assert hangs.seen[0].rank == 1 and hangs.seen[0].reason == "rank 1 has sent no heartbeat"


def test_a_world_of_one_beats_alone(watchdogs: Callable[..., tuple[PeerWatchdog, _Hangs]]) -> None:
    store = _MemoryStore()
    watchdog, hangs = watchdogs(store, 0, world_size=1)
    time.sleep(HANG_TIMEOUT + 0.2)
    assert hangs.seen == [] and Beat.decode(store["0"]).beat > 5


def test_its_own_errors_are_one_warning_and_never_leave_its_thread(
    watchdogs: Callable[..., tuple[PeerWatchdog, _Hangs]], monkeypatch: pytest.MonkeyPatch
) -> None:
    raised: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    store = _MemoryStore()
    store["1"] = b"garbage"  # a peer's key that is not a heartbeat: no news, said once

    def broken(hang: Hang) -> None:
        raise KeyError("on_hang")

    with pytest.warns(RuntimeWarning) as warned:
        watchdog, _ = watchdogs(store, 0, on_hang=broken)
        deadline = time.monotonic() + HANG_TIMEOUT + 1.0
        while watchdog.watching and time.monotonic() < deadline:
            time.sleep(INTERVAL)
    messages = [str(w.message) for w in warned]
    assert len(messages) == 2, messages
    assert messages[0] == (
        "PeerWatchdog (rank 0): rank 1's key holds not a heartbeat: b'garbage' (expected "
        "b'<beat> <step or -> <done 0|1>', such as b'12 340 0')"
    )
    assert messages[1] == "PeerWatchdog (rank 0) stopped watching after its own error: KeyError('on_hang')"
    assert not watchdog.watching and watchdog.hang.rank == 1 and raised == []


# -- exit_hung ----------------------------------------------------------------------------------------

_EXIT = """
import atexit, sys, types
package = types.ModuleType("lightning_bandlimit")  # the package without its __init__ (torch: seconds)
package.__path__ = [{path!r}]
sys.modules["lightning_bandlimit"] = package
from lightning_bandlimit.health.hangs import Hang
from lightning_bandlimit.health.heartbeat import exit_hung
atexit.register(lambda: sys.stderr.write("atexit ran\\n"))
sys.stdout.write("printed before")  # buffered (a pipe), no newline: exit_hung flushes it
exit_hung(Hang(1, 12, 61.0, 60.0, "rank 1 has not advanced past step 12", seen_by=0))
sys.stderr.write("still running\\n")
"""


def test_exit_hung_ends_the_process_with_75_and_says_why_on_stderr() -> None:
    env = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"}
    code = _EXIT.format(path=str(Path(lightning_bandlimit.__file__).parent))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == HUNG_EXIT_CODE == 75, done.stderr
    assert done.stdout == "printed before"
    assert done.stderr == (
        "[rank 0] PeerWatchdog: rank 1 has not advanced past step 12 for 61.0 s (hang_timeout=60.0 s): "
        "exiting so the agent restarts the group from the last checkpoint\n"
    )
