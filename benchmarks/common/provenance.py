"""Where a benchmark's results go and what they record: the command that wrote them, the commit, the machine.

Every results file under ``benchmarks/results/`` names its ``command`` (as a user reruns it, from
the repository root) and its commit; :func:`write_result` writes both with the library versions,
the device and the time, for the scripts that share one layout (``memory/model_memory.py``,
``speed/model_speed.py``); the others add :func:`stamp`'s fields to their own layout.

Example:
    >>> command("benchmarks.memory.model_memory", ["--quick"])
    'python -m benchmarks.memory.model_memory --quick'
"""

from __future__ import annotations

import datetime
import json
import platform
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "REPO_ROOT",
    "RESULTS",
    "command",
    "device_name",
    "git_commit",
    "git_dirty",
    "stamp",
    "versions",
    "write_result",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
RESULTS = REPO_ROOT / "benchmarks" / "results"


def command(module: str, argv: Sequence[str] = ()) -> str:
    """The command line that reruns ``module`` with ``argv``, from the repository root."""
    return " ".join(["python", "-m", module, *argv])


def device_name(device: Any) -> str:
    """GPU name, or the CPU model from /proc/cpuinfo (falling back to ``platform``).

    Args:
        device: a ``torch.device`` (or anything with ``.type``).
    """
    if device.type == "cuda":
        import torch

        return torch.cuda.get_device_name(device)
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def _git(*args: str) -> str | None:
    """``git <args>``'s output in the repository, or ``None`` if git is missing or fails."""
    try:
        done = subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_commit() -> str | None:
    """``git rev-parse HEAD`` of the repository, or ``None`` if unavailable."""
    return _git("rev-parse", "HEAD") or None


def git_dirty() -> bool | None:
    """Whether the working tree has uncommitted changes, or ``None`` if unknown."""
    status = _git("status", "--porcelain")
    return None if status is None else bool(status)


def versions() -> dict[str, str]:
    """The versions a training result depends on: torch, Lightning and Python."""
    import lightning
    import torch

    return {
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "python": platform.python_version(),
    }


def stamp(module: str | None = None, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The fields that name a result's origin: ``command`` (with ``module``), ``git_commit``, ``git_dirty``.

    Args:
        module: the script as a module (``benchmarks.<room>.<script>``); ``None``: no ``command``
            (a script that writes its own).
        argv: the script's arguments (default: ``sys.argv[1:]``).
    """
    fields: dict[str, Any] = {}
    if module is not None:
        fields["command"] = command(module, sys.argv[1:] if argv is None else argv)
    return {**fields, "git_commit": git_commit(), "git_dirty": git_dirty()}


def write_result(
    output: Path,
    benchmark: str,
    module: str,
    argv: Sequence[str],
    body: dict[str, Any],
    meta: dict[str, Any],
) -> None:
    """Write ``body`` as ``output`` with the command, and ``meta`` with the time and the commit.

    Args:
        output: the JSON file (its folder is created).
        benchmark: the benchmark's name, the file's first field.
        module: the script as a module (``benchmarks.<room>.<script>``), for the command.
        argv: the script's arguments, for the command.
        body: the results (after ``benchmark`` and ``command``).
        meta: what the run ran on (torch, device, threads, ...); the time, ``git_commit`` and
            ``git_dirty`` are added after it.
    """
    output.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "benchmark": benchmark,
        "command": command(module, argv),
        **body,
        "meta": {
            **meta,
            "timestamp": datetime.datetime.now().isoformat(timespec="seconds"),
            "git_commit": git_commit(),
            "git_dirty": git_dirty(),
        },
    }
    output.write_text(json.dumps(record, indent=2))
