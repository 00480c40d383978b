"""The main job's ``summary.json``: where a run keeps it, and the checkpoints it records.

:mod:`lightning_bandlimit.jobs.main_job` writes ``runs/main-<timestamp>/summary.json``; its
``results`` list holds one entry per variant (``"band-limited"``, ``"full-spectrum"``, and the
``"ladder"`` job, marked ``"robustness": false``) with the ``checkpoint`` that variant's job
saved. The reader lives here, beside the format's name, and
not in :mod:`~lightning_bandlimit.jobs.main_job` itself: the main job runs the robustness recipe,
which reads the summary back, so a reader inside ``main_job`` would make the two import each
other. Nothing here imports the rest of the package.
"""

from __future__ import annotations

import json
from pathlib import Path

__all__ = ["SUMMARY_NAME", "main_run_checkpoints", "main_run_dir"]

#: The file name of a main-job run's summary.
SUMMARY_NAME = "summary.json"


def main_run_dir(main_run: str | Path = "latest", runs_dir: str | Path = "runs") -> Path:
    """The folder of a main-job run.

    Args:
        main_run: a ``runs/main-<timestamp>`` folder (or its ``summary.json``), or ``"latest"``
            for the newest ``main-*`` folder with a ``summary.json`` under ``runs_dir``.
        runs_dir: where ``"latest"`` looks.

    Raises:
        FileNotFoundError: if ``"latest"`` finds no run (the message says where it looked).

    Example:
        >>> main_run_dir("runs/main-20250101-000000/summary.json").name
        'main-20250101-000000'
    """
    if str(main_run) == "latest":
        runs = sorted(p.parent for p in Path(runs_dir).glob(f"main-*/{SUMMARY_NAME}"))
        if not runs:
            raise FileNotFoundError(
                f"no main-job run (main-*/{SUMMARY_NAME}) under {str(runs_dir)!r}; run "
                "`python -m lightning_bandlimit.jobs.main_job` first or pass --main_run PATH"
            )
        return runs[-1]
    run = Path(main_run)
    return run.parent if run.name == SUMMARY_NAME else run


def main_run_checkpoints(main_run: str | Path = "latest", runs_dir: str | Path = "runs") -> dict[str, Path]:
    """The band-limited and full-spectrum checkpoints of a main-job run (``summary.json``).

    Args:
        main_run: a ``runs/main-<timestamp>`` folder (or its ``summary.json``), or ``"latest"``
            for the newest ``main-*`` folder with a ``summary.json`` under ``runs_dir``.
        runs_dir: where ``"latest"`` looks.

    Returns:
        ``{"band-limited": path, "full-spectrum": path}`` (the variants the run recorded); a
        relative checkpoint path that does not exist from here is taken relative to the run.

    Raises:
        FileNotFoundError: if no run, summary or checkpoint is found (the message says where
            it looked).
        ValueError: for a summary without checkpoints.

    Example:
        >>> main_run_checkpoints("latest", runs_dir="/nonexistent")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        FileNotFoundError: no main-job run (main-*/summary.json) under '/nonexistent'; run ... --main_run PATH
    """
    run = main_run_dir(main_run, runs_dir)
    summary_path = run / SUMMARY_NAME
    if not summary_path.is_file():
        raise FileNotFoundError(f"main-job summary not found: {str(summary_path)!r}")
    summary = json.loads(summary_path.read_text())
    found: dict[str, Path] = {}
    for result in summary.get("results", []):
        if result.get("robustness") is False:  # a run the main job does not attack
            continue
        variant, checkpoint = result.get("variant"), result.get("checkpoint")
        if not checkpoint:
            raise ValueError(f"{summary_path}: the {variant!r} run recorded no checkpoint")
        path = Path(checkpoint)
        if not path.is_absolute() and not path.exists():
            path = run / path
        if not path.is_file():
            raise FileNotFoundError(
                f"{summary_path}: checkpoint of the {variant!r} run not found: {str(path)!r}"
            )
        found[str(variant)] = path
    if not found:
        raise ValueError(
            f"{summary_path}: expected 'results' with 'variant' and 'checkpoint' entries, got none"
        )
    return found
