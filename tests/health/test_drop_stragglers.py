"""``drop_stragglers=True`` end to end: two torchrun agents (one worker each) on one elastic
rendezvous, one worker persistently slow. Both ranks stop at the step it is found (a checkpoint
there), the straggler ends its agent; the other agent's group re-forms alone and finishes the run
at world size 1 from that very step, with the learning rate the resize rule gives one process."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
import torch.distributed as dist
from _helpers import free_port, torchrun_agent

pytestmark = pytest.mark.slow  # two torchrun agents, a restart

WORKER = Path(__file__).with_name("hang_worker.py")
MAX_STEPS = 24
SLOW_STEPS = 5  # found at step 5, between the worker's checkpoints (every 2 steps)
EXTRA_SLEEP = 0.8  # the slow worker's step: 1.0 s against 0.2 s (slow_factor 2)


def _agent(out: Path, port: int, name: str, **env: str) -> subprocess.Popen[bytes]:
    # the store lives outside the agents (as a cluster's rendezvous service): the agent that
    # leaves must not take the rendezvous down with it
    conf = (
        "join_timeout=60,last_call_timeout=3,close_timeout=10,is_host=0,read_timeout=15,"
        "keep_alive_interval=1,keep_alive_max_attempt=3,heartbeat_timeout=3"
    )
    args = [str(WORKER), str(out), str(MAX_STEPS), "10", "-1", "0"]
    env = {"HANG_WORKER_DROP": "1", "HANG_WORKER_SLOW_STEPS": str(SLOW_STEPS), **env}
    return torchrun_agent(out, port, name, args, "drop", conf, monitor_interval=0.5, **env)


def test_a_straggler_leaves_and_the_group_finishes_at_the_smaller_world_size(tmp_path: Path) -> None:
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    fast = _agent(tmp_path, port, "fast")
    slow = _agent(tmp_path, port, "slow", HANG_WORKER_EXTRA_SLEEP=str(EXTRA_SLEEP))
    started = time.monotonic()
    try:
        fast_code = fast.wait(timeout=240)
        slow_code = slow.wait(timeout=30)
    finally:
        for agent in (fast, slow):
            if agent.poll() is None:
                agent.kill()
        del store
    fast_log = (tmp_path / "fast.log").read_text(errors="replace")
    slow_log = (tmp_path / "slow.log").read_text(errors="replace")
    both = f"--- fast agent\n{fast_log[-3000:]}\n--- slow agent\n{slow_log[-3000:]}"
    assert fast_code == 0, both
    # the slow worker named itself with its figures and left; its agent ended (by the signal it sent)
    left = re.search(
        r"leaving the group at step (\d+) as a straggler \(drop_stragglers=True\): rank \d is a straggler",
        slow_log,
    )
    assert left, both
    step = int(left.group(1))
    assert slow_code != 0, both
    assert f"stopping at step {step} so the group re-forms without straggler" in fast_log, both
    # the survivor stopped on purpose (status 143, as on a pre-emption), not on a peer's broken socket
    assert "Connection reset by peer" not in fast_log and "Connection closed by peer" not in fast_log, both
    assert re.search(r"exitcode\s*: 143\b", fast_log), both

    starts = [json.loads(line) for line in (tmp_path / "starts.jsonl").read_text().splitlines()]
    first, last = starts[0], starts[-1]
    assert first["world_size"] == 2 and first["step"] == 0, starts
    assert sum(s["world_size"] == 2 for s in starts) == 2, starts  # one generation at 2, both ranks
    # the survivor went on alone from the step the straggler was found at: nothing redone
    assert last["world_size"] == 1 and last["restart"] >= 1, starts
    assert step == SLOW_STEPS == last["step"], (step, starts)
    # LinearScaling: the learning rate follows the global batch (one process: half of two's)
    assert last["lr"] == pytest.approx(first["lr"] / 2), starts
    assert (tmp_path / "final-rank0.pt").exists() and not (tmp_path / "final-rank1.pt").exists()
    assert time.monotonic() - started < 180
