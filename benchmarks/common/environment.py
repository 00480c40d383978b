"""The environment a measurement needs, set before the process starts: the allocator, the path.

glibc reads its ``MALLOC_*`` settings once, at start-up, so a script that needs them starts itself
again with them (:func:`restart_with`) or passes them to the processes it starts; a script that
needs a folder on its import path (``zoo/zoo_matrix.py``: the zoo's table in ``tests/``) starts
itself again with it on ``PYTHONPATH`` (:func:`with_path`) instead of editing ``sys.path``.

* :data:`RESIDENT_MALLOC` (``memory/model_memory.py``, ``memory/ladder_memory.py``): a fixed mmap
  threshold makes glibc return every freed large block to the system, so the resident size follows
  the live tensors instead of what the allocator happens to retain.
* :data:`STEADY_MALLOC` (``speed/no_pressure.py``): glibc gives large freed blocks back and takes
  them again, and how often depends on each thread's arena history (a fit's first steps): thousands
  of page faults a step on one side and not on the other, a few per cent either way. One arena and
  fixed thresholds give both sides the same allocator, so a ratio measures the code, not its history.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["RESIDENT_MALLOC", "STEADY_MALLOC", "restart_with", "with_path"]

RESIDENT_MALLOC = {"MALLOC_MMAP_THRESHOLD_": "131072"}
STEADY_MALLOC = {
    "MALLOC_ARENA_MAX": "1",
    "MALLOC_MMAP_THRESHOLD_": str(256 << 20),
    "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
}


def restart_with(env: Mapping[str, str], module: str) -> None:
    """Start ``python -m module`` again with ``env`` added, unless the environment already has it.

    Returns only when nothing needs to change (the process is replaced otherwise), with the same
    arguments (``sys.argv[1:]``).

    Args:
        env: the variables to set.
        module: the running script as a module (``benchmarks.<room>.<script>``).
    """
    if any(os.environ.get(k) != v for k, v in env.items()):
        argv = [sys.executable, "-m", module, *sys.argv[1:]]
        os.execve(sys.executable, argv, {**os.environ, **env})


def with_path(folder: Path) -> dict[str, str]:
    """``PYTHONPATH`` with ``folder`` first, for :func:`restart_with`.

    Example:
        >>> import os
        >>> with_path(Path("/x"))["PYTHONPATH"].split(os.pathsep)[0]
        '/x'
    """
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(folder)]
    return {"PYTHONPATH": os.pathsep.join([str(folder), *rest])}
