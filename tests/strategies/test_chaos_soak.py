"""The chaos soak's CI version: five faults, one of each kind, into a real torchrun elastic job.

``benchmarks/chaos.py --faults 5``: two agents on one c10d rendezvous (loopback), float64,
``ExactGlobalBatch``; a worker SIGKILLed, an agent SIGKILLed with its worker, an agent
SIGTERMed, the checkpoint writer SIGKILLed mid-write, the newest checkpoint torn; a new agent
after each one lost. The run must finish on its own, train every surviving step on the
uninterrupted run's samples, and end with its weights (see ``chaos.TOLERANCE``).
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from _helpers import ROOT, script_env

pytestmark = pytest.mark.slow  # starts processes: two torchrun jobs

CHAOS = ROOT / "benchmarks" / "chaos.py"
KINDS = {"worker-kill", "agent-kill", "agent-term", "write-kill", "torn"}


def test_five_faults_lose_nothing_and_end_on_the_uninterrupted_weights(tmp_path: Path) -> None:
    out, result_file = tmp_path / "out", tmp_path / "chaos.json"
    command = [sys.executable, str(CHAOS), "--faults", "5", "--steps", "120", "--timeout", "200"]
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
