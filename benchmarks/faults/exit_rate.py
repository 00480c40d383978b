"""Clean exits as a rate: two-process command-line runs in a row, each must exit 0 with no abort.

Each run is ``python -m lightning_bandlimit fit --config elastic`` on two CPU processes
(Lightning's launcher, gloo), 2 steps, a checkpoint at step 2, as a user runs it. A run passes
when it exits 0, prints no ``terminate called`` (the abort a process group left to the
interpreter's exit caused in about 1 run in 6, before the group was closed at exit:
``lightning_bandlimit/health/exit.py``) and reaches ``max_steps``. The suite keeps one such run
(``tests/health/test_exit.py``); the rate is this script's figure.

Prints one line per run and the rate; writes ``benchmarks/results/exit_rate.json`` with the
command, the commit and every run's status and seconds. Exits 1 unless every run passed.

Run: ``.venv/bin/python -m benchmarks.faults.exit_rate --runs 20`` (about 10 s a run on 2
CPU cores).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.common.provenance import REPO_ROOT, RESULTS, command, git_commit, git_dirty


def command_line(run_dir: Path) -> list[str]:
    """The two-process run a user would start (the ``elastic`` recipe, 2 steps, on the CPU)."""
    return [
        sys.executable,
        *("-m", "lightning_bandlimit", "fit", "--config", "elastic"),
        *("--trainer.default_root_dir", str(run_dir), "--trainer.logger", "false"),
        *("--trainer.enable_progress_bar", "false", "--trainer.devices", "2"),
        *("--trainer.max_steps", "2", "--trainer.accelerator", "cpu"),
        *("--trainer.callbacks.every_n_train_steps", "2", "--data.train_size", "128"),
        *("--data.val_size", "32"),
    ]


def one_run(run_dir: Path, timeout: float) -> dict[str, Any]:
    """One run in ``run_dir``: its status, seconds, whether it aborted and whether it finished."""
    run_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT), "PYTHONUNBUFFERED": "1"}
    started = time.perf_counter()
    try:
        proc = subprocess.run(
            command_line(run_dir), cwd=run_dir, env=env, capture_output=True, text=True, timeout=timeout
        )
        status, output = proc.returncode, proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as expired:
        status, output = None, f"timed out after {timeout} s: {expired.stderr!s:.2000}"
    seconds = time.perf_counter() - started
    aborted = "terminate called" in output
    finished = "`Trainer.fit` stopped: `max_steps=2` reached." in output
    ok = status == 0 and not aborted and finished
    return {
        "status": status,
        "seconds": round(seconds, 2),
        "aborted": aborted,
        "finished": finished,
        "ok": ok,
        "tail": "" if ok else output[-3000:],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs in a row (default 20)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds before a run is killed")
    parser.add_argument("--json", type=Path, default=RESULTS / "exit_rate.json", help="where to write")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, got {args.runs}")
    runs = []
    with tempfile.TemporaryDirectory(prefix="exit_rate-") as work:
        for attempt in range(args.runs):
            run = one_run(Path(work) / f"run{attempt}", args.timeout)
            runs.append(run)
            print(
                f"run {attempt + 1}/{args.runs}: status {run['status']}, {run['seconds']:.1f} s"
                + ("" if run["ok"] else " FAILED" + (" (abort)" if run["aborted"] else "")),
                flush=True,
            )
    passed = sum(run["ok"] for run in runs)
    print(f"{passed} of {args.runs} runs exited 0 with no abort")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "command": command("benchmarks.faults.exit_rate", argv or sys.argv[1:]),
                "git_commit": git_commit(),
                "git_dirty": git_dirty(),
                "runs": args.runs,
                "passed": passed,
                "aborts": sum(run["aborted"] for run in runs),
                "results": runs,
            },
            indent=1,
        )
        + "\n"
    )
    return 0 if passed == args.runs else 1


if __name__ == "__main__":
    sys.exit(main())
