"""The chaos soak's faults that stop a worker: reading the agents' logs, what each fault cost,
what each kind expects, the table (``benchmarks/faults/chaos_judge.py``), and the driver's stopped
targets (``benchmarks/faults/chaos.py``: ``Target``, ``Cycler``) on a ``sleep`` process."""

import doctest
import signal
import subprocess
import time
from pathlib import Path

import pytest

from benchmarks.faults import chaos_judge
from benchmarks.faults.chaos_judge import (
    ABORT_MARK,
    Generation,
    LogWatch,
    attribute,
    count_aborts,
    fault_problems,
    fault_table,
    frontier,
    pace,
    parse_straggler,
    parse_watchdog,
    time_lost,
)
from lightning_bandlimit.health.stragglers import Straggler  # noqa: E402

HANG = 10.0


def test_the_judges_examples_hold() -> None:
    failed, tried = doctest.testmod(chaos_judge)
    assert tried >= 5 and failed == 0


def test_a_watchdog_line_gives_rank_step_and_silence() -> None:
    line = "[rank 0] PeerWatchdog: rank 1 has not advanced past step 57 for 10.4 s (hang_timeout=10); exit 75"
    assert parse_watchdog(line) == {"rank": 1, "step": 57, "silent_s": 10.4}
    assert parse_watchdog("PeerWatchdog: something else") == {"rank": None, "step": None, "silent_s": None}
    assert parse_watchdog("rank 1 has not advanced past step 57 for 10.4 s") is None  # not the watchdog's


def test_the_strategys_straggler_message_is_parsed() -> None:
    message = Straggler(
        rank=1, step=40, seconds=0.27, median=0.1003, ratio=2.69, slow_steps=10, slow_factor=2.0
    )
    parsed = parse_straggler(f"ElasticDDPStrategy: {message.message()}")
    assert parsed == {"rank": 1, "seconds": 0.27, "median": 0.1, "ratio": 2.7}
    tiny = Straggler(rank=0, step=3, seconds=2.5e-05, median=1e-05, ratio=float("inf"))
    assert parse_straggler(tiny.message()) == {
        "rank": 0,
        "seconds": 2.5e-05,
        "median": 1e-05,
        "ratio": float("inf"),
    }
    assert parse_straggler("nothing here") is None


def test_aborts_are_counted_over_every_log() -> None:
    assert count_aborts([f"a\n{ABORT_MARK}\nb", "", f"{ABORT_MARK}\n{ABORT_MARK}"]) == 3
    assert count_aborts(["terminate called after throwing an instance of 'c10::Error'"]) == 0


def test_the_log_watch_reads_what_is_new_and_waits_for_a_line_to_end(tmp_path: Path) -> None:
    watch = LogWatch(tmp_path)
    first = tmp_path / "agent0.log"
    first.write_text("starting\n[rank 1] PeerWatch")
    assert watch.poll(now=1.0) == []  # the line is not finished
    with open(first, "a") as f:
        f.write("dog: rank 0 has not advanced past step 3 for 5.1 s\nmore\n")
    (tmp_path / "agent1.log").write_text("ElasticDDPStrategy: rank 1 is a straggler: 0.3 s a step\n")
    (tmp_path / "other.log").write_text("PeerWatchdog: not an agent's log\n")
    new = watch.poll(now=2.0)
    assert [(e["log"], e["t"]) for e in new] == [("agent0.log", 2.0), ("agent1.log", 2.0)]
    assert parse_watchdog(new[0]["line"]) == {"rank": 0, "step": 3, "silent_s": 5.1}
    assert watch.poll(now=3.0) == []  # nothing read twice
    with open(first, "a") as f:
        f.write("PeerWatchdog: rank 0 has not advanced past step 3 for 6.0 s\n")
    watch.poll(now=4.0)
    assert watch.first("PeerWatchdog:", since=2.5)["t"] == 4.0
    assert watch.first("PeerWatchdog:", since=0.0)["t"] == 2.0
    assert watch.first("PeerWatchdog:", since=2.5, until=3.5) is None
    assert watch.first("is a straggler", since=0.0)["log"] == "agent1.log"


def _generation(name: str, steps: dict[int, float], started: float, start_step: int = 0) -> Generation:
    """A generation that completed ``steps`` (step -> time), 4 micro-batches each."""
    gen = Generation(name, start_step, 2, None, started)
    for step, t in steps.items():
        gen.micro_batches[step] = 4
        gen.done_at[step] = t
        gen.steps[step] = list(range(16))
    gen.first_batch = min(steps.values()) if steps else None
    return gen


def test_the_frontier_keeps_each_steps_first_completion_and_time_lost_counts_a_restart() -> None:
    # a: steps 0-9 every 0.1 s; killed at 1.05; b starts at 3.0 from the checkpoint of step 8:
    # redoes 8 and 9 (0.1 s each), then goes on
    a = _generation("a", {s: 0.1 * s for s in range(10)}, 0.0)
    b = _generation("b", {s: 3.0 + 0.1 * (s - 7) for s in range(8, 20)}, 2.9, start_step=8)
    b.micro_batches[20] = 2  # an incomplete step is not completed
    done = frontier({"a": a, "b": b}, micro_per_step=4)
    assert (
        sorted(done) == list(range(20)) and done[9] == pytest.approx(0.9) and done[10] == pytest.approx(3.3)
    )
    assert pace(done, 9) == pytest.approx(0.1)
    # from step 9 (0.9) to step 10 (3.3), less one step: 2.3 s (the restart, the 2 steps redone)
    assert time_lost(done, t0=1.05, over=3.1) == pytest.approx(2.3)
    assert time_lost(done, t0=1.05, over=3.25) == pytest.approx(2.3)  # over after step 10 began
    assert time_lost(done, t0=-1.0) is None  # nothing completed before
    assert time_lost(done, t0=1.05, over=9.0) is None  # nothing completed after
    assert time_lost({0: 0.0, 1: 5.0}, t0=0.5) is None  # no pace
    assert time_lost({0: 0.0, 1: 5.0}, t0=0.5, fallback=1.0) == pytest.approx(4.0)


def test_a_pace_leaves_out_a_restarts_gap() -> None:
    done = {s: 0.2 * s for s in range(10)} | {s: 30.0 + 0.2 * s for s in range(10, 15)}
    assert pace(done, 14) == pytest.approx(0.2)


def _restart(started: float, first_batch: float, redone: int = 1, torn: bool = False) -> dict:
    return {
        "started": started,
        "first_batch": first_batch,
        "resumed_step": 8,
        "steps_redone": redone,
        "torn_before": torn,
    }


def test_attribute_counts_the_restarts_before_the_next_fault() -> None:
    done = {s: 0.1 * s for s in range(100)}
    faults = [
        {"kind": "worker-stop", "t": 1.0, "step": 10, "over_t": 1.0},
        {"kind": "worker-pause", "t": 3.0, "step": 30, "over_t": 4.0},
        {"kind": "worker-kill", "t": 5.0, "step": 50},
        {"kind": "worker-kill", "t": 6.0, "step": 60},
        {"kind": "worker-slow", "t": 7.0, "step": 70, "missed": "no two ranks training"},
    ]
    restarts = [_restart(1.5, 1.6), _restart(2.0, 2.2, redone=9), _restart(6.5, 6.6)]
    problems: list[str] = []
    attribute(faults, restarts, done, every=4, problems=problems)
    stop, pause, kill, kill2, slow = faults
    assert stop["restarts"] == 2 and stop["restarted"] and stop["restart_latency_s"] == pytest.approx(0.6)
    assert problems == ["worker-stop at step 10: 9 steps redone > 4"]  # the second restart is checked too
    assert pause["restarted"] is False and "overlapped" not in pause  # a pause never restarts
    assert kill["overlapped"] and not kill["restarted"]  # its restart came after the next fault
    assert kill2["restarts"] == 1 and "overlapped" not in kill2
    assert "restarts" not in slow  # missed
    assert stop["time_lost_s"] is not None and pause["time_lost_s"] is not None


def test_fault_problems_hold_each_kind_to_what_it_expects() -> None:
    named = {"rank": 1, "step": 40, "silent_s": 10.2}
    stop = {"kind": "worker-stop", "step": 40, "target_rank": 1, "detected_s": 11.0, "watchdog": named}
    assert fault_problems({**stop, "restarted": True}, HANG) == []
    assert fault_problems({**stop, "restarted": False}, HANG) == [
        "worker-stop at step 40: the group did not restart"
    ]
    late = fault_problems({**stop, "detected_s": 26.0, "restarted": True}, HANG)
    assert late == ["worker-stop at step 40: named after 26.0 s > hang_timeout + 15 = 25 s"]
    wrong = fault_problems({**stop, "target_rank": 0, "restarted": True}, HANG)
    assert wrong == ["worker-stop at step 40: the watchdog named rank 1, the stopped one was rank 0"]
    unseen = fault_problems(
        {**stop, "kind": "worker-long-pause", "detected_s": None, "restarted": True}, HANG
    )
    assert unseen == ["worker-long-pause at step 40: no PeerWatchdog: line named the stopped rank 1"]
    rescued = fault_problems({**stop, "restarted": True, "rescued_s": 86.0}, HANG)
    assert rescued == [
        "worker-stop at step 40: the stopped worker was still there 86 s after; the driver killed it"
    ]

    pause = {"kind": "worker-pause", "step": 9, "target_rank": 0, "detected_s": None, "restarted": False}
    assert fault_problems(pause, HANG) == []
    assert fault_problems({**pause, "restarted": True, "restarts": 1}, HANG) == [
        "worker-pause at step 9: the group restarted (restarts: 1)"
    ]

    slow = {
        "kind": "worker-slow",
        "step": 5,
        "target_rank": 0,
        "detected_s": None,
        "restarted": False,
        "reported": True,
        "straggler": {"rank": 0},
    }
    assert fault_problems(slow, HANG) == []
    assert fault_problems({**slow, "reported": False, "straggler": None}, HANG) == [
        "worker-slow at step 5: no straggler report for the slowed rank 0"
    ]
    false_alarm = fault_problems({**slow, "detected_s": 3.0, "watchdog": named}, HANG)
    assert len(false_alarm) == 1 and "a PeerWatchdog: line 3.0 s after" in false_alarm[0]

    assert fault_problems({"kind": "worker-stop", "step": 3, "missed": "no two ranks"}, HANG) == [
        "worker-stop at step 3: not injected (no two ranks)"
    ]
    assert fault_problems({"kind": "worker-kill", "step": 3, "missed": "no worker alive"}, HANG) == []
    assert fault_problems({"kind": "agent-kill", "step": 3}, HANG) == []

    aborted = {"kind": "exit-abort", "step": 12, "target": 4242}
    assert fault_problems({**aborted, "restarted": True}, HANG) == []
    assert fault_problems({**aborted, "restarted": False, "overlapped": True}, HANG) == []
    assert fault_problems({**aborted, "restarted": False}, HANG) == [
        "exit-abort at step 12: the group did not restart after the abort"
    ]
    assert fault_problems({**aborted, "missed": "the worker ended before its exit handlers ran"}, HANG) == []


def test_the_table_has_a_row_per_kind_with_medians() -> None:
    faults = [
        {
            "kind": "worker-stop",
            "detected_s": 10.0,
            "time_lost_s": 40.0,
            "restarts": 2,
            "restart_latency_s": 11.0,
        },
        {
            "kind": "worker-stop",
            "detected_s": 12.0,
            "time_lost_s": 50.0,
            "restarts": 1,
            "restart_latency_s": 13.0,
        },
        {"kind": "worker-stop", "missed": "no two ranks"},
        {"kind": "worker-slow", "reported_s": 6.0, "detected_s": None, "time_lost_s": 9.0, "restarts": 0},
        {"kind": "worker-kill", "overlapped": True, "time_lost_s": None, "restarts": 0},
    ]
    rows = fault_table(faults, ["worker-stop", "worker-slow", "worker-kill", "rejoin"])
    assert rows[0].split()[:6] == ["fault", "injected", "missed", "overlapped", "restarts", "detected"]
    assert rows[1].split() == ["worker-stop", "2", "1", "0", "3", "11.0", "45.0", "12.0", "/", "13.0", "0"]
    assert rows[2].split() == ["worker-slow", "1", "0", "0", "0", "6.0", "9.0", "-", "0"]
    assert rows[3].split() == ["worker-kill", "1", "0", "1", "0", "-", "-", "-", "0"]
    assert rows[4].split() == ["rejoin", "0", "0", "0", "0", "-", "-", "-", "0"]


def _state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def test_the_driver_stops_continues_and_never_signals_a_reaped_pid() -> None:
    chaos = pytest.importorskip("chaos")
    proc = subprocess.Popen(["sleep", "30"])
    try:
        target = chaos.Target(proc.pid)
        assert target.signal(signal.SIGSTOP)
        time.sleep(0.1)
        assert target.state() == "T"
        cycler = chaos.Cycler(target, stop_s=0.05, run_s=0.02, seconds=0.5)
        cycler.start()
        time.sleep(0.2)
        cycler.halt()  # ends early, and leaves it continued
        assert cycler.ended is not None and cycler.cycles >= 1
        time.sleep(0.1)
        assert _state(proc.pid) in ("S", "R")
        assert target.signal(signal.SIGKILL)
        proc.wait(timeout=5)
        assert target.gone() and not target.signal(signal.SIGSTOP)
    finally:
        proc.kill()
        proc.wait()
