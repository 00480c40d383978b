"""A real torchrun elastic job on loopback: a second agent joins, then dies; training rescales each time.

Two torchrun agents (``--nnodes=1:2``, one CPU worker each) share one c10d rendezvous. When the
second agent joins, torchrun stops the first one's worker with SIGTERM (``ElasticCheckpoint``
saves) and restarts both as a world of 2; when the second agent's process group is killed (a
pre-empted node), the surviving worker's collective fails, its agent restarts it alone and it
resumes from the last periodic checkpoint. Bounded: every wait has a deadline.
"""

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from _helpers import free_port, torchrun_agent

pytestmark = pytest.mark.slow  # starts processes

WORKER = Path(__file__).with_name("torchrun_worker.py")
MAX_STEPS = 120


def _agent(out: Path, port: int, name: str) -> subprocess.Popen:
    # a round that reached its minimum closes after 1 s (default 30 s); a dead peer is noticed
    # after 3 missed 1 s keep-alives
    conf = "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=3"
    return torchrun_agent(out, port, name, [str(WORKER), str(out), str(MAX_STEPS)], "elastic-test", conf)


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def _launches(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted(out.glob("launch-*-rank0.json"))]


def _wait(condition, timeout: float, what: str, agents: list[subprocess.Popen], out: Path) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.5)
    logs = "\n".join(p.read_text()[-3000:] for p in out.glob("*.log"))
    for agent in agents:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
    pytest.fail(f"timed out waiting for {what}\n{logs}")


def test_torchrun_agents_join_and_leave(tmp_path: Path) -> None:
    port = free_port()
    first = _agent(tmp_path, port, "first")
    agents = [first]
    progress = tmp_path / "progress-rank0.json"
    try:
        _wait(
            lambda: (p := _read(progress)) is not None and p["step"] >= 8,
            180,
            "the first agent to train",
            agents,
            tmp_path,
        )
        second = _agent(tmp_path, port, "second")
        agents.append(second)

        def training_on_two() -> bool:
            launches = _launches(tmp_path)
            p = _read(progress)
            return (
                bool(launches)
                and launches[-1]["world_size"] == 2
                and p is not None
                and p["world_size"] == 2
                and p["step"] >= launches[-1]["step"] + 8
            )

        _wait(training_on_two, 240, "training on two processes", agents, tmp_path)
        # the second node is pre-empted: its agent and its worker (torchrun starts workers in
        # their own session, so the agent's process group does not cover it) die at once
        os.killpg(second.pid, signal.SIGKILL)
        worker = _read(tmp_path / "progress-rank1.json")
        assert worker is not None
        os.kill(worker["pid"], signal.SIGKILL)
        second.wait(timeout=30)
        _wait(lambda: first.poll() is not None, 300, "the first agent to finish alone", agents, tmp_path)
    finally:
        for agent in agents:
            if agent.poll() is None:
                os.killpg(agent.pid, signal.SIGKILL)
    assert first.returncode == 0, (tmp_path / "first.log").read_text()[-4000:]

    launches = _launches(tmp_path)
    sizes = [(x["world_size"], x["resized_from"]) for x in launches]
    assert sizes[0] == (1, None) and (2, 1) in sizes and sizes[-1] == (1, 2), sizes
    grown = next(x for x in launches if x["world_size"] == 2)
    shrunk = launches[-1]
    assert grown["step"] > 0 and shrunk["step"] >= grown["step"]  # resumed, not restarted from scratch
    assert grown["lr"] == pytest.approx(0.2) and shrunk["lr"] == pytest.approx(0.1)  # linear rule each time
    done = _read(tmp_path / "done-rank0.json")
    assert done == {"step": MAX_STEPS, "world_size": 1}
