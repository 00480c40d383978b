"""``benchmarks/tenants/cotrain_gpu.py`` runs its whole flow without a GPU (nothing squeezed): smoke test."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(600)  # three sets of job processes: 45 s alone, about 90 s beside four busy workers
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the run squeezes the device: a benchmark")
# one row a run (each run's solo jobs, then its set), so that the two rows run side by side
@pytest.mark.parametrize("row", ["plain", "coordinated"])
def test_a_set_runs_its_jobs_in_turn_and_writes_what_each_measured(tmp_path: Path, row: str) -> None:
    command = [
        sys.executable,
        *("-m", "benchmarks.tenants.cotrain_gpu"),
        *("--seeds", "0", "--rows", row, "--width", "4", "--epochs", "1"),
        *("--train-size", "64", "--val-size", "16", "--batch-size", "16", "--stagger-steps", "2"),
        *("--work", str(tmp_path / "work"), "--output", str(tmp_path / "out"), "--timeout", "120"),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run(command, check=True, env=env, timeout=540, capture_output=True, cwd=ROOT)
    result = json.loads((tmp_path / "out" / "cotrain_gpu.json").read_text())
    assert result["device"] == "cpu"
    assert [r["row"] for r in result["records"]] == [row]
    for record in result["records"]:
        assert [j["error"] for j in record["jobs"]] == [None, None]
        assert [j["steps"] for j in record["jobs"]] == [4, 4]  # 64 images in batches of 16
        assert all(len(j["timeline"]) == 4 for j in record["jobs"])
    # job1 waited for job0's second step before its first
    jobs = tmp_path / "work" / "seed0" / row
    second = json.loads((jobs / "job0" / "result.json").read_text())["timeline"][1]
    gate = float((jobs / "job1" / "job.log").read_text().split("gate passed at ")[1].split()[0])
    assert second["step"] == 2 and gate >= second["at"] - 0.1  # the log rounds to 0.1 s
