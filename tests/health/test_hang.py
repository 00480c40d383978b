"""A stopped rank costs about ``hang_timeout``, not the collective's 30 minutes: torchrun restarts
the group, it resumes from the last checkpoint and ends with the uninterrupted run's weights."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from _helpers import script_env

pytestmark = pytest.mark.slow  # torchrun, two processes, a stopped one

WORKER = Path(__file__).with_name("hang_worker.py")
HANG_TIMEOUT = 5.0
MAX_STEPS = 12
STOP_STEP = 8


def _torchrun(out: Path, stop_rank: int, stop_step: int, timeout: float) -> subprocess.CompletedProcess[str]:
    out.mkdir()
    torchrun = Path(sys.executable).with_name("torchrun")
    args = [str(torchrun), "--standalone", "--nnodes=1", "--nproc-per-node=2", "--max-restarts=1"]
    args += ["--monitor-interval=1", str(WORKER), str(out), str(MAX_STEPS), str(HANG_TIMEOUT)]
    args += [str(stop_rank), str(stop_step)]
    try:
        return subprocess.run(
            args, cwd=out, env=script_env(), capture_output=True, text=True, timeout=timeout
        )
    finally:
        stopped = out / "stopped.json"
        if stopped.exists():  # never leave a stopped process behind, whatever happened
            pid = json.loads(stopped.read_text())["pid"]
            subprocess.run(["kill", "-9", str(pid)], capture_output=True)


def _weights(out: Path) -> list[dict[str, torch.Tensor]]:
    return [torch.load(out / f"final-rank{r}.pt") for r in range(2)]


def test_a_stopped_rank_is_named_the_group_restarts_and_ends_with_the_uninterrupted_weights(
    tmp_path: Path,
) -> None:
    reference = _torchrun(tmp_path / "reference", -1, 0, timeout=240)
    assert reference.returncode == 0, reference.stderr[-3000:]
    started = time.monotonic()
    stopped = _torchrun(tmp_path / "stopped", 1, STOP_STEP, timeout=300)
    output = stopped.stdout + stopped.stderr
    assert stopped.returncode == 0, output[-4000:]
    found = re.search(r"rank 1 has not advanced past step (\d+) for ([\d.]+) s", output)
    assert found, output[-4000:]
    # its last heartbeat (every 0.5 s) carries the step of a batch it began a little before it stopped
    assert STOP_STEP - 3 <= int(found.group(1)) <= STOP_STEP and float(found.group(2)) <= HANG_TIMEOUT + 15
    # on this machine: not left to the agent's 30 s grace
    assert "[rank 0] ElasticDDPStrategy: SIGKILLed hung rank 1" in output
    assert "exitcode  : 75" in output or "exitcode: 75" in output.replace("  ", " "), output[-4000:]
    for mine, theirs in zip(_weights(tmp_path / "stopped"), _weights(tmp_path / "reference")):
        assert mine.keys() == theirs.keys()
        for name in mine:
            assert torch.equal(mine[name], theirs[name]), name
    # the collective's own timeout (30 minutes) was never waited for
    assert time.monotonic() - started < 240
