"""The command line of one job's process: ``python -m lightning_bandlimit.jobs.multitenant
SPEC.json`` reads a :class:`JobSpec`, runs it in this process (:func:`run_job`) and writes its
:class:`JobResult` to ``<out_dir>/result.json`` (what :func:`launch` starts and reads back).
A bad spec, bad overrides or an unknown recipe end in one line, exit code 2."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from lightning_bandlimit.jobs.multitenant.run import run_job
from lightning_bandlimit.jobs.multitenant.spec import JobSpec
from lightning_bandlimit.utils.command_line import CommandLineError, debugging, exit_with_error
from lightning_bandlimit.utils.files import atomic_write_json

__all__ = ["main"]


def main(argv: list[str]) -> None:
    """``python -m lightning_bandlimit.jobs.multitenant SPEC.json``: run the job and write its result.

    Args:
        argv: the arguments after the program's name (``[SPEC.json]``).

    Raises:
        SystemExit: code 2, after one line on standard error, for a spec that is missing,
            unreadable or not a valid :class:`JobSpec`, overrides that do not parse or an unknown
            recipe (with ``JSONARGPARSE_DEBUG=true``, the error itself instead).
    """
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m lightning_bandlimit.jobs.multitenant",
        description="Run one job of the multi-tenant scenario (what launch() does).",
    )
    parser.add_argument("spec", type=Path, help="a JobSpec as JSON (launch() writes <out_dir>/spec.json)")
    path = parser.parse_args(argv).spec
    try:
        spec = JobSpec(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError) as error:  # unreadable, not JSON, a bad or unknown field
        if debugging():
            raise
        reason = error.strerror if isinstance(error, OSError) and error.strerror else error
        raise exit_with_error(parser.prog, f"{path}: {reason}") from None
    try:
        result = run_job(spec)
    except (CommandLineError, FileNotFoundError) as error:  # bad overrides, no such recipe or data
        if debugging():
            raise
        raise exit_with_error(parser.prog, f"{path}: {error}") from None
    atomic_write_json(Path(spec.out_dir, "result.json"), asdict(result), indent=None)
