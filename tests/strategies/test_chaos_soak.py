"""The chaos soak's CI versions: faults of each kind into a real torchrun elastic job.

``benchmarks/chaos.py --faults 6``: two agents on one c10d rendezvous (loopback), float64,
``ExactGlobalBatch``; a worker SIGKILLed, an agent SIGKILLed with its worker, an agent
SIGTERMed, the checkpoint writer SIGKILLed mid-write, the newest checkpoint torn, a worker
SIGTERMed that aborts at its exit; a new agent after each one lost. The run must finish on its
own, train every surviving step on the uninterrupted run's samples, and end with its weights (see
``chaos.TOLERANCE``).

``--kinds worker-stop worker-pause worker-slow --faults 3 --hang-timeout 5``: a worker stopped for
good must be named by its peer's watchdog within ``hang_timeout + 15`` s and the group restart; a
pause of ``hang_timeout / 3`` must not restart it; a worker stopped and continued again and again
must be reported as a straggler; the same weights, no process left (stopped or not), no abort.
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers import ROOT, script_env

pytestmark = [
    pytest.mark.slow,  # starts processes: two torchrun jobs
    pytest.mark.timeout(600),  # 225-245 s each beside four busy xdist workers
]

CHAOS = ROOT / "benchmarks" / "chaos.py"
KINDS = {"worker-kill", "agent-kill", "agent-term", "write-kill", "torn", "exit-abort"}


def test_six_faults_lose_nothing_and_end_on_the_uninterrupted_weights(tmp_path: Path) -> None:
    out, result_file = tmp_path / "out", tmp_path / "chaos.json"
    command = [sys.executable, str(CHAOS), "--faults", "6", "--steps", "120", "--timeout", "200"]
    command += ["--out", str(out), "--json", str(result_file)]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=300, env=script_env())
    logs = "\n".join(p.read_text()[-1500:] for p in sorted(out.glob("soak/agent*.log")))
    assert result_file.exists(), proc.stdout[-3000:] + proc.stderr[-3000:] + logs
    result = json.loads(result_file.read_text())
    assert proc.returncode == 0 and result["ok"], proc.stdout[-3000:] + logs
    hit = {f["kind"] for f in result["faults"] if "missed" not in f}
    assert hit >= KINDS, result["faults"]
    assert result["surviving_steps"] == 120 and result["leftovers"] == []
    assert result["weights"]["max_abs_diff"] <= result["tolerance"]
    for fault in result["faults"]:  # every kill cost a restart (two close faults may share one)
        if fault["kind"] in KINDS:
            assert "restart_latency_s" in fault or fault.get("overlapped"), fault


HANG_KINDS = ("worker-stop", "worker-pause", "worker-slow")
HANG_TIMEOUT = 5.0


def test_a_stopped_worker_is_named_a_pause_is_waited_out_and_a_slow_one_reported(tmp_path: Path) -> None:
    out, result_file = tmp_path / "out", tmp_path / "chaos.json"
    command = [sys.executable, str(CHAOS), "--kinds", *HANG_KINDS, "--faults", "3", "--steps", "400"]
    command += [
        "--hang-timeout",
        str(HANG_TIMEOUT),
        "--timeout",
        "360",
        "--out",
        str(out),
        "--json",
        str(result_file),
    ]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=600, env=script_env())
    logs = "\n".join(p.read_text()[-1500:] for p in sorted(out.glob("soak/agent*.log")))
    assert result_file.exists(), proc.stdout[-3000:] + proc.stderr[-3000:] + logs
    result = json.loads(result_file.read_text())
    assert proc.returncode == 0 and result["ok"], proc.stdout[-3000:] + logs
    faults = {f["kind"]: f for f in result["faults"] if "missed" not in f}
    assert set(faults) == set(HANG_KINDS), result["faults"]
    stop, pause, slow = (faults[kind] for kind in HANG_KINDS)
    # the stopped rank named by its peer's watchdog, in time; the group restarted and resumed
    assert stop["detected_s"] is not None and stop["detected_s"] <= HANG_TIMEOUT + 15, stop
    assert stop["watchdog"]["rank"] == stop["target_rank"] and stop["restarted"], stop
    assert "restart_latency_s" in stop and stop.get("rescued_s") is None, stop
    # a pause under hang_timeout: no watchdog line, no restart; about the pause lost
    assert pause["pause_s"] == pytest.approx(HANG_TIMEOUT / 3)
    assert pause["restarted"] is False and pause["detected_s"] is None, pause
    # the slowed rank reported as a straggler, and nothing restarted
    assert slow["reported"] and slow["straggler"]["rank"] == slow["target_rank"], slow
    assert slow["restarted"] is False and slow["detected_s"] is None, slow
    assert result["surviving_steps"] == 400 and result["leftovers"] == []
    assert result["weights"]["max_abs_diff"] <= result["tolerance"]
    assert result["processes_left"] == [] and result["aborts_at_exit"] == 0
    assert [row.split()[0] for row in result["table"][1:]] == [*HANG_KINDS, "rejoin"]
