"""The chaos soak, one run of each kind of fault in CI (the rates are the benchmark's:
``benchmarks/faults/chaos.py``, ``benchmarks/results/chaos.json`` and ``chaos_hangs.json``).

``--kinds torn write-kill exit-abort --faults 3``: two agents on one c10d rendezvous (loopback),
float64, ``ExactGlobalBatch``; the newest checkpoint torn and a worker SIGKILLed, the checkpoint
writer SIGKILLed mid-write, a worker SIGTERMed that aborts at its exit. The run must finish on
its own, train every surviving step on the uninterrupted run's samples, and end with its weights
(see ``chaos.TOLERANCE``). The kinds left to the benchmark each have a test of their own: a
worker or an agent SIGKILLed and a new agent joining (``test_torchrun_elastic.py``), an agent's
SIGTERM stopping every rank at one step (``test_elastic_ddp.py``).

``--kinds worker-pause worker-slow --faults 2 --hang-timeout 5``: a pause of ``hang_timeout / 3``
must not restart the group; a worker stopped and continued again and again must be reported as a
straggler; the same weights, no process left (stopped or not), no abort. A worker stopped for
good is ``tests/health/test_hang.py``'s (named within ``hang_timeout + 15`` s, on either rank).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers import script_env

pytestmark = [
    pytest.mark.slow,  # starts processes: two torchrun jobs
    pytest.mark.timeout(400),  # 90-105 s each alone on 2 cores
]

CHAOS = ("-m", "benchmarks.faults.chaos")  # run from anywhere: script_env puts the root on the path
KINDS = ("torn", "write-kill", "exit-abort")


def test_a_torn_checkpoint_a_killed_writer_and_an_abort_at_exit_lose_nothing(tmp_path: Path) -> None:
    out, result_file = tmp_path / "out", tmp_path / "chaos.json"
    command = [sys.executable, *CHAOS, "--kinds", *KINDS, "--faults", str(len(KINDS))]
    command += ["--steps", "80", "--timeout", "300"]
    command += ["--out", str(out), "--json", str(result_file)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=380, env=script_env())
    logs = "\n".join(p.read_text()[-1500:] for p in sorted(out.glob("soak/agent*.log")))
    assert result_file.exists(), proc.stdout[-3000:] + proc.stderr[-3000:] + logs
    result = json.loads(result_file.read_text())
    assert proc.returncode == 0 and result["ok"], proc.stdout[-3000:] + logs
    hit = {f["kind"] for f in result["faults"] if "missed" not in f}
    assert hit == set(KINDS), result["faults"]
    assert result["surviving_steps"] == 80 and result["leftovers"] == []
    assert result["weights"]["max_abs_diff"] <= result["tolerance"]
    for fault in result["faults"]:  # every kill cost a restart (two close faults may share one)
        assert "restart_latency_s" in fault or fault.get("overlapped"), fault
    assert result["processes_left"] == [] and result["aborts_at_exit"] == 0


HANG_KINDS = ("worker-pause", "worker-slow")
HANG_TIMEOUT = 5.0


def test_a_pause_is_waited_out_and_a_slow_worker_reported(tmp_path: Path) -> None:
    out, result_file = tmp_path / "out", tmp_path / "chaos.json"
    command = [sys.executable, *CHAOS, "--kinds", *HANG_KINDS, "--faults", "2", "--steps", "160"]
    command += [
        "--hang-timeout",
        str(HANG_TIMEOUT),
        "--timeout",
        "300",
        "--out",
        str(out),
        "--json",
        str(result_file),
    ]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=380, env=script_env())
    logs = "\n".join(p.read_text()[-1500:] for p in sorted(out.glob("soak/agent*.log")))
    assert result_file.exists(), proc.stdout[-3000:] + proc.stderr[-3000:] + logs
    result = json.loads(result_file.read_text())
    assert proc.returncode == 0 and result["ok"], proc.stdout[-3000:] + logs
    faults = {f["kind"]: f for f in result["faults"] if "missed" not in f}
    assert set(faults) == set(HANG_KINDS), result["faults"]
    pause, slow = (faults[kind] for kind in HANG_KINDS)
    # a pause under hang_timeout: no watchdog line, no restart; about the pause lost
    assert pause["pause_s"] == pytest.approx(HANG_TIMEOUT / 3)
    assert pause["restarted"] is False and pause["detected_s"] is None, pause
    # the slowed rank reported as a straggler, and nothing restarted
    assert slow["reported"] and slow["straggler"]["rank"] == slow["target_rank"], slow
    assert slow["restarted"] is False and slow["detected_s"] is None, slow
    assert result["surviving_steps"] == 160 and result["leftovers"] == []
    assert result["weights"]["max_abs_diff"] <= result["tolerance"]
    assert result["processes_left"] == [] and result["aborts_at_exit"] == 0
    assert [row.split()[0] for row in result["table"][1:]] == [*HANG_KINDS, "rejoin"]
