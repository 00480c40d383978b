"""Jobs of the multi-tenant scenario launched as processes, one each, so that each job's resident
memory is its own: :func:`launch` and :func:`launch_set`.

A job's process runs ``python -m lightning_bandlimit.jobs.multitenant <out_dir>/spec.json``
(:mod:`lightning_bandlimit.jobs.multitenant.command`) under :data:`HOST_ALLOCATOR_ENV`, writes
its output to ``<out_dir>/job.log`` and its :class:`JobResult` to ``<out_dir>/result.json``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

from lightning_bandlimit.jobs.multitenant.spec import JobResult, JobSpec
from lightning_bandlimit.utils.files import atomic_write_json

__all__ = ["HOST_ALLOCATOR_ENV", "launch", "launch_set"]

# glibc serves allocations above 128 KiB by mmap, handed back on free: a job's resident set
# follows its live tensors, as a GPU job's reserved memory does after ``empty_cache``
HOST_ALLOCATOR_ENV = {"MALLOC_MMAP_THRESHOLD_": "131072"}


def launch(spec: JobSpec, timeout: float | None = None) -> JobResult:
    """Run ``spec`` in a fresh process (see the module docstring) and return what it measured.

    Its output goes to ``<out_dir>/job.log``; ``<out_dir>/result.json`` holds the result.

    Raises:
        RuntimeError: if the job fails (the message ends with the log's tail).
    """
    return launch_set([spec], timeout=timeout)[0]


def launch_set(specs: list[JobSpec], stagger_s: float = 0.0, timeout: float | None = None) -> list[JobResult]:
    """Run the jobs ``specs`` at once, each in its own process (as :func:`launch`), the ``k``-th
    started ``k * stagger_s`` seconds after the first (several jobs on one device); returns
    their results in order.

    Raises:
        RuntimeError: if a job fails (the message ends with its log's tail).
        subprocess.TimeoutExpired: if a job runs past ``timeout`` seconds (all are stopped).
    """
    processes: list[subprocess.Popen] = []
    try:
        for k, spec in enumerate(specs):
            if k:
                time.sleep(stagger_s)
            processes.append(_start(spec))
        codes = [process.wait(timeout=timeout) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
    return [_result(spec, code) for spec, code in zip(specs, codes)]


def _start(spec: JobSpec) -> subprocess.Popen:
    out = Path(spec.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    spec_path = out / "spec.json"
    atomic_write_json(spec_path, asdict(spec))
    with open(out / "job.log", "w") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "lightning_bandlimit.jobs.multitenant", str(spec_path)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **HOST_ALLOCATOR_ENV},
        )


def _result(spec: JobSpec, code: int) -> JobResult:
    out = Path(spec.out_dir)
    if code != 0 or not (out / "result.json").is_file():
        tail = "\n".join((out / "job.log").read_text().splitlines()[-20:])
        raise RuntimeError(
            f"the {spec.name!r} job failed (exit code {code}); the end of {out / 'job.log'}:\n{tail}"
        )
    return JobResult(**json.loads((out / "result.json").read_text()))
